"""From raw runs to the summary: per-metric median and spread over repetitions, ratios to napi
of the same repetition, and the markdown tables.

CPUs are reported by role, never by number: per-CPU metrics are keyed by the first role on
the CPU (``cpu_rt_busy_pct``, ``net_rx_tester_per_s``; :meth:`Placement.role_cpus`) and
column headings name every role on it ("tester+flood+heavy CPU busy").  The placement
itself (which number each role had) heads every report.

Scenarios (:mod:`kbp.bench.scenarios`) compose their report from the sections here
(``rtt_sections``, ``table2_section``, ``rfc_section``); ``markdown`` adds the header and
footer every scenario shares, with the runner's own parts (:data:`kbp.bench.parts.COMMON`):
the RT latency under the TCP heavy sender (``load-tcp``) and the idle cost per mode.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from kbp import names
from kbp.bench import anatomy, modes, schema, steer
from kbp.bench import parts as parts_
from kbp.bench.foreign import FOREIGN_MAX_FRACTION
from kbp.bench.modes import BASELINE
from kbp.bench.placement import Placement
from kbp.bench.schema import (
    Aggregate,
    IdleRun,
    LatencyRun,
    ModeSummary,
    Results,
    RunConfig,
    TailSummary,
    ThroughputRun,
    config_of,
    summary_of,
)
from kbp.bench.stats import (
    FEW_ABOVE,
    FEW_EPISODES,
    aggregate,
    group_summaries,
    kth_largest,
    pct_key,
)

Column = tuple[str, str, str]      # (metric key, heading, unit)

# the latency tables, in order; the per-CPU columns follow (latency_columns)
LATENCY_COLUMNS: tuple[Column, ...] = (
    ("rtt_p50_us", "p50", "us"),
    ("rtt_p99_us", "p99", "us"),
    ("rtt_p99.9_us", "p99.9", "us"),
    ("rtt_max_us", "max", "us"),
    ("rtt_mean_us", "mean", "us"),
    ("rtt_sd_us", "SD", "us"),
    ("lost", "lost", ""),
    ("xmit_to_poll_p99_us", "xmit→poll p99", "us"),
)


def placement_of(results: Results) -> Placement:
    """The placement a results.json recorded (also the two-CPU form before roles)."""
    return Placement.from_json(results.get("placement") or {})


def _per_cpu(pl: Placement, key: str, heading: str, unit: str) -> list[Column]:
    """One column per CPU a role claims: key "cpu_{role}_busy_pct" style, heading by role."""
    return [(key.format(role=r), f"{pl.cpu_label(c)} CPU {heading}".strip(), unit)
            for r, c in pl.role_cpus().items()]


def latency_columns(pl: Placement) -> list[Column]:
    return [*LATENCY_COLUMNS, *_per_cpu(pl, "cpu_{role}_busy_pct", "busy", "%")]


def cost_columns(pl: Placement) -> list[Column]:
    """CPU and interrupt cost of the same runs."""
    return [*_per_cpu(pl, "cpu_{role}_softirq_pct", "softirq", "%"),
            ("poller_cpu_pct", "poller thread", "% CPU"),
            *_per_cpu(pl, "net_rx_{role}_per_s", "NET_RX", "/s"),
            *_per_cpu(pl, "hardirqs_{role}_per_s", "hardIRQ+IPI", "/s"),
            ("poller_wake_to_run_p99_us", "poller wake p99", "us"),
            ("app_wake_to_run_p99_us", "app wake p99", "us")]


def table2_columns(pl: Placement) -> list[Column]:
    rt = {"rt": pl.role_cpus()["rt"]} if "rt" in pl.role_cpus() else {}
    return [("rtt_p99_us", "p99", "us"), ("rtt_p99.9_us", "p99.9", "us"),
            ("rtt_max_us", "max", "us"), ("lost", "lost", ""),
            ("xmit_to_poll_p99_us", "xmit→poll p99", "us"),
            *[(f"cpu_{r}_busy_pct", f"{pl.cpu_label(c)} CPU busy", "%") for r, c in rt.items()]]


def _us(v: Any) -> float | None:
    return None if v is None else float(v) / 1000.0


def run_metrics(rec: LatencyRun, pl: Placement) -> dict[str, float | None]:
    """The scalar metrics of one latency run (latencies in microseconds; per-CPU metrics by
    the role of the CPU)."""
    m: dict[str, float | None] = {}
    rtt = rec.get("rtt_ns") or {}
    for p in ("p50", "p90", "p99", "p99.9", "max", "mean", "sd", "min"):
        m[f"rtt_{p}_us"] = _us(rtt.get(p))
    m["rtt_n"] = None if rtt.get("n") is None else float(rtt["n"])
    late = rec.get("lateness_ns") or {}
    for p in ("p50", "p99", "max"):
        m[f"late_{p}_us"] = _us(late.get(p))
    chk = rec.get("rt_cpu_check") or {}
    m["rt_cpu_pkts_per_request"] = chk.get("per_request")
    user = rec.get("rtt_user_ns") or {}
    for p in ("p50", "p99", "max"):
        m[f"user_rtt_{p}_us"] = _us(user.get(p))
    sent = (rec.get("tester") or {}).get("sent") or 0
    lost = m["lost"] = float(rec.get("lost", 0))
    m["lost_pct"] = 100.0 * lost / sent if sent else None
    kd: Mapping[str, Any] = rec.get("kernel_delay") or {}
    for kname in ("xmit_to_poll", "poller_wake_to_run", "app_wake_to_run"):
        s = kd.get(kname) or {}
        for p in ("p50", "p99", "p99.9", "max"):
            m[f"{kname}_{p}_us"] = _us(s.get(p))
    netrx = kd.get("netrx_raise_to_entry") or {}
    sysd = rec.get("sys") or {}
    wall = sysd.get("wall_s") or 0
    cpus = sysd.get("cpu") or {}
    net_rx, hard = sysd.get("net_rx") or [], sysd.get("hardirqs_total") or []
    for role, cpu in pl.role_cpus().items():
        s = netrx.get(str(cpu)) or {}
        m[f"netrx_raise_to_entry_{role}_p99_us"] = _us(s.get("p99"))
        m[f"netrx_raise_to_entry_{role}_max_us"] = _us(s.get("max"))
        c = cpus.get(str(cpu)) or {}
        m[f"cpu_{role}_busy_pct"] = c.get("busy_pct")
        for k in ("softirq", "irq", "system", "user", "steal"):
            m[f"cpu_{role}_{k}_pct"] = (c.get("pct") or {}).get(k)
        m[f"net_rx_{role}_per_s"] = net_rx[cpu] / wall if wall and cpu < len(net_rx) else None
        m[f"hardirqs_{role}_per_s"] = hard[cpu] / wall if wall and cpu < len(hard) else None
    for k, v in (rec.get("poller") or {}).items():
        m[f"poller_{k}"] = float(v)
    thr = [t for t in (sysd.get("threads") or {}).values()
           if t.get("name") not in names.RT_APPS]          # the RT app is not a poller
    m["poller_cpu_pct"] = sum(t["cpu_pct"] for t in thr) if thr else None
    fb = rec.get("flood_block") or {}
    m["flood_rx_pps"] = fb.get("rx_pps")
    h = rec.get("heavy") or {}         # the heavy device over this run (shared-cpu, rt-split)
    m["heavy_gbit_s"] = h.get("gbit_s")
    m["heavy_kpps"] = None if h.get("rx_pps") is None else h["rx_pps"] / 1000
    return m


def summarize_runs(runs: Iterable[LatencyRun], pl: Placement,
                   ) -> dict[str, dict[str, dict[str, ModeSummary]]]:
    """{part: {condition: {mode: {metric: aggregate + ratio_to_napi}}}}: per part and
    condition, :func:`kbp.bench.stats.mode_summaries` of the runs (ratios to napi's run of
    the same repetition)."""
    out: dict[str, dict[str, dict[str, ModeSummary]]] = {}
    for (scen, cond), summ in group_summaries(
            runs, lambda rec: (rec["part"], rec["condition"]),
            lambda rec: run_metrics(cast(LatencyRun, rec), pl), base=BASELINE).items():
        out.setdefault(scen, {})[cond] = summ
    return out


def summarize_rfc(searches: Iterable[ThroughputRun], pl: Placement) -> dict[str, Any]:
    """{frame: {mode: {throughput_pps, throughput_mbps: aggregate + ratio, bounds}}}."""
    searches = list(searches)
    out: dict[str, Any] = group_summaries(
        searches, lambda s: str(s["frame"]),
        lambda s: {m: s[m] for m in ("throughput_pps", "throughput_mbps")}, base=BASELINE)
    per: dict[tuple[str, str], list[ThroughputRun]] = defaultdict(list)
    for s in searches:
        per[(str(s["frame"]), s["mode"])].append(s)
    for frame, by_mode in out.items():
        for mode, dst in by_mode.items():
            mine = per[(frame, mode)]
            dst["bounds"] = sorted({s["bound"] for s in mine})
            cpu = [sysd["cpu"] for s in mine if (sysd := s.get("sys"))]
            for role, c in pl.role_cpus().items():
                dst[f"cpu_{role}_busy_pct"] = aggregate(x[str(c)]["busy_pct"] for x in cpu
                                                        if str(c) in x)
    return out


# -- markdown -------------------------------------------------------------------------------
# -- idle cost (the runner's idle part) -----------------------------------------------------
IDLE_COLUMNS: tuple[Column, ...] = (
    ("poller_threads", "poller threads", ""),
    ("poller_cpu_pct_per_thread", "CPU per poller thread", "%"),
    ("poller_cpu_pct", "all pollers", "% CPU"),
    ("app_cpu_pct", "RT app", "% CPU"),
    ("cpu_rt_busy_pct", "RT CPU busy", "%"),
    ("cpu_rt_softirq_pct", "RT CPU softirq", "%"),
    ("net_rx_rt_per_s", "RT CPU NET_RX", "/s"),
    ("poller_passes_per_s", "poller passes", "/s"),       # kbp.ko
    ("poller_sleeps_per_s", "poller sleeps", "/s"),       # kbp.ko; stock: voluntary switches
)


def idle_metrics(rec: IdleRun, pl: Placement) -> dict[str, float | None]:
    """The scalar metrics of one idle-cost run: CPU time of the poller threads (each and
    in all, % of one CPU over the window), of the RT app, the RT CPU's share, counters/s."""
    sysd = rec.get("sys") or {}
    wall = sysd.get("wall_s") or 0
    threads = sysd.get("threads") or {}
    pollers = [t["cpu_pct"] for pid, t in threads.items()
               if pid in (rec.get("poller_threads") or {})]
    app = [t["cpu_pct"] for pid, t in threads.items() if pid in (rec.get("app_threads") or [])]
    m: dict[str, float | None] = {
        "poller_threads": float(len(rec.get("poller_threads") or {})),
        "poller_cpu_pct": sum(pollers) if pollers else None,
        "poller_cpu_pct_per_thread": sum(pollers) / len(pollers) if pollers else None,
        "poller_cpu_pct_max_thread": max(pollers) if pollers else None,
        "app_cpu_pct": sum(app) if app else None,
    }
    rt = pl.role_cpus().get("rt")
    c = (sysd.get("cpu") or {}).get(str(rt)) or {}
    m["cpu_rt_busy_pct"] = c.get("busy_pct")
    m["cpu_rt_softirq_pct"] = (c.get("pct") or {}).get("softirq")
    net_rx = sysd.get("net_rx") or []
    m["net_rx_rt_per_s"] = net_rx[rt] / wall if wall and rt is not None and rt < len(net_rx) \
        else None
    for k, v in (rec.get("poller") or {}).items():
        m[f"poller_{k}_per_s"] = float(v) / wall if wall else None
    return m


