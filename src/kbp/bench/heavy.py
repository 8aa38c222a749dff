"""The heavy side that the shared-cpu and rt-split scenarios share: a heavy receiver (iperf3
server) whose device's receive processing meets the RT flow's on the RT CPU, the steering that
puts both there, and the modes only such a scenario offers (kbp.bench.modes' categories
``excl`` and ``part``):

``exclusive``          the exclusive CPU method: the RT device stays on plain napi, the heavy
                       receiver and its device's RPS move to the non-RT CPU while it is on
``<kbp mode>-excl``    the kbp mode and the exclusive CPU together (kbpctl enable --isolate's
                       placement, the heavy receiver moved too)
``<kbp mode>-part``    the kbp mode on the RT device and the heavy device in the same backend's
                       class non-rt on the RT CPU itself; nothing moves

A scenario with a heavy side sets ``binds_heavy`` (:class:`kbp.bench.scenarios.Scenario`),
which offers it these modes, and its ``run`` builds a :class:`HeavySide` and hands it to them
with :func:`bind_heavy`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kbp import names, rps, sysinfo
from kbp.bench import netstats, steer, workloads
from kbp.bench import parts as pt
from kbp.bench import placement as pl
from kbp.bench.knobs import KnobError
from kbp.bench.modes import (
    EXCL_SUFFIX,
    EXCLUSIVE,
    NAPI,
    PART,
    SYSFS_THREADED,
    AppEnv,
    AppPlace,
    Target,
    _Defaults,
    catalog,
    require_softirq_napi,
    sysfs_net,
    thread_placement,
)
from kbp.bench.schema import Results
from kbp.system import journal

if TYPE_CHECKING:
    from kbp.bench.runner import Bench


#: --heavy-napi: where the heavy device's receive work starts.  ``sender`` (the default):
#: as veth does it, the heavy device has no NAPI (GRO off) and RPS queues each packet to the
#: RT CPU's backlog from the flood sender's CPU, so napi's RT CPU runs the backlog and the
#: stack only, and the -part modes (which give the device a NAPI and poll it on the RT CPU)
#: do more heavy-flow work there.  ``rt-cpu``: in every mode the heavy device has a
#: per-packet NAPI (GRO on, gro_max_size 1600) that is threaded and pinned to the RT CPU
#: (SCHED_OTHER), RPS off on it -- as a NIC whose interrupt is on the RT CPU polls it there
#: (veth takes no interrupt: the NAPI thread is where the poll can be put); the exclusive
#: CPU modes move that thread with the heavy receiver.
HEAVY_NAPI_SENDER, HEAVY_NAPI_RT_CPU = "sender", "rt-cpu"
HEAVY_NAPI = (HEAVY_NAPI_SENDER, HEAVY_NAPI_RT_CPU)


class HeavyError(RuntimeError):
    """A heavy-side mode outside a scenario with a heavy side, or its setup gone wrong."""


def exclusive_like(mode: str) -> bool:
    """The mode puts the heavy flow on the non-RT CPU (exclusive, or a kbp mode with it)."""
    info = catalog().get(mode)
    return info is not None and info.moves_load


def part_like(mode: str) -> bool:
    """The mode splits the RT CPU by class: RT device on its RT poller, heavy device on the
    same CPU's non-rt poller (or SCHED_OTHER NAPI thread)."""
    info = catalog().get(mode)
    return info is not None and info.category == PART


