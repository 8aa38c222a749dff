"""kbp against real-NIC behaviour, through the test NIC (vm/testdata/kbp_test_nic).

virtio-net and veth add and delete their NAPIs only under rtnl, one queue each.  The test
NIC does what ice, i40e, mlx5 and the tunnels do (its header says which mode imitates
which driver): several RX queues scheduled from hardIRQ on their own CPUs, NAPIs deleted
and freed by a reset from a workqueue without rtnl, ``ethtool -L`` under traffic, per-CPU
gro_cells NAPIs that must not be polled from another CPU.  Every frame carries its queue
and a sequence number, so a test can tell a lost or reordered packet from the driver's own
drops (frames still in a ring that a reset tore down).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import POLL_CPU, SPLAT, dmesg_lines, load_module, sh, wait_for
from test_bad_input import refused
from test_hardening import (
    DEFAULT_PRIO,
    RT_KERNEL,
    cpu_online,
    kill,
    no_rt_throttling,
    running_on,
    spin,
)
from test_kernel72 import napi_set_threaded, napis_of

__all__ = ["no_rt_throttling"]  # a fixture, used by name

KO = Path(os.environ.get("KBP_TEST_MODULES", "/nonexistent")) / "kbp_test_nic.ko"
DEV = "ktn0"
KERNEL = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
RECONCILE = Path("/sys/module/kbp/parameters/reconcile_ms")

pytestmark = pytest.mark.skipif(not KO.exists(), reason="kbp_test_nic.ko not built "
                                "(python3 -m vm test builds every vm/testdata module)")


@contextlib.contextmanager
def ktn_device(**params: object) -> Iterator[str]:
    """Load the test NIC with ``params``, bring it up; unload it (which unregisters it,
    and so detaches it) at the end."""
    args = " ".join(f"{k}={v}" for k, v in params.items())
    sh(f"insmod {KO} {args}")
    try:
        sh(f"ip link set {DEV} up")
        yield DEV
    finally:
        sh("rmmod kbp_test_nic", check=False)


PARAMS = Path("/sys/module/kbp_test_nic/parameters")


@contextlib.contextmanager
def ktn_ports(n: int, **params: object) -> Iterator[list[str]]:
    """Load the test NIC with ``n`` ports (one net_device each: the PFs of one adapter)
    and ``params`` for each, bring them up; unload it at the end."""
    args = " ".join(f"{k}={v}" for k, v in {"devices": n, **params}.items())
    sh(f"insmod {KO} {args}")
    devs = [f"ktn{i}" for i in range(n)]
    try:
        for d in devs:
            sh(f"ip link set {d} up")
        yield devs
    finally:
        sh("rmmod kbp_test_nic", check=False)


def adapter_reset(n: int, devs: list[str], timeout: float = 180) -> None:
    """``n`` resets of every port at once, each port's from its own work item without
    rtnl (ice's adapter-wide reset), waited for."""
    done = {d: stats(d)[0]["resets"] for d in devs}
    (PARAMS / "adapter_reset").write_text(str(n))
    wait_for(lambda: all(stats(d)[0]["resets"] >= done[d] + n for d in devs), timeout,
             step=0.2, what=f"{n} adapter-wide resets of {devs}")


@contextlib.contextmanager
def reconcile_every(ms: int) -> Iterator[None]:
    """kbp's reconcile work at another period (its module parameter), put back after."""
    old = RECONCILE.read_text().strip()
    RECONCILE.write_text(str(ms))
    try:
        yield
    finally:
        RECONCILE.write_text(old)


def stats(dev: str = DEV) -> tuple[dict[str, int], dict[int, dict[str, int]]]:
    """The test NIC's counters: the head line, and one dict per queue index used."""
    lines = Path(f"/sys/class/net/{dev}/ktn/stats").read_text().splitlines()

    def pairs(words: list[str]) -> dict[str, int]:
        return {k: int(v) for k, v in zip(words[::2], words[1::2], strict=True)}

    head = pairs(lines[0].split())
    queues = {int(w[0][1:]): pairs(w[1:]) for w in (ln.split() for ln in lines[1:])}
    return head, queues


def total(key: str, dev: str = DEV) -> int:
    return sum(q[key] for q in stats(dev)[1].values())


def reset(n: int, dev: str = DEV, timeout: float = 180) -> None:
    """``n`` resets from the driver's workqueue (no rtnl), waited for."""
    done = stats(dev)[0]["resets"]
    Path(f"/sys/class/net/{dev}/ktn/reset").write_text(str(n))
    wait_for(lambda: stats(dev)[0]["resets"] >= done + n, timeout, step=0.2,
             what=f"{n} resets of {dev}")


def assert_in_order(dev: str = DEV) -> None:
    """No frame reordered, and every gap is a frame the driver itself dropped at a
    teardown (the same sequence without kbp loses exactly those)."""
    _, qs = stats(dev)
    for i, q in qs.items():
        assert q["reorders"] == 0, f"queue {i}: {q}"
        assert q["gaps"] == q["ring_dropped"], f"queue {i}: lost frames: {q}"


def kbp_carries(dev: str = DEV, frames: int = 300, timeout: float = 30) -> None:
    k0 = total("by_kbp", dev)
    wait_for(lambda: total("by_kbp", dev) > k0 + frames, timeout,
             what=f"kbp's poller to carry {dev}'s frames")


def taken_back_since(t0: float) -> list[str]:
    """dmesg's "NAPI #i taken back" lines stamped after ``t0`` (CLOCK_MONOTONIC, as
    printk's stamps): the resets' lines may have wrapped the ring, so no line count."""
    return [ln for ln in dmesg_lines() if "taken back from kbp/" in ln and
            ln.startswith("[") and float(ln[1:ln.index("]")]) >= t0 - 1.0]


def kbp_polls_within(seconds: float, dev: str = DEV) -> bool:
    k0 = total("by_kbp", dev)
    time.sleep(seconds)
    return total("by_kbp", dev) > k0


def hooked(kmod, dev: str, nr: int) -> bool:
    d = kmod.device(dev)
    return d is not None and d.state == "active" and len(d.napis) == nr


# -- per-CPU NAPIs (gro_cells: vxlan, geneve, gre, ipip, ip6tnl) -------------------------
def test_per_cpu_napis_are_refused(kmod) -> None:
    """A device whose every NAPI is per-CPU (NAPI_STATE_NO_BUSY_POLL, fed without a lock
    on its own CPU) is refused with the reason; before, kbp polled CPU 0's cell from
    CPU 1 while CPU 0 queued into it."""
    with ktn_device(percpu=1, rate=2000) as dev:
        refused(kmod, errno.EOPNOTSUPP, "per-CPU",
                lambda: kmod.attach(dev, cpu=POLL_CPU, mode="hybrid"))
        time.sleep(1.0)
        _, qs = stats(dev)
        assert all(q["gaps"] == 0 and q["reorders"] == 0 for q in qs.values()), qs
        assert total("by_kbp", dev) == 0


# -- resets without rtnl (ice, igc, ixgbe) ---------------------------------------------
def resets_under_traffic(kmod, **attach: object) -> None:
    """100 resets that napi_disable(), netif_napi_del() and kfree() every queue vector
    from a workqueue, without rtnl, while 4 queues on 2 CPUs carry traffic and kbp's
    reconcile work runs every 10 ms: no splat (slub_debug on the debug flavour), no hang,
    the new NAPIs are served again, no frame lost or reordered beyond the driver's own
    drops."""
    with reconcile_every(10), ktn_device(queues=4, cpus="0,1,0,1", rate=2000) as dev:
        kmod.attach(dev, **attach)
        wait_for(lambda: hooked(kmod, dev, 4), 10, what="4 NAPIs hooked")
        kbp_carries(dev)
        reset(100, dev)
        wait_for(lambda: hooked(kmod, dev, 4), 20, what="the new NAPIs hooked again")
        kbp_carries(dev)
        assert_in_order(dev)
        assert stats(dev)[0]["resets"] >= 100


# busy is long: the stress test's resets (hybrid, both classes, folded and spread) and the
# hybrid and periodic runs here cover the reset path in make test
@pytest.mark.parametrize("mode", [pytest.param("hybrid", marks=pytest.mark.smoke),
                                  pytest.param("busy", marks=pytest.mark.long), "periodic"])
def test_resets_without_rtnl_under_traffic(kmod, mode: str) -> None:
    """Every queue on one poller (resets_under_traffic())."""
    resets_under_traffic(kmod, cpu=POLL_CPU, mode=mode)


@pytest.mark.long   # make test: test_stress attaches by queue map over both CPUs, then resets
def test_resets_spread_over_pollers(kmod) -> None:
    """The queues on two pollers (queue map), so each poller's list empties and fills
    again at every reset."""
    resets_under_traffic(kmod, queue_map={0: 0, 1: 1, 2: 0, 3: 1}, mode="hybrid")


# -- several ports on one CPU: one poller thread each -----------------------------------
def pollers_of(kmod, cpu: int) -> dict[str, object]:
    """The rt pollers of ``cpu`` by the device each serves."""
    return {p.ifname: p for p in kmod.pollers() if p.cpu == cpu and p.cls == "rt"}


@pytest.mark.timeout(300)
def test_adapter_wide_reset_of_ports_on_one_cpu(kmod) -> None:
    """Two ports of one adapter folded onto one CPU, reset 60 times at once, each port from
    its own work item without rtnl (ice), under traffic with the reconcile work every
    10 ms.  Before, both ports' NAPIs pointed at one poller thread, and two deleters
    stopped it at once: the second kthread_stop() waited for an exit that had already
    been taken (a reset work hung for good), or a respawn rewrote the other port's
    napi->thread under its deleter.  Now each port has its own poller thread on the CPU,
    whose every stopper holds that port's locks: the resets all finish, the ports are
    served again, nothing lost or reordered, and the two pollers took turns."""
    cpus = ",".join([str(POLL_CPU)] * 2)
    with reconcile_every(10), ktn_ports(2, queues=2, cpus=cpus, rate=2000) as devs:
        for d in devs:
            kmod.attach(d, cpu=POLL_CPU, mode="hybrid")
        for d in devs:
            wait_for(lambda d=d: hooked(kmod, d, 2), 10, what=f"{d}'s NAPIs hooked")
            kbp_carries(d)
        adapter_reset(60, devs)
        for d in devs:
            wait_for(lambda d=d: hooked(kmod, d, 2), 20, what=f"{d} hooked again")
            kbp_carries(d)
            assert_in_order(d)
        ps = pollers_of(kmod, POLL_CPU)
        assert sorted(ps) == devs and len({p.pid for p in ps.values()}) == 2, ps
        # the resets' deleters did stop our threads (they respawned).  Not "60 each": a
        # reset that finds the port's new NAPIs not yet hooked again stops no poller, and a
        # poller a reset left without NAPIs may be stopped by the reconcile work and a new
        # one (its count from 0) serve the port (CI 2026-11-29, one port below 60)
        assert sum(p.respawns or 0 for p in ps.values()) > 0, ps


@pytest.mark.smoke
def test_ports_on_one_cpu_take_turns(kmod) -> None:
    """Two ports on one CPU, each with its own poller there (one per device), both under
    load: each poller carries its own port's frames, and both progress (they give the CPU
    to each other pass by pass: a SCHED_FIFO poller with work is otherwise not preempted by
    its equal-priority sibling).  Detach of one leaves the other's poller running."""
    cpus = ",".join([str(POLL_CPU)] * 2)
    with ktn_ports(2, queues=2, cpus=cpus, rate=4000, cost_ns=20000) as devs:
        for d in devs:
            kmod.attach(d, cpu=POLL_CPU, mode="hybrid", rt_prio=DEFAULT_PRIO)
        for d in devs:
            wait_for(lambda d=d: hooked(kmod, d, 2), 10, what=f"{d}'s NAPIs hooked")
        k0 = {d: total("by_kbp", d) for d in devs}
        time.sleep(2.0)
        got = {d: total("by_kbp", d) - k0[d] for d in devs}
        assert all(n > 1000 for n in got.values()), got
        ps = pollers_of(kmod, POLL_CPU)
        assert {d: p.napis for d, p in ps.items()} == {d: 2 for d in devs}, ps
        assert all(p.packets for p in ps.values()), ps
        threads = {Path(f"/proc/{p.pid}/comm").read_text().strip() for p in ps.values()}
        assert threads == {f"kbp/{POLL_CPU}:{d}" for d in devs}, threads
        kmod.detach(devs[0])
        # the stopped one is listed (its device None) until its thread has exited
        wait_for(lambda: set(pollers_of(kmod, POLL_CPU)) == {devs[1]}, 10,
                 what=f"{devs[0]}'s poller to stop")
        kbp_carries(devs[1])
        for d in devs:
            assert_in_order(d)


# -- NAPI identity: RX queues, TX-only NAPIs not counted -------------------------------------
def test_rx_queues_numbered_without_tx_napis(kmod) -> None:
    """A driver that adds rx0, tx0, rx1, tx1 (virtio-net) and does not say which RX queue
    each NAPI serves (Debian 12's virtio-net): ``kbpctl enable --cpus A,B`` puts RX queue 0
    on CPU A and RX queue 1 on CPU B, its status says so, and each queue's frames are
    polled there.  Before, the module numbered NAPIs in add order with the TX-only ones:
    RX queue 1 was #2, not in kbpctl's map {0: A, 1: B}, and fell back to CPU A while
    kbpctl printed "2 NAPIs on CPU A-B".  A map naming a NAPI the device does not have is
    refused."""
    from test_kbpctl_kmod import kbpctl
    other = 1 - POLL_CPU
    with ktn_device(queues=2, cpus=f"{other},{POLL_CPU}", rate=2000, tx_napi=1,
                    queue_napi=0) as dev:
        out = kbpctl("enable", dev, "--backend", "kmod", "--cpus", f"{other},{POLL_CPU}",
                     "--rt-prio", "0").stdout
        try:
            want = {0: other, 1: POLL_CPU}
            assert {n.index: n.cpu for n in kmod.device(dev).napis} == want
            kbp_carries(dev)
            time.sleep(0.5)
            qs = stats(dev)[1]
            assert {i: qs[i]["rx_cpu"] for i in (0, 1)} == want, qs
            assert all(qs[i]["by_kbp"] for i in (0, 1)), qs
            st = json.loads(kbpctl("status", "--json").stdout)
            d = next(x for x in st["devices"] if x["name"] == dev)
            assert {n["index"]: n["cpu"] for n in d["napis"]} == want, d
            assert not d["problems"], d["problems"]
            assert f"CPU {other}-{POLL_CPU}" in out or f"CPU {min(want.values())}" in out, out
        finally:
            kbpctl("disable", dev)
        refused(kmod, errno.EINVAL, "#2", lambda: kmod.attach(
            dev, queue_map={0: other, 2: POLL_CPU}, mode="hybrid"))


MQ_MAC = os.environ.get("KBP_MQ_MAC")


def nic_by_mac(mac: str) -> str:
    for d in Path("/sys/class/net").iterdir():
        with contextlib.suppress(OSError):
            if (d / "address").read_text().strip() == mac:
                return d.name
    raise AssertionError(f"no NIC with MAC {mac}")


def queue_irqs(nic: str) -> dict[int, int]:
    """virtioN-input.Q's interrupt of each RX queue Q of a virtio NIC."""
    from conftest import virtio_name
    prefix, out = virtio_name(nic) + "-input.", {}
    for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
        parts = line.split()
        if parts and parts[0].rstrip(":").isdigit() and parts[-1].startswith(prefix):
            out[int(parts[-1][len(prefix):])] = int(parts[0].rstrip(":"))
    return out


def syns_from(cpu: int, host: str, ports: range) -> None:
    """TCP SYNs to closed ports of ``host`` from a sender pinned to ``cpu``: they leave on
    that CPU's TX queue and their RSTs come back on the paired RX queue."""
    code = "\n".join([
        "import socket",
        f"for p in range({ports.start}, {ports.stop}):",
        "    s = socket.socket(); s.settimeout(0.5)",
        "    try:",
        f"        s.connect(({host!r}, p))",
        "    except OSError:",
        "        pass",
        "    s.close()"])
    subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", code], check=True,
                   timeout=120)


