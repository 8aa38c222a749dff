"""Run in the guest by test_guest_vm.py (not collected: no test_ prefix): the outsourced
socket's control operations, then its data path against a UDP echo server in the VM's
host netns (KBP_SO_ECHO_PORT on 127.0.0.1 there): every datagram is copied once by
kbp-sod between its host socket and this process's pinned pages, and the guest's own
network stack (virtio-net, NET_RX) sees none of it.  Then /proc/kbp_so's counters,
setsockopt/getsockopt through the host, shutdown, a process killed while it blocks, and
last the daemon killed mid-traffic by the host side (it reads the KBP-SO-KILL-SOD line).
Prints KBP-SO-DATA with what it sent and received, for the host side to check the
daemon's counters against.  Each scenario is a function of main()'s list; they share
one Stats (every datagram any of them moved through the daemon)."""

import errno
import json
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from kbp.bench.sysstat import PROC as PROC_DIR
from kbp.bench.sysstat import read_percpu_table
from kbp.outsource import _spec as so_spec

PARAMS = "/sys/module/kbp_so/parameters"
PROC = "/proc/kbp_so"
PROTO = 253
ECHO = ("127.0.0.1", int(os.environ["KBP_SO_ECHO_PORT"]))
SINK = ("127.0.0.1", 9)  # nobody listens there in the VM's netns: sends just go


@dataclass
class Stats:
    """Data requests that moved bytes through the daemon (one copy each)."""

    sent: int = 0
    recvd: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    echo_sent: int = 0  # of `sent`, to the echo server (it counts them)
    pinned_while_blocked: int = 0

    def out(self, n: int, echo: bool = True) -> None:
        self.sent, self.bytes_out = self.sent + 1, self.bytes_out + n
        self.echo_sent += echo

    def inn(self, n: int) -> None:
        self.recvd, self.bytes_in = self.recvd + 1, self.bytes_in + n


def param(name: str) -> int:
    with open(f"{PARAMS}/{name}") as f:
        return int(f.read())


def pinned() -> int:
    return param("pinned_pages")


def wait_for(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def udp() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM, PROTO)


def proc() -> tuple[dict[str, str], dict[int, dict[str, str]]]:
    """/proc/kbp_so: the header's fields, and each socket's by inode."""
    with open(PROC) as f:
        lines = f.read().splitlines()
    assert lines and lines[0].startswith("kbp_so "), lines

    def fields(line: str) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in line.split()[1:])

    head = fields(lines[0])
    # the module writes every key of its spec, in the spec's order (kbp_so_proc.yaml)
    assert list(head) == [k.name for k in so_spec.MODULE_KEYS], lines[0]
    socks = {}
    for line in lines[1:]:
        assert line.startswith("sock "), line
        f = fields(line)
        assert list(f) == [k.name for k in so_spec.SOCK_KEYS], line
        socks[int(f["ino"])] = f
    assert int(head["sockets"]) == len(socks), lines
    return head, socks


def net_rx() -> int:
    """NET_RX softirqs, all CPUs."""
    rows = read_percpu_table(PROC_DIR / "softirqs")
    assert "NET_RX" in rows, "no NET_RX in /proc/softirqs"
    return sum(rows["NET_RX"])


def rx_packets() -> dict[str, int]:
    """Packets every guest interface (lo and the virtio-net NICs) received."""
    out = {}
    for dev in os.listdir("/sys/class/net"):
        with open(f"/sys/class/net/{dev}/statistics/rx_packets") as f:
            out[dev] = int(f.read())
    return out


def expect_errno(code: int, fn, *args) -> None:
    try:
        fn(*args)
    except OSError as e:
        assert e.errno == code, (fn, e)
    else:
        raise AssertionError(f"{fn} succeeded, expected {errno.errorcode[code]}")


def scenario_control(s: socket.socket, st: Stats) -> None:
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_UDP
    s.bind(("127.0.0.1", 0))
    host, port = s.getsockname()
    assert host == "127.0.0.1" and port > 0, (host, port)
    print("KBP-SO-BOUND", port, flush=True)
    # the host's own errors come back: a second bind is EINVAL, as for a local socket
    expect_errno(errno.EINVAL, s.bind, ("127.0.0.1", 0))
    # an open outsourced socket holds the module (proto.owner)
    rc = subprocess.run(["rmmod", "kbp_so"], capture_output=True).returncode
    assert rc != 0, "rmmod succeeded with an outsourced socket open"
    head, socks = proc()
    assert head["state"] == "attached" and head["epoch"] == "1", head
    assert socks[os.fstat(s.fileno()).st_ino]["local"] == f"127.0.0.1:{port}", socks


