"""ABI 1.1 in kbp-sod (issue 37 item 5, host side): GETSOCKOPT KBP_SO_OPT_INQ/OUTQ (SIOCINQ,
SIOCOUTQ on the host socket), RECVMSG with KBP_SO_F_META (struct kbp_so_rxmeta written
into guest RAM before the CQE, only for a delivered datagram: PKTINFO's destination, the
receive timestamp, SO_RXQ_OVFL's drops, TOS/TCLASS, TTL/hop limit), SENDMSG with
KBP_SO_MSG_SRC (IP_PKTINFO/IPV6_PKTINFO source) and KBP_SO_MSG_TOS, and the checks on each.
Loopback only."""

from __future__ import annotations

import errno
import socket
import struct
import time

import pytest

from . import sodclient as sc
from .conftest import RAM_SIZE, Sod
from .sodclient import OP, Sqe

# Linux's numbers (not every one is in Python's socket module)
IP_TOS, IP_TTL, IP_PKTINFO, IP_RECVTOS = 1, 2, 8, 13
IPV6_UNICAST_HOPS, IPV6_RECVPKTINFO, IPV6_PKTINFO = 16, 49, 50
IPV6_RECVTCLASS, IPV6_TCLASS = 66, 67
META = 0x30000
CANARY = b"\xa5" * sc.RXMETA.size
KNOWN = sc.META_DST | sc.META_TSTAMP | sc.META_DROPS | sc.META_TOS | sc.META_TTL


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def bound(g: sc.Guest, family: int = sc.AF_INET, host: str = "127.0.0.1") -> tuple[int, int]:
    h = g.socket(family)
    cqe = g.bind(h, host, 0, family)
    assert cqe.res == 0, cqe
    return h, cqe.addr[2]


def recv_meta(g: sc.Guest, h: int, buf: int = 0x10000, n: int = 2048, meta: int = META,
              flags: int = sc.F_WAIT | sc.F_META, msg_flags: int = 0) -> sc.Cqe:
    return g.call(Sqe(OP["RECVMSG"], sock=h, flags=flags, msg_flags=msg_flags, arg1=meta,
                      segs=[(buf, n)]))


def test_version_and_features(guest: sc.Guest) -> None:
    assert (guest.hdr("version_major"), guest.hdr("version_minor")) == (1, 1)
    feats = guest.hdr("host_features")
    want = (sc.FEAT_POLL_ARM | sc.FEAT_NEED_IRQ | sc.FEAT_HOST_POLL | sc.FEAT_META
            | sc.FEAT_QUEUE_OPTS)
    assert feats == want, hex(feats)


def test_inq_and_outq(guest: sc.Guest, peer: socket.socket) -> None:
    g = guest
    h, port = bound(g)
    get = OP["GETSOCKOPT"]
    assert g.call(Sqe(get, sock=h, arg0=sc.OPT["INQ"])).res == 0  # nothing queued
    assert g.call(Sqe(get, sock=h, arg0=sc.OPT["OUTQ"])).res == 0
    peer.sendto(b"x" * 123, ("127.0.0.1", port))
    peer.sendto(b"y" * 7, ("127.0.0.1", port))
    g.wait_until(lambda: g.call(Sqe(get, sock=h, arg0=sc.OPT["INQ"])).res == 123,
                 "SIOCINQ: the next datagram's payload")
    assert g.call(Sqe(OP["RECVMSG"], sock=h, segs=[(0x1000, 200)])).res == 123
    assert g.call(Sqe(get, sock=h, arg0=sc.OPT["INQ"])).res == 7
    # get only
    for opt in ("INQ", "OUTQ"):
        cqe = g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT[opt],
                         opt=struct.pack("<i", 1).ljust(16, b"\0")))
        assert cqe.res == -errno.EINVAL, opt
    assert g.call(Sqe(get, sock=h, arg0=14)).res == -errno.ENOPROTOOPT


