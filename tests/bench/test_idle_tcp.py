"""Idle cost and the TCP heavy sender (issue 12, item 4), without root: the runner offers
both in every scenario (``idle``, ``rtt-tcp``), plans them, places the roles and the veth
pair they need, and the report turns idle-cost records into the per-poller-thread table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kbp.bench import parts, report, workloads
from kbp.bench.placement import Placement
from kbp.bench.runner import Aborted, Bench, BenchConfig


def _bench(layout: list[int], **kw: Any) -> Bench:
    b = Bench(BenchConfig(**kw), cpus_available=lambda: layout)
    b.plan()
    return b


def test_every_scenario_gets_idle_and_rtt_tcp_by_default() -> None:
    b = _bench([0, 1, 2, 3])
    assert b.cfg.parts == ["rtt", "table2", "rfc2544", "idle", "rtt-tcp"]
    assert b.links() == ("rt", "flood", "tcp")
    assert b.placement is not None and b.placement.cpu("heavy") == 3


def test_rtt_tcp_is_a_load_default_only_with_loads_on() -> None:
    b = _bench([0, 1, 2, 3], loads=["off"])
    assert "rtt-tcp" not in (b.cfg.parts or []) and "idle" in (b.cfg.parts or [])
    assert b.links() == ("rt", "flood")
    # asked for explicitly, it brings the flood sender and heavy receiver roles
    b = _bench([0, 1, 2, 3], loads=["off"], parts=["rtt-tcp"])
    assert b.roles() == ("tester", "rt", "flood", "heavy")
    assert b.placement is not None
    assert (b.placement.cpu("flood"), b.placement.cpu("heavy")) == (2, 3)


def test_unknown_part_lists_the_common_ones() -> None:
    with pytest.raises(Aborted, match="choose from rtt, table2, rfc2544, idle, rtt-tcp"):
        _bench([0, 1], parts=["idel"])
    with pytest.raises(Aborted, match="--idle-duration must be positive"):
        _bench([0, 1], parts=["idle"], idle_duration=0)


def test_plan_seconds_count_the_common_parts() -> None:
    b = _bench([0, 1], parts=["idle", "rtt-tcp"], reps=2, duration=1.0, warmup=0.0,
               idle_duration=10.0)
    b.runnable = ["napi", "defer", "busypoll"]
    assert b.plan_seconds() == pytest.approx(3 * (10.0 + 0.5 + 1.0) + 2 * 3 * (1.0 + 1.6))
    # --anatomy's trace costs each latency run its own seconds (kbp.bench.parts)
    b = _bench([0, 1], parts=["idle", "rtt-tcp"], reps=2, duration=1.0, warmup=0.0,
               idle_duration=10.0, anatomy=True)
    b.runnable = ["napi", "defer", "busypoll"]
    assert b.plan_seconds() == pytest.approx(3 * (10.0 + 0.5 + 1.0) + 2 * 3 * (
        1.0 + 1.6 + parts.ANATOMY_RUN_S))


def test_cli_options() -> None:
    import argparse

    from kbp.bench.cli import add_arguments, config_from_args
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    cfg = config_from_args(ap.parse_args(["--parts", "idle", "--idle-duration", "3",
                                          "--tcp-len", "1448"]))
    assert (cfg.parts, cfg.idle_duration, cfg.tcp_len) == (["idle"], 3.0, 1448)


# -- the TCP heavy sender -------------------------------------------------------------------
def test_tcp_flood_argv_and_summary() -> None:
    f = workloads.Flood("c", "s", "198.18.0.2", "tcp-s-x", sender_cpu=2, receiver_cpu=3,
                        length=0, proto="tcp", port=workloads.IPERF_TCP_PORT)
    argv = f.client_argv()
    assert argv[:3] == ["taskset", "-c", "2"] and "-u" not in argv and "-l" not in argv
    assert argv[argv.index("-p") + 1] == "5202"
    udp = workloads.Flood("c", "s", "198.18.0.2", "flood-s-x", 0, 0).client_argv()
    assert "-u" in udp and udp[udp.index("-l") + 1] == "64" and "5201" in udp
    out = json.dumps({"end": {"sum_sent": {"retransmits": 4, "bits_per_second": 9e9},
                              "sum_received": {"bytes": 10, "bits_per_second": 8e9}}})
    assert workloads.iperf_summary(out, "tcp") == {"bytes": 10, "bits_per_second": 8e9,
                                                   "retransmits": 4}
    assert workloads.iperf_summary("not json", "tcp") == {}
    with pytest.raises(ValueError, match="udp or tcp"):
        workloads.Flood("c", "s", "ip", "d", 0, 0, proto="sctp").client_argv()


# -- idle cost in the report ----------------------------------------------------------------
PL = Placement(cpus={"tester": 0, "rt": 1, "flood": 0, "heavy": 0, "app": 1, "harness": 0},
               available=(0, 1))


def _idle(mode: str, pollers: dict[str, float], app_pct: float, rt_busy: float,
          poller: dict[str, int] | None = None) -> dict[str, Any]:
    threads = {pid: {"name": "napi/x", "cpu_pct": pct, "run_ns": int(pct * 1e8)}
               for pid, pct in pollers.items()}
    threads["900"] = {"name": "sockperf", "cpu_pct": app_pct, "run_ns": 0}
    return {"mode": mode, "part": "idle", "duration": 10.0,
            "poller_threads": dict.fromkeys(pollers, "napi/x"), "app_threads": ["900"],
            "poller": poller or {},
            "sys": {"wall_s": 10.0, "threads": threads, "net_rx": [0, 20],
                    "cpu": {"1": {"busy_pct": rt_busy, "pct": {"softirq": 0.5}}}}}


def test_idle_metrics_per_poller_thread() -> None:
    m = report.idle_metrics(_idle("stock-busy", {"11": 99.0, "12": 97.0}, 0.1, 99.5,
                                  {"passes": 1000, "wakeups": 0}), PL)
    assert m["poller_threads"] == 2
    assert m["poller_cpu_pct"] == pytest.approx(196.0)
    assert m["poller_cpu_pct_per_thread"] == pytest.approx(98.0)
    assert m["poller_cpu_pct_max_thread"] == pytest.approx(99.0)
    assert m["app_cpu_pct"] == pytest.approx(0.1)
    assert m["cpu_rt_busy_pct"] == 99.5 and m["cpu_rt_softirq_pct"] == 0.5
    assert m["net_rx_rt_per_s"] == pytest.approx(2.0)
    assert m["poller_passes_per_s"] == pytest.approx(100.0)
    napi = report.idle_metrics(_idle("napi", {}, 0.0, 0.2), PL)
    assert napi["poller_threads"] == 0 and napi["poller_cpu_pct_per_thread"] is None


def test_idle_table_in_the_report() -> None:
    res: dict[str, Any] = {
        "schema": "kbp-bench/2", "config": {"reps": 1, "idle_duration": 10.0},
        "scenario": {"name": "veth-inline", "title": "t"}, "placement": PL.to_json(),
        "runs": [], "idle": [_idle("napi", {}, 0.0, 0.2), _idle("stock-hybrid", {"11": 0.3}, 0, 1),
                             _idle("busypoll", {}, 0.4, 0.5)],
        "modes": {"stock-busy": {"status": "skipped", "reason": "kernel too old"}},
        "machine": {}}
    report.add_summary(res)
    assert set(res["summary"]["idle"]) == {"napi", "stock-hybrid", "busypoll"}
    md = report.markdown(res)
    assert "**Idle cost**" in md and "CPU per poller thread (%)" in md
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows[1:]][:3] == ["napi", "busypoll",
                                                                "stock-hybrid"]
    assert "| stock-hybrid | 1 | 0.30 |" in md
    assert "- stock-busy: kernel too old" in md


def test_load_tcp_rows_are_summarized_and_rendered() -> None:
    def run(mode: str, p99: float) -> dict[str, Any]:
        return {"rep": 0, "mode": mode, "part": "rtt", "condition": parts.TCP_CONDITION,
                "rtt_ns": {"p50": p99 / 2, "p99": p99, "p99.9": p99, "max": p99,
                           "mean": p99 / 2, "sd": 1.0}, "lost": 0, "tester": {"sent": 10},
                "sys": {}}
    res: dict[str, Any] = {
        "schema": "kbp-bench/2",
        "config": {"reps": 1, "rate": 2000.0, "frame": 64, "duration": 1.0, "poisson": True},
        "scenario": {"name": "veth-inline", "title": "t"}, "placement": PL.to_json(),
        "runs": [run("napi", 100e3), run("defer", 150e3)], "machine": {}}
    report.add_summary(res)
    d = res["summary"]["rtt"]["load-tcp"]["defer"]
    assert d["rtt_p99_us"]["ratio_to_napi"]["median"] == pytest.approx(1.5)
    md = report.markdown(res)
    assert "TCP heavy sender" in md and "| defer | 75 x1.50 | 150 x1.50 |" in md
