"""irq-suspend on the host kernel's netns testbed (root, Linux 6.13+): kbp-echo echoes every
datagram unchanged (the sequence kbp-rtt matches on, and the whole payload) and exits 0 on
SIGTERM and SIGINT; the mode sets the napi-set values on the RT device's NAPIs (read back with
napi-get) and turns its RPS off while a real echo exchange runs through kbp-echo, and puts
back exactly what it found; a smoke benchmark of napi and irq-suspend in the shared-cpu
scenario answers requests in both (RPS off on the RT device in irq-suspend only) and leaves
nothing behind, also after Ctrl-C while irq-suspend is on.

Needs root, sockperf, iperf3, ethtool, gcc.  About 40 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bench_netns import (
    _ours,
    _procs,
    _settings,
    _skip_unless_ready,
    interrupt_when_on,
    start_idle_bench,
)

from kbp import rps
from kbp.bench import modes, steer, tester, workloads
from kbp.bench.modes import IrqSuspendMode, Target
from kbp.bench.testbed import Testbed as VethTestbed  # not collected as a test class
from kbp.netdev import Napi, NetdevClient, get_link

pytestmark = [pytest.mark.netns, pytest.mark.root]

# a client in the client namespace: sockperf-like requests (be64 sequence, be16 flags,
# be32 length, then a payload that differs per request); prints the replies that differ
CLIENT = r"""
import os, socket, struct, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2.0)
bad = 0
for seq in range(n):
    req = struct.pack(">QHI", seq, 1, 14 + 50 + seq) + os.urandom(50 + seq)
    s.sendto(req, (ip, port))
    rep, src = s.recvfrom(65536)
    if rep != req or src != (ip, port):
        bad += 1
