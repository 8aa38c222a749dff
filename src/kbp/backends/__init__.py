"""kbpctl backends: who serves a device's NAPIs.

* ``stock``: no module. Threaded NAPI + SCHED_FIFO + CPU/IRQ alignment (+ defer/gro
  "linger") composed from features of stock kernels >= 5.12 (busy mode: SCHED_NORMAL).
* ``kmod``: the kbp kernel module's pollers, driven through :mod:`kbp.kmod`.

The API for other tools (the benchmark uses it)::

    from kbp import backends
    be = backends.get("auto")              # kmod when the module is loaded, else stock
    be.enable(backends.EnableRequest(["veth0"], netns="ns1", cpus=[1], rt_prio=50))
    st = backends.status(netns="ns1")      # Status; st.to_json() is the --json schema
    backends.disable(["veth0"], netns="ns1")   # whichever backend enabled it

Importing this package has no side effects; nothing touches the system until a method is
called. ``enable``/``disable`` need root.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kbp import _spec, modespec, names
from kbp.errors import InvalidInput, KbpctlError, NotRoot, OperationFailed
from kbp.netdev import get_link
from kbp.problems import KILLED_PROCESS, PREEMPT, Problem, texts
from kbp.rps import Rps, RpsStatus
from kbp.sysinfo import (
    CAP_SYS_NICE,
    HOST,
    RT_PRIO_MAX,
    RT_PRIO_MIN,
    SELF_STATUS,
    CpuTask,
    FreqReport,
    Host,
    PreemptModel,
    has_capability,
    read_schedstat,
)
from kbp.system.journal import Record, StateDir

DEFAULT_RT_PRIO = 50  # the priority of threaded IRQ handlers; NAPI threads run at it too
MAX_LINGER_US = _spec.KBP_LINGER_US_MAX  # the module's limit (module/netlink/kbp.yaml)
#: --repoll-us (stock non-rt): at most 1 ms between the heavy NAPIs' polls, so a ring of a
#: few hundred packets does not overflow at line rate between them
MAX_REPOLL_US = 1000


def default_rt_prio(backend: str, mode: str) -> int:
    """The priority of ``backend``'s polling threads in ``mode`` when none is asked for
    (``--rt-prio`` and ``rt_prio`` in kbp.toml left out; 0 = SCHED_NORMAL).

    SCHED_FIFO ``DEFAULT_RT_PRIO`` everywhere except the stock backend's busy mode, whose
    threads never sleep and do not yield to SCHED_OTHER tasks (see
    :func:`kbp.backends.stock.default_rt_prio`).
    """
    if backend == names.BACKEND_STOCK:
        from kbp.backends import stock
        return stock.default_rt_prio(mode)
    if backend == names.BACKEND_KMOD:
        from kbp.backends import kmod
        return kmod.default_rt_prio(mode)
    raise InvalidInput(f"unknown backend {backend!r}: use kmod or stock")


@dataclass(frozen=True)
class Periodic:
    """The knobs of mode periodic (NetAP; :data:`kbp.names.PERIODIC_KNOBS`, docs/netap.md).

    ``interval_us`` set: poll at that fixed interval. None: the golden-section search picks
    the interval in [min_interval_us, max_interval_us] (a latency cap), in rounds of
    ``round_ms``, maximizing ``objective``; it restarts when a round's objective moves by more
    than ``min_change`` percent, or every ``max_round`` rounds.
    """

    interval_us: int | None = None
    round_ms: int = names.PERIODIC_DEFAULTS["round_ms"]
    min_interval_us: int = names.PERIODIC_DEFAULTS["min_interval_us"]
    max_interval_us: int = names.PERIODIC_DEFAULTS["max_interval_us"]
    min_change: int = names.PERIODIC_DEFAULTS["min_change"]
    max_round: int = names.PERIODIC_DEFAULTS["max_round"]
    objective: str = names.OBJECTIVE_BYTES

    @property
    def search(self) -> bool:
        """The interval is searched (no fixed ``interval_us``)."""
        return self.interval_us is None

    def validate(self) -> None:
        """ERANGE-style refusals with the accepted range, as the module gives them."""
        for k, (lo, hi) in names.PERIODIC_RANGES.items():
            v = getattr(self, k)
            if v is not None and not lo <= v <= hi:
                raise InvalidInput(f"--{k.replace('_', '-')} {v} is out of range ({lo}..{hi}"
                                   f"{' percent' if k == 'min_change' else ''})")
        if self.min_interval_us > self.max_interval_us:
            raise InvalidInput(f"--min-interval-us {self.min_interval_us} is above "
                               f"--max-interval-us {self.max_interval_us}: the search range "
                               "is empty")
        if self.objective not in names.OBJECTIVES:
            raise InvalidInput(f"unknown objective {self.objective!r}: use "
                               f"{' or '.join(names.OBJECTIVES)}")

    @classmethod
    def from_args(cls, **kw: Any) -> Periodic:
        """From CLI/config values (None: the default). A fixed ``interval_us`` and a search
        knob together are refused: the search knobs do nothing at a fixed interval."""
        given = {k: v for k, v in kw.items() if v is not None}
        unknown = set(given) - set(names.PERIODIC_KNOBS)
        if unknown:
            raise InvalidInput(f"unknown periodic knob {sorted(unknown)[0]!r}")
        if "interval_us" in given:
            search = sorted(set(given) - {"interval_us"})
            if search:
                raise InvalidInput(f"--interval-us fixes the interval, so the search knob "
                                   f"--{search[0].replace('_', '-')} would do nothing: drop "
                                   "one of them")
        p = cls(**given)
        p.validate()
        return p


@dataclass
class EnableRequest:
    """What ``kbpctl enable`` asks for (the same for every listed device)."""

    devices: list[str]
    netns: str | None = None
    mode: str = modespec.DEFAULT.name
    cpus: list[int] | None = None  # None: all online CPUs, NAPIs round-robin
    rt_prio: int | None = None  # None: the backend's default for the mode (resolved())
    linger_us: int | None = None  # None: leave defer/gro settings as they are
    quota: int | None = None  # kmod only
    freq_ctl: bool = False  # kmod only: EE-KBP CPU-frequency control (hybrid)
    keep_rps: bool = False  # leave RPS on (default: turn it off, journaled; see kbp.rps)
    #: move other devices' queue interrupts off the polling CPUs, journaled (kbp.contention)
    isolate: bool = False
    periodic: Periodic | None = None  # mode periodic: its knobs (None there: the defaults)
    #: names.CLASS_RT or names.CLASS_NON_RT: which of the CPU's pollers serves the device
    #: (non-rt: hybrid only, SCHED_NORMAL, gives way to the RT poller between polls)
    cls: str = names.CLASS_RT
    nice: int | None = None  # non-rt only: the poller's (or NAPI threads') nice; None: 0
    #: stock non-rt only: the heavy NAPIs' hrtimer re-poll interval (IRQ deferral), µs;
    #: None: the backend's default (stock.NON_RT_REPOLL_US); 0: deferral left as found
    repoll_us: int | None = None

    def resolved(self, backend: str) -> EnableRequest:
        """This request with ``rt_prio`` filled in: when it is None, ``backend``'s default
        for the mode (:func:`default_rt_prio`). Backends resolve a request before they check
        or journal it, so journals, status and ``apply`` see the priority the threads get."""
        req = self
        if modespec.periodic(req.mode) and req.periodic is None:
            req = dataclasses.replace(req, periodic=Periodic())
        if req.cls == names.CLASS_NON_RT:  # SCHED_NORMAL at nice (0 when not given)
            return dataclasses.replace(req, rt_prio=0 if req.rt_prio is None else req.rt_prio,
                                       nice=req.nice or 0)
        if req.rt_prio is not None:
            return req
        return dataclasses.replace(req, rt_prio=default_rt_prio(backend, req.mode))

    def settings(self) -> dict[str, Any]:
        """The per-device part, as journaled (compared by ``apply``; resolve it first)."""
        return {"mode": self.mode, "cpus": self.cpus, "rt_prio": self.rt_prio,
                "linger_us": self.linger_us, "quota": self.quota, "freq_ctl": self.freq_ctl,
                "keep_rps": self.keep_rps,
                "periodic": asdict(self.periodic) if self.periodic is not None else None,
                # only when asked for: journals written before --isolate and before the
                # classes stay in sync
                **({"isolate": True} if self.isolate else {}),
                **({"class": self.cls, "nice": self.nice or 0}
                   if self.cls != names.CLASS_RT else {}),
                **({"repoll_us": self.repoll_us} if self.repoll_us is not None else {})}


#: settings() keys written only when not at their default, and that default
OPTIONAL_SETTINGS: dict[str, Any] = {"isolate": False, "class": names.CLASS_RT, "nice": None,
                                     "repoll_us": None}


def changed_settings(journaled: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The keys of ``wanted`` (``EnableRequest.settings()``) whose journaled value differs;
    an optional key (:data:`OPTIONAL_SETTINGS`) left out on either side is its default, so
    a device journaled non-rt and now wanted rt is a change too."""
    keys = set(wanted) | (set(journaled) & set(OPTIONAL_SETTINGS))
    return sorted(k for k in keys
                  if journaled.get(k, OPTIONAL_SETTINGS.get(k))
                  != wanted.get(k, OPTIONAL_SETTINGS.get(k)))


