"""PNG plots of a benchmark (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kbp.bench import anatomy, modes, schema
from kbp.bench.placement import Placement
from kbp.bench.report import _modes_in, mode_order, placement_of
from kbp.bench.schema import Results, Samples, Summary, sample_key, summary_of

CPU_PARTS = ("user", "system", "softirq", "irq", "steal")
FALLBACK = "#888888"   # a name the modes' table does not know (no mode has it)
#: line style by category: the exclusive CPU modes dashed, the part modes dash-dotted
STYLES = {modes.EXCL: "--", modes.PART: "-."}


def palette() -> dict[str, str]:
    """{mode: colour} for every mode the benchmark has (kbp.bench.modes' table, where each
    mode's colour is its own)."""
    return {m: info.colour for m, info in modes.catalog().items()}


def color(mode: str) -> str:
    """The colour of ``mode`` (a grey for a name the table does not know)."""
    info = modes.catalog().get(modes.canonical(mode))
    return info.colour if info is not None else FALLBACK


def style(mode: str) -> str:
    """The line style of ``mode``: solid, dashed (exclusive CPU modes), dash-dotted (part)."""
    info = modes.catalog().get(modes.canonical(mode))
    return STYLES.get(info.category, "-") if info is not None else "-"


def save(fig: Any, path: Path, title: str) -> Path:
    """Title, lay out, write and close a figure; its path."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _plt() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def latency_cdf(samples: Samples, out: Path, title: str, part: str = "rtt",
                titles: dict[str, str] | None = None) -> Path | None:
    """CDF (log x) and CCDF (log-log, the tail) of kernel RTTs per mode, one column per
    condition of ``part`` (in the order of ``titles`` when given)."""
    found = {k.split("|")[1] for k in samples if k.startswith(f"{part}|")}
    conds = [c for c in (titles or {}) if c in found] + sorted(found - set(titles or {}))
    if not conds:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, len(conds), figsize=(6 * len(conds), 8), squeeze=False)
    for j, cond in enumerate(conds):
        modes = _modes_in({k.split("|")[2]: 1 for k in samples
                           if k.startswith(f"{part}|{cond}|")})
        for mode in modes:
            xs = sorted(samples[sample_key(part, cond, mode)])
            if not xs:
                continue
            n = len(xs)
            us = [x / 1000 for x in xs]
            ys = [(i + 1) / n for i in range(n)]
            col, ls = color(mode), style(mode)
            axes[0][j].plot(us, ys, label=f"{mode} (n={n})", color=col, linestyle=ls)
            axes[1][j].plot(us, [1 - y + 1 / n for y in ys], label=mode, color=col,
                            linestyle=ls)
        axes[0][j].set_xscale("log")
        axes[0][j].set_title(f"{cond}: CDF of round-trip time")
        axes[0][j].set_xlabel("RTT (µs, kernel timestamps)")
        axes[0][j].set_ylabel("fraction ≤ x")
        axes[0][j].grid(True, which="both", alpha=0.3)
        axes[0][j].legend(loc="lower right", fontsize=8)
        axes[1][j].set_xscale("log")
        axes[1][j].set_yscale("log")
        axes[1][j].set_title(f"{cond}: tail (1 - CDF)")
        axes[1][j].set_xlabel("RTT (µs)")
        axes[1][j].set_ylabel("fraction > x")
        axes[1][j].grid(True, which="both", alpha=0.3)
        axes[1][j].legend(loc="lower left", fontsize=8)
    return save(fig, out / "latency_cdf.png", title)


def throughput_bars(summary: Summary, out: Path, title: str) -> Path | None:
    rfc = summary.get("rfc2544")
    if not rfc:
        return None
    plt = _plt()
    frames = sorted(rfc, key=int)
    fig, axes = plt.subplots(1, len(frames), figsize=(5 * len(frames), 4), squeeze=False)
    for j, frame in enumerate(frames):
        modes = _modes_in(rfc[frame])
        med = [rfc[frame][m]["throughput_pps"]["median"] or 0 for m in modes]
        lo = [med[i] - (rfc[frame][m]["throughput_pps"]["min"] or 0)
              for i, m in enumerate(modes)]
        hi = [(rfc[frame][m]["throughput_pps"]["max"] or 0) - med[i]
              for i, m in enumerate(modes)]
        ax = axes[0][j]
        ax.bar(modes, [v / 1000 for v in med], yerr=[[v / 1000 for v in lo],
                                                      [v / 1000 for v in hi]],
               color=[color(m) for m in modes], capsize=4)
        ax.set_title(f"RFC 2544 zero-loss rate, {frame} B frames")
        ax.set_ylabel("kpkt/s (median, min-max)")
        ax.grid(True, axis="y", alpha=0.3)
    return save(fig, out / "throughput.png", title)


def cpu_bars(summary: Summary, pl: Placement, out: Path, title: str) -> Path | None:
    """CPU time by kind on each CPU a role claims, per mode, labelled by role."""
    rtt = summary.get("rtt")
    if not rtt:
        return None
    plt = _plt()
    conds = sorted(rtt)
    cpus = list(pl.role_cpus().items())
    step = len(cpus) + 0.6
    # one bar per (mode, CPU): the panel widens with the bars (0.45 in each) so that 8+
    # modes' labels, slanted, stay apart
    nbars = max((len(_modes_in(rtt[c])) for c in conds), default=1) * len(cpus)
    width = max(6.0, 0.45 * nbars + 1.5)
    fig, axes = plt.subplots(1, len(conds), figsize=(width * len(conds), 5.5), squeeze=False)
    part_colors = {"user": "#1f77b4", "system": "#ff7f0e", "softirq": "#d62728",
                   "irq": "#9467bd", "steal": "#7f7f7f"}
    for j, cond in enumerate(conds):
        modes = _modes_in(rtt[cond])
        ax = axes[0][j]
        labels, xs = [], []
        for i, mode in enumerate(modes):
            for k, (_role, c) in enumerate(cpus):
                labels.append(f"{mode} · {pl.cpu_label(c)}")
                xs.append(i * step + k)
        bottoms = [0.0] * len(xs)
        for part in CPU_PARTS:
            vals = []
            for mode in modes:
                for role, _c in cpus:
                    agg = rtt[cond][mode].get(f"cpu_{role}_{part}_pct") or {}
                    vals.append(agg.get("median") or 0.0)
            ax.bar(xs, vals, bottom=bottoms, color=part_colors[part], label=part, width=0.9)
            bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=7, rotation=55, ha="right",
                           rotation_mode="anchor")
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of the CPU during the run (median)")
        ax.set_title(f"{cond}: CPU time by kind (/proc/stat)")
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(True, axis="y", alpha=0.3)
    return save(fig, out / "cpu.png", title)


def kernel_delay_bars(summary: Summary, out: Path, title: str) -> Path | None:
    rtt = summary.get("rtt")
    if not rtt:
        return None
    plt = _plt()
    conds = sorted(rtt)
    fig, axes = plt.subplots(1, len(conds), figsize=(6 * len(conds), 4), squeeze=False)
    for j, cond in enumerate(conds):
        modes = _modes_in(rtt[cond])
        ax = axes[0][j]
        width = 0.25
        for k, p in enumerate(("p50", "p99", "max")):
            vals = [(rtt[cond][m].get(f"xmit_to_poll_{p}_us") or {}).get("median") or 0
                    for m in modes]
            ax.bar([i + (k - 1) * width for i in range(len(modes))], vals, width, label=p)
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels(modes)
        ax.set_yscale("log")
        ax.set_ylabel("µs (median over repetitions)")
        ax.set_title(f"{cond}: request xmit → RT NAPI poll (bpftrace)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    return save(fig, out / "kernel_delay.png", title)


def standard(results: Results, samples: Samples, out: Path,
             titles: dict[str, str]) -> list[Path]:
    """The plots of a scenario with the rtt part (conditions ``titles``) and RFC 2544."""
    doc: Mapping[str, Any] = results.get("scenario") or {}
    scen = doc.get("name")
    title = f"kbp bench {scen} · {results.get('testbed')} · {results.get('started')}"
    summ = summary_of(results)
    made = [latency_cdf(samples, out, title, "rtt", titles),
            throughput_bars(summ, out, title),
            cpu_bars(summ, placement_of(results), out, title),
            kernel_delay_bars(summ, out, title),
            anatomy.plot(summ.get("anatomy") or {}, out, title, mode_order())]
    return [p for p in made if p is not None]


def all_plots(results: Results | dict[str, Any], samples: Samples, out: Path) -> list[Path]:
    """The plots of the results' scenario (a document and samples of any version
    :mod:`kbp.bench.schema` reads, brought to today's shape in place)."""
    from kbp.bench.report import scenario_of
    doc = schema.read(results)
    schema.upgrade_samples(samples)
    return scenario_of(doc).plots(doc, samples, out)
