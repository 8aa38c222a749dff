"""The stock backend's ``--mode busy`` on a virtio NIC: upstream's threaded busy polling
(``napi-set threaded busy-poll``, Linux 6.19+), driven by kbpctl without the module.

On older guests these tests are skipped with the reason; on the 7.2 flavours they are the
only place the stock backend's busy mode runs (the host kernel, 6.18, lacks it).

Upstream's busy-polling kthread never sleeps once woken and yields only at cond_resched():
kbpctl leaves it SCHED_NORMAL, where CFS shares its CPU fairly, and refuses a SCHED_FIFO
priority (at FIFO 50 it took 100 % of its CPU: every SCHED_OTHER task there starved but for
RT throttling's 5 %)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import pytest
from conftest import POLL_CPU, Flow, net_rx_softirqs, spinning, wait_for
from test_hardening import cpu_share, kill, running_on, spin
from test_kbpctl_kmod import kbpctl

from kbp import netdev

MIN = (6, 19)


def _release() -> tuple[int, int]:
    major, minor = platform.release().split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


pytestmark = pytest.mark.skipif(
    _release() < MIN, reason=f"threaded busy polling (NAPI threaded=2) is in Linux 6.19 and "
                             f"later; this guest runs {platform.release()}")


def napi_states(nic: str) -> dict[int, tuple[int | None, int | None]]:
    """NAPI id -> (threaded, pid) as the kernel's netdev family reports them."""
    with netdev.NetdevClient() as c:
        ifindex = int(Path(f"/sys/class/net/{nic}/ifindex").read_text())
        return {n.id: (n.threaded, n.pid) for n in c.napis(ifindex)}


def sched_of(pid: int) -> tuple[int, list[int]]:
    st = os.sched_getparam(pid).sched_priority
    return st, sorted(os.sched_getaffinity(pid))


def policy_of(pid: int) -> int:
    return os.sched_getscheduler(pid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)


@pytest.mark.smoke
def test_stock_busy_polls_from_napi_threads_and_restores(flow: Flow) -> None:
    nic = flow.t.nic0
    before = napi_states(nic)
    sysfs_before = Path(f"/sys/class/net/{nic}/threaded").read_text().strip()
    assert before and all(t in (0, None) for t, _ in before.values()), before

    out = kbpctl("enable", nic, "--backend", "stock", "--mode", "busy",
                 "--cpus", str(POLL_CPU))
    assert "busy NAPI thread" in out.stderr, out.stderr  # the notice of what busy costs
    assert "SCHED_NORMAL" in out.stdout and "SCHED_FIFO" not in out.stdout, out.stdout
    now = napi_states(nic)
    assert set(now) == set(before)
    assert all(t == netdev.THREADED_BUSY_POLL for t, _ in now.values()), now
    pids = [p for _, p in now.values() if p]
    assert pids, now
    for pid in pids:
        # SCHED_NORMAL by default: its cond_resched() then shares the CPU under CFS
        assert (policy_of(pid), sched_of(pid)) == (os.SCHED_OTHER, (0, [POLL_CPU]))

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
        print(f"napi kthread {pid}: policy {policy_of(pid)} priority {sched_of(pid)[0]}, "
              f"{cpu_share(pid, 2.0):.0%} of its CPU with no traffic")

    # A SCHED_OTHER task pinned to the polling CPU gets its fair share (at SCHED_FIFO 50:
    # only RT throttling's 5 %).
    hog = spin(POLL_CPU)
    try:
        wait_for(lambda: running_on(hog, POLL_CPU), 30, what="the hog to run")
        share = cpu_share(hog.pid, 3.0)
        polled = {pid: spinning(pid, 1.0) for pid in pids}
    finally:
        kill(hog)
    print(f"share of the busy NAPI thread's CPU for a pinned SCHED_OTHER hog: {share:.0%}; "
          f"kthreads still runnable beside it: {polled}")
    assert share > 0.3, f"a task pinned to the busy NAPI thread's CPU got {share:.0%} of it"

    status = json.loads(kbpctl("status", "--json").stdout)
    assert nic in json.dumps(status)
    (dev,) = [d for d in status["devices"] if d["name"] == nic]
    assert (dev["backend"], dev["mode"], dev["rt_prio"], dev["problems"]) == \
        ("stock", "busy", 0, [])  # SCHED_NORMAL is what was asked for: no drift

    kbpctl("disable", nic)
    after = napi_states(nic)
    assert {i: t for i, (t, _) in after.items()} == {i: t for i, (t, _) in before.items()}
    assert Path(f"/sys/class/net/{nic}/threaded").read_text().strip() == sysfs_before
    # Nothing spins on the CPU any more.
    time.sleep(0.5)
    assert not any(os.path.exists(f"/proc/{p}") and spinning(p, 1.0) for p in pids)


def test_stock_busy_refuses_a_fifo_priority_changing_nothing(flow: Flow) -> None:
    """``--rt-prio 50`` with the stock backend's busy: refused (exit 2, one line saying why
    and what to do instead) before anything changes."""
    nic = flow.t.nic0
    before = napi_states(nic)
    snap = kbpctl("snapshot", nic).stdout
    p = kbpctl("enable", nic, "--backend", "stock", "--mode", "busy", "--cpus", str(POLL_CPU),
               "--rt-prio", "50", check=False)
    print(p.stderr)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("kbpctl: --rt-prio 50 with the stock backend's --mode busy")
    flat = p.stderr
    assert "cond_resched()" in flat and "SCHED_NORMAL" in flat and "--backend kmod" in flat
    assert napi_states(nic) == before
    assert kbpctl("snapshot", nic).stdout == snap
    assert not any(Path("/run/kbp-guest-test").glob("**/*.jsonl"))
    assert nic not in {d["name"] for d in json.loads(kbpctl("status", "--json").stdout)[
        "devices"] if d["backend"]}
