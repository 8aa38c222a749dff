"""Scenario ``rt-split``: rt-socket-outsourcing Sect. IV-A / Table 3 (Garcia, Shinjo, Pu)
as closely as a netns + veth host allows: a simple RT request/response server and a TCP heavy
receiver whose receive processing meets it on the RT CPU; per mode the RT response time's
mean, 99th percentile and SD (Table 3), the heavy receiver's throughput (Fig. 7) and the RT
CPU's use (Fig. 8), with ratios to napi of the same repetition.

The paper's setup and this one:

==========================  ===================================================================
paper (Sect. IV-A)          here
==========================  ===================================================================
netperf UDP request/        kbp-rtt -> sockperf server (UDP echo) over the RT pair, requests
response, random gaps        at random gaps uniform in 1-10 ms (``--uniform MIN_US,MAX_US``,
1-10 ms                      default 1000,10000: ~182 req/s), 64 B frames; kernel software
                             timestamps on the client side (the paper: a hardware monitor)
iperf server (Heavy          iperf3 server (role ``heavy``) on the RT CPU, one iperf3 TCP
Receiver), iperf TCP at      stream at full speed into it from the flood sender's CPU (role
full speed (Heavy Sender)    ``flood``) over the ``heavy`` veth pair
RT and non-RT receive       RPS of both server devices to the RT CPU (shared-cpu's mechanism):
processing on one host       on veth each packet is queued on the RT CPU's backlog with an
CPU                          IPI, NET_RX runs there; with ``--nic-pair`` the RT port's IRQ is
                             on the RT CPU and only the heavy device uses RPS
RT threads FIFO, non-RT     the RT app at SCHED_FIFO rt-prio+1 (51), pollers FIFO rt-prio;
normal (Table 2)             heavy receiver, iperf3 client SCHED_OTHER
==========================  ===================================================================

The heavy pair is shaped so its receive work is per packet on the RT CPU, as a NIC's would
be: TSO off on the sender's end (the stack segments to MTU-sized packets, as on the wire)
and GRO off on the receiver's (no veth NAPI: each segment goes through netif_rx(), RPS
and the RT CPU's backlog, and up the TCP stack there).  With TSO on, veth would hand
64 KiB skbs to the backlog: a fraction of the per-packet work a 10G NIC's flow costs.

Modes (the paper's methods; napi is the baseline every ratio refers to):

``napi``       vanilla Linux: RT requests wait in the RT CPU's backlog behind the heavy
               flow's segments, NET_RX at the IPI's exit (or ksoftirqd)
``threaded``   stock threaded NAPI on the RT device (the paper's threaded interrupt handling
               is PREEMPT_RT's IRQ threads; on veth the RT device's NAPI kthread still hands
               the request to RPS, so it waits in the same backlog: the second priority
               inversion of Sect. II-C)
``exclusive``  the exclusive CPU method (Sect. II-D), this scenario's own mode: the RT device
               stays on plain napi (RPS to the RT CPU), but the heavy receiver (iperf3 server)
               and its device's receive processing (RPS) move to the non-RT CPU while the mode
               is on, and back after; the RT CPU then runs only RT work
``stock-hybrid``  the kbp RT class on this host (kbpctl stock backend: RT device off RPS, its
               NAPI polled by a SCHED_FIFO kthread on the RT CPU; the heavy flow stays on the
               RT CPU's backlog); ``hybrid`` / ``busy`` are kbp.ko's, in the VM rig
``<kbp mode>-excl``  the kbp mode and the exclusive CPU together (kbpctl enable --isolate's
               placement, the heavy receiver moved too)
``<kbp mode>-part``  the outsourcing paper's own method, RT and non-RT receive work split by
               priority on the *same* CPU (``stock-hybrid-part``, ``hybrid-part``,
               ``busy-part``): the RT device on the kbp mode's RT poller, the heavy device in
               the same backend's class non-rt on the RT CPU (kbp.ko: that CPU's non-rt
               poller, SCHED_NORMAL, giving way to the RT poller between polls of a small
               quota; stock: its NAPI thread SCHED_OTHER there).  The heavy device gets a NAPI
               that still delivers per packet while the mode is on (GRO on with gro_max_size
               1600; with GRO off veth has none) and RPS off (kbpctl enable).  Nothing moves;
               ``exclusive`` stays the yardstick.  Skipped with the reason where the backend
               lacks the class (kbp.ko not loaded; a stock backend without ``--class non-rt``)

The non-RT CPU of ``exclusive`` (``nonrt_cpu``): the first usable CPU no role uses, else one
only the harness uses, else the flood sender's (on 2 CPUs: the tester's and flood sender's
CPU 0, the only other one -- the paper's two-core host had exactly an RT and a non-RT CPU).

The summary's ``per_mode`` (and the report's headline table): per mode under the heavy
sender, the RT mean/p99/p99.9/SD/max and the heavy flow's Gbit/s with the repetitions, n and
the pooled p99.9's bootstrap CI (:func:`kbp.bench.report.per_mode`; shared-cpu has the same).

Per latency run (``results.runs``): ``heavy`` (the heavy device's receive bytes and packets
over the run's window: Gbit/s at the device, L2 bytes; the heavy receiver's CPU affinity),
``rt_cpu_rx`` and ``nonrt_cpu_rx`` (NET_RX softirqs, packets through the stack, RPS IPIs,
ksoftirqd on the RT and the non-RT CPU: where the heavy flow was processed), ``steering``
(the RPS masks in force), ``poller`` (the kbp modes' counters).  The summary's
``steering_check`` says, per mode, in how many runs the heavy flow was processed where the
mode puts it (the RT CPU, or the non-RT CPU in ``exclusive``).

In the VM rig (``python -m kbp.bench vm --nic-pair --scenario rt-split``, kbp.ko loaded:
hybrid and busy run there): on kernels before 6.15 the runner refuses threaded / stock-hybrid
and the module modes in one ``--nic-pair`` run (a NAPI keeps its kthread), so pass
``--modes napi,exclusive,hybrid,busy`` there and the others in a second invocation.

Parts: ``rtt`` with the loads ``--loads`` names: ``on`` (condition ``tcp``, the paper's
situation; the presets run only this) and ``off`` (``idle``: the RT flow alone, a baseline).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from kbp import rps
from kbp.bench import heavy as hs
from kbp.bench import modes, plots, report, steer, workloads
from kbp.bench import parts as pt
from kbp.bench import placement as pl
from kbp.bench.scenarios import Scenario
from kbp.bench.schema import LatencyRun, Results, Samples, Summary, config_of, summary_of
from kbp.bench.stats import group_summaries

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig

#: the kbp modes the heavy-side variants (-excl, -part) build on, in the variants' order
KBP_MODES = tuple(dict.fromkeys(i.base for i in modes.catalog().values()
                                if i.category == modes.PART and i.base))
LOADS = {"off": "idle", "on": "tcp"}
CONDITIONS: dict[str, str] = {
    "tcp": "RT flow with the TCP heavy sender, both server devices' receive processing on "
           "the RT CPU (the paper's situation)",
    "idle": "RT flow alone, its receive processing on the RT CPU (baseline)",
}
PAPER_UNIFORM_US = (1000.0, 10000.0)        # Sect. IV-A: random gaps of 1 to 10 ms
#: the kbp modes with the exclusive CPU ("<kbp mode>-excl"), and with the heavy device in
#: class non-rt on the RT CPU ("<kbp mode>-part")
KBP_EXCL_MODES = modes.named(lambda i: i.category == modes.EXCL and i.base in KBP_MODES)
PART_MODES = modes.named(lambda i: i.category == modes.PART)
#: the modes in this scenario's tables' order (and its default)
ORDER = (modes.NAPI, modes.THREADED, modes.EXCLUSIVE, *KBP_MODES, *KBP_EXCL_MODES,
         *PART_MODES)
# Table 3 of the paper (µs: mean, p99, SD) and Fig. 7's throughput, by the mode standing in
PAPER_TABLE3: dict[str, tuple[str, float, float, float]] = {
    modes.NAPI: ("(non-RT) vanilla Linux", 92.5, 225.0, 29.2),
    modes.THREADED: ("threaded interrupt handling", 100.8, 202.9, 29.0),
    modes.EXCLUSIVE: ("exclusive CPU", 70.5, 96.0, 11.8),
    "kbp": ("outsourcing (the paper's RT class)", 32.9, 46.8, 4.3),
}
HEAVY_LINK = "heavy"
PER_MODE_TITLE = ("Headline: RT response time with the TCP heavy sender and the heavy flow's "
                  "throughput, per mode (the README's table)")
STEER_SHARE = 0.5     # steering_check: this share of the heavy flow's packets where it belongs
RUN_OVERHEAD_S = 0.3  # per run: the probes, exclusive's moves


# -- the scenario ---------------------------------------------------------------------------
class RtSplit(Scenario):
    name = "rt-split"
    title = ("rt-socket-outsourcing Table 3: RT UDP request/response (random gaps 1-10 ms) "
             "and a TCP heavy receiver, both received on the RT CPU; RT mean/p99/SD, heavy "
             "Gbit/s, RT CPU use; the exclusive CPU method as mode exclusive")
    measures = ("Kernel-timestamped round trips of the RT flow (SO_TIMESTAMPING software "
                "stamps), microseconds; the heavy receiver's device counters and the CPUs' "
                "time (/proc/stat, /proc/net/softnet_stat) over each run.")
    links: tuple[str, ...] = ("rt", HEAVY_LINK)
    parts: tuple[str, ...] = (pt.RTT,)
    rt_roles: tuple[str, ...] = (pl.HEAVY,)
    app_policy = "fifo"
    binds_heavy = True
    default_modes: tuple[str, ...] = ORDER
    default_parts: tuple[str, ...] | None = (pt.RTT,)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"loads": ["on"], "parts": [pt.RTT], "duration": 10.0},
        "demo": {"loads": ["on"], "parts": [pt.RTT], "duration": 4.0, "reps": 3},
        "smoke": {"loads": ["on"], "parts": [pt.RTT], "duration": 2.0,
                  "modes": [modes.NAPI, modes.EXCLUSIVE, modes.STOCK_HYBRID]},
    }
    role_doc: ClassVar[dict[str, str]] = {
        pl.RT: "RPS target of both server devices: the backlog NET_RX of the RT flow (napi, "
               "threaded, exclusive) and of the heavy flow (every mode but exclusive)",
        pl.TESTER: "kbp-rtt (the RT client) and, in napi mode, the RT device's veth NAPI",
        pl.FLOOD: "iperf3 TCP client (the heavy sender), TSO off",
        pl.HEAVY: "iperf3 server (the heavy receiver), on the RT CPU by design; on the "
                  "non-RT CPU in mode exclusive",
    }

    def roles(self, cfg: BenchConfig) -> tuple[str, ...]:
        return (pl.TESTER, pl.RT, pl.FLOOD, pl.HEAVY)

    def tools(self, cfg: BenchConfig) -> list[str]:
        return ["iperf3"]

    def check(self, cfg: BenchConfig) -> None:
        from kbp.bench.runner import Aborted, BenchConfig
        bad = [x for x in cfg.loads if x not in LOADS]
        if bad:
            raise Aborted(f"unknown load {bad[0]!r} for rt-split: use {', '.join(LOADS)} "
                          "(on = the TCP heavy sender)")
        if not cfg.poisson:
            raise Aborted("rt-split's RT flow has random gaps uniform in a range (the paper's "
                          "1-10 ms): set it with --uniform MIN_US,MAX_US, not --constant")
        if cfg.rate != BenchConfig().rate:
            raise Aborted("rt-split's request rate follows from its gaps (uniform 1-10 ms: "
                          "~182 req/s): set them with --uniform MIN_US,MAX_US, not --rate")
        if cfg.duration < 1:
            raise Aborted("--duration must be at least 1 s for rt-split (gaps up to 10 ms)")

    def plan_seconds(self, cfg: BenchConfig, n_modes: int) -> float:
        runs = cfg.reps * len(cfg.loads) * n_modes
        warm = cfg.reps * ("on" in cfg.loads) * 1.5
        return pt.plan_seconds(cfg, n_modes, len(cfg.loads)) + runs * RUN_OVERHEAD_S + warm

    # -- the run ------------------------------------------------------------------------
    def run(self, bench: Bench) -> None:
        cfg, tb, place = bench.cfg, bench.tb, bench.placement
        assert tb is not None and place is not None
        if cfg.uniform_us is None:
            cfg.uniform_us = list(PAPER_UNIFORM_US)
        bench.results["config"]["uniform_us"] = list(cfg.uniform_us)
        rt_cpu, other = place.cpu(pl.RT), hs.nonrt_cpu(place)
        rt, hv = tb.link("rt"), tb.link(HEAVY_LINK)
        nic = rt.kind == "nic"
        shaping = pt.per_packet(hv)
        steering = hs.steer_to_rt_cpu(bench, HEAVY_LINK)
        load = workloads.Flood(tb.client, tb.server, hv.ip_b, hv.dev_b,
                               sender_cpu=place.cpu(pl.FLOOD), receiver_cpu=place.cpu(pl.HEAVY),
                               length=cfg.tcp_len, proto="tcp", port=workloads.IPERF_PORT)
        load.start_server()
        tb.defer(load.stop_server)
        tb.defer(load.stop)
        heavy = hs.HeavySide(tb.server, hv.dev_b, rt_cpu, other, load, cpu_now=rt_cpu,
                             ex=steering.ex)
        hs.bind_heavy(bench, heavy)
        bench.results["steering"] = {
            "mechanism": "RT NIC IRQ + RPS of the heavy device" if nic else "RPS",
            "cpu": rt_cpu, "devices": steering.now(),
            "note": ("kbp modes: kbpctl enable turns RPS off on the RT device while on; "
                     "exclusive: the heavy device's RPS on the non-RT CPU while on")}
        bench.results["rt_split"] = {
            "uniform_us": list(cfg.uniform_us), "nonrt_cpu": other,
            "nonrt_roles": place.roles_on(other),
            "heavy": {"sender": "iperf3 -c (TCP, full speed) on the flood sender's CPU, "
                                "TSO off on its veth end",
                      "receiver": "iperf3 -s on the RT CPU (the non-RT CPU in exclusive), "
                                  "GRO off on its veth end (no NAPI: netif_rx + RPS)",
                      "tcp_len": cfg.tcp_len, "shaping": shaping},
            "paper_table3_us": {k: {"method": v[0], "mean": v[1], "p99": v[2], "sd": v[3]}
                                for k, v in PAPER_TABLE3.items()}}
        irqs = bench.server_port_irqs() or ()
        bench.probes.append(_probe(steering, heavy, irqs))
        patient = pt.Patient(load)
        for rep in range(cfg.reps):
            loads = cfg.loads if rep % 2 == 0 else list(reversed(cfg.loads))
            for cond in loads:
                pt.latency_block(bench, rep, LOADS[cond],
                                 load=patient if cond == "on" else None,
                                 load_name="TCP heavy sender")

    # -- summary and report -------------------------------------------------------------
    def summarize(self, results: Results) -> Summary:
        summ = report.summarize(results)
        runs = [r for r in results.get("runs") or [] if r.get("part") == pt.RTT]
        summ["split"] = split_summary(runs, report.placement_of(results))
        summ["steering_check"] = steering_check(runs)
        summ["per_mode"] = {"condition": LOADS["on"], "idle_condition": LOADS["off"],
                            "modes": report.per_mode(summ, results.get("tails") or {},
                                                     LOADS["on"], idle=LOADS["off"])}
        return summ

    def render(self, results: Results) -> str:
        summ = summary_of(results)
        split = summ.get("split") or {}
        rs = results.get("rt_split") or {}
        place = report.placement_of(results)
        cfg = config_of(results)
        out = [f"RT app: {hs.app_words(results)}. RT flow: {report.arrival_words(cfg)}, "
               f"{cfg.get('frame')} B frames, {cfg.get('duration'):g} s per run. Non-RT CPU "
               f"of mode exclusive: {rs.get('nonrt_cpu', '?')}"
               f"{_roles_words(rs.get('nonrt_roles'))}.", ""]
        out += [check_line(summ.get("steering_check") or {}), ""]
        out += report.per_mode_section((summ.get("per_mode") or {}).get("modes") or {},
                                       LOADS["on"], PER_MODE_TITLE, idle=LOADS["off"])
        for cond in (c for c in CONDITIONS if c in split):
            out += table3_section(cond, split[cond], place)
        out += where_section(split, place, rs.get("nonrt_cpu"))
        out += paper_section()
        out += ["Full latency and cost tables of the same runs:", ""]
        out += report.rtt_sections(results, {c: t for c, t in CONDITIONS.items()})
        return "\n".join(out)

    def plots(self, results: Results, samples: Samples, out: Path,
              ) -> list[Path]:
        return plots.standard(results, samples, out, CONDITIONS)


def _probe(steering: steer.Steering, heavy: hs.HeavySide, irqs: tuple[int, ...] = ()) -> Any:
    """Around each latency run: receive work on the RT and the non-RT CPU, the heavy
    receiver's bytes and packets, where it runs, the RPS masks in force."""
    def begin() -> Any:
        rx = steer.CpuRx(heavy.rt_cpu, irqs=irqs)
        rx2 = steer.CpuRx(heavy.nonrt_cpu)
        masks = {**steering.now(),
                 heavy.dev: rps.masks_cpus(steer.read_rps(heavy.netns, heavy.dev))}
        where = heavy.receiver_cpus()
        c0, t0 = hs.heavy_counters(heavy), time.monotonic()
        rx.start()
        rx2.start()

        def end(rec: LatencyRun) -> None:
            rec["rt_cpu_rx"] = rx.stop()
            rec["nonrt_cpu_rx"] = rx2.stop()
            c1, t1 = hs.heavy_counters(heavy), time.monotonic()
            rec["heavy"] = {"receiver_cpus": where, **hs.heavy_rate(c0, c1, t1 - t0)}
            rec["steering"] = masks
        return end
    return begin


