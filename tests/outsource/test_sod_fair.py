"""Two VMs on one kbp-sod (issue 37 items 4 and 10, host side; docs/design.md 11.6): a worker
process per VM, so a socket handle of VM A means nothing to B, B's SO_REUSEPORT group is
not A's (each VM has its own network namespace), a flood of A's requests neither starves B
nor delays A's own heartbeat (the heartbeat is written between budgets), and file
descriptors are per VM: A's max-sockets answers A with EMFILE, never B, and a budget that
RLIMIT_NOFILE cannot hold is refused at start.

Counts, not timings, are what these assert, with generous time bounds: a flood that lasts
seconds against round trips and heartbeats that must keep coming during it."""

from __future__ import annotations

import errno
import itertools
import multiprocessing
import os
import resource
import shutil
import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from . import sodclient as sc
from .conftest import LEGACY, sod_user
from .netns import netns
from .nsutil import socket_in
from .sodclient import OP, Sqe
from .sodproc import Daemon, vm_spec


def flags() -> list[str]:
    return [] if LEGACY else ["--user", sod_user()]


@pytest.fixture
def two_ns() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip(reason="needs root and iproute2 (a network namespace per VM)")
    with ExitStack() as stack:
        yield (stack.enter_context(netns("kbpsoA")), stack.enter_context(netns("kbpsoB")))


def nofile(soft: int, hard: int) -> Callable[[], None]:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limit


def reuseport(g: sc.Guest, h: int) -> None:
    cqe = g.call(Sqe(OP["SETSOCKOPT"], sock=h, arg0=sc.OPT["REUSEPORT"],
                     opt=struct.pack("<i", 1).ljust(16, b"\0")))
    assert cqe.res == 0, cqe


def test_handles_and_reuseport_groups_are_per_vm(sod_bin: Path, tmp_path: Path,
                                                 two_ns: tuple[str, str],
                                                 daemons: list[Daemon]) -> None:
    ns_a, ns_b = two_ns
    d = Daemon(sod_bin, tmp_path, [vm_spec(tmp_path, "a", ns=ns_a),
                                   vm_spec(tmp_path, "b", ns=ns_b)], flags=flags())
    daemons.append(d)
    d.wait_ready()
    ga, gb = d.guest(0), d.guest(1)
    try:
        ha = ga.socket()
        reuseport(ga, ha)
        cqe = ga.bind(ha, "127.0.0.1", 0)
        assert cqe.res == 0
        port = cqe.addr[2]
        # A's handle names nothing of B's: nothing at all, then B's own socket
        assert gb.call(Sqe(OP["GETNAME"], sock=ha)).res == -errno.EBADF
        hb = gb.socket()
        assert hb == ha  # the same number, B's own table
        cqe = gb.call(Sqe(OP["GETNAME"], sock=ha))
        assert cqe.res == 0 and cqe.addr[2] != port  # B's unbound socket, not A's
        # B binds A's port with SO_REUSEPORT: allowed, in B's namespace, a group of its own
        reuseport(gb, hb)
        assert gb.bind(hb, "127.0.0.1", port).res == 0
        # a second socket of A joins A's group (as within one guest)
        ha2 = ga.socket()
        reuseport(ga, ha2)
        assert ga.bind(ha2, "127.0.0.1", port).res == 0
        ta = [ga.put(Sqe(OP["RECVMSG"], sock=h, flags=sc.F_WAIT, segs=[(0x1000 * (i + 1), 64)]))
              for i, h in enumerate((ha, ha2))]
        tb = gb.put(Sqe(OP["RECVMSG"], sock=hb, flags=sc.F_WAIT, segs=[(0x1000, 64)]))
        assert gb.no_cqe_for(tb, 0.05)
        with socket_in(ns_b) as pb:
            for i in range(16):  # spread over A's group by source port: 16 senders
                with socket_in(ns_a) as s:
                    s.sendto(b"to A %d" % i, ("127.0.0.1", port))
            got = [ga.wait_tag(t) for t in ta]
            assert all(c.res > 0 for c in got)
            assert gb.no_cqe_for(tb, 0.2), "a datagram for A reached B's group"
            pb.sendto(b"to B", ("127.0.0.1", port))
            cqe = gb.wait_tag(tb)
            assert cqe.res == 4 and gb.peek(0x1000, 4) == b"to B"
    finally:
        ga.close()
        gb.close()


