"""Softirq-lock inversion and foreign softirq work in kbp's poller (issue 11, items 1-2).

Runs in a guest of the VM rig (as root); prints one JSON document on stdout (the last line,
prefixed ``INVERSION-RESULT ``).  From the repository root on the host:

    kbpctl bench vm --flavour 6.12-rt-amd64 --scenario inversion --out /tmp/inv \\
        --no-parse --seconds 12 \\
        --configs busy:51:shared,busy:50:shared,hybrid:50:shared,hybrid:51:shared
    .venv/bin/python -m vm.experiments.inversion parse /tmp/inv --table   # on the host

(``python3 -m vm run 6.12-rt-amd64 --build --out /tmp/inv --env PYTHONPATH=$PWD/src
--qemu-arg=-netdev --qemu-arg=hubport,id=n2,hubid=0 --qemu-arg=-device
--qemu-arg=virtio-net-pci,netdev=n2,mac=52:54:00:4b:50:02 -- .venv/bin/python -m
vm.experiments.inversion run ...`` by hand.)  The ``--qemu-arg`` pair adds a third NIC on
the rig's hub (MAC :02), which the script puts in
netns kbpflood to send the flood; without it the flood leaves through NIC0, whose TX
completions kbp's poller then polls and whose TX queue lock the poller then shares with the
flood sender.  Without ``--no-parse`` the guest prints the figures itself (slow under TCG).

Traffic (the rig's two virtio NICs, cabled through QEMU's hub; conftest.build_topology):

* RT flow: ``rt-send`` in netns kbppeer (CPU 0, SCHED_FIFO ``--app-prio``) sends numbered,
  CLOCK_MONOTONIC-stamped 64 B datagrams at ``--rt-rate`` to ``rt-recv`` in the init netns
  (CPU 1 = POLL_CPU, same priority).  They arrive on NIC0, attached to kbp's poller kbp/1
  (``kbpctl enable NIC0 --backend kmod --mode MODE --cpus 1 --rt-prio PRIO`` for the first
  configuration, then the module's poller-set for mode and rt_prio: one poller thread for
  the whole run); the one-way latency is recv time - send stamp (one guest, one clock).
* Flood: ``iperf3 -u -b 0 -l 64`` from netns kbpflood (the third NIC; else the init netns)
  on CPU 0 to a server in kbppeer (CPU 0). It is *received by NIC1*, which is not attached
  to kbp; the placement says where NIC1's interrupts (and so its NET_RX: on PREEMPT_RT its
  IRQ thread, else the hardirq's softirq) go: ``shared`` = POLL_CPU (the inversion case),
  ``exclusive`` = the other CPU (remedy b), ``none`` = no flood. RPS stays off on NIC1 (the
  default).

Measured per configuration over ``--seconds`` with tracefs on POLL_CPU only
(tracing_cpumask), trace_clock mono (microsecond resolution in the text output):

* ``lock:contention_begin/end`` of every task on POLL_CPU; a ``stacktrace`` trigger on the
  poller's contention_begin finds the (hashed) address whose stacks pass through
  ``__local_bh_disable_ip``: the CPU's ``softirq_ctrl.lock``.  Waits on it are split by
  waiter; the poller's get count, count per RT packet and the distribution.
* ``sched:sched_switch`` of the poller: the task that ran when the poller blocked on the
  softirq lock (the holder, or what preempted it).
* ``sched:sched_pi_setprio``: PI boosts on POLL_CPU (who, to what priority).
* ``irq:softirq_entry/exit`` of every task on POLL_CPU: softirq vectors run by each task;
  those run by the poller are foreign work (the poller calls napi->poll itself and raises
  no softirq for its own NAPIs), with their wall time per vector, share of the poller's CPU
  time (/proc/PID/schedstat; no IRQ_TIME_ACCOUNTING in Debian's configs, so softirq time is
  the task's) and time per RT packet.

``parse`` re-reads a saved raw trace (``--out``/$KBP_OUT keeps them) on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACING = Path("/sys/kernel/tracing")
RT_PORT = 9100
IPERF_PORT = 5299
PKT = struct.Struct("!QQ")          # seq, CLOCK_MONOTONIC ns at send
BH_FRAME = "__local_bh_disable_ip"
FLOOD_MAC = "52:54:00:4b:50:02"     # optional third hub NIC (see QEMU_FLOOD_NIC)
FLOOD_NS, FLOOD_IP = "kbpflood", "198.18.100.3"


# -- RT flow: sender and receiver (stdlib only, started with python -S) ------------------
def rt_send(args: argparse.Namespace) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host, port = args.to.rsplit(":", 1)
    dst = (host, int(port))
    pad = b"\0" * max(0, args.size - PKT.size)
    interval = 1.0 / args.rate
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    start = time.monotonic()
    seq = 0
    while not stop and (args.count == 0 or seq < args.count):
        s.sendto(PKT.pack(seq, time.clock_gettime_ns(time.CLOCK_MONOTONIC)) + pad, dst)
        seq += 1
        delay = start + seq * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    print(json.dumps({"sent": seq, "seconds": round(time.monotonic() - start, 3)}),
          flush=True)
    return 0


def rt_recv(args: argparse.Namespace) -> int:
    """Records (seq, send ns, receive ns) per datagram; on SIGTERM writes them to --dump."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host, port = args.bind.rsplit(":", 1)
    s.bind((host, int(port)))
    s.settimeout(0.2)
    rows: list[tuple[int, int, int]] = []
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while not stop:
        try:
            data = s.recv(2048)
        except (TimeoutError, InterruptedError):
            continue
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if len(data) >= PKT.size:
            seq, sent = PKT.unpack_from(data)
            rows.append((seq, sent, now))
    Path(args.dump).write_text(json.dumps(rows))
    return 0


