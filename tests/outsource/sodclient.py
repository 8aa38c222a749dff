"""The guest side of kbp socket outsourcing, in user space, for testing kbp-sod.

It does what QEMU's ivshmem-doorbell and the guest module do: connects to the daemon's
ivshmem server socket, takes the region fd and the eventfds, maps the region, attaches
(the reset handshake of docs/design.md 11.5), fills SQEs, rings doorbells, reads CQEs.
"Guest RAM" is a file the test also maps; its offsets are the guest-physical addresses
(the daemon's default RAM map is the identity over the file).

Layout constants mirror outsource/include/kbp_so_abi.h; test_abi_layout checks them
against the C compiler's offsetof() (outsource/sod/abi_dump).
"""

from __future__ import annotations

import mmap
import os
import select
import socket
import struct
import time
from dataclasses import dataclass, field

MAGIC = 0x4942414F5350424B
HEADER_SIZE = 4096
QCTL_SIZE = 256
SQE_SIZE = 384
CQE_SIZE = 64
MAX_SEGS = 18

# header: (offset, struct format)
H = {
    "magic": (0, "<Q"),
    "version_major": (8, "<H"),
    "version_minor": (10, "<H"),
    "header_size": (12, "<I"),
    "region_size": (16, "<Q"),
    "epoch": (24, "<I"),
    "host_state": (28, "<I"),
    "nr_queues": (32, "<I"),
    "ring_entries": (36, "<I"),
    "queue_offset": (40, "<I"),
    "queue_stride": (44, "<I"),
    "host_features": (48, "<Q"),
    "heartbeat": (56, "<Q"),
    "max_sockets": (64, "<I"),
    "max_segs": (68, "<I"),
    "host_ack_gen": (72, "<I"),
    "guest_features": (128, "<Q"),
    "guest_state": (136, "<I"),
    "guest_gen": (140, "<I"),
    "guest_epoch": (144, "<I"),
}
# queue control block
Q = {
    "sq_tail": (0, "<I"),
    "cq_head": (4, "<I"),
    "need_irq": (8, "<I"),
    "sq_head": (64, "<I"),
    "cq_tail": (68, "<I"),
    "host_polling": (72, "<I"),
    "host_error": (76, "<I"),
    "inflight": (80, "<I"),
    "requests": (128, "<Q"),
    "completions": (136, "<Q"),
    "rejects": (144, "<Q"),
    "bytes_in": (152, "<Q"),
    "bytes_out": (160, "<Q"),
    "copies": (168, "<Q"),
    "irqs": (176, "<Q"),
    "doorbells": (184, "<Q"),
}
SQE_HEAD = struct.Struct("<QBBHIIIQ")  # tag op nr_segs flags sock msg_flags arg0 arg1
ADDR = struct.Struct("<HHI16sII")  # family port flowinfo addr scope_id pad
SEG = struct.Struct("<QII")  # gpa len pad
CQE_HEAD = struct.Struct("<QiIIIIB3x")  # tag res sock msg_len out_flags epoch op
SQE_OFF = {"tag": 0, "op": 8, "nr_segs": 9, "flags": 10, "sock": 12, "msg_flags": 16,
           "arg0": 20, "arg1": 24, "addr": 32, "opt": 64, "reserved": 80, "seg": 96}
CQE_OFF = {"tag": 0, "res": 8, "sock": 12, "msg_len": 16, "out_flags": 20, "epoch": 24,
           "op": 28, "addr": 32}
ADDR_OFF = {"family": 0, "port": 2, "flowinfo": 4, "addr": 8, "scope_id": 24}

OP = {"NOP": 0, "SOCKET": 1, "BIND": 2, "CONNECT": 3, "SENDMSG": 4, "RECVMSG": 5,
      "POLL": 6, "SETSOCKOPT": 7, "GETSOCKOPT": 8, "SHUTDOWN": 9, "CLOSE": 10,
      "CANCEL": 11, "GETNAME": 12}
F_WAIT, F_ARM, F_META = 1, 2, 4
MSG_PEEK, MSG_TRUNC, MSG_DONTWAIT, MSG_SRC, MSG_TOS = 1, 2, 4, 8, 16
OUT_TRUNC = 1
POLL_IN, POLL_OUT, POLL_ERR, POLL_HUP = 1, 2, 4, 8
OPT = {"RCVBUF": 1, "SNDBUF": 2, "REUSEADDR": 3, "REUSEPORT": 4, "PRIORITY": 5,
       "IP_TOS": 6, "IP_TTL": 7, "V6ONLY": 8, "TCLASS": 9, "HOPS": 10, "ERROR": 11,
       "INQ": 12, "OUTQ": 13}
