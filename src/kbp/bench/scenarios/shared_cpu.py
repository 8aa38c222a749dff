"""Scenario ``shared-cpu``: the papers' situation, RT and heavy receive work meeting on one
CPU (KBP Sect. 3.2.5, rt-socket-outsourcing Sect. II-C).

Two veth pairs as in ``veth-inline`` (``rt``: tester -> sockperf server; ``flood``: the heavy
sender, from the flood sender's CPU to the heavy receiver), but RPS steers the receive
processing of *both* server devices to the RT CPU, where the RT app and the heavy receiver
(iperf3 server) run.  The flood (``--flood``) is by default ``tcp``: one iperf3 TCP stream at
full speed with TSO off at the sender and GRO off at the receiver, so its receive work is one
packet per MTU segment on the RT CPU (~650,000 packets/s on this 2-CPU host) and fills that
CPU: NET_RX in softirq and ksoftirqd, the papers' "softirq load is high" -- rt-socket-
outsourcing's heavy sender.  ``udp`` (iperf3 64 B datagrams) is sender-bound on a CPU the
tester shares and left the RT CPU below saturation (no NET_RX round out of budget), so it hurt
napi in some runs only; docs/results.md, "shared-cpu", has both.

veth has no interrupt: its NAPI polls on the transmitting CPU and hands each packet to RPS,
which queues it on the RT CPU's backlog and sends that CPU an IPI; NET_RX then runs there at
the IPI's exit, or in ksoftirqd once softirq load is high -- the NIC IRQ affined to the RT CPU
of the papers, with both flows in one queue.  Why RPS and
not a tun device or the VM's virtio NICs: docs/results.md, "shared-cpu: the mechanism".

In ``napi`` and ``threaded`` both devices keep RPS, so the RT request waits in the RT CPU's
backlog behind the flood's packets.  The kbp modes serve the RT device with the poller on the
RT CPU and ``kbpctl enable`` turns RPS off on it (commit 26c022d; ``--keep-rps`` not used):
the RT flow is polled by the poller, the flood stays on the stock backlog on the same CPU --
the situation KBP is built for.  Every latency run records where NET_RX work ran on the RT
CPU (``rt_cpu_rx``: NET_RX softirqs, packets processed, RPS IPIs, ksoftirqd's run time) and
the RPS masks during the run (``steering``); the poller counters are in ``poller``.

The exclusive CPU modes (``exclusive``, ``<kbp mode>-excl``) move the flood's RPS and the
heavy receiver to the non-RT CPU; the part modes (``stock-hybrid-part``, ``hybrid-part``,
``busy-part``) keep everything on the RT CPU and put the flood's device in the backend's
class non-rt there (rt-split's docstring).  Every latency run records the heavy device's
bytes (``heavy``: Gbit/s over the run), so the summary's ``per_mode`` and the report's
headline table give each mode's heavy throughput beside its RT mean/p99/p99.9/SD.

The RT app runs SCHED_FIFO rt-prio+1 by default (``--app-policy``; the papers run their RT
threads at FIFO): with the default policy it waits behind the heavy receiver in CFS in every
mode, which is a scheduling and not a receive-path delay.

Parts: ``rtt`` (conditions ``idle`` / ``flood``, alternating which comes first) and
``rfc2544`` (under the flood).  The summary's acceptance check: in ``napi`` the flood must
raise the RT p99.9 at least ``ACCEPT_FACTOR`` times over its idle value in the same run
(median of the per-repetition ratios); if it does not, the run did not reproduce the papers'
situation and its kbp numbers say little.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kbp import sysinfo
from kbp.bench import heavy as hs
from kbp.bench import modes, plots, report, schema, steer
from kbp.bench import parts as pt
from kbp.bench import placement as pl
from kbp.bench.scenarios import Scenario
from kbp.bench.schema import LatencyRun, Results, Samples, Summary, ThroughputRun, summary_of
from kbp.bench.stats import aggregate

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig

LOADS = {"off": "idle", "on": "flood"}
CONDITIONS: dict[str, str] = {
    "idle": "RT flow alone, RPS of its server device to the RT CPU (idle baseline)",
    "flood": "RT flow with the heavy receiver's flood (see above), both devices' RPS to the "
             "RT CPU",
}
NIC_CONDITIONS: dict[str, str] = {   # --nic-pair: the RT port's IRQ on the RT CPU, no RPS on it
    "idle": "RT flow alone over the NIC pair, the RT port's interrupts on the RT CPU (idle "
            "baseline)",
    "flood": "RT flow over the NIC pair with the heavy receiver's flood (RPS to the RT CPU)",
}
ACCEPT_FACTOR = 5.0
FLOOD_RUN_S = 1.0       # modes_overhead_s: measured per-run costs over the plan (see there)
KBPCTL_FLOOD_S = 0.8
PART_FLOOD_S = 2.5
ACCEPT_STAT = "p99"
XMIT_NOTE = ("Note: xmit→poll ends where the RT device's veth NAPI poll hands the request "
             "up. In the modes that keep RPS on the RT device (napi, threaded, busypoll, "
             "defer) RPS then queues it on the RT CPU's backlog, so its wait there behind the "
             "flood is not in that column (it is in the round trip); in the kbp modes the "
             "poller takes it up the stack itself (in irq-suspend, RPS off too, the NAPI "
             "poll, the app's epoll or the deferral timer's).")
PER_MODE_TITLE = ("Headline: RT round trip idle and under the flood, with the heavy flow's "
                  "throughput, per mode (the README's table)")
RX_FIELDS = ("net_rx_per_s", "processed_per_s", "received_rps", "time_squeeze",
             "ksoftirqd_cpu_pct", "ksoftirqd_runs", "backlog_dropped", "rt_nic_irqs_per_s")


class SharedCpu(Scenario):
    name = "shared-cpu"
    title = ("RT flow and a heavy receiver's flood (a TCP heavy sender; --flood udp for a UDP "
             "one) with their receive processing steered (RPS) to the RT CPU; kbp modes move "
             "the RT device onto the poller")
    links = ("rt", "flood")
    parts = (pt.RTT, pt.RFC2544)
    rt_roles: tuple[str, ...] = (pl.HEAVY,)
    app_policy = "fifo"
    flood: str | None = "tcp"
    binds_heavy = True
    heavy_napi_choices = hs.HEAVY_NAPI
    # every mode but the periodic ones: NetAP trades per-request latency for CPU on bulk
    # streams (scenario ``stream``); at 2000 RT requests/s its interval puts ms into every
    # round trip (measured: docs/results.md, "shared-cpu"). Named with --modes, they run here.
    # Plus the exclusive CPU modes (rt-split's): ``exclusive`` (napi with the flood's RPS and
    # the heavy receiver on the non-RT CPU) and ``<kbp mode>-excl`` (the same with the RT
    # device on the poller: what kbpctl enable --isolate recommends, design.md §3), and the
    # part modes (``<kbp mode>-part``: the heavy device in the backend's class non-rt on the
    # RT CPU itself, the outsourcing paper's split by priority; nothing moved).
    def modes_by_default(self) -> tuple[str, ...]:
        return tuple(m for m in self.mode_names() if not modes.catalog()[m].periodic)

    role_doc: ClassVar[dict[str, str]] = {
        pl.RT: "RPS target of both server devices: the backlog NET_RX of the RT flow "
               "(napi, threaded) and of the flood (every mode)",
        pl.TESTER: "the RT device's veth NAPI in napi mode (veth polls on the transmitting "
                   "CPU), which hands each packet to RPS",
        pl.FLOOD: "iperf3 client (the flood: TCP with TSO off, or UDP) and the flood "
                  "device's veth NAPI",
        pl.HEAVY: "iperf3 server (the heavy receiver), on the RT CPU by design",
    }

    def roles(self, cfg: BenchConfig) -> tuple[str, ...]:
        return (pl.TESTER, pl.RT, pl.FLOOD, pl.HEAVY)

    def tools(self, cfg: BenchConfig) -> list[str]:
        return ["iperf3"]

    def check(self, cfg: BenchConfig) -> None:
        from kbp.bench.runner import Aborted
        bad = [x for x in cfg.loads if x not in LOADS]
        if bad:
            raise Aborted(f"unknown load {bad[0]!r}: use {', '.join(LOADS)}")

    def plan_seconds(self, cfg: BenchConfig, n_modes: int) -> float:
        warm = cfg.reps * ("on" in cfg.loads) + pt.rfc_reps(cfg) * (pt.RFC2544 in
                                                                   (cfg.parts or []))
        return pt.plan_seconds(cfg, n_modes, len(cfg.loads)) + warm * 1.5

    def modes_overhead_s(self, cfg: BenchConfig, mode_names: Sequence[str]) -> float:
        """What the modes' runs took over the per-run plan in this host's demos (2026-11-29,
        3 runs; planned 5.1 s a run): a flood run ~1 s more (napi 5.6-5.9 s), a mode that
        settles after it (moves the heavy flow, or reconfigures the heavy device) its settle
        in both conditions (exclusive 7.2-7.3 s under the flood), a kbpctl mode ~0.8 s more
        under the flood (stock-hybrid 6.7-7.1 s), and a -part mode's enable of the heavy
        device under the flood ~2.5 s more (9.4-10.4 s)."""
        rtt = pt.RTT in (cfg.parts or [])
        flood, idle = int("on" in cfg.loads), int("off" in cfg.loads)
        if not rtt:
            return 0.0
        per_rep = 0.0
        for name in mode_names:
            info = modes.catalog().get(name)
            if info is None:
                continue
            settles = info.moves_load or info.category == modes.PART
            per_rep += flood * FLOOD_RUN_S + (flood + idle) * (cfg.settle_s if settles else 0)
            per_rep += flood * (KBPCTL_FLOOD_S * (info.backend is not None)
                                + PART_FLOOD_S * (info.category == modes.PART))
        return cfg.reps * per_rep

    # -- the run --------------------------------------------------------------------------
    def run(self, bench: Bench) -> None:
        cfg, tb, place = bench.cfg, bench.tb, bench.placement
        assert tb is not None and place is not None
        rt_cpu = place.cpu(pl.RT)
        rt, fl = tb.link("rt"), tb.link("flood")
        nic = rt.kind == "nic"       # --nic-pair: its IRQ already lands on the RT CPU
        pinned = cfg.heavy_napi == hs.HEAVY_NAPI_RT_CPU
        steering = hs.steer_to_rt_cpu(bench, "flood", heavy_rps=not pinned)
        bench.results["steering"] = {
            "mechanism": "RT NIC IRQ + RPS of the flood" if nic else "RPS", "cpu": rt_cpu,
            "devices": steering.now(),
            "note": ("the RT port's interrupts are affined to the RT CPU (nic_pair); no RPS on "
                     "it" if nic else
                     "kbp modes: kbpctl enable turns RPS off on the RT device while on; "
                     "irq-suspend turns it off too")}
        flood = pt.start_flood(bench)
        heavy = hs.HeavySide(tb.server, fl.dev_b, rt_cpu, hs.nonrt_cpu(place), flood,
                             cpu_now=rt_cpu, ex=steering.ex)
        bench.results["heavy_napi"] = (hs.napi_on_rt_cpu(bench, heavy) if pinned else
                                       {"where": hs.HEAVY_NAPI_SENDER})
        hs.bind_heavy(bench, heavy)
        load = pt.Patient(flood)
        irqs = bench.server_port_irqs() or ()
        bench.probes.append(_probe(steering, rt_cpu, irqs, heavy))
        for rep in range(cfg.reps):
            if pt.RTT in (cfg.parts or []):
                loads = cfg.loads if rep % 2 == 0 else list(reversed(cfg.loads))
                for cond in loads:
                    pt.latency_block(bench, rep, LOADS[cond],
                                     load=load if cond == "on" else None,
                                     load_name="heavy receiver's flood")
            if pt.RFC2544 in (cfg.parts or []) and rep < pt.rfc_reps(cfg):
                _rfc_under_flood(bench, rep, load)

    # -- summary and report -------------------------------------------------------------
    def summarize(self, results: Results) -> Summary:
        summ = report.summarize(results)
        runs = [r for r in results.get("runs") or [] if r.get("part") == pt.RTT]
        summ["rt_cpu_rx"] = rx_summary(runs)
        summ["flood_vs_idle"] = flood_vs_idle(runs)
        summ["acceptance"] = acceptance(summ["flood_vs_idle"], results.get("tails"))
        place = report.placement_of(results)
        summ["equal_work"] = equal_work(runs, place.cpus.get(pl.RT), place.cpus.get(pl.FLOOD))
        summ["per_mode"] = {"condition": "flood", "idle_condition": "idle",
                            "modes": report.per_mode(summ, results.get("tails") or {}, "flood",
                                                     idle="idle")}
        return summ

    def render(self, results: Results) -> str:
        summ = summary_of(results)
        out = [acceptance_line(summ.get("acceptance") or {}), "",
               " ".join(filter(None, [f"RT app: {hs.app_words(results)}. Flood: "
                                      f"{pt.flood_words(results)}.",
                                      heavy_napi_words(results)])), ""]
        ew = summ.get("equal_work") or {}
        other = [m for m, d in ew.items() if d.get("equal") is False]
        out += report.per_mode_section((summ.get("per_mode") or {}).get("modes") or {},
                                       "flood", PER_MODE_TITLE, idle="idle", other_work=other)
        if other:
            out += [f"{report.OTHER_WORK_MARK}: the RT CPU did other heavy-flow work per packet "
                    f"than in napi (by more than {EQUAL_WORK_TOLERANCE:.0%}; see \"Equal "
                    "work?\" below): its heavy-flow rate is shown without a ratio to napi's, "
                    "which would compare different work.", ""]
        out += equal_work_section(summ.get("equal_work") or {})
        out += flood_vs_idle_section(summ.get("flood_vs_idle") or {}, summ.get(pt.RTT))
        nic = bool(results.get("nic_pair"))
        out += report.rtt_sections(results, conditions(results))
        out += [] if nic else [XMIT_NOTE, ""]
        out += rx_section(summ.get("rt_cpu_rx") or {}, report.placement_of(results))
        rfc = report.rfc_section(results)
        if rfc:
            rfc[0] = rfc[0].replace("**RFC 2544 zero-loss throughput**",
                                    "**RFC 2544 zero-loss throughput of the RT path under "
                                    "the flood**")
        return "\n".join([*out, *rfc])

    def plots(self, results: Results, samples: Samples, out: Path,
              ) -> list[Path]:
        return plots.standard(results, samples, out, conditions(results))


def heavy_napi_words(results: Results) -> str:
    """Where the heavy device's NAPI polled in the run (--heavy-napi), in words."""
    hn = results.get("heavy_napi")
    if not hn:
        return ""                      # a run from before --heavy-napi: not recorded
    if hn.get("where") == hs.HEAVY_NAPI_RT_CPU:
        return ("Heavy NAPI: on the RT CPU in every mode (--heavy-napi rt-cpu: GRO on with "
                f"gro_max_size {hn.get('gro_max_size')}, threaded, its thread pinned there, "
                "RPS off; the exclusive CPU modes move it), as a NIC with its interrupt on "
                "the RT CPU polls it.")
    return ("Heavy NAPI: none on the RT CPU in napi (--heavy-napi sender: GRO off, the "
            "sender's CPU hands each packet to RPS; the -part modes give it a NAPI polled "
            "on the RT CPU).")


