"""Run in the guest (imported by guest_boundary.py's ``udp_calls`` scenario; not collected):
what an unmodified UDP server asks of an outsourced socket, each call served or refused as
outsource/README.md's table says (issue 37, item 5).  Root, in the initial netns, on
protocol 253 sockets over the guest's loopback (the host's, in the VM's netns)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import socket
import struct
import time
from collections.abc import Callable

PROTO = 253
RELEASE = tuple(int(x) for x in os.uname().release.split(".")[:2])
# linux/in.h, asm-generic/socket.h, linux/udp.h, linux/sockios.h, asm-generic/ioctls.h
IP_TOS, IP_RECVERR, IP_PKTINFO, IP_RECVTOS = 1, 11, 8, 13
SO_TIMESTAMPNS_OLD, SO_RXQ_OVFL, SO_BINDTODEVICE = 35, 40, 25
SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104
SIOCGIFNAME, SIOCGIFCONF, SIOCGIFFLAGS, SIOCGIFADDR, SIOCGIFINDEX = (
    0x8910, 0x8912, 0x8913, 0x8915, 0x8933)
FIONREAD, SIOCOUTQ = 0x541B, 0x5411
IFF_UP, IFF_LOOPBACK = 0x1, 0x8
EPOLLEXCLUSIVE = 1 << 28
MSG_WAITFORONE = 0x10000


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, PROTO)
    s.settimeout(20)
    return s


def bound() -> socket.socket:
    s = udp()
    s.bind(("127.0.0.1", 0))
    return s


def refused(call: Callable[[], object], want: int) -> None:
    try:
        call()
    except OSError as e:
        assert e.errno == want, (e, errno.errorcode.get(want))
        return
    raise AssertionError(f"served; the table says {errno.errorcode[want]}")


# -- recvmmsg / sendmmsg through libc ---------------------------------------------------
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(IoVec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]


LIBC = ctypes.CDLL(None, use_errno=True)


def mmsg(fd: int, bufs: list[ctypes.Array[ctypes.c_char]], send: bool) -> list[int]:
    n = len(bufs)
    iovs = (IoVec * n)()
    vec = (MMsgHdr * n)()
    for i, b in enumerate(bufs):
        iovs[i] = IoVec(ctypes.addressof(b), len(b))
        vec[i].hdr.iov = ctypes.pointer(iovs[i])
        vec[i].hdr.iovlen = 1
    fn = LIBC.sendmmsg if send else LIBC.recvmmsg
    args = (fd, vec, n, 0) if send else (fd, vec, n, MSG_WAITFORONE, None)
    got = fn(*args)
    if got < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return [vec[i].len for i in range(got)]


def check_mmsg() -> None:
    """sendmmsg of three datagrams, one recvmmsg gets them (the kernel's loops)."""
    r, s = bound(), udp()
    s.connect(r.getsockname())
    out = [ctypes.create_string_buffer(b"m%d" % i * 100, 300) for i in range(3)]
    assert mmsg(s.fileno(), out, send=True) == [300, 300, 300]
    got: list[int] = []
    inb = [ctypes.create_string_buffer(1000) for _ in range(3)]
    end = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < end:
        select.select([r], [], [], 20)
        lens = mmsg(r.fileno(), inb[len(got):], send=False)
        got += lens
    assert got == [300, 300, 300], got
    assert [inb[i].raw[:300] for i in range(3)] == [out[i].raw for i in range(3)]
    r.close()
    s.close()


def check_largest() -> None:
    """A 65,507-byte datagram arrives whole."""
    r, s = bound(), udp()
    data = os.urandom(65507)
    s.sendto(data, r.getsockname())
    assert r.recv(70000) == data
    r.close()
    s.close()


def check_epoll_exclusive() -> None:
    """Two epoll sets with EPOLLEXCLUSIVE on one socket: a datagram wakes one of them."""
    r, s = bound(), udp()
    r.setblocking(False)
    eps = [select.epoll() for _ in range(2)]
    for ep in eps:
        ep.register(r.fileno(), select.EPOLLIN | EPOLLEXCLUSIVE)
    assert not any(ep.poll(0) for ep in eps)
    s.sendto(b"x", r.getsockname())
    end = time.monotonic() + 20
    woken = 0
    while not woken and time.monotonic() < end:
        woken = sum(bool(ep.poll(0.2)) for ep in eps)
    assert woken >= 1, "no exclusive waiter woke"
    assert r.recv(10) == b"x"
    for ep in eps:
        ep.close()
    r.close()
    s.close()


def check_cmsgs() -> None:
    """IP_PKTINFO (destination, the loopback's index), IP_RECVTOS (a TOS sent in a control
    message), SO_TIMESTAMPNS, SO_RXQ_OVFL accepted; IP_RECVERR refused, MSG_ERRQUEUE an
    empty error queue."""
    r, s = bound(), udp()
    for opt in (IP_PKTINFO, IP_RECVTOS):
        r.setsockopt(socket.IPPROTO_IP, opt, 1)
    r.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD, 1)
    r.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    before = time.time()
    s.sendmsg([b"meta"], [(socket.IPPROTO_IP, IP_TOS, struct.pack("i", 0x28))], 0,
              r.getsockname())
    data, anc, _, src = r.recvmsg(100, 1024)
    assert data == b"meta" and src[1] == s.getsockname()[1], (data, src)
    cm = {(lvl, typ): val for lvl, typ, val in anc}
    ifindex, _spec, dst = struct.unpack("i4s4s", cm[(socket.IPPROTO_IP, IP_PKTINFO)])
    assert ifindex == socket.if_nametoindex("lo"), ifindex
    assert socket.inet_ntoa(dst) == "127.0.0.1", socket.inet_ntoa(dst)
    assert cm[(socket.IPPROTO_IP, IP_TOS)][0] == 0x28, cm
    sec, nsec = struct.unpack("qq", cm[(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD)])
    assert abs(sec + nsec / 1e9 - before) < 60, (sec, nsec, before)   # host and guest clocks
    refused(lambda: r.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1), errno.ENOPROTOOPT)
    r.settimeout(None)      # blocking: Python would wait out EAGAIN on a timeout socket
    refused(lambda: r.recvmsg(100, 1024, socket.MSG_ERRQUEUE), errno.EAGAIN)
    r.close()
    s.close()


