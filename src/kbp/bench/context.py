"""The benchmark's run context: what a run holds on to and puts back.

:class:`Signals` is the run's SIGINT/SIGTERM handling (its state here, not in module
globals); :class:`RunContext` is the testbed, the RT application, the modes' lifecycle (each
mode on and off with its quirks) and the progress reports.  ``Bench.run``
(:mod:`kbp.bench.runner`) puts every restore of a run on one exit stack.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pyroute2.netlink.exceptions import NetlinkError

from kbp import names
from kbp.bench import machine, nicpair, parts, scenarios, steer, trace, workloads
from kbp.bench import modes as modes_
from kbp.bench import placement as placement_
from kbp.bench.modes import AppEnv, AppPlace, KnobError, Mode, Target
from kbp.bench.placement import Placement
from kbp.bench.schema import LatencyRun, Results, Samples
from kbp.bench.testbed import Testbed, VethLink
from kbp.system import access

if TYPE_CHECKING:
    from kbp.bench.heavy import HeavySide
    from kbp.bench.runner import BenchConfig, Progress


@dataclass
class Signals:
    """SIGINT and SIGTERM in the benchmark process unwind like Ctrl-C, so everything is
    restored; while a mode puts back what it changed they wait (:meth:`held`)."""

    main_pid: int = 0
    interrupted: bool = False
    hold: int = 0               # > 0: a mode is putting back what it changed (held)

    def handler(self, sig: int, _frm: Any) -> None:
        """SIGINT or SIGTERM in the benchmark process: unwind like Ctrl-C, so everything is
        restored.  Python drops an exception raised while it runs an at-fork callback
        (pyroute2 forks to enter namespaces; logging registers one: "Exception ignored in
        _releaseLock"), and the benchmark then ran to its end: the flag makes the next
        checkpoint raise it again.  A forked helper inherits this handler: it must just die,
        never run the cleanup."""
        if os.getpid() != self.main_pid:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return
        self.interrupted = True
        if self.hold:
            return                  # raised when the mode is off again (held)
        raise KeyboardInterrupt

    def checkpoint(self) -> None:
        """Raise the interrupt again if its first KeyboardInterrupt was swallowed."""
        if self.interrupted:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM wait while a mode puts back what it changed: one arriving
        inside ``kbpctl disable`` stopped it half way, leaving its journal (and the settings
        of a namespace about to be deleted) behind.  The handler only notes the signal
        meanwhile; it unwinds as usual right after.  (Blocking the signals would not do: the
        kernel hands a process-directed signal to another thread, and Python runs the
        handler in this one.)"""
        self.hold += 1
        try:
            yield
        finally:
            self.hold -= 1
            if not self.hold and self.interrupted:
                raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[Signals]:
        """This process's SIGTERM (and SIGINT, unless it is ignored) go to :meth:`handler`
        until the block ends; the old handlers are put back then."""
        self.main_pid = os.getpid()
        self.interrupted = False
        old_term = signal.signal(signal.SIGTERM, self.handler)
        old_int = signal.getsignal(signal.SIGINT)
        if old_int is signal.default_int_handler:       # not when SIGINT is ignored
            signal.signal(signal.SIGINT, self.handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, old_term)
            if old_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, old_int)


class Aborted(Exception):
    pass


RunProbe = Callable[[], Callable[[LatencyRun], None]]


def _no_results() -> Results:
    """The document before the run's head (Bench.head, with its schema) replaces it."""
    return cast(Results, {})


