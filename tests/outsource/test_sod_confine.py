"""kbp-sod confined (issue 37 items 2 and 7; docs/design.md 11.6 "Confinement"), checked from
outside the running daemon: its uid, capabilities, no_new_privs and seccomp mode in
/proc/PID/status, a forbidden system call made by the daemon itself killing it (and the same
injected call made by an unconfined process, and an allowed one by the daemon, showing the
check is not vacuous), the network namespace rules (mandatory, one VM per netns, never the
host's), the fd budget, the configuration file, ``--qemu-args`` and the systemd unit
(``systemd-analyze verify`` and ``security --offline=yes``, its exposure score)."""

from __future__ import annotations

import errno
import os
import pwd
import re
import resource
import shlex
import shutil
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from vm import outsource

from . import nsutil
from . import sodclient as sc
from .conftest import LEGACY, SOD_DIR, sod_user
from .netns import netns
from .sodclient import OP, Sqe
from .sodproc import Daemon, vm_spec

UNIT = SOD_DIR / "kbp-sod@.service"
CAP_NET_BIND_SERVICE = 10
CAP_DAC_OVERRIDE = 1

pytestmark = pytest.mark.skipif(LEGACY, reason="the confinement is the new daemon's")


def need_root_netns() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip(reason="needs root and iproute2 (network namespaces)")


def uid_of(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


def check_confined(pid: int, user: str, caps: int,
                   bounding: int = 0) -> dict[str, str]:
    """``bounding``: what systemd's CapabilityBoundingSet= left that the (unprivileged)
    daemon cannot drop from it; no exec and no_new_privs: it can never come back."""
    st = nsutil.status(pid)
    uid = str(uid_of(user))
    assert st["Uid"].split() == [uid] * 4, st["Uid"]
    assert st["Gid"].split() == [str(pwd.getpwnam(user).pw_gid)] * 4, st["Gid"]
    assert st["Groups"] in ("", str(pwd.getpwnam(user).pw_gid)), st["Groups"]
    for field in ("CapEff", "CapPrm"):
        assert int(st[field], 16) == caps, (field, st[field])
    assert int(st["CapInh"], 16) == 0 and int(st["CapAmb"], 16) == 0, st
    assert int(st["CapBnd"], 16) & ~caps & ~bounding == 0, st["CapBnd"]
    assert st["NoNewPrivs"] == "1"
    assert st["Seccomp"] == "2", "no seccomp filter"
    assert int(st.get("Seccomp_filters", "1")) >= 1
    return st


@pytest.mark.parametrize("low_ports", [False, True])
def test_confined_when_root_starts_it(sod_bin: Path, tmp_path: Path, daemons: list[Daemon],
                                      low_ports: bool) -> None:
    """As the rig starts it: root, then the user, nothing else (CAP_NET_BIND_SERVICE with
    bind-low-ports=yes), in the VM's netns; a guest's bind below 1024 follows from that."""
    need_root_netns()
    user = sod_user()
    with netns("kbpsoC") as ns:
        spec = vm_spec(tmp_path, ns=ns, **({"bind-low-ports": "yes"} if low_ports else {}))
        d = Daemon(sod_bin, tmp_path, spec, flags=["--user", user])
        daemons.append(d)
        d.wait_ready()
        caps = 1 << CAP_NET_BIND_SERVICE if low_ports else 0
        check_confined(d.proc.pid, user, caps)
        assert int(nsutil.status(d.proc.pid)["CapBnd"], 16) == caps
        # its network namespace is the VM's, for good
        assert os.readlink(f"/proc/{d.proc.pid}/ns/net") == \
            f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]"
        # its files: 0600
        assert os.stat(spec["region"]).st_mode & 0o777 == 0o600
        assert os.stat(spec["socket"]).st_mode & 0o077 == 0
        g = d.guest()
        try:
            h = g.socket()
            cqe = g.bind(h, "127.0.0.1", 53)
            assert cqe.res == (0 if low_ports else -errno.EACCES), cqe
            assert g.call(Sqe(OP["NOP"])).res == 0
        finally:
            g.close()
        assert "confined: uid" in d.log()


