"""Offline validation of contrib/kubernetes: Kubernetes' own kinds against the OpenAPI schemas
kubernetes-validate ships (strict: an unknown field is an error, as ``kubectl apply``'s
default server-side field validation makes it), custom resources against the CRDs of the
operators' Go modules pinned in tests/k8s/crds/go.mod (fetched into .cache/go by
scripts/setup.sh; read here with GOPROXY=off, their hashes checked against go.sum).

A CRD's ``openAPIV3Schema`` is a Kubernetes *structural schema*; :func:`to_jsonschema` turns it
into JSON Schema (draft 2020-12) the way the API server reads it: objects with ``properties``
take no other field unless ``x-kubernetes-preserve-unknown-fields``, ``int-or-string`` is
either, ``nullable`` admits null, ``int32``/``int64`` are range-checked. CEL rules
(``x-kubernetes-validations``) are not evaluated (the pinned CRDs of these kinds have none).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "contrib/kubernetes"
GOMOD = Path(__file__).resolve().parent / "crds"
GOCACHE_ROOT = REPO / ".cache/go"
#: Kubernetes' own kinds are checked against these versions' schemas: the oldest still in
#: the distributions' support when written, and the newest kubernetes-validate has
K8S_VERSIONS = ("1.28", "1.37")

#: module -> its CRD files (paths inside the module)
CRD_FILES: Mapping[str, tuple[str, ...]] = {
    "github.com/kubernetes-sigs/kernel-module-management": (
        "config/crd/bases/kmm.sigs.x-k8s.io_modules.yaml",
    ),
    "github.com/prometheus-operator/prometheus-operator": (
        "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
    ),
    "github.com/openshift/cluster-node-tuning-operator": (
        "manifests/20-tuned.crd.yaml",
    ),
}

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
OBJECT_META = ("https://kubernetes.io/api/_definitions.json#/$defs/"
               "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")


def unavailable(reason: str) -> None:
    """A tool or data set the checks need is missing: skip, saying what installs it -- or
    fail under CI (CI=true), where scripts/setup.sh has run and a skip would hide that the
    manifests went unchecked."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI: scripts/setup.sh should have installed it)")
    pytest.skip(reason)


def venv_tool(name: str) -> str | None:
    """A command of the venv this Python runs in (hadolint, kubectl from PyPI), or PATH's."""
    import sys
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


# -- YAML ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Doc:
    path: Path
    index: int
    obj: dict[str, Any]

    @property
    def id(self) -> str:
        rel = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{rel}#{self.index}:{self.obj.get('kind')}/{self.name}"

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name", "?"))


def load_docs(path: Path, text: str | None = None) -> list[Doc]:
    import yaml
    src = path.read_text() if text is None else text
    return [Doc(path, i, d) for i, d in enumerate(yaml.safe_load_all(src)) if d is not None]


def manifest_files() -> list[Path]:
    """Every Kubernetes object file of contrib/kubernetes (kustomization.yaml is kustomize's
    own: rendered and validated whole)."""
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


