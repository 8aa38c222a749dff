"""kbpctl outsource: the policy program, its loader's refusals, /proc/kbp_so, the BTF reader,
and -- where the kernel takes the program -- the redirect itself (policy_scenario.py).

The host kernel of the development machine refuses every BPF tracing program with EPERM
before the verifier runs (its own restriction: socket filters load), so there the end to
end test skips saying so, and the refusal test checks kbpctl's message for it; the VM test
(KBP_SO_VM=1) runs the scenario in the 6.12 and 7.2 guests and the refusal in 6.1's
(KBP_SO_VM_FLAVOUR=6.12-rt-amd64,7.2-rt-amd64 for the -rt kernels).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbp.errors import OperationFailed, Unavailable
from kbp.outsource import bpfsys, btf, policy, procfile, prog
from kbp.system import access

from . import policy_scenario

REPO = Path(__file__).resolve().parents[2]
SRC = str(REPO / "src")

PROC_TEXT = """\
kbp_so state=attached epoch=1 queues=2 sockets=2 pinned_pages=0 orphan_pages=0 fallbacks=0 host_timeout_ms=3000
sock ino=12345 uid=0 family=inet local=127.0.0.1:5000 remote=- requests=10 completions=10 bytes_out=100 bytes_in=100 copies=20 fallbacks=0 errors=0
sock ino=12346 uid=0 family=inet6 local=[::1]:5001 remote=[::1]:7 requests=3 completions=3 bytes_out=0 bytes_in=0 copies=0 fallbacks=0 errors=0
"""  # noqa: E501


# -- /proc/kbp_so -----------------------------------------------------------------------
def test_proc_file_parses_the_module_and_its_sockets() -> None:
    m = procfile.parse(PROC_TEXT)
    assert m.state == "attached"
    assert m.counters == {"epoch": 1, "queues": 2, "sockets": 2, "pinned_pages": 0,
                          "orphan_pages": 0, "fallbacks": 0, "host_timeout_ms": 3000}
    assert [s.ino for s in m.socks] == [12345, 12346]
    s4, s6 = m.socks
    assert (s4.family, s4.local, s4.remote, s4.uid) == ("inet", "127.0.0.1:5000", "-", 0)
    assert (s6.family, s6.local, s6.remote) == ("inet6", "[::1]:5001", "[::1]:7")
    assert s4.counters == {"requests": 10, "completions": 10, "bytes_out": 100,
                           "bytes_in": 100, "copies": 20, "fallbacks": 0, "errors": 0}
    j = m.to_json()
    assert j["state"] == "attached" and j["host_timeout_ms"] == 3000
    assert j["socks"][1]["requests"] == 3 and j["socks"][1]["local"] == "[::1]:5001"


def test_proc_file_keeps_unknown_keys_and_skips_unknown_lines() -> None:
    text = ("kbp_so state=host-dead epoch=7 queues=1 sockets=1 pinned_pages=0 orphan_pages=2 "
            "fallbacks=1 host_timeout_ms=3000 newkey=x\n"
            "queue id=0 depth=3\n"
            "sock ino=9 uid=1000 family=inet local=0.0.0.0:0 remote=- requests=1 completions=0 "
            "bytes_out=0 bytes_in=0 copies=0 fallbacks=0 errors=1 rtt_us=12\n")
    m = procfile.parse(text)
    assert m.state == "host-dead" and m.extra == {"newkey": "x"} and m.counters["epoch"] == 7
    assert len(m.socks) == 1 and m.socks[0].extra == {"rtt_us": "12"}
    assert m.socks[0].counters["errors"] == 1 and m.socks[0].uid == 1000


@pytest.mark.parametrize("text,what", [
    ("sock ino=1 uid=0\n", "no 'kbp_so state=...' line"),
    ("kbp_so epoch=1\n", "no state="),
    ("kbp_so state=attached epoch=x\n", "epoch is not a number"),
    ("kbp_so state=attached junk\n", "'junk' is not key=value"),
    ("kbp_so state=attached\nsock uid=0 family=inet\n", "no ino="),
])
def test_proc_file_refuses_malformed_lines(text: str, what: str) -> None:
    with pytest.raises(procfile.ProcFormatError, match=what):
        procfile.parse(text)


def test_socket_owners_finds_this_process_socket() -> None:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ino = os.fstat(s.fileno()).st_ino
        owners = procfile.socket_owners({ino, 1})
    assert (os.getpid(), Path("/proc/self/comm").read_text().strip()) in owners[ino]
    assert 1 not in owners


# -- the BTF reader ---------------------------------------------------------------------
def _btf(types: list[bytes], strings: bytes) -> bytes:
    body = b"".join(types)
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strings))
    return hdr + body + strings


def test_btf_reader_counts_types_of_every_size() -> None:
    strs = b"\0int\0s\0f\0update_socket_protocol\0"
    name = {n: strs.index(b"\0" + n.encode() + b"\0") + 1 for n in
            ("int", "s", "f", "update_socket_protocol")}
    types = [
        struct.pack("<III", name["int"], 1 << 24, 4) + struct.pack("<I", 32),     # 1 INT
        struct.pack("<III", name["s"], 4 << 24 | 2, 8) + bytes(24),                # 2 STRUCT
        struct.pack("<III", 0, 13 << 24 | 3, 1) + bytes(24),                       # 3 PROTO
        struct.pack("<III", name["f"], 12 << 24, 3),                               # 4 FUNC f
        struct.pack("<III", name["update_socket_protocol"], 17 << 24, 3) + bytes(4),  # 5 TAG
        struct.pack("<III", name["update_socket_protocol"], 12 << 24 | 1, 3),      # 6 FUNC
    ]
    blob = _btf(types, strs)
    assert btf.find_func(blob, "update_socket_protocol") == 6   # not the DECL_TAG (5)
    assert btf.find_func(blob, "f") == 4
    with pytest.raises(btf.BtfError, match="has no function 's'"):
        btf.find_func(blob, "s")
    with pytest.raises(btf.BtfError, match="has no 'nope'"):
        btf.find_func(blob, "nope")
    with pytest.raises(btf.BtfError, match="not BTF"):
        btf.find_func(b"\0" * 32, "f")


def test_btf_reader_on_this_kernel(tmp_path: Path) -> None:
    if not btf.VMLINUX.exists():
        pytest.skip(reason=f"{btf.VMLINUX} is missing (no CONFIG_DEBUG_INFO_BTF)")
    try:
        tid = btf.func_id("update_socket_protocol")
    except btf.BtfError as e:
        pytest.skip(reason=f"this kernel has no hook: {e}")
    data = btf.VMLINUX.read_bytes()
    assert tid > 1000
    assert btf.find_func(data, "__sys_socket") not in (tid, 0)
    with pytest.raises(btf.BtfError, match="has no 'kbp_no_such_function'"):
        btf.func_id("kbp_no_such_function")
    with pytest.raises(btf.BtfError, match="no BTF"):
        btf.func_id("update_socket_protocol", tmp_path / "none")


def test_missing_hook_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    if not btf.VMLINUX.exists():
        pytest.skip(reason=f"{btf.VMLINUX} is missing (no CONFIG_DEBUG_INFO_BTF)")
    monkeypatch.setattr(policy, "HOOK", "kbp_no_such_hook")
    with pytest.raises(Unavailable, match=r"no policy hook: .*6\.6 and later \(6\.1 has none"):
        policy.hook_btf_id()


# -- the program, run by a small interpreter of the instructions it uses ---------------------
def _run(code: bytes, family: int, typ: int, proto: int, cgroup: dict[int, int],
         current: int) -> int:
    """Execute the program for one socket() call; ``cgroup`` maps ancestor levels to ids,
    ``current`` is the task's own cgroup id."""
    ctx = [family, typ, proto]
    r = [0] * 11
    r[1] = -1     # ctx pointer
    ins = [struct.unpack_from("<BBhi", code, i) for i in range(0, len(code), 8)]
    pc, m32 = 0, 0xFFFFFFFF
    while True:
        op, regs, off, imm = ins[pc]
        dst, src = regs & 0xF, regs >> 4
        pc += 1
        if op == 0xBF:
            r[dst] = r[src]
        elif op == 0x79:
            assert r[src] == -1 and off % 8 == 0
            r[dst] = ctx[off // 8] & ((1 << 64) - 1)
        elif op == 0x18:
            r[dst] = (imm & m32) | (ins[pc][3] & m32) << 32
            pc += 1
        elif op == 0x54:
            r[dst] = (r[dst] & imm) & m32
        elif op in (0x16, 0x56):
            if ((r[dst] & m32) == (imm & m32)) == (op == 0x16):
                pc += off
        elif op == 0x5D:
            if r[dst] != r[src]:
                pc += off
        elif op == 0xB7:
            r[dst] = imm
        elif op == 0xB4:
            r[dst] = imm & m32
        elif op == 0xBC:
            r[dst] = r[src] & m32
        elif op == 0x85:
            r[0] = current if imm == prog.FUNC_GET_CURRENT_CGROUP_ID else cgroup.get(r[1], 0)
        elif op == 0x95:
            return r[0] & m32
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


AF, DG, ST = socket_consts = (2, 2, 1)
CG_ID = 0x1_0000_0042   # above 32 bits: the 64-bit compare and ld_imm64 matter


@pytest.mark.parametrize("families", [(prog.AF_INET,), (prog.AF_INET6,),
                                      (prog.AF_INET, prog.AF_INET6)])
def test_program_returns_253_exactly_for_the_policy_sockets(families: tuple[int, ...]) -> None:
    code = prog.policy_insns(families, CG_ID, 2)
    assert len(code) % 8 == 0 and len(code) // 8 <= 20
    inside = {0: 1, 1: 77, 2: CG_ID}        # the task is in a descendant of the cgroup
    outside = {0: 1, 1: 77, 2: 99}
    nb = 0o4000 | 0o2000000                 # SOCK_NONBLOCK | SOCK_CLOEXEC
    for fam in (prog.AF_INET, prog.AF_INET6, 1, 16):
        for typ, proto, udp in ((2, 0, True), (2 | nb, 0, True), (2, 17, True), (2, 6, False),
                                (1, 0, False), (1, 6, False), (3, 17, False), (5, 0, False)):
            want = 253 if (udp and fam in families) else proto
            assert _run(code, fam, typ, proto, inside, 5) == want, (fam, typ, proto)
            assert _run(code, fam, typ, proto, outside, 5) == proto, (fam, typ, proto)
    # an int argument's upper 32 bits are not the caller's: the compares are 32-bit
    assert _run(code, families[0] | 0xFFFF_0000_0000, 2, 0, inside, 5) == 253


def test_program_exact_cgroup_match_and_bad_families() -> None:
    code = prog.policy_insns((prog.AF_INET,), CG_ID, None)
    assert _run(code, 2, 2, 0, {}, CG_ID) == 253
    assert _run(code, 2, 2, 0, {2: CG_ID}, 5) == 0
    with pytest.raises(ValueError):
        prog.policy_insns((), 1, 0)
    with pytest.raises(ValueError):
        prog.policy_insns((1,), 1, 0)


def test_assembler_resolves_labels_across_the_wide_load() -> None:
    code = prog.assemble([prog.jeq32_imm(1, 0, "end"), prog.ld_imm64(2, 1 << 40), "end",
                          prog.exit_()])
    op, regs, off, imm = struct.unpack_from("<BBhi", code, 0)
    assert (op, regs, off, imm) == (0x16, 1, 2, 0)          # skips both slots of ld_imm64
    assert struct.unpack_from("<BBhi", code, 8) == (0x18, 2, 0, 0)
    assert struct.unpack_from("<BBhi", code, 16) == (0, 0, 0, 256)
    assert code[24] == 0x95


# -- the CLI's refusals: each says why and changes nothing ----------------------------------
def _kbpctl(*args: str, env: dict[str, str], pre: list[str] | None = None,
            python: str = sys.executable, src: str = SRC) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(pre or []), python, "-m", "kbp.cli", "outsource", *args],
                          env={**os.environ, **env, "PYTHONPATH": src}, capture_output=True,
                          text=True, timeout=120, cwd="/")


