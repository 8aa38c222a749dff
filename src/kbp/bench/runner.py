"""Plan and run a benchmark: one scenario (:mod:`kbp.bench.scenarios`), its modes
interleaved within each repetition, repeated.

The runner does what every scenario shares: it refuses bad input before anything changes
(unknown scenario, part or mode, a placement that cannot be made), places the roles on CPUs
(:mod:`kbp.bench.placement`), builds the testbed with the scenario's veth pairs named by role,
starts the RT application on the RT pair, and offers the scenario one latency run
(``latency_run``) and one RFC 2544 search (``rfc2544``) with every mode, each recording its
own CPU time, interrupts, softirqs, poller counters and kernel-side delays.  The scenario
decides which blocks run; the modes' order in each repetition is the runner's (``order``):
a seeded random permutation per repetition (``--seed``), recorded in ``results["mode_order"]``,
and after a mode that moves load (the exclusive CPU modes move the heavy receiver and its RPS
back on teardown) or reconfigures the heavy device under the flood (the -part modes: GRO,
RPS, threaded NAPI) the next one waits ``settle_s`` (``results["settle_after_move_s"]``).
A fresh ``--seed`` per invocation unless one is given (kbpctl bench prints it).

Every veth pair's client end (where the replies and the heavy receiver's ACKs arrive) has GRO
off and RPS to the tester's (RT pair) or the flood sender's CPU (:class:`kbp.bench.steer.
ClientEnds`, ``results["client_ends"]``), so no reply or ACK is processed on the RT CPU, and
each latency run of a scenario's ``rtt`` part with the RT CPU's receive counters is checked
(``rt_cpu_check``): packets processed there <= (heavy-device packets + RT requests) x 1.1 +
500, else the benchmark stops (Aborted).  Each run also records the tester's lateness
(``lateness_ns``: actual transmit - the schedule's intended time) and its tail statistics with
n, k-th largest and bootstrap CIs (``rtt_tail``); the samples pooled over repetitions have
theirs in ``results["tails"]``.

A mode owns its quirks (:mod:`kbp.bench.modes`): where the application runs while it is on
(``app_place``), which application that is (``app``: sockperf's server, or irq-suspend's
kbp-echo, swapped in at the same address and back after) and whether it needs a fresh RT
device (``needs_fresh_device``).  A mode that cannot put back what it changed stops the
benchmark (``restore_problems`` in the results).

Besides the scenario's parts the runner offers two of its own in every scenario
(:data:`kbp.bench.parts.COMMON`): ``idle`` (idle cost per mode, run first) and ``rtt-tcp``
(RT latency under a TCP heavy sender on a veth pair of its own, ``tcp``, run last).

``--nic-pair`` (:mod:`kbp.bench.nicpair`) replaces the RT veth pair by two NIC ports through
the testbed's ``builders``: checked before anything changes, journaled before they move, put
back by the testbed's undo (or by the next benchmark's ``recover`` after a SIGKILL).

Where the pieces are: this module plans (``BenchConfig``, ``Bench.plan``/``check``) and runs
(``Bench.run``: every restore on one exit stack); the run context Bench extends, with the
testbed, the RT application, the modes' lifecycle and the signals, is
:class:`kbp.bench.context.RunContext`; the measurements are :mod:`kbp.bench.measure`
(``latency``, ``throughput``, ``idle``), which ``latency_run``, ``rfc2544`` and ``idle_run``
call (docs/design.md section 10).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

from kbp import sysinfo
from kbp.bench import (
    anatomy,
    machine,
    nicpair,
    parts,
    rfc2544,
    scenarios,
    schema,
    tester,
    trace,
    workloads,
)
from kbp.bench import modes as modes_
from kbp.bench import placement as placement_
from kbp.bench.context import Aborted, RunContext, open_testbed
from kbp.bench.measure import idle, latency, throughput
from kbp.bench.modes import (
    SPIN_APP_CHOICES,
    all_modes,
    availability,
    periodic_problem,
)
from kbp.bench.placement import Placement, PlacementError
from kbp.bench.schema import (
    IdleRun,
    LatencyRun,
    PlacementDoc,
    Results,
    RunConfig,
    Samples,
    TailSummary,
    ThroughputRun,
)
from kbp.bench.stats import seeded_order, tail_summary

LABEL_HOST = "netns+veth on the host kernel (real timings)"
LABEL_EMULATED = "netns+veth in the VM rig guest: timings emulated (QEMU TCG), not real"
LABEL_NIC_HOST = "netns with the RT flow over a NIC pair ({pair}), real interrupts and timings"
LABEL_NIC_EMULATED = ("netns with the RT flow over a NIC pair ({pair}) in the VM rig guest: "
                      "real virtio interrupts, timings emulated (QEMU TCG), not real")


SCHEMA = schema.SCHEMA             # kbp.bench.schema owns the version
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)     # asm-generic value
# the modes that leave the RT device's NAPI a kthread (ModeInfo.kthread) and the module's
# (ModeInfo.module), which refuse such a NAPI on kernels before KTHREAD_KEPT_BEFORE (the runner
# recreates a veth pair; a NIC cannot be)
KTHREAD_KEPT_BEFORE = (6, 15, 0)


@dataclass
class BenchConfig:
    scenario: str = scenarios.DEFAULT
    # empty: the scenario's default modes (its ``default_modes``, else every mode), by plan()
    modes: list[str] = field(default_factory=list)
    reps: int = 5
    parts: list[str] | None = None  # None: every part the scenario has (rtt, table2, rfc2544)
    #                                 and the runner's (idle, rtt-tcp)
    loads: list[str] = field(default_factory=lambda: ["off", "on"])
    # RT request/response flow
    duration: float = 10.0
    warmup: float = 0.5
    rate: float = 2000.0            # mean requests/s
    frame: int = 64                 # Ethernet frame size of the RT requests
    poisson: bool = True            # random (exponential) inter-arrival times
    # random inter-arrival times uniform in [MIN_US, MAX_US] instead (--uniform; rt-split's
    # default is the paper's 1-10 ms); the mean rate then follows from the range
    uniform_us: list[float] | None = None
    # competing load: the flood's kind (--flood udp|tcp; None: the scenario's own, see
    # Scenario.flood), UDP payload and bitrate
    flood: str | None = None
    # where the heavy device's NAPI polls (--heavy-napi, shared-cpu: kbp.bench.heavy's
    # HEAVY_NAPI): "sender" (veth's way, no NAPI on the RT CPU) or "rt-cpu" (every mode)
    heavy_napi: str = "sender"
    flood_len: int = 64
    flood_bitrate: str = "0"
    tcp_len: int = 0                 # rtt-tcp: iperf3 TCP write size (0: iperf3's 128 KiB)
    # the stream scenario's bulk streams: seconds each stream runs before the measurement
    # (the periodic modes' interval search converges meanwhile), UDP payload bytes
    stream_warmup: float = 3.0
    udp_len: int = 1472              # a 1500-byte IP packet
    # the periodic modes (periodic, stock-periodic): the interval search's round (the bench's
    # default, 200 ms, lets its 11 rounds converge inside a 3 s warm-up; kbpctl's own
    # default is the paper's 1000 ms, which the stream scenario's full run uses), or a fixed
    # interval (None: searched)
    periodic_round_ms: int = 200
    periodic_interval_us: int | None = None
    # idle cost: seconds each mode stays on with no traffic
    idle_duration: float = 10.0
    # EE-KBP Table 2
    table2_scale: float = 0.02
    table2_duration: float = 5.0
    table2_reps: int | None = None  # None: same as reps
    # RFC 2544
    rfc_frames: list[int] = field(default_factory=lambda: [64])
    rfc_trial: float = 2.0
    rfc_resolution: float = 0.05
    rfc_reps: int = 3
    rfc_max_pps: float | None = None  # None: probe the tester's ceiling first
    rfc_loss_tolerance: float = 0.0
    # placement: {role: CPU} pins (kbp.bench.placement); the other roles are placed by rule
    cpus: dict[str, int] = field(default_factory=dict)
    # --nic-pair: the RT flow over these two ports (tester's, server's) instead of veth
    nic_pair: list[str] | None = None
    tester_prio: int = 50
    rt_prio: int = 50
    # the RT application's scheduling class: "fifo" = SCHED_FIFO rt_prio+1 (above the poller,
    # as the papers run RT threads), "other" = the default policy; None: the scenario's choice
    app_policy: str | None = None
    # a preset's time budget (demo: 5 min): repetitions shrink (not below 2) until the plan
    # for the modes this machine runs fits; None: no budget
    budget_s: float | None = None
    # busy (a poller that never sleeps): "fifo" = the app stays on its CPU at SCHED_FIFO
    # rt_prio+1, so a wake-up preempts the spinning poller; "elsewhere" = the app moves to the
    # tester's CPU; "same" = nothing changes (the app only runs in RT-throttling windows)
    spin_app: str = "fifo"
    trace: bool = True
    # every latency run cut into its kernel events, request by request (kbp.bench.anatomy)
    anatomy: bool = False
    wait_quiet_s: float = 0.0        # before each run, wait up to this long while QEMU runs
    # after a mode that moves load (the exclusive CPU modes: the heavy receiver and its RPS
    # back onto the RT CPU on teardown), seconds before the next mode starts
    settle_s: float = 1.0
    seed: int = 1                    # arrivals, the modes' order per repetition, bootstrap
    emulated: bool | None = None     # None: detect (QEMU guest)
    out: Path = Path("out/bench")
    command: str = ""
    deprecated: list[str] = field(default_factory=list)   # deprecated options used

    def to_json(self) -> RunConfig:
        d = asdict(self)
        d["out"] = str(self.out)
        # BenchConfig's fields are RunConfig's keys (tests/bench/test_schema.py holds them so)
        return cast(RunConfig, d)


APP_POLICIES = ("fifo", "other")


@dataclass
class Progress:
    """What the runner reports as it goes (the CLI draws it with rich): the planned total in
    seconds once known, then each finished unit's planned seconds."""

    set_total: Callable[[float], None] = lambda _s: None
    advance: Callable[[float, str], None] = lambda _s, _d: None
    note: Callable[[str], None] = lambda _m: None


