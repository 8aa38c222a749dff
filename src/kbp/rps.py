"""RPS on a device kbp serves: detect it, turn it off (journaled), show it.

Receive Packet Steering hands the packets a device receives to the backlog of a CPU:
``netif_receive_skb()`` and the GRO list path ask ``get_rps_cpu()``, and when it names a CPU
the packet is ``enqueue_to_backlog()``-ed there and processed later by that CPU's
NET_RX_SOFTIRQ (``process_backlog``) -- also when it is the poller's own CPU. A kbp poller (or
a stock NAPI thread) then only moves packets from the ring to a backlog queue, and the
protocol work goes back into the softirq that kbp takes it out of, behind timers, tasklets
and a starved ksoftirqd.

Two settings of each receive queue steer (Documentation/networking/scaling.rst):

* ``queues/rx-N/rps_cpus``: RPS proper, a CPU mask (hex words, comma-separated);
* ``queues/rx-N/rps_flow_cnt``: the queue's RFS flow table. RFS steers to the CPU of the
  consuming socket, and only while ``net.core.rps_sock_flow_entries`` (global; its file
  exists in the initial netns only) is non-zero too.

RPS is *on* for a device when a queue has a non-zero ``rps_cpus``, or a non-zero
``rps_flow_cnt`` while RFS is on globally (or kbpctl cannot tell, outside the initial netns).
``enable`` writes 0 to exactly those files, each a ``sysfs`` change in the device's journal,
so ``disable`` writes back the text it read; ``--keep-rps`` leaves them alone. Without
CONFIG_RPS the files do not exist and there is nothing to do.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from kbp.netdev import NetFS
from kbp.problems import RPS_ON, Problem
from kbp.sysinfo import HOST, Host, format_cpulist

RPS_CPUS = "rps_cpus"
RPS_FLOW_CNT = "rps_flow_cnt"
SOCK_FLOW_ENTRIES = "sys/net/core/rps_sock_flow_entries"  # under /proc
OFF = "0"


def mask_cpus(mask: str | None) -> list[int]:
    """The CPUs of a sysfs CPU mask ("00000000,00000003" -> [0, 1]); [] for none."""
    if not mask:
        return []
    try:
        bits = int(mask.replace(",", ""), 16)
    except ValueError:
        return []
    return [i for i in range(bits.bit_length()) if bits >> i & 1]


def cpu_mask(cpu: int) -> str:
    """The sysfs mask text of one CPU ("2" for CPU 1)."""
    return format(1 << cpu, "x")


def masks_cpus(masks: dict[str, str]) -> list[int]:
    """The CPUs some queues' masks steer to ({rx-N: mask}; union over the queues)."""
    return sorted({c for m in masks.values() for c in mask_cpus(m)})


def read_masks(fs: NetFS, dev: str) -> dict[str, str]:
    """{rx-N: rps_cpus text} of a device ("" where a queue has none)."""
    return {q: v.get(RPS_CPUS) or "" for q, v in fs.rx_queues(dev, [RPS_CPUS]).items()}


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def sock_flow_entries(host: Host = HOST) -> int | None:
    """net.core.rps_sock_flow_entries (None: not visible from this netns, or no RPS)."""
    with contextlib.suppress(OSError, ValueError):
        return int((host.proc / SOCK_FLOW_ENTRIES).read_text())
    return None


@dataclass
class RpsQueue:
    """One receive queue's steering settings, as sysfs shows them."""

    queue: str  # rx-N
    rps_cpus: str | None  # the mask text (None: no such file)
    rps_flow_cnt: int | None


@dataclass
class RpsStatus:
    """What ``status`` shows per device (``rps`` in --json)."""

    on: bool  # packets the device receives can be steered to a backlog
    cpus: list[int]  # the CPUs the rps_cpus masks name (union over the queues)
    rfs: bool  # a queue steers with RFS (rps_flow_cnt, RFS on globally)
    queues: list[RpsQueue] = field(default_factory=list)


