"""Kernel-side delays with bpftrace on tracepoints (no kprobes needed).

Four delays, each aggregated in the kernel into log-linear buckets (two significant digits,
>= 100 ns wide; see :func:`kbp.bench.stats.bucket_width`) with the exact maximum and sum:

``xmit_to_poll``  (every mode; the delay the seeds attack, end to end in the kernel)
    ``net:net_dev_start_xmit`` of a request sent by the tester (comm ``kbp-rtt``) on the
    client veth -> ``net:napi_gro_receive_entry`` of the same skb, i.e. the moment the server
    veth's NAPI poll hands that packet to the stack.  This spans the NAPI being scheduled
    (veth_xmit -> napi_schedule, the veth analogue of the hardIRQ), the wait for the poll
    (softirq or kthread) and the poll up to that packet.  Keyed by napi_id; the RT NAPI is the
    one with the most matches (others are reported as ``xmit_to_poll_other``).
``netrx_raise_to_entry``  (napi mode's mechanism, per CPU)
    ``irq:softirq_raise`` (vec NET_RX) -> ``irq:softirq_entry`` (NET_RX) on the same CPU: the
    softirq scheduling delay.  It covers every NET_RX on the CPU (the competing flood too).
``poller_wake_to_run``  (threaded / stock-hybrid / hybrid: the poller threads' pids)
    ``sched:sched_waking`` of a poller thread -> ``sched:sched_switch`` into it.
``app_wake_to_run``  (every mode: the RT application, sockperf server; kbp-echo in irq-suspend)
    ``sched:sched_waking`` -> ``sched:sched_switch`` of the application's threads.

Why not ``napi:napi_poll``: it fires after the poll *returns*, and bpftrace 0.17 misreads its
``dev_name``; the tracepoints above mark the start of the work instead.

bpftrace runs with ``-f json``: one JSON object a line (``printf`` output, then a ``map``
object per map at exit); :func:`parse` also reads the text dump (``@h[0, 312, 2800]: 10``)
of bpftrace without ``-f json``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp import sysaccess
from kbp.bench.stats import hist_summary
from kbp.bench.tester import TESTER_COMM

TRACEFS = Path("/sys/kernel/tracing")
NET_RX_VEC = 3

KIND_XMIT, KIND_NETRX, KIND_POLLER, KIND_APP = 0, 1, 2, 3
KIND_NAMES = {KIND_XMIT: "xmit_to_poll", KIND_NETRX: "netrx_raise_to_entry",
              KIND_POLLER: "poller_wake_to_run", KIND_APP: "app_wake_to_run"}

# log-linear bucket of $d (ns): 100 ns wide below 10 us, then two significant digits
_BUCKET = """
  $b = $d / 100 * 100;
  if ($d >= 10000) { $b = $d / 1000 * 1000; }
  if ($d >= 100000) { $b = $d / 10000 * 10000; }
  if ($d >= 1000000) { $b = $d / 100000 * 100000; }
  if ($d >= 10000000) { $b = $d / 1000000 * 1000000; }
  if ($d >= 100000000) { $b = $d / 10000000 * 10000000; }"""


def _record(kind: int, key: str) -> str:
    return (f"{_BUCKET}\n  @h[{kind}, {key}, $b] = count(); @mx[{kind}, {key}] = max($d);"
            f" @sm[{kind}, {key}] = sum($d);")


def _pid_pred(field_: str, pids: Sequence[int]) -> str:
    return " || ".join(f"{field_} == {int(p)}" for p in pids)


def program(poller_pids: Sequence[int] = (), app_pids: Sequence[int] = (),
            comm: str = TESTER_COMM) -> str:
    """The bpftrace program for one run."""
    parts = [
        'BEGIN { printf("READY\\n"); }',
        f'tracepoint:net:net_dev_start_xmit /comm == "{comm}"/ {{ @x[args->skbaddr] = nsecs; }}',
        "tracepoint:net:napi_gro_receive_entry /@x[args->skbaddr]/ {\n"
        "  $d = nsecs - @x[args->skbaddr]; delete(@x[args->skbaddr]);"
        + _record(KIND_XMIT, "args->napi_id") + "\n}",
        f"tracepoint:irq:softirq_raise /args->vec == {NET_RX_VEC} && @r[cpu] == 0/"
        " { @r[cpu] = nsecs; }",
        f"tracepoint:irq:softirq_entry /args->vec == {NET_RX_VEC} && @r[cpu] != 0/ {{\n"
        "  $d = nsecs - @r[cpu]; @r[cpu] = 0;" + _record(KIND_NETRX, "cpu") + "\n}",
    ]
    if poller_pids:
        parts += [
            f"tracepoint:sched:sched_waking /{_pid_pred('args->pid', poller_pids)}/"
            " { @wp[args->pid] = nsecs; }",
            "tracepoint:sched:sched_switch /@wp[args->next_pid]/ {\n"
            "  $d = nsecs - @wp[args->next_pid]; delete(@wp[args->next_pid]);"
            + _record(KIND_POLLER, "0") + "\n}",
        ]
    if app_pids:
        parts += [
            f"tracepoint:sched:sched_waking /{_pid_pred('args->pid', app_pids)}/"
            " { @wa[args->pid] = nsecs; }",
            "tracepoint:sched:sched_switch /@wa[args->next_pid]/ {\n"
            "  $d = nsecs - @wa[args->next_pid]; delete(@wa[args->next_pid]);"
            + _record(KIND_APP, "0") + "\n}",
        ]
    clears = ["@x", "@r"] + (["@wp"] if poller_pids else []) + (["@wa"] if app_pids else [])
    parts.append("END { " + " ".join(f"clear({m});" for m in clears) + " }")
    return "\n".join(parts) + "\n"


_LINE = re.compile(r"^@(h|mx|sm)\[([^\]]*)\]:\s*(-?\d+)\s*$")


def _entries(output: str) -> list[tuple[str, list[int], int]]:
    """(map name without @, key ints, value) of every map entry bpftrace printed, from its
    JSON lines (``-f json``: {"type": "map", "data": {"@h": {"0,312,2800": 10}}}) or its text
    dump (``@h[0, 312, 2800]: 10``)."""
    out: list[tuple[str, list[int], int]] = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(obj, dict) or obj.get("type") != "map":
                continue
            for name, entries in (obj.get("data") or {}).items():
                if not isinstance(entries, dict):
                    continue
                for key, val in entries.items():
                    with contextlib.suppress(ValueError, TypeError):
                        parts = key if isinstance(key, list) else str(key).split(",")
                        out.append((name.lstrip("@"), [int(str(k).strip()) for k in parts],
                                    int(val)))
            continue
        m = _LINE.match(line)
        if m:
            out.append((m.group(1), [int(k.strip()) for k in m.group(2).split(",")],
                        int(m.group(3))))
    return out


def is_ready(line: str) -> bool:
    """The program's BEGIN line ("READY"), as text or as a JSON printf object."""
    line = line.strip()
    if line == "READY":
        return True
    if line.startswith("{"):
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            obj = json.loads(line)
            return bool(obj.get("type") == "printf" and str(obj.get("data")).strip() == "READY")
    return False


