"""Where non-RT receive work meets a poller on its CPU, and what to do about it (issue 11).

Two measured inversions (docs/results.md "Softirq-lock inversion measured"):

* **Another device's interrupts on the polling CPU.** Its NET_RX is raised there; on non-RT
  kernels it runs inside the poller's ``local_bh_enable()``, at the poller's priority (6.12,
  busy mode, a flood on the second NIC: 35 % of the run in the poller's context, up to 68 ms
  at once), and on 6.12-rt its interrupt thread holds the CPU's softirq lock the poller then
  waits for. Moving those interrupts off the polling CPU (the exclusive-CPU method) removed
  it in both. ``kbpctl enable`` and ``apply`` name such interrupts, with the command that
  moves them.
* **A poller above the interrupt threads on a kernel with the softirq lock** (PREEMPT_RT
  before 6.18, or with ``CONFIG_PREEMPT_RT_NEEDS_BH_LOCK``): at SCHED_FIFO 51 it preempts
  bh sections it then has to wait for (6.12-rt: 5057 lock waits in 13 s instead of 174 at
  50, busy mode). ``kbpctl`` warns when asked for that.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbp import rtclass, sysinfo
from kbp.errors import InvalidInput, KbpctlError
from kbp.sysinfo import (
    HOST,
    Host,
    format_cpulist,
    parse_cpulist,
    read_interrupts,
    read_irq_affinity,
    read_irq_effective,
)
from kbp.system import journal
from kbp.system.journal import TargetGone

IRQ_THREAD_PRIO = 50  # forced-threaded interrupt handlers (kernel/irq/manage.c)


@dataclass(frozen=True)
class ForeignIrqs:
    """Queue interrupts of a device kbp does not serve that land on polling CPUs."""

    dev: str
    netns: str | None
    irqs: tuple[int, ...]
    cpus: tuple[int, ...]  # the polling CPUs they land on


def foreign_irqs(cpus: Iterable[int], served: Iterable[tuple[str, str | None]],
                 netns: Sequence[str | None] = (None,), host: Host = HOST
                 ) -> list[ForeignIrqs]:
    """The devices of ``netns`` (not in ``served``) whose queue interrupts are affined to one
    of ``cpus``."""
    from kbp.netdev import clients, link_names
    want, skip = set(cpus), set(served)
    actions = read_interrupts(host)
    out = []
    with clients() as client:
        for ns in dict.fromkeys(netns):
            for dev in link_names(ns):
                if dev == "lo" or (dev, ns) in skip:
                    continue
                hit, on = [], set()
                for irq in rtclass.device_irqs(dev, ns, actions, client, host):
                    where = set(_irq_cpus(irq, host)) & want
                    if where:
                        hit.append(irq)
                        on |= where
                if hit:
                    out.append(ForeignIrqs(dev, ns, tuple(hit), tuple(sorted(on))))
    return out


def _irq_cpus(irq: int, host: Host) -> list[int]:
    """The CPUs an interrupt lands on: its effective affinity where the kernel shows one
    that agrees with the requested list (an IRQ allowed on every CPU is delivered to one),
    else the requested list (x86 applies a new one at the vector's next interrupt, so the
    effective list lags behind a change until then)."""
    want = _requested(irq, host)
    try:
        eff = parse_cpulist(read_irq_effective(irq, host) or "")
    except ValueError:
        eff = []
    return eff if eff and set(eff) <= set(want) else want


def _requested(irq: int, host: Host) -> list[int]:
    """The interrupt's requested affinity ([] when it cannot be read)."""
    try:
        return parse_cpulist(read_irq_affinity(irq, host))
    except (OSError, ValueError):
        return []


def scope(netns: str | None) -> tuple[str | None, ...]:
    """The netns whose devices are looked at: the init netns, ``netns`` and every named one
    (an interrupt is global; the device may live anywhere)."""
    from kbp.netdev import named_netns
    return tuple(dict.fromkeys((None, netns, *named_netns())))


def foreign_irq_note(f: ForeignIrqs, online: Sequence[int]) -> str:
    """One warning line, with the command that moves the interrupts."""
    rest = [c for c in online if c not in f.cpus]
    where = f" in netns {f.netns}" if f.netns else ""
    irqs = ", ".join(str(i) for i in f.irqs)
    fix = ("; move them: " + "; ".join(f"echo {format_cpulist(rest)} > /proc/irq/{i}/"
                                       "smp_affinity_list" for i in f.irqs)) if rest else ""
    return (f"note: {f.dev}{where} (not served by kbp) has its interrupts (IRQ {irqs}) on "
            f"polling CPU {format_cpulist(list(f.cpus))}: its NET_RX runs there, inside the "
            "poller (non-RT kernels) or holding the softirq lock the poller waits for "
            f"(PREEMPT_RT before 6.18){fix}")


def has_bh_lock(version: str | None = None, release: str | None = None,
                config: str | None = None) -> bool:
    """The kernel has PREEMPT_RT's per-CPU softirq lock (``softirq_ctrl.lock``): PREEMPT_RT
    and either older than 6.18 or built with ``CONFIG_PREEMPT_RT_NEEDS_BH_LOCK=y``
    (docs/rt-softirq-lock.md)."""
    version = os.uname().version if version is None else version
    if not rtclass.preempt_rt(version=version):
        return False
    release = sysinfo.kernel_release() if release is None else release
    m = re.match(r"(\d+)\.(\d+)", release)
    if m and (int(m.group(1)), int(m.group(2))) < (6, 18):
        return True
    if config is None:
        try:
            config = Path(f"/boot/config-{release}").read_text()
        except OSError:
            return False  # 6.18+: the option defaults to n
    return "CONFIG_PREEMPT_RT_NEEDS_BH_LOCK=y" in config


