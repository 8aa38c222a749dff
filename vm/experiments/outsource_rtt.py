"""RT request/response through an outsourced socket against the guest's own stack (issue 27).

One guest, three ways for a host peer's UDP requests to reach the same unmodified RT server
(``sockperf server``) in it, measured in one boot, interleaved, in a shuffled order per
repetition:

=========  ==================================================================================
mode       the request's path
=========  ==================================================================================
napi       host client -> tap -> QEMU virtio-net -> guest IRQ + NET_RX softirq -> server
kbp        the same, the guest's NIC polled by kbp's hybrid poller on the other vCPU
outsource  host client -> host loopback -> kbp-sod's host socket -> one copy into the
           server's pinned pages -> completion on kbp_so's vector (docs/design.md 11)
outsource- the same, kbp_so's callers polling their completion for ``--poll-us`` before they
poll      ask for an interrupt (``poll_us``, design.md 11.10)
outsource- the same, kbp_so's idle path on (``idle_poll_us`` = ``--idle-poll-us``, design.md
idle      11.11): an idle vCPU polls every ring, then announces and halts; the host
          interrupts only vCPUs that announced
=========  ==================================================================================

The client is ``sockperf ping-pong`` in the network namespace that holds both the tap and
kbp-sod's host sockets. Reported per mode: round-trip mean, p50, p99, p99.9 and SD (sockperf's
full log: rx - tx per request, µs), guest interrupts per message (the tap NIC's virtio
vectors, kbp_so's vectors, all device interrupts), NET_RX softirqs per message, and host CPU
per message (QEMU's and kbp-sod's user+system time).

**Under TCG (this machine) every guest-side time is emulated**: the ratios between modes
say which path does less emulated work, not what a KVM host would see. Counts (interrupts,
softirqs, copies) and host CPU seconds are real. On a KVM host run it unchanged with
``--accel kvm``. Usage (repository root, root, a quiet machine: it is a timing run)::

    kbpctl bench vm --scenario outsource-rtt --flavour 6.12-amd64 --reps 3 \\
        --seconds 10 --out out/outsource-rtt

Without the BPF policy (``kbpctl outsource``) the outsourced server cannot be an unmodified
sockperf; ``--server python`` runs one small Python echo server in every mode instead, which
asks for protocol 253 itself in ``outsource``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbp.bench import report, stats
from kbp.bench.report import Column
from kbp.outsource import idle
from kbp.system import access

REPO = Path(__file__).resolve().parents[2]
TAP = "kbpsotap0"
HOST_IP, GUEST_IP, PREFIX = "10.77.0.1", "10.77.0.2", 24
PORT_STACK, PORT_SO = 11111, 11112
CGROUP = "/sys/fs/cgroup/kbp-so-rt"
MODES = ("napi", "kbp", "outsource")
ALL_MODES = (*MODES, "outsource-poll", "outsource-idle")
#: the server's CPU in every mode, and kbp's poller's (its own, as in the paper)
SERVER_CPU, POLL_CPU = "0", "1"
PYECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, int(sys.argv[3]))
s.bind((sys.argv[1], int(sys.argv[2])))
while True:
    d, a = s.recvfrom(65535)
    s.sendto(d, a)
"""

