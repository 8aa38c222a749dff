"""kbpctl starts on what it uses (issue 25, item 6): every kbpctl call in the TCG test VMs
paid seconds for the bench's modules and pyroute2's import-everything package __init__."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _modules_after(code: str) -> set[str]:
    p = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json\n"
                        "print(json.dumps(sorted(sys.modules)))"],
                       capture_output=True, text=True, check=True, timeout=60,
                       env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    return set(json.loads(p.stdout.splitlines()[-1]))


def test_core_commands_import_neither_the_bench_nor_all_of_pyroute2() -> None:
    mods = _modules_after("import kbp.cli; kbp.cli.build_parser(['status', '--json'])")
    assert not {m for m in mods if m.startswith("kbp.bench")}
    assert not {m for m in mods if m.startswith(("pyroute2.ndb", "pyroute2.ipdb",
                                                 "pyroute2.conntrack", "matplotlib"))}
    assert "pyroute2.netlink.generic" in mods and "importlib.metadata" not in mods


def test_bench_and_help_still_have_the_plugin() -> None:
    from kbp import cli
    for argv in (["bench", "--help"], ["--help"], []):
        sub = cli.build_parser(argv)._subparsers._group_actions[0]  # type: ignore[union-attr]
        assert "bench" in sub.choices, argv
    assert "bench" not in cli.build_parser(["status"])._subparsers._group_actions[0].choices


def test_version_and_the_full_pyroute2_on_demand() -> None:
    p = subprocess.run([sys.executable, "-m", "kbp.cli", "--version"], capture_output=True,
                       text=True, timeout=60, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and p.stdout.startswith("kbpctl "), (p.stdout, p.stderr)
    mods = _modules_after("import kbp.netdev\nfrom pyroute2 import IPRoute, NDB, netns\n"
                          "import pyroute2; assert pyroute2.__version__ and pyroute2.IPRoute")
    assert "pyroute2.ndb" in mods          # whoever asks for the whole library gets it
