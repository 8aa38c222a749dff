"""Scenario ``stream``: NetAP's throughput workload (Park et al. 2020, Sect. 5): bulk TCP and
UDP streams over the RT device, and what receiving them costs in each mode.

One iperf3 stream at full speed at a time, from the tester's CPU (the sender, standing in for
the remote host) to an iperf3 server (the receiver, role ``heavy``) over the RT pair, whose
server end each mode serves: ``stream-tcp`` (TCP, iperf3's write size or ``--tcp-len``; on
veth with TSO off on the sender's end, since veth_xmit() hands a TSO skb to the backlog and
never to the receiving NAPI: the stack segments it, the RT device's NAPI and GRO see MTU
packets as from a NIC) and
``stream-udp`` (UDP ``-b 0``, ``--udp-len`` payload bytes, 1472 by default: 1500-byte
packets).  Each run: the mode on, the stream started, ``--stream-warmup`` seconds (which
iperf3 leaves out of its figures, and in which the periodic modes' interval search
converges: rounds of ``--round-ms``, 11 of them), then ``--duration`` seconds measured, the
mode off.  A full run searches as kbpctl does by default, in the paper's 1000 ms rounds with
a 12 s warm-up (:data:`FULL_ROUND_MS`); --smoke and --demo keep the bench's 200 ms rounds and
their short warm-ups, which the search fits but in which it holds less often (on the host,
2026-12-01, a TCP stream through stock-periodic ran at x0.80 of napi's at 200 ms rounds, at
x1.12 at 1000 ms: docs/results.md, "NetAP today").  Modes are interleaved in each
repetition (a seeded random order per repetition, the runner's) and the two protocols
alternate which goes first.

Per run (``results["stream"]``, summarized per part and mode with the ratio to napi of the
same repetition):

* bandwidth: the receiver's goodput (iperf3) in Gbit/s, and the RT device's receive rate
  (``/proc/PID/net/dev`` of the receiver: packets/s, bytes/s); UDP loss: the bytes received
  against those sent;
* CPU time of the polling context: the mode's polling threads (kbp.ko's poller, a NAPI
  kthread: /proc/PID/schedstat) plus the softirq time of the CPUs the roles use (/proc/stat:
  NET_RX where napi and IRQ deferral poll), in % of one CPU; the busy time of those CPUs;
  the receiver's own CPU;
* interrupts per packet: with ``--nic-pair``, the server port's interrupts (/proc/interrupts:
  its queue IRQs, in the VM rig the virtio ``input``/``output`` vectors) per received packet.
  A veth device has no interrupt (its peer's transmit schedules its NAPI), so on veth the
  NET_RX softirqs per packet (all of the roles' CPUs, /proc/softirqs) stand in for it, and
  are reported with the NIC too;
* the periodic modes' interval in force while measured (sampled every SEARCH_SAMPLE_S), the
  share of samples in which the search had converged, and at the end of the run its
  rounds and restarts (``search``: kbp.ko's poller state, or the stock backend's from
  ``kbpctl status``).

Roles: tester (iperf3 client), rt (the RT device's poller in the kbp modes), heavy (the
receiver; its own CPU from 3 CPUs on, the tester's on 2).  The RT application of every
scenario (sockperf server) idles on the RT CPU.  Default modes: napi, hybrid, periodic (both
kbp.ko: where it is loaded), stock-hybrid, stock-periodic; default parts: both streams and the
idle cost (a periodic device handed back to interrupts should cost nothing idle).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from kbp import _spec, netap
from kbp.bench import machine, modes, netstats, report, steer, sysstat, workloads
from kbp.bench import parts as pt
from kbp.bench import placement as pl
from kbp.bench.modes import search_state
from kbp.bench.scenarios import Scenario
from kbp.bench.schema import Results, Samples, StreamRun, Summary, config_of, summary_of
from kbp.bench.stats import group_summaries

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig

TCP, UDP = "stream-tcp", "stream-udp"
PROTO = {TCP: "tcp", UDP: "udp"}
TITLES = {TCP: "bulk TCP stream (iperf3) over the RT device",
          UDP: "bulk UDP stream (iperf3 -u -b 0) over the RT device"}
RUN_OVERHEAD_S = 2.5       # mode on/off, iperf3 start and its final report
#: the interval search's rounds to converge over the default range (its golden-section
#: steps: 11), which a stream's warm-up must hold
SEARCH_ROUNDS = netap.rounds_to_converge(netap.Params())
#: a full run's search round: kbpctl's default (the module's KBP_ROUND_MS_DEF, the paper's)
FULL_ROUND_MS = _spec.KBP_ROUND_MS_DEF
SEARCH_SAMPLE_S = 2.0      # the periodic modes' search state, read this often while measured
RECEIVER = "iperf3 receiver"

# (metric, heading, unit) of the report's table, in order
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gbit_s", "Gbit/s", ""),
    ("dev_kpps", "kpps (RT dev)", ""),
    ("lost_pct", "lost", "%"),
    ("polling_cpu_pct", "polling CPU", "%"),
    ("poller_cpu_pct", "poller threads", "%"),
    ("softirq_cpu_pct", "softirq", "%"),
    ("busy_cpu_pct", "CPUs busy", "%"),
    ("receiver_cpu_pct", "receiver", "%"),
    ("gbit_per_polling_cpu", "Gbit/s per polling CPU", ""),
    ("net_rx_per_pkt", "NET_RX/pkt", ""),
    ("irqs_per_pkt", "IRQs/pkt", ""),
    ("interval_us", "interval", "µs"),
)
NO_IRQ_NOTE = ("The RT device is a veth: it has no interrupt (its peer's transmit schedules "
               "its NAPI), so IRQs/pkt is empty and NET_RX/pkt (softirqs on the roles' CPUs "
               "per received packet) stands in for it.")
NIC_IRQ_NOTE = ("IRQs/pkt: the server port's interrupts ({irqs}) per packet it received "
                "(/proc/interrupts; in the VM rig its virtio vectors).")


class Stream(Scenario):
    name = "stream"
    title = ("NetAP's throughput workload: bulk TCP and UDP streams (iperf3) over the RT "
             "device; bandwidth, CPU of the polling context, interrupts per packet, the "
             "periodic modes' interval")
    measures = ("Receiver goodput (iperf3), RT device counters (/proc/PID/net/dev), CPU time "
                "(/proc/stat, /proc/PID/schedstat), softirqs and interrupts (/proc/softirqs, "
                "/proc/interrupts) over each run's measured window.")
    links = ("rt",)
    parts = (TCP, UDP)
    rt_roles: tuple[str, ...] = ()
    app_policy = "other"
    default_modes: tuple[str, ...] = (modes.NAPI, modes.HYBRID, modes.PERIODIC,
                                      modes.STOCK_HYBRID, modes.STOCK_PERIODIC)
    default_parts: tuple[str, ...] | None = (TCP, UDP, pt.IDLE)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"periodic_round_ms": FULL_ROUND_MS,
                 "stream_warmup": SEARCH_ROUNDS * FULL_ROUND_MS / 1000 + 1.0},
        "smoke": {"parts": [TCP, UDP], "duration": 1.0, "stream_warmup": 1.0},
        "demo": {"parts": [TCP, UDP], "duration": 4.0, "stream_warmup": 3.0},
    }
    role_doc: ClassVar[dict[str, str]] = {
        pl.TESTER: "iperf3 client (the stream's sender) and, in napi mode on veth, the RT "
                   "device's NAPI (veth polls on the transmitting CPU)",
        pl.RT: "the RT device's polling context in the kbp modes (kbp.ko's poller, the "
               "NAPI kthread)",
        pl.HEAVY: "iperf3 server (the stream's receiver)",
    }

    def roles(self, cfg: BenchConfig) -> tuple[str, ...]:
        return (pl.TESTER, pl.RT, pl.HEAVY)

    def tools(self, cfg: BenchConfig) -> list[str]:
        return ["iperf3"]

    def check(self, cfg: BenchConfig) -> None:
        from kbp.bench.runner import Aborted
        if cfg.duration < 1:
            raise Aborted("--duration must be at least 1 s for the stream scenario (iperf3 "
                          "runs whole seconds)")
        if cfg.stream_warmup < 0:
            raise Aborted("--stream-warmup must not be negative")
        if not 1 <= cfg.udp_len <= 65507:
            raise Aborted(f"--udp-len {cfg.udp_len} is out of range (1..65507)")

    @staticmethod
    def streams(cfg: BenchConfig) -> list[str]:
        return [p for p in (cfg.parts or []) if p in PROTO]

    def plan_seconds(self, cfg: BenchConfig, n_modes: int) -> float:
        return cfg.reps * len(self.streams(cfg)) * n_modes * run_seconds(cfg)

    # -- the run --------------------------------------------------------------------------
    def run(self, bench: Bench) -> None:
        cfg, tb, place = bench.cfg, bench.tb, bench.placement
        assert tb is not None and place is not None
        rt = tb.link("rt")
        bench.results.setdefault("stream", [])
        todo = self.streams(cfg)
        if not todo:
            return
        streams = {p: workloads.Stream(
            tb.client, tb.server, rt.ip_b, sender_cpu=place.cpu(pl.TESTER),
            receiver_cpu=place.cpu(pl.HEAVY), proto=PROTO[p],
            length=cfg.udp_len if PROTO[p] == "udp" else cfg.tcp_len) for p in todo}
        server = streams[todo[0]]           # one iperf3 server takes both protocols
        for s in streams.values():
            s.port = server.port
        tso = rt.kind == "veth"
        if tso:
            no_tso(tb, rt.ns_a, rt.dev_a)
        server.start_server()
        tb.defer(server.stop_server)

        def restart() -> None:              # the RT veth pair was recreated
            no_tso(tb, rt.ns_a, rt.dev_a)
            server.stop_server()
            server.start_server()
        bench.rt_link_hooks.append(restart)
        nic = bench.server_port_irqs()
        bench.results["stream_setup"] = {
            "receiver": "iperf3 -s on the heavy receiver's CPU",
            "sender": "iperf3 -c on the tester's CPU",
            "interrupts": ({"source": "/proc/interrupts", "irqs": list(nic)} if nic is not None
                           else {"source": None, "why": "veth has no interrupts: NET_RX "
                                                        "softirqs per packet instead"}),
            "sender_tso": ("off on the tester's veth end (else TCP bypasses the RT NAPI)"
                           if tso else "the NIC's own"),
            "udp_len": cfg.udp_len, "tcp_len": cfg.tcp_len,
            "warmup_s": cfg.stream_warmup, "duration_s": cfg.duration,
            "periodic": bench.periodic_knobs()}
        for rep in range(cfg.reps):
            for part in (todo if rep % 2 == 0 else list(reversed(todo))):
                for m in bench.order(rep):
                    stream_run(bench, m, rep, part, streams[part], server,
                               tuple(nic or ()))

    # -- summary and report ---------------------------------------------------------------
    def summarize(self, results: Results) -> Summary:
        summ = report.summarize(results)
        summ["stream"] = summarize_streams(results.get("stream") or [],
                                           report.placement_of(results))
        return summ

    def render(self, results: Results) -> str:
        return "\n".join(stream_sections(results))

    def plots(self, results: Results, samples: Samples, out: Path,
              ) -> list[Path]:
        p = stream_bars(results, out)
        return [p] if p is not None else []


def no_tso(tb: Any, ns: str, dev: str) -> None:
    """TSO off on the sending veth end: veth_xmit() hands a TSO skb (TCP's) to netif_rx()
    and the backlog, never to the receiving device's NAPI (veth_skb_is_eligible_for_gro()),
    so no mode would see the TCP stream.  Without TSO the sender's stack segments it into
    MTU-sized packets, which the RT device's NAPI receives and GRO merges, as from a NIC."""
    tb.run(ns, ["ethtool", "-K", dev, "tso", "off"])


def run_seconds(cfg: BenchConfig) -> float:
    """Planned seconds of one stream run."""
    return cfg.stream_warmup + cfg.duration + RUN_OVERHEAD_S


def iperf_times(cfg: BenchConfig) -> tuple[int, int]:
    """(-t, -O) of iperf3: whole seconds covering the warm-up and the measured window."""
    return math.ceil(cfg.duration) + 1, math.ceil(cfg.stream_warmup)


def sample_search(mode: Any, seconds: float) -> list[dict[str, Any]]:
    """Sleep ``seconds`` (the measured window), reading a periodic mode's search state every
    SEARCH_SAMPLE_S on the way: the interval in force *while* the stream runs, not only at its
    end (a search that restarts on a change reads as its first probe then).  Other modes:
    one plain sleep, nothing read."""
    end = time.monotonic() + seconds
    if getattr(mode, "search_state", None) is None:     # not a periodic mode: nothing to read
        time.sleep(seconds)
        return []
    out: list[dict[str, Any]] = []
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(SEARCH_SAMPLE_S, left))
        st = search_state(mode) or {}
        out.append({k: st.get(k) for k in ("interval_us", "converged", "round", "restarts")})
    return out


