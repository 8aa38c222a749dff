"""The receive modes the benchmark compares, one small adapter each.

Every adapter serves the RT flow's receiving device (the server end of the RT veth pair) and
nothing else; the client ends and the competing flood's devices stay stock NAPI in every mode.

======================  =================================================================
``napi``                stock NAPI in NET_RX softirq (the kernel default; nothing to do).
                        On veth the receive NAPI runs on the CPU that transmits: here the
                        tester's CPU, where the competing flood's softirq runs too.
``threaded``            stock threaded NAPI: sysfs ``threaded`` = 1, kthreads
                        ``napi/<dev>-<id>`` left where the scheduler puts them (SCHED_OTHER).
``busypoll``            socket busy polling as tuned's network-latency profile sets it:
                        sysctls ``net.core.busy_read`` = ``busy_poll`` = 50 (µs).  The
                        application's own recv/poll/epoll calls poll the NAPI before they
                        sleep.  Global sysctls on kernels that keep them in the initial
                        namespace only (up to at least 6.18): set there, they apply to the
                        RT app's namespace too (and to the whole machine while the mode is on).
``defer``               the kernel's IRQ deferral on the RT server device: sysfs
                        ``napi_defer_hard_irqs`` = 2, ``gro_flush_timeout`` = 20000 ns
                        (after a poll with work, up to 2 empty re-polls from a 20 µs hrtimer
                        before the interrupt, on veth the peer's wake-up, is re-armed).
``stock-kbp``           kbpctl's stock backend (threaded NAPI kthread pinned to the RT CPU,
                        SCHED_FIFO), enabled and disabled through :mod:`kbp.backends`.
``stock-busy``          kbpctl's stock backend ``--mode busy``: upstream threaded busy polling
                        (``threaded`` = 2, the kthread never sleeps), Linux 6.19 and later;
                        skipped with the reason on older kernels.  No ``--rt-prio``: the
                        kthread keeps the backend's default policy for busy (kbpctl refuses
                        SCHED_FIFO there); the app is placed as for ``busy``.
``busy`` / ``hybrid``   the kbp module's poller on the RT CPU (:mod:`kbp.backends` kmod);
                        only where the module is loaded (the VM rig), skipped elsewhere.
======================  =================================================================

Every mode puts back exactly what it changed (:mod:`kbp.bench.knobs` for the sysctls and
sysfs attributes, kbpctl's journal for the backends), from ``teardown``, which the runner calls
in a ``finally``: also after an exception or Ctrl-C half-way through ``setup``.  A mode the
running kernel cannot do says why in ``unavailable()`` (e.g. "needs Linux 6.19 or later; this
kernel is 6.18.44") and the benchmark skips it with that reason.

IRQ suspension (``irq-suspend-timeout``, 6.13) is not a mode yet: it needs an epoll-based RT
application that asks for it (``EPIOCSPARAMS`` with ``prefer_busy_poll``), which sockperf
does not.

A mode owns its quirks; the runner only asks:

* ``app_place(home, env)``: where the RT application runs while the mode is on.  A mode
  whose poller never sleeps (``spins``: busy, stock-busy) owns its CPU: a SCHED_FIFO spinner
  leaves a SCHED_OTHER application on the same CPU only the RT-throttling window (50 ms per
  second);
  measured in the VM rig: p99 ~ 850 ms and lost requests.  KBP gives the poller a dedicated
  core and runs applications on other cores; with two CPUs the only other core is the
  tester's and the flood's (VM rig: p50 ~ 90 ms, the app starved by the SCHED_FIFO tester).
  So by default busy keeps the application on its CPU but runs it SCHED_FIFO one priority
  above the poller: a packet the poller delivers wakes the application, which preempts the
  poller, answers, and sleeps again (``--busy-app`` chooses otherwise).  Every other mode
  leaves the application where the placement put it.
* ``needs_fresh_device(target)``: the module modes want an RT device whose NAPI has no
  kthread (kernels before ~6.15 keep it after ``threaded`` goes back to 0, and the module
  refuses such a NAPI: EBUSY); the runner then recreates the RT veth pair.
* ``threads()`` / ``counters()``: read through :mod:`kbp.backends.probe` (the polling threads
  of one device once after setup, their counters around each run), not ``status()``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kbp import names, sysinfo
from kbp.bench.knobs import Changes, KernelIO, Knob, KnobError, KnobIO, net_core_sysctl
from kbp.testbed import run as ns_run

VM_HINT = "runs in the VM rig: python -m kbp.bench vm --smoke"


@dataclass(frozen=True)
class AppPlace:
    """Where the RT application runs: a CPU and a SCHED_FIFO priority (0: default policy)."""

    cpu: int
    fifo: int = 0


@dataclass(frozen=True)
class AppEnv:
    """What a mode may consult to place the application (``--busy-app``, the placement)."""

    spin_app: str = "fifo"         # fifo | elsewhere | same
    elsewhere_cpu: int = 0         # "elsewhere": the tester's CPU
    rt_prio: int = 50


SPIN_APP_CHOICES = ("fifo", "elsewhere", "same")


@dataclass
class Target:
    """The device a mode serves and where its receive path should run."""

    netns: str
    dev: str
    cpu: int              # the RT CPU (receive path + application)
    rt_prio: int = 50


class Mode(Protocol):
    name: str
    spins: bool

    def unavailable(self) -> str | None:
        """Why this mode cannot run here (None: it can)."""

    def app_place(self, home: AppPlace, env: AppEnv) -> AppPlace:
        """Where the RT application runs while this mode is on (``home``: the placement's)."""

    def needs_fresh_device(self, t: Target) -> bool:
        """True: recreate the RT device before ``setup`` (see the module docstring)."""

    def setup(self, t: Target) -> None: ...

    def teardown(self) -> None: ...

    def threads(self) -> dict[int, str]:
        """The poller threads serving the device now: {pid: comm}."""

    def counters(self) -> dict[str, int | None]:
        """Poller counters (names.POLLER_COUNTERS) where the mode has them."""

    def describe(self) -> dict[str, Any]: ...


# -- helpers ---------------------------------------------------------------------------------
def sysfs_net(netns: str, dev: str, attr: str, value: str | None = None) -> str:
    """Read (or write, then read back) /sys/class/net/DEV/ATTR as seen inside ``netns``."""
    path = f"/sys/class/net/{dev}/{attr}"
    if value is not None:
        ns_run(netns, ["sh", "-c", f"echo {value} > {path}"])
    return ns_run(netns, ["cat", path]).stdout.strip()


def napi_kthreads(dev: str, proc: Path = Path("/proc")) -> dict[int, str]:
    """Threaded-NAPI kthreads of ``dev`` by name (comm ``napi/<dev>-<id>``, 15 chars)."""
    prefix = f"napi/{dev}-"[:15]
    out = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith(prefix):
            out[int(d.name)] = comm
    return out


def thread_placement(pid: int) -> dict[str, Any]:
    """CPU affinity, scheduling policy and priority of a thread (for the record)."""
    try:
        pol = os.sched_getscheduler(pid)
        prio = os.sched_getparam(pid).sched_priority
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        return {"pid": pid, "gone": True}
    pname = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_FIFO: "SCHED_FIFO",
             os.SCHED_RR: "SCHED_RR"}.get(pol, str(pol))
    return {"pid": pid, "policy": pname, "priority": prio, "cpus": cpus}


