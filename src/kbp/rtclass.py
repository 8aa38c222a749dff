"""The RT class of the outsourcing method: which devices' receive work kbp serves.

The paper (../shared/papers/rt-socket-outsourcing.txt, Sect. III-A) splits receive work by
the priority of the interrupt thread that schedules a NAPI: at or above ``sysctl
net.core.rtnet_prio`` it is RT work, below it stays on NET_RX. kbp's equivalent, the
``[rt_class]`` table of kbp.toml::

    [rt_class]
    rtnet_prio = 47          # PREEMPT_RT: every device with an IRQ thread at FIFO/RR >= 47
    netns = ["server"]       # look in these netns too (default: the init netns only)

``kbpctl apply`` serves every device the rule selects with the ``[defaults]`` settings (a
``[[device]]`` entry of the same name overrides them) and hands back a device whose
interrupt threads fell below ``rtnet_prio``; ``kbpctl apply --watch S`` re-evaluates the rule
every S seconds, so devices appearing later and ``chrt`` on an IRQ thread are picked up.

The devices below ``rtnet_prio`` whose queue interrupts land on a CPU with an RT poller are
what makes that CPU's receive work contend: with ``non_rt = "poll"`` (the default) apply
serves them too, with class non-rt (``nice`` of the rule) on the CPUs their interrupts land
on, so the RT poller preempts their receive work between polls instead of waiting behind
it in NET_RX; ``non_rt = "leave"`` leaves them in softirq (before the classes, the only
behaviour; ``kbpctl enable --isolate`` is the other remedy: move them off the RT CPUs).

Why kbpctl and not kbp.ko: a module cannot map a device to its interrupt threads
(``irq_to_desc()`` is exported only to KVM on powerpc since 5.11, and virtio_net does not
record its NAPIs' IRQs before 6.13's ``netif_napi_set_irq()`` users); user space can, from
/proc/interrupts, the device's MSI vectors and /proc/PID/stat of the ``irq/N-name`` threads.

Only PREEMPT_RT kernels thread every interrupt handler (at SCHED_FIFO 50), so selection by
priority is refused elsewhere: there the RT class is the explicit device list (``[[device]]``
entries, ``kbpctl enable DEV``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp import names
from kbp.errors import InvalidInput
from kbp.sysinfo import (
    HOST,
    POLICY_NAMES,
    RT_PRIO_MAX,
    RT_PRIO_MIN,
    Host,
    kthreads,
    parse_cpulist,
    read_interrupts,
    read_irq_affinity,
    read_irq_effective,
)

RTNET_PRIO_MIN, RTNET_PRIO_MAX = RT_PRIO_MIN, RT_PRIO_MAX
RT_POLICIES = ("SCHED_FIFO", "SCHED_RR")
CLASS_RT, CLASS_NONRT = names.CLASS_RT, names.CLASS_NON_RT
#: [rt_class] non_rt: serve the non-RT devices on RT CPUs with class non-rt, or leave them
NON_RT_POLL, NON_RT_LEAVE = "poll", "leave"
NON_RT_CHOICES = (NON_RT_POLL, NON_RT_LEAVE)
_IRQ_THREAD = re.compile(r"^irq/(\d+)-")
_QUEUE = re.compile(r"[-_:.@]\D*\d+$")  # "-input.0", "-TxRx-3", "_comp0": a queue number


def preempt_rt(host: Host = HOST, version: str | None = None) -> bool:
    """The running kernel is PREEMPT_RT: its version string says so (``uname -v``: "SMP
    PREEMPT_RT", every RT build since the config option exists), or the out-of-tree RT
    patch's ``/sys/kernel/realtime`` reads 1 (mainline RT, e.g. Debian's 7.2-rt, has no such
    file)."""
    if "PREEMPT_RT" in (os.uname().version if version is None else version):
        return True
    try:
        return (host.sys / "kernel/realtime").read_text().strip() == "1"
    except OSError:
        return False


@dataclass(frozen=True)
class RtClassRule:
    """``[rt_class]`` of kbp.toml: select devices by their interrupt threads' priority."""

    rtnet_prio: int
    netns: tuple[str, ...] = ()
    #: NON_RT_POLL: devices below rtnet_prio whose queue interrupts land on a CPU with an RT
    #: poller get class non-rt there; NON_RT_LEAVE: they stay in softirq
    non_rt: str = NON_RT_POLL
    nice: int = 0  # the nice of their non-rt pollers

    def check_range(self) -> None:
        """ERANGE-style: the accepted range in the message."""
        if not RTNET_PRIO_MIN <= self.rtnet_prio <= RTNET_PRIO_MAX:
            raise InvalidInput(f"rt_class.rtnet_prio {self.rtnet_prio} is out of range "
                               f"({RTNET_PRIO_MIN}..{RTNET_PRIO_MAX}, the SCHED_FIFO "
                               "priorities of interrupt threads)")
        if self.non_rt not in NON_RT_CHOICES:
            raise InvalidInput(f"rt_class.non_rt {self.non_rt!r}: use \"{NON_RT_POLL}\" (serve "
                               "the non-RT devices on RT CPUs with class non-rt) or "
                               f"\"{NON_RT_LEAVE}\" (leave them in softirq)")
        lo, hi = names.NICE_RANGE
        if not lo <= self.nice <= hi:
            raise InvalidInput(f"rt_class.nice {self.nice} is out of range ({lo}..{hi})")

    def validate(self, host: Host = HOST, version: str | None = None) -> None:
        """Refuse what cannot work, before anything changes: the range, and a non-RT
        kernel (with the reason and what to do instead)."""
        self.check_range()
        if not preempt_rt(host, version):
            raise InvalidInput(
                "rt_class.rtnet_prio selects devices by the priority of their interrupt "
                "threads, and only PREEMPT_RT kernels run every interrupt handler in a "
                "thread (this kernel is not PREEMPT_RT: uname -v does not say PREEMPT_RT); "
                "list the RT devices as [[device]] entries instead")

    def to_json(self) -> dict[str, object]:
        return {"rtnet_prio": self.rtnet_prio, "netns": list(self.netns),
                "non_rt": self.non_rt, "nice": self.nice}

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> RtClassRule:
        """From :meth:`to_json` (a rule saved before the classes: non_rt "leave")."""
        prio = raw.get("rtnet_prio")
        ns = raw.get("netns") or []
        non_rt, nice = raw.get("non_rt", NON_RT_LEAVE), raw.get("nice", 0)
        if not isinstance(prio, int) or not isinstance(ns, list) or \
                not isinstance(non_rt, str) or not isinstance(nice, int):
            raise InvalidInput(f"bad rt_class record {dict(raw)!r}")
        return cls(prio, tuple(str(n) for n in ns), non_rt, nice)


