"""kbp-sod against a hostile or failing guest, and its own restarts (docs/design.md 11.5):
bad entries rejected with the right errno, bad ring indices stop only that queue, the CQ
never overflows, the guest's disconnect closes its sockets, a restart bumps the epoch and
voids the old attach, a second daemon cannot take a region in use, and a fuzzer under
AddressSanitizer finds nothing."""

from __future__ import annotations

import errno
import mmap
import os
import random
import signal
import socket
import struct
import time
from pathlib import Path

import pytest

from . import sodclient as sc
from .conftest import RAM_SIZE, Sod, make_sod
from .sodclient import OP, Sqe


def test_bad_entries_are_rejected_with_their_errno(guest: sc.Guest, sod: Sod) -> None:
    g = guest
    h = g.socket()
    assert g.bind(h).res == 0
    closed = g.socket()
    assert g.call(Sqe(OP["CLOSE"], sock=closed)).res == 0
    canary = 0x90000
    g.poke(canary, b"\xa5" * 4096)
    big = (1 << 64) - 16
    wait = sc.F_WAIT
    recv = OP["RECVMSG"]
    cases: list[tuple[str, Sqe, int]] = [
        ("unknown op", Sqe(200), -errno.EINVAL),
        ("unknown flag", Sqe(OP["NOP"], flags=0x80), -errno.EINVAL),
        ("unknown msg flag", Sqe(recv, sock=h, msg_flags=0x100, segs=[(0, 8)]), -errno.EINVAL),
        ("reserved word", Sqe(OP["NOP"], reserved=(0, 1)), -errno.EINVAL),
        ("WAIT on a non-data op", Sqe(OP["BIND"], sock=h, flags=wait), -errno.EINVAL),
        ("segments on a non-data op", Sqe(OP["NOP"], segs=[(0, 8)]), -errno.EINVAL),
        ("nr_segs above 18", Sqe(recv, sock=h, segs=[(0, 8)], nr_segs=19), -errno.EINVAL),
        ("nr_segs 255", Sqe(recv, sock=h, nr_segs=255), -errno.EINVAL),
        ("zero-length segment", Sqe(recv, sock=h, segs=[(0, 0)]), -errno.EINVAL),
        ("segment past RAM", Sqe(recv, sock=h, segs=[(RAM_SIZE - 8, 16)]), -errno.EFAULT),
        ("segment after RAM", Sqe(recv, sock=h, segs=[(RAM_SIZE, 1)]), -errno.EFAULT),
        ("gpa + len overflows", Sqe(recv, sock=h, segs=[(big, 32)]), -errno.EFAULT),
        ("one bad segment of many",
         Sqe(recv, sock=h, segs=[(canary, 8), (1 << 40, 8)]), -errno.EFAULT),
        ("total above 65535", Sqe(recv, sock=h, segs=[(0, 40000), (0x20000, 40000)]),
         -errno.EMSGSIZE),
        ("no such handle", Sqe(OP["GETNAME"], sock=0x00010333), -errno.EBADF),
        ("handle index beyond the table", Sqe(OP["GETNAME"], sock=0xFFFFFFFF), -errno.EBADF),
        ("closed handle", Sqe(OP["GETNAME"], sock=closed), -errno.EBADF),
        ("socket of a bad family", Sqe(OP["SOCKET"], arg0=17), -errno.EINVAL),
        ("v4 address with junk", Sqe(OP["CONNECT"], sock=h, addr=sc.ADDR.pack(
            sc.AF_INET, 0, 0, b"\x7f\0\0\1" + b"\1" * 12, 0, 0)), -errno.EINVAL),
        ("address pad", Sqe(OP["CONNECT"], sock=h, addr=sc.ADDR.pack(
            sc.AF_INET, 0, 0, b"\x7f\0\0\1".ljust(16, b"\0"), 0, 9)), -errno.EINVAL),
        ("poll of nothing", Sqe(OP["POLL"], sock=h), -errno.EINVAL),
        ("poll of unknown events", Sqe(OP["POLL"], sock=h, arg1=1 << 9), -errno.EINVAL),
        ("ARM outside POLL", Sqe(OP["NOP"], flags=sc.F_ARM), -errno.EINVAL),
        ("shutdown how 3", Sqe(OP["SHUTDOWN"], sock=h, arg0=3), -errno.EINVAL),
    ]
    before, after = g.expect(cases)
    # every one of them counted as a check's reject, the socket table untouched
    assert after["rejects"] - before["rejects"] == len(cases)
    assert after["bytes_in"] == before["bytes_in"]
    assert g.peek(canary, 4096) == b"\xa5" * 4096
    assert g.call(Sqe(OP["GETNAME"], sock=h)).res == 0
    assert sod.alive()


