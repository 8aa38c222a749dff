"""Statistics of the benchmark against values computed by hand."""

from __future__ import annotations

import math
import statistics

import pytest

from kbp.bench import stats


def test_nearest_rank_percentiles_of_1_to_100() -> None:
    xs = list(range(1, 101))
    assert stats.percentile(xs, 50) == 50
    assert stats.percentile(xs, 99) == 99
    assert stats.percentile(xs, 99.9) == 100      # rank ceil(99.9) = 100
    assert stats.percentile(xs, 100) == 100
    assert stats.percentile(xs, 0) == 1
    assert stats.percentile(xs, 1) == 1
    assert stats.percentile(xs, 1.5) == 2


def test_nearest_rank_small_sets() -> None:
    # the classic textbook example (15, 20, 35, 40, 50)
    xs = [15, 20, 35, 40, 50]
    assert stats.percentile(xs, 5) == 15
    assert stats.percentile(xs, 30) == 20
    assert stats.percentile(xs, 40) == 20
    assert stats.percentile(xs, 50) == 35
    assert stats.percentile(xs, 100) == 50
    assert stats.percentile([7], 99.9) == 7


def test_percentile_is_always_an_observed_sample() -> None:
    xs = sorted([3.5, 1.25, 9.0, 2.0, 100.0, 4.0, 4.0])
    for p in (0, 10, 33.3, 50, 90, 99, 99.9, 100):
        assert stats.percentile(xs, p) in xs


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1], 101)


def test_sample_sd_and_mean() -> None:
    xs = [2, 4, 4, 4, 5, 5, 7, 9]
    assert stats.mean(xs) == 5
    # population SD is 2; the sample SD is sqrt(32/7)
    assert stats.sd(xs) == pytest.approx(math.sqrt(32 / 7))
    assert stats.sd(xs) == pytest.approx(statistics.stdev(xs))
    assert stats.sd([42]) == 0.0


def test_summarize() -> None:
    s = stats.summarize([5, 1, 3, 2, 4])
    assert s["n"] == 5
    assert s["min"] == 1 and s["max"] == 5
    assert s["p50"] == 3 and s["p90"] == 5 and s["p99"] == 5
    assert s["mean"] == 3
    assert s["sd"] == pytest.approx(statistics.stdev([1, 2, 3, 4, 5]))
    empty = stats.summarize([])
    assert empty["n"] == 0 and empty["p99"] is None and empty["max"] is None


def test_pct_key() -> None:
    assert stats.pct_key(50) == "p50"
    assert stats.pct_key(99.9) == "p99.9"


def test_median_and_aggregate() -> None:
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5
    agg = stats.aggregate([10.0, None, 30.0, 20.0, 50.0, 40.0])
    assert agg == {"n": 5, "median": 30.0, "min": 10.0, "max": 50.0, "q1": 20.0, "q3": 40.0}
    assert stats.aggregate([None, float("nan")])["median"] is None


def test_ratios_are_per_repetition_then_median() -> None:
    mode = {0: 10.0, 1: 40.0, 2: 9.0}
    base = {0: 20.0, 1: 20.0, 2: 3.0}
    runs = [{"mode": m, "rep": rep, "v": v} for m, vals in (("napi", base), ("kbp", mode))
            for rep, v in vals.items()]
    rs = stats.mode_summaries(runs, lambda r: {"v": r["v"]}, base="napi")["kbp"]["v"]
    r = rs["ratio_to_napi"]                 # per repetition 0.5, 2.0, 3.0
    assert (r["n"], r["min"], r["median"], r["max"]) == (3, 0.5, 2.0, 3.0)
    # ratio of medians would be 10/20 = 0.5: not what we report
    assert stats.ratio(stats.median(list(mode.values())), stats.median(list(base.values()))) \
        == 0.5
    assert stats.ratio(1.0, 0.0) is None
    assert stats.ratio(None, 1.0) is None
    # a repetition without napi's run gives no ratio
    runs = [{"mode": "kbp", "rep": 0, "v": 1.0}, {"mode": "kbp", "rep": 1, "v": 2.0},
            {"mode": "napi", "rep": 1, "v": 4.0}]
    r = stats.mode_summaries(runs, lambda r: {"v": r["v"]}, base="napi")["kbp"]["v"]
    assert (r["ratio_to_napi"]["n"], r["ratio_to_napi"]["median"]) == (1, 0.5)