# -- the CRDs from the Go modules ------------------------------------------------------------
def go_binary() -> str | None:
    for c in (shutil.which("go"), "/usr/local/go/bin/go", "/usr/lib/go/bin/go"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def go_env() -> dict[str, str]:
    """The module cache scripts/setup.sh fills, offline; go.sum's hashes are checked."""
    return {**os.environ, "GOPATH": str(GOCACHE_ROOT), "GOMODCACHE": str(GOCACHE_ROOT / "mod"),
            "GOFLAGS": "-mod=readonly -modcacherw", "GOPROXY": "off", "GOTOOLCHAIN": "local",
            "GOWORK": "off"}


def _json_stream(text: str) -> Iterator[dict[str, Any]]:
    dec = json.JSONDecoder()
    i = 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        obj, i = dec.raw_decode(text, i)
        yield obj


@cache
def module_dirs() -> dict[str, Path]:
    """module path -> its directory in the module cache (skips, or fails under CI, when go
    or the cached modules are missing)."""
    go = go_binary()
    if go is None:
        unavailable("go is not installed (scripts/setup.sh installs Debian's golang-go): "
                    "the custom resources cannot be checked against their CRDs")
    assert go is not None
    p = subprocess.run([go, "mod", "download", "-json", *CRD_FILES], cwd=GOMOD, env=go_env(),
                       capture_output=True, text=True, timeout=120)
    out: dict[str, Path] = {}
    errors = []
    for m in _json_stream(p.stdout):
        if m.get("Error") or not m.get("Dir"):
            errors.append(f"{m.get('Path')}: {m.get('Error')}")
        else:
            out[m["Path"]] = Path(m["Dir"])
    if p.returncode != 0 or errors or set(out) != set(CRD_FILES):
        unavailable("the operators' CRDs are not in .cache/go (run scripts/setup.sh, which "
                    f"fetches tests/k8s/crds/go.mod's modules): {'; '.join(errors) or p.stderr}")
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, with the CRD's scope."""
    import yaml
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for mod, files in CRD_FILES.items():
        for f in files:
            for crd in yaml.safe_load_all((module_dirs()[mod] / f).read_text()):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                spec = crd["spec"]
                for v in spec["versions"]:
                    if v.get("served", True):
                        schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
                        schema["x-kbp-scope"] = spec.get("scope", "Namespaced")
                        out[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = schema
    return out


def to_jsonschema(node: Any) -> Any:
    """A structural-schema node as JSON Schema (the module's doc says how)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "properties":
            out[k] = {pk: to_jsonschema(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            out[k] = to_jsonschema(v)
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [to_jsonschema(x) for x in v]
        elif k.startswith("x-kubernetes-") or k == "description":
            continue
        else:
            out[k] = v
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if (out.get("type") == "object" and "properties" in out
            and not node.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in out):
        out["additionalProperties"] = False
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


def _format_checker() -> Any:
    from jsonschema import FormatChecker
    fc = FormatChecker()
    for fmt, bits in (("int32", 32), ("int64", 64)):
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

        def check(v: object, lo: int = lo, hi: int = hi) -> bool:
            return not isinstance(v, int) or isinstance(v, bool) or lo <= v <= hi
        fc.checks(fmt)(check)
    return fc


def _definitions(version: str) -> Any:
    """kubernetes-validate's _definitions.json of ``version`` (strict), as a resource."""
    from importlib import resources

    from referencing import Resource
    d = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    text = (d / f"v{version}.0-local-strict" / "_definitions.json").read_text()
    return Resource.from_contents(json.loads(text))


def validate_cr(obj: dict[str, Any], version: str = K8S_VERSIONS[-1]) -> list[str]:
    """Errors of a custom resource against its CRD (empty: valid)."""
    from jsonschema import Draft202012Validator
    from referencing import Registry
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    schemas = crd_schemas()
    if key not in schemas:
        return [f"no CRD for {key[0]} {key[1]} in tests/k8s/crds/go.mod's modules"]
    raw = schemas[key]
    schema = to_jsonschema({k: v for k, v in raw.items() if k != "x-kbp-scope"})
    schema.setdefault("properties", {})["metadata"] = {"$ref": OBJECT_META}
    schema.setdefault("required", [])
    registry = _definitions(version) @ Registry()
    v = Draft202012Validator(schema, registry=registry, format_checker=_format_checker())
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in sorted(v.iter_errors(obj), key=lambda e: list(map(str, e.path)))]
    meta = obj.get("metadata") or {}
    if not DNS_SUBDOMAIN.match(str(meta.get("name", ""))):
        errors.append(f"metadata.name: {meta.get('name')!r} is not a DNS subdomain name")
    if raw["x-kbp-scope"] == "Namespaced" and not meta.get("namespace"):
        errors.append("metadata.namespace: a namespaced kind without its namespace")
    return errors


def validate_core(obj: dict[str, Any], version: str) -> list[str] | None:
    """Errors of one of Kubernetes' own kinds (strict); None: not a kind Kubernetes has."""
    try:
        import kubernetes_validate as kv
    except ImportError:
        unavailable("kubernetes-validate is not installed (pip install -e '.[dev]', which "
                    "scripts/setup.sh runs)")
        raise
    try:
        kv.validate(obj, version, strict=True)
    except kv.SchemaNotFoundError:
        return None
    except kv.ValidationError as e:
        return [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message} (Kubernetes {version})"]
    return []


def validate(obj: dict[str, Any]) -> list[str]:
    """Errors of any object of contrib/kubernetes; a kind neither Kubernetes nor a pinned CRD
    knows is an error too, never a silent pass."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    if "." in group and not group.endswith(".k8s.io"):   # an operator's group: its CRD
        return validate_cr(obj)
    errors: list[str] = []
    for v in K8S_VERSIONS:
        got = validate_core(obj, v)
        if got is None:
            return [f"no schema for {obj.get('apiVersion')} {obj.get('kind')}: neither "
                    f"Kubernetes {v} nor the pinned CRDs have it"]
        errors += got
    return errors