def test_confined_when_systemd_starts_it(sod_bin: Path, tmp_path: Path,
                                         daemons: list[Daemon]) -> None:
    """As kbp-sod@.service starts it: the user from the start with the unit's ambient
    capabilities (CAP_DAC_OVERRIDE for the root-owned 0600 RAM file), already in the VM's
    netns (NetworkNamespacePath=), no_new_privs; it keeps none of them."""
    need_root_netns()
    if shutil.which("setpriv") is None:
        pytest.skip(reason="needs setpriv (util-linux)")
    user = sod_user()
    pw = pwd.getpwnam(user)
    run = tmp_path / "run"  # RuntimeDirectory=kbp-sod: the user's, 0700
    run.mkdir()
    os.chown(run, pw.pw_uid, pw.pw_gid)
    run.chmod(0o700)
    with netns("kbpsoS") as ns:
        spec = vm_spec(tmp_path, ns=ns)
        spec["region"] = str(run / "t.region")
        spec["socket"] = str(run / "t.sock")
        caps = "+dac_override,+net_bind_service"
        prefix = ["ip", "netns", "exec", ns, "setpriv", f"--reuid={pw.pw_uid}",
                  f"--regid={pw.pw_gid}", "--clear-groups", f"--inh-caps={caps}",
                  f"--ambient-caps={caps}", f"--bounding-set=-all,{caps}", "--no-new-privs",
                  "--"]
        d = Daemon(sod_bin, tmp_path, spec, prefix=prefix, config=True)
        daemons.append(d)
        d.wait_ready()
        check_confined(d.proc.pid, user, 0,
                       bounding=1 << CAP_DAC_OVERRIDE | 1 << CAP_NET_BIND_SERVICE)
        assert os.stat(spec["region"]).st_uid == pw.pw_uid
        assert os.stat(spec["region"]).st_mode & 0o777 == 0o600
        g = d.guest()
        try:
            assert g.call(Sqe(OP["NOP"])).res == 0
            assert g.socket() > 0
        finally:
            g.close()


@pytest.mark.parametrize("call", ["netlink-socket", "openat"])
def test_a_forbidden_call_kills_it(sod_bin: Path, tmp_path: Path, daemons: list[Daemon],
                                   call: str) -> None:
    """The running daemon makes a system call its filter forbids (made to, by ptrace: the
    call is the daemon's own, judged by its own filter) and dies of SIGSYS.  Not vacuous:
    the same injection into an unconfined process makes the call (a netlink socket, an
    openat reaching the kernel: EFAULT), and an allowed call injected into the daemon
    returns and leaves it serving."""
    need_root_netns()
    why = nsutil.can_inject()
    if why:
        pytest.skip(reason=why)
    nr, args = {"netlink-socket": (nsutil.SYS["socket"], (16, 3, 0)),  # AF_NETLINK, RAW
                "openat": (nsutil.SYS["openat"], (-100 & 0xFFFFFFFF, 0, 0))}[call]
    control = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.1)
        kind, res = nsutil.inject(control.pid, nr, *args)
        assert kind == "result" and (res >= 0 or res == -errno.EFAULT), (kind, res)
    finally:
        control.kill()
        control.wait()
    with netns("kbpsoK") as ns:
        d = Daemon(sod_bin, tmp_path, vm_spec(tmp_path, ns=ns), flags=["--user", sod_user()])
        daemons.append(d)
        d.wait_ready()
        pid = d.proc.pid
        assert nsutil.inject(pid, nsutil.SYS["getpid"]) == ("result", pid)
        g = d.guest()
        try:
            assert g.call(Sqe(OP["NOP"])).res == 0  # still serving after the allowed call
            assert nsutil.inject(pid, nr, *args) == ("killed", signal.SIGSYS)
        finally:
            g.close()
        d.proc.returncode = -signal.SIGSYS  # reaped by the injector's waitpid
        assert not Path(f"/proc/{pid}").exists()


def test_netns_is_mandatory_and_never_the_hosts(sod_bin: Path, tmp_path: Path,
                                                daemons: list[Daemon]) -> None:
    need_root_netns()
    user = sod_user()
    # none at all: refused unless the tests' flag says so
    d = Daemon(sod_bin, tmp_path / "a", vm_spec(tmp_path / "a"), flags=["--user", user])
    assert d.wait_exit() == 1 and "netns=NAME is required" in d.log(), d.log()
    # a name for the host's own network namespace (ip netns attach NAME PID: this one's)
    host = f"kbpsohost-{os.getpid()}"
    subprocess.run(["ip", "netns", "attach", host, str(os.getpid())], check=True)
    try:
        d = Daemon(sod_bin, tmp_path / "b", vm_spec(tmp_path / "b", ns=host),
                   flags=["--user", user])
        assert d.wait_exit() == 1 and "is the host's network namespace" in d.log(), d.log()
    finally:
        subprocess.run(["ip", "netns", "del", host], check=False)
    with netns("kbpsoN") as ns:
        # one VM per netns: a second daemon for it is refused, whatever its region
        first = Daemon(sod_bin, tmp_path / "c", vm_spec(tmp_path / "c", ns=ns),
                       flags=["--user", user])
        daemons.append(first)
        first.wait_ready()
        d = Daemon(sod_bin, tmp_path / "d", vm_spec(tmp_path / "d", "u", ns=ns),
                   flags=["--user", user])
        assert d.wait_exit() == 1 and "already serves a VM" in d.log(), d.log()
        first.stop()
        # two VMs of one daemon in one netns: its start fails, nothing is left serving
        argv = [str(sod_bin), "--user", user]
        for name in ("v1", "v2"):
            argv += ["--vm", ",".join(f"{k}={v}" for k, v in
                                      vm_spec(tmp_path / "e", name, ns=ns).items())]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        assert p.returncode == 1 and "already serves a VM" in p.stderr, p.stderr
        assert "did not start" in p.stderr
    # not root: no user to drop to is refused
    d = Daemon(sod_bin, tmp_path / "f", vm_spec(tmp_path / "f"),
               flags=["--allow-host-netns", "--user", "no-such-user-kbp"])
    assert d.wait_exit() == 1 and "no user no-such-user-kbp" in d.log()
    d = Daemon(sod_bin, tmp_path / "g", vm_spec(tmp_path / "g"),
               flags=["--allow-host-netns", "--user", "root"])
    assert d.wait_exit() == 1 and "does not serve guests as root" in d.log()


