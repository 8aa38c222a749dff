"""Human-readable ``kbpctl status`` (rich tables)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kbp import names, rps
from kbp.backends import (
    DeviceStatus,
    NapiStatus,
    PollerLoad,
    PollerStatus,
    PollingCpu,
    Status,
)
from kbp.sysinfo import CpuTask, format_cpulist


def _ns(v: int | None) -> str:
    if v is None:
        return "-"
    if v >= 10_000_000_000:
        return f"{v / 1e9:.0f}s"
    if v >= 10_000_000:
        return f"{v / 1e6:.0f}ms"
    if v >= 10_000:
        return f"{v / 1e3:.0f}us"
    return f"{v}ns"


def _n(v: object) -> str:
    return "-" if v is None else str(v)


def _backend_cell(d: DeviceStatus) -> str:
    if not d.backend:
        return "-"
    out = f"{d.backend} {d.mode or ''}".strip()
    if d.linger_us:
        out += f" linger {d.linger_us}us"
    if d.periodic_request:
        out += " " + periodic_cell(d.periodic_request)
    if not d.managed:
        out += " (outside kbpctl)"
    if not d.complete:
        out += " INCOMPLETE"
    return out


def periodic_cell(per: dict[str, object]) -> str:
    """A periodic device's interval as enabled: "every 500us", "search 100..4000us"."""
    if per.get("interval_us") is not None:
        return f"every {per['interval_us']}us"
    return f"search {_n(per.get('min_interval_us'))}..{_n(per.get('max_interval_us'))}us"


def rps_cell(d: DeviceStatus) -> str:
    """off, or where RPS steers the device's packets: "on: CPUs 0-1", "on: CPU 1 +RFS",
    "on: RFS"; "kept on: ..." when enabled with --keep-rps."""
    r = d.rps
    if r is None:
        return "-"
    if not r.on:
        return "off"
    cpus = [f"CPU{'s' if len(r.cpus) != 1 else ''} {format_cpulist(r.cpus)}"] if r.cpus else []
    where = " +".join(cpus + (["RFS"] if r.rfs else []))
    return f"{'kept on' if d.keep_rps and d.backend else 'on'}: {where}"


def class_cell(d: DeviceStatus) -> str:
    """The class a served device was enabled with ("non-rt nice 5"); "-": not served."""
    if not d.backend or d.cls is None:
        return "-"
    return f"{d.cls} nice {d.nice}" if d.cls == names.CLASS_NON_RT and d.nice else d.cls


def sched_cell(policy: str | None, priority: int | None, nice: int | None) -> str:
    """"FIFO/50", "OTHER/0", "OTHER/0 nice 5" (the nice when a SCHED_OTHER thread has one)."""
    out = f"{(policy or '?').replace('SCHED_', '')}/{_n(priority)}"
    if nice and policy not in ("SCHED_FIFO", "SCHED_RR"):
        out += f" nice {nice}"
    return out


def devices_table(st: Status) -> Table:
    t = Table(title="devices and their NAPIs", title_justify="left", expand=False)
    for col in ("device", "netns", "backend", "class", "RPS", "NAPI", "IRQ", "threaded",
                "defer/gro", "thread", "CPU", "sched", "sleeps", "ran", "rx pkts"):
        t.add_column(col, no_wrap=True)
    for d in st.devices:
        first = True
        rows: Sequence[NapiStatus | None] = d.napis or [None]
        for n in rows:
            dev_cells = [d.name, d.netns or "-", _backend_cell(d), class_cell(d),
                         rps_cell(d)] if first else ["", "", "", "", ""]
            pk = _n(d.counters.get("packets")) if first else ""
            first = False
            if n is None:
                t.add_row(*dev_cells, "-", "-", "-", "-", "-", "-", "-", "-", "-", pk)
                continue
            irq = "-" if n.irq is None else f"{n.irq}->{n.irq_affinity or '?'}"
            dg = "-" if n.defer_hard_irqs is None else \
                f"{n.defer_hard_irqs}/{_ns(n.gro_flush_timeout_ns)}"
            th = n.thread
            thread = f"{th.pid} {th.comm}" if th else "-"
            cpu = (format_cpulist(th.cpus) if th else "-") if n.cpu is None else str(n.cpu)
            sched = sched_cell(th.policy, th.priority, th.nice) if th else "-"
            t.add_row(*dev_cells, _n(n.id), irq, _n(n.threaded), dg, thread, cpu, sched,
                      _n(th.counters.get("sleeps")) if th else "-",
                      _ns(th.counters.get("poll_ns")) if th else "-", pk)
    return t