#: with --server python: the host's client (sockperf's client wants a sockperf server), its
#: log in sockperf's full-log format
PYCLIENT = """
import socket, sys, time
host, port, secs, mps, size, log = sys.argv[1:7]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
gap, end, rows = 1 / int(mps), time.monotonic() + float(secs), []
payload, nxt = bytes(int(size)), time.monotonic()
while time.monotonic() < end:
    tx = time.time()
    s.sendto(payload, (host, int(port)))
    try:
        s.recvfrom(65535)
        rows.append((tx, time.time()))
    except TimeoutError:
        rows.append((tx, 0.0))
    nxt += gap
    time.sleep(max(0.0, nxt - time.monotonic()))
with open(log, "w") as f:
    f.write("packet, txTime(sec), rxTime(sec), latency(usec)\\n")
    for i, (tx, rx) in enumerate(rows):
        f.write(f"{i}, {tx:.9f}, {rx:.9f}, {(rx - tx) * 5e5 if rx else 0:.3f}\\n")
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def wait_file(path: Path, timeout: float, alive: subprocess.Popen[bytes] | None = None
              ) -> str:
    end = time.monotonic() + timeout
    while not path.exists():
        if alive is not None and alive.poll() is not None:
            raise SystemExit(f"the VM ended before {path.name} (status {alive.returncode})")
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.05)
    time.sleep(0.05)  # written by rename, but be patient with 9p
    return path.read_text()


def put(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


# ---------------------------------------------------------------------------- guest side

def _guest_counters(virtio: str) -> dict[str, int]:
    # the bench's own readers (rows "<irq> <action>", "LOC", "NET_RX"; kbp_so's file)
    from kbp.bench.sysstat import PROC, read_percpu_table
    from kbp.outsource import procfile

    irqs = {k: sum(v) for k, v in read_percpu_table(PROC / "interrupts").items()}
    dev = {k: v for k, v in irqs.items() if k.split()[0].isdigit()}
    nic = tuple(f" {virtio}-{s}" for s in ("input.0", "output.0", "config"))
    out = {"irq_devices": sum(dev.values()),
           "irq_nic": sum(v for k, v in dev.items() if k.endswith(nic)),
           "irq_kbp_so": sum(v for k, v in dev.items() if k.endswith(" kbp_so")),
           "irq_local_timer": irqs.get("LOC", 0),
           "net_rx": sum(read_percpu_table(PROC / "softirqs").get("NET_RX", []))}
    mod = procfile.read()
    if mod is not None:
        out["so_copies"] = sum(sk.counters.get("copies", 0) for sk in mod.socks)
        # who found the completions, the idle path's work (results.json only)
        out.update({f"so_{k}": v for k, v in mod.counters.items()
                    if k.startswith(("completions_", "idle_")) and k != "idle_poll_us"})
    return out


def _nic_by_mac(mac: str) -> str:
    for d in Path("/sys/class/net").iterdir():
        if (d / "address").read_text().strip() == mac:
            return d.name
    raise SystemExit(f"no guest NIC with MAC {mac}")


def guest(args: argparse.Namespace) -> int:
    xchg = Path(args.xchg)
    plan: list[str] = json.loads(args.plan)
    nic = _nic_by_mac(os.environ["KBP_SO_TAP_MAC"])
    virtio = Path(f"/sys/class/net/{nic}/device").resolve().name
    sh("ip", "addr", "add", f"{GUEST_IP}/{PREFIX}", "dev", nic)
    sh("ip", "link", "set", nic, "up")
    sh("insmod", os.environ["KBP_SO_KO"])
    if "kbp" in plan and os.environ.get("KBP_KO"):
        sh("insmod", os.environ["KBP_KO"])
    os.makedirs(CGROUP, exist_ok=True)
    kbpctl = [sys.executable, "-m", "kbp.cli"]
    policy = args.server == "sockperf" and any(m.startswith("outsource") for m in plan)
    if policy:
        sh(*kbpctl, "outsource", "set", "--cgroup", CGROUP)
    for n, mode in enumerate(plan):
        so = mode.startswith("outsource")
        access.write(idle.PARAMS / "poll_us", args.poll_us if mode == "outsource-poll" else 0)
        idle.set_idle(args.idle_poll_us if mode == "outsource-idle" else 0)
        if mode == "kbp":
            sh(*kbpctl, "enable", nic, "--mode", "hybrid", "--cpus", POLL_CPU)
        ip, port = ("0.0.0.0", PORT_SO) if so else (GUEST_IP, PORT_STACK)
        if args.server == "sockperf":
            cmd = f"exec sockperf server -i {ip} -p {port}"
        else:
            proto = 253 if so else 0
            cmd = f"exec {shlex.quote(sys.executable)} -c {shlex.quote(PYECHO)} {ip} {port} {proto}"
        cmd = f"taskset -pc {SERVER_CPU} $$ >/dev/null && {cmd}"
        if so and policy:
            cmd = f"echo $$ > {CGROUP}/cgroup.procs && {cmd}"
        server = subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        time.sleep(1.5)
        if server.poll() is not None:
            raise SystemExit(f"{mode}: the server exited ({server.returncode})")
        before = _guest_counters(virtio)
        put(xchg / f"ready.{n}", json.dumps({"mode": mode,
                                              "target": "127.0.0.1" if so else GUEST_IP,
                                              "port": port}))
        wait_file(xchg / f"done.{n}", args.seconds * 4 + 120)
        after = _guest_counters(virtio)
        server.send_signal(signal.SIGTERM)
        server.wait()
        if mode == "kbp":
            sh(*kbpctl, "disable", nic)
        put(xchg / f"after.{n}", json.dumps({k: after[k] - before.get(k, 0) for k in after}))
    if policy:
        sh(*kbpctl, "outsource", "clear")
    sh("rmmod", "kbp_so")
    print("OUTSOURCE-RTT-GUEST-DONE", flush=True)
    return 0


# ----------------------------------------------------------------------------- host side

def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def qemu_pid(vm: subprocess.Popen[bytes], tap: str = TAP, tries: int = 600) -> int:
    """QEMU: the rig's child whose command line has this guest's tap (ip netns exec execs
    it); ``tries`` looks 0.1 s apart (a first boot builds modules first)."""
    needle = f"ifname={tap},".encode()
    for _ in range(tries):
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    cmd = (p / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"qemu-system" in cmd and needle in cmd:
                    return int(p.name)
        if vm.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"QEMU of tap {tap} did not start")


def _rtts(log: Path) -> list[float]:
    """Round trips (µs) from sockperf's full log: rx - tx of every answered request."""
    out = []
    rows = False
    for line in log.read_text().splitlines():
        if line.startswith("packet,"):
            rows = True
            continue
        if rows and line.count(",") == 3:
            _, tx, rx, _ = (x.strip() for x in line.split(","))
            if float(rx) > 0:
                out.append((float(rx) - float(tx)) * 1e6)
    return out