def scenario_data(s: socket.socket, st: Stats) -> None:
    assert pinned() == 0, pinned()
    # blocking round trips, sizes from 1 byte to 60000 (15+ pages: many segments)
    for i, size in enumerate([1, 64, 1000, 1472, 4096, 4097, 9000, 32768, 60000] + [200] * 23):
        payload = os.urandom(size)
        assert s.sendto(payload, ECHO) == size
        st.out(size)
        data, addr = s.recvfrom(65535)
        st.inn(size)
        assert data == payload, (i, size, len(data))
        assert addr == ECHO, addr

    # MSG_PEEK copies again (the datagram stays); recvmsg's MSG_TRUNC with a short buffer
    s.sendto(b"peek-me", ECHO)
    st.out(7)
    assert s.recv(100, socket.MSG_PEEK) == b"peek-me"
    assert s.recv(100) == b"peek-me"
    st.inn(7)
    st.inn(7)
    s.sendto(b"0123456789" * 10, ECHO)
    st.out(100)
    data, _anc, flags, addr = s.recvmsg(10)
    assert data == b"0123456789" and flags & socket.MSG_TRUNC and addr == ECHO, (data, flags)
    st.inn(10)
    # MSG_TRUNC asked for: the datagram's real length
    s.sendto(b"x" * 300, ECHO)
    st.out(300)
    buf = bytearray(16)
    assert s.recv_into(buf, 16, socket.MSG_TRUNC) == 300
    st.inn(16)

    # non-blocking: MSG_DONTWAIT, then O_NONBLOCK; nothing pending is EAGAIN at once
    for attempt in ("MSG_DONTWAIT", "O_NONBLOCK"):
        t0 = time.monotonic()
        try:
            if attempt == "MSG_DONTWAIT":
                s.recv(100, socket.MSG_DONTWAIT)
            else:
                s.setblocking(False)
                s.recv(100)
        except BlockingIOError:
            pass
        else:
            raise AssertionError(f"{attempt}: a receive with nothing pending returned data")
        assert time.monotonic() - t0 < 1.5, attempt
        s.setblocking(True)
    s.sendto(b"nb", socket.MSG_DONTWAIT, ECHO)
    st.out(2)
    time.sleep(0.3)  # the echo is back in the host socket: a non-blocking receive finds it
    assert s.recv(100, socket.MSG_DONTWAIT) == b"nb"
    st.inn(2)


def scenario_poll(s: socket.socket, st: Stats) -> None:
    # poll readiness: an armed POLL on the host answers, its completion wakes the poller
    fd = s.fileno()
    p = select.poll()
    p.register(fd, select.POLLIN | select.POLLOUT)
    ev = dict(p.poll(2000))
    assert ev.get(fd, 0) & select.POLLOUT and not ev[fd] & select.POLLIN, ev
    p.modify(fd, select.POLLIN)
    assert p.poll(300) == [], "readable with nothing sent"
    s.sendto(b"poll", ECHO)
    st.out(4)
    assert dict(p.poll(2000)).get(fd, 0) & select.POLLIN, "not readable after the echo"
    assert s.recv(100) == b"poll"
    st.inn(4)
    ep = select.epoll()
    ep.register(fd, select.EPOLLIN)
    assert ep.poll(0.3) == [], "epoll: readable with nothing sent"
    s.sendto(b"epoll", ECHO)
    st.out(5)
    assert ep.poll(2) == [(fd, select.EPOLLIN)]
    assert s.recv(100) == b"epoll"
    st.inn(5)
    ep.close()
    # Python's timeout mode polls, then receives without blocking
    s.settimeout(2.0)
    s.sendto(b"timeout-mode", ECHO)
    st.out(12)
    assert s.recv(100) == b"timeout-mode"
    st.inn(12)
    s.settimeout(0.3)
    try:
        s.recv(100)
    except TimeoutError:
        pass
    else:
        raise AssertionError("timeout mode: a receive with nothing pending returned data")
    s.settimeout(None)


class Interrupted(Exception):
    pass


def on_alarm(_sig: int, _frame: object) -> None:
    raise Interrupted


def scenario_cancel(s: socket.socket, st: Stats) -> None:
    # SO_RCVTIMEO (the socket blocking, no Python timeout): EAGAIN after the timeout
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 300_000))
    t0 = time.monotonic()
    try:
        s.recv(100)
    except BlockingIOError:
        pass
    else:
        raise AssertionError("SO_RCVTIMEO: a receive with nothing pending returned data")
    waited = time.monotonic() - t0
    assert 0.25 <= waited < 5, waited
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
    assert pinned() == 0, pinned()

    # a signal while blocked: EINTR (the handler raises, so Python does not retry), the
    # request was cancelled and completed before the pages were released.  A thread looks
    # at the pinned pages while the receive blocks, then signals the main thread.
    seen: list[int] = []
    main = threading.get_ident()

    def poke() -> None:
        time.sleep(0.5)
        seen.append(pinned())  # the blocked receive's pages are lent to the host now
        signal.pthread_kill(main, signal.SIGALRM)

    signal.signal(signal.SIGALRM, on_alarm)
    poker = threading.Thread(target=poke)
    poker.start()
    try:
        s.recv(4096)
    except Interrupted:
        pass
    else:
        raise AssertionError("a signal did not interrupt a blocking receive")
    poker.join()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert seen and seen[0] >= 1, seen
    st.pinned_while_blocked = seen[0]
    assert pinned() == 0, pinned()
    # the cancelled receive is not parked any more: the next datagram reaches the next call
    s.sendto(b"after-signal", ECHO)
    st.out(12)
    assert s.recv(100) == b"after-signal"
    st.inn(12)
    assert pinned() == 0, pinned()