@pytest.mark.skipif(not MQ_MAC, reason="no multi-queue virtio-net NIC in this boot "
                    "(python3 -m vm test --mq-nic; make test's 6.12 run has it)")
def test_multiqueue_virtio_net_queues_served_where_asked(kmod) -> None:
    """A real multi-queue virtio-net (QEMU mq=on on a multi-queue tap), queue 0's
    interrupt on CPU 0 and queue 1's on CPU 1, ``kbpctl enable --cpus 0,1``: RX queue 0 is
    polled by the poller of CPU 0 and RX queue 1 by CPU 1's, as kbpctl says.  Before (the
    issue's run on 6.12, where virtio-net does not link queues to NAPIs), kbpctl printed
    "2 NAPIs on CPU 0-1" while both RX NAPIs were on CPU 0: the module counted the TX
    NAPIs in add order (rx0 = #0, tx0 = #1, rx1 = #2), so RX queue 1 was not in the map."""
    from conftest import park_mq_nic
    from test_kbpctl_kmod import kbpctl
    nic = nic_by_mac(MQ_MAC)
    host, guest = os.environ["KBP_MQ_HOST_IP"], os.environ["KBP_MQ_GUEST_IP"]
    sh(f"ip link set {nic} up; ip addr add {guest}/{os.environ['KBP_MQ_PREFIX']} dev {nic}")
    try:
        sh(f"ethtool -L {nic} combined 2")
        irqs = queue_irqs(nic)
        assert sorted(irqs) == [0, 1], irqs
        for q, irq in irqs.items():
            Path(f"/proc/irq/{irq}/smp_affinity_list").write_text(str(q))
        wait_for(lambda: subprocess.run(["ping", "-c", "1", "-W", "1", host],
                                        capture_output=True).returncode == 0, 30,
                 what="the tap's host end")
        out = kbpctl("enable", nic, "--backend", "kmod", "--cpus", "0,1",
                     "--rt-prio", "0").stdout
        try:
            assert "2 NAPIs on CPU 0-1" in out, out
            d = kmod.device(nic)
            assert {n.index: n.cpu for n in d.napis} == {0: 0, 1: 1}, d.napis
            before = {n.index: n.packets for n in d.napis}
            for cpu in (0, 1):
                syns_from(cpu, host, range(20000 + 100 * cpu, 20040 + 100 * cpu))
            after = {n.index: n.packets for n in kmod.device(nic).napis}
            assert all(after[q] > before[q] for q in (0, 1)), (before, after)
            pollers = {p.cpu: p for p in kmod.pollers() if p.ifname == nic}
            assert sorted(pollers) == [0, 1] and all(p.packets for p in pollers.values())
            st = json.loads(kbpctl("status", "--json").stdout)
            ds = next(x for x in st["devices"] if x["name"] == nic)
            assert {n["index"]: n["cpu"] for n in ds["napis"]} == {0: 0, 1: 1}, ds
            assert not ds["problems"], ds["problems"]
        finally:
            kbpctl("disable", nic)
    finally:
        sh(f"ip addr flush dev {nic}; ip link set {nic} down", check=False)
        park_mq_nic()


