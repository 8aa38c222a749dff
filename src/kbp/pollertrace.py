"""What each polling thread's polls cost the other class, traced for a few seconds
(``kbpctl status --trace SECONDS``; root, bpftrace, tracepoints only).

The module's pollers count their own poll sizes and wake-up delays; a stock NAPI thread's
are counted nowhere, so on a CPU where an rt and a non-rt NAPI thread share, status could
only say how long each waited per run (schedstat), not behind whom nor how big the polls
were that it waited for.  This traces, for the polling threads ``kbpctl status`` found:

``napi:napi_poll`` in one of those threads (``tid``)
    polls, packets (``work``) summed and their maximum, the polls that used their whole
    budget (``work >= budget``: the kernel polls such a NAPI again at once, and a stock
    NAPI thread reaches a preemption point only after one of those on a kernel that does
    not preempt kernel code) and the budget itself.
``sched:sched_waking`` -> ``sched:sched_switch`` into an rt polling thread
    its wake-up-to-running delays, each charged to the task the switch took the CPU from
    (``prev``: under preemption models none and voluntary, the task that had to reach a
    preemption point; ``swapper`` when the CPU was idle and only the wake-up from idle
    counts).  A waking whose thread was running already (no switch follows) is dropped when
    the thread next switches out, so a later switch-in is never measured from it.

Each rt thread gets ``waited_behind`` (the tasks its waits ended behind, longest total
first) and every traced thread ``caused_*``: the rt threads' waits that ended when it gave
its CPU up -- what its class cost the rt class.  The module's pollers poll without the
tracepoint, so their poll sizes stay the module's counters; their waits are traced too.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kbp.bench import trace

#: waited_behind lists at most this many tasks per rt thread
TOP_BEHIND = 4
#: the longest --trace
MAX_SECONDS = 600
#: how long bpftrace may take to load the program before status gives the trace up: about
#: 1 s on an idle machine, 60-70 s in a 2-vCPU TCG guest with both vCPUs busy (the guest
#: test's load), so the bench's 60 s is too short here; an operator asks for a trace on a
#: loaded machine
START_TIMEOUT_S = 180.0


def program(pollers: Sequence[int], rt: Sequence[int]) -> str:
    """The bpftrace program: poll sizes of threads ``pollers``, wake-up delays of the rt
    threads ``rt`` charged to the task each switch took the CPU from."""
    parts = ['BEGIN { printf("READY\\n"); }']
    if pollers:
        parts.append(
            f"tracepoint:napi:napi_poll /{trace.one_of('tid', pollers)}/ {{\n"
            "  @pn[tid] = count(); @pw[tid] = sum(args->work); @px[tid] = max(args->work);\n"
            "  @pb[tid] = max(args->budget);\n"
            "  if (args->work >= args->budget) { @pf[tid] = count(); }\n}")
    if rt:
        parts += [
            f"tracepoint:sched:sched_waking /({trace.one_of('args->pid', rt)})"
            " && @w[args->pid] == 0/ { @w[args->pid] = nsecs; }",
            # current is still prev here: comm is the prev task's.  The pids are read into
            # variables first: bpftrace 0.17 reads args through a modified ctx pointer
            # after comm, which the verifier refuses
            "tracepoint:sched:sched_switch /@w[args->next_pid] || @w[args->prev_pid]/ {\n"
            "  $n = args->next_pid; $p = args->prev_pid; delete(@w[$p]);\n"
            "  if (@w[$n]) {\n"
            "    $d = nsecs - @w[$n]; delete(@w[$n]);\n"
            "    @wn[$n, $p] = count(); @ws[$n, $p] = sum($d); @wx[$n, $p] = max($d);\n"
            "    @bc[$p] = comm;\n  }\n}",
        ]
    parts.append("END { clear(@w); }" if rt else "END { }")
    return "\n".join(parts) + "\n"


@dataclass
class Wait:
    """Wake-up-to-running delays: how many, their sum and longest (ns)."""

    n: int = 0
    sum_ns: int = 0
    max_ns: int = 0

    def add(self, n: int, sum_ns: int, max_ns: int) -> None:
        self.n += n
        self.sum_ns += sum_ns
        self.max_ns = max(self.max_ns, max_ns)

    def to_json(self, **extra: Any) -> dict[str, Any]:
        return {**extra, "waits": self.n,
                "mean_us": round(self.sum_ns / self.n / 1000, 3) if self.n else None,
                "max_us": round(self.max_ns / 1000, 3)}


@dataclass
class Polls:
    polls: int = 0
    packets: int = 0
    max_packets: int = 0
    full: int = 0
    budget: int = 0


@dataclass
class Result:
    """One trace, parsed: polls per thread, waits per (rt thread, task it waited behind),
    the waited-behind tasks' names."""

    polls: dict[int, Polls] = field(default_factory=dict)
    waits: dict[tuple[int, int], Wait] = field(default_factory=dict)
    comms: dict[int, str] = field(default_factory=dict)

    def _total(self, pid: int, side: int) -> Wait:
        """The waits whose key has ``pid`` at ``side`` (0: the rt thread; 1: behind whom)."""
        w = Wait()
        for key, x in self.waits.items():
            if key[side] == pid:
                w.add(x.n, x.sum_ns, x.max_ns)
        return w

    def waited(self, pid: int) -> Wait:
        """All of rt thread ``pid``'s traced waits."""
        return self._total(pid, 0)

    def caused(self, pid: int) -> Wait:
        """The rt threads' waits that ended when ``pid`` gave its CPU up."""
        return self._total(pid, 1)

    def behind(self, pid: int, top: int = TOP_BEHIND) -> list[dict[str, Any]]:
        """The tasks rt thread ``pid`` waited behind, longest total first."""
        mine = sorted(((b, x) for (rt, b), x in self.waits.items() if rt == pid),
                      key=lambda bx: (-bx[1].sum_ns, bx[0]))
        return [x.to_json(pid=b, comm="idle" if b == 0 else self.comms.get(b, "?"))
                for b, x in mine[:top]]