def fill_queue(g: sc.Guest, q: int, sqe: Sqe, n: int, tag0: int) -> None:
    """n copies of sqe (tags tag0...) straight into queue q's SQ (empty), then published."""
    base = g.qbase(q) + sc.QCTL_SIZE
    raw = bytearray(sqe.pack())
    for i in range(n):
        struct.pack_into("<Q", raw, 0, tag0 + i)
        slot = (g.sq_tail[q] + i) & (g.entries - 1)
        g.region[base + slot * sc.SQE_SIZE:base + (slot + 1) * sc.SQE_SIZE] = raw
    g.sq_tail[q] = (g.sq_tail[q] + n) & 0xFFFFFFFF
    g.set_qctl(q, "sq_tail", g.sq_tail[q])


def flood(g: sc.Guest, sqe: Sqe, stop: Any) -> None:
    """A guest that keeps every queue full (a process of its own: no GIL shared with the
    test): a queue the host has emptied gets its completions read and is filled again."""
    tag = 1 << 40
    while not stop.is_set():
        for q in range(g.nr_queues):
            if g.qctl(q, "sq_head") != g.sq_tail[q]:
                continue
            g.cq_head[q] = g.qctl(q, "cq_tail")
            g.set_qctl(q, "cq_head", g.cq_head[q])
            fill_queue(g, q, sqe, g.entries, tag)
            tag += g.entries
            g.ring(q)
        time.sleep(0.001)


WINDOW = 2.0


def test_a_flooded_vm_starves_neither_the_other_nor_its_own_heartbeat(
        sod_bin: Path, tmp_path: Path, two_ns: tuple[str, str],
        daemons: list[Daemon]) -> None:
    """VM A's guest keeps 64 queues of 1024 entries full of 60 kB sends for two seconds
    (the most one VM can ask at once: 65,536 requests); meanwhile B's NOPs keep completing
    and both heartbeats keep moving, A's own too (it is written between budgets, not
    after the work).  The daemon that served every VM in one loop, a whole pass of A's
    queues per wake-up, answered B once per pass of A."""
    ns_a, ns_b = two_ns
    a = vm_spec(tmp_path, "a", ns=ns_a, queues="64", entries="1024")
    b = vm_spec(tmp_path, "b", ns=ns_b, queues="1", entries="16")
    d = Daemon(sod_bin, tmp_path, [a, b], flags=flags())
    daemons.append(d)
    d.wait_ready()
    ga, gb = d.guest(0), d.guest(1)
    sink = socket_in(ns_a)
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    filler = None
    try:
        sink.bind(("127.0.0.1", 0))
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # drops: cheap to be
        ha = ga.socket()
        size = 60000
        ga.poke(0x10000, os.urandom(size))
        send = Sqe(OP["SENDMSG"], sock=ha, segs=[(0x10000, size)],
                   addr=sc.pack_addr(sc.AF_INET, "127.0.0.1", sink.getsockname()[1]))
        for q in range(ga.nr_queues):
            ga.set_qctl(q, "need_irq", 0)

        def served() -> int:
            return sum(ga.qctl(q, "requests") for q in range(ga.nr_queues))

        before = served()
        beats: dict[str, list[tuple[float, int]]] = {"a": [], "b": []}
        rtts: list[float] = []
        filler = ctx.Process(target=flood, args=(ga, send, stop), daemon=True)
        t0 = time.monotonic()
        filler.start()
        while time.monotonic() - t0 < WINDOW:
            s = time.monotonic()
            beats["a"].append((s, ga.hdr("heartbeat")))
            beats["b"].append((s, gb.hdr("heartbeat")))
            gb.call(Sqe(OP["NOP"]), timeout=10)
            rtts.append(time.monotonic() - s)
            time.sleep(0.005)
        window = time.monotonic() - t0
        stop.set()
        filler.join(10)
        a_done = served() - before

        def gaps(vm: str) -> tuple[int, float]:
            pts = beats[vm]
            moves = [t for (_, prev), (t, hb) in itertools.pairwise(pts) if hb != prev]
            edges = [t0, *moves, pts[-1][0]]
            return len(moves), max(y - x for x, y in itertools.pairwise(edges))

        a_moves, a_gap = gaps("a")
        b_moves, b_gap = gaps("b")
        print(f"\n{window:.1f} s of A's flood: A served {a_done} requests; B: {len(rtts)} NOP "
              f"round trips, max {max(rtts) * 1e3:.1f} ms; heartbeats: A moved {a_moves} "
              f"times (max gap {a_gap * 1e3:.0f} ms), B {b_moves} (max gap "
              f"{b_gap * 1e3:.0f} ms)")
        assert a_done >= ga.nr_queues * ga.entries, "no flood: A served less than one pass"
        assert len(rtts) >= 10 * window, f"B: {len(rtts)} round trips in {window:.1f} s"
        assert max(rtts) < 1.0, f"B waited {max(rtts):.2f} s behind A's flood"
        assert a_gap < 1.0 and b_gap < 1.0, (a_gap, b_gap)
        assert a_moves >= window / 0.1 / 2 and b_moves >= window / 0.1 / 2, (a_moves, b_moves)
    finally:
        stop.set()
        if filler is not None and filler.is_alive():
            filler.kill()
        sink.close()
        ga.close()
        gb.close()


