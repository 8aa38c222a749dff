"""The rig's experiment drivers (vm/experiments) are drivers: they import what they use as
modules (no sys.path edits) and take their statistics from the benchmark's (kbp.bench.stats),
so a seed, a median or a ratio means the same in an experiment as in ``kbpctl bench``."""

from __future__ import annotations

import ast
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
#: modules whose use would be statistics of an experiment's own
OWN_STATS = {"random", "statistics"}


def _problems(path: Path) -> list[str]:
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import | ast.ImportFrom):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
            out += [f"{path.name}:{n.lineno}: imports {m}" for m in names
                    if m.split(".")[0] in OWN_STATS]
        if isinstance(n, ast.Attribute) and n.attr == "path" and \
                isinstance(n.value, ast.Name) and n.value.id == "sys":
            out.append(f"{path.name}:{n.lineno}: sys.path")
        if isinstance(n, ast.FunctionDef) and n.name in ("median", "pct", "percentile", "_med"):
            out.append(f"{path.name}:{n.lineno}: defines {n.name}()")
    return out


def test_experiments_have_no_statistics_or_path_edits_of_their_own() -> None:
    files = sorted(EXPERIMENTS.glob("*.py"))
    assert files
    assert [p for f in files for p in _problems(f)] == []


def test_experiments_import_as_modules() -> None:
    import importlib
    for f in sorted(EXPERIMENTS.glob("*.py")):
        importlib.import_module(f"vm.experiments.{f.stem}")
