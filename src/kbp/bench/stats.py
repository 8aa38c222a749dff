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
* **Ratio to napi** (``mode_summaries``): computed *per repetition* (mode value / napi
  value of the same repetition and condition; in the rig's multi-guest runs, of the same
  guest too), then aggregated like any other metric -- never a ratio of medians.
* **Tails** (``tail_summary``): each tail statistic (p99, p99.9, max) says which sample it
  is -- the k-th largest of n (k = n - rank + 1; max is k = 1) -- and is flagged ``few``
  when fewer than ``FEW_ABOVE`` (10) samples lie above it.  Tail samples cluster in time (a
  slow round trip is followed by another far more often than 1 in 1000), so samples are not
  independent and an i.i.d. bootstrap gives intervals that are too narrow.  The 95 %
  confidence interval is therefore a seeded *moving-block bootstrap within each repetition*
  (``BOOT_RESAMPLES`` = 1000 resamples): each repetition's samples, in the order they were
  taken, are rebuilt from blocks of ``block_length(n_rep)`` = ceil(sqrt(n_rep))
  consecutive samples (at least ``BLOCK_MIN``) whose starts are drawn with replacement, the
  repetitions are pooled again, and the nearest-rank statistic is taken.  Only the samples
  that can reach the tail are looked at per resample (the top ``4k + 50`` of the data, by
  position; a resample with fewer of them falls back to the whole resample), so it costs
  one lookup per block.  Each statistic also says where its tail comes from: ``by_rep``
  (samples at or above it per repetition), ``episodes`` (separate bursts: samples at or
  above it closer than ``EPISODE_GAP`` samples in one repetition are one episode),
  ``largest_episode`` and ``next_above`` (how often the next sample is at or above it too;
  about 1 - p/100 for independent samples); ``few_episodes`` flags a tail made of fewer
  than ``FEW_EPISODES`` (5) bursts: no resampling can say how often such bursts come, so
  its CI is a lower bound on the uncertainty.  On a synthetic model with bursts (3
  repetitions of 2,000 samples, bursts of 5-30 slow samples starting with probability
  0.0006 per sample), the 95 % interval covered the true p99 in 82 % of 60 data sets (the
  i.i.d. bootstrap: 33 %) and the true p99.9 in 70 % (i.i.d.: 63 %).  Losses count as
  infinite round trips in the ``with_lost`` variant (n + lost samples, the lost ones above
  every other).
* **Histograms** (``hist_percentile``): kernel-side delays are collected in log-linear buckets
  (see :mod:`kbp.bench.trace`); their percentiles use the same nearest-rank rule over bucket
  counts and return the bucket's mid-point, clamped to the exact observed maximum.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

from kbp.bench.schema import Aggregate, ModeSummary, Stats, TailSummary

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
TAILS: tuple[float, ...] = (99.0, 99.9, 100.0)     # 100: the maximum
FEW_ABOVE = 10              # a tail statistic with fewer samples above it is flagged
BOOT_RESAMPLES = 1000
CI_LEVEL = 0.95
BLOCK_MIN = 10              # samples per bootstrap block, at least
EPISODE_GAP = 10            # samples: tail samples closer than this are one episode
FEW_EPISODES = 5            # a tail made of fewer separate bursts is flagged

K = TypeVar("K")


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
              ) -> Stats:
    """n, mean, sd, min, the percentiles and max of samples (all None when there are none)."""
    xs = sorted(values)
    out: dict[str, float | int | None] = {"n": len(xs)}
    # Stats' keys (other ``percentiles`` than the default add theirs, pct_key's)
    if not xs:
        out.update({"mean": None, "sd": None, "min": None, "max": None})
        out.update({pct_key(p): None for p in percentiles})
        return cast(Stats, out)
    out["mean"] = mean(xs)
    out["sd"] = sd(xs)
    out["min"] = xs[0]
    for p in percentiles:
        out[pct_key(p)] = percentile(xs, p)
    out["max"] = xs[-1]
    return cast(Stats, out)


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


def block_length(n: int) -> int:
    """Samples per moving block for a repetition of n samples: ceil(sqrt(n)), at least
    BLOCK_MIN, at most n."""
    return max(1, min(n, max(BLOCK_MIN, math.isqrt(max(n - 1, 0)) + 1)))


def _split(values: Sequence[float], sizes: Sequence[int] | None) -> list[list[float]]:
    """``values`` cut into its repetitions (``sizes``: their lengths, in order)."""
    if not sizes or sum(sizes) != len(values):
        return [list(values)] if values else []
    out, at = [], 0
    for n in sizes:
        if n:
            out.append(list(values[at:at + n]))
        at += n
    return out


