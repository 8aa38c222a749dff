"""Run in the guest by test_guest_vm.py (not collected: no test_ prefix): the outsourced
socket's control operations, then its data path against a UDP echo server in the VM's
host netns (KBP_SO_ECHO_PORT on 127.0.0.1 there): every datagram is copied once by
kbp-sod between its host socket and this process's pinned pages, and the guest's own
network stack (virtio-net, NET_RX) sees none of it.  Prints KBP-SO-DATA with what it
sent and received, for the host side to check the daemon's counters against; poll,
epoll and Python's timeout mode see the host's readiness."""

import errno
import json
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time

PINNED = "/sys/module/kbp_so/parameters/pinned_pages"


def pinned() -> int:
    with open(PINNED) as f:
        return int(f.read())


def net_rx() -> int:
    """NET_RX softirqs, all CPUs."""
    with open("/proc/softirqs") as f:
        for line in f:
            if line.split(":")[0].strip() == "NET_RX":
                return sum(int(x) for x in line.split()[1:])
    raise AssertionError("no NET_RX in /proc/softirqs")


def rx_packets() -> dict[str, int]:
    """Packets every guest interface (lo and the virtio-net NICs) received."""
    out = {}
    for dev in os.listdir("/sys/class/net"):
        with open(f"/sys/class/net/{dev}/statistics/rx_packets") as f:
            out[dev] = int(f.read())
    return out


s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 253)
assert s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_UDP
s.bind(("127.0.0.1", 0))
host, port = s.getsockname()
assert host == "127.0.0.1" and port > 0, (host, port)
print("KBP-SO-BOUND", port, flush=True)
# the host's own errors come back: a second bind is EINVAL, as for a local socket
try:
    s.bind(("127.0.0.1", 0))
except OSError as e:
    assert e.errno == errno.EINVAL, e
else:
    raise AssertionError("a second bind succeeded")
# an open outsourced socket holds the module
rc = subprocess.run(["rmmod", "kbp_so"], capture_output=True).returncode
assert rc != 0, "rmmod succeeded with an outsourced socket open"

echo = ("127.0.0.1", int(os.environ["KBP_SO_ECHO_PORT"]))
sent = recvd = bytes_out = bytes_in = 0  # data requests that moved bytes (one copy each)
rx0, net0 = rx_packets(), net_rx()
assert pinned() == 0, pinned()

# blocking round trips, sizes from 1 byte to 60000 (15+ pages: many segments)
for i, size in enumerate([1, 64, 1000, 1472, 4096, 4097, 9000, 32768, 60000] + [200] * 23):
    payload = os.urandom(size)
    assert s.sendto(payload, echo) == size
    sent, bytes_out = sent + 1, bytes_out + size
    data, addr = s.recvfrom(65535)
    recvd, bytes_in = recvd + 1, bytes_in + size
    assert data == payload, (i, size, len(data))
    assert addr == echo, addr

# MSG_PEEK copies again (the datagram stays); recvmsg's MSG_TRUNC with a short buffer
s.sendto(b"peek-me", echo)
sent, bytes_out = sent + 1, bytes_out + 7
assert s.recv(100, socket.MSG_PEEK) == b"peek-me"
assert s.recv(100) == b"peek-me"
recvd, bytes_in = recvd + 2, bytes_in + 14
s.sendto(b"0123456789" * 10, echo)
sent, bytes_out = sent + 1, bytes_out + 100
data, _anc, flags, addr = s.recvmsg(10)
assert data == b"0123456789" and flags & socket.MSG_TRUNC and addr == echo, (data, flags)
recvd, bytes_in = recvd + 1, bytes_in + 10
# MSG_TRUNC asked for: the datagram's real length
s.sendto(b"x" * 300, echo)
sent, bytes_out = sent + 1, bytes_out + 300
buf = bytearray(16)
assert s.recv_into(buf, 16, socket.MSG_TRUNC) == 300
recvd, bytes_in = recvd + 1, bytes_in + 16

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
s.sendto(b"nb", socket.MSG_DONTWAIT, echo)
sent, bytes_out = sent + 1, bytes_out + 2
time.sleep(0.3)  # the echo is back in the host socket: a non-blocking receive finds it
assert s.recv(100, socket.MSG_DONTWAIT) == b"nb"
recvd, bytes_in = recvd + 1, bytes_in + 2

# poll readiness: an armed POLL on the host answers, its completion wakes the poller
fd = s.fileno()
p = select.poll()
p.register(fd, select.POLLIN | select.POLLOUT)
ev = dict(p.poll(2000))
assert ev.get(fd, 0) & select.POLLOUT and not ev[fd] & select.POLLIN, ev
p.modify(fd, select.POLLIN)
assert p.poll(300) == [], "readable with nothing sent"
s.sendto(b"poll", echo)
sent, bytes_out = sent + 1, bytes_out + 4
assert dict(p.poll(2000)).get(fd, 0) & select.POLLIN, "not readable after the echo"
assert s.recv(100) == b"poll"
recvd, bytes_in = recvd + 1, bytes_in + 4
ep = select.epoll()
ep.register(fd, select.EPOLLIN)
assert ep.poll(0.3) == [], "epoll: readable with nothing sent"
s.sendto(b"epoll", echo)
sent, bytes_out = sent + 1, bytes_out + 5
assert ep.poll(2) == [(fd, select.EPOLLIN)]
assert s.recv(100) == b"epoll"
recvd, bytes_in = recvd + 1, bytes_in + 5
ep.close()
# Python's timeout mode polls, then receives without blocking
s.settimeout(2.0)
s.sendto(b"timeout-mode", echo)
sent, bytes_out = sent + 1, bytes_out + 12
assert s.recv(100) == b"timeout-mode"
recvd, bytes_in = recvd + 1, bytes_in + 12
s.settimeout(0.3)
try:
    s.recv(100)
except TimeoutError:
    pass
else:
    raise AssertionError("timeout mode: a receive with nothing pending returned data")
s.settimeout(None)

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
# request was cancelled and completed before the pages were released.  A thread looks at
# the pinned pages while the receive blocks, then signals the main thread.
class Interrupted(Exception):
    pass


def on_alarm(_sig: int, _frame: object) -> None:
    raise Interrupted


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
assert pinned() == 0, pinned()
# the cancelled receive is not parked any more: the next datagram reaches the next call
s.sendto(b"after-signal", echo)
sent, bytes_out = sent + 1, bytes_out + 12
assert s.recv(100) == b"after-signal"
recvd, bytes_in = recvd + 1, bytes_in + 12
assert pinned() == 0, pinned()

rx1, net1 = rx_packets(), net_rx()
rx_delta = {dev: rx1[dev] - rx0.get(dev, 0) for dev in rx1}
print("KBP-SO-DATA " + json.dumps({
    "sent": sent, "recvd": recvd, "bytes_out": bytes_out, "bytes_in": bytes_in,
    "net_rx_delta": net1 - net0, "rx_packets_delta": rx_delta,
    "pinned_while_blocked": seen[0]}), flush=True)
# no virtual NIC and no loopback carried any of it
assert all(v == 0 for v in rx_delta.values()), rx_delta
assert net1 - net0 < 4, (net0, net1)
s.close()
print("KBP-SO-GUEST-OK", flush=True)
