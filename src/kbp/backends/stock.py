"""The stock backend: an EE-KBP-like receive path from stock kernel features, no module.

For each device:

1. threaded NAPI on (per NAPI with netdev ``napi-set threaded`` where the kernel has it,
   else the device's sysfs ``threaded``): the hardIRQ now wakes a ``napi/<dev>-<id>``
   kernel thread instead of raising NET_RX softirq -- EE-KBP's wake path (Sect. 4.1);
2. each NAPI thread bound to its CPU and made SCHED_FIFO at ``--rt-prio`` (KBP's dedicated
   polling thread that softirq work cannot delay) -- except with ``--mode busy``, where it
   stays SCHED_NORMAL (:func:`default_rt_prio`; a priority is refused there);
3. the device's queue IRQs pointed at the CPU of their thread (a NAPI's own IRQ where
   napi-get reports it);
4. ``--linger-us``: after the last packet keep the NAPI polled by its thread (hrtimer every
   ``LINGER_INTERVAL_US``) instead of re-arming the IRQ, via ``defer_hard_irqs`` and
   ``gro_flush_timeout`` (per NAPI where napi-set has them, else per device);
   With ``--class non-rt`` (a heavy device whose interrupts land on the CPU of an rt
   device) the threads stay SCHED_OTHER at ``--nice`` instead, on the same CPUs: the rt
   device's FIFO thread preempts them, but only where the kernel lets it (below, and
   docs/kbpctl.md "Classes");
5. ``--mode busy``: threaded busy polling (``threaded`` = 2, Linux 6.19+);
6. ``--mode periodic`` (NetAP): IRQ deferral polls the NAPI every interval with its IRQ
   masked (``defer_hard_irqs`` 8, ``gro_flush_timeout`` = the interval, as in 4.), and
   without ``--interval-us`` a service (:mod:`kbp.periodicd`, journaled last) runs the
   interval search and rewrites ``gro_flush_timeout`` every round.

Before all of these, RPS on the device is turned off (its receive queues' ``rps_cpus`` and
``rps_flow_cnt``: :mod:`kbp.rps`) unless ``--keep-rps``: with RPS the NAPI thread would hand
every packet back to the backlog softirq.

Every change is journaled before it is made (:mod:`kbp.system.journal`).

What the stock non-rt class cannot do that the module's non-rt poller does: cap a poll to a
small quota and give the CPU away between polls. ``napi_threaded_poll_loop()`` polls up to
the NAPI weight (64) with BH off and calls ``cond_resched()`` only after a poll that used its
whole budget, so under PREEMPT_NONE/VOLUNTARY a woken FIFO thread waits until the SCHED_OTHER
NAPI thread stops by itself (../shared/notes/rt-split-kernel-facts.md); ``kbpctl status``
says so where it applies.

``KBP_STOCK_FEATURES`` (diagnostics and tests) hides kernel features so older paths can be
exercised on a new kernel: ``sysfs`` ignores napi-set (per-device sysfs knobs), ``legacy``
ignores the whole netdev family (sysfs probe for NAPIs, threads found by name).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kbp import contention, modespec, names, periodicd, rps, sysinfo
from kbp.backends import (
    DEFAULT_RT_PRIO,
    DeviceResult,
    DeviceStatus,
    DisableResult,
    EnableRequest,
    EnableResult,
    NapiStatus,
    PollerStatus,
    ThreadStatus,
    changed_settings,
    check_nice_capability,
    contention_notes,
    isolate_others,
    journaled_class,
    lookup_device,
    read_rps,
    require_root,
    rps_off_plan,
    show_rps,
    validate_common,
)
from kbp.errors import InvalidInput, KbpctlError, OperationFailed, Unavailable
from kbp.netdev import (
    THREADED_BUSY_POLL,
    THREADED_ON,
    Link,
    Napi,
    NetdevClient,
    NetdevClients,
    NetdevFeatures,
    NetFS,
    check_netns,
    get_link,
    list_links,
    napi_threads_by_name,
    probe_napi_sysfs,
    same_named_elsewhere,
)
from kbp.problems import (
    AMBIGUOUS_NAME,
    DEVICE_GONE,
    INTERRUPTED,
    NEEDS_ROOT,
    NO_NAPI,
    NO_THREAD,
    NOT_THREADED,
    SCHED_DRIFT,
    Problem,
)
from kbp.sysinfo import HOST, RT_PRIO_MIN, Host, TaskStat
from kbp.system.access import RestoreError
from kbp.system.journal import (
    KIND_AFFINITY,
    KIND_IRQ,
    KIND_NAPI,
    KIND_SCHED,
    KIND_SYSFS,
    Executor,
    PauseHook,
    Record,
    StateDir,
    read_record,
    remove_record,
    restore,
)
from kbp.system.settings import netns_gone, sysfs_key, system_effector, task_key

NAME = names.BACKEND_STOCK
LINGER_INTERVAL_US = 10  # hrtimer re-poll interval while lingering
#: class non-rt: the heavy NAPI is re-polled by its hrtimer every NON_RT_REPOLL_US with its
#: IRQ (veth: its xmit notification) deferred, and handed back to it after NON_RT_DEFER
#: empty polls (:func:`non_rt_defer_values`).  Without it, under PREEMPT_NONE/VOLUNTARY a
#: stock NAPI thread that finds its NAPI scheduled again after each small poll never calls
#: schedule(), and the rt thread on its CPU waited up to 4.6-56 ms behind it (this host,
#: 6.18 PREEMPT_NONE, a UDP flood of ~2-packet polls, 2026-11-30); with it the thread
#: sleeps after every poll that did not fill its budget: the rt waits behind it were 23-55 us
#: at most, and the heavy flow received more packets per second, not fewer (docs/kbpctl.md)
NON_RT_REPOLL_US = 20
NON_RT_DEFER = 2
ENV_FEATURES = "KBP_STOCK_FEATURES"
THREADED_SINCE = (5, 12, 0)
BUSY_POLL_SINCE = modespec.BUSY.stock.since


def default_rt_prio(mode: str) -> int:
    """The NAPI threads' priority when none is asked for: SCHED_FIFO ``DEFAULT_RT_PRIO`` in
    hybrid; 0 (SCHED_NORMAL) in busy.

    Upstream's threaded busy polling (``napi_threaded_poll_loop()``) never sleeps once woken:
    it gives the CPU away only at ``cond_resched()``, which lets a SCHED_FIFO thread be
    preempted by higher RT priorities only, so every SCHED_OTHER task on its CPU would get
    just what RT throttling leaves (5 %, nothing with sched_rt_runtime_us=-1). At
    SCHED_NORMAL that ``cond_resched()`` is where CFS shares the CPU fairly.
    """
    return 0 if _spins(mode) else DEFAULT_RT_PRIO


def _spins(mode: str) -> bool:
    """The stock equivalent of ``mode`` never sleeps nor yields (modespec): SCHED_NORMAL."""
    spec = modespec.SPECS.get(mode)
    return spec is not None and not spec.stock.fifo


def _threaded_value(mode: str) -> int:
    """The NAPI 'threaded' value the stock backend sets for ``mode`` (modespec)."""
    spec = modespec.SPECS.get(mode)
    value = spec.stock.threaded if spec is not None else None
    return THREADED_ON if value is None else value


def busy_fifo_refusal(rt_prio: int) -> str:
    """Why ``--rt-prio N`` (N > 0) is refused with the stock backend's ``--mode busy``."""
    return (f"--rt-prio {rt_prio} with the stock backend's --mode busy would starve the "
            "polling CPUs: upstream's threaded busy polling never sleeps and yields only at "
            "cond_resched(), where a SCHED_FIFO thread gives way to higher RT priorities only, "
            "so every other task on its CPU (kworkers, ksoftirqd, your applications) would get "
            "just what RT throttling spares (5 %, nothing with sched_rt_runtime_us=-1) -- an "
            "isolated CPU is no exception: its per-CPU kworkers still run work that other CPUs "
            "wait for. Leave the priority out (or give 0; the same for rt_prio in kbp.toml): "
            "the NAPI threads then run SCHED_NORMAL and share their CPU fairly. For a "
            "SCHED_FIFO busy poller use the kbp module (--backend kmod --mode busy), whose "
            "poller yields to the CPU's other tasks, or --mode hybrid, which sleeps when idle")


