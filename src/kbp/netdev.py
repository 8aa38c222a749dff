"""Network devices as the stock kernel shows them: rtnetlink links, the ``netdev`` generic
netlink family (napi-get / napi-set), and per-device sysfs attributes -- in any netns.

The netdev family grew over time and everything here is feature-detected, never assumed:

=======  ===========================================================================
5.12     sysfs ``/sys/class/net/DEV/threaded`` (threaded NAPI, per device)
6.8/6.9  netdev ``napi-get``: NAPI ids, IRQ, and the NAPI kthread pid
6.13     netdev ``napi-set``: per-NAPI ``defer-hard-irqs``, ``gro-flush-timeout`` and
         ``irq-suspend-timeout`` (IRQ suspension)
6.17     netdev ``napi-set``: per-NAPI ``threaded``
6.19     ``threaded`` = 2: threaded busy polling
=======  ===========================================================================

Capabilities of ``napi-set`` are read from the family's policy (CTRL_CMD_GETPOLICY), which
also gives the largest accepted ``threaded`` value (1, or 2 where busy polling exists).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pyroute2.netlink import (
    GENL_ID_CTRL,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    genlmsg,
)
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import GenericNetlinkSocket

from kbp import sysinfo
from kbp.errors import InvalidInput, KbpctlError, OperationFailed
from kbp.genlctrl import CTRL_CMD_GETPOLICY, ctrlmsg
from kbp.sysinfo import HOST, Host
from kbp.system import access

if TYPE_CHECKING:
    from pyroute2.iproute import IPRoute

NETNS_DIR = Path("/run/netns")
T = TypeVar("T")

NETDEV_CMD_NAPI_GET = 11
NETDEV_CMD_NAPI_SET = 14
NETDEV_A_NAPI_IFINDEX = 1
NETDEV_A_NAPI_ID = 2
NETDEV_A_NAPI_IRQ = 3
NETDEV_A_NAPI_PID = 4
NETDEV_A_NAPI_DEFER_HARD_IRQS = 5
NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT = 6
NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT = 7
NETDEV_A_NAPI_THREADED = 8

THREADED_OFF = 0
THREADED_ON = 1
THREADED_BUSY_POLL = 2


class napi_get_msg(genlmsg):
    """netdev napi attribute set (Documentation/netlink/specs/netdev.yaml), decode side.

    ``gro-flush-timeout`` and ``irq-suspend-timeout`` are NLA_UINT (4 or 8 bytes).
    """

    nla_map = (
        (0, "NETDEV_A_NAPI_UNSPEC", "none"),
        (NETDEV_A_NAPI_IFINDEX, "NETDEV_A_NAPI_IFINDEX", "uint32"),
        (NETDEV_A_NAPI_ID, "NETDEV_A_NAPI_ID", "uint32"),
        (NETDEV_A_NAPI_IRQ, "NETDEV_A_NAPI_IRQ", "uint32"),
        (NETDEV_A_NAPI_PID, "NETDEV_A_NAPI_PID", "uint32"),
        (NETDEV_A_NAPI_DEFER_HARD_IRQS, "NETDEV_A_NAPI_DEFER_HARD_IRQS", "uint32"),
        (NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT, "NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT", "cdata"),
        (NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT, "NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT", "cdata"),
        (NETDEV_A_NAPI_THREADED, "NETDEV_A_NAPI_THREADED", "uint32"),
    )


class napi_set_msg(genlmsg):
    """netdev napi attribute set, encode side (NLA_UINT sent as 8 bytes)."""

    nla_map = (
        (0, "NETDEV_A_NAPI_UNSPEC", "none"),
        (NETDEV_A_NAPI_IFINDEX, "NETDEV_A_NAPI_IFINDEX", "uint32"),
        (NETDEV_A_NAPI_ID, "NETDEV_A_NAPI_ID", "uint32"),
        (NETDEV_A_NAPI_DEFER_HARD_IRQS, "NETDEV_A_NAPI_DEFER_HARD_IRQS", "uint32"),
        (NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT, "NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT", "uint64"),
        (NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT, "NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT", "uint64"),
        (NETDEV_A_NAPI_THREADED, "NETDEV_A_NAPI_THREADED", "uint32"),
    )


# napi-set knobs kbpctl uses: name -> (attribute id, attribute name)
NAPI_KNOBS = {
    "threaded": (NETDEV_A_NAPI_THREADED, "NETDEV_A_NAPI_THREADED"),
    "defer_hard_irqs": (NETDEV_A_NAPI_DEFER_HARD_IRQS, "NETDEV_A_NAPI_DEFER_HARD_IRQS"),
    "gro_flush_timeout": (NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT, "NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT"),
    "irq_suspend_timeout": (NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT,
                            "NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT"),
}


def _uint(raw: bytes | str | None) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, str):  # pyroute2 may hand back text for cdata
        raw = raw.encode("latin-1")
    return int.from_bytes(raw, sys.byteorder)


@dataclass
class Napi:
    """One NAPI instance as napi-get reports it (None: this kernel does not report it)."""

    id: int
    ifindex: int
    irq: int | None = None
    pid: int | None = None
    threaded: int | None = None
    defer_hard_irqs: int | None = None
    gro_flush_timeout: int | None = None
    irq_suspend_timeout: int | None = None

    @classmethod
    def from_msg(cls, msg: Any) -> Napi:
        return cls(
            id=msg.get_attr("NETDEV_A_NAPI_ID"),
            ifindex=msg.get_attr("NETDEV_A_NAPI_IFINDEX"),
            irq=msg.get_attr("NETDEV_A_NAPI_IRQ"),
            pid=msg.get_attr("NETDEV_A_NAPI_PID"),
            threaded=msg.get_attr("NETDEV_A_NAPI_THREADED"),
            defer_hard_irqs=msg.get_attr("NETDEV_A_NAPI_DEFER_HARD_IRQS"),
            gro_flush_timeout=_uint(msg.get_attr("NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT")),
            irq_suspend_timeout=_uint(msg.get_attr("NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT")),
        )


@dataclass
class NetdevFeatures:
    """What this kernel's netdev genl family can do."""

    family: bool = False
    napi_get: bool = False
    napi_set: bool = False
    # napi-set attribute id -> largest accepted value (None: no range given)
    napi_set_attrs: dict[int, int | None] = field(default_factory=dict)

    @property
    def napi_threaded(self) -> bool:
        return self.napi_set and NETDEV_A_NAPI_THREADED in self.napi_set_attrs

    @property
    def napi_busy_poll(self) -> bool:
        mx = self.napi_set_attrs.get(NETDEV_A_NAPI_THREADED)
        return self.napi_threaded and mx is not None and mx >= THREADED_BUSY_POLL

    def napi_knob(self, knob: str) -> bool:
        return self.napi_set and NAPI_KNOBS[knob][0] in self.napi_set_attrs

    def to_json(self) -> dict[str, bool]:
        return {"netdev_genl": self.family, "napi_get": self.napi_get,
                "napi_set": self.napi_set, "napi_set_threaded": self.napi_threaded,
                "napi_set_defer_hard_irqs": self.napi_knob("defer_hard_irqs"),
                "napi_set_gro_flush_timeout": self.napi_knob("gro_flush_timeout"),
                "threaded_busy_poll": self.napi_busy_poll}


