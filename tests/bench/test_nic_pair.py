"""``--nic-pair``: refusals before anything changes, and on the host kernel a run whose RT flow
crosses two devices of the initial namespace (a veth pair standing in for two cabled ports:
this host has no spare NIC) which are put back afterwards -- name, addresses, MTU, state --
also from the journal a killed benchmark leaves.  The run over real NICs (the VM rig's two
virtio ports, real interrupts) is vm/guest_tests/test_bench_nic_pair.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bench_netns import _ours, _procs, _run_anatomy, _skip_unless_ready

from kbp.bench import nicpair, report
from kbp.bench.runner import Aborted, Bench, BenchConfig
from kbp.system import journal

ROOT = Path(__file__).resolve().parents[2]


# -- no root ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "words"), [
    ("eth1", "give two devices"),
    ("eth1,eth2,eth3", "give two devices"),
    ("eth1,eth1", "names eth1 twice"),
    (",", "give two devices"),
])
def test_parse_refuses(text: str, words: str) -> None:
    with pytest.raises(nicpair.NicPairError, match=words):
        nicpair.parse(text)


def test_parse_keeps_the_order() -> None:
    assert nicpair.parse(" a , b ") == ("a", "b")


def test_cli_refuses_the_same_device_twice_before_anything_changes() -> None:
    before = _ours()
    p = subprocess.run([sys.executable, "-m", "kbp.bench", "--nic-pair", "ethX,ethX",
                        "--smoke", "--no-trace"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert p.returncode == 2, p.stderr
    assert "names ethX twice" in p.stderr
    assert _ours() == before


# -- root: devices of the initial namespace ---------------------------------------------------
def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=check)


@contextlib.contextmanager
def _veth_pair(up: bool = True) -> Iterator[tuple[str, str]]:
    """A veth pair in the initial namespace with GRO on (so it has NAPI when up), an
    address on each end and MTU 1400: what the run must put back."""
    t = uuid.uuid4().hex[:5]
    a, b = f"kbpnp{t}a", f"kbpnp{t}b"
    _ip("link", "add", a, "type", "veth", "peer", "name", b)
    try:
        for dev, addr in ((a, "203.0.113.201/32"), (b, "203.0.113.202/32")):
            # gro: veth has NAPI; rx-udp-gro-forwarding: local UDP goes through it
            # (kbp.bench.testbed's docstring) -- a NIC needs neither
            subprocess.run(["ethtool", "-K", dev, "gro", "on", "rx-udp-gro-forwarding", "on"],
                           check=True, capture_output=True)
            _ip("addr", "add", addr, "dev", dev)
            _ip("link", "set", dev, "mtu", "1400")
            if up:
                _ip("link", "set", dev, "up")
        yield a, b
    finally:
        _ip("link", "del", a, check=False)


def _state(dev: str) -> dict[str, object]:
    info = json.loads(_ip("-j", "addr", "show", "dev", dev).stdout)[0]
    return {"up": "UP" in info["flags"], "mtu": info["mtu"],
            "addrs": sorted(f"{x['local']}/{x['prefixlen']}" for x in info["addr_info"]
                            if x.get("scope") != "link")}


def test_receive_irqs_leave_out_only_the_vectors_that_only_transmit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The anatomy's I is the server port's receive interrupt: virtio's -output.N and a
    driver's separate -tx-N vectors are left out, combined TxRx vectors, receive ones and
    ones /proc/interrupts does not name are kept."""
    from kbp import sysinfo
    names = {25: "virtio0-input.0", 26: "virtio0-output.0", 40: "eth1-TxRx-0",
             41: "eth1-tx-1", 42: "eth1-rx-2", 43: "mlx5_comp0@pci:0000:3b:00.0"}
    monkeypatch.setattr(sysinfo, "read_interrupts", lambda *a, **k: names)
    assert nicpair.receive_irqs([26, 25, 40, 41, 42, 43, 99]) == [25, 40, 42, 43, 99]


def test_check_refuses_missing_down_and_default_route_devices() -> None:
    _skip_unless_ready()
    with pytest.raises(nicpair.NicPairError, match="no device kbpnope0"):
        nicpair.check(("kbpnope0", "lo"))
    with pytest.raises(nicpair.NicPairError, match="lo is not a NIC port"):
        nicpair.check(("lo", "kbpnope0"))
    with _veth_pair(up=False) as (a, b), pytest.raises(nicpair.NicPairError,
                                                         match=f"{a} has no NAPI instance"):
        nicpair.check((a, b))
    routed = sorted(nicpair.default_route_devs())
    if routed:
        with pytest.raises(nicpair.NicPairError, match="default route"):
            nicpair.check((routed[0], "lo"))


def test_bench_refuses_a_bad_pair_before_anything_changes(tmp_path: Path) -> None:
    _skip_unless_ready()
    before = _ours()
    cfg = BenchConfig(scenario="shared-cpu", modes=["napi"], reps=1, duration=0.5,
                      parts=["rtt"], trace=False, out=tmp_path, nic_pair=["kbpnope0", "lo"])
    with pytest.raises(Aborted, match="no device kbpnope0"):
        Bench(cfg).run()
    assert _ours() == before


