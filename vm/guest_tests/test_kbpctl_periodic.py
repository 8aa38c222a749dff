"""kbpctl's mode periodic on the real module, as users run it: ``kbpctl enable DEV --mode
periodic`` (the interval search) and ``--interval-us 500`` (a fixed interval), at kbpctl's
default priority, over the guest's virtio NIC; status --json shows the knobs and the search;
``kbpctl disable`` puts the device back on stock NAPI with its interrupt enabled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import POLL_CPU, Flow, net_rx_softirqs, traffic_flows, udp_seen, wait_for
from test_kbpctl_kmod import kbpctl
from test_periodic import input_irqs, roomy_sink, run_flow  # noqa: F401 (fixture)


def status_of(nic: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The NIC's device entry and its poller's entry in ``kbpctl status --json``."""
    st = json.loads(kbpctl("status", "--json").stdout)
    (d,) = [d for d in st["devices"] if d["name"] == nic and d["netns"] is None]
    (p,) = [p for p in st["pollers"] if p["cpu"] == POLL_CPU]
    return d, p


def assert_back_on_stock_napi(kmod, flow: Flow) -> None:
    """Nothing attached, no poller; the NIC interrupts and NET_RX carries its packets (with
    the flow's sender, started here when it is not running: a sender started under TCG takes
    a second or more before its first datagram, so wait for the stream first)."""
    nic = flow.t.nic0
    assert kmod.device(nic) is None and kmod.pollers() == []
    assert Path(f"/sys/class/net/{nic}/threaded").read_text().strip() == "0"
    started = flow.sender is None
    if started:
        flow.start_sender(1000)
    try:
        u0 = udp_seen()
        wait_for(lambda: udp_seen() > u0 + 50, 30, what="the stream on stock NAPI")
        rx0, i0 = net_rx_softirqs(), input_irqs(nic)
        assert traffic_flows(flow.t, 1.0)
        rx1, i1 = net_rx_softirqs(), input_irqs(nic)
    finally:
        if started:
            flow.stop_sender()
    print(f"\nafter disable, in 1 s: {i1 - i0} interrupts, {sum(rx1) - sum(rx0)} NET_RX")
    assert i1 - i0 >= 100, "the NIC's interrupt is not back on"
    assert sum(rx1) - sum(rx0) >= 50, "NET_RX does not carry the NIC's packets"


@pytest.mark.usefixtures("roomy_sink")
def test_kbpctl_periodic_fixed_interval(kmod, flow: Flow) -> None:
    nic, n = flow.t.nic0, 4000
    try:
        out = kbpctl("enable", nic, "--mode", "periodic", "--interval-us", "500",
                     "--cpus", str(POLL_CPU))
        assert f"enabled {nic}: kmod backend, periodic, every 500 us" in out.stdout, out.stdout
        assert "SCHED_FIFO 50" in out.stdout, out.stdout
        p = kmod.poller(POLL_CPU)
        assert (p.mode, p.interval_us, p.netap, p.rt_prio) == ("periodic", 500, False, 50), p
        assert p.search is None

        per = run_flow(kmod, flow, n, 2000)     # about one datagram per interval
        print(f"\n{n} datagrams at 2000/s, kbpctl periodic 500 us: {per}")
        assert per["unique"] == n, per
        assert per["packets"] >= n, per            # the poller carried them
        assert per["irqs"] * 10 <= n, per          # with the interrupt masked

        d, pj = status_of(nic)
        assert (d["backend"], d["mode"], d["managed"], d["problems"]) == \
            ("kmod", "periodic", True, []), d
        assert d["periodic_request"]["interval_us"] == 500, d
        assert pj["periodic"]["interval_us"] == 500 and pj["periodic"]["netap"] is False, pj
        assert (pj["policy"], pj["priority"]) == ("SCHED_FIFO", 50), pj
        assert pj["counters"]["packets"] >= n, pj
    finally:
        kbpctl("disable", "--all", check=False)
    assert_back_on_stock_napi(kmod, flow)


# long (make test-vm-all): ~45 s under TCG. In make test kbpctl's periodic path to the module
# is test_kbpctl_periodic_fixed_interval's, the module's search test_periodic's
@pytest.mark.long
def test_kbpctl_periodic_search(kmod, flow: Flow) -> None:
    """The default: the golden-section search, 1 s rounds, 100..4000 us; disable under
    traffic."""
    nic = flow.t.nic0
    flow.start_sink()
    try:
        out = kbpctl("enable", nic, "--mode", "periodic", "--cpus", str(POLL_CPU))
        assert "periodic, interval searched in 100..4000 us (rounds of 1000 ms" in out.stdout, \
            out.stdout
        p0 = kmod.poller(POLL_CPU)
        assert (p0.mode, p0.netap, p0.round_ms, p0.min_interval_us, p0.max_interval_us,
                p0.min_change, p0.max_round, p0.rt_prio) == \
            ("periodic", True, 1000, 100, 4000, 20, 300, 50), p0
        flow.start_sender(1000)
        wait_for(lambda: kmod.poller(POLL_CPU).packets > p0.packets + 300, 40,
                 what="the poller to carry the stream")
        wait_for(lambda: (kmod.poller(POLL_CPU).search or _no_rounds).rounds >= 3, 30,
                 what="three rounds of the search")

        d, pj = status_of(nic)
        assert d["problems"] == [] and d["periodic_request"]["interval_us"] is None, d
        per = pj["periodic"]
        assert (per["netap"], per["round_ms"], per["min_interval_us"], per["max_interval_us"],
                per["min_change"], per["max_round"], per["objective"]) == \
            (True, 1000, 100, 4000, 20, 300, "bytes"), per
        s = per["search"]
        print(f"\nsearch state: {s}")
        assert s["rounds"] >= 3 and 100 <= s["interval_us"] <= 4000, s
        assert 100 <= s["range_lo_us"] <= s["range_hi_us"] <= 4000, s
        last = s.get("last_objective", s.get("last_work"))   # named last_work before objective
        assert last, "no round counted anything"
        assert (pj["policy"], pj["priority"]) == ("SCHED_FIFO", 50), pj

        kbpctl("disable", nic)      # under traffic
        assert_back_on_stock_napi(kmod, flow)
    finally:
        flow.stop_sender()
        kbpctl("disable", "--all", check=False)
    assert flow.result(timeout=10)["unique"] >= 300


class _NoRounds:
    rounds = 0


_no_rounds = _NoRounds()
