"""Where receive processing runs: RPS masks of a device in a namespace, and per-CPU receive
counters (``/proc/net/softnet_stat``, ``/proc/softirqs``, the CPU's ksoftirqd).

Used by the ``shared-cpu`` scenario to steer both server devices' receive processing to the
RT CPU and to record, per run, how much NET_RX work ran there and who ran it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp import rps, sysinfo
from kbp.bench.knobs import KnobError
from kbp.bench.sysstat import read_percpu_table
from kbp.netdev import NetFS
from kbp.system import journal, settings

PROC = Path("/proc")
# /proc/net/softnet_stat columns (hex, one row per online CPU; the 13th is the CPU number)
SOFTNET = {"processed": 0, "dropped": 1, "time_squeeze": 2, "received_rps": 9}
SOFTNET_CPU_COL = 12


def rx_queues(netns: str, dev: str) -> list[str]:
    """The receive queues of a device (rx-0, rx-1, ...; [] when it has none)."""
    return list(NetFS(netns).rx_queues(dev, []))


def read_rps(netns: str, dev: str) -> dict[str, str]:
    """{rx-N: rps_cpus text} of a device (seen inside its namespace; "" where unreadable)."""
    return rps.read_masks(NetFS(netns), dev)


def changes() -> journal.Executor:
    """An in-memory journal of a testbed's device settings (RPS masks and other sysfs
    attributes, GRO), changed through kbpctl's handlers and undone by ``restore()``
    (a target gone meanwhile is a note, not a failure)."""
    return journal.Executor(None, settings.net_effector())


def dev_key(netns: str, dev: str, attr: str) -> dict[str, Any]:
    """``/sys/class/net/DEV/ATTR`` in ``netns`` as a change key (with the device's ifindex:
    a device recreated under the same name is another target)."""
    idx = NetFS(netns).read(dev, "ifindex")
    return settings.sysfs_key(netns, dev, int(idx) if idx else None, attr)


def rps_keys(netns: str, dev: str) -> list[dict[str, Any]]:
    """The ``rps_cpus`` of each of a device's receive queues, as change keys."""
    key = dev_key(netns, dev, "")
    return [{**key, "attr": f"queues/{q}/rps_cpus"} for q in rx_queues(netns, dev)]


def steer_rps(ex: journal.Executor, netns: str, dev: str, cpu: int | None) -> None:
    """RPS of every receive queue of ``dev`` to ``cpu`` (None: off), each mask journaled
    in ``ex`` before it changes; KnobError when the kernel reads back another."""
    for key in rps_keys(netns, dev):
        ex.apply(journal.KIND_SYSFS, key, "0" if cpu is None else rps.cpu_mask(cpu))
    got = rps.masks_cpus(read_rps(netns, dev))
    if got != ([] if cpu is None else [cpu]):
        raise KnobError(f"{dev}: RPS to {'no CPU' if cpu is None else f'CPU {cpu}'} did "
                       f"not stick (reads {got})")


@dataclass
class Steering:
    """RPS of some devices to one CPU; ``undo`` puts back what was there (each mask
    journaled before it changes, last change first)."""

    netns: str
    devs: list[str]
    cpu: int
    ex: journal.Executor = field(default_factory=changes)

    def apply(self, devs: list[str] | None = None) -> None:
        for dev in devs or self.devs:
            steer_rps(self.ex, self.netns, dev, self.cpu)

    def undo(self) -> None:
        self.ex.restore()                  # a device that is gone already is a note

    def now(self) -> dict[str, list[int]]:
        """{dev: CPUs its RPS steers to now} ([] = RPS off)."""
        out: dict[str, list[int]] = {}
        for dev in self.devs:
            try:
                out[dev] = rps.masks_cpus(read_rps(self.netns, dev))
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
    return next((st.pid for st in sysinfo.kthreads(sysinfo.Host(proc=proc))
                 if st.comm == want), None)


def schedstat(pid: int | None, proc: Path = PROC) -> tuple[int, int]:
    """(run ns, times it ran) of a thread; (0, 0) if unknown."""
    st = sysinfo.read_schedstat(pid, proc) if pid is not None else None
    return (st[0], st[2]) if st else (0, 0)


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


def gro_on(netns: str, dev: str) -> bool:
    """Whether GRO is active on a device, as the kernel reads it back."""
    return bool(settings.GroHandler().get({"netns": netns, "dev": dev}))


