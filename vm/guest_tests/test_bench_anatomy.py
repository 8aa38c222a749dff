"""The tail anatomy's probes over the rig's two hub-joined virtio NICs (``kbpctl bench
--anatomy --nic-pair``: an operator's own NIC as the RT server's port).  The ports' skbs are
their own, so each request is read from the packet each port received, and the server
port's virtio receive interrupt (I) splits the wire from the wait for the poll.

One bpftrace run of :func:`kbp.bench.anatomy.probes` for NIC ports (the bench's own
program, through :class:`kbp.bench.trace.KernelTrace`) while a client in the peer netns
sends sequence-numbered requests one at a time to an echo server on the polling CPU, in
napi: every request is traced from the client's xmit to the reply's arrival, the receive
interrupt lands between the xmit and the poll, the poll runs in the RT CPU's softirq, and
the events add up.  The bench's plumbing around these probes (the NIC pair's devices, NAPI
ids and receive IRQs, the report) runs at real speed on the host over a veth pair standing
in for the ports (tests/bench/test_nic_pair.py).  Timings are emulated (TCG): nothing about
how long anything took is asserted.  About 30 s under TCG (bpftrace's start).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NS, POLL_CPU, SERVER_IP, Topo, pin_irqs, spawn

from kbp.bench import anatomy, modes, nicpair, trace

PORT = 11111
N = 150

ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""

CLIENT = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
got = 0
for seq in range(1, int(sys.argv[3]) + 1):
    s.sendto(seq.to_bytes(8, "big") + bytes(24), (sys.argv[1], int(sys.argv[2])))
    try:
        if s.recv(2048)[:8] == seq.to_bytes(8, "big"):
            got += 1
    except socket.timeout:
        pass
    time.sleep(0.01)
print(got)
"""


@pytest.mark.long     # make test's budget: the host runs the NIC-keyed probes over a veth pair
def test_nic_keyed_probes_trace_each_request_and_the_server_ports_interrupt(
        topo: Topo, tmp_path: Path) -> None:
    irqs = pin_irqs(topo.nic0, POLL_CPU)          # the server port's interrupts: the RT CPU
    echo = spawn(["taskset", "-c", str(POLL_CPU), sys.executable, "-c", ECHO, SERVER_IP,
                  str(PORT)])
    tfs = trace.TraceFs()
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        tfs.ensure()
        why = anatomy.unavailable(tfs.path)
        assert why is None, why
        spec = anatomy.Spec(tx_dev=topo.nic1, rx_dev=topo.nic0, port=PORT, rt_cpu=POLL_CPU,
                            rt_napi_ids=tuple(modes.napi_ids(topo.nic0, None)),
                            roles={echo.pid: "app"}, wire=True,
                            rx_irqs=tuple(nicpair.receive_irqs(irqs)),
                            tx_napi_ids=tuple(modes.napi_ids(topo.nic1, NS)))
        assert spec.rx_irqs and set(spec.rx_irqs) < set(irqs)    # -output.0 left out
        kt = tfs.track(trace.KernelTrace(app_pids=[echo.pid], cpu=1 - POLL_CPU,
                                         extra_probes=anatomy.probes(spec),
                                         extra_clears=anatomy.cleared(spec)))
        kt.start(timeout=120)
        try:
            p = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", CLIENT,
                                SERVER_IP, str(PORT), str(N)], capture_output=True,
                               text=True, timeout=120)
        finally:
            kt.stop()
        assert p.returncode == 0, p.stderr
        answered = int(p.stdout.strip())
        assert answered >= 0.9 * N, answered
    finally:
        echo.kill()
        tfs.close()
    reqs = anatomy.parse(kt.output)
    whole = [q for q in reqs.values() if q.complete() and q.in_order()]
    missing: dict[str, int] = {}
    for q in reqs.values():
        gap = q.missing()
        if gap:
            missing[gap] = missing.get(gap, 0) + 1
    assert len(whole) >= 0.8 * N, (len(whole), missing, kt.error[-500:])
    assert anatomy.lost_events(kt.output) == 0
    for q in whole:
        seg = q.segments()
        assert min(seg.values()) >= 0 and sum(seg.values()) == (q.z or 0) - (q.x or 0)
    # napi: the server port's interrupt on the RT CPU raised NET_RX there, which polled the
    # request; the interrupt came after the client's xmit and before that poll began, so the
    # wire's part is cut out of the wait (nearly always: a request can land in a poll that
    # an earlier packet's interrupt began)
    polled_here = [q for q in whole if q.g_cpu == POLL_CPU and q.g_ctx == anatomy.CTX_SOFTIRQ]
    assert len(polled_here) >= 0.9 * len(whole), [(q.g_cpu, q.g_ctx) for q in whole[:5]]
    split = [q for q in whole if q.segments()["wire"] > 0]
    assert len(split) >= 0.8 * len(whole), [q.segments() for q in whole[:3]]
    assert all(q.g_napi in spec.rt_napi_ids for q in whole)
