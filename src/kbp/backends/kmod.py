"""The kmod backend: a thin layer on :mod:`kbp.kmod` (the kbp module's genl family).

``enable`` attaches each device to the module's pollers (``kbp/<cpu>``) with the mode,
linger, quota and rt_prio asked for. The module applies the pollers' scheduling itself
(KBP_A_RT_PRIO, so a respawned poller keeps it) and stops a poller when no attached device
needs it, so the changes to journal are the attachment (``disable`` detaches) and, before
it, RPS turned off on the device unless ``--keep-rps`` (:mod:`kbp.rps`: with RPS the poller
would hand every packet back to the backlog softirq; ``disable`` restores the masks).
A poller that already serves other devices with other knobs makes the module refuse the
attach (EBUSY, with its extack message); kbpctl passes that on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kbp import contention, kmod, modespec, names, rps, sysinfo
from kbp.backends import (
    DEFAULT_RT_PRIO,
    DeviceResult,
    DeviceStatus,
    DisableResult,
    EnableRequest,
    EnableResult,
    NapiStatus,
    Periodic,
    PollerStatus,
    contention_notes,
    isolate_others,
    lookup_device,
    read_rps,
    require_root,
    rps_off_plan,
    show_rps,
    validate_common,
)
from kbp.backends.stock import thread_status
from kbp.errors import InvalidInput, KbpctlError, OperationFailed, Unavailable
from kbp.netdev import NETNS_DIR, NetdevClient, NetFS, check_netns, link_names, named_netns
from kbp.problems import (
    DETACHED,
    DEVICE_DOWN,
    INTERRUPTED,
    MISPLACED,
    MODULE_NOT_LOADED,
    MODULE_SILENT,
    NEEDS_ROOT,
    PERIODIC_DRIFT,
    POLLER_STUCK,
    Problem,
)
from kbp.sysinfo import HOST, Host
from kbp.system.access import RestoreError
from kbp.system.journal import (
    KIND_IRQ,
    KIND_KMOD_ATTACH,
    KIND_SYSFS,
    MISSING,
    Executor,
    PauseHook,
    Record,
    StateDir,
    TargetGone,
    remove_record,
    restore,
)
from kbp.system.settings import IrqHandler, SysfsHandler, netns_gone, sysfs_key

NAME = names.BACKEND_KMOD
ClientFactory = Callable[[], Any]


#: the knobs of a searching periodic poller, as the module names them (kmod.PERIODIC_KNOBS)
SEARCH_KNOBS = ("round_ms", "min_interval_us", "max_interval_us", "min_change", "max_round")


def _periodic(p: Any) -> dict[str, object] | None:
    """What status shows of a periodic poller (module/uapi/kbp.h, KBP_A_NETAP_STATE): its
    knobs (the search's only while it searches), hand-backs and the search's state."""
    if not modespec.takes(p.mode, "interval_us"):
        return None
    out: dict[str, object] = {"interval_us": p.interval_us, "netap": bool(p.netap),
                              "handbacks": p.handbacks}
    if p.netap:
        out.update({k: getattr(p, k, None) for k in SEARCH_KNOBS})
        out["objective"] = _objective_name(getattr(p, "objective", None))
    if p.search is not None:
        out["search"] = dataclasses.asdict(p.search)
    return out


def _objective_name(v: Any) -> str:
    """The poller's objective by name (a module without the knob: bytes, its only one)."""
    if v is None:
        return names.OBJECTIVE_BYTES
    if isinstance(v, int):
        return {i: n for n, i in names.OBJECTIVE_IDS.items()}.get(v, str(v))
    return str(v)


def periodic_knobs(per: Periodic) -> dict[str, Any]:
    """The module's knobs for mode periodic (kmod.attach keyword arguments): a fixed interval
    is netap 0 + interval_us; the search is netap 1 + its range, round, MinChange and
    MaxRound and objective (:meth:`AttachHandler._attach` leaves the default objective out
    for a module without KBP_A_OBJECTIVE)."""
    if not per.search:
        return {"netap": 0, "interval_us": per.interval_us}
    return {"netap": 1, **{k: getattr(per, k) for k in SEARCH_KNOBS},
            "objective": per.objective}


def objective_refusal(per: Periodic | None) -> str | None:
    """Why this kbpctl cannot ask the module for ``per``'s objective (None: it can)."""
    if per is None or not per.search or per.objective == names.OBJECTIVE_BYTES:
        return None
    if "objective" in kmod.PERIODIC_KNOBS:
        return None
    return (f"--objective {per.objective} needs the kbp module's objective knob "
            "(KBP_A_OBJECTIVE), which this kbpctl's module client does not have: leave "
            f"--objective out (the search then maximizes {names.OBJECTIVE_BYTES})")


class AttachHandler:
    """kind ``kmod_attach``: key {dev, netns, ifindex}; value None (detached) or the
    attachment {cpu, queue_map, mode, linger_us, quota, rt_prio, freq_ctl, periodic, cls,
    nice} (periodic: the module's knobs of mode periodic, :func:`periodic_knobs`; None or
    absent in journals of other modes and of older kbpctl; cls and nice only for class
    non-rt: absent means the rt class)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def get(self, key: Mapping[str, Any]) -> Any:
        try:
            d = self.client.device(key["dev"], key.get("netns"))
        except kmod.KbpError as e:
            if e.errno in (errno.ENOENT, errno.ENODEV):
                return None
            raise
        if d is None:
            return None
        return {"attached": True, "state": d.state, "mode": d.mode, "cpu": d.cpu}

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        try:
            if value is None:
                self.client.detach(key["dev"], key.get("netns"))
                return
            self._attach(key, value)
        except kmod.KbpError as e:
            if value is None and e.errno in (errno.ENOENT, errno.ENODEV):
                raise TargetGone(str(e)) from e
            raise OSError(e.errno, _module_refusal(e, value)) from e

    def _attach(self, key: Mapping[str, Any], value: Mapping[str, Any]) -> None:
        """Attach with every knob of ``value``. The module keeps each CPU's knobs across
        requests (and pollers), so the default objective is sent too, or a bytes-per-cpu
        left by an earlier request would stay; but a client or module without the objective
        knob does the default only, so there it is left out (an old module refuses the
        unknown attribute before it changes anything: then the attach is retried)."""
        per = dict(value.get("periodic") or {})
        default = per.get("objective") == names.OBJECTIVE_BYTES
        if default and "objective" not in kmod.PERIODIC_KNOBS:
            del per["objective"]
        qm = value.get("queue_map")
        # the class only when not rt: an older module refuses the attribute it does not know
        cls = {k: value[k] for k in ("cls", "nice") if value.get(k) is not None}

        def attach() -> None:
            self.client.attach(key["dev"], key.get("netns"), cpu=value.get("cpu"),
                               queue_map=[tuple(p) for p in qm] if qm else None,
                               mode=value.get("mode"), linger_us=value.get("linger_us"),
                               quota=value.get("quota"), rt_prio=value.get("rt_prio"),
                               freq_ctl=value.get("freq_ctl"), **cls, **per)
        try:
            attach()
        except kmod.KbpError as e:
            if not (default and _unknown_objective(e, per)):
                raise
            del per["objective"]
            attach()


def attachment(req: EnableRequest, cpus: Sequence[int], napi_count: int | None
               ) -> dict[str, Any]:
    """The attach request for one device: cpu = first CPU; with several CPUs a queue map
    that puts NAPI i on cpus[i mod n]."""
    value: dict[str, Any] = {"cpu": cpus[0], "queue_map": None, "mode": req.mode,
                             "linger_us": req.linger_us, "quota": req.quota,
                             "rt_prio": req.resolved(NAME).rt_prio,
                             "freq_ctl": bool(req.freq_ctl)}
    if req.periodic is not None:
        value["periodic"] = periodic_knobs(req.periodic)
    if req.cls != names.CLASS_RT:  # only then: journals of the rt class stay as they were
        value["cls"] = req.cls
        value["nice"] = req.nice or 0
    if len(cpus) > 1:
        n = napi_count if napi_count else len(cpus)
        value["queue_map"] = [[i, cpus[i % len(cpus)]] for i in range(n)]
    return value


def placement_problems(queue_map: Sequence[Sequence[int]] | None,
                       napis: Sequence[Any]) -> list[Problem]:
    """Where the module serves a NAPI on another CPU than the queue map kbpctl sent
    (``[[index, cpu], ...]``) says: one line each.  kbpctl and the module number a
    device's NAPIs alike (its RX queues: the queue a driver links to a NAPI, else the order
    of its RX NAPIs, TX-only ones not counted), so a difference means the map does not do
    what was asked and must not be reported done."""
    want = {int(i): int(c) for i, c in (queue_map or [])}
    out = []
    for n in napis:
        if not want or n.cpu is None:
            continue
        if n.index not in want:
            out.append(Problem(MISPLACED, f"NAPI #{n.index} (id {n.id}) is served on CPU "
                               f"{n.cpu}, which the queue map it was enabled with does not "
                               f"name (it names NAPIs {', '.join(f'#{i}' for i in sorted(want))})"))
        elif n.cpu != want[n.index]:
            out.append(Problem(MISPLACED, f"NAPI #{n.index} (id {n.id}) is served on CPU "
                               f"{n.cpu}, not CPU {want[n.index]} as enabled"))
    return out


def check_freq_ctl(cpus: Sequence[int], host: Host = HOST) -> None:
    """freq_ctl sets the frequency through the userspace governor (as EE-KBP does): refuse
    before changing anything when a CPU has no cpufreq policy or another governor."""
    rep = sysinfo.cpufreq(cpus, host)
    have = {c.cpu: c for c in rep.cpus}
    for cpu in cpus:
        f = have.get(cpu)
        if f is None:
            raise Unavailable(f"--freq-ctl: CPU {cpu} has no cpufreq policy (no cpufreq driver "
                              "controls the frequency here): drop --freq-ctl")
        if f.governor != "userspace":
            raise InvalidInput(f"--freq-ctl needs the userspace governor on CPU {cpu} (it has "
                               f"{f.governor}): echo userspace > {host.cpu_dir}/cpu{cpu}/"
                               "cpufreq/scaling_governor (modprobe cpufreq_userspace)")


def default_rt_prio(mode: str) -> int:
    """The pollers' priority when none is asked for: SCHED_FIFO ``DEFAULT_RT_PRIO`` in every
    mode -- the module's busy poller yields to the other tasks of its CPU (docs/design.md
    §2, "Sharing the CPU"), so FIFO does not starve them.

    periodic too, as hybrid: its poller sleeps between polls (an hrtimer of interval_us with
    its NAPIs held, or untimed once every NAPI is handed back to interrupts), so at FIFO 50
    it takes its CPU for a poll per interval and no more; under a load that fills the budget
    it repolls at once, as hybrid does, and then yields like every module poller
    (``single_task_running()``, at most 50 us per ms held while others wait). FIFO is what
    keeps the interval an interval: at SCHED_NORMAL the wakeup of the timer would queue
    behind CFS tasks on a loaded CPU, and the search would measure the scheduler."""
    return DEFAULT_RT_PRIO


def _netns_inum(netns: str | None) -> int | None:
    try:
        return os.stat(NETNS_DIR / netns if netns else "/proc/self/ns/net").st_ino
    except OSError:
        return None


class KmodBackend:
    name = NAME

    def __init__(self, state: StateDir | None = None, client: ClientFactory | None = None,
                 host: Host = HOST) -> None:
        self.state = state or StateDir()
        self.client_factory: ClientFactory = client or kmod.Client
        self.host = host

    def _client(self) -> Any:
        try:
            return self.client_factory()
        except kmod.ModuleNotLoaded as e:
            raise Unavailable(str(e)) from None
        except kmod.KbpError as e:
            raise Unavailable(f"the kbp module does not answer: {e}") from None

    def default_rt_prio(self, mode: str) -> int:
        return default_rt_prio(mode)

    def available(self) -> tuple[bool, str]:
        try:
            c = self.client_factory()
        except kmod.ModuleNotLoaded:
            return False, "kbp module not loaded"
        except (kmod.KbpError, OSError) as e:
            return False, f"kbp module does not answer: {e}"
        c.close()
        return True, "kbp module loaded"

    def features(self) -> dict[str, Any]:
        ver = None
        with contextlib.suppress(OSError):
            ver = (kmod.SYS_MODULE / "version").read_text().strip()
        return {"module_version": ver, "genl_version": kmod.KBP_GENL_VERSION}

    # -- checks --------------------------------------------------------------------
    def _check_static(self, req: EnableRequest) -> None:
        validate_common(req, rt_prio_min=0)
        if req.repoll_us is not None:
            raise InvalidInput("--repoll-us is a knob of the stock backend's non-rt class: "
                               "the module's non-rt poller caps each poll at --quota and "
                               "gives way after it; drop --repoll-us (or use --backend stock)")
        why = objective_refusal(req.periodic)
        if why:
            raise Unavailable(why)
        if req.cpus is not None:
            sysinfo.validate_cpus(req.cpus, self.host)
        if req.freq_ctl:
            check_freq_ctl(req.cpus or sysinfo.online_cpus(self.host), self.host)
        if req.isolate:
            contention.check_isolate(req.cpus, sysinfo.online_cpus(self.host))

    def _prepare(self, client: Any, dev: str, netns: str | None,
                 replace_other: bool = False) -> tuple[Any, Record | None]:
        link, rec = lookup_device(self.state, NAME, dev, netns, replace_other)
        threaded = False
        with contextlib.suppress(KbpctlError, OSError), NetdevClient(netns) as nc:
            threaded = any(n.threaded for n in nc.napis(link.ifindex))
        if threaded and rec is None:
            raise InvalidInput(f"{dev} runs threaded NAPI, which the kbp module cannot take "
                               f"over: turn it off first (kbpctl disable {dev}, or write 0 to "
                               f"/sys/class/net/{dev}/threaded)")
        if rec is None and AttachHandler(client).get({"dev": dev, "netns": netns}):
            raise InvalidInput(f"{dev} is attached to the kbp module outside kbpctl: detach it "
                               "first (kbp.kmod.detach) so kbpctl can record what it changes")
        return link, rec

    def check(self, req: EnableRequest, replace_other: bool = False) -> None:
        req = req.resolved(NAME)
        self._check_static(req)
        check_netns(req.netns)
        client = self._client()
        try:
            require_root("kbpctl enable")
            for d in req.devices:
                self._prepare(client, d, req.netns, replace_other)
        finally:
            client.close()

    # -- enable --------------------------------------------------------------------
    def enable(self, req: EnableRequest) -> EnableResult:
        req = req.resolved(NAME)
        self._check_static(req)
        check_netns(req.netns)
        client = self._client()
        result = EnableResult(NAME, "")
        try:
            require_root("kbpctl enable")
            with self.state.lock():
                preps = [(d, *self._prepare(client, d, req.netns)) for d in req.devices]
                eff = self._effector(client)
                hook = PauseHook()
                started: list[str] = []
                try:
                    for dev, link, rec in preps:
                        if rec is not None:
                            self._restore(rec, eff)
                        started.append(dev)
                        result.devices.append(self._enable_one(client, eff, hook, req, dev,
                                                               link))
                except (OSError, KbpctlError, RestoreError, kmod.KbpError) as e:
                    for dev in reversed(started):
                        r = self.state.record(dev, req.netns)
                        if r is not None:
                            with contextlib.suppress(RestoreError):
                                self._restore(r, eff)
                    raise OperationFailed(f"enabling {started[-1] if started else '?'} with "
                                          f"the kbp module failed: {_reason(e)}{_hint(e)}; "
                                          "every change was rolled back") from e
        finally:
            client.close()
        result.notes = contention_notes(req, result, self.state, self.host)
        return result

    def _effector(self, client: Any) -> dict[str, Any]:
        """Attachments through ``client`` (None: the module is gone), and sysfs (RPS)."""
        fs = functools.cache(NetFS)       # one sysfs view per netns
        return {KIND_KMOD_ATTACH: AttachHandler(client) if client is not None else _Gone(),
                KIND_SYSFS: SysfsHandler(netns_gone(fs)), KIND_IRQ: IrqHandler(self.host)}

    def _enable_one(self, client: Any, eff: Mapping[str, Any], hook: Callable[[str], None],
                    req: EnableRequest, dev: str, link: Any) -> DeviceResult:
        cpus = req.cpus or sysinfo.online_cpus(self.host)
        napi_count = None
        with contextlib.suppress(KbpctlError, OSError), NetdevClient(req.netns) as nc:
            napi_count = len(nc.napis(link.ifindex)) or None
        journal = self.state.begin(NAME, dev, req.netns, link.ifindex, req.settings())
        changes = 0
        try:
            ex = Executor(journal, eff, hook)
            # RPS first: the poller must not hand its packets back to the softirq
            r = rps.read(NetFS(req.netns), dev, self.host)
            rps_plan = rps_off_plan(r, req)
            for attr, v in rps_plan:
                if ex.apply(KIND_SYSFS, sysfs_key(req.netns, dev, link.ifindex, attr),
                            v) is not None:
                    changes += 1
            if req.isolate:  # the other devices' interrupts off the polling CPUs
                changes += isolate_others(ex, req, cpus, self.state, self.host)
            key = {"dev": dev, "netns": req.netns, "ifindex": link.ifindex}
            value = attachment(req, cpus, napi_count)
            if ex.apply(KIND_KMOD_ATTACH, key, value) is not None:
                changes += 1
            served = _served(client, dev, req.netns)
            wrong = placement_problems(value["queue_map"], served)
            if wrong:
                raise InvalidInput(f"{dev}: the module did not place its queues as asked: "
                                   + "; ".join(map(str, wrong)))
            journal.done()
        finally:
            journal.close()
        # what the module did, where it says (a device that is down: what was asked)
        placed = sorted({n.cpu for n in served if n.cpu is not None}) or sorted(set(cpus))
        return DeviceResult(dev, req.netns, NAME, len(served) or napi_count or 0, placed,
                            changes, rps=r, rps_off=bool(rps_plan))

    def _restore(self, rec: Record, eff: Mapping[str, Any]) -> list[str]:
        notes = restore(rec, eff)
        remove_record(rec.path)
        return notes

    # -- disable -------------------------------------------------------------------
    def disable(self, devices: Sequence[str] | None = None,
                netns: str | None = None) -> DisableResult:
        require_root("kbpctl disable")
        result = DisableResult()
        try:
            client = self._client()
        except Unavailable:
            client = None
        try:
            with self.state.lock():
                recs = [r for r in self.state.records() if r.backend == NAME]
                if devices is not None:
                    recs = [r for r in recs if r.dev in devices and r.netns == netns]
                eff = self._effector(client)
                errors = []
                for rec in recs:
                    try:
                        notes = self._restore(rec, eff)
                    except RestoreError as e:
                        errors.append(f"{rec.dev}: {e} (journal kept; run disable again)")
                        continue
                    if client is None:
                        notes.append("the kbp module is not loaded: nothing is attached")
                    result.notes += [f"{rec.dev}: {n}" for n in notes]
                    result.devices.append(DeviceResult(rec.dev, rec.netns, NAME, 0, [],
                                                       len(rec.changes)))
                if errors:
                    raise OperationFailed("; ".join(errors))
        finally:
            if client is not None:
                client.close()
        return result

    # -- status --------------------------------------------------------------------
    def describe(self, netns: str | None, devices: Sequence[str] | None,
                 records: Sequence[Record], exclude: set[tuple[str, str | None]] | None = None,
                 ) -> tuple[list[DeviceStatus], list[PollerStatus]]:
        try:
            client = self.client_factory()
        except (kmod.KbpError, OSError):
            client = None
        wanted = [r for r in records
                  if devices is None or (r.dev in devices and r.netns == netns)]
        if client is None:
            return [self._status(r.dev, r.netns, r, None, False) for r in wanted], []
        try:
            devs, pollers = self._devices(client, netns, devices, wanted), self._pollers(client)
            for ds in devs:
                ds.problems += periodic_drift(ds, pollers) + stuck_pollers(ds, pollers)
            return devs, pollers
        except kmod.KbpError as e:
            if e.errno != errno.EPERM:
                raise
            why = f"{e}: the module answers CAP_NET_ADMIN only ('sudo kbpctl status')"
            return [self._status(r.dev, r.netns, r, None, True, why, needs_root=True)
                    for r in wanted], []
        finally:
            client.close()

    def _devices(self, client: Any, netns: str | None, devices: Sequence[str] | None,
                 records: Sequence[Record]) -> list[DeviceStatus]:
        """The journaled devices, then the ones attached outside kbpctl.

        The module's DEV_GET dump answers for the caller's netns only (for every netns from
        the initial one), so a device the dump does not show is asked for by name in its
        own netns (DEV_GET with KBP_A_NETNS_FD): status shows the same from any netns."""
        attached = client.devices()
        by_key = {(d.ifname, d.netns_inum): d for d in attached}
        seen: set[tuple[str | None, int | None]] = set()
        out = []
        for r in records:
            d, why = by_key.get((r.dev, _netns_inum(r.netns))), None
            if d is None:
                d, why = _lookup(client, r.dev, r.netns)
            if d is not None:
                seen.add((d.ifname, d.netns_inum))
            out.append(self._status(r.dev, r.netns, r, d, True, why))
        here = _netns_inum(netns)
        for d in attached:
            if (d.ifname, d.netns_inum) in seen or (devices is not None and (
                    d.ifname not in devices or d.netns_inum != here)):
                continue
            seen.add((d.ifname, d.netns_inum))
            ns = next((n for n in named_netns() if _netns_inum(n) == d.netns_inum), None)
            out.append(self._unmanaged(d, ns))
        for name in _probe_names(netns, devices):
            if (name, here) in seen or (name, here) in by_key:
                continue
            d, _ = _lookup(client, name, netns)
            if d is not None and (d.ifname, d.netns_inum) not in seen:
                seen.add((d.ifname, d.netns_inum))
                out.append(self._unmanaged(d, netns))
        return out

    def _unmanaged(self, d: Any, netns: str | None) -> DeviceStatus:
        ds = self._status(d.ifname or f"ifindex {d.ifindex}", netns, None, d, True)
        ds.managed = False
        return ds

    def _pollers(self, client: Any) -> list[PollerStatus]:
        out = []
        for p in client.pollers():
            pol, prio = None, p.rt_prio
            if p.pid:
                with contextlib.suppress(OSError):
                    s = sysinfo.get_sched(p.pid)
                    pol, prio = s.policy, s.priority
            # pid 0: the module does not show pids outside the initial pid namespace
            out.append(PollerStatus(cpu=p.cpu, cls=p.cls,
                                    device=p.ifname, state=p.state,
                                    nice=p.nice, pid=p.pid or None, mode=p.mode,
                                    linger_us=p.linger_us,
                                    quota=p.quota, napis=p.napis, policy=pol, priority=prio,
                                    counters=p.counters(), freq_ctl=p.freq_ctl,
                                    periodic=_periodic(p)))
        return out

    def _status(self, dev: str, netns: str | None, rec: Record | None, d: Any,
                loaded: bool, why: str | None = None, needs_root: bool = False
                ) -> DeviceStatus:
        """A device's status from the module's answer ``d`` (None: not attached, or, with
        ``why``, the module could not be asked; ``needs_root``: it answers CAP_NET_ADMIN
        only)."""
        req = rec.request if rec else {}
        ds = DeviceStatus(name=dev, netns=netns, ifindex=d.ifindex if d else None, kind=None,
                          backend=NAME, mode=(d.mode if d else None) or req.get("mode"),
                          linger_us=d.linger_us if d and d.linger_us is not None
                          else req.get("linger_us"),
                          rt_prio=req.get("rt_prio"), cpus=req.get("cpus"),
                          complete=rec.complete if rec else True,
                          periodic_request=req.get("periodic"))
        if d is not None:
            ds.counters = {"packets": d.packets, "polls": d.polls}
            for n in d.napis:
                ns_ = NapiStatus(id=n.id, index=n.index, cpu=n.cpu, state=d.state,
                                 counters={"packets": n.packets, "polls": n.polls})
                if n.pid:
                    ns_.thread = thread_status(n.pid, self.host)
                ds.napis.append(ns_)
            if d.state == "standby":
                ds.problems.append(Problem(DEVICE_DOWN, f"{dev} is down (or its NAPIs cannot be "
                                           "hooked): stock NAPI serves it until it is up"))
            cpus = sorted({n.cpu for n in d.napis if n.cpu is not None})
            ds.cpus = cpus or ([d.cpu] if d.cpu is not None else ds.cpus)
            ds.problems += [Problem(p.kind, f"{p.text}: 'kbpctl enable {dev}' again places them")
                            for p in placement_problems(_asked_map(rec), d.napis)]
        elif not loaded:
            ds.problems.append(Problem(MODULE_NOT_LOADED, "the kbp module is not loaded: "
                                       f"'kbpctl disable {dev}' forgets this device"))
        elif why:
            ds.problems.append(Problem(NEEDS_ROOT if needs_root else MODULE_SILENT,
                                       f"the kbp module did not say how it serves {dev}: {why}"))
        else:
            ds.problems.append(Problem(DETACHED, f"{dev} is not attached to the module any "
                                       "more: 'kbpctl apply' or enable again"))
        if rec is not None and not rec.complete:
            ds.problems.append(Problem(INTERRUPTED, f"enable was interrupted after {rec.steps} "
                                       f"change(s): 'kbpctl disable {dev}' restores"))
        show_rps(ds, read_rps(NetFS, dev, netns, self.host), rec.request if rec else None,
                 rec.complete if rec else True)
        return ds


def stuck_pollers(ds: DeviceStatus, pollers: Sequence[PollerStatus]) -> list[Problem]:
    """A problem for each poller of ``ds`` the module reports stuck: it did not give a
    NAPI back in time, because a task of higher priority hogs its CPU; until it runs again
    it takes no new NAPI, and its device's NAPIs wait."""
    return [Problem(POLLER_STUCK, f"poller {p.name} is stuck: it did not give a "
                    f"NAPI back in time (a task of higher priority hogs CPU {p.cpu}); find it "
                    "with 'kbpctl status' (tasks on polling CPUs) or 'top -H' and move or stop "
                    "it")
            for p in pollers if p.state == "stuck" and p.device == ds.name]


