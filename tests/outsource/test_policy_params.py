"""``kbpctl outsource`` and kbp_so's own policy (design.md 11.13): the module parameters
``cgroup``, ``netns`` and ``allow_uids`` that ``set`` writes and ``clear`` puts back, the
network namespaces' cookies (real namespaces of this host), the ``--force`` load line,
``status``'s warnings, and the paragraph on what the guest's filters see.

The module is stood in for by a directory for /sys/module/kbp_so/parameters
(``policy.PARAMS``, as ``idle.PARAMS``) and a file for /proc/kbp_so (``procfile.PROC_PATH``);
the bpf(2) calls that the development host's kernel refuses for tracing programs
(test_policy.py's docstring) by stand-ins that pin a plain file in a scratch directory.
Everything else -- the checks, the cgroup (a real one, made here), the cookies, the journal,
the record, the CLI -- is kbpctl's own code running for real.  The module's side (the
parameters' parsing, EPERM, the counters) is tested in the guest.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kbp import cli
from kbp.errors import InvalidInput, OperationFailed
from kbp.outsource import bpfsys, command, policy, procfile
from kbp.system import access

from .netns import netns

REPO = Path(__file__).resolve().parents[2]
HEAD = ("kbp_so state={state} epoch=1 queues=2 sockets=0 pinned_pages=0 orphan_pages=0 "
        "fallbacks=0 host_timeout_ms=3000 poll_us=0 idle=off idle_poll_us=0 irqs=0 irqs_sent=0 "
        "completions_irq=0 completions_polled=0 completions_syscall=0 completions_idle=0 "
        "completions_tick=0 idle_poll_ns=0 idle_halts=0 idle_races=0 refused_netns={rn} "
        "refused_user={ru} closes_pending=0\n")


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip(reason="set and clear need root (and these tests make cgroups, netns)")


def _cgroup2() -> str:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.startswith("cgroup2 "):
            return pre.split()[4]
    pytest.skip(reason="no cgroup2 mount")


@dataclass
class Kernel:
    """The module's files and the scratch places of one test."""

    params: Path
    proc: Path
    bpffs: Path
    run: Path
    cgroup: str         # a real cgroup v2 directory, made for the test
    rel: str            # its path from the hierarchy's root

    def load(self, state: str = "attached", cgroup: str = "", netns: str = "init",
             allow_uids: str = "", policy_params: bool = True) -> None:
        """kbp_so loaded, its parameters as the module shows them (with newlines)."""
        self.params.mkdir(exist_ok=True)
        if policy_params:
            for name, v in (("cgroup", cgroup), ("netns", netns), ("allow_uids", allow_uids)):
                (self.params / name).write_text(v + "\n")
        (self.params / "idle_poll_us").write_text("0\n")
        self.proc.write_text(HEAD.format(state=state, rn=3, ru=5))

    def unload(self) -> None:
        shutil.rmtree(self.params, ignore_errors=True)
        self.proc.unlink(missing_ok=True)

    def param(self, name: str) -> str:
        return (self.params / name).read_text()

    def record(self) -> dict[str, object]:
        return json.loads((self.run / "outsource.json").read_text())


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernel]:
    _need_root()
    cg = os.path.join(_cgroup2(), f"kbp-params-test-{os.getpid()}")
    os.mkdir(cg)
    k = Kernel(tmp_path / "parameters", tmp_path / "kbp_so", tmp_path / "bpf", tmp_path / "run",
               cg, policy.resolve_cgroup(cg).rel)
    k.bpffs.mkdir()
    monkeypatch.setenv("KBP_RUN_DIR", str(k.run))
    monkeypatch.delenv("KBP_SO_KO", raising=False)
    monkeypatch.setattr(policy, "PARAMS", k.params)
    monkeypatch.setattr(procfile, "PROC_PATH", k.proc)
    monkeypatch.setattr(policy, "BPFFS", str(k.bpffs))
    monkeypatch.setattr(policy, "PIN_DIR", str(k.bpffs / "kbp"))
    monkeypatch.setattr(policy, "PIN", str(k.bpffs / "kbp" / "outsource"))
    # the bpf(2) calls: a pin is a plain file, the link "exists" while it does
    monkeypatch.setattr(bpfsys, "mount_bpffs", lambda p: None)
    monkeypatch.setattr(bpfsys, "umount", lambda p: None)
    monkeypatch.setattr(bpfsys, "prog_load", lambda *a: os.open("/dev/null", os.O_RDONLY))
    monkeypatch.setattr(bpfsys, "link_create", lambda fd: os.open("/dev/null", os.O_RDONLY))
    monkeypatch.setattr(bpfsys, "obj_pin", lambda fd, p: Path(p).write_text("link"))
    monkeypatch.setattr(bpfsys, "obj_get", lambda p: os.open(p, os.O_RDONLY))
    monkeypatch.setattr(bpfsys, "link_ids", lambda fd: (7, 8))

    def gone(prog_id: int) -> int:
        raise OSError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(bpfsys, "prog_get_fd_by_id", gone)
    try:
        yield k
    finally:
        os.rmdir(cg)