Version = tuple[int, int, int]


def kernel_release() -> str:
    """The running kernel's release (the tests make it another one)."""
    return sysinfo.kernel_release()


def too_old(since: Version, what: str, release: str | None = None) -> str | None:
    """Why ``what`` cannot run on this kernel (None: it is ``since`` or newer)."""
    rel = release or kernel_release()
    if sysinfo.kernel_version(rel) >= since:
        return None
    return (f"{what} needs Linux {since[0]}.{since[1]} or later; this kernel is {rel} "
            "(kernel too old)")


class _Defaults:
    """The quirks of a mode that has none: the app stays home, any device will do."""

    def app_place(self, home: AppPlace, env: AppEnv) -> AppPlace:
        return home

    def needs_fresh_device(self, t: Target) -> bool:
        return False


# -- napi ------------------------------------------------------------------------------------
@dataclass
class NapiMode(_Defaults):
    name: str = "napi"
    target: Target | None = None
    spins: bool = False

    def unavailable(self) -> str | None:
        return None

    def setup(self, t: Target) -> None:
        self.target = t
        cur = sysfs_net(t.netns, t.dev, "threaded")
        if cur != "0":
            raise RuntimeError(f"{t.dev}: threaded is {cur}, expected 0 for mode napi "
                               "(a previous mode was not torn down?)")

    def teardown(self) -> None:
        self.target = None

    def threads(self) -> dict[int, str]:
        return {}

    def counters(self) -> dict[str, int | None]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {"how": "stock NAPI in NET_RX softirq, on the CPU that transmits to the veth"}


