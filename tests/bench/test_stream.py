"""Scenario ``stream`` (issue 10, item 5: NetAP's bulk TCP and UDP streams), without root:
its plan and placement on fake 2- and 4-CPU layouts, its defaults (modes, parts, presets),
the refusals, iperf3's JSON, the summary and report of synthetic runs (ratios to napi, the
periodic modes' interval, NET_RX per packet on veth, IRQs per packet with a NIC pair), the
plot, and the VM rig command."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kbp import _spec
from kbp.bench import cli, modes, report, scenarios, workloads
from kbp.bench.placement import Placement
from kbp.bench.runner import Aborted, Bench, BenchConfig
from kbp.bench.scenarios import stream as st

DEFAULT_MODES = ["napi", "hybrid", "periodic", "stock-hybrid", "stock-periodic"]


def _bench(cpus: list[int], **kw: Any) -> Bench:
    return Bench(BenchConfig(scenario="stream", **kw), cpus_available=lambda: cpus)


def test_registered_with_the_protocol() -> None:
    s = scenarios.get("stream")
    assert s is st.SCENARIO and s.links == ("rt",) and s.parts == ("stream-tcp", "stream-udp")
    assert s.tools(BenchConfig()) == ["iperf3"]
    assert scenarios.default_modes(s) == tuple(DEFAULT_MODES)
    assert scenarios.default_modes(scenarios.get("veth-inline")) == modes.standard_modes()
    # shared-cpu: every mode but the periodic ones (NetAP is for bulk streams), then the
    # exclusive CPU modes and the part modes
    assert scenarios.default_modes(scenarios.get("shared-cpu")) == (
        *(m for m in modes.standard_modes() if "periodic" not in m), "exclusive",
        "stock-hybrid-excl", "hybrid-excl", "busy-excl", "stock-hybrid-part", "hybrid-part",
        "busy-part")
    assert "stream" in cli.description()


@pytest.mark.parametrize(("cpus", "where"), [
    ([0, 1], {"tester": 0, "rt": 1, "heavy": 0, "app": 1, "harness": 0}),
    ([0, 1, 2, 3], {"tester": 0, "rt": 1, "heavy": 2, "app": 1, "harness": 3}),
    ([4, 5, 6], {"tester": 4, "rt": 5, "heavy": 6, "app": 5, "harness": 4}),
])
def test_plan_and_placement(cpus: list[int], where: dict[str, int]) -> None:
    b = _bench(cpus)
    pl = b.plan()
    assert dict(pl.cpus) == where
    assert "flood" not in pl.cpus                    # no flood in this scenario
    assert b.cfg.modes == DEFAULT_MODES
    assert b.cfg.parts == ["stream-tcp", "stream-udp", "idle"]
    assert b.links() == ("rt",) and b.roles() == ("tester", "rt", "heavy")
    b.runnable = list(b.cfg.modes)
    # 5 reps x 2 streams x 5 modes x (3 s warm-up + 10 s + 2.5 s), idle 5 x 11.5 s
    assert b.plan_seconds() == pytest.approx(5 * 2 * 5 * 15.5 + 5 * 11.5)


def test_explicit_choices_win_and_rtt_tcp_can_be_added() -> None:
    b = _bench([0, 1, 2, 3], modes=["napi", "stock-hybrid"], parts=["stream-udp", "rtt-tcp"])
    pl = b.plan()
    assert b.cfg.modes == ["napi", "stock-hybrid"] and b.cfg.parts == ["stream-udp", "rtt-tcp"]
    assert "flood" in pl.cpus and b.links() == ("rt", "tcp")
    b.runnable = ["napi", "stock-hybrid"]
    assert st.SCENARIO.plan_seconds(b.cfg, 2) == pytest.approx(5 * 1 * 2 * 15.5)


def test_refusals_before_anything_changes() -> None:
    with pytest.raises(Aborted, match="unknown part 'rtt' for scenario stream: choose from "
                                      "stream-tcp, stream-udp, idle, rtt-tcp"):
        _bench([0, 1], parts=["rtt"]).plan()
    with pytest.raises(Aborted, match="at least 1 s"):
        _bench([0, 1], duration=0.5).plan()
    with pytest.raises(Aborted, match="--udp-len 70000 is out of range"):
        _bench([0, 1], udp_len=70000).plan()
    with pytest.raises(Aborted, match="keep it in --modes"):
        _bench([0, 1], modes=["hybrid"]).plan()
    with pytest.raises(Aborted, match="needs 2 CPUs"):
        _bench([0]).plan()


def _cfg(argv: list[str]) -> BenchConfig:
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    return cli.config_from_args(ap.parse_args([*argv, "--out", "/tmp/never"]))


def test_cli_defaults_presets_and_knobs() -> None:
    cfg = _cfg(["--scenario", "stream"])
    assert cfg.modes == [] and cfg.parts is None           # the scenario's, by plan()
    b = Bench(cfg, cpus_available=lambda: [0, 1])
    b.plan()
    assert cfg.modes == DEFAULT_MODES
    # the full run searches as kbpctl does: the module's default round, a warm-up that holds
    # the search's 11 rounds; a latency scenario keeps the bench's 200 ms
    assert (cfg.periodic_round_ms, cfg.stream_warmup) == (1000, 12.0)
    assert st.FULL_ROUND_MS == _spec.KBP_ROUND_MS_DEF       # kbpctl's, the module's default
    assert _cfg(["--scenario", "stream", "--round-ms", "300"]).periodic_round_ms == 300
    assert _cfg(["--scenario", "shared-cpu"]).periodic_round_ms == 200
    cfg = _cfg(["--scenario", "stream", "--smoke"])
    assert cfg.modes == ["napi", "stock-hybrid"] and cfg.parts == ["stream-tcp", "stream-udp"]
    assert (cfg.duration, cfg.stream_warmup, cfg.periodic_round_ms) == (1.0, 1.0, 200)
    Bench(cfg, cpus_available=lambda: [0, 1]).plan()
    cfg = _cfg(["--scenario", "stream", "--demo"])
    assert cfg.scenario == "stream" and cfg.parts == ["stream-tcp", "stream-udp"]
    cfg = _cfg(["--scenario", "stream", "--smoke", "--duration", "2", "--round-ms", "1000",
                "--stream-warmup", "12", "--udp-len", "64", "--parts", "stream-tcp"])
    assert (cfg.duration, cfg.stream_warmup, cfg.udp_len) == (2.0, 12.0, 64)
    assert cfg.periodic_round_ms == 1000 and cfg.parts == ["stream-tcp"]
    assert _cfg(["--interval-us", "500"]).periodic_interval_us == 500
    # other scenarios keep their own modes and parts
    cfg = _cfg(["--scenario", "shared-cpu", "--smoke"])
    assert cfg.parts == ["rtt", "rfc2544"]
    b = Bench(_cfg(["--scenario", "veth-inline"]), cpus_available=lambda: [0, 1])
    b.plan()
    assert b.cfg.modes == list(modes.standard_modes())
    b = Bench(_cfg(["--scenario", "shared-cpu", "--modes", "napi,stock-periodic"]),
              cpus_available=lambda: [0, 1])
    b.plan()
    assert b.cfg.modes == ["napi", "stock-periodic"]          # named: they run


def test_iperf3_times_and_argv() -> None:
    cfg = BenchConfig(duration=10.0, stream_warmup=3.0)
    assert st.iperf_times(cfg) == (11, 3)
    assert st.iperf_times(BenchConfig(duration=1.5, stream_warmup=0.2)) == (3, 1)
    s = workloads.Stream("c", "s", "198.18.0.2", 0, 2, proto="udp", length=1472)
    argv = s.client_argv(11, 3)
    assert argv[:3] == ["taskset", "-c", "0"]
    assert argv[-7:] == ["-J", "-u", "-b", "0", "-l", "1472"][-6:] or "-u" in argv
    assert argv[argv.index("-t"):argv.index("-t") + 4] == ["-t", "11", "-O", "3"]
    assert "-u" not in workloads.Stream("c", "s", "x", 0, 1).client_argv(2, 1)
    with pytest.raises(ValueError, match="tcp or udp"):
        workloads.Stream("c", "s", "x", 0, 1, proto="sctp").client_argv(2, 1)


def test_iperf3_json() -> None:
    tcp = {"end": {"sum_sent": {"bytes": 10, "bits_per_second": 8e9, "retransmits": 3},
                   "sum_received": {"bytes": 9, "bits_per_second": 7.5e9, "seconds": 10.0}}}
    got = workloads.stream_summary(json.dumps(tcp), "tcp")
    assert got["bits_per_second"] == 7.5e9 and got["retransmits"] == 3
    udp = {"end": {"sum": {"bytes": 100, "bits_per_second": 2e9, "packets": 1000,
                           "lost_packets": 1010, "lost_percent": 101.0},
                   "sum_sent": {"bytes": 1000, "bits_per_second": 2e9},
                   "sum_received": {"bytes": 600, "bits_per_second": 1.2e9, "seconds": 2}}}
    got = workloads.stream_summary(json.dumps(udp), "udp")
    assert got["bits_per_second"] == 1.2e9 and got["sent_bytes"] == 1000
    assert st.udp_loss_pct(got) == pytest.approx(40.0)      # not iperf3's 101 %
    old = {"end": {"sum": {"bytes": 100, "bits_per_second": 2e9, "lost_percent": 25.0}}}
    got = workloads.stream_summary(json.dumps(old), "udp")
    assert got["bits_per_second"] == pytest.approx(1.5e9)
    assert workloads.stream_summary("", "tcp") == {}
    assert workloads.stream_summary('{"error": "the server is busy"}', "tcp") == {
        "error": "the server is busy"}


# -- summary and report of synthetic runs ------------------------------------------------------
PL2 = Placement(cpus={"tester": 0, "rt": 1, "heavy": 0, "app": 1, "harness": 0},
                available=(0, 1))
PL4 = Placement(cpus={"tester": 0, "rt": 1, "heavy": 2, "app": 1, "harness": 3},
                available=(0, 1, 2, 3))


def _rec(mode: str, rep: int, part: str, gbit: float, pkts: int, softirq_s: float,
         poller_pct: float, ncpu: int, irqs: int | None = None,
         search: dict[str, Any] | None = None) -> dict[str, Any]:
    wall = 2.0
    cpu = {str(c): {"seconds": {"softirq": softirq_s / ncpu}, "busy_pct": 50.0}
           for c in range(ncpu)}
    threads = {"900": {"name": RECV, "cpu_pct": 30.0}}
    pollers = {}
    if poller_pct:
        threads["77"] = {"name": "kbp/1", "cpu_pct": poller_pct}
        pollers = {"77": "kbp/1"}
    rec: dict[str, Any] = {
        "rep": rep, "mode": mode, "part": part, "proto": st.PROTO[part], "duration": wall,
        "iperf": {"bits_per_second": gbit * 1e9, "bytes": 900, "sent_bytes": 1000},
        "dev": {"packets": pkts, "bytes": pkts * 1500, "dropped": 0},
        "sys": {"wall_s": wall, "cpu": cpu, "net_rx": [pkts // 4] * ncpu, "threads": threads},
        "poller_threads": pollers, "receiver_threads": ["900"], "irqs": irqs, "poller": {}}
    if search is not None:
        rec["search"] = search
    return rec


RECV = st.RECEIVER
CONV = {"interval_us": 523, "converged": True, "rounds": 14, "restarts": 0,
        "search": {"interval_us": 523}}
# read while measured: one sample still searching, then converged after a restart
SAMPLES = [{"interval_us": 2510, "converged": False, "round": 3, "restarts": 0},
           {"interval_us": 523, "converged": True, "round": 12, "restarts": 1},
           {"interval_us": 523, "converged": True, "round": 13, "restarts": 1}]


def _results(pl: Placement, nic: bool = False) -> dict[str, Any]:
    ncpu = len(pl.available)
    recs = []
    for rep in range(2):
        for part in st.PROTO:
            irqs = 1000 if nic else None
            recs += [
                _rec("napi", rep, part, 10.0 + rep, 100_000, 0.6, 0.0, ncpu, irqs),
                _rec("hybrid", rep, part, 12.0, 100_000, 0.1, 40.0, ncpu,
                     500 if nic else None),
                _rec("periodic", rep, part, 13.0, 100_000, 0.1, 20.0, ncpu,
                     50 if nic else None, search=CONV),
                _rec("stock-periodic", rep, part, 11.0, 100_000, 0.2, 0.0, ncpu,
                     100 if nic else None,
                     search={"interval_us": 600.0, "interval_from": "gro_flush_timeout",
                             "searching": False}),
            ]
    for r in recs:
        if r["mode"] == "periodic":
            r["search_samples"] = SAMPLES
    res: dict[str, Any] = {
        "schema": "kbp-bench/2", "scenario": {"name": "stream", "title": st.SCENARIO.title},
        "config": BenchConfig(scenario="stream", reps=2).to_json(),
        "placement": pl.to_json(), "testbed": "test", "started": "now", "runs": [],
        "rfc2544": [], "idle": [], "stream": recs,
        "modes": {m: {"status": "ok"} for m in ("napi", "hybrid", "periodic",
                                                "stock-periodic")},
        "stream_setup": {"interrupts": {"source": "/proc/interrupts", "irqs": [24, 25]}
                         if nic else {"source": None, "why": "veth"},
                         "sender_tso": "the NIC's own" if nic else "off on the tester's",
                         "periodic": {"round_ms": 200}},
        "machine": {"power_meter": "no power meter"}}
    res["modes"]["stock-hybrid"] = {"status": "skipped", "reason": "kbp module not loaded"}
    return res


@pytest.mark.parametrize("pl", [PL2, PL4], ids=["2cpus", "4cpus"])
def test_summary_and_report(pl: Placement, tmp_path: Path) -> None:
    res = _results(pl)
    report.add_summary(res)
    res = json.loads(json.dumps(res))                      # well-formed JSON
    summ = res["summary"]["stream"]
    assert set(summ) == {"stream-tcp", "stream-udp"}
    tcp = summ["stream-tcp"]
    assert tcp["napi"]["gbit_s"]["median"] == pytest.approx(10.5)
    assert tcp["periodic"]["gbit_s"]["ratio_to_napi"]["median"] == pytest.approx(
        (13 / 10 + 13 / 11) / 2)
    ncpu = len(pl.available)
    roles = len(set(pl.role_cpus().values()))
    # softirq: only the roles' CPUs, % of one CPU; polling = poller threads + softirq
    soft = 100 * 0.6 / ncpu * roles / 2.0
    assert tcp["napi"]["softirq_cpu_pct"]["median"] == pytest.approx(soft)
    assert tcp["hybrid"]["polling_cpu_pct"]["median"] == pytest.approx(
        40 + 100 * 0.1 / ncpu * roles / 2.0)
    assert tcp["napi"]["dev_kpps"]["median"] == pytest.approx(50.0)
    assert tcp["napi"]["net_rx_per_pkt"]["median"] == pytest.approx(roles / 4)
    assert tcp["napi"]["irqs_per_pkt"]["median"] is None               # veth: none
    assert tcp["periodic"]["interval_us"]["median"] == 523
    assert tcp["periodic"]["converged"]["median"] == pytest.approx(2 / 3)  # of the samples
    assert tcp["periodic"]["search_restarts_in_window"]["median"] == 1
    assert tcp["stock-periodic"]["interval_us"]["median"] == 600
    assert "ratio_to_napi" not in tcp["periodic"]["interval_us"]      # napi has none
    assert summ["stream-udp"]["napi"]["lost_pct"]["median"] == pytest.approx(10.0)
    assert tcp["napi"]["lost_pct"]["median"] is None
    md = report.markdown(res)
    assert "**bulk TCP stream (iperf3) over the RT device**" in md
    assert "**bulk UDP stream (iperf3 -u -b 0) over the RT device**" in md
    assert "| periodic | 13 x1.24 |" in md and "| napi | 10.5 [10-11] |" in md
    assert "Kernel-timestamped" not in md and "goodput" in md
    assert "523, converged 67 %" in md and "IRQs/pkt" not in md.split("Skipped")[0].split(
        "NET_RX/pkt")[1].split("\n")[0]
    assert st.NO_IRQ_NOTE in md and "TSO is off" in md
    assert "- stock-hybrid: kbp module not loaded" in md
    assert "rounds of 200 ms" in md
    for c in sorted(set(pl.role_cpus().values())):
        assert f"{c} ({pl.cpu_label(c)})" in md
    made = st.SCENARIO.plots(res, {}, tmp_path)
    assert [p.name for p in made] == ["stream.png"] and made[0].stat().st_size > 1000


def test_report_with_a_nic_pair() -> None:
    res = _results(PL2, nic=True)
    report.add_summary(res)
    tcp = res["summary"]["stream"]["stream-tcp"]
    assert tcp["napi"]["irqs_per_pkt"]["median"] == pytest.approx(0.01)
    assert tcp["periodic"]["irqs_per_pkt"]["ratio_to_napi"]["median"] == pytest.approx(0.05)
    md = report.markdown(res)
    assert "IRQs/pkt" in md and "(24, 25)" in md and st.NO_IRQ_NOTE not in md
    assert "TSO is off" not in md


def test_empty_results_render() -> None:
    res = _results(PL2)
    res["stream"] = []
    report.add_summary(res)
    assert res["summary"]["stream"] == {}
    assert "**bulk TCP" not in report.markdown(res)
    assert st.stream_bars(res, Path("/nonexistent")) is None


def test_vm_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``python -m kbp.bench vm --flavour 7.2-amd64 --nic-pair --scenario stream``: the
    scenario and the rig's NIC pair reach the guest's benchmark (captured, not run)."""
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], *a: Any, **k: Any) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    assert cli.run_vm(["--flavour", "7.2-amd64", "--nic-pair", "--scenario", "stream",
                       "--out", str(tmp_path)]) == 0
    inner = seen[0][-1]
    src = str(Path(cli.__file__).resolve().parents[2])
    assert seen[0][seen[0].index("--env") + 1] == f"PYTHONPATH={src}"   # this kbp, in the guest
    assert inner.startswith('insmod "$KBP_KO" && modprobe veth && ')
    assert "--emulated --scenario stream" in inner
    assert inner.endswith('--nic-pair "$KBP_NIC1,$KBP_NIC0"')
    cfg = _cfg(["--emulated", "--scenario", "stream", "--nic-pair", "eth1,eth0"])
    b = Bench(cfg, cpus_available=lambda: [0, 1])
    b.plan()
    assert b.pair == ("eth1", "eth0") and cfg.modes == DEFAULT_MODES