def test_recv_meta_ipv4(guest: sc.Guest, peer: socket.socket) -> None:
    g = guest
    h, port = bound(g)
    peer.setsockopt(socket.IPPROTO_IP, IP_TOS, 0x28)
    peer.setsockopt(socket.IPPROTO_IP, IP_TTL, 33)
    g.poke(META, CANARY)
    t0 = time.time_ns()
    peer.sendto(b"meta!", ("127.0.0.1", port))
    cqe = recv_meta(g, h)
    t1 = time.time_ns()
    assert cqe.res == 5 and g.peek(0x10000, 5) == b"meta!"
    m = g.rxmeta(META)
    assert m.valid == sc.META_DST | sc.META_TSTAMP | sc.META_TOS | sc.META_TTL, m
    assert m.dst == (sc.AF_INET, "127.0.0.1", 0)
    assert (m.tos, m.ttl, m.drops) == (0x28, 33, 0)
    assert t0 <= m.tstamp_ns <= t1, (t0, m.tstamp_ns, t1)
    assert m.reserved == b"\0" * 16
    # a parked receive writes it when its datagram comes; MSG_PEEK reports it too
    g.poke(META, CANARY)
    tag = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT | sc.F_META, arg1=META,
                    msg_flags=sc.MSG_PEEK, segs=[(0x10000, 64)]))
    assert g.no_cqe_for(tag, 0.1)
    assert g.peek(META, len(CANARY)) == CANARY, "written before a datagram came"
    peer.setsockopt(socket.IPPROTO_IP, IP_TOS, 0x10)
    peer.sendto(b"parked", ("127.0.0.1", port))
    assert g.wait_tag(tag).res == 6
    m = g.rxmeta(META)
    assert m.valid & sc.META_TOS and m.tos == 0x10 and m.valid & ~KNOWN == 0


def test_recv_meta_ipv6_and_v4_mapped(guest: sc.Guest) -> None:
    if not has_ipv6_loopback():
        pytest.skip(reason="this host has no IPv6 loopback address")
    g = guest
    h, port = bound(g, sc.AF_INET6, "::1")
    p6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        p6.setsockopt(socket.IPPROTO_IPV6, IPV6_TCLASS, 0x40)
        p6.setsockopt(socket.IPPROTO_IPV6, IPV6_UNICAST_HOPS, 7)
        p6.sendto(b"six", ("::1", port))
        cqe = recv_meta(g, h)
        assert cqe.res == 3 and cqe.addr[:2] == (sc.AF_INET6, "::1")
        m = g.rxmeta(META)
        assert m.valid == sc.META_DST | sc.META_TSTAMP | sc.META_TOS | sc.META_TTL, m
        assert m.dst == (sc.AF_INET6, "::1", 0) and (m.tos, m.ttl) == (0x40, 7)
    finally:
        p6.close()
    # a dual-stack IPv6 socket receiving IPv4: the destination v4-mapped, as the kernel says
    d = g.socket(sc.AF_INET6)
    cqe = g.bind(d, "::", 0, sc.AF_INET6)
    assert cqe.res == 0, cqe
    p4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        p4.setsockopt(socket.IPPROTO_IP, IP_TOS, 0x20)
        p4.sendto(b"four", ("127.0.0.1", cqe.addr[2]))
        assert recv_meta(g, d).res == 4
        m = g.rxmeta(META)
        assert m.dst == (sc.AF_INET6, "::ffff:127.0.0.1", 0), m
        assert m.valid & sc.META_TOS and m.tos == 0x20 and m.valid & sc.META_TTL
    finally:
        p4.close()


def test_recv_meta_drops(guest: sc.Guest, peer: socket.socket) -> None:
    """SO_RXQ_OVFL: a datagram queued after drops carries the socket's drop count; the
    kernel says nothing while it is 0, and neither does the rxmeta (valid bit clear)."""
    g = guest
    h, port = bound(g)
    assert g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT["RCVBUF"],
                      opt=struct.pack("<i", 1).ljust(16, b"\0"))).res == 0
    for _ in range(40):
        peer.sendto(b"z" * 1000, ("127.0.0.1", port))
    first = recv_meta(g, h, flags=sc.F_META)
    assert first.res == 1000
    assert not g.rxmeta(META).valid & sc.META_DROPS  # queued before any drop
    peer.sendto(b"after", ("127.0.0.1", port))  # room again: queued with the count
    drops = 0
    for _ in range(50):
        cqe = recv_meta(g, h, flags=sc.F_META)
        if cqe.res < 0:
            assert cqe.res == -errno.EAGAIN
            break
        m = g.rxmeta(META)
        if m.valid & sc.META_DROPS:
            drops = m.drops
    assert drops > 0, "no SO_RXQ_OVFL count after drops"