# -- trace parsing (host or guest) ------------------------------------------------------
LINE = re.compile(r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+"
                  r"(?P<ts>\d+\.\d+):\s+(?P<ev><stack trace>|\w+):?\s?(?P<rest>.*)$")
SOFTIRQ = re.compile(r"vec=(\d+) \[action=(\w+)\]")
PISET = re.compile(r"comm=(.*) pid=(\d+) oldprio=(-?\d+) newprio=(-?\d+)")
SWITCH = re.compile(r"prev_comm=(.*) prev_pid=(\d+) prev_prio=(\d+) prev_state=(\S+) ==> "
                    r"next_comm=(.*) next_pid=(\d+) next_prio=(\d+)")


def _us(ts: str) -> int:
    """'123.456789' seconds -> microseconds (int, exact)."""
    sec, frac = ts.split(".")
    return int(sec) * 1_000_000 + int(frac.ljust(6, "0")[:6])


def dist(values: list[float], tail: tuple[float, ...] = ()) -> dict[str, Any]:
    """Count, total, nearest-rank p50/p90/p99 (and ``tail``'s) and max of some times (µs)."""
    from kbp.bench import stats  # here: the -S helpers (rt-send, rt-recv) import no kbp
    s = stats.summarize(values, (50.0, 90.0, 99.0, *tail))
    return {"count": s["n"], "total": round(sum(values), 1),
            **{k: v for k, v in s.items() if k not in ("n", "mean", "sd", "min")}}


@dataclass
class Wait:
    pid: int
    comm: str
    addr: str
    flags: str
    begin: int
    end: int | None = None
    stack: list[str] = field(default_factory=list)
    next_comm: str | None = None


@dataclass
class Parsed:
    waits: list[Wait] = field(default_factory=list)
    softirq: dict[tuple[int, str], dict[str, list[float]]] = field(default_factory=dict)
    comms: dict[int, str] = field(default_factory=dict)
    pi: list[dict[str, Any]] = field(default_factory=list)
    switches_out: list[tuple[int, str, str, str]] = field(default_factory=list)
    wake_delays: list[tuple[float, str]] = field(default_factory=list)
    soft_stacks: list[tuple[str, list[str]]] = field(default_factory=list)
    preempted: list[tuple[float, str]] = field(default_factory=list)
    lines: int = 0
    unparsed: int = 0
    first_us: int | None = None
    last_us: int | None = None


def parse_trace(lines: list[str], poller_pid: int) -> Parsed:
    out = Parsed()
    open_wait: dict[int, Wait] = {}
    last_event: dict[int, list[str]] = {}     # where a following <stack trace> goes
    soft_open: dict[int, list[tuple[int, int]]] = defaultdict(list)
    vec_name: dict[int, str] = {}
    stack_for: list[str] | None = None
    woken: int | None = None
    preempt: tuple[int, str] | None = None
    for raw in lines:
        if raw.startswith(" => "):
            if stack_for is not None:
                stack_for.append(raw[4:].strip())
            continue
        if not raw.strip() or raw.startswith("#"):
            continue
        m = LINE.match(raw)
        if not m:
            out.unparsed += 1
            continue
        out.lines += 1
        pid, ts, ev, rest = int(m["pid"]), _us(m["ts"]), m["ev"], m["rest"]
        out.comms.setdefault(pid, m["comm"])
        if out.first_us is None:
            out.first_us = ts
        out.last_us = ts
        stack_for = None
        if ev == "<stack trace>":
            stack_for = last_event.pop(pid, None)
        elif ev == "contention_begin":
            parts = rest.split(None, 1)
            flags = parts[1].strip("()").removeprefix("flags=") if len(parts) > 1 else ""
            w = Wait(pid, m["comm"], parts[0], flags, ts)
            open_wait[pid] = w
            last_event[pid] = w.stack
            out.waits.append(w)
        elif ev == "contention_end":
            w = open_wait.pop(pid, None)
            if w is not None:
                w.end = ts
        elif ev == "softirq_entry":
            sm = SOFTIRQ.search(rest)
            if sm:
                vec_name[int(sm[1])] = sm[2]
                soft_open[pid].append((int(sm[1]), ts))
                if pid == poller_pid:
                    frames: list[str] = []
                    out.soft_stacks.append((sm[2], frames))
                    last_event[pid] = frames
        elif ev == "softirq_exit":
            sm = SOFTIRQ.search(rest)
            if sm and soft_open[pid]:
                vec, t0 = soft_open[pid].pop()
                if vec == int(sm[1]):
                    d = out.softirq.setdefault((pid, m["comm"]), {})
                    d.setdefault(sm[2], []).append(float(ts - t0))
        elif ev == "sched_pi_setprio":
            pm = PISET.search(rest)
            if pm:
                out.pi.append({"by": m["comm"], "by_pid": pid, "comm": pm[1],
                               "pid": int(pm[2]), "old": int(pm[3]), "new": int(pm[4])})
        elif ev == "sched_wakeup":
            if f" pid={poller_pid} " in rest and poller_pid not in open_wait:
                woken = ts          # a wakeup to poll (a lock handoff is a lock wait)
        elif ev == "sched_switch":
            sw = SWITCH.search(rest)
            if sw and int(sw[2]) == poller_pid:
                w = open_wait.get(poller_pid)
                if w is not None and w.next_comm is None:
                    w.next_comm = sw[5]
                out.switches_out.append((ts, sw[4], sw[5], sw[7]))
                if sw[4].startswith("R"):
                    preempt = (ts, sw[5])
            elif sw and int(sw[6]) == poller_pid:
                if woken is not None:
                    out.wake_delays.append((float(ts - woken), sw[1]))
                if preempt is not None:
                    out.preempted.append((float(ts - preempt[0]), preempt[1]))
                woken, preempt = None, None
    return out