# -- ethtool -L under traffic (mlx4, i40e, virtio-net) -----------------------------------
@pytest.mark.smoke
def test_channel_changes_under_traffic(kmod) -> None:
    """Queues go 4 -> 2 -> 6 -> 4 under rtnl while traffic flows: every NAPI the driver
    adds again is served, the queue map's CPUs are kept, nothing lost beyond the driver's
    drops."""
    with ktn_device(queues=4, cpus="0,1,0,1,0,1", rate=2000) as dev:
        kmod.attach(dev, cpu=POLL_CPU, mode="hybrid")
        kbp_carries(dev)
        for n in (2, 6, 4):
            sh(f"ethtool -L {dev} combined {n}")
            wait_for(lambda n=n: hooked(kmod, dev, n), 20, what=f"{n} NAPIs hooked")
            kbp_carries(dev)
        assert {x.cpu for x in kmod.device(dev).napis} == {POLL_CPU}
        assert_in_order(dev)


# -- queue maps name RX queues, not list positions (item 7) -------------------------------
@pytest.mark.skipif(KERNEL < (6, 10), reason="netif_queue_set_napi() (the RX queue a NAPI "
                    "serves) is 6.10+; before, a NAPI's index is its place in add order")
def test_queue_map_names_rx_queues(kmod) -> None:
    """The driver adds its NAPIs last queue first (their list order is not their
    queues'; 6.18+ sorts the list by NAPI id anyway): the queue map's entry 0 is RX queue
    0, whose frames kbp/POLL_CPU polls, before and after ethtool -L takes the queues away
    and gives them back.  Before, entry 0 was the first NAPI on the list: queue 3's."""
    other = 1 - POLL_CPU
    qmap = {0: POLL_CPU, 1: other, 2: other, 3: other}
    with ktn_device(queues=4, cpus="0,1,0,1", rate=2000, reverse=1) as dev:
        kmod.attach(dev, queue_map=qmap, mode="hybrid")
        for n in (4, 2, 4):
            sh(f"ethtool -L {dev} combined {n}")
            wait_for(lambda n=n: hooked(kmod, dev, n), 20, what=f"{n} NAPIs hooked")
            kbp_carries(dev)
            time.sleep(0.5)
            qs = stats(dev)[1]
            assert {i: qs[i]["rx_cpu"] for i in range(n)} == \
                {i: qmap[i] for i in range(n)}, qs
            assert {x.index: x.cpu for x in kmod.device(dev).napis} == \
                {i: qmap[i] for i in range(n)}
        assert_in_order(dev)