def _system() -> tuple[bool, bool, list[str]]:
    return (os.path.lexists(policy.PIN), os.path.lexists(policy.PIN_DIR),
            policy_scenario.bpffs_mounts())


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A private run dir; the test fails if the system's policy state changed."""
    before = _system()
    yield {"KBP_RUN_DIR": str(tmp_path / "run")}
    after = _system()
    assert after == before, f"the system changed: {before} -> {after}"
    assert not (tmp_path / "run" / "outsource.json").exists() or before[0]


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip(reason="the refusals after the root check need root")


def test_refuses_a_missing_cgroup(env: dict[str, str], tmp_path: Path) -> None:
    _need_root()
    p = _kbpctl("set", "--cgroup", str(tmp_path / "nope"), "--force", env=env)
    assert p.returncode == 2 and "does not exist" in p.stderr, p


def test_refuses_a_directory_that_is_not_cgroup_v2(env: dict[str, str], tmp_path: Path) -> None:
    _need_root()
    p = _kbpctl("set", "--cgroup", str(tmp_path), "--force", env=env)
    assert p.returncode == 2 and "is not a cgroup v2 directory" in p.stderr, p


def test_refuses_without_kbp_so_unless_forced(env: dict[str, str]) -> None:
    _need_root()
    if procfile.PROC_PATH.exists():
        pytest.skip(reason="kbp_so is loaded here")
    cg = policy_scenario.cgroup2_mount()
    p = _kbpctl("set", "--cgroup", cg, env=env)
    assert p.returncode == 69, p
    assert "kbp_so is not loaded (no /proc/kbp_so)" in p.stderr and "--force" in p.stderr