def parse(output: str) -> Result:
    """bpftrace's maps (``-f json`` lines or the text dump) as a :class:`Result`."""
    res = Result()
    waits: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for name, keys, val in trace.map_entries(output):
        if name in ("pn", "pw", "px", "pf", "pb") and len(keys) == 1:
            p = res.polls.setdefault(keys[0], Polls())
            attr = {"pn": "polls", "pw": "packets", "px": "max_packets", "pf": "full",
                    "pb": "budget"}[name]
            setattr(p, attr, val)
        elif name in ("wn", "ws", "wx") and len(keys) == 2:
            waits[(keys[0], keys[1])][name] = val
    for key, v in waits.items():
        res.waits[key] = Wait(v.get("wn", 0), v.get("ws", 0), v.get("wx", 0))
    res.comms = {int(pid): str(comm) for pid, comm in trace.map_data(output, "@bc").items()
                 if str(pid).strip().isdigit()}
    return res


class PollerTrace(trace.KernelTrace):
    """:class:`kbp.bench.trace.KernelTrace` running :func:`program` for these threads."""

    def __init__(self, pollers: Sequence[int], rt: Sequence[int]) -> None:
        super().__init__()
        self.traced, self.rt = list(pollers), list(rt)

    def program(self) -> str:
        return program(self.traced, self.rt)


def bad_seconds(seconds: float) -> str | None:
    """Why ``--trace seconds`` is refused as given (None: it is not)."""
    if not 0 < seconds <= MAX_SECONDS:
        return f"--trace {seconds:g}: give SECONDS in (0, {MAX_SECONDS}]"
    return None


def why_not(seconds: float) -> str | None:
    """Why ``--trace seconds`` cannot run here (None: it can)."""
    return bad_seconds(seconds) or trace.unavailable()


def run(pollers: Sequence[int], rt: Sequence[int], seconds: float) -> Result:
    """Trace for ``seconds`` (tracefs mounted for the run if it was not, then unmounted);
    raises RuntimeError (bpftrace failed) or :class:`kbp.bench.trace.TraceFsError`."""
    fs = trace.TraceFs()
    fs.ensure()
    try:
        kt = fs.track(PollerTrace(pollers, rt))
        kt.start(timeout=START_TIMEOUT_S)
        time.sleep(seconds)
        kt.stop()
        if kt.error.strip() and not kt.output.strip():
            raise RuntimeError(f"bpftrace: {kt.error.strip()[-400:]}")
        return parse(kt.output)
    finally:
        fs.close()


def apply(res: Result, loads: Mapping[int, Any], rt: Sequence[int], seconds: float) -> None:
    """Fill each thread's PollerLoad (``loads``: pid -> load) from the trace: poll sizes
    where the load has none (the module's counters come first), an rt thread's waits and
    whom it waited behind, and every thread's caused waits."""
    for pid, ld in loads.items():
        ld.traced_s = seconds
        p = res.polls.get(pid)
        if p is not None and p.polls and ld.packets_per_poll is None:
            ld.polls = p.polls
            ld.packets_per_poll = round(p.packets / p.polls, 3)
            ld.poll_max = p.max_packets
            ld.full_polls = p.full
            ld.quota = ld.quota if ld.quota is not None else (p.budget or None)
        if pid in rt:
            w = res.waited(pid)
            summary = w.to_json()
            ld.traced_wakeups = w.n
            ld.traced_wait_mean_us = summary["mean_us"]
            ld.traced_wait_max_us = summary["max_us"] if w.n else None
            ld.waited_behind = res.behind(pid)
        c = res.caused(pid)
        if c.n:
            ld.caused = c.to_json()