def conditions(results: Results) -> dict[str, str]:
    """The conditions' titles: the RT device is a NIC port with --nic-pair, else RPS-steered."""
    return NIC_CONDITIONS if results.get("nic_pair") else CONDITIONS


def _probe(steering: steer.Steering, cpu: int, irqs: tuple[int, ...] = (),
           heavy: hs.HeavySide | None = None) -> Any:
    """Around each latency run: receive work on the RT CPU (and the RT NIC port's interrupts
    with --nic-pair), the RPS masks in force, and the heavy device's received packets (the
    runner's RT CPU check) and bytes: the heavy flow's Gbit/s in this run, per mode (rt-split's
    :func:`~kbp.bench.heavy.heavy_rate`)."""
    def begin() -> Any:
        if heavy is not None:
            heavy.keep_placed()           # --heavy-napi rt-cpu: its NAPI thread where it goes
        napi0 = _run_ns(heavy.napi_threads()) if heavy is not None and heavy.napi_pinned \
            else None
        c0 = hs.heavy_counters(heavy) if heavy is not None else None
        t0 = time.monotonic()
        rx = steer.CpuRx(cpu, irqs=irqs)
        rx.start()
        masks = steering.now()

        def end(rec: LatencyRun) -> None:
            rec["rt_cpu_rx"] = rx.stop()
            rec["steering"] = masks
            c1 = hs.heavy_counters(heavy) if heavy is not None else None
            wall = time.monotonic() - t0
            if c0 is not None and c1 is not None:
                rec["heavy"] = hs.heavy_rate(c0, c1, wall)
            if napi0 is not None and heavy is not None:
                rec["heavy_napi_threads"] = _napi_cpu(napi0, _run_ns(heavy.napi_threads()),
                                                      wall, heavy.cpu_now)
        return end
    return begin


