"""Tail anatomy: where each RT round trip's time went, request by request (``--anatomy``).

The benchmark's round trip (kbp-rtt's kernel stamps: the request reaching the client
device's xmit -> the reply entering the client device's receive path) is cut at eight
kernel events of the same request, all host tracepoints (no kprobes), in order:

``X``  ``net:net_dev_start_xmit`` of the request on the RT client device (its sockperf
       sequence number read from the UDP payload: the key that ties the trace to the tester's
       sample of that request);
``G``  ``net:napi_gro_receive_entry`` (or ``net:netif_rx`` where the device has no NAPI) of
       that skb: a NAPI poll hands the request up.  The context that did it (a softirq, a
       polling thread, another task) and when that context began running (the softirq's
       entry, the thread's last switch-in) are recorded;
``R``  ``net:netif_receive_skb``: the stack takes the request (after GRO; after RPS's backlog
       on the CPU RPS chose), with its context the same way;
``D``  ``sock:sk_data_ready`` of a UDP socket on that CPU right after ``R``: in the socket;
``A``  the RT app's last switch-in before ``V`` (``sched:sched_switch``);
``V``  ``sock:sock_recv_length`` in the RT app: its recvfrom() returned the request;
``Y``  ``net:net_dev_start_xmit`` of the reply (same sequence number) on the RT server
       device;
``Z``  ``net:netif_rx`` / ``napi_gro_receive_entry`` of the reply's skb on the client side.

Over a veth pair the skb the server polls is the one the client sent, so G, R and Z key on
skb addresses that X and Y recorded.  Over NIC ports (``--nic-pair``: the operator's own NIC
as the RT server's port, cabled to a tester port) each side has skbs of its own: G and Z read
the request's sequence number from the received packet instead (its linear part: a request
whose UDP payload a driver left in a page fragment is not matched, and counts as missing G),
on the server port's NAPIs (by NAPI id, or by device name before Linux 6.9) and on the tester
port; and ``I``, the server port's last hardIRQ (``irq:irq_handler_entry`` of its receive
vectors) before the poll began, splits the wait for the poll into the wire and NIC's part and
the host's.

Segments (:data:`SEGMENTS`), which add up to Z - X by construction:

=============== =========================================================================
``wire``        X -> I, over NIC ports: the client's driver, the wire, the server NIC's DMA
                and interrupt (0 over veth, and when no interrupt came between X and the
                poll's start: a busy poller found the request)
``poll_wait``   I (or X) -> the context that polled the request began running (0 when it
                already ran: a busy poller, a softirq already in progress)
``poll``        that start (or X) -> G: the poll's work before it reached the request
``stack_wait``  G -> the context that took it up the stack began running (RPS: the RT CPU's
                NET_RX softirq or ksoftirqd after the IPI; 0 in a poller that does both)
``stack_queue`` that start (or G) -> R: packets ahead of it (the backlog, GRO's hold)
``stack``       R -> D: IP and UDP up to the socket
``app_wake``    D -> A: the RT app woken and switched in (0 when it was running already)
``app_recv``    A -> V: the app running until its recvfrom() returned the request
``app_reply``   V -> Y: the app's work and its sendto() down to the server device's xmit
``reply``       Y -> Z: the reply back to the client device
=============== =========================================================================

``remainder`` is the tester's measured round trip minus Z - X (the time outside these
events: the stamps are taken a few instructions away from X and Z); ``explained`` is
(Z - X) / measured.

Meanwhile, on the RT CPU: cumulative per-category counters kept in the kernel (only the RT
CPU updates them) are printed with X and with V, so the difference is what the RT CPU did
while the request was on its way, in µs: task time by role (:data:`TASK_ROLES`: idle, the
app, the pollers, the non-rt pollers, the heavy receiver, the heavy device's NAPI thread,
ksoftirqd, any other task), net of the softirqs that ran inside it; NET_RX and other
softirq time; and the NAPI polls on that CPU: the RT device's and the others' (the heavy
flow's backlog or NAPI), how many and how many packets.  Work still in progress at the
snapshot is counted up to it (the line carries the current task, its switch-in and the
softirq in progress).  The heavy polls' sizes over the whole run are a histogram
(``poll_sizes``).

What it costs: probes on every packet's ``netif_receive_skb`` and ``napi_gro_receive_entry``
and on every softirq, switch and NAPI poll; the runs with ``--anatomy`` say so, and their
round trips are not mixed into a run without it.  PREEMPT_RT runs softirqs in threads that
can be preempted, which this accounting does not follow.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

from kbp.bench import stats, trace

#: the tracepoints the anatomy needs (tracefs event directories)
EVENTS = ("net/net_dev_start_xmit", "net/napi_gro_receive_entry", "net/netif_rx",
          "net/netif_receive_skb", "sock/sk_data_ready", "sock/sock_recv_length",
          "napi/napi_poll", "sched/sched_switch", "sched/sched_waking",
          "irq/softirq_entry", "irq/softirq_exit", "irq/irq_handler_entry")
SEGMENTS = ("wire", "poll_wait", "poll", "stack_wait", "stack_queue", "stack", "app_wake",
            "app_recv", "app_reply", "reply")
SEGMENT_WORDS = {
    "wire": "xmit → server NIC's IRQ", "poll_wait": "→ polling context runs",
    "poll": "poll until the request",
    "stack_wait": "→ stack context runs", "stack_queue": "packets ahead (backlog, GRO)",
    "stack": "IP/UDP → socket", "app_wake": "socket → app runs",
    "app_recv": "app runs → recv returns", "app_reply": "recv → reply xmit",
    "reply": "reply → client device"}
TASK_ROLES = ("idle", "app", "poller", "nonrt_poller", "heavy_receiver", "heavy_napi",
              "ksoftirqd", "other")
ROLE_OTHER = len(TASK_ROLES) - 1
# counter slots after the task roles
C_NETRX, C_SIRQ_OTHER, C_POLLS_RT, C_PKTS_RT, C_POLLS_OTHER, C_PKTS_OTHER = range(
    len(TASK_ROLES), len(TASK_ROLES) + 6)
COUNTERS = (*TASK_ROLES, "softirq_net_rx", "softirq_other", "polls_rt", "packets_rt",
            "polls_other", "packets_other")
N_COUNTERS = len(COUNTERS)
# state printed after the counters: current task's switch-in, its role, the softirq total
# at that switch-in, the softirq in progress (entry time, vector)
STATE = ("in_ns", "role", "softirq_at_in", "softirq_ns", "softirq_vec")
NET_RX_VEC = trace.NET_RX_VEC
# contexts of G and R
CTX_SOFTIRQ, CTX_POLLER, CTX_TASK, CTX_XMIT = 0, 1, 2, 3
CTX_NAMES = {CTX_SOFTIRQ: "softirq", CTX_POLLER: "poller", CTX_TASK: "task",
             CTX_XMIT: "xmit path"}
TAG = "KA"
TAIL_PCT = 99.0       # the tail: every sample above the run's p99
NAMED_PCT = 99.9      # and those at or above its p99.9 named with their whole timeline


def port_be(port: int) -> int:
    """``port`` as a little-endian load of its network-order bytes reads it."""
    if not 0 < port < 65536:
        raise ValueError(f"not a UDP port: {port}")
    return ((port & 0xFF) << 8) | (port >> 8)


def seq_of(tag: int) -> int:
    """The sockperf sequence number from a trace tag (the payload's be64 read little-endian,
    plus one so that no tag is 0, which bpftrace maps read as absent); ValueError for a tag
    no request has."""
    if not 0 < tag <= 1 << 64:
        raise ValueError(f"not an anatomy tag: {tag}")
    return int.from_bytes((tag - 1).to_bytes(8, "little"), "big")


def unavailable(tracefs: Path = trace.TRACEFS) -> str | None:
    """Why the anatomy cannot be traced here (None: it can): the tracepoints it needs."""
    events = tracefs / "events"
    if not events.is_dir():
        return f"no tracefs at {tracefs}"
    missing = [e for e in EVENTS if not (events / e).is_dir()]
    if missing:
        return ("this kernel lacks the tracepoint" + ("s " if len(missing) > 1 else " ")
                + ", ".join(missing) + " (sock_recv_length and sk_data_ready: Linux 6.3+)")
    return None


@dataclass(frozen=True)
class Spec:
    """What one run's anatomy probes key on."""

    tx_dev: str                     # the RT client device (requests leave, replies arrive)
    rx_dev: str                     # the RT server device
    port: int                       # the RT server's UDP port
    rt_cpu: int
    rt_napi_ids: Sequence[int] = ()   # empty: the RT NAPIs are the ones of rx_dev by name
    roles: Mapping[int, str] = field(default_factory=dict)   # {pid or tid: TASK_ROLES name}
    # NIC ports, not a veth pair: G and Z read the sequence number from the received packet
    wire: bool = False
    rx_irqs: Sequence[int] = ()       # the server port's receive interrupts (wire only)
    tx_napi_ids: Sequence[int] = ()   # the tester port's NAPIs (wire; empty: by tx_dev's name)

    def __post_init__(self) -> None:
        trace._dev(self.tx_dev)
        trace._dev(self.rx_dev)
        port_be(self.port)
        for pid, role in self.roles.items():
            if role not in TASK_ROLES or int(pid) <= 0:
                raise ValueError(f"anatomy role {role!r} of pid {pid}")
        if not self.wire and (self.rx_irqs or self.tx_napi_ids):
            raise ValueError("rx_irqs and tx_napi_ids key the NIC ports' probes (wire)")
        for n in (*self.rx_irqs, *self.tx_napi_ids, *self.rt_napi_ids):
            if int(n) < 0:
                raise ValueError(f"anatomy: not an IRQ or NAPI id: {n}")

    def pids(self, role: str) -> list[int]:
        return sorted(int(p) for p, r in self.roles.items() if r == role)

    def irq_at(self) -> str:
        """What G prints as I: the server port's last receive interrupt (@ir, kept by a
        probe on its vectors), or 0 where there is none to probe (veth, or no vector
        known): no probe on every hardIRQ then."""
        return "@ir[0]" if self.rx_irqs else "0"


