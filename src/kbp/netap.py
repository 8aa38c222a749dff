"""The NetAP interval search in Python: a line-for-line port of module/kbp_netap.c.

The stock backend's periodic service (:mod:`kbp.periodicd`) runs this search from user space;
the module runs the C original in its pollers. Both must pick the same intervals from the
same objective values, so this port keeps the C file's algorithm, constants, integer
arithmetic (u32/u64 wrap-around included), state names and restart rules, and
``tests/kbpctl/test_netap_port.py`` compiles the C file into a driver and checks that both
agree round by round. What the search does and why: docs/netap.md and the comments of
kbp_netap.c; only what is Python-specific is said here.

Usage::

    s = Search(Params(min_interval_us=100, max_interval_us=4000))  # round 0 has run
    s.interval_us                     # the interval of the first round
    s.round_end(bytes_of_the_round)   # -> the interval of the next round
"""

from __future__ import annotations

import errno
from dataclasses import asdict, dataclass
from typing import Any

from kbp import _spec

# The paper's constants (kbp_netap.h); MinInterval and MaxInterval, the search range by
# default, are the family spec's (module/netlink/kbp.yaml, module/kbp_spec.h).
MIN_INTERVAL_US = _spec.KBP_NETAP_MIN_INTERVAL_US   # MinInterval
MAX_INTERVAL_US = _spec.KBP_NETAP_MAX_INTERVAL_US   # MaxInterval
MIN_DISTANCE_US = 30         # MinDistance
R_NUM, R_DEN = 618, 1000     # R, kept in Q32 below
NR_DIST = 24                 # R^1 .. R^24

# The restart knobs' defaults and what check_params() accepts: the spec's, as kbp_netap.c's.
MIN_CHANGE_PCT_DEF = _spec.KBP_NETAP_MIN_CHANGE_PCT_DEF
MAX_ROUND_DEF = _spec.KBP_NETAP_MAX_ROUND_DEF

INTERVAL_US_LO, INTERVAL_US_HI = _spec.KBP_NETAP_INTERVAL_US_LO, _spec.KBP_NETAP_INTERVAL_US_HI
MIN_CHANGE_PCT_LO, MIN_CHANGE_PCT_HI = (_spec.KBP_NETAP_MIN_CHANGE_PCT_LO,
                                        _spec.KBP_NETAP_MIN_CHANGE_PCT_HI)
MAX_ROUND_LO, MAX_ROUND_HI = _spec.KBP_NETAP_MAX_ROUND_LO, _spec.KBP_NETAP_MAX_ROUND_HI

# round(R^k * 2^32) for R = 618/1000, k = 1..NR_DIST (kbp_netap_rq32, copied, not recomputed:
# the test checks the table against the C file's)
RQ32: tuple[int, ...] = (
    2654289789, 1640351090, 1013736973, 626489450, 387170480,
    239271357, 147869698, 91383474, 56474987, 34901542,
    21569153, 13329736, 8237777, 5090946, 3146205,
    1944355, 1201611, 742596, 458924, 283615,
    175274, 108319, 66941, 41370,
)

# enum kbp_netap_probe
PROBE_LOW, PROBE_HIGH = 0, 1
# enum kbp_netap_start
START_INIT, START_CHANGE, START_MAX_ROUND, START_CALLER = 0, 1, 2, 3
PROBE_NAMES = ("low", "high")
START_NAMES = ("init", "change", "max_round", "caller")

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Params:
    """struct kbp_netap_params."""

    min_interval_us: int = MIN_INTERVAL_US
    max_interval_us: int = MAX_INTERVAL_US
    min_change_pct: int = MIN_CHANGE_PCT_DEF
    max_round: int = MAX_ROUND_DEF


def check_params(p: Params) -> tuple[int, str | None]:
    """kbp_netap_check_params(): (0, None), or (-ERANGE / -EINVAL, the same message)."""
    msg: str | None = None
    err = -errno.ERANGE
    if not INTERVAL_US_LO <= p.min_interval_us <= INTERVAL_US_HI:
        msg = f"min_interval_us out of range ({INTERVAL_US_LO}-{INTERVAL_US_HI})"
    elif not INTERVAL_US_LO <= p.max_interval_us <= INTERVAL_US_HI:
        msg = f"max_interval_us out of range ({INTERVAL_US_LO}-{INTERVAL_US_HI})"
    elif p.min_interval_us > p.max_interval_us:
        msg = "min_interval_us above max_interval_us: empty range"
        err = -errno.EINVAL
    elif not MIN_CHANGE_PCT_LO <= p.min_change_pct <= MIN_CHANGE_PCT_HI:
        msg = f"min_change out of range ({MIN_CHANGE_PCT_LO}-{MIN_CHANGE_PCT_HI} percent)"
    elif not MAX_ROUND_LO <= p.max_round <= MAX_ROUND_HI:
        msg = f"max_round out of range ({MAX_ROUND_LO}-{MAX_ROUND_HI})"
    return (err if msg else 0), msg


def distance(p: Params, k: int) -> int:
    """kbp_netap_distance(): round((max - min) * R^k) in Q32; 0 past the table."""
    width = (p.max_interval_us - p.min_interval_us) & U32  # u32 arithmetic, then u64
    if k < 1 or k > NR_DIST:
        return 0
    return (((width * RQ32[k - 1] + (1 << 31)) & U64) >> 32) & U32


def _clamp(v: int, lo: int, hi: int) -> int:
    return lo if v < lo else hi if v > hi else v