# -- threaded --------------------------------------------------------------------------------
@dataclass
class ThreadedMode(_Defaults):
    name: str = "threaded"
    target: Target | None = None
    spins: bool = False
    _was: str | None = None

    def unavailable(self) -> str | None:
        return None

    def setup(self, t: Target) -> None:
        self.target = t
        self._was = sysfs_net(t.netns, t.dev, "threaded")
        got = sysfs_net(t.netns, t.dev, "threaded", "1")
        if got != "1":
            raise RuntimeError(f"{t.dev}: cannot turn threaded NAPI on (reads {got})")

    def teardown(self) -> None:
        if self.target is not None:
            with contextlib.suppress(RuntimeError):  # the device may be gone (Ctrl-C)
                sysfs_net(self.target.netns, self.target.dev, "threaded", self._was or "0")
        self.target = None

    def threads(self) -> dict[int, str]:
        return napi_kthreads(self.target.dev) if self.target else {}

    def counters(self) -> dict[str, int | None]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {"how": "sysfs threaded=1; kthreads unpinned, SCHED_OTHER",
                "threads": [thread_placement(p) for p in self.threads()]}


# -- busypoll, defer: kernel settings users tune today ---------------------------------------
BUSY_POLL_US = "50"             # tuned's network-latency profile: busy_read = busy_poll = 50
DEFER_HARD_IRQS = "2"           # napi_defer_hard_irqs
GRO_FLUSH_TIMEOUT_NS = "20000"  # gro_flush_timeout, ns (the hrtimer that re-polls)
DEFER_SINCE: Version = (5, 10, 0)   # napi_defer_hard_irqs appeared in 5.10


@dataclass
class KnobMode(_Defaults):
    """A mode that is a few kernel settings (sysctls, sysfs), each put back exactly."""

    name: str = ""
    target: Target | None = None
    spins: bool = False
    io: KnobIO = field(default_factory=KernelIO)
    changes: Changes | None = None
    _set: dict[str, str] = field(default_factory=dict)

    def wanted(self, t: Target) -> list[tuple[Knob, str]]:
        raise NotImplementedError

    def how(self) -> str:
        raise NotImplementedError

    def setup(self, t: Target) -> None:
        self.target = t
        self.changes = Changes(self.io)
        want = self.wanted(t)
        self._set = {str(k): v for k, v in want}
        self.changes.apply(want)

    def teardown(self) -> None:
        ch, self.changes, self.target = self.changes, None, None
        if ch is not None:
            ch.restore()            # KnobError names what could not be put back

    def threads(self) -> dict[int, str]:
        return {}

    def counters(self) -> dict[str, int | None]:
        return {}

    def describe(self) -> dict[str, Any]:
        d = {"how": self.how(), "set": dict(self._set),
             "found": self.changes.as_json() if self.changes else {}}
        if self.changes and self.changes.recovered:
            d["recovered_for_a_killed_benchmark"] = dict(self.changes.recovered)
        return d