@dataclass
class Rps:
    """The steering settings of a device's receive queues."""

    queues: list[RpsQueue]
    sock_flow_entries: int | None  # None: unknown

    @property
    def rfs_global(self) -> bool:
        return self.sock_flow_entries is None or self.sock_flow_entries > 0

    def steering(self, q: RpsQueue) -> list[str]:
        """The attributes of ``q`` that steer packets away from the poller."""
        out = []
        if mask_cpus(q.rps_cpus):
            out.append(RPS_CPUS)
        if q.rps_flow_cnt and self.rfs_global:
            out.append(RPS_FLOW_CNT)
        return out

    @property
    def on(self) -> bool:
        return any(self.steering(q) for q in self.queues)

    @property
    def cpus(self) -> list[int]:
        return sorted({c for q in self.queues for c in mask_cpus(q.rps_cpus)})

    @property
    def rfs(self) -> bool:
        return any(RPS_FLOW_CNT in self.steering(q) for q in self.queues)

    def status(self) -> RpsStatus:
        return RpsStatus(on=self.on, cpus=self.cpus, rfs=self.rfs, queues=list(self.queues))

    def plan_off(self) -> list[tuple[str, str]]:
        """(attribute under /sys/class/net/DEV, value) that turn the steering off."""
        return [(f"queues/{q.queue}/{a}", OFF) for q in self.queues for a in self.steering(q)]

    def summary(self, turned_off: bool = False) -> str:
        """The steering settings in a few words: "rx-0: rps_cpus 3" (``turned_off``:
        "rx-0: rps_cpus 3 -> 0"), queues with the same settings together."""
        groups: dict[tuple[str, ...], list[str]] = {}
        to = f" -> {OFF}" if turned_off else ""
        for q in self.queues:
            parts = [f"{a} {q.rps_cpus if a == RPS_CPUS else q.rps_flow_cnt}{to}"
                     for a in self.steering(q)]
            if parts:
                groups.setdefault(tuple(parts), []).append(q.queue)
        return "; ".join(f"{_queues(qs, len(self.queues))}: {', '.join(parts)}"
                         for parts, qs in groups.items())

    def where(self) -> str:
        return where(self.cpus, self.rfs)


def where(cpus: list[int], rfs: bool) -> str:
    """Where steered packets are processed, in words: "CPUs 0-1"."""
    out = [f"CPU{'s' if len(cpus) != 1 else ''} {format_cpulist(cpus)}"] if cpus else []
    if rfs:
        out.append("the receiving sockets' CPUs (RFS)")
    return " or ".join(out)


def _queues(names: list[str], total: int) -> str:
    if len(names) == 1:
        return names[0]
    if len(names) == total and total > 2:
        return f"rx-0..rx-{total - 1}"
    return ",".join(names)


def read(fs: NetFS, dev: str, host: Host = HOST) -> Rps | None:
    """The device's steering settings; None when the kernel has no RPS (CONFIG_RPS off:
    no rps_cpus files) or the device has no receive queues in sysfs."""
    raw = fs.rx_queues(dev, [RPS_CPUS, RPS_FLOW_CNT])
    queues = [RpsQueue(q, v.get(RPS_CPUS), _int(v.get(RPS_FLOW_CNT))) for q, v in raw.items()]
    if not any(q.rps_cpus is not None for q in queues):
        return None
    return Rps(queues, sock_flow_entries(host))


def _disable_cmd(dev: str, netns: str | None) -> str:
    return f"kbpctl disable {dev}" + (f" --netns {netns}" if netns else "")


def off_notice(dev: str, netns: str | None, rps: Rps) -> str:
    """One line (stderr): what ``enable`` turned off, and that ``disable`` restores it."""
    where = f" in netns {netns}" if netns else ""
    return (f"kbpctl: note: turned RPS off on {dev}{where} ({rps.summary(turned_off=True)}), "
            f"as RPS re-queues the poller's packets to the backlog softirq; "
            f"'{_disable_cmd(dev, netns)}' restores it (--keep-rps leaves it on)")


def kept_warning(dev: str, netns: str | None, rps: Rps) -> str:
    """One line (stderr): RPS stays on, and what that costs."""
    where = f" in netns {netns}" if netns else ""
    return (f"kbpctl: warning: RPS stays on for {dev}{where} (--keep-rps: {rps.summary()}): "
            f"every packet the poller receives is re-queued to the backlog softirq of "
            f"{rps.where()} (NET_RX_SOFTIRQ, ksoftirqd), the path kbp exists to avoid; "
            "enable without --keep-rps turns it off")


def drift_problem(dev: str, rps: Rps) -> Problem:
    """A ``status`` problem: RPS came back on after ``enable`` turned it off."""
    return Problem(RPS_ON, f"RPS is on ({rps.summary()}): the poller's packets are re-queued "
                   f"to the backlog softirq of {rps.where()}; 'kbpctl apply' or enable again "
                   "turns it off")
