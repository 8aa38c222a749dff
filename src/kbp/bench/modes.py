"""The receive modes the benchmark compares, one small adapter each.

Every adapter serves the RT flow's receiving device (the server end of the RT veth pair) and
nothing else; the client ends and the competing flood's devices stay stock NAPI in every mode.

======================  =================================================================
``napi``                stock NAPI in NET_RX softirq (the kernel default; nothing to do).
                        On veth the receive NAPI runs on the CPU that transmits: here the
                        tester's CPU, where the competing flood's softirq runs too.
``threaded``            stock threaded NAPI: sysfs ``threaded`` = 1, kthreads
                        ``napi/<dev>-<id>`` left where the scheduler puts them (SCHED_OTHER).
``stock-kbp``           kbpctl's stock backend (threaded NAPI kthread pinned to the RT CPU,
                        SCHED_FIFO), enabled and disabled through :mod:`kbp.backends`.
``busy`` / ``hybrid``   the kbp module's poller on the RT CPU (:mod:`kbp.backends` kmod);
                        only where the module is loaded (the VM rig), skipped elsewhere.
======================  =================================================================

A mode owns its quirks; the runner only asks:

* ``app_place(home, env)``: where the RT application runs while the mode is on.  A mode
  whose poller never sleeps (``spins``: busy) owns its CPU: a SCHED_FIFO spinner leaves a
  SCHED_OTHER application on the same CPU only the RT-throttling window (50 ms per second);
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

from kbp import names
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


# -- kbpctl backends (stock-kbp, busy, hybrid) -----------------------------------------------
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
        req = b.EnableRequest([t.dev], netns=t.netns, mode=self.kbp_mode, cpus=[t.cpu],
                              rt_prio=t.rt_prio)
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


def all_modes() -> dict[str, Mode]:
    """Every benchmark mode, by its name in names.BENCH_MODES."""
    return {
        "napi": NapiMode(),
        "threaded": ThreadedMode(),
        "stock-kbp": BackendMode("stock-kbp", names.BACKEND_STOCK, names.MODE_HYBRID),
        names.MODE_BUSY: BackendMode(names.MODE_BUSY, names.BACKEND_KMOD, names.MODE_BUSY,
                                     spins=True),
        names.MODE_HYBRID: BackendMode(names.MODE_HYBRID, names.BACKEND_KMOD,
                                       names.MODE_HYBRID),
    }