def scenario_proc_counters(s: socket.socket, st: Stats) -> None:
    """A fresh socket's /proc/kbp_so line against what was done with it."""
    head0 = proc()[0]
    p = udp()
    p.bind(("127.0.0.1", 0))
    port = p.getsockname()[1]
    sizes = [10, 1000, 5000, 60000, 1]
    for size in sizes:
        payload = os.urandom(size)
        p.sendto(payload, ECHO)
        st.out(size)
        assert p.recv(65535) == payload
        st.inn(size)
    expect_errno(errno.EINVAL, p.bind, ("127.0.0.1", 0))  # a host error: errors=1
    # fallbacks: a kernel buffer (sendfile: the pages come from the page cache) and a
    # buffer in more than 18 pages (20 one-byte pieces of 20 pages); both refused by the
    # module itself, nothing reaches the host, nothing stays pinned
    with tempfile.TemporaryFile() as f:
        f.write(b"sendfile")
        f.flush()
        expect_errno(errno.EOPNOTSUPP, os.sendfile, p.fileno(), f.fileno(), 0, 8)
    m = mmap.mmap(-1, 20 * mmap.PAGESIZE)
    view = memoryview(m)
    pieces = [view[i * mmap.PAGESIZE:i * mmap.PAGESIZE + 1] for i in range(20)]
    expect_errno(errno.EOPNOTSUPP, p.sendmsg, pieces, [], 0, ECHO)
    del pieces
    view.release()
    m.close()
    assert pinned() == 0, pinned()
    head, socks = proc()
    line = socks[os.fstat(p.fileno()).st_ino]
    n = len(sizes)
    # SOCKET, bind, getsockname, n sends, n receives, the failed bind
    want = {"uid": "0", "family": "inet", "local": f"127.0.0.1:{port}", "remote": "-",
            "requests": str(3 + 2 * n + 1), "completions": str(3 + 2 * n + 1),
            "bytes_out": str(sum(sizes)), "bytes_in": str(sum(sizes)),
            "copies": str(2 * n), "fallbacks": "2", "errors": "1"}
    assert {k: line[k] for k in want} == want, (line, want)
    assert head["state"] == "attached", head
    assert int(head["sockets"]) == int(head0["sockets"]) + 1, (head0, head)
    assert head["pinned_pages"] == "0" and head["orphan_pages"] == "0", head
    assert int(head["fallbacks"]) == int(head0["fallbacks"]) + 2, (head0, head)
    assert head["host_timeout_ms"] == "3000" and int(head["queues"]) >= 1, head
    p.close()
    head, socks = proc()
    assert os.fstat(s.fileno()).st_ino in socks and head["sockets"] == head0["sockets"]


def scenario_sockopts(s: socket.socket, st: Stats) -> None:
    """The allowlist goes to the host; SOL_SOCKET ones only where the kernel lets them
    reach the protocol (SOCK_CUSTOM_SOCKOPT, 6.7+; 6.1 keeps them local)."""
    o = udp()
    o.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 7)
    assert o.getsockopt(socket.IPPROTO_IP, socket.IP_TTL) == 7  # asked of the host
    o.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x10)
    assert o.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 0x10
    expect_errno(errno.ENOPROTOOPT, o.setsockopt, socket.IPPROTO_IP,
                 socket.IP_MULTICAST_TTL, 3)
    expect_errno(errno.ENOPROTOOPT, o.getsockopt, socket.IPPROTO_IP,
                 socket.IP_MULTICAST_TTL)
    custom = not os.environ["KBP_KVER"].startswith("6.1.")
    # the guest's own limit far below the host's: a local setsockopt would give 2 * 4096
    with open("/proc/sys/net/core/rmem_max") as f:
        rmem_max = f.read()
    with open("/proc/sys/net/core/rmem_max", "w") as f:
        f.write("4096")
    try:
        o.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 100000)
        got = o.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    finally:
        with open("/proc/sys/net/core/rmem_max", "w") as f:
            f.write(rmem_max)
    host_max = int(os.environ["KBP_SO_HOST_RMEM_MAX"])
    if custom:
        assert got == 2 * min(100000, host_max), (got, host_max)
        o.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        assert o.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        expect_errno(errno.ENOPROTOOPT, o.setsockopt, socket.SOL_SOCKET,
                     socket.SO_BROADCAST, 1)
    else:
        assert got == 2 * 4096, got
    print("KBP-SO-SOCKOPT", json.dumps({"rcvbuf": got, "custom": custom}), flush=True)
    o.close()


def scenario_shutdown(s: socket.socket, st: Stats) -> None:
    """SHUT_RD wakes a blocked receive with 0 bytes, as for a local UDP socket."""
    d = udp()
    expect_errno(errno.ENOTCONN, d.shutdown, socket.SHUT_WR)  # unconnected, as locally
    d.connect(ECHO)
    got: list[object] = []

    def blocked() -> None:
        got.append(d.recv(100))
        got.append(time.monotonic())

    t = threading.Thread(target=blocked)
    t.start()
    wait_for(lambda: pinned() >= 1, 5, "the receive never blocked")
    t0 = time.monotonic()
    d.shutdown(socket.SHUT_RD)
    t.join(5)
    assert not t.is_alive(), "SHUT_RD did not wake the blocked receive"
    assert got[0] == b"" and got[1] - t0 < 2, got
    assert d.recv(100) == b""  # and the next one returns at once
    assert pinned() == 0, pinned()
    d.close()


