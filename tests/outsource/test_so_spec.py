"""outsource/guest/kbp_so_proc.yaml drives /proc/kbp_so's keys in the module and in kbpctl
(tools/kbp_so_spec.py): the generated files are up to date, a change to the spec shows in all
three, and what the generator does not render is refused. The guest side (the module writes
exactly these keys, in this order) is asserted in the VM (guest_sockets.py's proc())."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kbp.outsource import _spec, idle, procfile

REPO = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    sys.path.insert(0, str(REPO / "tools"))     # it imports kbp_spec, its neighbour
    try:
        spec = importlib.util.spec_from_file_location("kbp_so_spec_tool",
                                                      REPO / "tools/kbp_so_spec.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod          # dataclasses look their module up
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(REPO / "tools"))


tool = _load_tool()


def test_generated_files_are_up_to_date() -> None:
    assert tool.stale(REPO) == [], "run: python3 tools/kbp_so_spec.py gen"


def test_kbpctl_reads_the_spec_not_a_copy() -> None:
    assert idle.MAX_US == _spec.IDLE_POLL_US_MAX == 2000
    assert procfile.COMPLETION_SOURCES == ("completions_irq", "completions_polled",
                                           "completions_syscall", "completions_idle",
                                           "completions_tick")
    assert procfile.POLICY_COUNTERS == ("refused_netns", "refused_user", "closes_pending")
    assert procfile.MODULE_TEXT == ("idle",)
    assert procfile.SOCK_TEXT == ("family", "local", "remote")
    assert "state" not in procfile.MODULE_COUNTERS and "ino" not in procfile.SOCK_COUNTERS
    assert procfile.DOCS["idle_halts"].startswith("counter: ")


def _copy(tmp_path: Path) -> Path:
    for rel in (tool.SPEC, tool.HEADER, tool.SOURCE, tool.PY):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    return tmp_path / tool.SPEC


def test_a_new_key_reaches_the_module_and_kbpctl(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    spec = _copy(tmp_path)
    assert tool.main(["check", "--root", str(tmp_path)]) == 0
    spec.write_text(spec.read_text().replace(
        "sock-line:\n", "  - name: new-thing\n    type: u64\n    doc: \"counter: new\"\n\n"
        "sock-line:\n"))
    assert tool.main(["check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for rel in (tool.HEADER, tool.SOURCE, tool.PY):
        assert f"{rel} is stale" in err
    assert tool.main(["gen", "--root", str(tmp_path)]) == 0
    assert "\tKBP_SO_K_NEW_THING,\n\tKBP_SO_NR_KEYS" in (tmp_path / tool.HEADER).read_text()
    assert '[KBP_SO_K_NEW_THING] = { "new_thing", false },' in \
        (tmp_path / tool.SOURCE).read_text()
    assert "Key('new_thing', 'u64', ''," in (tmp_path / tool.PY).read_text()


@pytest.mark.parametrize(("old", "new", "why"), [
    ("    type: u32\n    doc: queues in use", "    type: float\n    doc: queues in use",
     "type 'float'"),
    ("    group: policy\n    doc: closes", "    group: other\n    doc: closes", "group 'other'"),
    ("  - name: errors\n    type: s64\n", "  - name: errors\n    type: text\n",
     "counters only"),
    ("    doc: queues in use\n", "", "has no doc"),
])
def test_what_the_generator_does_not_render_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str,
        why: str) -> None:
    spec = _copy(tmp_path)
    assert old in spec.read_text()
    spec.write_text(spec.read_text().replace(old, new, 1))
    assert tool.main(["check", "--root", str(tmp_path)]) == 2
    assert why in capsys.readouterr().err