@contextmanager
def _unwritable(kernel: Kernel, name: str, tmp: Path) -> Iterator[None]:
    """Parameter ``name`` reads as it does now, and its writes fail (EROFS): a file on a
    read-only tmpfs in its place."""
    content = kernel.param(name)
    ro = tmp / f"ro-{name}"
    ro.mkdir()
    access.cmd(["mount", "-t", "tmpfs", "-o", "size=64k", "kbp-test", str(ro)])
    try:
        (ro / name).write_text(content)
        access.cmd(["mount", "-o", "remount,ro", str(ro)])
        (kernel.params / name).unlink()
        (kernel.params / name).symlink_to(ro / name)
        yield
    finally:
        (kernel.params / name).unlink(missing_ok=True)
        (kernel.params / name).write_text(content)
        access.cmd(["umount", str(ro)], check=False)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(["outsource", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _cookie_by_nsenter(ns: str) -> int:
    """The namespace's cookie by another route than kbpctl's (nsenter, not ip netns exec)."""
    code = ("import socket, struct; s = socket.socket(); "
            "print(struct.unpack('=Q', s.getsockopt(socket.SOL_SOCKET, 71, 8))[0])")
    p = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-S", "-c", code],
                       capture_output=True, text=True, check=True, timeout=30)
    return int(p.stdout)


def _own_cookie() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return int(struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, 71, 8))[0])


def _in_initial_netns() -> bool:
    return os.stat("/proc/self/ns/net").st_ino == policy.INIT_NET_INO


# -- /proc/kbp_so's new header fields ----------------------------------------------------------
def test_proc_header_with_the_policy_counters_and_unknown_keys() -> None:
    m = procfile.parse(HEAD.format(state="attached", rn=3, ru=5).rstrip("\n")
                       + " some_future_key=abc another=1,2\n")
    assert m.counters["refused_netns"] == 3 and m.counters["refused_user"] == 5
    assert m.counters["closes_pending"] == 0
    assert m.extra == {"some_future_key": "abc", "another": "1,2"}
    summary = procfile.summary(m)
    assert summary["refused_netns"] == 3 and summary["refused_user"] == 5
    with pytest.raises(procfile.ProcFormatError, match="refused_user is not a number"):
        procfile.parse("kbp_so state=attached refused_user=x\n")


def test_proc_header_of_an_older_module_has_no_policy_counters() -> None:
    m = procfile.parse("kbp_so state=attached epoch=1 queues=1 sockets=0\n")
    assert not set(procfile.POLICY_COUNTERS) & set(m.counters)


# -- the cgroup's path for the module --------------------------------------------------------
def test_the_cgroup_path_is_the_hierarchy_s(kernel: Kernel) -> None:
    sub = os.path.join(kernel.cgroup, "sub")
    os.mkdir(sub)
    try:
        cg, child = policy.resolve_cgroup(kernel.cgroup), policy.resolve_cgroup(sub + "/")
    finally:
        os.rmdir(sub)
    name = os.path.basename(kernel.cgroup)
    assert cg.rel.endswith("/" + name) and not cg.rel.startswith("/sys/")
    assert child.rel == cg.rel + "/sub" and child.level == cg.level + 1
    assert cg.rel.count("/") == cg.level        # one component per level below the root
    assert policy.resolve_cgroup(os.path.dirname(kernel.cgroup)).rel == os.path.dirname(cg.rel)