# -- summaries ------------------------------------------------------------------------------
def split_metrics(rec: dict[str, Any], place: pl.Placement) -> dict[str, float | None]:
    """A run's Table 3 metrics (µs), the heavy receiver's throughput, the RT and non-RT CPU's
    use and where receive work ran."""
    m: dict[str, float | None] = {}
    rtt = rec.get("rtt_ns") or {}
    for p in ("mean", "p99", "sd", "p99.9", "max", "p50"):
        v = rtt.get(p)
        m[f"rtt_{p}_us"] = None if v is None else v / 1000.0
    m["rtt_n"] = None if rtt.get("n") is None else float(rtt["n"])
    sent = (rec.get("tester") or {}).get("sent") or 0
    m["lost_pct"] = 100.0 * rec.get("lost", 0) / sent if sent else None
    h = rec.get("heavy") or {}
    m["heavy_gbit_s"] = h.get("gbit_s")
    m["heavy_kpps"] = None if h.get("rx_pps") is None else h["rx_pps"] / 1000
    cpus = (rec.get("sys") or {}).get("cpu") or {}
    for key, rx in (("rt", rec.get("rt_cpu_rx") or {}), ("nonrt", rec.get("nonrt_cpu_rx")
                                                         or {})):
        cpu = rx.get("cpu")
        c = cpus.get(str(cpu)) if cpu is not None else None
        m[f"cpu_{key}_busy_pct"] = (c or {}).get("busy_pct")
        m[f"cpu_{key}_softirq_pct"] = ((c or {}).get("pct") or {}).get("softirq")
        m[f"{key}_pkts_per_s"] = rx.get("processed_per_s")
        m[f"{key}_net_rx_per_s"] = rx.get("net_rx_per_s")
        wall = rx.get("wall_s") or 0
        m[f"{key}_rps_ipis_per_s"] = rx["received_rps"] / wall if wall and \
            rx.get("received_rps") is not None else None
        m[f"{key}_ksoftirqd_pct"] = rx.get("ksoftirqd_cpu_pct")
        pps = h.get("rx_pps")
        m[f"{key}_heavy_share"] = (rx["processed_per_s"] / pps if pps and
                                   rx.get("processed_per_s") is not None else None)
    poll_ns = (rec.get("poller") or {}).get("poll_ns")
    wall = (rec.get("rt_cpu_rx") or {}).get("wall_s") or 0
    m["poller_poll_pct"] = 100.0 * poll_ns / 1e9 / wall if poll_ns is not None and wall \
        else None
    return m