def changed(prev: int, cur: int, pct: int) -> bool:
    """kbp_netap_changed(): |cur - prev| * 100 > prev * pct, halving both below 2^53."""
    delta = cur - prev if cur > prev else prev - cur
    while prev >= (1 << 53) or delta >= (1 << 53):
        prev >>= 1
        delta >>= 1
    return delta * 100 > prev * pct


class Search:
    """struct kbp_netap and its functions. ``Search(p)`` is kbp_netap_init() (ValueError,
    with the C message, where that refuses); :meth:`round_end` is kbp_netap_round()."""

    def __init__(self, p: Params) -> None:
        err, why = check_params(p)
        if err:
            raise ValueError(why)
        self.p = p
        self.round = 0
        self.interval_us = 0
        self.low_us = 0
        self.high_us = 0
        self.range_lo_us = 0
        self.range_hi_us = 0
        self.distance_us = 0
        self.dist_idx = 0
        self.restarts = 0
        self.perf_low = 0
        self.perf_high = 0
        self.best_bytes = 0
        self.prev_bytes = 0
        self.selected = PROBE_LOW
        self.converged = 0
        self.started_by = START_INIT
        self._start(START_INIT)

    # -- kbp_netap_start() -------------------------------------------------------------
    def _start(self, why: int) -> None:
        p = self.p
        self.dist_idx = 1
        self.distance_us = distance(p, 1)
        self.low_us = (p.min_interval_us + self.distance_us) & U32
        self.high_us = (p.max_interval_us - self.distance_us) & U32
        self.range_lo_us = p.min_interval_us
        self.range_hi_us = p.max_interval_us
        self.perf_low = 0
        self.perf_high = 0
        self.best_bytes = 0
        self.prev_bytes = 0
        self.selected = PROBE_LOW
        self.converged = 0
        if why != START_INIT:
            self.restarts = (self.restarts + 1) & U32
        self.started_by = why
        self.interval_us = self.low_us
        self.round = 1

    def _converge(self) -> None:
        if self.perf_low > self.perf_high:
            self.interval_us = self.low_us
            self.best_bytes = self.perf_low
        else:
            self.interval_us = self.high_us
            self.best_bytes = self.perf_high
        self.prev_bytes = self.best_bytes
        self.converged = 1

    def _search(self, value: int) -> None:
        if self.round == 1:
            self.perf_low = value
            self.selected = PROBE_HIGH
            self.interval_us = self.high_us
            return
        if self.selected == PROBE_LOW:
            self.perf_low = value
        else:
            self.perf_high = value
        nxt = distance(self.p, self.dist_idx + 1)
        if nxt <= MIN_DISTANCE_US:
            self._converge()
            return
        self.dist_idx += 1
        self.distance_us = nxt
        if self.perf_low > self.perf_high:
            self.range_lo_us = self.high_us
            temp = self.high_us
            self.high_us = self.low_us
            self.low_us = (temp + self.distance_us) & U32
            self.perf_high = self.perf_low
            self.selected = PROBE_LOW
        else:
            self.range_hi_us = self.low_us
            temp = self.low_us
            self.low_us = self.high_us
            self.high_us = (temp - self.distance_us) & U32
            self.perf_low = self.perf_high
            self.selected = PROBE_HIGH
        self.low_us = _clamp(self.low_us, self.range_lo_us, self.range_hi_us)
        self.high_us = _clamp(self.high_us, self.range_lo_us, self.range_hi_us)
        self.interval_us = self.low_us if self.selected == PROBE_LOW else self.high_us

    # -- the API -----------------------------------------------------------------------
    def restart(self) -> None:
        """kbp_netap_restart()."""
        self._start(START_CALLER)

    def round_end(self, value: int) -> int:
        """kbp_netap_round(): ``value`` (a u64: bytes, or any objective where more is
        better) was measured in the round that ran at ``interval_us``; returns the next
        round's interval."""
        if not 0 <= value <= U64:
            raise ValueError(f"objective {value} is not a u64")
        if self.converged and changed(self.prev_bytes, value, self.p.min_change_pct):
            self._start(START_CHANGE)
            return self.interval_us
        if self.converged:
            self.prev_bytes = value
        else:
            self._search(value)
        self.round = (self.round + 1) & U32
        if self.round >= self.p.max_round:
            self._start(START_MAX_ROUND)
        return self.interval_us

    def state(self) -> dict[str, Any]:
        """Every field of struct kbp_netap by its C name (params as ``p``)."""
        return {"p": asdict(self.p), "round": self.round, "interval_us": self.interval_us,
                "low_us": self.low_us, "high_us": self.high_us,
                "range_lo_us": self.range_lo_us, "range_hi_us": self.range_hi_us,
                "distance_us": self.distance_us, "dist_idx": self.dist_idx,
                "restarts": self.restarts, "perf_low": self.perf_low,
                "perf_high": self.perf_high, "best_bytes": self.best_bytes,
                "prev_bytes": self.prev_bytes, "selected": self.selected,
                "converged": self.converged, "started_by": self.started_by}


def rounds_to_converge(p: Params) -> int:
    """The rounds a fresh search over ``p``'s range takes to converge: its golden-section
    steps, until the distance falls below MinDistance. The steps depend on the range alone,
    not on the values measured (ValueError if it did not converge within ``p.max_round``)."""
    s = Search(p)
    for rounds in range(1, p.max_round + 1):
        s.round_end(0)
        if s.converged:
            return rounds
    raise ValueError(f"no convergence within max_round {p.max_round}: {s.state()}")
