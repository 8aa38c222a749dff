"""CPU time, interrupts, softirqs, thread run time and energy, as deltas over a run.

Sources: /proc/stat (per-CPU time by category), /proc/interrupts (hardIRQs and IPIs per CPU),
/proc/softirqs (NET_RX etc. per CPU), /proc/PID/schedstat (a thread's run and wait time),
and RAPL through powercap (/sys/class/powercap/intel-rapl:*) when the machine has it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp.bench.schema import SysDelta, ThreadTime
from kbp.sysinfo import read_schedstat

PROC = Path("/proc")
POWERCAP = Path("/sys/class/powercap")
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
NO_POWER_METER = "no power meter"
# a thread's role in a run (delta()'s ``thread_roles``): a polling thread serving the RT
# device (Mode.threads()), one of the mode's polling threads serving another device on the
# RT CPU (Mode.nonrt_threads(): the -part modes' class non-rt), the RT application
ROLE_POLLER, ROLE_NONRT_POLLER, ROLE_APP = "poller", "nonrt_poller", "app"


def thread_roles(threads: Iterable[int], nonrt: Iterable[int], app: Iterable[int],
                 ) -> dict[int, str]:
    """{pid: ROLE_*} of a mode's pollers, its non-rt pollers and the RT app's threads."""
    return {**dict.fromkeys(threads, ROLE_POLLER), **dict.fromkeys(nonrt, ROLE_NONRT_POLLER),
            **dict.fromkeys(app, ROLE_APP)}


def read_stat(proc: Path = PROC) -> dict[int, dict[str, int]]:
    """Per-CPU jiffies by category from /proc/stat."""
    out: dict[int, dict[str, int]] = {}
    for line in (proc / "stat").read_text().splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu") or parts[0] == "cpu":
            continue
        cpu = int(parts[0][3:])
        vals = [int(x) for x in parts[1:1 + len(CPU_FIELDS)]]
        out[cpu] = dict(zip(CPU_FIELDS, vals, strict=False))
    return out


def read_percpu_table(path: Path) -> dict[str, list[int]]:
    """/proc/interrupts or /proc/softirqs: {row name: [count per CPU]}.

    Interrupt rows are named by their label and description ("LOC", "24 ACPI:Ged")."""
    lines = path.read_text().splitlines()
    ncpu = len(lines[0].split())
    out: dict[str, list[int]] = {}
    for line in lines[1:]:
        if ":" not in line:
            continue
        label, rest = line.split(":", 1)
        fields = rest.split()
        counts = []
        for f in fields[:ncpu]:
            if not f.isdigit():
                break
            counts.append(int(f))
        if not counts:
            continue
        counts += [0] * (ncpu - len(counts))
        desc = " ".join(fields[len(counts):])
        name = label.strip()
        if name.isdigit() and desc:
            name = f"{name} {desc.split()[-1]}"
        out[name] = counts
    return out


def rapl_zones(root: Path = POWERCAP) -> dict[str, Path]:
    """RAPL zones with an energy counter: {zone directory name: zone directory}; empty when
    the machine has no power meter."""
    if not root.is_dir():
        return {}
    return {z.name: z for z in sorted(root.glob("intel-rapl:*")) if (z / "energy_uj").exists()}


def power_meter() -> str:
    """What measures energy here: the RAPL zones (with their names), or "no power meter"."""
    zones = rapl_zones()
    if not zones:
        return NO_POWER_METER
    labels = []
    for zname, z in zones.items():
        try:
            labels.append(f"RAPL {zname} ({(z / 'name').read_text().strip()})")
        except OSError:
            labels.append(f"RAPL {zname}")
    return ", ".join(labels)


@dataclass
class Snapshot:
    t: float
    stat: dict[int, dict[str, int]]
    irqs: dict[str, list[int]]
    softirqs: dict[str, list[int]]
    threads: dict[int, tuple[int, int, int] | None] = field(default_factory=dict)
    energy_uj: dict[str, int] = field(default_factory=dict)

    @classmethod
    def take(cls, pids: list[int] | None = None, proc: Path = PROC) -> Snapshot:
        energy = {}
        for name, z in rapl_zones().items():
            with contextlib.suppress(OSError, ValueError):
                energy[name] = int((z / "energy_uj").read_text())
        return cls(t=time.monotonic(), stat=read_stat(proc),
                   irqs=read_percpu_table(proc / "interrupts"),
                   softirqs=read_percpu_table(proc / "softirqs"),
                   threads={p: read_schedstat(p, proc) for p in pids or []},
                   energy_uj=energy)


def _rapl_range(zone: str) -> int | None:
    f = POWERCAP / zone / "max_energy_range_uj"
    try:
        return int(f.read_text())
    except (OSError, ValueError):
        return None


def delta(a: Snapshot, b: Snapshot, thread_names: dict[int, str] | None = None,
          thread_roles: dict[int, str] | None = None) -> SysDelta:
    """What happened between two snapshots, per CPU.  With ``thread_roles`` ({pid: ROLE_*})
    each thread carries its ``role`` and ``threads_cpu_pct`` sums their ``cpu_pct`` by role
    (every role given, 0.0 when its threads ran none or were gone)."""
    wall = max(b.t - a.t, 1e-9)
    hz = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, Any] = {}
    for c in sorted(b.stat):
        if c not in a.stat:
            continue
        d = {k: (b.stat[c][k] - a.stat[c][k]) / hz for k in CPU_FIELDS}
        total = sum(d.values()) or 1e-9
        busy = total - d["idle"] - d["iowait"]
        cpu[str(c)] = {"seconds": d, "busy_pct": 100.0 * busy / total,
                       "pct": {k: 100.0 * v / total for k, v in d.items()}}

    def table_delta(ta: dict[str, list[int]], tb: dict[str, list[int]]) -> dict[str, list[int]]:
        return {k: [y - x for x, y in zip(ta[k], v, strict=False)]
                for k, v in tb.items() if k in ta}

    irqs = table_delta(a.irqs, b.irqs)
    sirqs = table_delta(a.softirqs, b.softirqs)
    ncpu = len(next(iter(irqs.values()), []))
    irq_total = [sum(v[i] for v in irqs.values()) for i in range(ncpu)]
    irq_named = {k: v for k, v in irqs.items() if any(v)}
    threads: dict[str, ThreadTime] = {}
    for pid, s0 in a.threads.items():
        s1 = b.threads.get(pid)
        if s0 is None or s1 is None:
            continue
        threads[str(pid)] = {"name": (thread_names or {}).get(pid, ""),
                             "run_ns": s1[0] - s0[0], "wait_ns": s1[1] - s0[1],
                             "timeslices": s1[2] - s0[2],
                             "cpu_pct": 100.0 * (s1[0] - s0[0]) / 1e9 / wall}
        if thread_roles and pid in thread_roles:
            threads[str(pid)]["role"] = thread_roles[pid]
    energy: dict[str, Any]
    if a.energy_uj and b.energy_uj:
        energy = {}
        for k, e0 in a.energy_uj.items():
            e1 = b.energy_uj.get(k)
            if e1 is None:
                continue
            d_uj = e1 - e0
            if d_uj < 0:
                rng = _rapl_range(k)
                d_uj = d_uj + rng if rng else d_uj
            energy[k] = {"joules": d_uj / 1e6, "watts": d_uj / 1e6 / wall}
    else:
        energy = {"meter": NO_POWER_METER}
    out: SysDelta = {"wall_s": wall, "cpu": cpu, "hardirqs_total": irq_total,
                     "hardirqs": irq_named, "softirqs": sirqs,
                     "net_rx": sirqs.get("NET_RX", []), "threads": threads, "energy": energy}
    if thread_roles:
        by_role = dict.fromkeys(sorted(set(thread_roles.values())), 0.0)
        for t in threads.values():
            if "role" in t:
                by_role[t["role"]] += t["cpu_pct"]
        out["threads_cpu_pct"] = by_role
    return out