def stream_run(bench: Bench, mode_name: str, rep: int, part: str,
               stream: workloads.Stream, server: workloads.Stream,
               irqs: tuple[int, ...] = ()) -> StreamRun:
    """One stream of ``part`` with ``mode_name`` on: the record, also in results["stream"]."""
    cfg, tb, place = bench.cfg, bench.tb, bench.placement
    assert tb is not None and place is not None
    rt = tb.link("rt")
    desc = f"rep {rep + 1}/{cfg.reps} · {part} · {mode_name}"
    bench.note(desc)
    rec: StreamRun = {"rep": rep, "mode": mode_name, "part": part,
                      "proto": PROTO[part], "duration": cfg.duration,
                      "warmup": cfg.stream_warmup,
                      "length": stream.length, "quiet": machine.quiet_report()}
    t_start = time.monotonic()
    seconds, omit = iperf_times(cfg)
    with bench.mode_on(mode_name) as mode:
        threads = mode.threads()
        receiver = server.server_pids()
        rec["mode_setup"] = mode.describe()
        rec["poller_threads"] = {str(p): n for p, n in threads.items()}
        rec["receiver_threads"] = [str(p) for p in receiver]
        stream.start(seconds, omit)
        dev = DevCounters(rt.ns_b, rt.dev_b, receiver[0] if receiver else None)
        try:
            time.sleep(cfg.stream_warmup)
            pids = list(threads) + receiver
            c0 = mode.counters()
            i0, d0, s0 = steer.irq_count(irqs), dev.read(), sysstat.Snapshot.take(pids)
            samples = sample_search(mode, cfg.duration)
            s1, d1, i1 = sysstat.Snapshot.take(pids), dev.read(), steer.irq_count(irqs)
            c1 = mode.counters()
            state = search_state(mode)
        except BaseException:             # Ctrl-C, a failure: the stream stops now
            stream.stop()
            raise
        rec["iperf"] = stream.finish(timeout=seconds + omit + 15.0)
    rec["sys"] = sysstat.delta(s0, s1, {**threads, **dict.fromkeys(receiver, RECEIVER)})
    rec["dev"] = {k: d1.get(k, 0) - d0.get(k, 0) for k in ("packets", "bytes", "dropped")}
    rec["dev_source"] = dev.source
    rec["irqs"] = i1 - i0 if irqs else None
    rec["poller"] = modes.counters_moved(c0, c1)
    if state is not None:
        rec["search"] = state
        rec["search_samples"] = samples
    bench.results.setdefault("stream", []).append(rec)
    rec["took_s"] = time.monotonic() - t_start
    bench.advance(run_seconds(cfg), desc)
    return rec


