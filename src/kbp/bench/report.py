"""From raw runs to the summary: per-metric median and spread over repetitions, ratios to napi
of the same repetition, and the markdown tables."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kbp import names
from kbp.bench.stats import aggregate, pct_key, ratios_to_baseline

BASELINE = "napi"

# (key, label, unit, lower_is_better) of the latency tables, in order
LATENCY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("rtt_p50_us", "p50", "us"),
    ("rtt_p99_us", "p99", "us"),
    ("rtt_p99.9_us", "p99.9", "us"),
    ("rtt_max_us", "max", "us"),
    ("rtt_mean_us", "mean", "us"),
    ("rtt_sd_us", "SD", "us"),
    ("lost", "lost", ""),
    ("xmit_to_poll_p99_us", "xmit→poll p99", "us"),
    ("cpu0_busy_pct", "CPU0 busy", "%"),
    ("cpu1_busy_pct", "CPU1 busy", "%"),
)


# CPU and interrupt cost of the same runs
COST_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("cpu0_softirq_pct", "CPU0 softirq", "%"),
    ("cpu1_softirq_pct", "CPU1 softirq", "%"),
    ("poller_cpu_pct", "poller thread", "% CPU"),
    ("net_rx_cpu0_per_s", "NET_RX CPU0", "/s"),
    ("net_rx_cpu1_per_s", "NET_RX CPU1", "/s"),
    ("hardirqs_cpu0_per_s", "hardIRQ+IPI CPU0", "/s"),
    ("hardirqs_cpu1_per_s", "hardIRQ+IPI CPU1", "/s"),
    ("poller_wake_to_run_p99_us", "poller wake p99", "us"),
    ("app_wake_to_run_p99_us", "app wake p99", "us"),
)


def _us(v: Any) -> float | None:
    return None if v is None else float(v) / 1000.0


def run_metrics(rec: dict[str, Any]) -> dict[str, float | None]:
    """The scalar metrics of one latency run (latencies in microseconds)."""
    m: dict[str, float | None] = {}
    rtt = rec.get("rtt_ns") or {}
    for p in ("p50", "p90", "p99", "p99.9", "max", "mean", "sd", "min"):
        m[f"rtt_{p}_us"] = _us(rtt.get(p))
    user = rec.get("rtt_user_ns") or {}
    for p in ("p50", "p99", "max"):
        m[f"user_rtt_{p}_us"] = _us(user.get(p))
    sent = (rec.get("tester") or {}).get("sent") or 0
    m["lost"] = float(rec.get("lost", 0))
    m["lost_pct"] = 100.0 * m["lost"] / sent if sent else None
    kd = rec.get("kernel_delay") or {}
    for kname in ("xmit_to_poll", "poller_wake_to_run", "app_wake_to_run"):
        s = kd.get(kname) or {}
        for p in ("p50", "p99", "p99.9", "max"):
            m[f"{kname}_{p}_us"] = _us(s.get(p))
    for cpu, s in (kd.get("netrx_raise_to_entry") or {}).items():
        m[f"netrx_raise_to_entry_cpu{cpu}_p99_us"] = _us(s.get("p99"))
        m[f"netrx_raise_to_entry_cpu{cpu}_max_us"] = _us(s.get("max"))
    sysd = rec.get("sys") or {}
    wall = sysd.get("wall_s") or 0
    for cpu, c in (sysd.get("cpu") or {}).items():
        m[f"cpu{cpu}_busy_pct"] = c.get("busy_pct")
        for k in ("softirq", "irq", "system", "user", "steal"):
            m[f"cpu{cpu}_{k}_pct"] = (c.get("pct") or {}).get(k)
    for i, v in enumerate(sysd.get("net_rx") or []):
        m[f"net_rx_cpu{i}_per_s"] = v / wall if wall else None
    for i, v in enumerate(sysd.get("hardirqs_total") or []):
        m[f"hardirqs_cpu{i}_per_s"] = v / wall if wall else None
    for k, v in (rec.get("poller") or {}).items():
        m[f"poller_{k}"] = float(v)
    thr = [t for t in (sysd.get("threads") or {}).values() if t.get("name") != "sockperf"]
    m["poller_cpu_pct"] = sum(t["cpu_pct"] for t in thr) if thr else None
    fb = rec.get("flood_block") or {}
    m["flood_rx_pps"] = fb.get("rx_pps")
    return m


def summarize_runs(runs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """{scenario: {condition: {mode: {metric: aggregate + ratio_to_napi}}}}."""
    per: dict[tuple[str, str, str], dict[str, dict[int, float | None]]] = defaultdict(
        lambda: defaultdict(dict))
    for rec in runs:
        key = (rec["scenario"], rec["condition"], rec["mode"])
        for metric, v in run_metrics(rec).items():
            per[key][metric][rec["rep"]] = v
    out: dict[str, Any] = {}
    for (scen, cond, mode), metrics in per.items():
        base = per.get((scen, cond, BASELINE), {})
        dst = out.setdefault(scen, {}).setdefault(cond, {}).setdefault(mode, {})
        for metric, by_rep in metrics.items():
            agg = aggregate(by_rep.values())
            if mode != BASELINE and metric in base:
                agg["ratio_to_napi"] = aggregate(ratios_to_baseline(by_rep, base[metric]))
            dst[metric] = agg
    return out


def summarize_rfc(searches: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """{frame: {mode: {throughput_pps, throughput_mbps: aggregate + ratio, bounds}}}."""
    per: dict[tuple[int, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for s in searches:
        per[(s["frame"], s["mode"])][s["rep"]] = s
    out: dict[str, Any] = {}
    for (frame, mode), by_rep in per.items():
        base = per.get((frame, BASELINE), {})
        dst = out.setdefault(str(frame), {}).setdefault(mode, {})
        for metric in ("throughput_pps", "throughput_mbps"):
            vals = {r: s[metric] for r, s in by_rep.items()}
            agg = aggregate(vals.values())
            if mode != BASELINE and base:
                agg["ratio_to_napi"] = aggregate(ratios_to_baseline(
                    vals, {r: s[metric] for r, s in base.items()}))
            dst[metric] = agg
        dst["bounds"] = sorted({s["bound"] for s in by_rep.values()})
        cpu = [s["sys"]["cpu"] for s in by_rep.values() if s.get("sys")]
        for c in ("0", "1"):
            dst[f"cpu{c}_busy_pct"] = aggregate(x[c]["busy_pct"] for x in cpu if c in x)
    return out


# -- markdown -------------------------------------------------------------------------------
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


def cell(agg: dict[str, Any] | None, spread: bool = True) -> str:
    if not agg or agg.get("median") is None:
        return "-"
    s = fmt(agg["median"])
    if spread and agg.get("n", 0) > 1 and agg["min"] != agg["max"]:
        s += f" [{fmt(agg['min'])}-{fmt(agg['max'])}]"
    r = agg.get("ratio_to_napi")
    if r and r.get("median") is not None:
        s += f" x{r['median']:.2f}"
    return s


def _modes_in(d: dict[str, Any]) -> list[str]:
    order = list(names.BENCH_MODES)
    return sorted(d, key=lambda m: order.index(m) if m in order else len(order))


def latency_table(cond: dict[str, Any], columns: Iterable[tuple[str, str, str]] = LATENCY_COLUMNS,
                  ) -> str:
    cols = list(columns)
    head = "| mode | " + " | ".join(f"{lab} ({u})" if u else lab for _, lab, u in cols) + " |"
    sep = "|---|" + "---|" * len(cols)
    rows = [head, sep]
    for mode in _modes_in(cond):
        rows.append(f"| {mode} | " + " | ".join(cell(cond[mode].get(k)) for k, _, _ in cols)
                    + " |")
    return "\n".join(rows)


def rfc_table(rfc: dict[str, Any]) -> str:
    rows = ["| frame | mode | zero-loss rate (pkt/s) | Mbit/s (frame) | bound | CPU0 busy (%) "
            "| CPU1 busy (%) |", "|---|---|---|---|---|---|---|"]
    for frame in sorted(rfc, key=int):
        for mode in _modes_in(rfc[frame]):
            d = rfc[frame][mode]
            rows.append(f"| {frame} B | {mode} | {cell(d['throughput_pps'])} | "
                        f"{cell(d['throughput_mbps'], spread=False)} | "
                        f"{', '.join(d['bounds'])} | {cell(d.get('cpu0_busy_pct'), False)} | "
                        f"{cell(d.get('cpu1_busy_pct'), False)} |")
    return "\n".join(rows)


TABLE2_COLUMNS = (("rtt_p99_us", "p99", "us"), ("rtt_p99.9_us", "p99.9", "us"),
                  ("rtt_max_us", "max", "us"), ("lost", "lost", ""),
                  ("xmit_to_poll_p99_us", "xmit→poll p99", "us"),
                  ("cpu1_busy_pct", "CPU1 busy", "%"))


def table2_table(t2: dict[str, Any]) -> str:
    cols = TABLE2_COLUMNS
    head = "| condition | mode | " + " | ".join(f"{lab} ({u})" if u else lab
                                               for _, lab, u in cols) + " |"
    rows = [head, "|---|---|" + "---|" * len(cols)]
    for cond in t2:
        for mode in _modes_in(t2[cond]):
            rows.append(f"| {cond} | {mode} | " +
                        " | ".join(cell(t2[cond][mode].get(k)) for k, _, _ in cols) + " |")
    return "\n".join(rows)


def markdown(results: dict[str, Any]) -> str:
    s = results.get("summary") or {}
    cfg = results.get("config") or {}
    reps = cfg.get("reps")
    out = [f"Testbed: {results.get('testbed')}. Kernel-timestamped round trips (SO_TIMESTAMPING"
           f" software stamps), microseconds. Cells: median of {reps} repetitions [min-max] "
           "xratio to napi (median of per-repetition ratios).", ""]
    skipped = {m: v.get("reason") for m, v in (results.get("modes") or {}).items()
               if v.get("status") == "skipped"}
    rtt = s.get("rtt") or {}
    for cond, title in (("load-off", "RT flow, no competing load (idle baseline)"),
                        ("load-on", "RT flow with the competing flood (iperf3 UDP on the "
                                    "load CPU)")):
        if cond in rtt:
            out += [f"**{title}** — {cfg.get('rate'):g} req/s "
                    f"{'random (exponential)' if cfg.get('poisson') else 'constant'} "
                    f"inter-arrival, {cfg.get('frame')} B frames, {cfg.get('duration'):g} s "
                    "per run", "", latency_table(rtt[cond]), "",
                    f"CPU and interrupt cost, {title.split(',')[0].split('(')[0].strip()}"
                    f" ({cond}):", "", latency_table(rtt[cond], COST_COLUMNS), ""]
    if s.get("table2"):
        out += [f"**EE-KBP Table 2 conditions, scaled x{cfg.get('table2_scale'):g}** "
                "(constant inter-arrival, no competing load)", "", table2_table(s["table2"]),
                ""]
    if s.get("rfc2544"):
        out += [f"**RFC 2544 zero-loss throughput** (binary search, {cfg.get('rfc_trial'):g} s "
                f"trials, stops within {100 * cfg.get('rfc_resolution', 0):g} % of the "
                "result)",
                "", rfc_table(s["rfc2544"]), ""]
    if skipped:
        out += ["Skipped modes:", ""] + [f"- {m}: {why}" for m, why in skipped.items()] + [""]
    meter = (results.get("machine") or {}).get("power_meter")
    out.append(f"Energy: {meter}.")
    return "\n".join(out) + "\n"


def add_summary(results: dict[str, Any]) -> dict[str, Any]:
    runs = results.get("runs") or []
    summ = summarize_runs(runs)
    if results.get("rfc2544"):
        summ["rfc2544"] = summarize_rfc(results["rfc2544"])
    results["summary"] = summ
    results["percentile_definition"] = (
        "nearest rank: the smallest sample with at least p% of samples <= it; SD is the "
        "sample SD (n-1); across repetitions: median, min-max, nearest-rank quartiles; ratios "
        "to napi per repetition, then median")
    return results


__all__ = ["add_summary", "latency_table", "markdown", "pct_key", "run_metrics",
           "summarize_rfc", "summarize_runs"]