def journaled_class(request: Mapping[str, Any]) -> str:
    """The class a journaled request asked for (journals before the classes: rt)."""
    return str(request.get("class") or names.CLASS_RT)


def validate_common(req: EnableRequest, rt_prio_min: int = RT_PRIO_MIN) -> None:
    """Checks every backend shares (no system access). ``rt_prio_min`` is 0 where the
    backend can run its polling threads SCHED_NORMAL (the module: ``--rt-prio 0``); an
    unresolved ``rt_prio`` (None: the backend's default) is not checked."""
    if not req.devices:
        raise InvalidInput("no device named: kbpctl enable DEV [DEV...]")
    dup = {d for d in req.devices if req.devices.count(d) > 1}
    if dup:
        raise InvalidInput(f"device {sorted(dup)[0]} is named twice: name each device once")
    for d in req.devices:
        if not d or "/" in d or d in (".", "..") or len(d) > 15 or any(c.isspace() for c in d):
            raise InvalidInput(f"bad device name {d!r}: use a name from 'ip link'")
    if req.mode not in names.MODES:
        raise InvalidInput(f"unknown mode {req.mode!r}: use --mode "
                           f"{modespec.modes_text(modespec.SPECS.values())}")
    validate_class(req)
    if req.cls == names.CLASS_NON_RT:
        rt_prio_min = 0  # SCHED_NORMAL (validate_class refused a priority above 0)
    spec = modespec.get(req.mode)
    if req.periodic is not None:
        if not spec.takes("interval_us"):
            raise InvalidInput(f"the periodic knobs (--interval-us, --round-ms, ...) apply "
                               f"to --mode {_taking('interval_us')} only, not {req.mode}: "
                               f"drop them or use --mode {_taking('interval_us')}")
        req.periodic.validate()
    if req.rt_prio is not None and not rt_prio_min <= req.rt_prio <= RT_PRIO_MAX:
        what = " (0: SCHED_NORMAL)" if rt_prio_min == 0 else ""
        raise InvalidInput(f"priority {req.rt_prio} is out of range: SCHED_FIFO priorities "
                           f"are {rt_prio_min}..{RT_PRIO_MAX}{what} (--rt-prio)")
    if req.linger_us is not None:
        if not spec.takes("linger_us"):
            others = ", ".join(s.sleep_rule for s in modespec.SPECS.values()
                               if not s.takes("linger_us"))
            raise InvalidInput(f"--linger-us applies to --mode {_taking('linger_us')} only "
                               f"(not {req.mode}: {others}): drop one of them")
        if not 0 <= req.linger_us <= MAX_LINGER_US:
            raise InvalidInput(f"--linger-us {req.linger_us} is out of range "
                               f"(0..{MAX_LINGER_US})")
    if req.freq_ctl and not spec.takes("freq_ctl"):
        raise InvalidInput(f"--freq-ctl applies to --mode {_taking('freq_ctl')} only"
                           f"{spec.why_no_freq_ctl}: drop one of them")
    if req.quota is not None and not 1 <= req.quota <= names.DEFAULT_QUOTA:
        raise InvalidInput(f"--quota {req.quota} is out of range (1..{names.DEFAULT_QUOTA}, "
                           "the NAPI weight)")


