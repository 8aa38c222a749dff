"""kbpctl: turn kbp on and off, see what it does, and trust that "off" restores the machine."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import textwrap
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from kbp import modespec, names
from kbp.errors import EXIT_OK, EXIT_USAGE, InvalidInput, KbpctlError, OperationFailed
from kbp.sysinfo import format_cpulist, online_cpus, parse_cpulist

if TYPE_CHECKING:
    from kbp import backends
    from kbp.backends import EnableRequest

PROG = "kbpctl"

MAIN_EPILOG = """\
examples:
  kbpctl status                               what serves each NAPI device, and how
  kbpctl enable eth1 --cpus 3 --rt-prio 50    poll eth1's NAPIs from CPU 3 (SCHED_FIFO 50)
  kbpctl enable veth0 --netns blue --linger-us 20
  kbpctl disable --all                        restore everything kbpctl changed
  kbpctl apply                                converge to /etc/kbp/kbp.toml

backends: 'kmod' (the kbp kernel module, when it is loaded) or 'stock' (no module:
threaded NAPI + SCHED_FIFO + CPU/IRQ alignment, Linux 5.12+; busy: SCHED_NORMAL).
--backend auto picks kmod when the module is loaded. Every change is journaled under
/run/kbp before it is made.

exit codes: 0 ok, 1 failed (rolled back), 2 invalid input, 69 kernel feature or module
missing, 77 needs root. Docs: docs/kbpctl.md.
"""

ENABLE_EPILOG_TEMPLATE = """\
examples:
  kbpctl enable eth1                          all NAPIs of eth1, round-robin over online CPUs
  kbpctl enable eth1 eth2 --cpus 2-3          NAPI i of each device on CPU 2 + (i mod 2)
  kbpctl enable veth0 --netns blue --cpus 1 --rt-prio 60 --linger-us 20
  kbpctl enable eth1 --backend kmod --mode busy --cpus 3
  kbpctl enable eth1 --keep-rps               leave eth1's RPS on (warns: see RPS below)
  kbpctl enable eth1 --backend stock --mode periodic --max-interval-us 1000
  kbpctl enable eth1 --cpus 1                 RT device: the rt poller of CPU 1 (FIFO 50)
  kbpctl enable eth2 --cpus 1 --class non-rt --nice 5
                                              heavy device on the same CPU, below it

{modes}
--rt-prio N: SCHED_FIFO priority of the polling threads, default 50 -- except the stock
backend's busy, whose NAPI threads run SCHED_NORMAL and refuse N > 0: they never sleep
and yield only at cond_resched(), so at SCHED_FIFO they would starve every other task on
their CPU (for a FIFO busy poller use --backend kmod: its poller yields).
--linger-us N (hybrid): keep polling N us after the last packet before sleeping
(stock: napi_defer_hard_irqs + gro_flush_timeout; kmod: the poller spins).
--freq-ctl (kmod, hybrid): EE-KBP's CPU-frequency control; the poller sets its CPU to
the policy's min frequency before it sleeps and to max when it wakes, through the
userspace governor (set it first: echo userspace > .../cpufreq/scaling_governor).
With the stock backend, the schedutil governor does the same for SCHED_FIFO threads.
Enabling a device that is already enabled reconfigures it (restore, then enable).

--class rt|non-rt: which of the CPU's two pollers serves the device. An RT device and a heavy
device whose interrupts land on the same CPU need not be split across CPUs: give the heavy
one --class non-rt. Its poller runs SCHED_NORMAL at --nice N (default 0; below 0 needs
CAP_SYS_NICE), hybrid only, sleeps when idle, and the RT device's poller (class rt, the
default, SCHED_FIFO) preempts it between polls, so the RT flow waits for at most one small
poll while the heavy flow keeps the CPU the RT flow does not use (no CPU set aside, unlike
--isolate). kmod: the module's non-rt poller kbpn/<cpu> polls 8 packets per NAPI and gives
way after every poll. stock: the heavy device's NAPI threads run SCHED_OTHER on that CPU;
they poll up to 64 packets and do not give way between polls, so on a kernel without full
preemption the RT thread may wait for one such poll (kbpctl status says so; kbpctl status
--trace 5 measures it). Without more, a stock NAPI thread that finds its NAPI scheduled
again after each small poll never sleeps, and under a flood the RT thread waited for
milliseconds (up to 56 ms, PREEMPT_NONE); so the stock non-rt class also sets IRQ deferral
on the heavy NAPIs (defer_hard_irqs 2, gro_flush_timeout --repoll-us, default 20 us,
journaled and restored): they are re-polled from their timer, their threads sleep after
every poll, and the wait is one poll. It costs the heavy flow up to N us per packet and
the RT flow's median 2-8 us (larger polls). Measured (docs/results.md): under a UDP flood
the RT p99.9 fell 58 %; under a TCP flood, whose NAPI thread sleeps between polls anyway,
it did not help (two of three runs were worse). --repoll-us 0 leaves the device's
deferral as it is: compare both on your device (bench mode stock-hybrid-part-repoll0).

