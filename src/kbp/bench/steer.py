"""Where receive processing runs: RPS masks of a device in a namespace, and per-CPU receive
counters (``/proc/net/softnet_stat``, ``/proc/softirqs``, the CPU's ksoftirqd).

Used by the ``shared-cpu`` scenario to steer both server devices' receive processing to the
RT CPU and to record, per run, how much NET_RX work ran there and who ran it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp.bench.sysstat import read_percpu_table
from kbp.rps import mask_cpus
from kbp.testbed import run as ns_run

PROC = Path("/proc")
# /proc/net/softnet_stat columns (hex, one row per online CPU; the 13th is the CPU number)
SOFTNET = {"processed": 0, "dropped": 1, "time_squeeze": 2, "received_rps": 9}
SOFTNET_CPU_COL = 12


def cpu_mask(cpu: int) -> str:
    """The sysfs mask text of one CPU ("2" for CPU 1)."""
    return format(1 << cpu, "x")


def rx_queues(netns: str, dev: str) -> list[str]:
    out = ns_run(netns, ["ls", f"/sys/class/net/{dev}/queues"]).stdout.split()
    return sorted(q for q in out if q.startswith("rx-"))


def read_rps(netns: str, dev: str) -> dict[str, str]:
    """{rx-N: rps_cpus text} of a device (seen inside its namespace)."""
    out: dict[str, str] = {}
    for q in rx_queues(netns, dev):
        r = ns_run(netns, ["cat", f"/sys/class/net/{dev}/queues/{q}/rps_cpus"], check=False)
        out[q] = r.stdout.strip()
    return out


def write_rps(netns: str, dev: str, masks: dict[str, str]) -> None:
    for q, mask in masks.items():
        ns_run(netns, ["sh", "-c", f"echo {mask} > /sys/class/net/{dev}/queues/{q}/rps_cpus"])


def rps_cpus(masks: dict[str, str]) -> list[int]:
    """The CPUs the masks of a device steer to (union over its queues)."""
    return sorted({c for m in masks.values() for c in mask_cpus(m)})


@dataclass
class Steering:
    """RPS of some devices to one CPU; ``undo`` writes back what was there."""

    netns: str
    devs: list[str]
    cpu: int
    before: dict[str, dict[str, str]] = field(default_factory=dict)

    def apply(self, devs: list[str] | None = None) -> None:
        for dev in devs or self.devs:
            self.before.setdefault(dev, read_rps(self.netns, dev))
            write_rps(self.netns, dev, {q: cpu_mask(self.cpu) for q in self.before[dev]})
            got = rps_cpus(read_rps(self.netns, dev))
            if got != [self.cpu]:
                raise RuntimeError(f"{dev}: RPS to CPU {self.cpu} did not stick (reads {got})")

    def undo(self) -> None:
        for dev, masks in self.before.items():
            with contextlib.suppress(Exception):     # the device may be gone already
                write_rps(self.netns, dev, masks)
        self.before.clear()

    def now(self) -> dict[str, list[int]]:
        """{dev: CPUs its RPS steers to now} ([] = RPS off)."""
        out: dict[str, list[int]] = {}
        for dev in self.devs:
            try:
                out[dev] = rps_cpus(read_rps(self.netns, dev))
            except Exception:
                out[dev] = []
        return out


def softnet(proc: Path = PROC) -> dict[int, dict[str, int]]:
    """Per-CPU counters of /proc/net/softnet_stat: {cpu: {processed, dropped, time_squeeze,
    received_rps}}."""
    out: dict[int, dict[str, int]] = {}
    for i, line in enumerate((proc / "net" / "softnet_stat").read_text().splitlines()):
        f = line.split()
        cpu = int(f[SOFTNET_CPU_COL], 16) if len(f) > SOFTNET_CPU_COL else i
        out[cpu] = {k: int(f[c], 16) for k, c in SOFTNET.items() if c < len(f)}
    return out


def net_rx(cpu: int, proc: Path = PROC) -> int:
    """NET_RX softirqs run on ``cpu`` so far (/proc/softirqs)."""
    for line in (proc / "softirqs").read_text().splitlines():
        if line.strip().startswith("NET_RX:"):
            return int(line.split()[1 + cpu])
    return 0


def ksoftirqd(cpu: int, proc: Path = PROC) -> int | None:
    """The pid of ``ksoftirqd/<cpu>``."""
    want = f"ksoftirqd/{cpu}"
    for d in proc.iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if (d / "comm").read_text().strip() == want:
                    return int(d.name)
    return None


def schedstat(pid: int | None, proc: Path = PROC) -> tuple[int, int]:
    """(run ns, times it ran) of a thread; (0, 0) if unknown."""
    if pid is None:
        return 0, 0
    try:
        run_ns, _wait, slices = (proc / str(pid) / "schedstat").read_text().split()[:3]
    except (OSError, ValueError):
        return 0, 0
    return int(run_ns), int(slices)


def irq_count(irqs: tuple[int, ...], proc: Path = PROC) -> int:
    """Interrupts taken so far by ``irqs``, summed over every CPU (/proc/interrupts, rows
    named "<irq> <action>" by sysstat.read_percpu_table)."""
    if not irqs:
        return 0
    want = {str(i) for i in irqs}
    rows = read_percpu_table(proc / "interrupts")
    return sum(sum(counts) for name, counts in rows.items() if name.split()[0] in want)


@dataclass
class CpuRx:
    """Receive work on one CPU between ``start`` and ``stop``."""

    cpu: int
    proc: Path = PROC
    _t0: float = 0.0
    _sn: dict[str, int] = field(default_factory=dict)
    _rx: int = 0
    _ks: tuple[int, int] = (0, 0)
    _ks_pid: int | None = None
    irqs: tuple[int, ...] = ()          # the RT NIC port's interrupts (--nic-pair)
    _irq: int = 0

    def start(self) -> None:
        import time
        self._irq = irq_count(self.irqs, self.proc)
        self._ks_pid = ksoftirqd(self.cpu, self.proc)
        self._t0 = time.monotonic()
        self._sn = softnet(self.proc).get(self.cpu, {})
        self._rx = net_rx(self.cpu, self.proc)
        self._ks = schedstat(self._ks_pid, self.proc)

    def stop(self) -> dict[str, Any]:
        import time
        wall = max(time.monotonic() - self._t0, 1e-9)
        sn = softnet(self.proc).get(self.cpu, {})
        rx = net_rx(self.cpu, self.proc)
        ks = schedstat(self._ks_pid, self.proc)
        d = {k: sn.get(k, 0) - self._sn.get(k, 0) for k in SOFTNET}
        nic: dict[str, Any] = {}
        if self.irqs:
            n = irq_count(self.irqs, self.proc) - self._irq
            nic = {"rt_nic_irqs": n, "rt_nic_irqs_per_s": n / wall}
        return {**nic, "cpu": self.cpu, "wall_s": wall, "net_rx": rx - self._rx,
                "net_rx_per_s": (rx - self._rx) / wall,
                "packets_processed": d["processed"], "processed_per_s": d["processed"] / wall,
                "received_rps": d["received_rps"], "time_squeeze": d["time_squeeze"],
                "backlog_dropped": d["dropped"],
                "ksoftirqd_run_ms": (ks[0] - self._ks[0]) / 1e6,
                "ksoftirqd_cpu_pct": 100.0 * (ks[0] - self._ks[0]) / 1e9 / wall,
                "ksoftirqd_runs": ks[1] - self._ks[1]}