def validate_class(req: EnableRequest) -> None:
    """The class and nice refusals (no system access), each with the reason and the fix."""
    if req.cls not in names.CLASSES:
        raise InvalidInput(f"unknown class {req.cls!r}: use --class "
                           f"{' or '.join(names.CLASSES)}")
    lo, hi = names.NICE_RANGE
    if req.repoll_us is not None and not 0 <= req.repoll_us <= MAX_REPOLL_US:
        raise InvalidInput(f"--repoll-us {req.repoll_us} is out of range (0..{MAX_REPOLL_US}; "
                           "0 leaves the heavy NAPIs' deferral as it is)")
    if req.cls != names.CLASS_NON_RT:
        if req.nice is not None:
            raise InvalidInput(f"--nice {req.nice} applies to --class {names.CLASS_NON_RT} "
                               f"only (the {names.CLASS_RT} pollers run SCHED_FIFO at "
                               "--rt-prio): drop --nice or add --class non-rt")
        if req.repoll_us is not None:
            raise InvalidInput(f"--repoll-us {req.repoll_us} applies to --class "
                               f"{names.CLASS_NON_RT} only (the heavy devices' NAPIs): drop "
                               "--repoll-us or add --class non-rt")
        return
    if not modespec.serves_non_rt(req.mode):
        ok = modespec.modes_text(modespec.non_rt_modes())
        raise InvalidInput(f"--class non-rt with --mode {req.mode}: the non-rt poller is "
                           f"{ok} only: it sleeps when idle and gives way to the RT poller; "
                           f"use --mode {ok}")
    if req.rt_prio:
        raise InvalidInput(f"--class non-rt with --rt-prio {req.rt_prio}: non-rt pollers run "
                           "SCHED_NORMAL; drop --rt-prio or use --nice")
    if req.freq_ctl:
        raise InvalidInput("--class non-rt with --freq-ctl: the CPU's frequency belongs to "
                           "its rt poller; drop --freq-ctl")
    if req.nice is not None and not lo <= req.nice <= hi:
        raise InvalidInput(f"--nice {req.nice} is out of range ({lo}..{hi})")


def check_nice_capability(req: EnableRequest, status_path: Path = SELF_STATUS) -> None:
    """A nice below 0 needs CAP_SYS_NICE (setpriority() would fail half-way through an
    enable, and the module refuses it too): refuse first, saying why. A container with only
    CAP_NET_ADMIN can serve a device as non-rt at nice 0 or above, not raise its priority."""
    if req.cls != names.CLASS_NON_RT or req.nice is None or req.nice >= 0:
        return
    if has_capability(CAP_SYS_NICE, status_path) is False:
        raise NotRoot(f"--nice {req.nice} raises the pollers' priority, which needs "
                      "CAP_SYS_NICE, and this process does not have it (CapEff in "
                      f"{status_path}): use --nice 0 or above, or run kbpctl with "
                      "CAP_SYS_NICE")


def _taking(knob: str) -> str:
    """The modes ``knob`` applies to, for a message ("hybrid")."""
    return modespec.modes_text(modespec.taking(knob))


def lookup_device(state: StateDir, backend: str, dev: str, netns: str | None,
                  replace_other: bool = False) -> tuple[Any, Any]:
    """The device's link and its journal record, refusing a device another backend serves
    (unless ``replace_other``: then the other record is ignored)."""

    link = get_link(dev, netns)
    if link is None:
        where = f"netns {netns}" if netns else "this netns"
        look = f"ip -n {netns} link" if netns else "ip link"
        raise InvalidInput(f"no device {dev} in {where}: check the name with '{look}'")
    rec = state.record(dev, netns)
    if rec is not None and rec.backend != backend:
        if not replace_other:
            raise InvalidInput(f"{dev} is served by the {rec.backend} backend: run "
                               f"'kbpctl disable {dev}' first")
        rec = None
    return link, rec


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise NotRoot(f"{what} changes kernel settings and needs root "
                      "(CAP_NET_ADMIN, CAP_SYS_NICE): run it with sudo")