# -- the heavy receiver's side, and the exclusive CPU modes -------------------------------
@dataclass
class HeavySide:
    """The heavy receiver and its device's receive processing: where they run now, and the
    move ``exclusive`` makes (RPS mask of the device, affinity of every iperf3 thread).
    Each mask is journaled in ``ex`` before it changes: the scenarios pass their steering's,
    whose undo puts back what the testbed had."""

    netns: str
    dev: str
    rt_cpu: int
    nonrt_cpu: int
    flood: workloads.Flood
    cpu_now: int = -1
    napi_pinned: bool = False       # --heavy-napi rt-cpu: the device's NAPI thread follows
    ex: journal.Executor = field(default_factory=steer.changes)

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
        """The heavy device's receive work and the heavy receiver onto ``cpu``: its RPS, or
        with ``napi_pinned`` its NAPI threads (KnobError when it does not stick)."""
        if self.napi_pinned:
            self.pin_napi(cpu)
        else:
            steer.steer_rps(self.ex, self.netns, self.dev, cpu)
        for tid in self.receiver_pids():
            with contextlib.suppress(OSError):
                sysinfo.set_affinity(tid, [cpu])
        self.cpu_now = cpu

    def napi_threads(self) -> dict[int, str]:
        """The heavy device's NAPI threads now ({pid: comm}; none unless threaded)."""
        from kbp.backends import probe
        return probe.poller_threads(names.BACKEND_STOCK, self.dev, self.netns)

    def pin_napi(self, cpu: int) -> list[dict[str, Any]]:
        """Every NAPI thread of the heavy device onto ``cpu`` (KnobError when there is none
        or it does not stick: the run would poll the heavy flow elsewhere); their placement."""
        threads = self.napi_threads()
        if not threads:
            raise KnobError(f"{self.dev}: no NAPI thread to pin to CPU {cpu} (threaded off?)")
        for pid in threads:
            with contextlib.suppress(ProcessLookupError):
                sysinfo.set_affinity(pid, [cpu])
        got = [thread_placement(pid) for pid in threads]
        bad = [g for g in got if not g.get("gone") and g.get("cpus") != [cpu]]
        if bad:
            raise KnobError(f"{self.dev}: NAPI threads not on CPU {cpu}: {bad}")
        return got

    def keep_placed(self) -> None:
        """Before a run: with ``napi_pinned``, the device's NAPI threads where the heavy side
        is now (a mode that re-created the NAPI, as the -part modes do, leaves its new
        thread wherever the kernel started it)."""
        if self.napi_pinned:
            self.pin_napi(self.cpu_now)