def named_netns() -> list[str]:
    """The names of the netns ``ip netns`` knows (/run/netns), sorted; [] without any."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []


def check_netns(netns: str | None) -> None:
    if netns is None:
        return
    if "/" in netns or netns in (".", "..") or not (NETNS_DIR / netns).exists():
        known = sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else []
        hint = f" (known: {', '.join(known[:8])})" if known else " (ip netns list shows none)"
        raise InvalidInput(f"unknown netns {netns!r}{hint}: create it or fix --netns")


class NetdevClient:
    """A netdev genl socket in one network namespace (None: ours)."""

    def __init__(self, netns: str | None = None) -> None:
        check_netns(netns)
        self.netns = netns
        self.sock: GenericNetlinkSocket | None = None
        self._features: NetdevFeatures | None = None
        try:
            sock = in_netns(GenericNetlinkSocket, netns, ext_ack=True)
            sock.module_err_level = "debug"  # no netdev family: handled below, not logged
            try:
                sock.bind("netdev", napi_get_msg)
            except BaseException:
                sock.close()
                raise
            self.sock = sock
        except NetlinkError as e:
            if e.code != errno.ENOENT:
                raise
            self.sock = None  # kernel older than 6.3: no netdev family

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self) -> NetdevClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- features ------------------------------------------------------------------
    def features(self) -> NetdevFeatures:
        if self._features is None:
            self._features = self._detect()
        return self._features

    def _detect(self) -> NetdevFeatures:
        f = NetdevFeatures()
        if self.sock is None:
            return f
        f.family = True
        fam = self.sock.discovery("netdev")
        ops = {o.get_attr("CTRL_ATTR_OP_ID") for o in fam.get_attr("CTRL_ATTR_OPS", [])}
        f.napi_get = NETDEV_CMD_NAPI_GET in ops
        f.napi_set = NETDEV_CMD_NAPI_SET in ops
        if f.napi_set:
            f.napi_set_attrs = self._op_policy(NETDEV_CMD_NAPI_SET)
        return f

    def _op_policy(self, op: int) -> dict[int, int | None]:
        """Attribute id -> max value of the ``do`` policy of ``op`` (CTRL_CMD_GETPOLICY)."""
        assert self.sock is not None
        self.sock.marshal.msg_map[GENL_ID_CTRL] = ctrlmsg
        m = ctrlmsg()
        m["cmd"] = CTRL_CMD_GETPOLICY
        m["version"] = 1
        m["attrs"] = [["CTRL_ATTR_FAMILY_NAME", "netdev"], ["CTRL_ATTR_OP", op]]
        do_idx: int | None = None
        policies: dict[int, dict[int, int | None]] = {}
        try:
            replies = list(self.sock.nlm_request(m, msg_type=GENL_ID_CTRL,
                                                 msg_flags=NLM_F_REQUEST | NLM_F_DUMP))
        except NetlinkError:
            return {}
        for r in replies:
            op_pol = r.get_attr("CTRL_ATTR_OP_POLICY")
            if op_pol is not None:
                for _name, nest in _nla_items(op_pol):
                    v = nest.get_attr("CTRL_ATTR_POLICY_DO")
                    if v is not None:
                        do_idx = v
            pol = r.get_attr("CTRL_ATTR_POLICY")
            if pol is not None:
                for pname, attrs in _nla_items(pol):
                    pidx = int(pname[len("POLICY("):-1])
                    for aname, spec in _nla_items(attrs):
                        aid = int(aname[len("ATTR("):-1])
                        mx = spec.get_attr("NL_POLICY_TYPE_ATTR_MAX_VALUE_U")
                        policies.setdefault(pidx, {})[aid] = mx
        if do_idx is None:
            do_idx = 0
        return policies.get(do_idx, {})

    # -- napi-get / napi-set -------------------------------------------------------
    def napis(self, ifindex: int | None = None) -> list[Napi]:
        """NAPI instances (of one device), sorted by id; [] without napi-get."""
        if self.sock is None or not self.features().napi_get:
            return []
        m = napi_get_msg()
        m["cmd"] = NETDEV_CMD_NAPI_GET
        m["version"] = 1
        if ifindex is not None:
            m["attrs"] = [["NETDEV_A_NAPI_IFINDEX", ifindex]]
        replies = self.sock.nlm_request(m, msg_type=self.sock.prid,
                                        msg_flags=NLM_F_REQUEST | NLM_F_DUMP)
        out = [Napi.from_msg(r) for r in replies]
        if ifindex is not None:
            out = [n for n in out if n.ifindex == ifindex]
        return sorted(out, key=lambda n: n.id)

    def napi(self, napi_id: int) -> Napi | None:
        if self.sock is None or not self.features().napi_get:
            return None
        m = napi_get_msg()
        m["cmd"] = NETDEV_CMD_NAPI_GET
        m["version"] = 1
        m["attrs"] = [["NETDEV_A_NAPI_ID", napi_id]]
        try:
            replies = list(self.sock.nlm_request(m, msg_type=self.sock.prid,
                                                 msg_flags=NLM_F_REQUEST))
        except NetlinkError as e:
            if e.code == errno.ENOENT:
                return None
            raise
        return Napi.from_msg(replies[0]) if replies else None

    def napi_set(self, napi_id: int, **knobs: int) -> None:
        """napi-set one or more of threaded / defer_hard_irqs / gro_flush_timeout /
        irq_suspend_timeout (NAPI_KNOBS)."""
        if self.sock is None:
            raise OperationFailed("the netdev netlink family is missing")
        m = build_napi_set(napi_id, **knobs)
        try:
            list(self.sock.nlm_request(m, msg_type=self.sock.prid,
                                       msg_flags=NLM_F_REQUEST | NLM_F_ACK))
        except NetlinkError as e:
            raise OSError(e.code, f"napi-set {knobs} on NAPI {napi_id}: {e.args[1]}") from e


def build_napi_set(napi_id: int, **knobs: int) -> napi_set_msg:
    m = napi_set_msg()
    m["cmd"] = NETDEV_CMD_NAPI_SET
    m["version"] = 1
    attrs: list[list[Any]] = [["NETDEV_A_NAPI_ID", napi_id]]
    for k, v in knobs.items():
        attrs.append([NAPI_KNOBS[k][1], int(v)])
    m["attrs"] = attrs
    return m


def _nla_items(nest: Any) -> list[tuple[str, Any]]:
    return [(a[0], a[1]) for a in nest["attrs"]]


# -- rtnetlink -------------------------------------------------------------------------
@dataclass
class Link:
    ifindex: int
    name: str
    kind: str | None  # IFLA_INFO_KIND: veth, bridge, ... (None for physical devices)
    operstate: str | None
    up: bool
    rx_packets: int | None
    #: the device it sits on (IFLA_PARENT_DEV_NAME/_BUS_NAME, 5.15+): ("virtio1", "virtio"),
    #: ("0000:01:00.0", "pci"); None for software devices. /sys/bus/BUS/devices/NAME is
    #: readable from any netns, unlike /sys/class/net
    parent: tuple[str, str] | None = None


def _iproute(netns: str | None) -> IPRoute:
    from pyroute2.iproute import IPRoute  # only when a link is looked up (~40 ms import)
    return in_netns(IPRoute, netns)


_CLONE_NEWNET = 0x40000000


def in_netns(factory: Callable[..., T], netns: str | None, **kw: Any) -> T:
    """``factory(**kw)``, a pyroute2 socket, opened in the named netns (None: ours).

    pyroute2 0.9 takes ``netns=NAME, flags=0`` (0: never create it). Debian 12's 0.7.2,
    which the kbpctl package runs on, has no such keyword: there the calling thread enters
    the netns with setns(2) while the socket is made (a socket stays in the netns it was
    made in) and goes back at once."""
    if not netns:
        return factory(**kw)
    try:
        return factory(netns=netns, flags=0, **kw)
    except TypeError as e:
        if "netns" not in str(e):
            raise
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    target = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
        os.close(target)
        raise
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns to netns {netns}: {os.strerror(err)}")
        try:
            return factory(**kw)
        finally:
            if libc.setns(home, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back from netns {netns}: {os.strerror(err)}")
    finally:
        os.close(target)
        os.close(home)


def get_link(dev: str | int, netns: str | None = None) -> Link | None:
    """The link named (or numbered) ``dev`` in ``netns``; None if there is none."""
    check_netns(netns)
    with _iproute(netns) as ipr:
        if isinstance(dev, int):
            idx = dev
        else:
            found = ipr.link_lookup(ifname=dev)
            if not found:
                return None
            idx = found[0]
        try:
            msg = ipr.get_links(idx)[0]
        except NetlinkError:
            return None
    info = msg.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    stats = msg.get_attr("IFLA_STATS64")
    pname, pbus = msg.get_attr("IFLA_PARENT_DEV_NAME"), msg.get_attr("IFLA_PARENT_DEV_BUS_NAME")
    return Link(ifindex=msg["index"], name=msg.get_attr("IFLA_IFNAME"), kind=kind,
                operstate=msg.get_attr("IFLA_OPERSTATE"), up=bool(msg["flags"] & 1),
                rx_packets=stats["rx_packets"] if stats is not None else None,
                parent=(str(pname), str(pbus)) if pname and pbus else None)


def link_names(netns: str | None = None) -> list[str]:
    """The names of the links in ``netns`` (one rtnetlink dump)."""
    check_netns(netns)
    with _iproute(netns) as ipr:
        return [str(m.get_attr("IFLA_IFNAME")) for m in ipr.get_links()]


def _ns_id(path: Path) -> tuple[int, int] | None:
    """The identity (device, inode) of the network namespace a nsfs file names."""
    try:
        st = os.stat(path)
    except OSError:   # gone, or a process whose namespaces we may not see
        return None
    return st.st_dev, st.st_ino


def proc_net_dev_rows(text: str) -> dict[str, list[str]]:
    """A /proc/PID/net/dev (or /proc/net/dev) by device: its counters' fields, in the file's
    order (two header lines, then ``NAME: counters``)."""
    rows = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        if sep:
            rows[name.strip()] = rest.split()
    return rows


def devices_elsewhere(netns: str | None, host: Host = HOST,
                      netns_dir: Path = NETNS_DIR) -> dict[str, list[str]]:
    """The device names of every network namespace other than ``netns`` (None: ours) that
    this machine shows, by a label: ``netns NAME`` for those ``ip netns`` names, ``the netns
    of pid N (COMM)`` for the others, found through each process's /proc/PID/ns/net and read
    from its /proc/PID/net/dev.

    Best effort by nature: a namespace no process holds and ``ip netns`` does not name is
    invisible, and without root another user's processes' namespaces are too (so is every
    namespace outside our pid namespace: the node agent runs with hostPID for this)."""
    own = _ns_id(netns_dir / netns if netns else host.proc / "self/ns/net")
    seen = {own}
    out: dict[str, list[str]] = {}
    try:
        named = sorted(os.listdir(netns_dir))
    except OSError:
        named = []
    for name in named:
        nid = _ns_id(netns_dir / name)
        if nid is None or nid in seen:
            continue
        with contextlib.suppress(OSError, NetlinkError, KbpctlError):  # else: by its pids
            out[f"netns {name}"] = link_names(name)
            seen.add(nid)
    for pid in sorted(int(d) for d in os.listdir(host.proc) if d.isdigit()):
        nid = _ns_id(host.proc / str(pid) / "ns/net")
        if nid is None or nid in seen:
            continue
        seen.add(nid)
        with contextlib.suppress(OSError):
            names = list(proc_net_dev_rows((host.proc / str(pid) / "net/dev").read_text()))
            comm = (host.proc / str(pid) / "comm").read_text().strip()
            out[f"the netns of pid {pid} ({comm})"] = names
    return out


def same_named_elsewhere(dev: str, netns: str | None, host: Host = HOST,
                         collide: Callable[[str, str], bool] = sysinfo.napi_names_collide,
                         netns_dir: Path = NETNS_DIR) -> list[str]:
    """The other network namespaces (labels of :func:`devices_elsewhere`) holding a device
    whose NAPI threads' names :func:`kbp.sysinfo.find_napi_threads` would take for ``dev``'s
    (``collide``: :func:`kbp.sysinfo.irq_names_collide` for queue IRQs' names instead).

    A NAPI thread's name (``napi/<dev>-<id>``) says nothing of its device's namespace, so
    before Linux 6.9 (no netdev napi-get, which gives each NAPI's thread) the threads of a
    container's ``eth0`` and the host's ``eth0`` cannot be told apart; nor can the queue IRQs
    of two same-named devices without MSI IRQs in sysfs. Whoever changes a thread or IRQ
    found by name asks this first, and refuses when it is not empty."""
    return [label for label, names in devices_elsewhere(netns, host, netns_dir).items()
            if any(collide(dev, other) for other in names)]


def napi_threads_by_name(dev: str, netns: str | None, host: Host = HOST
                         ) -> tuple[list[sysinfo.TaskStat], list[str]]:
    """``dev``'s NAPI threads found by name (kernels without napi-get), and the other
    namespaces whose same-named devices make the name ambiguous: when there are any, no
    thread is returned (each may be theirs)."""
    others = same_named_elsewhere(dev, netns, host)
    return ([] if others else sysinfo.find_napi_threads(dev, host)), others


def list_links(netns: str | None = None) -> list[Link]:
    check_netns(netns)
    with _iproute(netns) as ipr:
        idxs = [m["index"] for m in ipr.get_links()]
    return [lk for lk in (get_link(i, netns) for i in idxs) if lk is not None]


# -- sysfs in any netns ----------------------------------------------------------------
class NetFS:
    """/sys/class/net of a network namespace.

    sysfs shows the devices of the netns it was mounted in, so for another netns the
    access runs in :func:`kbp.system.access.ns_fs` (a short helper under ``ip netns exec``, which
    mounts a fresh sysfs, keeping errno).
    """

    def __init__(self, netns: str | None = None, sysroot: Path = Path("/sys")) -> None:
        check_netns(netns)
        self.netns = netns
        self.sysroot = sysroot

    def path(self, dev: str, attr: str = "") -> Path:
        if "/" in dev or dev in (".", ".."):
            raise InvalidInput(f"bad device name {dev!r}")
        p = Path("/sys" if self.netns else self.sysroot) / "class/net" / dev
        return p / attr if attr else p

    def read(self, dev: str, attr: str) -> str | None:
        """The attribute's text, stripped (None if the attribute does not exist)."""
        try:
            if self.netns:
                return str(access.ns_fs(self.netns, "read", str(self.path(dev, attr)))).strip()
            return self.path(dev, attr).read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            raise

    def write(self, dev: str, attr: str, value: str | int) -> None:
        access.write(self.path(dev, attr), value, self.netns)

    def read_many(self, dev: str, attrs: list[str]) -> dict[str, str | None]:
        """Several attributes at once (one helper run in another netns)."""
        if not self.netns:
            return {a: self.read(dev, a) for a in attrs}
        try:
            raw = access.ns_fs(self.netns, "readmany", str(self.path(dev)), *attrs)
        except OSError:
            return dict.fromkeys(attrs)
        return {a: (v.strip() if isinstance(v, str) else None) for a, v in raw.items()}

    def listdir(self, dev: str, sub: str) -> list[str]:
        try:
            if self.netns:
                return list(access.ns_fs(self.netns, "list", str(self.path(dev, sub))))
            return sorted(os.listdir(self.path(dev, sub)))
        except OSError:
            return []

    def rx_queues(self, dev: str, attrs: list[str]) -> dict[str, dict[str, str | None]]:
        """``queues/rx-N/<attr>`` of every receive queue, by queue name (one helper run in
        another netns); an attribute that does not exist is None, and a device without a
        ``queues`` directory has no queues ({})."""
        if self.netns:
            try:
                raw = access.ns_fs(self.netns, "rxqueues", str(self.path(dev, "queues")), *attrs)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    return {}
                raise
        else:
            raw = {}
            try:
                names = sorted(os.listdir(self.path(dev, "queues")))
            except FileNotFoundError:
                return {}
            for q in names:
                if not q.startswith("rx-"):
                    continue
                raw[q] = {}
                for a in attrs:
                    try:
                        raw[q][a] = self.path(dev, f"queues/{q}/{a}").read_text()
                    except FileNotFoundError:
                        raw[q][a] = None
        return {q: {a: (v.strip() if isinstance(v, str) else None) for a, v in vals.items()}
                for q, vals in sorted(raw.items(), key=lambda kv: _queue_order(kv[0]))}

    def msi_irqs(self, dev: str) -> list[int]:
        return sorted(int(n) for n in self.listdir(dev, "device/msi_irqs") if n.isdigit())


def _queue_order(name: str) -> tuple[int, str]:
    """rx-2 before rx-10."""
    tail = name.rpartition("-")[2]
    return (int(tail) if tail.isdigit() else 1 << 30, name)


def probe_napi_sysfs(fs: NetFS, dev: str) -> bool | None:
    """Whether ``dev`` has NAPI instances, on kernels without napi-get.

    Writes the current value of ``threaded`` back: the kernel answers EOPNOTSUPP for a
    device without NAPI and otherwise returns early without changing anything.
    None when the device has no ``threaded`` attribute (kernel older than 5.12).
    """
    cur = fs.read(dev, "threaded")
    if cur is None:
        return None
    try:
        fs.write(dev, "threaded", cur)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EIO, errno.ENOTSUP):
            return False
        raise
    return True


class NetdevClients:
    """NetdevClient per netns, opened when first asked for (``clients(netns)``);
    ``close()`` closes them all, and a later call opens a fresh one."""

    def __init__(self) -> None:
        self._cache: dict[str | None, NetdevClient] = {}

    def __call__(self, netns: str | None) -> NetdevClient:
        if netns not in self._cache:
            self._cache[netns] = NetdevClient(netns)
        return self._cache[netns]

    def close(self) -> None:
        while self._cache:
            _, c = self._cache.popitem()
            with contextlib.suppress(Exception):
                c.close()


@contextlib.contextmanager
def clients() -> Any:
    """A cache of NetdevClient per netns for one command; closes them all at the end."""
    cache = NetdevClients()
    try:
        yield cache
    finally:
        cache.close()