@dataclass
class Bench(RunContext):
    """A benchmark: its plan (below), the run context it runs in (:class:`kbp.bench.context.
    RunContext`: testbed, RT application, modes on and off, signals) and the measurements it
    offers the scenarios (:mod:`kbp.bench.measure`)."""

    runnable: list[str] = field(default_factory=list)
    cpus_available: Callable[[], list[int]] = placement_.available_cpus

    # -- planning ------------------------------------------------------------------------
    def plan(self) -> Placement:
        """Everything decided from the configuration and the CPU layout alone (no root, no
        system change): the scenario, its parts, the modes, the placement.  Refuses bad
        input with the reason (Aborted)."""
        cfg = self.cfg
        try:
            self.scenario = scenarios.get(cfg.scenario)
        except scenarios.UnknownScenario as e:
            raise Aborted(str(e)) from e
        known = [*self.scenario.parts, *parts.COMMON]
        own = self.scenario.default_parts
        if cfg.parts is None and own is not None:
            cfg.parts = list(own)
        elif cfg.parts is None:     # rtt-tcp is a competing load: only when loads are on
            cfg.parts = [p for p in known if p != parts.RTT_TCP or "on" in cfg.loads]
        if not cfg.modes:
            cfg.modes = list(scenarios.default_modes(self.scenario))
        bad = [p for p in cfg.parts if p not in known]
        if bad:
            raise Aborted(f"unknown part {bad[0]!r} for scenario {self.scenario.name}: choose "
                          f"from {', '.join(known)}")
        if cfg.idle_duration <= 0:
            raise Aborted("--idle-duration must be positive")
        self._rename_old_modes(cfg)
        known_modes = self.scenario.mode_names()
        badm = [m for m in cfg.modes if m not in known_modes]
        if badm:
            raise Aborted(f"unknown mode {badm[0]!r} for scenario {self.scenario.name}: "
                          f"choose from {', '.join(known_modes)}")
        if modes_.BASELINE not in cfg.modes:
            raise Aborted(f"mode {modes_.BASELINE} is the baseline every ratio refers to: "
                          "keep it in --modes")
        if any(modes_.catalog()[m].periodic for m in cfg.modes):
            why = periodic_problem(self.periodic_knobs())
            if why:
                raise Aborted(f"the periodic modes' knobs: {why}")
        if cfg.spin_app not in SPIN_APP_CHOICES:
            raise Aborted(f"unknown --busy-app {cfg.spin_app!r}: use "
                          f"{', '.join(SPIN_APP_CHOICES)}")
        if cfg.reps < 1:
            raise Aborted("--reps must be at least 1")
        try:
            self.pair = nicpair.parse(",".join(cfg.nic_pair)) if cfg.nic_pair else None
        except nicpair.NicPairError as e:
            raise Aborted(str(e)) from e
        if cfg.app_policy is not None and cfg.app_policy not in APP_POLICIES:
            raise Aborted(f"unknown --app-policy {cfg.app_policy!r}: use "
                          f"{', '.join(APP_POLICIES)}")
        if cfg.uniform_us is not None:
            why = tester.uniform_problem(cfg.uniform_us)
            if why:
                raise Aborted(why)
        rfc2544.udp_payload(cfg.frame)
        for f in cfg.rfc_frames:
            rfc2544.udp_payload(f)
        self._check_flood(cfg)
        self.scenario.check(cfg)
        try:
            self.placement = placement_.plan(self.cpus_available(), cfg.cpus,
                                             self.roles(),
                                             on_rt=self.scenario.rt_roles)
        except PlacementError as e:
            raise Aborted(str(e)) from e
        return self.placement

    def check(self) -> None:
        """plan(), then what this machine must offer (root, tools)."""
        self.plan()
        assert self.scenario is not None
        if os.geteuid() != 0:
            raise Aborted("kbpctl bench builds network namespaces and changes kernel "
                          "settings: run it as root")
        tcp = ["iperf3"] if parts.RTT_TCP in (self.cfg.parts or []) else []
        workloads.require_tools(sorted({"ip", "ethtool", "taskset", "sockperf", *tcp,
                                        *self.scenario.tools(self.cfg)}))
        if self.pair:
            self._check_nic_pair(self.pair)
        if self.cfg.heavy_napi != "sender" and not self.scenario.heavy_napi_choices:
            raise Aborted(f"--heavy-napi {self.cfg.heavy_napi}: scenario "
                          f"{self.scenario.name} has no heavy device to poll elsewhere "
                          "(shared-cpu has)")

    def _check_nic_pair(self, pair: tuple[str, str]) -> None:
        """--nic-pair: two usable ports, and no mode mix a NIC cannot serve in one run."""
        try:
            nicpair.check(pair)
        except nicpair.NicPairError as e:
            raise Aborted(str(e)) from e
        workloads.require_tools(["ping"])
        kthread = [m for m in self.cfg.modes if modes_.catalog()[m].kthread]
        module = [m for m in self.cfg.modes if modes_.catalog()[m].module]
        if kthread and module and sysinfo.kernel_version() < KTHREAD_KEPT_BEFORE:
            raise Aborted(
                f"--nic-pair with {', '.join(kthread)} and {', '.join(module)} in one run: on "
                f"this kernel ({sysinfo.kernel_release()}, before "
                f"{'.'.join(map(str, KTHREAD_KEPT_BEFORE))}) a NAPI keeps its kthread once "
                "threaded NAPI was on, kbp.ko then refuses the device, and a NIC cannot be "
                "recreated as a veth pair is: run them in two invocations")

    def roles(self) -> tuple[str, ...]:
        """The scenario's roles, plus the flood sender and heavy receiver for rtt-tcp."""
        assert self.scenario is not None
        roles = tuple(self.scenario.roles(self.cfg))
        if parts.RTT_TCP in (self.cfg.parts or []):
            roles += tuple(r for r in (placement_.FLOOD, placement_.HEAVY) if r not in roles)
        return roles

    def links(self) -> tuple[str, ...]:
        """The scenario's veth pairs, plus ``tcp`` for rtt-tcp."""
        assert self.scenario is not None
        extra = (parts.TCP_LINK,) if parts.RTT_TCP in (self.cfg.parts or []) else ()
        return (*self.scenario.links, *extra)

    def _rename_old_modes(self, cfg: BenchConfig) -> None:
        """--modes with a mode's older name: today's name, and a note (cfg.deprecated)."""
        old = [m for m in cfg.modes if m in modes_.aliases()]
        if old:
            cfg.modes = [modes_.canonical(m) for m in cfg.modes]
            cfg.deprecated.append("--modes " + ", ".join(
                f"{m} (now {modes_.canonical(m)})" for m in old))

    def _check_flood(self, cfg: BenchConfig) -> None:
        """--flood: known, and only for a scenario with a flood of that kind to choose."""
        assert self.scenario is not None
        own = self.scenario.flood
        if cfg.flood is None:
            return
        if cfg.flood not in parts.FLOODS:
            raise Aborted(f"unknown --flood {cfg.flood!r}: use {', '.join(parts.FLOODS)}")
        if own is None:
            raise Aborted(f"--flood does not apply to {self.scenario.name}: its load is its "
                          "own (--flood chooses veth-inline's and shared-cpu's)")

    def flood_proto(self) -> str:
        """The flood this run uses: --flood, else the scenario's own default."""
        assert self.scenario is not None
        return self.cfg.flood or self.scenario.flood or "udp"

    def plan_seconds(self) -> float:
        """Planned duration of the whole benchmark (for the progress bar)."""
        assert self.scenario is not None
        n = max(len(self.runnable), 1)
        return (self.scenario.plan_seconds(self.cfg, n) + parts.common_seconds(self.cfg, n)
                + self.scenario.modes_overhead_s(self.cfg, list(self.runnable)))

    def _fit_budget(self) -> None:
        """Fewer repetitions until the plan fits cfg.budget_s (the modes that run are known
        only now), at least 2; recorded in results["budget"] and the config."""
        cfg = self.cfg
        if not cfg.budget_s:
            return
        asked = cfg.reps
        while cfg.reps > 2 and self.plan_seconds() > cfg.budget_s:
            cfg.reps -= 1
        self.results["budget"] = {"budget_s": cfg.budget_s, "reps_asked": asked,
                                  "reps": cfg.reps, "planned_s": self.plan_seconds(),
                                  "runnable_modes": len(self.runnable)}
        self.results["config"]["reps"] = cfg.reps

    def order(self, rep: int) -> list[str]:
        """The runnable modes in repetition ``rep``'s order: a random permutation seeded by
        --seed and the repetition (the same for every block of that repetition), recorded in
        results["mode_order"]."""
        order = seeded_order(self.runnable, self.cfg.seed, rep)
        self.results.setdefault("mode_order", {})[str(rep)] = order
        return order

    def _placement_json(self) -> PlacementDoc:
        assert self.placement is not None
        p, cfg = self.placement, self.cfg
        d = PlacementDoc(**p.to_json())
        d["app_policy"] = self.app_policy()
        d["app_fifo"] = self.app_fifo()
        d["runs"] = {
            **modes_.runs_doc(self.app_words(), cfg.spin_app),
            "tester": f"kbp-rtt (SCHED_FIFO {cfg.tester_prio})",
            "harness": "this program, bpftrace",
        }
        for role, what in (self.scenario.role_doc if self.scenario else {}).items():
            d["runs"][role] = f"{d['runs'][role]}; {what}" if role in d["runs"] else what
        return d

    def head(self, emulated: bool) -> Results:
        """The results document as it stands before the first run (kbp.bench.schema's
        Results): what was asked, the machine, the placement, no records yet."""
        assert self.scenario is not None
        cfg = self.cfg
        return Results(
            schema=SCHEMA,
            started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            command=cfg.command,
            config=cfg.to_json(),
            scenario={"name": self.scenario.name, "title": self.scenario.title,
                      "parts": list(cfg.parts or [])},
            testbed=self._label(emulated),
            emulated=emulated,
            machine=machine.describe(),
            tools=machine.tool_versions(),
            quiet_before=machine.quiet_report(),
            placement=self._placement_json(),
            modes={}, runs=[], rfc2544=[], idle=[], idle_skipped={},
            interrupted=False,
            mode_order_rule=f"seeded random permutation per repetition (--seed {cfg.seed})",
            mode_order={}, settle_after_move_s=cfg.settle_s, settle_after_part=True,
        )

    # -- the whole run -----------------------------------------------------------------------
    def run(self) -> Results:
        cfg = self.cfg
        self.check()
        assert self.scenario is not None and self.placement is not None
        pl = self.placement
        with contextlib.ExitStack() as stack:
            # every restore of the run on this one stack, undone in reverse order: the
            # testbed (and what its defer()s registered), then the run's results closed,
            # the timestamp socket, the harness's affinity, tracefs, the signal handlers
            stack.callback(setattr, self, "tb", None)
            stack.enter_context(self.signals.installed())
            old_aff = os.sched_getaffinity(0)
            emulated = machine.is_qemu_guest() if cfg.emulated is None else cfg.emulated
            self.results = self.head(emulated)
            # fresh adapters: every scenario's modes and the scenario's own (bound by its run)
            self.modes = {**all_modes(), **self.scenario.make_modes()}
            for m, why in availability(cfg.modes, self.modes).items():
                self.results["modes"][m] = {"status": "skipped", "reason": why} if why else \
                    {"status": "ok"}
                if not why:
                    self.runnable.append(m)
            if cfg.trace:
                self.trace_reason = trace.unavailable()
            else:
                self.trace_reason = "disabled (--no-trace)"
            self.results["kernel_trace"] = self.trace_reason or "bpftrace on tracepoints"
            self._fit_budget()
            if self.progress:
                self.progress.set_total(self.plan_seconds())
            self.binary = tester.build()
            tfs = self.tfs = trace.TraceFs()
            stack.callback(self._close_tracefs, tfs)
            stack.callback(_set_affinity, old_aff)
            stack.callback(timestamps_held().close)
            stack.callback(self._finish)
            stack.push(self._mark_interrupted)
            if not self.trace_reason:
                tfs.ensure()
            if cfg.anatomy:
                why = self.trace_reason or anatomy.unavailable(tfs.path)
                if why:
                    raise Aborted(f"--anatomy: {why}")
            os.sched_setaffinity(0, {pl.cpu(placement_.HARNESS)})
            recovered, kept = nicpair.recover()
            for line in recovered:
                self.note(line)
                self.results.setdefault("recovered", []).append(line)
            if kept:            # its ports may still be away: fix them, then run again
                raise Aborted("; ".join(kept))
            self.tb = tb = stack.enter_context(open_testbed(self.links(), self._builders()))
            self._start(tb)
            if parts.IDLE in (cfg.parts or []):
                parts.idle(self)
            self.scenario.run(self)
            if parts.RTT_TCP in (cfg.parts or []):
                for rep in range(cfg.reps):
                    parts.tcp_block(self, rep)
            self.signals.checkpoint()
        return self.results

    def _finish(self) -> None:
        """The results' tail: pooled tails, the finishing time, how quiet the machine was."""
        self.results["tails"] = pooled_tails(self.results["runs"], self.samples, self.cfg.seed)
        self.results["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.results["quiet_after"] = machine.quiet_report()

    def _close_tracefs(self, tfs: trace.TraceFs) -> None:
        """Wait for bpftrace to exit, then unmount what we mounted (a failure is a restore
        problem in the results)."""
        try:
            tfs.close()
        except trace.TraceFsError as e:
            self.results.setdefault("restore_problems", []).append(str(e))

    def _label(self, emulated: bool) -> str:
        if self.pair:
            return (LABEL_NIC_EMULATED if emulated else LABEL_NIC_HOST).format(
                pair=",".join(self.pair))
        return LABEL_EMULATED if emulated else LABEL_HOST

    # -- the measurements (kbp.bench.measure: one module each) -----------------------------
    def latency_run(self, mode_name: str, rep: int, *, part: str, condition: str, size: int,
                    rate: float, poisson: bool, duration: float,
                    uniform_us: list[float] | None = None) -> LatencyRun:
        """One RT latency run of ``mode_name`` (:func:`kbp.bench.measure.latency.
        latency_run`): the record, also appended to results."""
        return latency.latency_run(self, mode_name, rep, part=part, condition=condition,
                                   size=size, rate=rate, poisson=poisson, duration=duration,
                                   uniform_us=uniform_us)

    def rfc2544(self, mode_name: str, rep: int, frame: int) -> ThroughputRun:
        """One RFC 2544 zero-loss search of ``mode_name`` (:func:`kbp.bench.measure.
        throughput.search`): the record, also in results."""
        return throughput.search(self, mode_name, rep, frame)

    def idle_run(self, mode_name: str) -> IdleRun:
        """``mode_name`` on, no traffic (:func:`kbp.bench.measure.idle.idle_run`)."""
        return idle.idle_run(self, mode_name)

    def latency_plan(self, duration: float) -> float:
        return parts.latency_seconds(self.cfg, duration)

    def rfc_plan(self) -> float:
        return parts.rfc_seconds(self.cfg)


def _set_affinity(cpus: set[int]) -> None:
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpus)


