"""Console markers and the kernel-splat scan."""

from __future__ import annotations

import re

import pytest

from vm import console
from vm.console import ConsoleWatcher, find_splat

NONCE = "0123456789abcdef"


def watch(lines: list[str], **kw: object) -> ConsoleWatcher:
    w = ConsoleWatcher(NONCE, **kw)  # type: ignore[arg-type]
    for i, line in enumerate(lines):
        w.feed(line, float(i))
    return w


def test_markers() -> None:
    w = watch(["boot...", f"KBP-VM-START {NONCE} 3.16", "output", f"KBP-VM-EXIT {NONCE} 3"])
    assert w.started_at == 1.0
    assert w.guest_uptime_at_start == 3.16
    assert w.exit_code == 3


def test_marker_with_other_nonce_is_ignored() -> None:
    w = watch([f"KBP-VM-START {'f' * 16}", f"KBP-VM-EXIT {'f' * 16} 0"])
    assert w.started_at is None and w.exit_code is None


def test_marker_after_interleaved_kernel_text() -> None:
    w = watch([f"[    5.000000] virtio_net: fooKBP-VM-EXIT {NONCE} 0"])
    assert w.exit_code == 0


def test_first_exit_marker_wins() -> None:
    w = watch([f"KBP-VM-EXIT {NONCE} 1", f"KBP-VM-EXIT {NONCE} 0"])
    assert w.exit_code == 1


def test_fatal_line() -> None:
    w = watch(["kbp-vm-init: FATAL: cannot mount the host root", f"KBP-VM-EXIT {NONCE} 125"])
    assert w.fatal == "cannot mount the host root"


@pytest.mark.parametrize(("line", "label"), [
    ("[   12.345678] BUG: kernel NULL pointer dereference, address: 0000000000000008", "BUG"),
    ("[   12.345678] kernel BUG at net/core/dev.c:1234!", "BUG"),
    ("[    3.000001] WARNING: CPU: 1 PID: 42 at net/core/dev.c:6789 napi_x+0x1/0x2 [kbp]",
     "WARNING"),
    ("[    3.000001] Oops: general protection fault, probably for non-canonical address",
     "Oops"),
    ("[    3.000001] general protection fault, probably for non-canonical address 0x1",
     "general protection fault"),
    ("[  120.000000] INFO: task kworker/0:1:17 blocked for more than 120 seconds.",
     "hung task"),
    ("[   30.000000] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:", "RCU stall"),
    ("[   30.000000] BUG: soft lockup - CPU#1 stuck for 22s! [kbp/1:99]", "BUG"),
    ("[    9.000000] Kernel panic - not syncing: Fatal exception", "panic"),
    ("[    9.000000] WARNING: possible circular locking dependency detected", "WARNING"),
    ("[    9.000000] UBSAN: array-index-out-of-bounds in net/core/dev.c:1:2", "UBSAN"),
    ("[    9.000000][ T1] BUG: sleeping function called from invalid context", "BUG"),
    ("....[   14.083816] WARNING: CPU: 0 PID: 0 at kernel/x.c:1 f+0x0/0x1", "WARNING"),
])
def test_splats(line: str, label: str) -> None:
    assert find_splat(line) == label


@pytest.mark.parametrize("line", [
    "WARNING: this is pytest or the command, not the kernel",
    "E   AssertionError: BUG: in the test itself",
    "[    0.000000] Linux version 6.12.117+deb12-amd64",
    "[   14.083816] clocksource: timekeeping watchdog on CPU0: marking tsc unstable",
    "[    2.000000] kbp: refused: no device kbpnosuch0",
])
def test_not_splats(line: str) -> None:
    assert find_splat(line) is None


def test_watcher_collects_and_allows() -> None:
    lines = ["[    1.000000] WARNING: CPU: 0 PID: 1 at drivers/foo.c:1 foo+0x0/0x1",
             "[    2.000000] BUG: soft lockup - CPU#0 stuck for 22s!"]
    w = watch(lines)
    assert [s.label for s in w.splats] == ["WARNING", "BUG"]
    w = watch(lines, allow=(re.compile(r"drivers/foo\.c"),))
    assert [s.label for s in w.splats] == ["BUG"] and w.allowed_splats == 1
    w = watch(lines, splat_check=False)
    assert w.splats == []


# -- QEMU TCG's stale INT3 (vm/README.md, "Oops: int3") --------------------------------------
# The CI console of 2026-11-29 (6.12-rt, test_citizenship's function tracer on and off): the
# Code: line shows the 5-byte NOP back in place (0f <1f> 44 00 00), yet the CPU trapped on
# the INT3 that had been written over its first byte.
STALE_INT3 = [
    "[   15.834318] Oops: int3: 0000 [#1] PREEMPT_RT SMP NOPTI",
    "[   15.834803] CPU: 1 UID: 0 PID: 34 Comm: ksoftirqd/1 Tainted: G           OE      "
    "6.12.117+deb12-rt-amd64 #1  Debian 6.12.117-1~deb12u1",
    "[   15.835366] RIP: 0010:__schedule+0x339/0xbf0",
    "[   15.835698] Code: a8 48 89 45 b8 0f 85 42 07 00 00 41 83 7d 68 01 ba 01 00 00 00 75 0d "
    "31 d2 41 80 bd d1 00 00 00 00 0f 95 c2 e9 70 03 00 00 0f <1f> 44 00 00 48 8b 83 88 0a 00 "
    "00 49 39 c5 74 4e 83 bb a8 0a 00 00",
    "[   15.838531] Modules linked in: kbp(OE) overlay 9p",
    "[   15.839370] Kernel panic - not syncing: Fatal exception in interrupt",
]


def test_stale_int3_reads_the_byte_before_rip() -> None:
    assert console.stale_int3(STALE_INT3[3]) is True
    assert console.stale_int3("[ 1.0] Code: 00 00 cc <1f> 44 00 00") is False   # still there
    assert console.stale_int3("[ 1.0] Code: 00 00 0f 1f 44 00 00") is None      # no RIP mark
    assert console.stale_int3("[ 1.0] Code: <1f> 44 00 00") is None             # nothing before
    assert console.stale_int3("[ 1.0] RIP: 0010:x+0x1/0x2") is None


def test_a_run_that_failed_only_on_a_stale_int3_is_told_apart() -> None:
    w = watch(STALE_INT3)
    assert [s.label for s in w.splats] == ["Oops", "panic"]
    assert w.int3_stale == [True] and w.only_stale_int3()


def test_anything_else_in_the_run_keeps_it_a_failure() -> None:
    # the INT3 still in memory: a real trap
    real = [ln.replace("0f <1f>", "cc <1f>") for ln in STALE_INT3]
    assert not watch(real).only_stale_int3()
    # another splat besides
    bug = "[   16.000000] BUG: sleeping function called"
    assert not watch([*STALE_INT3, bug]).only_stale_int3()
    # no Code: line to prove it
    assert not watch([ln for ln in STALE_INT3 if "Code:" not in ln]).only_stale_int3()
    # another oops, not an int3
    assert not watch(["[ 1.000000] Oops: general protection fault"]).only_stale_int3()