# -- pure planning --------------------------------------------------------------------
@dataclass
class Planned:
    kind: str
    key: dict[str, Any]
    new: Any


def napi_key(netns: str | None, ifindex: int, napi_id: int, knob: str) -> dict[str, Any]:
    return {"netns": netns, "ifindex": ifindex, "napi_id": napi_id, "knob": knob}


def plan_threaded(netns: str | None, dev: str, ifindex: int, napi_ids: Sequence[int] | None,
                  value: int) -> list[Planned]:
    """Threaded NAPI on: per NAPI (napi_ids given) or per device (None)."""
    if napi_ids is None:
        return [Planned(KIND_SYSFS, sysfs_key(netns, dev, ifindex, "threaded"), str(value))]
    return [Planned(KIND_NAPI, napi_key(netns, ifindex, n, "threaded"), value) for n in napi_ids]


def assign_cpus(n: int, cpus: Sequence[int]) -> list[int]:
    """NAPI i (in id order) -> CPU cpus[i mod len(cpus)]."""
    return [cpus[i % len(cpus)] for i in range(n)]


def thread_sched(prio: int) -> tuple[str, int]:
    """(policy, priority) of a NAPI thread asked to run at ``prio`` (0: SCHED_NORMAL)."""
    return ("SCHED_FIFO", prio) if prio > 0 else ("SCHED_OTHER", 0)


def thread_nices(req: EnableRequest, current: Sequence[int]) -> list[int]:
    """The nice each NAPI thread gets: class non-rt's ``--nice``; rt keeps the thread's."""
    if req.cls == names.CLASS_NON_RT:
        return [req.nice or 0] * len(current)
    return list(current)


def first_nice(rec: Record, t: TaskStat) -> int:
    """The nice ``t`` had before ``rec``'s first change of its scheduling (its nice now when
    there was none): an rt thread back from class non-rt gets the nice it started with."""
    for c in rec.changes:
        if c.kind == KIND_SCHED and c.key.get("pid") == t.pid and \
                c.key.get("starttime") == t.starttime and isinstance(c.old, dict):
            return int(c.old.get("nice", 0))
    return os.getpriority(os.PRIO_PROCESS, t.pid)


def linger_refusal() -> str:
    """Why the stock backend's non-rt class takes no ``--linger-us``."""
    return ("--class non-rt with --linger-us: the stock non-rt NAPI threads do not linger "
            f"(they are re-polled every {NON_RT_REPOLL_US} us while packets keep coming, so "
            "the rt thread waits at most one poll; lingering after the last packet would "
            "only add work on the rt device's CPU); drop --linger-us")


def in_place_change(rec: Record, req: EnableRequest) -> bool:
    """``req`` differs from the device's complete journal only in its class, nice or
    ``--repoll-us`` (and the priority that follows from them), so enable changes the NAPI
    threads' policy and the deferral in place:
    threaded NAPI stays on and no packet goes back to softirq on the way (a restore and
    enable would turn it off and on)."""
    if not rec.complete or rec.backend != NAME:
        return False
    changed = set(changed_settings(rec.request, req.settings()))
    return bool(changed & {"class", "nice", "repoll_us"}) and \
        changed <= {"class", "nice", "rt_prio", "repoll_us"}