class BlockBootstrap:
    """Moving-block bootstrap of the k-th largest of samples pooled over repetitions (see the
    module docstring), for several k at once."""

    def __init__(self, reps: Sequence[Sequence[float]], kmax: int,
                 block: int | None = None) -> None:
        """``block``: samples per block instead of :func:`block_length` (1: the i.i.d.
        bootstrap, for comparison)."""
        self.reps = [list(r) for r in reps if r]
        self.n = sum(len(r) for r in self.reps)
        # the samples that can reach the top kmax of a resample: the top m of the data
        m = min(self.n, 4 * kmax + 50)
        flat = sorted(((v, i, j) for i, r in enumerate(self.reps) for j, v in enumerate(r)),
                      reverse=True)[:m]
        self.floor = flat[-1][0] if flat else 0.0
        pos: list[list[int]] = [[] for _ in self.reps]
        for _, i, j in flat:
            pos[i].append(j)
        self.cand_pos = [sorted(p) for p in pos]
        self.cand_val = [[self.reps[i][j] for j in self.cand_pos[i]]
                         for i in range(len(self.reps))]
        self.blocks = [min(block, len(r)) if block else block_length(len(r))
                       for r in self.reps]

    def _resample(self, rng: random.Random, full: bool) -> list[float]:
        """One resample: its candidate values (or, with ``full``, all its values)."""
        out: list[float] = []
        for i, r in enumerate(self.reps):
            n, b = len(r), self.blocks[i]
            cp, cv = self.cand_pos[i], self.cand_val[i]
            left = n
            while left > 0:
                take = min(b, left)
                s = rng.randint(0, n - b)
                if full:
                    out.extend(r[s:s + take])
                else:
                    lo = bisect.bisect_left(cp, s)
                    hi = bisect.bisect_left(cp, s + take)
                    out.extend(cv[lo:hi])
                left -= take
        return out

    def kth_largest(self, ks: Sequence[int], rng: random.Random,
                    resamples: int = BOOT_RESAMPLES, exact: bool = False,
                    ) -> dict[int, list[float]]:
        """{k: the k-th largest value of each resample} (``exact``: every resample in full,
        the reference the candidate shortcut must match)."""
        kmax = max(ks)
        out: dict[int, list[float]] = {k: [] for k in ks}
        for _ in range(resamples):
            state = rng.getstate()
            vals = self._resample(rng, full=exact)
            if len(vals) < kmax:        # too few candidates drawn: this resample in full
                rng.setstate(state)
                vals = self._resample(rng, full=True)
            top = heapq.nlargest(kmax, vals)
            for k in ks:
                out[k].append(top[k - 1])
        return out


def _ci(boot: Sequence[float]) -> list[float]:
    vals = sorted(boot)
    lo = (1.0 - CI_LEVEL) / 2 * 100.0
    return [percentile(vals, max(lo, 0.0)), percentile(vals, 100.0 - lo)]


def tail_episodes(reps: Sequence[Sequence[float]], threshold: float,
                  gap: int = EPISODE_GAP) -> dict[str, Any]:
    """Where the samples at or above ``threshold`` are: per repetition (``by_rep``), in how
    many separate bursts (``episodes``: closer than ``gap`` samples in one repetition is
    one burst), the largest burst, and ``next_above``: of the samples at or above it that
    have a successor, the share whose successor is at or above it too."""
    by_rep, episodes, largest, pairs, follow = [], 0, 0, 0, 0
    for r in reps:
        at = [j for j, v in enumerate(r) if v >= threshold]
        by_rep.append(len(at))
        run = 0
        for a, b in zip([None, *at], at, strict=False):
            if a is None or b - a > gap:
                episodes += 1
                run = 0
            run += 1
            largest = max(largest, run)
        for j in at:
            if j + 1 < len(r):
                pairs += 1
                follow += r[j + 1] >= threshold
    return {"by_rep": by_rep, "episodes": episodes, "largest_episode": largest,
            "next_above": follow / pairs if pairs else None, "gap": gap}