def softirq_origin(frames: list[str]) -> str:
    """Where a softirq run in the poller's context came from, by its stack: the hardirq
    exit that interrupted the poller, or the poller's own local_bh_enable()."""
    text = " ".join(frames)
    if "irq_exit" in text or "sysvec_" in text or "common_interrupt" in text:
        return "irq_exit"
    if "local_bh_enable" in text or "__local_bh_enable_ip" in text:
        return "local_bh_enable"
    return "other"


def analyse(p: Parsed, poller_pid: int, rt_packets: int, poller_cpu_ns: int | None,
            window_us: float, known_bh: str | None = None) -> dict[str, Any]:
    """Figures of one configuration from its parsed trace.  ``known_bh``: the softirq
    lock's (hashed) address from an earlier configuration of the same boot."""
    bh_addrs = Counter(w.addr for w in p.waits if any(f.startswith(BH_FRAME) for f in w.stack))
    stacked = Counter(w.addr for w in p.waits if w.stack)
    bh_addr = bh_addrs.most_common(1)[0][0] if bh_addrs else known_bh

    def per_rt(x: float) -> float | None:
        return round(x / rt_packets, 4) if rt_packets else None

    def waits_of(pred: Any) -> list[float]:
        return [float(w.end - w.begin) for w in p.waits if w.end is not None and pred(w)]

    res: dict[str, Any] = {"softirq_lock_addr": bh_addr,
                           "stacked_addrs": dict(stacked.most_common(6))}
    pw = waits_of(lambda w: w.pid == poller_pid and w.addr == bh_addr) if bh_addr else []
    res["poller_bh_lock_waits_us"] = {**dist(pw), "per_rt_pkt": per_rt(len(pw)),
                                      "us_per_rt_pkt": per_rt(sum(pw)),
                                      "share_of_window": round(sum(pw) / window_us, 4)}
    res["poller_bh_lock_waits_unmatched"] = sum(
        1 for w in p.waits if w.pid == poller_pid and w.addr == bh_addr and w.end is None)
    res["poller_bh_wait_switched_to"] = dict(Counter(
        w.next_comm or "-" for w in p.waits
        if w.pid == poller_pid and w.addr == bh_addr).most_common(8))
    other = waits_of(lambda w: w.pid == poller_pid and w.addr != bh_addr)
    res["poller_other_lock_waits_us"] = dist(other)
    by_waiter: dict[str, list[float]] = defaultdict(list)
    for w in p.waits:
        if bh_addr and w.addr == bh_addr and w.pid != poller_pid and w.end is not None:
            by_waiter[w.comm].append(float(w.end - w.begin))
    res["others_bh_lock_waits_us"] = {c: dist(v) for c, v in sorted(
        by_waiter.items(), key=lambda kv: -sum(kv[1]))}
    res["all_waits_by_task"] = dict(Counter(
        f"{w.comm}{'*' if w.addr == bh_addr else ''}" for w in p.waits).most_common(10))
    boosts = [e for e in p.pi if e["new"] < e["old"]]
    res["pi_boosts"] = {"events": len(p.pi), "boosts": len(boosts),
                        "boosted": dict(Counter(f"{e['comm']}->{e['new']}"
                                                for e in boosts).most_common(8)),
                        "by": dict(Counter(e["by"] for e in boosts).most_common(4))}
    res["poller_switched_out"] = len(p.switches_out)
    res["poller_wake_to_run_us"] = {**dist([d for d, _ in p.wake_delays]),
                                    "ran_before": dict(Counter(
                                        c for d, c in p.wake_delays if d > 0).most_common(6))}
    res["poller_preempted_us"] = {**dist([d for d, _ in p.preempted]),
                                  "per_rt_pkt": per_rt(len(p.preempted)),
                                  "share_of_window": round(sum(d for d, _ in p.preempted)
                                                           / window_us, 4),
                                  "by": dict(Counter(c for _, c in p.preempted).most_common(6))}
    soft: dict[str, Any] = {}
    poller_soft: dict[str, Any] = {}
    poller_total = 0.0
    for (pid, comm), vecs in sorted(p.softirq.items(), key=lambda kv: kv[0][1]):
        key = comm if pid != poller_pid else f"{comm} (poller)"
        soft[key] = {v: {"count": len(d), "total_us": round(sum(d), 1)}
                     for v, d in vecs.items()}
        if pid == poller_pid:
            for v, d in vecs.items():
                poller_soft[v] = {**dist(d), "per_rt_pkt": per_rt(len(d)),
                                  "us_per_rt_pkt": per_rt(sum(d))}
                poller_total += sum(d)
    res["softirq_by_task_us"] = soft
    origin: Counter[str] = Counter()
    for vec, frames in p.soft_stacks:
        if frames:
            origin[f"{vec} {softirq_origin(frames)}"] += 1
    res["poller_softirq_origin_sample"] = dict(origin.most_common())
    res["poller_foreign_softirq"] = {
        "by_vector_us": poller_soft, "total_us": round(poller_total, 1),
        "share_of_poller_cpu": (round(poller_total * 1000 / poller_cpu_ns, 4)
                                if poller_cpu_ns else None),
        "share_of_window": round(poller_total / window_us, 4),
        "us_per_rt_pkt": per_rt(poller_total)}
    res["trace"] = {"lines": p.lines, "unparsed": p.unparsed,
                    "span_s": (round((p.last_us - p.first_us) / 1e6, 3)
                               if p.first_us is not None and p.last_us is not None else 0)}
    return res


