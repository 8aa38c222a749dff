"""Modes and scenarios that describe themselves (issue 25, item 2), without root: one table
(kbp.bench.modes.CATALOG) says what each mode is, and --help, the plots' colours, the report's
order, the runner's checks and the scenarios' mode lists follow from it, so adding a mode is
one entry there; no mode name is typed as a literal anywhere else in the benchmark; the
stock backend's hybrid is ``stock-hybrid`` (``stock-kbp`` before 2026-11-27), and the old
names are still taken by --modes and read from old results files; scenarios read their
optional members from the Scenario base class's defaults, never with getattr."""

from __future__ import annotations

import argparse
import ast
import gzip
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from kbp import modespec, names
from kbp.bench import cli, modes, plots, report, runner, scenarios
from kbp.bench.modes import ModeInfo, NapiMode
from kbp.bench.runner import Bench, BenchConfig

BENCH = Path(modes.__file__).resolve().parent
OLD = Path(__file__).resolve().parent / "data" / "old-stock-kbp"
RENAMED = {"stock-kbp": "stock-hybrid", "stock-kbp-excl": "stock-hybrid-excl",
           "stock-kbp-part": "stock-hybrid-part"}


# -- the table ---------------------------------------------------------------------------
def test_every_mode_is_described_once() -> None:
    cat = modes.catalog()
    assert next(iter(cat)) == modes.BASELINE == "napi"
    assert len({i.colour for i in cat.values()}) == len(cat)            # one colour each
    assert {i.category for i in cat.values()} == set(modes.CATEGORIES)
    for name, info in cat.items():
        assert info.name == name and info.summary and info.make().name == name, name
        if info.category == modes.KBPCTL:     # named and spinning as kbpctl's mode
            assert info.backend is not None and info.kbp_mode is not None
            assert name == modes.backend_mode(info.backend, info.kbp_mode)
            assert info.spins == modespec.spins(info.kbp_mode), name
        if info.heavy and info.base != modes.BASELINE:   # a kbp mode's -excl / -part
            base = cat[info.base or ""]
            assert (info.backend, info.kbp_mode, info.spins, info.kthread) == (
                base.backend, base.kbp_mode, base.spins, base.kthread), name
        assert info.make().spins == info.spins, name
        assert info.make().moves_load == info.moves_load, name
    assert modes.STOCK_HYBRID == "stock-hybrid" and modes.HYBRID == names.MODE_HYBRID
    assert modes.named(lambda i: i.periodic) == ("stock-periodic", "periodic")
    assert modes.named(lambda i: i.module) == ("busy", "hybrid", "periodic", "hybrid-excl",
                                               "busy-excl", "hybrid-part", "busy-part")


