"""What Linux 7.2 changed in the threaded-NAPI machinery kbp hooks into (design.md 7,
"Run-time differences"): the persistent per-NAPI config that napi_enable() applies, turning
threaded NAPI off stopping napi->thread, and per-NAPI "napi-set threaded" over netlink.

The ring-resize and threaded-off tests run on every kernel (what they check held before
7.2 too); the netlink ones need the netdev family's per-NAPI threaded attribute (6.17+).
On 7.2 each of them failed (or hung) before the fix it names.
"""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    POLL_CPU,
    Flow,
    dmesg_lines,
    dmesg_since,
    sh,
    threads_named,
    wait_for,
)
from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, genlmsg
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import GenericNetlinkSocket

KERNEL = tuple(int(x) for x in Path("/proc/sys/kernel/osrelease").read_text()
               .split("-")[0].split(".")[:2])


# -- the netdev generic netlink family (include/uapi/linux/netdev.h) ---------------------
NETDEV_CMD_NAPI_GET = 11
NETDEV_CMD_NAPI_SET = 14
THREADED = {"disabled": 0, "enabled": 1, "busy-poll": 2}


class netdevmsg(genlmsg):
    """NETDEV_A_NAPI_* (the napi attribute set; ids from the uapi enum)."""

    nla_map = (
        (0, "NETDEV_A_NAPI_UNSPEC", "none"),
        (1, "NETDEV_A_NAPI_IFINDEX", "uint32"),
        (2, "NETDEV_A_NAPI_ID", "uint32"),
        (3, "NETDEV_A_NAPI_IRQ", "uint32"),
        (4, "NETDEV_A_NAPI_PID", "uint32"),
        (5, "NETDEV_A_NAPI_DEFER_HARD_IRQS", "uint32"),
        (6, "NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT", "uint64"),
        (7, "NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT", "uint64"),
        (8, "NETDEV_A_NAPI_THREADED", "uint32"),
    )


@dataclass
class Napi:
    id: int
    pid: int          # napi->thread's pid, 0 without a thread
    threaded: int | None


def _netdev_request(cmd: int, attrs: list[list[Any]], dump: bool) -> list[Any]:
    sock = GenericNetlinkSocket(ext_ack=True)
    try:
        sock.bind("netdev", netdevmsg)
        m = netdevmsg()
        m["cmd"], m["version"], m["attrs"] = cmd, 1, attrs
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        return [r for r in sock.nlm_request(m, msg_type=sock.prid, msg_flags=flags)
                if r["header"]["type"] == sock.prid]
    finally:
        sock.close()


def napis_of(dev: str) -> list[Napi]:
    """napi-get of every NAPI of ``dev`` that has an id (virtio-net: the rx NAPIs)."""
    ifindex = int(Path(f"/sys/class/net/{dev}/ifindex").read_text())
    rs = _netdev_request(NETDEV_CMD_NAPI_GET, [["NETDEV_A_NAPI_IFINDEX", ifindex]], True)
    return [Napi(r.get_attr("NETDEV_A_NAPI_ID"), r.get_attr("NETDEV_A_NAPI_PID") or 0,
                 r.get_attr("NETDEV_A_NAPI_THREADED")) for r in rs]


def napi_set_threaded(napi_id: int, mode: str) -> None:
    _netdev_request(NETDEV_CMD_NAPI_SET, [["NETDEV_A_NAPI_ID", napi_id],
                                          ["NETDEV_A_NAPI_THREADED", THREADED[mode]]], False)


def has_napi_set_threaded(dev: str) -> bool:
    """The kernel has per-NAPI threaded state over netlink (napi-get reports it)."""
    try:
        return any(n.threaded is not None for n in napis_of(dev))
    except NetlinkError:
        return False


# -- helpers ---------------------------------------------------------------------------
def rx_ring(dev: str) -> int:
    out = sh(f"ethtool -g {dev}").stdout.split("Current hardware settings:")[1]
    return int(out.split("RX:")[1].split()[0])


def resize_rx_ring(dev: str, entries: int) -> None:
    """``ethtool -G`` on virtio-net: virtnet_rx_resize() disables the rx NAPI and enables
    it again (even where the device cannot resize rings: the error comes after that), so
    napi_enable() applies the NAPI's persistent config.  A hang fails here."""
    try:
        subprocess.run(["ethtool", "-G", dev, "rx", str(entries)], capture_output=True,
                       text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"ethtool -G {dev} rx {entries} hung (napi_enable() stopping "
                             f"the poller?)") from None