# -- network namespaces: real ones --------------------------------------------------------------
def test_a_named_netns_cookie_is_the_namespace_s() -> None:
    _need_root()
    with netns("kbp-pp-a") as a, netns("kbp-pp-b") as b:
        refs = policy.resolve_netns([a, b, a])
        assert [r.name for r in refs] == [a, b]
        assert refs[0].cookie == _cookie_by_nsenter(a)
        assert refs[1].cookie == _cookie_by_nsenter(b)
        assert refs[0].cookie != refs[1].cookie != _own_cookie()
        assert refs[0].ino == os.stat(f"/run/netns/{a}").st_ino
        # the initial netns alone: the module's empty list says it, no cookie needed
        assert [(r.name, r.cookie) for r in policy.resolve_netns(["init"])] == [("init", None)]
        if _in_initial_netns():
            both = policy.resolve_netns(["init", a])
            assert [r.cookie for r in both] == [_own_cookie(), refs[0].cookie]
            vals = policy.module_values(policy.resolve_cgroup(_cgroup2()), both, [0])
            assert vals["netns"] == f"{_own_cookie()},{refs[0].cookie}"
        else:
            with pytest.raises(InvalidInput, match="run it in the initial network namespace"):
                policy.resolve_netns(["init", a])


def test_a_missing_netns_and_too_many_are_refused() -> None:
    _need_root()
    with pytest.raises(InvalidInput, match=r"--netns kbp-no-such-ns: no such network "
                                           r"namespace .*'ip netns list'"):
        policy.resolve_netns(["kbp-no-such-ns"])
    with pytest.raises(InvalidInput, match="a name from 'ip netns list', or 'init'"):
        policy.resolve_netns(["../etc"])
    made: list[str] = []
    try:
        for i in range(policy.MAX_NETNS):
            made.append(f"kbp-pp-many{i}-{os.getpid()}")
            access.cmd(["ip", "netns", "add", made[-1]])
        with pytest.raises(InvalidInput, match="9 network namespaces; kbp_so takes at most 8"):
            policy.resolve_netns(["init", *made])
    finally:
        for ns in made:
            access.cmd(["ip", "netns", "del", ns], check=False)


def test_uids_by_number_and_name() -> None:
    assert policy.resolve_uids(["1000", "root", "1000", "0"]) == [1000, 0]
    with pytest.raises(InvalidInput, match="no such user"):
        policy.resolve_uids(["kbp-no-such-user"])
    with pytest.raises(InvalidInput, match=r"a uid is 0\.\.4294967294"):
        policy.resolve_uids(["4294967295"])
    with pytest.raises(InvalidInput, match="17 uids; kbp_so takes at most 16"):
        policy.resolve_uids([str(i) for i in range(17)])


