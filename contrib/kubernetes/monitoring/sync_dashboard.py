#!/usr/bin/env python3
"""Write monitoring/kbp.json, the Grafana dashboard the kustomization puts in a ConfigMap for
Grafana's dashboard sidecar, from contrib/grafana/kbp.json (the one to import by hand):

    python3 contrib/kubernetes/monitoring/sync_dashboard.py

The sidecar provisions dashboards from files, and provisioning does not fill in an import's
``__inputs``: the panels' data source ``${DS_PROMETHEUS}`` would name nothing. So the copy drops
``__inputs`` and defines DS_PROMETHEUS as a dashboard variable of type datasource (Prometheus,
the default one selected), which the same ``${DS_PROMETHEUS}`` then names. Nothing else
changes. tests/k8s fails when the copy is not what this script writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "grafana" / "kbp.json"
TARGET = HERE / "kbp.json"
VARIABLE = "DS_PROMETHEUS"


def provisioned(dash: dict[str, Any]) -> dict[str, Any]:
    """The dashboard as the sidecar needs it (see the module's doc)."""
    out = {k: v for k, v in dash.items() if k != "__inputs"}
    templating = dict(out.get("templating") or {})
    others = [v for v in templating.get("list", []) if v.get("name") != VARIABLE]
    templating["list"] = [{"name": VARIABLE, "label": "Prometheus", "type": "datasource",
                           "query": "prometheus", "current": {}, "hide": 0,
                           "includeAll": False, "multi": False, "options": [],
                           "refresh": 1}, *others]
    out["templating"] = templating
    return out


def render(source: Path = SOURCE) -> str:
    return json.dumps(provisioned(json.loads(source.read_text())), indent=2) + "\n"


def main() -> int:
    TARGET.write_text(render())
    sys.stdout.write(f"wrote {TARGET}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