def _asked_map(rec: Record | None) -> list[list[int]] | None:
    """The queue map kbpctl's journal says it attached with (None: none)."""
    for c in (rec.changes if rec else []):
        if c.kind == KIND_KMOD_ATTACH and isinstance(c.new, dict):
            return c.new.get("queue_map")
    return None


def _served(client: Any, dev: str, netns: str | None) -> list[Any]:
    """The NAPIs the module serves for ``dev`` now (none while it is down)."""
    d = client.device(dev, netns)
    return list(d.napis) if d is not None else []


def periodic_drift(ds: DeviceStatus, pollers: Sequence[PollerStatus]) -> list[Problem]:
    """Problems when a poller serving ``ds`` runs other periodic knobs than kbpctl enabled
    (changed behind kbpctl's back, e.g. kbp.kmod.poller_set): ``apply`` re-enables."""
    if not ds.managed or not ds.periodic_request or not ds.cpus:
        return []
    try:
        want = periodic_knobs(Periodic(**ds.periodic_request))
    except (TypeError, KbpctlError):
        return []   # a journal of another kbpctl: nothing to compare with
    out = []
    for p in pollers:
        # the pollers of the device's CPUs that serve it (one per device on a CPU)
        if p.cpu not in ds.cpus or not p.periodic or (p.device and p.device != ds.name):
            continue
        have = {**p.periodic, "netap": int(bool(p.periodic.get("netap")))}
        diff = [f"{k} {have.get(k)} (enabled with {v})" for k, v in want.items()
                if have.get(k) != v]
        if diff:
            out.append(Problem(PERIODIC_DRIFT, f"poller {p.name} runs {', '.join(diff)}: "
                               "'kbpctl apply' or enable again"))
    return out