def timestamps_held() -> socket.socket:
    """A socket that asks for receive timestamps for the whole benchmark, so the kernel's
    ``netstamp_needed_key`` stays on instead of flipping each time a tester (SO_TIMESTAMPING)
    starts and ends.  Each flip rewrites the receive path's code (a static branch in
    ``__netif_receive_skb_core``, text_poke_bp) while packets flow: a perturbation of the
    runs on any machine, and under QEMU TCG with 4 vCPUs a guest crash (stale int3 in
    ``__netif_receive_skb_core``, twice in a row on 7.2 with ``--smp 4``)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return s


def pooled_tails(runs: list[LatencyRun], samples: Samples, seed: int,
                 ) -> dict[str, TailSummary]:
    """Tail statistics (n, k-th largest, bootstrap CIs, losses as infinite) of every
    part|condition|mode's kernel round trips pooled over its repetitions."""
    lost: dict[str, int] = {}
    reps: dict[str, int] = {}
    sizes: dict[str, list[int]] = {}
    for r in runs:
        key = schema.sample_key(str(r.get("part")), str(r.get("condition")), str(r.get("mode")))
        lost[key] = lost.get(key, 0) + int(r.get("lost") or 0)
        reps[key] = reps.get(key, 0) + 1
        # the samples of a key are its runs' in run order (measure.latency): the block
        # bootstrap resamples within each run
        sizes.setdefault(key, []).append(int((r.get("rtt_ns") or {}).get("n") or 0))
    return {key: {**tail_summary(xs, lost=lost.get(key, 0), seed=seed, sizes=sizes.get(key)),
                  "runs": reps.get(key)}
            for key, xs in samples.items()}


def write_outputs(results: Results, samples: Samples, out: Path) -> dict[str, Path]:
    """results.json (everything but raw samples) and samples.json.gz (kernel RTTs, ns)."""
    out.mkdir(parents=True, exist_ok=True)
    return {"json": schema.dump(results, out / schema.RESULTS_FILE),
            "samples": schema.dump_samples(samples, out / schema.SAMPLES_FILE)}


def default_out_dir() -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("out") / f"bench-{stamp}"


def main_guard(fn: Callable[[], int]) -> int:
    try:
        return fn()
    except Aborted as e:
        print(f"kbpctl bench: {e}", file=sys.stderr)
        return 2
