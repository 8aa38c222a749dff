"""Python client of the kbp kernel module's generic netlink family "kbp" (module/uapi/kbp.h).

Message classes mirror the uapi enums exactly: their ``nla_map`` is built from the family's
spec (module/netlink/kbp.yaml, through the generated :mod:`kbp._spec`), and a unit test checks
them against the header generated from the same spec. Every call opens a socket in the
caller's network namespace; a device in another namespace is named together with that
namespace (``netns="NAME"`` opens /run/netns/NAME and passes its fd as KBP_A_NETNS_FD).

>>> from kbp import kmod
>>> kmod.attach("eth1", cpu=3, mode="hybrid", linger_us=50)
>>> [p.packets for p in kmod.pollers()]

Errors from the kernel arrive as :class:`KbpError` (errno + the kernel's extack message);
an absent module as :class:`ModuleNotLoaded`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pyroute2.netlink import NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, genlmsg, nla
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import GenericNetlinkSocket

from kbp import _spec, names

KBP_GENL_NAME = _spec.KBP_GENL_NAME
KBP_GENL_VERSION = _spec.KBP_GENL_VERSION
SYS_MODULE = Path("/sys/module/kbp")
NETNS_DIR = Path("/run/netns")

STATE_NAMES = {v: k for k, v in _spec.ENUMS["state"].items()}  # enum kbp_state


def __getattr__(name: str) -> int:
    """``kmod.KBP_*``: every constant of module/uapi/kbp.h (and of kbp_spec.h), by its C
    name, from :mod:`kbp._spec`."""
    value = getattr(_spec, name, None) if name.startswith("KBP_") else None
    if not isinstance(value, int):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return value


#: knobs of mode periodic (u32 each), as keyword arguments of attach() and poller_set()
#: (objective: the id of names.OBJECTIVE_IDS, or its name)
PERIODIC_KNOBS = ("interval_us", "netap", "round_ms", "min_interval_us", "max_interval_us",
                  "min_change", "max_round", "objective")

#: the spec's attribute types as pyroute2's nla types (nests: the class attribute named after
#: the nested attribute set)
_NLA_TYPES = {"unused": "none", "pad": "none", "u8": "uint8", "u16": "uint16", "u32": "uint32",
              "u64": "uint64", "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
              "flag": "flag", "string": "asciiz", "binary": "cdata"}


def _nla_map(attr_set: str) -> tuple[tuple[Any, ...], ...]:
    """A pyroute2 ``nla_map`` of one of the spec's attribute sets (module/netlink/kbp.yaml)."""
    return tuple((a.value, a.c_name, a.nested.replace("-", "_"), NLA_F_NESTED)
                 if a.type == "nest" else (a.value, a.c_name, _NLA_TYPES[a.type])
                 for a in _spec.ATTRIBUTE_SETS[attr_set])


class kbp_map_entry(nla):
    """KBP_A_MAP_ENTRY: one NAPI index -> CPU pair."""

    nla_map = _nla_map("map-entry")


class kbp_queue_map(nla):
    """KBP_A_QUEUE_MAP: a nest of KBP_A_MAP_ENTRY nests."""

    nla_map = _nla_map("queue-map")
    map_entry = kbp_map_entry


class kbp_napi(nla):
    """KBP_A_NAPI: one NAPI of an attached device (output)."""

    nla_map = _nla_map("napi")


class kbp_netap_state(nla):
    """KBP_A_NETAP_STATE: the interval search of a periodic poller (output)."""

    nla_map = _nla_map("netap-state")


class kbpmsg(genlmsg):
    """A message of the kbp family (every command uses the one attribute space KBP_A_*)."""

    nla_map = _nla_map("kbp")
    queue_map = kbp_queue_map
    map_entry = kbp_map_entry
    napi = kbp_napi
    netap_state = kbp_netap_state