def carried_by_poller(flow: Flow, n: int = 100) -> None:
    """``n`` datagrams arrive, and the poller of POLL_CPU polled them."""
    from kbp import kmod
    before = kmod.poller(POLL_CPU).packets
    flow.start_sink(expect=n)
    flow.send(n, rate=200)
    assert flow.result()["unique"] == n
    assert kmod.poller(POLL_CPU).packets >= before + n, "traffic went around the poller"


def hooked(dev: str) -> bool:
    """Every NAPI of ``dev`` is attached to the poller of POLL_CPU (kbp's view)."""
    from kbp import kmod
    d = kmod.device(dev)
    p = kmod.poller(POLL_CPU)
    return bool(d and d.state == "active" and d.napi_count and p.pid and
                all(n.pid == p.pid for n in d.napis))


@pytest.fixture()
def threaded_off(flow: Flow) -> Iterator[Path]:
    f = Path(f"/sys/class/net/{flow.t.nic0}/threaded")
    yield f
    f.write_text("0\n")


# -- 1. napi_enable() applies the persistent config --------------------------------------
@pytest.mark.smoke
def test_ring_resize_of_an_attached_device(kmod, flow: Flow) -> None:
    """A disable/enable cycle of virtio-net's rx NAPI (``ethtool -G``) while attached.
    7.2 before the fix: napi_enable() -> napi_restore_config() -> napi_set_threaded(n,
    disabled) with our poller in napi->thread -> napi_stop_kthread() waits forever for a
    disabled NAPI (ethtool hangs holding rtnl).  Now the config says enabled while kbp
    holds the NAPI: no stop, no respawn, the poller keeps the device."""
    dev = flow.t.nic0
    size = rx_ring(dev)
    kmod.attach(dev, cpu=POLL_CPU, mode="hybrid")
    carried_by_poller(flow)
    p0 = kmod.poller(POLL_CPU)
    try:
        for entries in (size // 2, size):
            resize_rx_ring(dev, entries)
        wait_for(lambda: hooked(dev), 5, what="the NAPIs to stay with the poller")
        time.sleep(0.5)     # before 7.2 napi_enable() drops THREADED: reconcile repairs
        carried_by_poller(flow)
    finally:
        resize_rx_ring(dev, size)
    assert kmod.poller(POLL_CPU).respawns == p0.respawns, "the kernel stopped the poller"
    if has_napi_set_threaded(dev):
        # kbp claims the config while attached (napi-get: threaded enabled, kbp's pid) ...
        assert all(n.threaded == THREADED["enabled"] and n.pid == p0.pid
                   for n in napis_of(dev)), napis_of(dev)
    kmod.detach(dev)
    if has_napi_set_threaded(dev):
        # ... and puts back "disabled" on detach: the next napi_enable() starts no kthread
        assert all(n.threaded == THREADED["disabled"] and n.pid == 0 for n in napis_of(dev))
        resize_rx_ring(dev, size // 2)
        resize_rx_ring(dev, size)
        assert not threads_named(f"napi/{dev}-"), "detach left threaded mode in the config"


# -- 2. turning threaded NAPI off stops napi->thread (7.2) -------------------------------
@pytest.mark.smoke
def test_threaded_turned_off_while_attached(kmod, flow: Flow, threaded_off: Path) -> None:
    """sysfs threaded=0 on an attached device (already 0).  7.2 stops napi->thread of
    every NAPI: our shared poller, once per NAPI; it respawns, the kernel then clears
    napi->thread.  Before the fix the NAPIs stayed on softirq while kbp reported them
    attached; now the reconcile work hooks them again (``repairs``)."""
    dev = flow.t.nic0
    kmod.attach(dev, cpu=POLL_CPU, mode="busy")
    carried_by_poller(flow)
    p0 = kmod.poller(POLL_CPU)
    mark = len(dmesg_lines())
    threaded_off.write_text("0\n")
    wait_for(lambda: hooked(dev), 10, what="the NAPIs to be hooked again")
    carried_by_poller(flow)
    p1 = kmod.poller(POLL_CPU)
    if KERNEL >= (7, 0):
        nr = kmod.device(dev).napi_count
        assert p1.respawns - p0.respawns == nr, (p0, p1)
        assert p1.repairs - p0.repairs >= nr, (p0, p1)
        assert p1.pid != p0.pid
        assert any("hooked again" in ln for ln in dmesg_since(mark)), dmesg_since(mark)
    assert not threads_named(f"napi/{dev}-")


def test_threaded_off_then_on_while_attached(kmod, flow: Flow, threaded_off: Path) -> None:
    """threaded=0 then at once 1.  On 7.2, if the second write comes before the reconcile
    work hooked the NAPIs again (it is kicked by the respawns: either order happens), it
    gives the NAPIs the kernel's own kthreads while kbp still lists them: the poller must
    not poll them (one thread per NAPI), and the hand-back must neither clear their
    THREADED bits nor forget (leak) their kthreads.  Either way the device ends with the
    kernel's kthreads, which carry the traffic and stop when threaded is turned off."""
    dev = flow.t.nic0
    Path("/sys/module/kbp/parameters/reconcile_ms").write_text("2000\n")
    try:
        kmod.attach(dev, cpu=POLL_CPU, mode="busy")
        time.sleep(0.5)
        threaded_off.write_text("0\n")
        threaded_off.write_text("1\n")
        wait_for(lambda: kmod.device(dev).napi_count == 0, 10,
                 what="kbp to hand the NAPIs to threaded NAPI")
        kthreads = sorted(threads_named(f"napi/{dev}-"))
        assert kthreads, "no threaded-NAPI kthread"
        flow.start_sink(expect=200)
        flow.send(200, rate=200)
        assert flow.result()["unique"] == 200
        kmod.detach(dev)
        assert sorted(threads_named(f"napi/{dev}-")) == kthreads
        threaded_off.write_text("0\n")
        if KERNEL >= (6, 17):   # before, the kernel keeps them until the NAPI is deleted
            wait_for(lambda: not threads_named(f"napi/{dev}-"), 10,
                     what="the kernel to stop its NAPI kthreads (none leaked)")
    finally:
        Path("/sys/module/kbp/parameters/reconcile_ms").write_text("200\n")


# -- 3. netlink napi-set threaded (7.2) --------------------------------------------------
@pytest.fixture()
def rx_napi(flow: Flow) -> Iterator[int]:
    dev = flow.t.nic0
    if not has_napi_set_threaded(dev):
        pytest.skip(reason="no per-NAPI threaded state over netlink (6.17+)")
    yield napis_of(dev)[0].id
    for n in napis_of(dev):
        napi_set_threaded(n.id, "disabled")


def test_napi_set_threaded_disabled_while_attached(kmod, flow: Flow, rx_napi: int) -> None:
    """napi-set threaded disabled on an attached NAPI stops the poller without rtnl; the
    poller respawns and the reconcile work hooks the NAPI again."""
    dev = flow.t.nic0
    kmod.attach(dev, cpu=POLL_CPU, mode="hybrid")
    p0 = kmod.poller(POLL_CPU)
    napi_set_threaded(rx_napi, "disabled")
    wait_for(lambda: hooked(dev) and kmod.poller(POLL_CPU).repairs > p0.repairs, 10,
             what="the NAPI to be hooked again")
    p1 = kmod.poller(POLL_CPU)
    assert p1.respawns == p0.respawns + 1, (p0, p1)
    assert [n.threaded for n in napis_of(dev)] == [THREADED["enabled"]]
    carried_by_poller(flow)


def test_napi_set_threaded_busy_poll_while_attached(kmod, flow: Flow, rx_napi: int) -> None:
    """napi-set threaded busy-poll on an attached NAPI: kbp's poller does not busy poll
    that way, so the device goes back to the kernel, which starts the mode the config
    asks for at the NAPI's next enable.  Detach clears THREADED_BUSY_POLL with THREADED:
    napi-get does not report busy-poll for a NAPI on softirq."""
    dev = flow.t.nic0
    kmod.attach(dev, cpu=POLL_CPU, mode="hybrid")
    napi_set_threaded(rx_napi, "busy-poll")
    wait_for(lambda: kmod.device(dev).napi_count == 0, 10,
             what="kbp to hand the device back")
    assert kmod.device(dev).state == "standby"
    assert [(n.threaded, n.pid) for n in napis_of(dev)] == [(THREADED["disabled"], 0)]
    size = rx_ring(dev)
    resize_rx_ring(dev, size // 2)          # napi_enable() applies the config
    resize_rx_ring(dev, size)
    assert [n.threaded for n in napis_of(dev)] == [THREADED["busy-poll"]]
    assert threads_named(f"napi/{dev}-")
    flow.start_sink(expect=100)
    flow.send(100, rate=200)
    assert flow.result()["unique"] == 100
    kmod.detach(dev)


def test_napi_set_threaded_refused_kthread_on_attach(kmod, flow: Flow, rx_napi: int) -> None:
    """A NAPI with a kthread of its own from napi-set threaded enabled: attach refuses it
    (EBUSY), as for sysfs threaded."""
    dev = flow.t.nic0
    napi_set_threaded(rx_napi, "enabled")
    with pytest.raises(kmod.KbpError) as e:
        kmod.attach(dev, cpu=POLL_CPU, mode="hybrid")
    assert e.value.errno == errno.EBUSY
