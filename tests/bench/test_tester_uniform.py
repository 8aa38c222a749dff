"""kbp-rtt's ``--uniform MIN_US,MAX_US`` inter-arrival times (rt-socket-outsourcing Sect.
IV-A: requests at random gaps of 1 to 10 ms), on the host: the tester built from
src/kbp/data/kbp_rtt.c against a UDP echo on the loopback (no root, no namespace), the gaps
it planned (its summary) inside the range with the range's mean, and bad ranges refused by
the binary and by tester.run_rtt before anything runs.  About 2 s."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbp.bench import tester


@pytest.fixture(scope="module")
def binary() -> Path:
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip(reason="no C compiler (gcc or cc): the tester is built from C")
    return tester.build()


@pytest.fixture
def echo() -> Iterator[int]:
    """A UDP echo on 127.0.0.1 (what sockperf's server does with a ping-pong message)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                data, peer = s.recvfrom(2048)
            except TimeoutError:
                continue
            s.sendto(data, peer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield s.getsockname()[1]
    finally:
        done.set()
        t.join(2)
        s.close()


def test_uniform_gaps_inside_the_range(binary: Path, echo: int) -> None:
    res = tester.run_rtt(binary, None, "127.0.0.1", port=echo, size=18, rate=99999.0,
                         poisson=True, duration=1.5, warmup=0.1, uniform_us=(1000, 3000))
    s = res.summary
    assert s["arrival"] == "uniform"
    assert s["gaps"] >= 400
    assert 1000 <= s["gap_min_us"] < 1100 and 2900 < s["gap_max_us"] <= 3000
    assert s["gap_mean_us"] == pytest.approx(2000, rel=0.08)
    # ~1.6 s / 2 ms requests, not the 99999/s asked for by rate (unused with --uniform)
    assert 500 <= s["sent"] + s["warmup_sent"] <= 1000
    assert s["received"] >= 0.95 * s["sent"] and res.lost <= 0.05 * s["sent"]
    assert len(res.user_ns) == s["received"]


def test_poisson_and_constant_say_so(binary: Path, echo: int) -> None:
    for poisson, name in ((True, "poisson"), (False, "constant")):
        s = tester.run_rtt(binary, None, "127.0.0.1", port=echo, size=18, rate=500.0,
                           poisson=poisson, duration=0.3, warmup=0.0).summary
        assert s["arrival"] == name
        if not poisson:
            assert s["gap_min_us"] == pytest.approx(2000, abs=1)
            assert s["gap_max_us"] == pytest.approx(2000, abs=1)


@pytest.mark.parametrize("arg", ["5000,1000", "0,10", "-1,10", "1000", "1000,", "a,b",
                                 "1000,10000x", "1,70000000"])
def test_binary_refuses_a_bad_range(binary: Path, arg: str) -> None:
    p = subprocess.run([str(binary), "--ip", "127.0.0.1", "--uniform", arg],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "bad --uniform" in p.stderr, p.stderr


def test_binary_refuses_uniform_with_poisson_or_rate_mode(binary: Path) -> None:
    for extra in (["--poisson"], ["--mode", "rate"]):
        p = subprocess.run([str(binary), "--ip", "127.0.0.1", "--uniform", "1000,2000",
                            *extra], capture_output=True, text=True, timeout=10)
        assert p.returncode == 2 and "--uniform is for --mode rtt" in p.stderr, p.stderr


def test_run_rtt_refuses_before_running(binary: Path) -> None:
    assert tester.uniform_problem((1000, 10000)) is None
    assert tester.uniform_rate((1000, 10000)) == pytest.approx(2e6 / 11000)
    for bad in ((10, 1), (0, 5), (1, 2, 3)):
        assert tester.uniform_problem(bad)
        with pytest.raises(tester.TesterError, match="--uniform"):
            # no echo listens on port 9: it would fail differently if it ran
            tester.run_rtt(binary, None, "127.0.0.1", port=9, size=18, rate=1.0,
                           poisson=False, duration=0.1, uniform_us=bad)  # type: ignore[arg-type]
