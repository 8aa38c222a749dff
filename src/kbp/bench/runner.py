"""Plan and run a benchmark: modes interleaved within each repetition, repeated.

Order (rep = 1..N): for each load condition (alternating which comes first), for each mode
(rotated by one position every repetition, so no mode always runs first or right after the
flood starts): one RT latency run.  Then, in the same repetition, the Table 2 conditions and
the RFC 2544 search, again with the modes rotated.  Every run records its own CPU time,
interrupts, softirqs, poller counters and kernel-side delays.

Placement (docs/results.md explains it): the RT CPU runs the RT application (sockperf
server) and, in the kbp modes, the RT device's receive poller; the load CPU runs the tester
(SCHED_FIFO), the competing flood (iperf3 client and server), bpftrace and this program.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from kbp import names
from kbp.bench import machine, rfc2544, sysstat, tester, trace, workloads
from kbp.bench.modes import Mode, Target, all_modes, napi_kthreads
from kbp.bench.stats import summarize
from kbp.testbed import Testbed

LABEL_HOST = "netns+veth on the host kernel (real timings)"
LABEL_EMULATED = "netns+veth in the VM rig guest: timings emulated (QEMU TCG), not real"


@dataclass
class BenchConfig:
    modes: list[str] = field(default_factory=lambda: list(names.BENCH_MODES))
    reps: int = 5
    scenarios: list[str] = field(default_factory=lambda: ["rtt", "table2", "rfc2544"])
    loads: list[str] = field(default_factory=lambda: ["off", "on"])
    # RT request/response flow
    duration: float = 10.0
    warmup: float = 0.5
    rate: float = 2000.0            # mean requests/s
    frame: int = 64                 # Ethernet frame size of the RT requests
    poisson: bool = True            # random (exponential) inter-arrival times
    # competing load
    flood_len: int = 64
    flood_bitrate: str = "0"
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
    # placement
    rt_cpu: int = 1
    load_cpu: int = 0
    tester_prio: int = 50
    rt_prio: int = 50
    # busy (a poller that never sleeps): "fifo" = the app stays on the RT CPU at SCHED_FIFO
    # rt_prio+1, so a wake-up preempts the spinning poller; "elsewhere" = the app moves to the
    # load CPU; "same" = nothing changes (the app only runs in RT-throttling windows)
    spin_app: str = "fifo"
    trace: bool = True
    wait_quiet_s: float = 0.0        # before each run, wait up to this long while QEMU runs
    seed: int = 1
    emulated: bool | None = None     # None: detect (QEMU guest)
    out: Path = Path("out/bench")
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["out"] = str(self.out)
        return d


class Aborted(Exception):
    pass


_MAIN_PID = [0]
_INTERRUPTED = [False]


def _interrupt(sig: int, _frm: Any) -> None:
    """SIGINT or SIGTERM in the benchmark process: unwind like Ctrl-C, so everything is
    restored.  Python drops an exception raised while it runs an at-fork callback (pyroute2
    forks to enter namespaces; logging registers one: "Exception ignored in _releaseLock"),
    and the benchmark then ran to its end: the flag makes the next checkpoint raise it again.
    A forked helper inherits this handler: it must just die, never run the cleanup."""
    if os.getpid() != _MAIN_PID[0]:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return
    _INTERRUPTED[0] = True
    raise KeyboardInterrupt


def _checkpoint() -> None:
    """Raise the interrupt again if its first KeyboardInterrupt was swallowed."""
    if _INTERRUPTED[0]:
        raise KeyboardInterrupt


@dataclass
class Progress:
    """What the runner reports as it goes (the CLI draws it with rich): the planned total in
    seconds once known, then each finished unit's planned seconds."""

    set_total: Callable[[float], None] = lambda _s: None
    advance: Callable[[float, str], None] = lambda _s, _d: None
    note: Callable[[str], None] = lambda _m: None