def _udp(skb: str, received: bool = False) -> str:
    """Statements that read an IPv4 UDP skb: $sport, $dport (as a little-endian load reads
    them: compare with :func:`port_be`) and $tag (the payload's first 8 bytes, plus one),
    all 0 for anything else.  At xmit the IP header is at the network header; on receive,
    before the stack sets that, at ``data`` (the driver's eth_type_trans() pulled the MAC
    header), and only the linear part (len - data_len) is read."""
    where = "$skb->data" if received else "$skb->head + $skb->network_header"
    room = ("$skb->len - $skb->data_len" if received else "(uint32)0xffffffff")
    return (f"    $skb = (struct sk_buff *){skb}; $tag = (uint64)0;"
            " $sport = (uint16)0; $dport = (uint16)0;\n"
            f"    $p = {where}; $room = {room};\n"
            "    if ($room >= 20 && (*(uint8 *)$p >> 4) == 4 && *(uint8 *)($p + 9) == 17) {\n"
            "      $ihl = (*(uint8 *)$p & 15) * 4; $u = $p + $ihl;\n"
            "      if ($room >= $ihl + 16) {\n"
            "        $sport = *(uint16 *)$u; $dport = *(uint16 *)($u + 2);\n"
            "        $tag = *(uint64 *)($u + 8) + 1;\n      }\n    }\n")


def _ctx(pollers: str, indent: str = "  ") -> str:
    """Statements that set $ctx and $start: who runs this receive work and since when."""
    return (f"{indent}$ctx = 2; $start = (uint64)0;\n"
            f"{indent}if ({pollers}) {{ $ctx = 1; $start = @on[tid]; }}\n"
            f"{indent}else {{ if (@sx[cpu] != 0) {{ $ctx = 0; $start = @sx[cpu]; }} }}\n")