def test_bad_sq_tail_stops_only_its_queue(guest: sc.Guest, sod: Sod) -> None:
    g = guest
    g.set_qctl(1, "sq_tail", g.entries + 5)  # more entries than the ring holds
    g.ring(1)
    g.wait_until(lambda: g.qctl(1, "host_error") == sc.QERR_SQ_INDEX, "queue 1 stopped")
    assert g.qctl(1, "sq_head") == 0, "consumed entries from a lying queue"
    assert g.call(Sqe(OP["NOP"]), q=0).res == 0  # queue 0 goes on
    # a reset brings the stopped queue back
    g.attach()
    assert g.qctl(1, "host_error") == 0
    assert g.call(Sqe(OP["NOP"]), q=1).res == 0
    assert sod.alive()


def test_bad_cq_head_stops_only_its_queue(guest: sc.Guest) -> None:
    g = guest
    assert g.call(Sqe(OP["NOP"]), q=1).res == 0
    g.set_qctl(1, "cq_head", 0x80000000)  # "consumed" far more than was posted
    g.put(Sqe(OP["NOP"]), q=1)
    g.wait_until(lambda: g.qctl(1, "host_error") == sc.QERR_CQ_INDEX, "queue 1 stopped")
    assert g.qctl(1, "cq_tail") == 1
    assert g.call(Sqe(OP["NOP"]), q=0).res == 0


def test_completion_ring_never_overflows(guest: sc.Guest) -> None:
    g = guest
    h = g.socket()
    assert g.bind(h).res == 0
    n = g.entries
    sq0, cq0 = g.qctl(0, "sq_head"), g.qctl(0, "cq_tail")  # SOCKET and BIND so far
    # park n-2 receives: they hold CQE slots although nothing is posted yet
    parked = [g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x1000 * i, 64)]))
              for i in range(1, n - 1)]
    g.wait_until(lambda: g.qctl(0, "inflight") == n - 2, "parked")
    # then more NOPs than the CQ has room for, without reading any CQE
    for _ in range(4):
        g.put(Sqe(OP["NOP"]))
    time.sleep(0.25)
    assert g.qctl(0, "cq_tail") == cq0 + 2, "posted past the guest's unread completions"
    assert g.qctl(0, "sq_head") == sq0 + n, "consumed an SQE without a CQE slot for it"
    # reading completions frees slots; the rest are served (doorbell or timer)
    got = [g.poll_cqe(0), g.poll_cqe(0)]
    assert all(c is not None and c.op == OP["NOP"] for c in got)
    g.ring(0)
    g.wait_until(lambda: g.qctl(0, "sq_head") == sq0 + n + 2, "rest consumed")
    assert g.qctl(0, "cq_tail") == cq0 + 4
    assert g.call(Sqe(OP["CLOSE"], sock=h)).res == 0
    res = [g.wait_tag(t).res for t in parked]
    assert res == [-errno.ECANCELED] * (n - 2)


def test_guest_disconnect_closes_its_sockets(sod: Sod) -> None:
    g = sod.guest()
    h = g.socket()
    cqe = g.bind(h)
    port = cqe.addr[2]
    g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x1000, 64)]))
    g.wait_until(lambda: g.qctl(0, "inflight") == 1, "parked")
    g.close()  # QEMU exits
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        end = time.monotonic() + 5
        while True:
            try:
                probe.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < end, "the host socket outlived its guest"
                time.sleep(0.02)
    finally:
        probe.close()
    assert "client gone" in sod.log()
    # the next QEMU of this VM is served (after its reset)
    g2 = sod.guest()
    try:
        assert g2.call(Sqe(OP["NOP"])).res == 0
    finally:
        g2.close()