def _run_ns(threads: dict[int, str]) -> dict[int, int]:
    """Each thread's CPU time so far (ns, /proc/PID/schedstat); gone threads left out."""
    out: dict[int, int] = {}
    for pid in threads:
        got = sysinfo.task_counters(pid).poll_ns
        if got is not None:
            out[pid] = got
    return out


def _napi_cpu(r0: dict[int, int], r1: dict[int, int], wall: float, cpu: int,
              ) -> dict[str, Any]:
    """The heavy device's NAPI threads over a run: their CPU share (% of the run's wall
    time, threads present at both ends), the CPU they were pinned to and their placement
    read back at the run's end."""
    ns = sum(r1[p] - r0[p] for p in r1 if p in r0)
    return {"cpu_pct": 100.0 * ns / 1e9 / max(wall, 1e-9), "threads": sorted(r1),
            "cpu": cpu, "placement": [modes.thread_placement(p) for p in sorted(r1)]}


def _rfc_under_flood(bench: Bench, rep: int, flood: pt.Patient) -> None:
    bench.note(f"rep {rep + 1}: starting the heavy receiver's flood (RFC 2544)")
    flood.start()
    done: list[ThroughputRun] = []
    try:
        for frame in bench.cfg.rfc_frames:
            for m in bench.order(rep):
                done.append(bench.rfc2544(m, rep, frame))
    finally:
        stats = flood.stop()
    for s in done:
        s["condition"] = "flood"
        s["flood_block"] = stats


