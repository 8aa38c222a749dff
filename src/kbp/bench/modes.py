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
                        RPS off on the RT server device (the polled NAPI hands the request to
                        the socket, not to the RT CPU's backlog); the tester's socket has
                        ``SO_BUSY_POLL`` 0, so it never busy-polls.
``defer``               the kernel's IRQ deferral on the RT server device: sysfs
                        ``napi_defer_hard_irqs`` = 2, ``gro_flush_timeout`` = 20000 ns
                        (after a poll with work, up to 2 empty re-polls from a 20 µs hrtimer
                        before the interrupt, on veth the peer's wake-up, is re-armed).
``irq-suspend``         the kernel's IRQ suspension (Linux 6.13+, napi.rst "IRQ suspension")
                        on the RT server device, per NAPI through netdev ``napi-set``:
                        ``defer-hard-irqs`` = 2, ``gro-flush-timeout`` = 20000 ns,
                        ``irq-suspend-timeout`` = 20000000 ns, RPS off on that device; the RT
                        application is ``kbp-echo``, an epoll echo server that asks for it
                        (``EPIOCSPARAMS``: prefer_busy_poll 1, busy_poll_usecs 0, budget 16).
                        Why these values: :class:`IrqSuspendMode`.
``stock-hybrid``        kbpctl's stock backend ``--mode hybrid`` (threaded NAPI kthread
                        pinned to the RT CPU, SCHED_FIFO), enabled and disabled through
                        :mod:`kbp.backends`; called ``stock-kbp`` until 2026-11-27 (still
                        taken by ``--modes`` and read from older results files).
``stock-busy``          kbpctl's stock backend ``--mode busy``: upstream threaded busy polling
                        (``threaded`` = 2, the kthread never sleeps), Linux 6.19 and later;
                        skipped with the reason on older kernels.  No ``--rt-prio``: the
                        kthread keeps the backend's default policy for busy (kbpctl refuses
                        SCHED_FIFO there); the app is placed as for ``busy``.
``stock-periodic``      kbpctl's stock backend ``--mode periodic`` (NetAP on a stock kernel):
                        the kernel's IRQ deferral (``napi_defer_hard_irqs`` +
                        ``gro_flush_timeout``) polls the NAPI from an hrtimer with its
                        interrupt masked, at the interval kbpctl's user-space search tunes
                        (golden-section, rounds of ``--round-ms``).  ``--rt-prio`` left to
                        the backend.  ``search_state()`` reads the search (converged
                        interval) from ``kbpctl status`` and the NAPIs' gro_flush_timeout;
                        the search's process, where the state names it (``service_pid``),
                        counts as one of the mode's polling threads (its CPU time).
``busy`` / ``hybrid``   the kbp module's poller on the RT CPU (:mod:`kbp.backends` kmod);
                        only where the module is loaded (the VM rig), skipped elsewhere.
``periodic``            the kbp module's poller in mode periodic (NetAP): it polls every
                        interval with the device's interrupt masked; the golden-section
                        search tunes the interval per round (``--round-ms``; a fixed
                        ``--interval-us`` turns it off).  ``search_state()`` reads the
                        poller's search (round, interval, converged) from the module.
======================  =================================================================

The periodic modes are refused with the backend's own reason where kbpctl does not offer
mode periodic on that backend (its static check, run with no device: ``unavailable()``).

