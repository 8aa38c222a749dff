"""The monitoring objects of contrib/kubernetes against what the exporter really serves: every
PromQL expression of the PrometheusRule and of the sidecar's dashboard parses (the
promql-parser package, Prometheus' grammar), every kbp_ metric and label they name is in a
real scrape of kbpctl's exporter (tests/kbpctl/test_exporter.py's Status through the exporter,
with a config, parsed back as Prometheus reads it), the problem kinds they name are the
exporter's, the alerts the issue asks for are there; the PodMonitor finds the agent's pods
and port; the dashboard ConfigMap's copy is contrib/grafana/kbp.json made provisionable."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kbp import exporter
from kbp.exporter import KbpCollector

from .schemas import K8S, REPO, load_docs, unavailable

RULE = load_docs(K8S / "monitoring/prometheusrule.yaml")[0].obj
PODMON = load_docs(K8S / "monitoring/podmonitor.yaml")[0].obj
DAEMONSET = load_docs(K8S / "node-agent/daemonset.yaml")[0].obj
KUSTOMIZATION = load_docs(K8S / "kustomization.yaml")[0].obj
DASHBOARD = K8S / "monitoring/kbp.json"
RULES = [r for g in RULE["spec"]["groups"] for r in g["rules"]]
# Grafana's own variables in the dashboard's queries, as Grafana fills them in
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def promql() -> ModuleType:
    try:
        import promql_parser
    except ImportError:
        unavailable("promql-parser is not installed: pip install -e '.[dev]', which "
                    "scripts/setup.sh runs")
        raise
    return promql_parser


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, {label: value}) of every series selector of a PromQL expression."""
    p = promql()
    out: list[tuple[str, dict[str, str]]] = []

    def visit(node: Any) -> None:
        if type(node).__name__ == "VectorSelector":
            matchers = {m.name: m.value for m in node.matchers.matchers}
            out.append((node.name or matchers.pop("__name__"), matchers))
    p.walk(p.parse(expr), visit)
    return out


def dashboard_exprs() -> Iterator[str]:
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            e = t["expr"]
            for var, value in GRAFANA_VARS.items():
                e = e.replace(var, value)
            yield e


def scraped(tmp: Path) -> dict[str, set[str]]:
    """Sample name -> its label names, in a scrape of the exporter as the agent runs it (a
    config given); the Status is the one tests/kbpctl/test_exporter.py builds, with module
    pollers, devices of both backends, NAPIs, threads, periodic state and problems."""
    from kbpctl.test_exporter import make_status  # tests/kbpctl's fixture
    cfg = tmp / "kbp.toml"
    cfg.write_text('backend = "kmod"\n[[device]]\nname = "eth1"\n')
    text = exporter.exposition(exporter.registry(KbpCollector(make_status, config=cfg)))
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


# Prometheus' own series and the labels its scrape adds (the PodMonitor's relabeling: node)
PROMETHEUS = {"up"}
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "node"}


@pytest.mark.parametrize("expr", [r["expr"] for r in RULES] + list(dashboard_exprs()))
def test_every_expression_names_only_what_the_exporter_serves(expr: str,
                                                               tmp_path: Path) -> None:
    metrics = scraped(tmp_path)
    sels = selectors(expr)
    assert sels, expr
    for name, matchers in sels:
        if name in PROMETHEUS:
            continue
        assert name in metrics, f"{name} is not in a scrape of the exporter ({expr})"
        assert set(matchers) <= metrics[name] | TARGET_LABELS, (name, matchers)
        if "kind" in matchers:   # kbp_problems{kind}: the exporter's kinds
            kinds = re.split(r"\|", matchers["kind"])
            assert set(kinds) <= set(exporter.PROBLEM_KIND_NAMES), kinds


def test_a_broken_expression_is_caught(tmp_path: Path) -> None:
    p = promql()
    with pytest.raises(ValueError):
        p.parse('kbp_problems{kind="misplaced"} >')
    with pytest.raises(AssertionError, match="kbp_problem "):
        test_every_expression_names_only_what_the_exporter_serves(
            'kbp_problem{kind="misplaced"} > 0', tmp_path)
    with pytest.raises(AssertionError, match="misplace"):
        test_every_expression_names_only_what_the_exporter_serves(
            'kbp_problems{kind="misplace"} > 0', tmp_path)