# -- errors ---------------------------------------------------------------------------
class KbpError(Exception):
    """The kernel refused a request: ``errno`` and the extack message (may be empty)."""

    def __init__(self, err: int, message: str = "", request: str = "") -> None:
        self.errno = err
        self.message = message or os.strerror(err)
        self.request = request
        super().__init__(err, self.message)

    def __str__(self) -> str:
        what = f"{self.request}: " if self.request else ""
        return f"{what}{self.message} ({errno.errorcode.get(self.errno, self.errno)})"


class ModuleNotLoaded(KbpError):
    """The generic netlink family "kbp" cannot be resolved: the module is not loaded."""

    def __init__(self) -> None:
        super().__init__(errno.ENOENT, (
            "the kbp kernel module is not loaded: load it with 'modprobe kbp' (or install "
            "the kbp DKMS package), or use the stock backend (--backend stock)"))

    def __str__(self) -> str:
        return self.message


# -- results --------------------------------------------------------------------------
def mode_name(mode_id: int | None) -> str | None:
    if mode_id is None:
        return None
    return names.MODE_NAMES.get(mode_id, str(mode_id))


def mode_id(mode: str | int) -> int:
    if isinstance(mode, int):
        return mode
    try:
        return names.MODE_IDS[mode]
    except KeyError:
        raise ValueError(f"unknown mode {mode!r} (one of {', '.join(names.MODE_IDS)})") \
            from None


def class_name(cls_id: int | None) -> str:
    """KBP_A_CLASS's name (names.CLASSES).  A module that does not say has no classes: every
    poller and device of it is rt, and this is the one place that rule is spelled."""
    if cls_id is None:
        return names.CLASS_RT
    return names.CLASS_NAMES.get(cls_id, str(cls_id))


def class_id(cls: str | int) -> int:
    if isinstance(cls, int):
        return cls
    try:
        return names.CLASS_IDS[cls]
    except KeyError:
        raise ValueError(f"unknown class {cls!r} (one of {', '.join(names.CLASSES)})") \
            from None


_OBJECTIVE_NAMES = {v: k for k, v in names.OBJECTIVE_IDS.items()}


def objective_name(objective: int | None) -> str | None:
    """KBP_A_OBJECTIVE's name (names.OBJECTIVES); an id this client does not know as a str."""
    if objective is None:
        return None
    return _OBJECTIVE_NAMES.get(objective, str(objective))


def objective_id(objective: str | int) -> int:
    """The id of an objective given by name or id; an id is passed on as it is (the module
    checks its range)."""
    if isinstance(objective, str):
        try:
            return names.OBJECTIVE_IDS[objective]
        except KeyError:
            raise ValueError(f"unknown objective {objective!r} (one of "
                             f"{', '.join(names.OBJECTIVES)})") from None
    return int(objective)


@dataclass
class NetapState:
    """The interval search of a periodic poller with netap on (docs/netap.md)."""

    round: int | None = None  # rounds since the search (re)started, round 0 included
    rounds: int | None = None  # rounds since it was started on this poller
    interval_us: int | None = None  # interval of the running round
    low_us: int | None = None  # probe interval_low (the longer one)
    high_us: int | None = None  # probe interval_high
    range_lo_us: int | None = None
    range_hi_us: int | None = None
    distance_us: int | None = None
    converged: bool | None = None
    restarts: int | None = None
    objective: str | None = None  # what the search maximizes (names.OBJECTIVES)
    last_objective: int | None = None  # its value in the last round: bytes, or bytes/CPU-s
    last_bytes: int | None = None  # bytes the poller's devices received in the last round
    last_cpu_ns: int | None = None  # CPU time of the poller thread in the last round

    @property
    def last_work(self) -> int | None:
        """The objective's value in the last round (its name when it counted packets)."""
        return self.last_objective


#: the module's poller counters (names.MODULE_POLLER_COUNTER_HELP: the counters of the
#: spec's poller-get reply) and their attributes: Poller's counter fields
_C_NAMES = {a.name.replace("-", "_"): a.c_name for a in _spec.ATTRIBUTE_SETS["kbp"]}
POLLER_COUNTER_ATTRS: dict[str, str] = {c: _C_NAMES[c] for c in names.MODULE_POLLER_COUNTER_HELP}

_C = TypeVar("_C", bound=type)


