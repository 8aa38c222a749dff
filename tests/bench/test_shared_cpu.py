"""The shared-cpu scenario without root: its roles on fake 4- and 2-CPU layouts (the heavy
receiver on the RT CPU, allowed for this scenario only), the report naming CPUs by role, the
acceptance check's verdict, the app's scheduling class, and the receive counters' parsing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kbp import rps
from kbp.bench import parts as pt
from kbp.bench import placement, report, scenarios, steer
from kbp.bench.cli import PRESETS
from kbp.bench.placement import PlacementError
from kbp.bench.runner import Aborted, Bench, BenchConfig
from kbp.bench.scenarios import shared_cpu


def _plan(layout: list[int], **kw: Any) -> placement.Placement:
    return Bench(BenchConfig(scenario="shared-cpu", **kw), cpus_available=lambda: layout).plan()


def test_registered_and_the_demo_runs_it() -> None:
    assert "shared-cpu" in scenarios.all_scenarios()
    assert scenarios.DEFAULT == "veth-inline"            # still there by name, the default
    assert PRESETS["demo"]["scenario"] == "shared-cpu"
    s = scenarios.get("shared-cpu")
    assert s.rt_roles == ("heavy",) and s.app_policy == "fifo"
    assert scenarios.get("veth-inline").rt_roles == ()


def test_four_cpus_heavy_on_the_rt_cpu() -> None:
    p = _plan([0, 1, 2, 3])
    assert dict(p.cpus) == {"tester": 0, "rt": 1, "flood": 2, "heavy": 1, "app": 1,
                            "harness": 3}
    assert p.lines() == ["CPU 0: tester", "CPU 1: RT, heavy receiver, RT app",
                         "CPU 2: flood sender", "CPU 3: harness"]
    assert p.role_cpus() == {"tester": 0, "rt": 1, "flood": 2}
    assert p.cpu_label(1) == "RT+heavy"
    assert "heavy receiver on the RT CPU 1 by the scenario's design" in p.note


def test_two_cpus() -> None:
    p = _plan([0, 1])
    assert dict(p.cpus) == {"tester": 0, "rt": 1, "flood": 0, "heavy": 1, "app": 1,
                            "harness": 0}
    assert p.cpu_label(0) == "tester+flood" and p.cpu_label(1) == "RT+heavy"
    assert "tester and flood sender share CPU 0" in p.summary()
    p = _plan([4, 7])
    assert (p.cpu("rt"), p.cpu("heavy"), p.cpu("tester")) == (7, 7, 4)


def test_pins_with_the_allowance() -> None:
    p = _plan([0, 1, 2, 3], cpus={"rt": 3})
    assert (p.cpu("rt"), p.cpu("heavy"), p.cpu("tester"), p.cpu("flood")) == (3, 3, 0, 1)
    p = _plan([0, 1], cpus={"rt": 0, "heavy": 0})
    assert p.cpu("heavy") == 0 and p.cpu("tester") == 1
    with pytest.raises(Aborted, match="only the app and the heavy receiver may share it"):
        _plan([0, 1], cpus={"rt": 1, "tester": 1})
    # the allowance is the scenario's: veth-inline still refuses the heavy receiver there
    with pytest.raises(PlacementError, match="only the app may share it"):
        placement.plan([0, 1], {"rt": 1, "heavy": 1})
    with pytest.raises(PlacementError, match="cannot be placed on the RT CPU"):
        placement.plan([0, 1], on_rt=("rt",))


def test_app_policy() -> None:
    b = Bench(BenchConfig(scenario="shared-cpu"), cpus_available=lambda: [0, 1])
    b.plan()
    assert b.app_policy() == "fifo" and b.app_fifo() == 51
    b = Bench(BenchConfig(scenario="shared-cpu", app_policy="other", rt_prio=40),
              cpus_available=lambda: [0, 1])
    b.plan()
    assert b.app_fifo() == 0
    b = Bench(BenchConfig(scenario="veth-inline"), cpus_available=lambda: [0, 1])
    b.plan()
    assert b.app_fifo() == 0
    with pytest.raises(Aborted, match="unknown --app-policy"):
        Bench(BenchConfig(app_policy="rr"), cpus_available=lambda: [0, 1]).plan()


def test_the_flood_kind() -> None:
    """shared-cpu floods with the shaped TCP heavy sender unless --flood udp; veth-inline
    keeps UDP; a scenario whose load is its own refuses --flood, an unknown kind is refused,
    and the report names the flood in force."""
    def bench(scen: str, flood: str | None = None) -> Bench:
        b = Bench(BenchConfig(scenario=scen, flood=flood), cpus_available=lambda: [0, 1])
        b.plan()
        return b
    assert bench("shared-cpu").flood_proto() == "tcp"
    assert bench("shared-cpu", "udp").flood_proto() == "udp"
    assert bench("veth-inline").flood_proto() == "udp"
    assert bench("veth-inline", "tcp").flood_proto() == "tcp"
    for scen in ("rt-split", "stream"):
        with pytest.raises(Aborted, match=f"--flood does not apply to {scen}"):
            bench(scen, "tcp")
    with pytest.raises(Aborted, match="unknown --flood 'icmp': use udp, tcp"):
        bench("shared-cpu", "icmp")
    assert "TCP heavy sender" in pt.flood_words({"flood": {"proto": "tcp"}})
    assert "UDP flood (64 B" in pt.flood_words({"flood": {"proto": "udp",
                                                          "payload_bytes": 64}})


def _run(mode: str, cond: str, rep: int, p999: float, rt: int, rps: dict[str, list[int]],
         ) -> dict[str, Any]:
    cpus = {str(c): {"busy_pct": 50.0, "pct": {"softirq": 5.0}} for c in range(4)}
    return {"rep": rep, "mode": mode, "scenario": "shared-cpu", "part": "rtt",
            "condition": cond, "tester": {"sent": 2000}, "lost": 0,
            "rtt_ns": {"p50": 20_000, "p99": 50_000, "p99.9": p999, "max": 2 * p999},
            "sys": {"wall_s": 1.0, "cpu": cpus, "net_rx": [1, 2, 3, 4],
                    "hardirqs_total": [0] * 4, "threads": {}},
            "poller": {"poll_ns": 20_000_000} if mode != "napi" else {},
            "rt_cpu_rx": {"cpu": rt, "wall_s": 1.0, "net_rx_per_s": 4000.0,
                          "processed_per_s": 9000.0, "received_rps": 3000,
                          "time_squeeze": 0, "ksoftirqd_cpu_pct": 0.5, "ksoftirqd_runs": 20,
                          "backlog_dropped": 0},
            "steering": rps}


def _results(p: placement.Placement, napi_flood: float) -> dict[str, Any]:
    rt = p.cpu("rt")
    both = {"rt-s-ab": [rt], "flood-s-ab": [rt]}
    kbp = {"rt-s-ab": [], "flood-s-ab": [rt]}
    runs = []
    for rep in range(3):
        runs += [_run("napi", "idle", rep, 100_000, rt, both),
                 _run("napi", "flood", rep, napi_flood, rt, both),
                 _run("stock-hybrid", "idle", rep, 80_000, rt, kbp),
                 _run("stock-hybrid", "flood", rep, 160_000, rt, kbp)]
    return {"schema": "kbp-bench/2", "scenario": {"name": "shared-cpu", "title": "t"},
            "placement": {**p.to_json(), "app_policy": "fifo", "app_fifo": 51},
            "runs": runs, "rfc2544": [], "testbed": "test", "machine": {}, "modes": {},
            "config": {"reps": 3, "rate": 2000.0, "poisson": True, "frame": 64,
                       "duration": 1.0}}


@pytest.mark.parametrize("layout", [[0, 1, 2, 3], [0, 1]])
def test_report_acceptance_and_roles(layout: list[int]) -> None:
    p = placement.plan(layout, on_rt=("heavy",))
    res = _results(p, 700_000)
    report.add_summary(res)
    acc = res["summary"]["acceptance"]
    assert acc["passed"] is True and acc["factor"] == pytest.approx(7.0)
    fvi = res["summary"]["flood_vs_idle"]
    assert fvi["stock-hybrid"]["p99.9_ratio"]["median"] == pytest.approx(2.0)
    rx = res["summary"]["rt_cpu_rx"]
    assert rx["flood"]["napi"]["rps"] == ["flood:1", "rt:1"]
    assert rx["flood"]["stock-hybrid"]["rps"] == ["flood:1", "rt:off"]
    assert rx["flood"]["stock-hybrid"]["poller_poll_pct"]["median"] == pytest.approx(2.0)
    md = report.markdown(res)
    assert "**Acceptance check: PASS**" in md and "x7.00" in md
    assert "RT app: SCHED_FIFO 51 (--app-policy fifo)" in md
    assert "| flood | stock-hybrid | flood:1 rt:off |" in md
    assert "RT+heavy CPU busy (%)" in md
    assert "| stock-hybrid | 80 x0.80 | 160 x0.23 | 2 | 160 x0.80 | 320 x0.23 | 2 |" in md
    assert "CPU0" not in md and "CPU1" not in md
    if len(layout) == 4:
        assert "| tester CPU busy (%) | RT+heavy CPU busy (%) | flood CPU busy (%) |" in md
    else:
        assert "| tester+flood CPU busy (%) | RT+heavy CPU busy (%) |" in md


def test_acceptance_fails_honestly() -> None:
    res = _results(placement.plan([0, 1], on_rt=("heavy",)), 300_000)
    report.add_summary(res)
    assert res["summary"]["acceptance"]["passed"] is False
    md = report.markdown(res)
    assert "**Acceptance check: FAIL**" in md and "not yet the papers' situation" in md
    assert shared_cpu.acceptance({})["passed"] is None


def test_softnet_and_softirqs_parsing(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "softnet_stat").write_text(
        "0000000a 00000000 00000001 00000000 00000000 00000000 00000000 00000000 "
        "00000000 00000003 00000000 00000000 00000000 00000000 00000000\n"
        "000000ff 00000002 00000004 00000000 00000000 00000000 00000000 00000000 "
        "00000000 00000010 00000000 00000000 00000001 00000000 00000000\n")
    (tmp_path / "softirqs").write_text(
        "                    CPU0       CPU1\n          HI:          0          1\n"
        "      NET_RX:        100        250\n")
    sn = steer.softnet(tmp_path)
    assert sn[1] == {"processed": 255, "dropped": 2, "time_squeeze": 4, "received_rps": 16}
    assert steer.net_rx(1, tmp_path) == 250
    assert rps.cpu_mask(1) == "2" and rps.cpu_mask(12) == "1000"
    assert rps.masks_cpus({"rx-0": "00000000,00000002"}) == [1]
    assert rps.masks_cpus({"rx-0": "0"}) == []


def _tails(idle: tuple[float, float, float], flood: tuple[float, float, float],
           ) -> dict[str, Any]:
    def stat(v: tuple[float, float, float]) -> dict[str, Any]:
        return {"p99": {"value": v[0], "ci95": [v[1], v[2]], "k": 301, "n": 30_000}}
    return {"rtt|idle|napi": stat(idle), "rtt|flood|napi": stat(flood)}


def test_acceptance_on_pooled_p99_with_an_inconclusive_outcome() -> None:
    """Issue 38: the verdict comes from the pooled p99's intervals, not from the median of
    three ratios of 7-sample tails, and says INCONCLUSIVE when the ratio's interval
    straddles the factor."""
    f = shared_cpu.ACCEPT_FACTOR
    ok = shared_cpu.acceptance({}, _tails((100e3, 90e3, 110e3), (1000e3, 900e3, 1100e3)))
    assert ok["verdict"] == "PASS" and ok["passed"] is True
    assert ok["factor"] == pytest.approx(10.0)
    assert ok["ratio_ci"] == pytest.approx([900 / 110, 1100 / 90])
    fail = shared_cpu.acceptance({}, _tails((100e3, 90e3, 110e3), (200e3, 180e3, 220e3)))
    assert fail["verdict"] == "FAIL" and fail["passed"] is False
    # the point estimate passes, the interval does not: no verdict either way
    unsure = shared_cpu.acceptance({}, _tails((100e3, 60e3, 140e3),
                                              (f * 110e3, f * 70e3, f * 200e3)))
    assert unsure["verdict"] == "INCONCLUSIVE" and unsure["passed"] is None
    assert unsure["factor"] > f
    line = shared_cpu.acceptance_line(unsure)
    assert line.startswith("**Acceptance check: INCONCLUSIVE**") and "straddles" in line
    assert "k=301 and 301 of n=30,000 and 30,000" in line
    # older results (no pooled tails): the per-repetition rule, labelled as such
    old = shared_cpu.acceptance({"napi": {"p99.9_ratio": {"median": 7.0, "min": 6.0,
                                                          "max": 8.0, "n": 3}}})
    assert old["verdict"] == "PASS" and "results without pooled tails" in old["check"]


def _ew_run(mode: str, rep: int, busy_s: float, pkts: int, softirq_s: float = 0.0,
            sender_busy: float = 60.0, nonrt_pct: float = 0.0) -> dict[str, Any]:
    return {"mode": mode, "rep": rep, "condition": "flood", "heavy": {"rx_packets": pkts},
            "sys": {"wall_s": 3.0, "threads_cpu_pct": {"nonrt_poller": nonrt_pct},
                    "cpu": {"1": {"seconds": {"user": 0.1, "system": busy_s - 0.1 - softirq_s,
                                              "softirq": softirq_s, "idle": 3.0 - busy_s,
                                              "iowait": 0.0},
                                  "busy_pct": 100 * busy_s / 3.0},
                            "0": {"seconds": {"user": 1.0, "idle": 1.0},
                                  "busy_pct": sender_busy}}}}


def test_equal_work_flags_modes_with_other_heavy_work_on_the_rt_cpu() -> None:
    """Issue 38, item 1: busy µs per heavy packet on the RT CPU per mode, by context; a mode
    outside 10 % of napi's is not equal work, and the headline prints its heavy-flow rate
    without a ratio; the CPU that bounded the heavy flow is named per mode."""
    runs = [_ew_run("napi", r, 2.7, 2_700_000, softirq_s=2.0, sender_busy=99.0)
            for r in range(3)]                                               # 1.0 µs
    runs += [_ew_run("stock-hybrid", r, 2.8, 2_700_000, softirq_s=2.1) for r in range(3)]
    runs += [_ew_run("stock-hybrid-part", r, 2.9, 1_600_000, nonrt_pct=50.0)
             for r in range(3)]                                              # 1.81
    runs.append({"mode": "napi", "rep": 0, "condition": "idle"})           # not counted
    ew = shared_cpu.equal_work(runs, 1, 0)
    assert ew["napi"]["us_per_heavy_packet"]["median"] == pytest.approx(1.0)
    assert ew["napi"]["softirq_us"]["median"] == pytest.approx(2.0 / 2.7)
    assert ew["napi"]["task_us"]["median"] == pytest.approx(0.7 / 2.7)
    assert ew["napi"]["bound_by"] == ["sender"]    # RT CPU 90 % busy (2.7 of 3 s), sender 99 %
    assert ew["stock-hybrid"]["equal"] is True
    assert ew["stock-hybrid"]["bound_by"] == ["neither"]
    part = ew["stock-hybrid-part"]
    assert part["equal"] is False and part["bound_by"] == ["RT CPU"]
    assert part["ratio_to_napi"]["median"] == pytest.approx(1.8125 / 1.0, rel=1e-3)
    assert part["pollers_us"]["median"] == pytest.approx(0.5 * 3.0 / 1.6)   # 1.5 s / 1.6 M
    assert part["softirq_us"]["median"] == 0.0
    md = "\n".join(shared_cpu.equal_work_section(ew))
    assert "Not so for stock-hybrid-part" in md and "| stock-hybrid-part |" in md
    assert "| stock-hybrid | 1.04 x1.04 | 0.78 | 0.26 | 0 | 93.3 | 60 | neither | yes |" in md
    pm = {"stock-hybrid-part": {"heavy_gbit_s": {"median": 6.0, "n": 1, "min": 6.0,
                                                 "max": 6.0, "ratio_to_napi": {"median": 0.65}}}}
    row = report.per_mode_section(pm, "flood", "t", other_work=["stock-hybrid-part"])
    assert any("| 6 ≠ |" in ln for ln in row), row       # the rate, no ratio of other work
    assert not any("x0.65" in ln for ln in row), row
    plain = report.per_mode_section(pm, "flood", "t")
    assert any("| 6 x0.65 |" in ln for ln in plain), plain


def test_equal_work_counts_the_pinned_heavy_napi_thread_only_on_the_rt_cpu() -> None:
    """--heavy-napi rt-cpu: the heavy device's NAPI thread is a polling thread of the RT CPU
    in napi too, but not in exclusive, which moves it to the other CPU (its 1.7 µs per
    packet there were counted as the RT CPU's in the first variant run)."""
    napi = _ew_run("napi", 0, 2.9, 1_500_000)
    napi["heavy_napi_threads"] = {"cpu_pct": 40.0, "cpu": 1}
    excl = _ew_run("exclusive", 0, 0.1, 1_500_000)
    excl["heavy_napi_threads"] = {"cpu_pct": 60.0, "cpu": 0}
    ew = shared_cpu.equal_work([napi, excl], 1, 0)
    assert ew["napi"]["pollers_us"]["median"] == pytest.approx(0.4 * 3.0 / 1.5)
    assert ew["exclusive"]["pollers_us"]["median"] == 0.0


def test_bound_by_names_the_saturated_cpu() -> None:
    assert shared_cpu.bound_by(99.0, 60.0) == "RT CPU"
    assert shared_cpu.bound_by(70.0, 99.5) == "sender"
    assert shared_cpu.bound_by(96.0, 97.0) == "both"
    assert shared_cpu.bound_by(None, None) == "neither"
    # exclusive: the heavy receiver shares the sender's CPU, which is then not just the sender
    assert shared_cpu.bound_by(3.0, 99.5, heavy_moved=True) == "non-RT CPU"
    excl = _ew_run("exclusive", 0, 0.1, 1_500_000, sender_busy=99.5)
    assert shared_cpu.equal_work([excl], 1, 0)["exclusive"]["bound_by"] == ["non-RT CPU"]