def test_the_alerts_the_issue_asks_for() -> None:
    """Poller stuck, device served by the wrong CPU, module not loaded where the config asks
    for it, the exporter's scrape errors: each has its alert."""
    by = {r["alert"]: r for r in RULES}
    assert len(by) == len(RULES) and all(r.get("for") and r["labels"]["severity"] in
                                         ("warning", "critical") for r in RULES)
    assert selectors(by["KbpPollerStuck"]["expr"]) == [("kbp_problems", {"kind": "poller_stuck"})]
    assert selectors(by["KbpDeviceMisplaced"]["expr"]) == [("kbp_problems", {"kind": "misplaced"})]
    assert selectors(by["KbpModuleNotLoaded"]["expr"]) == [
        ("kbp_backend_required", {"backend": "kmod"}), ("kbp_module_loaded", {})]
    assert selectors(by["KbpExporterScrapeErrors"]["expr"]) == [("kbp_exporter_errors_total", {})]
    assert ("up", {"job": "kbp-node-agent"}) in selectors(by["KbpExporterDown"]["expr"])
    for r in RULES:
        assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_the_podmonitor_scrapes_the_agent() -> None:
    pod = DAEMONSET["spec"]["template"]
    labels = pod["metadata"]["labels"]
    sel = PODMON["spec"]["selector"]["matchLabels"]
    assert sel.items() <= labels.items()
    assert PODMON["metadata"]["namespace"] == DAEMONSET["metadata"]["namespace"]
    # up{job="kbp-node-agent"}: the job is the pods' value of jobLabel
    assert labels[PODMON["spec"]["jobLabel"]] == "kbp-node-agent"
    c = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    (ep,) = PODMON["spec"]["podMetricsEndpoints"]
    assert ep["port"] in ports and ep["path"] == "/metrics"
    assert f"--port={ports[ep['port']]}" in c["args"]
    probe = c["readinessProbe"]["httpGet"]
    assert probe["path"] == "/metrics" and probe["port"] == ep["port"]
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in ep["relabelings"]}
    assert relabel["node"] == ["__meta_kubernetes_pod_node_name"]


def _sync_script() -> ModuleType:
    path = K8S / "monitoring/sync_dashboard.py"
    spec = importlib.util.spec_from_file_location("kbp_sync_dashboard", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_sidecar_dashboard_is_in_sync_with_contrib_grafana() -> None:
    sync = _sync_script()
    assert DASHBOARD.read_text() == sync.render(REPO / "contrib/grafana/kbp.json"), (
        "contrib/kubernetes/monitoring/kbp.json is not contrib/grafana/kbp.json made "
        "provisionable: run python3 contrib/kubernetes/monitoring/sync_dashboard.py")


def test_the_sync_check_catches_an_edit(tmp_path: Path) -> None:
    sync = _sync_script()
    src = json.loads((REPO / "contrib/grafana/kbp.json").read_text())
    src["panels"][0]["title"] = "edited"
    edited = tmp_path / "kbp.json"
    edited.write_text(json.dumps(src))
    assert sync.render(edited) != DASHBOARD.read_text()


def test_the_dashboard_is_provisionable() -> None:
    """Provisioning fills in no __inputs: DS_PROMETHEUS must be a variable of the dashboard,
    defined before the variables whose queries use it, and every panel's data source it."""
    dash = json.loads(DASHBOARD.read_text())
    assert "__inputs" not in dash and dash["uid"] and dash["title"]
    variables = [v["name"] for v in dash["templating"]["list"]]
    assert variables[0] == "DS_PROMETHEUS"
    assert dash["templating"]["list"][0]["type"] == "datasource"
    assert dash["templating"]["list"][0]["query"] == "prometheus"
    refs = re.findall(r'"uid": "\$\{(\w+)\}"', DASHBOARD.read_text())
    assert refs and set(refs) == {"DS_PROMETHEUS"}
    gen = {g["name"]: g for g in KUSTOMIZATION["configMapGenerator"]}
    cm = gen["kbp-grafana-dashboard"]
    assert cm["files"] == ["monitoring/kbp.json"]
    assert cm["options"]["labels"]["grafana_dashboard"] == "1"
    assert cm["options"]["disableNameSuffixHash"] is True   # one ConfigMap, updated in place