def test_refuses_a_second_policy(env: dict[str, str]) -> None:
    _need_root()
    run = Path(env["KBP_RUN_DIR"])
    run.mkdir()
    rec = run / "outsource.json"
    rec.write_text(json.dumps({"cgroup": "/sys/fs/cgroup/x", "prog_id": 1}))
    p = _kbpctl("set", "--cgroup", policy_scenario.cgroup2_mount(), "--force", env=env)
    assert p.returncode == 2, p
    assert "already set (cgroup /sys/fs/cgroup/x): run 'kbpctl outsource clear' first" \
        in p.stderr
    assert json.loads(rec.read_text())["prog_id"] == 1
    rec.unlink()


def test_refuses_non_root(env: dict[str, str]) -> None:
    python = "/usr/bin/python3"
    if shutil.which("setpriv") is None or not os.path.exists(python) or os.geteuid() != 0:
        pytest.skip(reason="needs root, setpriv and /usr/bin/python3 (readable by nobody)")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    # kbp's sources where nobody can read them (a checkout under /root, mode 0700, is not)
    readable = Path(tempfile.mkdtemp(prefix="kbp-outsource-run-"))
    try:
        readable.chmod(0o755)
        src = readable / "src"
        shutil.copytree(Path(SRC) / "kbp", src / "kbp",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d in (src, *src.rglob("*")):
            d.chmod(0o755 if d.is_dir() else 0o644)
        run_dir = readable / "run"
        run_dir.mkdir(mode=0o755)
        for args in (("set", "--cgroup", policy_scenario.cgroup2_mount(), "--force"),
                     ("clear",)):
            p = _kbpctl(*args, env=env, pre=as_nobody, python=python, src=str(src))
            assert p.returncode == 77, p
            assert "needs root (CAP_SYS_ADMIN and CAP_BPF missing)" in p.stderr, p
        p = _kbpctl("status", "--json", env={"KBP_RUN_DIR": str(run_dir)}, pre=as_nobody,
                    python=python, src=str(src))
    finally:
        shutil.rmtree(readable)
    assert p.returncode == 0 and json.loads(p.stdout)["schema"] == "kbpctl-outsource/1", p


def _load_refusal() -> str | None:
    """Why this kernel refuses the program (None: it takes it), by loading it for real
    (and closing it: a program that is not attached changes nothing)."""
    try:
        tid = btf.func_id(policy.HOOK)
    except btf.BtfError as e:
        return str(e)
    cg = policy.resolve_cgroup(policy_scenario.cgroup2_mount())
    try:
        fd = bpfsys.prog_load(prog.policy_insns((prog.AF_INET,), cg.id, cg.level),
                              policy.PROG_NAME, tid)
    except bpfsys.LoadError as e:
        return f"{e.strerror} [{errno.errorcode.get(e.errno or 0)}] {e.log}".strip()
    os.close(fd)
    return None


def test_a_kernel_that_refuses_the_program_is_quoted(env: dict[str, str]) -> None:
    _need_root()
    why = _load_refusal()
    if why is None:
        pytest.skip(reason="this kernel takes the program (test_policy_end_to_end runs)")
    p = _kbpctl("set", "--cgroup", policy_scenario.cgroup2_mount(), "--force", env=env)
    assert p.returncode == 69, p
    assert ("refused the policy program" in p.stderr or "no policy hook" in p.stderr), p
    assert why.split(" [")[0] in p.stderr, (why, p.stderr)


def test_clear_without_a_policy_says_so(env: dict[str, str]) -> None:
    _need_root()
    if os.path.lexists(policy.PIN):
        pytest.skip(reason=f"{policy.PIN} exists: a policy is set on this machine")
    for _ in range(2):
        p = _kbpctl("clear", env=env)
        assert p.returncode == 0 and "no outsource policy is set: nothing to clear" in p.stdout


def test_help_teaches() -> None:
    p = _kbpctl("--help", env={})
    assert p.returncode == 0
    for text in ("update_socket_protocol", "examples:", "refused, before anything changes",
                 "undo:", "kbpctl outsource clear", "--force"):
        assert text in p.stdout, text


def test_the_outsource_commands_import_no_pyroute2_or_rich() -> None:
    code = ("import sys, kbp.cli\nkbp.cli.build_parser(['outsource', 'status', '--json'])\n"
            "from kbp.outsource import command, policy\n"
            "print(sorted(m for m in sys.modules if m.startswith(('pyroute2.', 'rich', "
            "'kbp.backends', 'kbp.netdev'))))")   # 'pyroute2' alone: kbp._pyroute2's stub
    p = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": SRC},
                       capture_output=True, text=True, check=True, timeout=60)
    assert p.stdout.strip() == "[]", p.stdout