def _reply_arrives(indent: str) -> str:
    """Statements that print Z when the skb $a is a reply's (and forget it)."""
    return (f"{indent}$z = @rp[$a];\n"
            f'{indent}if ($z != 0) {{ printf("{TAG} Z %llu %llu %d\\n", $z, nsecs, cpu);'
            " delete(@rp[$a]); }\n")


def _snapshot() -> tuple[str, str]:
    """printf format and arguments of the RT CPU's counters and state."""
    fmt = " ".join(["%llu"] * (N_COUNTERS + len(STATE)))
    args = [f"@c[{i}]" for i in range(N_COUNTERS)] + ["@in[0]", "@cat[0]", "@sat[0]",
                                                        "@se[0]", "@sv[0]"]
    return fmt, ", ".join(args)


def probes(spec: Spec) -> list[str]:
    """The anatomy's bpftrace probes (appended to :func:`kbp.bench.trace.program`'s, so one
    bpftrace process serves both), printing ``KA`` lines (:func:`parse`)."""
    rt = int(spec.rt_cpu)
    be = port_be(spec.port)
    app = trace.one_of("tid", spec.pids("app")) + " || " + trace.one_of("pid", spec.pids("app"))
    polling = spec.pids("poller") + spec.pids("nonrt_poller")
    pollers = trace.one_of("tid", polling)
    watched = trace.one_of("$np", spec.pids("app") + polling)
    woken = trace.one_of("args->pid", spec.pids("app") + polling)
    if spec.rt_napi_ids:
        rt_napi = trace.one_of("$n->napi_id", spec.rt_napi_ids)
    else:
        rt_napi = f'$n->dev->name == "{spec.rx_dev}"'
    role_of = "".join(
        f"    if ({trace.one_of('$q', spec.pids(role))}) {{ $k = {i}; }}\n"
        for i, role in enumerate(TASK_ROLES) if role not in ("idle", "other") and
        spec.pids(role))
    fmt, snap = _snapshot()
    sirq_tot = f"@c[{C_NETRX}] + @c[{C_SIRQ_OTHER}]"
    # X records the request's skb for G (veth: the server polls that skb); over NIC ports
    # G reads the request from the server's own skb (_received)
    remember = "" if spec.wire else "      @rq[$a] = $tag; @rs[$tag] = $a;\n"
    # Y records the reply's skb for Z (veth), and forgets the request's skb: answered, so
    # it is not a request any more unless a newer request has that address
    forget = "" if spec.wire else (
        "      @rp[$a] = $tag;\n"
        "      $o = @rs[$tag]; if ($o != 0) { if (@rq[$o] == $tag) { delete(@rq[$o]); }"
        " delete(@rs[$tag]); }\n")
    return [
        # softirqs: in progress per CPU (the context of G and R); time on the RT CPU
        "tracepoint:irq:softirq_entry {\n  $v = args->vec; @sx[cpu] = nsecs;\n"
        f"  if (cpu == {rt}) {{ @se[0] = nsecs; @sv[0] = $v; }}\n}}",
        "tracepoint:irq:softirq_exit {\n  $v = args->vec;\n"
        f"  if (cpu == {rt} && @se[0] != 0) {{\n    $d = nsecs - @se[0];\n"
        f"    if ($v == {NET_RX_VEC}) {{ @c[{C_NETRX}] = @c[{C_NETRX}] + $d; }}\n"
        f"    else {{ @c[{C_SIRQ_OTHER}] = @c[{C_SIRQ_OTHER}] + $d; }}\n"
        "    @se[0] = 0;\n  }\n  @sx[cpu] = 0;\n}",
        # the RT CPU's task time by role, net of the softirqs inside each slice
        "tracepoint:sched:sched_switch {\n  $np = args->next_pid; $pp = args->prev_pid;"
        " $pc = args->prev_comm;\n"
        f"  if (cpu == {rt}) {{\n    $now = nsecs;\n"
        "    if (@in[0] != 0) {\n"
        f"      $sl = $now - @in[0]; $s = {sirq_tot} - @sat[0];\n"
        "      if ($sl > $s) { @c[@cat[0]] = @c[@cat[0]] + $sl - $s;\n"
        f"        if (@cat[0] == {ROLE_OTHER}) {{ @ot[$pp, $pc] = sum($sl - $s); }} }}\n    }}\n"
        f"    $q = $np; $k = {ROLE_OTHER};\n"
        "    if ($q == 0) { $k = 0; }\n" + role_of +
        f"    @cat[0] = $k; @in[0] = $now; @sat[0] = {sirq_tot};\n  }}\n"
        f"  if ({watched}) {{ @on[$np] = nsecs; }}\n}}",
        f"tracepoint:sched:sched_waking /{woken}/ {{ @wk[args->pid] = nsecs; }}",
        # NAPI polls on the RT CPU: the RT device's and the others', with the others' sizes
        f"tracepoint:napi:napi_poll /cpu == {rt}/ {{\n"
        "  $n = (struct napi_struct *)args->napi; $w = (uint64)args->work;\n"
        f"  if ({rt_napi}) {{ @c[{C_POLLS_RT}] = @c[{C_POLLS_RT}] + 1;"
        f" @c[{C_PKTS_RT}] = @c[{C_PKTS_RT}] + $w; }}\n"
        f"  else {{ @c[{C_POLLS_OTHER}] = @c[{C_POLLS_OTHER}] + 1;"
        f" @c[{C_PKTS_OTHER}] = @c[{C_PKTS_OTHER}] + $w;"
        " @hw[$w] = count(); }\n}",
        # X: the request leaves the client; Y: the reply leaves the server.  One probe per
        # tracepoint (each program run costs every packet, the flood's too)
        "tracepoint:net:net_dev_start_xmit {\n  $a = args->skbaddr; $nm = str(args->name);\n"
        f'  if ($nm == "{spec.tx_dev}" || $nm == "{spec.rx_dev}") {{\n'
        + _udp("$a") +
        f'    if ($nm == "{spec.tx_dev}" && $dport == {be}) {{\n'
        + remember +
        f'      printf("{TAG} X %llu %llu %d {fmt}\\n", $tag, nsecs, cpu, {snap});\n    }}\n'
        f'    if ($nm == "{spec.rx_dev}" && $sport == {be}) {{\n' + forget +
        f'      printf("{TAG} Y %llu %llu %d %d\\n", $tag, nsecs, cpu, tid);\n    }}\n  }}\n}}',
        *(_received(spec, pollers) if spec.wire else _forwarded(pollers)),
        # I: the server port's receive interrupts
        *([f"tracepoint:irq:irq_handler_entry /{trace.one_of('args->irq', spec.rx_irqs)}/"
           " { @ir[0] = nsecs; }"] if spec.rx_irqs else []),
        # R: the stack takes it; D: in the socket
        "tracepoint:net:netif_receive_skb /@rq[args->skbaddr]/ {\n"
        "  $a = args->skbaddr; $t = @rq[$a];\n  if ($t != 0) {\n" + _ctx(pollers, "    ") +
        f'    printf("{TAG} R %llu %llu %d %d %llu\\n", $t, nsecs, cpu, $ctx, $start);\n'
        "    @cur[cpu] = $t; delete(@rq[$a]);\n  }\n}",
        "tracepoint:sock:sk_data_ready /args->protocol == 17 && @cur[cpu] != 0/ {\n"
        f'  printf("{TAG} D %llu %llu %d\\n", @cur[cpu], nsecs, cpu); delete(@cur[cpu]);\n}}',
        # V: the app's recvfrom() returned (which request: the reply it sends next says)
        f"tracepoint:sock:sock_recv_length /({app}) && args->protocol == 17 &&"
        " args->ret > 0/ {\n"
        f'  printf("{TAG} V %d %llu %d %llu %llu {fmt}\\n", tid, nsecs, cpu, @on[tid],'
        f" @wk[tid], {snap});\n}}",
    ]


