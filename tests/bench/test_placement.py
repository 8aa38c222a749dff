"""Roles on CPUs (issue 12, item 2): the plan and the report name CPUs by role, for fake 2-,
3- and 4-CPU layouts; pins are honoured; impossible placements are refused with the reason
before anything changes (no root needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kbp import sysinfo
from kbp.bench import placement, plots, report
from kbp.bench.placement import PlacementError
from kbp.bench.runner import Aborted, Bench, BenchConfig


def _plan(layout: list[int], **kw: Any) -> placement.Placement:
    b = Bench(BenchConfig(**kw), cpus_available=lambda: layout)
    return b.plan()


def test_four_cpus_every_role_its_own() -> None:
    p = _plan([0, 1, 2, 3])
    assert dict(p.cpus) == {"tester": 0, "rt": 1, "flood": 2, "heavy": 3, "app": 1,
                            "harness": 0}
    assert p.lines() == ["CPU 0: tester, harness", "CPU 1: RT, RT app",
                         "CPU 2: flood sender", "CPU 3: heavy receiver"]
    assert "every role on a CPU of its own" in p.note


def test_many_cpus_harness_gets_a_spare() -> None:
    p = _plan(list(range(8, 24)))
    assert [p.cpu(r) for r in ("tester", "rt", "flood", "heavy", "harness")] == \
        [8, 9, 10, 11, 12]


def test_three_cpus_remote_side_shares() -> None:
    p = _plan([0, 1, 2])
    assert dict(p.cpus) == {"tester": 0, "rt": 1, "flood": 0, "heavy": 2, "app": 1,
                            "harness": 0}
    assert "tester and flood sender share CPU 0" in p.note


def test_two_cpus_todays_sharing_is_stated() -> None:
    p = _plan([0, 1])
    assert dict(p.cpus) == {"tester": 0, "rt": 1, "flood": 0, "heavy": 0, "app": 1,
                            "harness": 0}
    assert "tester, flood sender and heavy receiver share CPU 0" in p.summary()
    assert p.role_cpus() == {"tester": 0, "rt": 1}
    assert p.cpu_label(0) == "tester+flood+heavy" and p.cpu_label(1) == "RT"


def test_without_the_flood_only_tester_and_rt_are_placed() -> None:
    p = _plan([0, 1, 2, 3], loads=["off"])
    assert set(p.role_cpus()) == {"tester", "rt"}


def test_pins_and_the_deprecated_aliases() -> None:
    p = _plan([0, 1, 2, 3], cpus={"rt": 3})
    assert (p.cpu("rt"), p.cpu("tester"), p.cpu("flood"), p.cpu("heavy")) == (3, 0, 1, 2)
    p = _plan([0, 1], cpus={"tester": 1})
    assert (p.cpu("rt"), p.cpu("flood"), p.cpu("heavy")) == (0, 1, 1)
    pins = placement.Pins(placement.parse_pins("app=0"))
    pins.add_legacy(rt_cpu=1, load_cpu=0)
    assert pins.roles == {"app": 0, "rt": 1, "tester": 0, "flood": 0, "heavy": 0,
                          "harness": 0}
    assert len(pins.deprecated) == 2
    p = _plan([0, 1], cpus=pins.roles)
    assert p.cpu("app") == 0 and p.cpu("rt") == 1


@pytest.mark.parametrize(("cpus", "pins", "why"), [
    ([0, 1], {"rt": 5}, "CPU 5"),
    ([0, 1], {"rt": 0, "tester": 0}, "RT CPU"),
    ([0, 1], {"tester": 0, "flood": 1}, "no CPU is left for the RT CPU"),
    ([0, 1, 2], {"rt": 2, "harness": 2}, "harness"),
    ([0], {}, "needs 2 CPUs"),
])
def test_refused_with_the_reason(cpus: list[int], pins: dict[str, int], why: str) -> None:
    with pytest.raises(PlacementError, match=why):
        placement.plan(cpus, pins)
    with pytest.raises(Aborted, match=why):            # as the runner says it
        _plan(cpus, cpus=pins)


def test_more_roles_than_cpus_when_pinned() -> None:
    # three CPUs, tester and flood pinned apart: rt takes the last one, heavy shares the flood
    p = placement.plan([0, 1, 2], {"tester": 0, "flood": 1})
    assert (p.cpu("rt"), p.cpu("heavy")) == (2, 1)
    # two CPUs: rt pinned, then the tester pinned to the RT CPU
    with pytest.raises(PlacementError, match="RT CPU"):
        placement.plan([0, 1], {"rt": 1, "tester": 1})


def test_offline_cpu(tmp_path: Path) -> None:
    (tmp_path / "present").write_text("0-3\n")
    (tmp_path / "online").write_text("0-1,3\n")
    assert "is offline" in placement.cpu_problem(2, [0, 1, 3], tmp_path)
    assert "does not exist" in placement.cpu_problem(9, [0, 1, 3], tmp_path)
    assert sysinfo.parse_cpulist("0-1,3") == [0, 1, 3]


@pytest.mark.parametrize("text", ["rt", "rt=x", "bogus=1", "rt=1,rt=2"])
def test_bad_pins(text: str) -> None:
    with pytest.raises(PlacementError):
        placement.parse_pins(text)


def _results(p: placement.Placement, busy: dict[int, float]) -> dict[str, Any]:
    ncpu = max(p.available) + 1
    sysd = {"wall_s": 1.0,
            "cpu": {str(c): {"busy_pct": busy.get(c, 0.0), "pct": {"softirq": busy.get(c, 0)}}
                    for c in range(ncpu)},
            "net_rx": [100 * c for c in range(ncpu)], "hardirqs_total": [0] * ncpu,
            "threads": {}}
    runs = [{"rep": 0, "mode": m, "scenario": "veth-inline", "part": "rtt",
             "condition": "load-on", "rtt_ns": {"p50": 1000, "p99": 2000}, "tester": {"sent": 1},
             "lost": 0, "sys": sysd,
             "kernel_delay": {"xmit_to_poll": {"p50": 900, "p99": 1900, "max": 2900}}}
            for m in ("napi", "stock-hybrid")]
    return {"schema": "kbp-bench/2", "scenario": {"name": "veth-inline", "title": "t"},
            "placement": p.to_json(), "runs": runs, "rfc2544": [],
            "config": {"reps": 1, "rate": 2000.0, "poisson": True, "frame": 64,
                       "duration": 1.0}, "testbed": "test", "machine": {}, "modes": {}}


def test_report_names_cpus_by_role_four_cpus(tmp_path: Path) -> None:
    res = _results(placement.plan([0, 1, 2, 3]), {0: 10.5, 1: 11.5, 2: 12.5, 3: 13.5})
    report.add_summary(res)
    md = report.markdown(res)
    assert ("| tester CPU busy (%) | RT CPU busy (%) | flood CPU busy (%) | "
            "heavy CPU busy (%) |") in md
    assert "| napi | 1 | 2 |" in md and "| 10.5 | 11.5 | 12.5 | 13.5 |" in md
    assert "| flood CPU NET_RX (/s) | heavy CPU NET_RX (/s) |" in md
    assert "tester 0, RT 1, flood sender 2, heavy receiver 3" in md
    assert "CPU0" not in md and "CPU1" not in md
    made = plots.all_plots(res, {"rtt|load-on|napi": [1000, 2000]}, tmp_path)
    assert tmp_path / "cpu.png" in made


def test_report_names_cpus_by_role_two_cpus() -> None:
    res = _results(placement.plan([4, 7]), {4: 50.5, 7: 70.5})
    report.add_summary(res)
    md = report.markdown(res)
    assert "| tester+flood+heavy CPU busy (%) | RT CPU busy (%) |" in md
    assert "| 50.5 | 70.5 |" in md
    assert "tester, flood sender and heavy receiver share CPU 4" in md
    assert "CPU4" not in md and "CPU7" not in md


def test_results_before_roles_still_render() -> None:
    """A results.json of schema 1 (scenario = part, rt_cpu/load_cpu) renders by role."""
    res = _results(placement.plan([0, 1]), {0: 20.5, 1: 30.5})
    res["schema"] = "kbp-bench/1"
    res["placement"] = {"rt_cpu": 1, "load_cpu": 0}
    del res["scenario"]
    for r in res["runs"]:
        r["scenario"] = "rtt"
        del r["part"]
    report.add_summary(res)
    md = report.markdown(res)
    assert "| tester+flood+heavy CPU busy (%) | RT CPU busy (%) |" in md
    assert res["runs"][0]["part"] == "rtt" and res["scenario"]["name"] == "veth-inline"
