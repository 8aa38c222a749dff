"""RT latency and the heavy flow's rate with RT and non-RT receive work on one CPU .

Runs in a guest of the VM rig, as root; prints a table and, last, one JSON line prefixed
``CLASS-SPLIT-RESULT``. From the repository root on the host (one flavour at a time, on a
quiet machine: it is a timing run)::

    kbpctl bench vm --flavour 7.2-amd64 --scenario class-split [options below]

(which runs ``python3 -m vm run 7.2-amd64 --build -- .venv/bin/python -m
vm.experiments.class_split [options]``; ``kbpctl bench vm --scenario class-split -- --help``
shows the options).

The machine (conftest.build_topology): NIC0 in the init netns, its interrupts on POLL_CPU,
the RT server there; NIC1 in netns kbppeer, interrupts on the other CPU, the RT client
there. RT flow: ``sockperf ping-pong`` 64 B at ``--mps`` to a sockperf server pinned to
POLL_CPU at SCHED_FIFO ``--app-prio``. Heavy flow: the test NIC (vm/testdata/kbp_test_nic)
delivering ``--rate`` frames/s on each of 2 queues, each costing the receiving context
``--cost-ns`` of CPU (the protocol work of a heavy flow, made in the guest's kernel, so the
emulator's cost of a user-space sender does not decide the rate). Its queues' "interrupts"
are on POLL_CPU, except in ``exclusive``, where they are on the other CPU.

Modes (the bench's names where the bench has one):

=============  ===========================  ==============================================
mode           RT NIC0                      heavy device (test NIC)
=============  ===========================  ==============================================
napi-idle      softirq                      not loaded (the no-contention baseline)
napi           softirq                      softirq, POLL_CPU
hybrid         kbp/N (rt, FIFO 50)          softirq, POLL_CPU (kbp alone: today's mode)
hybrid-part    kbp/N (rt, FIFO 50)          kbpn/N (non-rt, SCHED_OTHER, quota 8)
threaded-part  kbp/N (rt, FIFO 50)          stock threaded NAPI thread, SCHED_OTHER, POLL_CPU
exclusive      kbp/N (rt, FIFO 50)          softirq on the other CPU (the placement remedy)
=============  ===========================  ==============================================

``--quotas 1,2,4,8`` replaces ``hybrid-part`` by one mode per non-rt quota
(``hybrid-part:q1`` ...), interleaved with the others in every repetition: the quota sweep.

Timings in the guest are emulated (QEMU TCG): compare modes within one run. Counts (frames
delivered, wake-ups, gave_way) are real, and so is the accounting of POLL_CPU's time
(``cpu_*``: shares of the window from /proc/stat and the tasks' utime+stime), which says
where the CPU went when the heavy rate falls: ``cpu_heavy_cost`` is the frames' own cost
(rate x ``--cost-ns``), ``rt_rps`` the RT round trips served per second (sockperf
ping-pong is closed-loop: a mode that answers faster serves more of them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from kbp import kmod, names, sysinfo
from kbp.bench import report, stats
from kbp.bench.report import Column
from kbp.system import access
from vm.guest_tests.conftest import (
    NS,
    POLL_CPU,
    SERVER_IP,
    build_topology,
    load_module,
    net_rx_softirqs,
    sh,
    spawn,
    stop,
)

OTHER_CPU = 1 - POLL_CPU
KO = Path(os.environ.get("KBP_TEST_MODULES", "/nonexistent")) / "kbp_test_nic.ko"
DEV = "ktn0"
MODES = ("napi-idle", "napi", "hybrid", "hybrid-part", "threaded-part", "exclusive")
RT_PRIO = 50


def ktn_load(cpu: int, rate: int, cost_ns: int) -> None:
    sh(f"insmod {KO} queues=2 cpus={cpu},{cpu} rate={rate} cost_ns={cost_ns}")
    sh(f"ip link set {DEV} up")


def ktn_unload() -> None:
    sh("rmmod kbp_test_nic", check=False)


def ktn_totals() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/sys/class/net/{DEV}/ktn/stats").read_text().splitlines()[1:]:
        w = line.split()[1:]
        for k, v in zip(w[::2], w[1::2], strict=True):
            out[k] = out.get(k, 0) + int(v)
    return out


STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_stat(cpu: int) -> dict[str, int]:
    """/proc/stat's line of ``cpu`` (clock ticks by kind)."""
    for line in Path("/proc/stat").read_text().splitlines():
        w = line.split()
        if w[0] == f"cpu{cpu}":
            return dict(zip(STAT_FIELDS, (int(x) for x in w[1:9]), strict=True))
    raise AssertionError(f"no cpu{cpu} line in /proc/stat")