RPS: a device with RPS on (queues/rx-*/rps_cpus non-zero, or RFS: rps_flow_cnt non-zero
while net.core.rps_sock_flow_entries is) re-queues every packet its poller receives to the
backlog softirq of the RPS CPUs -- the softirq path kbp takes receive work out of. enable
turns RPS off for the devices it serves (both backends; journaled, says what it changed);
disable puts the exact masks back. --keep-rps leaves RPS on, with a warning.
"""
ENABLE_EPILOG = ENABLE_EPILOG_TEMPLATE.replace("{modes}", modespec.help_text())

DISABLE_EPILOG = """\
examples:
  kbpctl disable eth1
  kbpctl disable veth0 --netns blue
  kbpctl disable --all

Restores every setting kbpctl changed to the value it had before, from the journal under
/run/kbp -- also after an interrupted enable.  --all also puts back what a killed
`kbpctl bench` left set (global sysctls such as net.core.busy_read, NIC ports it had
moved), from that benchmark's journal; the next benchmark would do it otherwise.
"""

STATUS_EPILOG = """\
examples:
  kbpctl status
  kbpctl status --json | jq '.devices[] | {name, backend, mode}'
  kbpctl status --watch --interval 0.5
  kbpctl status --netns blue veth0
  kbpctl status --trace 5               trace the polling threads for 5 s (root, bpftrace)

Shows the devices with NAPI instances in the netns (default: this one) plus every device
kbp serves. Column RPS: off, or the CPUs that RPS steers the device's packets to (+RFS:
also to the receiving sockets' CPUs); "kept" when enabled with --keep-rps. In a guest
with kbp_so (/proc/kbp_so), a section "socket outsourcing" gives its counters and who
found the completions (JSON "outsource"; null without the module). --json output is stable
(schema kbpctl-status/1, see docs/kbpctl.md).

Where an rt and a non-rt poller share a CPU, status gives each one's load: the module's
pollers count their poll sizes and wake-up delays; a stock NAPI thread's are counted
nowhere, so --trace SECONDS traces them (tracepoints napi:napi_poll, sched_waking and
sched_switch; tracefs is mounted for the run if it is not): each thread's polls, packets
per poll, largest poll and full-budget polls; each rt thread's wake-up-to-running waits
and the tasks it waited behind; and, for every thread, the rt waits that ended when it
gave its CPU up -- what its polls cost the rt class. Without root or bpftrace status says
why and shows the rest.
"""

APPLY_EPILOG = """\
examples:
  kbpctl apply                          converge to /etc/kbp/kbp.toml
  kbpctl apply --dry-run                show what would change
  kbpctl apply --config ./kbp.toml
  kbpctl apply --watch 5                converge now and every 5 s until stopped

Enables what the file lists (and re-enables what drifted or changed), disables what kbpctl
enabled that the file no longer lists. The systemd unit kbp.service runs it at boot.

The RT class (PREEMPT_RT): with [rt_class] rtnet_prio = N in the file, every device one of
whose queue interrupts is handled by a thread at SCHED_FIFO/RR >= N is served too, with the
[defaults] settings, and one whose threads fell below N is handed back to NET_RX, e.g.
  chrt -f -p 60 $(pgrep '^irq/45-')     # raise eth1's RX interrupt thread above N
  kbpctl apply                          # serves eth1 from now on