def plan_threads(threads: Sequence[TaskStat], cpus: Sequence[int], prio: int,
                 nices: Sequence[int]) -> list[Planned]:
    """Bind each NAPI thread to its CPU, then make it SCHED_FIFO at ``prio`` (0:
    SCHED_OTHER, i.e. SCHED_NORMAL; a thread already there is left alone) at ``nices``
    (:func:`thread_nices`)."""
    policy, priority = thread_sched(prio)
    out = []
    for t, cpu, nice in zip(threads, cpus, nices, strict=True):
        key = task_key(sysinfo.TaskId(t.pid, t.starttime, t.comm))
        out.append(Planned(KIND_AFFINITY, key, [cpu]))
        out.append(Planned(KIND_SCHED, key, {"policy": policy, "priority": priority,
                                          "nice": nice}))
    return out


def irq_targets(napi_irqs: Sequence[int | None], name_irqs: Sequence[int],
                thread_cpus: Sequence[int]) -> dict[int, str]:
    """IRQ -> CPU list that aligns the device's IRQs with its NAPI threads.

    A NAPI's own IRQ (napi-get) goes to its thread's CPU. Otherwise the queue IRQs found by
    name pair with the NAPIs in order when the counts match, or else all go to the set of
    polling CPUs.
    """
    out: dict[int, str] = {}
    if napi_irqs and all(i is not None for i in napi_irqs):
        for irq, cpu in zip(napi_irqs, thread_cpus, strict=True):
            assert irq is not None
            out[irq] = sysinfo.format_cpulist([cpu])
        return out
    if not name_irqs or not thread_cpus:
        return out
    if len(name_irqs) == len(thread_cpus):
        for irq, cpu in zip(name_irqs, thread_cpus, strict=True):
            out[irq] = sysinfo.format_cpulist([cpu])
    else:
        every = sysinfo.format_cpulist(thread_cpus)
        for irq in name_irqs:
            out[irq] = every
    return out


def plan_irqs(targets: dict[int, str]) -> list[Planned]:
    return [Planned(KIND_IRQ, {"irq": irq}, cpus) for irq, cpus in sorted(targets.items())]


def linger_values(linger_us: int) -> tuple[int, int]:
    """(napi_defer_hard_irqs, gro_flush_timeout in ns) that keep a NAPI polled ~linger_us.

    After the last packet the kernel re-polls every gro_flush_timeout (hrtimer) and
    re-arms the IRQ after defer_hard_irqs empty polls.
    """
    if linger_us <= 0:
        return 0, 0
    interval = min(linger_us, LINGER_INTERVAL_US)
    return math.ceil(linger_us / interval), interval * 1000


def repoll_us(req: EnableRequest) -> int:
    """Class non-rt's re-poll interval: ``--repoll-us`` or :data:`NON_RT_REPOLL_US`
    (0: the deferral is left as found)."""
    return NON_RT_REPOLL_US if req.repoll_us is None else req.repoll_us


def non_rt_defer_values(interval_us: int = NON_RT_REPOLL_US) -> tuple[int, int]:
    """(napi_defer_hard_irqs, gro_flush_timeout in ns) of class non-rt's NAPIs: re-polled
    from the hrtimer every ``interval_us`` while packets keep coming, so each poll that does
    not fill the budget ends in schedule() (a preemption point on every model)."""
    return NON_RT_DEFER, interval_us * 1000


def plan_non_rt_defer(netns: str | None, dev: str, ifindex: int,
                      napi_ids: Sequence[int] | None, req: EnableRequest) -> list[Planned]:
    """Class non-rt's IRQ deferral at :func:`repoll_us` ([]: another class, or 0)."""
    every = repoll_us(req)
    if req.cls != names.CLASS_NON_RT or not every:
        return []
    return plan_defer(netns, dev, ifindex, napi_ids, *non_rt_defer_values(every))


def defer_napi_ids(napis: Sequence[Napi] | None, feats: NetdevFeatures) -> list[int] | None:
    """The NAPI ids IRQ deferral is set on (napi-set), or None: per device (sysfs), where
    napi-get listed none or napi-set lacks the deferral attributes."""
    ok = feats.napi_knob("defer_hard_irqs") and feats.napi_knob("gro_flush_timeout")
    return [n.id for n in napis] if (napis and ok) else None


def plan_linger(netns: str | None, dev: str, ifindex: int, napi_ids: Sequence[int] | None,
                linger_us: int) -> list[Planned]:
    defer, gro_ns = linger_values(linger_us)
    return plan_defer(netns, dev, ifindex, napi_ids, defer, gro_ns)


def periodic_values(interval_us: int) -> tuple[int, int]:
    """(napi_defer_hard_irqs, gro_flush_timeout in ns) of mode periodic: the NAPI is re-polled
    from its hrtimer every ``interval_us`` with the IRQ masked, and handed back to the IRQ
    after ``periodicd.DEFER_HARD_IRQS`` empty polls (docs/netap.md, "The stock backend")."""
    return periodicd.DEFER_HARD_IRQS, interval_us * 1000


def plan_periodic(netns: str | None, dev: str, ifindex: int, napi_ids: Sequence[int] | None,
                  interval_us: int) -> list[Planned]:
    return plan_defer(netns, dev, ifindex, napi_ids, *periodic_values(interval_us))


def plan_defer(netns: str | None, dev: str, ifindex: int, napi_ids: Sequence[int] | None,
               defer: int, gro_ns: int) -> list[Planned]:
    """IRQ deferral: per NAPI (napi-set) where ``napi_ids`` are given, else per device."""
    if napi_ids is None:
        return [Planned(KIND_SYSFS, sysfs_key(netns, dev, ifindex, "napi_defer_hard_irqs"),
                        str(defer)),
                Planned(KIND_SYSFS, sysfs_key(netns, dev, ifindex, "gro_flush_timeout"),
                        str(gro_ns))]
    out = []
    for n in napi_ids:
        out.append(Planned(KIND_NAPI, napi_key(netns, ifindex, n, "defer_hard_irqs"), defer))
        out.append(Planned(KIND_NAPI, napi_key(netns, ifindex, n, "gro_flush_timeout"), gro_ns))
    return out