def prio_note(rt_prio: int, bh_lock: bool) -> str | None:
    """The warning for a poller above the interrupt threads on a kernel with the lock."""
    if not bh_lock or rt_prio <= IRQ_THREAD_PRIO:
        return None
    return (f"note: SCHED_FIFO {rt_prio} puts the poller above the interrupt threads "
            f"(FIFO {IRQ_THREAD_PRIO}) on a PREEMPT_RT kernel with the per-CPU softirq lock: "
            "it preempts their bottom-half sections and then waits for the lock they hold "
            "(6.12-rt, busy mode, measured: 29x the lock waits of FIFO 50); --rt-prio "
            f"{IRQ_THREAD_PRIO} avoids that")


def notes(cpus: Iterable[int], rt_prio: int, served: Iterable[tuple[str, str | None]],
          netns: str | None, online: Sequence[int], host: Host = HOST) -> list[str]:
    """The warnings ``enable``/``apply`` print for devices just served on ``cpus`` (other
    devices: those of the init netns, ``netns`` and every named netns -- interrupts are
    global, the device may live anywhere); a system that cannot be read gives none (they are
    advice, never a failure)."""
    out = []
    note = prio_note(rt_prio, has_bh_lock())
    if note:
        out.append(note)
    try:
        found = foreign_irqs(cpus, served, scope(netns), host)
    except (OSError, ValueError, KbpctlError):  # e.g. a netns deleted while it was read
        found = []
    out += [foreign_irq_note(f, online) for f in found]
    return out


def check_isolate(cpus: Sequence[int] | None, online: Sequence[int]) -> None:
    """``--isolate`` needs a CPU without a poller for the other devices' interrupts."""
    polling = set(online if cpus is None else cpus)
    if [c for c in online if c not in polling]:
        return
    which = ("without --cpus the pollers use every online CPU" if cpus is None else
             f"CPUs {format_cpulist(sorted(polling))} are every online CPU")
    raise InvalidInput(f"--isolate moves other devices' interrupts off the polling CPUs, but "
                       f"{which}: give --cpus a subset, or drop --isolate")


def isolate_plan(cpus: Iterable[int], served: Iterable[tuple[str, str | None]],
                 netns: Sequence[str | None], online: Sequence[int], host: Host = HOST
                 ) -> list[tuple[int, str]]:
    """``--isolate``: (IRQ, new affinity list) for every queue interrupt of a device kbp does
    not serve that lands on ``cpus``: its affinity without the polling CPUs (every other
    online CPU when nothing is left). Journaled as ``irq`` changes of the enabled device,
    so ``disable`` puts them back."""
    polling = set(cpus)
    rest = [c for c in online if c not in polling]
    out = []
    for f in foreign_irqs(polling, served, netns, host):
        for irq in f.irqs:
            keep = [c for c in _requested(irq, host) if c not in polling] or rest
            out.append((irq, format_cpulist(keep)))
    return out


def rps_isolate_plan(cpus: Iterable[int], served: Iterable[tuple[str, str | None]],
                     netns: Sequence[str | None]) -> list[tuple[dict[str, Any], str]]:
    """``--isolate``, RPS: (sysfs key, new mask) for every receive queue of a device kbp does
    not serve whose ``rps_cpus`` names a polling CPU: the mask without the polling CPUs (0,
    no RPS, when nothing is left: the packets stay on the CPU that received them)."""
    from kbp.netdev import NetFS, get_link, link_names
    from kbp.rps import RPS_CPUS, mask_cpus
    polling, skip = set(cpus), set(served)
    out = []
    for ns in dict.fromkeys(netns):
        fs = NetFS(ns)
        for dev in link_names(ns):
            if dev == "lo" or (dev, ns) in skip:
                continue
            queues = fs.rx_queues(dev, [RPS_CPUS])
            link = get_link(dev, ns)
            if link is None:
                continue
            for q, v in queues.items():
                on = mask_cpus(v.get(RPS_CPUS))
                if polling & set(on):
                    keep = sum(1 << c for c in on if c not in polling)
                    out.append(({"netns": ns, "dev": dev, "ifindex": link.ifindex,
                                 "attr": f"queues/{q}/{RPS_CPUS}"}, f"{keep:x}"))
    return out


def isolate(ex: Any, cpus: Iterable[int], served: Iterable[tuple[str, str | None]],
            netns: str | None, online: Sequence[int], host: Host = HOST) -> int:
    """Carry out :func:`isolate_plan` and :func:`rps_isolate_plan` through a journal's
    executor (kinds ``irq`` and ``sysfs``); returns the number of changes. An interrupt whose
    affinity the kernel manages (EIO), or a target that went away, is left as it is: the
    other devices still work, and the note after ``enable`` names an interrupt that stayed."""
    cpus, served, where = list(cpus), list(served), scope(netns)
    steps: list[tuple[str, dict[str, Any], str]] = [
        (journal.KIND_IRQ, {"irq": irq}, new)
        for irq, new in isolate_plan(cpus, served, where, online, host)]
    steps += [(journal.KIND_SYSFS, key, new) for key, new in rps_isolate_plan(cpus, served, where)]
    moved = 0
    for kind, key, new in steps:
        try:
            if ex.apply(kind, key, new) is not None:
                moved += 1
        except (OSError, TargetGone):
            continue
    return moved