def _forwarded(pollers: str) -> list[str]:
    """G and Z over a veth pair: the skb polled is the one transmitted (X, Y recorded it)."""
    return [
        # G: a NAPI poll (or the xmit path into a backlog) hands the request up; Z: the
        # reply reaches the client device
        "tracepoint:net:napi_gro_receive_entry {\n"
        "  $a = args->skbaddr; $id = args->napi_id; $t = @rq[$a];\n"
        "  if ($t != 0) {\n" + _ctx(pollers, "    ") +
        f'    printf("{TAG} G %llu %llu %d %u %d %llu %llu 0\\n", $t, nsecs, cpu, $id,'
        " $ctx, $start, @wk[tid]);\n  }\n" + _reply_arrives("  ") + "}",
        "tracepoint:net:netif_rx {\n  $a = args->skbaddr; $t = @rq[$a];\n"
        f'  if ($t != 0) {{ printf("{TAG} G %llu %llu %d 0 {CTX_XMIT} 0 0 0\\n", $t, nsecs,'
        " cpu); }\n" + _reply_arrives("  ") + "}"]


def _received(spec: Spec, pollers: str) -> list[str]:
    """G, Z and I over NIC ports: G and Z read the sequence number from the skb the port
    received (the request on the server port, the reply on the tester port); G carries the
    server port's last receive interrupt (I)."""
    be = port_be(spec.port)
    if spec.rt_napi_ids:
        server = trace.one_of("$id", spec.rt_napi_ids)
    else:
        server = f'str(args->name) == "{spec.rx_dev}"'
    if spec.tx_napi_ids:
        tester = trace.one_of("$id", spec.tx_napi_ids)
    else:
        tester = f'str(args->name) == "{spec.tx_dev}"'

    def arrival(is_server: str, is_tester: str, napi: str, ctx: str) -> str:
        return (f"  if ({is_server}) {{\n" + _udp("$a", received=True) +
                f"    if ($dport == {be} && $tag != 0) {{\n      @rq[$a] = $tag;\n" + ctx +
                f'      printf("{TAG} G %llu %llu %d %u %d %llu %llu %llu\\n", $tag, nsecs,'
                f" cpu, {napi}, $ctx, $start, @wk[tid], {spec.irq_at()});\n    }}\n  }}\n"
                f"  else {{ if ({is_tester}) {{\n" + _udp("$a", received=True) +
                f"    if ($sport == {be} && $tag != 0) {{"
                f' printf("{TAG} Z %llu %llu %d\\n", $tag, nsecs, cpu); }}\n  }} }}\n')

    xmit = f"      $ctx = {CTX_XMIT}; $start = (uint64)0;\n"
    return ["tracepoint:net:napi_gro_receive_entry {\n"
            "  $a = args->skbaddr; $id = args->napi_id;\n"
            + arrival(server, tester, "$id", _ctx(pollers, "      ")) + "}",
            "tracepoint:net:netif_rx {\n  $a = args->skbaddr;\n"
            + arrival(f'str(args->name) == "{spec.rx_dev}"',
                      f'str(args->name) == "{spec.tx_dev}"', "0", xmit) + "}"]


def cleared(spec: Spec) -> tuple[str, ...]:
    """The maps the anatomy's END clears (the rest, @hw and @ot, are printed for
    :func:`parse`); over NIC ports the transmits record no skbs (@rs, @rp)."""
    return (*(() if spec.wire else ("@rs", "@rp")), "@rq", "@cur", "@sx", "@se", "@sv", "@on",
            "@wk", "@in", "@cat", "@sat", "@c", *(("@ir",) if spec.rx_irqs else ()))