def _with_counters(after: str) -> Callable[[_C], _C]:
    """A class decorator, under ``@dataclass``: every POLLER_COUNTER_ATTRS becomes a field
    ``int | None = None`` right after the field ``after``, in the spec's order."""
    def add(cls: _C) -> _C:
        own = dict(cls.__annotations__)
        if after not in own:
            raise TypeError(f"{cls.__name__}: no field {after!r}")
        if set(own) & set(POLLER_COUNTER_ATTRS):
            raise TypeError(f"{cls.__name__}: a field named as a counter of the spec: "
                            f"{', '.join(sorted(set(own) & set(POLLER_COUNTER_ATTRS)))}")
        ann: dict[str, Any] = {}
        for k, v in own.items():
            ann[k] = v
            if k == after:
                ann.update(dict.fromkeys(POLLER_COUNTER_ATTRS, "int | None"))
        cls.__annotations__ = ann
        for c in POLLER_COUNTER_ATTRS:
            setattr(cls, c, None)
        return cls
    return add


@dataclass
@_with_counters(after="napis")
class Poller:
    """One poller kthread (``kbp/<cpu>:<dev>``, or ``kbpn/<cpu>:<dev>`` for class non-rt):
    the module runs one per CPU, class and device; the pollers of a CPU and class share
    its knobs and take turns.

    After ``napis`` come its counters (passes, ..., takeovers), a field ``int | None``
    each: the spec's, POLLER_COUNTER_ATTRS (module/netlink/kbp.yaml; what each counts:
    names.MODULE_POLLER_COUNTER_HELP)."""

    cpu: int
    cls: str = names.CLASS_RT  # or names.CLASS_NON_RT (class_name)
    nice: int | None = None  # non-rt: the thread's nice
    pid: int | None = None  # 0: the caller is outside the initial pid namespace (unknown)
    mode: str | None = None
    linger_us: int | None = None
    quota: int | None = None
    rt_prio: int | None = None  # 0: SCHED_NORMAL, 1..99: SCHED_FIFO priority
    freq_ctl: bool | None = None  # hybrid: CPU frequency to min while asleep, max awake
    napis: int | None = None
    # (the counters: _with_counters)
    interval_us: int | None = None  # periodic: the interval while netap is off
    netap: bool | None = None  # periodic: search the interval
    round_ms: int | None = None
    min_interval_us: int | None = None
    max_interval_us: int | None = None
    min_change: int | None = None
    max_round: int | None = None
    objective: str | None = None  # periodic: what the search maximizes (names.OBJECTIVES)
    search: NetapState | None = None  # periodic with netap on
    ifindex: int | None = None  # the device it serves (None once detached: stopping)
    ifname: str | None = None
    netns_inum: int | None = None
    #: active (its thread runs), stopping (told to stop, listed until its thread exits),
    #: stuck (did not give a NAPI back in time: a higher-priority task hogs its CPU)
    state: str | None = None

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> int | None: ...  # a counter (_with_counters)

    @property
    def name(self) -> str:
        """Its thread's name (:func:`kbp.names.poller_name`)."""
        return names.poller_name(self.cpu, self.cls, self.ifname)

    def counters(self) -> dict[str, int | None]:
        return {c: getattr(self, c) for c in names.POLLER_COUNTERS}


@dataclass
class NapiInfo:
    """One NAPI of an attached device."""

    index: int | None = None
    id: int | None = None
    cpu: int | None = None
    pid: int | None = None  # the poller serving it (0: as for Poller.pid)
    packets: int | None = None
    polls: int | None = None


@dataclass
class Device:
    """An attached device."""

    ifindex: int | None = None
    ifname: str | None = None
    netns_inum: int | None = None
    state: str | None = None  # active | standby (device down: stock NAPI until it is up)
    cls: str = names.CLASS_RT  # or names.CLASS_NON_RT: which poller class serves it
    cpu: int | None = None
    mode: str | None = None
    linger_us: int | None = None
    quota: int | None = None
    napi_count: int | None = None
    packets: int | None = None
    polls: int | None = None
    napis: list[NapiInfo] = field(default_factory=list)