def tail_summary(values: Iterable[float], lost: int = 0, seed: int = 1,
                 tails: Sequence[float] = TAILS, resamples: int = BOOT_RESAMPLES,
                 sizes: Sequence[int] | None = None) -> TailSummary:
    """n, lost, and per tail statistic (``p99``, ``p99.9``, ``max``): its value, which
    k-th largest of n it is, how many samples lie above it, ``few`` (< FEW_ABOVE above),
    a seeded moving-block bootstrap 95 % CI, where its tail comes from
    (:func:`tail_episodes`), and the same statistic with the ``lost`` requests counted as
    infinite round trips (``with_lost``: value "inf" when its rank falls on a loss).
    ``values`` in the order they were taken; ``sizes``: the repetitions' lengths when
    ``values`` is several repetitions one after the other (else one)."""
    seq = list(values)
    reps = _split(seq, sizes)
    xs = sorted(seq)
    n = len(xs)
    rng = random.Random(seed)
    out: dict[str, Any] = {"n": n, "lost": lost, "resamples": resamples,
                           "ci_level": CI_LEVEL, "seed": seed,
                           "ci_method": "moving-block bootstrap within repetitions",
                           "reps": [len(r) for r in reps],
                           "blocks": [block_length(len(r)) for r in reps]}
    ks = {p: n - rank_of(n, p) + 1 for p in tails} if n else {}
    boot = BlockBootstrap(reps, max(ks.values())).kth_largest(
        sorted(set(ks.values())), rng, resamples) if n else {}
    for p in tails:
        key = tail_key(p)
        if not n:
            out[key] = None
            continue
        r = rank_of(n, p)
        k = n - r + 1
        d: dict[str, Any] = {"value": xs[r - 1], "k": k, "n": n, "above": k - 1,
                             "few": k - 1 < FEW_ABOVE, "ci95": _ci(boot[k]),
                             **tail_episodes(reps, xs[r - 1])}
        d["few_episodes"] = d["episodes"] < FEW_EPISODES
        nl = n + lost
        rl = rank_of(nl, p)
        d["with_lost"] = {"value": xs[rl - 1] if rl <= n else "inf", "k": nl - rl + 1,
                          "n": nl, "few": nl - rl < FEW_ABOVE}
        out[key] = d
    # TailSummary's keys (other ``tails`` than the default add theirs, tail_key's)
    return cast(TailSummary, out)


def seeded_order(xs: Sequence[str], seed: int, rep: int) -> list[str]:
    """A random permutation of ``xs`` for repetition ``rep``, the same for the same seed: the
    interleaving of every comparison kbp measures (the benchmark's modes, the rig's
    experiments)."""
    out = list(xs)
    random.Random(f"kbp-bench-order/{seed}/{rep}").shuffle(out)
    return out


def mode_summaries(runs: Iterable[Mapping[str, Any]],
                   metrics: Callable[[Mapping[str, Any]], Mapping[str, float | None]], *,
                   base: str, pair: Sequence[str] = ("rep",),
                   ) -> dict[str, ModeSummary]:
    """Per mode (in the order the runs first name them), per metric: its :func:`aggregate`
    over the mode's runs (median, spread) and, for every mode but ``base``,
    ``ratio_to_napi``: the aggregate of the ratios of each run's value to the value of the
    ``base`` mode's run with the same ``pair`` fields (the same repetition; in the rig's
    multi-guest runs the same guest too) -- per pair, then the median, never a ratio of
    medians.  A run without its partner, or a value that is missing, gives no ratio (not 0);
    a metric with no ratio in any pair (the base mode's runs do not have it, none of its
    values pairs) has no ``ratio_to_napi``.  ``metrics(run)`` gives a run's
    values.  The benchmark's summary (:func:`kbp.bench.report.summarize_runs`) and the rig's
    experiments both summarise through this one function (the key is named after napi, the
    baseline of every comparison kbp makes)."""
    vals = [(r["mode"], tuple(r.get(f) for f in pair), metrics(r)) for r in runs]
    base_of = {key: m for mode, key, m in vals if mode == base}
    out: dict[str, ModeSummary] = {}
    for mode in dict.fromkeys(mode for mode, _, _ in vals):
        mine = [(key, m) for md, key, m in vals if md == mode]
        row: ModeSummary = {}
        for k in dict.fromkeys(k for _, m in mine for k in m):
            agg = aggregate(m.get(k) for _, m in mine)
            if mode != base:       # a metric the base's runs lack pairs nowhere: n 0
                to_base = aggregate(
                    ratio(m.get(k), base_of.get(key, {}).get(k)) for key, m in mine)
                if to_base["n"]:
                    agg["ratio_to_napi"] = to_base
            row[k] = agg
        out[mode] = row
    return out


def group_summaries(runs: Iterable[Mapping[str, Any]], group: Callable[[Mapping[str, Any]], K],
                    metrics: Callable[[Mapping[str, Any]], Mapping[str, float | None]], *,
                    base: str, pair: Sequence[str] = ("rep",),
                    ) -> dict[K, dict[str, ModeSummary]]:
    """:func:`mode_summaries` of each group of runs (``group(run)``: a part, a condition),
    the groups in the order the runs first name them: {group: {mode: {metric: ...}}}."""
    groups: dict[K, list[Mapping[str, Any]]] = {}
    for r in runs:
        groups.setdefault(group(r), []).append(r)
    return {g: mode_summaries(rs, metrics, base=base, pair=pair) for g, rs in groups.items()}


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2.0


def aggregate(values: Iterable[float | None]) -> Aggregate:
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