# -- parsing -------------------------------------------------------------------------------
@dataclass
class Snapshot:
    """The RT CPU's counters at one instant, in-progress work counted up to it."""

    t: int
    values: list[float]

    @classmethod
    def of(cls, t: int, raw: Sequence[int]) -> Snapshot:
        vals = [float(v) for v in raw[:N_COUNTERS]]
        in_ns, role, sat, se, sv = (int(v) for v in raw[N_COUNTERS:N_COUNTERS + len(STATE)])
        partial_sirq = max(0, t - se) if se else 0
        if se:
            vals[C_NETRX if sv == NET_RX_VEC else C_SIRQ_OTHER] += partial_sirq
        if in_ns and 0 <= role < len(TASK_ROLES):
            sirq_now = vals[C_NETRX] + vals[C_SIRQ_OTHER]
            vals[role] += max(0.0, (t - in_ns) - max(0.0, sirq_now - sat))
        return cls(t, vals)

    def minus(self, other: Snapshot) -> dict[str, float]:
        return {name: max(0.0, a - b) for name, a, b in zip(COUNTERS, self.values,
                                                              other.values, strict=True)}


@dataclass
class Request:
    """One request's events (ns, ktime) as traced."""

    seq: int
    x: int | None = None
    x_cpu: int = -1
    x_snap: Snapshot | None = None
    g: int | None = None
    g_cpu: int = -1
    g_napi: int = 0
    g_ctx: int = CTX_TASK
    g_start: int = 0
    g_irq: int = 0          # the server port's last receive interrupt then (NIC ports)
    r: int | None = None
    r_cpu: int = -1
    r_ctx: int = CTX_TASK
    r_start: int = 0
    d: int | None = None
    a: int | None = None
    v: int | None = None
    v_snap: Snapshot | None = None
    y: int | None = None
    z: int | None = None
    # no R of its own: GRO merged it into this earlier request's skb in the same poll, and
    # it went up the stack with that one (:func:`resolve`)
    merged_with: int | None = None
    # no sk_data_ready seen (mostly under the flood on this 6.18 host; Linux 6.12's UDP
    # calls it for every datagram, so a later kernel's skipping the wake of a reader whose
    # queue holds data is our reading, not checked in its source) -- D is taken as R, and
    # "stack" is 0
    no_data_ready: bool = False

    def complete(self) -> bool:
        return None not in (self.x, self.g, self.r, self.d, self.v, self.y, self.z)

    def in_order(self) -> bool:
        """X <= G <= R <= D <= V <= Y <= Z (a complete request whose events are not is
        counted, not cut into segments)."""
        ts = (self.x, self.g, self.r, self.d, self.v, self.y, self.z)
        return all(a is not None and b is not None and a <= b for a, b in pairwise(ts))

    def missing(self) -> str | None:
        for name in ("x", "g", "r", "d", "v", "y", "z"):
            if getattr(self, name) is None:
                return name.upper()
        return None

    def segments(self) -> dict[str, float]:
        """The segments (ns; :data:`SEGMENTS`), which add up to Z - X."""
        assert self.complete()
        # complete(): none of them is None
        x, g, r, d, v, y, z = (int(cast(int, t)) for t in (self.x, self.g, self.r, self.d,
                                                            self.v, self.y, self.z))
        ps = min(max(self.g_start, x), g) if self.g_start else x
        i = self.g_irq if x <= self.g_irq <= ps else x     # I, when it came between
        rs = min(max(self.r_start, g), r) if self.r_start else g
        a = min(max(self.a or d, d), v)
        return {"wire": i - x, "poll_wait": ps - i, "poll": g - ps, "stack_wait": rs - g,
                "stack_queue": r - rs, "stack": d - r, "app_wake": a - d, "app_recv": v - a,
                "app_reply": y - v, "reply": z - y}

    def meanwhile(self) -> dict[str, float] | None:
        """What the RT CPU did from X to V (ns, or counts for polls and packets)."""
        if self.x_snap is None or self.v_snap is None:
            return None
        return self.v_snap.minus(self.x_snap)


def _objects(output: str) -> Iterable[dict[str, Any]]:
    """The JSON objects of bpftrace's ``-f json`` output, one a line."""
    for raw in output.splitlines():
        obj = trace.json_object(raw)
        if obj is not None:
            yield obj


def lines(output: str) -> Iterable[list[str]]:
    """The anatomy's ``KA`` lines of bpftrace's output (JSON or text), split."""
    for raw in output.splitlines():
        if raw.strip().startswith(TAG + " "):
            yield raw.split()
    for obj in _objects(output):
        if obj.get("type") == "printf":
            for text in str(obj.get("data") or "").splitlines():
                if text.startswith(TAG + " "):
                    yield text.split()


def lost_events(output: str) -> int:
    """Events bpftrace reported lost (its perf buffer overran)."""
    return sum(int((obj.get("data") or {}).get("events") or 0) for obj in _objects(output)
               if obj.get("type") == "lost_events")


def poll_sizes(output: str) -> dict[int, int]:
    """The histogram of the non-RT NAPI polls' work on the RT CPU ({packets: polls})."""
    return dict(sorted((int(k), int(v)) for k, v in trace.map_data(output, "@hw").items()))


def other_tasks(output: str, top: int = 5) -> list[dict[str, Any]]:
    """The tasks of no known role that ran longest on the RT CPU over the run (from the
    ``@ot`` map: µs net of softirqs), longest first."""
    got: dict[tuple[int, str], int] = {}
    for key, v in trace.map_data(output, "@ot").items():
        pid, _, comm = str(key).partition(",")
        try:
            got[(int(pid), comm.strip())] = int(v)
        except ValueError:
            continue
    ranked = sorted(got.items(), key=lambda kv: -kv[1])[:top]
    return [{"pid": pid, "comm": comm, "run_us": round(ns / 1e3, 1)}
            for (pid, comm), ns in ranked]