# -- 7.2: a NAPI deleted while the kernel had stopped kbp's thread on it ----------------
@pytest.mark.smoke     # make test runs 7.2 and 7.2-rt with the smoke tests only
@pytest.mark.skipif(KERNEL < (6, 17), reason="napi_stop_kthread() (threaded off stops "
                    "napi->thread and leaves it NULL) and per-NAPI napi-set are 6.17+; "
                    "before, threaded off only clears NAPI_STATE_THREADED")
def test_napi_deleted_after_threaded_off(kmod) -> None:
    """napi-set threaded disabled stops the poller on every NAPI and leaves napi->thread
    NULL; the driver then deletes and frees those NAPIs (a reset, no rtnl) before the
    reconcile work can hook them again (kbp_test_rtnl holds rtnl meanwhile).  Before, the
    links stayed on the poller's list: it polled freed NAPIs, and periodic's round end
    read the freed NAPI's ->dev (a GPF with slub_debug); now the respawn takes them off."""
    rtnl_ko = KO.parent / "kbp_test_rtnl.ko"
    with reconcile_every(60000), ktn_device(queues=4, cpus="1,1,1,1", rate=2000,
                                             queue_napi=0) as dev:
        kmod.attach(dev, cpu=POLL_CPU, mode="periodic", round_ms=10, netap=1)
        kbp_carries(dev)
        ids = [n.id for n in napis_of(dev)]
        assert len(ids) == 4, ids
        mark = len(dmesg_lines())
        holder = subprocess.Popen(["insmod", str(rtnl_ko), "before_ms=5000", "after_ms=0"])
        try:
            wait_for(lambda: any("kbp_test_rtnl: holding rtnl" in ln
                                 for ln in dmesg_lines()[mark:]), 10, what="rtnl held")
            for i in ids:
                napi_set_threaded(i, "disabled")
            reset(1, dev)
            time.sleep(0.5)     # 50 periodic rounds
            stale = kmod.poller(POLL_CPU).napis
        finally:
            holder.wait(timeout=60)
            sh("rmmod kbp_test_rtnl", check=False)
        assert stale == 0, f"{stale} links to deleted NAPIs left on the poller"
        wait_for(lambda: hooked(kmod, dev, 4), 20, what="the new NAPIs hooked")
        kbp_carries(dev)
        assert_in_order(dev)