def _bool(v: int | None) -> bool | None:
    return None if v is None else bool(v)


def _poller_from(msg: Any) -> Poller:
    g = msg.get_attr
    return Poller(cpu=g("KBP_A_CPU"), cls=class_name(g("KBP_A_CLASS")), nice=g("KBP_A_NICE"),
                  pid=g("KBP_A_PID"), mode=mode_name(g("KBP_A_MODE")),
                  linger_us=g("KBP_A_LINGER_US"), quota=g("KBP_A_QUOTA"),
                  rt_prio=g("KBP_A_RT_PRIO"), freq_ctl=_bool(g("KBP_A_FREQ_CTL")),
                  napis=g("KBP_A_NAPIS"),
                  **{c: g(attr) for c, attr in POLLER_COUNTER_ATTRS.items()},
                  interval_us=g("KBP_A_INTERVAL_US"),
                  netap=_bool(g("KBP_A_NETAP")), round_ms=g("KBP_A_ROUND_MS"),
                  min_interval_us=g("KBP_A_MIN_INTERVAL_US"),
                  max_interval_us=g("KBP_A_MAX_INTERVAL_US"),
                  min_change=g("KBP_A_MIN_CHANGE"), max_round=g("KBP_A_MAX_ROUND"),
                  objective=objective_name(g("KBP_A_OBJECTIVE")),
                  search=_netap_from(g("KBP_A_NETAP_STATE")),
                  ifindex=g("KBP_A_IFINDEX"), ifname=g("KBP_A_IFNAME"),
                  netns_inum=g("KBP_A_NETNS_INUM"),
                  state=STATE_NAMES.get(g("KBP_A_STATE")))


def _netap_from(nest: Any) -> NetapState | None:
    if nest is None:
        return None
    g = nest.get_attr
    return NetapState(round=g("KBP_NETAP_A_ROUND"), rounds=g("KBP_NETAP_A_ROUNDS"),
                      interval_us=g("KBP_NETAP_A_INTERVAL_US"), low_us=g("KBP_NETAP_A_LOW_US"),
                      high_us=g("KBP_NETAP_A_HIGH_US"),
                      range_lo_us=g("KBP_NETAP_A_RANGE_LO_US"),
                      range_hi_us=g("KBP_NETAP_A_RANGE_HI_US"),
                      distance_us=g("KBP_NETAP_A_DISTANCE_US"),
                      converged=_bool(g("KBP_NETAP_A_CONVERGED")),
                      restarts=g("KBP_NETAP_A_RESTARTS"),
                      objective=objective_name(g("KBP_NETAP_A_OBJECTIVE")),
                      last_objective=g("KBP_NETAP_A_LAST_OBJECTIVE"),
                      last_bytes=g("KBP_NETAP_A_LAST_BYTES"),
                      last_cpu_ns=g("KBP_NETAP_A_LAST_CPU_NS"))


def _napi_from(nest: Any) -> NapiInfo:
    g = nest.get_attr
    return NapiInfo(index=g("KBP_NAPI_A_INDEX"), id=g("KBP_NAPI_A_ID"), cpu=g("KBP_NAPI_A_CPU"),
                    pid=g("KBP_NAPI_A_PID"), packets=g("KBP_NAPI_A_PACKETS"),
                    polls=g("KBP_NAPI_A_POLLS"))


def _device_from(msg: Any) -> Device:
    g = msg.get_attr
    st = g("KBP_A_STATE")
    return Device(ifindex=g("KBP_A_IFINDEX"), ifname=g("KBP_A_IFNAME"),
                  netns_inum=g("KBP_A_NETNS_INUM"),
                  state=STATE_NAMES.get(st, str(st)) if st is not None else None,
                  cpu=g("KBP_A_CPU"), cls=class_name(g("KBP_A_CLASS")),
                  mode=mode_name(g("KBP_A_MODE")), linger_us=g("KBP_A_LINGER_US"),
                  quota=g("KBP_A_QUOTA"), napi_count=g("KBP_A_NAPIS"),
                  packets=g("KBP_A_PACKETS"), polls=g("KBP_A_POLLS"),
                  napis=[_napi_from(n) for n in msg.get_attrs("KBP_A_NAPI")])


