"""What the host looks like: CPUs, kernel version, kernel threads, IRQs, cpufreq.

Every reader takes a :class:`Host` so unit tests can point it at a fake /proc and /sys.
Nothing here changes the system except :func:`set_sched` and :func:`set_affinity`, which
only the settings layer's handlers call (kbp.system.settings), after journaling the change;
IRQ affinities are written there too (``IrqHandler``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kbp.errors import InvalidInput

POLICY_NAMES = {
    os.SCHED_OTHER: "SCHED_OTHER",
    os.SCHED_FIFO: "SCHED_FIFO",
    os.SCHED_RR: "SCHED_RR",
    os.SCHED_BATCH: "SCHED_BATCH",
    os.SCHED_IDLE: "SCHED_IDLE",
}
POLICY_IDS = {v: k for k, v in POLICY_NAMES.items()}
RT_PRIO_MIN = 1
RT_PRIO_MAX = 99
PF_KTHREAD = 0x00200000
TASK_COMM_LEN = 16  # names are cut to 15 characters (except kthreads in /proc/PID/stat, 6.x)


@dataclass(frozen=True)
class Host:
    """Where /proc and /sys are (the real ones unless a test says otherwise)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")

    @property
    def cpu_dir(self) -> Path:
        return self.sys / "devices/system/cpu"


HOST = Host()


# -- CPU lists ------------------------------------------------------------------------
def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list ("0-3,8,10-11") into sorted CPU numbers."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise InvalidInput(f"bad CPU list {text!r}: use numbers and ranges like 1,3-5")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise InvalidInput(f"bad CPU range {part!r} in {text!r}: write low-high, e.g. 1-3")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU numbers as a compact kernel CPU list."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [c]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def read_cpulist(path: Path) -> list[int]:
    """The CPU list in a file (.../cpu/online, an IRQ's smp_affinity_list); OSError when
    it cannot be read, InvalidInput when it is not a CPU list."""
    return parse_cpulist(path.read_text())


def online_cpus(host: Host = HOST) -> list[int]:
    """The online CPUs (this process's affinity when /sys does not say)."""
    try:
        return read_cpulist(host.cpu_dir / "online")
    except OSError:
        return sorted(os.sched_getaffinity(0))


def possible_cpus(host: Host = HOST) -> list[int]:
    try:
        return read_cpulist(host.cpu_dir / "possible")
    except OSError:
        return online_cpus(host)


def validate_cpus(cpus: list[int], host: Host = HOST) -> list[int]:
    """Refuse CPUs that do not exist or are offline."""
    if not cpus:
        raise InvalidInput("empty CPU list: name at least one CPU, e.g. --cpus 1")
    online = online_cpus(host)
    possible = possible_cpus(host)
    for c in cpus:
        if c not in possible:
            raise InvalidInput(
                f"CPU {c} does not exist (this machine has CPUs {format_cpulist(possible)}): "
                "pick CPUs from that list")
        if c not in online:
            raise InvalidInput(
                f"CPU {c} is offline (online: {format_cpulist(online)}): bring it online "
                f"(echo 1 > /sys/devices/system/cpu/cpu{c}/online) or pick an online CPU")
    return cpus


# -- kernel version -------------------------------------------------------------------
def kernel_release() -> str:
    return platform.release()


def kernel_version(release: str | None = None) -> tuple[int, int, int]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release or kernel_release())
    if not m:
        return (0, 0, 0)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


# -- tasks (kernel threads) -----------------------------------------------------------
@dataclass(frozen=True)
class TaskId:
    """A task, robust against pid reuse: the pid plus its start time in clock ticks."""

    pid: int
    starttime: int
    comm: str


@dataclass
class TaskStat:
    pid: int
    comm: str
    state: str
    ppid: int
    flags: int
    starttime: int
    last_cpu: int
    rt_priority: int
    policy: int