Every mode puts back exactly what it changed (:mod:`kbp.bench.knobs` for the sysctls and
sysfs attributes, kbpctl's journal for the backends), from ``teardown``, which the runner calls
in a ``finally``: also after an exception or Ctrl-C half-way through ``setup``.  A mode the
running kernel cannot do says why in ``unavailable()`` (e.g. "needs Linux 6.19 or later; this
kernel is 6.18.44") and the benchmark skips it with that reason.

IRQ suspension only acts for an epoll application that asks for it (``EPIOCSPARAMS`` with
``prefer_busy_poll``), which sockperf cannot do: the mode ``irq-suspend`` replaces the RT
application while it is on (``app()`` below), with ``kbp-echo`` at the same address, port
and placement (:mod:`kbp.bench.workloads`).  Its numbers are therefore kbp-echo's, not
sockperf's: both echo the request unchanged from one socket, kbp-echo with epoll and
recvmmsg/sendmmsg.

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
* ``app()``: the RT application while the mode is on (names.RT_APPS): sockperf's server,
  except irq-suspend's kbp-echo; the runner swaps the running server before ``setup`` and
  back after ``teardown``.
* ``needs_fresh_device(target)``: the module modes want an RT device whose NAPI has no
  kthread (kernels before ~6.15 keep it after ``threaded`` goes back to 0, and the module
  refuses such a NAPI: EBUSY); the runner then recreates the RT veth pair.
* ``threads()`` / ``counters()``: read through :mod:`kbp.backends.probe` (the polling threads
  of one device once after setup, their counters around each run), not ``status()``.
  ``nonrt_threads()``: the mode's polling threads of other devices on the RT CPU (the -part
  modes' class non-rt; none elsewhere): their CPU time is recorded beside the pollers'.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, Protocol

from kbp import modespec, names, sysinfo
from kbp.bench import knobs, steer
from kbp.bench.knobs import Changes, Knob, KnobError, net_core_sysctl
from kbp.system import access, journal

VM_HINT = "runs in the VM rig: python -m kbp.bench vm --smoke"


def backend_mode(backend: str, kbp_mode: str) -> str:
    """The benchmark mode in which kbpctl's ``backend`` serves the RT device in ``kbp_mode``
    (names.MODE_*): the kbp module's under the kbpctl mode's own name (busy, hybrid,
    periodic), the stock backend's as ``stock-<mode>``."""
    return kbp_mode if backend == names.BACKEND_KMOD else f"{backend}-{kbp_mode}"


# The modes' names: the only place they are typed (the table at the end of this module says
# what each is; every other module takes them from here or from the table).
NAPI: Final = "napi"
THREADED: Final = "threaded"
BUSYPOLL: Final = "busypoll"
DEFER: Final = "defer"
IRQ_SUSPEND: Final = "irq-suspend"
STOCK_HYBRID: Final = backend_mode(names.BACKEND_STOCK, names.MODE_HYBRID)
STOCK_BUSY: Final = backend_mode(names.BACKEND_STOCK, names.MODE_BUSY)
STOCK_PERIODIC: Final = backend_mode(names.BACKEND_STOCK, names.MODE_PERIODIC)
BUSY: Final = backend_mode(names.BACKEND_KMOD, names.MODE_BUSY)
HYBRID: Final = backend_mode(names.BACKEND_KMOD, names.MODE_HYBRID)
PERIODIC: Final = backend_mode(names.BACKEND_KMOD, names.MODE_PERIODIC)
EXCLUSIVE: Final = "exclusive"
EXCL_SUFFIX: Final = "-excl"   # <kbp mode>-excl: the kbp mode and the exclusive CPU
PART_SUFFIX: Final = "-part"   # <kbp mode>-part: the kbp mode and the heavy device non-rt
#: the baseline every ratio refers to
BASELINE: Final = NAPI


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
    # the periodic modes' knobs (names.PERIODIC_KNOBS, kbpctl's names: round_ms, interval_us,
    # ...); the backend's defaults for the others
    periodic: dict[str, Any] = field(default_factory=dict)


class Mode(Protocol):
    name: str
    spins: bool
    moves_load: bool        # it moves load off the RT CPU: the runner lets it settle after

    def idle_problem(self) -> str | None:
        """Why the idle part cannot run this mode (None: it can)."""

    def unavailable(self) -> str | None:
        """Why this mode cannot run here (None: it can)."""

    def app_place(self, home: AppPlace, env: AppEnv) -> AppPlace:
        """Where the RT application runs while this mode is on (``home``: the placement's)."""

    def app(self) -> str:
        """Which RT application runs while this mode is on (names.RT_APPS)."""

    def needs_fresh_device(self, t: Target) -> bool:
        """True: recreate the RT device before ``setup`` (see the module docstring)."""

    def setup(self, t: Target) -> None: ...

    def teardown(self) -> None: ...

    def threads(self) -> dict[int, str]:
        """The poller threads serving the device now: {pid: comm}."""

    def nonrt_threads(self) -> dict[int, str]:
        """The mode's other polling threads on the RT CPU, serving other devices (the -part
        modes' class non-rt: kbpn/<cpu> pollers, the heavy device's napi/<dev>-<id> threads):
        {pid: comm}; empty for every other mode."""

    def counters(self) -> dict[str, int | None]:
        """Poller counters (names.POLLER_COUNTERS) where the mode has them."""

    def describe(self) -> dict[str, Any]: ...


# -- helpers ---------------------------------------------------------------------------------
def counters_moved(before: dict[str, int | None], after: dict[str, int | None],
                   ) -> dict[str, float]:
    """How far each poller counter moved between two :meth:`Mode.counters` reads (a counter
    the second read has; one the first lacked counts from 0)."""
    return {k: v - (before.get(k) or 0) for k, v in after.items() if v is not None}


#: the sysfs attribute that threads a device's NAPIs (/sys/class/net/DEV/threaded)
SYSFS_THREADED: Final = "threaded"


def sysfs_net(netns: str, dev: str, attr: str, value: str | None = None) -> str:
    """Read (or write, then read back) /sys/class/net/DEV/ATTR as seen inside ``netns``
    (OSError with the kernel's errno)."""
    path = access.net_path(dev, attr)
    if value is not None:
        access.write(path, f"{value}\n", netns)
    return access.read(path, netns)


def thread_placement(pid: int) -> dict[str, Any]:
    """CPU affinity, scheduling policy and priority of a thread (for the record)."""
    try:
        s = sysinfo.get_sched(pid)
    except OSError:
        return {"pid": pid, "gone": True}
    return {"pid": pid, "policy": s.policy, "priority": s.priority, "cpus": s.cpus}


Version = tuple[int, int, int]


def too_old(since: Version, what: str, release: str | None = None) -> str | None:
    """Why ``what`` cannot run on this kernel (None: it is ``since`` or newer)."""
    rel = release or sysinfo.kernel_release()
    if sysinfo.kernel_version(rel) >= since:
        return None
    return (f"{what} needs Linux {since[0]}.{since[1]} or later; this kernel is {rel} "
            "(kernel too old)")


class _Defaults:
    """The quirks of a mode that has none: the app stays home, any device will do, nothing
    moves, it runs in the idle part."""

    moves_load = False

    def idle_problem(self) -> str | None:
        return None

    def app_place(self, home: AppPlace, env: AppEnv) -> AppPlace:
        return home

    def app(self) -> str:
        return names.APP_SOCKPERF

    def needs_fresh_device(self, t: Target) -> bool:
        return False

    def nonrt_threads(self) -> dict[int, str]:
        return {}


def nonrt_threads(mode: Any) -> dict[int, str]:
    """``mode.nonrt_threads()``; {} for a mode without that method."""
    get = getattr(mode, "nonrt_threads", None)
    return dict(get()) if get is not None else {}


# -- napi ------------------------------------------------------------------------------------
def require_softirq_napi(t: Target, mode: str, error: type[Exception] = RuntimeError) -> None:
    """The RT device's NAPI runs in softirq (threaded 0), as a napi-like mode expects; a
    threaded one means a previous mode was not torn down (``error`` with the reason)."""
    cur = sysfs_net(t.netns, t.dev, "threaded")
    if cur != "0":
        raise error(f"{t.dev}: threaded is {cur}, expected 0 for mode {mode} "
                    "(a previous mode was not torn down?)")


@dataclass
class NapiMode(_Defaults):
    name: str = NAPI
    target: Target | None = None
    spins: bool = False

    def unavailable(self) -> str | None:
        return None

    def setup(self, t: Target) -> None:
        self.target = t
        require_softirq_napi(t, self.name)

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
    name: str = THREADED
    target: Target | None = None
    spins: bool = False
    ex: journal.Executor = field(default_factory=steer.changes)

    def unavailable(self) -> str | None:
        return None

    def setup(self, t: Target) -> None:
        self.target = t
        self.ex.apply(journal.KIND_SYSFS, steer.dev_key(t.netns, t.dev, "threaded"), "1")
        got = sysfs_net(t.netns, t.dev, "threaded")
        if got != "1":
            raise RuntimeError(f"{t.dev}: cannot turn threaded NAPI on (reads {got})")

    def teardown(self) -> None:
        try:
            self.ex.restore()                 # the device may be gone (Ctrl-C): a note
        except access.RestoreError as e:
            raise KnobError(f"{self.name}: {e}") from e
        finally:
            self.target = None

    def threads(self) -> dict[int, str]:
        if self.target is None:
            return {}
        return {st.pid: st.comm for st in sysinfo.find_napi_threads(self.target.dev)}

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
    #: how it reads and sets its knobs: the kernel's (kbpctl's handlers), a test's fake
    effector: journal.Effector = field(default_factory=knobs.kernel_effector)
    changes: Changes | None = None
    _set: dict[str, str] = field(default_factory=dict)

    def wanted(self, t: Target) -> list[tuple[Knob, str]]:
        raise NotImplementedError

    def how(self) -> str:
        raise NotImplementedError

    def setup(self, t: Target) -> None:
        self.target = t
        self.changes = Changes(self.effector)
        want = self.wanted(t)
        self._set = {str(k): v for k, v in want}
        self.changes.apply(want)

    def teardown(self) -> None:
        ch, self.changes, self.target = self.changes, None, None
        try:
            if ch is not None:
                ch.restore()        # KnobError names what could not be put back
        finally:
            knobs.close(self.effector)

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
    them (its own when the kernel has them per namespace, else the global ones), and RPS off
    on the RT device while on (as irq-suspend): with RPS the NAPI the app busy-polls would
    hand every request to the RT CPU's backlog again instead of to the socket.  The tester
    does not busy-poll although the sysctls may be global: kbp-rtt sets SO_BUSY_POLL 0 on its
    socket (checked by :func:`kbp.bench.tester.check_busy_poll`)."""

    name: str = BUSYPOLL

    def unavailable(self) -> str | None:
        k = net_core_sysctl("busy_read", None, self.effector)
        if knobs.read(self.effector, k) is None:
            return "this kernel has no net.core.busy_read (built without CONFIG_NET_RX_BUSY_POLL)"
        return None

    def wanted(self, t: Target) -> list[tuple[Knob, str]]:
        return [*rps_off(t, self.effector), *((net_core_sysctl(n, t.netns, self.effector),
                                             BUSY_POLL_US) for n in ("busy_read", "busy_poll"))]

    def how(self) -> str:
        scope = "per namespace" if any("(netns" in k for k in self._set) else \
            "global (not per namespace on this kernel)"
        return (f"sysctl net.core.busy_read = net.core.busy_poll = {BUSY_POLL_US} us "
                f"(tuned network-latency), {scope}; the app's recv/epoll busy-poll the NAPI; "
                "RPS off on the RT server device; the tester's socket SO_BUSY_POLL 0")


def rps_off(t: Target, kernel: journal.Effector, max_queues: int = 4096,
            queues: Iterable[str] | None = None) -> list[tuple[Knob, str]]:
    """Knobs that turn RPS off on every receive queue of the target device (``rps_cpus``
    and a non-zero ``rps_flow_cnt`` written as zero, in the width they read); ``queues``
    (rx-0, ...), or while rx-N's ``rps_cpus`` is there."""
    want: list[tuple[Knob, str]] = []
    d = f"/sys/class/net/{t.dev}/queues"
    for q in queues if queues is not None else (f"rx-{i}" for i in range(max_queues)):
        cpus = Knob(f"{d}/{q}/rps_cpus", t.netns)
        was = knobs.read(kernel, cpus)
        if was is None and queues is None:
            break
        if was is not None and zero_mask(was) != was:
            want.append((cpus, zero_mask(was)))
        flows = Knob(f"{d}/{q}/rps_flow_cnt", t.netns)
        if knobs.read(kernel, flows) not in (None, "0"):
            want.append((flows, "0"))
    return want


@dataclass
class DeferMode(KnobMode):
    """``defer``: napi_defer_hard_irqs and gro_flush_timeout on the RT server device."""

    name: str = DEFER

    def unavailable(self) -> str | None:
        return too_old(DEFER_SINCE, "napi_defer_hard_irqs")

    def wanted(self, t: Target) -> list[tuple[Knob, str]]:
        d = f"/sys/class/net/{t.dev}"
        return [(Knob(f"{d}/gro_flush_timeout", t.netns), GRO_FLUSH_TIMEOUT_NS),
                (Knob(f"{d}/napi_defer_hard_irqs", t.netns), DEFER_HARD_IRQS)]

    def how(self) -> str:
        return (f"sysfs napi_defer_hard_irqs = {DEFER_HARD_IRQS}, gro_flush_timeout = "
                f"{GRO_FLUSH_TIMEOUT_NS} ns on the RT server device (IRQ deferral)")


# -- irq-suspend: the kernel's IRQ suspension, for an epoll app that asks for it --------------
# napi.rst "IRQ suspension": defer-hard-irqs / gro-flush-timeout "low"; the same as defer's,
# so the two modes differ only by the suspension.  NOT the selftest's 100 x 50 us: see below.
IRQ_SUSPEND_DEFER_HARD_IRQS = "2"           # napi-set defer-hard-irqs
IRQ_SUSPEND_GRO_FLUSH_TIMEOUT_NS = "20000"  # napi-set gro-flush-timeout (20 us)
IRQ_SUSPEND_TIMEOUT_NS = "20000000"         # napi-set irq-suspend-timeout (20 ms)
IRQ_SUSPEND_SINCE: Version = (6, 13, 0)     # napi-set irq-suspend-timeout
EPOLL_PARAMS_SINCE: Version = (6, 9, 0)     # EPIOCSPARAMS / EPIOCGPARAMS on an epoll fd
# _IOR(0x8A, 0x02, struct epoll_params): 8 bytes (asm-generic ioctl encoding: x86, arm)
EPIOCGPARAMS = (2 << 30) | (8 << 16) | (0x8A << 8) | 0x02
NAPI_ATTRS = {"defer-hard-irqs": "defer_hard_irqs", "gro-flush-timeout": "gro_flush_timeout",
              "irq-suspend-timeout": "irq_suspend_timeout"}


def napi_knob(napi_id: int, attr: str, netns: str | None) -> Knob:
    """A NAPI's napi-set attribute (``attr`` as netdev.yaml spells it) as a :class:`Knob`."""
    if attr not in NAPI_ATTRS:
        raise ValueError(f"unknown napi-set attribute {attr!r}")
    return Knob(f"netdev napi {napi_id} {attr}", netns, (napi_id, NAPI_ATTRS[attr]))


def rt_napi_ids(t: Target) -> list[int]:
    """The NAPI ids of the target device (napi-get in its namespace)."""
    return napi_ids(t.dev, t.netns)


def napi_ids(dev: str, netns: str | None) -> list[int]:
    """The NAPI ids of ``dev`` in ``netns`` (napi-get there)."""
    from kbp.netdev import NetdevClient, get_link
    link = get_link(dev, netns)
    if link is None:
        raise RuntimeError(f"{dev}: no such device in netns {netns}")
    with NetdevClient(netns) as c:
        return [n.id for n in c.napis(link.ifindex)]


def rt_rx_queues(t: Target) -> list[str]:
    """The receive queues of the target device (rx-0, ...)."""
    from kbp.bench.steer import rx_queues
    return rx_queues(t.netns, t.dev)


def netdev_features() -> Any:
    """What this kernel's netdev family can do (kbp.netdev; read from its policy)."""
    from kbp.netdev import NetdevClient, NetdevFeatures
    try:
        with NetdevClient(None) as c:
            return c.features()
    except Exception:
        return NetdevFeatures()


def epoll_params_errno() -> int | None:
    """errno of EPIOCGPARAMS on a fresh epoll fd: None when the kernel has the ioctl
    (ENOTTY: older than 6.9; EOPNOTSUPP: built without CONFIG_NET_RX_BUSY_POLL)."""
    import fcntl
    import select
    ep = select.epoll()
    try:
        fcntl.ioctl(ep.fileno(), EPIOCGPARAMS, bytearray(8))
    except OSError as e:
        return e.errno
    finally:
        ep.close()
    return None


def zero_mask(mask: str) -> str:
    """The empty CPU mask in the width the kernel prints ``mask`` ("00000000,00000002" ->
    "00000000,00000000"), so a write reads back as written."""
    return "".join("0" if c in "0123456789abcdefABCDEF" else c for c in mask)


@dataclass
class IrqSuspendMode(KnobMode):
    """``irq-suspend``: IRQ suspension (Linux 6.13, Documentation/networking/napi.rst "IRQ
    suspension") on the RT server device, for an RT application that asks for it.

    How it works: the application's ``epoll_wait()`` polls the NAPI itself (epoll busy
    polling with ``prefer_busy_poll``); while it finds events, the NAPI's IRQ stays masked
    for up to ``irq-suspend-timeout``, re-armed at every such call; once a call finds none,
    the suspension ends and IRQ deferral takes over (after a poll with work, up to
    ``defer-hard-irqs`` empty re-polls from a ``gro-flush-timeout`` hrtimer before the IRQ
    is re-armed; GRO keeps what it holds until that last re-poll or the next jiffy).  On
    veth the "IRQ" is the peer's wake-up of the NAPI (``rx_notify_masked``).

    The values follow Documentation/networking/napi.rst ("IRQ suspension"), which gives no
    numbers but the rules: ``irq-suspend-timeout`` much larger than ``gro-flush-timeout`` (a
    safety net for one userland processing cycle: 20 ms), ``gro-flush-timeout`` and
    ``defer-hard-irqs`` set but "low" (they decide what happens once epoll finds nothing):
    2 and 20 us, defer's values.  epoll ``busy_poll_usecs`` 0, budget 16, ``prefer_busy_poll``
    1, 8 events per call (kbp-echo's defaults, :data:`kbp.bench.workloads.ECHO_BUSY_POLL_USECS`
    ...).  The selftest's 100 x 50 us (tools/testing/selftests/net/busy_poll_test.sh, a bulk
    TCP transfer over netdevsim) does not fit this testbed: the RT device has
    ``rx-udp-gro-forwarding`` on (:mod:`kbp.bench.testbed`), so veth's GRO holds each request
    (udp4_gro_receive() -> udp_gro_receive_segment(); no socket lookup without a UDP tunnel
    socket), and while a deferral timeout is pending napi_complete_done() flushes only
    packets older than the current jiffy (gro_flush_normal(gro, flush_old=true)).  With 100
    re-polls x 50 us = 5 ms > one jiffy (4 ms at HZ=250) every request waited for the next
    tick: RTT ~U(0, 4 ms), p50 2.1 ms (docs/results.md, 2026-11-23).  With 2 re-polls the
    hold ends at the third completion (<= ~40 us, as in defer), and after ~40 us without
    traffic the "interrupt" (on veth the peer's wake-up, ``rx_notify_masked``) is back.  The
    mode is the per-NAPI netlink settings (there is no sysfs one for ``irq-suspend-timeout``),
    set on every NAPI of the RT device, which has one per receive queue.

    RPS is turned off on the device while the mode is on (each queue's ``rps_cpus`` and, where
    set, ``rps_flow_cnt``, written as zero in the width they read): the shared-cpu scenario
    steers the RT device to the RT CPU with RPS, and then the NAPI polled from ``epoll_wait``
    would queue the request on a backlog again instead of handing it to the socket.  Every
    value found (NAPI attributes and RPS files) goes back exactly on teardown
    (:class:`Changes`).  The app is placed as the placement says (``app_place``: home).
    """

    name: str = IRQ_SUSPEND
    find_napis: Any = rt_napi_ids               # Target -> [NAPI id]
    find_rx_queues: Any = rt_rx_queues          # Target -> ["rx-0", ...]
    features: Any = netdev_features             # () -> NetdevFeatures
    epoll_errno: Any = epoll_params_errno       # () -> errno | None

    def app(self) -> str:
        return names.APP_KBP_ECHO

    def unavailable(self) -> str | None:
        rel = sysinfo.kernel_release()
        f = self.features()
        if not f.napi_knob("irq_suspend_timeout"):
            where = ("its netdev napi-set has no irq-suspend-timeout" if f.napi_set else
                     "it has no netdev napi-set" if f.family else
                     "it has no netdev netlink family")
            return (f"IRQ suspension (netdev napi-set irq-suspend-timeout) needs Linux "
                    f"{IRQ_SUSPEND_SINCE[0]}.{IRQ_SUSPEND_SINCE[1]} or later; this kernel "
                    f"is {rel} ({where})")
        err = self.epoll_errno()
        if err is None:
            return None
        import errno as errno_
        if err == errno_.EOPNOTSUPP:
            return (f"IRQ suspension needs epoll busy polling (EPIOCSPARAMS); this kernel "
                    f"is {rel}, built without CONFIG_NET_RX_BUSY_POLL")
        return (f"epoll busy-poll parameters (EPIOCSPARAMS, prefer_busy_poll) need Linux "
                f"{EPOLL_PARAMS_SINCE[0]}.{EPOLL_PARAMS_SINCE[1]} or later; this kernel is "
                f"{rel} (the ioctl fails: {os.strerror(err)})")

    def wanted(self, t: Target) -> list[tuple[Knob, str]]:
        ids = list(self.find_napis(t))
        if not ids:
            raise RuntimeError(f"{t.dev}: napi-get lists no NAPI instance (GRO off on "
                               "veth?): IRQ suspension has nothing to act on")
        want = rps_off(t, self.effector, queues=self.find_rx_queues(t))
        for nid in ids:
            want += [(napi_knob(nid, "defer-hard-irqs", t.netns), IRQ_SUSPEND_DEFER_HARD_IRQS),
                     (napi_knob(nid, "gro-flush-timeout", t.netns),
                      IRQ_SUSPEND_GRO_FLUSH_TIMEOUT_NS),
                     (napi_knob(nid, "irq-suspend-timeout", t.netns), IRQ_SUSPEND_TIMEOUT_NS)]
        return want

    def how(self) -> str:
        return (f"IRQ suspension: napi-set defer-hard-irqs = {IRQ_SUSPEND_DEFER_HARD_IRQS}, "
                f"gro-flush-timeout = {IRQ_SUSPEND_GRO_FLUSH_TIMEOUT_NS} ns, "
                f"irq-suspend-timeout = {IRQ_SUSPEND_TIMEOUT_NS} ns on every NAPI of the "
                "RT server device, RPS off there; RT app kbp-echo (epoll, EPIOCSPARAMS)")

    def describe(self) -> dict[str, Any]:
        from kbp.bench import workloads
        return {**super().describe(), "app": names.APP_KBP_ECHO,
                "epoll_params": {"busy_poll_usecs": workloads.ECHO_BUSY_POLL_USECS,
                                 "busy_poll_budget": workloads.ECHO_BUSY_POLL_BUDGET,
                                 "prefer_busy_poll": workloads.ECHO_PREFER_BUSY_POLL,
                                 "max_events": workloads.ECHO_MAX_EVENTS}}


# -- kbpctl backends (stock-hybrid, stock-busy, stock-periodic, busy, hybrid, periodic) ------
def _backends() -> Any:
    import kbp.backends as b  # the kbpctl engineers' package; imported only when used
    return b


@dataclass
class BackendMode(_Defaults):
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

    def app(self) -> str:
        return names.APP_SOCKPERF

    def needs_fresh_device(self, t: Target) -> bool:
        return self.backend == names.BACKEND_KMOD and bool(sysinfo.find_napi_threads(t.dev))

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

    def request(self, t: Target) -> Any:
        """The kbpctl EnableRequest this mode makes for ``t``."""
        b = _backends()
        prio = {} if self.own_prio else {"rt_prio": t.rt_prio}
        return b.EnableRequest([t.dev], netns=t.netns, mode=self.kbp_mode, cpus=[t.cpu],
                               **prio)

    def setup(self, t: Target) -> None:
        b = _backends()
        self.target = t
        req = self.request(t)
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


def backend_refusal(backend: str, mode: str, periodic: dict[str, Any] | None = None,
                    ) -> str | None:
    """Why kbpctl's ``backend`` refuses ``mode`` before it looks at any device (its static
    checks, with a placeholder device and no CPU list; nothing changes), None when it takes
    it.  While a backend does not offer mode periodic yet, this is its own refusal."""
    b = _backends()
    be = b.get(backend)
    check = getattr(be, "_check_static", None)
    if check is None:
        return None
    try:
        per = b.Periodic.from_args(**periodic) if periodic else None
        req = b.EnableRequest(["lo"], mode=mode, periodic=per).resolved(backend)
        check(req)
    except Exception as e:
        return f"kbpctl {backend} backend refuses --mode {mode}: {e}"
    return None


def periodic_problem(knobs: dict[str, Any]) -> str | None:
    """Why the bench's periodic knobs (``--round-ms``, ``--interval-us``) would be refused by
    kbpctl (its own validation and message), None when they are fine."""
    if not knobs:
        return None
    try:
        b = _backends()
    except ImportError:
        return None
    try:
        b.Periodic.from_args(**knobs)
    except Exception as e:
        return str(e)
    return None


def _flat_search(out: dict[str, Any]) -> dict[str, Any]:
    """The search's headline fields at the top of a state: interval_us (the interval in force),
    converged, round, rounds, restarts (from its ``search`` nest where it has one)."""
    s = out.get("search")
    if isinstance(s, dict):
        for k in ("interval_us", "converged", "round", "rounds", "restarts",
                  "last_objective"):
            if s.get(k) is not None:
                out[k] = s[k]
        out["searching"] = True
    elif "searching" not in out:
        out["searching"] = False
    if out.get("converged") is not None:
        out["converged"] = bool(out["converged"])
    return out


def kmod_search_state(t: Target) -> dict[str, Any]:
    """The periodic poller of the RT CPU as kbp.ko reports it: its interval and (netap on)
    the search's state (module/uapi/kbp.h KBP_A_NETAP_STATE)."""
    import dataclasses

    from kbp import kmod
    with kmod.Client() as c:
        ps = [p for p in c.pollers() if p.cpu == t.cpu]
    if not ps:
        return {"source": f"kbp.ko poller {names.poller_name(t.cpu, device=t.dev)}",
                "error": "no poller on the RT CPU"}
    # the RT device's own (the module runs a poller per CPU and device)
    p = next((q for q in ps if q.ifname == t.dev), ps[0])
    out: dict[str, Any] = {"source": f"kbp.ko poller {p.name}", "mode": p.mode,
                           "netap": p.netap, "interval_us": p.interval_us,
                           "handbacks": p.handbacks, "round_ms": p.round_ms}
    if p.search is not None:
        out["search"] = dataclasses.asdict(p.search)
    return _flat_search(out)


def stock_search_state(t: Target) -> dict[str, Any]:
    """The stock backend's periodic search for the RT device: the state its service reports
    through ``kbpctl status`` (a ``periodic`` entry of the device, where the backend has it),
    and the interval in force read from the device's NAPIs (gro_flush_timeout, defer)."""
    b = _backends()
    st = b.status(netns=t.netns, devices=[t.dev])
    ds = next((d for d in st.devices if d.name == t.dev and d.netns == t.netns), None)
    out: dict[str, Any] = {"source": "kbpctl stock backend (kbpctl status)"}
    if ds is None:
        return {**out, "error": f"{t.dev} not in kbpctl status"}
    per = getattr(ds, "periodic", None)
    if isinstance(per, dict):
        out.update(per)
        svc = per.get("service")
        if isinstance(svc, dict) and svc.get("running") and isinstance(svc.get("pid"), int):
            out["service_pid"] = svc["pid"]  # the search's process: its CPU is the mode's
    gro = sorted(n.gro_flush_timeout_ns for n in ds.napis if n.gro_flush_timeout_ns is not None)
    defer = sorted({n.defer_hard_irqs for n in ds.napis if n.defer_hard_irqs is not None})
    out["gro_flush_timeout_ns"] = gro
    out["defer_hard_irqs"] = defer
    out = _flat_search(out)
    if out.get("interval_us") is None and gro:
        out["interval_us"] = gro[len(gro) // 2] / 1000
        out["interval_from"] = "gro_flush_timeout"
    return out


def search_state(mode: Mode) -> dict[str, Any] | None:
    """A periodic mode's search state now (None for the other modes); errors are recorded,
    never raised: reading it must not stop a run."""
    fn = getattr(mode, "search_state", None)
    if fn is None:
        return None
    try:
        state = fn()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return state if isinstance(state, dict) else None


@dataclass
class PeriodicMode(BackendMode):
    """Mode periodic (NetAP) through a kbpctl backend: kmod (kbp.ko's poller) or stock (IRQ
    deferral at an interval kbpctl's user-space search tunes)."""

    knobs: dict[str, Any] = field(default_factory=dict)

    def unavailable(self) -> str | None:
        why = BackendMode.unavailable(self)
        if why:
            return why
        try:
            return backend_refusal(self.backend, self.kbp_mode)
        except Exception as e:
            return f"{self.backend} backend: {e}"

    def request(self, t: Target) -> Any:
        b = _backends()
        self.knobs = dict(t.periodic)
        req = BackendMode.request(self, t)
        req.periodic = b.Periodic.from_args(**self.knobs)
        return req

    def search_state(self) -> dict[str, Any] | None:
        if self.target is None:
            return None
        if self.backend == names.BACKEND_KMOD:
            return kmod_search_state(self.target)
        return stock_search_state(self.target)

    def _read_threads(self) -> dict[int, str]:
        """The polling threads, plus the process that runs the interval search where the
        backend names it in its state (``service_pid``: the stock backend's user-space
        search is part of what this mode costs)."""
        out = BackendMode._read_threads(self)
        state = search_state(self) or {}
        pid = state.get("service_pid")
        if isinstance(pid, int) and pid > 0 and pid not in out:
            out[pid] = "periodic search"
        return out

    def describe(self) -> dict[str, Any]:
        d = BackendMode.describe(self)
        d["periodic"] = {**names.PERIODIC_DEFAULTS, **self.knobs}
        d["how"] += (f", interval fixed at {self.knobs['interval_us']} us"
                     if self.knobs.get("interval_us") else ", interval searched (NetAP)")
        return d


STOCK_BUSY_SINCE: Version = modespec.BUSY.stock.since   # kbpctl stock --mode busy


# -- the table: what every mode is -----------------------------------------------------------
# Categories: what a mode does with the RT CPU.
KERNEL: Final = "kernel"    # the kernel's own settings, no kbpctl
KBPCTL: Final = "kbpctl"    # a kbpctl backend serves the RT device (names.BACKENDS)
EXCL: Final = "excl"        # the exclusive CPU method: the heavy flow moved to the non-RT CPU
PART: Final = "part"        # RT and heavy receive work split by class on the RT CPU itself
CATEGORIES: Final = (KERNEL, KBPCTL, EXCL, PART)
#: the categories only a scenario with a heavy receiver offers (kbp.bench.heavy)
HEAVY_CATEGORIES: Final = (EXCL, PART)


@dataclass(frozen=True)
class ModeInfo:
    """What a benchmark mode is, typed once (in :data:`CATALOG`): --help, the runner's
    checks, the plots' colours, the report's order and the scenarios' mode lists read it."""

    name: str
    category: str                  # one of CATEGORIES
    summary: str                   # one line: --help and the docs
    colour: str                    # its colour in every plot (no two modes share one)
    make: Callable[[], Mode]       # a fresh adapter (the runner makes one set per run)
    backend: str | None = None     # the kbpctl backend serving the RT device (names.BACKENDS)
    kbp_mode: str | None = None    # the kbpctl mode it enables there (names.MODES)
    spins: bool = False            # its poller never sleeps: it owns its CPU (modespec)
    kthread: bool = False          # it leaves the RT device's NAPI a kthread (threaded NAPI)
    base: str | None = None        # the mode it adds to (the -excl and -part modes; exclusive)
    aliases: tuple[str, ...] = ()  # older names, still read from --modes and results files
    #: a variant for a comparison: it runs only when named in --modes (never by default)
    on_request: bool = False

    @property
    def heavy(self) -> bool:
        """Only a scenario with a heavy receiver offers it (HEAVY_CATEGORIES)."""
        return self.category in HEAVY_CATEGORIES

    @property
    def module(self) -> bool:
        """kbp.ko serves the RT device (it refuses a NAPI that kept a kthread)."""
        return self.backend == names.BACKEND_KMOD

    @property
    def periodic(self) -> bool:
        """Mode periodic (NetAP): the bench's periodic knobs apply."""
        return modespec.periodic(self.kbp_mode)

    @property
    def moves_load(self) -> bool:
        """It moves the heavy flow off the RT CPU while on (the exclusive CPU modes)."""
        return self.category == EXCL


def _kbpctl(backend: str, kbp_mode: str, colour: str, summary: str,
            aliases: tuple[str, ...] = (), **adapter: Any) -> ModeInfo:
    """A mode in which kbpctl's ``backend`` serves the RT device in ``kbp_mode``: named by
    :func:`backend_mode`, spinning where kbpctl's mode does (modespec); ``adapter``: the
    adapter's own settings (BackendMode's since, feature, own_prio)."""
    name, spins = backend_mode(backend, kbp_mode), modespec.spins(kbp_mode)
    cls = PeriodicMode if modespec.periodic(kbp_mode) else BackendMode
    return ModeInfo(name, KBPCTL, summary, colour,
                    partial(cls, name, backend, kbp_mode, spins=spins, **adapter),
                    backend=backend, kbp_mode=kbp_mode, spins=spins,
                    kthread=backend == names.BACKEND_STOCK, aliases=aliases)


def _heavy() -> Any:
    from kbp.bench import heavy  # it builds on this module's adapters
    return heavy


def _make_excl(base: str) -> Mode:
    return _heavy().KbpExclusiveMode(CATALOG[base].make())


def _make_part(name: str, base: str, repoll_us: int | None = None) -> Mode:
    return _heavy().PartMode(name, CATALOG[base].make(), repoll_us)


def _variant(base: ModeInfo, category: str, colour: str, summary: str) -> ModeInfo:
    """``base`` plus what a heavy-receiver category adds: everything the RT flow sees is
    base's (backend, kbpctl mode, spinning, kthread), its older names too (with the
    suffix)."""
    suffix = EXCL_SUFFIX if category == EXCL else PART_SUFFIX
    name = base.name + suffix
    make = partial(_make_excl, base.name) if category == EXCL else \
        partial(_make_part, name, base.name)
    return ModeInfo(name, category, summary, colour, make, backend=base.backend,
                    kbp_mode=base.kbp_mode, spins=base.spins, kthread=base.kthread,
                    base=base.name, aliases=tuple(a + suffix for a in base.aliases))


def _excl(base: ModeInfo, colour: str) -> ModeInfo:
    return _variant(base, EXCL, colour, f"{base.name} and the exclusive CPU together (kbpctl "
                    "enable --isolate's placement, the heavy receiver moved too)")


def _part(base: ModeInfo, colour: str) -> ModeInfo:
    return _variant(base, PART, colour, f"{base.name} on the RT device and the heavy device "
                    "in the same backend's class non-rt on the RT CPU itself (the outsourcing "
                    "paper's RT/non-RT split by priority; nothing moved)")


#: the stock -part variant without the heavy NAPIs' IRQ deferral (kbpctl --repoll-us 0), so
#: one interleaved run measures what the class's default deferral buys and costs
REPOLL0_SUFFIX: Final = "-repoll0"


def _part_repoll0(part: ModeInfo, colour: str) -> ModeInfo:
    name = part.name + REPOLL0_SUFFIX
    return replace(part, name=name, colour=colour, aliases=(), on_request=True,
                   summary=f"{part.name} with kbpctl --repoll-us 0: the heavy device's NAPI "
                           "IRQ deferral left as found (no re-poll timer), to compare with "
                           f"{part.name}'s default in one run; only when named in --modes",
                   make=partial(_make_part, name, part.base or "", 0))


def _exclusive() -> ModeInfo:
    return ModeInfo(EXCLUSIVE, EXCL, "the exclusive CPU method (RT device on napi; the heavy "
                    "receiver and its RPS on the non-RT CPU)", "#aaaaaa",
                    lambda: _heavy().ExclusiveMode(), base=NAPI)


def _table() -> list[ModeInfo]:
    """Every mode, in table order (--help, the report's rows, the plots' legends).  Colours:
    a kbp mode's ``-excl`` variant is its colour's light shade, its ``-part`` variant its
    dark shade; ``exclusive`` is napi's light grey (napi with the heavy flow moved)."""
    # stock-hybrid was stock-kbp until 2026-11-27 (the stock backend's *hybrid*); its -excl
    # and -part variants take the old name with the suffix
    stock_hybrid = _kbpctl(names.BACKEND_STOCK, names.MODE_HYBRID, "#2ca02c",
                           "kbpctl stock backend --mode hybrid (NAPI kthread SCHED_FIFO on "
                           "the RT CPU)", aliases=("stock-kbp",))
    hybrid = _kbpctl(names.BACKEND_KMOD, names.MODE_HYBRID, "#ff7f0e",
                     "kbp.ko poller, hybrid mode (kbp module loaded: the VM rig)")
    busy = _kbpctl(names.BACKEND_KMOD, names.MODE_BUSY, "#d62728",
                   "kbp.ko poller, busy mode (kbp module loaded: the VM rig)")
    stock_part = _part(stock_hybrid, "#00441b")
    return [
        ModeInfo(NAPI, KERNEL, "stock NAPI in NET_RX softirq (the baseline)", "#444444",
                 NapiMode),
        ModeInfo(THREADED, KERNEL, "stock threaded NAPI (sysfs threaded=1), kthreads "
                 "unpinned", "#1f77b4", ThreadedMode, kthread=True),
        ModeInfo(BUSYPOLL, KERNEL, f"sysctls net.core.busy_read = busy_poll = {BUSY_POLL_US} "
                 "(tuned network-latency), RPS off on the RT device", "#9467bd", BusyPollMode),
        ModeInfo(DEFER, KERNEL, f"IRQ deferral on the RT device: napi_defer_hard_irqs "
                 f"{DEFER_HARD_IRQS}, gro_flush_timeout {GRO_FLUSH_TIMEOUT_NS} ns", "#8c564b",
                 DeferMode),
        ModeInfo(IRQ_SUSPEND, KERNEL, "IRQ suspension on the RT device (Linux 6.13+), RT app "
                 "kbp-echo (epoll)", "#e377c2", IrqSuspendMode),
        stock_hybrid,
        # kbpctl refuses a SCHED_FIFO priority for stock --mode busy (the upstream kthread
        # never sleeps): the backend's default, SCHED_NORMAL, as a user gets it
        _kbpctl(names.BACKEND_STOCK, names.MODE_BUSY, "#17becf", "kbpctl stock backend --mode "
                "busy: upstream threaded busy polling (Linux 6.19+)", since=STOCK_BUSY_SINCE,
                own_prio=True,
                feature="threaded busy polling (napi threaded=2, kbpctl --mode busy)"),
        # the interval search runs in kbpctl's service; the priority is the backend's own
        _kbpctl(names.BACKEND_STOCK, names.MODE_PERIODIC, "#bcbd22", "kbpctl stock backend "
                "--mode periodic: IRQ deferral, interval searched (NetAP)", own_prio=True),
        busy,
        hybrid,
        _kbpctl(names.BACKEND_KMOD, names.MODE_PERIODIC, "#7f3b08", "kbp.ko poller, periodic "
                "mode: IRQ masked, interval searched (NetAP; the VM rig)"),
        _exclusive(),
        _excl(stock_hybrid, "#98df8a"),
        _excl(hybrid, "#ffbb78"),
        _excl(busy, "#ff9896"),
        stock_part,
        _part(hybrid, "#b8860b"),
        _part(busy, "#67000d"),
        _part_repoll0(stock_part, "#74c476"),
    ]


def _catalog(table: list[ModeInfo]) -> dict[str, ModeInfo]:
    out = {i.name: i for i in table}
    every = [n for i in table for n in (i.name, *i.aliases)]
    assert len(set(every)) == len(every), "two modes share a name"
    assert len({i.colour for i in table}) == len(table), "two modes share a colour"
    assert all(i.category in CATEGORIES for i in table)
    return out


#: every mode by name, in table order
CATALOG: Final[dict[str, ModeInfo]] = _catalog(_table())


def catalog() -> dict[str, ModeInfo]:
    """Every mode's :class:`ModeInfo` by name, in table order."""
    return CATALOG


def canonical(name: str) -> str:
    """The mode's name today (an older name, an alias, gives the mode's; others stay)."""
    for info in CATALOG.values():
        if name in info.aliases:
            return info.name
    return name


def aliases() -> dict[str, str]:
    """{older name: the mode's name today}."""
    return {a: i.name for i in CATALOG.values() for a in i.aliases}


def named(pred: Callable[[ModeInfo], bool]) -> tuple[str, ...]:
    """The modes whose info satisfies ``pred``, in table order."""
    return tuple(n for n, i in CATALOG.items() if pred(i))


def standard_modes() -> tuple[str, ...]:
    """The modes every scenario offers (those that need no heavy receiver), in table order."""
    return named(lambda i: not i.heavy)


def make_modes(wanted: Iterable[str]) -> dict[str, Mode]:
    """Fresh adapters of the modes in ``wanted``."""
    return {m: CATALOG[m].make() for m in wanted}


def all_modes() -> dict[str, Mode]:
    """Fresh adapters of the modes every scenario offers (:func:`standard_modes`)."""
    return make_modes(standard_modes())


def runs_doc(app_words: str, spin_app: str) -> dict[str, str]:
    """What the modes run on the RT CPU and where the RT app runs (results' placement.runs):
    ``app_words`` is the app's class at home, ``spin_app`` --busy-app."""
    kbpctl = named(lambda i: i.category == KBPCTL)
    spinning = named(lambda i: i.spins and i.category == KBPCTL)
    return {"rt": f"the RT device's poller in {THREADED} (unpinned: where the scheduler puts "
                  f"it), {', '.join(kbpctl)}",
            "app": f"sockperf server (the RT application), {app_words}; {BUSYPOLL}: it "
                   f"busy-polls the RT NAPI itself; {', '.join(spinning)}: --busy-app "
                   f"{spin_app}; {IRQ_SUSPEND}: {names.APP_KBP_ECHO} in its place"}


def availability(wanted: list[str], modes: dict[str, Mode] | None = None,
                 ) -> dict[str, str | None]:
    """{mode: why it cannot run here, None when it can} for the modes in ``wanted``."""
    modes = modes if modes is not None else all_modes()
    return {m: modes[m].unavailable() for m in wanted}


__all__ = ["CATALOG", "AppEnv", "AppPlace", "BackendMode", "BusyPollMode", "DeferMode",
           "IrqSuspendMode", "KnobError", "KnobMode", "Mode", "ModeInfo", "NapiMode",
           "PeriodicMode", "Target", "ThreadedMode", "aliases", "all_modes", "availability",
           "backend_mode", "backend_refusal", "canonical", "catalog", "make_modes", "named",
           "runs_doc", "search_state", "standard_modes", "too_old"]
