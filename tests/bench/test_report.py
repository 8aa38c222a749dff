"""Summaries, tables, trace parsing and /proc parsing of the benchmark (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbp.bench import modes, placement, report, sysstat, trace, workloads
from kbp.bench.modes import all_modes

TWO_CPUS = placement.plan([0, 1])


def _run(mode: str, rep: int, p99_ns: float, cond: str = "load-off") -> dict:
    return {"rep": rep, "mode": mode, "scenario": "veth-inline", "part": "rtt",
            "condition": cond,
            "rtt_ns": {"n": 100, "p50": 50_000, "p99": p99_ns, "p99.9": 2 * p99_ns,
                       "max": 3 * p99_ns, "mean": 60_000, "sd": 10_000},
            "rtt_user_ns": {"p50": 90_000, "p99": 200_000, "max": 900_000},
            "tester": {"sent": 100}, "lost": rep,
            "kernel_delay": {"xmit_to_poll": {"p50": 2000, "p99": 9000, "max": 20000},
                             "netrx_raise_to_entry": {"0": {"p99": 1000, "max": 5000}}},
            "sys": {"wall_s": 2.0, "cpu": {"0": {"busy_pct": 10.0, "pct": {"softirq": 4.0}},
                                           "1": {"busy_pct": 20.0, "pct": {}}},
                    "net_rx": [200, 10], "hardirqs_total": [40, 20], "threads": {}},
            "poller": {"packets": 100 * (rep + 1)}}


def test_summary_medians_and_per_rep_ratios() -> None:
    runs = []
    for rep, (base, kbp) in enumerate([(100e3, 50e3), (200e3, 50e3), (400e3, 400e3)]):
        runs += [_run("napi", rep, base), _run("stock-hybrid", rep, kbp)]
    s = report.summarize_runs(runs, TWO_CPUS)
    napi = s["rtt"]["load-off"]["napi"]
    kbp = s["rtt"]["load-off"]["stock-hybrid"]
    assert napi["rtt_p99_us"]["median"] == 200.0
    assert napi["rtt_p99_us"]["min"] == 100.0 and napi["rtt_p99_us"]["max"] == 400.0
    assert "ratio_to_napi" not in napi["rtt_p99_us"]
    # per-repetition ratios 0.5, 0.25, 1.0 -> median 0.5 (ratio of medians would be 0.25)
    assert kbp["rtt_p99_us"]["ratio_to_napi"]["median"] == 0.5
    assert kbp["rtt_p99_us"]["ratio_to_napi"]["min"] == 0.25
    assert kbp["net_rx_tester_per_s"]["median"] == 100.0     # CPU 0: tester, flood, heavy
    assert kbp["net_rx_rt_per_s"]["median"] == 5.0           # CPU 1: the RT CPU
    assert kbp["cpu_rt_busy_pct"]["median"] == 20.0
    assert kbp["lost_pct"]["median"] == 1.0
    assert kbp["poller_packets"]["median"] == 200.0
    for key, _, _ in [*report.latency_columns(TWO_CPUS), *report.cost_columns(TWO_CPUS)]:
        assert key in kbp, key


def test_markdown_tables() -> None:
    runs = [_run("napi", 0, 100e3), _run("stock-hybrid", 0, 50e3),
            _run("napi", 0, 1e6, "load-on"), _run("stock-hybrid", 0, 2e5, "load-on")]
    res = {"schema": "kbp-bench/2", "scenario": {"name": "veth-inline", "title": "t"},
           "placement": TWO_CPUS.to_json(),
           "runs": runs, "config": {"reps": 1, "rate": 2000.0, "poisson": True, "frame": 64,
                                    "duration": 5.0, "rfc_trial": 1.0, "rfc_resolution": 0.05},
           "testbed": "test", "machine": {"power_meter": "no power meter"},
           "modes": {"busy": {"status": "skipped", "reason": "kbp module not loaded"}},
           "rfc2544": [
               {"rep": 0, "mode": "napi", "frame": 64, "throughput_pps": 1000.0,
                "throughput_mbps": 0.512, "bound": "device", "sys": None},
               {"rep": 0, "mode": "stock-hybrid", "frame": 64, "throughput_pps": 1500.0,
                "throughput_mbps": 0.768, "bound": "device", "sys": None}]}
    report.add_summary(res)
    md = report.markdown(res)
    # p99 of a run's 100 samples is its 2nd largest: k and n disclosed, marked (< 10 above)
    assert "| napi | 50 | 100 (k=2 of n=100)† |" in md
    assert "| stock-hybrid | 50 x1.00 | 50 x0.50 (k=2 of n=100)† |" in md
    assert "200 x0.20" in md                       # load-on p99 ratio
    assert "| 64 B | stock-hybrid | 1,500 x1.50 |" in md
    assert "busy: kbp module not loaded" in md
    assert "no power meter" in md


def test_cell_format() -> None:
    assert report.cell(None) == "-"
    assert report.cell({"n": 3, "median": 12.345, "min": 10.0, "max": 15.0,
                        "ratio_to_napi": {"median": 0.5}}) == "12.3 [10-15] x0.50"
    assert report.fmt(1234.5) in ("1,234", "1,235")
    assert report.fmt(0.123) == "0.12"
    assert report.fmt(0.0) == "0"
    assert report.fmt(17.25) == "17.2" or report.fmt(17.25) == "17.3"


BPFTRACE_OUT = """Attaching 8 probes...
READY