def test_restart_bumps_the_epoch_and_voids_the_old_attach(sod: Sod) -> None:
    g = sod.guest()
    h = g.socket()
    assert g.bind(h).res == 0
    parked = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x1000, 64)]))
    assert g.no_cqe_for(parked, 0.05)
    # a second daemon cannot take the region while this one holds it
    second = Sod(sod.binary, sod.dir, starts=100)
    second.start(wait=False)
    assert second.proc is not None
    assert second.proc.wait(10) == 1
    assert "held by another kbp-sod" in second.log()
    # clean stop: the parked receive gets its final completion, the region says DOWN
    assert sod.stop(signal.SIGTERM) == 0
    assert g.wait_tag(parked).res == -errno.ESHUTDOWN
    assert g.hdr("host_state") == sc.HOST_DOWN
    # the confined daemon cannot unlink (seccomp): its server socket's name stays,
    # refusing connections, until the next start replaces it
    late = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(ConnectionRefusedError):
            late.connect(sod.sock)
    finally:
        late.close()
    assert "stopped" in sod.log()
    # QEMU's mapping of the region outlives the daemon and sees the next epoch
    qemu_fd = os.open(sod.region, os.O_RDWR)
    qemu_map = mmap.mmap(qemu_fd, os.fstat(qemu_fd).st_size)
    g.close()
    sod.start()
    assert struct.unpack_from("<I", qemu_map, sc.H["epoch"][0])[0] == 2
    qemu_map.close()
    os.close(qemu_fd)
    g2 = sod.guest(attach=False)
    try:
        assert g2.hdr("epoch") == 2
        assert g2.hdr("host_state") == sc.HOST_UP
        # still attached to epoch 1: the new daemon does not serve it
        assert g2.hdr("guest_epoch") == 1
        tag = g2.put(Sqe(OP["NOP"]))
        time.sleep(0.25)
        assert g2.qctl(0, "sq_head") == 0
        g2.attach()
        cqe = g2.call(Sqe(OP["NOP"]))
        assert (cqe.res, cqe.epoch) == (0, 2) and cqe.tag != tag
        # the old handle died with the old daemon
        assert g2.call(Sqe(OP["GETNAME"], sock=h)).res == -errno.EBADF
    finally:
        g2.close()
    # killed, not stopped: the next one still bumps the epoch (the lock went with it)
    assert sod.stop(signal.SIGKILL) == -signal.SIGKILL
    sod.start()
    g3 = sod.guest()
    try:
        assert g3.hdr("epoch") == 3
        assert g3.call(Sqe(OP["NOP"])).epoch == 3
    finally:
        g3.close()


def _random_sqe(rng: random.Random, handles: list[int]) -> bytes:
    """Random or crafted bytes, with every address forced to loopback (no traffic
    leaves the host's lo, whatever the fuzzer picks)."""
    b = bytearray(rng.randbytes(sc.SQE_SIZE) if rng.random() < 0.3 else bytes(sc.SQE_SIZE))
    b[8] = rng.choice([rng.randrange(256), rng.randrange(13), rng.randrange(13)])
    if rng.random() < 0.7:
        b[9] = rng.choice([0, 1, 2, 17, 18, 19, 255])
    if rng.random() < 0.6:
        struct.pack_into("<H", b, 10, rng.choice([0, 1, 2, 3, 0xFFFF]))
    if handles and rng.random() < 0.7:
        struct.pack_into("<I", b, 12, rng.choice(handles))
    if rng.random() < 0.6:
        struct.pack_into("<I", b, 16, rng.choice([0, 1, 2, 4, 7, 0xFFFFFFFF]))
    if rng.random() < 0.5:
        struct.pack_into("<I", b, 20, rng.choice([0, 1, 2, 10, 11, 12, 0x7FFFFFFF]))
    if rng.random() < 0.5:
        struct.pack_into("<Q", b, 24, rng.choice([0, 1, 3, 15, 16, 1 << 63]))
    for i in range(sc.MAX_SEGS):
        off = 96 + 16 * i
        if rng.random() < 0.7:
            gpa = rng.choice([0, RAM_SIZE - 1, RAM_SIZE, RAM_SIZE - 4096, (1 << 64) - 1,
                              (1 << 64) - 4096, rng.randrange(RAM_SIZE), rng.randrange(1 << 64)])
            ln = rng.choice([0, 1, 4096, 65535, 65536, 0xFFFFFFFF, rng.randrange(70000)])
            pad = 0 if rng.random() < 0.9 else rng.randrange(1 << 32)
            sc.SEG.pack_into(b, off, gpa, ln, pad)
    family = struct.unpack_from("<H", b, 32)[0]
    if rng.random() < 0.5:
        family = rng.choice([0, sc.AF_INET, sc.AF_INET6])
        struct.pack_into("<H", b, 32, family)
    if family == sc.AF_INET:
        b[40:44] = b"\x7f\0\0\1"
    elif family == sc.AF_INET6:
        b[40:56] = socket.inet_pton(socket.AF_INET6, "::1")
    return bytes(b)