# ABI 1.1 (host_features)
FEAT_POLL_ARM, FEAT_NEED_IRQ, FEAT_HOST_POLL, FEAT_META, FEAT_QUEUE_OPTS = 1, 2, 4, 8, 16
# struct kbp_so_rxmeta: dst, tstamp_ns, drops, tos, ttl, valid, reserved[2]
RXMETA = struct.Struct("<32sQIBBH16s")
RXMETA_OFF = {"dst": 0, "tstamp_ns": 32, "drops": 40, "tos": 44, "ttl": 45, "valid": 46,
              "reserved": 48}
META_DST, META_TSTAMP, META_DROPS, META_TOS, META_TTL = 1, 2, 4, 8, 16
AF_INET, AF_INET6 = 2, 10
HOST_DOWN, HOST_UP, HOST_STOPPING = 0, 1, 2
GUEST_ABSENT, GUEST_RESET, GUEST_ATTACHED = 0, 1, 2
QERR_SQ_INDEX, QERR_CQ_INDEX = 1, 2


def pack_addr(family: int = 0, host: str = "", port: int = 0) -> bytes:
    """An ABI address; host in its family's text form, port in host order."""
    if family == AF_INET:
        raw = socket.inet_pton(socket.AF_INET, host).ljust(16, b"\0")
    elif family == AF_INET6:
        raw = socket.inet_pton(socket.AF_INET6, host)
    else:
        raw = b"\0" * 16
    return ADDR.pack(family, socket.htons(port), 0, raw, 0, 0)


def unpack_addr(raw: bytes) -> tuple[int, str, int]:
    family, port, _flow, addr, _scope, _pad = ADDR.unpack(raw)
    if family == AF_INET:
        return family, socket.inet_ntop(socket.AF_INET, addr[:4]), socket.ntohs(port)
    if family == AF_INET6:
        return family, socket.inet_ntop(socket.AF_INET6, addr), socket.ntohs(port)
    return family, "", 0


@dataclass
class Sqe:
    op: int
    tag: int = 0
    sock: int = 0
    flags: int = 0
    msg_flags: int = 0
    arg0: int = 0
    arg1: int = 0
    addr: bytes = b"\0" * 32
    opt: bytes = b"\0" * 16
    reserved: tuple[int, int] = (0, 0)
    segs: list[tuple[int, int]] = field(default_factory=list)
    nr_segs: int | None = None  # None: len(segs); set to lie on purpose

    def pack(self) -> bytes:
        nr = len(self.segs) if self.nr_segs is None else self.nr_segs
        b = bytearray(SQE_SIZE)
        SQE_HEAD.pack_into(b, 0, self.tag, self.op, nr, self.flags, self.sock,
                           self.msg_flags, self.arg0, self.arg1)
        b[32:64] = self.addr
        b[64:80] = self.opt
        struct.pack_into("<QQ", b, 80, *self.reserved)
        for i, (gpa, ln) in enumerate(self.segs[:MAX_SEGS]):
            SEG.pack_into(b, 96 + 16 * i, gpa, ln, 0)
        return bytes(b)


@dataclass
class Cqe:
    tag: int
    res: int
    sock: int
    msg_len: int
    out_flags: int
    epoch: int
    op: int
    addr: tuple[int, str, int]

    @classmethod
    def unpack(cls, raw: bytes) -> Cqe:
        tag, res, sock, msg_len, out_flags, epoch, op = CQE_HEAD.unpack_from(raw, 0)
        return cls(tag, res, sock, msg_len, out_flags, epoch, op, unpack_addr(raw[32:64]))


@dataclass
class RxMeta:
    """What the host wrote at a RECVMSG's KBP_SO_F_META address (kbp_so_abi.h)."""

    dst: tuple[int, str, int]
    tstamp_ns: int
    drops: int
    tos: int
    ttl: int
    valid: int
    reserved: bytes

    @classmethod
    def unpack(cls, raw: bytes) -> RxMeta:
        dst, ts, drops, tos, ttl, valid, reserved = RXMETA.unpack(raw)
        return cls(unpack_addr(dst), ts, drops, tos, ttl, valid, reserved)