def scenario_ipv6(s: socket.socket, st: Stats) -> None:
    """AF_INET6 sockets of the protocol: v4-mapped through the host's AF_INET6 socket to
    the IPv4 echo server, and from one outsourced socket to another on the netns's ::1."""
    a = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, PROTO)
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_UDP
    assert a.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0  # the host's
    mapped = ("::ffff:127.0.0.1", ECHO[1])
    a.sendto(b"v4-mapped", mapped)
    st.out(9)
    data, addr = a.recvfrom(100)
    st.inn(9)
    assert data == b"v4-mapped" and addr[:2] == mapped, (data, addr)
    b, c = (socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, PROTO) for _ in range(2))
    b.bind(("::1", 0))
    c.bind(("::1", 0))
    bport, cport = b.getsockname()[1], c.getsockname()[1]
    assert b.getsockname()[0] == "::1" and bport > 0, b.getsockname()
    c.sendto(b"six", ("::1", bport))
    st.out(3, echo=False)
    data, addr = b.recvfrom(100)
    st.inn(3)
    assert data == b"six" and addr[:2] == ("::1", cport), (data, addr)
    b.connect(("::1", cport))
    assert b.getpeername()[:2] == ("::1", cport)
    line = proc()[1][os.fstat(b.fileno()).st_ino]
    assert line["family"] == "inet6" and line["local"] == f"[::1]:{bport}", line
    assert line["remote"] == f"[::1]:{cport}", line
    c.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 9)
    assert c.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS) == 9
    for sock in (a, b, c):
        sock.close()


def scenario_killed_child(s: socket.socket, st: Stats) -> None:
    """A process killed while its receive is parked: cancelled, its pages given back."""
    before = int(proc()[0]["sockets"])
    pid = os.fork()
    if pid == 0:  # the child: blocks until killed
        try:
            c = udp()
            c.bind(("127.0.0.1", 0))
            c.recv(65535)
        finally:
            os._exit(3)
    try:
        wait_for(lambda: pinned() >= 1, 10, "the child's receive never blocked")
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    wait_for(lambda: pinned() == 0, 5, f"pinned_pages {pinned()} after the kill")
    assert int(proc()[0]["sockets"]) == before


def scenario_dead_host(s: socket.socket, st: Stats) -> None:
    """Last: the host side kills kbp-sod when it reads KBP-SO-KILL-SOD, while one thread
    blocks in a receive with no timeout and another keeps sending.  Both end with
    ECONNRESET within host_timeout_ms and a margin; new sockets are ENETDOWN."""
    for bad in ("100", "700000", "x"):
        try:
            with open(f"{PARAMS}/host_timeout_ms", "w") as f:
                f.write(bad)
        except OSError as e:
            assert e.errno == errno.EINVAL, (bad, e)
        else:
            raise AssertionError(f"host_timeout_ms={bad} accepted")
    timeout = 1.0
    with open(f"{PARAMS}/host_timeout_ms", "w") as f:
        f.write(str(int(timeout * 1000)))
    assert param("host_timeout_ms") == 1000 and proc()[0]["host_timeout_ms"] == "1000"
    r, w = udp(), udp()
    r.bind(("127.0.0.1", 0))
    results: dict[str, tuple[int, float]] = {}
    sends = [0]
    stop = threading.Event()

    def receiver() -> None:
        try:
            r.recv(65535)
            results["recv"] = (0, time.monotonic())
        except OSError as e:
            results["recv"] = (e.errno or 0, time.monotonic())

    def sender() -> None:
        while not stop.is_set():
            try:
                w.sendto(b"s" * 100, SINK)
            except OSError as e:
                results["send"] = (e.errno or 0, time.monotonic())
                return
            sends[0] += 1
            time.sleep(0.02)

    threads = [threading.Thread(target=receiver), threading.Thread(target=sender)]
    for t in threads:
        t.start()
    wait_for(lambda: pinned() >= 1 and sends[0] >= 5, 10, "receiver parked, sender going")
    t0 = time.monotonic()
    print("KBP-SO-KILL-SOD", flush=True)
    for t in threads:
        t.join(timeout + 15)
    stop.set()
    alive = [t.is_alive() for t in threads]
    for _ in range(sends[0]):  # to the sink: the echo server does not count them
        st.out(100, echo=False)
    print("KBP-SO-DEAD", json.dumps({k: (v[0], round(v[1] - t0, 3))
                                     for k, v in results.items()}), flush=True)
    assert not any(alive), ("a caller hangs after the host died", alive, results)
    for k in ("recv", "send"):
        code, at = results[k]
        assert code == errno.ECONNRESET, (k, errno.errorcode.get(code, code))
        assert at - t0 < timeout + 3, (k, at - t0)  # TCG: the margin is generous
    head = proc()[0]
    assert head["state"] == "host-dead", head
    assert head["pinned_pages"] == "0" and int(head["orphan_pages"]) >= 1, head
    fallbacks = int(head["fallbacks"])
    expect_errno(errno.ENETDOWN, udp)
    assert int(proc()[0]["fallbacks"]) == fallbacks + 1
    expect_errno(errno.ECONNRESET, r.sendto, b"x", ECHO)
    expect_errno(errno.ECONNRESET, r.getsockname)
    for sock in (r, w, s):
        sock.close()
    assert proc()[0]["sockets"] == "0"
    if os.environ.get("KBP_SO_RESTART") == "1":
        # a new daemon on the same region: its epoch (the region's flock) proves the old
        # one gone, so the orphans are released now, not at rmmod; no re-attach yet
        print("KBP-SO-START-SOD", flush=True)
        wait_for(lambda: proc()[0]["orphan_pages"] == "0", 20,
                 "a new epoch did not release the orphaned pages")
        assert proc()[0]["state"] == "host-dead"
        expect_errno(errno.ENETDOWN, udp)