def parse(output: str) -> dict[int, Request]:
    """The traced requests by sequence number.  A V (a recvfrom() that returned, which
    does not say what it read) belongs to the request whose reply the same app thread sends
    next (the server answers each request before it reads the next): the last V of that
    thread before the reply's Y and after its previous Y.  Lines come per CPU buffer, not in
    time order, so the matching is by time."""
    reqs: dict[int, Request] = {}
    recvs: dict[int, list[tuple[int, int, Snapshot]]] = defaultdict(list)  # tid: (t, on, snap)
    replies: dict[int, list[tuple[int, Request]]] = defaultdict(list)      # tid: (t, request)

    def req(tag: str) -> Request:
        seq = seq_of(int(tag))
        return reqs.setdefault(seq, Request(seq))

    for f in lines(output):
        kind = f[1]
        try:
            if kind == "X":
                q = req(f[2])
                q.x, q.x_cpu = int(f[3]), int(f[4])
                q.x_snap = Snapshot.of(q.x, [int(v) for v in f[5:]])
            elif kind == "G":
                q = req(f[2])
                if q.g is None or int(f[3]) < q.g:     # the first poll that handed it up
                    q.g, q.g_cpu, q.g_napi = int(f[3]), int(f[4]), int(f[5])
                    q.g_ctx, q.g_start = int(f[6]), int(f[7])
                    q.g_irq = int(f[9]) if len(f) > 9 else 0
            elif kind == "R":
                q = req(f[2])
                if q.r is None or int(f[3]) < q.r:
                    q.r, q.r_cpu = int(f[3]), int(f[4])
                    q.r_ctx, q.r_start = int(f[5]), int(f[6])
            elif kind == "D":
                q = req(f[2])
                if q.d is None or int(f[3]) < q.d:
                    q.d = int(f[3])
            elif kind == "V":
                t = int(f[3])
                recvs[int(f[2])].append((t, int(f[5]), Snapshot.of(t, [int(v) for v in f[7:]])))
            elif kind == "Y":
                q = req(f[2])
                if q.y is None:
                    q.y = int(f[3])
                    replies[int(f[5])].append((q.y, q))
            elif kind == "Z":
                q = req(f[2])
                if q.z is None or int(f[3]) < q.z:
                    q.z = int(f[3])
        except (IndexError, ValueError):
            continue
    for tid, ys in replies.items():
        vs = sorted(recvs.get(tid) or [], key=lambda v: v[0])
        i, prev_y = 0, -1
        for y, q in sorted(ys, key=lambda p: p[0]):
            got = None
            while i < len(vs) and vs[i][0] <= y:
                if vs[i][0] > prev_y:
                    got = vs[i]
                i += 1
            if got is not None:
                q.v, q.a, q.v_snap = got[0], got[1] or None, got[2]
            prev_y = y
    resolve(reqs)
    return reqs


def resolve(reqs: Mapping[int, Request]) -> None:
    """Fill in what the kernel did not show per request: a stack entry (R) later than the
    reply (the skb's address reused by another packet) or a socket wake (D) outside R..V is
    dropped; a request polled (G) without an R of its own takes the R and D of the request
    polled just before it whose R is still to come (GRO merged the two in one poll); a
    request with R but no D takes D = R (``no_data_ready``)."""
    for q in reqs.values():
        end = q.z if q.z is not None else q.y
        if q.r is not None and ((q.g is not None and q.r < q.g) or
                                (end is not None and q.r > end)):
            q.r = None
        if q.d is not None and (q.r is None or q.d < q.r or
                                (q.v is not None and q.d > q.v)):
            q.d = None
    polled = sorted((q for q in reqs.values() if q.g is not None), key=lambda q: q.g or 0)
    for i, q in enumerate(polled):
        if q.r is not None:
            continue
        for p in reversed(polled[max(0, i - 64):i]):
            if p.r is not None and p.merged_with is None and p.r >= (q.g or 0):
                q.r, q.r_cpu, q.r_ctx, q.r_start = p.r, p.r_cpu, p.r_ctx, p.r_start
                q.d, q.merged_with = p.d, p.seq
                break
    for q in reqs.values():
        if q.r is not None and q.d is None:
            q.d, q.no_data_ready = q.r, True


# -- one run's record ----------------------------------------------------------------------
def _pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile as the report defines it (:func:`kbp.bench.stats.percentile`,
    nearest rank); NaN of no values."""
    return stats.percentile(sorted(values), p) if values else math.nan


def sample(q: Request, measured_ns: int, rt_cpu: int) -> dict[str, Any]:
    """One request's anatomy for results.json (µs)."""
    seg = q.segments()
    total = sum(seg.values())
    mw = q.meanwhile()
    return {
        "seq": q.seq, "rtt_us": measured_ns / 1e3,
        "segments_us": {k: round(v / 1e3, 3) for k, v in seg.items()},
        "traced_us": round(total / 1e3, 3),
        "remainder_us": round((measured_ns - total) / 1e3, 3),
        "explained": round(total / measured_ns, 4) if measured_ns > 0 else None,
        "poll": {"cpu": q.g_cpu, "napi_id": q.g_napi, "context": CTX_NAMES.get(q.g_ctx)},
        "stack": {"cpu": q.r_cpu, "context": CTX_NAMES.get(q.r_ctx),
                  "on_rt_cpu": q.r_cpu == rt_cpu, "gro_merged_with": q.merged_with,
                  "no_data_ready": q.no_data_ready},
        "meanwhile": None if mw is None else {
            k: (round(v / 1e3, 3) if k in TASK_ROLES or k.startswith("softirq") else int(v))
            for k, v in mw.items()},
    }


