"""The mode spec (issue 10 item 0): one entry per mode, read by validation, backends, help."""

from __future__ import annotations

import pytest

from kbp import modespec, names
from kbp.backends import EnableRequest, Periodic, validate_common
from kbp.backends import stock as stock_backend
from kbp.errors import InvalidInput


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