def pollers_table(st: Status) -> Table:
    t = Table(title="kbp module pollers", title_justify="left")
    cols = ("CPU", "class", "device", "state", "pid", "mode", "linger", "quota", "sched",
            "freq_ctl", "NAPIs",
            "passes",
            "empty", "packets", "wakeups", "sleeps", "slept", "yields", "polled", "respawns",
            "repairs")
    for col in cols:
        t.add_column(col, no_wrap=True)
    for p in st.pollers:
        c = p.counters
        t.add_row(str(p.cpu), p.cls, p.device or "-", p.state or "-",
                  _n(p.pid), _n(p.mode),
                  _n(p.linger_us), _n(p.quota), sched_cell(p.policy, p.priority, p.nice),
                  f"on, {_n(c.get('freq_changes'))} changes" if p.freq_ctl else "off",
                  _n(p.napis),
                  _n(c.get("passes")), _n(c.get("empty_passes")), _n(c.get("packets")),
                  _n(c.get("wakeups")), _n(c.get("sleeps")), _ns(c.get("sleep_ns")),
                  _n(c.get("yields")), _ns(c.get("poll_ns")), _n(c.get("respawns")),
                  _n(c.get("repairs")))
    return t


def periodic_line(p: PollerStatus) -> str:
    """One line per periodic poller: its interval, and the interval search when it runs."""
    per = p.periodic or {}
    head = f"{p.name} periodic: {_n(per.get('handbacks'))} hand-backs to interrupts, "
    s = per.get("search")
    if not isinstance(s, dict):
        return head + f"fixed interval {_n(per.get('interval_us'))} us"
    state = "converged" if s.get("converged") else f"distance {_n(s.get('distance_us'))} us"
    return (head + f"search round {_n(s.get('round'))} ({_n(s.get('rounds'))} in all, "
            f"{_n(s.get('restarts'))} restarts): interval {_n(s.get('interval_us'))} us, "
            f"probes {_n(s.get('low_us'))}/{_n(s.get('high_us'))} us in "
            f"{_n(s.get('range_lo_us'))}..{_n(s.get('range_hi_us'))} us, {state}"
            f"{_search_knobs(per)}; {_last_round(s)}")


def _search_knobs(per: dict[str, object]) -> str:
    """The search's knobs, when the module reported them."""
    if per.get("round_ms") is None:
        return ""
    return (f" (rounds of {_n(per.get('round_ms'))} ms, restart on a change above "
            f"{_n(per.get('min_change'))} % or every {_n(per.get('max_round'))} rounds)")


def device_periodic_line(d: DeviceStatus) -> str:
    """One line per stock periodic device: its interval, and the service's search."""
    per = d.periodic or {}
    where = f"{d.name}{' (' + d.netns + ')' if d.netns else ''}"
    head = f"{where} periodic (defer {_n(per.get('defer_hard_irqs'))} empty polls): "
    svc = per.get("service")
    if not isinstance(svc, dict):
        fixed = per.get("interval_us")
        return head + (f"fixed interval {fixed} us" if fixed is not None else
                       "no search service")
    run = f"service {_n(svc.get('pid'))} {'running' if svc.get('running') else 'NOT running'}"
    s = per.get("search")
    if not isinstance(s, dict):
        return head + run
    state = "converged" if s.get("converged") else f"distance {_n(s.get('distance_us'))} us"
    got = svc.get("last")
    last = got if isinstance(got, dict) else {}
    return (head + f"{run}, {_n(svc.get('rounds'))} rounds ({_n(svc.get('idle_rounds'))} "
            f"idle); search round {_n(s.get('round'))} ({_n(s.get('restarts'))} restarts, "
            f"last by {_n(s.get('started_by'))}): interval {_n(per.get('interval_us'))} us, "
            f"probes {_n(s.get('low_us'))}/{_n(s.get('high_us'))} us in "
            f"{_n(s.get('range_lo_us'))}..{_n(s.get('range_hi_us'))} us, {state}, "
            f"last round {_n(last.get('bytes'))} bytes, objective {_n(last.get('value'))} "
            f"({_n(per.get('objective'))})")