@dataclass
class BusyPollMode(KnobMode):
    """``busypoll``: net.core.busy_read and busy_poll = 50 where the RT app's namespace sees
    them (its own when the kernel has them per namespace, else the global ones)."""

    name: str = names.BENCH_BUSYPOLL

    def unavailable(self) -> str | None:
        k = net_core_sysctl("busy_read", None, self.io)
        if not self.io.exists(k):
            return "this kernel has no net.core.busy_read (built without CONFIG_NET_RX_BUSY_POLL)"
        return None

    def wanted(self, t: Target) -> list[tuple[Knob, str]]:
        return [(net_core_sysctl(n, t.netns, self.io), BUSY_POLL_US)
                for n in ("busy_read", "busy_poll")]

    def how(self) -> str:
        scope = "per namespace" if any("(netns" in k for k in self._set) else \
            "global (not per namespace on this kernel)"
        return (f"sysctl net.core.busy_read = net.core.busy_poll = {BUSY_POLL_US} us "
                f"(tuned network-latency), {scope}; the app's recv/epoll busy-poll the NAPI")


@dataclass
class DeferMode(KnobMode):
    """``defer``: napi_defer_hard_irqs and gro_flush_timeout on the RT server device."""

    name: str = names.BENCH_DEFER

    def unavailable(self) -> str | None:
        return too_old(DEFER_SINCE, "napi_defer_hard_irqs")

    def wanted(self, t: Target) -> list[tuple[Knob, str]]:
        d = f"/sys/class/net/{t.dev}"
        return [(Knob(f"{d}/gro_flush_timeout", t.netns), GRO_FLUSH_TIMEOUT_NS),
                (Knob(f"{d}/napi_defer_hard_irqs", t.netns), DEFER_HARD_IRQS)]

    def how(self) -> str:
        return (f"sysfs napi_defer_hard_irqs = {DEFER_HARD_IRQS}, gro_flush_timeout = "
                f"{GRO_FLUSH_TIMEOUT_NS} ns on the RT server device (IRQ deferral)")


# -- kbpctl backends (stock-kbp, stock-busy, busy, hybrid) -----------------------------------
def _backends() -> Any:
    import kbp.backends as b  # the kbpctl engineers' package; imported only when used
    return b


@dataclass
class BackendMode:
    """A mode served by one of kbpctl's backends."""

    name: str
    backend: str                    # names.BACKEND_STOCK or names.BACKEND_KMOD
    kbp_mode: str                   # names.MODE_HYBRID / names.MODE_BUSY
    spins: bool = False             # the poller never sleeps: it owns its CPU
    since: Version | None = None    # the oldest kernel that has it (None: the backend decides)
    feature: str = ""               # what needs ``since`` (in the skip reason)
    own_prio: bool = False          # True: leave the priority to the backend (no --rt-prio)
    target: Target | None = None
    enabled: bool = False
    _threads: dict[int, str] = field(default_factory=dict)

    def app_place(self, home: AppPlace, env: AppEnv) -> AppPlace:
        if not self.spins or env.spin_app == "same":
            return home
        if env.spin_app == "elsewhere":
            return AppPlace(env.elsewhere_cpu)
        return AppPlace(home.cpu, env.rt_prio + 1)      # fifo: preempts the spinning poller

    def needs_fresh_device(self, t: Target) -> bool:
        return self.backend == names.BACKEND_KMOD and bool(napi_kthreads(t.dev))

    def unavailable(self) -> str | None:
        if self.since is not None:
            why = too_old(self.since, self.feature or self.name)
            if why:
                return why
        try:
            b = _backends()
        except ImportError as e:
            return f"kbpctl backends not installed ({e})"
        try:
            be = b.get(self.backend)
            ok, why = be.available()
        except Exception as e:
            return f"{self.backend} backend: {e}"
        if not ok:
            if self.backend == names.BACKEND_KMOD:
                extra = "" if "not loaded" in why else f"; {why}"
                return f"kbp module not loaded ({VM_HINT}){extra}"
            return f"{self.backend} backend unavailable: {why}"
        return None

    def setup(self, t: Target) -> None:
        b = _backends()
        self.target = t
        prio = {} if self.own_prio else {"rt_prio": t.rt_prio}
        req = b.EnableRequest([t.dev], netns=t.netns, mode=self.kbp_mode, cpus=[t.cpu],
                              **prio)
        be = b.get(self.backend)
        self.enabled = True   # even a half-done enable is journaled: always disable
        be.enable(req)
        self._threads = self._read_threads()

    def teardown(self) -> None:
        if self.target is None or not self.enabled:
            return
        b = _backends()
        try:
            b.get(self.backend).disable([self.target.dev], self.target.netns)
        finally:
            self.enabled = False
            self.target = None
            self._threads = {}

    def _read_threads(self) -> dict[int, str]:
        assert self.target is not None
        from kbp.backends import probe
        return probe.poller_threads(self.backend, self.target.dev, self.target.netns,
                                    self.target.cpu)

    def threads(self) -> dict[int, str]:
        return dict(self._threads)

    def counters(self) -> dict[str, int | None]:
        if self.target is None:
            return {}
        from kbp.backends import probe
        return dict(probe.poller_counters(self.backend, self._threads, [self.target.cpu]))

    def describe(self) -> dict[str, Any]:
        return {"how": f"kbpctl backend {self.backend}, mode {self.kbp_mode}, "
                       f"cpu {self.target.cpu if self.target else '?'}",
                "threads": [thread_placement(p) for p in self._threads]}