def test_meta_written_only_for_a_delivered_datagram(guest: sc.Guest) -> None:
    g = guest
    h, _port = bound(g)
    g.poke(META, CANARY)
    # nothing queued: EAGAIN, nothing written
    cqe = recv_meta(g, h, flags=sc.F_META)
    assert cqe.res == -errno.EAGAIN
    assert g.peek(META, len(CANARY)) == CANARY
    # a parked receive ended by SHUT_RD: an end of data, no datagram, nothing written
    tag = g.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT | sc.F_META, arg1=META,
                    segs=[(0x10000, 64)]))
    assert g.no_cqe_for(tag, 0.05)
    assert g.call(Sqe(OP["SHUTDOWN"], sock=h, arg0=0)).res in (0, -errno.ENOTCONN)
    assert g.wait_tag(tag).res == 0
    assert g.peek(META, len(CANARY)) == CANARY
    # cancelled: nothing written
    h2, _ = bound(g)
    tag = g.put(Sqe(OP["RECVMSG"], sock=h2, flags=sc.F_WAIT | sc.F_META, arg1=META,
                    segs=[(0x10000, 64)]))
    assert g.no_cqe_for(tag, 0.05)
    assert g.call(Sqe(OP["CANCEL"], sock=h2, arg1=tag)).res == 0
    assert g.wait_tag(tag).res == -errno.ECANCELED
    assert g.peek(META, len(CANARY)) == CANARY


def test_meta_and_send_options_are_checked(guest: sc.Guest, sod: Sod) -> None:
    g = guest
    h, _port = bound(g)
    recv, send = OP["RECVMSG"], OP["SENDMSG"]
    buf = 0x10000
    seg = [(buf, 256)]
    to = sc.pack_addr(sc.AF_INET, "127.0.0.1", 9)
    src = sc.src_opt(sc.AF_INET, "127.0.0.1")
    cases: list[tuple[str, Sqe, int]] = [
        ("rxmeta past RAM", Sqe(recv, sock=h, flags=sc.F_META, arg1=RAM_SIZE, segs=seg),
         -errno.EFAULT),
        ("rxmeta across the end of RAM",
         Sqe(recv, sock=h, flags=sc.F_META, arg1=RAM_SIZE - 32, segs=seg), -errno.EFAULT),
        ("rxmeta gpa + 64 overflows",
         Sqe(recv, sock=h, flags=sc.F_META, arg1=(1 << 64) - 32, segs=seg), -errno.EFAULT),
        ("rxmeta on the payload",
         Sqe(recv, sock=h, flags=sc.F_META, arg1=buf + 100, segs=seg), -errno.EINVAL),
        ("rxmeta just before the payload overlapping",
         Sqe(recv, sock=h, flags=sc.F_META, arg1=buf - 63, segs=seg), -errno.EINVAL),
        ("arg1 without F_META", Sqe(recv, sock=h, arg1=META, segs=seg), -errno.EINVAL),
        ("F_META on a send", Sqe(send, sock=h, flags=sc.F_META, arg1=META, segs=seg,
                                 addr=to), -errno.EINVAL),
        ("F_META on NOP", Sqe(OP["NOP"], flags=sc.F_META), -errno.EINVAL),
        ("MSG_SRC on a receive", Sqe(recv, sock=h, msg_flags=sc.MSG_SRC, opt=src, segs=seg),
         -errno.EINVAL),
        ("MSG_TOS on a receive", Sqe(recv, sock=h, msg_flags=sc.MSG_TOS, segs=seg),
         -errno.EINVAL),
        ("TOS above 255", Sqe(send, sock=h, msg_flags=sc.MSG_TOS, arg0=256, segs=seg,
                              addr=to), -errno.EINVAL),
        ("arg0 without MSG_TOS", Sqe(send, sock=h, arg0=16, segs=seg, addr=to),
         -errno.EINVAL),
        ("opt without MSG_SRC", Sqe(send, sock=h, opt=src, segs=seg, addr=to),
         -errno.EINVAL),
        ("IPv4 source with bytes past 4", Sqe(send, sock=h, msg_flags=sc.MSG_SRC,
                                              opt=src[:4] + b"\1" * 12, segs=seg, addr=to),
         -errno.EINVAL),
        ("arg1 on a send", Sqe(send, sock=h, arg1=1, segs=seg, addr=to), -errno.EINVAL),
    ]
    g.poke(META, CANARY)
    before, after = g.expect(cases)
    assert after["rejects"] - before["rejects"] == len(cases)
    assert after["bytes_out"] == before["bytes_out"]
    assert g.peek(META, len(CANARY)) == CANARY
    assert sod.alive()