def read_rps(fs: Callable[[str | None], Any], dev: str, netns: str | None,
             host: Host = HOST) -> Rps | None:
    """The device's RPS settings for status (None: no RPS here, or not readable)."""
    from kbp import rps
    try:
        return rps.read(fs(netns), dev, host)
    except (KbpctlError, OSError):
        return None


def served_devices(state: StateDir, req: EnableRequest) -> list[tuple[str, str | None]]:
    """The devices kbp serves (journaled) and those ``req`` enables: the ones ``--isolate``
    and the contention notes leave alone."""
    return [(r.dev, r.netns) for r in state.records()] + [(d, req.netns) for d in req.devices]


def isolate_others(ex: Any, req: EnableRequest, cpus: Sequence[int], state: StateDir,
                   host: Host = HOST) -> int:
    """``--isolate`` inside a device's enable (its journal's executor ``ex``): the other
    devices' queue interrupts and RPS off ``cpus`` (kbp.contention.isolate); the number of
    changes made."""
    from kbp import contention
    from kbp.sysinfo import online_cpus
    return contention.isolate(ex, cpus, served_devices(state, req), req.netns,
                              online_cpus(host), host)


def contention_notes(req: EnableRequest, result: EnableResult, state: StateDir,
                     host: Host = HOST) -> list[str]:
    """kbp.contention's notes for the devices ``result`` just enabled (``req`` resolved)."""
    from kbp import contention
    from kbp.sysinfo import online_cpus
    cpus = {c for d in result.devices for c in d.cpus}
    if not cpus or req.rt_prio is None:
        return []
    return contention.notes(cpus, req.rt_prio, served_devices(state, req), req.netns,
                            online_cpus(host), host)


def rps_off_plan(r: Rps | None, req: EnableRequest) -> list[tuple[str, str]]:
    """(sysfs attribute, value) that turn RPS off, unless ``--keep-rps``."""
    return [] if r is None or req.keep_rps else r.plan_off()


def show_rps(ds: DeviceStatus, r: Rps | None, request: Mapping[str, Any] | None,
             complete: bool) -> None:
    """Fill ``rps``/``keep_rps`` of a device's status; RPS on where a complete enable turned
    it off is a problem (drift: ``apply`` re-enables)."""
    from kbp import rps
    ds.rps = r.status() if r is not None else None
    if request is None:
        return
    ds.keep_rps = bool(request.get("keep_rps", False))
    if r is not None and r.on and complete and not ds.keep_rps:
        ds.problems.append(rps.drift_problem(ds.name, r))


# -- results and status ---------------------------------------------------------------
@dataclass
class DeviceResult:
    name: str
    netns: str | None
    backend: str
    napis: int
    cpus: list[int]
    changes: int
    note: str = ""
    rps: Rps | None = None  # the device's RPS settings before enable (None: no RPS)
    rps_off: bool = False  # enable turned RPS off (journaled)


@dataclass
class EnableResult:
    backend: str
    reason: str
    devices: list[DeviceResult] = field(default_factory=list)
    #: advice on what else meets the pollers on their CPUs (kbp.contention), one line each
    notes: list[str] = field(default_factory=list)