def no_napi_message(dev: str, link: Link, netns: str | None) -> str:
    pre = f"ip netns exec {netns} " if netns else ""
    if link.kind == "veth":
        hint = f"veth uses NAPI only with GRO on: {pre}ethtool -K {dev} gro on"
        if not link.up:
            hint = f"it is down: {pre}ip link set {dev} up; and {hint}"
        return f"{dev} has no NAPI instance ({hint})"
    if not link.up:
        return (f"{dev} has no NAPI instance while it is down: bring it up "
                f"({pre}ip link set {dev} up)")
    what = f"{link.kind} devices do" if link.kind else "its driver does"
    return f"{dev} has no NAPI instance ({what} not use NAPI): kbp serves NAPI devices only"


def _where_has(others: Sequence[str]) -> str:
    """``netns blue has`` / ``netns blue, netns red have`` (three named at most)."""
    where = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return f"{where} {'has' if len(others) == 1 else 'have'}"


def ambiguous_threads_message(dev: str, others: Sequence[str], status: bool = False) -> str:
    """Why a device's NAPI threads cannot be found on a kernel without napi-get (``status``:
    as ``kbpctl status`` says it; else as ``enable`` refuses)."""
    fact = (f"{dev}'s NAPI threads can only be found by name (napi/{dev}-<id>) on this "
            f"kernel, which has no netdev napi-get (Linux 6.9), and {_where_has(others)} a "
            "device whose threads carry the same names")
    if status:
        return f"{fact}: status shows none of them, and 'kbpctl enable {dev}' refuses it"
    return (f"{fact}; kbpctl does not change another namespace's threads: use the kbp module "
            "(--backend kmod), or give the devices names of their own (a NAPI thread keeps "
            "the name its device had when the thread started)")


def ambiguous_threads_problem(dev: str, others: Sequence[str]) -> Problem:
    """What ``kbpctl status`` says of a device whose NAPI threads' name is ambiguous."""
    return Problem(AMBIGUOUS_NAME, ambiguous_threads_message(dev, others, status=True))


def ambiguous_irqs_message(dev: str, irqs: Sequence[int], others: Sequence[str]) -> str:
    """Why a device's queue IRQs found by name are not moved."""
    return (f"{dev} lists no MSI IRQs in sysfs, so its queue IRQs can only be found by name in "
            f"/proc/interrupts (IRQ {', '.join(map(str, irqs))}), and {_where_has(others)} a "
            "device whose IRQs can carry such names; kbpctl does not move another namespace's "
            "IRQs: give the devices names of their own")


# -- the backend ----------------------------------------------------------------------
@dataclass
class _Prep:
    dev: str
    netns: str | None
    link: Link
    napis: list[Napi] | None  # None: this kernel (or emulation) has no napi-get
    record: Record | None
    threads_before: set[int] = field(default_factory=set)


class _Ctx:
    """Per-command caches: netdev sockets and sysfs views per netns."""

    def __init__(self) -> None:
        self.client = NetdevClients()
        self.fs = functools.cache(NetFS)

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def _context() -> Iterator[_Ctx]:
    ctx = _Ctx()
    try:
        yield ctx
    finally:
        ctx.close()