@pytest.mark.smoke     # make test runs 7.2 and 7.2-rt with the smoke tests only
@pytest.mark.timeout(300)
@pytest.mark.skipif(KERNEL < (6, 17), reason="napi_stop_kthread() (threaded off stops "
                    "napi->thread) and per-NAPI napi-set are 6.17+")
def test_napi_set_threaded_off_on_two_ports_at_once(kmod) -> None:
    """Two ports on one CPU; two threads turn threaded NAPI off with netlink napi-set on
    every NAPI of one port each, at the same time, ten times (the reconcile work hooks
    them again in between).  Each napi_stop_kthread() holds only its own port's instance
    lock.  Before, both ports' NAPIs pointed at one poller thread: both stoppers stopped
    it (the second kthread_stop() waited for good, or, reading napi->thread again after
    its wait, found the NULL the respawn had written there: kthread_stop(NULL)), and the
    respawn rewrote the other port's NAPIs without that port's lock.  Now each port's
    stops stop its own poller's thread."""
    import threading
    cpus = ",".join([str(POLL_CPU)] * 2)
    with reconcile_every(20), ktn_ports(2, queues=2, cpus=cpus, rate=2000) as devs:
        for d in devs:
            kmod.attach(d, cpu=POLL_CPU, mode="hybrid")
        for d in devs:
            wait_for(lambda d=d: hooked(kmod, d, 2), 10, what=f"{d}'s NAPIs hooked")
        errors: list[BaseException] = []

        def threaded_off(dev: str) -> None:
            try:
                for n in napis_of(dev):
                    napi_set_threaded(n.id, "disabled")
            except BaseException as e:   # reported by the main thread
                errors.append(e)
        for _ in range(10):
            ts = [threading.Thread(target=threaded_off, args=(d,)) for d in devs]
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in ts), "napi-set threaded disabled hung"
            assert not errors, errors
            for d in devs:
                wait_for(lambda d=d: hooked(kmod, d, 2) and all(
                    n.pid for n in napis_of(d)), 20, what=f"{d} hooked again")
        for d in devs:
            kbp_carries(d)
            assert_in_order(d)


