"""The outsource policy end to end, on whatever kernel runs it (root, cgroup v2, no kbp_so):
``set --force`` redirects the UDP sockets of a cgroup's processes to protocol 253, which has
no handler without kbp_so, so their ``socket()`` fails with EPROTONOSUPPORT -- the proof of
the redirect -- while their TCP sockets, the UDP sockets of other processes and the
families not asked for keep working; ``clear`` puts everything back.

Used by tests/outsource/test_policy.py on the host and, in the VMs, run directly:
``python3 tests/outsource/policy_scenario.py`` (exit 0: every check passed).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[2] / "src")
PIN = "/sys/fs/bpf/kbp/outsource"
NB = socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC

# name: (family, type, protocol)
PROBES: dict[str, tuple[int, int, int]] = {
    "udp4": (socket.AF_INET, socket.SOCK_DGRAM, 0),
    "udp4_proto": (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP),
    "udp4_nb_cloexec": (socket.AF_INET, socket.SOCK_DGRAM | NB, 0),
    "udp6": (socket.AF_INET6, socket.SOCK_DGRAM, 0),
    "udp6_nb_cloexec": (socket.AF_INET6, socket.SOCK_DGRAM | NB, 0),
    "tcp4": (socket.AF_INET, socket.SOCK_STREAM, 0),
    "tcp6": (socket.AF_INET6, socket.SOCK_STREAM, 0),
}

_CHILD = r"""
import json, os, socket, sys
probes = json.loads(sys.argv[1])
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "join":
        with open(os.path.join(cmd[1], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        print(json.dumps("ok"), flush=True)
    elif cmd[0] == "probe":
        out = {}
        for name, (fam, typ, proto) in probes.items():
            try:
                socket.socket(fam, typ, proto).close()
                out[name] = 0
            except OSError as e:
                out[name] = e.errno
        print(json.dumps(out), flush=True)
"""


class Child:
    """A long-lived process that can join a cgroup and try each socket of PROBES."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", "-c", _CHILD, json.dumps(PROBES)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _ask(self, line: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def join(self, cgroup: str) -> None:
        assert self._ask(f"join {cgroup}") == "ok"

    def probe(self) -> dict[str, int]:
        return dict(self._ask("probe"))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(10)


def kbpctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "kbp.cli", "outsource", *args], env=env,
                       capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, f"kbpctl outsource {' '.join(args)}: {p.returncode} " \
                                  f"{p.stdout}{p.stderr}"
    return p


def cgroup2_mount() -> str:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.startswith("cgroup2 "):
            return pre.split()[4]
    raise RuntimeError("no cgroup2 mount")


@contextlib.contextmanager
def scratch_cgroup() -> Iterator[str]:
    """CG-PID with a child cgroup ``sub``; removed on the way out (its processes must have
    exited)."""
    cg = os.path.join(cgroup2_mount(), f"kbp-policy-test-{os.getpid()}")
    os.mkdir(cg)
    os.mkdir(os.path.join(cg, "sub"))
    try:
        yield cg
    finally:
        for d in (os.path.join(cg, "sub"), cg):
            with contextlib.suppress(OSError):
                os.rmdir(d)


def bpffs_mounts() -> list[str]:
    """The mountinfo lines of /sys/fs/bpf (set may mount bpffs; clear must undo just that)."""
    return [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if ln.split()[4] == "/sys/fs/bpf"]


def expect(got: dict[str, int], redirected: set[str], what: str) -> None:
    want = {n: (errno.EPROTONOSUPPORT if n in redirected else 0) for n in PROBES}
    assert got == want, f"{what}: socket() errnos {got}, expected {want}"


V4 = {"udp4", "udp4_proto", "udp4_nb_cloexec"}
V6 = {"udp6", "udp6_nb_cloexec"}


def run(log: Any = print) -> None:
    """Every check; AssertionError names the first that failed.  Clears the policy on the
    way out whatever happened."""
    assert not os.path.lexists(PIN), f"{PIN} exists before the test: not starting"
    mounts = bpffs_mounts()
    had_dir = os.path.lexists(os.path.dirname(PIN))
    with scratch_cgroup() as cg:
        inside, below, outside = Child(), Child(), Child()
        try:
            inside.join(cg)
            below.join(os.path.join(cg, "sub"))
            expect(inside.probe(), set(), "before set")
            # KBP_SO_POLICY_FAMILIES: a subset (the VM test of kbp_so runs one: its boot
            # also serves inet sockets through the real module)
            only = os.environ.get("KBP_SO_POLICY_FAMILIES", "inet,inet6,both").split(",")
            for family, redirected in (("inet", V4), ("inet6", V6), ("both", V4 | V6)):
                if family not in only:
                    continue
                p = kbpctl("set", "--cgroup", cg, "--family", family, "--force")
                log(f"set --family {family}: {p.stdout.strip()} {p.stderr.strip()}")
                assert os.path.lexists(PIN)
                expect(inside.probe(), redirected, f"--family {family}, in the cgroup")
                expect(below.probe(), redirected, f"--family {family}, in a child cgroup")
                expect(outside.probe(), set(), f"--family {family}, outside the cgroup")
                st = json.loads(kbpctl("status", "--json").stdout)["policy"]
                assert st["cgroup"] == os.path.realpath(cg), st
                assert st["link"] == "attached" and st["families"] == (
                    ["inet", "inet6"] if family == "both" else [family]), st
                again = kbpctl("set", "--cgroup", cg, "--force", check=False)
                assert again.returncode == 2 and "already set" in again.stderr, again
                same = json.loads(kbpctl("status", "--json").stdout)["policy"]
                assert same["prog_id"] == st["prog_id"], (same, st)
                p = kbpctl("clear")
                log(f"clear: {p.stdout.strip()}")
                assert not os.path.lexists(PIN)
                assert os.path.lexists(os.path.dirname(PIN)) == had_dir
                assert bpffs_mounts() == mounts, (bpffs_mounts(), mounts)
                expect(inside.probe(), set(), f"after clear of --family {family}")
                assert json.loads(kbpctl("status", "--json").stdout)["policy"] is None
            p = kbpctl("clear")
            assert "nothing to clear" in p.stdout, p.stdout
        finally:
            kbpctl("clear", check=False)
            for c in (inside, below, outside):
                c.close()


if __name__ == "__main__":
    run()
    print("policy scenario: PASS")
