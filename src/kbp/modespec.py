"""One entry per kbpctl mode (issue 10 item 0): what a mode is, read by validation, both
backends, kbpctl's help and the bench, so no other code compares mode names: it asks the
small predicates below (:func:`spins`, :func:`periodic`, :func:`serves_non_rt`,
:func:`takes`) or reads :data:`DEFAULT` (tests/kbpctl/test_modespec.py scans src/kbp for
a comparison with a mode's name).

The module has the same table on its side (``kbp_modes[]`` in module/kbp_poller.c: name,
whether it sleeps, why ``freq_ctl`` does not apply); :mod:`kbp.names` keeps the names.

>>> from kbp import modespec
>>> modespec.get("busy").sleeps, modespec.get("periodic").stock.per_napi_since
(False, (6, 13, 0))
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from kbp import names

Version = tuple[int, int, int]

#: knobs that only some modes take (the others apply to every mode: cpus, rt_prio, quota)
MODE_KNOBS: Final = ("linger_us", "freq_ctl", *names.PERIODIC_KNOBS)


@dataclass(frozen=True)
class StockEquivalent:
    """What the stock backend (no module) composes for a mode, and the kernel it needs."""

    how: str                          # one line for help and docs
    since: Version                    # the oldest kernel with the features it uses
    threaded: int | None              # NAPI 'threaded' value it sets (None: left as it is)
    fifo: bool                        # its threads may run SCHED_FIFO (they sleep or yield)
    per_napi_since: Version | None = None  # per-NAPI settings (netdev napi-set) from here on
    built: bool = True                # False: kbpctl's stock backend does not offer it yet


@dataclass(frozen=True)
class ModeSpec:
    """One poller mode of kbpctl (``--mode``) and of the module (``KBP_MODE_*``)."""

    name: str                 # names.MODE_*
    paper: str                # the system it implements
    summary: str              # what the polling thread does, for --help
    sleeps: bool              # it sleeps while it serves NAPIs (False: it spins on its CPU)
    sleep_rule: str           # when it sleeps, in a few words (refusal messages)
    knobs: frozenset[str]     # the knobs of MODE_KNOBS that apply to it
    stock: StockEquivalent
    why_no_freq_ctl: str = ""  # why --freq-ctl does not apply (appended to the refusal)
    #: a poller of class non-rt may run it (names.CLASS_NON_RT: it must sleep when idle and
    #: give way to the CPU's rt poller between polls)
    serves_non_rt: bool = False

    @property
    def id(self) -> int:
        """The module's KBP_MODE_* value (module/uapi/kbp.h)."""
        return names.MODE_IDS[self.name]

    @property
    def spins(self) -> bool:
        return not self.sleeps

    @property
    def periodic(self) -> bool:
        """It polls at an interval (NetAP): the periodic knobs (names.PERIODIC_KNOBS) apply,
        with their defaults when none is given, and status shows its interval and search."""
        return self.knobs >= frozenset(names.PERIODIC_KNOBS)

    def takes(self, knob: str) -> bool:
        return knob in self.knobs


BUSY: Final = ModeSpec(
    name=names.MODE_BUSY, paper="KBP",
    summary="the polling thread never sleeps (the module's poller yields to the CPU's other "
            "tasks)",
    sleeps=False, sleep_rule="busy never sleeps", knobs=frozenset(),
    stock=StockEquivalent(
        how="upstream threaded busy polling (NAPI threaded=2, netdev napi-set threaded "
            "busy-poll), SCHED_NORMAL: its kthread never sleeps and yields only at "
            "cond_resched()",
        since=(6, 19, 0), threaded=2, fifo=False),
    why_no_freq_ctl=" (busy never sleeps, so it never lowers the frequency)")

HYBRID: Final = ModeSpec(
    name=names.MODE_HYBRID, paper="EE-KBP",
    summary="the polling thread sleeps when idle and the hardIRQ wakes it",
    sleeps=True, sleep_rule="hybrid sleeps when idle",
    knobs=frozenset({"linger_us", "freq_ctl"}),
    stock=StockEquivalent(
        how="threaded NAPI (threaded=1) at SCHED_FIFO, pinned with its IRQ; linger through "
            "napi_defer_hard_irqs + gro_flush_timeout",
        since=(5, 12, 0), threaded=1, fifo=True),
    serves_non_rt=True)