def src_opt(family: int, host: str) -> bytes:
    """SENDMSG's KBP_SO_MSG_SRC source address in opt[]: 4 bytes (IPv4) or 16, zero-padded."""
    af = socket.AF_INET if family == AF_INET else socket.AF_INET6
    return socket.inet_pton(af, host).ljust(16, b"\0")


class ProtocolError(Exception):
    pass


def _recv_msg(conn: socket.socket, timeout: float) -> tuple[int, int | None]:
    """One ivshmem server message: an 8-byte LE number and at most one fd."""
    conn.settimeout(timeout)
    data, fds, _flags, _addr = socket.recv_fds(conn, 8, 1)
    if len(data) != 8:
        for fd in fds:
            os.close(fd)
        raise ProtocolError(f"short message: {data!r}")
    return struct.unpack("<q", data)[0], (fds[0] if fds else None)


class Guest:
    """A fake guest attached to one VM of kbp-sod."""

    def __init__(self, sock_path: str, ram_path: str, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(sock_path)
        self.version, _ = _recv_msg(self.conn, timeout)
        self.my_id, _ = _recv_msg(self.conn, timeout)
        minus1, shm_fd = _recv_msg(self.conn, timeout)
        if minus1 != -1 or shm_fd is None:
            raise ProtocolError(f"expected -1 with the region fd, got {minus1}")
        self.region_fd = shm_fd
        size = os.fstat(shm_fd).st_size
        self.region = mmap.mmap(shm_fd, size)
        self.nr_queues = self.hdr("nr_queues")
        self.entries = self.hdr("ring_entries")
        # peer 0 (the daemon): doorbells; own ID: our interrupts, one per queue each
        self.peer_id: int | None = None
        self.doorbells: list[int] = []
        self.irqs: list[int] = []
        for _ in range(2 * self.nr_queues):
            val, fd = _recv_msg(self.conn, timeout)
            if fd is None:
                raise ProtocolError(f"message {val} without an fd")
            if val == self.my_id:
                self.irqs.append(fd)
            else:
                self.peer_id = val
                self.doorbells.append(fd)
        self.ram_fd = os.open(ram_path, os.O_RDWR)
        self.ram = mmap.mmap(self.ram_fd, os.fstat(self.ram_fd).st_size)
        self.sq_tail = [0] * self.nr_queues
        self.cq_head = [0] * self.nr_queues
        self.next_tag = 1
        self.stash: dict[int, Cqe] = {}

    def close(self) -> None:
        for fd in self.doorbells + self.irqs:
            os.close(fd)
        self.doorbells, self.irqs = [], []
        self.region.close()
        os.close(self.region_fd)
        self.ram.close()
        os.close(self.ram_fd)
        self.conn.close()

    # shared words
    def hdr(self, name: str) -> int:
        off, fmt = H[name]
        return struct.unpack_from(fmt, self.region, off)[0]

    def set_hdr(self, name: str, value: int) -> None:
        off, fmt = H[name]
        struct.pack_into(fmt, self.region, off, value)

    def qbase(self, q: int) -> int:
        return self.hdr("queue_offset") + q * self.hdr("queue_stride")

    def qctl(self, q: int, name: str) -> int:
        off, fmt = Q[name]
        return struct.unpack_from(fmt, self.region, self.qbase(q) + off)[0]

    def set_qctl(self, q: int, name: str, value: int) -> None:
        off, fmt = Q[name]
        struct.pack_into(fmt, self.region, self.qbase(q) + off, value)

    def counters(self, q: int = 0) -> dict[str, int]:
        return {k: self.qctl(q, k) for k in ("requests", "completions", "rejects", "bytes_in",
                                             "bytes_out", "copies", "irqs", "doorbells")}

    def expect(self, cases: list[tuple[str, Sqe, int]]) -> tuple[dict[str, int],
                                                              dict[str, int]]:
        """Each (what, request, the result it must get) called in turn; the counters before
        and after, for the caller's checks of what moved."""
        before = self.counters()
        for what, sqe, want in cases:
            cqe = self.call(sqe)
            assert cqe.res == want, f"{what}: {cqe.res} != {want}"
        return before, self.counters()

    # doorbells and interrupts
    def ring(self, q: int = 0) -> None:
        os.write(self.doorbells[q], struct.pack("<Q", 1))

    def irq_count(self, q: int = 0) -> int:
        """Reads (and clears) queue q's interrupt eventfd: 0 if not raised."""
        try:
            return struct.unpack("<Q", os.read(self.irqs[q], 8))[0]
        except BlockingIOError:
            return 0

    def wait_until(self, cond, what: str, timeout: float | None = None) -> None:
        end = time.monotonic() + (timeout or self.timeout)
        while not cond():
            if time.monotonic() > end:
                raise TimeoutError(what)
            time.sleep(0.002)

    def attach(self) -> None:
        """The reset handshake, then ATTACHED at the current epoch."""
        gen = (self.hdr("guest_gen") + 1) & 0xFFFFFFFF
        self.set_hdr("guest_state", GUEST_RESET)
        self.set_hdr("guest_gen", gen)
        self.ring(0)
        self.wait_until(lambda: self.hdr("host_ack_gen") == gen, "reset ack")
        self.sq_tail = [0] * self.nr_queues
        self.cq_head = [0] * self.nr_queues
        self.stash.clear()
        self.set_hdr("guest_epoch", self.hdr("epoch"))
        self.set_hdr("guest_state", GUEST_ATTACHED)
        for q in range(self.nr_queues):
            self.set_qctl(q, "need_irq", 1)

    # rings
    def put(self, sqe: Sqe, q: int = 0, doorbell: bool = True) -> int:
        """Writes one SQE and publishes it; returns its tag."""
        if not sqe.tag:
            sqe.tag = self.next_tag
            self.next_tag += 1
        # a real guest never overwrites an SQE the host has not consumed
        self.wait_until(lambda: (self.sq_tail[q] - self.qctl(q, "sq_head")) & 0xFFFFFFFF
                        < self.entries, f"room in SQ {q}")
        slot = self.sq_tail[q] & (self.entries - 1)
        off = self.qbase(q) + QCTL_SIZE + slot * SQE_SIZE
        self.region[off:off + SQE_SIZE] = sqe.pack()
        self.sq_tail[q] = (self.sq_tail[q] + 1) & 0xFFFFFFFF
        self.set_qctl(q, "sq_tail", self.sq_tail[q])
        if doorbell and not self.qctl(q, "host_polling"):
            self.ring(q)
        return sqe.tag

    def poll_cqe(self, q: int = 0) -> Cqe | None:
        if self.qctl(q, "cq_tail") == self.cq_head[q]:
            return None
        slot = self.cq_head[q] & (self.entries - 1)
        off = self.qbase(q) + QCTL_SIZE + self.entries * SQE_SIZE + slot * CQE_SIZE
        cqe = Cqe.unpack(bytes(self.region[off:off + CQE_SIZE]))
        self.cq_head[q] = (self.cq_head[q] + 1) & 0xFFFFFFFF
        self.set_qctl(q, "cq_head", self.cq_head[q])
        return cqe

    def wait_tag(self, tag: int, q: int = 0, timeout: float | None = None) -> Cqe:
        end = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while tag not in self.stash:
            cqe = self.poll_cqe(q)
            if cqe is not None:
                self.stash[cqe.tag] = cqe
                continue
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no completion for tag {tag} on queue {q}")
            select.select([self.irqs[q]], [], [], min(left, 0.02))
            self.irq_count(q)
        return self.stash.pop(tag)

    def call(self, sqe: Sqe, q: int = 0, timeout: float | None = None) -> Cqe:
        return self.wait_tag(self.put(sqe, q), q, timeout)

    def no_cqe_for(self, tag: int, seconds: float, q: int = 0) -> bool:
        try:
            cqe = self.wait_tag(tag, q, seconds)
        except TimeoutError:
            return True
        self.stash[tag] = cqe
        return False

    # helpers for the usual requests
    def socket(self, family: int = AF_INET, q: int = 0) -> int:
        cqe = self.call(Sqe(OP["SOCKET"], arg0=family), q)
        assert cqe.res == 0, cqe
        return cqe.sock

    def bind(self, sock: int, host: str = "127.0.0.1", port: int = 0,
             family: int = AF_INET) -> Cqe:
        return self.call(Sqe(OP["BIND"], sock=sock, addr=pack_addr(family, host, port)))

    # guest RAM
    def poke(self, gpa: int, data: bytes) -> None:
        self.ram[gpa:gpa + len(data)] = data

    def peek(self, gpa: int, n: int) -> bytes:
        return bytes(self.ram[gpa:gpa + n])

    def rxmeta(self, gpa: int) -> RxMeta:
        return RxMeta.unpack(self.peek(gpa, RXMETA.size))
