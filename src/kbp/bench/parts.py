"""Measurements a scenario composes (its ``parts``), each over every runnable mode in the
repetition's order (the runner's: a seeded random permutation per repetition), so no mode
always runs first, right after a load starts or after the same neighbour:

``rtt``      RT latency runs under one condition (``latency_block``), with an optional load
             (a :class:`Load`, e.g. the iperf3 flood) running for the whole block
``table2``   EE-KBP's Table 2 traffic conditions, scaled (``table2``)
``rfc2544``  RFC 2544 zero-loss throughput searches (``rfc2544``)

and the parts the runner offers in every scenario (``COMMON``), after the scenario's own:

``idle``     idle cost: each mode on with no traffic at all for ``--idle-duration`` (10 s),
             the CPU time of every poller thread (and of the RT app, where busypoll polls),
             the RT CPU's busy and softirq share, the poller counters (``idle``)
``rtt-tcp``  RT latency runs under a TCP heavy sender: an iperf3 TCP stream at full speed
             through its own veth pair (``tcp``) from the flood sender's CPU to the heavy
             receiver's, condition ``load-tcp`` (``tcp_block``)
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any, Final, Protocol

from kbp.bench import placement as pl
from kbp.bench import rfc2544 as rfc
from kbp.bench import workloads
from kbp.bench.schema import LatencyRun, Results
from kbp.bench.testbed import set_gro
from kbp.system import access

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig
    from kbp.bench.testbed import VethLink

# the parts (Final: mypy reads rtt, table2, ... as the keys of kbp.bench.schema.Summary)
RTT: Final = "rtt"
TABLE2: Final = "table2"
RFC2544: Final = "rfc2544"
IDLE: Final = "idle"
RTT_TCP: Final = "rtt-tcp"
COMMON: tuple[str, ...] = (IDLE, RTT_TCP)     # the runner's, in every scenario
TCP_LINK = "tcp"                             # the veth pair rtt-tcp adds to the testbed
TCP_CONDITION = "load-tcp"
TCP_TITLE = ("RT flow with a TCP heavy sender (iperf3 TCP at full speed from the flood "
             "sender's CPU to the heavy receiver's)")
TABLE2_CONDITIONS = len(workloads.TABLE2)


class Load(Protocol):
    """A competing load that runs for a whole block of latency runs."""

    def start(self) -> None: ...

    def stop(self) -> dict[str, Any]: ...


#: what --anatomy adds to a latency run: bpftrace loading ~24 probes and stopping, and the
#: parsing of ~4 lines a request (per-run median 10.6 s against 6.7 s without, 3 s runs,
#: this host, 2026-11-29)
ANATOMY_RUN_S = 4.0


def latency_seconds(cfg: BenchConfig, duration: float) -> float:
    """Planned seconds of one latency run (run, warm-up, start and stop; with --anatomy its
    trace's cost)."""
    return duration + cfg.warmup + 1.6 + (ANATOMY_RUN_S if cfg.anatomy else 0.0)


def rfc_seconds(cfg: BenchConfig) -> float:
    """Planned seconds of one RFC 2544 search: ceiling probe + ceiling + ~4 halvings (the RT
    path carries far less than the sender can offer) + refinements down to the resolution."""
    trials = 6 + max(1, math.ceil(-math.log2(cfg.rfc_resolution)))
    return trials * (cfg.rfc_trial + 0.8)


def table2_reps(cfg: BenchConfig) -> int:
    return min(cfg.table2_reps or cfg.reps, cfg.reps)


def rfc_reps(cfg: BenchConfig) -> int:
    return min(cfg.rfc_reps, cfg.reps)


def idle_seconds(cfg: BenchConfig) -> float:
    """Planned seconds of one idle-cost run (settle, measure, mode on and off)."""
    return cfg.idle_duration + IDLE_SETTLE_S + 1.0


IDLE_SETTLE_S = 0.5


def common_seconds(cfg: BenchConfig, n_modes: int) -> float:
    """Planned seconds of the runner's own parts in cfg.parts."""
    ps = cfg.parts or []
    s = 0.0
    if IDLE in ps:
        s += n_modes * idle_seconds(cfg)
    if RTT_TCP in ps:
        s += cfg.reps * n_modes * latency_seconds(cfg, cfg.duration)
    return s


def plan_seconds(cfg: BenchConfig, n_modes: int, rtt_conditions: int) -> float:
    """Planned seconds of the parts in cfg.parts (``rtt_conditions`` blocks per rep)."""
    parts = cfg.parts or []
    s = 0.0
    if RTT in parts:
        s += cfg.reps * rtt_conditions * n_modes * latency_seconds(cfg, cfg.duration)
    if TABLE2 in parts:
        s += table2_reps(cfg) * TABLE2_CONDITIONS * n_modes * latency_seconds(
            cfg, cfg.table2_duration)
    if RFC2544 in parts:
        s += rfc_reps(cfg) * len(cfg.rfc_frames) * n_modes * rfc_seconds(cfg)
    return s


FLOODS = ("udp", "tcp")      # --flood: the heavy receiver's load in veth-inline and shared-cpu


def per_packet(link: VethLink) -> dict[str, bool]:
    """Shape a veth pair so a TCP stream's receive work is one packet per MTU segment, as a
    NIC's interrupt delivers it: TSO off at the sender's end (no 64 KiB super-segments), GRO
    off at the receiver's (no merging before RPS); returns both as the kernel reads them back
    (``ethtool --json -k``), so results show what was in force, not what was asked."""
    access.cmd(["ethtool", "-K", link.dev_a, "tso", "off"], ns=link.ns_a)
    set_gro(link.ns_b, link.dev_b, False)
    return {"sender_tso": _feature(link.ns_a, link.dev_a, "tcp-segmentation-offload"),
            "receiver_gro": _feature(link.ns_b, link.dev_b, "generic-receive-offload")}


#: gro_max_size that keeps veth's GRO from merging two MTU-sized segments (1500 B each): the
#: device has a NAPI (veth has one only with GRO or XDP on) yet delivers one packet at a time
PER_PACKET_GRO_MAX = 1600


def gro_max_size(ns: str, dev: str) -> int | None:
    """The device's gro_max_size (``ip -d -j link``), None where iproute2 does not show it."""
    out = access.cmd(["ip", "-d", "-j", "link", "show", "dev", dev], ns=ns).stdout
    v = json.loads(out)[0].get("gro_max_size")
    return None if v is None else int(v)


def napi_state(ns: str, dev: str) -> dict[str, Any]:
    """GRO and gro_max_size of a device as the kernel reads them back."""
    return {"gro": _feature(ns, dev, "generic-receive-offload"),
            "gro_max_size": gro_max_size(ns, dev)}


def napi_per_packet(ns: str, dev: str) -> dict[str, Any]:
    """Give a veth end shaped by :func:`per_packet` (GRO off: no NAPI) a NAPI that still
    delivers per packet: GRO on with gro_max_size :data:`PER_PACKET_GRO_MAX` (issue 24's
    probe did the same), which a backend can then thread or attach.  GRO goes off first, so
    the NAPI is always a fresh one (kernels before 6.15 keep a NAPI's kthread after threaded
    NAPI, and kbp.ko refuses such a NAPI).  Returns the state read back; RuntimeError when
    the kernel or iproute2 refuses or it does not stick (read :func:`napi_state` first to
    put it back with :func:`napi_restore`)."""
    set_gro(ns, dev, False)
    access.cmd(["ip", "link", "set", "dev", dev, "gro_max_size", str(PER_PACKET_GRO_MAX)], ns=ns)
    set_gro(ns, dev, True)
    now = napi_state(ns, dev)
    if now != {"gro": True, "gro_max_size": PER_PACKET_GRO_MAX}:
        raise RuntimeError(f"{dev}: GRO on with gro_max_size {PER_PACKET_GRO_MAX} did not "
                           f"stick (reads {now})")
    return now


def napi_restore(ns: str, dev: str, before: dict[str, Any]) -> None:
    """Undo :func:`napi_per_packet`: GRO and gro_max_size as they were."""
    set_gro(ns, dev, bool(before.get("gro")))
    if before.get("gro_max_size") is not None:
        access.cmd(["ip", "link", "set", "dev", dev, "gro_max_size",
                       str(before["gro_max_size"])], ns=ns)


def _feature(ns: str, dev: str, name: str) -> bool:
    out = access.cmd(["ethtool", "--json", "-k", dev], ns=ns).stdout
    return bool(json.loads(out)[0][name]["active"])


def start_flood(bench: Bench) -> workloads.Flood:
    """The heavy receiver's flood over the ``flood`` link, from the flood sender's CPU to the
    heavy receiver's; its server runs from now on, both stop when the testbed closes.

    Its kind is ``bench.flood_proto()`` (--flood, checked by the plan, else the scenario's).
    "udp": iperf3 UDP datagrams of ``--flood-len`` bytes at ``--flood-bitrate``.
    "tcp": one iperf3 TCP stream at full speed over the pair shaped by :func:`per_packet`
    (``--tcp-len`` writes): the heavy sender of rt-socket-outsourcing, whose receive work
    fills the receiving CPU (what it does and why: docs/results.md, "shared-cpu")."""
    cfg, tb, place = bench.cfg, bench.tb, bench.placement
    assert tb is not None and place is not None
    proto = bench.flood_proto()
    fl = tb.link("flood")
    rec: dict[str, Any] = {"proto": proto}
    if proto == "tcp":
        rec["shaping"] = per_packet(fl)
    udp = proto == "udp"
    rec.update(payload_bytes=cfg.flood_len if udp else cfg.tcp_len,
               bitrate=cfg.flood_bitrate if udp else "0")
    bench.results["flood"] = rec
    flood = workloads.Flood(tb.client, tb.server, fl.ip_b, fl.dev_b,
                            sender_cpu=place.cpu(pl.FLOOD), receiver_cpu=place.cpu(pl.HEAVY),
                            length=rec["payload_bytes"], bitrate=rec["bitrate"], proto=proto)
    flood.start_server()
    tb.defer(flood.stop_server)
    tb.defer(flood.stop)
    return flood


def flood_words(results: Results) -> str:
    """The flood of a run, in words (report lines and titles)."""
    f = results.get("flood") or {}
    if f.get("proto") == "tcp":
        return "a TCP heavy sender (one iperf3 stream, TSO and GRO off: per-packet receive work)"
    return f"a UDP flood ({f.get('payload_bytes', 64)} B iperf3 datagrams)"


# What iperf3's client says when its server is still finishing the previous test: "the
# server is busy", or, when the server drops the new control connection meanwhile (seen on
# 2026-11-27 with the heavy receiver on a loaded RT CPU), a reset of that connection.
SERVER_NOT_DONE = ("busy", "unable to receive control message: Connection reset by peer")


class Patient:
    """The flood, started again when iperf3's server still reports the previous test (with
    the heavy receiver on the busy RT CPU it can take a moment to finish one)."""

    def __init__(self, flood: workloads.Flood, tries: int = 6, pause: float = 1.0) -> None:
        self.flood, self.tries, self.pause = flood, tries, pause

    def start(self) -> None:
        for i in range(self.tries):
            try:
                self.flood.start()
                return
            except RuntimeError as e:
                if not any(s in str(e) for s in SERVER_NOT_DONE) or i == self.tries - 1:
                    raise
                time.sleep(self.pause)

    def stop(self) -> dict[str, Any]:
        return self.flood.stop()


def latency_block(bench: Bench, rep: int, condition: str, load: Load | None = None,
                  load_name: str = "load") -> list[LatencyRun]:
    """One RT latency run per mode under ``condition``; ``load`` (if any) runs throughout and
    what it reports is kept in every run's ``flood_block``."""
    cfg = bench.cfg
    stats: dict[str, Any] = {}
    block: list[LatencyRun] = []
    if load is not None:
        bench.note(f"rep {rep + 1}: starting the {load_name}")
        load.start()
    try:
        for m in bench.order(rep):
            block.append(bench.latency_run(
                m, rep, part=RTT, condition=condition, size=rfc.udp_payload(cfg.frame),
                rate=cfg.rate, poisson=cfg.poisson, duration=cfg.duration,
                uniform_us=cfg.uniform_us))
    finally:
        if load is not None:
            stats = load.stop()
    for r in block:
        r["flood_block"] = stats
    return block


def table2(bench: Bench, rep: int) -> None:
    """The Table 2 conditions (constant inter-arrival), every mode each."""
    cfg = bench.cfg
    if rep >= table2_reps(cfg):
        return
    for cond in workloads.table2(cfg.table2_scale):
        for m in bench.order(rep):
            r = bench.latency_run(m, rep, part=TABLE2, condition=cond.label,
                                  size=rfc.udp_payload(cond.frame), rate=cond.pps,
                                  poisson=False, duration=cfg.table2_duration)
            r["table2"] = cond.to_json()


def rfc2544(bench: Bench, rep: int) -> None:
    """One zero-loss search per frame size and mode."""
    cfg = bench.cfg
    if rep >= rfc_reps(cfg):
        return
    for frame in cfg.rfc_frames:
        for m in bench.order(rep):
            bench.rfc2544(m, rep, frame)


def idle(bench: Bench) -> None:
    """The idle cost of every mode, once (the first repetition's order).  A mode whose
    ``idle_problem()`` gives a reason is recorded as skipped with it: the heavy-receiver
    modes move or split the heavy flow, which the scenario starts after this part."""
    for m in bench.order(0):
        why = bench.modes[m].idle_problem()
        if why:
            bench.note(f"idle cost · {m}: skipped: {why}")
            bench.results["idle_skipped"][m] = why
            continue
        bench.idle_run(m)


def tcp_block(bench: Bench, rep: int) -> None:
    """RT latency runs of every mode under the TCP heavy sender."""
    load = bench.tcp_load()
    latency_block(bench, rep, TCP_CONDITION, load=load, load_name="TCP heavy sender")