def parse(output: str) -> dict[str, Any]:
    """Parse bpftrace's maps into {delay name: {key: summary}} (key: napi_id / cpu / 0)."""
    hist: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    mx: dict[tuple[int, int], int] = {}
    sm: dict[tuple[int, int], int] = {}
    for name, keys, val in _entries(output):
        if name == "h" and len(keys) == 3:
            hist[(keys[0], keys[1])][keys[2]] = val
        elif name == "mx" and len(keys) == 2:
            mx[(keys[0], keys[1])] = val
        elif name == "sm" and len(keys) == 2:
            sm[(keys[0], keys[1])] = val
    out: dict[str, Any] = {}
    for (kind, key), buckets in sorted(hist.items()):
        name = KIND_NAMES.get(kind, f"kind{kind}")
        s = hist_summary(buckets, exact_max=mx.get((kind, key)), total_ns=sm.get((kind, key)))
        s["buckets"] = {str(k): v for k, v in sorted(buckets.items())}
        out.setdefault(name, {})[str(key)] = s
    return out


def merged(result: dict[str, Any], name: str) -> dict[str, Any] | None:
    """One summary for a delay: all keys merged (histograms added, max of maxima)."""
    per_key = result.get(name)
    if not per_key:
        return None
    buckets: dict[int, int] = defaultdict(int)
    total = 0.0
    mx = 0.0
    for s in per_key.values():
        for k, v in s["buckets"].items():
            buckets[int(k)] += int(v)
        total += (s["mean"] or 0.0) * s["n"]
        mx = max(mx, s["max"] or 0.0)
    return hist_summary(buckets, exact_max=mx, total_ns=total)


def rt_napi(result: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None, int]:
    """The RT NAPI's xmit_to_poll summary: (napi_id, summary, matches on other NAPIs)."""
    per_key = result.get(KIND_NAMES[KIND_XMIT]) or {}
    if not per_key:
        return None, None, 0
    best = max(per_key, key=lambda k: per_key[k]["n"])
    others = sum(s["n"] for k, s in per_key.items() if k != best)
    return best, per_key[best], others


def unavailable() -> str | None:
    """Why kernel tracing cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "kernel trace needs root"
    if shutil.which("bpftrace") is None:
        return "bpftrace not installed (Debian: apt-get install bpftrace)"
    if not Path("/sys/kernel/btf/vmlinux").exists() and not TRACEFS.exists():
        return "no tracefs"
    return None


class TraceFsError(RuntimeError):
    """tracefs could not be mounted, or could not be put back the way it was."""


def umount(path: Path) -> int:
    """umount2(path, 0): 0, or the errno it failed with (EBUSY: something holds it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), 0) == 0:
        return 0
    return ctypes.get_errno()