def test_max_sockets_answers_only_its_own_vm(sod_bin: Path, tmp_path: Path,
                                             two_ns: tuple[str, str],
                                             daemons: list[Daemon]) -> None:
    ns_a, ns_b = two_ns
    a = vm_spec(tmp_path, "a", ns=ns_a, **{"max-sockets": "20"})
    b = vm_spec(tmp_path, "b", ns=ns_b, **{"max-sockets": "20"})
    # room for one VM's budget per process (20 + 2*2 + 32), not for both in one
    d = Daemon(sod_bin, tmp_path, [a, b], flags=flags(), preexec=nofile(64, 64))
    daemons.append(d)
    d.wait_ready()
    ga, gb = d.guest(0), d.guest(1)
    try:
        got = [ga.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET)) for _ in range(21)]
        assert [c.res for c in got] == [0] * 20 + [-errno.EMFILE]
        assert all(gb.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET)).res == 0 for _ in range(20))
        assert gb.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET)).res == -errno.EMFILE
        # a close gives A its slot back
        assert ga.call(Sqe(OP["CLOSE"], sock=got[3].sock)).res == 0
        assert ga.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET)).res == 0
        log = d.log()
        assert "a: max-sockets=20 reached" in log and "b: max-sockets=20 reached" in log
    finally:
        ga.close()
        gb.close()


def test_an_fd_budget_rlimit_cannot_hold_is_refused_at_start(
        sod_bin: Path, tmp_path: Path, two_ns: tuple[str, str]) -> None:
    """A may hold 100 sockets, RLIMIT_NOFILE is 64: the daemon says so and does not start
    (the daemon that started ran out of fds under A's sockets and answered B's SOCKET with
    the process's EMFILE)."""
    ns_a, ns_b = two_ns
    a = vm_spec(tmp_path, "a", ns=ns_a, **{"max-sockets": "100"})
    b = vm_spec(tmp_path, "b", ns=ns_b, **{"max-sockets": "8"})
    d = Daemon(sod_bin, tmp_path, [a, b], flags=flags(), preexec=nofile(64, 64))
    try:
        end = time.monotonic() + 10
        while d.proc.poll() is None and "kbp-sod: ready" not in d.log():
            assert time.monotonic() < end
            time.sleep(0.01)
        if d.proc.poll() is None:  # it started: then B must be served whatever A does
            ga, gb = d.guest(0), d.guest(1)
            try:
                for _ in range(100):
                    if ga.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET)).res < 0:
                        break
                assert gb.call(Sqe(OP["SOCKET"], arg0=sc.AF_INET)).res == 0, \
                    "B got EMFILE because of A's sockets"
            finally:
                ga.close()
                gb.close()
            pytest.fail("a daemon whose fds cannot cover its VMs' max-sockets started")
        assert d.wait_exit() == 1
        assert "a: RLIMIT_NOFILE allows 64 open files, this VM may need 136" in d.log()
    finally:
        d.stop()