# -- request building (pure; unit-tested offline) -------------------------------------
def _msg(cmd: int, attrs: list[list[Any]]) -> kbpmsg:
    m = kbpmsg()
    m["cmd"] = cmd
    m["version"] = KBP_GENL_VERSION
    m["attrs"] = attrs
    return m


def _knobs(mode: str | int | None, linger_us: int | None, quota: int | None,
           rt_prio: int | None, freq_ctl: bool | None = None,
           periodic: Mapping[str, int] | None = None, cls: str | int | None = None,
           nice: int | None = None) -> list[list[Any]]:
    attrs: list[list[Any]] = []
    if cls is not None:
        attrs.append(["KBP_A_CLASS", class_id(cls)])
    if nice is not None:
        attrs.append(["KBP_A_NICE", int(nice)])
    if mode is not None:
        attrs.append(["KBP_A_MODE", mode_id(mode)])
    if linger_us is not None:
        attrs.append(["KBP_A_LINGER_US", int(linger_us)])
    if quota is not None:
        attrs.append(["KBP_A_QUOTA", int(quota)])
    if rt_prio is not None:
        attrs.append(["KBP_A_RT_PRIO", int(rt_prio)])
    if freq_ctl is not None:
        attrs.append(["KBP_A_FREQ_CTL", int(freq_ctl)])
    for name, value in (periodic or {}).items():
        if name not in PERIODIC_KNOBS:
            raise ValueError(f"unknown knob {name!r} (periodic: {', '.join(PERIODIC_KNOBS)})")
        if value is not None:
            attrs.append([f"KBP_A_{name.upper()}",
                          objective_id(value) if name == "objective" else int(value)])
    return attrs


def _dev_attrs(dev: str | int, netns_fd: int | None) -> list[list[Any]]:
    attrs: list[list[Any]] = [["KBP_A_IFINDEX", dev] if isinstance(dev, int)
                              else ["KBP_A_IFNAME", dev]]
    if netns_fd is not None:
        attrs.append(["KBP_A_NETNS_FD", netns_fd])
    return attrs


def _queue_map(queue_map: Mapping[int, int] | Iterable[tuple[int, int]]) -> list[Any]:
    pairs = sorted(queue_map.items()) if isinstance(queue_map, Mapping) else list(queue_map)
    return ["KBP_A_QUEUE_MAP", {"attrs": [
        ["KBP_A_MAP_ENTRY", {"attrs": [["KBP_MAP_A_NAPI_INDEX", int(i)],
                                       ["KBP_MAP_A_CPU", int(c)]]}] for i, c in pairs]}]


def build_poller_get(cpu: int | None = None, cls: str | int | None = None,
                     dev: str | int | None = None, netns_fd: int | None = None) -> kbpmsg:
    """poller-get: every poller (no ``cpu``), or the one of ``cpu`` and ``cls``; ``dev``
    names which when the CPU has one for each of several devices."""
    attrs: list[list[Any]] = [["KBP_A_CPU", cpu]] if cpu is not None else []
    if cls is not None:
        attrs.append(["KBP_A_CLASS", class_id(cls)])
    if dev is not None:
        attrs += _dev_attrs(dev, netns_fd)
    return _msg(_spec.KBP_CMD_POLLER_GET, attrs)


def build_poller_set(cpu: int, mode: str | int | None = None, linger_us: int | None = None,
                     quota: int | None = None, rt_prio: int | None = None,
                     freq_ctl: bool | None = None, *, cls: str | int | None = None,
                     nice: int | None = None, **periodic: int) -> kbpmsg:
    return _msg(_spec.KBP_CMD_POLLER_SET,
                [["KBP_A_CPU", int(cpu)],
                 *_knobs(mode, linger_us, quota, rt_prio, freq_ctl, periodic, cls, nice)])


