"""The mode spec (issue 10 item 0): one entry per mode, read by validation, backends, help."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kbp import modespec, names
from kbp.backends import EnableRequest, Periodic, validate_common
from kbp.backends import stock as stock_backend
from kbp.errors import InvalidInput

from .conftest import REPO


def test_one_entry_per_mode_with_the_module_ids() -> None:
    assert tuple(modespec.SPECS) == names.MODES
    assert {s.name: s.id for s in modespec.SPECS.values()} == names.MODE_IDS
    assert [s.name for s in modespec.SPECS.values() if s.spins] == [names.MODE_BUSY]
    assert modespec.spins("busy") and not modespec.spins("hybrid")
    assert not modespec.spins(None) and not modespec.spins("turbo")
    assert modespec.takes("periodic", "interval_us") and not modespec.takes("hybrid", "round_ms")
    assert not modespec.takes(None, "linger_us") and not modespec.takes("turbo", "linger_us")
    assert set(modespec.MODE_KNOBS) == {k for s in modespec.SPECS.values() for k in s.knobs}


def test_stock_equivalents() -> None:
    busy, hybrid, per = (modespec.get(m) for m in names.MODES)
    assert (busy.stock.since, busy.stock.threaded, busy.stock.fifo) == ((6, 19, 0), 2, False)
    assert (hybrid.stock.since, hybrid.stock.threaded, hybrid.stock.fifo) == \
        ((5, 12, 0), 1, True)
    assert per.stock.per_napi_since == (6, 13, 0)
    assert "gro_flush_timeout" in per.stock.how and "napi_defer_hard_irqs" in per.stock.how
    assert busy.stock.since == stock_backend.BUSY_POLL_SINCE
    assert [stock_backend.default_rt_prio(m) for m in names.MODES] == [0, 50, 50]


@pytest.mark.parametrize(("req", "text"), [
    (EnableRequest(["eth1"], mode="busy", linger_us=5),
     "--linger-us applies to --mode hybrid only (not busy: busy never sleeps, periodic sleeps "
     "its interval): drop one of them"),
    (EnableRequest(["eth1"], mode="busy", freq_ctl=True),
     "--freq-ctl applies to --mode hybrid only (busy never sleeps, so it never lowers the "
     "frequency): drop one of them"),
    (EnableRequest(["eth1"], mode="periodic", freq_ctl=True),
     "--freq-ctl applies to --mode hybrid only: a periodic poller sleeps for one interval at "
     "a time, too short for a frequency change to pay off, and the frequency would skew the "
     "interval search's measurements: drop one of them"),
    (EnableRequest(["eth1"], mode="hybrid", periodic=Periodic()),
     "the periodic knobs (--interval-us, --round-ms, ...) apply to --mode periodic only, not "
     "hybrid: drop them or use --mode periodic"),
    (EnableRequest(["eth1"], mode="turbo"),
     "unknown mode 'turbo': use --mode busy, hybrid or periodic"),
])
def test_refusals_read_the_spec(req: EnableRequest, text: str) -> None:
    with pytest.raises(InvalidInput) as e:
        validate_common(req)
    assert str(e.value) == text


def test_help_lists_every_mode() -> None:
    from kbp import cli
    text = cli.ENABLE_EPILOG
    for s in modespec.SPECS.values():
        assert f"  {s.name} ({s.paper}" in text
    assert "Linux 6.19+" in text and "Linux 5.12+" in text
    assert cli._mode_help() == "hybrid (default), busy or periodic"


# -- the predicates: the one place that knows mode names (issue 39 item 4) -----------------
@pytest.mark.parametrize("mode", [*names.MODES, None, "", "turbo"])
def test_predicates_answer_as_the_name_comparisons_did(mode: str | None) -> None:
    """Each predicate says what the comparison it replaced said, for every mode, for None (a
    journal or a module that does not say) and for a name that is not a mode."""
    assert modespec.periodic(mode) == (mode == names.MODE_PERIODIC)
    assert modespec.serves_non_rt(mode) == (mode == names.MODE_HYBRID)
    assert modespec.spins(mode) == (mode == names.MODE_BUSY)


def test_default_and_the_mode_lists() -> None:
    assert modespec.DEFAULT is modespec.HYBRID and modespec.DEFAULT.name == names.MODE_HYBRID
    assert [s.name for s in modespec.non_rt_modes()] == [names.MODE_HYBRID]
    assert [s.name for s in modespec.SPECS.values() if s.periodic] == [names.MODE_PERIODIC]
    # the periodic mode is the one that takes every periodic knob
    assert all(modespec.taking(k) == [modespec.PERIODIC] for k in names.PERIODIC_KNOBS)
    from kbp import cli, config
    from kbp.backends import EnableRequest
    assert EnableRequest(["eth1"]).mode == config.DeviceConfig("eth1").mode == \
        cli.build_parser().parse_args(["enable", "eth1"]).mode == modespec.DEFAULT.name


def _mode_name_comparisons(path: Path) -> list[str]:
    """Where a file compares a mode by name: with names.MODE_*, or with a mode's name as a
    string (==, !=, or in a literal tuple, list or set)."""
    def is_mode(node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute) and node.attr.startswith("MODE_") and \
                isinstance(node.value, ast.Name) and node.value.id == "names":
            return True
        return isinstance(node, ast.Constant) and node.value in names.MODES

    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        for left, op, right in zip([node.left, *node.comparators[:-1]], node.ops,
                                   node.comparators, strict=True):
            if isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot):
                hit = is_mode(left) or is_mode(right)
            elif isinstance(op, ast.In | ast.NotIn):
                hit = isinstance(right, ast.Tuple | ast.List | ast.Set) and \
                    any(is_mode(e) for e in right.elts)
            else:
                hit = False
            if hit:
                out.append(f"{path}:{node.lineno}")
    return out


def test_no_other_code_compares_mode_names() -> None:
    """modespec's promise: kbpctl, its backends and the bench ask its predicates."""
    src = REPO / "src/kbp"
    found = [hit for p in sorted(src.rglob("*.py")) if p.name not in ("modespec.py",)
             for hit in _mode_name_comparisons(p)]
    assert found == []


def test_the_scan_finds_a_comparison(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("a = mode == names.MODE_PERIODIC\nb = m != 'hybrid'\nc = m in ('busy', 'x')\n"
                 "d = 'busy' in text\ne = m == names.BACKEND_KMOD\n")
    assert _mode_name_comparisons(f) == [f"{f}:1", f"{f}:2", f"{f}:3"]