@dataclass
class DisableResult:
    devices: list[DeviceResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ThreadStatus:
    """The kernel thread that polls (a NAPI kthread, or a kbp poller)."""

    pid: int
    comm: str
    cpus: list[int]
    last_cpu: int | None
    policy: str
    priority: int
    counters: dict[str, int | None]
    nice: int | None = None  # its nice (what a SCHED_OTHER thread of class non-rt runs at)


@dataclass
class NapiStatus:
    id: int | None
    index: int | None = None
    irq: int | None = None
    irq_affinity: str | None = None
    cpu: int | None = None  # the CPU that polls it (None: not pinned to one CPU)
    threaded: int | None = None
    defer_hard_irqs: int | None = None
    gro_flush_timeout_ns: int | None = None
    state: str | None = None
    thread: ThreadStatus | None = None
    counters: dict[str, int | None] = field(default_factory=dict)


@dataclass
class DeviceStatus:
    name: str
    netns: str | None
    ifindex: int | None
    kind: str | None
    backend: str | None  # None: not served by kbp
    mode: str | None = None
    linger_us: int | None = None
    rt_prio: int | None = None
    cpus: list[int] | None = None
    complete: bool = True  # False: an enable was interrupted (disable restores)
    managed: bool = True  # kbpctl journals it (False: not served, or attached outside kbpctl)
    keep_rps: bool | None = None  # enabled with --keep-rps (None: not served by kbpctl)
    #: mode periodic: its knobs as enabled, from the journal (Periodic's fields; interval_us
    #: None: searched)
    periodic_request: dict[str, Any] | None = None
    napis: list[NapiStatus] = field(default_factory=list)
    counters: dict[str, int | None] = field(default_factory=dict)
    rps: RpsStatus | None = None  # None: no RPS in this kernel, or it could not be read
    #: what is wrong, one line each with what to do (JSON: the sentences)
    problems: list[Problem] = field(default_factory=list)
    #: stock mode periodic: interval, defer, and the service's search (kbp.periodicd.describe)
    periodic: dict[str, Any] | None = None
    #: the [rt_class] rule's verdict when ``kbpctl apply`` runs one (kbp.rtclass.DeviceClass
    #: as JSON: class, why, irq_threads); None without a rule
    rt_class: dict[str, Any] | None = None
    #: names.CLASS_RT or names.CLASS_NON_RT: which poller class serves it (None: not served;
    #: JSON "class")
    cls: str | None = None
    nice: int | None = None  # class non-rt: the nice it was enabled with


@dataclass
class PollerStatus:
    cpu: int
    pid: int | None
    mode: str | None
    linger_us: int | None
    quota: int | None
    napis: int | None
    policy: str | None
    priority: int | None
    counters: dict[str, int | None]
    freq_ctl: bool | None = None
    #: mode periodic: its interval, hand-backs and (netap on) the search's state
    periodic: dict[str, Any] | None = None
    #: names.CLASS_RT or names.CLASS_NON_RT (kmod.Poller.cls; JSON "class")
    cls: str = names.CLASS_RT
    nice: int | None = None  # class non-rt: the poller's nice
    #: the device it serves (the module runs a poller per CPU, class and device); None
    #: once the device is detached and the poller is stopping
    device: str | None = None
    #: active, stopping, stuck (kmod.Poller.state; None: a module that does not say)
    state: str | None = None

    @property
    def name(self) -> str:
        """Its thread's name, the module's (kbp.names.poller_name: kbp/1:eth0)."""
        return names.poller_name(self.cpu, self.cls, self.device)


@dataclass
class PollerLoad:
    """How big a polling thread's polls are and how long it waits for its CPU: what one class
    costs the other on a CPU both share. Every thread: the scheduler's schedstat (run_delay:
    runnable but not running, over the times it ran). The module's pollers also: their
    counters (NAPI polls and their packets, the quota that caps a poll, wake-up-to-running
    delays, gave_way). A stock NAPI thread's poll sizes are not counted by the kernel (the
    ``napi:napi_poll`` tracepoint has them: ``kbpctl bench --anatomy``)."""

    runs: int | None = None             # times it ran (schedstat)
    wait_mean_us: float | None = None   # run_delay / runs
    packets_per_poll: float | None = None   # kmod: packets / polls
    quota: int | None = None            # kmod: the most one poll may take
    wakeups: int | None = None          # kmod: wake-ups from sleep
    wake_delay_mean_us: float | None = None  # kmod: wake-up to running, mean
    wake_delay_max_us: float | None = None   # kmod: and the longest
    gave_way: int | None = None         # kmod non-rt: polls after which it gave way
    # ``kbpctl status --trace SECONDS`` (:mod:`kbp.pollertrace`), over that many seconds:
    traced_s: float | None = None
    polls: int | None = None            # NAPI polls in this thread (stock)
    poll_max: int | None = None         # the most packets one took
    full_polls: int | None = None       # polls that used their whole budget
    traced_wakeups: int | None = None   # rt: wake-ups that ended in a switch to it
    traced_wait_mean_us: float | None = None  # rt: wake-up to running, mean
    traced_wait_max_us: float | None = None   # rt: and the longest
    #: rt: the tasks whose CPU it waited for, longest total first ({pid, comm, waits,
    #: mean_us, max_us}; comm "idle": the wake-up from an idle CPU)
    waited_behind: list[dict[str, Any]] | None = None
    #: the rt threads' waits that ended when this thread gave its CPU up ({waits, mean_us,
    #: max_us}): what its polls cost the rt class
    caused: dict[str, Any] | None = None


def _ratio(num: int | None, den: int | None, scale: float = 1.0) -> float | None:
    return round(num / den / scale, 3) if num is not None and den else None


def poller_load(pid: int | None, p: PollerStatus | None = None,
                napis: Sequence[NapiStatus] = (), host: Host = HOST) -> PollerLoad:
    """The load of thread ``pid`` (schedstat), with module poller ``p``'s counters and
    those of the NAPIs it polls (``napis``: the module counts polls per NAPI)."""
    st = read_schedstat(pid, host.proc) if pid else None
    load = PollerLoad(runs=st[2] if st else None,
                      wait_mean_us=_ratio(st[1], st[2], 1000) if st else None)
    if p is not None:
        c = p.counters
        max_ns = c.get("wake_delay_max_ns")
        mine = [n.counters for n in napis if n.thread is not None and n.thread.pid == pid]
        if mine:
            load.packets_per_poll = _ratio(sum(n.get("packets") or 0 for n in mine),
                                           sum(n.get("polls") or 0 for n in mine))
        load.quota = p.quota
        load.wakeups = c.get("wakeups")
        load.wake_delay_mean_us = _ratio(c.get("wake_delay_ns"), c.get("wakeups"), 1000)
        load.wake_delay_max_us = None if max_ns is None else round(max_ns / 1000, 3)
        load.gave_way = c.get("gave_way")
    return load


@dataclass
class CpuPoller:
    """A polling thread on a CPU, with its class: a module poller (``kbp/<cpu>``, its
    non-rt sibling) or a stock NAPI thread (class of the device it polls)."""

    cls: str  # names.CLASS_RT or names.CLASS_NON_RT (JSON "class")
    backend: str
    pid: int | None
    comm: str
    policy: str | None
    priority: int | None
    nice: int | None
    devices: list[str] = field(default_factory=list)  # "dev" or "dev@netns"
    load: PollerLoad | None = None


@dataclass
class PollingCpu:
    """A CPU a polling thread runs on, and the other tasks that compete for it."""

    cpu: int
    busy: bool  # a busy poller polls here (it never sleeps: the tasks get only its yields)
    tasks: list[CpuTask] = field(default_factory=list)
    pollers: list[CpuPoller] = field(default_factory=list)  # the polling threads here


@dataclass
class BackendInfo:
    available: bool
    reason: str
    features: dict[str, Any] = field(default_factory=dict)


@dataclass
class OrphanJournal:
    """A process journal whose process is gone: what it changed is still set."""

    owner: str  # who wrote it: "bench-knobs" (global sysctls), "nicpair" (NIC ports)
    pid: int
    path: str
    changes: int

    @classmethod
    def of(cls, rec: Record) -> OrphanJournal:
        owner, pid = StateDir.process_of(rec.path)
        return cls(owner, pid, str(rec.path), rec.steps)

    @property
    def problem(self) -> Problem:
        """What status says of it (kind killed_process, counted in kbp_problems)."""
        return Problem(KILLED_PROCESS,
                       f"a killed {self.owner} process (pid {self.pid}) left {self.changes} "
                       f"change{'s' if self.changes != 1 else ''} set ({self.path}): kbpctl "
                       "disable --all puts them back")


@dataclass
class Status:
    kernel: str
    auto: str  # what --backend auto picks now
    backends: dict[str, BackendInfo]
    devices: list[DeviceStatus]
    pollers: list[PollerStatus]
    cpufreq: FreqReport
    polling_cpus: list[PollingCpu] = field(default_factory=list)
    rt_class: dict[str, Any] | None = None  # the [rt_class] rule apply last converged to
    #: the kernel's preemption model (sysinfo.PreemptModel.to_json()) and, in "notes", where
    #: it limits an RT poller of this set-up (Problems of kind preempt; JSON: the sentences)
    preempt: dict[str, Any] | None = None
    #: socket outsourcing, the guest module kbp_so (:func:`outsource_status`): None when
    #: /proc/kbp_so does not exist (JSON null)
    outsource: dict[str, Any] | None = None
    #: ``--trace``: {"seconds", "threads", "error"} (:func:`trace_loads`); None: not asked
    trace: dict[str, Any] | None = None
    #: journals of killed processes that changed the machine for their lifetime (a
    #: benchmark's global sysctls, its NIC ports): what ``disable --all`` puts back
    orphans: list[OrphanJournal] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "kbpctl-status/1",
            "kernel": self.kernel,
            "preempt": _preempt_json(self.preempt),
            "auto_backend": self.auto,
            "backends": {k: asdict(v) for k, v in self.backends.items()},
            "devices": [_class_key(dict(asdict(d), problems=texts(d.problems)))
                        for d in self.devices],
            "pollers": [_class_key(asdict(p)) for p in self.pollers],
            "cpufreq": self.cpufreq.to_json(),
            "polling_cpus": [dict(asdict(c), pollers=[_class_key(asdict(p))
                                                      for p in c.pollers])
                             for c in self.polling_cpus],
            "rt_class": self.rt_class,
            "outsource": self.outsource,
            "trace": self.trace,
            "orphans": [asdict(o) for o in self.orphans],
        }