# -- 7.x: drivers with instance-lock ops (mlx5, bnxt, gve, fbnic) ------------------------
@pytest.mark.skipif(KERNEL < (6, 15), reason="request_ops_lock (drivers whose ops run "
                    "under the instance lock) is 6.15+")
@pytest.mark.parametrize("mode", [pytest.param("hybrid", marks=pytest.mark.smoke),
                                  "periodic"])
def test_ops_locked_driver(kmod, mode: str) -> None:
    """A driver that asks for the instance lock (its NETDEV_UP and GOING_DOWN come with
    that lock held, its NAPIs change under it): attached instead of refused, served through
    ethtool -L, resets and a down/up, detached cleanly."""
    with ktn_device(queues=2, cpus="0,1", rate=2000, ops_lock=1) as dev:
        kmod.attach(dev, cpu=POLL_CPU, mode=mode)
        wait_for(lambda: hooked(kmod, dev, 2), 10, what="2 NAPIs hooked")
        kbp_carries(dev)
        sh(f"ethtool -L {dev} combined 3")
        wait_for(lambda: hooked(kmod, dev, 3), 20, what="3 NAPIs hooked")
        kbp_carries(dev)
        reset(20, dev)
        wait_for(lambda: hooked(kmod, dev, 3), 20, what="the NAPIs hooked again")
        kbp_carries(dev)
        sh(f"ip link set {dev} down")
        wait_for(lambda: kmod.device(dev).state == "standby", 10, what="standby while down")
        sh(f"ip link set {dev} up")
        wait_for(lambda: hooked(kmod, dev, 3), 20, what="attached again when up")
        kbp_carries(dev)
        assert_in_order(dev)
        kmod.detach(dev)
        k0 = total("by_kbp", dev)
        d0 = total("delivered", dev)
        wait_for(lambda: total("delivered", dev) > d0 + 300, 20, what="the kernel to carry")
        assert total("by_kbp", dev) == k0


TRACING = Path("/sys/kernel/tracing")


def kallsyms(name: str) -> str:
    """The address of a kernel or module symbol, as %ps prints one it cannot resolve."""
    for line in Path("/proc/kallsyms").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == name:
            return "0x" + parts[0].lstrip("0")
    raise AssertionError(f"no symbol {name} in /proc/kallsyms")


@contextlib.contextmanager
def queued_work() -> Iterator[list[str]]:
    """The workqueue_queue_work events of the block (filled in at its end)."""
    if not (TRACING / "trace").exists():
        sh(f"mount -t tracefs nodev {TRACING}", check=False)
    ev = TRACING / "events/workqueue/workqueue_queue_work/enable"
    if not ev.exists():
        pytest.skip(reason="no workqueue_queue_work tracepoint in this kernel")
    (TRACING / "trace").write_text("")
    ev.write_text("1")
    out: list[str] = []
    try:
        yield out
    finally:
        ev.write_text("0")
        out += (TRACING / "trace").read_text().splitlines()


