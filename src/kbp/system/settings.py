"""Handlers that read and change the settings kbpctl touches, one per journal ``kind``:

=============  ======================================  ==============================
kind           key                                     value
=============  ======================================  ==============================
napi           netns, ifindex, napi_id, knob           int (netdev napi-set knob)
sysfs          netns, dev, ifindex, attr               str (/sys/class/net/DEV/attr)
sched          pid, starttime, comm                    {policy, priority, nice}
affinity       pid, starttime, comm                    [cpu, ...]
irq            irq                                     CPU list string
gro            netns, dev                              bool (ethtool -k/-K)
file           path, netns                             str (a /proc/sys or /sys file)
=============  ======================================  ==============================

Tasks are identified by pid *and* start time, so a restored setting never lands on an
unrelated task that reused the pid.

Each handler also says which of its keys belong to a device (``keys(device)``, from a
:class:`Device` found once): ``kbpctl snapshot`` is every kind's keys of a device with their
``get()`` values, so a kind added here is in the snapshot proof ("disable puts back what
enable found") with nothing else to write.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kbp import sysinfo
from kbp.errors import InvalidInput
from kbp.netdev import Napi, NetdevClient, NetFS
from kbp.rps import RPS_CPUS, RPS_FLOW_CNT
from kbp.sysinfo import HOST, Host, TaskId
from kbp.system import access
from kbp.system.journal import (
    KIND_AFFINITY,
    KIND_FILE,
    KIND_GRO,
    KIND_IRQ,
    KIND_NAPI,
    KIND_SCHED,
    KIND_SYSFS,
    MISSING,
    Handler,
    TargetGone,
)


def task_key(tid: TaskId) -> dict[str, Any]:
    return {"pid": tid.pid, "starttime": tid.starttime, "comm": tid.comm}


@dataclass(frozen=True)
class Device:
    """One device as the kinds see it, found once (:func:`kbp.snapshot.device`): its NAPIs
    (napi-get; empty without it), receive queues, NAPI threads and queue IRQs."""

    netns: str | None
    dev: str
    ifindex: int
    napis: tuple[Napi, ...] = ()
    rx_queues: tuple[str, ...] = ()
    tasks: tuple[TaskId, ...] = ()
    irqs: tuple[int, ...] = ()


class Kind(Handler, Protocol):
    """A handler that also names its keys of a device (the snapshot's)."""

    def keys(self, d: Device) -> list[dict[str, Any]]: ...


#: a NAPI's napi-set knobs kbpctl changes (those napi-get reports are a device's keys)
NAPI_KNOBS = ("threaded", "defer_hard_irqs", "gro_flush_timeout")
#: a device's sysfs attributes kbpctl changes, and each receive queue's RPS ones
SYSFS_ATTRS = ("threaded", "napi_defer_hard_irqs", "gro_flush_timeout")
RPS_ATTRS = (RPS_CPUS, RPS_FLOW_CNT)


class NapiHandler:
    def __init__(self, client: Callable[[str | None], NetdevClient]) -> None:
        self.client = client

    def get(self, key: Mapping[str, Any]) -> Any:
        napi = self.client(key.get("netns")).napi(key["napi_id"])
        # the journal's key names the device too: a NAPI id reused by another device is gone
        if napi is None or key.get("ifindex", napi.ifindex) != napi.ifindex:
            return MISSING
        v = getattr(napi, key["knob"])
        if v is None:        # a kernel whose napi-get does not report it: nothing to restore
            raise OSError(errno.EOPNOTSUPP, f"napi-get does not report {key['knob']}")
        return v

    def keys(self, d: Device) -> list[dict[str, Any]]:
        return [{"netns": d.netns, "ifindex": d.ifindex, "napi_id": n.id, "knob": k}
                for n in d.napis for k in NAPI_KNOBS if getattr(n, k) is not None]

    def close(self) -> None:
        """Closes the netlink sockets ``client`` keeps open, if it keeps any (NetdevClients
        does); the next get or set opens them again."""
        close = getattr(self.client, "close", None)
        if callable(close):
            close()

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        try:
            self.client(key.get("netns")).napi_set(key["napi_id"], **{key["knob"]: int(value)})
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise TargetGone(str(e)) from e
            raise


class SysfsHandler:
    def __init__(self, fs: Callable[[str | None], NetFS]) -> None:
        self.fs = fs

    def _check(self, key: Mapping[str, Any]) -> NetFS | None:
        try:
            fs = self.fs(key.get("netns"))
        except InvalidInput:               # its namespace is gone, and the device with it
            return None
        idx = fs.read(key["dev"], "ifindex")
        if idx is None or (key.get("ifindex") is not None and int(idx) != key["ifindex"]):
            return None
        return fs

    def get(self, key: Mapping[str, Any]) -> Any:
        fs = self._check(key)
        if fs is None:
            return MISSING
        v = fs.read(key["dev"], key["attr"])
        return MISSING if v is None else v

    def get_many(self, keys: Sequence[Mapping[str, Any]]) -> list[Any]:
        """``get`` of keys of one device (ValueError for another's), in one read (one helper
        run in another netns)."""
        if not keys:
            return []
        one = {(k["netns"], k["dev"], k.get("ifindex")) for k in keys}
        if len(one) > 1:
            raise ValueError(f"get_many: keys of {len(one)} devices, not one")
        fs = self._check(keys[0])
        if fs is None:
            return [MISSING] * len(keys)
        got = fs.read_many(keys[0]["dev"], [k["attr"] for k in keys])
        return [MISSING if got.get(k["attr"]) is None else got[k["attr"]] for k in keys]

    def keys(self, d: Device) -> list[dict[str, Any]]:
        attrs = [*SYSFS_ATTRS, *(f"queues/{q}/{a}" for q in d.rx_queues for a in RPS_ATTRS)]
        return [sysfs_key(d.netns, d.dev, d.ifindex, a) for a in attrs]

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        fs = self._check(key)
        if fs is None:
            raise TargetGone(f"{key['dev']} is gone")
        fs.write(key["dev"], key["attr"], str(value))


class _TaskHandler:
    def __init__(self, host: Host = HOST) -> None:
        self.host = host

    def keys(self, d: Device) -> list[dict[str, Any]]:
        return [task_key(t) for t in d.tasks]

    def _alive(self, key: Mapping[str, Any]) -> bool:
        return sysinfo.same_task(TaskId(key["pid"], key["starttime"], key.get("comm", "")),
                                 self.host)


class SchedHandler(_TaskHandler):
    def get(self, key: Mapping[str, Any]) -> Any:
        if not self._alive(key):
            return MISSING
        try:
            s = sysinfo.get_sched(key["pid"])
        except ProcessLookupError:
            return MISSING
        return {"policy": s.policy, "priority": s.priority, "nice": s.nice}

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        if not self._alive(key):
            raise TargetGone(f"task {key['pid']} is gone")
        try:
            sysinfo.set_policy(key["pid"], value["policy"], int(value["priority"]),
                               value.get("nice"))
        except ProcessLookupError as e:
            raise TargetGone(str(e)) from e


class AffinityHandler(_TaskHandler):
    def get(self, key: Mapping[str, Any]) -> Any:
        if not self._alive(key):
            return MISSING
        try:
            return sysinfo.get_sched(key["pid"]).cpus
        except ProcessLookupError:
            return MISSING

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        if not self._alive(key):
            raise TargetGone(f"task {key['pid']} is gone")
        try:
            sysinfo.set_affinity(key["pid"], value)
        except ProcessLookupError as e:
            raise TargetGone(str(e)) from e


class IrqHandler:
    def __init__(self, host: Host = HOST) -> None:
        self.host = host

    def keys(self, d: Device) -> list[dict[str, Any]]:
        return [{"irq": i} for i in d.irqs]

    def get(self, key: Mapping[str, Any]) -> Any:
        try:
            return sysinfo.read_irq_affinity(key["irq"], self.host)
        except FileNotFoundError:
            return MISSING

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        try:
            access.write(self.host.proc / "irq" / str(key["irq"]) / "smp_affinity_list",
                         f"{value}\n")
        except FileNotFoundError as e:
            raise TargetGone(str(e)) from e


class GroHandler:
    """A device's GRO as the kernel reads it back (``ethtool -k``), set with ``ethtool -K``,
    in the key's namespace."""

    def keys(self, d: Device) -> list[dict[str, Any]]:
        return [{"netns": d.netns, "dev": d.dev}]

    def get(self, key: Mapping[str, Any]) -> Any:
        try:
            out = access.cmd(["ethtool", "--json", "-k", key["dev"]], ns=key.get("netns")).stdout
        except access.CmdError as e:
            if access.is_gone(e):
                return MISSING
            raise
        return bool(json.loads(out)[0]["generic-receive-offload"]["active"])

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        access.cmd(["ethtool", "-K", key["dev"], "gro", "on" if value else "off"],
                   ns=key.get("netns"))


class FileHandler:
    """A kernel file by path (a sysctl under /proc/sys, a /sys attribute) as the key's
    namespace sees it (/proc/sys/net and /sys/class/net show the namespace of the process
    that opens them): its text, stripped; written in one write(2).  A file that is not
    there is MISSING; a write the kernel refuses is an OSError with its errno."""

    def keys(self, d: Device) -> list[dict[str, Any]]:
        return []                        # a machine's or a namespace's file, no device's

    def get(self, key: Mapping[str, Any]) -> Any:
        try:
            return access.read(key["path"], key.get("netns"))
        except FileNotFoundError:
            return MISSING

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        access.write(key["path"], f"{value}\n", key.get("netns"))


def sysfs_key(netns: str | None, dev: str, ifindex: int | None, attr: str) -> dict[str, Any]:
    """The key of ``/sys/class/net/DEV/ATTR`` (ATTR may be ``queues/rx-N/rps_cpus``)."""
    return {"netns": netns, "dev": dev, "ifindex": ifindex, "attr": attr}


def netns_gone(factory: Callable[[str | None], Any]) -> Callable[[str | None], Any]:
    """``factory`` (a NetdevClient or NetFS per netns) that reports a netns deleted since
    the change (InvalidInput: unknown netns) as its target gone, so undo notes it and goes
    on (:class:`kbp.system.journal.TargetGone`)."""
    def get(netns: str | None) -> Any:
        try:
            return factory(netns)
        except InvalidInput as e:
            raise TargetGone(str(e)) from e
    return get


def net_effector(fs: Callable[[str | None], NetFS] = NetFS) -> dict[str, Kind]:
    """The handlers of a network namespace's device settings (sysfs, GRO): what the
    benchmark's testbed changes, through :class:`kbp.system.journal.Executor`."""
    return {KIND_SYSFS: SysfsHandler(fs), KIND_GRO: GroHandler()}


def system_effector(client: Callable[[str | None], NetdevClient],
                    fs: Callable[[str | None], NetFS],
                    host: Host = HOST) -> dict[str, Kind]:
    return {
        KIND_NAPI: NapiHandler(client),
        KIND_FILE: FileHandler(),
        **net_effector(fs),
        KIND_SCHED: SchedHandler(host),
        KIND_AFFINITY: AffinityHandler(host),
        KIND_IRQ: IrqHandler(host),
    }
