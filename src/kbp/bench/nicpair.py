"""NIC-pair mode (``--nic-pair DEV_A,DEV_B``): the RT flow over two real NIC ports cabled to
each other instead of a veth pair, so every mode -- the module's too -- meets real interrupts.

``DEV_A`` becomes the tester's end (moved into the client namespace), ``DEV_B`` the server's
(moved into the server namespace, where the RT application and the mode serve it).  Each
port's interrupts are affined for the run: the server port's to the RT CPU (the papers' RT
NIC, whose IRQ lands on the RT CPU), the tester port's to the tester's CPU.  Everything else
in the scenario (the flood's veth pair, RPS of the flood device) is unchanged; a scenario
that steers the RT device with RPS leaves a NIC alone (its interrupt already runs the receive
path on the RT CPU: ``VethLink.kind == "nic"``).

Before anything changes, :func:`check` refuses: a malformed list or the same device twice, a
device that does not exist in this namespace, the loopback, a device without NAPI (kbp
serves NAPI devices only), a device that carries this machine's default route (the run would
cut the machine off its network).  After the ports are in place, :func:`wait_reachable`
refuses ports that cannot reach each other ("are they cabled to each other?").

What each port was (name, ifindex, up or down, MTU, addresses, IRQ affinities) is journaled
in kbpctl's format (a process journal, owner ``nicpair``) *before* it moves, and
:meth:`NicPort.restore` puts it back: out of the namespace, renamed if the kernel had to
rename it, addresses, MTU, state, affinities.  Deleting a namespace hands a physical port
back to the initial namespace by itself but loses the rest, so a benchmark killed with
SIGKILL leaves the journal, and the next benchmark (:func:`recover`) finishes the restore.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from kbp import netdev, sysinfo
from kbp.system import access, journal
from kbp.system.settings import IrqHandler

OWNER = "nicpair"                    # its process journal (kbp.system.journal)
_IRQ = IrqHandler()                  # the ports' IRQ affinities, read and written
SYS_NET = Path("/sys/class/net")


class NicPairError(ValueError):
    """A ``--nic-pair`` that cannot be used (the message says why)."""


def parse(text: str) -> tuple[str, str]:
    """``"eth1,eth2"`` -> ("eth1", "eth2"); refuses anything but two different names."""
    devs = [d.strip() for d in text.split(",") if d.strip()]
    if len(devs) != 2:
        raise NicPairError(f"--nic-pair {text!r}: give two devices, DEV_A,DEV_B (the tester's "
                           "port, then the server's)")
    if devs[0] == devs[1]:
        raise NicPairError(f"--nic-pair names {devs[0]} twice: give two ports cabled to each "
                           "other")
    return devs[0], devs[1]


def default_route_devs() -> set[str]:
    """Devices carrying a default route in this namespace (IPv4 and IPv6)."""
    out: set[str] = set()
    for fam in ("-4", "-6"):
        r = access.cmd(["ip", "-j", fam, "route", "show", "default"], check=False)
        with contextlib.suppress(ValueError):
            out |= {x["dev"] for x in json.loads(r.stdout or "[]") if x.get("dev")}
    return out


def has_napi(link: netdev.Link) -> bool | None:
    """Whether ``dev`` has NAPI instances (napi-get where the kernel has it and the device is
    up -- napi-get lists no NAPI of a device that is down --, else the sysfs probe); None when
    this kernel cannot tell.  A spare port is often down: it is brought up in its namespace."""
    if not link.up:
        return netdev.probe_napi_sysfs(netdev.NetFS(None), link.name)
    with contextlib.suppress(OSError, NetlinkError), netdev.NetdevClient(None) as nc:
        if nc.features().napi_get:
            return bool(nc.napis(link.ifindex))
    return netdev.probe_napi_sysfs(netdev.NetFS(None), link.name)


def check(pair: tuple[str, str]) -> None:
    """Refuse a pair that cannot be used, before anything changes (NicPairError)."""
    routes = default_route_devs()
    for dev in pair:
        link = netdev.get_link(dev)
        if link is None:
            raise NicPairError(f"--nic-pair: no device {dev} in this network namespace "
                               f"(devices: {', '.join(sorted(os.listdir(SYS_NET)))})")
        if dev == "lo":
            raise NicPairError("--nic-pair: lo is not a NIC port")
        if dev in routes:
            raise NicPairError(f"--nic-pair: {dev} carries this machine's default route; "
                               "moving it into the benchmark's namespace would cut the "
                               "machine off its network: give two spare ports")
        if has_napi(link) is False:
            raise NicPairError(f"--nic-pair: {dev} has no NAPI instance "
                               f"({link.kind or 'its driver'} does not use NAPI, or it is "
                               "down): kbp serves NAPI devices only")


def port_irqs(dev: str) -> list[int]:
    """The interrupts of a NIC port: its queue IRQs named after it (``eth1-TxRx-0``,
    sysinfo.device_irqs) or, for virtio, the virtqueues' (``virtio2-input.0``,
    ``virtio2-output.0``; not ``-config``), named after the virtio device behind it."""
    out = {q.irq for q in sysinfo.device_irqs(dev, None)}
    virtio = (SYS_NET / dev / "device").resolve().name
    if virtio.startswith("virtio"):
        for irq, action in sysinfo.read_interrupts().items():
            if any(a.strip().startswith(f"{virtio}-") and not a.strip().endswith("-config")
                   for a in action.split(", ")):
                out.add(irq)
    return sorted(out)


#: an interrupt action that only transmits: virtio's ``-output.N`` virtqueue, a ``-tx-N``
#: vector (not ``TxRx``, not ``rx``)
_TX_ONLY = re.compile(r"output|(?<![a-z])tx(?![a-z])", re.I)


def receive_irqs(irqs: Iterable[int]) -> list[int]:
    """Those of a port's ``irqs`` that can signal a received packet: all but the ones whose
    every action only transmits (by name, /proc/interrupts)."""
    names = sysinfo.read_interrupts()

    def tx_only(action: str) -> bool:
        return bool(_TX_ONLY.search(action)) and not re.search(r"rx|input", action, re.I)

    def receives(irq: int) -> bool:
        actions = [a.strip() for a in names.get(irq, "").split(", ") if a.strip()]
        return not actions or not all(tx_only(a) for a in actions)

    return sorted(i for i in irqs if receives(i))


@dataclass
class NicPort:
    """One port of the pair as it was, and where it went."""

    name: str
    ifindex: int
    up: bool
    mtu: int
    addrs: list[tuple[str, int]]                 # (address, prefixlen)
    irqs: dict[int, str]                          # IRQ -> smp_affinity_list
    netns: str = ""                               # where it is now ("" = here)
    moved: bool = False

    @classmethod
    def record(cls, dev: str) -> NicPort:
        r = access.cmd(["ip", "-j", "addr", "show", "dev", dev])
        info = json.loads(r.stdout)[0]
        addrs = [(a["local"], int(a["prefixlen"])) for a in info.get("addr_info", [])
                 if a.get("scope") != "link"]
        irqs = {i: sysinfo.read_irq_affinity(i) for i in port_irqs(dev)}
        return cls(name=dev, ifindex=int(info["ifindex"]), up="UP" in info.get("flags", []),
                   mtu=int(info.get("mtu", 1500)), addrs=addrs, irqs=irqs)

    def move(self, netns: str, ip: str, prefixlen: int) -> None:
        """Into ``netns`` (same name), address ``ip``, up."""
        self.netns = netns
        self.moved = True
        access.cmd(["ip", "link", "set", "dev", self.name, "netns", netns])
        access.cmd(["ip", "addr", "flush", "dev", self.name], ns=netns)
        access.cmd(["ip", "addr", "add", f"{ip}/{prefixlen}", "dev", self.name], ns=netns)
        access.cmd(["ip", "link", "set", "dev", self.name, "up"], ns=netns)

    def pin_irqs(self, cpu: int) -> None:
        for irq in self.irqs:
            # a managed IRQ refuses (OSError), a vanished one is gone: left as it is
            with contextlib.suppress(OSError, journal.TargetGone):
                _IRQ.set({"irq": irq}, str(cpu))

    def restore(self) -> None:
        """Put the port back as recorded: every step is tried, then
        :class:`kbp.system.access.RestoreError` names the ones that failed."""
        if self.moved and self.netns and Path(f"/run/netns/{self.netns}").exists():
            r = access.cmd(["ip", "link", "set", "dev", self.name, "netns", "1"],
                           ns=self.netns, check=False)
            if r.returncode != 0 and _name_of(self.ifindex) is None:
                raise access.RestoreError([RuntimeError(
                    f"{self.name}: could not leave netns {self.netns}: {r.stderr.strip()}")])
        now = _name_of(self.ifindex)
        if now is None:
            raise access.RestoreError([LookupError(
                f"{self.name} (ifindex {self.ifindex}) is not back in this namespace")])
        argvs = []
        if now != self.name:                       # the kernel renamed it (name taken)
            argvs.append(["ip", "link", "set", "dev", now, "name", self.name])
        argvs += [["ip", "addr", "flush", "dev", self.name],
                  *(["ip", "addr", "add", f"{a}/{p}", "dev", self.name] for a, p in self.addrs),
                  ["ip", "link", "set", "dev", self.name, "mtu", str(self.mtu)],
                  ["ip", "link", "set", "dev", self.name, "up" if self.up else "down"]]

        def affinity(irq: int, aff: str) -> None:
            key = {"irq": irq}
            try:
                if _IRQ.get(key) != aff:
                    _IRQ.set(key, aff)
            except journal.TargetGone:
                raise OSError(errno.ENOENT, f"IRQ {irq} affinity {aff}: the IRQ is gone") \
                    from None
            except OSError as e:
                raise OSError(e.errno, f"IRQ {irq} affinity {aff}: {e.strerror}") from None

        access.run_all([*(partial(access.cmd, argv) for argv in argvs),
                        *(partial(affinity, irq, aff) for irq, aff in self.irqs.items())])
        self.moved = False


def _name_of(ifindex: int) -> str | None:
    link = netdev.get_link(ifindex)
    return link.name if link else None


KIND = journal.KIND_NIC_PORT  # a journal record: key name, ifindex, netns; old: the port as it was


def _record(port: NicPort) -> dict[str, Any]:
    return {"up": port.up, "mtu": port.mtu, "addrs": port.addrs, "irqs": port.irqs}


class PortHandler:
    """The journal's handler of a NIC port that a killed benchmark moved away.  Its state is
    not read back (``get`` answers None, never the recorded state): a journaled port is always
    put back, and every step of :meth:`NicPort.restore` is idempotent (a port that never
    left is only readdressed and re-affined as it was)."""

    def get(self, key: Mapping[str, Any]) -> Any:
        return None

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        port = NicPort(name=str(key["name"]), ifindex=int(key["ifindex"]), up=bool(value["up"]),
                       mtu=int(value["mtu"]), addrs=[(str(a), int(p)) for a, p in value["addrs"]],
                       irqs={int(i): str(a) for i, a in value["irqs"].items()},
                       netns=str(key["netns"]), moved=True)
        port.restore()


@dataclass
class NicPair:
    """The two ports, journaled while they are away."""

    tester: NicPort
    server: NicPort
    state: journal.StateDir = field(default_factory=journal.StateDir)
    _file: journal.JournalFile | None = None

    @classmethod
    def record(cls, pair: tuple[str, str]) -> NicPair:
        return cls(NicPort.record(pair[0]), NicPort.record(pair[1]))

    def ports(self) -> tuple[NicPort, NicPort]:
        return self.tester, self.server

    def journal_moves(self, tester_ns: str, server_ns: str, pid: int | None = None) -> None:
        """Write ahead, before either port moves: each port as it is and the namespace it
        goes to (``pid``: as another process's journal, for tests)."""
        self._file = self.state.begin_process(OWNER, pid)
        for port, ns in ((self.tester, tester_ns), (self.server, server_ns)):
            self._file.change(KIND, {"name": port.name, "ifindex": port.ifindex, "netns": ns},
                              _record(port), "moved")

    def restore(self) -> None:
        """Both ports back (both tried); the journal goes once nothing failed, else
        :class:`kbp.system.access.RestoreError` names every failed step of both."""
        errors: list[BaseException] = []
        for port in self.ports():
            try:
                port.restore()
            except access.RestoreError as e:
                errors += e.errors
        if errors:
            raise access.RestoreError(errors)
        file, self._file = self._file, None
        if file is not None:
            file.remove()

    def to_json(self) -> dict[str, Any]:
        return {"tester_port": self.tester.name, "server_port": self.server.name,
                "irqs": {p.name: sorted(p.irqs) for p in self.ports()}}


def wait_reachable(client_ns: str, server_ip: str, timeout: float = 15.0) -> None:
    """Until the tester's port reaches the server's (ARP + ping); NicPairError if never."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = access.cmd(["ping", "-c", "1", "-W", "1", server_ip], ns=client_ns, check=False)
        if r.returncode == 0:
            return
        time.sleep(0.3)
    raise NicPairError(f"--nic-pair: the ports do not reach each other ({server_ip} did not "
                       f"answer in {timeout:.0f} s): are they cabled to each other, and the "
                       "link up?")


def recover(state: journal.StateDir | None = None) -> tuple[list[str], list[str]]:
    """Finish the restore a killed benchmark left in its journal (under kbp's lock): the
    ports it names, back out of a namespace still holding them, renamed, readdressed,
    re-affined.  Returns (one line per port put back, one per journal that could not all
    be: it is kept for the next try).  Without such a journal it changes nothing, not even
    the lock's file."""
    st = state or journal.StateDir()
    if not st.orphans(OWNER, own=True):
        return [], []
    with st.lock():
        recs, failed = st.replay_orphans(OWNER, {KIND: PortHandler()},
                                         "a killed benchmark's NIC ports", own=True)
    return [f"NIC port {c.key['name']} restored from {rec.path.name}"
            for rec in recs for c in rec.changes], failed