class _Gone:
    """Attach handler when the module is gone: nothing is attached."""

    def get(self, key: Mapping[str, Any]) -> Any:
        return MISSING

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        raise TargetGone("kbp module not loaded")


def _module_refusal(e: kmod.KbpError, value: Mapping[str, Any] | None) -> str:
    """The module's refusal of an attachment in words: its extack message (ERANGE/EINVAL
    name the knob and its range), or, for the objective knob sent to a module that predates
    it (the kernel's strict attribute check: EINVAL, "Unknown attribute type"), what to do."""
    per = (value or {}).get("periodic") or {}
    if _unknown_objective(e, per):
        return (f"{e.request + ': ' if e.request else ''}the loaded kbp module does not know "
                f"the objective knob (it refused KBP_A_OBJECTIVE: {e.message}): --objective "
                f"{per['objective']} needs a newer kbp.ko; load it, or leave --objective out "
                f"(the search then maximizes {names.OBJECTIVE_BYTES})")
    return str(e)


def _unknown_objective(e: kmod.KbpError, per: Mapping[str, Any]) -> bool:
    """``e`` is a module's refusal of the objective attribute it does not know."""
    return "objective" in per and e.errno == errno.EINVAL and (
        "attribute" in e.message.lower() or e.message == os.strerror(errno.EINVAL))