# -- summaries ------------------------------------------------------------------------------
def rx_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{condition: {mode: {field: aggregate}}} of the runs' rt_cpu_rx, plus the poller's
    CPU share (poll_ns) and the RT device's RPS during the runs."""
    per: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rps: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in runs:
        key = (r["condition"], r["mode"])
        rx = r.get("rt_cpu_rx") or {}
        wall = rx.get("wall_s") or 0
        for f in RX_FIELDS:
            v = rx.get(f)
            if v is not None and f in ("received_rps", "time_squeeze", "ksoftirqd_runs",
                                       "backlog_dropped") and wall:
                v = v / wall
            if v is not None:
                per[key][f].append(float(v))
        poll_ns = (r.get("poller") or {}).get("poll_ns")
        if poll_ns is not None and wall:
            per[key]["poller_poll_pct"].append(100.0 * poll_ns / 1e9 / wall)
        for dev, cpus in (r.get("steering") or {}).items():
            rps[key].add(f"{dev.split('-')[0]}:{','.join(map(str, cpus)) or 'off'}")
    out: dict[str, Any] = {}
    for (cond, mode), fields in per.items():
        d = out.setdefault(cond, {}).setdefault(mode, {})
        for f, vs in fields.items():
            d[f] = aggregate(vs)
        d["rps"] = sorted(rps[(cond, mode)])
    return out