@h[0, 312, 2800]: 10
@h[0, 312, 45000]: 1
@h[0, 99, 1000]: 2
@h[1, 0, 300]: 5
@h[1, 1, 12000]: 1
@mx[0, 312]: 46491
@mx[0, 99]: 1050
@mx[1, 0]: 399
@mx[1, 1]: 12345
@sm[0, 312]: 74000
@sm[0, 99]: 2040
@sm[1, 0]: 1500
@sm[1, 1]: 12345
"""


def test_parse_bpftrace_maps() -> None:
    r = trace.parse(BPFTRACE_OUT)
    x = r["xmit_to_poll"]["312"]
    assert x["n"] == 11 and x["max"] == 46491
    assert x["mean"] == pytest.approx(74000 / 11)
    assert x["p50"] == 2850.0                     # bucket 2800..2900, mid-point
    assert x["p99"] == 45500.0
    s, match = trace.xmit_to_poll(r, [312])      # keyed on the RT NAPI, not the busiest
    assert s is not None and s["n"] == 11 and s["max"] == 46491
    assert match["foreign_napis"] == {"99": 2}
    assert set(r["netrx_raise_to_entry"]) == {"0", "1"}
    m = trace.merged(r, "netrx_raise_to_entry")
    assert m is not None and m["n"] == 6 and m["max"] == 12345
    assert trace.merged(r, "app_wake_to_run") is None


def test_program_filters() -> None:
    p = trace.program(poller_pids=[11, 12], app_pids=[20], tx_dev="rt-c-ab", rx_dev="rt-s-ab",
                      rt_napi_ids=[312])
    assert 'str(args->name) == "rt-c-ab"' in p and "comm" not in p
    assert "args->napi_id == 312" in p
    assert "args->pid == 11 || args->pid == 12" in p
    assert "@wa[args->pid]" in p and "clear(@wp)" in p
    bare = trace.program()
    assert "sched_waking" not in bare and "clear(@wp)" not in bare
    assert "net_dev_start_xmit" not in bare        # no RT client device: not traced


def test_proc_parsers(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text(
        "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 5 0 5 50 0 0 2 1 0 0\ncpu1 5 0 5 50 0 0 0 0 0 0\n"
        "intr 1 2 3\n")
    (tmp_path / "interrupts").write_text(
        "           CPU0       CPU1\n 24:          1          0  IO-APIC   5-edge  ACPI:Ged\n"
        "LOC:     100      200   Local timer interrupts\nERR:          0\n")
    (tmp_path / "softirqs").write_text(
        "                    CPU0       CPU1\n      NET_RX:       10       20\n"
        "       TIMER:        1        2\n")
    st = sysstat.read_stat(tmp_path)
    assert st[0]["softirq"] == 2 and st[0]["steal"] == 1 and st[1]["idle"] == 50
    irq = sysstat.read_percpu_table(tmp_path / "interrupts")
    assert irq["LOC"] == [100, 200]
    assert irq["24 ACPI:Ged"] == [1, 0]
    assert irq["ERR"] == [0, 0]
    assert sysstat.read_percpu_table(tmp_path / "softirqs")["NET_RX"] == [10, 20]
    a = sysstat.Snapshot.take(proc=tmp_path)
    (tmp_path / "softirqs").write_text(
        "                    CPU0       CPU1\n      NET_RX:       15       20\n"
        "       TIMER:        1        2\n")
    b = sysstat.Snapshot.take(proc=tmp_path)
    d = sysstat.delta(a, b)
    assert d["net_rx"] == [5, 0]
    assert d["energy"] == {"meter": sysstat.NO_POWER_METER} or "meter" not in d["energy"]


def test_table2_scaling() -> None:
    conds = workloads.table2(0.02)
    assert [c.label for c in conds] == ["80M/1518B", "80M/512B", "80M/64B", "1G/1518B",
                                        "1G/512B", "1G/64B"]
    c = conds[2]
    assert c.paper_interval_us == pytest.approx(6.4)      # the paper's Table 2
    assert conds[0].paper_interval_us == pytest.approx(151.8)
    assert conds[3].paper_interval_us == pytest.approx(12.144)
    assert c.pps == pytest.approx(80e6 * 0.02 / 512)
    assert c.to_json()["interval_us"] == pytest.approx(6.4 / 0.02)
    # the scale keeps the ratios between conditions
    assert conds[5].pps / conds[2].pps == pytest.approx(12.5)


def test_modes_use_the_vocabulary() -> None:
    assert tuple(all_modes()) == modes.standard_modes()
    for name, m in all_modes().items():
        assert m.name == name