STOCK_BUSY_SINCE: Version = (6, 19, 0)    # kbp.backends.stock.BUSY_POLL_SINCE

# one line per mode for --help and the docs (the table in this module's docstring, short)
SUMMARY: dict[str, str] = {
    names.BENCH_NAPI: "stock NAPI in NET_RX softirq (the baseline)",
    names.BENCH_THREADED: "stock threaded NAPI (sysfs threaded=1), kthreads unpinned",
    names.BENCH_BUSYPOLL: f"sysctls net.core.busy_read = busy_poll = {BUSY_POLL_US} "
                          "(tuned network-latency)",
    names.BENCH_DEFER: f"IRQ deferral on the RT device: napi_defer_hard_irqs {DEFER_HARD_IRQS}, "
                       f"gro_flush_timeout {GRO_FLUSH_TIMEOUT_NS} ns",
    names.BENCH_STOCK_KBP: "kbpctl stock backend --mode hybrid (NAPI kthread SCHED_FIFO on "
                           "the RT CPU)",
    names.BENCH_STOCK_BUSY: "kbpctl stock backend --mode busy: upstream threaded busy "
                            "polling (Linux 6.19+)",
    names.MODE_BUSY: "kbp.ko poller, busy mode (kbp module loaded: the VM rig)",
    names.MODE_HYBRID: "kbp.ko poller, hybrid mode (kbp module loaded: the VM rig)",
}


def all_modes() -> dict[str, Mode]:
    """Every benchmark mode, by its name in names.BENCH_MODES (in that order)."""
    modes: list[Mode] = [
        NapiMode(),
        ThreadedMode(),
        BusyPollMode(),
        DeferMode(),
        BackendMode(names.BENCH_STOCK_KBP, names.BACKEND_STOCK, names.MODE_HYBRID),
        # kbpctl refuses a SCHED_FIFO priority for stock --mode busy (the upstream kthread
        # never sleeps): the backend's default, SCHED_NORMAL, as a user gets it
        BackendMode(names.BENCH_STOCK_BUSY, names.BACKEND_STOCK, names.MODE_BUSY, spins=True,
                    since=STOCK_BUSY_SINCE, own_prio=True,
                    feature="threaded busy polling (napi threaded=2, kbpctl --mode busy)"),
        BackendMode(names.MODE_BUSY, names.BACKEND_KMOD, names.MODE_BUSY, spins=True),
        BackendMode(names.MODE_HYBRID, names.BACKEND_KMOD, names.MODE_HYBRID),
    ]
    return {m.name: m for m in modes}


def availability(wanted: list[str], modes: dict[str, Mode] | None = None,
                 ) -> dict[str, str | None]:
    """{mode: why it cannot run here, None when it can} for the modes in ``wanted``."""
    modes = modes if modes is not None else all_modes()
    return {m: modes[m].unavailable() for m in wanted}


__all__ = ["AppEnv", "AppPlace", "BackendMode", "BusyPollMode", "DeferMode", "KnobError",
           "KnobMode", "Mode", "NapiMode", "Target", "ThreadedMode", "all_modes",
           "availability", "too_old"]