def run_record(output: str, measured: Mapping[int, int], rt_cpu: int) -> dict[str, Any]:
    """One run's anatomy: how many of the tester's samples were traced whole, the median
    of each segment over them, the tail (every traced sample above the run's p99 of the
    measured round trips, slowest first) and the p99.9 samples' sequence numbers, the heavy
    polls' sizes on the RT CPU and bpftrace's lost events."""
    reqs = parse(output)
    missing: dict[str, int] = defaultdict(int)
    whole: list[tuple[Request, int]] = []
    for seq, ns in measured.items():
        q = reqs.get(seq)
        gap = "X" if q is None else q.missing()
        if gap:
            missing[gap] += 1
        elif q is not None and not q.in_order():
            missing["order"] += 1
        elif q is not None:
            whole.append((q, ns))
    rtts = list(measured.values())
    p99, p999 = _pct(rtts, TAIL_PCT), _pct(rtts, NAMED_PCT)
    tail = sorted((pair for pair in whole if pair[1] > p99), key=lambda p: -p[1])
    median = {}
    if whole:
        segs = [q.segments() for q, _ in whole]
        for name in SEGMENTS:
            median[name] = round(_pct([s[name] for s in segs], 50.0) / 1e3, 3)
    return {
        "samples": len(measured), "traced": len(whole), "missing_from": dict(missing),
        "gro_merged": sum(1 for q, _ in whole if q.merged_with is not None),
        "no_data_ready": sum(1 for q, _ in whole if q.no_data_ready),
        "lost_events": lost_events(output),
        "p99_us": None if math.isnan(p99) else p99 / 1e3,
        "p999_us": None if math.isnan(p999) else p999 / 1e3,
        "median_us": median,
        "tail": [sample(q, ns, rt_cpu) for q, ns in tail],
        "named": [q.seq for q, ns in tail if ns >= p999],
        "poll_sizes": {str(k): v for k, v in poll_sizes(output).items()},
        "other_tasks": other_tasks(output),
    }


# -- pooled over the repetitions: the summary, the report's section, the plot --------------
MEANWHILE_SHOWN = ("softirq_net_rx", "ksoftirqd", "heavy_receiver", "heavy_napi",
                   "nonrt_poller", "poller", "other", "idle")
