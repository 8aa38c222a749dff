"""The rt-split scenario on the host kernel's netns testbed (root), from results.json: the RT
flow at uniform random gaps, the TCP heavy receiver's receive processing on the RT CPU in
napi (its packets through the stack there, RPS of both server devices to it), on the non-RT
CPU with the heavy receiver in exclusive (and back on the RT CPU for the modes after it),
the RT flow on the poller in stock-hybrid (RT device off RPS, poller time in NAPI poll).
Nothing left behind: namespaces, RPS masks, settings, processes.  Ctrl-C while it runs
restores everything too.  About 30 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bench_netns import _ours, _procs, _settings, _skip_unless_ready
from test_shared_cpu_netns import _host_rps, _iperf

from kbp.bench import report
from kbp.bench.runner import Bench, BenchConfig

pytestmark = [pytest.mark.netns, pytest.mark.root]

MODES = ["napi", "exclusive", "stock-hybrid", "stock-hybrid-excl"]


def test_heavy_flow_where_each_mode_puts_it(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_ns, before_set, before_rps = _ours(), _settings(), _host_rps()
    cfg = BenchConfig(scenario="rt-split", modes=MODES, reps=2, duration=1.5, warmup=0.2,
                      loads=["on"], trace=False, out=tmp_path, command="pytest")
    res = Bench(cfg).run()
    report.add_summary(res)
    res = json.loads(json.dumps(res))

    assert res["scenario"]["name"] == "rt-split" and not res["interrupted"]
    assert "restore_problems" not in res
    assert res["modes"] == {m: {"status": "ok"} for m in MODES}
    cpus = res["placement"]["cpus"]
    rt, other = cpus["rt"], res["rt_split"]["nonrt_cpu"]
    assert cpus["heavy"] == rt and cpus["app"] == rt and other != rt
    assert res["config"]["uniform_us"] == [1000.0, 10000.0]
    assert sorted(res["steering"]["devices"].values()) == [[rt], [rt]]
    runs = res["runs"]
    assert sorted((r["mode"], r["rep"]) for r in runs) == sorted(
        (m, rep) for m in MODES for rep in range(2))
    for r in runs:
        mode, rx, rx2, h = r["mode"], r["rt_cpu_rx"], r["nonrt_cpu_rx"], r["heavy"]
        sent = r["tester"]["sent"]
        assert r["condition"] == "tcp" and r["uniform_us"] == [1000.0, 10000.0]
        assert r["tester"]["arrival"] == "uniform"
        assert 1000 <= r["tester"]["gap_min_us"] <= r["tester"]["gap_max_us"] <= 10000
        assert 100 <= sent <= 500, r["tester"]              # ~182 req/s for 1.5 s
        assert r["rtt_ns"]["n"] > 0.8 * sent and r["rtt_ns"]["sd"] is not None
        assert r["app_fifo"] == 51 and rx["cpu"] == rt and rx2["cpu"] == other
        assert h["rx_pps"] > 1000 and h["gbit_s"] > 0.01, h
        rt_dev = next(d for d in r["steering"] if d.startswith("rt-"))
        hv_dev = next(d for d in r["steering"] if d.startswith("heavy-"))
        if mode in ("exclusive", "stock-hybrid-excl"):
            # the heavy receiver and its receive processing on the non-RT CPU
            assert r["steering"][hv_dev] == [other] and h["receiver_cpus"] == [other]
            setup = r["mode_setup"]
            assert (setup if mode == "exclusive" else setup["exclusive"])[
                "heavy_receiver_cpus"] == [other]
            assert rx2["packets_processed"] >= 0.8 * h["rx_packets"], (rx2, h)
            assert rx["packets_processed"] < 0.1 * h["rx_packets"], (rx, h)
            if mode == "exclusive":
                assert r["steering"][rt_dev] == [rt]          # RT device: plain napi
        else:
            # put back on the RT CPU after exclusive (modes rotate: some ran after it)
            assert r["steering"][hv_dev] == [rt] and h["receiver_cpus"] == [rt]
            assert rx["packets_processed"] >= 0.8 * h["rx_packets"], (mode, rx, h)
            assert rx["net_rx"] > 0 and rx["received_rps"] > 0
        if mode == "napi":
            assert r["steering"][rt_dev] == [rt] and r["poller"] == {}
        if mode in ("stock-hybrid", "stock-hybrid-excl"):
            assert r["steering"][rt_dev] == [], "enable must turn RPS off on the RT device"
            assert r["poller"].get("poll_ns", 0) > 0, r["poller"]
    summ = res["summary"]
    assert all(d["passed"] for d in summ["steering_check"].values()), summ["steering_check"]
    assert set(summ["split"]["tcp"]) == set(MODES)
    ratio = summ["split"]["tcp"]["exclusive"]["rtt_mean_us"]["ratio_to_napi"]
    assert ratio["n"] == 2
    md = report.markdown(res)
    assert "**Steering check: PASS**" in md and "| mean (µs) | p99 (µs) | SD (µs) |" in md
    assert _ours() == before_ns
    assert _settings() == before_set
    assert _host_rps() == before_rps
    assert _procs() == [] and _iperf() == []


def test_ctrl_c_in_exclusive_leaves_nothing(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_ns, before_set, before_rps = _ours(), _settings(), _host_rps()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "kbp.bench", "--scenario", "rt-split",
                             "--smoke", "--modes", "exclusive,napi", "--duration", "5",
                             "--no-plots", "--no-trace", "--out", str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not set(_ours()) - set(before_ns):
        time.sleep(0.1)
    assert set(_ours()) - set(before_ns), "the benchmark never built its testbed"
    time.sleep(4.0)               # the heavy sender on, exclusive's first run under way
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert _ours() == before_ns
    assert _settings() == before_set
    assert _host_rps() == before_rps
    assert _procs() == [] and _iperf() == []
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["interrupted"] is True and res["scenario"]["name"] == "rt-split"
    assert "restore_problems" not in res and "not restored" not in err, err[-2000:]