@pytest.mark.smoke
@pytest.mark.skipif(KERNEL < (6, 15), reason="request_ops_lock (drivers whose ops run "
                    "under the instance lock) is 6.15+")
def test_rmmod_with_an_ops_locked_device_up(kmod) -> None:
    """rmmod kbp while a device whose driver asks for the instance lock is up.  Unloading
    unregisters the netdevice notifier, which replays NETDEV_GOING_DOWN for every device
    that is up; for such a device kbp's notifier kicks the reconcile work.  Before, exit
    had already cancelled that work: it was queued again into a module on its way out
    (seen here as a workqueue_queue_work event of kbp_reconcile_fn during the rmmod; it
    ran in freed memory when it waited longer than the unload, for rtnl say).  Now exit
    unregisters its notifier and CPU callbacks first, waits for every poller thread, and
    only then cancels the work, and nothing queues it once unloading has begun."""
    with ktn_device(queues=2, cpus="0,1", rate=1000, ops_lock=1) as dev:
        kmod.attach(dev, cpu=POLL_CPU, mode="hybrid")
        wait_for(lambda: hooked(kmod, dev, 2), 10, what="2 NAPIs hooked")
        kbp_carries(dev)
        fn = kallsyms("kbp_reconcile_fn")
        # the periodic reconcile: re-armed at 60 s by its next run, so no timer of its own
        # queues it during the rmmod (the module loads again with the default)
        RECONCILE.write_text("60000")
        time.sleep(0.5)
        mark = len(dmesg_lines())
        try:
            with queued_work() as events:
                sh("rmmod kbp")
            late = [e for e in events if f"function={fn}" in e or
                    "function=kbp_reconcile_fn" in e]
            assert not late, late
            time.sleep(0.5)
            splats = [ln for ln in dmesg_lines()[mark:] if SPLAT.search(ln)]
            assert not splats, splats
            s0 = total("by_softirq", dev)
            wait_for(lambda: total("by_softirq", dev) > s0 + 300, 20,
                     what="the kernel to carry it after rmmod")
            assert_in_order(dev)
        finally:
            load_module()


# -- hotplug and rmmod while traffic flows ----------------------------------------------
def test_cpu_offline_under_traffic(kmod) -> None:
    """4 queues on two pollers; CPU 1 goes offline (its queues' "interrupts" move with
    their timers): the whole device goes back to the kernel (design.md §8), no frame lost;
    online again, it is attached again as configured."""
    if not Path(f"/sys/devices/system/cpu/cpu{POLL_CPU}/online").exists():
        pytest.skip(reason=f"CPU {POLL_CPU} cannot be offlined in this guest")
    other = 1 - POLL_CPU
    qmap = {0: other, 1: POLL_CPU, 2: other, 3: POLL_CPU}
    with ktn_device(queues=4, cpus="0,1,0,1", rate=2000) as dev:
        kmod.attach(dev, queue_map=qmap, mode="hybrid")
        kbp_carries(dev)
        cpu_online(POLL_CPU, False)
        try:
            wait_for(lambda: kmod.device(dev).napi_count == 0, 10,
                     what="the device handed back")
            s0 = total("by_softirq", dev)
            wait_for(lambda: total("by_softirq", dev) > s0 + 300, 20,
                     what="the kernel to carry it while the CPU is offline")
        finally:
            cpu_online(POLL_CPU, True)
        wait_for(lambda: hooked(kmod, dev, 4), 20, what="attached again")
        assert {x.index: x.cpu for x in kmod.device(dev).napis} == qmap
        kbp_carries(dev)
        assert_in_order(dev)


def rmmod_hands_back(dev: str) -> None:
    """rmmod kbp under traffic: the kernel carries ``dev`` after it, nothing lost or
    reordered; the module is loaded again whatever happens."""
    try:
        sh("rmmod kbp")
        s0 = total("by_softirq", dev)
        wait_for(lambda: total("by_softirq", dev) > s0 + 300, 20,
                 what="the kernel to carry it after rmmod")
        assert_in_order(dev)
    finally:
        load_module()


def test_rmmod_under_traffic(kmod) -> None:
    """rmmod kbp while 4 queues flow through two pollers: every NAPI goes back to the
    kernel, no frame lost or reordered, the module loads again."""
    with ktn_device(queues=4, cpus="0,1,0,1", rate=2000) as dev:
        kmod.attach(dev, queue_map={0: 0, 1: 1, 2: 0, 3: 1}, mode="busy")
        kbp_carries(dev)
        rmmod_hands_back(dev)


# -- kbp stops a poller whose thread a deletion is stopping -------------------------------
@pytest.mark.timeout(180)
@pytest.mark.skipif(RT_KERNEL, reason="PREEMPT_RT: a FIFO-99 hog starves rcuc/N too "
                    "(see test_detach_from_a_starved_poller_is_bounded)")
