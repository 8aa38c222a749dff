"""Issue 23 on the host kernel's netns testbed (root): the RT CPU is free of reply and ACK
work.  With no flood, the packets processed on the RT CPU (softnet) per RT request are about
one -- the request -- in shared-cpu and rt-split, because every client end has GRO off and
RPS to the tester's / flood sender's CPU; the per-run RT CPU check passes and is recorded;
the tester's socket reports SO_BUSY_POLL 0; busypoll runs with RPS off on the RT device.
With the client ends left stock (GRO on: the reply's veth NAPI runs on the sending CPU, the
RT CPU) the check stops the benchmark.  Nothing is left behind.  About 40 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_netns import _ours, _procs, _settings, _skip_unless_ready
from test_shared_cpu_netns import _host_rps, _iperf

from kbp.bench import report
from kbp.bench.runner import Aborted, Bench, BenchConfig

pytestmark = [pytest.mark.netns, pytest.mark.root]


def _check_run(res: dict, rec: dict, low: float | None) -> None:
    chk = rec["rt_cpu_check"]
    sent = rec["tester"]["sent"] + rec["tester"]["warmup_sent"]
    assert chk["passed"] and chk["requests"] == sent, chk
    assert chk["per_request"] <= 1.3, (rec["mode"], chk)      # not 2: no reply there
    if low is not None:
        assert chk["per_request"] >= low, (rec["mode"], chk)  # the request is
    assert rec["tester"]["so_busy_poll_us"] == 0
    assert rec["lateness_ns"]["n"] > 0.9 * rec["tester"]["sent"]
    tail = rec["rtt_tail"]
    assert tail["n"] == rec["rtt_ns"]["n"] and tail["p99.9"]["k"] >= 1
    assert tail["p99"]["ci95"][0] <= tail["p99"]["value"] <= tail["p99"]["ci95"][1]


def _client_ends_ok(res: dict) -> None:
    cpus = res["placement"]["cpus"]
    devs = res["client_ends"]["devices"]
    assert devs and all(d["gro"] is False for d in devs.values()), devs
    assert all(d["rps"] and cpus["rt"] not in d["rps"] for d in devs.values()), devs
    rt_dev = next(d for d in devs if d.startswith("rt-"))
    assert devs[rt_dev]["rps"] == [cpus["tester"]]


def test_shared_cpu_idle_one_packet_per_request_on_the_rt_cpu(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_ns, before_set, before_rps = _ours(), _settings(), _host_rps()
    cfg = BenchConfig(scenario="shared-cpu", modes=["napi", "stock-hybrid", "busypoll"], reps=1,
                      duration=1.5, warmup=0.2, parts=["rtt"], loads=["off"], trace=False,
                      out=tmp_path, command="pytest")
    res = Bench(cfg).run()
    report.add_summary(res)
    res = json.loads(json.dumps(res))
    assert not res["interrupted"] and "restore_problems" not in res
    _client_ends_ok(res)
    assert sorted(res["mode_order"]["0"]) == ["busypoll", "napi", "stock-hybrid"]
    runs = {r["mode"]: r for r in res["runs"]}
    assert set(runs) == {"napi", "stock-hybrid", "busypoll"}
    for mode, r in runs.items():
        # busypoll: the app may poll the request from the RT CPU or the NAPI run where the
        # tester sent it (RPS off): at most one per request there
        _check_run(res, r, None if mode == "busypoll" else 0.8)
    rt_dev = next(d for d in runs["busypoll"]["steering"] if d.startswith("rt-"))
    assert runs["busypoll"]["steering"][rt_dev] == [], "busypoll must turn RPS off"
    assert runs["napi"]["steering"][rt_dev] == [res["placement"]["cpus"]["rt"]]
    assert set(res["tails"]) == {f"rtt|idle|{m}" for m in runs}
    md = report.markdown(res)
    assert "**RT CPU check**" in md and "Order of the modes" in md and "bootstrap" in md
    assert _ours() == before_ns and _settings() == before_set and _host_rps() == before_rps
    assert _procs() == [] and _iperf() == []


def test_rt_split_idle_one_packet_per_request_on_the_rt_cpu(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_ns, before_set, before_rps = _ours(), _settings(), _host_rps()
    cfg = BenchConfig(scenario="rt-split", modes=["napi", "stock-hybrid"], reps=1, duration=3.0,
                      warmup=0.2, loads=["off"], trace=False, out=tmp_path, command="pytest")
    res = json.loads(json.dumps(Bench(cfg).run()))
    assert not res["interrupted"] and "restore_problems" not in res
    _client_ends_ok(res)
    assert {r["mode"] for r in res["runs"]} == {"napi", "stock-hybrid"}
    for r in res["runs"]:
        assert r["condition"] == "idle" and r["tester"]["sent"] > 300
        _check_run(res, r, 0.8)
    assert _ours() == before_ns and _settings() == before_set and _host_rps() == before_rps
    assert _procs() == [] and _iperf() == []


def test_replies_on_the_rt_cpu_stop_the_benchmark(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The client ends left as the testbed makes them (GRO on): each reply's veth NAPI runs
    on the RT CPU that sends it, two packets per request there, and the check aborts."""
    _skip_unless_ready()
    before_ns, before_set, before_rps = _ours(), _settings(), _host_rps()
    monkeypatch.setattr(Bench, "_client_end", lambda self, name: None)
    # 3 s at 2000 req/s: enough requests (> 3,000) for their replies to exceed the slack
    cfg = BenchConfig(scenario="shared-cpu", modes=["napi"], reps=1, duration=3.0,
                      warmup=0.2, parts=["rtt"], loads=["off"], trace=False, out=tmp_path,
                      command="pytest")
    b = Bench(cfg)
    with pytest.raises(Aborted, match=r"the RT CPU processed .* replies, ACKs"):
        b.run()
    chk = b.results["runs"][0]["rt_cpu_check"]
    assert not chk["passed"] and chk["per_request"] > 1.5 and chk["sees_replies"], chk
    assert b.results["rt_cpu_check_failed"]
    assert _ours() == before_ns and _settings() == before_set and _host_rps() == before_rps
    assert _procs() == [] and _iperf() == []