def task_ticks(pid: int) -> int:
    """utime + stime of one task, in clock ticks (0 if it is gone)."""
    try:
        w = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(w[11]) + int(w[12])


def roles(server_pid: int, pollers: dict[str, list[kmod.Poller]]) -> dict[str, list[int]]:
    """The tasks whose CPU time the run accounts, by role: POLL_CPU's pollers of each class
    (``poll_cpu_pollers``, by the module's word: their threads are per device,
    ``kbp/<cpu>:<dev>``, so no fixed name finds them), the NAPI threads of the test NIC,
    POLL_CPU's ksoftirqd and ktimers (PREEMPT_RT), the RT server (sockperf under chrt and
    taskset, which exec in place: its pid is the server's)."""
    out: dict[str, list[int]] = {"rt_poller": [], "nrt_poller": [], "napi_threads": [],
                                 "ksoftirqd": [], "ktimers": [], "server": [server_pid]}
    for role, ps in pollers.items():
        out[role] += [p.pid for p in ps if p.pid]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            c = (d / "comm").read_text().strip()
        except OSError:
            continue
        role = {f"ksoftirqd/{POLL_CPU}": "ksoftirqd", f"ktimers/{POLL_CPU}": "ktimers"}.get(c)
        if role is None and c.startswith(f"napi/{DEV}"):
            role = "napi_threads"
        if role:
            out[role].append(int(d.name))
    return out


def role_ticks(r: dict[str, list[int]]) -> dict[str, int]:
    return {k: sum(task_ticks(p) for p in pids) for k, pids in r.items()}


def base_and_quota(mode: str, args: argparse.Namespace) -> tuple[str, int | None]:
    """``hybrid-part:q4`` -> ("hybrid-part", 4); other modes keep ``--quota``."""
    base, _, q = mode.partition(":q")
    return base, int(q) if q else args.quota


def setup(mode: str, nic0: str, args: argparse.Namespace) -> None:
    mode, quota = base_and_quota(mode, args)
    if mode != "napi-idle":
        # loaded idle, the load started after the attaches: a NAPI kept scheduled by a load
        # that fills its CPU never goes idle in softirq, and kbp takes a NAPI over only when
        # it does (a saturating --rate left every frame in softirq, nrt_packets 0)
        ktn_load(OTHER_CPU if mode == "exclusive" else POLL_CPU, 0, args.cost_ns)
    if mode not in ("napi-idle", "napi"):
        kmod.attach(nic0, cpu=POLL_CPU, mode="hybrid", rt_prio=RT_PRIO)
    if mode == "hybrid-part":
        kmod.attach(DEV, cpu=POLL_CPU, mode="hybrid", cls="non-rt", quota=quota)
    if mode == "threaded-part":
        access.write(access.net_path(DEV, "threaded"), 1)
        pids = [t.pid for t in sysinfo.find_napi_threads(DEV)]
        assert pids, "no napi/ktn0-* threads"
        for pid in pids:
            os.sched_setaffinity(pid, {POLL_CPU})
    if mode != "napi-idle":   # the hrtimers pick the rate up within a second (--settle)
        access.write("/sys/module/kbp_test_nic/parameters/rate", args.rate)


def teardown(nic0: str) -> None:
    for d in kmod.devices():
        kmod.detach(d.ifname)
    ktn_unload()
    deadline = time.monotonic() + 10
    while kmod.pollers() and time.monotonic() < deadline:
        time.sleep(0.05)


SOCKPERF_TAILS = {"p99": "99.000", "p99.9": "99.900", "max": "<MAX> observation"}


def parse_sockperf(out: str) -> dict[str, float]:
    r: dict[str, float] = {}
    m = re.search(r"avg-lat(?:ency)?=\s*([\d.]+)\s*\(std-dev=\s*([\d.]+)", out)
    if m:
        r["mean"], r["sd"] = float(m.group(1)), float(m.group(2))
    for k, label in SOCKPERF_TAILS.items():
        pat = (r"<MAX> observation\s*=\s*([\d.]+)" if k == "max"
               else rf"percentile {re.escape(label)}\s*=\s*([\d.]+)")
        m = re.search(pat, out)
        if m:
            r[k] = float(m.group(1))
    m = re.search(r"Total (\d+) observations", out)
    r["n"] = float(m.group(1)) if m else 0.0
    m = re.search(r"# dropped messages = (\d+)", out)
    r["dropped"] = float(m.group(1)) if m else -1.0
    return r