def scenario_detach(s: socket.socket, st: Stats) -> None:
    """After the daemon's death: the device unbound (the driver's remove, as at rmmod).
    A dead daemon acks no reset, and the module cannot tell dead from stopped (a stopped
    daemon resumes and writes): the orphans stay pinned for good (issue 37; before, they
    went back to the allocator here) -- unless a new epoch released them already
    (KBP_SO_RESTART).  /proc/kbp_so says detached and socket() is ENETDOWN."""
    orphans = proc()[0]["orphan_pages"]
    drv = "/sys/bus/pci/drivers/kbp_so"
    devs = [d for d in os.listdir(drv) if d.count(":") == 2]
    assert len(devs) == 1, devs
    with open(f"{drv}/unbind", "w") as f:
        f.write(devs[0])
    head = proc()[0]
    assert (head["state"], head["epoch"], head["queues"]) == ("detached", "0", "0"), head
    assert head["pinned_pages"] == "0" and head["orphan_pages"] == orphans, (orphans, head)
    fallbacks = int(head["fallbacks"])
    expect_errno(errno.ENETDOWN, udp)
    assert int(proc()[0]["fallbacks"]) == fallbacks + 1


#: in order, one boot; each gets the long-lived socket and the shared Stats.  New
#: scenarios go here; scenario_dead_host and scenario_detach stay last (no host after).
def kbp_so_vectors() -> dict[int, list[int]]:
    """kbp_so's interrupts (rows "<irq> kbp_so"): {irq: count per CPU}."""
    return {int(name.split()[0]): counts
            for name, counts in read_percpu_table(PROC_DIR / "interrupts").items()
            if name.split()[0].isdigit() and name.split()[-1] == "kbp_so"}


def kbp_so_irqs() -> int:
    """Interrupts kbp_so's vectors took, all CPUs."""
    return sum(sum(counts) for counts in kbp_so_vectors().values())


def set_poll_us(us: int) -> None:
    with open(f"{PARAMS}/poll_us", "w") as f:
        f.write(str(us))


def scenario_poll_us(s: socket.socket, st: Stats) -> None:
    """poll_us (design.md 11.10): a caller polls for its completion before it asks for
    the host's interrupt (need_irq). With a window longer than the host's answer, round
    trips complete without kbp_so's interrupts; a receive that outlasts it sleeps and is
    woken by the interrupt it asked for; at 0 every completion interrupts again."""
    assert param("poll_us") == 0
    expect_errno(errno.EINVAL, set_poll_us, 1001)
    h0, irq0 = proc()[0], kbp_so_irqs()
    set_poll_us(1000)
    try:
        n = 40
        for i in range(n):
            s.sendto(b"p" * 64, ECHO)
            st.out(64)
            assert s.recv(100) == b"p" * 64, i
            st.inn(64)
        h1, irq1 = proc()[0], kbp_so_irqs()
        polled = int(h1["completions_polled"]) - int(h0["completions_polled"])
        print(f"KBP-SO-POLL-US rounds={n} polled={polled} irqs={irq1 - irq0}", flush=True)
        assert h1["poll_us"] == "1000", h1
        # 2n completions; a host slower than the window (a loaded machine) leaves some to
        # interrupts, but polling must find a good part and save their interrupts
        assert polled >= n // 2, (polled, n)
        assert irq1 - irq0 < 2 * n - n // 2, (irq0, irq1)  # 2n without polling
        # outlasting the window: asleep, woken by its interrupt
        late = threading.Timer(0.3, lambda: s.sendto(b"late", ECHO))
        t0 = time.monotonic()
        late.start()
        assert s.recv(100) == b"late"
        late.join()
        st.out(4)
        st.inn(4)
        assert time.monotonic() - t0 >= 0.25
        assert kbp_so_irqs() > irq1, "the sleeping receive was not woken by an interrupt"
    finally:
        set_poll_us(0)
    h2, irq2 = proc()[0], kbp_so_irqs()
    for i in range(10):
        s.sendto(b"q" * 8, ECHO)
        st.out(8)
        assert s.recv(100) == b"q" * 8, i
        st.inn(8)
    h3, irq3 = proc()[0], kbp_so_irqs()
    assert int(h3["completions_irq"]) - int(h2["completions_irq"]) >= 20, (h2, h3)
    assert irq3 - irq2 >= 15, (irq2, irq3)  # every completion asked for one
    assert pinned() == 0, pinned()


#: sends two datagrams to argv[2]'s port, a pause between, from CPU argv[1]
_SENDER = """
import os, socket, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 253)
for msg in (b"first", b"second"):
    s.sendto(msg, ("127.0.0.1", int(sys.argv[2])))
    time.sleep(0.3)  # the receiver drains the first and polls again
"""