def read_stat(pid: int, host: Host = HOST) -> TaskStat | None:
    """Parse /proc/PID/stat (None when the task is gone)."""
    try:
        raw = (host.proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return parse_stat(pid, raw)


def parse_stat(pid: int, raw: str) -> TaskStat:
    """One /proc/PID/stat (or /proc/PID/task/TID/stat) line."""
    lpar, rpar = raw.index("("), raw.rindex(")")
    comm = raw[lpar + 1 : rpar]
    f = raw[rpar + 2 :].split()
    # f[0] is field 3 (state) of proc(5)
    return TaskStat(pid=pid, comm=comm, state=f[0], ppid=int(f[1]), flags=int(f[6]),
                    starttime=int(f[19]), last_cpu=int(f[36]), rt_priority=int(f[37]),
                    policy=int(f[38]))


def task_id(pid: int, host: Host = HOST) -> TaskId | None:
    st = read_stat(pid, host)
    return TaskId(pid, st.starttime, st.comm) if st else None


def same_task(tid: TaskId, host: Host = HOST) -> bool:
    st = read_stat(tid.pid, host)
    return st is not None and st.starttime == tid.starttime


def kthreads(host: Host = HOST) -> list[TaskStat]:
    """All kernel threads (children of kthreadd with PF_KTHREAD)."""
    out = []
    for name in os.listdir(host.proc):
        if not name.isdigit():
            continue
        st = read_stat(int(name), host)
        if st and st.flags & PF_KTHREAD:
            out.append(st)
    return out


def napi_thread_name(dev: str, napi_id: int) -> str:
    return f"napi/{dev}-{napi_id}"


def napi_comm_matches(comm: str, dev: str) -> bool:
    """Whether a kthread named ``comm`` may be a NAPI thread of ``dev``: ``napi/<dev>-<id>``,
    or that name cut to the 15 characters a task name keeps."""
    prefix = f"napi/{dev}-"
    full = comm.startswith(prefix) and comm[len(prefix):].isdigit()
    cut = len(comm) == TASK_COMM_LEN - 1 and prefix.startswith(comm)
    return full or cut


def napi_names_collide(dev: str, other: str) -> bool:
    """Whether NAPI threads of a device named ``other`` can carry a name that
    :func:`find_napi_threads` takes for ``dev``'s (the same name, or a name whose threads'
    names are cut to the same 15 characters, or one like ``<dev>-123`` whose ``-<id>`` tail
    is cut off). Only the number of digits of a NAPI id matters to the match."""
    names = (napi_thread_name(other, int("1" * n)) for n in range(1, 11))
    return any(napi_comm_matches(name, dev) or napi_comm_matches(name[:TASK_COMM_LEN - 1], dev)
               for name in names)


def find_napi_threads(dev: str, host: Host = HOST) -> list[TaskStat]:
    """Threaded-NAPI kthreads whose name says they serve ``dev`` (``napi/<dev>-<id>``).

    Names are global, so the same device name in two namespaces is ambiguous; the netdev
    netlink family's napi-get pid (Linux 6.9+) is exact and preferred over this, and
    :func:`kbp.netdev.napi_thread_owners` says when the name is not enough.
    """
    return sorted((st for st in kthreads(host) if napi_comm_matches(st.comm, dev)),
                  key=lambda s: s.pid)


# -- other tasks on a polling CPU -------------------------------------------------------
@dataclass
class CpuTask:
    """A task that competes with a polling thread for its CPU."""

    pid: int  # the process (thread group)
    tid: int  # the thread
    comm: str
    state: str  # /proc stat state: R running or waiting for the CPU, S sleeping, ...
    pinned: bool  # its allowed CPU list is exactly this CPU
    kthread: bool
    policy: str
    priority: int  # SCHED_FIFO/RR priority (0 for the others)


def allowed_cpus(status_path: Path) -> list[int] | None:
    """Cpus_allowed_list of a /proc .../status file (None when it is gone or unreadable)."""
    try:
        with status_path.open() as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return parse_cpulist(line.partition(":")[2])
    except (OSError, InvalidInput):
        return None
    return None


def _task_dirs(host: Host) -> Iterable[tuple[int, Path]]:
    """(pid, /proc/PID/task/TID) of every thread this /proc shows."""
    for name in os.listdir(host.proc):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for tid in os.listdir(host.proc / name / "task"):
                if tid.isdigit():
                    yield int(name), host.proc / name / "task" / tid


def _cpu_task(pid: int, tdir: Path, cpus: set[int]) -> tuple[int, CpuTask] | None:
    """(CPU, task) when the thread in ``tdir`` is pinned to one of ``cpus`` or runnable on
    one; kernel threads only when runnable (every CPU has its sleeping per-CPU kthreads)."""
    try:
        st = parse_stat(int(tdir.name), (tdir / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    if st.state in ("Z", "X", "x"):
        return None
    kthread = bool(st.flags & PF_KTHREAD)
    here = st.state == "R" and st.last_cpu in cpus
    if kthread and not here:
        return None
    allowed = allowed_cpus(tdir / "status")
    pinned = allowed is not None and len(allowed) == 1 and allowed[0] in cpus
    if not (pinned or here):
        return None
    cpu = allowed[0] if pinned and allowed else st.last_cpu
    return cpu, CpuTask(pid=pid, tid=st.pid, comm=st.comm, state=st.state,
                        pinned=pinned, kthread=kthread,
                        policy=POLICY_NAMES.get(st.policy, str(st.policy)),
                        priority=st.rt_priority)


def tasks_on_cpus(cpus: Iterable[int], exclude: Iterable[int] = (),
                  host: Host = HOST) -> dict[int, list[CpuTask]]:
    """The tasks competing for each of ``cpus``: user tasks pinned there (allowed on that CPU
    only) or runnable there (state R, stat field 39 ``processor``), and kernel threads
    runnable there. ``exclude``: pids or tids left out (the polling threads, kbpctl)."""
    want = set(cpus)
    out: dict[int, list[CpuTask]] = {c: [] for c in sorted(want)}
    skip = set(exclude)
    for pid, tdir in _task_dirs(host):
        if pid in skip or int(tdir.name) in skip:
            continue
        found = _cpu_task(pid, tdir, want)
        if found is not None:
            out[found[0]].append(found[1])
    for tasks in out.values():
        tasks.sort(key=lambda t: (t.kthread, t.pid, t.tid))
    return out


@dataclass
class Sched:
    """Scheduling of a task: policy name, RT priority, nice, allowed CPUs."""

    policy: str
    priority: int
    nice: int
    cpus: list[int]

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def get_sched(pid: int) -> Sched:
    pol = os.sched_getscheduler(pid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)
    return Sched(policy=POLICY_NAMES.get(pol, str(pol)),
                 priority=os.sched_getparam(pid).sched_priority,
                 nice=os.getpriority(os.PRIO_PROCESS, pid),
                 cpus=sorted(os.sched_getaffinity(pid)))


def set_policy(pid: int, policy: str, priority: int, nice: int | None = None) -> None:
    """Set the task's policy and priority, then its nice (kept by the kernel under every
    policy, used again when the task returns to SCHED_OTHER: so a restore that goes back
    through SCHED_FIFO still ends at the nice it started with)."""
    os.sched_setscheduler(pid, POLICY_IDS[policy], os.sched_param(priority))
    if nice is not None and os.getpriority(os.PRIO_PROCESS, pid) != nice:
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def set_affinity(pid: int, cpus: Iterable[int]) -> None:
    os.sched_setaffinity(pid, set(cpus))


@dataclass
class TaskCounters:
    """What the scheduler knows about a polling thread (stock backend counters)."""

    poll_ns: int | None  # CPU time the thread ran (NAPI poll + protocol processing)
    sleeps: int | None   # voluntary context switches: times it went to sleep


def read_schedstat(pid: int, proc: Path = Path("/proc")) -> tuple[int, int, int] | None:
    """/proc/PID/schedstat: (run ns, run_delay ns -- runnable but waiting for the CPU --,
    times it ran) of a thread, None if it is gone."""
    try:
        a, b, c = (proc / str(pid) / "schedstat").read_text().split()[:3]
        return int(a), int(b), int(c)
    except (OSError, ValueError):
        return None


def task_counters(pid: int, host: Host = HOST) -> TaskCounters:
    sleeps = None
    st = read_schedstat(pid, host.proc)
    with contextlib.suppress(OSError, ValueError):
        for line in (host.proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                sleeps = int(line.split()[1])
    return TaskCounters(poll_ns=st[0] if st else None, sleeps=sleeps)


# -- capabilities ---------------------------------------------------------------------
CAP_SYS_NICE = 23
SELF_STATUS = Path("/proc/self/status")


def has_capability(bit: int, status_path: Path = SELF_STATUS) -> bool | None:
    """This process has capability ``bit`` in its effective set (``CapEff`` of
    /proc/self/status); None when that cannot be read."""
    try:
        for line in status_path.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- preemption model -----------------------------------------------------------------
PREEMPT_NONE, PREEMPT_VOLUNTARY = "none", "voluntary"
PREEMPT_FULL, PREEMPT_LAZY, PREEMPT_RT = "full", "lazy", "rt"
PREEMPT_UNKNOWN = "none/voluntary (unknown)"
#: models under which a woken SCHED_FIFO task waits until a running kernel thread gives the
#: CPU away by itself (preempt_schedule() is a no-op in kernel code)
NON_PREEMPTIBLE = (PREEMPT_NONE, PREEMPT_VOLUNTARY, PREEMPT_UNKNOWN)


@dataclass(frozen=True)
class PreemptModel:
    """The kernel's preemption model and where that was read."""

    model: str  # one of the PREEMPT_* names above
    source: str  # "debugfs", "uname -v"

    @property
    def preempts_kernel(self) -> bool:
        """A woken RT task preempts kernel code at once (full, lazy, rt)."""
        return self.model not in NON_PREEMPTIBLE

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "source": self.source,
                "preempts_kernel": self.preempts_kernel}


def preempt_model(host: Host = HOST, version: str | None = None) -> PreemptModel:
    """The preemption model: the current one of a PREEMPT_DYNAMIC kernel from
    /sys/kernel/debug/sched/preempt (``none (voluntary) full lazy``: the one in parentheses)
    when debugfs is mounted and readable; else what ``uname -v`` says (``PREEMPT_RT``,
    ``PREEMPT`` = full; ``PREEMPT_DYNAMIC`` alone does not say which model was chosen at
    boot, nor does a version without PREEMPT: both read as none/voluntary (unknown))."""
    try:
        text = (host.sys / "kernel/debug/sched/preempt").read_text()
        m = re.search(r"\((\w+)\)", text)
        if m:
            return PreemptModel(m.group(1), "debugfs")
    except OSError:
        pass
    words = (os.uname().version if version is None else version).split()
    if "PREEMPT_RT" in words:
        return PreemptModel(PREEMPT_RT, "uname -v")
    if "PREEMPT_LAZY" in words:
        return PreemptModel(PREEMPT_LAZY, "uname -v")
    if "PREEMPT" in words:
        return PreemptModel(PREEMPT_FULL, "uname -v")
    return PreemptModel(PREEMPT_UNKNOWN, "uname -v")


# -- IRQs -----------------------------------------------------------------------------
@dataclass
class Irq:
    irq: int
    name: str  # action name from /proc/interrupts (e.g. "eth1-TxRx-0")


def read_interrupts(host: Host = HOST) -> dict[int, str]:
    """IRQ number -> action name(s) from /proc/interrupts."""
    out: dict[int, str] = {}
    try:
        lines = (host.proc / "interrupts").read_text().splitlines()
    except OSError:
        return out
    if not lines:
        return out
    ncpu = len(lines[0].split())
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        if not head.strip().isdigit():
            continue
        fields = rest.split()
        # counts, then chip name, hwirq/edge info, then action names
        tail = fields[ncpu:]
        out[int(head)] = " ".join(tail[2:]) if len(tail) > 2 else " ".join(tail)
    return out


#: what follows the device's name in a queue IRQ's action name
_IRQ_NAME_SEP = "[-_:.@]"


def device_irqs(dev: str, msi: Iterable[int] | None, host: Host = HOST) -> list[Irq]:
    """The queue IRQs of ``dev``, sorted by queue number.

    A queue IRQ's action name is the device name, a separator and a name ending in the
    queue number (``eth1-TxRx-3``, ``eth1-rx-0``, ``eth1:q2``). The device's other IRQs
    (link, mailbox: usually just ``eth1``) and IRQs named without the device name (virtio's
    ``virtio2-input.0``, mlx5's ``mlx5_comp0``) are not touched. ``msi``: the device's MSI
    IRQs (/sys/class/net/DEV/device/msi_irqs) to choose from, None for every IRQ.
    """
    names = read_interrupts(host)
    candidates: Iterable[int] = names.keys() if msi is None else msi
    pat = re.compile(rf"^{re.escape(dev)}{_IRQ_NAME_SEP}\S*?(\d+)$")
    found: list[tuple[int, Irq]] = []
    for i in candidates:
        for action in names.get(i, "").split(", "):
            m = pat.match(action.strip())
            if m:
                found.append((int(m.group(1)), Irq(i, action.strip())))
                break
    return [q for _, q in sorted(found, key=lambda t: (t[0], t[1].irq))]


def irq_names_collide(dev: str, other: str) -> bool:
    """Whether queue IRQs of a device named ``other`` can carry an action name that
    :func:`device_irqs` takes for ``dev``'s (``other`` is ``dev``, or ``dev`` and a
    separator then more: ``eth1-vf0``'s ``eth1-vf0-TxRx-0``)."""
    return other == dev or re.match(rf"^{re.escape(dev)}{_IRQ_NAME_SEP}", other) is not None


def read_irq_affinity(irq: int, host: Host = HOST) -> str:
    return (host.proc / "irq" / str(irq) / "smp_affinity_list").read_text().strip()


def read_irq_effective(irq: int, host: Host = HOST) -> str | None:
    try:
        return (host.proc / "irq" / str(irq) / "effective_affinity_list").read_text().strip()
    except OSError:
        return None


# -- cpufreq --------------------------------------------------------------------------
@dataclass
class CpuFreq:
    cpu: int
    governor: str | None
    driver: str | None
    min_khz: int | None
    max_khz: int | None
    cur_khz: int | None
    hw_min_khz: int | None
    hw_max_khz: int | None


@dataclass
class FreqReport:
    available: bool
    cpus: list[CpuFreq] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, object]:
        return {"available": self.available, "note": self.note,
                "cpus": [asdict(c) for c in self.cpus]}


def _read_int(p: Path) -> int | None:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_str(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def cpufreq(cpus: Iterable[int] | None = None, host: Host = HOST) -> FreqReport:
    """cpufreq policy of each CPU, and what it means for a SCHED_FIFO polling thread."""
    wanted = list(cpus) if cpus is not None else online_cpus(host)
    rows = []
    for c in wanted:
        d = host.cpu_dir / f"cpu{c}" / "cpufreq"
        if not d.is_dir():
            continue
        rows.append(CpuFreq(
            cpu=c, governor=_read_str(d / "scaling_governor"),
            driver=_read_str(d / "scaling_driver"),
            min_khz=_read_int(d / "scaling_min_freq"), max_khz=_read_int(d / "scaling_max_freq"),
            cur_khz=_read_int(d / "scaling_cur_freq"),
            hw_min_khz=_read_int(d / "cpuinfo_min_freq"),
            hw_max_khz=_read_int(d / "cpuinfo_max_freq")))
    if not rows:
        return FreqReport(False, [], "no cpufreq on this machine: the CPU frequency is fixed or "
                                     "set by firmware/hypervisor; kbp does not change it")
    govs = {r.governor for r in rows}
    if govs == {"schedutil"}:
        note = ("schedutil: a SCHED_FIFO polling thread runs its CPU at the policy's max "
                "frequency while it polls, and the CPU drops when it sleeps (EE-KBP Sect. 4.2 "
                "without patches)")
    elif "schedutil" in govs:
        note = ("mixed governors: only CPUs under schedutil raise the frequency for a "
                "SCHED_FIFO polling thread; use schedutil on the polling CPUs")
    elif govs == {"userspace"}:
        note = ("userspace: the frequency stays where it is set; the kbp module's freq_ctl "
                "(kbpctl enable --freq-ctl) sets min before a poller sleeps and max when it "
                "wakes (EE-KBP Sect. 4.2)")
    elif govs <= {"performance"}:
        note = "performance: CPUs stay at max frequency (lowest latency, no power saving)"
    else:
        note = (f"governor {'/'.join(sorted(g or '?' for g in govs))}: the frequency does not "
                "follow the polling thread; use schedutil for EE-KBP-like frequency control")
    return FreqReport(True, rows, note)