def poll_cpu_pollers(pollers: list[kmod.Poller]) -> dict[str, list[kmod.Poller]]:
    """POLL_CPU's pollers (of the module's ``pollers``, read once) by role: rt_poller (class
    rt, or a module without classes), nrt_poller (class non-rt)."""
    out: dict[str, list[kmod.Poller]] = {"rt_poller": [], "nrt_poller": []}
    for p in pollers:
        if p.cpu == POLL_CPU:
            out["nrt_poller" if p.cls == names.CLASS_NON_RT else "rt_poller"].append(p)
    return out


def first(pollers: list[kmod.Poller]) -> kmod.Poller | None:
    return pollers[0] if pollers else None


def one_run(mode: str, nic0: str, args: argparse.Namespace) -> dict[str, Any]:
    setup(mode, nic0, args)
    server = spawn(["chrt", "-f", str(args.app_prio), "taskset", "-c", str(POLL_CPU),
                    "sockperf", "server", "-i", SERVER_IP, "-p", "11111"])
    try:
        time.sleep(args.settle)
        k0 = ktn_totals() if mode != "napi-idle" else {}
        ps, rx0 = poll_cpu_pollers(kmod.pollers()), net_rx_softirqs()
        p0, n0, who = first(ps["rt_poller"]), first(ps["nrt_poller"]), roles(server.pid, ps)
        c0, w0 = cpu_stat(POLL_CPU), role_ticks(who)
        t0 = time.monotonic()
        client = ("ping-pong" if args.client == "pp" else
                  "under-load --reply-every 1")
        out = sh(f"taskset -c {OTHER_CPU} sockperf {client} -i {SERVER_IP} -p 11111 "
                 f"-t {args.seconds} --mps {args.mps} -m 64", ns=NS,
                 timeout=args.seconds * 6 + 60).stdout
        dt = time.monotonic() - t0
        c1, w1 = cpu_stat(POLL_CPU), role_ticks(who)
        k1 = ktn_totals() if mode != "napi-idle" else {}
        ps, rx1 = poll_cpu_pollers(kmod.pollers()), net_rx_softirqs()
        p1, n1 = first(ps["rt_poller"]), first(ps["nrt_poller"])
    finally:
        stop(server)
        teardown(nic0)
    r: dict[str, Any] = {"mode": mode, **parse_sockperf(out)}
    r["rt_rps"] = r["n"] / dt
    # Where POLL_CPU's time went (shares of the window, from /proc/stat and the tasks'
    # utime+stime: real accounting of emulated time)
    dc = {k: c1[k] - c0[k] for k in STAT_FIELDS}
    total_ticks = max(1, sum(dc.values()))
    r["cpu_busy"] = 1 - (dc["idle"] + dc["iowait"]) / total_ticks
    for k in ("softirq", "irq", "steal"):
        r[f"cpu_{k}"] = dc[k] / total_ticks
    for k, v in w1.items():
        r[f"cpu_{k}"] = (v - w0[k]) / total_ticks
    if k0:
        r["heavy_fps"] = (k1["delivered"] - k0["delivered"]) / dt
        # the CPU the heavy frames' own cost took (a busy-wait of --cost-ns each)
        r["cpu_heavy_cost"] = r["heavy_fps"] * args.cost_ns / 1e9
        r["heavy_missed"] = k1["missed"] - k0["missed"]
        r["heavy_lost"] = (k1["gaps"] - k0["gaps"]) - (k1["ring_dropped"] - k0["ring_dropped"])
        # who received the heavy frames (check before trusting a comparison)
        for k in ("by_kbp", "by_kbpn", "by_softirq", "by_other"):
            r[f"heavy_{k}"] = k1[k] - k0[k]
    r["net_rx_poll_cpu"] = rx1[POLL_CPU] - rx0[POLL_CPU]
    if p0 and p1:
        w = p1.wakeups - p0.wakeups
        r["rt_wakeups"] = w
        r["rt_wake_delay_mean_us"] = ((p1.wake_delay_ns - p0.wake_delay_ns) / max(1, p1.sleeps
                                      - p0.sleeps) / 1000)
        r["rt_wake_delay_max_us"] = p1.wake_delay_max_ns / 1000
    if n0 and n1:
        r["gave_way"] = n1.gave_way - n0.gave_way
        r["nrt_packets"] = n1.packets - n0.packets
    return r


