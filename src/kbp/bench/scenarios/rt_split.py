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
``stock-kbp``  the kbp RT class on this host (kbpctl stock backend: RT device off RPS, its
               NAPI polled by a SCHED_FIFO kthread on the RT CPU; the heavy flow stays on the
               RT CPU's backlog); ``hybrid`` / ``busy`` are kbp.ko's, in the VM rig
``<kbp mode>-excl``  the kbp mode and the exclusive CPU together (kbpctl enable --isolate's
               placement, the heavy receiver moved too)
``<kbp mode>-part``  the outsourcing paper's own method, RT and non-RT receive work split by
               priority on the *same* CPU (``stock-kbp-part``, ``hybrid-part``,
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
hybrid and busy run there): on kernels before 6.15 the runner refuses threaded / stock-kbp
and the module modes in one ``--nic-pair`` run (a NAPI keeps its kthread), so pass
``--modes napi,exclusive,hybrid,busy`` there and the others in a second invocation.

Parts: ``rtt`` with the loads ``--loads`` names: ``on`` (condition ``tcp``, the paper's
situation; the presets run only this) and ``off`` (``idle``: the RT flow alone, a baseline).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kbp import names
from kbp.bench import netstats, plots, report, steer, workloads
from kbp.bench import parts as pt
from kbp.bench import placement as pl
from kbp.bench.knobs import KnobError
from kbp.bench.modes import (
    AppEnv,
    AppPlace,
    Target,
    _Defaults,
    require_softirq_napi,
    thread_placement,
)
from kbp.bench.stats import aggregate, ratios_to_baseline

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig

EXCLUSIVE = "exclusive"
KBP_MODES = (names.BENCH_STOCK_KBP, names.MODE_HYBRID, names.MODE_BUSY)
LOADS = {"off": "idle", "on": "tcp"}
CONDITIONS: dict[str, str] = {
    "tcp": "RT flow with the TCP heavy sender, both server devices' receive processing on "
           "the RT CPU (the paper's situation)",
    "idle": "RT flow alone, its receive processing on the RT CPU (baseline)",
}
PAPER_UNIFORM_US = (1000.0, 10000.0)        # Sect. IV-A: random gaps of 1 to 10 ms
EXCL_SUFFIX = "-excl"
#: the kbp modes combined with the exclusive CPU (kbpctl enable --isolate's placement plus the
#: heavy receiver moved): "stock-kbp-excl", "hybrid-excl", "busy-excl"
KBP_EXCL_MODES = tuple(m + EXCL_SUFFIX for m in KBP_MODES)
ORDER = (names.BENCH_NAPI, names.BENCH_THREADED, EXCLUSIVE, *KBP_MODES, *KBP_EXCL_MODES,
         names.BENCH_STOCK_KBP_PART, names.BENCH_HYBRID_PART, names.BENCH_BUSY_PART)


#: the part modes (the outsourcing paper's RT/non-RT split by priority on the RT CPU itself):
#: {part mode: the kbp mode that serves the RT device}; the heavy device goes to the same
#: backend's non-rt class on the same CPU
PART_MODES: dict[str, str] = {names.BENCH_STOCK_KBP_PART: names.BENCH_STOCK_KBP,
                              names.BENCH_HYBRID_PART: names.MODE_HYBRID,
                              names.BENCH_BUSY_PART: names.MODE_BUSY}


def part_like(mode: str) -> bool:
    """The mode splits the RT CPU by class: RT device on its RT poller, heavy device on the
    same CPU's non-rt poller (or SCHED_OTHER NAPI thread)."""
    return mode in PART_MODES


def exclusive_like(mode: str) -> bool:
    """The mode puts the heavy flow on the non-RT CPU (exclusive, or a kbp mode with it)."""
    return mode == EXCLUSIVE or mode in KBP_EXCL_MODES
# Table 3 of the paper (µs: mean, p99, SD) and Fig. 7's throughput, by the mode standing in
PAPER_TABLE3: dict[str, tuple[str, float, float, float]] = {
    names.BENCH_NAPI: ("(non-RT) vanilla Linux", 92.5, 225.0, 29.2),
    names.BENCH_THREADED: ("threaded interrupt handling", 100.8, 202.9, 29.0),
    EXCLUSIVE: ("exclusive CPU", 70.5, 96.0, 11.8),
    "kbp": ("outsourcing (the paper's RT class)", 32.9, 46.8, 4.3),
}
HEAVY_LINK = "heavy"
PER_MODE_TITLE = ("Headline: RT response time with the TCP heavy sender and the heavy flow's "
                  "throughput, per mode (the README's table)")
STEER_SHARE = 0.5     # steering_check: this share of the heavy flow's packets where it belongs
RUN_OVERHEAD_S = 0.3  # per run: the probes, exclusive's moves


class RtSplitError(RuntimeError):
    pass


# -- the heavy receiver's side, and the exclusive CPU mode --------------------------------
@dataclass
class HeavySide:
    """The heavy receiver and its device's receive processing: where they run now, and the
    move ``exclusive`` makes (RPS mask of the device, affinity of every iperf3 thread)."""

    netns: str
    dev: str
    rt_cpu: int
    nonrt_cpu: int
    flood: workloads.Flood
    cpu_now: int = -1

    def receiver_pids(self) -> list[int]:
        srv = self.flood.server
        if srv is None:
            return []
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{srv.pid}/task"))
        except OSError:
            return [srv.pid]

    def receiver_cpus(self) -> list[int]:
        """The CPUs the heavy receiver may run on now (its main thread's affinity)."""
        pids = self.receiver_pids()
        with contextlib.suppress(OSError):
            return sorted(os.sched_getaffinity(pids[0])) if pids else []
        return []

    def place(self, cpu: int) -> None:
        """The heavy device's RPS and the heavy receiver onto ``cpu`` (KnobError when the
        mask does not stick)."""
        rx = steer.read_rps(self.netns, self.dev)
        steer.write_rps(self.netns, self.dev, dict.fromkeys(rx, steer.cpu_mask(cpu)))
        got = steer.rps_cpus(steer.read_rps(self.netns, self.dev))
        if got != [cpu]:
            raise KnobError(f"{self.dev}: RPS to CPU {cpu} did not stick (reads {got})")
        for tid in self.receiver_pids():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, {cpu})
        self.cpu_now = cpu


