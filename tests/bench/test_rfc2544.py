"""The RFC 2544 binary search against simulated devices with known loss thresholds."""

from __future__ import annotations

import math

import pytest

from kbp.bench import rfc2544


def device(threshold: float, tester_max: float = float("inf"), duration: float = 1.0):
    """A device that loses frames above ``threshold`` frames/s, behind a tester that can
    offer at most ``tester_max`` frames/s."""
    calls: list[float] = []

    def trial(rate: float) -> rfc2544.Trial:
        calls.append(rate)
        offered = min(rate, tester_max)
        sent = int(offered * duration)
        lost = 0 if offered <= threshold else max(1, int((offered - threshold) * duration))
        return rfc2544.Trial(rate=rate, sent=sent, received=sent - lost,
                             achieved_rate=offered, duration_s=duration)

    return trial, calls


@pytest.mark.parametrize("threshold", [150.0, 1234.0, 50_000.0, 99_000.0])
def test_finds_threshold_within_resolution(threshold: float) -> None:
    trial, calls = device(threshold)
    res = rfc2544.search(trial, hi=100_000.0, resolution=0.01)
    assert res.throughput <= threshold            # never claims a lossy rate
    assert res.throughput >= threshold / 1.01     # within the (relative) resolution
    assert res.bound == "device"
    assert calls[0] == 100_000.0                  # the ceiling is tried first
    # halvings down to the threshold, then ~log2(1/0.01) refinements
    assert len(calls) <= 1 + math.ceil(math.log2(100_000.0 / threshold)) + 8
    # every trial is recorded with its outcome
    assert [t["rate"] for t in res.trials] == calls
    assert all(t["passed"] == (t["rate"] <= threshold) for t in res.trials)


def test_ceiling_passes() -> None:
    trial, calls = device(threshold=1e9)
    res = rfc2544.search(trial, hi=5000.0)
    assert res.throughput == 5000.0 and res.bound == "ceiling" and calls == [5000.0]


def test_nothing_passes() -> None:
    trial, calls = device(threshold=0.0)
    res = rfc2544.search(trial, hi=1000.0, resolution=0.1)
    assert res.throughput == 0.0
    assert res.bound == "device"
    assert min(calls) <= 1000.0 / 1024 * 2        # gave up at the floor
    trial, _ = device(threshold=5.0)
    assert rfc2544.search(trial, hi=1000.0, floor=10.0).throughput == 0.0


def test_loss_tolerance() -> None:
    # the device loses 1 frame in 10 000 from 500 frames/s on
    def trial(rate: float) -> rfc2544.Trial:
        sent = int(rate * 10)
        lost = sent // 10_000 if rate > 500 else 0
        return rfc2544.Trial(rate, sent, sent - lost, rate)

    strict = rfc2544.search(trial, hi=100_000.0, resolution=0.001)
    assert strict.throughput < 100_000.0
    tolerant = rfc2544.search(trial, hi=100_000.0, resolution=0.001, loss_tolerance=1e-4)
    assert tolerant.throughput == 100_000.0


def test_sender_limited_trials_fail_and_are_marked() -> None:
    # lossless device, but the tester cannot offer more than 30 000 frames/s
    trial, _ = device(threshold=1e9, tester_max=30_000.0)
    res = rfc2544.search(trial, hi=100_000.0, resolution=0.01)
    assert 0.97 * 30_000.0 / 1.01 <= res.throughput <= 30_000.0
    assert res.bound == "sender"
    assert any(t["sender_limited"] for t in res.trials)


def test_device_below_tester_limit_is_device_bound() -> None:
    trial, _ = device(threshold=20_000.0, tester_max=30_000.0)
    res = rfc2544.search(trial, hi=100_000.0, resolution=0.01)
    assert res.bound == "device"
    assert 19_000.0 <= res.throughput <= 20_000.0


def test_bad_interval() -> None:
    trial, _ = device(1.0)
    with pytest.raises(ValueError):
        rfc2544.search(trial, hi=0.0)


def test_frame_sizes() -> None:
    assert rfc2544.udp_payload(64) == 18
    assert rfc2544.udp_payload(512) == 466
    assert rfc2544.udp_payload(1518) == 1472
    with pytest.raises(ValueError):
        rfc2544.udp_payload(59)
    assert rfc2544.frame_mbps(1_000_000 / 8 / 64 * 80, 64) == pytest.approx(80.0)


# -- a tester that has to be killed (measure/throughput.py) -----------------------------------

def _fake_trial(finishes_at: float, calls: list[float], achieved: float = 0.9):
    from kbp.bench.measure import throughput

    def trial(rate: float) -> rfc2544.Trial:
        calls.append(rate)
        if rate > finishes_at:
            return throughput.timed_out(rate, 32.5, f"killed at {rate:g}")
        return rfc2544.Trial(rate=rate, sent=int(rate), received=int(rate),
                             achieved_rate=rate * achieved)
    return trial


def test_a_killed_trial_fails_and_says_why():
    from kbp.bench.measure import throughput

    t = throughput.timed_out(5e6, 32.5, "tester still running")
    ok, limited = rfc2544._passes(t, 0.0, 0.97)
    assert not ok and limited
    res = rfc2544.search(_fake_trial(1e5, [], achieved=1.0), hi=4e5, resolution=0.05)
    assert res.trials[0]["tester_timeout"] == "killed at 400000"
    assert not res.trials[0]["passed"]
    assert 0 < res.throughput <= 1e5


def test_the_ceiling_probe_steps_down_past_a_killed_tester():
    from kbp.bench.measure import throughput

    calls: list[float] = []
    probe = throughput.ceiling_probe(_fake_trial(1e6, calls))
    assert calls == [5e6, 1e6]
    assert probe.rate == 1e6 and probe.achieved_rate == 0.9e6
    assert probe.extra["timed_out_at"] == [5e6]
    calls.clear()
    probe = throughput.ceiling_probe(_fake_trial(1e7, calls))
    assert calls == [5e6] and "timed_out_at" not in probe.extra
    calls.clear()
    probe = throughput.ceiling_probe(_fake_trial(10.0, calls))     # nothing finishes
    assert calls == list(throughput.PROBE_RATES)
    assert "tester_timeout" in probe.extra and probe.achieved_rate == 0.0