def host(args: argparse.Namespace) -> int:
    from vm import outsource  # the guest side needs none of it

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    if not modes or set(modes) - set(ALL_MODES):
        raise SystemExit(f"--modes: some of {','.join(ALL_MODES)}, not {args.modes}")
    plan = [m for rep in range(args.reps) for m in stats.seeded_order(modes, args.seed, rep)]
    ns = f"kbpso-rtt-{os.getpid()}"
    sh("ip", "netns", "add", ns)
    xchg = Path(tempfile.mkdtemp(prefix="xchg-", dir=out))
    vm = None
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        guest_cmd = [sys.executable, "-m", "vm.experiments.outsource_rtt", "guest", "--xchg",
                     str(xchg), "--plan", json.dumps(plan), "--server", args.server,
                     "--seconds", str(args.seconds), "--poll-us", str(args.poll_us),
                     "--idle-poll-us", str(args.idle_poll_us)]
        argv = [sys.executable, "-m", "vm", "run", args.flavour, "--build", "--sod", ns,
                "--sod-tap", TAP, "--sod-dir", str(out / "sod"), "--out", str(xchg),
                "--memory", "1024", "--accel", args.accel, "--timeout",
                str(600 + len(plan) * (args.seconds + 30)), "--log", str(out / "console.log"),
                "--quiet", "--", *guest_cmd]
        vm = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL)
        qemu = qemu_pid(vm)
        outsource.configure_tap(ns, TAP, f"{HOST_IP}/{PREFIX}")
        sod_pid = int(wait_file(out / "sod" / "sod.pid", 60, vm))
        runs = []
        for n, mode in enumerate(plan):
            ready = json.loads(wait_file(xchg / f"ready.{n}", 900, vm))
            assert ready["mode"] == mode, (ready, mode)
            log = out / f"rep{n // len(modes)}-{mode}.csv"
            cpu0 = (_cpu_s(qemu), _cpu_s(sod_pid))
            if args.server == "sockperf":
                client_cmd = ["sockperf", "ping-pong", "-i", ready["target"], "-p",
                              str(ready["port"]), "-t", str(args.seconds), "--mps",
                              str(args.mps), "-m", str(args.size), "--full-log", str(log)]
            else:
                client_cmd = [sys.executable, "-c", PYCLIENT, ready["target"],
                              str(ready["port"]), str(args.seconds), str(args.mps),
                              str(args.size), str(log)]
            client = sh("ip", "netns", "exec", ns, *client_cmd, check=False)
            if client.returncode:
                print(f"{mode}: the client failed ({client.returncode}): "
                      f"{(client.stdout + client.stderr)[-500:]}", flush=True)
            cpu1 = (_cpu_s(qemu), _cpu_s(sod_pid))
            put(xchg / f"done.{n}", "1")
            guest_d = json.loads(wait_file(xchg / f"after.{n}", 120, vm))
            rtt = _rtts(log) if log.exists() else []
            msgs = max(len(rtt), 1)
            runs.append({"mode": mode, "rep": n // len(modes), "sockperf_rc": client.returncode,
                         "rtt_us": stats.summarize(rtt, (50, 99, 99.9)), "messages": len(rtt),
                         "guest": guest_d,
                         "per_message": {k: v / msgs for k, v in guest_d.items()},
                         "host_cpu_us_per_message": {
                             "qemu": (cpu1[0] - cpu0[0]) * 1e6 / msgs,
                             "kbp_sod": (cpu1[1] - cpu0[1]) * 1e6 / msgs}})
            print(f"rep {n // len(modes)} {mode}: {len(rtt)} msgs, mean "
                  f"{runs[-1]['rtt_us']['mean']}", flush=True)
        rc = vm.wait()
        doc = {"command": shlex.join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                        time.gmtime()),
               "flavour": args.flavour, "accel": args.accel, "server": args.server,
               "mps": args.mps, "size": args.size, "seconds": args.seconds, "plan": plan,
               "vm_rc": rc, "runs": runs}
        (out / "results.json").write_text(json.dumps(doc, indent=1))
        print(render(doc))
        return 0 if rc == 0 else 1
    finally:
        if vm is not None and vm.poll() is None:
            vm.send_signal(signal.SIGTERM)
            vm.wait()
        sh("ip", "netns", "del", ns, check=False)