def holders(path: Path) -> list[str]:
    """Processes with a file or their working directory under ``path``: "comm (pid)"."""
    out: list[str] = []
    prefix = str(path).rstrip("/")
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            links = [pid_dir / "cwd", *(pid_dir / "fd").iterdir()]
            held = False
            for link in links:
                with contextlib.suppress(OSError):
                    t = os.readlink(link)
                    if t == prefix or t.startswith(prefix + "/"):
                        held = True
                        break
            if held:
                comm = (pid_dir / "comm").read_text().strip()
                out.append(f"{comm} ({pid_dir.name})")
        except OSError:
            continue
    return out


@dataclass
class TraceFs:
    """Mounts tracefs at /sys/kernel/tracing if it is not mounted; ``close()`` puts that back.

    Tracers started while it is mounted are registered with ``track()``: ``close()`` first
    makes every one of them exit (and reaps it), then unmounts what ``ensure()`` mounted,
    retrying while the mount is still busy, and raises :class:`TraceFsError` if tracefs stays
    mounted, so a failure to restore is reported, never dropped."""

    path: Path = TRACEFS
    mounted_by_us: bool = False
    busy_timeout: float = 5.0
    tracers: list[KernelTrace] = field(default_factory=list)

    def mounted(self) -> bool:
        return (self.path / "events").is_dir()

    def ensure(self) -> None:
        if self.mounted():
            return
        try:
            proc = subprocess.run(["mount", "-t", "tracefs", "nodev", str(self.path)],
                                  capture_output=True, text=True)
        except BaseException:
            # interrupted (Ctrl-C) around the mount: it was not mounted before, so whatever
            # is mounted now is ours to undo
            self.mounted_by_us = self.mounted()
            raise
        if proc.returncode != 0:
            raise TraceFsError(f"cannot mount tracefs: {proc.stderr.strip()}")
        self.mounted_by_us = True

    def track(self, kt: KernelTrace) -> KernelTrace:
        """Register a tracer that uses this tracefs (``close()`` waits for it)."""
        self.tracers.append(kt)
        return kt

    def close(self) -> None:
        """Stop and reap the tracers, then unmount tracefs if ``ensure()`` mounted it."""
        while self.tracers:
            self.tracers.pop().abort()
        if not self.mounted_by_us:
            return
        deadline = time.monotonic() + self.busy_timeout
        while self.mounted():
            err = umount(self.path)
            if err == 0:
                break
            if err == errno.EBUSY and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            if not self.mounted():      # unmounted by someone else meanwhile: restored
                break
            held = holders(self.path)
            raise TraceFsError(
                f"could not unmount {self.path} (mounted by the benchmark): "
                f"{os.strerror(err)}" + (f", held by {', '.join(held)}" if held else "")
                + f"; unmount it with: umount {self.path}")
        self.mounted_by_us = False


@dataclass
class KernelTrace:
    """One bpftrace session around one run: ``start()`` returns when the probes are attached."""

    poller_pids: Sequence[int] = ()
    app_pids: Sequence[int] = ()
    cpu: int | None = None            # where bpftrace's user-space part runs
    proc: subprocess.Popen[str] | None = None
    output: str = ""
    error: str = ""
    started_ns: int = 0
    stopped_ns: int = 0
    script: str = field(default="", repr=False)

    def start(self, timeout: float = 60.0) -> None:
        self.script = program(self.poller_pids, self.app_pids)
        argv = ["bpftrace", "-f", "json", "-e", self.script]
        if shutil.which("nice"):
            # a large CFS weight: loading the program took > 20 s with both CPUs saturated
            # (TCG, busy + flood).  Not SCHED_FIFO: pinned next to this (SCHED_OTHER) process,
            # a SCHED_FIFO bpftrace never delivered its BEGIN output (measured, 6.18).
            argv = ["nice", "-n", "-10", *argv]
        if self.cpu is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", str(self.cpu), *argv]
        env_argv = ["env", "BPFTRACE_MAP_KEYS_MAX=65536", *argv]
        self.proc = sysaccess.popen(env_argv, session=True)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = ""
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if sel.select(timeout=0.2):
                    line = self.proc.stdout.readline()
                    buf += line
                    if is_ready(line):
                        self.started_ns = time.monotonic_ns()
                        return
        except BaseException:
            # Ctrl-C (or anything else) while bpftrace loads: it runs in its own session, so
            # nobody else stops it; left running it would hold tracefs (and the CPU)
            self.abort()
            raise
        finally:
            sel.close()
        out, err = sysaccess.stop(self.proc, signal.SIGKILL, timeout=2)
        self.proc = None
        raise RuntimeError(f"bpftrace did not start: {(buf + out + err).strip()[-600:]}")

    def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        out, err = sysaccess.stop(self.proc, signal.SIGINT, timeout=20)
        self.proc = None
        self.stopped_ns = time.monotonic_ns()
        self.output, self.error = out, err
        return parse(out)

    def abort(self) -> None:
        """Kill bpftrace if it runs and wait until it has exited."""
        if self.proc is not None:
            with contextlib.suppress(Exception):
                sysaccess.stop(self.proc, signal.SIGKILL, timeout=2)
            self.proc = None
