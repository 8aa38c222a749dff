"""Faults while traffic flows leave the system working on stock NAPI, dmesg clean.

(The autouse fixtures check dmesg for splats and that no kbp/ thread is left.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    NS,
    POLL_CPU,
    Flow,
    build_topology,
    kbp_threads,
    load_module,
    module_loaded,
    net_rx_softirqs,
    sh,
    spawn,
    stop,
    traffic_flows,
    udp_seen,
    wait_for,
)
from test_kernel72 import has_napi_set_threaded

MODES = ["busy", "hybrid", "periodic"]


def poller_packets(kmod) -> int:
    """Packets of every rt poller of POLL_CPU (one per device there)."""
    return sum(p.packets or 0 for p in kmod.pollers() if p.cpu == POLL_CPU and p.cls == "rt")


def assert_stock_carries(flow: Flow) -> None:
    """Traffic reaches the socket and NET_RX runs on the NIC's CPU again."""
    rx0 = net_rx_softirqs()[POLL_CPU]
    assert traffic_flows(flow.t, 1.5), "traffic stopped"
    assert net_rx_softirqs()[POLL_CPU] > rx0, "stock NAPI is not carrying the traffic"


@pytest.mark.parametrize("mode", MODES)
def test_detach_under_traffic(kmod, flow: Flow, mode: str) -> None:
    flow.start_sink(timeout=300)
    flow.start_sender(rate=1000)
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode=mode)
    p0 = poller_packets(kmod)
    wait_for(lambda: poller_packets(kmod) > p0 + 200, 10, what="poller to carry traffic")
    kmod.detach(flow.t.nic0)
    assert_stock_carries(flow)


@pytest.mark.parametrize("mode", MODES)
def test_link_down_up_under_traffic(kmod, flow: Flow, mode: str) -> None:
    flow.start_sink(timeout=300)
    flow.start_sender(rate=1000)
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode=mode)
    sh(f"ip link set {flow.t.nic0} down")
    assert kmod.device(flow.t.nic0).napi_count == 0
    sh(f"ip link set {flow.t.nic0} up")
    dev = wait_for(lambda: (d := kmod.device(flow.t.nic0)) and d.napi_count and d,
                   10, what="NAPIs to be attached again after up")
    assert dev.napis and all(n.cpu == POLL_CPU for n in dev.napis)
    p0 = poller_packets(kmod)
    wait_for(lambda: poller_packets(kmod) > p0 + 200, 20, what="poller to carry traffic again")
    kmod.detach(flow.t.nic0)
    assert_stock_carries(flow)


@pytest.fixture()
def veth_pair(kmod, topo) -> Iterator[tuple[str, str]]:
    """kbpva (init netns, GRO on: NAPI) <-> kbpvb (peer netns), 198.18.101.0/24."""
    sh("modprobe veth; ip link add kbpva type veth peer name kbpvb netns " + NS)
    sh("ip addr add 198.18.101.1/24 dev kbpva; ip link set kbpva up; "
       "ethtool -K kbpva gro on rx-udp-gro-forwarding on")
    sh("ip addr add 198.18.101.2/24 dev kbpvb; ip link set kbpvb up", ns=NS)
    yield "kbpva", "kbpvb"
    sh("ip link del kbpva", check=False)


def veth_sender(rate: int = 1000):
    from conftest import UDPFLOW
    return spawn([*UDPFLOW, "send", "--to", "198.18.101.1:9001", "--count", "0",
                  "--rate", str(rate)], ns=NS)


@pytest.mark.parametrize("mode", MODES)
def test_device_deletion_under_traffic(kmod, flow: Flow, veth_pair, mode: str) -> None:
    flow.start_sink(timeout=300)
    flow.start_sender(rate=500)
    sender = veth_sender()
    try:
        kmod.attach("kbpva", cpu=POLL_CPU, mode=mode)
        p0 = poller_packets(kmod)
        wait_for(lambda: poller_packets(kmod) > p0 + 200, 10, what="poller to carry veth")
        sh("ip link del kbpva")
        wait_for(lambda: not kmod.devices(), 5, what="binding to go with the device")
    finally:
        stop(sender)
    assert traffic_flows(flow.t, 1.0)


@pytest.mark.parametrize("mode", MODES)
def test_gro_off_deletes_napi_under_the_poller(kmod, veth_pair, mode: str) -> None:
    """veth deletes its NAPI on "gro off" while up: the poller is respawned, not lost."""
    sender = veth_sender()
    try:
        kmod.attach("kbpva", cpu=POLL_CPU, mode=mode)
        pid0 = kmod.poller(POLL_CPU).pid
        p0 = poller_packets(kmod)
        wait_for(lambda: poller_packets(kmod) > p0 + 200, 10, what="poller to carry veth")
        seen = udp_seen()
        sh("ethtool -K kbpva gro off")
        p = kmod.poller(POLL_CPU)
        assert p.respawns == 1 and p.pid != pid0
        assert kmod.device("kbpva").napi_count == 0
        wait_for(lambda: udp_seen() > seen + 200, 10, what="traffic without NAPI")
        sh("ethtool -K kbpva gro on rx-udp-gro-forwarding on")
        wait_for(lambda: kmod.device("kbpva").napi_count == 1, 10,
                 what="the re-added NAPI to be hooked")
        p1 = poller_packets(kmod)
        wait_for(lambda: poller_packets(kmod) > p1 + 200, 10, what="poller to carry veth again")
        assert kbp_threads() == [f"kbp/{POLL_CPU}:kbpva"]
    finally:
        stop(sender)