@dataclass
class ClientEnds:
    """The client ends of the benchmark's veth pairs, where the RT replies and the heavy
    receiver's ACKs arrive, shaped so that work never lands on the RT CPU:

    * GRO off: veth then has no NAPI on that end, so the server's ``veth_xmit()`` hands a
      reply or an ACK to ``__netif_rx()`` right away.  The reply's RX software stamp is
      taken there (``net_timestamp_check`` with ``tstamp_prequeue``): when the server sends
      it, not when a veth NAPI scheduled on the sending CPU (the RT CPU) gets to poll it.
    * RPS to ``cpu`` (the tester's CPU for the RT pair, the flood sender's for the others,
      never the RT CPU): ``__netif_rx()`` queues the packet on that CPU's backlog instead of
      the sending CPU's, so the replies and the ACKs (with the heavy sender's ACK-clocked
      transmits, run in the softirq that processes them) are processed there.

    ``undo`` puts back the masks and GRO found (as :class:`Steering` does)."""

    netns: str
    cpus: dict[str, int] = field(default_factory=dict)      # {dev: CPU}
    ex: journal.Executor = field(default_factory=changes)

    def apply(self, dev: str, cpu: int) -> None:
        self.cpus[dev] = cpu
        self.ex.apply(journal.KIND_GRO, {"netns": self.netns, "dev": dev}, False)
        steer_rps(self.ex, self.netns, dev, cpu)
        if gro_on(self.netns, dev):
            raise RuntimeError(f"{dev}: GRO off did not stick")

    def undo(self) -> None:
        self.ex.restore()                  # a device that is gone already is a note

    def now(self) -> dict[str, dict[str, Any]]:
        """{dev: {"gro": bool, "rps": [CPUs]}} as the kernel reads them now."""
        out: dict[str, dict[str, Any]] = {}
        for dev in self.cpus:
            try:
                out[dev] = {"gro": gro_on(self.netns, dev),
                            "rps": rps.masks_cpus(read_rps(self.netns, dev))}
            except Exception as e:
                out[dev] = {"error": str(e)}
        return out


# -- the RT CPU check -------------------------------------------------------------------------
RT_CPU_SLACK = 1500        # packets over a run the check lets pass whatever the requests: the
#                            host's own traffic (iperf3's control connection, ARP) and a
#                            backlog's worth (netdev_max_backlog 1000) of heavy packets counted
#                            on one side of the run's window and processed on the other
RT_CPU_REQ_SLACK = 0.5     # ... plus this share of the RT requests: the replies are one packet
#                            per request, so processing them on the RT CPU goes over the limit


def rt_cpu_check(processed: int, heavy_packets: int, requests: int, *,
                 heavy_moved: bool = False) -> dict[str, Any]:
    """Packets processed on the RT CPU over a run (softnet ``processed``) against what should
    be processed there: the heavy device's packets (none where the mode moved the heavy flow
    to the non-RT CPU, ``heavy_moved``: the -excl modes and exclusive) plus the RT requests.
    Replies and ACKs are the client ends' (:class:`ClientEnds`).  The slack is absolute and
    tied to the request count, not a share of the heavy flow (a 10 % share of 3 million
    heavy packets hid 7,000 replies): more than ``expected + RT_CPU_SLACK + requests x
    RT_CPU_REQ_SLACK`` means the replies (or other work) were processed on the RT CPU:
    ``passed`` False.  ``sees_replies``: the run had enough requests for their replies to
    exceed the slack (fewer than ``RT_CPU_SLACK / (1 - RT_CPU_REQ_SLACK)`` cannot be told
    from the noise).  Heavy packets dropped before they were processed make ``processed``
    lower, so the check bounds the RT CPU's extra work from above only."""
    expected = (0 if heavy_moved else heavy_packets) + requests
    slack = RT_CPU_SLACK + requests * RT_CPU_REQ_SLACK
    limit = expected + slack
    return {"processed": processed, "heavy_packets": heavy_packets, "requests": requests,
            "heavy_moved": heavy_moved, "expected_at_most": expected, "limit": limit,
            "slack": slack, "extra": processed - expected,
            "sees_replies": requests * (1.0 - RT_CPU_REQ_SLACK) > RT_CPU_SLACK,
            "per_request": processed / requests if requests else None,
            "passed": processed <= limit}


def rt_cpu_expected_words(chk: dict[str, Any]) -> str:
    """What the RT CPU should have processed in words: "559,000 heavy packets + 2,000 RT
    requests", or "2,000 RT requests (the heavy flow moved away)"."""
    if chk.get("heavy_moved"):
        return f"{chk['requests']:,} RT requests (the heavy flow moved away)"
    return f"{chk['heavy_packets']:,} heavy packets + {chk['requests']:,} RT requests"
