"""The results document's schema (kbp.bench.schema, issue 25 item 4), without root: one
version named in one place, older documents (kbp-bench/1, modes under older names) read and
rendered as before, a current run's document through dump and load unchanged, a newer
version refused by name, a missing required key reported by its path."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kbp.bench import cli, machine, plots, report, runner, schema
from kbp.bench.runner import Bench, BenchConfig
from kbp.bench.schema import SchemaError

DATA = Path(__file__).resolve().parent / "data"
V1 = DATA / "v1-veth-inline"            # kbp-bench/1's shape; results.md: 3181495's report
OLD = DATA / "old-stock-kbp"            # kbp-bench/2 with stock-kbp; results.md: 17bf7f5's
BENCH = Path(schema.__file__).resolve().parent
RENAMED = {"stock-kbp": "stock-hybrid", "stock-kbp-excl": "stock-hybrid-excl",
           "stock-kbp-part": "stock-hybrid-part"}


def _renamed(text: str) -> str:
    for o in sorted(RENAMED, key=len, reverse=True):
        text = text.replace(o, RENAMED[o])
    return text


# -- the version, named once --------------------------------------------------------------
def test_the_schema_is_named_in_one_place() -> None:
    assert schema.SCHEMA == f"kbp-bench/{schema.VERSION}" == "kbp-bench/2"
    assert runner.SCHEMA == schema.SCHEMA
    named = [p.relative_to(BENCH) for p in BENCH.rglob("*.py")
             if p.name != "schema.py" and re.search(r"kbp-bench/\d", p.read_text())]
    assert named == []


def test_the_config_type_is_the_configs_fields() -> None:
    """RunConfig (what results.json holds) has every BenchConfig field and nothing else."""
    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    assert set(schema.RunConfig.__annotations__) == fields
    assert set(BenchConfig().to_json()) == fields


def test_required_keys_are_what_the_report_indexes() -> None:
    assert schema.Results.__required_keys__ == {"schema"}
    assert schema.LatencyRun.__required_keys__ == {"rep", "mode", "part", "condition"}
    assert schema.ThroughputRun.__required_keys__ == {
        "rep", "mode", "frame", "throughput_pps", "throughput_mbps", "bound"}
    assert schema.IdleRun.__required_keys__ == {"mode"}
    assert schema.PlacementDoc.__required_keys__ == {"cpus"}
    assert schema.ModeStatus.__required_keys__ == {"status"}


# -- older documents ------------------------------------------------------------------------
def test_a_v1_file_loads_in_todays_shape_and_renders_as_before() -> None:
    """kbp-bench/1 (one scenario, ``scenario`` = the part, CPUs rt_cpu/load_cpu,
    stock-kbp): read by load, upgraded in one place, its report the one 3181495 gave (with
    today's mode names)."""
    raw = json.loads((V1 / "results.json").read_text())
    assert raw["schema"] == "kbp-bench/1" and "cpus" not in raw["placement"]
    res = schema.load(V1)
    assert res["schema"] == schema.SCHEMA
    assert res["scenario"]["name"] == "veth-inline" and res["config"]["parts"] == [
        "rtt", "rfc2544"]
    assert "scenarios" not in res["config"]
    assert {r["part"] for r in res["runs"]} == {"rtt"}
    assert {r["scenario"] for r in res["runs"]} == {"veth-inline"}
    assert {s["part"] for s in res["rfc2544"]} == {"rfc2544"}
    assert res["placement"]["cpus"]["rt"] == 1 and res["placement"]["cpus"]["tester"] == 0
    assert {r["mode"] for r in res["runs"]} == {"napi", "stock-hybrid"}
    assert res["command"] == raw["command"]                     # as it was run
    assert schema.problems(res) == []
    report.add_summary(res)
    assert report.markdown(res) == (V1 / "results.md").read_text()
    assert schema.load(copy.deepcopy(res)) == res               # today's shape: unchanged


def test_the_old_stock_kbp_file_loads_and_renders_as_before() -> None:
    """The 17bf7f5 fixture through load (path and run directory) and load_samples: the
    same report as test_mode_table's, byte for byte; nothing under an old name left."""
    res = schema.load(OLD / "results.json")
    assert schema.load(OLD) == res
    report.add_summary(res)
    assert report.markdown(res) == _renamed((OLD / "results.md").read_text())
    samples = schema.load_samples(OLD)
    assert samples and not [k for k in samples if "stock-kbp" in k]
    rest = json.dumps({k: v for k, v in res.items() if k != "command"})
    assert "stock-kbp" not in rest


def test_the_report_command_renders_a_v1_directory(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results.json").write_bytes((V1 / "results.json").read_bytes())
    assert cli.main(["report", str(tmp_path)]) == 0          # no samples: no latency CDF
    out = capsys.readouterr().out
    assert out == (V1 / "results.md").read_text() + "\n"


# -- a current run's document -------------------------------------------------------------
def _run(mode: str, rep: int, cond: str, p99: float) -> dict[str, Any]:
    return {"rep": rep, "mode": mode, "scenario": "veth-inline", "part": "rtt",
            "condition": cond, "rate": 2000.0, "poisson": True, "payload": 18,
            "duration": 1.0,
            "rtt_ns": {"n": 100, "p50": 50_000, "p99": p99, "p99.9": 2 * p99, "max": 3 * p99,
                       "mean": 60_000, "sd": 10_000},
            "tester": {"sent": 100}, "lost": rep,
            "kernel_delay": {"xmit_to_poll": {"n": 100, "p50": 2000, "p99": 9000, "max": 20000},
                             "poller_wake_to_run": None, "app_wake_to_run": None},
            "sys": {"wall_s": 1.0, "cpu": {str(c): {"busy_pct": 10.0 * (c + 1), "pct": {}}
                                           for c in range(4)},
                    "net_rx": [1, 2, 3, 4], "hardirqs_total": [0, 0, 0, 0], "threads": {}},
            "poller": {"packets": 100}}


def _current(monkeypatch: pytest.MonkeyPatch) -> schema.Results:
    """A document as the runner assembles it (Bench.head, the records, the tail), with a
    planned placement on 4 CPUs and no benchmark run."""
    monkeypatch.setattr(machine, "tool_versions", lambda: {"sockperf": "sockperf 3.10"})
    bench = Bench(BenchConfig(modes=["napi", "stock-hybrid"], reps=2, parts=["rtt", "idle"],
                              command="pytest", seed=3),
                  cpus_available=lambda: [0, 1, 2, 3])
    bench.plan()
    doc = bench.head(emulated=False)
    doc["modes"] = {"napi": {"status": "ok"}, "stock-hybrid": {"status": "ok"},
                    "busy": {"status": "skipped", "reason": "kbp module not loaded"}}
    samples: schema.Samples = {}
    for rep in range(2):
        doc["mode_order"][str(rep)] = runner.seeded_order(["napi", "stock-hybrid"], 3, rep)
        for cond in ("load-off", "load-on"):
            for mode, p99 in (("napi", 90e3), ("stock-hybrid", 60e3)):
                doc["runs"].append(_run(mode, rep, cond, p99 * (rep + 1)))
                samples.setdefault(schema.sample_key("rtt", cond, mode), []).extend(
                    range(40_000, 40_000 + 100 * (rep + 1)))
    doc["idle"].append({"mode": "napi", "part": "idle", "duration": 10.0,
                        "poller_threads": {}, "app_threads": [], "poller": {},
                        "sys": {"wall_s": 10.0, "cpu": {}, "net_rx": [], "threads": {}}})
    doc["tails"] = runner.pooled_tails(doc["runs"], samples, 3)
    doc["finished"] = doc["started"]
    return doc


def test_a_current_document_round_trips(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _current(monkeypatch)
    assert doc["schema"] == schema.SCHEMA and schema.problems(doc) == []
    assert doc["placement"]["cpus"]["rt"] != doc["placement"]["cpus"]["tester"]
    assert doc["config"]["modes"] == ["napi", "stock-hybrid"]
    report.add_summary(doc)
    want = json.loads(json.dumps(doc))
    path = schema.dump(doc, tmp_path / "results.json")
    got = schema.load(path)
    assert got == want
    again = schema.dump(got, tmp_path / "again.json")
    assert again.read_text() == path.read_text() == schema.dumps(doc)
    md = report.markdown(got)
    assert md == report.markdown(schema.load(path)) and "| stock-hybrid |" in md
    paths = runner.write_outputs(got, {"rtt|load-off|napi": [1, 2]}, tmp_path / "out")
    assert schema.load(paths["json"]) == want
    assert schema.load_samples(paths["samples"]) == {"rtt|load-off|napi": [1, 2]}
    made = plots.all_plots(got, schema.load_samples(paths["samples"]), tmp_path)
    assert {p.name for p in made} >= {"latency_cdf.png", "cpu.png"}


def test_dump_gives_a_document_todays_schema(tmp_path: Path) -> None:
    doc: dict[str, Any] = {"runs": []}
    schema.dump(doc, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == schema.SCHEMA


# -- refusals -------------------------------------------------------------------------------
def test_a_newer_version_is_refused_by_name(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads((OLD / "results.json").read_text())
    doc["schema"] = "kbp-bench/3"
    with pytest.raises(SchemaError, match=r"kbp-bench/3 is newer than this kbp reads "
                                          r"\(kbp-bench/2\)"):
        schema.load(copy.deepcopy(doc))
    with pytest.raises(SchemaError, match="kbp-bench/3"):
        report.markdown(copy.deepcopy(doc))
    (tmp_path / "results.json").write_text(json.dumps(doc))
    with pytest.raises(SchemaError, match=r"results\.json: results schema kbp-bench/3"):
        schema.load(tmp_path)
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "kbp-bench/3" in err and "newer" in err


@pytest.mark.parametrize("value", [None, "kbpctl-status/1", "kbp-bench/x", "kbp-bench/0", 2])
def test_another_kind_of_document_is_refused(value: Any) -> None:
    doc: dict[str, Any] = {"runs": []}
    if value is not None:
        doc["schema"] = value
    with pytest.raises(SchemaError, match="not a kbp bench results document"):
        schema.load(doc)


def test_a_missing_required_key_is_reported_with_its_path() -> None:
    doc = json.loads((OLD / "results.json").read_text())
    del doc["runs"][1]["condition"]
    del doc["modes"]["napi"]["status"]
    with pytest.raises(SchemaError) as e:
        schema.load(copy.deepcopy(doc))
    assert "runs[1].condition: required key missing" in str(e.value)
    assert "modes.napi.status: required key missing" in str(e.value)
    with pytest.raises(SchemaError, match=r"runs\[1\]\.condition"):
        report.add_summary(copy.deepcopy(doc))          # not a KeyError in the summary
    v1 = json.loads((V1 / "results.json").read_text())
    del v1["rfc2544"][2]["bound"]
    with pytest.raises(SchemaError, match=r"rfc2544\[2\]\.bound: required key missing"):
        schema.load(v1)
    bad: dict[str, Any] = {"schema": schema.SCHEMA, "runs": {"not": "a list"},
                           "placement": {"pinned": []}}
    assert sorted(schema.problems(bad)) == ["placement.cpus: required key missing",
                                            "runs: a list expected, found dict"]


# -- the types follow the code ------------------------------------------------------------
def _record_keys(path: Path, types: tuple[str, ...]) -> dict[str, set[str]]:
    """{type: keys} of the records a module's functions build or read: a variable or an
    argument annotated with the type (``rec: LatencyRun = {...}``, ``rec: IdleRun``), its
    literal's keys and its ``[...]`` and ``.get(...)`` keys."""
    out: dict[str, set[str]] = {t: set() for t in types}
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef):
            continue
        var = {a.arg: a.annotation.id for a in fn.args.args
               if isinstance(a.annotation, ast.Name) and a.annotation.id in types}
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and isinstance(node.annotation, ast.Name) and \
                    node.annotation.id in types and isinstance(node.target, ast.Name):
                var[node.target.id] = node.annotation.id
                if isinstance(node.value, ast.Dict):
                    out[node.annotation.id] |= {k.value for k in node.value.keys
                                                if isinstance(k, ast.Constant)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                    node.value.id in var and isinstance(node.slice, ast.Constant):
                out[var[node.value.id]].add(node.slice.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "get" and isinstance(node.func.value, ast.Name) and \
                    node.func.value.id in var and node.args and \
                    isinstance(node.args[0], ast.Constant):
                out[var[node.func.value.id]].add(node.args[0].value)
    return out


def test_every_key_the_bench_uses_is_in_the_types() -> None:
    """The top-level keys the bench reads and writes (``results[...]``, ``.get``,
    ``.setdefault``) and the keys the measurements put in their records are keys of
    Results, LatencyRun, IdleRun and ThroughputRun: a new key is declared where it lives."""
    top = {m.group(1) for f in BENCH.rglob("*.py") for m in re.finditer(
        r'\bresults(?:\[|\.get\(|\.setdefault\()"([a-z_0-9]+)"', f.read_text())}
    assert {"runs", "config", "placement", "tails", "summary"} <= top
    assert top <= set(schema.Results.__annotations__)
    for f, tp in (("latency.py", schema.LatencyRun), ("idle.py", schema.IdleRun),
                  ("throughput.py", schema.ThroughputRun)):
        keys = _record_keys(BENCH / "measure" / f, (tp.__name__,))[tp.__name__]
        assert {"mode", "sys"} <= keys <= set(tp.__annotations__), (f, keys)
    used = _record_keys(BENCH / "report.py", ("LatencyRun", "IdleRun"))
    for name, keys in used.items():
        assert {"sys", "poller"} <= keys <= set(getattr(schema, name).__annotations__)


def test_a_streams_keys_are_in_its_type() -> None:
    """The keys the stream scenario puts in its records (quiet, iperf, sys, search, ...)
    are StreamRun's."""
    keys = _record_keys(BENCH / "scenarios" / "stream.py", ("StreamRun",))["StreamRun"]
    assert {"mode", "sys", "iperf", "took_s"} <= keys <= set(schema.StreamRun.__annotations__)


def test_every_summary_key_is_in_the_type() -> None:
    """A scenario's summary holds Summary's keys only (shared-cpu's ``equal_work`` too)."""
    for src in (V1, OLD):
        doc = report.add_summary(json.loads((src / "results.json").read_text()))
        assert "rtt" in doc["summary"], src.name
        assert set(doc["summary"]) <= set(schema.Summary.__annotations__), src.name