def _preempt_json(p: dict[str, Any] | None) -> dict[str, Any] | None:
    """Status's ``preempt`` as JSON: its notes as their sentences."""
    if p is None or "notes" not in p:
        return p
    return dict(p, notes=texts(p["notes"] or []))


def _class_key(d: dict[str, Any]) -> dict[str, Any]:
    """The JSON of a status dataclass with ``cls`` written as "class" (the vocabulary)."""
    return {("class" if k == "cls" else k): v for k, v in d.items()}


class Backend(Protocol):
    name: str

    def available(self) -> tuple[bool, str]: ...

    def default_rt_prio(self, mode: str) -> int: ...

    def features(self) -> dict[str, Any]: ...

    def check(self, req: EnableRequest, replace_other: bool = False) -> None: ...

    def enable(self, req: EnableRequest) -> EnableResult: ...

    def disable(self, devices: Sequence[str] | None = None,
                netns: str | None = None) -> DisableResult: ...

    def describe(self, netns: str | None, devices: Sequence[str] | None,
                 records: Sequence[Any], exclude: set[tuple[str, str | None]] | None = None,
                 ) -> tuple[list[DeviceStatus], list[PollerStatus]]: ...


# -- choosing a backend ---------------------------------------------------------------
def get(name: str = "auto", state: StateDir | None = None) -> Backend:
    """The backend called ``name`` ("auto": kmod when the module is loaded, else stock)."""
    if name == "auto":
        return resolve_auto(state)[0]
    if name == names.BACKEND_STOCK:
        from kbp.backends.stock import StockBackend
        return StockBackend(state=state)
    if name == names.BACKEND_KMOD:
        from kbp.backends.kmod import KmodBackend
        return KmodBackend(state=state)
    raise InvalidInput(f"unknown backend {name!r}: use auto, kmod or stock")


def resolve_auto(state: StateDir | None = None) -> tuple[Backend, str]:
    """The backend ``auto`` picks, and why (one line for the operator)."""
    from kbp.backends.kmod import KmodBackend
    from kbp.backends.stock import StockBackend
    km = KmodBackend(state=state)
    ok, why = km.available()
    if ok:
        return km, "the kbp module is loaded"
    return StockBackend(state=state), f"{why}; using stock kernel features"


