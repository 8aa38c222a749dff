"""The stock backend's ``--mode busy`` on a virtio NIC: upstream's threaded busy polling
(``napi-set threaded busy-poll``, Linux 6.19+), driven by kbpctl without the module.

On older guests these tests are skipped with the reason; on the 7.2 flavours they are the
only place the stock backend's busy mode runs (the host kernel, 6.18, lacks it)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import POLL_CPU, Flow, net_rx_softirqs, spinning

from kbp import netdev

MIN = (6, 19)


def _release() -> tuple[int, int]:
    major, minor = platform.release().split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


pytestmark = pytest.mark.skipif(
    _release() < MIN, reason=f"threaded busy polling (NAPI threaded=2) is in Linux 6.19 and "
                             f"later; this guest runs {platform.release()}")


def kbpctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("kbpctl") or os.path.join(os.path.dirname(os.environ.get(
        "KBP_PYTHON", "python3")), "kbpctl")
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KBP_RUN_DIR": "/run/kbp-guest-test"})
    if check:
        assert p.returncode == 0, f"kbpctl {' '.join(args)}: {p.returncode} {p.stderr}"
    return p


def napi_states(nic: str) -> dict[int, tuple[int | None, int | None]]:
    """NAPI id -> (threaded, pid) as the kernel's netdev family reports them."""
    with netdev.NetdevClient() as c:
        ifindex = int(Path(f"/sys/class/net/{nic}/ifindex").read_text())
        return {n.id: (n.threaded, n.pid) for n in c.napis(ifindex)}


def cpu_share(pid: int, seconds: float = 2.0) -> float:
    def ticks() -> int:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    t0, c0 = time.monotonic(), ticks()
    time.sleep(seconds)
    return (ticks() - c0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)


def sched_of(pid: int) -> tuple[int, list[int]]:
    st = os.sched_getparam(pid).sched_priority
    return st, sorted(os.sched_getaffinity(pid))


@pytest.mark.smoke
def test_stock_busy_polls_from_napi_threads_and_restores(flow: Flow) -> None:
    nic = flow.t.nic0
    before = napi_states(nic)
    sysfs_before = Path(f"/sys/class/net/{nic}/threaded").read_text().strip()
    assert before and all(t in (0, None) for t, _ in before.values()), before

    out = kbpctl("enable", nic, "--backend", "stock", "--mode", "busy",
                 "--cpus", str(POLL_CPU))
    assert "busy NAPI thread" in out.stderr, out.stderr  # the notice of what busy costs
    now = napi_states(nic)
    assert set(now) == set(before)
    assert all(t == netdev.THREADED_BUSY_POLL for t, _ in now.values()), now
    pids = [p for _, p in now.values() if p]
    assert pids, now
    for pid in pids:
        assert sched_of(pid)[1] == [POLL_CPU]

    n = 2000
    flow.start_sink(expect=n)
    rx0 = net_rx_softirqs()[POLL_CPU]
    flow.send(n, rate=2000)
    got = flow.result()
    assert got["unique"] == n, got
    # The kthreads took the packets: NET_RX softirq on the polling CPU barely moved.
    assert net_rx_softirqs()[POLL_CPU] - rx0 < n // 10
    # Threaded busy polling: once the first interrupt woke a kthread it keeps its NAPI and
    # spins, traffic or not (napi_complete_done() returns false in IN_BUSY_POLL).
    assert any(spinning(pid) for pid in pids)
    for pid in pids:
        print(f"napi kthread {pid}: priority {sched_of(pid)[0]}, "
              f"{cpu_share(pid):.0%} of its CPU with no traffic")

    status = json.loads(kbpctl("status", "--json").stdout)
    assert nic in json.dumps(status)

    kbpctl("disable", nic)
    after = napi_states(nic)
    assert {i: t for i, (t, _) in after.items()} == {i: t for i, (t, _) in before.items()}
    assert Path(f"/sys/class/net/{nic}/threaded").read_text().strip() == sysfs_before
    # Nothing spins on the CPU any more.
    time.sleep(0.5)
    assert not any(os.path.exists(f"/proc/{p}") and spinning(p, 1.0) for p in pids)