EQUAL_WORK_TOLERANCE = 0.10     # per-packet RT-CPU work within this of napi's: equal work
BOUND_PCT = 95.0                # a CPU this busy over a run bounds the heavy flow's rate
#: the equal-work record's per-packet fields (µs per heavy packet on the RT CPU): all busy
#: time, then by context: softirq (at IRQ exit or in ksoftirqd: NET_RX, /proc/stat's softirq)
#: and task context (the NAPI threads', kbp pollers' and the apps' system time), and the
#: polling threads' own run time (the mode's RT poller and the heavy device's non-rt one)
EW_FIELDS = ("us_per_heavy_packet", "softirq_us", "task_us", "pollers_us")


def _ew_rep(r: Mapping[str, Any], rt_cpu: int, flood_cpu: int | None) -> dict[str, float] | None:
    """One flood run's equal-work numbers, None without CPU times or heavy packets."""
    sys_ = r.get("sys") or {}
    cpus = sys_.get("cpu") or {}
    secs = (cpus.get(str(rt_cpu)) or {}).get("seconds") or {}
    pkts = int((r.get("heavy") or {}).get("rx_packets") or 0)
    if not secs or not pkts:
        return None
    per = 1e6 / pkts
    busy = sum(v for k, v in secs.items() if k not in ("idle", "iowait"))
    roles = sys_.get("threads_cpu_pct") or {}
    wall = float(sys_.get("wall_s") or 0)
    # the heavy device's NAPI thread: the non-rt poller in the -part modes; with
    # --heavy-napi rt-cpu the pinned NAPI thread in every mode (the same thread in -part)
    # (counted only while pinned to the RT CPU: the exclusive CPU modes move it away)
    hn = r.get("heavy_napi_threads") or {}
    heavy_thread = max(float(roles.get("nonrt_poller") or 0),
                       float(hn.get("cpu_pct") or 0) if hn.get("cpu") == rt_cpu else 0.0)
    polling = float(roles.get("poller") or 0) + heavy_thread
    out = {"us_per_heavy_packet": busy * per, "softirq_us": float(secs.get("softirq") or 0) * per,
           "task_us": sum(float(secs.get(k) or 0) for k in ("user", "nice", "system")) * per,
           "pollers_us": polling / 100 * wall * per,
           "rt_cpu_busy_pct": float((cpus.get(str(rt_cpu)) or {}).get("busy_pct") or 0)}
    if flood_cpu is not None and flood_cpu != rt_cpu and str(flood_cpu) in cpus:
        out["sender_cpu_busy_pct"] = float(cpus[str(flood_cpu)].get("busy_pct") or 0)
    return out


def bound_by(rt_busy: float | None, sender_busy: float | None,
             heavy_moved: bool = False) -> str:
    """Which CPU limited the heavy flow's rate in a run: the one ≥ BOUND_PCT busy (the
    sender's when the flood sender's CPU is saturated: the RT CPU then had time to spare).
    Where the mode moved the heavy flow to the sender's CPU (``heavy_moved``: exclusive,
    the -excl modes) that CPU does the sender's and the receiver's work: "non-RT CPU"."""
    rt = rt_busy is not None and rt_busy >= BOUND_PCT
    snd = sender_busy is not None and sender_busy >= BOUND_PCT
    other = "non-RT CPU" if heavy_moved else "sender"
    return {(True, True): "both", (True, False): "RT CPU", (False, True): other,
            (False, False): "neither"}[(rt, snd)]


