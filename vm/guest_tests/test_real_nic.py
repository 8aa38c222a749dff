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
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import POLL_CPU, dmesg_lines, load_module, sh, wait_for
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


@pytest.mark.parametrize("mode", [pytest.param("hybrid", marks=pytest.mark.smoke),
                                  "busy", "periodic"])
def test_resets_without_rtnl_under_traffic(kmod, mode: str) -> None:
    """Every queue on one poller (resets_under_traffic())."""
    resets_under_traffic(kmod, cpu=POLL_CPU, mode=mode)


def test_resets_spread_over_pollers(kmod) -> None:
    """The queues on two pollers (queue map), so each poller's list empties and fills
    again at every reset."""
    resets_under_traffic(kmod, queue_map={0: 0, 1: 1, 2: 0, 3: 1}, mode="hybrid")


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
        finally:
            kill(hog)
        assert rc == 0
        assert len(back) == 8, f"NAPIs taken back: {back}"
        # the Python process's start under TCG with one usable vCPU is most of it
        # (test_detach_from_a_starved_poller_is_bounded); 8 x 5 s before
        assert took < 30, f"detach took {took:.1f} s for 8 NAPIs"
        time.sleep(1.0)
        assert_in_order(dev)