class StockBackend:
    name = NAME

    def __init__(self, state: StateDir | None = None, host: Host = HOST,
                 emulate: str | None = None) -> None:
        self.state = state or StateDir()
        self.host = host
        self.emulate = emulate if emulate is not None else os.environ.get(ENV_FEATURES, "")
        if self.emulate not in ("", "sysfs", "legacy"):
            raise InvalidInput(f"{ENV_FEATURES}={self.emulate!r}: use sysfs or legacy")

    def default_rt_prio(self, mode: str) -> int:
        return default_rt_prio(mode)

    # -- features ------------------------------------------------------------------
    def _features(self, client: NetdevClient) -> NetdevFeatures:
        f = client.features()
        if self.emulate == "legacy":
            return NetdevFeatures()
        if self.emulate == "sysfs":
            return NetdevFeatures(family=f.family, napi_get=f.napi_get)
        return f

    def available(self) -> tuple[bool, str]:
        rel = sysinfo.kernel_release()
        if sysinfo.kernel_version(rel) >= THREADED_SINCE:
            return True, f"Linux {rel} has threaded NAPI"
        return False, f"threaded NAPI needs Linux 5.12 or later (this is {rel})"

    def features(self) -> dict[str, Any]:
        with NetdevClient() as c:
            out: dict[str, Any] = dict(self._features(c).to_json())
        out["sysfs_threaded"] = sysinfo.kernel_version() >= THREADED_SINCE
        out["busy_poll"] = self._busy_supported(out.get("threaded_busy_poll", False))
        if self.emulate:
            out["emulate"] = self.emulate
        return out

    def _busy_supported(self, napi_busy: bool) -> bool:
        return bool(napi_busy) or sysinfo.kernel_version() >= BUSY_POLL_SINCE

    def _effector(self, client: Callable[[str | None], NetdevClient],
                  fs: Callable[[str | None], NetFS]) -> dict[str, Any]:
        """The system's handlers, and the periodic service's (journal kind periodicd)."""
        eff: dict[str, Any] = dict(system_effector(client, fs, self.host))
        eff[periodicd.KIND] = periodicd.ServiceHandler(self.state)
        return eff

    # -- checks --------------------------------------------------------------------
    def _check_static(self, req: EnableRequest) -> None:
        """``req`` resolved (:meth:`EnableRequest.resolved`)."""
        busy = _spins(req.mode)
        spec = modespec.SPECS.get(req.mode)
        if spec is not None and not spec.stock.built:
            raise InvalidInput(f"mode {req.mode} is not available with the {NAME} backend yet")
        if busy and req.rt_prio is not None and req.rt_prio > 0:
            raise InvalidInput(busy_fifo_refusal(req.rt_prio))
        validate_common(req, rt_prio_min=0 if busy else RT_PRIO_MIN)
        if req.cls == names.CLASS_NON_RT and req.linger_us is not None:
            raise InvalidInput(linger_refusal())
        check_nice_capability(req)
        if req.isolate:
            contention.check_isolate(req.cpus, sysinfo.online_cpus(self.host))
        if req.quota is not None:
            raise InvalidInput("--quota is a knob of the kbp module: the stock backend polls "
                               "with the driver's NAPI weight (drop --quota or use "
                               "--backend kmod)")
        if req.freq_ctl:
            raise InvalidInput("--freq-ctl is a knob of the kbp module (--backend kmod); with "
                               "the stock backend use the schedutil governor instead: it runs "
                               "a SCHED_FIFO NAPI thread's CPU at max frequency")
        ok, why = self.available()
        if not ok:
            raise Unavailable(f"{why}: use the kbp module (--backend kmod)")
        if req.cpus is not None:
            sysinfo.validate_cpus(req.cpus, self.host)

    def _check_busy(self, feats: NetdevFeatures, req: EnableRequest) -> None:
        if _threaded_value(req.mode) != THREADED_BUSY_POLL:
            return
        if not self._busy_supported(feats.napi_busy_poll):
            raise Unavailable(
                f"--mode busy needs threaded busy polling (NAPI threaded=2), which is in "
                f"Linux 6.19 and later; this kernel is {sysinfo.kernel_release()}: use "
                f"--mode hybrid, or load the kbp module and use --backend kmod")

    def _prepare(self, ctx: _Ctx, dev: str, netns: str | None,
                 replace_other: bool = False) -> _Prep:
        link, rec = lookup_device(self.state, NAME, dev, netns, replace_other)
        feats = self._features(ctx.client(netns))
        napis: list[Napi] | None = None
        if feats.napi_get:
            napis = ctx.client(netns).napis(link.ifindex)
            has = bool(napis)
        else:
            probe = probe_napi_sysfs(ctx.fs(netns), dev)
            if probe is None:
                raise Unavailable(f"{dev} has no 'threaded' attribute: threaded NAPI needs "
                                  f"Linux 5.12 or later; use the kbp module (--backend kmod)")
            has = probe
        if not has:
            raise InvalidInput(no_napi_message(dev, link, netns))
        if not feats.napi_get:  # threads by name: only when the name is ours alone
            self._check_named_threads(dev, netns)
        before = {t.pid for t in sysinfo.find_napi_threads(dev, self.host)}
        return _Prep(dev, netns, link, napis, rec, before)

    def check(self, req: EnableRequest, replace_other: bool = False) -> None:
        """Every check ``enable`` makes, without changing anything (``replace_other``: a
        device served by the other backend is fine, the caller disables it first)."""
        req = req.resolved(NAME)
        self._check_static(req)
        require_root("kbpctl enable")
        check_netns(req.netns)
        with _context() as ctx:
            self._check_busy(self._features(ctx.client(req.netns)), req)
            for d in req.devices:
                self._prepare(ctx, d, req.netns, replace_other)

    # -- enable --------------------------------------------------------------------
    def enable(self, req: EnableRequest) -> EnableResult:
        req = req.resolved(NAME)
        self._check_static(req)
        require_root("kbpctl enable")
        check_netns(req.netns)
        result = EnableResult(NAME, "")
        with self.state.lock(), _context() as ctx:
            self._check_busy(self._features(ctx.client(req.netns)), req)
            preps = [self._prepare(ctx, d, req.netns) for d in req.devices]
            eff = self._effector(ctx.client, ctx.fs)
            hook = PauseHook()
            started: list[_Prep] = []
            try:
                for p in preps:
                    if p.record is not None and in_place_change(p.record, req):
                        started.append(p)
                        result.devices.append(self._reclass_one(ctx, p, req, eff, hook))
                        continue
                    if p.record is not None:  # reconfigure: back to the original first
                        restore(p.record, eff)
                        remove_record(p.record.path)
                        p = self._prepare(ctx, p.dev, p.netns)
                    started.append(p)
                    result.devices.append(self._enable_one(ctx, p, req, eff, hook))
            except (OSError, KbpctlError, RestoreError, KeyError, ValueError) as e:
                notes = self._rollback(started, eff)
                extra = f" ({'; '.join(notes)})" if notes else ""
                raise OperationFailed(
                    f"enabling {started[-1].dev if started else '?'} failed: {e}; "
                    f"every change was rolled back{extra}") from e
        result.notes = contention_notes(req, result, self.state, self.host)
        return result

    def _enable_one(self, ctx: _Ctx, p: _Prep, req: EnableRequest, eff: Any,
                    hook: Callable[[str], None]) -> DeviceResult:
        feats = self._features(ctx.client(p.netns))
        cpus = req.cpus or sysinfo.online_cpus(self.host)
        settings = req.settings()
        journal = self.state.begin(NAME, p.dev, p.netns, p.link.ifindex, settings)
        ex = Executor(journal, eff, hook)
        changes = 0

        def run(plan: list[Planned]) -> None:
            nonlocal changes
            for step in plan:
                if ex.apply(step.kind, step.key, step.new) is not None:
                    changes += 1

        try:
            # RPS first: the NAPI thread must not hand its packets back to the softirq
            r = rps.read(ctx.fs(p.netns), p.dev, self.host)
            rps_plan = rps_off_plan(r, req)
            run([Planned(KIND_SYSFS, sysfs_key(p.netns, p.dev, p.link.ifindex, attr), v)
                 for attr, v in rps_plan])

            value = _threaded_value(req.mode)
            ids = [n.id for n in p.napis] if (p.napis is not None and feats.napi_threaded) \
                else None
            run(plan_threaded(p.netns, p.dev, p.link.ifindex, ids, value))

            napis, threads = self._wait_threads(ctx, p, feats)
            thread_cpus = assign_cpus(len(threads), cpus)
            nices = thread_nices(req, [os.getpriority(os.PRIO_PROCESS, t.pid)
                                       for t in threads])
            assert req.rt_prio is not None  # resolved by enable()
            run(plan_threads(threads, thread_cpus, req.rt_prio, nices))

            napi_irqs = [n.irq for n in napis] if napis else []
            name_irqs: list[int] = []
            if not napi_irqs or any(i is None for i in napi_irqs):
                name_irqs = self._queue_irqs_by_name(ctx.fs(p.netns), p.dev, p.netns)
            run(plan_irqs(irq_targets(napi_irqs, name_irqs, thread_cpus)))
            if req.isolate:  # the other devices' interrupts off the polling CPUs
                changes += isolate_others(ex, req, thread_cpus, self.state, self.host)

            lids = defer_napi_ids(napis, feats)
            if req.linger_us is not None:
                run(plan_linger(p.netns, p.dev, p.link.ifindex, lids, req.linger_us))
            run(plan_non_rt_defer(p.netns, p.dev, p.link.ifindex, lids, req))
            if modespec.periodic(req.mode):
                assert req.periodic is not None  # resolved
                per = dataclasses.asdict(req.periodic)
                run(plan_periodic(p.netns, p.dev, p.link.ifindex, lids,
                                  periodicd.first_interval(per)))
                if req.periodic.search:  # last: it drives what the steps above journaled
                    started = read_record(journal.path)
                    assert started is not None
                    run([Planned(periodicd.KIND, periodicd.service_key(
                        p.dev, p.netns, p.link.ifindex, started.started), periodicd.RUNNING)])
            journal.done()
        finally:
            journal.close()
        return DeviceResult(p.dev, p.netns, NAME, len(threads), sorted(set(thread_cpus)),
                            changes, rps=r, rps_off=bool(rps_plan))

    def _reclass_one(self, ctx: _Ctx, p: _Prep, req: EnableRequest, eff: Any,
                     hook: Callable[[str], None]) -> DeviceResult:
        """A class (or nice) change of a served device, in place (:func:`in_place_change`):
        the journal is rewritten with the new request and its changes so far (atomically,
        incomplete until done), then each NAPI thread's policy and nice are changed,
        journaled as usual; threaded NAPI, IRQs, CPUs and RPS stay as they are. ``disable``
        replays both, newest first, back to the policy and nice found before the first
        enable."""
        assert p.record is not None and req.rt_prio is not None
        changed = set(changed_settings(p.record.request, req.settings()))
        what = "class" if changed & {"class", "nice"} else "--repoll-us"
        feats = self._features(ctx.client(p.netns))
        cpus = req.cpus or sysinfo.online_cpus(self.host)
        journal = self.state.rebegin(p.record, req.settings())
        ex = Executor(journal, eff, hook)
        try:
            _, threads = self._wait_threads(ctx, p, feats)
            thread_cpus = assign_cpus(len(threads), cpus)
            nices = thread_nices(req, [first_nice(p.record, t) for t in threads])
            changes = sum(ex.apply(s.kind, s.key, s.new) is not None
                          for s in plan_threads(threads, thread_cpus, req.rt_prio, nices))
            changes += sum(ex.apply(s.kind, s.key, s.new) is not None
                           for s in self._reclass_defer(p, req, feats))
            journal.done()
        finally:
            journal.close()
        return DeviceResult(p.dev, p.netns, NAME, len(threads), sorted(set(thread_cpus)),
                            changes, note=f"{what} changed in place")

    def _reclass_defer(self, p: _Prep, req: EnableRequest,
                       feats: NetdevFeatures) -> list[Planned]:
        """The IRQ deferral of a class (or ``--repoll-us``) change in place: class non-rt's
        values, or, back to rt or with ``--repoll-us 0``, each deferral setting as the
        device's first enable found it (the oldest journaled change of that key; none
        journaled: nothing to put back)."""
        assert p.record is not None
        ids = defer_napi_ids(p.napis, feats)
        planned = plan_non_rt_defer(p.netns, p.dev, p.link.ifindex, ids, req)
        if planned:
            return planned
        out = []
        for want in plan_defer(p.netns, p.dev, p.link.ifindex, ids, 0, 0):
            first = next((c for c in p.record.changes
                          if c.kind == want.kind and c.key == want.key), None)
            if first is not None:
                out.append(Planned(want.kind, want.key, first.old))
        return out

    def _wait_threads(self, ctx: _Ctx, p: _Prep, feats: NetdevFeatures,
                      timeout: float = 2.0) -> tuple[list[Napi], list[TaskStat]]:
        """The NAPIs and their kthreads, in NAPI id order, once every thread exists."""
        deadline = time.monotonic() + timeout
        while True:
            if feats.napi_get:
                napis = ctx.client(p.netns).napis(p.link.ifindex)
                stats = [sysinfo.read_stat(n.pid, self.host) if n.pid else None for n in napis]
                if napis and all(stats):
                    return napis, [s for s in stats if s is not None]
            else:
                found = sysinfo.find_napi_threads(p.dev, self.host)
                if found:  # again: a same-named device may have come meanwhile
                    self._check_named_threads(p.dev, p.netns)
                new = [t for t in found if t.pid not in p.threads_before]
                threads = new if new else found
                if threads:
                    return [], sorted(threads, key=_thread_order)
            if time.monotonic() > deadline:
                raise OperationFailed(f"no NAPI thread of {p.dev} appeared after turning "
                                      "threaded NAPI on")
            time.sleep(0.05)

    def _queue_irqs_by_name(self, fs: NetFS, dev: str, netns: str | None) -> list[int]:
        """``dev``'s queue IRQs by their names (among its MSI IRQs, or else among all);
        Unavailable when they were looked for among all and another namespace has a device
        whose IRQs can carry such names."""
        msi = fs.msi_irqs(dev)
        irqs = [q.irq for q in sysinfo.device_irqs(dev, msi or None, self.host)]
        others = same_named_elsewhere(dev, netns, self.host, sysinfo.irq_names_collide) \
            if irqs and not msi else []
        if others:  # any IRQ's name: each may be the other device's
            raise Unavailable(ambiguous_irqs_message(dev, irqs, others))
        return irqs

    def _check_named_threads(self, dev: str, netns: str | None) -> None:
        """Refuse (Unavailable) when another namespace has a device whose NAPI threads'
        names are taken for ``dev``'s."""
        others = same_named_elsewhere(dev, netns, self.host)
        if others:
            raise Unavailable(ambiguous_threads_message(dev, others))

    def _rollback(self, preps: list[_Prep], eff: Any) -> list[str]:
        notes = []
        for p in reversed(preps):
            rec = self.state.record(p.dev, p.netns)
            if rec is None:
                continue
            try:
                restore(rec, eff)
                remove_record(rec.path)
            except RestoreError as e:
                notes.append(f"{p.dev}: restore incomplete, journal kept: {e}")
        return notes

    # -- disable -------------------------------------------------------------------
    def disable(self, devices: Sequence[str] | None = None,
                netns: str | None = None) -> DisableResult:
        require_root("kbpctl disable")
        result = DisableResult()
        with self.state.lock(), _context() as ctx:
            recs = [r for r in self.state.records() if r.backend == NAME]
            if devices is not None:
                recs = [r for r in recs if r.dev in devices and r.netns == netns]
            eff = self._effector(netns_gone(ctx.client), netns_gone(ctx.fs))
            errors = []
            for rec in recs:
                try:
                    notes = restore(rec, eff)
                except RestoreError as e:
                    errors.append(f"{rec.dev}: {e} (journal kept in {rec.path}; "
                                  "run disable again)")
                    continue
                remove_record(rec.path)
                result.notes += [f"{rec.dev}: {n}" for n in notes]
                result.devices.append(DeviceResult(rec.dev, rec.netns, NAME, 0, [],
                                                   len(rec.changes)))
            if errors:
                raise OperationFailed("; ".join(errors))
        return result

    # -- status --------------------------------------------------------------------
    def describe(self, netns: str | None, devices: Sequence[str] | None,
                 records: Sequence[Record], exclude: set[tuple[str, str | None]] | None = None,
                 ) -> tuple[list[DeviceStatus], list[PollerStatus]]:
        exclude = exclude or set()
        wanted: dict[tuple[str, str | None], Record | None] = {}
        for r in records:
            if devices is None or (r.dev in devices and r.netns == netns):
                wanted[(r.dev, r.netns)] = r
        out = []
        with _context() as ctx:
            client = netns_gone(ctx.client)
            if devices is not None:
                for d in devices:
                    wanted.setdefault((d, netns), None)
            else:
                with contextlib.suppress(KbpctlError, OSError):
                    feats = self._features(ctx.client(netns))
                    if feats.napi_get:
                        idx = {n.ifindex for n in ctx.client(netns).napis()}
                        for lk in list_links(netns):
                            if lk.ifindex in idx:
                                wanted.setdefault((lk.name, netns), None)
            for (dev, ns), rec in sorted(wanted.items(), key=lambda kv: (kv[0][1] or "",
                                                                          kv[0][0])):
                if (dev, ns) in exclude:
                    continue
                try:
                    out.append(self._describe_one(ctx, client, dev, ns, rec))
                except PermissionError:
                    out.append(self._describe_unprivileged(dev, ns, rec))
        return out, []

    def _describe_one(self, ctx: _Ctx, client: Callable[[str | None], NetdevClient], dev: str,
                      ns: str | None, rec: Record | None) -> DeviceStatus:
        req = rec.request if rec else {}
        ds = DeviceStatus(name=dev, netns=ns, ifindex=None, kind=None,
                          backend=NAME if rec else None, mode=req.get("mode"),
                          linger_us=req.get("linger_us"), rt_prio=req.get("rt_prio"),
                          cpus=req.get("cpus"), complete=rec.complete if rec else True,
                          managed=rec is not None)
        try:
            link = get_link(dev, ns)
        except KbpctlError:
            link = None
        if link is None:
            if rec:
                ds.problems.append(Problem(DEVICE_GONE, f"{dev} is gone: 'kbpctl disable "
                                           f"{dev}' restores the rest and forgets it"))
            else:
                ds.problems.append(Problem(DEVICE_GONE, f"no device {dev}"))
            return ds
        ds.ifindex, ds.kind = link.ifindex, link.kind
        ds.counters = {"packets": link.rx_packets, "polls": None}
        r = read_rps(ctx.fs, dev, ns, self.host)
        feats = self._features(client(ns))
        napis: list[Napi] = client(ns).napis(link.ifindex) if feats.napi_get else []
        if napis:
            for n in napis:
                ns_ = NapiStatus(id=n.id, irq=n.irq, threaded=n.threaded,
                                 defer_hard_irqs=n.defer_hard_irqs,
                                 gro_flush_timeout_ns=n.gro_flush_timeout,
                                 counters={"packets": None, "polls": None})
                if n.pid:
                    ns_.thread = thread_status(n.pid, self.host)
                ds.napis.append(ns_)
        else:
            threads, said = self._threads_by_name(dev, ns, rec)
            ds.problems += said
            for t in sorted(threads, key=_thread_order):
                ds.napis.append(NapiStatus(id=_thread_napi_id(t), thread=thread_status(
                    t.pid, self.host), counters={"packets": None, "polls": None}))
            with contextlib.suppress(KbpctlError, OSError):
                thr = ctx.fs(ns).read(dev, "threaded")
                for st in ds.napis:
                    st.threaded = int(thr) if thr is not None else None
        for i, st in enumerate(ds.napis):
            st.index = i
            if st.thread and len(st.thread.cpus) == 1:
                st.cpu = st.thread.cpus[0]
            if st.irq is not None:
                with contextlib.suppress(OSError):
                    st.irq_affinity = sysinfo.read_irq_affinity(st.irq, self.host)
        if rec:
            ds.cpus = sorted({n.cpu for n in ds.napis if n.cpu is not None}) or ds.cpus
            ds.problems += self._problems(rec, ds)
            self._describe_periodic(ds, rec)
        show_rps(ds, r, rec.request if rec else None, rec.complete if rec else True)
        return ds

    def _threads_by_name(self, dev: str, ns: str | None, rec: Record | None
                         ) -> tuple[list[TaskStat], list[Problem]]:
        """The NAPI threads of ``dev`` on a kernel without napi-get: those whose scheduling
        ``enable`` journaled for a device kbp serves; else those found by name, none when
        another namespace's same-named device makes the name ambiguous (a problem says so)."""
        mine = {(c.key.get("pid"), c.key.get("starttime")) for c in rec.changes
                if c.kind in (KIND_SCHED, KIND_AFFINITY)} if rec is not None else set()
        if mine:  # (enable changed nothing of a thread already as asked: by name, then)
            return [t for t in sysinfo.find_napi_threads(dev, self.host)
                    if (t.pid, t.starttime) in mine], []
        threads, others = napi_threads_by_name(dev, ns, self.host)
        if not others:
            return threads, []
        return [], [ambiguous_threads_problem(dev, others)]

    def _describe_unprivileged(self, dev: str, ns: str | None, rec: Record | None
                               ) -> DeviceStatus:
        req = rec.request if rec else {}
        ds = DeviceStatus(name=dev, netns=ns, ifindex=rec.ifindex if rec else None, kind=None,
                          backend=NAME if rec else None, mode=req.get("mode"),
                          linger_us=req.get("linger_us"), rt_prio=req.get("rt_prio"),
                          cpus=req.get("cpus"), complete=rec.complete if rec else True,
                          managed=rec is not None,
                          keep_rps=bool(req.get("keep_rps", False)) if rec else None)
        ds.problems.append(Problem(NEEDS_ROOT, f"looking into netns {ns} needs root: run "
                                   "'sudo kbpctl status' for its NAPIs and threads"))
        if rec:
            self._describe_periodic(ds, rec)
        return ds

    def _describe_periodic(self, ds: DeviceStatus, rec: Record) -> None:
        """Mode periodic: the interval, and the service's search state (or why it stopped)."""
        if not modespec.periodic(rec.request.get("mode")):
            return
        ds.periodic, problems = periodicd.describe(self.state.root, rec)
        ds.problems += problems

    def _problems(self, rec: Record, ds: DeviceStatus) -> list[Problem]:
        if not rec.complete:
            return [Problem(INTERRUPTED, f"enable was interrupted after {rec.steps} change(s): "
                            f"'kbpctl disable {ds.name}' restores, 'kbpctl enable' or 'kbpctl "
                            "apply' redoes it")]
        mode = rec.request.get("mode") or names.MODE_HYBRID
        want = _threaded_value(mode)
        prio = rec.request.get("rt_prio")
        policy, priority = thread_sched(prio if prio is not None else default_rt_prio(mode))
        non_rt = journaled_class(rec.request) == names.CLASS_NON_RT
        nice = (rec.request.get("nice") or 0) if non_rt else None
        out = []
        if not ds.napis:
            out.append(Problem(NO_NAPI, f"{ds.name} has no NAPI now: enable it again (kbpctl "
                               "apply)"))
        for n in ds.napis:
            if n.threaded is not None and n.threaded != want:
                out.append(Problem(NOT_THREADED, f"NAPI {n.id} is not threaded (the driver "
                                   "re-created its NAPIs?): run 'kbpctl apply' or enable again"))
            elif n.thread is None:
                out.append(Problem(NO_THREAD, f"NAPI {n.id} has no thread: run 'kbpctl apply' "
                                   "or enable again"))
            elif (n.thread.policy, n.thread.priority) != (policy, priority):
                out.append(Problem(SCHED_DRIFT, f"NAPI {n.id} thread {n.thread.pid} runs "
                                   f"{n.thread.policy}/{n.thread.priority}, not "
                                   f"{policy}/{priority}: run 'kbpctl apply' or enable again"))
            elif nice is not None and n.thread.nice is not None and n.thread.nice != nice:
                out.append(Problem(SCHED_DRIFT, f"NAPI {n.id} thread {n.thread.pid} (class "
                                   f"non-rt) runs at nice {n.thread.nice}, not {nice}: run "
                                   "'kbpctl apply' or enable again"))
        return out


def _thread_napi_id(t: TaskStat) -> int | None:
    """The NAPI id in a ``napi/<dev>-<id>`` name (None when the name may be truncated)."""
    head, _, tail = t.comm.rpartition("-")
    if not head or not tail.isdigit() or len(t.comm) == sysinfo.TASK_COMM_LEN - 1:
        return None
    return int(tail)


def _thread_order(t: TaskStat) -> tuple[int, int]:
    nid = _thread_napi_id(t)
    return (nid if nid is not None else 1 << 30, t.pid)


def thread_status(pid: int, host: Host = HOST) -> ThreadStatus | None:
    st = sysinfo.read_stat(pid, host)
    if st is None:
        return None
    try:
        s = sysinfo.get_sched(pid)
    except (ProcessLookupError, PermissionError):
        return None
    c = sysinfo.task_counters(pid, host)
    counters: dict[str, int | None] = dict.fromkeys(names.POLLER_COUNTERS)
    counters["poll_ns"] = c.poll_ns
    counters["sleeps"] = c.sleeps
    return ThreadStatus(pid=pid, comm=st.comm, cpus=s.cpus, last_cpu=st.last_cpu,
                        policy=s.policy, priority=s.priority, counters=counters, nice=s.nice)