def equal_work(runs: Sequence[Mapping[str, Any]], rt_cpu: int | None,
               flood_cpu: int | None = None) -> dict[str, Any]:
    """Per mode under the flood: the RT CPU's busy time per heavy-device packet (µs; all of
    the CPU's non-idle time over the run, over the heavy device's received packets), split
    by context (:data:`EW_FIELDS`), its ratio to napi's (median of per-repetition ratios),
    whether it is within EQUAL_WORK_TOLERANCE of napi's (only then does a heavy-flow ratio
    to napi compare the same work: napi's heavy device runs no NAPI on the RT CPU, GRO off;
    the -part modes turn GRO on and poll the veth NAPI there; the -excl modes move it away),
    and which CPU bounded the heavy flow (:func:`bound_by`, per repetition)."""
    if rt_cpu is None:
        return {}
    per: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for r in runs:
        if r.get("condition") != "flood":
            continue
        rec = _ew_rep(r, rt_cpu, flood_cpu)
        if rec is not None:
            per[r["mode"]][int(r["rep"])] = rec
    base = per.get(modes.BASELINE) or {}
    out: dict[str, Any] = {}
    for mode, by_rep in per.items():
        ratios = [v["us_per_heavy_packet"] / base[k]["us_per_heavy_packet"]
                  for k, v in by_rep.items() if base.get(k, {}).get("us_per_heavy_packet")]
        to_napi = aggregate(ratios)
        med = to_napi.get("median")
        d: dict[str, Any] = {f: aggregate(v[f] for v in by_rep.values()) for f in EW_FIELDS}
        for f in ("rt_cpu_busy_pct", "sender_cpu_busy_pct"):
            d[f] = aggregate(v[f] for v in by_rep.values() if f in v)
        bounds = sorted({bound_by(v.get("rt_cpu_busy_pct"), v.get("sender_cpu_busy_pct"),
                                  hs.exclusive_like(mode))
                         for v in by_rep.values()})
        out[mode] = {**d, "ratio_to_napi": to_napi, "bound_by": bounds,
                     "equal": None if med is None else abs(med - 1.0) <= EQUAL_WORK_TOLERANCE}
    return out


def equal_work_section(ew: dict[str, Any]) -> list[str]:
    if not ew:
        return []
    unequal = [m for m in report._modes_in(ew) if ew[m].get("equal") is False]
    sender = [m for m in report._modes_in(ew) if "sender" in (ew[m].get("bound_by") or [])]
    rows = ["**Equal work?** The RT CPU's busy time per heavy-flow packet under the flood "
            "(µs; median of repetitions [min-max] x ratio to napi, median of per-repetition "
            "ratios), split by context: softirq (NET_RX at IRQ exit or in ksoftirqd), task "
            "(NAPI threads, kbp pollers, apps: system and user time), and the polling threads' "
            f"own run time (RT poller + non-rt poller). Within {EQUAL_WORK_TOLERANCE:.0%} of "
            "napi's: the modes do the same heavy-flow work on the RT CPU, and their heavy-flow "
            "ratios compare like with like. "
            + (f"Not so for {', '.join(unequal)}: the headline shows their heavy-flow rate "
               "without a ratio (another GRO setting, the veth poll on the RT CPU, or the heavy "
               "flow moved away)." if unequal else "Every mode is within it.")
            + (f" Bound by: the CPU ≥ {BOUND_PCT:g} % busy in a repetition; sender-bound "
               f"({', '.join(sender)}): the flood sender's CPU, not the RT CPU, set the heavy "
               "rate, so the RT CPU had time to spare." if sender else ""), "",
            "| mode | RT CPU µs per heavy packet | softirq µs | task µs | polling threads µs "
            "| RT CPU busy % | sender CPU busy % | bound by | equal work |",
            "|---|---|---|---|---|---|---|---|---|"]
    for mode in report._modes_in(ew):
        d = ew[mode]
        us = dict(d.get("us_per_heavy_packet") or {})
        us["ratio_to_napi"] = d.get("ratio_to_napi") or {}
        eq = {True: "yes", False: "**no**", None: "-"}[d.get("equal")]
        ctx = " | ".join(report.cell(d.get(f)) for f in (*EW_FIELDS[1:], "rt_cpu_busy_pct",
                                                          "sender_cpu_busy_pct"))
        rows.append(f"| {mode} | {report.cell(us)} | {ctx} | "
                    f"{', '.join(d.get('bound_by') or []) or '-'} | {eq} |")
    return [*rows, ""]


