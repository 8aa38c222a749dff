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
import platform
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kbp import rtclass
from kbp.sysinfo import (
    HOST,
    Host,
    format_cpulist,
    parse_cpulist,
    read_interrupts,
    read_irq_effective,
)

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
    of ``cpus`` (effective affinity, else the requested one)."""
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
                for irq in rtclass.device_irqs(dev, ns, actions, client):
                    where = set(_irq_cpus(irq, host)) & want
                    if where:
                        hit.append(irq)
                        on |= where
                if hit:
                    out.append(ForeignIrqs(dev, ns, tuple(hit), tuple(sorted(on))))
    return out


def _irq_cpus(irq: int, host: Host) -> list[int]:
    try:
        text = read_irq_effective(irq, host)
        if text is None:
            text = (host.proc / "irq" / str(irq) / "smp_affinity_list").read_text()
        return parse_cpulist(text)
    except (OSError, ValueError):
        return []


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
    release = platform.release() if release is None else release
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
    named = sorted(p.name for p in Path("/run/netns").glob("*"))
    try:
        found = foreign_irqs(cpus, served, (None, netns, *named), host)
    except (OSError, ValueError):
        found = []
    out += [foreign_irq_note(f, online) for f in found]
    return out