def test_run_over_a_device_pair_puts_them_back(tmp_path: Path) -> None:
    _skip_unless_ready()
    before_ns, before_procs = _ours(), _procs()
    with _veth_pair() as (a, b):
        was = {a: _state(a), b: _state(b)}
        cfg = BenchConfig(scenario="shared-cpu", modes=["napi", "stock-hybrid"], reps=1,
                          duration=1.0, warmup=0.2, parts=["rtt"], trace=False, out=tmp_path,
                          command="pytest", nic_pair=[a, b])
        res = Bench(cfg).run()
        report.add_summary(res)
        res = json.loads(json.dumps(res))
        assert not res.get("restore_problems"), res.get("restore_problems")
        assert "NIC pair" in res["testbed"]
        assert res["nic_pair"]["tester_port"] == a and res["nic_pair"]["server_port"] == b
        rt = res["testbed_devices"]["rt"]
        assert (rt["dev_a"], rt["dev_b"], rt["kind"]) == (a, b, "nic")
        # the RT port is not steered with RPS (its interrupt runs the receive path); the flood is
        assert list(res["steering"]["devices"]) == [res["testbed_devices"]["flood"]["dev_b"]]
        runs = {(r["mode"], r["condition"]): r for r in res["runs"]}
        assert set(runs) == {(m, c) for m in ("napi", "stock-hybrid") for c in ("idle", "flood")}
        for key, r in runs.items():
            assert r["rtt_ns"]["n"] > 0.5 * r["tester"]["sent"], key
            if key[0] == "stock-hybrid":
                assert r["poller"].get("poll_ns", 0) > 0, (key, r["poller"])
        # both devices back in this namespace, as they were; the journal gone
        assert {a: _state(a), b: _state(b)} == was
        assert not journal.StateDir().process_path(nicpair.OWNER).exists()
    assert _ours() == before_ns
    assert _procs() == before_procs


def test_anatomy_over_a_device_pair_reads_each_request_from_the_packets(
        tmp_path: Path) -> None:
    """--anatomy with --nic-pair, over a veth pair standing in for the two NIC ports (this
    host has none to spare; the rig's test has virtio NICs): the probes key as for NICs, on
    the sequence number in the packet each port received, and nearly every request is
    traced whole from the tester's xmit to the reply's arrival, its segments adding up to
    the time traced and that to the tester's round trip; the server port's RT NAPI polled
    them (no interrupt on veth: the wire segment is 0)."""
    _skip_unless_ready()
    with _veth_pair() as (a, b):
        cfg = BenchConfig(scenario="shared-cpu", modes=["napi"], reps=1, duration=1.0,
                          warmup=0.2, parts=["rtt"], loads=["off"], out=tmp_path,
                          command="pytest", nic_pair=[a, b], anatomy=True)
        res = json.loads(json.dumps(_run_anatomy(cfg)))
    assert not res.get("restore_problems"), res.get("restore_problems")
    (r,) = res["runs"]
    an = r["anatomy"]
    assert an["samples"] > 200 and an["traced"] >= 0.9 * an["samples"], an["missing_from"]
    assert an["lost_events"] == 0 and an["tail"]
    explained = sorted(s["explained"] for s in an["tail"])
    assert 0.95 <= explained[len(explained) // 2] <= 1.2, explained
    for s in an["tail"]:
        seg = s["segments_us"]
        assert min(seg.values()) >= 0 and seg["wire"] == 0
        assert sum(seg.values()) == pytest.approx(s["traced_us"], abs=0.01)
    assert sum(s["poll"]["napi_id"] != 0 for s in an["tail"]) >= 0.9 * len(an["tail"])


def test_recover_finishes_a_killed_runs_restore() -> None:
    _skip_unless_ready()
    ns = f"kbpnp-{uuid.uuid4().hex[:6]}"
    with _veth_pair() as (a, b):
        was = {a: _state(a), b: _state(b)}
        pair = nicpair.NicPair.record((a, b))
        dead = subprocess.Popen(["true"])
        dead.wait()
        pair.journal_moves(ns, ns, pid=dead.pid)       # as the killed run wrote it
        path = journal.StateDir().process_path(nicpair.OWNER, dead.pid)
        _ip("netns", "add", ns)
        try:
            pair.tester.move(ns, "198.18.250.1", 24)
            pair.server.move(ns, "198.18.250.2", 24)
            assert not Path(f"/sys/class/net/{a}").exists()       # really moved away
            done, kept = nicpair.recover()
            assert kept == []
            assert any(a in line for line in done) and any(b in line for line in done), done
            assert {a: _state(a), b: _state(b)} == was
            assert not path.exists()
        finally:
            _ip("netns", "del", ns, check=False)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