def flood_vs_idle(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per mode: p99.9 and max under the flood over idle, per repetition (then median)."""
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in runs:
        by[(r["mode"], r["condition"])][r["rep"]] = r.get("rtt_ns") or {}
    out: dict[str, Any] = {}
    for mode in sorted({m for m, _ in by}):
        idle, flood = by.get((mode, "idle"), {}), by.get((mode, "flood"), {})
        d: dict[str, Any] = {}
        for p in ("p99.9", "max"):
            pairs = [(idle[k].get(p), flood[k].get(p)) for k in idle if k in flood]
            d[f"{p}_ratio"] = aggregate(f / i for i, f in pairs if i and f is not None)
            d[f"idle_{p}_us"] = aggregate(x / 1000 for v in idle.values()
                                          if (x := v.get(p)) is not None)
            d[f"flood_{p}_us"] = aggregate(x / 1000 for v in flood.values()
                                           if (x := v.get(p)) is not None)
        for c, vs in (("idle", idle), ("flood", flood)):
            d[f"{c}_n"] = aggregate(v.get("n") for v in vs.values())
        out[mode] = d
    return out


def acceptance(fvi: dict[str, Any], tails: dict[str, Any] | None = None) -> dict[str, Any]:
    """The scenario's own check: the flood must raise napi's RT tail ACCEPT_FACTOR times.

    On the pooled p99 (``ACCEPT_STAT``: the k-th largest of all repetitions' samples, k in
    the hundreds, not the 7th of one run that p99.9 is) with its moving-block bootstrap CI:
    PASS when even the low end of the ratio (flood CI low / idle CI high) reaches the
    factor, FAIL when even its high end (flood CI high / idle CI low) stays below it,
    INCONCLUSIVE in between.  Results without pooled tails (older files) fall back to the
    median of the per-repetition p99.9 ratios, said so."""
    key = {c: schema.sample_key(pt.RTT, c, modes.BASELINE) for c in ("idle", "flood")}
    got = {c: ((tails or {}).get(k) or {}).get(ACCEPT_STAT) for c, k in key.items()}
    idle, flood = got["idle"], got["flood"]
    if idle and flood and idle.get("ci95") and flood.get("ci95") and all(
            idle["ci95"]) and idle["value"]:
        (ilo, ihi), (flo, fhi) = idle["ci95"], flood["ci95"]
        lo, hi = flo / ihi, fhi / ilo
        verdict: str | None = ("PASS" if lo >= ACCEPT_FACTOR else "FAIL" if hi < ACCEPT_FACTOR
                               else "INCONCLUSIVE")
        return {"check": f"napi {ACCEPT_STAT} flood / idle >= {ACCEPT_FACTOR:g} (pooled over "
                         "the repetitions; the ratio's interval from the two 95 % CIs)",
                "statistic": ACCEPT_STAT, "required": ACCEPT_FACTOR,
                "factor": flood["value"] / idle["value"], "ratio_ci": [lo, hi],
                "idle": {"value": idle["value"], "ci95": idle["ci95"], "k": idle.get("k"),
                         "n": idle.get("n")},
                "flood": {"value": flood["value"], "ci95": flood["ci95"],
                          "k": flood.get("k"), "n": flood.get("n")},
                "verdict": verdict, "passed": None if verdict == "INCONCLUSIVE"
                else verdict == "PASS"}
    r = (fvi.get(modes.BASELINE) or {}).get("p99.9_ratio") or {}
    med = r.get("median")
    verdict = None if med is None else ("PASS" if med >= ACCEPT_FACTOR else "FAIL")
    return {"check": f"napi p99.9 flood / idle >= {ACCEPT_FACTOR:g} (median of the "
                     "per-repetition ratios; results without pooled tails)",
            "statistic": "p99.9 per repetition", "required": ACCEPT_FACTOR,
            "factor": med, "min": r.get("min"), "max": r.get("max"), "n": r.get("n", 0),
            "verdict": verdict, "passed": None if med is None else bool(med >= ACCEPT_FACTOR)}


# -- markdown -------------------------------------------------------------------------------
def acceptance_line(acc: dict[str, Any]) -> str:
    if acc.get("verdict") is None and acc.get("passed") is None:
        return "**Acceptance check: not evaluated** (no napi run with and without the flood)."
    word = acc.get("verdict") or ("PASS" if acc["passed"] else "FAIL")
    req = acc.get("required", ACCEPT_FACTOR)
    tail = {"PASS": "", "FAIL": " -- the flood did not hurt napi enough here: this run is "
                            "not yet the papers' situation",
            "INCONCLUSIVE": " -- the interval straddles the factor: this run cannot say "
                            "whether it is the papers' situation; rerun, or run longer"}[word]
    if "ratio_ci" in acc:
        i, f = acc["idle"], acc["flood"]
        lo, hi = acc["ratio_ci"]
        return (f"**Acceptance check: {word}**: napi's RT {acc['statistic']} under the flood "
                f"is x{acc['factor']:.2f} its idle value [{lo:.2f}-{hi:.2f}] "
                f"({fmt_us(f['value'])} µs [{fmt_us(f['ci95'][0])}-{fmt_us(f['ci95'][1])}] "
                f"over {fmt_us(i['value'])} µs [{fmt_us(i['ci95'][0])}-"
                f"{fmt_us(i['ci95'][1])}], pooled, k={f.get('k')} and {i.get('k')} of "
                f"n={f.get('n'):,} and {i.get('n'):,}); required x{req:g} over the whole "
                f"interval{tail}.")
    return (f"**Acceptance check: {word}**: napi's RT p99.9 under the flood is "
            f"x{acc['factor']:.2f} its idle value [{acc['min']:.2f}-{acc['max']:.2f} over "
            f"{acc['n']} repetitions]; required x{req:g}{tail}.")


def fmt_us(ns: float | None) -> str:
    return report.fmt(None if ns is None else ns / 1000)


def flood_vs_idle_section(fvi: dict[str, Any], rtt: dict[str, Any] | None = None,
                          ) -> list[str]:
    """The idle-vs-flood table; ``rtt``: the summary's per condition and mode aggregates,
    whose ``ratio_to_napi`` (the median of per-repetition ratios, the report's one
    definition) the x values are."""
    if not fvi:
        return []
    rows = ["**RT round trip, idle vs flood** (µs; median of repetitions; x = ratio to napi, "
            "median of per-repetition ratios; flood/idle = median of per-repetition ratios)",
            "",
            "| mode | p99.9 idle | p99.9 flood | p99.9 flood/idle | max idle | max flood | "
            "max flood/idle |", "|---|---|---|---|---|---|---|"]
    for mode in report._modes_in(fvi):
        d = fvi[mode]
        cells = []
        for p in ("p99.9", "max"):
            for c in ("idle", "flood"):
                v = (d.get(f"{c}_{p}_us") or {}).get("median")
                agg = (((rtt or {}).get(c) or {}).get(mode) or {}).get(f"rtt_{p}_us") or {}
                r = (agg.get("ratio_to_napi") or {}).get("median")
                x = f" x{r:.2f}" if v is not None and r is not None and \
                    mode != modes.BASELINE else ""
                n = (d.get(f"{c}_n") or {}).get("median")
                k = report.tail_note(n, 99.9 if p == "p99.9" else 100.0) if v is not None \
                    else ""
                cells.append(f"{report.fmt(v)}{x}{k}")
            cells.append(report.cell(d.get(f"{p}_ratio")))
        rows.append(f"| {mode} | " + " | ".join(cells) + " |")
    return [*rows, ""]


def rx_section(rx: dict[str, Any], place: pl.Placement) -> list[str]:
    if not rx:
        return []
    cpu = place.cpus.get(pl.RT)
    nic = any("rt_nic_irqs_per_s" in d for modes in rx.values() for d in modes.values())
    rows = [f"**Receive work on the RT CPU {cpu}** (per second of the tester's run, median of "
            "repetitions): NET_RX softirqs, packets through the stack (softnet processed), "
            "RPS IPIs received, NET_RX rounds out of budget (time_squeeze), ksoftirqd's CPU "
            "share and runs, the poller's time in NAPI poll; RPS masks in force (device: CPUs)"
            + ("; with --nic-pair the RT NIC port's interrupts" if nic else ""),
            "", "| condition | mode | RPS | NET_RX/s | pkts/s | RPS IPIs/s | squeezed/s | "
            "ksoftirqd % | ksoftirqd runs/s | backlog drops/s | poller in poll % |"
            + (" RT NIC IRQs/s |" if nic else ""),
            "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if nic else "")]
    fields = ("net_rx_per_s", "processed_per_s", "received_rps", "time_squeeze",
              "ksoftirqd_cpu_pct", "ksoftirqd_runs", "backlog_dropped", "poller_poll_pct",
              *(("rt_nic_irqs_per_s",) if nic else ()))
    for cond in (c for c in CONDITIONS if c in rx):
        for mode in report._modes_in(rx[cond]):
            d = rx[cond][mode]
            vals = [report.cell(d.get(f), spread=False) for f in fields]
            rows.append(f"| {cond} | {mode} | {' '.join(d.get('rps') or [])} | "
                        + " | ".join(vals) + " |")
    return [*rows, ""]


SCENARIO = SharedCpu()