def scenario_poll_answer_preempted(s: socket.socket, st: Stats) -> None:
    """A receiver of higher priority than the interrupt handler that answers its POLL
    (PREEMPT_RT: a FIFO-50 thread; the kbp use case) preempts it at the wake-up. If that
    wake-up came before the handler's complete(), the receiver drained the socket and
    polled again while the POLL was still out, armed none, and slept with no wake-up
    coming (a lost wake-up: the next datagram's poll timed out). The receiver arms on
    queue 0 from CPU 0, then runs on CPU 1, where queue 0's interrupt is moved (irqbalance
    could put it there) and where its own receive, polled (poll_us), goes to queue 1:
    nothing it does waits for the handler. The sender is another process (no GIL shared
    with the receiver), on CPU 1 too."""
    # queue 0's vector first: pci_alloc_irq_vectors() numbers them in order
    irqs, cpus = sorted(kbp_so_vectors()), sorted(os.sched_getaffinity(0))
    if len(irqs) < 2 or len(cpus) < 2:
        print(f"KBP-SO-SKIP poll_answer_preempted: needs two queues and two CPUs "
              f"({len(irqs)}, {len(cpus)})", flush=True)
        return
    arm_cpu, run_cpu = cpus[0], cpus[1]
    aff = f"/proc/irq/{irqs[0]}/smp_affinity_list"
    with open(aff) as f:
        saved_aff = f.read().strip()
    rx = udp()
    rx.bind(("127.0.0.1", 0))
    got: list[object] = []
    armed = threading.Event()

    def receiver() -> None:
        try:
            os.sched_setaffinity(0, {arm_cpu})
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(60))
            p = select.poll()
            p.register(rx, select.POLLIN)
            armed.set()
            got.append(p.poll(10000))  # armed on queue 0, asleep; woken on run_cpu
            got.append(rx.recv(100, socket.MSG_DONTWAIT))
            got.append(p.poll(2000))  # before the fix: the answered POLL was still out
            got.append(rx.recv(100, socket.MSG_DONTWAIT))
        except Exception as e:  # reported by the main thread
            got.append(e)

    t = threading.Thread(target=receiver)
    set_poll_us(1000)
    try:
        with open(aff, "w") as f:
            f.write(str(run_cpu))
        t.start()
        assert armed.wait(5), "the receiver did not start"
        time.sleep(0.2)  # in poll(), its POLL out on queue 0
        os.sched_setaffinity(t.native_id, {run_cpu})
        sender = subprocess.run(["python3", "-c", _SENDER, str(run_cpu),
                                 str(rx.getsockname()[1])], capture_output=True, text=True,
                                timeout=30, check=False)
        assert sender.returncode == 0, sender.stderr
        t.join(10)
        assert not t.is_alive(), "the receiver hangs"
        fd = rx.fileno()
        assert got[:2] == [[(fd, select.POLLIN)], b"first"], got
        assert got[2:] == [[(fd, select.POLLIN)], b"second"], (
            f"the poll after the first answer was not woken (a lost wake-up): {got}")
        for n in (5, 6):
            st.out(n, echo=False)
            st.inn(n)
    finally:
        set_poll_us(0)
        with open(aff, "w") as f:
            f.write(saved_aff)
        rx.close()


IDLE_DRIVER = "/sys/devices/system/cpu/cpuidle/current_driver"


def kbpctl_idle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", "-m", "kbp.cli", "outsource", "idle", *args],
                          capture_output=True, text=True, check=False)


def set_idle_poll_us(us: int) -> None:
    with open(f"{PARAMS}/idle_poll_us", "w") as f:
        f.write(str(us))


def cpuidle_driver() -> str:
    try:
        with open(IDLE_DRIVER) as f:
            return f.read().strip()
    except FileNotFoundError:
        return "none"


def idle_counts() -> dict[str, int]:
    """/proc/kbp_so's counters of who found completions, the idle path's, and the
    interrupts kbp_so's vectors took (/proc/interrupts: the independent count)."""
    head = proc()[0]
    keys = [k for k in head if k.startswith(("completions_", "idle_")) and k != "idle_poll_us"]
    out = {k: int(head[k]) for k in keys}
    out["irqs"], out["vector_irqs"] = int(head["irqs"]), kbp_so_irqs()
    return out


def delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in b}


def round_trips(s: socket.socket, st: Stats, n: int, size: int = 32) -> float:
    """n blocking echo round trips; returns the slowest (s)."""
    worst = 0.0
    for i in range(n):
        payload = bytes([i & 0xFF]) * size
        t0 = time.monotonic()
        s.sendto(payload, ECHO)
        st.out(size)
        try:
            got = s.recv(size + 1)
        except TimeoutError:
            # the host side reads the rings and the echo server's count now (test_guest_vm.py):
            # was the request echoed, and was its completion posted but never reaped?
            print(f"KBP-SO-LOST-WAKEUP echo_sent={st.echo_sent}", flush=True)
            time.sleep(1.0)
            raise AssertionError(f"round trip {i}: no completion within the socket timeout "
                                 f"(a lost wake-up, or a request never answered): "
                                 f"{proc()[0]}") from None
        assert got == payload, i
        st.inn(size)
        worst = max(worst, time.monotonic() - t0)
    return worst


def idle_refused() -> str | None:
    """The reason this boot cannot have the idle path, from its command line."""
    with open("/proc/cmdline") as f:
        cmdline = f.read().split()
    if "cpuidle.off=1" in cmdline:
        return "cpuidle.off"
    if any(w.startswith("idle=") for w in cmdline):
        return "idle=-boot-option"
    return None