def _nofile(soft: int, hard: int) -> object:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limit


def test_fd_budget_is_checked_at_start(sod_bin: Path, tmp_path: Path,
                                       daemons: list[Daemon]) -> None:
    """max-sockets + 2 per queue + the daemon's own must fit RLIMIT_NOFILE: the soft limit
    is raised up to the hard one, above that the start is refused with the numbers."""
    flags = ["--allow-host-netns", *(["--user", sod_user()] if os.geteuid() == 0 else [])]
    spec = vm_spec(tmp_path / "a", **{"max-sockets": "200"})
    d = Daemon(sod_bin, tmp_path / "a", spec, flags=flags, preexec=_nofile(64, 128))
    assert d.wait_exit() == 1, d.log()
    assert re.search(r"RLIMIT_NOFILE allows 128 open files, this VM may need 236 "
                     r"\(max-sockets=200", d.log()), d.log()
    d = Daemon(sod_bin, tmp_path / "b", vm_spec(tmp_path / "b", **{"max-sockets": "200"}),
               flags=flags, preexec=_nofile(64, 4096))
    daemons.append(d)
    d.wait_ready()
    assert "raised the soft RLIMIT_NOFILE from 64 to 236" in d.log()
    soft = int(Path(f"/proc/{d.proc.pid}/limits").read_text().split(
        "Max open files")[1].split()[0])
    assert soft == 236


def test_config_file(sod_bin: Path, tmp_path: Path, daemons: list[Daemon]) -> None:
    flags = ["--allow-host-netns", *(["--user", sod_user()] if os.geteuid() == 0 else [])]
    spec = vm_spec(tmp_path / "a", **{"max-sockets": "3", "budget": "4"})
    d = Daemon(sod_bin, tmp_path / "a", spec, flags=flags, config=True)
    daemons.append(d)
    d.wait_ready()
    g = d.guest()
    try:
        assert g.hdr("max_sockets") == 3
        assert [g.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET)).res for _ in range(4)] == \
            [0, 0, 0, -errno.EMFILE]
    finally:
        g.close()
    assert "max-sockets=3 reached" in d.log()
    bad = tmp_path / "bad.conf"
    bad.write_text("name = x\n# fine\nmax-sockets = lots\n")
    p = subprocess.run([str(sod_bin), "--config", str(bad)], capture_output=True, text=True,
                       timeout=10)
    assert p.returncode == 2 and f"{bad}:3: bad max-sockets" in p.stderr, p.stderr