@pytest.mark.skipif(KERNEL < (6, 2), reason="before 6.2 softirqs raised while ksoftirqd/N "
                    "is runnable wait for it (see test_detach_from_a_starved_poller_is_bounded)")
@pytest.mark.skipif(KERNEL >= (6, 14), reason="from 6.14 a deletion holds the instance lock "
                    "kbp's detach takes: it cannot overlap one")
def test_detach_while_a_reset_stops_the_poller(kmod, no_rt_throttling: None) -> None:
    """A reset without rtnl deletes the port's NAPI and kthread_stop()s the poller's
    thread, which cannot run (SCHED_FIFO 50 under a FIFO-99 hog on its CPU, RT throttling
    off: a SCHED_OTHER thread would still get 6.12's fair-server share), so the stop
    waits; meanwhile the port is detached, which empties the poller and stops it.  Before,
    the detach kthread_stop()ped the same thread (rtnl held): the thread's one exit
    released one of the two stoppers and the other waited for good (the detach under
    rtnl, or the reset work).  Now kbp stops its threads by asking them to exit and waits
    for nothing: the detach returns at once, and when the hog ends the thread exits once
    for both."""
    with ktn_device(queues=1, cpus=str(POLL_CPU), rate=0, queue_napi=0) as dev:
        kmod.attach(dev, cpu=POLL_CPU, mode="hybrid", rt_prio=DEFAULT_PRIO)
        wait_for(lambda: hooked(kmod, dev, 1), 10, what="the NAPI hooked")
        hog = spin(POLL_CPU, fifo=99)
        det = None
        try:
            wait_for(lambda: running_on(hog, POLL_CPU), 30, what="the FIFO-99 hog to run")
            Path(f"/sys/class/net/{dev}/ktn/reset").write_text("1")
            time.sleep(1.0)     # the reset's kthread_stop() now waits for the thread
            det = subprocess.Popen([sys.executable, "-c",
                                    f"from kbp import kmod; kmod.detach({dev!r})"])
            try:
                rc = det.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
        finally:
            kill(hog)
        if rc is None:
            det.wait(timeout=60)    # before: a stopper never returns; the test's timeout
            raise AssertionError("detach did not return in 30 s while a reset stopped "
                                 "the poller")
        assert rc == 0
        wait_for(lambda: stats(dev)[0]["resets"] >= 1, 30, what="the reset to finish")
        wait_for(lambda: not kmod.pollers(), 10, what="the poller to be gone")


# -- a starved poller: the detach bound is per device -----------------------------------
@pytest.mark.skipif(RT_KERNEL, reason="PREEMPT_RT: a FIFO-99 hog starves rcuc/N too "
                    "(see test_detach_from_a_starved_poller_is_bounded)")
@pytest.mark.skipif(KERNEL < (6, 2), reason="before 6.2 softirqs raised while ksoftirqd/N "
                    "is runnable wait for it (see test_detach_from_a_starved_poller_is_bounded)")
def test_detach_of_many_napis_from_a_starved_poller_is_bounded(
        kmod, no_rt_throttling: None) -> None:
    """8 NAPIs on one poller that a FIFO-99 hog starves: detach takes them all back
    within one 5 s bound, not 5 s each (40 s under rtnl before)."""
    with ktn_device(queues=8, cpus=",".join([str(POLL_CPU)] * 8), rate=2000) as dev:
        kmod.attach(dev, cpu=POLL_CPU, mode="busy", rt_prio=DEFAULT_PRIO)
        kbp_carries(dev)
        hog = spin(POLL_CPU, fifo=99)
        try:
            wait_for(lambda: running_on(hog, POLL_CPU), 30, what="the FIFO-99 hog to run")
            wait_for(lambda: not kbp_polls_within(1.0, dev), 20,
                     what="the hog to starve the poller")
            t0 = time.monotonic()
            det = subprocess.Popen([sys.executable, "-c",
                                    f"from kbp import kmod; kmod.detach({dev!r})"])
            try:
                rc = det.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill(hog)
                det.wait(timeout=120)
                raise AssertionError("detach did not return in 60 s") from None
            took = time.monotonic() - t0
            back = taken_back_since(t0)
            # stopped, but listed until its thread runs and exits: the module says why
            stuck = [p.state for p in kmod.pollers() if p.cpu == POLL_CPU]
        finally:
            kill(hog)
        assert rc == 0
        assert len(back) == 8, f"NAPIs taken back: {back}"
        assert stuck == ["stuck"], stuck
        # the Python process's start under TCG with one usable vCPU is most of it
        # (test_detach_from_a_starved_poller_is_bounded); 8 x 5 s before
        assert took < 30, f"detach took {took:.1f} s for 8 NAPIs"
        time.sleep(1.0)
        assert_in_order(dev)