# -- set writes, clear puts back -----------------------------------------------------------------
def test_set_writes_the_module_policy_and_clear_restores_it_exactly(
        kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load(cgroup="/old-policy", netns="init", allow_uids="5,6")
    rc, out, err = _cli(capsys, "set", "--cgroup", kernel.cgroup, "--allow-uid", "1000",
                        "--allow-uid", "root")
    assert rc == 0, err
    assert kernel.param("cgroup") == kernel.rel + "\n"
    assert kernel.param("netns") == "\n"                  # the initial netns only
    assert kernel.param("allow_uids") == "1000,0\n"
    assert f"kbp_so's own policy: sockets in the initial netns only, made by a task in " \
           f"cgroup {kernel.rel} (or below) or holding CAP_NET_ADMIN or uid 1000, 0" in out
    assert "they were: cgroup='/old-policy' netns='init' allow_uids='5,6'" in out
    assert "What the guest's filters see" in out and err == ""
    rec = kernel.record()
    mp = rec["module_params"]
    assert isinstance(mp, dict) and mp["written"] is True
    assert mp["previous"] == {"cgroup": "/old-policy", "netns": "init", "allow_uids": "5,6"}
    assert mp["want"] == {"cgroup": kernel.rel, "netns": "", "allow_uids": "1000,0"}
    assert rec["cgroup_rel"] == kernel.rel

    rc, out, err = _cli(capsys, "clear")
    assert rc == 0, err
    assert kernel.param("cgroup") == "/old-policy\n"
    assert kernel.param("netns") == "\n"                  # "init": the module's empty list
    assert kernel.param("allow_uids") == "5,6\n"
    assert "kbp_so's cgroup: put back '/old-policy'" in out
    assert not (kernel.run / "outsource.json").exists()
    assert not os.path.lexists(policy.PIN)


def test_set_with_netns_writes_their_cookies(kernel: Kernel,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load()
    with netns("kbp-pp-set") as ns:
        cookie = _cookie_by_nsenter(ns)
        rc, out, err = _cli(capsys, "set", "--cgroup", kernel.cgroup, "--netns", ns)
        assert rc == 0, err
        assert kernel.param("netns") == f"{cookie}\n"
        assert f"sockets in netns {cookie} ({ns})" in out
        st = policy.status()
        assert st["module_params"]["netns"] == [cookie] and st["warnings"] == []
        assert f"netns {cookie} ({ns})" in "\n".join(command.status_lines(st))
    # the namespace is gone: its cookie names nothing, status says so
    st = policy.status()
    assert any(f"network namespace {ns} is gone" in w for w in st["warnings"]), st["warnings"]
    rc, out, err = _cli(capsys, "clear")
    assert rc == 0 and kernel.param("netns") == "\n", err


@pytest.mark.parametrize("fail", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()])
def test_a_failure_after_the_writes_puts_the_parameters_back(
        kernel: Kernel, fail: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel.load(cgroup="/before", allow_uids="7")

    def save(path: Path, data: dict[str, object]) -> None:
        assert kernel.param("cgroup") == kernel.rel + "\n"     # written by then
        raise fail

    monkeypatch.setattr(access, "save_json", save)
    with pytest.raises(OperationFailed if isinstance(fail, OSError) else KeyboardInterrupt):
        policy.set_policy(kernel.cgroup, "inet", False, None, ["1000"])
    assert (kernel.param("cgroup"), kernel.param("netns"), kernel.param("allow_uids")) == \
        ("/before\n", "\n", "7\n")
    assert not os.path.lexists(policy.PIN) and not (kernel.run / "outsource.json").exists()


def test_a_parameter_the_kernel_refuses_undoes_the_others(kernel: Kernel,
                                                         tmp_path: Path) -> None:
    kernel.load(cgroup="/before")
    refused = r"nothing left changed: kbp_so refused allow_uids='1000'.*\[EROFS\]"
    with _unwritable(kernel, "allow_uids", tmp_path), \
            pytest.raises(OperationFailed, match=refused):     # allow_uids: the last written
        policy.set_policy(kernel.cgroup, "inet", False, None, ["1000"])
    assert kernel.param("cgroup") == "/before\n" and kernel.param("netns") == "\n"
    assert not os.path.lexists(policy.PIN) and not (kernel.run / "outsource.json").exists()


def test_clear_leaves_a_parameter_changed_since_and_says_so(
        kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load(cgroup="/before")
    assert _cli(capsys, "set", "--cgroup", kernel.cgroup)[0] == 0
    kernel.unload()
    kernel.load(cgroup="/someone-else")         # reloaded with another policy
    rc, out, _ = _cli(capsys, "clear")
    assert rc == 0
    assert "left kbp_so's cgroup='/someone-else': it is no longer what set wrote" in out
    assert kernel.param("cgroup") == "/someone-else\n"
    assert "kbp_so's netns: put back 'init'" in out


def test_clear_with_kbp_so_unloaded_since(kernel: Kernel,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load()
    assert _cli(capsys, "set", "--cgroup", kernel.cgroup)[0] == 0
    kernel.unload()
    rc, out, _ = _cli(capsys, "clear")
    assert rc == 0 and "kbp_so is not loaded now" in out and not kernel.params.exists()


def test_clear_says_which_parameter_it_could_not_read(
        kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load(allow_uids="5")
    assert _cli(capsys, "set", "--cgroup", kernel.cgroup)[0] == 0
    (kernel.params / "allow_uids").unlink()
    (kernel.params / "allow_uids").mkdir()      # its read fails: EISDIR
    rc, out, err = _cli(capsys, "clear")
    assert rc == 1 and "kbpctl: error: cannot read kbp_so's parameters" in err, (out, err)
    assert not os.path.lexists(policy.PIN)      # the rest was done
    assert "outsource policy cleared" in out


def test_clear_says_which_parameter_it_could_not_write_and_how(
        kernel: Kernel, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kernel.load(cgroup="/before", allow_uids="5")
    assert _cli(capsys, "set", "--cgroup", kernel.cgroup)[0] == 0
    with _unwritable(kernel, "allow_uids", tmp_path):
        rc, out, err = _cli(capsys, "clear")
    assert rc == 1, (out, err)
    assert "kbpctl: error: could not put back kbp_so's allow_uids='5' (Read-only file " \
           f"system); by hand: echo 5 > {kernel.params / 'allow_uids'}" in err, err
    assert kernel.param("cgroup") == "/before\n"           # the others were put back
    assert "outsource policy cleared" in out


def test_set_is_refused_by_an_older_module_unless_forced(
        kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load(policy_params=False)
    rc, _, err = _cli(capsys, "set", "--cgroup", kernel.cgroup)
    assert rc == 69 and "does not enforce a policy itself" in err and "--force" in err
    assert not os.path.lexists(policy.PIN) and not (kernel.run / "outsource.json").exists()
    assert sorted(p.name for p in kernel.params.iterdir()) == ["idle_poll_us"]
    rc, _, err = _cli(capsys, "set", "--cgroup", kernel.cgroup, "--force")
    assert rc == 0 and "has no policy parameters" in err
    assert kernel.record()["module_params"]["written"] is False     # type: ignore[index]
    assert sorted(p.name for p in kernel.params.iterdir()) == ["idle_poll_us"]
    st = policy.status()
    assert any("an older kbp_so without the guest-user policy" in w for w in st["warnings"])
    assert _cli(capsys, "clear")[0] == 0


def test_refusals_write_nothing(kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load(cgroup="/before")
    for args, code, words in (
            (("--netns", "kbp-no-such-ns"), 2, "no such network namespace"),
            (("--allow-uid", "kbp-no-such-user"), 2, "no such user")):
        rc, _, err = _cli(capsys, "set", "--cgroup", kernel.cgroup, *args)
        assert rc == code and words in err and err.count("\n") == 1, err
        assert kernel.param("cgroup") == "/before\n" and kernel.param("allow_uids") == "\n"
        assert not os.path.lexists(policy.PIN)


# -- --force without the module: the load line -------------------------------------------------
def test_force_without_kbp_so_prints_the_load_line_and_writes_nothing(
        kernel: Kernel, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ko = tmp_path / "kbp_so.ko"
    ko.write_text("")
    monkeypatch.setenv("KBP_SO_KO", str(ko))
    rc, out, err = _cli(capsys, "set", "--cgroup", kernel.cgroup, "--allow-uid", "1000",
                        "--force")
    assert rc == 0, err
    known = subprocess.run(["modinfo", "-n", "kbp_so"], capture_output=True,
                           check=False).returncode == 0 if shutil.which("modinfo") else False
    line = (f"modprobe kbp_so cgroup={kernel.rel} allow_uids=1000" if known else
            f"insmod {ko} cgroup={kernel.rel} allow_uids=1000")
    assert f"\n  {line}\n" in err, err
    assert "kbp_so is not loaded" in err and "NOT written" in err
    assert "kbp_so's policy, to give it when it is loaded: sockets in the initial netns " \
           "only" in out
    assert not kernel.params.exists()
    mp = kernel.record()["module_params"]
    assert isinstance(mp, dict) and mp["written"] is False and mp["previous"] is None
    assert mp["load"] == line
    # loaded later as told: no warning; loaded without the policy: the warning
    kernel.load(cgroup=kernel.rel, allow_uids="1000")
    assert policy.status()["warnings"] == []
    kernel.unload()
    kernel.load()
    ws = policy.status()["warnings"]
    assert len(ws) == 2 and "kbp_so's cgroup parameter is 'empty'" in ws[0], ws
    rc, out, _ = _cli(capsys, "clear")
    assert rc == 0 and "set wrote none (kbp_so was not loaded)" in out
    assert kernel.param("cgroup") == "\n"       # not touched: it was never written


def test_the_load_line_quotes_what_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBP_SO_KO", "/nonexistent/kbp_so.ko")
    monkeypatch.setattr(shutil, "which", lambda name: None)     # no modinfo
    line = policy.load_command({"cgroup": "/a b", "netns": "", "allow_uids": "1,2"})
    assert line == "insmod kbp_so.ko 'cgroup=\"/a b\"' allow_uids=1,2"
    assert "netns" not in line


# -- status -------------------------------------------------------------------------------------
def test_status_shows_the_parameters_the_counters_and_a_reload(
        kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load()
    assert _cli(capsys, "set", "--cgroup", kernel.cgroup, "--allow-uid", "1000")[0] == 0
    rc, out, _ = _cli(capsys, "status", "--json")
    st = json.loads(out)
    assert rc == 0 and st["schema"] == "kbpctl-outsource/1"
    assert st["module_params"] == {"cgroup": kernel.rel, "netns": [], "allow_uids": [1000]}
    assert st["module"]["refused_netns"] == 3 and st["module"]["refused_user"] == 5
    assert st["module"]["closes_pending"] == 0 and st["warnings"] == []
    assert st["policy"]["module_params"]["written"] is True
    rc, out, _ = _cli(capsys, "status")
    assert f"kbp_so's policy: sockets in the initial netns only, made by a task in cgroup " \
           f"{kernel.rel} (or below) or holding CAP_NET_ADMIN or uid 1000; any other " \
           "protocol-253 socket gets EPERM; refused so far: 3 (netns), 5 (user)" in out
    assert "warning" not in out
    # kbp_so reloaded: its parameters are the defaults again
    kernel.unload()
    kernel.load()
    rc, out, _ = _cli(capsys, "status")
    assert rc == 0
    assert f"warning: the BPF policy sends the UDP sockets of {kernel.cgroup} to kbp_so but " \
           f"kbp_so's cgroup parameter is 'empty', not '{kernel.rel}'" in out
    assert "socket() fails with EPERM" in out
    assert "warning: kbp_so's allow_uids parameter is '', not '1000'" in out
    st = json.loads(_cli(capsys, "status", "--json")[1])
    assert len(st["warnings"]) == 2
    # put right by hand as the warning says: quiet again
    (kernel.params / "cgroup").write_text(kernel.rel + "\n")
    (kernel.params / "allow_uids").write_text("1000\n")
    assert policy.status()["warnings"] == []
    assert _cli(capsys, "clear")[0] == 0


def test_status_without_a_policy_shows_the_module_s_own(kernel: Kernel) -> None:
    kernel.load(cgroup="/by-modprobe", netns="4096,1", allow_uids="")
    st = policy.status()
    assert st["policy"] is None and st["warnings"] == []
    assert st["module_params"] == {"cgroup": "/by-modprobe", "netns": [4096, 1],
                                   "allow_uids": []}
    text = "\n".join(command.status_lines(st))
    assert "kbp_so's policy: sockets in netns 4096, 1, made by a task in cgroup /by-modprobe " \
           "(or below) or holding CAP_NET_ADMIN;" in text


def test_status_when_a_policy_is_set_but_kbp_so_is_not_loaded(
        kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    kernel.load()
    assert _cli(capsys, "set", "--cgroup", kernel.cgroup)[0] == 0
    kernel.unload()
    st = policy.status()
    assert st["module"] is None and st["module_params"] is None and st["warnings"] == []
    assert _cli(capsys, "clear")[0] == 0


# -- what the guest's filters see: printed by set, said in design.md ---------------------------
def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_filters_paragraph_is_design_md_s() -> None:
    design = (REPO / "docs" / "design.md").read_text()
    sec = design[design.index("### 11.13 The guest's policy and the kernel's own rules"):]
    sub = sec[sec.index("#### What the guest's filters see"):]
    assert _words(command.FILTERS_SEE) in _words(sub)
    for must in ("netfilter", "tc", "cgroup-skb", "IPAddressDeny=", "NIC counters",
                 "sock_addr", "bind, connect, sendmsg, recvmsg", "privileged-port",
                 "CAP_NET_BIND_SERVICE", "host's netfilter in the VM's network namespace"):
        assert must in command.FILTERS_SEE, must


def test_help_teaches_the_new_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["outsource", "set", "--help"])
    assert e.value.code == 0
    out = _words(capsys.readouterr().out)
    for text in ("--netns NAME|init", "--allow-uid UID", "--netns init --netns blue",
                 "--allow-uid 1000", "prints the modprobe line", "allow_uids",
                 "what the guest's filters see", "puts kbp_so's parameters back",
                 "/sys/module/kbp_so/parameters/", "refused_netns"):
        assert _words(text) in out, text
    assert re.search(r"cgroup \(the cgroup's path from the hierarchy's root, e\.g\. /rt-app\)",
                     out)