def latency(rows: list[list[int]], t0: int, t1: int) -> dict[str, Any]:
    """One-way RT latency (us) of datagrams received inside [t0, t1] (CLOCK_MONOTONIC ns)."""
    lat = [(r - s) / 1000 for _, s, r in rows if t0 <= r <= t1]
    seqs = [q for q, _, r in rows if t0 <= r <= t1]
    lost = (max(seqs) - min(seqs) + 1 - len(set(seqs))) if seqs else 0
    d = dist(lat, (99.9,))
    d.pop("total")
    d["p999"] = d.pop("p99.9")
    return {**{k: (round(v, 1) if isinstance(v, float) else v) for k, v in d.items()},
            "lost_in_window": lost}


# -- the driver (guest only) -------------------------------------------------------------
@dataclass
class Config:
    mode: str
    prio: int
    place: str          # shared | exclusive | none

    @classmethod
    def parse(cls, text: str) -> Config:
        mode, prio, place = text.split(":")
        assert mode in ("busy", "hybrid"), text
        assert place in ("shared", "exclusive", "none"), text
        return cls(mode, int(prio), place)

    @property
    def name(self) -> str:
        return f"{self.mode}:{self.prio}:{self.place}"


def tw(name: str, value: str) -> None:
    """Write a tracefs control file (opened with O_TRUNC, as the shell's '>': a trigger
    file so opened drops its triggers first)."""
    from kbp.system import access  # here: the -S helpers (rt-send, rt-recv) import no kbp
    access.write(TRACING / name, value)


def tw_ok(name: str, value: str) -> bool:
    try:
        tw(name, value)
        return True
    except OSError:
        return False


def poller_pid(pollers: list[Any], cpu: int, dev: str) -> int:
    """The pid of the rt poller serving ``dev`` on ``cpu``, by the module's word
    (``kbp.kmod.pollers()``): the threads are per device, ``kbp/<cpu>:<dev>``."""
    from kbp import names  # here: the -S helpers import no kbp (as stats above)
    for p in pollers:
        if p.cpu == cpu and p.ifname == dev and p.cls == names.CLASS_RT and p.pid:
            return int(p.pid)
    have = ", ".join(f"{p.ifname} on CPU {p.cpu} ({p.cls}, pid {p.pid})" for p in pollers)
    raise AssertionError(f"no kbp poller of {dev} on CPU {cpu}; the module has: "
                         f"{have or 'none'}")


def sum_exec_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def softirq_row(name: str, cpu: int) -> int:
    for line in Path("/proc/softirqs").read_text().splitlines():
        if line.strip().startswith(name + ":"):
            return int(line.split()[1 + cpu])
    return 0


