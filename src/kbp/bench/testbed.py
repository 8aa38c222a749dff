"""Network-namespace testbeds on the running kernel: namespaces joined by veth pairs.

Modelled on the kernel selftests' drivers/net/lib/py: an environment is a context manager,
and every change it makes registers its own undo with ``defer`` so that leaving the
``with`` block -- normally, on an exception or on Ctrl-C -- removes everything it built.

Addresses come from 198.18.0.0/15, the range RFC 2544 reserves for benchmarking, and live
only inside namespaces this module created.

veth uses NAPI (and so can be polled, threaded or attached to kbp) only when GRO is on for
the receiving device; ``Testbed`` turns it on for both ends by default.  That is not enough
for UDP from a local socket: veth_xmit() hands such a packet to NAPI only when the sending
device has no TSO or the receiving one has ``rx-udp-gro-forwarding`` (or ``rx-gro-list``) on
(veth_skb_is_eligible_for_gro()); otherwise it goes through netif_rx() and the per-CPU backlog,
and the device's NAPI never sees it.  ``udp_gro_forwarding`` (default on, with ``gro``) turns
``rx-udp-gro-forwarding`` on for both ends.  It does not merge datagrams for a local socket
that has not asked for UDP GRO, so every datagram still reaches the application on its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, netns

from kbp.system import access, settings

NETNS_DIR = Path("/run/netns")
DEFAULT_PREFIX = "kbp"


def _short_id() -> str:
    return uuid.uuid4().hex[:6]


def set_gro(ns: str | None, dev: str, on: bool) -> None:
    settings.GroHandler().set({"netns": ns, "dev": dev}, on)


def set_udp_gro_forwarding(ns: str | None, dev: str, on: bool) -> None:
    access.cmd(["ethtool", "-K", dev, "rx-udp-gro-forwarding", "on" if on else "off"], ns)


def ifindex(ns: str | None, dev: str) -> int:
    with IPRoute(netns=ns) if ns else IPRoute() as ipr:
        found = ipr.link_lookup(ifname=dev)
    if not found:
        raise LookupError(f"no device {dev} in netns {ns or '(current)'}")
    return int(found[0])


@dataclass
class VethLink:
    """One veth pair: ``dev_a`` in ``ns_a`` with ``ip_a``, ``dev_b`` in ``ns_b`` with ``ip_b``."""

    ns_a: str
    dev_a: str
    ip_a: str
    ns_b: str
    dev_b: str
    ip_b: str
    prefixlen: int = 24
    kind: str = "veth"        # "nic": two real ports a builder put there (--nic-pair)


@dataclass
class Testbed:
    """Two namespaces, ``client`` and ``server``, joined by one or more veth pairs.

    >>> with Testbed() as tb:
    ...     tb.run(tb.server, ["sockperf", "server", "-i", tb.links[0].ip_b])
    """

    links_wanted: int = 1
    link_names: Sequence[str] = ()    # name pairs by role: "rt" -> rt-c-<tag>, rt-s-<tag>
    # links by role built by the caller instead of a veth pair: builder(testbed, i) -> link
    # (it puts its devices in place and registers its own undo with ``defer``)
    builders: dict[str, Callable[[Testbed, int], VethLink]] = field(default_factory=dict)
    gro: bool = True
    udp_gro_forwarding: bool = True   # with gro: local UDP goes through veth's NAPI too
    prefix: str = DEFAULT_PREFIX
    tag: str = field(default_factory=_short_id)
    client: str = ""
    server: str = ""
    links: list[VethLink] = field(default_factory=list)
    journal: access.Journal = field(default_factory=access.Journal)

    # -- context manager -------------------------------------------------------------
    def __enter__(self) -> Testbed:
        try:
            self.client = self.add_netns("c")
            self.server = self.add_netns("s")
            for i in range(max(self.links_wanted, len(self.link_names))):
                self.add_link(i)
        except BaseException:
            self.journal.restore()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.journal.restore()

    def defer(self, fn: Callable[..., object], *args: object) -> access.Deferred:
        """Register an undo step; steps run in reverse order when the testbed closes."""
        return self.journal.defer(fn, *args)

    # -- building blocks -------------------------------------------------------------
    def add_netns(self, role: str) -> str:
        name = f"{self.prefix}-{self.tag}-{role}"
        netns.create(name)
        self.defer(_remove_netns, name)
        with IPRoute(netns=name) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        return name

    def add_link(self, i: int) -> VethLink:
        """Create veth pair number ``i`` between client and server (198.18.<i>.1/.2),
        named ``<role>-c-<tag>`` / ``<role>-s-<tag>`` when ``link_names`` names it, else
        ``<prefix><i>c<tag>`` / ``<prefix><i>s<tag>``."""
        t = self.tag[:4]
        if i < len(self.link_names) and self.link_names[i] in self.builders:
            built = self.builders[self.link_names[i]](self, i)
            self.links.append(built)
            return built
        if i < len(self.link_names):
            role = self.link_names[i]
            dev_a, dev_b = f"{role}-c-{t}", f"{role}-s-{t}"
        else:
            dev_a, dev_b = f"{self.prefix}{i}c{t}", f"{self.prefix}{i}s{t}"
        link = VethLink(ns_a=self.client, dev_a=dev_a, ip_a=f"198.18.{i}.1",
                        ns_b=self.server, dev_b=dev_b, ip_b=f"198.18.{i}.2")
        with IPRoute() as ipr:
            ipr.link("add", ifname=link.dev_a, kind="veth",
                     peer={"ifname": link.dev_b, "net_ns_fd": link.ns_b})
            ipr.link("set", index=ipr.link_lookup(ifname=link.dev_a)[0], net_ns_fd=link.ns_a)
        for ns, dev, ip in ((link.ns_a, link.dev_a, link.ip_a), (link.ns_b, link.dev_b, link.ip_b)):
            with IPRoute(netns=ns) as ipr:
                idx = ipr.link_lookup(ifname=dev)[0]
                ipr.addr("add", index=idx, address=ip, prefixlen=link.prefixlen)
                ipr.link("set", index=idx, state="up")
            if self.gro:
                set_gro(ns, dev, True)
                if self.udp_gro_forwarding:
                    set_udp_gro_forwarding(ns, dev, True)
        self.links.append(link)
        return link

    def recreate_link(self, i: int) -> VethLink:
        """Delete veth pair ``i`` and build it again with the same names and addresses.

        A fresh device drops per-device state a test left behind -- e.g. the NAPI kthreads
        that kernels before about 6.15 keep after ``threaded`` goes back to 0."""
        old = self.links[i]
        if old.kind != "veth":
            raise ValueError(f"link {i} ({old.dev_a}, {old.dev_b}) is not a veth pair: it "
                             "cannot be recreated")
        access.cmd(["ip", "link", "del", old.dev_a], old.ns_a, check=False)
        link = self.add_link(i)
        self.links.remove(link)
        self.links[i] = link
        return link

    def link(self, name: str) -> VethLink:
        """The veth pair ``link_names`` calls ``name``."""
        return self.links[list(self.link_names).index(name)]

    # -- helpers (kbp.system.access) ------------------------------------------------
    def run(self, ns: str | None, argv: Sequence[str], check: bool = True,
            timeout: float | None = 60) -> subprocess.CompletedProcess[str]:
        return access.cmd(argv, ns, check=check, timeout=timeout)

    def popen(self, ns: str | None, argv: Sequence[str], **kw: Any) -> subprocess.Popen[str]:
        """Start a command in a namespace; it is stopped when the testbed closes."""
        proc = access.popen(argv, ns, **kw)
        self.defer(access.stop, proc)
        return proc


def _remove_netns(name: str) -> None:
    # Deleting the namespace deletes the veth ends inside it (and so their peers).
    with contextlib.suppress(FileNotFoundError, OSError):
        netns.remove(name)


def stale_namespaces(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Namespaces a killed run of ours left behind (named ``<prefix>-<tag>-<role>``)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(n for n in os.listdir(NETNS_DIR)
                  if n.startswith(prefix + "-") and n.count("-") == 2)


def remove_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    names = stale_namespaces(prefix)
    for n in names:
        _remove_netns(n)
    return names