# -- operations across backends -------------------------------------------------------
def disable(devices: Sequence[str] | None = None, netns: str | None = None,
            state: StateDir | None = None) -> DisableResult:
    """Disable devices (None: all), each with the backend that enabled it."""
    from kbp.netdev import check_netns
    st = state or StateDir()
    require_root("kbpctl disable")
    recs = st.records()
    result = DisableResult()
    if devices is not None:
        known = {(r.dev, r.netns) for r in recs}
        for d in devices:
            if (d, netns) in known:  # the netns may be gone: the journal knows the rest
                continue
            check_netns(netns)
            if get_link(d, netns) is None:
                where = f"netns {netns}" if netns else "this netns"
                raise InvalidInput(f"no device {d} in {where}, and kbp does not serve one by "
                                   "that name: check 'kbpctl status'")
            result.notes.append(f"{d} is not enabled: nothing to do")
        wanted = {(d, netns) for d in devices}
        recs = [r for r in recs if (r.dev, r.netns) in wanted]
    by_backend: dict[str, list[str]] = {}
    for r in recs:
        by_backend.setdefault(r.backend, []).append(r.dev)
    errors = []
    for bname in sorted(by_backend):
        be = get(bname, st)
        try:
            res = be.disable(by_backend[bname], netns) if devices is not None \
                else be.disable(None)
        except OperationFailed as e:
            errors.append(str(e))
            continue
        result.devices += res.devices
        result.notes += res.notes
    if errors:
        raise OperationFailed("; ".join(errors))
    return result


def polling_cpus(devs: Sequence[DeviceStatus], pollers: Sequence[PollerStatus],
                 host: Host = HOST) -> list[PollingCpu]:
    """Each CPU that polls for kbp (module pollers, threads of served devices) with the other
    tasks pinned to it or runnable on it (the polling threads and kbpctl left out)."""
    from kbp import sysinfo
    napis = [n for d in devs if d.backend for n in d.napis]
    cpus = {n.cpu for n in napis if n.cpu is not None} | {p.cpu for p in pollers}
    if not cpus:
        return []
    busy = {p.cpu for p in pollers if modespec.spins(p.mode)}
    busy |= {n.cpu for d in devs if d.backend and modespec.spins(d.mode) for n in d.napis
             if n.cpu is not None}
    mine = {os.getpid()} | {p.pid for p in pollers if p.pid} | {
        n.thread.pid for n in napis if n.thread}
    tasks = sysinfo.tasks_on_cpus(cpus, mine, host)
    threads = cpu_pollers(devs, pollers, host)
    return [PollingCpu(cpu=c, busy=c in busy, tasks=t, pollers=threads.get(c, []))
            for c, t in tasks.items()]


def cpu_pollers(devs: Sequence[DeviceStatus], pollers: Sequence[PollerStatus],
                host: Host = HOST) -> dict[int, list[CpuPoller]]:
    """CPU -> its polling threads with their class and load: the module's pollers and the
    stock backend's NAPI threads (the class their device was enabled with), rt first."""
    out: dict[int, list[CpuPoller]] = {}
    kmod_napis = [n for d in devs if d.backend == names.BACKEND_KMOD for n in d.napis]
    for p in pollers:
        out.setdefault(p.cpu, []).append(CpuPoller(
            p.cls, names.BACKEND_KMOD, p.pid, p.name, p.policy, p.priority,
            p.nice, [p.device] if p.device else [], poller_load(p.pid, p, kmod_napis, host)))
    for d in devs:
        if d.backend != names.BACKEND_STOCK:
            continue
        who = f"{d.name}@{d.netns}" if d.netns else d.name
        for n in d.napis:
            if n.thread is None or n.cpu is None:
                continue
            t = n.thread
            out.setdefault(n.cpu, []).append(CpuPoller(
                d.cls or names.CLASS_RT, names.BACKEND_STOCK, t.pid, t.comm, t.policy,
                t.priority, t.nice, [who], poller_load(t.pid, None, (), host)))
    for lst in out.values():
        lst.sort(key=lambda c: (names.CLASSES.index(c.cls), c.pid or 0))
    return out


def deferred_pids(devs: Sequence[DeviceStatus]) -> set[int]:
    """The NAPI threads whose NAPIs are re-polled from their hrtimer (IRQ deferral on:
    ``defer_hard_irqs`` and ``gro_flush_timeout`` both set), as class non-rt sets them."""
    return {n.thread.pid for d in devs for n in d.napis
            if n.thread is not None and n.defer_hard_irqs and n.gro_flush_timeout_ns}


def preempt_notes(model: PreemptModel, cpus: Sequence[PollingCpu],
                  deferred: Collection[int] = ()) -> list[Problem]:
    """Where the preemption model limits an RT poller here: under none/voluntary a stock
    NAPI thread of class non-rt keeps its CPU for as long as its NAPI is scheduled again
    before each poll ends (polls of up to 64 packets with BH off; cond_resched() only after
    a full-budget poll; napi_thread_wait() skips schedule() when the NAPI is scheduled
    already), so a woken FIFO thread of class rt on that CPU waits for it: 4.6-56 ms at
    most traced on this project's host under a UDP flood of ~2-packet polls.  Class
    non-rt's IRQ deferral (threads in ``deferred``) makes the thread sleep after every
    poll that does not fill its budget, which leaves one poll to wait for.  The module's
    non-rt poller gives way after every small poll on every model: no note for it."""
    if model.preempts_kernel:
        return []
    out = []
    for c in cpus:
        stock = [p for p in c.pollers if p.backend == names.BACKEND_STOCK]
        rt = [p for p in stock if p.cls == names.CLASS_RT]
        non_rt = [p for p in stock if p.cls == names.CLASS_NON_RT]
        if not (rt and non_rt):
            continue
        head = f"CPU {c.cpu}: preemption model {model.model}: the rt NAPI thread " \
               f"{rt[0].comm} (SCHED_FIFO) may wait for "
        fix = "the kbp module's non-rt poller gives way after every small poll " \
              "(--backend kmod), or boot with preempt=full"
        if all(p.pid in deferred for p in non_rt):
            out.append(Problem(PREEMPT, head + (
                f"one poll (up to 64 packets) of the non-rt thread {non_rt[0].comm}: IRQ "
                "deferral makes it sleep between polls, but a stock NAPI thread does not "
                f"cap its poll; {fix}")))
        else:
            out.append(Problem(PREEMPT, head + (
                f"the non-rt thread {non_rt[0].comm} as long as its NAPI keeps getting "
                "scheduled: a stock NAPI thread reaches a preemption point only after a "
                "full-budget poll or once its NAPI runs dry (IRQ deferral, which --class "
                "non-rt sets, is off on it; measure it: kbpctl status --trace 5); "
                f"{fix}")))
    return out