def build_attach(dev: str | int, netns_fd: int | None = None, cpu: int | None = None,
                 queue_map: Mapping[int, int] | Iterable[tuple[int, int]] | None = None,
                 mode: str | int | None = None, linger_us: int | None = None,
                 quota: int | None = None, rt_prio: int | None = None,
                 freq_ctl: bool | None = None, *, cls: str | int | None = None,
                 nice: int | None = None, **periodic: int) -> kbpmsg:
    """dev-attach: the NAPIs of ``dev`` on ``cpu`` and/or as ``queue_map`` says; with
    neither, each NAPI on the CPU its interrupt is affined to (the module refuses a NAPI
    without an interrupt)."""
    attrs = _dev_attrs(dev, netns_fd)
    if cpu is not None:
        attrs.append(["KBP_A_CPU", int(cpu)])
    if queue_map is not None:
        attrs.append(_queue_map(queue_map))
    attrs += _knobs(mode, linger_us, quota, rt_prio, freq_ctl, periodic, cls, nice)
    return _msg(_spec.KBP_CMD_DEV_ATTACH, attrs)


def build_detach(dev: str | int, netns_fd: int | None = None) -> kbpmsg:
    return _msg(_spec.KBP_CMD_DEV_DETACH, _dev_attrs(dev, netns_fd))


def build_dev_get(dev: str | int | None = None, netns_fd: int | None = None) -> kbpmsg:
    return _msg(_spec.KBP_CMD_DEV_GET, _dev_attrs(dev, netns_fd) if dev is not None else [])


# -- the socket -----------------------------------------------------------------------
def is_loaded() -> bool:
    """True when the module is loaded (its genl family resolves, or /sys/module/kbp exists)."""
    if SYS_MODULE.exists():
        return True
    try:
        with Client():
            return True
    except ModuleNotLoaded:
        return False


class Client:
    """One socket bound to the kbp family. Use as a context manager."""

    def __init__(self) -> None:
        sock = GenericNetlinkSocket(ext_ack=True)
        # a missing family is ModuleNotLoaded below, not an error for pyroute2 to log
        # (pyroute2 0.7, Debian 12's, logs it on the root logger)
        sock.module_err_level = "debug"
        try:
            sock.bind(KBP_GENL_NAME, kbpmsg)
        except NetlinkError as e:
            sock.close()
            if e.code in (errno.ENOENT, errno.EOPNOTSUPP):
                raise ModuleNotLoaded() from None
            raise KbpError(e.code, str(e.args[1]) if len(e.args) > 1 else "",
                           "resolve family kbp") from None
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, msg: kbpmsg, dump: bool = False, what: str = "") -> list[Any]:
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        try:
            return [r for r in self.sock.nlm_request(msg, msg_type=self.sock.prid,
                                                      msg_flags=flags)
                    if r["header"]["type"] == self.sock.prid]
        except NetlinkError as e:
            msg_text = e.args[1] if len(e.args) > 1 and isinstance(e.args[1], str) else ""
            if msg_text == os.strerror(e.code):
                msg_text = ""
            raise KbpError(e.code, msg_text, what) from None

    # -- commands ------------------------------------------------------------------
    def pollers(self) -> list[Poller]:
        return [_poller_from(r) for r in self.request(build_poller_get(), True, "poller-get")]

    def poller(self, cpu: int, cls: str | int | None = None, dev: str | int | None = None,
               netns: str | None = None) -> Poller:
        """The poller of ``cpu`` (and ``cls``); name ``dev`` when the CPU serves several
        devices (one poller each): the module refuses the question otherwise."""
        what = (f"poller-get cpu {cpu}" + (f" class {class_name(class_id(cls))}" if cls else "")
                + (f" dev {dev}" if dev is not None else ""))
        with _netns_fd(netns) as fd:
            rs = self.request(build_poller_get(cpu, cls, dev, fd), False, what)
        if not rs:
            raise KbpError(errno.ENOENT, f"no poller on CPU {cpu}", "poller-get")
        return _poller_from(rs[0])

    def poller_set(self, cpu: int, mode: str | int | None = None,
                   linger_us: int | None = None, quota: int | None = None,
                   rt_prio: int | None = None, freq_ctl: bool | None = None, *,
                   cls: str | int | None = None, nice: int | None = None,
                   **periodic: int) -> None:
        self.request(build_poller_set(cpu, mode, linger_us, quota, rt_prio, freq_ctl,
                                      cls=cls, nice=nice, **periodic), False,
                     f"poller-set cpu {cpu}")

    def attach(self, dev: str | int, netns: str | None = None, cpu: int | None = None,
               queue_map: Mapping[int, int] | Iterable[tuple[int, int]] | None = None,
               mode: str | int | None = None, linger_us: int | None = None,
               quota: int | None = None, rt_prio: int | None = None,
               freq_ctl: bool | None = None, *, cls: str | int | None = None,
               nice: int | None = None, **periodic: int) -> Device | None:
        with _netns_fd(netns) as fd:
            self.request(build_attach(dev, fd, cpu, queue_map, mode, linger_us, quota, rt_prio,
                                      freq_ctl, cls=cls, nice=nice, **periodic), False,
                         f"attach {dev}")
            rs = self.request(build_dev_get(dev, fd), False, f"dev-get {dev}")
        return _device_from(rs[0]) if rs else None

    def detach(self, dev: str | int, netns: str | None = None) -> None:
        with _netns_fd(netns) as fd:
            self.request(build_detach(dev, fd), False, f"detach {dev}")

    def device(self, dev: str | int, netns: str | None = None) -> Device | None:
        with _netns_fd(netns) as fd:
            try:
                rs = self.request(build_dev_get(dev, fd), False, f"dev-get {dev}")
            except KbpError as e:
                if e.errno in (errno.ENOENT, errno.ENODEV):
                    return None
                raise
        return _device_from(rs[0]) if rs else None

    def devices(self) -> list[Device]:
        return [_device_from(r) for r in self.request(build_dev_get(), True, "dev-get")]