@dataclass(frozen=True)
class IrqThread:
    irq: int
    pid: int
    comm: str
    policy: str
    priority: int  # SCHED_FIFO/RR priority; 0 for the other policies

    @property
    def rt_priority(self) -> int:
        return self.priority if self.policy in RT_POLICIES else 0

    def text(self) -> str:
        return f"{self.comm} (IRQ {self.irq}) {self.policy.replace('SCHED_', '')} " \
               f"{self.priority}"


def irq_threads(host: Host = HOST) -> dict[int, list[IrqThread]]:
    """IRQ number -> its handler threads (``irq/N-name`` kernel threads)."""
    out: dict[int, list[IrqThread]] = {}
    for st in kthreads(host):
        m = _IRQ_THREAD.match(st.comm)
        if m:
            irq = int(m.group(1))
            out.setdefault(irq, []).append(IrqThread(
                irq, st.pid, st.comm, POLICY_NAMES.get(st.policy, str(st.policy)),
                st.rt_priority))
    return out


def queue_irqs(candidates: Iterable[int], actions: Mapping[int, str]) -> list[int]:
    """The IRQs among ``candidates`` that serve a queue: their action name ends in a queue
    number after a separator (``virtio0-input.0``, ``eth1-TxRx-3``); link, config and
    mailbox IRQs (``eth1``, ``virtio0-config``) do not schedule NAPIs."""
    return sorted(i for i in set(candidates)
                  if any(_QUEUE.search(a.strip()) for a in actions.get(i, "").split(", ")))


@dataclass(frozen=True)
class DeviceClass:
    """A device's class and why (``kbpctl status``, ``apply``'s reasons)."""

    dev: str
    netns: str | None
    cls: str  # CLASS_RT or CLASS_NONRT
    why: str
    threads: tuple[IrqThread, ...] = field(default=())
    #: the CPUs its queue interrupts land on (effective affinity; where non_rt = "poll"
    #: serves a non-RT device when one of them has an RT poller)
    irq_cpus: tuple[int, ...] = field(default=())

    @property
    def rt(self) -> bool:
        return self.cls == CLASS_RT

    def to_json(self) -> dict[str, object]:
        return {"class": self.cls, "why": self.why,
                "irq_threads": [{"irq": t.irq, "pid": t.pid, "comm": t.comm,
                                 "policy": t.policy, "priority": t.priority}
                                for t in self.threads],
                "irq_cpus": list(self.irq_cpus)}


def classify(dev: str, netns: str | None, irqs: Sequence[int],
             threads: Mapping[int, list[IrqThread]], rtnet_prio: int) -> DeviceClass:
    """RT when one of the device's queue interrupts is handled by a thread at or above
    ``rtnet_prio`` (the paper's test in ``napi_schedule_irqoff()``), pure."""
    mine = tuple(t for i in irqs for t in threads.get(i, []))
    if not irqs:
        return DeviceClass(dev, netns, CLASS_NONRT,
                           "no queue interrupt (veth, tun and other software devices "
                           "receive in the sender's context)")
    if not mine:
        return DeviceClass(dev, netns, CLASS_NONRT,
                           f"no interrupt thread for IRQ {_irq_list(irqs)} (not threaded)")
    top = max(mine, key=lambda t: (t.rt_priority, -t.irq))
    if top.rt_priority >= rtnet_prio:
        return DeviceClass(dev, netns, CLASS_RT,
                           f"{top.text()} >= rtnet_prio {rtnet_prio}", mine)
    return DeviceClass(dev, netns, CLASS_NONRT,
                       f"its interrupt threads run below rtnet_prio {rtnet_prio} "
                       f"(highest: {top.text()})", mine)


