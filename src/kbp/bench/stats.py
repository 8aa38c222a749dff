"""Statistics of the benchmark, with the definitions written down.

* **Percentile** (``percentile``): *nearest rank* -- the p-th percentile of n samples is the
  smallest sample x such that at least p % of the samples are <= x, i.e. the sample of rank
  ``ceil(p/100 * n)`` (1-based) in ascending order; p = 0 gives the minimum.  Every reported
  percentile is therefore a value that was actually observed, and tail percentiles are never
  interpolated below a real sample.
* **Standard deviation** (``sd``): the *sample* standard deviation (divisor n - 1); 0.0 for a
  single sample.
* **Median** of repetitions (``aggregate``): the middle value, or the mean of the two middle
  values for an even count (the usual median, not nearest rank).  Spread: minimum--maximum and
  the nearest-rank quartiles (q1, q3).
* **Ratio to napi** (``ratios_to_baseline``): computed *per repetition* (mode value / napi
  value of the same repetition and condition), then aggregated like any other metric.
* **Tails** (``tail_summary``): each tail statistic (p99, p99.9, max) says which sample it
  is -- the k-th largest of n (k = n - rank + 1; max is k = 1) -- and is flagged ``few``
  when fewer than ``FEW_ABOVE`` (10) samples lie above it.  Its 95 % confidence interval is
  a seeded percentile bootstrap (``BOOT_RESAMPLES`` = 1000 resamples): the nearest-rank
  statistic of a resample of n drawn with replacement is the sample of rank
  ceil(n * U) with U ~ Beta(rank, n - rank + 1) (the rank-th smallest of n uniform draws),
  so each resample costs one Beta draw instead of n draws and a sort -- the same
  distribution as resampling the samples themselves.  Losses count as infinite round
  trips in the ``with_lost`` variant (n + lost samples, the lost ones above every other).
* **Histograms** (``hist_percentile``): kernel-side delays are collected in log-linear buckets
  (see :mod:`kbp.bench.trace`); their percentiles use the same nearest-rank rule over bucket
  counts and return the bucket's mid-point, clamped to the exact observed maximum.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
TAILS: tuple[float, ...] = (99.0, 99.9, 100.0)     # 100: the maximum
FEW_ABOVE = 10              # a tail statistic with fewer samples above it is flagged
BOOT_RESAMPLES = 1000
CI_LEVEL = 0.95


def pct_key(p: float) -> str:
    """The JSON key of a percentile: 50 -> "p50", 99.9 -> "p99.9"."""
    return "p" + (f"{p:g}")


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no samples")
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile {p} outside 0..100")
    return sorted_values[rank_of(n, p) - 1]


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no samples")
    return math.fsum(values) / len(values)


def sd(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1)."""
    n = len(values)
    if n == 0:
        raise ValueError("sd of no samples")
    if n == 1:
        return 0.0
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))


def summarize(values: Iterable[float], percentiles: Sequence[float] = PERCENTILES,
              ) -> dict[str, float | int | None]:
    """n, mean, sd, min, the percentiles and max of samples (all None when there are none)."""
    xs = sorted(values)
    out: dict[str, float | int | None] = {"n": len(xs)}
    if not xs:
        out.update({"mean": None, "sd": None, "min": None, "max": None})
        out.update({pct_key(p): None for p in percentiles})
        return out
    out["mean"] = mean(xs)
    out["sd"] = sd(xs)
    out["min"] = xs[0]
    for p in percentiles:
        out[pct_key(p)] = percentile(xs, p)
    out["max"] = xs[-1]
    return out


def tail_key(p: float) -> str:
    """The JSON key of a tail statistic: 99 -> "p99", 100 -> "max"."""
    return "max" if p >= 100.0 else pct_key(p)


def rank_of(n: int, p: float) -> int:
    """The 1-based ascending rank of the nearest-rank p-th percentile of n samples."""
    # rounded first: 99.9 / 100 * 6000 is 5994.000000000001 in binary floating point, and
    # its ceiling would be one rank too high
    return max(math.ceil(round(p / 100.0 * n, 9)), 1)


def kth_largest(n: int, p: float) -> int:
    """Which largest sample the p-th percentile of n samples is (1: the maximum)."""
    return n - rank_of(n, p) + 1


def boot_ranks(n: int, rank: int, rng: random.Random, resamples: int = BOOT_RESAMPLES,
               ) -> list[int]:
    """Ranks (1-based, into the sorted original samples) of the rank-th smallest value in
    ``resamples`` bootstrap resamples of n samples drawn with replacement: the rank-th
    smallest of n uniform draws on [0, 1) is Beta(rank, n - rank + 1), and a draw u picks
    the original sample of rank ceil(n * u)."""
    out = []
    for _ in range(resamples):
        u = rng.betavariate(rank, n - rank + 1)
        out.append(min(max(math.ceil(n * u), 1), n))
    return out