def _recv_anc(s: socket.socket) -> tuple[bytes, tuple[str, int], dict[tuple[int, int], bytes]]:
    data, anc, _flags, addr = s.recvmsg(2048, 1024)
    return data, addr[:2], {(lvl, typ): raw for lvl, typ, raw in anc}


def test_send_source_and_tos_ipv4(guest: sc.Guest, peer: socket.socket) -> None:
    g = guest
    h = g.socket()
    peer.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    peer.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
    to = sc.pack_addr(sc.AF_INET, "127.0.0.1", peer.getsockname()[1])
    g.poke(0x10000, b"from 127.0.0.2")
    cqe = g.call(Sqe(OP["SENDMSG"], sock=h, msg_flags=sc.MSG_SRC | sc.MSG_TOS, arg0=0x48,
                     opt=sc.src_opt(sc.AF_INET, "127.0.0.2"), segs=[(0x10000, 14)], addr=to))
    assert cqe.res == 14, cqe
    data, src, anc = _recv_anc(peer)
    assert data == b"from 127.0.0.2" and src[0] == "127.0.0.2"
    assert anc[(socket.IPPROTO_IP, IP_TOS)][0] == 0x48
    # the source only, the TOS only
    assert g.call(Sqe(OP["SENDMSG"], sock=h, msg_flags=sc.MSG_TOS, arg0=0x20,
                      segs=[(0x10000, 4)], addr=to)).res == 4
    data, src, anc = _recv_anc(peer)
    assert anc[(socket.IPPROTO_IP, IP_TOS)][0] == 0x20
    # a source the VM's netns does not have: the host kernel refuses it (no spoofing)
    cqe = g.call(Sqe(OP["SENDMSG"], sock=h, msg_flags=sc.MSG_SRC,
                     opt=sc.src_opt(sc.AF_INET, "192.0.2.1"), segs=[(0x10000, 4)], addr=to))
    assert cqe.res in (-errno.EINVAL, -errno.ENETUNREACH), cqe
    peer.settimeout(0.1)
    with pytest.raises(TimeoutError):
        peer.recv(100)


def test_send_source_and_tclass_ipv6(guest: sc.Guest) -> None:
    if not has_ipv6_loopback():
        pytest.skip(reason="this host has no IPv6 loopback address")
    g = guest
    h = g.socket(sc.AF_INET6)
    p6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        p6.bind(("::1", 0))
        p6.settimeout(5)
        p6.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
        p6.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
        to = sc.pack_addr(sc.AF_INET6, "::1", p6.getsockname()[1])
        g.poke(0x10000, b"v6")
        cqe = g.call(Sqe(OP["SENDMSG"], sock=h, msg_flags=sc.MSG_SRC | sc.MSG_TOS, arg0=0x20,
                         opt=sc.src_opt(sc.AF_INET6, "::1"), segs=[(0x10000, 2)], addr=to))
        assert cqe.res == 2, cqe
        data, src, anc = _recv_anc(p6)
        assert data == b"v6" and src[0] == "::1"
        assert struct.unpack("<i", anc[(socket.IPPROTO_IPV6, IPV6_TCLASS)])[0] == 0x20
        cqe = g.call(Sqe(OP["SENDMSG"], sock=h, msg_flags=sc.MSG_SRC,
                         opt=sc.src_opt(sc.AF_INET6, "2001:db8::1"), segs=[(0x10000, 2)],
                         addr=to))
        assert cqe.res == -errno.EINVAL, cqe
    finally:
        p6.close()