def irq_counts(prefix: str, cpu: int) -> dict[str, int]:
    out = {}
    for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
        parts = line.split()
        if parts and parts[-1].startswith(prefix):
            out[f"{parts[0].rstrip(':')} {parts[-1]}"] = int(parts[1 + cpu])
    return out


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        from vm.guest_tests import conftest as c  # the suite's topology helpers (guest only)
        self.c = c
        self.args = args
        self.cpu = c.POLL_CPU
        self.other = 1 - c.POLL_CPU
        self.py = [sys.executable, "-S", str(Path(__file__).resolve())]
        self.work = Path("/tmp/inversion")
        self.work.mkdir(exist_ok=True)
        self.keep = Path(args.out or os.environ.get("KBP_OUT", "") or self.work)

    def kbpctl(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "kbpctl")
        p = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "KBP_RUN_DIR": "/run/kbp-inversion"})
        if check and p.returncode:
            raise AssertionError(f"kbpctl {' '.join(argv)}: {p.returncode} {p.stderr}")
        return p

    def setup(self) -> None:
        c = self.c
        os.sched_setaffinity(0, {self.other})     # the driver stays off the poller's CPU
        if not (TRACING / "events").exists():
            c.sh(f"mount -t tracefs nodev {TRACING}")
        c.load_module()
        self.topo = c.build_topology()
        self.bh_addr: str | None = None
        self.poller = 0
        self.flood_ns: str | None = None
        for d in Path("/sys/class/net").iterdir():
            if (d / "address").read_text().strip() == FLOOD_MAC:
                # a third hub NIC sends the flood: NIC0's TX queue stays out of it
                c.virtio_name(d.name)
                c.sh(f"ip netns add {FLOOD_NS}")
                c.sh(f"ip link set {d.name} netns {FLOOD_NS}")
                c.sh(f"ip addr add {FLOOD_IP}/24 dev {d.name}; ip link set {d.name} up; "
                     f"ip link set lo up", ns=FLOOD_NS)
                c.pin_irqs(d.name, self.other)
                self.flood_ns = FLOOD_NS
        self.events = {e: (TRACING / "events" / e).exists() for e in (
            "lock/contention_begin", "lock/contention_end", "irq/softirq_entry",
            "irq/softirq_exit", "sched/sched_pi_setprio", "sched/sched_switch",
            "sched/sched_wakeup")}

    def trace_setup(self, poller: int) -> None:
        """Everything tracefs needs, once, while the guest is quiet, with the ring buffer
        off; per configuration only tracing_on flips, the buffer is cleared and the
        stacktrace triggers are armed (stacks()); the poller thread, hence the pid in the
        filters, lives for the whole run.  Turning
        a tracepoint on rewrites kernel text (text_poke_bp), and under TCG another vCPU
        running that code can hit a stale int3 (vm/README.md, "The guest's clock"):
        doing it at the start of a loaded configuration oopsed 6.12-rt in __schedule
        (the sched_switch site); a filter write under load once ended 6.12 in a double
        fault inside kmalloc (memdup_user_nul of event_filter_write)."""
        tw("tracing_on", "0")
        tw("events/enable", "0")
        tw("trace_clock", "mono")
        tw("buffer_size_kb", str(self.args.buffer_kb))
        tw("tracing_cpumask", f"{1 << self.cpu:x}")
        filters = {"sched/sched_switch": f"prev_pid == {poller} || next_pid == {poller}",
                   "sched/sched_wakeup": f"pid == {poller}"}
        for ev, ok in self.events.items():
            if ok:
                tw(f"events/{ev}/filter", filters.get(ev, "0"))
                tw(f"events/{ev}/enable", "1")
        tw("trace", "")
        time.sleep(1.0)

    def stacks(self, on: bool) -> None:
        """The stacktrace triggers, armed right after tracing_on=1: their count runs down
        whether or not the ring buffer records (armed at setup, the warm-up used it all).
        Arming one soft-enables an event that is already on: no text is rewritten."""
        for ev in ("lock/contention_begin", "irq/softirq_entry"):
            if self.events[ev]:
                tw_ok(f"events/{ev}/trigger", "!stacktrace")
                if on:
                    tw(f"events/{ev}/trigger",
                       f"stacktrace:{self.args.stacks} if common_pid == {self.poller}")

    def trace_teardown(self) -> None:
        """After the last configuration, its traffic stopped."""
        tw("tracing_on", "0")
        self.stacks(False)
        tw_ok("events/enable", "0")
        for ev, ok in self.events.items():
            if ok:
                tw_ok(f"events/{ev}/filter", "0")

    def overrun(self) -> dict[str, int]:
        out = {}
        for line in (TRACING / f"per_cpu/cpu{self.cpu}/stats").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("overrun", "dropped events", "entries"):
                out[k] = int(v.split()[0])
        return out

    def nic_rx(self, nic: str, ns: str | None) -> int:
        return int(self.c.sh(f"cat /sys/class/net/{nic}/statistics/rx_packets",
                             ns=ns).stdout)

    def run_one(self, cfg: Config, idx: int) -> dict[str, Any]:
        c, t, a = self.c, self.topo, self.args
        from kbp import kmod
        kmod.poller_set(self.cpu, mode=cfg.mode, rt_prio=cfg.prio)
        poller = poller_pid(kmod.pollers(), self.cpu, self.topo.nic0)
        assert poller == self.poller, "the poller thread changed: the trace filters are stale"
        policy = (os.sched_getscheduler(poller), os.sched_getparam(poller).sched_priority)
        c.pin_irqs(t.nic1, self.cpu if cfg.place == "shared" else self.other)
        c.pin_irqs(t.nic0, self.cpu)
        procs: list[subprocess.Popen[str]] = []
        if cfg.place != "none":
            procs.append(c.spawn(["taskset", "-c", str(self.other), "iperf3", "-s", "-1",
                                  "-B", t.client_ip, "-p", str(IPERF_PORT)], ns=t.ns))
            time.sleep(1.5)
            procs.append(c.spawn(["taskset", "-c", str(self.other), "iperf3", "-u", "-b",
                                  a.flood_bitrate, "-l", str(a.flood_len), "-t",
                                  str(int(a.seconds + a.warmup + 20)), "-c", t.client_ip,
                                  "-p", str(IPERF_PORT)], ns=self.flood_ns))
        dump = self.work / f"rt-{idx}.json"
        recv = c.spawn(["chrt", "-f", str(a.app_prio), "taskset", "-c", str(self.cpu),
                        *self.py, "rt-recv", "--bind", f"{t.server_ip}:{RT_PORT}",
                        "--dump", str(dump)])
        assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
        send = c.spawn(["chrt", "-f", str(a.app_prio), "taskset", "-c", str(self.other),
                        *self.py, "rt-send", "--to", f"{t.server_ip}:{RT_PORT}",
                        "--rate", str(a.rt_rate), "--count", "0"], ns=t.ns)
        time.sleep(a.warmup)
        tw("tracing_on", "0")
        tw("trace", "")
        raw = self.work / f"trace-{idx}.txt"
        with open(raw, "w") as f:
            cat = subprocess.Popen(["taskset", "-c", str(self.other), "cat",
                                    str(TRACING / "trace_pipe")], stdout=f)
            before = {"t": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
                      "poller_ns": sum_exec_ns(poller),
                      "net_rx": softirq_row("NET_RX", self.cpu),
                      "irqs": irq_counts("virtio", self.cpu),
                      "nic1_rx": self.nic_rx(t.nic1, t.ns), "nic0_rx": self.nic_rx(t.nic0, None)}
            tw("tracing_on", "1")
            self.stacks(True)
            time.sleep(a.seconds)
            tw("tracing_on", "0")
            self.stacks(False)
            after = {"t": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
                     "poller_ns": sum_exec_ns(poller),
                     "net_rx": softirq_row("NET_RX", self.cpu),
                     "irqs": irq_counts("virtio", self.cpu),
                     "nic1_rx": self.nic_rx(t.nic1, t.ns), "nic0_rx": self.nic_rx(t.nic0, None)}
            size = -1
            while raw.stat().st_size != size:     # cat drains trace_pipe
                size = raw.stat().st_size
                time.sleep(0.5)
            cat.terminate()
            cat.wait()
        rest = [ln for ln in (TRACING / "trace").read_text().splitlines()
                if not ln.startswith("#")]
        with open(raw, "a") as f:
            f.write("\n".join(rest) + "\n")
        lost = self.overrun()
        send.send_signal(signal.SIGTERM)
        sent = c.stop(send)
        recv.send_signal(signal.SIGTERM)
        c.stop(recv)
        for p in procs:
            c.stop(p)
        rows = json.loads(dump.read_text()) if dump.exists() else []
        window_ns = after["t"] - before["t"]
        t0, t1 = before["t"], after["t"]
        rt_pkts = sum(1 for _, _, r in rows if t0 <= r <= t1)
        meta = {"config": cfg.name, "t0": t0, "t1": t1,
                "flood_from": self.flood_ns or "init netns (NIC0)",
                "mode": cfg.mode, "rt_prio": cfg.prio,
                "poller_policy": {"fifo": policy[0] == os.SCHED_FIFO, "prio": policy[1]},
                "place": cfg.place, "poller_pid": poller, "window_s": round(window_ns / 1e9, 3),
                "rt_pkts": rt_pkts, "rt_sender": sent.strip().splitlines()[-1:] or None,
                "poller_cpu_ns": after["poller_ns"] - before["poller_ns"],
                "net_rx_softirqs_cpu": after["net_rx"] - before["net_rx"],
                "irqs_cpu": {k: after["irqs"].get(k, 0) - v for k, v in before["irqs"].items()},
                "nic1_rx_pps": round((after["nic1_rx"] - before["nic1_rx"]) * 1e9 / window_ns),
                "nic0_rx_pps": round((after["nic0_rx"] - before["nic0_rx"]) * 1e9 / window_ns),
                "trace_stats": lost}
        meta["poller_cpu_share"] = round(meta["poller_cpu_ns"] / window_ns, 4)
        (self.keep / f"meta-{idx}.json").write_text(json.dumps(meta))
        if self.keep != self.work:
            (self.keep / f"trace-{idx}.txt").write_bytes(raw.read_bytes())
            (self.keep / f"rt-{idx}.json").write_text(json.dumps(rows))
        if not a.parse:
            return meta
        res = figures(meta, raw.read_text().splitlines(), rows, self.bh_addr)
        self.bh_addr = res["softirq_lock_addr"] or self.bh_addr
        raw.unlink()
        return res