print(bad)
"""


def _skip_unless_irq_suspend() -> None:
    _skip_unless_ready()
    why = modes.all_modes()[modes.IRQ_SUSPEND].unavailable()
    if why:
        pytest.skip(reason=why)


@pytest.fixture
def testbed() -> Iterator[VethTestbed]:
    with VethTestbed(link_names=("rt",), prefix="kbpb") as tb:
        yield tb


def _napis(tb: VethTestbed) -> list[Napi]:
    rt = tb.link("rt")
    link = get_link(rt.dev_b, tb.server)
    assert link is not None
    with NetdevClient(tb.server) as c:
        return c.napis(link.ifindex)


def _exchange(tb: VethTestbed, n: int) -> int:
    """Requests through the echo server from the client namespace: how many came back
    other than sent (the whole datagram compared)."""
    rt = tb.link("rt")
    out = tb.run(tb.client, [sys.executable, "-c", CLIENT, rt.ip_b,
                             str(workloads.SOCKPERF_PORT), str(n)], timeout=60)
    return int(out.stdout.strip())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_kbp_echo_echoes_unchanged_and_exits_on_a_signal(testbed: VethTestbed,
                                                         sig: signal.Signals) -> None:
    _skip_unless_ready()
    tb = testbed
    rt = tb.link("rt")
    echo = workloads.EchoServer(tb.server, rt.ip_b, 1)
    echo.start()
    try:
        assert _exchange(tb, 50) == 0
        binary = tester.build()
        res = tester.run_rtt(binary, tb.client, rt.ip_b, port=echo.port, size=64, rate=1000,
                             poisson=False, duration=0.5, warmup=0.1, cpu=0)
        t = res.summary
        assert t["sent"] >= 400 and t["received"] == t["sent"], t     # every sequence back
        assert t["unknown"] == 0 and t["bad"] == 0 and t["duplicates"] == 0, t
        assert echo.proc is not None
        proc = echo.proc
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=5)
        assert proc.returncode == 0, err
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["received"] == summary["echoed"] >= 50 + t["sent"], summary
        assert summary["prefer_busy_poll"] == 1 and summary["busy_poll_budget"] == 16
    finally:
        echo.stop()


def test_kbp_echo_refuses_a_port_in_use(testbed: VethTestbed) -> None:
    _skip_unless_ready()
    tb = testbed
    rt = tb.link("rt")
    first = workloads.EchoServer(tb.server, rt.ip_b, 1)
    first.start()
    try:
        with pytest.raises(RuntimeError, match="bind"):
            workloads.EchoServer(tb.server, rt.ip_b, 1).start(timeout=5)
    finally:
        first.stop()


def test_irq_suspend_sets_the_napis_and_rps_off_then_restores_exactly(
        testbed: VethTestbed) -> None:
    _skip_unless_irq_suspend()
    tb = testbed
    rt = tb.link("rt")
    rt_cpu = 1
    # the device as the shared-cpu scenario leaves it (RPS to the RT CPU), with NAPI values
    # of its own, so "restored" is not just "back to 0"
    steering = steer.Steering(tb.server, [rt.dev_b], rt_cpu)
    steering.apply()
    tb.defer(steering.undo)
    with NetdevClient(tb.server) as c:
        for n in _napis(tb):
            c.napi_set(n.id, defer_hard_irqs=3, gro_flush_timeout=12345,
                       irq_suspend_timeout=777)
    napis_before = _napis(tb)
    rps_before = steer.read_rps(tb.server, rt.dev_b)
    assert napis_before and rps.masks_cpus(rps_before) == [rt_cpu]

    mode = IrqSuspendMode()
    echo = workloads.EchoServer(tb.server, rt.ip_b, rt_cpu)
    mode.setup(Target(tb.server, rt.dev_b, rt_cpu))
    try:
        on = _napis(tb)
        assert [n.id for n in on] == [n.id for n in napis_before]
        for n in on:
            assert (n.defer_hard_irqs, n.gro_flush_timeout, n.irq_suspend_timeout) == \
                (2, 20_000, 20_000_000), n
        assert rps.masks_cpus(steer.read_rps(tb.server, rt.dev_b)) == []
        d = mode.describe()
        assert d["found"][f"netdev napi {on[0].id} irq-suspend-timeout (netns {tb.server})"] \
            == "777"
        echo.start()
        assert _exchange(tb, 30) == 0
        res = tester.run_rtt(tester.build(), tb.client, rt.ip_b, port=echo.port, size=64,
                             rate=2000, poisson=True, duration=1.0, warmup=0.2, cpu=0)
        assert res.summary["received"] == res.summary["sent"] >= 1500, res.summary
        assert res.summary["unknown"] == 0
    finally:
        echo.stop()
        mode.teardown()
    assert echo.summary["received"] == echo.summary["echoed"] > 1500, echo.summary
    assert _napis(tb) == napis_before
    assert steer.read_rps(tb.server, rt.dev_b) == rps_before


def test_smoke_bench_napi_and_irq_suspend_shared_cpu(tmp_path: Path) -> None:
    """python -m kbp.bench --smoke --modes napi,irq-suspend --scenario shared-cpu --no-trace
    --parts rtt: both modes answer (irq-suspend through kbp-echo), nothing is left behind."""
    _skip_unless_irq_suspend()
    before_ns, before_set = _ours(), _settings()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.run([sys.executable, "-m", "kbp.bench", "--smoke", "--modes",
                           "napi,irq-suspend", "--scenario", "shared-cpu", "--no-trace",
                           "--parts", "rtt", "--no-plots", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["modes"]["irq-suspend"] == {"status": "ok"}
    assert "restore_problems" not in res and not res["interrupted"]
    runs = [r for r in res["runs"] if r["mode"] == "irq-suspend"]
    assert {r["condition"] for r in runs} == {"idle", "flood"}
    for r in runs:
        t = r["tester"]
        assert r["app"] == "kbp-echo", r.get("app")
        assert t["sent"] > 500 and r["rtt_ns"]["n"] > 0.5 * t["sent"], t
        ms = r["mode_setup"]
        assert set(ms["set"].values()) >= {"2", "20000", "20000000"}, ms["set"]
        assert any("/rps_cpus (netns " in k for k in ms["set"]), ms["set"]   # RPS off
        if r["condition"] == "idle":
            # the deferral ends within 2 empty re-polls of a request (and GRO lets go of it
            # then): the RT CPU's NET_RX rounds per request stay a handful (request poll,
            # re-polls, the reply's veth NAPI). With the selftest's 100 x 50 us the timer
            # re-polled through every gap and held each request to the next jiffy (~10 per
            # request at 2000/s: docs/results.md, irq-suspend).
            assert r["rt_cpu_rx"]["net_rx"] <= 6 * t["sent"], (r["rt_cpu_rx"], t)
    rt_cpu = res["placement"]["cpus"]["rt"]
    for r in res["runs"]:
        rt_dev = next(d for d in r["steering"] if d.startswith("rt-"))
        if r["mode"] == "napi":
            assert r["app"] == "sockperf" and r["tester"]["received"] > 500
            assert r["steering"][rt_dev] == [rt_cpu]            # the scenario's RPS
        else:
            assert r["steering"][rt_dev] == [], "irq-suspend must turn RPS off on the RT device"
    assert _ours() == before_ns
    assert _settings() == before_set
    assert _procs() == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "kbp-echo" not in ps


def _echo_pids() -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,comm"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:]
            if line.split()[1:] == ["kbp-echo"]]


def test_ctrl_c_while_irq_suspend_is_on(tmp_path: Path) -> None:
    """SIGINT while irq-suspend (and so kbp-echo) is on: the mode is torn down without a
    restore problem, sockperf is not left running in its place, nothing is left behind."""
    _skip_unless_irq_suspend()
    if _echo_pids():
        pytest.skip(reason="a kbp-echo already runs here (another benchmark?)")
    before_ns, before_set = _ours(), _settings()
    proc = start_idle_bench("irq-suspend", tmp_path)
    err = interrupt_when_on(proc, lambda: bool(_echo_pids()), "kbp-echo never started",
                            settle=1.0)                 # the mode is set up by then
    assert proc.returncode == 130, err[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["interrupted"] is True and "restore_problems" not in res
    assert _echo_pids() == []
    assert _ours() == before_ns
    assert _settings() == before_set
    assert _procs() == []
