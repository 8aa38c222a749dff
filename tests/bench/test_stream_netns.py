"""The stream scenario on the host kernel's netns testbed (root): short bulk TCP and UDP
streams with napi and stock-hybrid move bytes through the RT device and its counters (device,
NET_RX, the stock-hybrid NAPI thread's CPU), the results are well-formed, and nothing is left
behind (namespaces, settings, iperf3, the RT app), also after Ctrl-C.  The periodic modes run
here when kbpctl offers them (else skipped with the backend's reason).  About 30 s; no
timing assertions.
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

from kbp.bench import report
from kbp.bench.modes import availability
from kbp.bench.runner import Bench, BenchConfig

pytestmark = [pytest.mark.netns, pytest.mark.root]


def _iperf() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "iperf3" in line and "198.18." in line]


def _run(tmp_path: Path, modes: list[str]) -> dict:
    cfg = BenchConfig(scenario="stream", modes=modes, reps=1, duration=1.0,
                      stream_warmup=1.0, parts=["stream-tcp", "stream-udp"], trace=False,
                      out=tmp_path, command="pytest")
    res = Bench(cfg).run()
    report.add_summary(res)
    return json.loads(json.dumps(res))          # well-formed JSON


def test_short_streams_napi_and_stock_hybrid(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_ns, before_set = _ours(), _settings()
    res = _run(tmp_path, ["napi", "stock-hybrid"])
    assert res["scenario"]["name"] == "stream" and not res["interrupted"]
    assert "restore_problems" not in res
    assert res["modes"]["stock-hybrid"]["status"] == "ok", res["modes"]
    cpus = res["placement"]["cpus"]
    assert cpus["rt"] != cpus["tester"] and cpus["heavy"] != cpus["rt"]
    setup = res["stream_setup"]
    assert setup["interrupts"]["source"] is None          # veth: no interrupts
    assert setup["sender_tso"].startswith("off")
    recs = {(r["mode"], r["part"]): r for r in res["stream"]}
    assert set(recs) == {(m, p) for m in ("napi", "stock-hybrid")
                         for p in ("stream-tcp", "stream-udp")}
    for (mode, part), r in recs.items():
        assert r["iperf"].get("bits_per_second", 0) > 0, (mode, part, r["iperf"])
        assert r["dev"]["packets"] > 0 and r["dev"]["bytes"] > 0, r["dev"]
        assert r["receiver_threads"], r
        assert "search" not in r                         # no periodic mode
        if mode == "napi":
            assert r["poller_threads"] == {} and r["poller"] == {}
            assert sum(r["sys"]["net_rx"]) > 0           # the NAPI ran in NET_RX softirq
        else:
            # the RT device's NAPI kthread polled the stream: it ran, its counters moved
            assert r["poller_threads"], r["mode_setup"]
            run_ns = sum(t["run_ns"] for p, t in r["sys"]["threads"].items()
                         if p in r["poller_threads"])
            assert run_ns > 0 and r["poller"].get("poll_ns", 0) > 0, r["poller"]
    summ = res["summary"]["stream"]
    for part in ("stream-tcp", "stream-udp"):
        assert summ[part]["napi"]["gbit_s"]["median"] > 0
        assert summ[part]["stock-hybrid"]["gbit_s"]["ratio_to_napi"]["n"] == 1
        assert summ[part]["napi"]["net_rx_per_pkt"]["median"] is not None
    md = report.markdown(res)
    assert "**bulk TCP stream" in md and "**bulk UDP stream" in md
    assert _ours() == before_ns
    assert _settings() == before_set
    assert _procs() == [] and _iperf() == []


@pytest.mark.parametrize("mode", ["stock-periodic", "periodic"])
def test_short_streams_periodic(tmp_path: Path, mode: str) -> None:
    """Needs kbpctl's periodic mode on that backend (and kbp.ko loaded for ``periodic``):
    skipped with the reason until then."""
    _skip_unless_ready()
    why = availability([mode])[mode]
    if why:
        pytest.skip(reason=why)
    before_ns, before_set = _ours(), _settings()
    res = _run(tmp_path, ["napi", mode])
    assert res["modes"][mode]["status"] == "ok" and "restore_problems" not in res
    for r in (r for r in res["stream"] if r["mode"] == mode):
        assert r["iperf"].get("bits_per_second", 0) > 0 and r["dev"]["packets"] > 0
        s = r["search"]
        assert "error" not in s, s
        assert isinstance(s.get("interval_us"), int | float) and s["interval_us"] > 0, s
    assert _ours() == before_ns and _settings() == before_set
    assert _procs() == [] and _iperf() == []


def test_ctrl_c_mid_stream_leaves_nothing(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_ns, before_set = _ours(), _settings()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "kbp.bench", "--scenario", "stream",
                             "--smoke", "--duration", "3", "--no-plots", "--no-trace",
                             "--out", str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _iperf():
        time.sleep(0.1)
    assert _iperf(), "the benchmark never started its receiver"
    time.sleep(2.5)                      # a stream running, napi or stock-hybrid on
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert _ours() == before_ns
    assert _settings() == before_set
    assert _procs() == [] and _iperf() == []
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["interrupted"] is True
    assert "restore_problems" not in res and "not restored" not in err, err[-2000:]