--watch re-reads the file and re-evaluates the rule every S seconds, so devices appearing
later and priority changes are picked up (kbp-watch.service runs it). On kernels that are
not PREEMPT_RT, name the RT devices as [[device]] entries. kbpctl status shows each
device's class and why. The devices below N whose queue interrupts land on a CPU with an
RT poller are served there with --class non-rt (below the RT poller, which preempts them
between polls; [rt_class] nice = M sets their nice), unless [rt_class] non_rt = "leave"
keeps them on NET_RX as before (--isolate is the other remedy: move them away).
"""

EXPORTER_EPILOG = """\
examples:
  kbpctl exporter                             serve http://127.0.0.1:9717/metrics
  curl -s http://127.0.0.1:9717/metrics | grep '^kbp_poller_packets_total'
  kbpctl exporter --listen 0.0.0.0:9717       every address: on purpose only (see below)
  kbpctl exporter --textfile /var/lib/node_exporter/textfile --interval 15
  kbpctl exporter --once                      print one scrape and exit
  kbpctl exporter --once --textfile DIR       write DIR/kbp.prom once (a cron job)

What is exported: the counters 'kbpctl status' shows, read afresh at every scrape --
per module poller (labels cpu, mode, class, backend, device) every poller counter as
kbp_poller_<counter>_total (times in seconds: kbp_poller_poll_seconds_total; the longest
wake-up delay is the gauge kbp_poller_wake_delay_max_seconds); per device (labels device,
netns, backend, mode, class) kbp_device_enabled{state}, kbp_device_packets_total,
kbp_device_polls_total; per NAPI kbp_napi_*; the polling threads' CPU time and sleeps
(kbp_napi_thread_*, the stock backend's NAPI threads); NetAP's interval and objective
(kbp_*_periodic_*); kbp_up, kbp_module_loaded, kbp_kernel_info (preemption model),
kbp_problems{kind} and kbp_exporter_errors_total{section}. docs/kbpctl.md, "Monitoring",
lists them all; contrib/grafana/kbp.json is a dashboard of them.

Prometheus scrape config:
  scrape_configs:
    - job_name: kbp
      static_configs: [{targets: ['127.0.0.1:9717']}]

--textfile DIR writes DIR/kbp.prom atomically (temporary file + rename) every --interval
seconds, for node_exporter's textfile collector:
  node_exporter --collector.textfile.directory=/var/lib/node_exporter/textfile
Without --listen it serves no HTTP.

--listen defaults to loopback (127.0.0.1:9717): the counters describe this host (its
devices, CPUs, threads and kernel); expose them to the network only on purpose, behind
whatever guards your other exporters. Not root: the module's counters (CAP_NET_ADMIN) and
the NAPIs of devices in other netns cannot be read; their series are missing and
kbp_problems{kind="needs_root"} counts them.
"""


class _Parser(argparse.ArgumentParser):
    """argparse that fails with one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: {message} (see '{self.prog} --help')\n")
        sys.exit(EXIT_USAGE)


def _cpulist(text: str) -> list[int]:
    try:
        return parse_cpulist(text)
    except KbpctlError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _mode_help() -> str:
    """"hybrid (default), busy or periodic"."""
    others = [s for s in modespec.SPECS.values() if s is not modespec.DEFAULT]
    return f"{modespec.DEFAULT.name} (default), {modespec.modes_text(others)}"


class _VersionAction(argparse.Action):
    """``--version``, with the version looked up only when asked (importlib.metadata)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        sys.stdout.write(f"{PROG} {_version()}\n")
        parser.exit()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """kbpctl's parser; given the command line, without the plugin commands (``bench``)
    when it names a command of kbpctl's own: importing kbp.bench costs more than the rest
    of kbpctl together, seconds per call in the test VMs."""
    p = _Parser(prog=PROG, description=__doc__, epilog=MAIN_EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    fmt = argparse.RawDescriptionHelpFormatter
    from kbp.outsource import command as outsource_command
    first = next((a for a in (argv or ()) if not a.startswith("-")), None)
    if first == "outsource":    # its own, light parser: no pyroute2 (TCG guests)
        outsource_command.add_parser(sub, fmt)
        return p
    from kbp.backends import DEFAULT_RT_PRIO

    s = sub.add_parser("status", help="show devices, NAPIs, polling threads, counters",
                       epilog=STATUS_EPILOG, formatter_class=fmt)
    s.add_argument("devices", nargs="*", metavar="DEV", help="only these devices")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    s.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="refresh interval for --watch (default 1 s)")
    s.add_argument("--netns", metavar="NAME", help="list the devices of this netns")
    s.add_argument("--trace", type=float, default=0, metavar="SECONDS",
                   help="trace the polling threads' polls and the waits they cause for "
                        "SECONDS (root, bpftrace; see below)")
    s.set_defaults(func=cmd_status)

    e = sub.add_parser("enable", help="serve devices' NAPIs with kbp",
                       epilog=ENABLE_EPILOG, formatter_class=fmt)
    e.add_argument("devices", nargs="+", metavar="DEV")
    e.add_argument("--mode", choices=names.MODES, default=modespec.DEFAULT.name,
                   help=_mode_help())
    e.add_argument("--cpus", type=_cpulist, metavar="LIST",
                   help="CPUs for the polling threads, e.g. 2-3,6 (default: all online)")
    e.add_argument("--rt-prio", type=_int, default=None, metavar="N",
                   help=f"SCHED_FIFO priority 1..99 of the polling threads (default "
                        f"{DEFAULT_RT_PRIO}); kmod: 0 runs them SCHED_NORMAL. The stock "
                        "backend's --mode busy runs them SCHED_NORMAL and refuses N > 0 "
                        "(its threads never sleep: see below)")
    e.add_argument("--class", dest="cls", choices=names.CLASSES, default=names.CLASS_RT,
                   help="rt (default): the CPU's RT poller, SCHED_FIFO; non-rt: a heavy "
                        "device on an RT device's CPU, polled by a SCHED_NORMAL poller "
                        "that the RT poller preempts between polls (hybrid only; see below)")
    lo, hi = names.NICE_RANGE
    e.add_argument("--nice", type=_int, metavar="N",
                   help=f"--class non-rt: nice {lo}..{hi} of its poller (default 0; below 0 "
                        "needs CAP_SYS_NICE)")
    e.add_argument("--repoll-us", type=_int, metavar="N",
                   help="--class non-rt, stock backend: the heavy NAPIs are re-polled from "
                        "their timer every N us (IRQ deferral), so their threads sleep "
                        "between polls and the rt thread waits at most one poll (default "
                        "20; 0: leave the deferral as it is: on PREEMPT_NONE/VOLUNTARY a "
                        "flood can then hold the CPU for milliseconds; see below)")
    e.add_argument("--linger-us", type=_int, metavar="N",
                   help="hybrid: keep polling N us after the last packet (default: leave "
                        "the device's setting)")
    e.add_argument("--quota", type=_int, metavar="N",
                   help=f"kmod: packets per NAPI per pass, 1..{names.DEFAULT_QUOTA}")
    e.add_argument("--freq-ctl", action="store_true",
                   help="kmod, hybrid: CPU frequency to min while a poller sleeps, max when "
                        "it wakes (EE-KBP; needs the userspace cpufreq governor)")
    pg = e.add_argument_group(
        "mode periodic (NetAP)", "poll every interval with the device's interrupt masked; "
        "without --interval-us a golden-section search picks the interval per round")
    rng, dflt = names.PERIODIC_RANGES, names.PERIODIC_DEFAULTS

    def _r(k: str) -> str:
        return f"{rng[k][0]}..{rng[k][1]}"

    pg.add_argument("--interval-us", type=_int, metavar="N",
                    help=f"fixed polling interval, {_r('interval_us')} us (default: searched)")
    pg.add_argument("--round-ms", type=_int, metavar="N",
                    help=f"search round length, {_r('round_ms')} ms "
                         f"(default {dflt['round_ms']})")
    pg.add_argument("--min-interval-us", type=_int, metavar="N",
                    help=f"shortest interval the search tries, {_r('min_interval_us')} us "
                         f"(default {dflt['min_interval_us']})")
    pg.add_argument("--max-interval-us", type=_int, metavar="N",
                    help=f"longest interval the search tries, a latency cap, "
                         f"{_r('max_interval_us')} us (default {dflt['max_interval_us']})")
    pg.add_argument("--min-change", type=_int, metavar="PCT",
                    help=f"restart the search when a round's objective moves by more than "
                         f"PCT %% of the previous round's, {_r('min_change')} "
                         f"(default {dflt['min_change']})")
    pg.add_argument("--max-round", type=_int, metavar="N",
                    help=f"restart the search every N rounds, {_r('max_round')} "
                         f"(default {dflt['max_round']})")
    pg.add_argument("--objective", choices=names.OBJECTIVES,
                    help="what the search maximizes per round: bytes received (default, "
                         "the paper's) or bytes per CPU-second of the polling context")
    e.add_argument("--isolate", action="store_true",
                   help="move the queue interrupts of devices kbp does not serve off the "
                        "polling CPUs (journaled; disable puts them back): their NET_RX "
                        "would run inside the poller, or hold the softirq lock it waits for "
                        "on PREEMPT_RT (the exclusive-CPU method; needs --cpus)")
    e.add_argument("--keep-rps", action="store_true",
                   help="leave RPS on for the devices (default: turn it off, journaled, "
                        "restored by disable); with RPS the poller's packets are re-queued "
                        "to the backlog softirq")
    e.add_argument("--backend", choices=names.BACKENDS, default="auto",
                   help="auto (default): kmod if the module is loaded, else stock")
    e.add_argument("--netns", metavar="NAME", help="the devices live in this netns")
    e.set_defaults(func=cmd_enable)

    d = sub.add_parser("disable", help="restore what enable changed",
                       epilog=DISABLE_EPILOG, formatter_class=fmt)
    d.add_argument("devices", nargs="*", metavar="DEV")
    d.add_argument("--all", action="store_true", help="every device kbpctl enabled")
    d.add_argument("--netns", metavar="NAME", help="the devices live in this netns")
    d.set_defaults(func=cmd_disable)

    a = sub.add_parser("apply", help="converge to the config file",
                       epilog=APPLY_EPILOG, formatter_class=fmt)
    a.add_argument("--config", type=Path, default=None, metavar="PATH",
                   help="default /etc/kbp/kbp.toml")
    a.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    a.add_argument("--watch", type=float, default=None, metavar="S",
                   help="keep converging every S seconds (>= 0.5) until SIGTERM/Ctrl-C; "
                        "prints what changes")
    a.set_defaults(func=cmd_apply)

    n = sub.add_parser("snapshot", help="print every setting kbpctl may touch (JSON)",
                       epilog="example:\n  kbpctl snapshot eth1 > before.json\n\n"
                              "Compare one taken before enable with one after disable.",
                       formatter_class=fmt)
    n.add_argument("devices", nargs="+", metavar="DEV")
    n.add_argument("--netns", metavar="NAME")
    n.set_defaults(func=cmd_snapshot)

    x = sub.add_parser("exporter", help="serve kbp's counters to Prometheus",
                       epilog=EXPORTER_EPILOG, formatter_class=fmt)
    x.add_argument("--listen", metavar="ADDR:PORT",
                   help="serve /metrics here (default 127.0.0.1:9717, loopback: the counters "
                        "describe this host; [::1]:9717 for IPv6, port 0: any free port)")
    x.add_argument("--textfile", type=Path, metavar="DIR",
                   help="write DIR/kbp.prom for node_exporter's textfile collector (then no "
                        "HTTP unless --listen is given)")
    x.add_argument("--interval", type=float, default=15.0, metavar="S",
                   help="--textfile: rewrite it every S seconds (default 15)")
    x.add_argument("--once", action="store_true",
                   help="one scrape and exit: to DIR/kbp.prom with --textfile, else stdout")
    x.add_argument("--config", type=Path, metavar="PATH",
                   help="the kbp.toml 'kbpctl apply' converges to: also serve "
                        "kbp_backend_required{backend} (1 where the file needs the kbp "
                        "module), for a 'module not loaded where the config asks' alert")
    x.set_defaults(func=cmd_exporter)

    outsource_command.add_parser(sub, fmt)

    if argv is None or first not in sub.choices:
        _register_plugins(sub)
    return p


def _register_plugins(sub: Any) -> None:
    """``kbpctl bench`` comes from kbp.bench.cli when it is installed."""
    try:
        mod = importlib.import_module("kbp.bench.cli")
    except ImportError:
        return
    register = getattr(mod, "register", None)
    if callable(register):
        register(sub)


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("kbp")
    except Exception:
        return "unknown"


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def busy_notice(backend: str, pollers: Iterable[tuple[int, str]], rt_prio: int) -> str:
    """What a busy poller does to its CPU, in one short paragraph (for stderr): ``pollers``
    the (CPU, device) pairs enabled busy (the module runs a poller per CPU and device, named
    by kbp.names.poller_name), ``rt_prio`` resolved (0: SCHED_NORMAL)."""
    pairs = set(pollers)
    cpu_list = sorted({c for c, _ in pairs})
    many = len(cpu_list) != 1
    plural = many       # the stock backend's threads, said per CPU
    where = f"CPU{'s' if many else ''} {format_cpulist(cpu_list)}"
    tail = "Place applications on other CPUs, or use --mode hybrid, which sleeps when idle."
    if backend == names.BACKEND_STOCK and not rt_prio:
        who = (f"the busy NAPI threads on {where} never sleep: each takes" if many else
               f"the busy NAPI thread on {where} never sleeps: it takes")
        text = (f"{PROG}: note: {who} ~100% of its CPU when nothing else runs there. "
                f"{'They run' if many else 'It runs'} SCHED_NORMAL, so other tasks pinned "
                "there share the CPU with it fairly (it yields at cond_resched()): each gets "
                f"less than it would alone. {tail}")
        return textwrap.fill(text, width=100)
    if backend == names.BACKEND_STOCK:
        who = f"busy NAPI thread{'s' if many else ''}"
        when = (f"at SCHED_FIFO {rt_prio} that means lower-priority tasks wait for the "
                "kernel's RT throttling")
    else:
        # a poller per CPU and device: one name per device, the CPU as <cpu> when there are
        # several (kbp/<cpu>:eth1), and the verb plural when the pollers are
        devs = sorted({d for _, d in pairs})
        plural = len(pairs) != 1
        cpu: int | str = cpu_list[0] if len(cpu_list) == 1 else "<cpu>"
        who = f"busy poller{'s' if plural else ''} " + ", ".join(
            names.poller_name(cpu, names.CLASS_RT, d) for d in devs)
        when = ("for ~50 us when it finds no work, or after holding the CPU a millisecond while "
                "others wait: counter 'yields'")
    owns = f"own {where}: each spins" if plural else f"owns {where}: it spins"
    text = (f"{PROG}: note: the {who} {owns} at ~100% of its CPU, and other tasks pinned "
            f"there get the CPU only when it yields ({when}). {tail}")
    return textwrap.fill(text, width=100)


def class_text(req: EnableRequest) -> str:
    """"class non-rt, " for the ``enabled ...`` line; nothing for the default class rt (so
    the line reads as before the classes)."""
    return "" if req.cls == names.CLASS_RT else f"class {req.cls}, "


def sched_text(req: EnableRequest) -> str:
    """The polling threads' scheduling for the ``enabled ...`` line (``req`` resolved)."""
    if req.rt_prio:
        return f"SCHED_FIFO {req.rt_prio}"
    if req.cls == names.CLASS_NON_RT:
        return f"SCHED_NORMAL nice {req.nice or 0}"
    return "SCHED_NORMAL"


def periodic_text(per: backends.Periodic | None) -> str:
    """The periodic knobs for the ``enabled ...`` line ("" for other modes)."""
    if per is None:
        return ""
    if not per.search:
        return f", every {per.interval_us} us"
    return (f", interval searched in {per.min_interval_us}..{per.max_interval_us} us (rounds "
            f"of {per.round_ms} ms, restart on a change above {per.min_change} % or every "
            f"{per.max_round} rounds, objective {per.objective})")


def _warn(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def rps_notice(d: backends.DeviceResult, keep_rps: bool) -> None:
    """One line on stderr when a device had RPS on: turned off, or kept (--keep-rps)."""
    from kbp import rps
    if d.rps is None or not d.rps.on:
        return
    if d.rps_off:
        _warn(rps.off_notice(d.name, d.netns, d.rps))
    elif keep_rps:
        _warn(rps.kept_warning(d.name, d.netns, d.rps))


# -- commands -------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    from kbp import backends
    from kbp.netdev import check_netns
    check_netns(args.netns)
    devs = args.devices or None
    if args.json and args.watch:
        raise InvalidInput("--json and --watch do not mix: pick one")
    if args.interval <= 0:
        raise InvalidInput("--interval must be positive")
    if args.trace and args.watch:
        raise InvalidInput("--trace and --watch do not mix: --trace SECONDS is one sample")
    if args.trace:
        from kbp.pollertrace import bad_seconds
        if why := bad_seconds(args.trace):
            raise InvalidInput(why)
    if args.json:
        st = backends.status(args.netns, devs, trace_s=args.trace)
        _out(json.dumps(st.to_json(), indent=2, sort_keys=False))
        return EXIT_OK
    from rich.console import Console

    from kbp.render import status_view
    console = Console(width=None if sys.stdout.isatty() else 200)
    if not args.watch:
        console.print(status_view(backends.status(args.netns, devs, trace_s=args.trace)))
        return EXIT_OK
    from rich.live import Live
    try:
        with Live(status_view(backends.status(args.netns, devs)), console=console,
                  refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(status_view(backends.status(args.netns, devs)))
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _periodic_args(args: argparse.Namespace) -> backends.Periodic | None:
    """The periodic knobs given on the command line (None: none given)."""
    given = {k: getattr(args, k) for k in names.PERIODIC_KNOBS}
    if all(v is None for v in given.values()):
        return None
    if not modespec.periodic(args.mode):
        knob = next(k for k, v in given.items() if v is not None)
        modes = modespec.modes_text(modespec.taking(knob))
        raise InvalidInput(f"--{knob.replace('_', '-')} applies to --mode {modes} only, not "
                           f"{args.mode}: drop it or use --mode {modes}")
    from kbp import backends
    return backends.Periodic.from_args(**given)


def cmd_enable(args: argparse.Namespace) -> int:
    from kbp import backends
    from kbp.backends import EnableRequest
    req = EnableRequest(devices=list(args.devices), netns=args.netns, mode=args.mode,
                        cpus=args.cpus, rt_prio=args.rt_prio, linger_us=args.linger_us,
                        quota=args.quota, freq_ctl=args.freq_ctl, keep_rps=args.keep_rps,
                        periodic=_periodic_args(args), isolate=args.isolate,
                        cls=args.cls, nice=args.nice, repoll_us=args.repoll_us)
    backends.validate_common(req, rt_prio_min=0)   # the backend checks its own minimum
    backends.check_nice_capability(req)
    why = ""
    if args.backend == "auto":
        be, why = backends.resolve_auto()
    else:
        be = backends.get(args.backend)
    req = req.resolved(be.name)  # --rt-prio left out: the backend's default for the mode
    res = be.enable(req)
    if why:
        _out(f"backend: {be.name} (auto: {why})")
    for d in res.devices:
        where = f" in netns {d.netns}" if d.netns else ""
        what = "NAPI thread" if be.name == names.BACKEND_STOCK else "NAPI"
        count = f"{d.napis} {what}{'s' if d.napis != 1 else ''}" if d.napis else "its NAPIs"
        knobs = f", linger {req.linger_us} us" if req.linger_us is not None else ""
        knobs += ", freq_ctl" if req.freq_ctl else ""
        knobs += periodic_text(req.periodic)
        if be.name == names.BACKEND_STOCK and req.cls == names.CLASS_NON_RT:
            from kbp.backends.stock import repoll_us
            every = repoll_us(req)
            knobs += f", re-polled every {every} us (IRQ deferral)" if every else \
                ", IRQ deferral left as found (--repoll-us 0)"
        _out(f"enabled {d.name}{where}: {be.name} backend, {class_text(req)}{req.mode}{knobs}, "
             f"{count} on CPU {format_cpulist(d.cpus)}, {sched_text(req)} "
             f"({d.changes} change{'s' if d.changes != 1 else ''} journaled"
             f"{'; ' + d.note if d.note else ''})")
        rps_notice(d, req.keep_rps)
    if modespec.spins(req.mode) and res.devices:
        assert req.rt_prio is not None
        _warn(busy_notice(be.name, ((c, d.name) for d in res.devices for c in d.cpus),
                          req.rt_prio))
    for n in res.notes:  # other receive work on the polling CPUs (kbp.contention)
        _warn(f"{PROG}: {n}")  # one line each: scripts grep them
    return EXIT_OK


def cmd_disable(args: argparse.Namespace) -> int:
    if args.all and args.devices:
        raise InvalidInput("name devices or give --all, not both")
    if args.all and args.netns:
        raise InvalidInput("--all covers every netns: drop --netns")
    if not args.all and not args.devices:
        raise InvalidInput("name the devices to disable, or give --all")
    from kbp import backends
    res = backends.disable(None if args.all else list(args.devices), args.netns)
    put_back: list[str] = []
    failed: list[str] = []
    if args.all:  # kbp is off: status no longer classifies by apply's [rt_class] rule
        from kbp import rtclass
        from kbp.bench import knobs, nicpair
        from kbp.system.journal import StateDir
        rtclass.save_rule(StateDir().root, None)
        # and what a killed `kbpctl bench` left set: global sysctls, NIC ports
        for recover in (knobs.recover, nicpair.recover):
            done, kept = recover()
            put_back += done
            failed += kept
    for n in res.notes:
        _out(n)
    for d in res.devices:
        where = f" in netns {d.netns}" if d.netns else ""
        _out(f"disabled {d.name}{where} ({d.backend}): {d.changes} journaled change"
             f"{'s' if d.changes != 1 else ''} undone")
    for line in put_back:
        _out(line)
    if failed:
        raise OperationFailed("; ".join(failed))
    if args.all and not res.devices and not put_back:
        _out("nothing is enabled")
    return EXIT_OK


def cmd_apply(args: argparse.Namespace) -> int:
    from kbp import config
    path = args.config or config.DEFAULT_PATH
    if args.watch is None:
        _apply_once(config.load(path), args.dry_run, quiet=False)
        return EXIT_OK
    if args.dry_run:
        raise InvalidInput("--watch and --dry-run together would print the same plan "
                           "forever: drop one of them")
    if not args.watch >= 0.5:
        raise InvalidInput(f"--watch {args.watch} is too short: use 0.5 seconds or more")
    return _watch(path, args.watch)


def _watch(path: Path, every: float) -> int:
    """``apply --watch``: converge, then again every ``every`` seconds until SIGTERM or
    SIGINT (exit 0, leaving the system as converged). A round that fails (a device went
    away half-way, a config edit that does not parse) is reported and retried; the first
    round's failure is the command's failure."""
    import signal
    import threading

    from kbp import config
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    first = True
    while True:
        try:
            _apply_once(config.load(path), False, quiet=not first)
        except KbpctlError as e:
            if first:
                raise
            _warn(f"apply: {e.message} (retrying in {every:g} s)")
        first = False
        if stop.wait(every):
            return EXIT_OK


def _apply_once(cfg: Any, dry_run: bool, quiet: bool) -> None:
    """One convergence; ``quiet``: print only what changed."""
    from kbp import config
    actions = config.converge(cfg, dry_run=dry_run)
    verb = "would " if dry_run else ""
    for a in actions:
        where = f" in netns {a.netns}" if a.netns else ""
        if a.op == "keep":
            if not quiet:
                _out(f"{a.dev}{where}: in sync ({a.backend})")
        else:
            _out(f"{a.dev}{where}: {verb}{a.op} ({a.backend}): {a.why}")
        if a.result is not None and a.request is not None:
            for d in a.result.devices:
                rps_notice(d, a.request.keep_rps)
    if not actions and not quiet:
        _out(f"{cfg.path} lists no device and kbpctl serves none: nothing to do")
    busy = [a for a in actions if a.op in ("enable", "reenable") and a.request is not None
            and modespec.spins(a.request.mode)]
    if busy and not dry_run:
        for bname in sorted({a.backend for a in busy}):
            reqs = [a.request for a in busy if a.backend == bname and a.request is not None]
            pollers = {(c, d) for r in reqs for c in (r.cpus or online_cpus()) for d in r.devices}
            prio = reqs[0].resolved(bname).rt_prio
            assert prio is not None
            _warn(busy_notice(bname, pollers, prio))
    for a in actions:
        for n in a.result.notes if a.result is not None else []:
            _warn(f"{PROG}: {n}")


def cmd_exporter(args: argparse.Namespace) -> int:
    from kbp import exporter  # imports prometheus_client: only for this command
    return exporter.run(args.listen, args.textfile, args.interval, args.once, _out,
                        args.config)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from kbp.snapshot import snapshot
    out = {d: snapshot(d, args.netns) for d in args.devices}
    _out(json.dumps(out, indent=2, sort_keys=True))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if list(argv[:2]) == ["bench", "vm"]:     # its own parser: options pass through
        from kbp.bench.cli import run_vm
        return run_vm(list(argv[2:]))
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KbpctlError as e:
        sys.stderr.write(f"{PROG}: {e.message}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted (run 'kbpctl status'; 'kbpctl disable' "
                         "restores a half-done enable)\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