def test_buckets_mirror_the_bpf_code() -> None:
    assert stats.bucket_of(0) == 0
    assert stats.bucket_of(1234) == 1200
    assert stats.bucket_of(9999) == 9900
    assert stats.bucket_of(10_000) == 10_000
    assert stats.bucket_of(12_345) == 12_000
    assert stats.bucket_of(123_456) == 120_000
    assert stats.bucket_of(1_234_567) == 1_200_000
    assert stats.bucket_width(9_900) == 100
    assert stats.bucket_width(12_000) == 1000
    assert stats.bucket_width(1_200_000) == 100_000
    for v in (0, 57, 999, 10_001, 99_999, 5_555_555, 123_456_789):
        lo = stats.bucket_of(v)
        assert lo <= v < lo + stats.bucket_width(lo)


def test_hist_percentiles_match_raw_within_a_bucket() -> None:
    raw = [100 * i + 37 for i in range(1, 2001)] + [5_000_000]
    buckets: dict[int, int] = {}
    for v in raw:
        b = stats.bucket_of(v)
        buckets[b] = buckets.get(b, 0) + 1
    xs = sorted(raw)
    for p in (50, 90, 99, 99.9):
        exact = stats.percentile(xs, p)
        got = stats.hist_percentile(buckets, p, exact_max=max(raw))
        lo = stats.bucket_of(exact)
        assert lo <= got <= lo + stats.bucket_width(lo)
    s = stats.hist_summary(buckets, exact_max=max(raw), total_ns=sum(raw))
    assert s["n"] == len(raw)
    assert s["max"] == 5_000_000
    assert s["mean"] == pytest.approx(sum(raw) / len(raw))
    assert stats.hist_percentile(buckets, 100, exact_max=max(raw)) == 5_000_000


def test_hist_summary_empty() -> None:
    s = stats.hist_summary({})
    assert s["n"] == 0 and s["p99"] is None


def test_mode_summaries_pair_each_run_with_the_baselines_run_of_the_same_repetition() -> None:
    """The summary of the benchmark and the rig's experiments: per mode each metric's median
    and spread, and the median of per-pair ratios to napi (never the ratio of the medians; a
    run without napi's partner gives no ratio; a missing value is left out, not counted as
    0)."""
    runs = [{"mode": "napi", "rep": 0, "guest": 1, "v": 10.0, "w": None},
            {"mode": "kbp", "rep": 0, "guest": 1, "v": 5.0, "w": 2.0},
            {"mode": "napi", "rep": 1, "guest": 1, "v": 20.0, "w": 1.0},
            {"mode": "kbp", "rep": 1, "guest": 1, "v": 30.0, "w": None},
            {"mode": "kbp", "rep": 2, "guest": 1, "v": 7.0, "w": 4.0},
            {"mode": "kbp", "rep": 0, "guest": 2, "v": 1.0, "w": 1.0}]   # napi of guest 2: none
    got = stats.mode_summaries(runs, lambda r: {"v": r["v"], "w": r["w"]}, base="napi",
                               pair=("rep", "guest"))
    assert list(got) == ["napi", "kbp"]
    assert got["napi"]["v"] == {"n": 2, "median": 15.0, "min": 10.0, "max": 20.0,
                                "q1": 10.0, "q3": 20.0}
    assert "ratio_to_napi" not in got["napi"]["v"] and got["napi"]["w"]["median"] == 1.0
    kbp = got["kbp"]
    assert (kbp["v"]["n"], kbp["v"]["median"], kbp["v"]["min"], kbp["v"]["max"]) == (
        4, 6.0, 1.0, 30.0)
    ratio = kbp["v"]["ratio_to_napi"]          # 5/10 and 30/20 only: the median of 0.5, 1.5
    assert (ratio["n"], ratio["median"]) == (2, 1.0)
    # w pairs nowhere (napi's rep 0 and kbp's rep 1 lack it): no ratio, not an empty one
    assert kbp["w"]["median"] == 2.0 and "ratio_to_napi" not in kbp["w"]
    # a metric napi's runs do not have gets no ratio; without napi, no mode has one
    got = stats.mode_summaries([{"mode": "kbp", "rep": 0, "v": 1.0}], lambda r: {"v": r["v"]},
                               base="napi")
    assert "ratio_to_napi" not in got["kbp"]["v"]
    # a value that is not there (None, NaN) is left out, not counted
    got = stats.mode_summaries([{"mode": "kbp", "rep": 0, "v": float("nan")},
                                {"mode": "kbp", "rep": 1, "v": None}],
                               lambda r: {"v": r["v"]}, base="napi")
    assert got["kbp"]["v"]["n"] == 0 and got["kbp"]["v"]["median"] is None


def test_seeded_order_is_a_permutation_fixed_by_seed_and_repetition() -> None:
    xs = ["a", "b", "c", "d", "e"]
    assert sorted(stats.seeded_order(xs, 7, 0)) == xs
    assert stats.seeded_order(xs, 7, 0) == stats.seeded_order(xs, 7, 0)
    assert len({tuple(stats.seeded_order(xs, 7, rep)) for rep in range(6)}) > 1
