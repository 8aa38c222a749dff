"""kbp-sod's socket operations through real host UDP sockets on 127.0.0.1 (loopback
only): echo through guest RAM, parking, MSG_PEEK/TRUNC, non-blocking EAGAIN, cancel,
poll readiness, the setsockopt allowlist (docs/design.md 11.2, 11.6)."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import struct
import sys
from pathlib import Path

import pytest

from kbp.system import access

from . import sodclient as sc
from .conftest import make_sod
from .netns import netns
from .sodclient import OP, Sqe


def bound(g: sc.Guest) -> tuple[int, int]:
    h = g.socket()
    cqe = g.bind(h)
    assert cqe.res == 0, cqe
    fam, host, port = cqe.addr
    assert (fam, host) == (sc.AF_INET, "127.0.0.1") and port > 0
    return h, port


def test_echo_one_copy_each_way(guest: sc.Guest, peer: socket.socket) -> None:
    g = guest
    h, port = bound(g)
    before = g.counters()
    # a blocking receive parks at the host: no completion until a datagram arrives
    buf = 0x10000
    g.poke(buf, b"\xee" * 256)
    tag = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(buf, 256)]))
    assert g.no_cqe_for(tag, 0.2)
    assert g.qctl(0, "inflight") == 1
    msg = b"ping from the host side " * 3
    peer.sendto(msg, ("127.0.0.1", port))
    cqe = g.wait_tag(tag)
    assert cqe.res == len(msg) == cqe.msg_len
    assert cqe.out_flags == 0
    assert cqe.addr == (sc.AF_INET, "127.0.0.1", peer.getsockname()[1])
    # the datagram is in guest RAM, where the segment said, and nothing past it
    assert g.peek(buf, len(msg)) == msg
    assert g.peek(buf + len(msg), 256 - len(msg)) == b"\xee" * (256 - len(msg))
    # echo it back from guest RAM
    cqe = g.call(Sqe(OP["SENDMSG"], sock=h, segs=[(buf, len(msg))],
                     addr=sc.pack_addr(sc.AF_INET, "127.0.0.1", peer.getsockname()[1])))
    assert cqe.res == len(msg)
    data, src = peer.recvfrom(2048)
    assert (data, src) == (msg, ("127.0.0.1", port))
    after = g.counters()
    assert after["bytes_in"] - before["bytes_in"] == len(msg)
    assert after["bytes_out"] - before["bytes_out"] == len(msg)
    assert after["copies"] - before["copies"] == 2  # one per message, each way
    assert g.qctl(0, "inflight") == 0


def test_scatter_gather_segments(guest: sc.Guest, peer: socket.socket) -> None:
    g = guest
    h, port = bound(g)
    a, b, c = 0x20000, 0x30000 + 7, 0x40FF0  # the last one crosses a page
    peer.sendto(bytes(range(200)), ("127.0.0.1", port))
    cqe = g.call(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT,
                     segs=[(a, 50), (b, 100), (c, 50)]))
    assert cqe.res == 200
    assert g.peek(a, 50) + g.peek(b, 100) + g.peek(c, 50) == bytes(range(200))
    g.poke(a, b"AB")
    g.poke(c, b"CDE")
    assert g.call(Sqe(OP["CONNECT"], sock=h, addr=sc.pack_addr(
        sc.AF_INET, "127.0.0.1", peer.getsockname()[1]))).res == 0
    cqe = g.call(Sqe(OP["SENDMSG"], sock=h, segs=[(a, 2), (c, 3)]))  # connected: no addr
    assert cqe.res == 5
    assert peer.recv(100) == b"ABCDE"
    cqe = g.call(Sqe(OP["GETNAME"], sock=h, arg0=1))
    assert cqe.res == 0 and cqe.addr[2] == peer.getsockname()[1]


def test_peek_trunc_and_nonblocking(guest: sc.Guest, peer: socket.socket) -> None:
    g = guest
    h, port = bound(g)
    buf = 0x50000
    # nothing queued: a non-blocking receive says EAGAIN at once, as does WAIT+DONTWAIT
    for flags, mflags in ((0, 0), (sc.F_WAIT, sc.MSG_DONTWAIT)):
        cqe = g.call(Sqe(OP["RECVMSG"], sock=h, flags=flags, msg_flags=mflags,
                         segs=[(buf, 64)]), timeout=1)
        assert cqe.res == -errno.EAGAIN
    msg = bytes(range(100))
    peer.sendto(msg, ("127.0.0.1", port))
    g.wait_until(lambda: g.call(Sqe(OP["POLL"], sock=h, arg1=sc.POLL_IN)).out_flags
                 & sc.POLL_IN, "readable")
    # MSG_PEEK into a short buffer: 10 bytes copied, full length and TRUNC reported
    cqe = g.call(Sqe(OP["RECVMSG"], sock=h, msg_flags=sc.MSG_PEEK, segs=[(buf, 10)]))
    assert (cqe.res, cqe.msg_len, cqe.out_flags) == (10, 100, sc.OUT_TRUNC)
    assert g.peek(buf, 10) == msg[:10]
    # still queued; MSG_TRUNC: the result is the datagram's length (recv(2) semantics)
    cqe = g.call(Sqe(OP["RECVMSG"], sock=h, msg_flags=sc.MSG_TRUNC, segs=[(buf + 100, 20)]))
    assert (cqe.res, cqe.msg_len, cqe.out_flags) == (100, 100, sc.OUT_TRUNC)
    assert g.peek(buf + 100, 20) == msg[:20]
    # consumed: empty again
    cqe = g.call(Sqe(OP["RECVMSG"], sock=h, segs=[(buf, 64)]))
    assert cqe.res == -errno.EAGAIN
    # a zero-length receive with MSG_TRUNC reports the size (no segment at all)
    peer.sendto(b"x" * 33, ("127.0.0.1", port))
    cqe = g.call(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT,
                     msg_flags=sc.MSG_PEEK | sc.MSG_TRUNC))
    assert (cqe.res, cqe.msg_len) == (33, 33)


def test_cancel_and_close_complete_parked_requests(guest: sc.Guest,
                                                   peer: socket.socket) -> None:
    g = guest
    h, port = bound(g)
    t1 = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x60000, 64)]))
    t2 = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x61000, 64)]))
    assert g.no_cqe_for(t1, 0.1) and g.no_cqe_for(t2, 0.05)
    # SO_RCVTIMEO / a signal in the guest: cancel by tag; the parked one completes once
    cqe = g.call(Sqe(OP["CANCEL"], sock=h, arg1=t1))
    assert cqe.res == 0
    assert g.wait_tag(t1).res == -errno.ECANCELED
    assert g.call(Sqe(OP["CANCEL"], sock=h, arg1=t1)).res == -errno.ENOENT
    # t2 is still parked and FIFO-next: it gets the next datagram
    peer.sendto(b"for t2", ("127.0.0.1", port))
    assert g.wait_tag(t2).res == 6
    assert g.peek(0x61000, 6) == b"for t2"
    # close with a parked receive: it completes -ECANCELED, the handle dies
    t3 = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x62000, 64)]))
    assert g.no_cqe_for(t3, 0.05)
    assert g.call(Sqe(OP["CLOSE"], sock=h)).res == 0
    assert g.wait_tag(t3).res == -errno.ECANCELED
    assert g.call(Sqe(OP["GETNAME"], sock=h)).res == -errno.EBADF
    assert g.qctl(0, "inflight") == 0
    # the slot is reused with a new generation: the old handle stays dead
    h2 = g.socket()
    assert h2 & 0xFFFF == h & 0xFFFF and h2 != h
    assert g.call(Sqe(OP["GETNAME"], sock=h)).res == -errno.EBADF
    assert g.call(Sqe(OP["GETNAME"], sock=h2)).res == 0


def test_poll_readiness_armed(guest: sc.Guest, peer: socket.socket) -> None:
    g = guest
    h, port = bound(g)
    cqe = g.call(Sqe(OP["POLL"], sock=h, arg1=sc.POLL_IN | sc.POLL_OUT))
    assert cqe.res == 0 and cqe.out_flags & sc.POLL_OUT and not cqe.out_flags & sc.POLL_IN
    tag = g.put(Sqe(OP["POLL"], sock=h, flags=sc.F_ARM, arg1=sc.POLL_IN))
    assert g.no_cqe_for(tag, 0.2)
    peer.sendto(b"wake", ("127.0.0.1", port))
    cqe = g.wait_tag(tag)
    assert cqe.res == 0 and cqe.out_flags & sc.POLL_IN


def test_shutdown_ends_a_parked_receive(guest: sc.Guest) -> None:
    g = guest
    h, _port = bound(g)
    tag = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x70000, 64)]))
    assert g.no_cqe_for(tag, 0.1)
    cqe = g.call(Sqe(OP["SHUTDOWN"], sock=h, arg0=0))
    assert cqe.res in (0, -errno.ENOTCONN)  # Linux: unconnected UDP says ENOTCONN
    assert g.wait_tag(tag).res == 0  # end of data, as for a local socket


def opt(value: int) -> bytes:
    return struct.pack("<i", value).ljust(16, b"\0")


def test_setsockopt_allowlist(guest: sc.Guest) -> None:
    g = guest
    h = g.socket()
    assert g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT["RCVBUF"],
                      opt=opt(65536))).res == 0
    assert g.call(Sqe(OP["GETSOCKOPT"], sock=h, arg0=sc.OPT["RCVBUF"])).res >= 65536
    assert g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT["IP_TOS"], opt=opt(0x10))).res == 0
    assert g.call(Sqe(OP["GETSOCKOPT"], sock=h, arg0=sc.OPT["IP_TOS"])).res == 0x10
    # priorities above 6 need CAP_NET_ADMIN: the daemon does not lend its own
    assert g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT["PRIORITY"],
                      opt=opt(7))).res == -errno.EPERM
    assert g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT["ERROR"],
                      opt=opt(1))).res == -errno.EINVAL
    assert g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=99, opt=opt(1))).res == -errno.ENOPROTOOPT
    junk = struct.pack("<i", 1) + b"\1" * 12  # bytes past the int
    assert g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT["RCVBUF"],
                      opt=junk)).res == -errno.EINVAL
    assert g.call(Sqe(OP["GETSOCKOPT"], sock=h, arg0=sc.OPT["ERROR"])).res == 0


def test_ipv6_loopback(guest: sc.Guest) -> None:
    g = guest
    h = g.socket(sc.AF_INET6)
    cqe = g.bind(h, "::1", 0, sc.AF_INET6)
    if cqe.res == -errno.EADDRNOTAVAIL:
        pytest.skip(reason="this host has no IPv6 loopback address")
    assert cqe.res == 0 and cqe.addr[:2] == (sc.AF_INET6, "::1")
    port = cqe.addr[2]
    # an IPv4 address on an IPv6 socket is refused by the checks, not by the kernel
    assert g.bind(h, "127.0.0.1", 0, sc.AF_INET).res == -errno.EAFNOSUPPORT
    p = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        p.bind(("::1", 0))
        p.sendto(b"six", ("::1", port))
        cqe = g.call(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x80000, 16)]))
        assert cqe.res == 3 and g.peek(0x80000, 3) == b"six"
        assert cqe.addr == (sc.AF_INET6, "::1", p.getsockname()[1])
    finally:
        p.close()


def test_sockets_live_in_the_vms_netns(sod_bin: Path, tmp_path: Path) -> None:
    """netns=NAME: the VM's host sockets are made in that namespace (setns around
    socket()), the daemon itself stays in its own."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip(reason="needs root and iproute2 to make a network namespace")
    with netns("kbpso") as ns:
        s = make_sod(sod_bin, tmp_path, netns=ns)
        s.start()
        g = s.guest()
        try:
            h = g.socket()
            cqe = g.bind(h)
            assert cqe.res == 0, cqe
            port = cqe.addr[2]
            inside = access.cmd(["ss", "-Huln"], ns=ns).stdout
            outside = access.cmd(["ss", "-Huln"]).stdout
            assert f"127.0.0.1:{port} " in inside, inside
            assert f"127.0.0.1:{port} " not in outside, outside
            # a datagram from inside the namespace reaches it, one from outside cannot
            access.cmd([sys.executable, "-c",
                           "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                           f".sendto(b'in-ns', ('127.0.0.1', {port}))"], ns=ns)
            cqe = g.call(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x1000, 16)]))
            assert cqe.res == 5 and g.peek(0x1000, 5) == b"in-ns"
        finally:
            g.close()
            assert s.stop() == 0