@dataclass
class Bench:
    cfg: BenchConfig
    progress: Progress | None = None
    results: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, list[int]] = field(default_factory=dict)
    modes: dict[str, Mode] = field(default_factory=dict)
    runnable: list[str] = field(default_factory=list)
    binary: Path | None = None
    tb: Testbed | None = None
    server: workloads.SockperfServer | None = None
    flood: workloads.Flood | None = None
    trace_reason: str | None = None
    tfs: trace.TraceFs = field(default_factory=trace.TraceFs)

    # -- planning ------------------------------------------------------------------------
    def check(self) -> None:
        cfg = self.cfg
        if os.geteuid() != 0:
            raise Aborted("kbpctl bench builds network namespaces and changes kernel "
                          "settings: run it as root")
        bad = [m for m in cfg.modes if m not in names.BENCH_MODES]
        if bad:
            raise Aborted(f"unknown mode {bad[0]!r}: choose from {', '.join(names.BENCH_MODES)}")
        if "napi" not in cfg.modes:
            raise Aborted("mode napi is the baseline every ratio refers to: keep it in --modes")
        online = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        for c in (cfg.rt_cpu, cfg.load_cpu):
            if c not in online:
                raise Aborted(f"CPU {c} is not available here (online/allowed: {online}); "
                              "choose --rt-cpu and --load-cpu among them")
        if cfg.rt_cpu == cfg.load_cpu:
            raise Aborted("--rt-cpu and --load-cpu must differ: the RT receive path gets a "
                          "CPU of its own (KBP Sect. 4.1)")
        tools = ["ip", "ethtool", "taskset", "sockperf"]
        if "on" in cfg.loads and "rtt" in cfg.scenarios:
            tools.append("iperf3")
        workloads.require_tools(tools)
        if cfg.reps < 1:
            raise Aborted("--reps must be at least 1")
        rfc2544.udp_payload(cfg.frame)
        for f in cfg.rfc_frames:
            rfc2544.udp_payload(f)

    def plan_seconds(self) -> float:
        """Planned duration of the whole benchmark (for the progress bar)."""
        cfg = self.cfg
        n = max(len(self.runnable), 1)
        s = 0.0
        if "rtt" in cfg.scenarios:
            s += cfg.reps * len(cfg.loads) * n * self._latency_plan(cfg.duration)
        if "table2" in cfg.scenarios:
            s += (cfg.table2_reps or cfg.reps) * 6 * n * self._latency_plan(cfg.table2_duration)
        if "rfc2544" in cfg.scenarios:
            s += min(cfg.rfc_reps, cfg.reps) * len(cfg.rfc_frames) * n * self._rfc_plan()
        return s

    # -- the whole run -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.check()
        _MAIN_PID[0] = os.getpid()
        _INTERRUPTED[0] = False
        old_term = signal.signal(signal.SIGTERM, _interrupt)
        old_int = signal.getsignal(signal.SIGINT)
        if old_int is signal.default_int_handler:       # not when SIGINT is ignored
            signal.signal(signal.SIGINT, _interrupt)
        old_aff = os.sched_getaffinity(0)
        emulated = machine.is_qemu_guest() if cfg.emulated is None else cfg.emulated
        self.results = {
            "schema": "kbp-bench/1",
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": cfg.command,
            "config": cfg.to_json(),
            "testbed": LABEL_EMULATED if emulated else LABEL_HOST,
            "emulated": emulated,
            "machine": machine.describe(),
            "tools": machine.tool_versions(),
            "quiet_before": machine.quiet_report(),
            "placement": {
                "rt_cpu": cfg.rt_cpu, "load_cpu": cfg.load_cpu,
                "rt_cpu_runs": "sockperf server (RT app); the RT device's poller in "
                               "threaded/stock-kbp/busy/hybrid (busy: the poller alone, the "
                               f"app placement: {cfg.spin_app})",
                "load_cpu_runs": "tester kbp-rtt (SCHED_FIFO "
                                 f"{cfg.tester_prio}), iperf3 flood client+server, bpftrace, "
                                 "the benchmark itself; in napi mode also the RT device's "
                                 "NAPI (veth polls on the transmitting CPU)",
            },
            "modes": {}, "runs": [], "rfc2544": [], "interrupted": False,
        }
        self.modes = all_modes()
        for m in cfg.modes:
            why = self.modes[m].unavailable()
            self.results["modes"][m] = {"status": "skipped", "reason": why} if why else \
                {"status": "ok"}
            if not why:
                self.runnable.append(m)
        if cfg.trace:
            self.trace_reason = trace.unavailable()
        else:
            self.trace_reason = "disabled (--no-trace)"
        self.results["kernel_trace"] = self.trace_reason or "bpftrace on tracepoints"
        if self.progress:
            self.progress.set_total(self.plan_seconds())
        self.binary = tester.build()
        tfs = self.tfs = trace.TraceFs()
        try:
            if not self.trace_reason:
                tfs.ensure()
            os.sched_setaffinity(0, {cfg.load_cpu})
            with _testbed() as tb:
                self.tb = tb
                self._run_all(tb)
                _checkpoint()
        except KeyboardInterrupt:
            self.results["interrupted"] = True
            raise
        finally:
            self.results["finished"] = dt.datetime.now(dt.UTC).isoformat(
                timespec="seconds")
            self.results["quiet_after"] = machine.quiet_report()
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, old_aff)
            try:
                tfs.close()       # waits for bpftrace to exit, then unmounts what we mounted
            except trace.TraceFsError as e:
                self.results.setdefault("restore_problems", []).append(str(e))
            signal.signal(signal.SIGTERM, old_term)
            if old_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, old_int)
            self.tb = None
        return self.results

    def _run_all(self, tb: Testbed) -> None:
        cfg = self.cfg
        rt, fl = tb.links[0], tb.links[1]
        self.results["testbed_devices"] = {"rt": asdict(rt), "flood": asdict(fl)}
        self.server = workloads.SockperfServer(tb.server, rt.ip_b, cfg.rt_cpu)
        self.server.start()
        tb.defer(self.server.stop)
        if "on" in cfg.loads and "rtt" in cfg.scenarios:
            self.flood = workloads.Flood(tb.client, tb.server, fl.ip_b, fl.dev_b, cfg.load_cpu,
                                         length=cfg.flood_len, bitrate=cfg.flood_bitrate)
            self.flood.start_server()
            tb.defer(self.flood.stop_server)
            tb.defer(self.flood.stop)
        target = Target(tb.server, rt.dev_b, cfg.rt_cpu, cfg.rt_prio)
        for rep in range(cfg.reps):
            order = _rotate(self.runnable, rep)
            if "rtt" in cfg.scenarios:
                loads = cfg.loads if rep % 2 == 0 else list(reversed(cfg.loads))
                for load in loads:
                    flood_stats: dict[str, Any] = {}
                    if load == "on":
                        assert self.flood is not None
                        self._note(f"rep {rep + 1}: starting the competing flood")
                        self.flood.start()
                    block: list[dict[str, Any]] = []
                    try:
                        for m in order:
                            block.append(self._latency_run(
                                m, target, rep, scenario="rtt", condition=f"load-{load}",
                                size=rfc2544.udp_payload(cfg.frame), rate=cfg.rate,
                                poisson=cfg.poisson, duration=cfg.duration))
                    finally:
                        if load == "on" and self.flood is not None:
                            flood_stats = self.flood.stop()
                    for r in block:
                        r["flood_block"] = flood_stats
            if "table2" in cfg.scenarios and rep < (cfg.table2_reps or cfg.reps):
                for cond in workloads.table2(cfg.table2_scale):
                    for m in order:
                        r = self._latency_run(
                            m, target, rep, scenario="table2", condition=cond.label,
                            size=rfc2544.udp_payload(cond.frame), rate=cond.pps, poisson=False,
                            duration=cfg.table2_duration)
                        r["table2"] = cond.to_json()
            if "rfc2544" in cfg.scenarios and rep < cfg.rfc_reps:
                for frame in cfg.rfc_frames:
                    for m in order:
                        self._rfc2544(m, target, rep, frame)

    # -- one latency run -------------------------------------------------------------------
    def _latency_run(self, mode_name: str, target: Target, rep: int, *, scenario: str,
                     condition: str, size: int, rate: float, poisson: bool,
                     duration: float) -> dict[str, Any]:
        cfg = self.cfg
        assert self.tb is not None and self.binary is not None and self.server is not None
        mode = self.modes[mode_name]
        desc = f"rep {rep + 1}/{cfg.reps} · {scenario} {condition} · {mode_name}"
        self._note(desc)
        rec: dict[str, Any] = {"rep": rep, "mode": mode_name, "scenario": scenario,
                               "condition": condition, "rate": rate, "poisson": poisson,
                               "payload": size, "duration": duration}
        rec["waited_for_quiet_s"] = self._wait_quiet(desc)
        rec["quiet"] = machine.quiet_report()
        t_start = time.monotonic()
        kt: trace.KernelTrace | None = None
        with self._mode(mode, target):
            threads = mode.threads()
            app = self.server.pids()
            rec["mode_setup"] = mode.describe()
            rec["app_cpu"] = self.server.cpu_now
            rec["app_fifo"] = self.server.fifo_now
            if not self.trace_reason:
                kt = self.tfs.track(trace.KernelTrace(poller_pids=list(threads),
                                                      app_pids=app, cpu=cfg.load_cpu))
                try:
                    kt.start()
                except RuntimeError as e:
                    rec["kernel_delay_error"] = str(e)
                    kt = None
            try:
                c0 = mode.counters()
                s0 = sysstat.Snapshot.take(list(threads) + app)
                res = tester.run_rtt(self.binary, self.tb.client, target_ip(self.tb), port=
                                     workloads.SOCKPERF_PORT, size=size, rate=rate,
                                     poisson=poisson, duration=duration, warmup=cfg.warmup,
                                     cpu=cfg.load_cpu, fifo=cfg.tester_prio,
                                     seed=cfg.seed * 1000 + rep)
                s1 = sysstat.Snapshot.take(list(threads) + app)
                c1 = mode.counters()
            finally:
                kd = kt.stop() if kt is not None else {}
        names_ = {**threads, **{p: "sockperf" for p in app}}
        rec["tester"] = res.summary
        rec["rtt_ns"] = summarize(res.kernel_ns)
        rec["rtt_user_ns"] = summarize(res.user_ns)
        rec["lost"] = res.lost
        rec["sys"] = sysstat.delta(s0, s1, names_)
        rec["poller"] = {k: (c1[k] - (c0.get(k) or 0)) for k in c1 if c1[k] is not None}
        if kt is not None:
            napi_id, xs, other = trace.rt_napi(kd)
            rec["kernel_delay"] = {
                "xmit_to_poll": xs, "xmit_to_poll_napi_id": napi_id,
                "xmit_to_poll_other": other,
                "netrx_raise_to_entry": {k: _nobuckets(v) for k, v in
                                         (kd.get("netrx_raise_to_entry") or {}).items()},
                "poller_wake_to_run": trace.merged(kd, "poller_wake_to_run"),
                "app_wake_to_run": trace.merged(kd, "app_wake_to_run"),
            }
        else:
            rec["kernel_delay"] = None
            rec["kernel_delay_skipped"] = self.trace_reason or rec.get("kernel_delay_error")
        key = f"{scenario}|{condition}|{mode_name}"
        self.samples.setdefault(key, []).extend(res.kernel_ns)
        self.results["runs"].append(rec)
        rec["took_s"] = time.monotonic() - t_start
        self._advance(self._latency_plan(duration), desc)
        return rec

    # -- one RFC 2544 search -----------------------------------------------------------------
    def _rfc2544(self, mode_name: str, target: Target, rep: int, frame: int) -> None:
        cfg = self.cfg
        assert self.tb is not None and self.binary is not None
        mode = self.modes[mode_name]
        size = rfc2544.udp_payload(frame)
        desc = f"rep {rep + 1}/{cfg.reps} · rfc2544 {frame}B · {mode_name}"
        self._note(desc)
        waited = self._wait_quiet(desc)
        quiet = machine.quiet_report()
        t_start = time.monotonic()
        ip = target_ip(self.tb)

        def trial(rate: float) -> rfc2544.Trial:
            self._note(f"{desc} · trial {rate:,.0f} pps")
            d0 = _drops(self.tb, target)
            r = tester.run_rate(self.binary, self.tb.client if self.tb else None, ip,
                                port=workloads.SOCKPERF_PORT, size=size, rate=rate,
                                duration=cfg.rfc_trial, cpu=cfg.load_cpu, fifo=cfg.tester_prio)
            d1 = _drops(self.tb, target)
            return rfc2544.Trial(rate=rate, sent=int(r["sent"]), received=int(r["received"]),
                                 achieved_rate=float(r["achieved_pps"]),
                                 duration_s=float(r["elapsed_s"]),
                                 extra={"drops": {k: d1[k] - d0.get(k, 0) for k in d1}})

        with self._mode(mode, target):
            s0 = sysstat.Snapshot.take()
            hi = cfg.rfc_max_pps
            probe = None
            if hi is None:
                probe = trial(5_000_000.0)
                hi = max(1000.0, round(probe.achieved_rate * 0.98, -2))
            res = rfc2544.search(trial, hi=hi, resolution=cfg.rfc_resolution,
                                 loss_tolerance=cfg.rfc_loss_tolerance)
            s1 = sysstat.Snapshot.take()
        out = {"rep": rep, "mode": mode_name, "frame": frame, "payload": size,
               "throughput_pps": res.throughput,
               "throughput_mbps": rfc2544.frame_mbps(res.throughput, frame),
               "bound": res.bound, "hi": hi, "resolution": cfg.rfc_resolution,
               "trial_s": cfg.rfc_trial,
               "ceiling_probe": None if probe is None else
               {"asked": probe.rate, "achieved_pps": probe.achieved_rate, "sent": probe.sent,
                "received": probe.received},
               "trials": res.trials, "sys": sysstat.delta(s0, s1),
               "waited_for_quiet_s": waited, "quiet": quiet}
        self.results["rfc2544"].append(out)
        out["took_s"] = time.monotonic() - t_start
        self._advance(self._rfc_plan(), desc)

    # -- helpers -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _mode(self, mode: Mode, target: Target) -> Iterator[None]:
        if getattr(mode, "backend", None) == names.BACKEND_KMOD and napi_kthreads(target.dev):
            self._fresh_rt_link()
        spin = mode.spins and self.server is not None
        try:
            if spin and self.cfg.spin_app == "elsewhere":
                self.server.move(self.cfg.load_cpu)
            elif spin and self.cfg.spin_app == "fifo":
                self.server.set_fifo(self.cfg.rt_prio + 1)
            mode.setup(target)
            yield
        finally:
            try:
                mode.teardown()
            finally:
                if self.server is not None:
                    if self.server.cpu_now != self.cfg.rt_cpu:
                        self.server.move(self.cfg.rt_cpu)
                    if self.server.fifo_now:
                        self.server.set_fifo(0)

    def _fresh_rt_link(self) -> None:
        """Kernels before ~6.15 keep a NAPI's kthread after threaded=0, and the module refuses
        a NAPI that has one (EBUSY): give the module modes a fresh RT device."""
        assert self.tb is not None and self.server is not None
        self._note("recreating the RT veth pair (a NAPI kthread outlived threaded=0)")
        self.server.stop()
        self.tb.recreate_link(0)
        self.server.start()
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

    def _note(self, msg: str) -> None:
        _checkpoint()                   # called as each run, trial and flood starts
        if self.progress:
            self.progress.note(msg)

    def _advance(self, planned_s: float, desc: str) -> None:
        _checkpoint()
        if self.progress:
            self.progress.advance(planned_s, desc)

    def _latency_plan(self, duration: float) -> float:
        return duration + self.cfg.warmup + 1.6

    def _rfc_plan(self) -> float:
        cfg = self.cfg
        # ceiling probe + ceiling + ~4 halvings (the RT path carries far less than the
        # sender can offer) + refinements down to the resolution
        trials = 6 + max(1, math.ceil(-math.log2(cfg.rfc_resolution)))
        return trials * (cfg.rfc_trial + 0.8)