def outsource_status(host: Host = HOST) -> dict[str, Any] | None:
    """kbp_so's module line as ``kbpctl status`` shows it (:func:`kbp.outsource.procfile.
    summary`); None without /proc/kbp_so (the module is not loaded: not a guest, or an older
    set-up), ``{"error": ...}`` when the file cannot be read or parsed -- status goes on.
    Standard library only (no pyroute2), no privilege: the file is world-readable."""
    from kbp.outsource import procfile
    path = host.proc / "kbp_so"
    try:
        mod = procfile.read(path)
    except (OSError, procfile.ProcFormatError) as e:
        return {"error": f"cannot read {path}: {e}"}
    return None if mod is None else procfile.summary(mod)


def status(netns: str | None = None, devices: Sequence[str] | None = None,
           state: StateDir | None = None, host: Host = HOST, trace_s: float = 0) -> Status:
    """Everything ``kbpctl status`` shows, for the devices of ``netns`` and every device kbp
    serves (in any netns); with ``trace_s``, the polling threads' loads traced for that many
    seconds too (:func:`trace_loads`)."""
    from kbp import rtclass, sysinfo
    from kbp.backends.kmod import KmodBackend
    from kbp.backends.stock import StockBackend
    st = state or StateDir()
    recs = st.records()
    stock, km = StockBackend(state=st), KmodBackend(state=st)
    infos = {}
    for be in (km, stock):
        ok, why = be.available()
        infos[be.name] = BackendInfo(ok, why, be.features() if ok else {})
    auto = km.name if infos[km.name].available else stock.name
    devs: list[DeviceStatus] = []
    pollers: list[PollerStatus] = []
    kd, kp = km.describe(netns, devices, [r for r in recs if r.backend == km.name])
    sd, _ = stock.describe(netns, devices, [r for r in recs if r.backend != km.name],
                           exclude={(d.name, d.netns) for d in kd})
    devs = sorted(sd + kd, key=lambda d: (d.netns or "", d.name))
    by_key = {(r.dev, r.netns): r for r in recs}
    for d in devs:
        rec = by_key.get((d.name, d.netns))
        if rec is not None and d.backend:
            d.cls = journaled_class(rec.request)
            d.nice = rec.request.get("nice")
        elif d.backend:
            d.cls = names.CLASS_RT  # attached outside kbpctl: the module's default class
    rule = rtclass.load_rule(st.root)
    classes = rtclass.describe([(d.name, d.netns) for d in devs], rule, host)
    for d in devs:
        c = classes.get((d.name, d.netns))
        d.rt_class = c.to_json() if c else None
    pollers = kp
    used = sorted({c for d in devs if d.backend for n in d.napis
                   if n.cpu is not None for c in [n.cpu]} | {p.cpu for p in pollers})
    freq = sysinfo.cpufreq(used or None, host)
    pcpus = polling_cpus(devs, pollers, host)
    model = sysinfo.preempt_model(host)
    preempt = dict(model.to_json(), notes=preempt_notes(model, pcpus, deferred_pids(devs)))
    return Status(kernel=sysinfo.kernel_release(), auto=auto, backends=infos, devices=devs,
                  pollers=pollers, cpufreq=freq, polling_cpus=pcpus,
                  rt_class=rule.to_json() if rule else None, preempt=preempt,
                  outsource=outsource_status(host),
                  trace=trace_loads(pcpus, trace_s) if trace_s else None,
                  orphans=[OrphanJournal.of(r) for r in st.orphans(None)])


def trace_loads(cpus: Sequence[PollingCpu], seconds: float) -> dict[str, Any]:
    """Trace the polling threads on ``cpus`` for ``seconds`` (:mod:`kbp.pollertrace`) and
    fill their loads in; returns what ran: {"seconds", "threads", "error"} (error: why it
    could not, status goes on without it)."""
    from kbp import pollertrace
    loads = {p.pid: p.load for c in cpus for p in c.pollers if p.pid and p.load is not None}
    out: dict[str, Any] = {"seconds": seconds, "threads": len(loads), "error": None}
    why = pollertrace.why_not(seconds) or (None if loads else "no polling thread to trace")
    if why:
        return dict(out, error=why)
    rt = [p.pid for c in cpus for p in c.pollers if p.pid in loads and p.cls == names.CLASS_RT]
    try:
        res = pollertrace.run(list(loads), rt, seconds)
    except (RuntimeError, OSError) as e:
        return dict(out, error=str(e))
    pollertrace.apply(res, loads, rt, seconds)
    return out