def _metrics(r: dict) -> dict[str, float | None]:
    """The summarised values of one run."""
    return {**{k: r["rtt_us"][k] for k in ("mean", "p50", "p99", "p99.9", "sd")},
            **{k: r["per_message"][k] for k in ("irq_nic", "irq_kbp_so", "irq_devices",
                                                 "net_rx")},
            **r["host_cpu_us_per_message"], "msgs": r["messages"]}


#: the table's columns: the RT round trip (µs), the guest's interrupts and NET_RX softirqs
#: per RT message, the host's CPU per RT message (QEMU's, kbp-sod's) and the messages
RTT_COLUMNS: tuple[Column, ...] = (
    ("mean", "RTT mean", "µs"), ("p50", "p50", "µs"), ("p99", "p99", "µs"),
    ("p99.9", "p99.9", "µs"), ("sd", "SD", "µs"))
IRQ_COLUMNS: tuple[Column, ...] = (
    ("irq_kbp_so", "kbp_so irq/msg", ""), ("irq_nic", "NIC irq/msg", ""),
    ("irq_devices", "device irq/msg", ""), ("net_rx", "NET_RX/msg", ""))
COLUMNS: tuple[Column, ...] = (
    *RTT_COLUMNS, *IRQ_COLUMNS, ("qemu", "host CPU/msg: QEMU", "µs"),
    ("kbp_sod", "kbp-sod", "µs"), ("msgs", "msgs", ""))


def render(doc: dict) -> str:
    """Per mode: each column's median over the repetitions [min-max] and xR, the median of
    its ratios to napi's run of the same repetition (the bench's summary and table)."""
    summ = stats.mode_summaries(doc["runs"], _metrics, base="napi")
    emulated = ": guest times emulated" if doc["accel"] == "tcg" else ""
    head = (f"{doc['flavour']} ({doc['accel'].upper()}{emulated}),"
            f" {doc['mps']} req/s of {doc['size']} B, {doc['seconds']} s, medians of "
            f"{len(doc['plan']) // max(len(summ), 1)} [min-max]; xR: ratio to napi's run of "
            "the same repetition (median)\n")
    return head + "\n" + report.summary_table(
        (([m], s) for m, s in summ.items()), COLUMNS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    g = sub.add_parser("guest", help="(internal) the guest side")
    g.add_argument("--xchg", required=True)
    g.add_argument("--plan", required=True)
    g.add_argument("--server", default="sockperf")
    g.add_argument("--seconds", type=int, default=10)
    g.add_argument("--poll-us", type=int, default=0)
    g.add_argument("--idle-poll-us", type=int, default=0)
    for q in (p,):
        q.add_argument("--flavour", default="6.12-amd64")
        q.add_argument("--modes", default=",".join(MODES),
                       help=f"some of {','.join(ALL_MODES)} (default %(default)s)")
        q.add_argument("--poll-us", type=int, default=200,
                       help="kbp_so's poll_us in outsource-poll (default %(default)s)")
        q.add_argument("--idle-poll-us", type=int, default=2000,
                       help="kbp_so's idle_poll_us in outsource-idle (default %(default)s)")
        q.add_argument("--reps", type=int, default=3)
        q.add_argument("--seconds", type=int, default=10)
        q.add_argument("--mps", type=int, default=1000, help="requests per second")
        q.add_argument("--size", type=int, default=64, help="request bytes")
        q.add_argument("--server", choices=("sockperf", "python"), default="sockperf")
        q.add_argument("--accel", choices=("tcg", "kvm"), default="tcg")
        q.add_argument("--seed", type=int, default=1)
        q.add_argument("--out", default="out/outsource-rtt")
    r = sub.add_parser("render", help="print the table of a results.json again")
    r.add_argument("results")
    args = p.parse_args(argv)
    if args.cmd == "guest":
        return guest(args)
    if args.cmd == "render":
        print(render(json.loads(Path(args.results).read_text())))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespace, tap)")
    return host(args)


if __name__ == "__main__":
    sys.exit(main())
