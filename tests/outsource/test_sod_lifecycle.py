"""The guest's lifecycle on kbp-sod's side (issue 37 item 4, host side; docs/design.md 11.5):
a guest that is not ATTACHED at the daemon's epoch (ABSENT after a panic or reboot, RESET,
or attached to another epoch) gets nothing more written into its RAM, on every path that
serves -- a host socket's event completing a parked receive too, not only the doorbell --
and its sockets and parked requests are dropped without a completion.  And a restarted
daemon lays out the queues from its own constants, whatever the guest-writable header says
meanwhile (item 6)."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import sodclient as sc
from .conftest import Sod, make_sod
from .sodclient import OP, Sqe

POISON = b"\x5a" * 4096


def port_free(port: int) -> bool:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _leave(g: sc.Guest, how: str) -> None:
    """What the guest's kernel does at a panic, a reboot or a kexec, without a doorbell."""
    if how == "absent":
        g.set_hdr("guest_state", sc.GUEST_ABSENT)
    elif how == "reset":
        g.set_hdr("guest_state", sc.GUEST_RESET)
        g.set_hdr("guest_gen", (g.hdr("guest_gen") + 1) & 0xFFFFFFFF)
    elif how == "reset-same-gen":  # RESET again, not asking for a new ack
        g.set_hdr("guest_state", sc.GUEST_RESET)
    else:  # attached, but to another epoch (a stale attach)
        g.set_hdr("guest_epoch", g.hdr("epoch") + 7)


@pytest.mark.parametrize("how", ["absent", "reset", "reset-same-gen", "other-epoch"])
def test_a_parked_receive_writes_nothing_into_a_guest_that_left(
        guest: sc.Guest, sod: Sod, peer: socket.socket, how: str) -> None:
    g = guest
    h = g.socket()
    cqe = g.bind(h)
    assert cqe.res == 0
    port = cqe.addr[2]
    seg, meta = 0x40000, 0x42000
    g.poke(seg, POISON + POISON[:512])
    g.poke(meta, POISON[:64])
    tags = [g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(seg, 4096)])),
            g.put(Sqe(OP["POLL"], sock=h, flags=sc.F_ARM, arg1=sc.POLL_IN))]
    if g.hdr("host_features") & sc.FEAT_META:  # (so that it runs against a 1.0 daemon too)
        tags.append(g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT | sc.F_META, arg1=meta,
                              segs=[(seg + 4096, 512)])))
    g.wait_until(lambda: g.qctl(0, "inflight") == len(tags), "parked")
    cq_tail = g.qctl(0, "cq_tail")
    cq_base = g.qbase(0) + sc.QCTL_SIZE + g.entries * sc.SQE_SIZE
    slots = [cq_base + ((cq_tail + i) & (g.entries - 1)) * sc.CQE_SIZE
             for i in range(len(tags))]
    for off in slots:  # where their completions would go
        g.region[off:off + sc.CQE_SIZE] = POISON[:sc.CQE_SIZE]
    _leave(g, how)  # no doorbell: the socket's event (or the timer) is the first to see it
    for i in range(3):
        peer.sendto(b"into the next kernel %d" % i, ("127.0.0.1", port))
    time.sleep(0.35)  # three heartbeats: the timer's retry of parked requests ran too
    assert g.peek(seg, 4096) == POISON, "a datagram was written into a guest that left"
    assert g.peek(meta, 64) == POISON[:64], "an rxmeta was written into a guest that left"
    assert g.peek(seg + 4096, 512) == POISON[:512]
    assert all(g.region[off:off + sc.CQE_SIZE] == POISON[:sc.CQE_SIZE] for off in slots), \
        "completions posted for a guest that left"
    # (a reset asked for zeroes the indices: that is the handshake, not a completion)
    assert g.qctl(0, "cq_tail") == (0 if how == "reset" else cq_tail)
    # dropped: the host socket closed (its port free), nothing in flight
    g.wait_until(lambda: port_free(port), "the host socket closed", timeout=2)
    assert g.qctl(0, "inflight") == 0
    assert "the guest is not attached" in sod.log()
    # the next kernel attaches and is served; the old handle means nothing
    g.attach()
    assert g.call(Sqe(OP["NOP"])).res == 0
    assert g.call(Sqe(OP["GETNAME"], sock=h)).res == -errno.EBADF
    assert all(t not in g.stash for t in tags)
    assert sod.alive()