def test_adding_a_mode_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mode registered in the table (and nowhere else) is in --help, has its own colour in
    the plots, takes its place in the report's tables, is planned by the runner in every
    scenario and is among the modes it makes."""
    dummy = ModeInfo("zz-dummy", modes.KERNEL, "a dummy mode for the test", "#123456",
                     lambda: NapiMode(name="zz-dummy"))
    monkeypatch.setitem(modes.CATALOG, dummy.name, dummy)
    assert "\nzz-dummy       a dummy mode for the test" in cli.description()
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    assert "zz-dummy" in ap.format_help()
    assert plots.color("zz-dummy") == "#123456" and plots.style("zz-dummy") == "-"
    assert len(set(plots.palette().values())) == len(plots.palette())
    assert report.mode_order()[-1] == "zz-dummy"
    summ = {"zz-dummy": {"rtt_p99_us": {"median": 9.0}}, "napi": {"rtt_p99_us": {"median": 1.0}}}
    table = report.latency_table(summ, (("rtt_p99_us", "p99", "us"),))
    assert table.index("| napi |") < table.index("| zz-dummy |")
    for scen in scenarios.all_scenarios():
        b = Bench(BenchConfig(scenario=scen, modes=["napi", "zz-dummy"]),
                  cpus_available=lambda: [0, 1])
        b.plan()
        assert b.cfg.modes == ["napi", "zz-dummy"], scen
    assert "zz-dummy" in scenarios.default_modes(scenarios.get("veth-inline"))
    assert "zz-dummy" in scenarios.default_modes(scenarios.get("shared-cpu"))
    assert modes.all_modes()["zz-dummy"].name == "zz-dummy"


def _literals(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_mode_name_is_typed_outside_the_table() -> None:
    """No string in the benchmark's code (docstrings aside) is a mode's name, except in
    kbp.bench.modes: the others take the names from there.  The kbp module's modes share
    their names with kbpctl's (names.MODES: busy, hybrid, periodic: kbpctl's vocabulary, and
    "busy" is also iperf3's word), so only the benchmark's own names are looked for; the
    older names appear nowhere else at all."""
    own = {n for i in modes.catalog().values() for n in (i.name, *i.aliases)} - set(names.MODES)
    old = set(modes.aliases())
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        if path.name == "modes.py" and path.parent == BENCH:
            continue
        found += [f"{path.relative_to(BENCH)}:{line}: {v!r}" for line, v in _literals(path)
                  if v in own]
        text = path.read_text()
        found += [f"{path.relative_to(BENCH)}: older name {o!r}" for o in old if o in text]
    assert found == []


# -- stock-kbp is stock-hybrid ------------------------------------------------------------
def test_the_old_names_are_aliases() -> None:
    assert modes.aliases() == RENAMED
    assert [modes.canonical(m) for m in ("stock-kbp", "stock-kbp-part", "napi", "nope")] == [
        "stock-hybrid", "stock-hybrid-part", "napi", "nope"]
    assert plots.color("stock-kbp") == plots.color("stock-hybrid") != plots.FALLBACK
    assert plots.style("stock-kbp-excl") == "--"
    assert "stock-kbp = stock-hybrid" in cli.description()


def test_modes_with_an_old_name_are_taken_with_a_note() -> None:
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    cfg = cli.config_from_args(ap.parse_args(["--scenario", "rt-split", "--modes",
                                              "napi,stock-kbp,stock-kbp-part,exclusive"]))
    b = Bench(cfg, cpus_available=lambda: [0, 1])
    b.plan()
    assert cfg.modes == ["napi", "stock-hybrid", "stock-hybrid-part", "exclusive"]
    assert cfg.deprecated == ["--modes stock-kbp (now stock-hybrid), stock-kbp-part (now "
                              "stock-hybrid-part)"]
    b.plan()                                  # planning again: nothing more to say
    assert len(cfg.deprecated) == 1
    with pytest.raises(runner.Aborted, match="unknown mode 'stock-hybrid-part' for scenario "
                                             "veth-inline"):
        Bench(BenchConfig(modes=["napi", "stock-kbp-part"]),
              cpus_available=lambda: [0, 1]).plan()


def _old() -> tuple[dict[str, Any], dict[str, list[int]]]:
    res = json.loads((OLD / "results.json").read_text())
    with gzip.open(OLD / "samples.json.gz", "rt") as f:
        samples = json.load(f)
    return res, samples


def test_an_old_results_file_reads_with_todays_names(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared-cpu results.json written with stock-kbp, stock-kbp-excl and stock-kbp-part
    (and its samples): its report is the one the code before the rename gave (17bf7f5,
    results.md beside it), with today's names; its plots draw every mode in its own colour;
    nothing under an old name is left but the command as it was run."""
    res, samples = _old()
    assert "stock-kbp" in json.dumps(res)
    report.add_summary(res)
    want = (OLD / "results.md").read_text()
    for o in sorted(RENAMED, key=len, reverse=True):
        want = want.replace(o, RENAMED[o])
    assert report.markdown(res) == want
    assert "| stock-hybrid-part | 2 |" in want
    rest = json.dumps({k: v for k, v in res.items() if k != "command"})
    assert "stock-kbp" not in rest and "stock-hybrid-excl" in rest
    assert "--modes napi,exclusive,stock-kbp," in res["command"]       # as it was run
    assert res["idle_skipped"] == {"stock-hybrid-excl": "moves the heavy flow, which does "
                                                        "not exist in the idle part"}
    assert res["tails"]["rtt|flood|stock-hybrid-part"]["runs"] == 2
    drawn: dict[str, str] = {}
    colour = plots.color
    monkeypatch.setattr(plots, "color", lambda m: drawn.setdefault(m, colour(m)))
    made = plots.all_plots(res, samples, tmp_path)
    assert {p.name for p in made} >= {"latency_cdf.png", "cpu.png"}
    assert set(drawn) == {"napi", "exclusive", *RENAMED.values()}
    assert len(set(drawn.values())) == len(drawn) and plots.FALLBACK not in drawn.values()
    assert set(samples) == {f"rtt|{c}|{RENAMED.get(m, m)}" for c in ("idle", "flood")
                            for m in ("napi", "exclusive", *RENAMED)}


def test_the_report_command_reads_an_old_run(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m kbp.bench report DIR`` on the old run's directory."""
    for f in ("results.json", "samples.json.gz"):
        (tmp_path / f).write_bytes((OLD / f).read_bytes())
    assert cli.main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| stock-hybrid |" in out and "stock-kbp" not in out
    assert (tmp_path / "latency_cdf.png").exists()


# -- scenarios: defaults from the base class ------------------------------------------------
def test_scenario_defaults_without_getattr() -> None:
    class Bare(scenarios.Scenario):
        name, title, links, parts = "bare", "a bare scenario", ("rt",), ("rtt",)
    s = Bare()
    assert (s.measures, s.default_parts, s.presets, s.flood, s.own_modes) == (
        scenarios.ROUND_TRIPS, None, {}, None, {})
    assert scenarios.default_modes(s) == modes.standard_modes() == s.mode_names()
    assert s.make_modes() == {} and not s.offers("exclusive") and s.offers("napi")
    with pytest.raises(NotImplementedError):
        s.roles(BenchConfig())
    heavy = scenarios.get("rt-split")
    assert heavy.binds_heavy and heavy.offers("exclusive") and heavy.offers("busy-part")
    srcs = [inspect.getsource(m) for m in (runner, cli, report, scenarios)] + [
        inspect.getsource(type(s)) for s in scenarios.all_scenarios().values()]
    for src in srcs:
        assert "getattr(self.scenario" not in src and "getattr(scen" not in src
        assert "getattr(scenario" not in src
