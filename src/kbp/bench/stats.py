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
* **Histograms** (``hist_percentile``): kernel-side delays are collected in log-linear buckets
  (see :mod:`kbp.bench.trace`); their percentiles use the same nearest-rank rule over bucket
  counts and return the bucket's mid-point, clamped to the exact observed maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)


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
    rank = math.ceil(p / 100.0 * n)
    return sorted_values[max(rank, 1) - 1]


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