# -- end to end ------------------------------------------------------------------------------
def test_policy_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _need_root()
    why = _load_refusal()
    if why is not None:
        pytest.skip(reason=f"this kernel refuses the policy program ({why}); the VM test "
                           "(KBP_SO_VM=1) runs this scenario on 6.12 and 7.2")
    monkeypatch.setenv("KBP_RUN_DIR", str(tmp_path / "run"))
    with access.Journal() as undo:
        undo.defer(_kbpctl, "clear", env={"KBP_RUN_DIR": str(tmp_path / "run")})
        policy_scenario.run(log=lambda s: None)


# flavour: whether its kernel has the hook
VM_FLAVOURS = {"6.12-amd64": True, "6.12-rt-amd64": True, "7.2-amd64": True,
               "7.2-rt-amd64": True, "6.1-amd64": False}
VM_DEFAULT = ("6.12-amd64", "7.2-amd64", "6.1-amd64")


@pytest.mark.parametrize("flavour", sorted(VM_FLAVOURS))
def test_policy_in_vm(flavour: str) -> None:
    """KBP_SO_VM=1: the scenario in 6.12 and 7.2, the refusal in 6.1 (~1 min each);
    KBP_SO_VM_FLAVOUR=F[,F...] picks others (the -rt ones too)."""
    if os.environ.get("KBP_SO_VM") != "1":
        pytest.skip(reason="boots QEMU (~1 min each): set KBP_SO_VM=1")
    picked = os.environ.get("KBP_SO_VM_FLAVOUR", "")
    if flavour not in (picked.split(",") if picked else VM_DEFAULT):
        pytest.skip(reason=f"{flavour}: not picked (KBP_SO_VM_FLAVOUR={picked or 'unset'})")
    if Path("/work/main/.quiet").exists():
        pytest.skip(reason="/work/main/.quiet: no VM runs now")
    if VM_FLAVOURS[flavour]:
        inner = "python3 tests/outsource/policy_scenario.py"
    else:
        inner = (f"PYTHONPATH={SRC} python3 -m kbp.cli outsource set --cgroup /sys/fs/cgroup "
                 "--force; echo kbpctl-rc=$?; test ! -e /sys/fs/bpf/kbp")
    p = subprocess.run([sys.executable, "-m", "vm", "run", flavour, "--", "sh", "-c", inner],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    if VM_FLAVOURS[flavour]:
        assert p.returncode == 0 and "policy scenario: PASS" in p.stdout, p.stdout[-3000:]
    else:
        assert p.returncode == 0 and "kbpctl-rc=69" in p.stdout, p.stdout[-3000:]
        assert "has no policy hook" in p.stdout + p.stderr


# -- status and the module check, on a /proc/kbp_so written by the test ----------------------
def test_status_shows_the_module_and_each_socket_with_its_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from kbp.outsource import command
    monkeypatch.setenv("KBP_RUN_DIR", str(tmp_path / "run"))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ino = os.fstat(s.fileno()).st_ino
        fake = tmp_path / "kbp_so"
        fake.write_text(PROC_TEXT.replace("ino=12345", f"ino={ino}"))
        monkeypatch.setattr(procfile, "PROC_PATH", fake)
        st = policy.status()
    assert st["schema"] == "kbpctl-outsource/1" and st["policy"] is None
    assert st["module"] == {"state": "attached", "epoch": 1, "queues": 2, "sockets": 2,
                            "pinned_pages": 0, "orphan_pages": 0, "fallbacks": 0,
                            "host_timeout_ms": 3000}
    mine, other = st["sockets"]
    assert mine["ino"] == ino and mine["copies"] == 20 and mine["bytes_out"] == 100
    assert {"pid": os.getpid(), "comm": Path("/proc/self/comm").read_text().strip()} \
        in mine["owners"]
    assert other["owners"] == [] and other["remote"] == "[::1]:7"
    text = "\n".join(command.status_lines(st))
    assert "kbp_so: state=attached epoch=1 queues=2" in text
    assert f"ino {ino} inet 127.0.0.1:5000 -> - uid 0 [{os.getpid()}/" in text
    assert "requests=10 completions=10 bytes_out=100 bytes_in=100 copies=20" in text
    assert "no process]: requests=3" in text


@pytest.mark.parametrize("state,refused", [("attached", None), ("detached", "ENETDOWN"),
                                           ("host-dead", "ENETDOWN"), (None, "EPROTONOSUPPORT")])
def test_module_check(state: str | None, refused: str | None, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "kbp_so"
    if state is not None:
        fake.write_text(f"kbp_so state={state} epoch=1 queues=1 sockets=0\n")
    monkeypatch.setattr(procfile, "PROC_PATH", fake)
    if refused is None:
        mod = policy.check_module(False)
        assert mod is not None and mod.state == "attached"
    else:
        with pytest.raises(Unavailable, match=f"{refused}.*--force"):
            policy.check_module(False)
    forced = policy.check_module(True)
    assert (forced.state if forced else None) == state


@pytest.mark.parametrize("fail", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()])
def test_a_failure_half_way_undoes_what_set_made(fail: BaseException, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of set made (here: in a scratch directory, with the mount and the bpf
    calls stood in for), then the last one fails: all of it is undone, last first."""
    calls: list[str] = []
    bpffs = tmp_path / "bpf"
    bpffs.mkdir()
    monkeypatch.setenv("KBP_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(policy, "BPFFS", str(bpffs))
    monkeypatch.setattr(policy, "PIN_DIR", str(bpffs / "kbp"))
    monkeypatch.setattr(policy, "PIN", str(bpffs / "kbp" / "outsource"))
    monkeypatch.setattr(policy, "_is_bpffs", lambda p: False)
    monkeypatch.setattr(bpfsys, "mount_bpffs", lambda p: calls.append(f"mount {p}"))
    monkeypatch.setattr(bpfsys, "umount", lambda p: calls.append(f"umount {p}"))
    monkeypatch.setattr(bpfsys, "link_create", lambda fd: os.open("/dev/null", os.O_RDONLY))
    monkeypatch.setattr(bpfsys, "obj_pin", lambda fd, p: Path(p).write_text(""))
    monkeypatch.setattr(bpfsys, "link_ids", lambda fd: (7, 8))

    def save(path: Path, data: dict[str, object]) -> None:
        assert data["mounted_bpffs"] is True and data["made_pin_dir"] is True
        raise fail

    monkeypatch.setattr(access, "save_json", save)
    cg = policy.Cgroup("/sys/fs/cgroup/x", 42, 1, "/x")
    want = OperationFailed if isinstance(fail, OSError) else KeyboardInterrupt
    with pytest.raises(want) as exc:
        policy._install(cg, (prog.AF_INET,), 1, -1, True, None)
    if want is OperationFailed:
        assert "nothing left changed: Input/output error [EIO]" in str(exc.value)
    assert calls == [f"mount {bpffs}", f"umount {bpffs}"]
    assert list(bpffs.iterdir()) == []
    assert not (tmp_path / "run" / "outsource.json").exists()
