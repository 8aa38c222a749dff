"""N RT guests at once, each beside a heavy non-RT receiver (issue 28 item 4).

The shape of the outsourcing paper's Figs. 16-18: how the RT round trip, the guests'
interrupts and the host's CPU grow with the number of RT guests, per way of reaching the RT
server. For each N of ``--guests`` (a "round": one boot of N guests at once) every guest
runs, in its own network namespace with its own tap, kbp-sod, lock and output share:

* an unmodified ``sockperf server`` (the RT server), a host ``sockperf ping-pong`` at
  ``--mps`` requests/s from that guest's namespace, and
* ``iperf3 -s`` on the guest's own stack (the tap NIC), a host ``iperf3 -c`` TCP flow into
  it for the same seconds (``--load none``: no such flow; ``--load-bitrate``: iperf3 -b).

==============  =============================================================================
mode            the RT request's path (the iperf3 flow always takes the tap NIC)
==============  =============================================================================
napi            host client -> tap -> QEMU virtio-net -> guest IRQ + NET_RX -> server
kbp             the same, the NIC polled by kbp's hybrid poller (``kbpctl enable``)
outsource       host client -> kbp-sod's host socket -> one copy into the server's pages ->
                completion on kbp_so's vector (the ``kbpctl outsource`` policy, design.md 11)
outsource-idle  the same with ``idle_poll_us`` = ``--idle-poll-us`` in kbp_so during the
                measurement (0 after it); a module without that parameter fails that run
                (its error is in results.json and the table), not the bench
==============  =============================================================================

All N guests measure the same mode at the same time: the steps of a round's plan (the
modes shuffled per repetition, ``--seed``) are synchronised across the guests. Reported per
N, guest and mode (medians over repetitions; "all": over every guest's runs): RT round trip
mean/p50/p99/SD (sockperf's full log, rx - tx, µs) with the ratio to ``napi`` of the same N
and guest (per repetition, then the median), the iperf3 flow's Mbit/s (received), guest
interrupts per RT message (kbp_so's vectors, the tap NIC's virtio vectors, all device
interrupts), NET_RX softirqs per RT message, host CPU per RT message (QEMU's and kbp-sod's
user+system), and the deltas of ``/proc/kbp_so``'s header counters over the run
(``completions_irq``, ``completions_polled`` and whatever else the module reports).
Per-message counts include the iperf3 flow's share: they say what the guest paid per RT
message with the flow beside it.

**Real and emulated.** Under TCG (this machine) every guest-side time -- round trips,
throughput -- is emulated: the ratios say which path does less emulated work, not what a
KVM host would see. Interrupt and softirq counts, copies and host CPU seconds are real.
**Two host cores**: N guests x ``--vcpus`` TCG threads, kbp-sods, sockperf and iperf3
clients all share them, so the rounds contend for the host CPU far beyond the paper's
setup; the bench shows the shape, not KVM numbers. With ``--vcpus 1`` (default; the
paper's RT VMs have one vCPU) the ``kbp`` mode's poller shares the one vCPU with the RT
server and iperf3 (with 2 it gets CPU 1, the server CPU 0). On a KVM host run it unchanged
with ``--accel kvm``. Usage (repository root, root, a quiet machine: it is a timing run)::

    kbpctl bench vm --scenario outsource-scale --flavour 6.12-amd64 \\
        --guests 1,2,4 --reps 3 --seconds 10 --out out/outsource-scale
    .venv/bin/python -m vm.experiments.outsource_scale render out/outsource-scale/results.json

(a worktree without its own .venv and kernel cache: the main checkout's python,
``PYTHONPATH=src`` and ``KBP_VM_CACHE=<main>/.cache/vm``). It writes results.json,
results.md (the tables) and per guest its sockperf logs, console log and kbp-sod's files
under ``OUT/n<N>/g<i>/``. A guest's counters run from its server's start to the end of the
step, so in the first step of a round they include the wait for the other guests' boots (no
RT or iperf3 traffic then: a few timer-driven device interrupts at most).

Each guest gets its own VM lock (``KBP_VM_LOCK``), so a round's guests run at once instead
of one after the other -- and do not wait for other rig users either: check that nothing
else runs first.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kbp.bench import report, stats
from kbp.bench.report import Column
from vm.experiments import outsource_rtt as rtt  # the single-guest bench: helpers

REPO = Path(__file__).resolve().parents[2]
MODES = ("napi", "kbp", "outsource", "outsource-idle")
IPERF_PORT = 5201
SERVER_CPU = "0"
EMULATED = "guest times EMULATED; interrupt/softirq counts and host CPU seconds real"


# ------------------------------------------------------------------------------ the plan

def parse_guests(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]; each N a round."""
    try:
        ns = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--guests: numbers like 1,2,4, not {text!r}") from None
    if not ns or min(ns) < 1:
        raise SystemExit(f"--guests: numbers >= 1, not {text!r}")
    return ns