def _reason(e: BaseException) -> str:
    """A failed enable's cause: the module's own message when it refused (not the OSError
    the attach handler wraps it in, whose str() leads with "[Errno N]")."""
    if isinstance(e, OSError) and isinstance(e.__cause__, kmod.KbpError):
        return e.strerror or str(e.__cause__)
    return str(e)


def _hint(e: BaseException) -> str:
    """What to do about a refusal the operator can fix by asking for less."""
    if isinstance(e, OSError) and isinstance(e.__cause__, kmod.KbpError):
        e = e.__cause__
    if isinstance(e, kmod.KbpError) and e.errno == errno.EPERM and "CAP_SYS_NICE" in e.message:
        return (" (a process without CAP_SYS_NICE, e.g. a container with only NET_ADMIN, "
                "may attach with --mode hybrid --rt-prio 0)")
    return ""


def _lookup(client: Any, dev: str, netns: str | None) -> tuple[Any, str | None]:
    """DEV_GET for one device in its netns: (the device or None when it is not attached,
    why the module could not be asked)."""
    try:
        return client.device(dev, netns), None
    except kmod.KbpError as e:
        if e.errno in (errno.ENOENT, errno.ENODEV):
            return None, None
        return None, str(e)


def _probe_names(netns: str | None, devices: Sequence[str] | None) -> list[str]:
    """Devices of another netns to ask the module about by name (the dump may not show
    them): the ones named, else every link there."""
    if netns is None:
        return []
    if devices is not None:
        return list(devices)
    try:
        return link_names(netns)
    except (KbpctlError, OSError):
        return []