def figures(meta: dict[str, Any], lines: list[str], rows: list[list[int]],
            known_bh: str | None = None) -> dict[str, Any]:
    parsed = parse_trace(lines, meta["poller_pid"])
    res = analyse(parsed, meta["poller_pid"], meta["rt_pkts"], meta["poller_cpu_ns"],
                  meta["window_s"] * 1e6, known_bh)
    return {**meta, "rt_latency_us": latency(rows, meta["t0"], meta["t1"]), **res}


def run(args: argparse.Namespace) -> int:
    d = Driver(args)
    d.setup()
    first = Config.parse(args.configs.split(",")[0])
    d.kbpctl("disable", "--all", check=False)
    d.kbpctl("enable", d.topo.nic0, "--backend", "kmod", "--mode", first.mode,
             "--cpus", str(d.cpu), "--rt-prio", str(first.prio))
    from kbp import kmod
    d.poller = poller_pid(kmod.pollers(), d.cpu, d.topo.nic0)
    d.trace_setup(d.poller)
    results = []
    try:
        for i, text in enumerate(args.configs.split(",")):
            cfg = Config.parse(text)
            print(f"inversion: {cfg.name} ...", file=sys.stderr, flush=True)
            r = d.run_one(cfg, i)
            if args.parse:
                print(f"inversion: {cfg.name}: {json.dumps(summary(r))}", file=sys.stderr,
                      flush=True)
            results.append(r)
    finally:
        d.trace_teardown()
        d.kbpctl("disable", "--all", check=False)
    doc = {"kernel": os.uname().release, "flavour": os.environ.get("KBP_FLAVOUR"),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "args": {k: v for k, v in vars(args).items() if k != "fn"},
           "events": d.events, "results": results}
    (d.keep / f"inversion-{os.environ.get('KBP_FLAVOUR', 'guest')}.json").write_text(
        json.dumps(doc, indent=1))
    print("INVERSION-RESULT " + json.dumps(doc), flush=True)
    return 0