#: the table's columns (a run's keys): sockperf's latency (RTT/2), the heavy rate, the RT
#: poller's wake-ups, what the non-rt poller gave away, POLL_CPU's NET_RX softirqs and the
#: shares of its time (cpu_*)
COLUMNS: tuple[Column, ...] = (
    ("mean", "mean", "us"), ("sd", "sd", "us"), ("p99", "p99", "us"),
    ("p99.9", "p99.9", "us"), ("max", "max", "us"), ("heavy_fps", "heavy_fps", "frames/s"),
    ("rt_wake_delay_mean_us", "rt_wake_delay_mean", "us"),
    ("rt_wake_delay_max_us", "rt_wake_delay_max", "us"), ("gave_way", "gave_way", ""),
    ("net_rx_poll_cpu", "net_rx_poll_cpu", ""), ("rt_rps", "rt_rps", "/s"),
    *((c, c, "share") for c in ("cpu_busy", "cpu_heavy_cost", "cpu_softirq", "cpu_rt_poller",
                                "cpu_nrt_poller", "cpu_napi_threads", "cpu_server",
                                "cpu_ksoftirqd", "cpu_ktimers")))


def table(results: list[dict[str, Any]]) -> str:
    """Per mode (MODES' order): each column's median over the repetitions, its spread and
    the median of its ratios to napi's run of the same repetition (the bench's summary and
    table, kbp.bench.stats.mode_summaries and kbp.bench.report.summary_table)."""
    rank = {m: i for i, m in enumerate(MODES)}
    runs = sorted(results, key=lambda r: rank.get(r["mode"].partition(":q")[0], len(MODES)))
    summ = stats.mode_summaries(runs, lambda r: {c: r.get(c) for c, _, _ in COLUMNS},
                                base="napi")
    return report.summary_table((([m], s) for m, s in summ.items()),
                                COLUMNS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--settle", type=float, default=1.5)
    ap.add_argument("--mps", type=int, default=1000, help="RT requests per second")
    ap.add_argument("--client", choices=("pp", "ul"), default="pp",
                    help="pp: sockperf ping-pong (closed loop: the next request waits for "
                         "the reply, so a slower mode serves fewer); ul: under-load "
                         "--reply-every 1 (open loop: --mps requests/s in every mode, so "
                         "every mode carries the same RT work)")
    ap.add_argument("--rate", type=int, default=8000, help="heavy frames/s per queue (2)")
    ap.add_argument("--cost-ns", type=int, default=50000, help="CPU per heavy frame")
    ap.add_argument("--quota", type=int, default=None, help="non-rt quota (default: 8)")
    ap.add_argument("--quotas", default="",
                    help="comma list: run hybrid-part once per quota (modes hybrid-part:qN), "
                         "interleaved with the other modes")
    ap.add_argument("--app-prio", type=int, default=40, help="RT server's SCHED_FIFO prio")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if args.quotas:
        modes = [m for m in modes if m != "hybrid-part"] + [
            f"hybrid-part:q{int(q)}" for q in args.quotas.split(",") if q]
    bad = {m for m in modes if base_and_quota(m, args)[0] not in MODES}
    if bad:
        ap.error(f"unknown modes {sorted(bad)}: use {', '.join(MODES)}")
    load_module()
    t = build_topology()
    results: list[dict[str, Any]] = []
    orders = []
    for rep in range(args.reps):
        order = stats.seeded_order(modes, args.seed, rep)
        orders.append(order)
        for m in order:
            r = one_run(m, t.nic0, args)
            r["rep"] = rep
            results.append(r)
            print(json.dumps(r), flush=True)
    print(f"kernel {os.uname().release} ({os.uname().version}); timings emulated (TCG); "
          f"sockperf latency = RTT/2 in us; per cell the median of {args.reps} "
          f"repetitions [min-max] and xR, the median of the ratios to napi's run of the same "
          f"repetition; orders {orders}")
    print(table(results))
    print("CLASS-SPLIT-RESULT " + json.dumps({"args": vars(args), "orders": orders,
                                              "kernel": os.uname().release,
                                              "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