class _netns_fd:
    """Open /run/netns/NAME for the duration of one request (None: no netns)."""

    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        self.fd: int | None = None

    def __enter__(self) -> int | None:
        if self.netns is None:
            return None
        path = NETNS_DIR / self.netns
        if "/" in self.netns or not path.exists():
            raise KbpError(errno.ENOENT, f"unknown netns {self.netns!r} (no {path})")
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)


# -- module-level convenience (one socket per call) -----------------------------------
def pollers() -> list[Poller]:
    with Client() as c:
        return c.pollers()


def poller(cpu: int, cls: str | int | None = None, dev: str | int | None = None,
           netns: str | None = None) -> Poller:
    with Client() as c:
        return c.poller(cpu, cls, dev, netns)


def poller_set(cpu: int, mode: str | int | None = None, linger_us: int | None = None,
               quota: int | None = None, rt_prio: int | None = None,
               freq_ctl: bool | None = None, *, cls: str | int | None = None,
               nice: int | None = None, **periodic: int) -> None:
    with Client() as c:
        c.poller_set(cpu, mode, linger_us, quota, rt_prio, freq_ctl, cls=cls, nice=nice,
                     **periodic)


def attach(dev: str | int, netns: str | None = None, cpu: int | None = None,
           queue_map: Mapping[int, int] | Iterable[tuple[int, int]] | None = None,
           mode: str | int | None = None, linger_us: int | None = None,
           quota: int | None = None, rt_prio: int | None = None,
           freq_ctl: bool | None = None, *, cls: str | int | None = None,
           nice: int | None = None, **periodic: int) -> Device | None:
    with Client() as c:
        return c.attach(dev, netns, cpu, queue_map, mode, linger_us, quota, rt_prio, freq_ctl,
                        cls=cls, nice=nice, **periodic)


def detach(dev: str | int, netns: str | None = None) -> None:
    with Client() as c:
        c.detach(dev, netns)


def device(dev: str | int, netns: str | None = None) -> Device | None:
    with Client() as c:
        return c.device(dev, netns)


def devices() -> list[Device]:
    with Client() as c:
        return c.devices()