def test_netns_deletion_with_attached_devices(kmod, topo) -> None:
    """Deleting a netns: its veth is destroyed, its virtio NIC comes home; both detach."""
    sh("modprobe veth; ip netns add kbpdoomed; ip link add kbpdx type veth peer name kbpdy "
       "netns kbpdoomed")
    sh("ip addr add 198.18.102.1/24 dev kbpdx; ip link set kbpdx up")
    sh("ip addr add 198.18.102.2/24 dev kbpdy; ip link set kbpdy up; "
       "ethtool -K kbpdy gro on rx-udp-gro-forwarding on", ns="kbpdoomed")
    kmod.attach("kbpdy", netns="kbpdoomed", cpu=POLL_CPU, mode="hybrid")
    kmod.attach(topo.nic1, netns=NS, cpu=POLL_CPU, mode="hybrid")
    assert len(kmod.devices()) == 2
    from conftest import UDPFLOW
    s1 = spawn([*UDPFLOW, "send", "--to", "198.18.102.2:9", "--count", "0", "--rate", "500"])
    s2 = spawn([*UDPFLOW, "send", "--to", f"{topo.client_ip}:9", "--count", "0",
                "--rate", "500"])
    try:
        p0 = poller_packets(kmod)
        wait_for(lambda: poller_packets(kmod) > p0 + 200, 10, what="poller to carry both")
        sh("ip netns del kbpdoomed")
        sh(f"ip netns del {NS}")
        wait_for(lambda: not kmod.devices(), 30, what="both bindings to go with the netns")
        wait_for(lambda: Path(f"/sys/class/net/{topo.nic1}").exists(), 30,
                 what=f"{topo.nic1} to come back to the init netns")
    finally:
        stop(s1)
        stop(s2)
    t = build_topology()
    f = Flow(t)
    f.start_sink(expect=500)
    f.send(500, rate=1000)
    assert f.result()["unique"] == 500


@pytest.mark.parametrize("mode", MODES)
def test_rmmod_under_traffic(kmod, flow: Flow, mode: str) -> None:
    flow.start_sink(timeout=300)
    flow.start_sender(rate=1000)
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode=mode)
    p0 = poller_packets(kmod)
    wait_for(lambda: poller_packets(kmod) > p0 + 200, 10, what="poller to carry traffic")
    sh("rmmod kbp")
    try:
        assert not module_loaded()
        assert not kbp_threads()
        assert_stock_carries(flow)
    finally:
        load_module()


@pytest.mark.long   # make test: test_stress's ~90 detaches and attaches under traffic
def test_attach_detach_50_times_under_traffic(kmod, flow: Flow) -> None:
    flow.start_sink(timeout=600)
    flow.start_sender(rate=1000)
    for i in range(50):
        kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode=MODES[i % 2], linger_us=(i % 3) * 50)
        time.sleep(0.02)
        kmod.detach(flow.t.nic0)
    assert not kmod.devices()
    assert_stock_carries(flow)
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid")
    p0 = poller_packets(kmod)
    wait_for(lambda: poller_packets(kmod) > p0 + 200, 10, what="poller to carry traffic")


@pytest.mark.smoke
def test_driver_disable_enable_is_repaired(kmod, flow: Flow) -> None:
    """A driver's own napi_disable()/napi_enable() (ring resize) must not lose the NAPI."""
    cur = sh(f"ethtool -g {flow.t.nic0}", check=False).stdout
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid")
    r = sh(f"ethtool -G {flow.t.nic0} rx 128", check=False)
    if r.returncode != 0:
        pytest.skip(reason=f"virtio-net here cannot resize rings ({r.stderr.strip()}); "
                    f"ring settings: {cur!r}")
    flow.start_sink(timeout=300)
    flow.start_sender(rate=1000)
    if not has_napi_set_threaded(flow.t.nic0):
        # 7.2: napi_enable() sets THREADED itself from the config kbp claimed (design 7)
        wait_for(lambda: kmod.poller(POLL_CPU).repairs >= 1, 5,
                 what="the NAPI to be re-hooked")
    p0 = poller_packets(kmod)
    wait_for(lambda: poller_packets(kmod) > p0 + 200, 10, what="poller to carry traffic")
