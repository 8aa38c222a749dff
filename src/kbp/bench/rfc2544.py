"""RFC 2544 (Sect. 26.1) throughput: the highest offered rate at which no frame is lost.

The search is a binary search over the offered rate, as RFC 2544 and the KBP paper (Sect. 5.2)
describe: each *trial* offers a constant rate for a fixed time and counts the frames that come
back.  A trial passes when the loss is at most ``loss_tolerance`` (0 by default: zero loss).

A trial whose sender could not offer the rate (it sent noticeably less than asked) proves
nothing about zero loss at that rate: it counts as a failure, and the result is marked
``sender``-bound when the lowest failing rate failed that way.  On veth in stock NAPI mode the
*receiver's* NAPI poll runs inside the sender's send calls (veth polls on the transmitting
CPU), so there a sender-bound result is the receive path's cost showing up as back-pressure,
not only the tester's own limit; docs/results.md discusses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Trial:
    """One trial: what was offered and what came back."""

    rate: float               # offered rate (frames/s) asked of the tester
    sent: int
    received: int
    achieved_rate: float      # what the tester actually sent (frames/s)
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return max(self.sent - self.received, 0)

    @property
    def loss_ratio(self) -> float:
        return self.lost / self.sent if self.sent else 1.0


@dataclass
class SearchResult:
    throughput: float          # highest rate offered in a passing trial (frames/s); 0 if none
    bound: str                 # "device": the lowest failing rate lost frames;
                               # "sender": it could not even be offered; "ceiling": hi passed
    trials: list[dict[str, Any]]
    lo: float
    hi: float
    resolution: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _passes(t: Trial, loss_tolerance: float, min_achieved: float) -> tuple[bool, bool]:
    """(passed, sender_limited)."""
    limited = t.achieved_rate < t.rate * min_achieved
    return (not limited and t.sent > 0 and t.loss_ratio <= loss_tolerance), limited


def search(trial: Callable[[float], Trial], hi: float, lo: float = 0.0,
           resolution: float = 0.05, loss_tolerance: float = 0.0, max_trials: int = 24,
           min_achieved: float = 0.97, floor: float | None = None,
           on_trial: Callable[[Trial, bool], None] | None = None) -> SearchResult:
    """Binary search for the highest passing rate in [lo, hi].

    ``hi`` is tried first; if it passes, the result is ``hi`` (bound ``ceiling``).  ``lo`` is
    assumed to pass (0 always does) and is not tried.  The interval is halved until the
    lowest failing rate is within ``resolution`` (relative) of the highest passing one, so the
    result is at most ``resolution`` below the true threshold however far below ``hi`` it is;
    while nothing has passed the search stops at ``floor`` (default ``hi / 1024``).
    """
    if hi <= 0 or hi <= lo:
        raise ValueError(f"bad search interval [{lo}, {hi}]")
    trials: list[dict[str, Any]] = []
    good, bad = lo, hi
    floor = hi / 1024 if floor is None else floor

    def run(rate: float) -> bool:
        t = trial(rate)
        ok, limited = _passes(t, loss_tolerance, min_achieved)
        trials.append({"rate": rate, "sent": t.sent, "received": t.received,
                       "lost": t.lost, "loss_ratio": t.loss_ratio,
                       "achieved_rate": t.achieved_rate, "passed": ok,
                       "sender_limited": limited, "duration_s": t.duration_s, **t.extra})
        if on_trial:
            on_trial(t, ok)
        return ok

    if run(hi):
        return SearchResult(_offered(trials), "ceiling", trials, lo, hi, resolution)
    while len(trials) < max_trials:
        if good <= lo and bad <= max(floor, lo):
            break
        if good > lo and bad - good <= resolution * good:
            break
        mid = (good + bad) / 2.0
        if run(mid):
            good = mid
        else:
            bad = mid
    bound = "sender" if _lowest_fail_sender_limited(trials) else "device"
    return SearchResult(_offered(trials), bound, trials, lo, hi, resolution)


def _offered(trials: list[dict[str, Any]]) -> float:
    """The throughput: the highest rate actually offered (not just asked for) in a passing
    trial; 0.0 if none passed."""
    ok = [min(t["rate"], t["achieved_rate"]) for t in trials if t["passed"]]
    return max(ok, default=0.0)


def _lowest_fail_sender_limited(trials: list[dict[str, Any]]) -> bool:
    fails = [t for t in trials if not t["passed"]]
    return bool(fails) and bool(min(fails, key=lambda t: t["rate"])["sender_limited"])


# -- Ethernet frame sizes --------------------------------------------------------------------
ETH_OVERHEAD = 14 + 4      # Ethernet header + FCS (RFC 2544 frame sizes include the FCS)
IPV4_UDP = 20 + 8


def udp_payload(frame_size: int) -> int:
    """UDP payload of an IPv4 UDP Ethernet frame of ``frame_size`` bytes (FCS included):
    64 -> 18, 512 -> 466, 1518 -> 1472."""
    p = frame_size - ETH_OVERHEAD - IPV4_UDP
    if p < 14:
        raise ValueError(f"frame size {frame_size} leaves {p} B of UDP payload; sockperf's "
                         "header needs 14 (use frames of at least 60 B)")
    return p


def frame_mbps(pps: float, frame_size: int) -> float:
    """Frame bit rate (FCS included, no preamble / inter-frame gap), Mbit/s."""
    return pps * frame_size * 8 / 1e6