def scenario_idle(s: socket.socket, st: Stats) -> None:
    """The idle path (design.md 11.11): with idle_poll_us set, kbp_so is the cpuidle
    driver; an idle vCPU finds completions by polling, announces in need_irq and halts,
    and the host interrupts only vCPUs that announced."""
    assert param("idle_poll_us") == 0 and proc()[0]["idle"] == "off", proc()[0]
    expect_errno(errno.EINVAL, set_idle_poll_us, 2001)
    refused = idle_refused()
    if refused:
        # cpuidle.off=1: cpuidle_register() says ENODEV; idle=: refused before it
        expect_errno(errno.ENODEV if refused == "cpuidle.off" else errno.EBUSY,
                     set_idle_poll_us, 200)
        head = proc()[0]
        assert head["idle"] == f"unavailable:{refused}" and head["idle_poll_us"] == "0", head
        # the operator's command says why, in words, and fails
        r = kbpctl_idle("--poll-us", "200")
        assert r.returncode == 1 and "kbp_so refused idle_poll_us=200" in r.stderr, r
        assert ("idle=" if refused.startswith("idle=") else "cpuidle.off=1") in r.stderr, r
        print(f"KBP-SO-IDLE-REFUSED {refused}", flush=True)
        return
    before_driver = cpuidle_driver()
    assert before_driver in ("none", ""), f"another cpuidle driver holds the slot: {before_driver}"
    s.settimeout(2.0)
    r = kbpctl_idle("--poll-us", "2000")
    assert r.returncode == 0 and "idle path on" in r.stdout, r
    try:
        assert cpuidle_driver() == "kbp_so", cpuidle_driver()
        assert proc()[0]["idle"] == "on", proc()[0]
        # an idle guest: the window outlasts the host's answer, no interrupt is needed
        round_trips(s, st, 20)  # warm
        c0 = idle_counts()
        n = 200
        round_trips(s, st, n)
        d = delta(c0, idle_counts())
        # a round trip is a send, a receive and (Python's timeout) a POLL: 3 completions
        done = sum(v for k, v in d.items() if k.startswith("completions_"))
        per_msg, per_done = d["vector_irqs"] / n, d["vector_irqs"] / max(done, 1)
        print(f"KBP-SO-IDLE rounds={n} {d} irqs_per_message={per_msg:.3f} "
              f"irqs_per_completion={per_done:.3f}", flush=True)
        assert d["completions_idle"] >= done // 2, d
        assert per_msg <= 0.1 and per_done <= 0.1, d
        assert d["irqs"] <= d["vector_irqs"] + 1, d  # the handler ran for them only
        # the operator's view: kbpctl status names the same counters, with the same values
        # (the runs with the operator's path; the socket-only runs save its start-up)
        if os.environ.get("KBP_SO_LIGHT") != "1":
            check_status()
    finally:
        set_idle_poll_us(0)
    assert cpuidle_driver() == before_driver and proc()[0]["idle"] == "off"
    s.settimeout(None)


def check_status() -> None:
    """``kbpctl status --json``'s outsource object against /proc/kbp_so, traffic stopped."""
    head = proc()[0]
    r = subprocess.run(["python3", "-m", "kbp.cli", "status", "--json"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    so = json.loads(r.stdout)["outsource"]
    assert so["idle"] == "on" and so["idle_poll_us"] == 2000, so
    for k in ("completions_idle", "completions_irq", "completions_tick"):
        assert so[k] == int(head[k]), (k, so, head)
    assert so["idle_halts"] >= int(head["idle_halts"]), (so, head)  # kbpctl idles too
    assert so["completions"] == sum(int(v) for k, v in head.items()
                                    if k.startswith("completions_")), so


HOG = "echo r; while :; do :; done"


def _hogs() -> list[subprocess.Popen[bytes]]:
    """One spinning shell per vCPU, each in its loop when this returns (a process that
    is still starting idles its vCPU while it reads files from the host's share)."""
    hogs = [subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", HOG],
                             stdout=subprocess.PIPE)
            for cpu in range(os.cpu_count() or 1)]
    for h in hogs:
        assert h.stdout is not None and h.stdout.read(1) == b"r", "a hog did not start"
    time.sleep(0.2)
    return hogs


def scenario_idle_busy(s: socket.socket, st: Stats) -> None:
    """A busy vCPU (item 2): with every vCPU running a hog, nobody halts, so the host
    interrupts nobody; completions are found by the tick-aligned sweep (at most two
    ticks) or by the next outsourced call."""
    if idle_refused():
        return
    set_idle_poll_us(200)
    hogs = _hogs()
    try:
        s.settimeout(2.0)
        c0 = idle_counts()
        worst = round_trips(s, st, 20)
        d = delta(c0, idle_counts())
        print(f"KBP-SO-IDLE-BUSY {d} worst={worst * 1e3:.1f}ms", flush=True)
        # nobody halts: no need_irq, no interrupt; the tick-aligned sweep and the next
        # call find them (a vCPU may still idle a moment when the hogs are preempted)
        found = d["completions_tick"] + d["completions_syscall"]
        assert found >= 20 and found >= 2 * d["completions_idle"], d
        assert d["vector_irqs"] <= 4, d
        # the bound: two ticks (8 ms at HZ=250), plus the scheduler's share of a hog's
        # vCPU for the woken receiver (emulated time under TCG: loose)
        assert worst < 1.0, worst
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        set_idle_poll_us(0)
        s.settimeout(None)


RACE_WINDOWS_US = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233)