@dataclass
class ExclusiveMode(_Defaults):
    """``exclusive``: the exclusive CPU method.  The RT device is plain napi (as ``napi``);
    while the mode is on the heavy receiver and its device's RPS are on the non-RT CPU, and
    teardown puts both back on the RT CPU.  Bound to the run's heavy side by the scenario."""

    name: str = EXCLUSIVE
    base: str = NAPI                # the mode it is without the move (idle_problem)
    spins: bool = False
    moves_load: bool = True         # the runner lets the moved load settle after it
    heavy: HeavySide | None = None
    target: Target | None = None
    _moved: bool = False

    def unavailable(self) -> str | None:
        return None

    def setup(self, t: Target) -> None:
        self.target = t
        require_softirq_napi(t, self.name, HeavyError)
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
        """The bound heavy side, or HeavyError outside the scenarios that bind one."""
        if self.heavy is None:
            raise HeavyError(f"mode {self.name} runs only in the rt-split and shared-cpu "
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


class _Wrapper(_Defaults):
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
        return {**self.inner.describe(), EXCLUSIVE: self.excl.describe()}


# -- the part modes: RT and non-RT receive work split by class on the RT CPU ---------------
def nonrt_request(backend: str, dev: str, netns: str | None, cpu: int | None,
                  repoll_us: int | None = None) -> Any:
    """The kbpctl EnableRequest for the heavy device in a part mode: class non-rt, mode
    hybrid (that class's only mode), on the RT CPU itself (``cpu``; no placement move).
    Priority: the class's own (``EnableRequest.resolved``: SCHED_NORMAL at nice 0);
    ``repoll_us``: kbpctl's --repoll-us (None: the backend's default)."""
    return _backends().EnableRequest([dev], netns=netns, mode=names.MODE_HYBRID,
                                     cpus=None if cpu is None else [cpu],
                                     cls=names.CLASS_NON_RT, repoll_us=repoll_us)


def _backends() -> Any:
    from kbp.bench.modes import _backends as get
    return get()


def nonrt_refusal(backend: str, repoll_us: int | None = None) -> str | None:
    """Why kbpctl's ``backend`` cannot serve a device in class non-rt (with ``repoll_us``)
    here (its static checks on a placeholder device, nothing changed), None when it can."""
    be = _backends().get(backend)
    check = getattr(be, "_check_static", None)
    if check is None:
        return None
    try:
        check(nonrt_request(backend, "lo", None, None, repoll_us).resolved(backend))
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

    def __init__(self, name: str, inner: Any, repoll_us: int | None = None) -> None:
        self.inner = inner
        self.name = name
        self.repoll_us = repoll_us    # kbpctl --repoll-us for the heavy device (None: default)
        self.spins = inner.spins
        self.backend: str = inner.backend
        self.moves_load = False
        # it reconfigures the heavy device (GRO, RPS, threaded NAPI) under the flood: the
        # runner lets the flood settle after it as after a mode that moves load
        self.reconfigures_heavy = True
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
            return nonrt_refusal(self.backend, self.repoll_us)
        except Exception as e:
            return f"{self.backend} backend: {e}"

    def idle_problem(self) -> str | None:
        return None if self.heavy is not None else (
            f"{self.name} puts the heavy device in the RT CPU's non-rt class, and the heavy "
            f"device does not exist in the idle part: its idle cost is {self.inner.name}'s")

    def require_heavy(self) -> HeavySide:
        if self.heavy is None:
            raise HeavyError(f"mode {self.name} runs only in the rt-split and shared-cpu "
                               "scenarios (no heavy device to put in class non-rt)")
        return self.heavy

    def heavy_request(self) -> Any:
        """The EnableRequest this mode makes for the heavy device (on the RT CPU)."""
        h = self.require_heavy()
        return nonrt_request(self.backend, h.dev, h.netns, h.rt_cpu, self.repoll_us)

    def setup(self, t: Target) -> None:
        h = self.require_heavy()        # refuse before the inner mode changes anything
        if h.rt_cpu != t.cpu:
            raise HeavyError(f"{self.name}: the heavy device's CPU {h.rt_cpu} is not the "
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
            raise HeavyError(f"{self.name}: after kbpctl enable --class non-rt the heavy "
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

    def nonrt_threads(self) -> dict[int, str]:
        """The heavy device's polling threads in class non-rt on the RT CPU (kbp.ko: the
        CPU's kbpn/<cpu> poller; stock: its napi/<dev>-<id> threads): {pid: comm}.  Not in
        ``threads()``, which is what serves the RT device."""
        return dict(self._nonrt)

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
                             "rt_prio": req.rt_prio, "nice": req.nice,
                             "repoll_us": req.repoll_us},
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


def bind_heavy(bench: Bench, heavy: HeavySide) -> None:
    """Tell the run's exclusive CPU modes which heavy receiver and device they move, and the
    part modes which heavy device they put in class non-rt."""
    bench.heavy = heavy
    for mode in bench.modes.values():
        if isinstance(mode, ExclusiveMode | KbpExclusiveMode | PartMode):
            mode.heavy = heavy


def steer_to_rt_cpu(bench: Bench, heavy_link: str, heavy_rps: bool = True,
                    ) -> steer.Steering:
    """RPS of both server devices (the RT pair's and ``heavy_link``'s) to the RT CPU, put back
    when the testbed closes and applied again to an RT veth pair the runner recreates; with
    --nic-pair only the heavy device's (the RT port's interrupts are already on the RT
    CPU); without ``heavy_rps`` (--heavy-napi rt-cpu) not the heavy device's."""
    tb, place = bench.tb, bench.placement
    assert tb is not None and place is not None
    rt, hv = tb.link("rt"), tb.link(heavy_link)
    nic = rt.kind == "nic"
    devs = ([] if nic else [rt.dev_b]) + ([hv.dev_b] if heavy_rps else [])
    steering = steer.Steering(tb.server, devs, place.cpu(pl.RT))
    tb.defer(steering.undo)
    steering.apply()
    if not nic:
        bench.rt_link_hooks.append(lambda: steering.apply([rt.dev_b]))
    return steering


def napi_on_rt_cpu(bench: Bench, heavy: HeavySide) -> dict[str, Any]:
    """--heavy-napi rt-cpu: give the heavy device a per-packet NAPI, thread it (sysfs
    ``threaded`` 1, SCHED_OTHER) and pin its thread to the RT CPU, RPS off on it, for every
    mode of the run; each change undone when the testbed closes.  Returns what is in force,
    read back from the kernel (for results.json)."""
    tb = bench.tb
    assert tb is not None
    ns, dev = heavy.netns, heavy.dev
    before = pt.napi_state(ns, dev)
    tb.defer(pt.napi_restore, ns, dev, before)
    state = pt.napi_per_packet(ns, dev)
    ex = steer.changes()
    tb.defer(ex.restore)
    steer.steer_rps(ex, ns, dev, None)
    ex.apply(journal.KIND_SYSFS, steer.dev_key(ns, dev, SYSFS_THREADED), "1")
    if sysfs_net(ns, dev, SYSFS_THREADED) != "1":
        raise HeavyError(f"{dev}: cannot turn threaded NAPI on for --heavy-napi rt-cpu")
    heavy.napi_pinned = True
    heavy.place(heavy.rt_cpu)
    return {"where": HEAVY_NAPI_RT_CPU, **state, SYSFS_THREADED: "1",
            "rps": rps.masks_cpus(steer.read_rps(ns, dev)),
            "threads": [thread_placement(p) for p in heavy.napi_threads()]}


def app_words(results: Results) -> str:
    """The RT app's scheduling class in a run, in words (its report's first line)."""
    p: Mapping[str, Any] = results.get("placement") or {}
    fifo = p.get("app_fifo")
    pol = f"SCHED_FIFO {fifo}" if fifo else "default policy (SCHED_OTHER)"
    return f"{pol} (--app-policy {p.get('app_policy', '?')})"


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
