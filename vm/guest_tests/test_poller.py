"""The poller carries the traffic, in each mode, on a real virtio-net NIC."""

from __future__ import annotations

import os
import re
import time

import pytest
from conftest import (
    NS,
    POLL_CPU,
    SERVER_IP,
    Flow,
    Topo,
    net_rx_softirqs,
    sh,
    spawn,
    spinning,
    stop,
    task_cpu_ticks,
    task_state,
    wait_for,
)

MODES = ["busy", "hybrid"]


@pytest.mark.smoke
def test_module_loads_and_family_resolves(kmod) -> None:
    assert os.path.isdir("/sys/module/kbp")
    assert kmod.pollers() == []
    assert kmod.devices() == []


@pytest.mark.parametrize("mode", MODES)
def test_sockperf_pingpong(kmod, topo: Topo, mode: str) -> None:
    """An unmodified UDP server answers ping-pong across the two NICs."""
    dev = kmod.attach(topo.nic0, cpu=POLL_CPU, mode=mode)
    assert dev is not None and dev.napi_count and dev.napi_count >= 1
    server = spawn(["taskset", "-c", str(POLL_CPU), "sockperf", "server", "-i", SERVER_IP,
                    "-p", "11111"])
    try:
        time.sleep(1.0)
        before = kmod.poller(POLL_CPU).packets or 0
        out = sh(f"sockperf ping-pong -i {SERVER_IP} -p 11111 -t 3 --mps 200", ns=NS).stdout
    finally:
        stop(server)
    m = re.search(r"Total (\d+) observations", out)
    assert m and int(m.group(1)) > 50, out
    assert re.search(r"# dropped messages = 0\b", out), out
    assert (kmod.poller(POLL_CPU).packets or 0) - before >= int(m.group(1))


@pytest.mark.smoke
@pytest.mark.parametrize("mode", MODES)
def test_poller_carries_traffic_not_softirq(kmod, flow: Flow, mode: str) -> None:
    """The poller's packet counter grows by the packets sent while NET_RX does not."""
    n = 2000
    # baseline: the same traffic through stock NAPI raises NET_RX
    flow.start_sink(expect=n)
    rx0 = net_rx_softirqs()
    flow.send(n, rate=1000)
    stock = flow.result()
    stock_softirqs = net_rx_softirqs()[POLL_CPU] - rx0[POLL_CPU]
    # the baseline only has to show stock NAPI at work; the kernel's own path may drop a few
    # when TCG stalls the sink's vCPU (1923 of 2000 on 6.1 on a loaded host, stop 18): kbp's
    # run below must deliver every one
    assert stock["unique"] >= 0.95 * n, f"stock NAPI delivered {stock['unique']} of {n}"
    assert stock_softirqs > n // 20, f"stock NAPI raised only {stock_softirqs} NET_RX"

    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode=mode)
    flow.start_sink(expect=n)
    p0, rx0 = kmod.poller(POLL_CPU), net_rx_softirqs()
    dev0 = kmod.device(flow.t.nic0)
    flow.send(n, rate=1000)
    res = flow.result()
    p1, rx1 = kmod.poller(POLL_CPU), net_rx_softirqs()
    dev1 = kmod.device(flow.t.nic0)

    assert res["unique"] == n
    assert p1.packets - p0.packets >= n
    assert dev1.packets - dev0.packets >= n
    assert dev1.polls > dev0.polls
    # NIC0's interrupts land on the poller's CPU: there NET_RX no longer grows
    assert rx1[POLL_CPU] - rx0[POLL_CPU] < max(20, stock_softirqs // 20), (rx0, rx1)


@pytest.mark.smoke
def test_hybrid_sleeps_when_idle_and_wakes_per_burst(kmod, flow: Flow) -> None:
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid")
    p = kmod.poller(POLL_CPU)
    wait_for(lambda: task_state(p.pid) == "S", 5, what="hybrid poller to sleep")
    time.sleep(1.0)
    idle0 = kmod.poller(POLL_CPU)
    time.sleep(1.0)
    idle1 = kmod.poller(POLL_CPU)
    assert idle1.wakeups - idle0.wakeups <= 5, "an idle hybrid poller keeps waking up"
    assert task_state(p.pid) == "S"

    bursts, per_burst = 20, 8
    flow.start_sink(expect=bursts * per_burst)
    a = kmod.poller(POLL_CPU)
    flow.send(bursts * per_burst, rate=per_burst * 10, burst=per_burst)   # 10 bursts/s
    res = flow.result()
    b = kmod.poller(POLL_CPU)
    assert res["unique"] == bursts * per_burst
    assert b.packets - a.packets >= bursts * per_burst
    woke = b.wakeups - a.wakeups
    assert bursts <= woke <= bursts * per_burst + 20, f"{woke} wakeups for {bursts} bursts"
    assert b.sleeps - a.sleeps >= bursts
    assert b.sleep_ns > a.sleep_ns
    wait_for(lambda: task_state(p.pid) == "S", 5, what="hybrid poller to sleep again")


def test_busy_poller_never_sleeps(kmod, flow: Flow) -> None:
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="busy")
    p0 = kmod.poller(POLL_CPU)
    time.sleep(0.5)
    assert spinning(p0.pid)
    flow.start_sink(expect=500)
    flow.send(500, rate=500)
    assert flow.result()["unique"] == 500
    time.sleep(0.5)
    p1 = kmod.poller(POLL_CPU)
    assert spinning(p1.pid)
    assert p1.sleeps == p0.sleeps == 0
    assert p1.wakeups == 0
    assert p1.passes > p0.passes + 1000
    assert p1.empty_passes > p0.empty_passes
    assert p1.packets - p0.packets >= 500


@pytest.mark.parametrize("mode", MODES)
def test_zero_loss_10000_packets(kmod, flow: Flow, mode: str) -> None:
    n = 10_000
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode=mode)
    flow.start_sink(expect=n, timeout=120)
    p0 = kmod.poller(POLL_CPU)
    sent = flow.send(n, rate=2000)
    res = flow.result()
    p1 = kmod.poller(POLL_CPU)
    assert sent["sent"] == n
    assert res["unique"] == n, f"lost {n - res['unique']} of {n} in mode {mode}"
    assert p1.packets - p0.packets >= n


# 4 s a mode: 1,000 ticks at HZ=250, enough to tell 100 % from < 5 % (10 s until the
# anatomy's NIC test took its place in make test's time)
IDLE_S = 4


def test_idle_cpu_time_busy_vs_hybrid(kmod, topo: Topo, record_property) -> None:
    """An idle hybrid poller costs (almost) no CPU; an idle busy one a whole CPU."""
    ticks = {}
    for mode in ("busy", "hybrid"):
        kmod.attach(topo.nic0, cpu=POLL_CPU, mode=mode)
        pid = kmod.poller(POLL_CPU).pid
        time.sleep(0.5)
        t0, w0 = task_cpu_ticks(pid), time.monotonic()
        time.sleep(IDLE_S)
        ticks[mode] = (task_cpu_ticks(pid) - t0) / os.sysconf("SC_CLK_TCK") / (
            time.monotonic() - w0)
        kmod.detach(topo.nic0)
    print(f"\nidle poller CPU share over {IDLE_S} s: busy {ticks['busy']:.1%}, "
          f"hybrid {ticks['hybrid']:.1%}")
    record_property("idle_cpu_busy", ticks["busy"])
    record_property("idle_cpu_hybrid", ticks["hybrid"])
    assert ticks["busy"] > 0.5
    assert ticks["hybrid"] < 0.05