@contextlib.contextmanager
def _testbed() -> Iterator[Testbed]:
    """The benchmark's testbed: RT pair (0) and flood pair (1), namespaces kbpb-<tag>-c/s."""
    tb = Testbed(links_wanted=2, prefix="kbpb")
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


def target_ip(tb: Testbed) -> str:
    return tb.links[0].ip_b


def _drops(tb: Testbed | None, target: Target) -> dict[str, int]:
    """Where packets were dropped: UDP socket buffers in both namespaces, veth counters."""
    if tb is None:
        return {}
    out: dict[str, int] = {}
    for ns, tag in ((tb.server, "server"), (tb.client, "client")):
        snmp = tb.run(ns, ["cat", "/proc/net/snmp"], check=False).stdout.splitlines()
        udp = [line.split()[1:] for line in snmp if line.startswith("Udp:")]
        if len(udp) == 2:
            row = dict(zip(udp[0], (int(x) for x in udp[1]), strict=False))
            out[f"{tag}_udp_rcvbuf_errors"] = row.get("RcvbufErrors", 0)
            out[f"{tag}_udp_sndbuf_errors"] = row.get("SndbufErrors", 0)
            out[f"{tag}_udp_in_errors"] = row.get("InErrors", 0)
    link = tb.links[0]
    for ns, dev, tag in ((link.ns_a, link.dev_a, "client_dev"),
                         (link.ns_b, link.dev_b, "server_dev")):
        for stat in ("rx_dropped", "tx_dropped"):
            p = tb.run(ns, ["cat", f"/sys/class/net/{dev}/statistics/{stat}"], check=False)
            with contextlib.suppress(ValueError):
                out[f"{tag}_{stat}"] = int(p.stdout.strip())
    return out


def _nobuckets(s: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in s.items() if k != "buckets"}


def _rotate(xs: list[str], k: int) -> list[str]:
    if not xs:
        return []
    k %= len(xs)
    return xs[k:] + xs[:k]


def write_outputs(results: dict[str, Any], samples: dict[str, list[int]], out: Path,
                  ) -> dict[str, Path]:
    """results.json (everything but raw samples) and samples.json.gz (kernel RTTs, ns)."""
    import gzip
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "samples": out / "samples.json.gz"}
    paths["json"].write_text(json.dumps(results, indent=1, default=str) + "\n")
    with gzip.open(paths["samples"], "wt") as f:
        json.dump(samples, f)
    return paths


def default_out_dir() -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("out") / f"bench-{stamp}"


def main_guard(fn: Callable[[], int]) -> int:
    try:
        return fn()
    except Aborted as e:
        print(f"kbpctl bench: {e}", file=sys.stderr)
        return 2
