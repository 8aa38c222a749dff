"""Declarative configuration (/etc/kbp/kbp.toml) and ``kbpctl apply``.

The file lists the devices kbp should serve; ``apply`` converges to it: it enables what is
listed and not (or differently, or incompletely) enabled, and disables what kbpctl enabled
that is no longer listed. Example (also in kbp/data/kbp.toml.example)::

    backend = "auto"            # auto | kmod | stock

    [defaults]                  # apply to every [[device]] unless it says otherwise
    mode = "hybrid"             # hybrid | busy | periodic
    rt_prio = 50                # SCHED_FIFO priority of the polling threads (1..99; omit:
                                # the backend's default, FIFO 50 -- SCHED_NORMAL for the
                                # stock backend's busy, which refuses a priority)
    cpus = "1"                  # CPU list; NAPIs round-robin over it (default: all online)
    linger_us = 20              # keep polling this long after the last packet (hybrid)
    freq_ctl = false            # kmod, hybrid: CPU to min frequency while a poller sleeps
    keep_rps = false            # true: leave RPS on (default: enable turns it off)
    # class = "non-rt"          # rt (default) | non-rt: SCHED_NORMAL poller below the CPU's
    # nice = 5                  # rt poller (hybrid only); nice: its nice (non-rt only)
    # repoll_us = 20            # stock non-rt: heavy NAPIs re-polled every N us (0: off)
    # mode periodic only (NetAP): interval_us (fixed; omit: searched), round_ms,
    # min_interval_us, max_interval_us, min_change, max_round, objective ("bytes" or
    # "bytes-per-cpu"); see kbpctl enable --help

    [rt_class]                  # PREEMPT_RT: serve every device whose interrupt threads
    rtnet_prio = 47             # run at SCHED_FIFO/RR >= 47, with [defaults] (kbp.rtclass;
    netns = []                  # also look in these netns); `apply --watch S` re-evaluates
    non_rt = "poll"             # the devices below rtnet_prio whose queue interrupts land
    nice = 0                    # on an RT poller's CPU: class non-rt there at this nice
                                # ("poll", the default), or left in softirq ("leave")

    [[device]]
    name = "eth1"

    [[device]]
    name = "veth-s"
    netns = "server"
    cpus = "1"
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp import modespec, names, rtclass
from kbp.backends import EnableRequest, EnableResult, Periodic, changed_settings
from kbp.errors import InvalidInput
from kbp.sysinfo import format_cpulist, parse_cpulist
from kbp.system.journal import Record

DEFAULT_PATH = Path("/etc/kbp/kbp.toml")
DEVICE_KEYS = {"name", "netns", "mode", "cpus", "rt_prio", "linger_us", "quota", "freq_ctl",
               "keep_rps", "isolate", "backend", "class", "nice", "repoll_us",
               *names.PERIODIC_KNOBS}
DEFAULT_KEYS = DEVICE_KEYS - {"name", "netns"}
TOP_KEYS = {"backend", "defaults", "device", "rt_class"}
RT_CLASS_KEYS = {"rtnet_prio", "netns", "non_rt", "nice"}


@dataclass
class DeviceConfig:
    name: str
    netns: str | None = None
    backend: str = "auto"
    mode: str = modespec.DEFAULT.name
    cpus: list[int] | None = None
    rt_prio: int | None = None  # None: the backend's default for the mode (resolved in plan)
    linger_us: int | None = None
    quota: int | None = None
    freq_ctl: bool = False
    keep_rps: bool = False
    isolate: bool = False
    periodic: dict[str, Any] = field(default_factory=dict)  # mode periodic: knobs given
    cls: str = names.CLASS_RT  # key "class"
    nice: int | None = None
    repoll_us: int | None = None  # stock, class non-rt: --repoll-us

    def request(self) -> EnableRequest:
        per = None
        if self.periodic:
            if not modespec.takes(self.mode, "interval_us"):
                raise InvalidInput(f"device {self.name}: {sorted(self.periodic)[0]} applies "
                                   f"to mode periodic only, not {self.mode}")
            per = Periodic.from_args(**self.periodic)
        return EnableRequest(devices=[self.name], netns=self.netns, mode=self.mode,
                             cpus=self.cpus, rt_prio=self.rt_prio, linger_us=self.linger_us,
                             quota=self.quota, freq_ctl=self.freq_ctl, keep_rps=self.keep_rps,
                             periodic=per, isolate=self.isolate, cls=self.cls,
                             nice=self.nice, repoll_us=self.repoll_us)


@dataclass
class Config:
    path: Path
    backend: str = "auto"
    devices: list[DeviceConfig] = field(default_factory=list)
    defaults: dict[str, Any] = field(default_factory=dict)  # [defaults] as written
    rt_class: rtclass.RtClassRule | None = None

    def class_device(self, dev: str, netns: str | None) -> DeviceConfig:
        """A device the [rt_class] rule selected, with the [defaults] settings."""
        d = DeviceConfig(name=dev, netns=netns, backend=self.backend)
        _apply_keys(f"{self.path}: defaults", d, self.defaults)
        return d

    def non_rt_device(self, dev: str, netns: str | None, cpus: list[int]) -> DeviceConfig:
        """A device below rtnet_prio on an RT poller's CPU (``[rt_class] non_rt = "poll"``):
        class non-rt on ``cpus`` at the rule's nice, hybrid, no linger; of the [defaults]
        only backend and keep_rps apply (the rest are the RT devices' knobs)."""
        assert self.rt_class is not None
        d = DeviceConfig(name=dev, netns=netns, backend=self.backend, cpus=cpus,
                         cls=names.CLASS_NON_RT, nice=self.rt_class.nice)
        _apply_keys(f"{self.path}: defaults",
                    d, {k: v for k, v in self.defaults.items() if k in ("backend", "keep_rps")})
        return d


def _suggest(key: str, allowed: set[str]) -> str:
    import difflib
    m = difflib.get_close_matches(key, sorted(allowed), n=1)
    return f" (did you mean {m[0]}?)" if m else f" (allowed: {', '.join(sorted(allowed))})"


def _int(where: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidInput(f"{where}: expected an integer, got {v!r}")
    return v


def _bool(where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidInput(f"{where}: expected true or false, got {v!r}")
    return v


def _str(where: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidInput(f"{where}: expected a string, got {v!r}")
    return v


def _apply_keys(where: str, d: DeviceConfig, raw: Mapping[str, Any]) -> None:
    for k, v in raw.items():
        w = f"{where}.{k}"
        if k == "name":
            d.name = _str(w, v)
        elif k == "netns":
            d.netns = _str(w, v)
        elif k == "backend":
            d.backend = _str(w, v)
            if d.backend not in names.BACKENDS:
                raise InvalidInput(f"{w}: unknown backend {v!r} (auto, kmod or stock)")
        elif k == "mode":
            d.mode = _str(w, v)
        elif k == "cpus":
            d.cpus = parse_cpulist(_str(w, v)) if isinstance(v, str) else \
                [_int(w, c) for c in v] if isinstance(v, list) else [_int(w, v)]
        elif k == "rt_prio":
            d.rt_prio = _int(w, v)
        elif k == "linger_us":
            d.linger_us = _int(w, v)
        elif k == "quota":
            d.quota = _int(w, v)
        elif k == "freq_ctl":
            d.freq_ctl = _bool(w, v)
        elif k == "keep_rps":
            d.keep_rps = _bool(w, v)
        elif k == "isolate":
            d.isolate = _bool(w, v)
        elif k == "class":
            d.cls = _str(w, v)
            if d.cls not in names.CLASSES:
                raise InvalidInput(f"{w}: unknown class {v!r} ({' or '.join(names.CLASSES)})")
        elif k == "nice":
            d.nice = _int(w, v)
        elif k == "repoll_us":
            d.repoll_us = _int(w, v)
        elif k == "objective":
            d.periodic[k] = _str(w, v)
        elif k in names.PERIODIC_KNOBS:
            d.periodic[k] = _int(w, v)


def parse(text: str, path: Path = DEFAULT_PATH) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidInput(f"{path}: {e}") from None
    for k in raw:
        if k not in TOP_KEYS:
            raise InvalidInput(f"{path}: unknown key {k!r}{_suggest(k, TOP_KEYS)}")
    cfg = Config(path=path, backend=_str(f"{path}: backend", raw.get("backend", "auto")))
    if cfg.backend not in names.BACKENDS:
        raise InvalidInput(f"{path}: unknown backend {cfg.backend!r} (auto, kmod or stock)")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise InvalidInput(f"{path}: [defaults] must be a table")
    for k in defaults:
        if k not in DEFAULT_KEYS:
            raise InvalidInput(f"{path}: defaults.{k}: unknown key{_suggest(k, DEFAULT_KEYS)}")
    cfg.defaults = dict(defaults)
    cfg.rt_class = _rt_class(path, raw.get("rt_class"))
    devs = raw.get("device", [])
    if not isinstance(devs, list):
        raise InvalidInput(f"{path}: write devices as [[device]] tables")
    seen = set()
    for i, dv in enumerate(devs):
        where = f"{path}: device[{i}]"
        _check_table(where, dv, DEVICE_KEYS)
        if "name" not in dv:
            raise InvalidInput(f"{where}: needs name = \"DEV\"")
        d = DeviceConfig(name="", backend=cfg.backend)
        _apply_keys(f"{path}: defaults", d, defaults)
        _apply_keys(where, d, dv)
        if (d.name, d.netns) in seen:
            raise InvalidInput(f"{where}: {d.name} is listed twice")
        seen.add((d.name, d.netns))
        cfg.devices.append(d)
    return cfg


def _check_table(where: str, raw: Any, allowed: set[str]) -> None:
    """``raw`` is a TOML table whose keys are all in ``allowed`` (else a refusal that
    suggests the closest key)."""
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: must be a table")
    for k in raw:
        if k not in allowed:
            raise InvalidInput(f"{where}.{k}: unknown key{_suggest(k, allowed)}")


def _rt_class(path: Path, raw: Any) -> rtclass.RtClassRule | None:
    if raw is None:
        return None
    where = f"{path}: rt_class"
    _check_table(where, raw, RT_CLASS_KEYS)
    if "rtnet_prio" not in raw:
        raise InvalidInput(f"{where}: needs rtnet_prio = N (the lowest interrupt-thread "
                           f"priority that makes a device RT, {rtclass.RTNET_PRIO_MIN}.."
                           f"{rtclass.RTNET_PRIO_MAX})")
    ns = raw.get("netns", [])
    if not isinstance(ns, list) or not all(isinstance(n, str) and n for n in ns):
        raise InvalidInput(f"{where}.netns: expected a list of netns names, got {ns!r}")
    rule = rtclass.RtClassRule(_int(f"{where}.rtnet_prio", raw["rtnet_prio"]), tuple(ns),
                               _str(f"{where}.non_rt", raw.get("non_rt", rtclass.NON_RT_POLL)),
                               _int(f"{where}.nice", raw.get("nice", 0)))
    try:
        rule.check_range()
    except InvalidInput as e:
        raise InvalidInput(f"{path}: {e}") from None
    return rule


def load(path: Path = DEFAULT_PATH) -> Config:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InvalidInput(f"no config file {path}: write one (from /etc/kbp/kbp.toml.example "
                           "of the kbpctl package, kbp/data/kbp.toml.example of the Python "
                           "package, or docs/kbpctl.md) or pass --config") from None
    return parse(text, path)


@dataclass
class Action:
    op: str  # enable | reenable | disable | keep
    dev: str
    netns: str | None
    backend: str
    why: str = ""
    request: EnableRequest | None = None
    result: EnableResult | None = None  # what enable did (after a real apply)


def plan(cfg: Config, records: list[Record], backend_for: Mapping[str, str],
         problems: Mapping[tuple[str, str | None], list[str]],
         classes: Sequence[rtclass.DeviceClass] = ()) -> list[Action]:
    """What ``apply`` does: compare the config with the journals (pure).

    ``backend_for`` maps a configured backend name ("auto", "stock", "kmod") to the concrete
    one; ``problems`` are status problems per managed device (drift makes it re-enable);
    ``classes``: the devices the ``[rt_class]`` rule classified (RT ones are served with the
    ``[defaults]`` unless a ``[[device]]`` entry names them).
    """
    have = {(r.dev, r.netns): r for r in records}
    actions: list[Action] = []
    wanted = set()
    why_class = {(c.dev, c.netns): c for c in classes}
    listed = {(d.name, d.netns) for d in cfg.devices}
    devices = [*cfg.devices, *(cfg.class_device(c.dev, c.netns) for c in classes
                               if c.rt and (c.dev, c.netns) not in listed)]
    non_rt = non_rt_devices(cfg, devices, classes, listed)
    why_non_rt = {(d.name, d.netns): d for d in non_rt}
    for d in devices + non_rt:
        key = (d.name, d.netns)
        wanted.add(key)
        be = backend_for[d.backend]
        req = d.request().resolved(be)  # rt_prio left out: the priority enable would journal
        rec = have.get(key)
        new = "not enabled" if key in listed else f"RT class: {why_class[key].why}"
        if key in why_non_rt:
            new = (f"non-rt class on CPU {format_cpulist(d.cpus or [])} (its queue "
                   f"interrupts share it with an RT poller): {why_class[key].why}")
        if rec is None:
            actions.append(Action("enable", d.name, d.netns, be, new, req))
        elif rec.backend != be:
            actions.append(Action("reenable", d.name, d.netns, be,
                                  f"backend {rec.backend} -> {be}", req))
        elif not rec.complete:
            actions.append(Action("reenable", d.name, d.netns, be, "enable was interrupted",
                                  req))
        elif changed := changed_settings(rec.request, req.settings()):
            actions.append(Action("reenable", d.name, d.netns, be,
                                  f"{', '.join(changed)} changed", req))
        elif problems.get(key):
            actions.append(Action("reenable", d.name, d.netns, be, problems[key][0], req))
        else:
            actions.append(Action("keep", d.name, d.netns, be, "in sync", req))
    for key, rec in sorted(have.items(), key=lambda kv: (kv[0][1] or "", kv[0][0])):
        if key not in wanted:
            c = why_class.get(key)
            actions.append(Action("disable", rec.dev, rec.netns, rec.backend,
                                  f"not in the config, and not RT: {c.why}" if c
                                  else "not in the config"))
    return actions


def non_rt_devices(cfg: Config, served: Sequence[DeviceConfig],
                   classes: Sequence[rtclass.DeviceClass],
                   listed: set[tuple[str, str | None]]) -> list[DeviceConfig]:
    """``[rt_class] non_rt = "poll"``: the devices below rtnet_prio (not named in the file)
    whose queue interrupts land on a CPU where one of ``served``'s RT pollers runs, each as
    class non-rt on the CPUs its interrupts land on (pure)."""
    rule = cfg.rt_class
    if rule is None or rule.non_rt != rtclass.NON_RT_POLL:
        return []
    rt = [d for d in served if d.cls == names.CLASS_RT]
    if not rt:
        return []
    every = any(d.cpus is None for d in rt)  # an RT device polled on every online CPU
    rt_cpus = None if every else {c for d in rt for c in d.cpus or []}
    out = []
    for c in classes:
        cpus = rtclass.shares_rt_cpu(c, rt_cpus)
        if cpus and (c.dev, c.netns) not in listed:
            out.append(cfg.non_rt_device(c.dev, c.netns, cpus))
    return out


def converge(cfg: Config, dry_run: bool = False, state: Any = None) -> list[Action]:
    """Make the system match ``cfg``; every enable is checked before anything changes."""
    from kbp import backends
    from kbp.system.journal import StateDir
    st = state or StateDir()
    if not dry_run:
        backends.require_root("kbpctl apply")
    auto_be, _ = backends.resolve_auto(st)
    backend_for = {"auto": auto_be.name, names.BACKEND_STOCK: names.BACKEND_STOCK,
                   names.BACKEND_KMOD: names.BACKEND_KMOD}
    classes: list[rtclass.DeviceClass] = []
    if cfg.rt_class is not None:
        cfg.rt_class.validate()
        classes = rtclass.scan(cfg.rt_class)
    status = backends.status(state=st)
    problems = {(d.name, d.netns): [str(p) for p in d.problems]
                for d in status.devices if d.backend}
    actions = plan(cfg, st.records(), backend_for, problems, classes)
    if dry_run:
        return actions
    rtclass.save_rule(st.root, cfg.rt_class)
    current = {(r.dev, r.netns): r.backend for r in st.records()}
    for a in actions:
        if a.op in ("enable", "reenable"):
            assert a.request is not None
            backends.get(a.backend, st).check(a.request, replace_other=True)
    for a in actions:
        if a.op == "disable" or (a.op == "reenable" and current.get((a.dev, a.netns))
                                 not in (None, a.backend)):
            backends.disable([a.dev], a.netns, st)
    # A reenable for a class change (a device crossing rtnet_prio under --watch) loses no
    # packet: the stock backend changes its NAPI threads' policy in place (threaded NAPI
    # stays on: StockBackend._reclass_one); the kmod backend detaches and attaches again,
    # and the module's detach lets the poller complete each NAPI or hand it, still
    # scheduled, to the softirq (module/kbp_main.c, the release wait), its ring untouched,
    # before the attach takes it over.
    for a in actions:
        if a.op in ("enable", "reenable"):
            assert a.request is not None
            a.result = backends.get(a.backend, st).enable(a.request)
    return actions
