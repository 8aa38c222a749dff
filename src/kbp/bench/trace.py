"""Kernel-side delays with bpftrace on tracepoints (no kprobes needed).

Four delays, each aggregated in the kernel into log-linear buckets (two significant digits,
>= 100 ns wide; see :func:`kbp.bench.stats.bucket_width`) with the exact maximum and sum:

``xmit_to_poll``  (every mode; the delay the seeds attack, end to end in the kernel)
    ``net:net_dev_start_xmit`` on the RT client device (the veth end the tester sends on,
    matched by the tracepoint's device name, whoever the running task is) ->
    ``net:napi_gro_receive_entry`` of the same skb on one of the RT server device's NAPIs,
    i.e. the moment that NAPI's poll hands the packet to the stack.  This spans the NAPI
    being scheduled (veth_xmit -> napi_schedule, the veth analogue of the hardIRQ), the wait
    for the poll (softirq or kthread) and the poll up to that packet.  The RT NAPIs are the
    ids netdev ``napi-get`` lists for the RT server device when the run starts
    (:func:`kbp.bench.modes.rt_napi_ids`); without napi-get (before 6.9) or with none listed
    the receive side is keyed on the RT server device's name in the tracepoint instead.  The
    RT pair's names carry the testbed's tag, so no other device in any namespace has them.
    Matching rule: a transmit records its skb address and time; the first
    ``napi_gro_receive_entry`` of that address on *any* NAPI consumes the entry (deletes it)
    and is

    * a sample when the NAPI is an RT one and the transmit is at most :data:`STALE_NS` old;
    * ``stale`` when the NAPI is an RT one and the transmit is older than that: the entry's
      skb never reached a NAPI (veth handed it to the backlog, or dropped it) and its address
      was reused, so the time is not a delay of that packet (one of these gave a 2.9 s max);
    * ``foreign`` when the NAPI is not an RT one (an RT skb's address reused by another
      device's packet: the RT skb itself went elsewhere).

    Transmits never consumed are ``unmatched`` (transmits - samples - stale - foreign): a
    request that took the backlog path (veth_xmit -> __netif_rx, not the NAPI), was dropped,
    or was transmitted again before a poll saw it.  :data:`STALE_NS` is 1 s: far above any
    genuine xmit -> poll seen so far (p99 up to 68 ms, round trips up to ~0.2 s in
    docs/results.md), far below the stale matches it removes; a genuine delay longer than
    that would be counted as stale, not lost silently.  :func:`xmit_to_poll` /
    :meth:`KernelTrace.xmit_record` return the summary over the RT NAPIs and these counts.
    Only over a veth pair is the skb the NAPI polls the one transmitted: with ``--nic-pair``
    the run does not trace xmit_to_poll (:func:`kbp.bench.measure.latency.latency_run`).
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
import shutil
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp.bench.stats import hist_summary
from kbp.system import access

TRACEFS = Path("/sys/kernel/tracing")
NET_RX_VEC = 3

KIND_XMIT, KIND_NETRX, KIND_POLLER, KIND_APP = 0, 1, 2, 3
KIND_NAMES = {KIND_XMIT: "xmit_to_poll", KIND_NETRX: "netrx_raise_to_entry",
              KIND_POLLER: "poller_wake_to_run", KIND_APP: "app_wake_to_run"}
#: an RT transmit older than this when its skb reaches an RT NAPI is stale, not a sample
STALE_NS = 1_000_000_000
# @xn[what, napi_id]: the xmit_to_poll matching's counts (XN_XMITS under napi_id 0)
XN_XMITS, XN_STALE, XN_FOREIGN = 0, 1, 2
#: parse()'s entry for the @xn counts: {"xmits": n, "stale": {napi: n}, "foreign": {napi: n}}
XMIT_COUNTS = "xmit_to_poll_counts"
KEYED_NAPI, KEYED_RX_DEV = "napi_id", "rx_dev"
_DEV_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,15}")    # IFNAMSIZ - 1, nothing to escape

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


def one_of(field_: str, values: Iterable[int]) -> str:
    """A bpftrace predicate true when ``field_`` is one of ``values`` (pids, NAPI ids, IRQ
    numbers; each once, in order; "0", never true, for none)."""
    vs = sorted({int(v) for v in values})
    return " || ".join(f"{field_} == {v}" for v in vs) if vs else "0"


def _dev(name: str) -> str:
    if not _DEV_NAME.fullmatch(name):
        raise ValueError(f"device name {name!r} cannot go into the bpftrace program as is")
    return name


def xmit_probes(tx_dev: str, rx_dev: str | None, rt_napi_ids: Sequence[int] = (),
                stale_ns: int = STALE_NS) -> list[str]:
    """The xmit_to_poll probes (see the module docstring for the matching rule): transmits
    on ``tx_dev``, polled by one of ``rt_napi_ids`` (none: by any NAPI of ``rx_dev``)."""
    if rt_napi_ids:
        rt = " || ".join(f"args->napi_id == {int(i)}" for i in rt_napi_ids)
    elif rx_dev:
        rt = f'str(args->name) == "{_dev(rx_dev)}"'
    else:
        raise ValueError("xmit_to_poll needs the RT device's NAPI ids or its name")
    return [
        f'tracepoint:net:net_dev_start_xmit /str(args->name) == "{_dev(tx_dev)}"/ {{'
        f" @x[args->skbaddr] = nsecs; @xn[{XN_XMITS}, 0] = count(); }}",
        "tracepoint:net:napi_gro_receive_entry /@x[args->skbaddr]/ {\n"
        "  $d = nsecs - @x[args->skbaddr]; delete(@x[args->skbaddr]);\n"
        f"  if ({rt}) {{\n"
        f"    if ($d <= {int(stale_ns)}) {{"
        + _record(KIND_XMIT, "args->napi_id") + "\n"
        f"    }} else {{ @xn[{XN_STALE}, args->napi_id] = count(); }}\n"
        f"  }} else {{ @xn[{XN_FOREIGN}, args->napi_id] = count(); }}\n}}",
    ]


def program(poller_pids: Sequence[int] = (), app_pids: Sequence[int] = (), *,
            tx_dev: str | None = None, rx_dev: str | None = None,
            rt_napi_ids: Sequence[int] = (), stale_ns: int = STALE_NS,
            extra: Sequence[str] = (), extra_clears: Sequence[str] = ()) -> str:
    """The bpftrace program for one run (xmit_to_poll only with ``tx_dev``, the RT client
    device, and ``rt_napi_ids`` or ``rx_dev``: :func:`xmit_probes`), plus ``extra`` probes
    whose maps ``extra_clears`` END clears (:mod:`kbp.bench.anatomy`'s)."""
    parts = ['BEGIN { printf("READY\\n"); }']
    if tx_dev:
        parts += xmit_probes(tx_dev, rx_dev, rt_napi_ids, stale_ns)
    parts += [
        f"tracepoint:irq:softirq_raise /args->vec == {NET_RX_VEC} && @r[cpu] == 0/"
        " { @r[cpu] = nsecs; }",
        f"tracepoint:irq:softirq_entry /args->vec == {NET_RX_VEC} && @r[cpu] != 0/ {{\n"
        "  $d = nsecs - @r[cpu]; @r[cpu] = 0;" + _record(KIND_NETRX, "cpu") + "\n}",
    ]
    if poller_pids:
        parts += [
            f"tracepoint:sched:sched_waking /{one_of('args->pid', poller_pids)}/"
            " { @wp[args->pid] = nsecs; }",
            "tracepoint:sched:sched_switch /@wp[args->next_pid]/ {\n"
            "  $d = nsecs - @wp[args->next_pid]; delete(@wp[args->next_pid]);"
            + _record(KIND_POLLER, "0") + "\n}",
        ]
    if app_pids:
        parts += [
            f"tracepoint:sched:sched_waking /{one_of('args->pid', app_pids)}/"
            " { @wa[args->pid] = nsecs; }",
            "tracepoint:sched:sched_switch /@wa[args->next_pid]/ {\n"
            "  $d = nsecs - @wa[args->next_pid]; delete(@wa[args->next_pid]);"
            + _record(KIND_APP, "0") + "\n}",
        ]
    parts += list(extra)
    clears = (["@x"] if tx_dev else []) + ["@r"] + (["@wp"] if poller_pids else []) + (
        ["@wa"] if app_pids else []) + list(extra_clears)
    parts.append("END { " + " ".join(f"clear({m});" for m in clears) + " }")
    return "\n".join(parts) + "\n"


_LINE = re.compile(r"^@(h|mx|sm|xn)\[([^\]]*)\]:\s*(-?\d+)\s*$")


def json_object(line: str) -> dict[str, Any] | None:
    """One line of bpftrace's ``-f json`` output as its object (None: not a JSON object)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def map_data(output: str, name: str) -> dict[str, Any]:
    """One map bpftrace printed at exit with ``-f json`` ({key text: value, as printed};
    {} when it printed none): for maps whose keys or values are not all integers."""
    out: dict[str, Any] = {}
    for line in output.splitlines():
        obj = json_object(line)
        data = (obj.get("data") or {}).get(name) if obj and obj.get("type") == "map" else None
        if isinstance(data, dict):
            out.update(data)
    return out


def map_entries(output: str) -> list[tuple[str, list[int], int]]:
    """(map name without @, key ints, value) of every map entry bpftrace printed, from its
    JSON lines (``-f json``: {"type": "map", "data": {"@h": {"0,312,2800": 10}}}) or its text
    dump (``@h[0, 312, 2800]: 10``)."""
    out: list[tuple[str, list[int], int]] = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{"):
            obj = json_object(line)
            if obj is None or obj.get("type") != "map":
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
    if line.strip() == "READY":
        return True
    obj = json_object(line)
    return bool(obj and obj.get("type") == "printf" and str(obj.get("data")).strip() == "READY")


def parse(output: str) -> dict[str, Any]:
    """Parse bpftrace's maps into {delay name: {key: summary}} (key: napi_id / cpu / 0), and
    the xmit_to_poll matching's counts into ``XMIT_COUNTS``: {"xmits": n, "stale": {napi_id:
    n}, "foreign": {napi_id: n}} (only when the program traced xmit_to_poll)."""
    hist: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    mx: dict[tuple[int, int], int] = {}
    sm: dict[tuple[int, int], int] = {}
    xn: dict[tuple[int, int], int] = {}
    for name, keys, val in map_entries(output):
        if name == "h" and len(keys) == 3:
            hist[(keys[0], keys[1])][keys[2]] = val
        elif name == "mx" and len(keys) == 2:
            mx[(keys[0], keys[1])] = val
        elif name == "sm" and len(keys) == 2:
            sm[(keys[0], keys[1])] = val
        elif name == "xn" and len(keys) == 2:
            xn[(keys[0], keys[1])] = val
    out: dict[str, Any] = {}
    for (kind, key), buckets in sorted(hist.items()):
        name = KIND_NAMES.get(kind, f"kind{kind}")
        s: dict[str, Any] = hist_summary(buckets, exact_max=mx.get((kind, key)),
                                         total_ns=sm.get((kind, key)))
        s["buckets"] = {str(k): v for k, v in sorted(buckets.items())}
        out.setdefault(name, {})[str(key)] = s
    if xn:
        out[XMIT_COUNTS] = {
            "xmits": sum(v for (w, _), v in xn.items() if w == XN_XMITS),
            "stale": {str(k): v for (w, k), v in sorted(xn.items()) if w == XN_STALE},
            "foreign": {str(k): v for (w, k), v in sorted(xn.items()) if w == XN_FOREIGN}}
    return out


def merged(result: dict[str, Any], name: str) -> dict[str, Any] | None:
    """One summary for a delay: all keys merged (histograms added, max of maxima)."""
    per_key = result.get(name)
    if not per_key:
        return None
    buckets = _added_buckets(per_key.values())
    total = 0.0
    mx = 0.0
    for s in per_key.values():
        total += (s["mean"] or 0.0) * s["n"]
        mx = max(mx, s["max"] or 0.0)
    return hist_summary(buckets, exact_max=mx, total_ns=total)


def _added_buckets(summaries: Any) -> dict[int, int]:
    """The histograms of several summaries added together."""
    buckets: dict[int, int] = defaultdict(int)
    for s in summaries:
        for k, v in s["buckets"].items():
            buckets[int(k)] += int(v)
    return buckets


def without_buckets(s: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in s.items() if k != "buckets"}


def xmit_to_poll(result: dict[str, Any], napi_ids: Sequence[int] = (),
                 ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The RT flow's xmit_to_poll from :func:`parse`'s ``result``: (its summary over the RT
    NAPIs ``napi_ids``, with their histograms added as ``buckets``, None without a sample;
    the matching's counts).

    ``napi_ids`` empty: the program was keyed on the RT server device's name, and every
    NAPI in the histogram is one of that device's.  Otherwise a histogram of another NAPI
    (none from :func:`program`, which keys in the kernel; an older program's output) is not
    the RT flow's: its samples are counted as foreign.  Counts: ``napi_ids`` (the ids keyed,
    sorted), ``xmits`` (transmits on the RT client device), ``matched`` (the summary's n),
    ``stale``, ``foreign`` (both summed over NAPIs), ``foreign_napis`` ({napi_id: n}),
    ``unmatched`` (xmits - matched - stale - foreign, >= 0; None when the output has no
    transmit count) and ``per_napi`` ({napi_id: summary without buckets}, the RT NAPIs')."""
    per_key: dict[str, Any] = result.get(KIND_NAMES[KIND_XMIT]) or {}
    counts: dict[str, Any] = result.get(XMIT_COUNTS) or {}
    keyed = {str(int(i)) for i in napi_ids}
    rt = {k: s for k, s in per_key.items() if not keyed or k in keyed}
    foreign_napis: dict[str, int] = defaultdict(int)
    for k, n in (counts.get("foreign") or {}).items():
        foreign_napis[str(k)] += int(n)
    for k, s in per_key.items():
        if k not in rt:
            foreign_napis[k] += int(s["n"])
    summary = None
    if rt:
        summary = merged({KIND_NAMES[KIND_XMIT]: rt}, KIND_NAMES[KIND_XMIT])
        if summary is not None:
            summary["buckets"] = {str(b): n for b, n in
                                  sorted(_added_buckets(rt.values()).items())}
    matched = int(summary["n"]) if summary else 0
    stale = sum(int(n) for n in (counts.get("stale") or {}).values())
    foreign = sum(foreign_napis.values())
    xmits = counts.get("xmits")
    return summary, {
        "napi_ids": sorted(int(i) for i in napi_ids),
        "xmits": xmits, "matched": matched, "stale": stale, "foreign": foreign,
        "foreign_napis": dict(sorted(foreign_napis.items())),
        "unmatched": None if xmits is None else max(0, int(xmits) - matched - stale - foreign),
        "per_napi": {k: without_buckets(s) for k, s in sorted(rt.items())}}


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
    # xmit_to_poll (see the module docstring): the RT client device the tester sends on
    # (None: not traced), the RT server device and its NAPI ids (napi-get; empty: keyed on
    # rx_dev's name), why napi-get gave none if it failed, and the stale bound
    tx_dev: str | None = None
    rx_dev: str | None = None
    rt_napi_ids: Sequence[int] = ()
    napi_error: str | None = None
    stale_ns: int = STALE_NS
    # more probes in the same program (one bpftrace process): kbp.bench.anatomy's, and the
    # maps its END clears
    extra_probes: Sequence[str] = ()
    extra_clears: Sequence[str] = ()
    proc: subprocess.Popen[str] | None = None
    out_path: Path | None = None      # bpftrace's output file while it runs
    output: str = ""
    error: str = ""
    started_ns: int = 0
    stopped_ns: int = 0
    script: str = field(default="", repr=False)

    def program(self) -> str:
        """This run's bpftrace program (:func:`program`)."""
        return program(self.poller_pids, self.app_pids, tx_dev=self.tx_dev, rx_dev=self.rx_dev,
                       rt_napi_ids=self.rt_napi_ids, stale_ns=self.stale_ns,
                       extra=self.extra_probes, extra_clears=self.extra_clears)

    def start(self, timeout: float = 60.0) -> None:
        self.script = self.program()
        argv = ["bpftrace", "-f", "json", "-e", self.script]
        if shutil.which("nice"):
            # a large CFS weight: loading the program took > 20 s with both CPUs saturated
            # (TCG, busy + flood).  Not SCHED_FIFO: pinned next to this (SCHED_OTHER) process,
            # a SCHED_FIFO bpftrace never delivered its BEGIN output (measured, 6.18).
            argv = ["nice", "-n", "-10", *argv]
        if self.cpu is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", str(self.cpu), *argv]
        env_argv = ["env", "BPFTRACE_MAP_KEYS_MAX=65536", *argv]
        # its output goes to a file, not a pipe: a program that prints during the run
        # (kbp.bench.anatomy's lines) would fill a pipe nobody reads until stop() and block
        fd, name = tempfile.mkstemp(prefix="kbp-bpftrace-", suffix=".json")
        self.out_path = Path(name)
        try:
            with os.fdopen(fd, "w") as out:
                self.proc = access.popen(env_argv, session=True, stdout=out)
        except BaseException:
            self.out_path.unlink(missing_ok=True)
            self.out_path = None
            raise
        deadline = time.monotonic() + timeout
        buf = ""
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                buf = self.out_path.read_text(errors="replace")
                if any(is_ready(line) for line in buf.splitlines()):
                    self.started_ns = time.monotonic_ns()
                    return
                time.sleep(0.05)
        except BaseException:
            # Ctrl-C (or anything else) while bpftrace loads: it runs in its own session, so
            # nobody else stops it; left running it would hold tracefs (and the CPU)
            self.abort()
            raise
        _out, err = access.stop(self.proc, signal.SIGKILL, timeout=2)
        self.proc = None
        buf = self._take_output()
        raise RuntimeError(f"bpftrace did not start in {timeout:g} s: "
                           f"{(buf + err).strip()[-600:]}")

    def _take_output(self) -> str:
        """What bpftrace wrote to its output file, which is then removed."""
        if self.out_path is None:
            return ""
        try:
            return self.out_path.read_text(errors="replace")
        except OSError:
            return ""
        finally:
            self.out_path.unlink(missing_ok=True)
            self.out_path = None

    def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        _out, err = access.stop(self.proc, signal.SIGINT, timeout=20)
        self.proc = None
        self.stopped_ns = time.monotonic_ns()
        self.output, self.error = self._take_output(), err
        return parse(self.output)

    def xmit_record(self, result: dict[str, Any],
                    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """:func:`xmit_to_poll` of :meth:`stop`'s result for this run's RT devices, the
        counts completed with how they were keyed: ``keyed_by`` ("napi_id": the RT server
        device's NAPI ids from napi-get; "rx_dev": its name in the tracepoint), ``tx_dev``,
        ``rx_dev``, ``stale_ns`` and, when napi-get failed, ``napi_error``."""
        summary, rec = xmit_to_poll(result, self.rt_napi_ids)
        out = {"keyed_by": KEYED_NAPI if self.rt_napi_ids else KEYED_RX_DEV,
               "tx_dev": self.tx_dev, "rx_dev": self.rx_dev, "stale_ns": self.stale_ns, **rec}
        if self.napi_error:
            out["napi_error"] = self.napi_error
        return summary, out

    def abort(self) -> None:
        """Kill bpftrace if it runs and wait until it has exited."""
        if self.proc is not None:
            with contextlib.suppress(Exception):
                access.stop(self.proc, signal.SIGKILL, timeout=2)
            self.proc = None
        self._take_output()