def test_restart_while_qemu_holds_the_region(sod: Sod) -> None:
    """QEMU keeps the region fd it was passed for its whole life; the flock that makes a
    new epoch mean "the old daemon is gone" must not go with it, or a daemon killed under
    a running QEMU could never be followed by another (the guest's orphaned pages are
    released by that new epoch)."""
    g = sod.guest()  # holds the passed fd, as QEMU does
    try:
        assert g.hdr("epoch") == 1
        assert sod.stop(signal.SIGKILL) == -signal.SIGKILL
        sod.start()  # asserts it became ready, i.e. took the lock
        assert g.hdr("epoch") == 2 and g.hdr("host_state") == sc.HOST_UP
    finally:
        g.close()


def test_fuzz_under_asan_finds_nothing(sod_asan_bin: Path, tmp_path: Path) -> None:
    s = make_sod(sod_asan_bin, tmp_path, queues=2, entries=32)
    s.start(env={"ASAN_OPTIONS": "abort_on_error=0:detect_leaks=1:exitcode=66",
                 "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=67"})
    rng = random.Random(0x4B42_50)
    g = s.guest()
    processed = rejects = resets = 0

    def reset() -> list[int]:
        nonlocal processed, rejects, resets
        for q in range(g.nr_queues):
            processed += g.qctl(q, "requests")
            rejects += g.qctl(q, "rejects")
        resets += 1
        g.attach()
        hs = [g.socket(), g.socket(sc.AF_INET6), g.socket()]
        assert g.bind(hs[0]).res == 0
        return hs

    try:
        handles = reset()
        rounds = 0
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and rounds < 2500:
            q = rng.randrange(2)
            # a stopped queue, or one full of parked receives: reset (what a guest does)
            if g.qctl(q, "host_error") or \
                    (g.sq_tail[q] - g.qctl(q, "sq_head")) & 0xFFFFFFFF >= g.entries:
                handles = reset()
            raw = _random_sqe(rng, handles)
            slot = g.sq_tail[q] & (g.entries - 1)
            off = g.qbase(q) + sc.QCTL_SIZE + slot * sc.SQE_SIZE
            g.region[off:off + sc.SQE_SIZE] = raw
            g.sq_tail[q] = (g.sq_tail[q] + 1) & 0xFFFFFFFF
            if rng.random() < 0.01:  # a lying index now and then
                g.set_qctl(q, rng.choice(["sq_tail", "cq_head"]), rng.randrange(1 << 32))
            else:
                g.set_qctl(q, "sq_tail", g.sq_tail[q])
            g.ring(q)
            # let the daemon take it (or refuse the queue, or run out of CQ room)
            end = time.monotonic() + 0.05
            while g.qctl(q, "sq_head") != g.sq_tail[q] and not g.qctl(q, "host_error") \
                    and time.monotonic() < end:
                time.sleep(0.0002)
            while g.poll_cqe(q) is not None:
                pass
            # sockets a random SOCKET made: keep some handles current
            if rounds % 50 == 0 and not g.qctl(q, "host_error"):
                try:
                    cqe = g.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET), q=q, timeout=0.5)
                except TimeoutError:  # a lying index or parked receives hold the queue
                    pass
                else:
                    if cqe.res == 0:
                        handles.append(cqe.sock)
            rounds += 1
        assert s.alive(), s.log()
        # still serving after all that
        reset()
        assert g.call(Sqe(OP["NOP"])).res == 0
        # the fuzzer reached the checks: many entries taken, many refused
        assert rounds >= 500 and processed >= 500 and rejects >= 100, \
            (rounds, processed, rejects, resets)
    finally:
        g.close()
    rc = s.stop()
    log = s.log()
    assert "AddressSanitizer" not in log and "runtime error" not in log, log[-4000:]
    assert rc == 0, log[-4000:]
