"""busypoll and defer on the host kernel's netns testbed (issue 12, items 3 and 4): a short
run with the idle-cost part and the TCP heavy sender gives well-formed records, every sysctl
and device attribute is back at the value found (also after Ctrl-C while busypoll is on).

Needs root, sockperf, iperf3, ethtool.  About 40 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_bench_netns import (
    _ours,
    _procs,
    _settings,
    _skip_unless_ready,
    interrupt_when_on,
    start_idle_bench,
)

from kbp.bench import modes, report
from kbp.bench.runner import Bench, BenchConfig

pytestmark = [pytest.mark.netns, pytest.mark.root]

BUSY_READ = Path("/proc/sys/net/core/busy_read")


def test_busypoll_defer_idle_and_tcp(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_set = _settings()
    cfg = BenchConfig(modes=["napi", "busypoll", "defer"], reps=1, duration=1.0, warmup=0.2,
                      parts=["rtt", "idle", "rtt-tcp"], loads=["off"], idle_duration=1.0,
                      trace=False, out=tmp_path, command="pytest")
    t0 = time.monotonic()
    res = json.loads(json.dumps(Bench(cfg).run(), default=str))
    assert time.monotonic() - t0 < 90
    assert all(res["modes"][m]["status"] == "ok" for m in cfg.modes), res["modes"]
    runs = {(r["mode"], r["condition"]): r for r in res["runs"]}
    assert set(runs) == {(m, c) for m in cfg.modes for c in ("load-off", "load-tcp")}
    for r in runs.values():
        assert r["tester"]["sent"] > 500 and r["rtt_ns"]["n"] > 0.5 * r["tester"]["sent"]
        if r["condition"] == "load-tcp":
            fb = r["flood_block"]
            assert fb["proto"] == "tcp" and fb["rx_pps"] > 100, fb
    bp = runs[("busypoll", "load-off")]["mode_setup"]
    assert set(bp["set"].values()) == {modes.BUSY_POLL_US}
    assert bp["found"] == {k: before_set[k].strip() for k in bp["found"]}   # the values found
    df = runs[("defer", "load-off")]["mode_setup"]
    assert sorted(df["set"].values()) == sorted([modes.DEFER_HARD_IRQS,
                                                 modes.GRO_FLUSH_TIMEOUT_NS])
    assert all(k.startswith("/sys/class/net/rt-s-") and "(netns kbpb-" in k
               for k in df["found"])
    idle = {r["mode"]: r for r in res["idle"]}
    assert set(idle) == set(cfg.modes)
    for r in idle.values():
        assert r["duration"] == 1.0 and 0.9 < r["sys"]["wall_s"] < 2.0
        assert r["app_threads"]
    report.add_summary(res)
    assert set(res["summary"]["idle"]) == set(cfg.modes)
    assert "load-tcp" in res["summary"]["rtt"]
    md = report.markdown(res)
    assert "**Idle cost**" in md and "TCP heavy sender" in md and "| defer |" in md

    mine = {d[k] for d in res["testbed_devices"].values() for k in ("ns_a", "ns_b")}
    assert mine and not mine & set(_ours())     # others may run benchmarks concurrently
    assert _settings() == before_set
    if not _ours():                 # no other benchmark runs now: nothing of ours is left
        assert _procs() == []


def test_ctrl_c_while_busypoll_is_on_restores_the_sysctls(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_set = _settings()
    was = BUSY_READ.read_text().strip()
    if was == modes.BUSY_POLL_US:
        pytest.skip(reason="busy_read is already 50 here: cannot see the mode turn on")
    proc = start_idle_bench("busypoll", tmp_path)
    err = interrupt_when_on(proc, lambda: BUSY_READ.read_text().strip() == modes.BUSY_POLL_US,
                            "busypoll never came on")
    assert proc.returncode == 130, err[-2000:]
    assert BUSY_READ.read_text().strip() == was
    assert _settings() == before_set
    if not _ours():                 # no other benchmark runs now: nothing of ours is left
        assert _procs() == []
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["interrupted"] is True and "restore_problems" not in res
    mine = {d[k] for d in res["testbed_devices"].values() for k in ("ns_a", "ns_b")}
    assert mine and not mine & set(_ours())     # others may run benchmarks concurrently