def summary(r: dict[str, Any]) -> dict[str, Any]:
    w = r["poller_bh_lock_waits_us"]
    f = r["poller_foreign_softirq"]
    return {"rt_pkts": r["rt_pkts"], "flood_pps": r["nic1_rx_pps"],
            "poller_cpu": r["poller_cpu_share"], "bh_waits": w["count"],
            "bh_waits_per_pkt": w["per_rt_pkt"], "bh_wait_p50": w["p50"],
            "bh_wait_p99": w["p99"], "bh_wait_max": w["max"],
            "foreign_softirq_us": f["total_us"], "foreign_share": f["share_of_poller_cpu"],
            "lat_p50": r["rt_latency_us"]["p50"], "lat_p99": r["rt_latency_us"]["p99"],
            "lat_max": r["rt_latency_us"]["max"]}


DASH = "\u2013"


def _n(v: Any, fmt: str = "{:,.0f}") -> str:
    return DASH if v is None else fmt.format(v)


def table(results: list[dict[str, Any]]) -> str:
    """The figures of docs/results.md as Markdown rows (us; emulated timings)."""
    head = ("| config | flood pps | RT pkts | poller waits on softirq lock: n, per RT pkt, "
            "p50/p99/max us, % of time | lock holder at the wait (top) | poller wake-to-run "
            "p99/max us | foreign softirq in poller: ms, % of poller CPU, us per RT pkt | "
            "RT one-way p50/p99/max us |")
    rows = [head, "|" + "---|" * 8]
    for r in results:
        w, f = r["poller_bh_lock_waits_us"], r["poller_foreign_softirq"]
        wr, lat = r["poller_wake_to_run_us"], r["rt_latency_us"]
        holder = next(iter(r["poller_bh_wait_switched_to"].items()), None)
        waits = (f"{w['count']:,}, {w['per_rt_pkt']}, {_n(w['p50'])}/{_n(w['p99'])}/"
                 f"{_n(w['max'])}, {w['share_of_window'] * 100:.1f} %"
                 if w["count"] else ("0" if r["softirq_lock_addr"] else "0 (no lock)"))
        rows.append(
            f"| {r['config']} | {r['nic1_rx_pps']:,} | {r['rt_pkts']:,} | {waits} | "
            f"{f'{holder[0]} ({holder[1]})' if holder else DASH} | "
            f"{_n(wr['p99'])}/{_n(wr['max'])} | "
            f"{f['total_us'] / 1000:,.1f}, {(f['share_of_poller_cpu'] or 0) * 100:.1f} %, "
            f"{_n(f['us_per_rt_pkt'], '{:.1f}')} | "
            f"{_n(lat['p50'])}/{_n(lat['p99'])}/{_n(lat['max'])} |")
    return "\n".join(rows)