@dataclass
class ExclusiveMode(_Defaults):
    """``exclusive``: the exclusive CPU method.  The RT device is plain napi (as ``napi``);
    while the mode is on the heavy receiver and its device's RPS are on the non-RT CPU, and
    teardown puts both back on the RT CPU.  Bound to the run's heavy side by the scenario."""

    name: str = EXCLUSIVE
    base: str = names.BENCH_NAPI    # the mode it is without the move (idle_problem)
    spins: bool = False
    moves_load: bool = True         # the runner lets the moved load settle after it
    heavy: HeavySide | None = None
    target: Target | None = None
    _moved: bool = False

    def unavailable(self) -> str | None:
        return None

    def setup(self, t: Target) -> None:
        self.target = t
        require_softirq_napi(t, self.name, RtSplitError)
        self.move_out()

    def idle_problem(self) -> str | None:
        """Why the idle part cannot run this mode: nothing to move before the heavy flow."""
        return None if self.heavy is not None else (
            f"{self.name} moves the heavy flow, which does not exist in the idle part: "
            f"its idle cost is {self.base}'s")

    def teardown(self) -> None:
        self.target = None
        self.move_back()

    def require_heavy(self) -> HeavySide:
        """The bound heavy side, or RtSplitError outside the scenarios that bind one."""
        if self.heavy is None:
            raise RtSplitError(f"mode {self.name} runs only in the rt-split and shared-cpu "
                               "scenarios (no heavy receiver to move)")
        return self.heavy

    def move_out(self) -> None:
        """The heavy receiver and its device's RPS to the non-RT CPU (the exclusive CPU)."""
        heavy = self.require_heavy()
        self._moved = True
        heavy.place(heavy.nonrt_cpu)

    def move_back(self) -> None:
        """Undo :meth:`move_out` (nothing when it did not run)."""
        if self._moved and self.heavy is not None:
            self._moved = False
            self.heavy.place(self.heavy.rt_cpu)

    def threads(self) -> dict[int, str]:
        return {}

    def counters(self) -> dict[str, int | None]:
        return {}

    def describe(self) -> dict[str, Any]:
        h = self.heavy
        return {"how": "RT device on stock NAPI (RPS to the RT CPU); the heavy receiver and "
                       "its device's RPS on the non-RT CPU while on",
                "rt_cpu": h.rt_cpu if h else None, "nonrt_cpu": h.nonrt_cpu if h else None,
                "heavy_receiver_cpus": h.receiver_cpus() if h else None}


