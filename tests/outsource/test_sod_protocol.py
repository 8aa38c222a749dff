"""kbp-sod's transport: the ABI layout, the ivshmem server protocol, attach, doorbells and
interrupts (docs/design.md 11.3-11.5).  No network traffic."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from . import sodclient as sc
from .conftest import SOD_DIR, Sod


def test_abi_layout_matches_the_c_header(sod_bin: Path) -> None:
    out = subprocess.run([str(SOD_DIR / "abi_dump")], capture_output=True, text=True,
                         check=True).stdout
    c = {k: tuple(v) for k, v in json.loads(out).items()}
    py: dict[str, tuple[int, int]] = {}
    for name, (off, fmt) in sc.H.items():
        py[f"kbp_so_header.{name}"] = (off, sc.struct.calcsize(fmt))
    for name, (off, fmt) in sc.Q.items():
        py[f"kbp_so_queue_ctl.{name}"] = (off, sc.struct.calcsize(fmt))
    for name, off in sc.SQE_OFF.items():
        assert c[f"kbp_so_sqe.{name}"][0] == off, name
    for name, off in sc.CQE_OFF.items():
        assert c[f"kbp_so_cqe.{name}"][0] == off, name
    for name, off in sc.ADDR_OFF.items():
        assert c[f"kbp_so_addr.{name}"][0] == off, name
    for key, val in py.items():
        assert c[key] == val, key
    assert c["sizeof.header"][1] == sc.HEADER_SIZE
    assert c["sizeof.sqe"][1] == sc.SQE_SIZE == sc.SQE_HEAD.size + 32 + 16 + 16 + 18 * 16
    assert c["sizeof.cqe"][1] == sc.CQE_SIZE == sc.CQE_HEAD.size + sc.ADDR.size
    assert c["const.QCTL_SIZE"][1] == sc.QCTL_SIZE
    assert c["const.MAGIC_LO"][1] == sc.MAGIC & 0xFFFFFFFF
    # ABI 1.1
    for name, off in sc.RXMETA_OFF.items():
        assert c[f"kbp_so_rxmeta.{name}"][0] == off, name
    assert c["sizeof.rxmeta"][1] == sc.RXMETA.size == 64
    assert c["const.MINOR"][1] == 1
    assert (c["const.FEAT_META"][1], c["const.FEAT_QUEUE_OPTS"][1]) == (
        sc.FEAT_META, sc.FEAT_QUEUE_OPTS)
    assert (c["const.F_META"][1], c["const.MSG_SRC"][1], c["const.MSG_TOS"][1]) == (
        sc.F_META, sc.MSG_SRC, sc.MSG_TOS)
    assert (c["const.OPT_INQ"][1], c["const.OPT_OUTQ"][1]) == (sc.OPT["INQ"], sc.OPT["OUTQ"])
    assert c["const.META_VALID"][1] == (sc.META_DST | sc.META_TSTAMP | sc.META_DROPS
                                        | sc.META_TOS | sc.META_TTL)


def test_ivshmem_server_protocol_and_layout(sod: Sod) -> None:
    g = sod.guest(attach=False)
    try:
        # what QEMU's ivshmem-doorbell expects: version 0, its ID, the region, then
        # per-vector eventfds for the peer (the daemon) and for itself
        assert g.version == 0
        assert g.my_id == 1
        assert g.peer_id == 0
        assert len(g.doorbells) == len(g.irqs) == sod.queues == g.nr_queues
        size = len(g.region)
        assert size & (size - 1) == 0, "ivshmem BAR2 must be a power of two"
        assert g.hdr("magic") == sc.MAGIC
        assert (g.hdr("version_major"), g.hdr("header_size")) == (1, sc.HEADER_SIZE)
        assert g.hdr("region_size") == size
        assert g.hdr("epoch") == 1
        assert g.hdr("host_state") == sc.HOST_UP
        assert g.hdr("ring_entries") == sod.entries
        stride = g.hdr("queue_stride")
        assert stride % 4096 == 0
        assert stride >= sc.QCTL_SIZE + sod.entries * (sc.SQE_SIZE + sc.CQE_SIZE)
        assert g.hdr("queue_offset") + sod.queues * stride <= size
        assert g.hdr("max_segs") == sc.MAX_SEGS
        # a second QEMU for the same VM is turned away (it would share the rings)
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.connect(sod.sock)
        other.settimeout(5)
        assert other.recv(8) == b""
        other.close()
    finally:
        g.close()
    assert sod.alive()


def test_not_served_before_attach_then_served(sod: Sod) -> None:
    g = sod.guest(attach=False)
    try:
        tag = g.put(sc.Sqe(sc.OP["NOP"]))
        time.sleep(0.25)  # two heartbeats: the timer rescans too
        assert g.qctl(0, "sq_head") == 0, "served a guest that never attached"
        g.attach()  # the reset drops what was written before it
        assert g.qctl(0, "sq_head") == 0
        cqe = g.call(sc.Sqe(sc.OP["NOP"]))
        assert (cqe.res, cqe.epoch, cqe.op) == (0, 1, sc.OP["NOP"])
        assert cqe.tag != tag
    finally:
        g.close()


def test_doorbell_interrupt_and_need_irq(guest: sc.Guest) -> None:
    g = guest
    for q in range(g.nr_queues):
        before = g.counters(q)
        g.set_qctl(q, "need_irq", 1)
        tag = g.put(sc.Sqe(sc.OP["NOP"]), q)
        g.wait_until(lambda q=q: g.qctl(q, "cq_tail") == g.cq_head[q] + 1, "cqe")
        g.wait_until(lambda q=q, b=before["irqs"]: g.counters(q)["irqs"] == b + 1, "irq")
        assert g.irq_count(q) == 1, "interrupt eventfd not written"
        cqe = g.wait_tag(tag, q)
        assert cqe.res == 0
        after = g.counters(q)
        assert after["requests"] == before["requests"] + 1
        assert after["completions"] == before["completions"] + 1
        assert after["doorbells"] >= before["doorbells"] + 1
        # part 2's flag: no interrupt for a vCPU that did not ask for one
        g.set_qctl(q, "need_irq", 0)
        cqe = g.call(sc.Sqe(sc.OP["NOP"]), q)
        assert cqe.res == 0
        assert g.counters(q)["irqs"] == after["irqs"]
        assert g.irq_count(q) == 0


def test_need_irq_is_any_nonzero_composition(guest: sc.Guest) -> None:
    """The guest composes need_irq (kbp_so_abi.h): bit 0 for a sleeping waiter, 2 per
    halted vCPU of the queue (the idle path). Any nonzero value interrupts, 0 never."""
    g = guest
    for q in range(g.nr_queues):
        for value, irq in ((2, True), (4, True), (3, True), (0, False)):
            before = g.counters(q)["irqs"]
            g.set_qctl(q, "need_irq", value)
            # not call(): its wait reads the interrupt eventfd this test counts
            tag = g.put(sc.Sqe(sc.OP["NOP"]), q)
            g.wait_until(lambda q=q: g.qctl(q, "cq_tail") == g.cq_head[q] + 1, "cqe")
            if irq:
                g.wait_until(lambda q=q, b=before: g.counters(q)["irqs"] == b + 1,
                             f"irq for need_irq={value}")
                assert g.irq_count(q) == 1, value
            else:
                assert g.counters(q)["irqs"] == before and g.irq_count(q) == 0
            assert g.wait_tag(tag, q).res == 0


def test_a_guest_that_never_announces_does_not_stall_the_host(guest: sc.Guest) -> None:
    """need_irq stays 0 (a guest that polls, or never halts): the host posts every
    completion without an interrupt and goes on serving; its heartbeat keeps moving."""
    g = guest
    hb = g.hdr("heartbeat")
    for q in range(g.nr_queues):
        g.set_qctl(q, "need_irq", 0)
        before = g.counters(q)
        for _ in range(200):
            assert g.call(sc.Sqe(sc.OP["NOP"]), q).res == 0
        after = g.counters(q)
        assert after["completions"] == before["completions"] + 200
        assert after["irqs"] == before["irqs"] and g.irq_count(q) == 0
    g.wait_until(lambda: g.hdr("heartbeat") >= hb + 1, "heartbeat", timeout=2)


def test_heartbeat_moves(guest: sc.Guest) -> None:
    hb = guest.hdr("heartbeat")
    guest.wait_until(lambda: guest.hdr("heartbeat") >= hb + 2, "heartbeat", timeout=2)


def test_poll_mode_needs_no_doorbell(sod_bin: Path, tmp_path: Path) -> None:
    from .conftest import make_sod

    s = make_sod(sod_bin, tmp_path, extra=["--poll"])
    s.start()
    try:
        g = s.guest()
        try:
            assert g.qctl(0, "host_polling") == 1
            before = g.counters(0)["doorbells"]
            tag = g.put(sc.Sqe(sc.OP["NOP"]), doorbell=False)
            # well inside one heartbeat: found by polling, not by the timer
            cqe = g.wait_tag(tag, timeout=0.09)
            assert cqe.res == 0
            assert g.counters(0)["doorbells"] == before
        finally:
            g.close()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("bad", [
    "name=t",  # no region, socket, ram
    "name=t,region=/nonexistent/r,socket=/tmp/x.sock,ram=/nonexistent/ram",
    "name=t,region=r,socket=s,ram=m,entries=12",  # not a power of two
    "name=t,region=r,socket=s,ram=m,queues=65",
    "name=t,region=r,socket=s,ram=m,bogus=1",
])
def test_bad_command_lines_are_refused(sod_bin: Path, bad: str) -> None:
    proc = subprocess.run([str(sod_bin), "--vm", bad], capture_output=True, text=True,
                          timeout=10, check=False)
    assert proc.returncode in (1, 2), proc
    assert "kbp-sod" in proc.stderr


def test_qemu_ivshmem_doorbell_accepts_the_daemon(sod: Sod) -> None:
    """QEMU's own ivshmem-doorbell realizes against the daemon (a paused machine: no
    guest code runs): version, ID, region, the peer's and its own eventfds."""
    import shutil

    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        pytest.skip(reason="qemu-system-x86_64 is not installed")
    cmd = [qemu, "-machine", "pc,accel=tcg", "-S", "-nodefaults", "-display", "none",
           "-m", "64", "-chardev", f"socket,path={sod.sock},id=iv",
           "-device", f"ivshmem-doorbell,chardev=iv,vectors={sod.queues}",
           "-monitor", "stdio", "-serial", "none"]
    proc = subprocess.run(cmd, input="info pci\nquit\n", capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1af4:1110" in out, out  # the ivshmem device, realized
    assert "BAR2" in out, out  # the region is mapped as its BAR2
    end = time.monotonic() + 5
    while "client gone" not in sod.log():  # QEMU's exit closed the connection
        assert time.monotonic() < end, sod.log()
        time.sleep(0.02)
    assert "client connected" in sod.log()
