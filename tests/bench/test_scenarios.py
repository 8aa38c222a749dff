"""The scenario registry and what a mode owns (issue 12, item 7), without root: unknown
scenarios, parts and loads are refused with the known ones before anything changes; every
scenario implements the protocol; modes place the app and ask for a fresh device themselves;
tools are read through their JSON output."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from kbp.bench import netstats, scenarios, trace
from kbp.bench.cli import main
from kbp.bench.modes import AppEnv, AppPlace, Target, all_modes
from kbp.bench.runner import Aborted, Bench, BenchConfig

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_registry_default_and_lookup() -> None:
    known = scenarios.all_scenarios()
    assert next(iter(known)) == scenarios.DEFAULT == "veth-inline"
    for name, s in known.items():
        assert scenarios.get(name) is not None and s.name == name
        assert s.links[0] == "rt" and s.parts and s.title
        for meth in ("roles", "tools", "check", "plan_seconds", "run", "summarize",
                     "render", "plots"):
            assert callable(getattr(s, meth)), (name, meth)
        assert all(len(f"{link}-s-abcd") <= 15 for link in s.links)   # IFNAMSIZ


def test_a_new_scenario_is_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module defining SCENARIO next to the others is registered, --help lists it, and the
    refusal of unknown names names it; nothing else is edited."""
    (tmp_path / "zz_probe.py").write_text(
        "from kbp.bench.scenarios.veth_inline import VethInline\n"
        "class Probe(VethInline):\n"
        "    name = 'zz-probe'\n"
        "    title = 'a probe scenario for the test'\n"
        "SCENARIO = Probe()\n")
    monkeypatch.setattr(scenarios, "__path__", [*scenarios.__path__, str(tmp_path)])
    scenarios.all_scenarios.cache_clear()
    try:
        assert list(scenarios.all_scenarios()) == ["veth-inline", "rt-split", "shared-cpu",
                                                   "stream", "zz-probe"]
        with pytest.raises(scenarios.UnknownScenario,
                           match="veth-inline, rt-split, shared-cpu, stream, zz-probe"):
            scenarios.get("nope")
        from kbp.bench.cli import description
        assert "zz-probe       a probe scenario for the test" in description()
        assert Bench(BenchConfig(scenario="zz-probe"), cpus_available=lambda: [0, 1]).plan()
    finally:
        scenarios.all_scenarios.cache_clear()
        sys.modules.pop("kbp.bench.scenarios.zz_probe", None)


def test_unknown_scenario_refused_with_the_known_ones() -> None:
    with pytest.raises(scenarios.UnknownScenario, match="choose from veth-inline"):
        scenarios.get("shared-cpu-typo")
    with pytest.raises(Aborted, match="unknown scenario 'nope': choose from veth-inline"):
        Bench(BenchConfig(scenario="nope"), cpus_available=lambda: [0, 1]).plan()


def test_cli_refuses_before_anything_changes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "nope", "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err
    assert "unknown scenario 'nope': choose from veth-inline" in err
    assert main(["--parts", "rtt,bogus"]) == 2
    assert "unknown part 'bogus' for scenario veth-inline: choose from rtt, table2, rfc2544" \
        in capsys.readouterr().err
    assert main(["--loads", "maybe"]) == 2
    assert "unknown load 'maybe'" in capsys.readouterr().err
    assert main(["--modes", "napi,warp"]) == 2
    assert "unknown mode 'warp'" in capsys.readouterr().err


def test_cli_unknown_scenario_as_a_program() -> None:
    p = subprocess.run([sys.executable, "-m", "kbp.bench", "--scenario", "nope"],
                       capture_output=True, text=True, env={"PYTHONPATH": SRC}, timeout=60)
    assert p.returncode == 2 and "choose from veth-inline" in p.stderr


def test_deprecated_scenarios_option_means_parts() -> None:
    import argparse

    from kbp.bench.cli import add_arguments, config_from_args
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    cfg = config_from_args(ap.parse_args(["--scenarios", "rtt", "--load-cpu", "0"]))
    assert cfg.parts == ["rtt"] and cfg.scenario == "veth-inline"
    assert cfg.cpus["tester"] == 0 and any("--scenarios" in d for d in cfg.deprecated)


def test_veth_inline_plan() -> None:
    s = scenarios.get("veth-inline")
    cfg = BenchConfig(parts=["rtt", "rfc2544"], loads=["off", "on"], reps=2, duration=1.0,
                      warmup=0.0, rfc_reps=1)
    assert s.tools(cfg) == ["iperf3"]
    assert s.roles(cfg) == ("tester", "rt", "flood", "heavy")
    # 2 reps x 2 loads x 3 modes x (1 s + 1.6 s) + 1 rep x 1 frame x 3 modes x search
    from kbp.bench import parts
    assert s.plan_seconds(cfg, 3) == pytest.approx(2 * 2 * 3 * 2.6 + 3 * parts.rfc_seconds(cfg))
    cfg.loads = ["off"]
    assert s.tools(cfg) == [] and s.roles(cfg) == ("tester", "rt")