def split_summary(runs: Sequence[Mapping[str, Any]], place: pl.Placement) -> dict[str, Any]:
    """{condition: {mode: {metric: aggregate + ratio_to_napi}, "rps": [...],
    "heavy_cpus": [...]}} over the rtt runs (ratios per repetition against napi's:
    :func:`kbp.bench.stats.group_summaries`)."""
    out: dict[str, Any] = group_summaries(runs, lambda r: r["condition"],
                                          lambda r: split_metrics(cast(dict[str, Any], r), place),
                                          base=report.BASELINE)
    rps: dict[tuple[str, str], set[str]] = defaultdict(set)
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in runs:
        key = (r["condition"], r["mode"])
        for dev, cpus in (r.get("steering") or {}).items():
            rps[key].add(f"{dev.split('-')[0]}:{','.join(map(str, cpus)) or 'off'}")
        where[key].update((r.get("heavy") or {}).get("receiver_cpus") or [])
    for cond, by_mode in out.items():
        for mode, d in by_mode.items():
            d["rps"] = sorted(rps[(cond, mode)])
            d["heavy_cpus"] = sorted(where[(cond, mode)])
    return out


def steering_check(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per mode, over the runs with the heavy sender: in how many the heavy flow's packets
    went up the stack where the mode puts them (>= STEER_SHARE of the heavy device's packets
    processed there: the RT CPU, the non-RT CPU in exclusive)."""
    out: dict[str, Any] = {}
    for r in runs:
        h = r.get("heavy") or {}
        if r.get("condition") != LOADS["on"] or not h.get("rx_pps"):
            continue
        key = "nonrt_cpu_rx" if hs.exclusive_like(r["mode"]) else "rt_cpu_rx"
        got = (r.get(key) or {}).get("processed_per_s") or 0.0
        d = out.setdefault(r["mode"], {"where": "non-RT CPU" if hs.exclusive_like(r["mode"])
                                       else "RT CPU", "runs": 0, "ok": 0})
        d["runs"] += 1
        d["ok"] += int(got >= STEER_SHARE * h["rx_pps"])
    for d in out.values():
        d["passed"] = d["ok"] == d["runs"]
    return out


# -- markdown -------------------------------------------------------------------------------
def _modes(d: dict[str, Any]) -> list[str]:
    return sorted(d, key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER))


def _roles_words(roles: list[str] | None) -> str:
    if not roles:
        return ", which no role uses"
    return f", shared with the {', '.join(pl.LABELS.get(r, r) for r in roles)}"


def check_line(chk: dict[str, Any]) -> str:
    if not chk:
        return "**Steering check: not evaluated** (no run with the heavy sender)."
    bad = {m: d for m, d in chk.items() if not d["passed"]}
    detail = "; ".join(f"{m}: {d['ok']}/{d['runs']} on the {d['where']}"
                       for m, d in ((m, chk[m]) for m in _modes(chk)))
    word = "PASS" if not bad else "FAIL"
    return (f"**Steering check: {word}** (the heavy flow's packets went up the stack on the "
            f"CPU each mode puts them, >= {STEER_SHARE:.0%} of them per run): {detail}.")


TABLE3_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rtt_mean_us", "mean (µs)"), ("rtt_p99_us", "p99 (µs)"), ("rtt_sd_us", "SD (µs)"),
    ("rtt_p99.9_us", "p99.9 (µs)"), ("rtt_max_us", "max (µs)"),
    ("heavy_gbit_s", "heavy Gbit/s"), ("cpu_rt_busy_pct", "RT CPU busy (%)"),
    ("cpu_nonrt_busy_pct", "non-RT CPU busy (%)"), ("lost_pct", "lost (%)"))


def table3_section(cond: str, d: dict[str, Any], place: pl.Placement) -> list[str]:
    rt = place.cpus.get(pl.RT)
    rows = [f"**{CONDITIONS[cond]}** (condition `{cond}`; Table 3's statistics of the RT "
            f"response time, the heavy receiver's throughput at its device, the RT CPU {rt} "
            "and the non-RT CPU busy; median of repetitions [min-max] xratio to napi)", "",
            "| mode | " + " | ".join(h for _, h in TABLE3_COLUMNS) + " |",
            "|---|" + "---|" * len(TABLE3_COLUMNS)]
    for mode in _modes(d):
        n = (d[mode].get("rtt_n") or {}).get("median")
        rows.append(f"| {mode} | " + " | ".join(
            report.cell(d[mode].get(k)) + (report.tail_note(n, report.TAIL_COLUMNS[k])
                                           if k in report.TAIL_COLUMNS and d[mode].get(k)
                                           else "")
            for k, _ in TABLE3_COLUMNS) + " |")
    return [*rows, ""]


WHERE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("heavy_kpps", "heavy kpps"), ("rt_pkts_per_s", "RT CPU pkts/s"),
    ("rt_heavy_share", "RT CPU pkts / heavy pkts"), ("rt_net_rx_per_s", "RT CPU NET_RX/s"),
    ("rt_rps_ipis_per_s", "RT CPU RPS IPIs/s"), ("cpu_rt_softirq_pct", "RT CPU softirq %"),
    ("rt_ksoftirqd_pct", "RT ksoftirqd %"), ("nonrt_pkts_per_s", "non-RT CPU pkts/s"),
    ("nonrt_heavy_share", "non-RT pkts / heavy pkts"), ("poller_poll_pct", "poller in poll %"))


def where_section(split: dict[str, Any], place: pl.Placement, other: int | None,
                  ) -> list[str]:
    if not split:
        return []
    rows = [f"**Where the receive work ran** (per second of each run, median of repetitions): "
            f"the heavy receiver's packets, packets through the stack (softnet processed) on "
            f"the RT CPU {place.cpus.get(pl.RT)} and the non-RT CPU {other}, NET_RX, RPS "
            "IPIs, softirq and ksoftirqd time on the RT CPU, the poller's time in NAPI poll; "
            "RPS masks in force (device: CPUs) and the heavy receiver's CPU", "",
            "| condition | mode | RPS | heavy receiver on | " +
            " | ".join(h for _, h in WHERE_COLUMNS) + " |",
            "|---|---|---|---|" + "---|" * len(WHERE_COLUMNS)]
    for cond in (c for c in CONDITIONS if c in split):
        for mode in _modes(split[cond]):
            d = split[cond][mode]
            cpus = ",".join(map(str, d.get("heavy_cpus") or [])) or "-"
            rows.append(f"| {cond} | {mode} | {' '.join(d.get('rps') or [])} | CPU {cpus} | "
                        + " | ".join(report.cell(_no_ratio(d.get(k)), spread=False)
                                     for k, _ in WHERE_COLUMNS) + " |")
    return [*rows, ""]


def _no_ratio(agg: dict[str, Any] | None) -> dict[str, Any] | None:
    """A cell's aggregate without its ratio to napi (counters: where, not better or worse)."""
    return None if agg is None else {k: v for k, v in agg.items() if k != "ratio_to_napi"}


def paper_section() -> list[str]:
    rows = ["The paper's Table 3 (Garcia, Shinjo, Pu; a 2-core Core i7 KVM host, 10G NICs, a "
            "hardware monitor, the RT server in a VM): for the shape of the comparison, not "
            "its values", "", "| mode here | paper's method | mean (µs) | p99 (µs) | SD (µs) |",
            "|---|---|---|---|---|"]
    for mode, (meth, mean, p99, sd) in PAPER_TABLE3.items():
        here = " / ".join(KBP_MODES) if mode == "kbp" else mode
        rows.append(f"| {here} | {meth} | {mean:g} | {p99:g} | {sd:g} |")
    return [*rows, ""]


SCENARIO = RtSplit()