def test_qemu_args_are_the_rigs(sod_bin: Path, tmp_path: Path) -> None:
    """kbp-sod --qemu-args prints what the rig (vm/outsource.py) gives QEMU, and QEMU's
    comma escaping for a path with a comma."""
    work = tmp_path / "w"
    work.mkdir()
    ram = "/dev/shm/x.ram"
    (work / "ram.path").write_text(ram)
    spec = f"name=v,region={work}/region,socket={work / 'sod.sock'},ram={ram},queues=3," \
           "ram-size=1024M,netns=n"
    p = subprocess.run([str(sod_bin), "--qemu-args", "--vm", spec], capture_output=True,
                       text=True, timeout=10, check=True)
    assert shlex.split(p.stdout) == outsource.qemu_args(outsource.SodSpec("n"), work, 1024, 3)
    bare = subprocess.run([str(sod_bin), "--qemu-args", spec], capture_output=True, text=True,
                          timeout=10, check=True)
    assert bare.stdout == p.stdout
    conf = tmp_path / "v.conf"
    conf.write_text(f"name = v\nregion = /r\nsocket = /run/a,b c.sock\nram = {ram}\n"
                    "ram-size = 2G\nqueues = 2\n")
    p = subprocess.run([str(sod_bin), "--qemu-args", "--config", str(conf)],
                       capture_output=True, text=True, timeout=10, check=True)
    words = shlex.split(p.stdout)
    assert words[words.index("-chardev") + 1] == "socket,path=/run/a,,b c.sock,id=kbpso"
    assert "size=2048M" in words[1]
    # without a size and without the file, it says what is missing
    conf.write_text("name = v\nregion = /r\nsocket = /s\nram = /nonexistent/ram\n")
    p = subprocess.run([str(sod_bin), "--qemu-args", "--config", str(conf)],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 1 and "no ram-size=" in p.stderr


def test_unit_verifies_and_its_exposure_is_low(sod_bin: Path, tmp_path: Path) -> None:
    """kbp-sod@.service as the package installs it: systemd-analyze verify is clean, and
    systemd-analyze security --offline=yes rates it (the score is printed: pytest -s)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip(reason="needs systemd-analyze")
    root = tmp_path / "root"
    units = root / "lib/systemd/system"
    shutil.copytree("/lib/systemd/system", units, symlinks=True)  # sysinit.target & co.
    shutil.copy(UNIT, units / "kbp-sod@.service")
    (root / "usr/sbin").mkdir(parents=True)
    shutil.copy(sod_bin, root / "usr/sbin/kbp-sod")
    (root / "etc/kbp-sod").mkdir(parents=True)
    (root / "etc/kbp-sod/vm0.conf").write_text("name = vm0\n")
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}",
                        "kbp-sod@vm0.service"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr.strip() and not p.stdout.strip(), \
        p.stdout + p.stderr
    p = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"--root={root}",
                        "--threshold=20", "kbp-sod@vm0.service"], capture_output=True,
                       text=True, timeout=60)
    m = re.search(r"Overall exposure level for kbp-sod@vm0.service: (\d+\.\d+) (\w+)", p.stdout)
    assert m, p.stdout + p.stderr
    print(f"\nsystemd-analyze security --offline=yes kbp-sod@vm0.service: {m.group(1)} "
          f"{m.group(2)}")
    assert p.returncode == 0 and float(m.group(1)) <= 2.0, p.stdout[-3000:]
    # the unit's claims that the daemon relies on
    text = UNIT.read_text()
    for line in ("User=kbp-sod", "NoNewPrivileges=yes", "NetworkNamespacePath=/run/netns/%i",
                 "CapabilityBoundingSet=CAP_DAC_OVERRIDE CAP_NET_BIND_SERVICE",
                 "ProtectSystem=strict", "PrivateTmp=yes", "UMask=0077",
                 "ExecStart=/usr/sbin/kbp-sod --config /etc/kbp-sod/%i.conf"):
        assert line in text.splitlines(), line


def test_supervisor_and_workers_are_all_confined(sod_bin: Path, tmp_path: Path,
                                                 daemons: list[Daemon]) -> None:
    """Two VMs on one command line: a worker process per VM, each in its netns, and the
    supervisor keeps nothing of theirs (no VM file open, seccomp on too)."""
    need_root_netns()
    user = sod_user()
    with ExitStack() as stack:
        nss = [stack.enter_context(netns(f"kbpsoW{i}")) for i in range(2)]
        specs = [vm_spec(tmp_path, f"w{i}", ns=ns) for i, ns in enumerate(nss)]
        argv = [str(sod_bin), "--user", user]
        for s in specs:
            argv += ["--vm", ",".join(f"{k}={v}" for k, v in s.items())]
        log = tmp_path / "two.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + 10
            while "kbp-sod: ready" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < end, log.read_text()
                time.sleep(0.01)
            kids = [int(x) for x in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                    .read_text().split()]
            assert len(kids) == 2
            for pid in kids:
                check_confined(pid, user, 0)
            parent = nsutil.status(proc.pid)
            assert parent["Seccomp"] == "2" and parent["NoNewPrivs"] == "1"
            assert int(parent["CapEff"], 16) == 0
            assert parent["Uid"].split()[0] == str(uid_of(user))
            opened = {os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                      for fd in os.listdir(f"/proc/{proc.pid}/fd")}
            assert not any(p.endswith((".ram", ".region")) for p in opened), opened
            nets = {os.readlink(f"/proc/{pid}/ns/net") for pid in kids}
            assert len(nets) == 2
            # a worker that dies leaves the other serving, and the supervisor idle
            os.kill(kids[0], signal.SIGKILL)
            end = time.monotonic() + 5
            while "worker" not in log.read_text():
                assert time.monotonic() < end, log.read_text()
                time.sleep(0.01)
            cpu = _cpu_s(proc.pid)
            time.sleep(0.3)
            assert _cpu_s(proc.pid) - cpu < 0.05, "the supervisor spins"
            assert Path(f"/proc/{kids[1]}").exists()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 1, log.read_text()  # one worker did not end well
        assert "signal 9" in log.read_text()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