def test_absent_with_a_doorbell_drops_at_once(guest: sc.Guest, sod: Sod) -> None:
    g = guest
    h = g.socket()
    cqe = g.bind(h)
    port = cqe.addr[2]
    g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x50000, 64)]))
    g.wait_until(lambda: g.qctl(0, "inflight") == 1, "parked")
    g.set_hdr("guest_state", sc.GUEST_ABSENT)
    g.ring(0)
    g.wait_until(lambda: port_free(port), "dropped at the doorbell", timeout=0.5)
    # an ABSENT guest's new requests are not served either
    sq_head = g.qctl(0, "sq_head")
    g.put(Sqe(OP["NOP"]))
    time.sleep(0.25)
    assert g.qctl(0, "sq_head") == sq_head


def _layout_words(stride: int) -> dict[str, int]:
    return {"queue_offset": sc.HEADER_SIZE, "queue_stride": stride}


@pytest.fixture
def asan_sod(sod_asan_bin: Path, tmp_path: Path) -> Iterator[Sod]:
    s = make_sod(sod_asan_bin, tmp_path)
    s.start(env=ASAN_ENV)
    yield s
    if s.proc is not None:
        s.proc.kill()
        s.proc.wait()


ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=0:exitcode=66",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=67"}


def test_restart_lays_out_from_its_own_constants(asan_sod: Sod) -> None:
    """A guest rewriting the header's layout words while a daemon starts (the restart of
    a daemon under a live guest) moves none of the daemon's queue pointers: it serves the
    queues where its constants put them.  Repeated starts of the ASan build (-O1: it
    reloads what it reads) with a thread hammering queue_offset/queue_stride/nr_queues/
    ring_entries with values far past the region.  (The daemon that re-read them crashed
    here: issue 37 item 6.)"""
    sod = asan_sod
    g0 = sod.guest()
    stride = g0.hdr("queue_stride")
    g0.close()
    fd = os.open(sod.region, os.O_RDWR)
    region = mmap.mmap(fd, os.fstat(fd).st_size)
    stop = threading.Event()
    writes = 0

    def hammer() -> None:
        nonlocal writes
        bad = [0x7FFFF000, 0xFFFFF000, 0x40000000, 0xDEAD0000]
        while not stop.is_set():
            for v in bad:
                struct.pack_into("<I", region, sc.H["queue_offset"][0], v)
                struct.pack_into("<I", region, sc.H["queue_stride"][0], v)
                struct.pack_into("<I", region, sc.H["nr_queues"][0], 64)
                struct.pack_into("<I", region, sc.H["ring_entries"][0], 1 << 20)
                writes += 1

    try:
        for _ in range(8):
            assert sod.stop(signal.SIGKILL) == -signal.SIGKILL
            t = threading.Thread(target=hammer, daemon=True)
            stop.clear()
            t.start()
            try:
                sod.start(env=ASAN_ENV)
                time.sleep(0.02)
            finally:
                stop.set()
                t.join(5)
            assert sod.alive(), sod.log()
            # the guest puts the layout words back as the daemon wrote them and uses them
            for name, val in _layout_words(stride).items():
                struct.pack_into("<I", region, sc.H[name][0], val)
            struct.pack_into("<I", region, sc.H["nr_queues"][0], sod.queues)
            struct.pack_into("<I", region, sc.H["ring_entries"][0], sod.entries)
            g = sod.guest()
            try:
                for q in range(sod.queues):
                    assert g.call(Sqe(OP["NOP"]), q=q, timeout=2).res == 0
            finally:
                g.close()
        assert writes > 100
    finally:
        stop.set()
        region.close()
        os.close(fd)


def test_garbage_header_before_start(sod_bin: Path, tmp_path: Path) -> None:
    """A region whose header a guest filled with garbage while no daemon ran: the next one
    writes its own layout and serves it."""
    s = make_sod(sod_bin, tmp_path)
    with open(s.region, "wb") as f:
        f.write(os.urandom(4096))
    os.chmod(s.region, 0o644)
    s.start()
    try:
        assert os.stat(s.region).st_mode & 0o777 == 0o600  # files it keeps: 0600
        g = s.guest()
        try:
            assert g.hdr("queue_offset") == sc.HEADER_SIZE
            assert g.call(Sqe(OP["NOP"]), q=1).res == 0
        finally:
            g.close()
    finally:
        assert s.stop() == 0