def summarize_idle(recs: Iterable[IdleRun], pl: Placement) -> dict[str, ModeSummary]:
    """{mode: {metric: aggregate}} over the idle-cost runs."""
    per: dict[str, dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for rec in recs:
        for metric, v in idle_metrics(rec, pl).items():
            per[rec["mode"]][metric].append(v)
    return {mode: {k: aggregate(v) for k, v in ms.items()} for mode, ms in per.items()}


def idle_section(results: Results) -> list[str]:
    idle = summary_of(results).get("idle")
    if not idle:
        return []
    cfg = config_of(results)
    skipped = [f"- {m}: {why}" for m, why in (results.get("idle_skipped") or {}).items()]
    return [f"**Idle cost** — single run per mode (not a median of repetitions): each "
            f"mode on, no traffic, {cfg.get('idle_duration', 10):g} s: "
            "CPU time of the polling threads (% of one CPU; busypoll polls in the RT app's "
            "own calls, so see the RT app column)", "",
            latency_table(idle, IDLE_COLUMNS), "",
            *(["Not in the idle part:", "", *skipped, ""] if skipped else [])]


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer() and abs(v) < 1e6:
        return f"{int(v):,}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def cell(agg: Mapping[str, Any] | None, spread: bool = True) -> str:
    """An aggregate (:class:`Aggregate`'s keys) as a table cell: median [min-max] xratio."""
    if not agg or agg.get("median") is None:
        return "-"
    s = fmt(agg["median"])
    if spread and agg.get("n", 0) > 1 and agg["min"] != agg["max"]:
        s += f" [{fmt(agg['min'])}-{fmt(agg['max'])}]"
    r = agg.get("ratio_to_napi")
    if r and r.get("median") is not None:
        s += f" x{r['median']:.2f}"
    return s


def mode_order() -> tuple[str, ...]:
    """Every mode name in table order (kbp.bench.modes' table): the modes every scenario
    has, then those of the scenarios with a heavy receiver (exclusive, the ``-excl`` and the
    ``-part`` modes)."""
    return tuple(modes.catalog())


def _modes_in(d: dict[str, Any]) -> list[str]:
    order = mode_order()
    return sorted(d, key=lambda m: order.index(m) if m in order else len(order))


def _heading(col: Column) -> str:
    _, lab, u = col
    return f"{lab} ({u})" if u else lab


# tail columns of the latency tables: the percentile each is (100: the maximum)
TAIL_COLUMNS = {"rtt_p99_us": 99.0, "rtt_p99.9_us": 99.9, "rtt_max_us": 100.0}
FEW_MARK = "†"


def tail_note(n: float | None, p: float) -> str:
    """" (k=7 of n=6000)" -- which largest sample of a run's n the statistic is -- and the
    FEW_MARK when fewer than FEW_ABOVE samples lie above it."""
    if not n:
        return ""
    k = kth_largest(int(n), p)
    return f" (k={k} of n={int(n):,}){FEW_MARK if k - 1 < FEW_ABOVE else ''}"


def summary_table(rows: Iterable[tuple[Sequence[str], ModeSummary]],
                  columns: Iterable[Column], labels: Sequence[str] = ("mode",)) -> str:
    """A markdown table of summaries (:func:`kbp.bench.stats.mode_summaries`): one row per
    (label cells, summary), each cell the median, its spread over the repetitions and its
    ratio to napi (:func:`cell`); a tail column says which sample of a run it is.  The
    benchmark's tables and the rig's experiments' tables are all this one."""
    cols = list(columns)
    out = ["| " + " | ".join([*labels, *(_heading(c) for c in cols)]) + " |",
           "|---" * (len(labels) + len(cols)) + "|"]
    for label, summ in rows:
        n = (summ.get("rtt_n") or {}).get("median")
        out.append("| " + " | ".join([*label, *(
            cell(summ.get(k)) + (tail_note(n, TAIL_COLUMNS[k]) if k in TAIL_COLUMNS
                                 and summ.get(k) else "")
            for k, _, _ in cols)]) + " |")
    return "\n".join(out)


def latency_table(cond: dict[str, ModeSummary], columns: Iterable[Column]) -> str:
    return summary_table((([mode], cond[mode]) for mode in _modes_in(cond)), columns)


def rfc_table(rfc: dict[str, Any], pl: Placement) -> str:
    cpus = list(pl.role_cpus().items())
    rows = ["| frame | mode | zero-loss rate (pkt/s) | Mbit/s (frame) | bound | " +
            " | ".join(f"{pl.cpu_label(c)} CPU busy (%)" for _, c in cpus) + " |",
            "|---|---|---|---|---|" + "---|" * len(cpus)]
    for frame in sorted(rfc, key=int):
        for mode in _modes_in(rfc[frame]):
            d = rfc[frame][mode]
            rows.append(f"| {frame} B | {mode} | {cell(d['throughput_pps'])} | "
                        f"{cell(d['throughput_mbps'], spread=False)} | "
                        f"{', '.join(d['bounds'])} | " +
                        " | ".join(cell(d.get(f"cpu_{r}_busy_pct"), False) for r, _ in cpus)
                        + " |")
    return "\n".join(rows)


def table2_table(t2: dict[str, dict[str, ModeSummary]], pl: Placement) -> str:
    cols = table2_columns(pl)
    head = "| condition | mode | " + " | ".join(_heading(c) for c in cols) + " |"
    rows = [head, "|---|---|" + "---|" * len(cols)]
    for cond in t2:
        for mode in _modes_in(t2[cond]):
            rows.append(f"| {cond} | {mode} | " +
                        " | ".join(cell(t2[cond][mode].get(k)) for k, _, _ in cols) + " |")
    return "\n".join(rows)


# -- RT latency and the heavy flow's throughput, per mode (shared-cpu, rt-split) ------------
#: the per-mode table's columns under the load: Table 3's statistics, the tail, the heavy flow
PER_MODE_COLUMNS: tuple[Column, ...] = (
    ("rtt_mean_us", "RT mean", "µs"), ("rtt_p99_us", "RT p99", "µs"),
    ("rtt_p99.9_us", "RT p99.9", "µs"), ("rtt_sd_us", "RT SD", "µs"),
    ("rtt_max_us", "RT max", "µs"), ("heavy_gbit_s", "heavy", "Gbit/s"))


def per_mode(summary: schema.Summary, tails: dict[str, TailSummary], cond: str,
             idle: str | None = None, part: str = parts_.RTT) -> dict[str, Any]:
    """Per mode under condition ``cond`` of ``part``: the RT flow's mean, p99, p99.9, SD and
    max and the heavy flow's Gbit/s (each the aggregate over repetitions with its ratio to
    napi), the repetitions, the median n, the p99.9 of the samples pooled over repetitions
    with its bootstrap CI (``tails``: results["tails"]), and with ``idle`` the p99.9 in
    that condition.  ``summary``: :func:`summarize`'s.  {} when ``cond`` did not run."""
    # part: a latency part (rtt, table2): its key of the summary holds this shape
    rtt = cast(dict[str, dict[str, ModeSummary]], summary.get(part) or {})
    got = rtt.get(cond) or {}
    out: dict[str, Any] = {}
    for mode in _modes_in(got):
        d = got[mode]
        tail = tails.get(schema.sample_key(part, cond, mode)) or TailSummary()
        row: dict[str, Any] = {k: d.get(k) for k, _, _ in PER_MODE_COLUMNS}
        row["reps"] = (d.get("rtt_n") or {}).get("n") or tail.get("runs")
        row["n"] = (d.get("rtt_n") or {}).get("median")
        row["p99.9_pooled"] = tail.get("p99.9")
        if idle is not None:
            row["idle_rtt_p99.9_us"] = ((rtt.get(idle) or {}).get(mode) or {}).get(
                "rtt_p99.9_us")
            row["idle_n"] = (((rtt.get(idle) or {}).get(mode) or {}).get("rtt_n")
                             or {}).get("median")
        out[mode] = row
    return out


#: marks a heavy-flow ratio between modes that did different heavy-flow work on the RT CPU
OTHER_WORK_MARK = "≠"


def per_mode_section(pm: dict[str, Any], cond: str, title: str, idle: str | None = None,
                     other_work: Iterable[str] = ()) -> list[str]:
    """The per-mode table (:func:`per_mode`'s rows): the README's headline table's shape,
    with the heavy flow's throughput beside the RT flow's statistics."""
    if not pm:
        return []
    with_idle = idle is not None and any(r.get("idle_rtt_p99.9_us") for r in pm.values())
    cols = ["mode", "reps", *([f"RT p99.9 {idle} (µs)"] if with_idle else []),
            *(f"{_heading(c)} {cond}" for c in PER_MODE_COLUMNS),
            f"RT p99.9 {cond}, pooled [95 % CI] (µs)"]
    rows = [f"**{title}** (condition `{cond}`; cells: median of the repetitions [min-max] "
            "xratio to napi (median of per-repetition ratios); tails: k-th largest of a run's "
            f"n; pooled: the repetitions' samples together, {_ci_words(pm.values())}", "",
            "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for mode, r in pm.items():
        cells = [mode, str(r.get("reps") or "-")]
        if with_idle:
            cells.append(cell(r.get("idle_rtt_p99.9_us")) + (
                tail_note(r.get("idle_n"), 99.9) if r.get("idle_rtt_p99.9_us") else ""))
        for k, _, _ in PER_MODE_COLUMNS:
            c = cell(r.get(k))
            if k == "heavy_gbit_s" and mode in set(other_work) and c != "-":
                # a ratio of different work is not printed: the rate alone, marked
                c = cell({**(r.get(k) or {}), "ratio_to_napi": None}) + f" {OTHER_WORK_MARK}"
            if k in TAIL_COLUMNS and r.get(k):
                c += tail_note(r.get("n"), TAIL_COLUMNS[k])
            cells.append(c)
        cells.append(_tail_cell(r.get("p99.9_pooled")))
        rows.append("| " + " | ".join(cells) + " |")
    return [*rows, ""]


# -- sections a scenario composes ---------------------------------------------------------
def rtt_sections(results: Results, titles: dict[str, str]) -> list[str]:
    """The RT latency table and its cost table for each condition in ``titles`` that ran."""
    cfg = config_of(results)
    rtt = summary_of(results).get("rtt") or {}
    pl = placement_of(results)
    out: list[str] = []
    for cond, title in titles.items():
        if cond not in rtt:
            continue
        short = title.split(",")[0].split("(")[0].strip()
        out += [f"**{title}** — {arrival_words(cfg)}, {cfg.get('frame')} B frames, "
                f"{cfg.get('duration'):g} s per run", "",
                latency_table(rtt[cond], latency_columns(pl)), "",
                f"CPU and interrupt cost, {short} ({cond}):", "",
                latency_table(rtt[cond], cost_columns(pl)), ""]
    return out


def arrival_words(cfg: RunConfig) -> str:
    """The RT flow's requests in words: "2000 req/s random (exponential) inter-arrival", or
    with --uniform "random inter-arrival uniform in 1000-10000 µs (182 req/s mean)"."""
    uni = cfg.get("uniform_us")
    if uni:
        lo, hi = (float(x) for x in uni)
        return (f"random inter-arrival uniform in {lo:g}-{hi:g} µs "
                f"({2e6 / (lo + hi):.0f} req/s mean)")
    how = "random (exponential)" if cfg.get("poisson") else "constant"
    return f"{cfg.get('rate'):g} req/s {how} inter-arrival"


def table2_section(results: Results) -> list[str]:
    cfg = config_of(results)
    t2 = summary_of(results).get("table2")
    if not t2:
        return []
    return [f"**EE-KBP Table 2 conditions, scaled x{cfg.get('table2_scale'):g}** "
            "(constant inter-arrival, no competing load)", "",
            table2_table(t2, placement_of(results)), ""]


def rfc_section(results: Results) -> list[str]:
    cfg = config_of(results)
    rfc = summary_of(results).get("rfc2544")
    if not rfc:
        return []
    n = min(int(cfg.get("rfc_reps") or 1), int(cfg.get("reps") or 1))
    runs = "single run per mode" if n == 1 else f"median of {n} searches"
    return [f"**RFC 2544 zero-loss throughput** ({runs}; binary search, "
            f"{cfg.get('rfc_trial'):g} s trials, stops within "
            f"{100 * cfg.get('rfc_resolution', 0):g} % of the result)",
            "", rfc_table(rfc, placement_of(results)), ""]


# -- the whole report ---------------------------------------------------------------------
def scenario_of(results: Results) -> Any:
    from kbp.bench import scenarios
    scen: Mapping[str, Any] = results.get("scenario") or {}
    name = scen.get("name") or scenarios.DEFAULT
    return scenarios.get(name)


def markdown(results: Results | dict[str, Any]) -> str:
    """The report of a results document (of any version :mod:`kbp.bench.schema` reads;
    brought to today's shape in place)."""
    results = schema.read(results)
    cfg = config_of(results)
    reps = cfg.get("reps")
    pl = placement_of(results)
    scen: Mapping[str, Any] = results.get("scenario") or {}
    scenario = scenario_of(results)
    what = scenario.measures
    out = [f"Scenario `{scen.get('name')}`: {scen.get('title', '')}.", "",
           f"Testbed: {results.get('testbed')}. {what} Cells: median of {reps} repetitions "
           "[min-max] xratio to napi (median of per-repetition ratios); idle cost and RFC "
           "2544 with --rfc-reps 1 are single runs (said where they are). Tail cells (p99, "
           "p99.9, max) say which largest sample of a run's n they are (k of n, median n); "
           f"{FEW_MARK}: fewer than {FEW_ABOVE} samples above it.", "",
           f"{pl.summary()}.", ""]
    skipped = {m: v.get("reason") for m, v in (results.get("modes") or {}).items()
               if v.get("status") == "skipped"}
    out.append(scenario.render(results))
    out += common_sections(results)
    out += method_sections(results)
    if skipped:
        out += ["Skipped modes:", ""] + [f"- {m}: {why}" for m, why in skipped.items()] + [""]
    meter = (results.get("machine") or {}).get("power_meter")
    out.append(f"Energy: {meter}.")
    return "\n".join(out) + "\n"


def common_sections(results: Results) -> list[str]:
    """The runner's parts: RT latency under the TCP heavy sender, idle cost."""
    return [*rtt_sections(results, {parts_.TCP_CONDITION: parts_.TCP_TITLE}),
            *idle_section(results)]


def method_sections(results: Results) -> list[str]:
    """What the numbers rest on: the pooled tails with bootstrap CIs, the tester's lateness,
    the RT CPU check, the modes' order (each only when the results have it)."""
    anat = summary_of(results).get("anatomy") or {}
    return [*anatomy.section(anat, mode_order()), *tails_section(results),
            *lateness_section(results), *rt_cpu_section(results), *foreign_section(results),
            *order_section(results)]


FEW_EPISODES_MARK = "‡"


def _episodes_note(d: Mapping[str, Any]) -> str:
    """", 3 bursts: 1+0+6" -- how many separate bursts make the tail and how its samples
    split over the repetitions (results before the block bootstrap have neither)."""
    if d.get("episodes") is None:
        return ""
    reps = d.get("by_rep") or []
    split = f": {'+'.join(map(str, reps))}" if len(reps) > 1 else ""
    mark = FEW_EPISODES_MARK if d.get("few_episodes") else ""
    return f", {d['episodes']} burst{'s' if d['episodes'] != 1 else ''}{split}{mark}"


def _ci_words(rows: Iterable[dict[str, Any]]) -> str:
    """How the pooled CIs were made, as the rows say (older results: an i.i.d. bootstrap)."""
    if any((r.get("p99.9_pooled") or {}).get("episodes") is not None for r in rows):
        return ("seeded moving-block bootstrap CI, the bursts at or above it per repetition; "
                f"{FEW_MARK}: fewer than {FEW_ABOVE} samples above it; {FEW_EPISODES_MARK}: "
                f"fewer than {FEW_EPISODES} bursts)")
    return f"seeded bootstrap CI; {FEW_MARK}: fewer than {FEW_ABOVE} samples above it)"


def _tail_cell(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "-"
    lo, hi = d.get("ci95") or (None, None)
    mark = FEW_MARK if d.get("few") else ""
    return (f"{fmt(_us(d['value']))} [{fmt(_us(lo))}-{fmt(_us(hi))}] "
            f"(k={d['k']} of n={d['n']:,}{_episodes_note(d)}){mark}")


def _lost_cell(d: Mapping[str, Any] | None) -> str:
    w = (d or {}).get("with_lost")
    if not w:
        return "-"
    v = "∞" if w["value"] == "inf" else fmt(_us(w["value"]))
    return f"{v} (k={w['k']} of n={w['n']:,}){FEW_MARK if w.get('few') else ''}"


def tails_section(results: Results) -> list[str]:
    tails = results.get("tails") or {}
    if not tails:
        return []
    if any("ci_method" in d for d in tails.values()):
        head = ("**Tails of the samples pooled over repetitions** (µs): value [95 % CI: "
                "seeded moving-block bootstrap within each repetition, 1000 resamples] (k-th "
                "largest of n, separate bursts at or above it: per repetition); with losses: "
                f"the lost requests counted as infinite round trips. {FEW_MARK}: fewer than "
                f"{FEW_ABOVE} samples above it; {FEW_EPISODES_MARK}: fewer than {FEW_EPISODES} "
                "bursts: that statistic rests on a handful of round trips or events, and its "
                "CI understates the uncertainty")
    else:           # results before the block bootstrap
        head = ("**Tails of the samples pooled over repetitions** (µs): value [95 % bootstrap "
                "CI, seeded, 1000 resamples] (k-th largest of n); with losses: the lost "
                f"requests counted as infinite round trips. {FEW_MARK}: fewer than {FEW_ABOVE} "
                "samples above it: that statistic rests on a handful of round trips")
    rows = [head, "",
            "| part | condition | mode | runs | lost | p99 | p99.9 | max | p99 with losses | "
            "p99.9 with losses |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(tails):
        part, cond, mode = [*key.split("|"), "", "", ""][:3]
        d = tails[key]
        rows.append(f"| {part} | {cond} | {mode} | {d.get('runs', '-')} | {d.get('lost', 0)} | "
                    f"{_tail_cell(d.get('p99'))} | {_tail_cell(d.get('p99.9'))} | "
                    f"{_tail_cell(d.get('max'))} | {_lost_cell(d.get('p99'))} | "
                    f"{_lost_cell(d.get('p99.9'))} |")
    return [*rows, ""]


LATENESS_COLUMNS: tuple[Column, ...] = (
    ("late_p50_us", "p50", "us"), ("late_p99_us", "p99", "us"), ("late_max_us", "max", "us"))


def lateness_section(results: Results) -> list[str]:
    rtt = summary_of(results).get("rtt") or {}
    conds = {c: d for c, d in rtt.items()
             if any((m.get("late_p50_us") or {}).get("median") is not None
                    for m in d.values())}
    if not conds:
        return []
    out = ["**The tester's lateness** (µs; the request's kernel TX stamp minus the send "
           "time the arrival schedule intended; median of repetitions): a tester delayed on "
           "its CPU sends late, and that delay is not in the round trip", ""]
    for cond, d in conds.items():
        bare: dict[str, ModeSummary] = {m: {k: _without_ratio(v) for k, v in ms.items()}
                                        for m, ms in d.items()}   # the tester's, no ratio
        out += [f"Condition `{cond}`:", "", latency_table(bare, LATENESS_COLUMNS), ""]
    return out


def _without_ratio(agg: Aggregate | None) -> Aggregate:
    """A copy of ``agg`` without its ratio to napi ({} for None)."""
    out = agg.copy() if agg else Aggregate()
    out.pop("ratio_to_napi", None)
    return out


def rt_cpu_section(results: Results) -> list[str]:
    runs = [r for r in results.get("runs") or [] if r.get("rt_cpu_check")]
    if not runs:
        return []
    per: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        per[(r["condition"], r["mode"])].append(r["rt_cpu_check"])
    blind = sum(1 for r in runs if r["rt_cpu_check"].get("sees_replies") is False)
    rows = ["**RT CPU check**: packets processed on the RT CPU (softnet) per run against "
            "what it should process: the heavy device's packets (none in the modes that move "
            "the heavy flow away) + the RT requests. A run over that by more than "
            f"{steer.RT_CPU_SLACK:,} packets + {steer.RT_CPU_REQ_SLACK:.0%} of its requests "
            "stops the benchmark: the replies (one per request) or ACKs were processed there. "
            "Extra: processed minus expected, per run (negative: heavy packets dropped or "
            "still queued at the run's end). Median of runs [min-max]"
            + (f"; {blind} run(s) had too few requests for their replies to exceed the slack"
               if blind else ""), "",
            "| condition | mode | runs passed | RT CPU pkts / request | extra pkts | "
            "slack |", "|---|---|---|---|---|---|"]
    for (cond, mode) in sorted(per):
        cs = per[(cond, mode)]
        pr = aggregate(c.get("per_request") for c in cs)
        extra = aggregate(c.get("extra") for c in cs if c.get("extra") is not None)
        slack = aggregate(c.get("slack") for c in cs)
        rows.append(f"| {cond} | {mode} | {sum(bool(c['passed']) for c in cs)}/{len(cs)} | "
                    f"{cell(pr)} | {cell(extra)} | {cell(slack, spread=False)} |")
    return [*rows, ""]


def foreign_section(results: Results) -> list[str]:
    """The foreign-CPU check: attempts run again, and kept runs still disturbed."""
    runs = [r for r in results.get("runs") or [] if r.get("foreign_cpu")]
    if not runs:
        return []
    redone = results.get("disturbed_runs") or []
    kept = [r for r in runs if r["foreign_cpu"].get("disturbed")]
    worst = max(float(r["foreign_cpu"].get("foreign_user_s") or 0.0) for r in runs)
    out = [f"**Foreign CPU check** (user time on the RT CPU from processes the benchmark did "
           f"not start, per run; more than {FOREIGN_MAX_FRACTION:.0%} of the run's wall "
           f"time: disturbed, run again): {len(redone)} attempt(s) "
           f"discarded and run again, {len(kept)} kept run(s) still disturbed, at most "
           f"{worst:.2f} s foreign in a kept run.", ""]
    out += [f"- discarded: rep {d['rep'] + 1} {d['condition']} {d['mode']}: "
            f"{d['foreign_cpu']['foreign_user_s']:.2f} s foreign" for d in redone]
    out += [f"- kept, disturbed: rep {r['rep'] + 1} {r['condition']} {r['mode']}: "
            f"{r['foreign_cpu']['foreign_user_s']:.2f} s foreign" for r in kept]
    return [*out, ""] if redone or kept else out


def order_section(results: Results) -> list[str]:
    order = results.get("mode_order") or {}
    if not order:
        return []
    rule = results.get("mode_order_rule") or "seeded random permutation per repetition"
    settle = results.get("settle_after_move_s")
    lines = [f"**Order of the modes**: {rule}"
             + (f"; {settle:g} s settle after a mode that moves load (the exclusive CPU "
                "modes)" + (" or reconfigures the heavy device under the flood (the -part "
                            "modes)" if results.get("settle_after_part") else "")
                if settle else "") + ".", ""]
    lines += [f"- repetition {int(r) + 1}: {', '.join(ms)}"
              for r, ms in sorted(order.items(), key=lambda x: int(x[0]))]
    return [*lines, ""]


def summarize(results: Results) -> schema.Summary:
    """The summary every part shares: latency runs by part, RFC 2544 searches."""
    pl = placement_of(results)
    # by the runs' parts, rtt and table2: Summary's keys of that shape
    summ = cast(schema.Summary, summarize_runs(results.get("runs") or [], pl))
    if results.get("rfc2544"):
        summ["rfc2544"] = summarize_rfc(results["rfc2544"], pl)
    anat = anatomy.summarize(results.get("runs") or [])
    if anat:
        summ["anatomy"] = anat
    return summ


def add_summary(results: Results | dict[str, Any]) -> Results:
    """``results`` (of any version :mod:`kbp.bench.schema` reads; brought to today's shape
    in place) with its summary and the percentile definition."""
    results = schema.read(results)
    summ = results["summary"] = scenario_of(results).summarize(results)
    pl = placement_of(results)
    tcp = [r for r in results.get("runs") or [] if r.get("condition") == parts_.TCP_CONDITION]
    if tcp and parts_.TCP_CONDITION not in (summ.get(parts_.RTT) or {}):
        summ.setdefault(parts_.RTT, {}).update(summarize_runs(tcp, pl).get(parts_.RTT, {}))
    if results.get("idle"):
        summ["idle"] = summarize_idle(results["idle"], pl)
    results["percentile_definition"] = (
        "nearest rank: the smallest sample with at least p% of samples <= it; SD is the "
        "sample SD (n-1); across repetitions: median, min-max, nearest-rank quartiles; ratios "
        "to napi per repetition, then median; tails: k-th largest of n, seeded moving-block "
        "bootstrap 95 % CIs within each repetition (1000 resamples), the bursts that make "
        "them, losses as infinite round trips in the with-losses variant")
    return results


__all__ = ["add_summary", "latency_table", "markdown", "pct_key", "run_metrics", "summarize",
           "summarize_rfc", "summarize_runs", "summary_table"]