PERIODIC: Final = ModeSpec(
    name=names.MODE_PERIODIC, paper="NetAP",
    summary="the polling thread polls every interval with the device's interrupt masked, "
            "the interval fixed (--interval-us) or found by a golden-section search",
    sleeps=True, sleep_rule="periodic sleeps its interval",
    knobs=frozenset(names.PERIODIC_KNOBS),
    stock=StockEquivalent(
        how="threaded NAPI with IRQ deferral (napi_defer_hard_irqs 8 + gro_flush_timeout = "
            "the interval re-arm the NAPI's timer instead of its interrupt); without "
            "--interval-us a search service that kbpctl starts, status shows and disable "
            "stops",
        since=(5, 12, 0), threaded=1, fifo=True, per_napi_since=(6, 13, 0)),
    why_no_freq_ctl=": a periodic poller sleeps for one interval at a time, too short for a "
                    "frequency change to pay off, and the frequency would skew the interval "
                    "search's measurements")

#: every mode, in names.MODES order
SPECS: Final = {s.name: s for s in (BUSY, HYBRID, PERIODIC)}
assert tuple(SPECS) == names.MODES, "a mode of names.MODES has no spec"

#: the mode kbpctl enables when none is asked for (--mode)
DEFAULT: Final = HYBRID


def get(mode: str) -> ModeSpec:
    """The spec of ``mode`` (KeyError: not a mode; validate_common says so first)."""
    return SPECS[mode]


# The predicates on a mode by name, for the rest of kbpctl: each is False for None (a journal
# or a module that does not say) and for a name that is not a mode.
def _find(mode: str | None) -> ModeSpec | None:
    return SPECS.get(mode or "")


def spins(mode: str | None) -> bool:
    """``mode`` never sleeps while it has NAPIs."""
    spec = _find(mode)
    return spec is not None and spec.spins


def periodic(mode: str | None) -> bool:
    """``mode`` polls at an interval (NetAP): :attr:`ModeSpec.periodic`."""
    spec = _find(mode)
    return spec is not None and spec.periodic


def serves_non_rt(mode: str | None) -> bool:
    """A poller of class non-rt may run ``mode``: :attr:`ModeSpec.serves_non_rt`."""
    spec = _find(mode)
    return spec is not None and spec.serves_non_rt


def takes(mode: str | None, knob: str) -> bool:
    """``knob`` applies to ``mode``."""
    spec = _find(mode)
    return spec is not None and spec.takes(knob)


def taking(knob: str) -> list[ModeSpec]:
    """The modes ``knob`` applies to."""
    return [s for s in SPECS.values() if s.takes(knob)]


def non_rt_modes() -> list[ModeSpec]:
    """The modes a poller of class non-rt may run."""
    return [s for s in SPECS.values() if s.serves_non_rt]


def modes_text(modes: Iterable[ModeSpec]) -> str:
    """"busy, hybrid or periodic"."""
    ns = [s.name for s in modes]
    return ns[0] if len(ns) == 1 else f"{', '.join(ns[:-1])} or {ns[-1]}"


def _version(v: Version) -> str:
    return ".".join(map(str, v[:2]))


def help_text(width: int = 90) -> str:
    """The modes paragraph of ``kbpctl enable --help``."""
    lines = ["modes:"]
    for s in SPECS.values():
        default = ", the default" if s is DEFAULT else ""
        per_napi = (f" (per NAPI on {_version(s.stock.per_napi_since)}+)"
                    if s.stock.per_napi_since else "")
        stock = (f"Stock backend: {s.stock.how}; Linux {_version(s.stock.since)}+{per_napi}."
                 if s.stock.built else "The stock backend does not offer it yet.")
        text = f"{s.name} ({s.paper}{default}): {s.summary}. {stock}"
        lines.append(textwrap.fill(text, width=width, initial_indent="  ",
                                   subsequent_indent="    "))
    return "\n".join(lines)