class DevCounters:
    """The RT device's receive counters, read from ``/proc/PID/net/dev`` of a process in its
    namespace (the receiver: no child process, so the window is as tight as /proc/stat's),
    else with ``ip -s link`` in the namespace."""

    def __init__(self, ns: str, dev: str, pid: int | None) -> None:
        self.ns, self.dev, self.pid = ns, dev, pid
        self.source = f"/proc/{pid}/net/dev" if pid else "ip -s link"

    def read(self) -> dict[str, int]:
        if self.pid:
            got = netstats.proc_net_dev(self.pid, self.dev)
            if got is not None:
                return got
        self.source = "ip -s link"
        rx = netstats.link_stats(self.ns, self.dev).get("rx") or {}
        return {k: int(rx.get(k) or 0) for k in ("packets", "bytes", "dropped")}


# -- summaries ------------------------------------------------------------------------------
def stream_metrics(rec: dict[str, Any], place: pl.Placement) -> dict[str, float | None]:
    """The scalar metrics of one stream run (CPU in % of one CPU over the window)."""
    sysd = rec.get("sys") or {}
    wall = sysd.get("wall_s") or 0.0
    cpus = sorted(set(place.role_cpus().values()))
    per_cpu = sysd.get("cpu") or {}
    threads = sysd.get("threads") or {}
    pollers = [t["cpu_pct"] for pid, t in threads.items()
               if pid in (rec.get("poller_threads") or {})]
    recv = [t["cpu_pct"] for pid, t in threads.items()
            if pid in (rec.get("receiver_threads") or [])]
    ip = rec.get("iperf") or {}
    dev = rec.get("dev") or {}
    pkts = dev.get("packets") or 0
    m: dict[str, float | None] = {}
    bps = ip.get("bits_per_second")
    m["gbit_s"] = None if bps is None else bps / 1e9
    m["dev_kpps"] = pkts / wall / 1e3 if wall else None
    m["dev_gbit_s"] = (dev.get("bytes") or 0) * 8 / wall / 1e9 if wall else None
    m["lost_pct"] = udp_loss_pct(ip) if rec.get("proto") == "udp" else None
    m["retransmits"] = ip.get("retransmits") if rec.get("proto") == "tcp" else None
    softirq = [((per_cpu.get(str(c)) or {}).get("seconds") or {}).get("softirq") for c in cpus]
    busy = [(per_cpu.get(str(c)) or {}).get("busy_pct") for c in cpus]
    poller_pct = m["poller_cpu_pct"] = sum(pollers) if pollers else 0.0
    softirq_pct = m["softirq_cpu_pct"] = \
        100.0 * sum(x or 0.0 for x in softirq) / wall if wall else None
    m["polling_cpu_pct"] = None if softirq_pct is None else poller_pct + softirq_pct
    m["busy_cpu_pct"] = sum(b or 0.0 for b in busy)
    m["receiver_cpu_pct"] = sum(recv) if recv else None
    for role, c in place.role_cpus().items():
        m[f"cpu_{role}_busy_pct"] = (per_cpu.get(str(c)) or {}).get("busy_pct")
    gbit, poll = m["gbit_s"], m["polling_cpu_pct"]
    m["gbit_per_polling_cpu"] = gbit / (poll / 100.0) if gbit is not None and poll else None
    net_rx = sysd.get("net_rx") or []
    rx = sum(net_rx[c] for c in cpus if c < len(net_rx))
    m["net_rx_per_pkt"] = rx / pkts if pkts else None
    irqs = rec.get("irqs")
    m["irqs_per_pkt"] = irqs / pkts if irqs is not None and pkts else None
    s = rec.get("search") or {}
    samples = [x for x in rec.get("search_samples") or []
               if isinstance(x.get("interval_us"), int | float)]
    if samples:    # the interval in force while measured: median of the samples
        ivs = sorted(float(x["interval_us"]) for x in samples)
        m["interval_us"] = ivs[len(ivs) // 2]
        m["converged"] = sum(bool(x.get("converged")) for x in samples) / len(samples)
    else:
        iv = s.get("interval_us")
        m["interval_us"] = float(iv) if isinstance(iv, int | float) else None
        conv = s.get("converged")
        m["converged"] = None if conv is None else float(bool(conv))
    for k in ("rounds", "restarts"):
        v = s.get(k)
        m[f"search_{k}"] = float(v) if isinstance(v, int | float) else None
    r = [x.get("restarts") for x in samples if isinstance(x.get("restarts"), int)]
    m["search_restarts_in_window"] = float(r[-1] - r[0]) if len(r) >= 2 else None
    return m


def udp_loss_pct(ip: dict[str, Any]) -> float | None:
    """The UDP stream's loss: the bytes the receiver got against those sent in the same
    (warm-up excluded) window.  iperf3's own lost_percent miscounts with -O (omitted
    datagrams; above 100 % seen with 3.12), so it is kept in the record but not used."""
    got, sent = ip.get("bytes"), ip.get("sent_bytes")
    if got is None or not sent:
        return None
    return max(0.0, 100.0 * (1.0 - got / sent))


def summarize_streams(recs: Sequence[Mapping[str, Any]], place: pl.Placement,
                      ) -> dict[str, Any]:
    """{part: {mode: {metric: aggregate (+ ratio_to_napi)}}}; ratios per repetition
    (:func:`kbp.bench.stats.group_summaries`: none where no repetition gave one)."""
    return group_summaries(recs, lambda r: r["part"],
                           lambda r: stream_metrics(cast(dict[str, Any], r), place),
                           base=report.BASELINE)


# -- markdown -------------------------------------------------------------------------------
def _interval_cell(d: dict[str, Any]) -> str:
    iv = d.get("interval_us") or {}
    if iv.get("median") is None:
        return "-"
    conv = (d.get("converged") or {})
    share = conv.get("median")
    tail = "" if share is None else f", converged {100 * share:.0f} %"
    return report.cell({k: v for k, v in iv.items() if k != "ratio_to_napi"}) + tail


def stream_table(part: dict[str, Any], irqs: bool) -> str:
    cols = [c for c in COLUMNS if irqs or c[0] != "irqs_per_pkt"]
    head = "| mode | " + " | ".join(f"{h} ({u})" if u else h for _, h, u in cols) + " |"
    rows = [head, "|---|" + "---|" * len(cols)]
    for mode in report._modes_in(part):
        d = part[mode]
        cells = [_interval_cell(d) if k == "interval_us" else
                 report.cell(d.get(k), spread=k in ("gbit_s", "polling_cpu_pct"))
                 for k, _, _ in cols]
        rows.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def stream_sections(results: Results) -> list[str]:
    cfg = config_of(results)
    summ = summary_of(results).get("stream") or {}
    setup = results.get("stream_setup") or {}
    place = report.placement_of(results)
    irq = (setup.get("interrupts") or {})
    has_irqs = irq.get("source") is not None
    cpus = ", ".join(f"{c} ({place.cpu_label(c)})"
                     for c in sorted(set(place.role_cpus().values())))
    per = setup.get("periodic") or {}
    how = (f"fixed interval {per['interval_us']} µs" if per.get("interval_us") else
           f"interval searched in rounds of {per.get('round_ms', '?')} ms")
    out = [f"Each run: {cfg.get('stream_warmup', 0):g} s warm-up (left out), "
           f"{cfg.get('duration', 0):g} s measured; UDP payload {cfg.get('udp_len')} B; "
           f"periodic modes: {how}. Polling CPU = the mode's polling threads (schedstat) + "
           f"softirq time of CPUs {cpus} (/proc/stat), % of one CPU; interval = the "
           f"periodic modes' interval in force while measured (read every {SEARCH_SAMPLE_S:g} "
           "s; median over samples and repetitions), and the share of those samples in "
           "which the search had converged."
           + (" TSO is off on the tester's veth end: veth hands a "
              "TSO skb to the backlog, never to the RT device's NAPI."
                                      if str(setup.get("sender_tso", "")).startswith("off")
                                      else ""), ""]
    for part in (p for p in (TCP, UDP) if p in summ):
        out += [f"**{TITLES[part]}** (median of repetitions [min-max] xratio to napi)", "",
                stream_table(summ[part], has_irqs), ""]
    if summ:
        out.append(NIC_IRQ_NOTE.format(irqs=", ".join(map(str, irq.get("irqs") or [])))
                   if has_irqs else NO_IRQ_NOTE)
        out.append("")
    return out


def stream_bars(results: Results, out: Path) -> Path | None:
    """Goodput and polling CPU per mode, one column per stream."""
    from kbp.bench.plots import _plt, color
    summ = summary_of(results).get("stream") or {}
    parts = [p for p in (TCP, UDP) if p in summ]
    if not parts:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, len(parts), figsize=(6 * len(parts), 7), squeeze=False)
    for j, part in enumerate(parts):
        modes = report._modes_in(summ[part])
        for i, (key, label) in enumerate((("gbit_s", "goodput (Gbit/s)"),
                                          ("polling_cpu_pct", "polling CPU (% of one CPU)"))):
            vals = [((summ[part][m].get(key) or {}).get("median") or 0.0) for m in modes]
            ax = axes[i][j]
            ax.bar(range(len(modes)), vals, color=[color(m) for m in modes])
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels(modes, fontsize=8)
            ax.set_ylabel(label)
            ax.set_title(f"{part}: {label} (median)")
            ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"kbp bench stream · {results.get('testbed')} · {results.get('started')}",
                 fontsize=10)
    fig.tight_layout()
    path = out / "stream.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


SCENARIO = Stream()