class _Wrapper:
    """A mode made of an inner kbp mode plus something around it (a placement move, a
    heavy device's class): what the RT flow sees is the inner mode's."""

    inner: Any

    def unavailable(self) -> str | None:
        return self.inner.unavailable()

    def app_place(self, home: AppPlace, env: AppEnv) -> AppPlace:
        return self.inner.app_place(home, env)

    def app(self) -> str:
        return self.inner.app()

    def needs_fresh_device(self, t: Target) -> bool:
        return bool(self.inner.needs_fresh_device(t))

    def threads(self) -> dict[int, str]:
        """The inner mode's threads (what serves the RT device)."""
        return dict(self.inner.threads())


class KbpExclusiveMode(_Wrapper):
    """``<kbp mode>-excl``: a kbp mode (the RT device on the poller) *and* the exclusive CPU
    (the heavy receiver and its device's RPS on the non-RT CPU): what an operator gets with
    ``kbpctl enable --isolate`` plus the heavy application placed elsewhere. Everything but
    the move is the inner mode's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name + EXCL_SUFFIX
        self.spins = inner.spins
        self.moves_load = True
        self.excl = ExclusiveMode(name=self.name, base=inner.name)

    @property
    def heavy(self) -> HeavySide | None:
        return self.excl.heavy

    @heavy.setter
    def heavy(self, h: HeavySide | None) -> None:
        self.excl.heavy = h

    def idle_problem(self) -> str | None:
        return self.excl.idle_problem()

    def setup(self, t: Target) -> None:
        self.excl.require_heavy()  # refuse before the inner mode changes anything
        self.inner.setup(t)
        self.excl.move_out()

    def teardown(self) -> None:
        try:
            self.excl.move_back()
        finally:
            self.inner.teardown()

    def counters(self) -> dict[str, int | None]:
        return dict(self.inner.counters())

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "exclusive": self.excl.describe()}


# -- the part modes: RT and non-RT receive work split by class on the RT CPU ---------------
def nonrt_request(backend: str, dev: str, netns: str | None, cpu: int | None) -> Any:
    """The kbpctl EnableRequest for the heavy device in a part mode: class non-rt, mode
    hybrid (that class's only mode), on the RT CPU itself (``cpu``; no placement move).
    Priority: the class's own (``EnableRequest.resolved``: SCHED_NORMAL at nice 0)."""
    return _backends().EnableRequest([dev], netns=netns, mode=names.MODE_HYBRID,
                                     cpus=None if cpu is None else [cpu],
                                     cls=names.CLASS_NON_RT)


def _backends() -> Any:
    from kbp.bench.modes import _backends as get
    return get()


def nonrt_refusal(backend: str) -> str | None:
    """Why kbpctl's ``backend`` cannot serve a device in class non-rt here (its static
    checks on a placeholder device, nothing changed), None when it can."""
    be = _backends().get(backend)
    check = getattr(be, "_check_static", None)
    if check is None:
        return None
    try:
        check(nonrt_request(backend, "lo", None, None).resolved(backend))
    except Exception as e:
        return f"kbpctl {backend} backend refuses --class {names.CLASS_NON_RT}: {e}"
    return None


class PartMode(_Wrapper):
    """``<kbp mode>-part``: the outsourcing paper's split by priority on the RT CPU itself.
    The RT device on the inner kbp mode (its RT poller, class rt); the heavy device, given a
    per-packet NAPI (:func:`kbp.bench.parts.napi_per_packet`), in the same backend's class
    non-rt on the same CPU (kbp.ko: the CPU's non-rt poller, SCHED_NORMAL, which gives way to
    the RT poller between polls; stock: its NAPI thread SCHED_OTHER there).  Nothing moves:
    the heavy receiver stays on the RT CPU.  Bound to the run's heavy side by the scenario."""

    def __init__(self, name: str, inner: Any) -> None:
        self.inner = inner
        self.name = name
        self.spins = inner.spins
        self.backend: str = inner.backend
        self.moves_load = False
        self.heavy: HeavySide | None = None
        self.request_made: Any = None          # the heavy device's EnableRequest while on
        self._before: dict[str, Any] | None = None   # the heavy device's GRO before setup
        self._napi: dict[str, Any] | None = None
        self._enabled = False
        self._nonrt: dict[int, str] = {}

    def unavailable(self) -> str | None:
        why = super().unavailable()
        if why:
            return why
        try:
            return nonrt_refusal(self.backend)
        except Exception as e:
            return f"{self.backend} backend: {e}"

    def idle_problem(self) -> str | None:
        return None if self.heavy is not None else (
            f"{self.name} puts the heavy device in the RT CPU's non-rt class, and the heavy "
            f"device does not exist in the idle part: its idle cost is {self.inner.name}'s")

    def require_heavy(self) -> HeavySide:
        if self.heavy is None:
            raise RtSplitError(f"mode {self.name} runs only in the rt-split and shared-cpu "
                               "scenarios (no heavy device to put in class non-rt)")
        return self.heavy

    def heavy_request(self) -> Any:
        """The EnableRequest this mode makes for the heavy device (on the RT CPU)."""
        h = self.require_heavy()
        return nonrt_request(self.backend, h.dev, h.netns, h.rt_cpu)

    def setup(self, t: Target) -> None:
        h = self.require_heavy()        # refuse before the inner mode changes anything
        if h.rt_cpu != t.cpu:
            raise RtSplitError(f"{self.name}: the heavy device's CPU {h.rt_cpu} is not the "
                               f"RT CPU {t.cpu}")
        self.inner.setup(t)
        self._before = pt.napi_state(h.netns, h.dev)
        self._napi = pt.napi_per_packet(h.netns, h.dev)
        self.request_made = self.heavy_request()
        self._enabled = True              # a half-done enable is journaled: always disable
        _backends().get(self.backend).enable(self.request_made)
        from kbp.backends import probe
        self._nonrt = probe.poller_threads(self.backend, h.dev, h.netns, h.rt_cpu)
        self.verify()

    def verify(self) -> None:
        """The stock backend's non-rt class as asked: the heavy device's NAPI threads
        SCHED_OTHER on the RT CPU (a backend that ignored the class would run them FIFO:
        the run would then measure something else, so it stops here)."""
        if self.backend != names.BACKEND_STOCK:
            return
        h = self.require_heavy()
        got = [thread_placement(pid) for pid in self._nonrt]
        bad = [g for g in got if not g.get("gone") and (g["policy"] != "SCHED_OTHER"
                                                        or g["cpus"] != [h.rt_cpu])]
        if not got or bad:
            raise RtSplitError(f"{self.name}: after kbpctl enable --class non-rt the heavy "
                               f"device {h.dev}'s NAPI threads should be SCHED_OTHER on the "
                               f"RT CPU {h.rt_cpu}; found {got or 'none'}")

    def teardown(self) -> None:
        h = self.heavy
        try:
            if self._enabled and h is not None:
                try:
                    _backends().get(self.backend).disable([h.dev], h.netns)
                finally:
                    self._enabled = False
                    self._nonrt = {}
        finally:
            try:
                before, self._before, self._napi = self._before, None, None
                if before is not None and h is not None:
                    try:
                        pt.napi_restore(h.netns, h.dev, before)
                    except RuntimeError as e:
                        raise KnobError(str(e)) from e
            finally:
                self.request_made = None
                self.inner.teardown()

    def counters(self) -> dict[str, int | None]:
        """The RT poller's counters, and the non-rt class's as ``nonrt_<counter>``."""
        h = self.heavy
        if h is None:
            return dict(self.inner.counters())
        from kbp.backends import probe
        if self.backend != names.BACKEND_KMOD:
            nonrt = probe.poller_counters(self.backend, self._nonrt, [h.rt_cpu])
            return {**self.inner.counters(), **{f"nonrt_{k}": v for k, v in nonrt.items()}}
        from kbp import kmod
        out: dict[str, int | None] = {}
        with kmod.Client() as c:          # the CPU's two pollers, apart by class
            for p in c.pollers():
                if p.cpu != h.rt_cpu:
                    continue
                pre = "nonrt_" if p.cls == names.CLASS_NON_RT else ""
                for k, v in p.counters().items():
                    if k in names.POLLER_COUNTERS and v is not None:
                        out[pre + k] = int(out.get(pre + k) or 0) + int(v)
        return out

    def describe(self) -> dict[str, Any]:
        h, req = self.heavy, self.request_made
        return {**self.inner.describe(),
                "part": {"how": f"the heavy device in kbpctl {self.backend} backend's class "
                                f"{names.CLASS_NON_RT} on the RT CPU (mode hybrid), the RT "
                                "device on the RT poller; nothing moved",
                         "heavy_dev": h.dev if h else None,
                         "request": None if req is None else {
                             "mode": req.mode, "cls": req.cls, "cpus": req.cpus,
                             "rt_prio": req.rt_prio, "nice": req.nice},
                         "heavy_napi": self._napi,
                         "heavy_receiver_cpus": h.receiver_cpus() if h else None,
                         "nonrt_threads": [thread_placement(p) for p in self._nonrt]}}


def nonrt_cpu(place: pl.Placement) -> int:
    """The exclusive CPU method's non-RT CPU: a usable CPU no role uses, else one only the
    harness uses, else the flood sender's (never the RT CPU)."""
    used = set(place.cpus.values())
    free = [c for c in place.available if c not in used]
    if free:
        return free[0]
    harness = [c for c in place.available if place.roles_on(c) == [pl.HARNESS]]
    if harness:
        return harness[0]
    return place.cpu(pl.FLOOD)


#: the exclusive CPU modes, which rt-split and shared-cpu offer (their ``own_modes``)
EXCLUSIVE_MODES_DOC: dict[str, str] = {
    EXCLUSIVE: "rt-split and shared-cpu only: the exclusive CPU method (RT device on napi; "
               "the heavy receiver and its RPS on the non-RT CPU)",
    **{m + EXCL_SUFFIX: f"rt-split and shared-cpu only: {m} and the exclusive CPU together "
                        "(kbpctl enable --isolate's placement, the heavy receiver moved too)"
       for m in KBP_MODES}}


#: the part modes, which rt-split and shared-cpu offer beside the exclusive CPU modes
PART_MODES_DOC: dict[str, str] = {
    m: f"rt-split and shared-cpu only: {inner} on the RT device and the heavy device in the "
       f"same backend's class non-rt on the RT CPU itself (the outsourcing paper's RT/non-RT "
       "split by priority; nothing moved)" for m, inner in PART_MODES.items()}
#: a scenario's own modes: the exclusive CPU modes (the yardstick) and the part modes
OWN_MODES_DOC: dict[str, str] = {**EXCLUSIVE_MODES_DOC, **PART_MODES_DOC}


def make_own_modes() -> dict[str, Any]:
    """Fresh objects of rt-split's and shared-cpu's own modes: the exclusive CPU modes and
    the part modes, unbound until :func:`bind_heavy`."""
    from kbp.bench.modes import all_modes
    base = all_modes()
    return {**make_exclusive_modes(),
            **{m: PartMode(m, base[inner]) for m, inner in PART_MODES.items()}}


def make_exclusive_modes() -> dict[str, Any]:
    """Fresh objects of the exclusive CPU modes (a scenario's ``make_modes``), unbound until
    :func:`bind_heavy`."""
    from kbp.bench.modes import all_modes
    base = all_modes()
    return {EXCLUSIVE: ExclusiveMode(),
            **{m + EXCL_SUFFIX: KbpExclusiveMode(base[m]) for m in KBP_MODES}}


def bind_heavy(bench: Bench, heavy: HeavySide) -> None:
    """Tell the run's exclusive CPU modes which heavy receiver and device they move, and the
    part modes which heavy device they put in class non-rt."""
    for m in (EXCLUSIVE, *KBP_EXCL_MODES, *PART_MODES):
        mode = bench.modes.get(m)
        if isinstance(mode, ExclusiveMode | KbpExclusiveMode | PartMode):
            mode.heavy = heavy


# -- the scenario ---------------------------------------------------------------------------
class RtSplit:
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
    default_modes: tuple[str, ...] = (names.BENCH_NAPI, names.BENCH_THREADED, EXCLUSIVE,
                                      *KBP_MODES, *KBP_EXCL_MODES, *PART_MODES)
    default_parts: tuple[str, ...] = (pt.RTT,)
    own_modes: ClassVar[dict[str, str]] = OWN_MODES_DOC
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"loads": ["on"], "parts": [pt.RTT], "duration": 10.0},
        "demo": {"loads": ["on"], "parts": [pt.RTT], "duration": 4.0, "reps": 3},
        "smoke": {"loads": ["on"], "parts": [pt.RTT], "duration": 2.0,
                  "modes": [names.BENCH_NAPI, EXCLUSIVE, names.BENCH_STOCK_KBP]},
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

    def make_modes(self) -> dict[str, Any]:
        return make_own_modes()

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
        rt_cpu, other = place.cpu(pl.RT), nonrt_cpu(place)
        rt, hv = tb.link("rt"), tb.link(HEAVY_LINK)
        nic = rt.kind == "nic"
        shaping = pt.per_packet(hv)
        steering = steer.Steering(tb.server, [hv.dev_b] if nic else [rt.dev_b, hv.dev_b],
                                  rt_cpu)
        tb.defer(steering.undo)
        steering.apply()
        if not nic:
            bench.rt_link_hooks.append(lambda: steering.apply([rt.dev_b]))
        load = workloads.Flood(tb.client, tb.server, hv.ip_b, hv.dev_b,
                               sender_cpu=place.cpu(pl.FLOOD), receiver_cpu=place.cpu(pl.HEAVY),
                               length=cfg.tcp_len, proto="tcp", port=workloads.IPERF_PORT)
        load.start_server()
        tb.defer(load.stop_server)
        tb.defer(load.stop)
        heavy = HeavySide(tb.server, hv.dev_b, rt_cpu, other, load, cpu_now=rt_cpu)
        bind_heavy(bench, heavy)
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
        irqs = tuple((bench.results.get("nic_pair") or {}).get("irqs", {}).get(rt.dev_b, ()))
        bench.probes.append(_probe(steering, heavy, irqs))
        patient = pt.Patient(load)
        for rep in range(cfg.reps):
            loads = cfg.loads if rep % 2 == 0 else list(reversed(cfg.loads))
            for cond in loads:
                pt.latency_block(bench, rep, LOADS[cond],
                                 load=patient if cond == "on" else None,
                                 load_name="TCP heavy sender")

    # -- summary and report -------------------------------------------------------------
    def summarize(self, results: dict[str, Any]) -> dict[str, Any]:
        summ = report.summarize(results)
        runs = [r for r in results.get("runs") or [] if r.get("part") == pt.RTT]
        summ["split"] = split_summary(runs, report.placement_of(results))
        summ["steering_check"] = steering_check(runs)
        summ["per_mode"] = {"condition": LOADS["on"], "idle_condition": LOADS["off"],
                            "modes": report.per_mode(summ, results.get("tails") or {},
                                                     LOADS["on"], idle=LOADS["off"])}
        return summ

    def render(self, results: dict[str, Any]) -> str:
        summ = results.get("summary") or {}
        split = summ.get("split") or {}
        rs = results.get("rt_split") or {}
        place = report.placement_of(results)
        cfg = results.get("config") or {}
        out = [f"RT app: {_app_words(results)}. RT flow: {report.arrival_words(cfg)}, "
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

    def plots(self, results: dict[str, Any], samples: dict[str, list[int]], out: Path,
              ) -> list[Path]:
        return plots.standard(results, samples, out, CONDITIONS)


def heavy_counters(heavy: HeavySide) -> dict[str, int] | None:
    """The heavy device's receive counters, read through the receiver's /proc (no child
    process), else with ip."""
    pids = heavy.receiver_pids()
    got = netstats.proc_net_dev(pids[0], heavy.dev) if pids else None
    if got is not None:
        return got
    st = (netstats.link_stats(heavy.netns, heavy.dev).get("rx") or {})
    if "bytes" not in st:
        return None
    return {"bytes": int(st["bytes"]), "packets": int(st.get("packets") or 0),
            "dropped": int(st.get("dropped") or 0)}


def heavy_rate(c0: dict[str, int] | None, c1: dict[str, int] | None, wall: float,
               ) -> dict[str, Any]:
    """The heavy device's receive counters over a run's window (``heavy_counters`` at its
    start and end, ``wall`` seconds apart): bytes, packets, Gbit/s (L2 bytes at the device)
    and packets/s; only the window when a read failed."""
    wall = max(wall, 1e-9)
    h: dict[str, Any] = {"wall_s": wall}
    if c0 is not None and c1 is not None:
        h["rx_bytes"] = c1["bytes"] - c0["bytes"]
        h["rx_packets"] = c1["packets"] - c0["packets"]
        h["gbit_s"] = 8 * h["rx_bytes"] / wall / 1e9
        h["rx_pps"] = h["rx_packets"] / wall
    return h


def _probe(steering: steer.Steering, heavy: HeavySide, irqs: tuple[int, ...] = ()) -> Any:
    """Around each latency run: receive work on the RT and the non-RT CPU, the heavy
    receiver's bytes and packets, where it runs, the RPS masks in force."""
    def begin() -> Any:
        rx = steer.CpuRx(heavy.rt_cpu, irqs=irqs)
        rx2 = steer.CpuRx(heavy.nonrt_cpu)
        masks = {**steering.now(),
                 heavy.dev: steer.rps_cpus(steer.read_rps(heavy.netns, heavy.dev))}
        where = heavy.receiver_cpus()
        c0, t0 = heavy_counters(heavy), time.monotonic()
        rx.start()
        rx2.start()

        def end(rec: dict[str, Any]) -> None:
            rec["rt_cpu_rx"] = rx.stop()
            rec["nonrt_cpu_rx"] = rx2.stop()
            c1, t1 = heavy_counters(heavy), time.monotonic()
            rec["heavy"] = {"receiver_cpus": where, **heavy_rate(c0, c1, t1 - t0)}
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


def split_summary(runs: list[dict[str, Any]], place: pl.Placement) -> dict[str, Any]:
    """{condition: {mode: {metric: aggregate + ratio_to_napi}, "rps": [...],
    "heavy_cpus": [...]}} over the rtt runs (ratios per repetition against napi's)."""
    per: dict[tuple[str, str], dict[str, dict[int, float | None]]] = defaultdict(
        lambda: defaultdict(dict))
    rps: dict[tuple[str, str], set[str]] = defaultdict(set)
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in runs:
        key = (r["condition"], r["mode"])
        for k, v in split_metrics(r, place).items():
            per[key][k][r["rep"]] = v
        for dev, cpus in (r.get("steering") or {}).items():
            rps[key].add(f"{dev.split('-')[0]}:{','.join(map(str, cpus)) or 'off'}")
        where[key].update((r.get("heavy") or {}).get("receiver_cpus") or [])
    out: dict[str, Any] = {}
    for (cond, mode), metrics in per.items():
        base = per.get((cond, report.BASELINE), {})
        d = out.setdefault(cond, {}).setdefault(mode, {})
        for k, by_rep in metrics.items():
            agg = aggregate(by_rep.values())
            if mode != report.BASELINE and k in base:
                agg["ratio_to_napi"] = aggregate(ratios_to_baseline(by_rep, base[k]))
            d[k] = agg
        d["rps"] = sorted(rps[(cond, mode)])
        d["heavy_cpus"] = sorted(where[(cond, mode)])
    return out


def steering_check(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, over the runs with the heavy sender: in how many the heavy flow's packets
    went up the stack where the mode puts them (>= STEER_SHARE of the heavy device's packets
    processed there: the RT CPU, the non-RT CPU in exclusive)."""
    out: dict[str, Any] = {}
    for r in runs:
        h = r.get("heavy") or {}
        if r.get("condition") != LOADS["on"] or not h.get("rx_pps"):
            continue
        key = "nonrt_cpu_rx" if exclusive_like(r["mode"]) else "rt_cpu_rx"
        got = (r.get(key) or {}).get("processed_per_s") or 0.0
        d = out.setdefault(r["mode"], {"where": "non-RT CPU" if exclusive_like(r["mode"])
                                       else "RT CPU", "runs": 0, "ok": 0})
        d["runs"] += 1
        d["ok"] += int(got >= STEER_SHARE * h["rx_pps"])
    for d in out.values():
        d["passed"] = d["ok"] == d["runs"]
    return out


# -- markdown -------------------------------------------------------------------------------
def _modes(d: dict[str, Any]) -> list[str]:
    return sorted(d, key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER))


def _app_words(results: dict[str, Any]) -> str:
    p = results.get("placement") or {}
    fifo = p.get("app_fifo")
    pol = f"SCHED_FIFO {fifo}" if fifo else "default policy (SCHED_OTHER)"
    return f"{pol} (--app-policy {p.get('app_policy', '?')})"


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
        here = "stock-kbp / hybrid / busy" if mode == "kbp" else mode
        rows.append(f"| {here} | {meth} | {mean:g} | {p99:g} | {sd:g} |")
    return [*rows, ""]


SCENARIO = RtSplit()