def _irq_list(irqs: Sequence[int]) -> str:
    return ", ".join(str(i) for i in irqs)


def device_irqs(dev: str, netns: str | None, actions: Mapping[int, str],
                client: Callable[[str | None], Any], host: Host = HOST) -> list[int]:
    """The queue IRQs of ``dev``: its NAPIs' IRQs where the driver records them, else the
    MSI vectors of the device it sits on (``/sys/bus/BUS/devices/NAME/msi_irqs``; for
    virtio those of the PCI function above it), else an IRQ whose action is named after the
    device (a single legacy interrupt). No sysfs of another netns is needed: the parent
    comes from rtnetlink. ``client``: a netdev netlink client per netns
    (:func:`kbp.netdev.clients`)."""
    from kbp.netdev import get_link
    link = get_link(dev, netns)
    if link is None:
        return []
    napi_irqs = [n.irq for n in client(netns).napis(link.ifindex) if n.irq is not None]
    if napi_irqs:
        return queue_irqs(napi_irqs, actions) or sorted(set(napi_irqs))
    msi: list[int] = []
    if link.parent is not None:
        name, bus = link.parent
        base = host.sys / "bus" / bus / "devices" / name
        for d in (base, base / "..") if bus == "virtio" else (base,):
            try:
                msi = [int(n) for n in os.listdir(d / "msi_irqs") if n.isdigit()]
            except OSError:
                continue
            if msi:
                break
    named = [i for i, a in actions.items() if dev in (x.strip() for x in a.split(", "))]
    return queue_irqs(msi, actions) or sorted(named)


def scan(rule: RtClassRule, host: Host = HOST) -> list[DeviceClass]:
    """Every device of the init netns and of those of ``rule.netns`` that exist now,
    classified."""
    from kbp.netdev import link_names, named_netns
    known = set(named_netns())
    present = [ns for ns in rule.netns if ns in known]  # may come later
    devs = [(d, ns) for ns in (None, *present) for d in link_names(ns) if d != "lo"]
    return list(describe(devs, rule, host).values())


def describe(devices: Iterable[tuple[str, str | None]], rule: RtClassRule | None,
             host: Host = HOST) -> dict[tuple[str, str | None], DeviceClass]:
    """The class of each (device, netns) under ``rule`` (none: {})."""
    if rule is None:
        return {}
    from kbp.netdev import clients
    actions = read_interrupts(host)
    threads = irq_threads(host)
    out = {}
    with clients() as client:
        for d, ns in devices:
            irqs = device_irqs(d, ns, actions, client, host)
            c = classify(d, ns, irqs, threads, rule.rtnet_prio)
            out[(d, ns)] = dataclasses.replace(c, irq_cpus=irq_cpus(irqs, host))
    return out


def irq_cpus(irqs: Iterable[int], host: Host = HOST) -> tuple[int, ...]:
    """The CPUs the IRQs are delivered to: each one's effective affinity where the kernel
    shows one within the affinity asked for, else that (x86 applies a new affinity at the
    next interrupt; kbp.contention reads them the same way). An IRQ that cannot be read is
    left out."""
    out: set[int] = set()
    for irq in irqs:
        try:
            want = set(parse_cpulist(read_irq_affinity(irq, host)))
        except (OSError, InvalidInput):
            continue
        try:
            eff = set(parse_cpulist(read_irq_effective(irq, host) or ""))
        except InvalidInput:
            eff = set()
        out |= eff if eff and eff <= want else want
    return tuple(sorted(out))


def shares_rt_cpu(c: DeviceClass, rt_cpus: set[int] | None) -> list[int]:
    """A non-RT device's CPUs when one of its queue interrupts lands on a CPU with an RT
    poller (``rt_cpus`` None: every CPU has one), else []: the CPUs its interrupts land on,
    where its non-rt pollers then run (moving a heavy device's interrupts onto the RT CPUs
    would add to the contention, not split it)."""
    if c.rt or not c.irq_cpus:
        return []
    if rt_cpus is not None and not set(c.irq_cpus) & rt_cpus:
        return []
    return list(c.irq_cpus)


RULE_FILE = "rt_class.json"


def save_rule(root: Path, rule: RtClassRule | None) -> None:
    """Record the rule ``apply`` last converged to (``status`` classifies with it); None
    removes it."""
    path = root / RULE_FILE
    if rule is None:
        path.unlink(missing_ok=True)
        return
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rule.to_json()) + "\n")
    tmp.replace(path)


def load_rule(root: Path) -> RtClassRule | None:
    try:
        return RtClassRule.from_json(json.loads((root / RULE_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, InvalidInput):
        return None