def scenario_idle_race(s: socket.socket, st: Stats) -> None:
    """The wake race on purpose: round trips with idle windows around the host's
    answer time, so completions land while a vCPU polls, between its announcement and
    its halt (idle_races: the re-check found it) and after it halted (an interrupt).
    A lost wake-up is a receive that outlasts the socket timeout."""
    if idle_refused():
        return
    rounds = int(os.environ.get("KBP_SO_RACE_ROUNDS", "3000"))
    s.settimeout(2.0)
    c0 = idle_counts()
    t0 = time.monotonic()
    worst = 0.0
    try:
        per = max(rounds // len(RACE_WINDOWS_US), 1)
        for us in RACE_WINDOWS_US:
            set_idle_poll_us(us)
            worst = max(worst, round_trips(s, st, per))
    finally:
        set_idle_poll_us(0)
        s.settimeout(None)
    d = delta(c0, idle_counts())
    print(f"KBP-SO-IDLE-RACE rounds={per * len(RACE_WINDOWS_US)} {d} "
          f"worst={worst * 1e3:.1f}ms in {time.monotonic() - t0:.1f}s", flush=True)
    # every side of the race ran: found polling, found by the interrupt of a halted vCPU
    assert d["completions_idle"] > 0 and d["idle_halts"] > 0, d
    assert d["completions_irq"] > 0, d


def scenario_idle_stop_wakes_waiters(s: socket.socket, st: Stats) -> None:
    """idle_poll_us back to 0 with receivers asleep: the driver goes, their own
    need_irq comes back, and both wake: one whose datagram came before the switch,
    one whose datagram comes after it. Then the switch, many times, under traffic."""
    if idle_refused():
        return
    set_idle_poll_us(50)
    peer = udp()
    try:
        rx = [udp(), udp()]
        got: list[bytes] = []
        for r in rx:
            r.bind(("127.0.0.1", 0))
            r.settimeout(5.0)
        threads = [threading.Thread(target=lambda r=r: got.append(r.recv(100))) for r in rx]
        for t in threads:
            t.start()
        time.sleep(0.3)  # both asleep in recv, their vCPUs idle
        peer.sendto(b"before", rx[0].getsockname())
        set_idle_poll_us(0)
        assert cpuidle_driver() in ("none", "") and proc()[0]["idle"] == "off"
        peer.sendto(b"after", rx[1].getsockname())
        for t in threads:
            t.join(10)
        assert sorted(got) == [b"after", b"before"], got
        st.out(6, echo=False)
        st.out(5, echo=False)
        st.inn(6)
        st.inn(5)
        for r in rx:
            r.close()
        # toggled under traffic: nothing lost, nothing hangs
        stop = threading.Event()
        errors: list[BaseException] = []

        def traffic() -> None:
            try:
                s.settimeout(2.0)
                while not stop.is_set():
                    round_trips(s, st, 1)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=traffic)
        t.start()
        for i in range(40):
            set_idle_poll_us(0 if i % 2 else 20 + i)
            time.sleep(0.02)
        set_idle_poll_us(0)
        stop.set()
        t.join(10)
        assert not errors, errors
        assert not t.is_alive()
    finally:
        peer.close()
        set_idle_poll_us(0)
        s.settimeout(None)
    assert proc()[0]["idle"] == "off" and cpuidle_driver() in ("none", "")
    assert pinned() == 0, pinned()


def scenario_idle_on_for_the_end(s: socket.socket, st: Stats) -> None:
    """The last scenarios (a killed process, the dead host, rmmod) run with the idle
    path on: removal must stop it first (the driver is gone after rmmod)."""
    if not idle_refused():
        set_idle_poll_us(100)
        assert cpuidle_driver() == "kbp_so"


SCENARIOS = [scenario_control, scenario_data, scenario_poll, scenario_cancel,
             scenario_proc_counters, scenario_sockopts, scenario_shutdown, scenario_ipv6,
             scenario_poll_us, scenario_poll_answer_preempted, scenario_idle, scenario_idle_busy,
             scenario_idle_race,
             scenario_idle_stop_wakes_waiters, scenario_idle_on_for_the_end,
             scenario_killed_child]


def main() -> None:
    st = Stats()
    only = os.environ.get("KBP_SO_SCENARIOS")
    if only:  # a short boot for some scenarios (test_guest_vm.py): no data check, no faults
        s = udp()
        named = {f.__name__: f for f in SCENARIOS}
        for name in only.split(","):
            named[name](s, st)
            print("KBP-SO-SCENARIO-OK", name, flush=True)
        s.close()
        print("KBP-SO-GUEST-OK", flush=True)
        return
    rx0, net0 = rx_packets(), net_rx()
    s = udp()
    for scenario in SCENARIOS:
        t0 = time.monotonic()
        scenario(s, st)
        print("KBP-SO-SCENARIO-OK", scenario.__name__, f"{time.monotonic() - t0:.1f}s",
              flush=True)
    rx1, net1 = rx_packets(), net_rx()
    rx_delta = {dev: rx1[dev] - rx0.get(dev, 0) for dev in rx1}
    # no virtual NIC and no loopback carried any of it
    assert all(v == 0 for v in rx_delta.values()), rx_delta
    assert net1 - net0 < 4, (net0, net1)
    for scenario in (scenario_dead_host, scenario_detach):  # last: the host is gone
        scenario(s, st)
        print("KBP-SO-SCENARIO-OK", scenario.__name__, flush=True)
    print("KBP-SO-DATA " + json.dumps({**asdict(st), "net_rx_delta": net1 - net0,
                                       "rx_packets_delta": rx_delta}), flush=True)
    print("KBP-SO-GUEST-OK", flush=True)


if __name__ == "__main__":
    main()