def _last_round(s: dict[str, Any]) -> str:
    """The search's objective and its value in the last round (module/uapi/kbp.h)."""
    obj = s.get("objective") or names.OBJECTIVE_BYTES
    last = s.get("last_objective", s.get("last_work"))
    if obj == names.OBJECTIVE_BYTES_PER_CPU:
        cpu = s.get("last_cpu_ns")
        return (f"objective {obj}: last round {_n(last)} bytes per CPU-second "
                f"({_n(s.get('last_bytes'))} bytes in {_ns(cpu)} of CPU)")
    return f"objective {obj}: last round {_n(last)} bytes"



def _task_cells(t: CpuTask) -> list[str]:
    who = str(t.pid) if t.pid == t.tid else f"{t.pid}/{t.tid}"
    comm = f"[{t.comm}]" if t.kthread else t.comm
    sched = f"{t.policy.replace('SCHED_', '')}/{t.priority}"
    why = ", ".join(w for w, on in (("pinned", t.pinned), ("runnable here", t.state == "R"))
                    if on)
    return [who, escape(comm), t.state, sched, why]


def cpu_tasks_block(cpus: list[PollingCpu]) -> RenderableType:
    """Other tasks on the polling CPUs: what a busy poller makes wait."""
    if not any(c.tasks for c in cpus):
        return Text(f"polling CPUs {format_cpulist(c.cpu for c in cpus)}: no other task is "
                    "pinned to them or runnable on them")
    t = Table(title="other tasks on polling CPUs", title_justify="left")
    for col in ("CPU", "pid/tid", "command", "state", "sched", "why listed"):
        t.add_column(col, no_wrap=True)
    for c in cpus:
        cpu = f"{c.cpu} (busy)" if c.busy else str(c.cpu)
        for i, task in enumerate(c.tasks):
            t.add_row(cpu if i == 0 else "", *_task_cells(task))
    return t


def busy_warnings(cpus: list[PollingCpu]) -> list[Text]:
    out = []
    for c in cpus:
        users = [t for t in c.tasks if not t.kthread]
        if c.busy and users:
            out.append(Text(f"! CPU {c.cpu}: a busy poller owns it; {len(users)} other task"
                            f"{'s' if len(users) != 1 else ''} there run only when it yields: "
                            "move them to other CPUs or use --mode hybrid", style="bold yellow"))
    return out


