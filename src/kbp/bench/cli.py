"""``kbpctl bench`` and ``python -m kbp.bench``: run the comparison, print the table, write
results.json, samples.json.gz, results.md and the PNG plots.

Scenarios (``--scenario``; the first is the default):

{scenarios}

Modes (``--modes``; default: the scenario's, below); {baseline} is the baseline every ratio
refers to; a mode this kernel cannot run is skipped with the reason; the modes marked with
scenarios run only there (they move or split a heavy receiver's flow):

{modes}

Default modes by scenario:

{defaults}

Parts of every scenario besides its own: ``idle`` (idle cost: each mode on with no traffic
for ``--idle-duration`` s, CPU time per poller thread) and ``rtt-tcp`` (RT latency under an
iperf3 TCP heavy sender, condition load-tcp).

Presets (explicit options override them; demo runs the shared-cpu scenario, and fewer
repetitions (not below 2) when the modes this machine runs would not fit in 6 minutes):

=========  =====================================================================================
full       every mode and part, 5 repetitions of 10 s runs, load off/on and TCP, Table 2 (5 s
           runs), RFC 2544 at 64/512/1518 B (3 searches per mode), idle cost 10 s per mode;
           about 57 minutes with the five modes a host without kbp.ko ran before irq-suspend
           (a sixth, on 6.13+)
demo       the scenario's default modes (unrunnable ones are reported as skipped), 5
           repetitions of 3 s runs, load off/on (shared-cpu: idle, and the TCP heavy
           sender as the flood), no RFC 2544; about 6 minutes (``make demo``)
smoke      {smoke}, 1 repetition of 1 s runs, coarse RFC 2544: a functional check
=========  =====================================================================================

A scenario may say what a preset means for it (stream: the full run searches in kbpctl's
1000 ms rounds with a 12 s warm-up; --smoke = both streams, 1 s warm-up, 1 s runs; --demo =
3 s warm-up, 4 s runs).

Periodic modes ({periodic}; NetAP): ``--round-ms`` is the interval search's
round (default 200 ms here, so its 11 rounds converge inside a 3 s warm-up; the stream
scenario's full run uses kbpctl's default, the paper's 1000 ms),
``--interval-us`` fixes the interval instead (no search).

CPUs by role (``--cpus ROLE=CPU,...``; roles tester, rt, flood, heavy, app, harness): on 4 or
more usable CPUs every role gets its own; on 3 the tester and the flood sender share one; on 2
tester, flood sender and heavy receiver share one and the RT CPU is the other.  The RT CPU is
never shared (except with the RT app, there by default).  See kbp.bench.placement.

NIC pair (``--nic-pair DEV_A,DEV_B``): the RT flow crosses two NIC ports cabled to each other
instead of a veth pair, so every mode meets real interrupts: DEV_A (the tester's port) and
DEV_B (the server's, the one each mode serves) are moved into the benchmark's namespaces, the
server port's interrupts affined to the RT CPU and the tester port's to the tester's CPU; the
flood keeps its veth pair.  Both ports are put back afterwards (name, addresses, MTU, state,
IRQ affinity), from a journal if the benchmark was killed.  In the VM rig:
``kbpctl bench vm --nic-pair --scenario shared-cpu ...`` uses its two virtio NICs.

The VM rig (``kbpctl bench vm [--flavour KERNEL] --scenario NAME ...``, from a checkout): a
scenario above inside a QEMU guest with kbp.ko loaded (the module's modes; timings
emulated), or one of the rig's experiments by name (class-split, inversion, freq,
outsource-rtt, outsource-scale); ``kbpctl bench vm --help`` lists them.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kbp.bench import (
    modes,
    parts,
    placement,
    plots,
    report,
    runner,
    scenarios,
    schema,
    tester,
    workloads,
)
from kbp.bench.runner import Aborted, Bench, BenchConfig, Progress
from kbp.bench.testbed import remove_stale, stale_namespaces

PRESETS: dict[str, dict[str, Any]] = {
    "full": {},
    "demo": {"scenario": "shared-cpu", "budget_s": 350.0,
             "reps": 5, "duration": 3.0, "parts": ["rtt"]},
    "smoke": {"modes": [modes.NAPI, modes.STOCK_HYBRID], "reps": 1, "duration": 1.0, "warmup": 0.2,
              "parts": ["rtt", "rfc2544"], "rfc_frames": [64], "rfc_reps": 1,
              "rfc_trial": 0.3, "rfc_resolution": 0.25, "rfc_max_pps": 20000.0},
}
FULL_RFC_FRAMES = [64, 512, 1518]


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _uniform(s: str) -> list[float]:
    """``--uniform MIN_US,MAX_US``: refused by argparse (before anything changes) unless
    0 < MIN_US <= MAX_US."""
    try:
        vals = [float(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: use MIN_US,MAX_US, e.g. 1000,10000") \
            from None
    why = tester.uniform_problem(vals)
    if why:
        raise argparse.ArgumentTypeError(why)
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default="full",
                   help="starting point for every option below (default: full)")
    p.add_argument("--demo", dest="preset", action="store_const", const="demo",
                   help="same as --preset demo (make demo)")
    p.add_argument("--smoke", dest="preset", action="store_const", const="smoke",
                   help="same as --preset smoke")
    p.add_argument("--scenario",
                   help=f"what to measure: {', '.join(scenarios.all_scenarios())} "
                        f"(default {scenarios.DEFAULT}, --demo: shared-cpu; see above)")
    p.add_argument("--app-policy", choices=runner.APP_POLICIES,
                   help="the RT app's scheduling class: fifo = SCHED_FIFO rt-prio+1 (above "
                        "the poller), other = default policy (default: the scenario's; "
                        "shared-cpu fifo, veth-inline other)")
    own = [m for m in modes.catalog() if m not in modes.standard_modes()]
    p.add_argument("--modes", type=_csv, help=f"comma list of "
                   f"{','.join(modes.standard_modes())}, and where a scenario offers them "
                   f"{','.join(own)} (see above)")
    p.add_argument("--reps", type=int, help="repetitions (modes interleaved in each)")
    p.add_argument("--parts", type=_csv,
                   help="comma list of the scenario's parts (" + "; ".join(
                       f"{n}: {','.join(s.parts)}" for n, s in scenarios.all_scenarios().items())
                   + f"; every scenario: {','.join(parts.COMMON)}; default: all)")
    p.add_argument("--idle-duration", type=float,
                   help="seconds of no traffic per mode in the idle part (default 10)")
    p.add_argument("--tcp-len", type=int,
                   help="iperf3 TCP write size in bytes of rtt-tcp, --flood tcp and rt-split "
                        "(default: iperf3's 128 KiB)")
    p.add_argument("--scenarios", type=_csv, dest="parts_deprecated", metavar="PARTS",
                   help="deprecated: the old name of --parts")
    p.add_argument("--loads", type=_csv, help="competing load for rtt: off,on")
    p.add_argument("--round-ms", type=int, dest="periodic_round_ms",
                   help="periodic modes: the interval search's round in ms (default 200; "
                        "stream's full run: 1000, kbpctl's)")
    p.add_argument("--interval-us", type=int, dest="periodic_interval_us",
                   help="periodic modes: a fixed polling interval in µs (default: searched)")
    p.add_argument("--stream-warmup", type=float,
                   help="stream: seconds each stream runs before it is measured (default 3; "
                        "full run: 12, the search's 11 rounds of 1000 ms)")
    p.add_argument("--udp-len", type=int,
                   help="stream: UDP payload bytes of the UDP stream (default 1472)")
    p.add_argument("--duration", type=float, help="seconds per RT latency run")
    p.add_argument("--rate", type=float, help="RT requests per second (mean)")
    p.add_argument("--frame", type=int, help="RT request frame size, bytes (64..1518)")
    p.add_argument("--constant", action="store_true",
                   help="constant inter-arrival times (default: random, exponential)")
    p.add_argument("--uniform", type=_uniform, metavar="MIN_US,MAX_US", dest="uniform_us",
                   help="random inter-arrival times uniform in [MIN_US, MAX_US] µs instead "
                        "(--rate and --constant then unused; rt-split's default: 1000,10000, "
                        "the paper's 1-10 ms)")
    p.add_argument("--flood", choices=parts.FLOODS,
                   help="the heavy receiver's load (veth-inline, shared-cpu): udp = iperf3 "
                        "UDP datagrams of --flood-len bytes at full speed; tcp = one iperf3 "
                        "TCP stream at full speed with TSO off at the sender and GRO off at "
                        "the receiver, so its receive work is per MTU packet and fills the RT "
                        "CPU (default: tcp in shared-cpu, udp in veth-inline)")
    p.add_argument("--heavy-napi", choices=("sender", "rt-cpu"),
                   help="shared-cpu: where the heavy device's NAPI polls. sender (default): "
                        "veth's way, no NAPI for it (GRO off) and RPS queues its packets to "
                        "the RT CPU's backlog from the sender's CPU, so napi's RT CPU does "
                        "less heavy-flow work than the -part modes'; rt-cpu: in every mode a "
                        "per-packet NAPI, threaded and pinned to the RT CPU (RPS off), as a "
                        "NIC with its interrupt there polls it: the same heavy-flow work on "
                        "the RT CPU in napi and the -part modes")
    p.add_argument("--flood-len", type=int, help="UDP payload of the competing flood")
    p.add_argument("--table2-scale", type=float,
                   help="factor applied to EE-KBP Table 2's bit rates (default 0.02)")
    p.add_argument("--table2-duration", type=float)
    p.add_argument("--rfc-frames", type=lambda s: [int(x) for x in _csv(s)])
    p.add_argument("--rfc-trial", type=float, help="seconds per RFC 2544 trial")
    p.add_argument("--rfc-reps", type=int)
    p.add_argument("--rfc-resolution", type=float, help="search stops at this fraction of hi")
    p.add_argument("--rfc-max-pps", type=float, help="search ceiling (default: probe it)")
    p.add_argument("--cpus", metavar="ROLE=CPU,...",
                   help="pin roles to CPUs (roles: " + ", ".join(placement.ALL_ROLES) +
                        "); the others are placed by rule on the CPUs left")
    p.add_argument("--nic-pair", metavar="DEV_A,DEV_B",
                   help="carry the RT flow over two NIC ports cabled to each other instead of "
                        "a veth pair: DEV_A is the tester's port, DEV_B the server's (served "
                        "by each mode, its interrupts affined to the RT CPU); both are moved "
                        "into the benchmark's namespaces and put back afterwards (name, "
                        "addresses, MTU, state, IRQ affinity). Refused for a device that "
                        "carries the default route or has no NAPI")
    p.add_argument("--rt-cpu", type=int, help="deprecated: --cpus rt=N")
    p.add_argument("--load-cpu", type=int,
                   help="deprecated: --cpus tester=N,flood=N,heavy=N,harness=N")
    p.add_argument("--tester-prio", type=int, help="SCHED_FIFO priority of the tester (50)")
    p.add_argument("--rt-prio", type=int, help="SCHED_FIFO priority of kbp pollers (50)")
    spinning = " and ".join(modes.named(lambda i: i.spins and i.category == modes.KBPCTL))
    p.add_argument("--busy-app", choices=("fifo", "elsewhere", "same"),
                   help=f"the app in {spinning}, whose pollers never sleep: fifo "
                        "(default) = "
                        "on its CPU at SCHED_FIFO rt-prio+1, so it preempts the spinner; "
                        "elsewhere = on the tester's CPU; same = unchanged (starves)")
    p.add_argument("--no-trace", action="store_true", help="skip the bpftrace kernel delays")
    p.add_argument("--anatomy", action="store_true",
                   help="cut every RT round trip into its kernel events (request xmit, "
                        "poll, stack, socket, app, reply) and say what the RT CPU did "
                        "meanwhile: a table and plot of the slowest round trips per mode. "
                        "With --nic-pair (your own NIC as the RT server's port) the requests "
                        "are read from the packets each port received, and the server "
                        "port's interrupt splits the wire from the wait for the poll. Adds "
                        "probes on every packet (the run says so); Linux 6.3+")
    p.add_argument("--emulated", action="store_true",
                   help="label results as emulated (VM rig guest); detected under QEMU")
    p.add_argument("--out", type=Path, help="output directory (default out/bench-<time>)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--json", action="store_true", help="print results.json to stdout")
    p.add_argument("--require-quiet", action="store_true",
                   help="refuse to run when load average >= 0.5 or QEMU runs")
    p.add_argument("--clean-stale", action="store_true",
                   help="first remove namespaces a killed benchmark left (kbpb-*)")
    p.add_argument("--wait-quiet", type=float, metavar="SECONDS",
                   help="before each run, wait while a QEMU process runs (at most SECONDS "
                        "in all); runs still record the load they saw")
    p.add_argument("--seed", type=int, metavar="N",
                   help="seed of the request arrivals, the modes' random order in each "
                        "repetition and the tails' bootstrap (default: a fresh one per "
                        "invocation, printed and recorded as config.seed in results.json; "
                        "give it to repeat a run's arrivals and orders)")
    p.add_argument("--settle", type=float, metavar="SECONDS",
                   help="after a mode that moves load (the exclusive CPU modes), wait this "
                        "long before the next mode (default 1)")


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig()
    if a.preset == "full":
        cfg.rfc_frames = list(FULL_RFC_FRAMES)
    for k, v in PRESETS[a.preset].items():
        setattr(cfg, k, v)
    try:                    # what the preset means for this scenario (unknown: plan refuses)
        scen = scenarios.get(getattr(a, "scenario", None) or cfg.scenario)
        for k, v in scen.presets.get(a.preset, {}).items():
            setattr(cfg, k, v)
    except scenarios.UnknownScenario:
        pass
    simple = ("scenario", "modes", "reps", "parts", "loads", "duration", "rate", "frame",
              "flood", "heavy_napi", "flood_len", "idle_duration", "tcp_len", "table2_scale",
              "table2_duration",
              "rfc_frames", "rfc_trial", "rfc_reps", "rfc_resolution", "rfc_max_pps",
              "tester_prio", "rt_prio", "periodic_round_ms", "periodic_interval_us",
              "stream_warmup", "udp_len", "uniform_us")
    for k in simple:
        v = getattr(a, k, None)
        if v is not None:
            setattr(cfg, k, v)
    deprecated: list[str] = []
    if getattr(a, "parts_deprecated", None) is not None:
        deprecated.append("--scenarios (now --parts)")
        if a.parts is None:
            cfg.parts = a.parts_deprecated
    try:
        pins = placement.Pins(placement.parse_pins(a.cpus) if getattr(a, "cpus", None)
                              else {})
    except placement.PlacementError as e:
        raise Aborted(str(e)) from e
    pins.add_legacy(getattr(a, "rt_cpu", None), getattr(a, "load_cpu", None))
    cfg.cpus = pins.roles
    if getattr(a, "nic_pair", None):
        from kbp.bench import nicpair
        try:
            cfg.nic_pair = list(nicpair.parse(a.nic_pair))
        except nicpair.NicPairError as e:
            raise Aborted(str(e)) from e
    cfg.deprecated = deprecated + pins.deprecated
    if a.constant:
        cfg.poisson = False
    if a.no_trace:
        cfg.trace = False
    if a.anatomy:
        if a.no_trace:
            raise Aborted("--anatomy traces the kernel: it cannot go with --no-trace")
        cfg.anatomy = True
    if a.wait_quiet is not None:
        cfg.wait_quiet_s = a.wait_quiet
    # a fresh seed per invocation: reruns do not all replay the same three orders
    cfg.seed = a.seed if a.seed is not None else secrets.randbelow(2**31 - 1) + 1
    if a.settle is not None:
        if a.settle < 0:
            raise Aborted("--settle must not be negative")
        cfg.settle_s = a.settle
    if a.busy_app:
        cfg.spin_app = a.busy_app
    if getattr(a, "app_policy", None):
        cfg.app_policy = a.app_policy
    if getattr(a, "reps", None) is not None:
        cfg.budget_s = None          # the repetitions asked for, whatever they take
    if a.emulated:
        cfg.emulated = True
    cfg.out = a.out or runner.default_out_dir()
    return cfg


def description() -> str:
    """This module's docstring with the registered scenarios and the modes' table filled in
    (every mode from kbp.bench.modes, each with the scenarios that offer it where not all
    do)."""
    import textwrap
    known = scenarios.all_scenarios()
    rows = []
    for name, scen in known.items():
        lines = textwrap.wrap(scen.title, 80) or [""]
        rows += [f"{name:<13}  {lines[0]}", *(" " * 15 + x for x in lines[1:])]
    def table(rows: dict[str, str]) -> list[str]:
        out = []
        for name, text in rows.items():
            lines = textwrap.wrap(text, 80, break_on_hyphens=False) or [""]
            out += [f"{name:<13}  {lines[0]}", *(" " * 15 + x for x in lines[1:])]
        return out

    where = {m: [n for n, scen in known.items() if scen.offers(m)] for m in modes.catalog()}
    mode_rows = table({m: ("" if len(where[m]) == len(known) else
                           f"{' and '.join(where[m])} only: ") + info.summary
                       for m, info in modes.catalog().items()})
    old = modes.aliases()
    if old:
        mode_rows += ["", *textwrap.wrap("Older names, still taken (--modes, results files): "
                                         + ", ".join(f"{a} = {m}" for a, m in old.items()),
                                         95, break_on_hyphens=False)]
    defaults = table({n: ", ".join(scenarios.default_modes(scen)) for n, scen in known.items()})
    fill = {"{scenarios}": "\n".join(rows), "{modes}": "\n".join(mode_rows),
            "{defaults}": "\n".join(defaults), "{baseline}": modes.BASELINE,
            "{smoke}": " and ".join(PRESETS["smoke"]["modes"]),
            "{periodic}": ", ".join(modes.named(lambda i: i.periodic))}
    text = __doc__ or ""
    for k, v in fill.items():
        text = text.replace(k, v)
    return text


def _console() -> Any:
    from rich.console import Console
    return Console(stderr=True)


def run_bench(a: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress
    con = _console()
    try:
        cfg = config_from_args(a)
        bench = Bench(cfg)
        place = bench.plan()          # refuses bad input before anything changes
    except Aborted as e:
        print(f"kbpctl bench: {e}", file=sys.stderr)
        return 2
    for d in cfg.deprecated:
        con.print(f"[yellow]deprecated:[/] {d}")
    assert bench.scenario is not None
    con.print(f"scenario {bench.scenario.name}: {bench.scenario.title}")
    con.print(f"seed {bench.cfg.seed} (rerun with --seed {bench.cfg.seed} for the same arrivals "
              "and orders)")
    con.print(f"{place.summary()}\n  " + "\n  ".join(place.lines()))
    cfg.command = getattr(a, "_command", None) or shlex.join([Path(sys.argv[0]).name,
                                                              *sys.argv[1:]])
    stale = stale_namespaces("kbpb")
    if stale and a.clean_stale:
        remove_stale("kbpb")
        con.print(f"removed stale namespaces: {', '.join(stale)}")
    elif stale:
        con.print(f"[yellow]warning:[/] namespaces of a killed benchmark remain: "
                  f"{', '.join(stale)} (remove them with --clean-stale; if it was killed "
                  "while a mode had kbpctl enable a device, 'kbpctl disable --all' restores "
                  "the rest)")
    quiet = runner.machine.quiet_report()
    if not quiet["quiet"]:
        msg = (f"machine not quiet (load {quiet['loadavg'][0]:.2f}, "
               f"{quiet['qemu_processes']} QEMU processes): timings will be noisy")
        if a.require_quiet:
            print(f"kbpctl bench: {msg}; refusing (--require-quiet)", file=sys.stderr)
            return 75
        con.print(f"[yellow]warning:[/] {msg}")
    bar = RichProgress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                       TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                       console=con, transient=False)
    with bar:
        task = bar.add_task("preparing", total=None)
        t0 = time.monotonic()
        planned = [0.0, 0.0]   # total, done

        def advance(sec: float, desc: str) -> None:
            bar.update(task, advance=sec, description=desc)
            planned[1] += sec
            if not con.is_terminal:   # a log line per finished run when not on a terminal
                el = time.monotonic() - t0
                con.print(f"[{el / 60:5.1f} min] done: {desc} "
                          f"({100 * planned[1] / max(planned[0], 1):.0f} % of the plan)")

        def set_total(sec: float) -> None:
            planned[0] = sec
            bar.update(task, total=sec, completed=0)
            if not con.is_terminal:
                con.print(f"planned: {sec / 60:.1f} min of runs")

        bench.progress = Progress(set_total=set_total, advance=advance,
                                  note=lambda m: bar.update(task, description=m))
        try:
            bench.run()
        except KeyboardInterrupt:
            bar.stop()
            if _restore_failed(bench, con):
                con.print("[red]interrupted[/]: namespaces removed, but not everything was "
                          "restored (above); partial results follow")
            else:
                con.print("[red]interrupted[/]: namespaces removed and settings restored; "
                          "partial results follow")
            _finish(bench, cfg, a, con, partial=True)
            return 130
        except (Aborted, workloads.MissingTool, tester.TesterError) as e:
            bar.stop()
            con.print(f"[red]kbpctl bench:[/] {e}")
            _restore_failed(bench, con)
            return 2
    _finish(bench, cfg, a, con, partial=False)
    return 1 if _restore_failed(bench, con) else 0


def _restore_failed(bench: Bench, con: Any) -> bool:
    """Print what the benchmark could not put back (results' restore_problems): True if any."""
    from rich.markup import escape
    problems = bench.results.get("restore_problems") or []
    for p in problems:
        con.print(f"[red]kbpctl bench: not restored:[/] {escape(p)}")
    return bool(problems)


def _finish(bench: Bench, cfg: BenchConfig, a: argparse.Namespace, con: Any,
            partial: bool) -> None:
    res = bench.results
    if not res:
        return
    report.add_summary(res)
    md = report.markdown(res)
    paths = runner.write_outputs(res, bench.samples, cfg.out)
    (cfg.out / "results.md").write_text(
        f"# kbp bench {res.get('started')}\n\nCommand: `{res.get('command')}`\n\n"
        f"Machine: {describe_machine(res)}\n\n{md}")
    made = [] if a.no_plots or partial else plots.all_plots(res, bench.samples, cfg.out)
    if a.json:
        sys.stdout.write(schema.dumps(res))
    else:
        print(md)
    con.print(f"results: {paths['json']}  table: {cfg.out / 'results.md'}  "
              f"plots: {', '.join(str(p) for p in made) or 'none'}")


def describe_machine(res: schema.Results) -> str:
    m = res.get("machine") or {}
    qb, qa = res.get("quiet_before") or {}, res.get("quiet_after") or {}
    virt = "virtual machine" if m.get("virtualized") else "bare metal"
    return (f"{m.get('cpu_model')} x{m.get('ncpu')} ({virt}), {m.get('mem_gib')} GiB, kernel "
            f"{m.get('kernel')}, cpuidle {(m.get('cpuidle') or {}).get('driver')}, "
            f"{m.get('cpufreq')}, {m.get('power_meter')}; load average before "
            f"{(qb.get('loadavg') or ['?'])[0]}, after {(qa.get('loadavg') or ['?'])[0]}; "
            f"QEMU processes before/after {qb.get('qemu_processes')}/{qa.get('qemu_processes')}")


# -- setup --------------------------------------------------------------------------------------
SETUP_TOOLS = ["sockperf", "iperf3", "bpftrace", "ethtool", "ip", "taskset", "gcc"]


def run_setup(a: argparse.Namespace) -> int:
    """Check (and with --install, apt-get install) the tools, then build the tester."""
    miss = workloads.missing_tools(SETUP_TOOLS)
    if miss:
        pkgs = sorted({workloads.APT_PACKAGES.get(t, t) for t in miss})
        if "gcc" in miss:
            pkgs.append("libc6-dev")
        if a.install and shutil.which("apt-get") and os.geteuid() == 0:
            print(f"installing {' '.join(pkgs)}", file=sys.stderr)
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            for argv in (["apt-get", "update"],
                         ["apt-get", "install", "-y", "--no-install-recommends", *pkgs]):
                if subprocess.run(argv, env=env).returncode != 0:
                    print(f"kbp bench setup: {' '.join(argv)} failed", file=sys.stderr)
                    return 1
        else:
            print(f"kbp bench setup: missing {', '.join(miss)}; install with "
                  f"'apt-get install {' '.join(pkgs)}' (or rerun with --install as root)",
                  file=sys.stderr)
            return 1
    try:
        path = tester.build()
        echo = tester.build(tester.ECHO_SOURCE)
    except tester.TesterError as e:
        print(f"kbp bench setup: {e}", file=sys.stderr)
        return 1
    print(f"tools present; tester built: {path}; irq-suspend's echo server: {echo}")
    return 0


def run_report(a: argparse.Namespace) -> int:
    """Re-render the table and plots of a finished run from its directory (results.json of
    any version kbp.bench.schema reads)."""
    d: Path = a.dir
    try:
        res = schema.load(d / schema.RESULTS_FILE)
    except (OSError, schema.SchemaError) as e:
        print(f"kbp bench report: {e}", file=sys.stderr)
        return 2
    samples = schema.load_samples(d / schema.SAMPLES_FILE)
    report.add_summary(res)
    print(report.markdown(res))
    made = plots.all_plots(res, samples, d)
    print(f"plots: {', '.join(str(p) for p in made)}", file=sys.stderr)
    return 0


# -- the VM rig -----------------------------------------------------------------------------
def run_vm(argv: list[str]) -> int:
    """``kbpctl bench vm`` / ``python -m kbp.bench vm``: a bench scenario inside a rig guest
    with kbp.ko loaded, or one of the rig's experiments by name (kbp.bench.rig)."""
    from kbp.bench import rig
    known = {name: scen.title for name, scen in scenarios.all_scenarios().items()}
    default = runner.default_out_dir()
    return rig.run(argv, known, default.with_name(default.name + "-vm"))


# -- entry points -------------------------------------------------------------------------------
def register(subparsers: Any) -> None:
    """Add ``bench`` to kbpctl (called by kbp.cli)."""
    p = subparsers.add_parser("bench", help="compare receive modes against NAPI "
                              "(latency, zero-loss throughput, CPU cost)",
                              description=description(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run_bench, handler=run_bench)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["setup"]:
        sp = argparse.ArgumentParser(prog="python -m kbp.bench setup")
        sp.add_argument("--install", action="store_true",
                        help="apt-get install what is missing (root)")
        return run_setup(sp.parse_args(argv[1:]))
    if argv[:1] == ["vm"]:
        return run_vm(argv[1:])
    if argv[:1] == ["report"]:
        rp = argparse.ArgumentParser(prog="python -m kbp.bench report")
        rp.add_argument("dir", type=Path)
        return run_report(rp.parse_args(argv[1:]))
    p = argparse.ArgumentParser(prog="python -m kbp.bench", description=description(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    a = p.parse_args(argv)
    a._command = shlex.join(["python", "-m", "kbp.bench", *argv])
    return run_bench(a)