def table_foreign(results: list[dict[str, Any]]) -> str:
    """Foreign softirq work in the poller's context, per configuration (Markdown)."""
    rows = ["| config | flood pps | RT pkts | poller CPU | foreign NET_RX in poller: runs, ms, "
            "% of poller CPU, us per RT pkt | one run p99/max us | all foreign vectors: ms, "
            "% of poller CPU | origin (stack sample): irq exit / local_bh_enable |",
            "|" + "---|" * 8]
    for r in results:
        f = r["poller_foreign_softirq"]
        nr = f["by_vector_us"].get("NET_RX")
        cpu = r["poller_cpu_ns"] / 1000 or 1.0
        org: Counter[str] = Counter()
        for k, v in r["poller_softirq_origin_sample"].items():
            org[k.split()[1]] += v
        net = (f"{nr['count']:,}, {nr['total'] / 1000:,.1f}, {nr['total'] / cpu * 100:.1f} %, "
               f"{_n(nr['us_per_rt_pkt'], '{:.1f}')}" if nr else "0")
        runs = f"{_n(nr['p99'])}/{_n(nr['max'])}" if nr else DASH
        rows.append(
            f"| {r['config']} | {r['nic1_rx_pps']:,} | {r['rt_pkts']:,} | "
            f"{r['poller_cpu_share'] * 100:.0f} % | {net} | {runs} | "
            f"{f['total_us'] / 1000:,.1f}, {(f['share_of_poller_cpu'] or 0) * 100:.1f} % | "
            f"{org['irq_exit']} / {org['local_bh_enable']} |")
    return "\n".join(rows)


def parse_saved(args: argparse.Namespace) -> int:
    """Re-derive the figures from the raw files a run left in DIR (meta-N, trace-N, rt-N)."""
    d = Path(args.dir)
    out = []
    metas = sorted(d.glob("meta-*.json"), key=lambda q: int(q.stem.split("-")[1]))
    # the softirq lock's hashed address is one per boot: the first configuration whose
    # stacks show it names it for all (the poller's stacks are recorded until --stacks)
    bh: str | None = None
    for meta_path in metas:
        i = meta_path.stem.split("-")[1]
        lines = (d / f"trace-{i}.txt").read_text().splitlines()
        meta = json.loads(meta_path.read_text())
        bh = bh or analyse(parse_trace(lines, meta["poller_pid"]), meta["poller_pid"], 0,
                           None, 1.0)["softirq_lock_addr"]
    for meta_path in metas:
        i = meta_path.stem.split("-")[1]
        meta = json.loads(meta_path.read_text())
        rows = json.loads((d / f"rt-{i}.json").read_text())
        lines = (d / f"trace-{i}.txt").read_text().splitlines()
        out.append(figures(meta, lines, rows, bh))
    doc = {"dir": str(d), "results": out}
    if args.table:
        print(table(out) + "\n\n" + table_foreign(out))
        return 0
    if args.summary:
        for r in out:
            print(r["config"], json.dumps(summary(r)))
    print(json.dumps(doc, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the measurement (guest, root)")
    r.add_argument("--configs", default="hybrid:50:shared,hybrid:51:shared,"
                   "hybrid:50:exclusive,hybrid:50:none",
                   help="comma-separated MODE:RT_PRIO:PLACE, PLACE shared|exclusive|none")
    r.add_argument("--seconds", type=float, default=15.0)
    r.add_argument("--warmup", type=float, default=3.0)
    r.add_argument("--rt-rate", type=float, default=500.0)
    r.add_argument("--app-prio", type=int, default=60,
                   help="SCHED_FIFO priority of the RT sender and receiver")
    r.add_argument("--flood-bitrate", default="0", help="iperf3 -b (0: as fast as it can)")
    r.add_argument("--flood-len", type=int, default=64)
    r.add_argument("--buffer-kb", type=int, default=16384)
    r.add_argument("--stacks", type=int, default=300,
                   help="stack traces of the poller's first N contention_begin (which lock) "
                        "and softirq_entry (irq exit or its own local_bh_enable) events")
    r.add_argument("--out", help="keep raw traces here (default $KBP_OUT)")
    r.add_argument("--no-parse", dest="parse", action="store_false",
                   help="only record (meta-N.json, trace-N.txt, rt-N.json in --out); "
                        "figures with 'parse DIR' on the host (Python is 12-25x slower "
                        "under TCG)")
    r.set_defaults(fn=run)
    s = sub.add_parser("rt-send")
    s.add_argument("--to", required=True)
    s.add_argument("--rate", type=float, default=500.0)
    s.add_argument("--count", type=int, default=0)
    s.add_argument("--size", type=int, default=64)
    s.set_defaults(fn=rt_send)
    v = sub.add_parser("rt-recv")
    v.add_argument("--bind", required=True)
    v.add_argument("--dump", required=True)
    v.set_defaults(fn=rt_recv)
    p = sub.add_parser("parse", help="figures from a run's saved raw files (host)")
    p.add_argument("dir")
    p.add_argument("--summary", action="store_true", help="one summary line per config first")
    p.add_argument("--table", action="store_true",
                   help="only the Markdown tables (softirq lock; foreign softirq work)")
    p.set_defaults(fn=parse_saved)
    args = ap.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