@dataclass
class RunContext:
    """What one benchmark run holds and puts back: the testbed (its undo steps, the NIC
    pair's journal, the client ends' steering), the RT application, each mode on and off
    with its quirks (:meth:`_mode`), the signals, the progress reports; ``cfg``,
    ``scenario`` and ``placement`` come from the plan (:class:`kbp.bench.runner.Bench`)."""

    cfg: BenchConfig
    progress: Progress | None = None
    results: Results = field(default_factory=_no_results)   # kbp.bench.schema's document
    samples: Samples = field(default_factory=dict)
    modes: dict[str, Mode] = field(default_factory=dict)
    binary: Path | None = None
    tb: Testbed | None = None
    server: workloads.RtApp | None = None
    trace_reason: str | None = None
    tfs: trace.TraceFs = field(default_factory=trace.TraceFs)
    scenario: scenarios.Scenario | None = None
    placement: Placement | None = None
    pair: tuple[str, str] | None = None      # --nic-pair (tester's port, server's), by plan()
    # a scenario's own measurements of each latency run: called right before the tester
    # starts (inside the mode), each returns the function that adds what it saw to the record
    probes: list[RunProbe] = field(default_factory=list)
    # the heavy receiver and its device, once a scenario started one (heavy.bind_heavy):
    # --anatomy names its threads on the RT CPU
    heavy: HeavySide | None = None
    # called after the runner recreated the RT veth pair (a scenario re-applies its settings)
    rt_link_hooks: list[Callable[[], None]] = field(default_factory=list)
    _tcp: workloads.Flood | None = None
    _client_ends: steer.ClientEnds = field(default_factory=lambda: steer.ClientEnds(""))
    # SIGINT/SIGTERM while run() runs
    signals: Signals = field(default_factory=Signals)

    # -- the RT application's scheduling -------------------------------------------------
    def app_policy(self) -> str:
        """The RT application's scheduling class in this run (--app-policy, else the
        scenario's)."""
        assert self.scenario is not None
        return self.cfg.app_policy or self.scenario.app_policy

    def app_words(self) -> str:
        return f"SCHED_FIFO {self.app_fifo()}" if self.app_fifo() else "default policy"

    def app_fifo(self) -> int:
        """The app's SCHED_FIFO priority at home (0: the default policy)."""
        return self.cfg.rt_prio + 1 if self.app_policy() == "fifo" else 0


    # -- the testbed and the RT application ------------------------------------------------
    def _builders(self) -> dict[str, Callable[[Testbed, int], VethLink]]:
        """--nic-pair: the RT link is the two ports, not a veth pair."""
        pair = self.pair
        return {"rt": lambda tb, i: self._nic_link(tb, i, pair)} if pair else {}

    def _nic_link(self, tb: Testbed, i: int, pair: tuple[str, str]) -> VethLink:
        """Move the ports into the namespaces (journaled first, undone by the testbed), their
        interrupts onto the server's RT CPU and the tester's CPU, and check they talk."""
        assert self.placement is not None
        nics = nicpair.NicPair.record(pair)
        nics.journal_moves(tb.client, tb.server)

        def undo() -> None:
            try:
                nics.restore()
            except access.RestoreError as e:
                self.results.setdefault("restore_problems", []).extend(
                    f"--nic-pair: {x}" for x in e.errors)
        tb.defer(undo)
        link = VethLink(ns_a=tb.client, dev_a=pair[0], ip_a=f"198.18.{i}.1",
                        ns_b=tb.server, dev_b=pair[1], ip_b=f"198.18.{i}.2", kind="nic")
        nics.tester.move(tb.client, link.ip_a, link.prefixlen)
        nics.server.move(tb.server, link.ip_b, link.prefixlen)
        nics.server.pin_irqs(self.placement.cpu(placement_.RT))
        nics.tester.pin_irqs(self.placement.cpu(placement_.TESTER))
        try:
            nicpair.wait_reachable(tb.client, link.ip_b)
        except nicpair.NicPairError as e:
            raise Aborted(str(e)) from e
        self.results["nic_pair"] = {
            **nics.to_json(), "server_irqs_cpu": self.placement.cpu(placement_.RT),
            "tester_irqs_cpu": self.placement.cpu(placement_.TESTER)}
        return link

    def _start(self, tb: Testbed) -> None:
        """The RT application on the RT pair; every scenario has it."""
        assert self.placement is not None
        rt = tb.link("rt")
        self.results["testbed_devices"] = {name: asdict(tb.link(name)) for name in tb.link_names}
        self._client_ends = steer.ClientEnds(tb.client)
        tb.defer(self._client_ends.undo)
        for name in tb.link_names:
            self._client_end(name)
        self.server = workloads.SockperfServer(tb.server, rt.ip_b,
                                               self.placement.cpu(placement_.APP))
        self.server.start()
        self.server.place(AppPlace(self.placement.cpu(placement_.APP), self.app_fifo()))
        tb.defer(lambda: self.server.stop() if self.server else None)   # whichever runs then

    def client_end_cpu(self, link: str) -> int:
        """Where a pair's client end processes what it receives: the tester's CPU for the
        RT pair, else the flood sender's (the tester's if there is none); never the RT CPU."""
        assert self.placement is not None
        pl = self.placement
        cpu = pl.cpu(placement_.TESTER)
        if link != "rt" and placement_.FLOOD in pl.cpus:
            cpu = pl.cpu(placement_.FLOOD)
        if cpu == pl.cpu(placement_.RT):
            raise Aborted(f"the {link} pair's client end would be steered to the RT CPU {cpu}")
        return cpu

    def _client_end(self, name: str) -> None:
        """GRO off and RPS to client_end_cpu() on pair ``name``'s client end (also the
        tester's NIC port with --nic-pair, whose interrupts are on the tester's CPU already;
        put back before the port leaves the namespace: the testbed undoes in reverse)."""
        assert self.tb is not None
        link = self.tb.link(name)
        self._client_ends.apply(link.dev_a, self.client_end_cpu(name))
        self.results["client_ends"] = {
            "what": "GRO off (no veth NAPI: replies and ACKs go through __netif_rx(), stamped "
                    "when the server sends them) and RPS to the tester's / flood sender's CPU",
            "devices": self._client_ends.now()}

    def _use_app(self, name: str) -> None:
        """Run the RT application ``name`` (names.RT_APPS) in place of the one running now:
        same namespace, address, port and home CPU; the caller places it."""
        old = self.server
        assert old is not None
        if old.name == name:
            return
        if self.progress:         # not _note: this also runs while a Ctrl-C unwinds
            self.progress.note(f"RT application: {name} in place of {old.name}")
        old.stop()
        self.server = workloads.rt_app(name, old.ns, old.ip, old.cpu, old.port)
        self.server.start()

    def target(self) -> Target:
        """The device every mode serves: the server end of the RT pair, on the RT CPU."""
        assert self.tb is not None and self.placement is not None
        return Target(self.tb.server, self.tb.link("rt").dev_b,
                      self.placement.cpu(placement_.RT), self.cfg.rt_prio,
                      periodic=self.periodic_knobs())

    def server_port_irqs(self) -> tuple[int, ...] | None:
        """The interrupts of the RT server's NIC port as recorded when --nic-pair set it up
        (``results["nic_pair"]``); None over a veth pair, which has none."""
        assert self.tb is not None
        nic = self.results.get("nic_pair")
        if not nic:
            return None
        return tuple(nic["irqs"].get(self.tb.link("rt").dev_b, ()))

    def periodic_knobs(self) -> dict[str, Any]:
        """kbpctl's periodic knobs for the periodic modes: a fixed interval
        (--interval-us), else the search's round (--round-ms)."""
        cfg = self.cfg
        if cfg.periodic_interval_us is not None:
            return {"interval_us": cfg.periodic_interval_us}
        return {"round_ms": cfg.periodic_round_ms}

    @contextlib.contextmanager
    def mode_on(self, mode_name: str) -> Iterator[Mode]:
        """``mode_name`` on (with its quirks, as for every run of the runner's own), for a
        scenario's own measurements; off again afterwards, also on an exception."""
        mode = self.modes[mode_name]
        with self._mode(mode):
            yield mode

    # -- the TCP heavy sender ------------------------------------------------------------------
    def tcp_load(self) -> workloads.Flood:
        """The TCP heavy sender (started once, its server stopped with the testbed)."""
        if self._tcp is None:
            assert self.tb is not None and self.placement is not None
            link = self.tb.link(parts.TCP_LINK)
            self._tcp = workloads.Flood(
                self.tb.client, self.tb.server, link.ip_b, link.dev_b,
                sender_cpu=self.placement.cpu(placement_.FLOOD),
                receiver_cpu=self.placement.cpu(placement_.HEAVY),
                length=self.cfg.tcp_len, proto="tcp", port=workloads.IPERF_TCP_PORT)
            self._tcp.start_server()
            self.tb.defer(self._tcp.stop_server)
            self.tb.defer(self._tcp.stop)
        return self._tcp

    # -- helpers -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _mode(self, mode: Mode) -> Iterator[None]:
        """The mode on, with its quirks: a fresh RT device if it needs one, the application
        where the mode wants it; afterwards the mode off and the application home again."""
        assert self.server is not None and self.placement is not None
        if mode.needs_fresh_device(self.target()):
            self._fresh_rt_link()
        home = AppPlace(self.placement.cpu(placement_.APP), self.app_fifo())
        env = AppEnv(spin_app=self.cfg.spin_app,
                     elsewhere_cpu=self.placement.cpu(placement_.TESTER),
                     rt_prio=self.cfg.rt_prio)
        try:
            self._use_app(mode.app())
            self.server.place(mode.app_place(home, env))
            mode.setup(self.target())
            yield
        finally:
            with self.signals.held():
                try:
                    mode.teardown()
                except KnobError as e:
                    self.results.setdefault("restore_problems", []).append(
                        f"{mode.name}: {e}")
                    raise Aborted(f"mode {mode.name} could not put back what it changed: "
                                  f"{e}") from e
                finally:
                    self._use_app(names.APP_SOCKPERF)
                    self.server.place(home)
            if settles_after(mode) and self.cfg.settle_s > 0:
                time.sleep(self.cfg.settle_s)      # the moved load settles back first

    def _fresh_rt_link(self) -> None:
        """Kernels before ~6.15 keep a NAPI's kthread after threaded=0, and the module refuses
        a NAPI that has one (EBUSY): give the module modes a fresh RT device."""
        assert self.tb is not None and self.server is not None
        if self.tb.link("rt").kind != "veth":
            raise Aborted("the RT device's NAPI kept its kthread after threaded NAPI (kernels "
                          "before 6.15) and a NIC pair cannot be recreated: run the modes "
                          "that thread it ("
                          + ", ".join(modes_.named(lambda i: i.kthread))
                          + ") and the module modes in two invocations")
        self._note("recreating the RT veth pair (a NAPI kthread outlived threaded=0)")
        self.server.stop()
        self.tb.recreate_link(list(self.tb.link_names).index("rt"))
        self.server.start()
        self.server.place(AppPlace(self.server.cpu, self.app_fifo()))
        self._client_end("rt")
        for hook in self.rt_link_hooks:
            hook()
        self.results.setdefault("rt_link_recreated", 0)
        self.results["rt_link_recreated"] += 1

    def _wait_quiet(self, desc: str) -> float:
        """Wait (up to the budget left of --wait-quiet) while a QEMU process runs."""
        if self.cfg.wait_quiet_s <= 0:
            return 0.0
        waited = 0.0
        spent = self.results.get("waited_for_quiet_s", 0.0)
        while machine.qemu_running() and spent + waited < self.cfg.wait_quiet_s:
            self._note(f"{desc} · waiting for QEMU to finish ({waited:.0f} s)")
            time.sleep(2.0)
            waited += 2.0
        self.results["waited_for_quiet_s"] = spent + waited
        return waited

    def note(self, msg: str) -> None:
        """Say what starts now (and honour a pending Ctrl-C)."""
        self.signals.checkpoint()       # called as each run, trial and load starts
        if self.progress:
            self.progress.note(msg)

    _note = note

    def advance(self, planned_s: float, desc: str) -> None:
        """One unit of ``planned_s`` planned seconds is done (and honour a pending Ctrl-C)."""
        self.signals.checkpoint()
        if self.progress:
            self.progress.advance(planned_s, desc)

    _advance = advance

    def _mark_interrupted(self, exc_type: type[BaseException] | None, *_: Any) -> bool:
        """An exit callback: a Ctrl-C (or SIGTERM) is recorded in the results."""
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.results["interrupted"] = True
        return False


@contextlib.contextmanager
def open_testbed(links: tuple[str, ...],
             builders: dict[str, Callable[[Testbed, int], VethLink]] | None = None,
             ) -> Iterator[Testbed]:
    """The benchmark's testbed: namespaces kbpb-<tag>-c/s, one veth pair per name in
    ``links`` (devices <name>-c-<tag> / <name>-s-<tag>; the first is the RT pair), except the
    links ``builders`` make (--nic-pair)."""
    tb = Testbed(link_names=links, prefix="kbpb", builders=builders or {})
    try:
        tb.__enter__()
    except NetlinkError as e:
        if e.code == errno.EOPNOTSUPP:
            raise Aborted("cannot create veth pairs (Operation not supported): the veth "
                          "driver is not loaded; load it with 'modprobe veth'") from e
        raise
    try:
        yield tb
    finally:
        tb.__exit__(None, None, None)


def settles_after(mode: Any) -> bool:
    """Whether the next mode waits ``settle_s`` after ``mode``: it moved load (the exclusive
    CPU modes) or reconfigured the heavy device under the flood (the -part modes)."""
    return bool(mode.moves_load or getattr(mode, "reconfigures_heavy", False))
