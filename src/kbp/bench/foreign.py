"""The foreign-CPU check of a latency run: user time on the RT CPU that no process of the
benchmark accounts for (a compiler, a cron job, another user's QEMU).

Every process the benchmark runs is a descendant of this one (the tester, the RT app, the
heavy receiver, the flood, bpftrace: started through ``ip netns exec``/``taskset``, which
exec).  Around the tester's run the check sums the user time of those descendants' threads
that may run on the RT CPU (their affinity includes it) and compares it with the RT CPU's
user time from /proc/stat; the rest is foreign.  A run with more than
``FOREIGN_MAX_FRACTION`` of its wall time foreign is *disturbed*: the runner discards it,
records it under ``results["disturbed_runs"]`` and runs it again, at most ``RERUNS`` times
(the last attempt is kept, flagged).  Kernel threads have no user time, so pollers, softirq
and ksoftirqd never count; a foreign process's system time is not seen (a lower bound).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
FOREIGN_MAX_FRACTION = 0.05
RERUNS = 2


def _stat_fields(path: Path) -> list[str] | None:
    try:
        raw = path.read_text()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields start after the last ")"
    return raw[raw.rfind(")") + 2:].split()


def descendants(root: int, proc: Path = PROC) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for d in proc.glob("[0-9]*"):
        f = _stat_fields(d / "stat")
        if f and len(f) > 1:
            children.setdefault(int(f[1]), []).append(int(d.name))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += children.get(p, [])
    return out


def user_ticks(pids: set[int], cpu: int, proc: Path = PROC) -> dict[int, int]:
    """{tid: user ticks} of the threads of ``pids`` whose affinity includes ``cpu``."""
    out: dict[int, int] = {}
    for pid in pids:
        for t in (proc / str(pid) / "task").glob("[0-9]*"):
            f = _stat_fields(t / "stat")
            try:
                ok = f is not None and cpu in os.sched_getaffinity(int(t.name))
            except OSError:
                ok = False
            if ok and f is not None:
                out[int(t.name)] = int(f[11])           # utime (field 14)
    return out


@dataclass
class Mark:
    cpu: int
    ticks: dict[int, int]

    @classmethod
    def take(cls, cpu: int, proc: Path = PROC) -> Mark:
        return cls(cpu, user_ticks(descendants(os.getpid(), proc), cpu, proc))


def check(a: Mark, b: Mark, cpu_user_s: float, wall_s: float) -> dict[str, Any]:
    """The run's record: the RT CPU's user seconds, the benchmark's own there, the rest
    (``foreign_user_s``), the limit and whether the run was ``disturbed``."""
    hz = os.sysconf("SC_CLK_TCK")
    ours = sum(max(v - a.ticks.get(t, 0), 0) for t, v in b.ticks.items()) / hz
    foreign = max(cpu_user_s - ours, 0.0)
    limit = FOREIGN_MAX_FRACTION * wall_s
    return {"cpu": a.cpu, "cpu_user_s": cpu_user_s, "bench_user_s": ours,
            "foreign_user_s": foreign, "limit_s": limit, "disturbed": foreign > limit}