def freq_block(st: Status) -> RenderableType:
    f = st.cpufreq
    if not f.available:
        return Text(f"cpufreq: {f.note}")
    t = Table(title="cpufreq", title_justify="left")
    for c in ("CPU", "governor", "driver", "min MHz", "max MHz", "now MHz"):
        t.add_column(c)
    for r in f.cpus:
        t.add_row(str(r.cpu), _n(r.governor), _n(r.driver),
                  _n(r.min_khz // 1000 if r.min_khz else None),
                  _n(r.max_khz // 1000 if r.max_khz else None),
                  _n(r.cur_khz // 1000 if r.cur_khz else None))
    return Group(t, Text(f.note))


def cpu_poller_lines(cpus: list[PollingCpu]) -> list[Text]:
    """One line per polling CPU: its pollers with their class, rt first, and the devices
    their names do not say ("CPU 1 pollers: rt kbp/1:eth0 FIFO/50; non-rt napi/eth2-9 OTHER/0
    nice 5 (eth2)")."""
    out = []
    for c in cpus:
        if not c.pollers:
            continue
        parts = []
        for p in c.pollers:
            unsaid = [d for d in p.devices if not p.comm.endswith(f":{d}")]
            devs = f" ({', '.join(unsaid)})" if unsaid else ""
            parts.append(f"{p.cls} {p.comm} {sched_cell(p.policy, p.priority, p.nice)}{devs}")
        out.append(Text(f"CPU {c.cpu} pollers: {'; '.join(parts)}"))
        out += [Text(f"  {p.cls} {p.comm}: {cell}") for p in c.pollers
                if p.load is not None and (cell := load_cell(p.load))]
    return out


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} us"


def load_cell(ld: PollerLoad) -> str:
    """A polling thread's poll sizes and waits, in the counters' words ('' if none known):
    what its class costs the other class on a CPU both share."""
    parts = []
    traced = f" (traced {ld.traced_s:g} s)" if ld.traced_s else ""
    if ld.polls is not None and ld.packets_per_poll is not None:
        parts.append(f"{ld.packets_per_poll:,.1f} packets per poll over {ld.polls:,} polls, "
                     f"largest {_n(ld.poll_max)}, {_n(ld.full_polls)} took the whole budget "
                     f"{_n(ld.quota)}{traced}")
    elif ld.packets_per_poll is not None:
        gave = f", gave way {ld.gave_way:,} times" if ld.gave_way else ""
        parts.append(f"{ld.packets_per_poll:,.1f} packets per poll (quota {_n(ld.quota)}){gave}")
    if ld.traced_wakeups:
        behind = ", ".join(f"{b['comm']} ({b['pid']}) {b['waits']:,}x max {_us(b['max_us'])}"
                           for b in ld.waited_behind or [])
        parts.append(f"woken {ld.traced_wakeups:,} times: waited {_us(ld.traced_wait_mean_us)} "
                     f"mean, {_us(ld.traced_wait_max_us)} max{traced}"
                     + (f", behind {behind}" if behind else ""))
    if ld.caused:
        c = ld.caused
        parts.append(f"rt waits it ended: {c['waits']:,}, {_us(c['mean_us'])} mean, "
                     f"{_us(c['max_us'])} max{traced}")
    if ld.wake_delay_mean_us is not None:
        parts.append(f"wake-up to running {_us(ld.wake_delay_mean_us)} mean, "
                     f"{_us(ld.wake_delay_max_us)} max over {ld.wakeups:,} wake-ups")
    if ld.wait_mean_us is not None:
        parts.append(f"runnable but waiting {_us(ld.wait_mean_us)} per run "
                     f"(schedstat, {ld.runs:,} runs)")
    return "; ".join(parts)


def preempt_lines(st: Status) -> list[Text]:
    """The preemption model, and where it limits an RT poller here (a warning each)."""
    if st.preempt is None:
        return []
    p = st.preempt
    how = "a woken RT poller preempts kernel code at once" if p.get("preempts_kernel") else \
        "a woken RT poller waits until kernel code on its CPU gives way"
    out = [Text(f"preemption model: {p.get('model')} (from {p.get('source')}): {how}")]
    out += [Text(f"! {n}", style="bold yellow") for n in p.get("notes") or []]
    return out


def rt_class_lines(st: Status) -> list[Text]:
    """One line per device under the [rt_class] rule: its class and why."""
    if st.rt_class is None:
        return []
    ns = st.rt_class.get("netns") or []
    out = [Text(f"RT class: devices whose interrupt threads run at SCHED_FIFO/RR >= "
                f"rtnet_prio {st.rt_class['rtnet_prio']} (init netns"
                f"{''.join(', ' + n for n in ns)}; kbpctl apply)")]
    for d in st.devices:
        if d.rt_class is None:
            continue
        cls, why = d.rt_class["class"], d.rt_class["why"]
        served = ""
        if cls != "rt" and d.backend and d.cls == names.CLASS_NON_RT:
            served = " -- served with class non-rt below the RT poller"
        elif cls != "rt" and d.backend:
            served = " -- served anyway: named in kbp.toml or by kbpctl enable"
        elif cls == "rt" and not d.backend:
            served = " -- not served yet: run kbpctl apply"
        where = f" ({d.netns})" if d.netns else ""
        out.append(Text(f"  {d.name}{where}: {cls}: {why}{served}"))
    return out


def _share(v: object) -> str:
    return f"{v * 100:.1f}%" if isinstance(v, (int, float)) else "-"


def outsource_lines(st: Status) -> list[Text]:
    """Socket outsourcing (kbp_so, /proc/kbp_so): its state, how completions are found and
    who found them; nothing without the module. The counters under the module's names."""
    o = st.outsource
    if o is None:
        return []
    if "state" not in o:  # {"error": ...}: the file did not read or parse
        return [Text(f"! socket outsourcing (kbp_so): {o.get('error')}", style="bold yellow")]
    head = (f"socket outsourcing (kbp_so): state {o.get('state')}, idle "
            f"{o.get('idle', '-')}")
    if "idle_poll_us" in o:
        head += f" (idle_poll_us {o['idle_poll_us']})"
    if "poll_us" in o:
        head += f", poll_us {o['poll_us']}"
    derived = {"state", "idle", "idle_poll_us", "poll_us", "completions",
               "irqs_per_completion", "share"}
    counters = " ".join(f"{k}={v}" for k, v in o.items() if k not in derived)
    out = [Text(head), Text(f"  {counters}")]
    total = o.get("completions")
    if total is not None:
        share = o.get("share") or {}
        who = ", ".join(f"{k} {_share(v)}" for k, v in share.items())
        ipc = o.get("irqs_per_completion")
        out.append(Text(f"  completions {total}: found by {who} (syscall: "
                        f"completions_polled + completions_syscall); irqs_per_completion "
                        f"{'-' if ipc is None else f'{ipc:.3f}'}"))
    return out


def status_view(st: Status) -> RenderableType:
    parts: list[RenderableType] = []
    b = st.backends
    kmod_info = b.get("kmod")
    head = Text(f"kernel {st.kernel}; --backend auto picks {st.auto}")
    if kmod_info is not None and not kmod_info.available:
        head.append(f" ({kmod_info.reason})")
    parts.append(head)
    parts.append(devices_table(st))
    if st.pollers:
        parts.append(pollers_table(st))
        parts += [Text(periodic_line(p)) for p in st.pollers if p.periodic]
    parts += [Text(device_periodic_line(d)) for d in st.devices if d.backend and d.periodic]
    parts += rt_class_lines(st)
    problems = [f"{d.name}{' (' + d.netns + ')' if d.netns else ''}: {p}"
                for d in st.devices for p in d.problems if d.backend]
    for p in problems:
        parts.append(Text(f"! {p}", style="bold yellow"))
    for d in st.devices:
        if d.backend and d.keep_rps and d.rps is not None and d.rps.on:
            parts.append(Text(f"! {d.name}{' (' + d.netns + ')' if d.netns else ''}: RPS kept "
                              f"on (--keep-rps): the poller's packets are re-queued to the "
                              f"backlog softirq of {rps.where(d.rps.cpus, d.rps.rfs)}",
                              style="bold yellow"))
    parts += cpu_poller_lines(st.polling_cpus)
    if st.trace and st.trace.get("error"):
        parts.append(Text(f"! --trace {st.trace['seconds']:g}: not traced: "
                          f"{st.trace['error']}", style="bold yellow"))
    parts += [Text(f"! {o.problem}", style="bold yellow") for o in st.orphans]
    parts += preempt_lines(st)
    if st.polling_cpus:
        parts.append(cpu_tasks_block(st.polling_cpus))
        parts += busy_warnings(st.polling_cpus)
    parts += outsource_lines(st)
    parts.append(freq_block(st))
    parts.append(Text("RPS: off, or the CPUs whose backlog softirq RPS hands the device's "
                      "packets to (kbpctl enable turns it off unless --keep-rps). "
                      "threaded 0: softirq, 1: kthread, 2: kthread busy-polls. defer/gro: "
                      "napi_defer_hard_irqs/gro_flush_timeout. sleeps, ran: the thread's "
                      "sleeps and CPU time. Other tasks: user tasks pinned to a polling CPU "
                      "or runnable on it, [kernel threads] runnable on it.", style="dim"))
    return Group(*parts)