EXPLAINED_TARGET = 0.95


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def pooled(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One mode and condition's anatomy over its runs: the tail samples of every run (each
    above its own run's p99) pooled; segment and meanwhile means over them; how much of each
    sample's measured time the events explain; the slowest named sample whole; the heavy
    polls' sizes on the RT CPU."""
    tail = [s for r in recs for s in r.get("tail") or []]
    named = {(i, q) for i, r in enumerate(recs) for q in r.get("named") or []}
    named_samples = [s for i, r in enumerate(recs) for s in r.get("tail") or []
                     if (i, s.get("seq")) in named]
    seg = {k: _mean([float(s["segments_us"][k]) for s in tail]) for k in SEGMENTS}
    rtt = _mean([float(s["rtt_us"]) for s in tail])
    expl = sorted(float(s["explained"]) for s in tail if s.get("explained") is not None)
    mws = [s["meanwhile"] for s in tail if s.get("meanwhile")]
    mw = {k: _mean([float(m.get(k) or 0.0) for m in mws]) for k in COUNTERS} if mws else {}
    sizes: dict[int, int] = defaultdict(int)
    for r in recs:
        for k, v in (r.get("poll_sizes") or {}).items():
            sizes[int(k)] += int(v)
    polls = sum(sizes.values())
    medians = [r.get("median_us") or {} for r in recs]
    others: dict[str, float] = defaultdict(float)
    for r in recs:
        for t in r.get("other_tasks") or []:
            others[str(t.get("comm"))] += float(t.get("run_us") or 0.0)
    return {
        "runs": len(recs), "samples": sum(int(r.get("samples") or 0) for r in recs),
        "traced": sum(int(r.get("traced") or 0) for r in recs),
        "lost_events": sum(int(r.get("lost_events") or 0) for r in recs),
        "tail_n": len(tail), "tail_rtt_mean_us": rtt, "tail_segments_us": seg,
        "tail_traced_mean_us": _mean([float(s["traced_us"]) for s in tail]),
        "explained_min": expl[0] if expl else None,
        "explained_median": expl[len(expl) // 2] if expl else None,
        "explained_max": expl[-1] if expl else None,
        "explained_ok": (sum(1 for e in expl if e >= EXPLAINED_TARGET) / len(expl)
                         if expl else None),
        "named_explained_min": min((float(s["explained"]) for s in named_samples
                                    if s.get("explained") is not None), default=None),
        "tail_meanwhile": mw,
        "median_segments_us": {k: _median_of([m.get(k) for m in medians]) for k in SEGMENTS},
        "slowest": max(named_samples or tail, key=lambda s: float(s["rtt_us"]), default=None),
        "heavy_polls": polls,
        "heavy_poll_max": max(sizes) if sizes else None,
        "heavy_poll_mean": (sum(k * v for k, v in sizes.items()) / polls) if polls else None,
        "other_tasks_ms": {c: round(us / 1e3, 2) for c, us in
                           sorted(others.items(), key=lambda kv: -kv[1])[:5]},
        "polled_in": _contexts(tail),
        "stack_off_rt_cpu": sum(1 for s in tail if not (s.get("stack") or {}).get("on_rt_cpu")),
    }


def _contexts(tail: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many tail samples were handed up in each context ("softirq on the RT CPU": n)."""
    out: dict[str, int] = defaultdict(int)
    for s in tail:
        p = s.get("poll") or {}
        st = s.get("stack") or {}
        where = f"{p.get('context')}, stack in {st.get('context')}"
        if st.get("on_rt_cpu"):
            where += " on the RT CPU"
        out[where] += 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _median_of(xs: Sequence[Any]) -> float | None:
    vals = sorted(float(x) for x in xs if x is not None)
    return vals[len(vals) // 2] if vals else None


def summarize(runs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{condition: {mode: :func:`pooled`}} of the RT latency runs that carry an anatomy."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        a = r.get("anatomy")
        if a:
            by[(str(r.get("condition")), str(r.get("mode")))].append(a)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (cond, mode), recs in by.items():
        out.setdefault(cond, {})[mode] = pooled(recs)
    return out


def _f(v: float | None, nd: int = 0) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f} %"


def timeline_words(s: dict[str, Any]) -> str:
    """One sample's segments and meanwhile, in a line."""
    seg = s.get("segments_us") or {}
    parts = [f"{k} {float(seg[k]):,.0f}" for k in SEGMENTS if float(seg.get(k) or 0) >= 1]
    mw = s.get("meanwhile") or {}
    busy = [f"{k} {float(mw[k]):,.0f}" for k in MEANWHILE_SHOWN if float(mw.get(k) or 0) >= 1]
    polls = int(mw.get("polls_other") or 0)
    more = (f"; {polls} other polls ({int(mw.get('packets_other') or 0)} packets)"
            if polls else "")
    return (f"seq {s.get('seq')}: {float(s['rtt_us']):,.0f} µs measured = "
            + " + ".join(parts) + f" (µs; {_pc(s.get('explained'))} explained); "
            f"poll in {(s.get('poll') or {}).get('context')} on CPU "
            f"{(s.get('poll') or {}).get('cpu')}, stack in "
            f"{(s.get('stack') or {}).get('context')} on CPU {(s.get('stack') or {}).get('cpu')}"
            + (f"; the RT CPU meanwhile: {', '.join(busy)} µs" if busy else "") + more)


def section(summary: dict[str, dict[str, dict[str, Any]]], order: Sequence[str] = ()) -> list[str]:
    """The report's tail anatomy: per condition, a table of the tail's mean segments and
    what the RT CPU did meanwhile, then each mode's slowest sample whole."""
    if not summary:
        return []
    out = ["**Tail anatomy** (--anatomy: host tracepoints, ktime; every traced sample above "
           "its run's p99, pooled over the repetitions; segment means in µs; they add up to "
           "the traced time, and \"explained\" is traced / measured round trip. The probes "
           "cost time on every packet, so these runs' round trips are the traced system's.)",
           ""]
    seg_head = " | ".join(SEGMENT_WORDS[k] for k in SEGMENTS)
    for cond in sorted(summary):
        modes = [m for m in order if m in summary[cond]] + sorted(
            m for m in summary[cond] if m not in order)
        out += [f"*{cond}* — the tail's segments:", "",
                f"| mode | tail n | RTT mean | {seg_head} | explained (min to max / ≥95 %) |",
                "|" + "---|" * (4 + len(SEGMENTS))]
        for m in modes:
            d = summary[cond][m]
            seg = d.get("tail_segments_us") or {}
            out.append(f"| {m} | {d['tail_n']} | {_f(d.get('tail_rtt_mean_us'))} | "
                       + " | ".join(_f(seg.get(k)) for k in SEGMENTS)
                       + f" | {_pc(d.get('explained_min'))} to {_pc(d.get('explained_max'))} / "
                       f"{_pc(d.get('explained_ok'))} |")
        out += ["", f"*{cond}* — what the RT CPU did meanwhile (request xmit → app's recv; "
                "µs of task time by role net of softirqs, softirq time, and the other NAPIs' "
                "polls there):", "",
                "| mode | " + " | ".join(MEANWHILE_SHOWN) + " | other polls (packets) | "
                "heavy poll size mean / max (run) | traced / samples | lost events |",
                "|" + "---|" * (5 + len(MEANWHILE_SHOWN))]
        for m in modes:
            d = summary[cond][m]
            mw = d.get("tail_meanwhile") or {}
            out.append(f"| {m} | " + " | ".join(_f(mw.get(k)) for k in MEANWHILE_SHOWN)
                       + f" | {_f(mw.get('polls_other'), 1)} ({_f(mw.get('packets_other'))})"
                       f" | {_f(d.get('heavy_poll_mean'), 1)} / {_f(d.get('heavy_poll_max'))}"
                       f" | {d['traced']:,} / {d['samples']:,} | {d['lost_events']:,} |")
        others = [f"{m}: " + ", ".join(f"{c} {ms:,.1f} ms" for c, ms in
                                      (summary[cond][m].get("other_tasks_ms") or {}).items())
                  for m in modes if summary[cond][m].get("other_tasks_ms")]
        ctx = [f"{m}: " + ", ".join(f"{n} polled in {w}" for w, n in
                                    (summary[cond][m].get("polled_in") or {}).items())
               for m in modes if summary[cond][m].get("polled_in")]
        if ctx:
            out += ["", "Where the tail's requests were handed up: " + "; ".join(ctx) + "."]
        if others:
            out += ["", "Tasks of no benchmark role that ran on the RT CPU (\"other\", whole "
                    "runs, summed over the repetitions): " + "; ".join(others) + "."]
        out += ["", f"*{cond}* — each mode's slowest named (≥ p99.9) sample:", ""]
        out += [f"- {m}: {timeline_words(summary[cond][m]['slowest'])}" for m in modes
                if summary[cond][m].get("slowest")]
        out.append("")
    return out


def plot(summary: dict[str, dict[str, dict[str, Any]]], out: Path, title: str,
         order: Sequence[str] = ()) -> Path | None:
    """Stacked bars: the tail's mean segments per mode, one panel per condition."""
    if not summary:
        return None
    from kbp.bench.plots import _plt, save
    plt = _plt()
    conds = sorted(summary)
    fig, axes = plt.subplots(1, len(conds), figsize=(7 * len(conds), 4.5), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for j, cond in enumerate(conds):
        ax = axes[0][j]
        modes = [m for m in order if m in summary[cond]] + sorted(
            m for m in summary[cond] if m not in order)
        left = [0.0] * len(modes)
        for i, k in enumerate(SEGMENTS):
            vals = [float((summary[cond][m].get("tail_segments_us") or {}).get(k) or 0.0)
                    for m in modes]
            ax.barh(range(len(modes)), vals, left=left, color=cmap(i % 10),
                    label=SEGMENT_WORDS[k])
            left = [a + b for a, b in zip(left, vals, strict=True)]
        for y, m in enumerate(modes):
            rtt = summary[cond][m].get("tail_rtt_mean_us")
            if rtt:
                ax.plot([rtt, rtt], [y - 0.4, y + 0.4], color="black", lw=1)
        ax.set_yticks(range(len(modes)))
        ax.set_yticklabels(modes)
        ax.invert_yaxis()
        ax.set_xlabel("µs, mean over the tail (> p99 of each run); black: measured RTT")
        ax.set_title(f"{cond}: where the tail's round trip went")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    return save(fig, out / "anatomy.png", title)