def test_shared_cpu_plan_counts_what_the_modes_took() -> None:
    """Issue 38, item 7: the plan assumed 5.1 s per run where a -part run under the flood
    took 9.4-10.4 s; the demo's nine modes and three repetitions now plan about what the
    2026-11-29 demos took (5 min 48 s, ~340 s of runs), and the demo's budget keeps 3 reps."""
    from kbp.bench import cli
    s = scenarios.get("shared-cpu")
    cfg = BenchConfig(parts=["rtt"], loads=["off", "on"], reps=3, duration=3.0, warmup=0.5,
                      settle_s=1.0)
    assert s.modes_overhead_s(cfg, ["napi"]) == pytest.approx(3 * 1.0)
    assert s.modes_overhead_s(cfg, ["exclusive"]) == pytest.approx(3 * (1.0 + 2 * 1.0))
    # -part under the flood: 5.1 planned + 1 flood + 1 settle + 0.8 kbpctl + 2.5 enable
    part = s.modes_overhead_s(cfg, ["stock-hybrid-part"])
    assert part == pytest.approx(3 * (1.0 + 2 * 1.0 + 0.8 + 2.5))
    # its idle and flood runs per repetition: measured 6.4-6.6 + 9.4-10.4 s
    assert 15.8 <= 2 * 5.1 + part / 3 <= 17.0
    demo = ["napi", "threaded", "busypoll", "defer", "irq-suspend", "stock-hybrid",
            "exclusive", "stock-hybrid-excl", "stock-hybrid-part"]
    planned = s.plan_seconds(cfg, len(demo)) + s.modes_overhead_s(cfg, demo)
    assert 320 <= planned <= cli.PRESETS["demo"]["budget_s"]
    assert s.modes_overhead_s(BenchConfig(parts=["rfc2544"]), demo) == 0.0


def test_modes_own_their_quirks() -> None:
    modes = all_modes()
    home, env = AppPlace(1), AppEnv(spin_app="fifo", elsewhere_cpu=0, rt_prio=50)
    for name in ("napi", "threaded", "stock-hybrid", "hybrid"):
        assert modes[name].app_place(home, env) == home, name
    assert modes["busy"].app_place(home, env) == AppPlace(1, 51)
    assert modes["busy"].app_place(home, AppEnv("elsewhere", 0, 50)) == AppPlace(0)
    assert modes["busy"].app_place(home, AppEnv("same", 0, 50)) == home
    t = Target("nonexistent-ns", "no-such-dev-x", 1)
    assert not any(m.needs_fresh_device(t) for m in modes.values())
    # the runner does not know these quirks any more
    from kbp.bench import runner
    src = inspect.getsource(runner)
    assert "spins" not in src and "BACKEND_KMOD" not in src


def test_bpftrace_json_and_text_give_the_same() -> None:
    text = "@h[0, 312, 2800]: 10\n@h[0, 312, 45000]: 1\n@mx[0, 312]: 46491\n@sm[0, 312]: 74000\n"
    js = ('{"type": "attached_probes", "data": {"probes": 8}}\n'
          '{"type": "printf", "data": "READY\\n"}\n'
          '{"type": "map", "data": {"@h": {"0,312,2800": 10, "0,312,45000": 1}}}\n'
          '{"type": "map", "data": {"@mx": {"0,312": 46491}}}\n'
          '{"type": "map", "data": {"@sm": {"0,312": 74000}}}\n')
    assert trace.parse(js) == trace.parse(text)
    assert trace.parse(js)["xmit_to_poll"]["312"]["n"] == 11
    assert trace.is_ready('{"type": "printf", "data": "READY\\n"}') and trace.is_ready("READY")
    assert not trace.is_ready('{"type": "attached_probes", "data": {"probes": 8}}')


def test_proc_net_dev() -> None:
    text = ("Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes ...\n"
            "    lo:  198417     946    0    0    0     0          0         0   198417\n"
            "rt-s-ab12: 1500 3 0 2 0 0 0 0 10 1 0 0 0 0 0 0\n")
    assert netstats.parse_proc_net_dev(text, "rt-s-ab12") == {"bytes": 1500, "packets": 3,
                                                              "dropped": 2}
    assert netstats.parse_proc_net_dev(text, "rt-s") is None
    import os
    assert netstats.proc_net_dev(os.getpid(), "lo") is not None
    assert netstats.proc_net_dev(2**22 + 7, "lo") is None


def test_ip_json_link_stats() -> None:
    out = ('[{"ifindex":5,"ifname":"rt-s-ab12","stats64":{"rx":{"bytes":10,"packets":3,'
           '"errors":0,"dropped":2},"tx":{"bytes":5,"packets":1,"errors":0,"dropped":0}}}]')
    st = netstats.parse_link_stats(out)
    assert st["rx"]["packets"] == 3 and st["rx"]["dropped"] == 2
    assert netstats.parse_link_stats("") == {} and netstats.parse_link_stats("garbage") == {}