def parse_modes(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes: some of {','.join(MODES)}, not {text!r}")
    return modes


def build_plan(modes: Sequence[str], reps: int, seed: int, n_guests: int) -> list[str]:
    """The round's steps: every mode once per repetition, shuffled per repetition (seeded by
    ``seed`` and N, so each round has its own order and a rerun the same)."""
    return [m for rep in range(reps)
            for m in stats.seeded_order(modes, seed * 1000 + n_guests, rep)]


@dataclass(frozen=True)
class GuestNames:
    """What must differ between the guests of a round (and from other rig users)."""

    index: int
    netns: str
    tap: str
    lock: Path
    dir: Path

    @property
    def xchg(self) -> Path:
        return self.dir / "xchg"


def guest_names(n_guests: int, out: Path, tag: int) -> list[GuestNames]:
    """Names for the N guests of a round; ``tag`` (the bench's pid) keeps them apart from
    another bench's. Tap names stay within IFNAMSIZ."""
    t = tag % 100000
    return [GuestNames(i, f"kbpscale-{t}-{i}", f"kbpsc{t}g{i}",
                       Path(f"/tmp/kbp-scale-{t}-{i}.lock"), out / f"n{n_guests}" / f"g{i}")
            for i in range(n_guests)]


# ---------------------------------------------------------------------------- guest side

def so_header() -> dict[str, str]:
    """/proc/kbp_so's header line as key=value strings (every key, known or not)."""
    from kbp.outsource import procfile

    mod = procfile.read()
    if mod is None:
        return {}
    return {"state": mod.state, **{k: str(v) for k, v in mod.counters.items()}, **mod.extra}


def header_delta(before: dict[str, str], after: dict[str, str]) -> dict[str, int | str]:
    """after - before for each numeric key; a non-numeric one (state) keeps its after value,
    with ``before->after`` if it changed."""
    out: dict[str, int | str] = {}
    for k, a in after.items():
        b = before.get(k)
        if a.lstrip("-").isdigit() and (b is None or b.lstrip("-").isdigit()):
            out[k] = int(a) - int(b or 0)
        else:
            out[k] = a if b in (None, a) else f"{b}->{a}"
    return out


def set_idle(us: int) -> str | None:
    """The idle path's knob, written as ``kbpctl outsource idle`` writes it
    (:func:`kbp.outsource.idle.set_idle`); its refusal as text, None when it worked."""
    from kbp.errors import KbpctlError
    from kbp.outsource.idle import set_idle as write
    try:
        write(us)
    except KbpctlError as e:
        return str(e)
    return None


def _start_server(mode: str, policy_cgroup: str | None) -> subprocess.Popen[bytes]:
    so = mode.startswith("outsource")
    ip, port = ("0.0.0.0", rtt.PORT_SO) if so else (rtt.GUEST_IP, rtt.PORT_STACK)
    cmd = f"taskset -pc {SERVER_CPU} $$ >/dev/null && exec sockperf server -i {ip} -p {port}"
    if so and policy_cgroup:
        cmd = f"echo $$ > {policy_cgroup}/cgroup.procs && {cmd}"
    return subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _snapshot(virtio: str) -> tuple[dict[str, int], dict[str, str]]:
    return rtt._guest_counters(virtio), so_header()


def _guest_step(args: argparse.Namespace, n: int, mode: str, nic: str, virtio: str) -> None:
    xchg, kbpctl = Path(args.xchg), [sys.executable, "-m", "kbp.cli"]
    so = mode.startswith("outsource")
    error = set_idle(args.idle_poll_us) if mode == "outsource-idle" else None
    if error:
        rtt.put(xchg / f"ready.{n}", json.dumps({"mode": mode, "error": error}))
        rtt.wait_file(xchg / f"done.{n}", 3600)
        rtt.put(xchg / f"after.{n}", json.dumps({"error": error}))
        return
    if mode == "kbp":
        rtt.sh(*kbpctl, "enable", nic, "--mode", "hybrid", "--cpus", args.poll_cpu)
    server = _start_server(mode, rtt.CGROUP if so else None)
    time.sleep(1.5)
    if server.poll() is not None:
        raise SystemExit(f"{mode}: the server exited ({server.returncode})")
    before = _snapshot(virtio)
    rtt.put(xchg / f"ready.{n}", json.dumps({
        "mode": mode, "target": "127.0.0.1" if so else rtt.GUEST_IP,
        "port": rtt.PORT_SO if so else rtt.PORT_STACK}))
    rtt.wait_file(xchg / f"done.{n}", 3600)
    after = _snapshot(virtio)
    server.send_signal(signal.SIGTERM)
    server.wait()
    if mode == "kbp":
        rtt.sh(*kbpctl, "disable", nic)
    if mode == "outsource-idle":
        error = set_idle(0)
    rtt.put(xchg / f"after.{n}", json.dumps({
        "guest": {k: v - before[0].get(k, 0) for k, v in after[0].items()},
        "so_header": header_delta(before[1], after[1]), "error": error}))


def guest(args: argparse.Namespace) -> int:
    plan: list[str] = json.loads(args.plan)
    nic = rtt._nic_by_mac(os.environ["KBP_SO_TAP_MAC"])
    virtio = Path(f"/sys/class/net/{nic}/device").resolve().name
    rtt.sh("ip", "addr", "add", f"{rtt.GUEST_IP}/{rtt.PREFIX}", "dev", nic)
    rtt.sh("ip", "link", "set", nic, "up")
    rtt.sh("insmod", os.environ["KBP_SO_KO"])
    if "kbp" in plan and os.environ.get("KBP_KO"):
        rtt.sh("insmod", os.environ["KBP_KO"])
    os.makedirs(rtt.CGROUP, exist_ok=True)
    kbpctl = [sys.executable, "-m", "kbp.cli"]
    policy = any(m.startswith("outsource") for m in plan)
    if policy:
        rtt.sh(*kbpctl, "outsource", "set", "--cgroup", rtt.CGROUP)
    load = None
    if args.load == "iperf3":
        load = subprocess.Popen(["iperf3", "-s", "-B", rtt.GUEST_IP, "-p", str(IPERF_PORT)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for n, mode in enumerate(plan):
        _guest_step(args, n, mode, nic, virtio)
    if load is not None:
        load.terminate()
        load.wait()
    if policy:
        rtt.sh(*kbpctl, "outsource", "clear")
    rtt.sh("rmmod", "kbp_so")
    print("OUTSOURCE-SCALE-GUEST-DONE", flush=True)
    return 0


# ----------------------------------------------------------------------------- host side

def iperf_mbps(text: str) -> float | None:
    """Received Mbit/s from ``iperf3 -J``'s output; None when it failed."""
    try:
        doc = json.loads(text)
        return float(doc["end"]["sum_received"]["bits_per_second"]) / 1e6
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class Booted:
    """A running guest of a round: its rig process, QEMU and kbp-sod."""

    names: GuestNames
    vm: subprocess.Popen[bytes]
    qemu: int
    sod: int


def _boot(args: argparse.Namespace, g: GuestNames, plan: list[str], n_guests: int) -> Booted:
    """Start one guest, wait for its QEMU (so builds are done before the next starts),
    configure its tap and find its kbp-sod."""
    rtt.sh("ip", "netns", "add", g.netns)
    rtt.sh("ip", "-n", g.netns, "link", "set", "lo", "up")
    g.xchg.mkdir(parents=True, exist_ok=True)
    for stale in g.xchg.iterdir():
        stale.unlink()
    guest_cmd = [sys.executable, "-m", "vm.experiments.outsource_scale", "guest", "--xchg",
                 str(g.xchg),
                 "--plan", json.dumps(plan), "--idle-poll-us", str(args.idle_poll_us),
                 "--load", args.load, "--poll-cpu", "1" if args.vcpus > 1 else "0"]
    argv = [sys.executable, "-m", "vm", "run", args.flavour, "--build", "--sod", g.netns,
            "--sod-tap", g.tap, "--sod-dir", str(g.dir / "sod"), "--out", str(g.xchg),
            "--memory", str(args.memory), "--smp", str(args.vcpus), "--accel", args.accel,
            "--env", f"PYTHONPATH={REPO / 'src'}:{REPO}", "--timeout",
            str(900 + len(plan) * (args.seconds + 60) * n_guests),
            "--log", str(g.dir / "console.log"), "--quiet", "--", *guest_cmd]
    env = {**os.environ, "KBP_VM_LOCK": str(g.lock)}
    vm = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, env=env)
    qemu = rtt.qemu_pid(vm, g.tap, tries=6000)
    from vm import outsource  # the guest side needs none of it

    outsource.configure_tap(g.netns, g.tap, f"{rtt.HOST_IP}/{rtt.PREFIX}")
    sod = int(rtt.wait_file(g.dir / "sod" / "sod.pid", 120, vm))
    return Booted(g, vm, qemu, sod)


def _clients(args: argparse.Namespace, b: Booted, ready: dict, log: Path
             ) -> tuple[subprocess.Popen[str], subprocess.Popen[str] | None]:
    ns = ["ip", "netns", "exec", b.names.netns]
    rt = subprocess.Popen(
        [*ns, "sockperf", "ping-pong", "-i", ready["target"], "-p", str(ready["port"]), "-t",
         str(args.seconds), "--mps", str(args.mps), "-m", str(args.size), "--full-log",
         str(log)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if args.load == "none":
        return rt, None
    bitrate = ["-b", args.load_bitrate] if args.load_bitrate else []
    load = subprocess.Popen([*ns, "iperf3", "-c", rtt.GUEST_IP, "-p", str(IPERF_PORT), "-t",
                             str(args.seconds), "-J", *bitrate],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return rt, load


def _cpu(b: Booted) -> tuple[float, float]:
    return rtt._cpu_s(b.qemu), rtt._cpu_s(b.sod)


def _record(b: Booted, mode: str, rep: int, n: int, log: Path, rt_rc: int | None,
            mbps: float | None, cpu: tuple[float, float], after: dict) -> dict:
    rtts = rtt._rtts(log) if log.exists() else []
    msgs = max(len(rtts), 1)
    counters = after.get("guest", {})
    return {"guest": b.names.index, "mode": mode, "rep": rep, "step": n,
            "error": after.get("error"), "sockperf_rc": rt_rc, "messages": len(rtts),
            "rtt_us": stats.summarize(rtts, (50, 99)), "throughput_mbps": mbps,
            "guest_counters": counters,
            "per_message": {k: v / msgs for k, v in counters.items()},
            "host_cpu_us_per_message": {"qemu": cpu[0] * 1e6 / msgs,
                                        "kbp_sod": cpu[1] * 1e6 / msgs},
            "so_header": after.get("so_header", {})}


def _step(args: argparse.Namespace, booted: list[Booted], n: int, mode: str, rep: int
          ) -> list[dict]:
    """One synchronised measurement: every guest's clients at once."""
    readies = [json.loads(rtt.wait_file(b.names.xchg / f"ready.{n}", 1800, b.vm))
               for b in booted]
    for b, r in zip(booted, readies, strict=True):
        assert r["mode"] == mode, (b.names, r, mode)
    logs = [b.names.dir / f"rep{rep}-{mode}.csv" for b in booted]
    cpu0 = [_cpu(b) for b in booted]
    running = [None if "error" in r else _clients(args, b, r, log)
               for b, r, log in zip(booted, readies, logs, strict=True)]
    outs = []
    for c in running:
        if c is None:
            outs.append((None, None))
            continue
        rt_out = c[0].communicate()[0]
        if c[0].returncode:
            print(f"{mode}: sockperf failed ({c[0].returncode}): {rt_out[-300:]}", flush=True)
        mbps = iperf_mbps(c[1].communicate()[0]) if c[1] else None
        if c[1] and mbps is None:
            print(f"{mode}: iperf3 failed ({c[1].returncode})", flush=True)
        outs.append((c[0].returncode, mbps))
    cpu1 = [_cpu(b) for b in booted]
    for b in booted:
        rtt.put(b.names.xchg / f"done.{n}", "1")
    recs = []
    for i, b in enumerate(booted):
        after = json.loads(rtt.wait_file(b.names.xchg / f"after.{n}", 300, b.vm))
        cpu = (cpu1[i][0] - cpu0[i][0], cpu1[i][1] - cpu0[i][1])
        recs.append(_record(b, mode, rep, n, logs[i], outs[i][0], outs[i][1], cpu, after))
    return recs


def run_round(args: argparse.Namespace, out: Path, n_guests: int, plan: list[str]) -> dict:
    names = guest_names(n_guests, out, os.getpid())
    booted: list[Booted] = []
    runs: list[dict] = []
    try:
        for g in names:
            booted.append(_boot(args, g, plan, n_guests))
        per_rep = len(plan) // max(args.reps, 1)
        for n, mode in enumerate(plan):
            recs = _step(args, booted, n, mode, n // per_rep)
            runs += recs
            print(f"N={n_guests} rep {n // per_rep} {mode}: " + ", ".join(
                f"g{r['guest']} " + (f"FAILED ({r['error']})" if r["error"] else
                                     f"{r['messages']} msgs mean {report.fmt(r['rtt_us']['mean'])}")
                for r in recs), flush=True)
        rcs = [b.vm.wait() for b in booted]
    finally:
        for b in booted:
            if b.vm.poll() is None:
                b.vm.send_signal(signal.SIGTERM)
                b.vm.wait()
        for g in names:
            rtt.sh("ip", "netns", "del", g.netns, check=False)
            g.lock.unlink(missing_ok=True)
    return {"guests": n_guests, "plan": plan, "vm_rc": rcs, "runs": runs}


def host(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    modes = parse_modes(args.modes)
    doc = {"command": shlex.join(sys.argv), "flavour": args.flavour, "accel": args.accel,
           "vcpus": args.vcpus, "memory_mb": args.memory, "mps": args.mps, "size": args.size,
           "seconds": args.seconds, "reps": args.reps, "load": args.load,
           "load_bitrate": args.load_bitrate, "idle_poll_us": args.idle_poll_us,
           "note": EMULATED, "rounds": []}
    for n_guests in parse_guests(args.guests):
        plan = build_plan(modes, args.reps, args.seed, n_guests)
        doc["rounds"].append(run_round(args, out, n_guests, plan))
        doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        (out / "results.json").write_text(json.dumps(doc, indent=1))
    text = render(doc)
    (out / "results.md").write_text(text + "\n")
    print(text)
    return 0 if all(rc == 0 for r in doc["rounds"] for rc in r["vm_rc"]) else 1


# ------------------------------------------------------------------ summary and rendering

def _metrics(r: dict) -> dict[str, float | None]:
    """The summarised metrics of one run (None where the run has none)."""
    rt, pm, cpu = r["rtt_us"], r["per_message"], r["host_cpu_us_per_message"]
    ok = not r.get("error") and r["messages"] > 0
    return {"mean": rt["mean"], "p50": rt["p50"], "p99": rt["p99"], "sd": rt["sd"],
            "mbps": r.get("throughput_mbps"),
            "irq_kbp_so": pm.get("irq_kbp_so") if ok else None,
            "irq_nic": pm.get("irq_nic") if ok else None,
            "irq_devices": pm.get("irq_devices") if ok else None,
            "net_rx": pm.get("net_rx") if ok else None,
            "cpu": cpu["qemu"] + cpu["kbp_sod"] if ok else None,
            "cpu_qemu": cpu["qemu"] if ok else None,
            "cpu_sod": cpu["kbp_sod"] if ok else None,
            "msgs": float(r["messages"]) if not r.get("error") else None}


def _so_header(r: dict) -> dict[str, float | None]:
    """The run's /proc/kbp_so header counters (their change over the run)."""
    return {k: v for k, v in (r.get("so_header") or {}).items() if isinstance(v, int)}


def _rows(guest: int | str, runs: list[dict]) -> list[dict]:
    """One row per mode: the summary of its runs (kbp.bench.stats.mode_summaries: medians,
    spread, ratios to napi's run of the same guest and repetition), its failures, and the
    summary of the kbp_so header counters."""
    summ = stats.mode_summaries(runs, _metrics, base="napi", pair=("guest", "rep"))
    so = stats.mode_summaries(runs, _so_header, base="")        # counts: no ratios
    rows = []
    for mode, s in summ.items():
        rs = [r for r in runs if r["mode"] == mode]
        errors = [r["error"] for r in rs if r.get("error")]
        rows.append({"guest": guest, "mode": mode, "runs": len(rs), "failed": len(errors),
                     "errors": sorted(set(errors)), "summary": s, "so_header": so[mode]})
    return rows


def summarize_round(rnd: dict) -> list[dict]:
    """Rows per guest and mode, then "all" (every guest's runs) per mode: medians over the
    repetitions, ratios to napi of the same guest and repetition."""
    runs = rnd["runs"]
    modes = sorted({r["mode"] for r in runs},
                   key=lambda m: (MODES.index(m) if m in MODES else len(MODES), m))
    runs = sorted(runs, key=lambda r: modes.index(r["mode"]))
    guests = sorted({r["guest"] for r in runs})
    rows = [row for g in guests for row in _rows(g, [r for r in runs if r["guest"] == g])]
    if len(guests) > 1:
        rows += _rows("all", runs)
    return rows


#: the table's columns: the RT round trip, the iperf3 flow, the guest's interrupts and
#: NET_RX per RT message, the host's CPU per RT message (QEMU + kbp-sod, each) and messages
COLUMNS: tuple[Column, ...] = (
    *(c for c in rtt.RTT_COLUMNS if c[0] != "p99.9"), ("mbps", "non-RT", "Mbit/s"),
    *rtt.IRQ_COLUMNS,
    ("cpu", "host CPU/msg (QEMU+sod)", "µs"), ("cpu_qemu", "QEMU", "µs"),
    ("cpu_sod", "kbp-sod", "µs"), ("msgs", "msgs", ""))
LABELS = ("guest", "mode")


def _label(row: dict) -> list[str]:
    """The row's guest and mode, and its failures: "outsource-idle (1 of 1 failed: ...)"."""
    failed = (f" ({row['failed']} of {row['runs']} failed: {'; '.join(row['errors'])})"
              if row["failed"] else "")
    return [str(row["guest"]), row["mode"] + failed]


def _so_table(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k, a in r["so_header"].items()
                              if a.get("median")))
    if not keys:
        return []
    return ["", "/proc/kbp_so header, change over the run (medians [min-max]):", "",
            report.summary_table(((_label(r), r["so_header"]) for r in rows),
                                 [(k, k, "") for k in keys], LABELS)]


def render(doc: dict) -> str:
    """One table per N: per cell the median over the repetitions [min-max] and xR, the
    median of the ratios to napi's run of the same N, guest and repetition."""
    head = (f"{doc['flavour']} ({doc['accel'].upper()}"
            f"{': ' + EMULATED if doc['accel'] == 'tcg' else ''}), {doc['vcpus']} vCPU per "
            f"guest, RT {doc['mps']} req/s of {doc['size']} B, non-RT load {doc['load']}"
            f"{' ' + doc['load_bitrate'] if doc.get('load_bitrate') else ''}, "
            f"{doc['seconds']} s per run, medians of {doc['reps']} rep(s) [min-max]; xR: "
            "ratio to napi of the same N, guest and repetition (median)")
    lines = [head]
    for rnd in doc["rounds"]:
        rows = summarize_round(rnd)
        rcs = ", ".join(str(rc) for rc in rnd["vm_rc"])
        lines += ["", f"### N = {rnd['guests']} guest(s) (VM exit status {rcs})", "",
                  report.summary_table(((_label(r), r["summary"]) for r in rows), COLUMNS,
                                       LABELS)]
        lines += _so_table(rows)
    return "\n".join(lines)


# --------------------------------------------------------------------------------- main

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    g = sub.add_parser("guest", help="(internal) the guest side")
    g.add_argument("--xchg", required=True)
    g.add_argument("--plan", required=True)
    g.add_argument("--idle-poll-us", type=int, default=200)
    g.add_argument("--load", default="iperf3")
    g.add_argument("--poll-cpu", default="0")
    p.add_argument("--flavour", default="6.12-amd64")
    p.add_argument("--guests", default="1,2,4", help="N per round (default %(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="default %(default)s")
    p.add_argument("--idle-poll-us", type=int, default=200,
                   help="kbp_so's idle_poll_us in outsource-idle (default %(default)s)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--mps", type=int, default=1000, help="RT requests per second")
    p.add_argument("--size", type=int, default=64, help="RT request bytes")
    p.add_argument("--vcpus", type=int, default=1, help="vCPUs per guest (default 1)")
    p.add_argument("--memory", type=int, default=768, help="MiB per guest (default 768)")
    p.add_argument("--load", choices=("iperf3", "none"), default="iperf3",
                   help="the non-RT receiver's flow (default iperf3: TCP, host -> guest)")
    p.add_argument("--load-bitrate", default="",
                   help="iperf3 -b for that flow (default: iperf3's, unlimited for TCP)")
    p.add_argument("--accel", choices=("tcg", "kvm"), default="tcg")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="out/outsource-scale")
    r = sub.add_parser("render", help="print the tables of a results.json again")
    r.add_argument("results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "guest":
        return guest(args)
    if args.cmd == "render":
        print(render(json.loads(Path(args.results).read_text())))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, taps)")
    return host(args)


if __name__ == "__main__":
    sys.exit(main())