def check_so_error() -> None:
    """Connected UDP to a closed port: POLLERR, SO_ERROR says ECONNREFUSED once, then 0."""
    gone = bound()
    port = gone.getsockname()
    gone.close()
    s = udp()
    s.connect(port)
    s.send(b"anyone?")
    p = select.poll()
    p.register(s.fileno(), select.POLLIN)
    end = time.monotonic() + 20
    ev = 0
    while not ev & select.POLLERR and time.monotonic() < end:
        ev = dict(p.poll(200)).get(s.fileno(), 0)
    assert ev & select.POLLERR, ev
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    s.close()


def check_ioctls() -> None:
    """The guest's interfaces, as its UDP sockets see them; the queues from the host."""
    r, s = bound(), udp()
    fd = r.fileno()
    lo = socket.if_nametoindex("lo")
    req = struct.pack("16si20x", b"lo", 0)
    assert struct.unpack_from("i", fcntl.ioctl(fd, SIOCGIFINDEX, req), 16)[0] == lo
    name = fcntl.ioctl(fd, SIOCGIFNAME, struct.pack("16si20x", b"", lo))[:16]
    assert name.rstrip(b"\0") == b"lo", name
    flags = struct.unpack_from("H", fcntl.ioctl(fd, SIOCGIFFLAGS, req), 16)[0]
    assert flags & IFF_UP and flags & IFF_LOOPBACK, hex(flags)
    addr = fcntl.ioctl(fd, SIOCGIFADDR, req)
    assert socket.inet_ntoa(addr[20:24]) == "127.0.0.1", addr
    buf = ctypes.create_string_buffer(40 * 16)
    conf = struct.pack("iP", len(buf), ctypes.addressof(buf))
    n = struct.unpack("iP", fcntl.ioctl(fd, SIOCGIFCONF, conf))[0]
    names = {buf.raw[i:i + 16].rstrip(b"\0") for i in range(0, n, 40)}
    assert b"lo" in names, names
    assert struct.unpack("i", fcntl.ioctl(fd, FIONREAD, struct.pack("i", -1)))[0] == 0
    s.sendto(b"12345", r.getsockname())
    select.select([r], [], [], 20)
    assert struct.unpack("i", fcntl.ioctl(fd, FIONREAD, struct.pack("i", -1)))[0] == 5
    assert struct.unpack("i", fcntl.ioctl(fd, SIOCOUTQ, struct.pack("i", -1)))[0] >= 0
    assert r.recv(10) == b"12345"
    r.close()
    s.close()


def check_refusals() -> None:
    """UDP_SEGMENT and UDP_GRO: ENOPROTOOPT, a UDP_SEGMENT control message: EINVAL;
    MSG_OOB: EOPNOTSUPP; SO_BINDTODEVICE (6.7+): ENOPROTOOPT."""
    r, s = bound(), udp()
    refused(lambda: s.setsockopt(SOL_UDP, UDP_SEGMENT, 1000), errno.ENOPROTOOPT)
    refused(lambda: r.setsockopt(SOL_UDP, UDP_GRO, 1), errno.ENOPROTOOPT)
    refused(lambda: s.sendmsg([b"x" * 2000], [(SOL_UDP, UDP_SEGMENT, struct.pack("H", 1000))],
                              0, r.getsockname()), errno.EINVAL)
    refused(lambda: s.sendto(b"x", socket.MSG_OOB, r.getsockname()), errno.EOPNOTSUPP)
    if RELEASE >= (6, 7):
        refused(lambda: s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, b"lo"),
                errno.ENOPROTOOPT)
    s.sendto(b"still", r.getsockname())     # the socket still works after every refusal
    assert r.recv(10) == b"still"
    r.close()
    s.close()


def check_fork_dup() -> None:
    """A dup and a forked child's copy are the same socket: the child sends on it, the
    parent receives on its dup."""
    r, s = bound(), udp()
    d = r.dup()
    pid = os.fork()
    if pid == 0:
        try:
            s.sendto(b"from-child", r.getsockname())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    r.close()
    assert d.recv(20) == b"from-child"
    d.close()
    s.close()


CHECKS: list[Callable[[], None]] = [check_mmsg, check_largest, check_epoll_exclusive,
                                    check_cmsgs, check_so_error, check_ioctls,
                                    check_refusals, check_fork_dup]


def run() -> None:
    """Every check; the failures together in one AssertionError (each named)."""
    failed = []
    for check in CHECKS:
        try:
            check()
        except Exception as e:      # the next check runs: one boot shows every gap
            failed.append(f"{check.__name__}: {type(e).__name__}: {e}")
    assert not failed, "; ".join(failed)
    print(f"udp calls: {len(CHECKS)} checks served or refused as documented", flush=True)