def _ci(xs: Sequence[float], rank: int, rng: random.Random, resamples: int,
        ) -> list[float]:
    vals = sorted(xs[r - 1] for r in boot_ranks(len(xs), rank, rng, resamples))
    lo = (1.0 - CI_LEVEL) / 2 * 100.0
    return [percentile(vals, max(lo, 0.0)), percentile(vals, 100.0 - lo)]


def tail_summary(values: Iterable[float], lost: int = 0, seed: int = 1,
                 tails: Sequence[float] = TAILS, resamples: int = BOOT_RESAMPLES,
                 ) -> dict[str, Any]:
    """n, lost, and per tail statistic (``p99``, ``p99.9``, ``max``): its value, which
    k-th largest of n it is, how many samples lie above it, ``few`` (< FEW_ABOVE above),
    a seeded bootstrap 95 % CI, and the same statistic with the ``lost`` requests counted
    as infinite round trips (``with_lost``: value "inf" when its rank falls on a loss)."""
    xs = sorted(values)
    n = len(xs)
    rng = random.Random(seed)
    out: dict[str, Any] = {"n": n, "lost": lost, "resamples": resamples,
                           "ci_level": CI_LEVEL, "seed": seed}
    for p in tails:
        key = tail_key(p)
        if not n:
            out[key] = None
            continue
        r = rank_of(n, p)
        k = n - r + 1
        d: dict[str, Any] = {"value": xs[r - 1], "k": k, "n": n, "above": k - 1,
                             "few": k - 1 < FEW_ABOVE, "ci95": _ci(xs, r, rng, resamples)}
        nl = n + lost
        rl = rank_of(nl, p)
        d["with_lost"] = {"value": xs[rl - 1] if rl <= n else "inf", "k": nl - rl + 1,
                          "n": nl, "few": nl - rl < FEW_ABOVE}
        out[key] = d
    return out


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2.0


def aggregate(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """Median and spread of one metric over repetitions (None values are left out)."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "q1": None, "q3": None}
    return {"n": len(xs), "median": median(xs), "min": xs[0], "max": xs[-1],
            "q1": percentile(xs, 25.0), "q3": percentile(xs, 75.0)}


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base, or None when either is missing or the base is 0."""
    if value is None or base is None or base == 0:
        return None
    return value / base


def ratios_to_baseline(per_rep: Mapping[int, float | None],
                       base_per_rep: Mapping[int, float | None]) -> list[float]:
    """Per-repetition ratios of a metric to the baseline's value in the same repetition."""
    out = []
    for rep, v in sorted(per_rep.items()):
        r = ratio(v, base_per_rep.get(rep))
        if r is not None:
            out.append(r)
    return out


# -- bucketed (kernel-side) samples ---------------------------------------------------------
def bucket_width(lower_ns: int) -> int:
    """Width of the log-linear bucket starting at ``lower_ns`` (two significant digits,
    at least 100 ns) -- the same rule the bpftrace program applies."""
    if lower_ns < 10_000:
        return 100
    return 10 ** (len(str(int(lower_ns))) - 2)


def bucket_of(value_ns: int) -> int:
    """Lower edge of the bucket holding ``value_ns`` (mirror of the BPF code; for tests)."""
    v = int(value_ns)
    if v < 10_000:
        return v // 100 * 100
    w = 10 ** (len(str(v)) - 2)
    return v // w * w


def hist_percentile(buckets: Mapping[int, int], p: float, exact_max: float | None = None,
                    ) -> float:
    """Nearest-rank percentile of bucketed samples: the mid-point of the bucket holding the
    sample of rank ceil(p/100 * n), clamped to the exact maximum when it is known."""
    items = sorted((int(k), int(c)) for k, c in buckets.items() if c > 0)
    n = sum(c for _, c in items)
    if n == 0:
        raise ValueError("percentile of an empty histogram")
    rank = max(math.ceil(p / 100.0 * n), 1)
    seen = 0
    for lower, count in items:
        seen += count
        if seen >= rank:
            mid = lower + bucket_width(lower) / 2.0
            return min(mid, exact_max) if exact_max is not None else mid
    raise AssertionError("unreachable")


def hist_summary(buckets: Mapping[int, int], exact_max: float | None = None,
                 total_ns: float | None = None, percentiles: Sequence[float] = PERCENTILES,
                 ) -> dict[str, float | int | None]:
    """n, mean (from the exact sum when given), percentiles and max of a histogram."""
    n = sum(int(c) for c in buckets.values())
    out: dict[str, float | int | None] = {"n": n}
    if n == 0:
        out.update({"mean": None, "max": None})
        out.update({pct_key(p): None for p in percentiles})
        return out
    if total_ns is not None:
        out["mean"] = total_ns / n
    else:
        out["mean"] = sum((int(k) + bucket_width(int(k)) / 2.0) * int(c)
                          for k, c in buckets.items()) / n
    for p in percentiles:
        out[pct_key(p)] = hist_percentile(buckets, p, exact_max)
    out["max"] = exact_max if exact_max is not None else hist_percentile(buckets, 100.0)
    return out
