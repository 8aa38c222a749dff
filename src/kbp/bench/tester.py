"""The tester: ``kbp-rtt`` (C, src/kbp/data/kbp_rtt.c), compiled on first use.

It measures round trips against an unmodified sockperf server with kernel software
timestamps (SO_TIMESTAMPING), so the tester's own scheduling is not in the numbers; see the
header of kbp_rtt.c.  This module builds it, runs it in a namespace and parses its output.

``build(source)`` compiles any of the benchmark's C programs in src/kbp/data the same way,
once per source version: also ``kbp-echo`` (kbp_echo.c, the epoll echo server of the
irq-suspend mode, :mod:`kbp.bench.workloads`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kbp.system import access

TESTER_COMM = "kbp-rtt"   # the tester's process name (comm)
SOURCE = "kbp_rtt.c"
ECHO_SOURCE = "kbp_echo.c"  # kbp-echo, the irq-suspend mode's RT application


class TesterError(RuntimeError):
    pass


class TesterTimeout(TesterError):
    """The tester did not finish within its run's time plus a margin (it was killed): a trial
    the machine could not carry out, not a result."""


def _cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("KBP_CACHE"):
        dirs.append(Path(os.environ["KBP_CACHE"]))
    xdg = os.environ.get("XDG_CACHE_HOME")
    dirs.append(Path(xdg) / "kbp" if xdg else Path.home() / ".cache" / "kbp")
    dirs.append(Path(tempfile.gettempdir()) / f"kbp-cache-{os.getuid()}")
    return dirs


def source_text(source: str = SOURCE) -> bytes:
    return (resources.files("kbp") / "data" / source).read_bytes()


def program_name(source: str) -> str:
    """The binary (and process name) built from ``source``: kbp_rtt.c -> kbp-rtt."""
    if "/" in source or not source.endswith(".c"):
        raise ValueError(f"not a C source of src/kbp/data: {source!r}")
    return source[:-2].replace("_", "-")


def build(source: str = SOURCE, force: bool = False) -> Path:
    """Compile one of the benchmark's C programs (default: the tester), once per source
    version, and return the binary's path."""
    src = source_text(source)
    name = program_name(source)
    digest = hashlib.sha256(src).hexdigest()[:12]
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    last_err = ""
    for base in _cache_dirs():
        # the tester keeps the directory name it always had (caches stay valid)
        out = base / f"{'tester' if source == SOURCE else name}-{digest}" / name
        if out.exists() and not force:
            return out
        if cc is None:
            raise TesterError(f"no C compiler: install gcc (Debian: apt-get install gcc "
                              f"libc6-dev) to build the benchmark's {name}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            csrc = out.parent / source
            csrc.write_bytes(src)
        except OSError as e:
            last_err = str(e)
            continue
        proc = subprocess.run([cc, "-O2", "-Wall", "-o", str(out) + ".tmp", str(csrc), "-lm"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise TesterError(f"building {name} failed ({cc}): {proc.stderr.strip()[-800:]}"
                              " -- is libc6-dev installed?")
        os.replace(str(out) + ".tmp", out)
        return out
    raise TesterError(f"no writable cache directory for {name} ({last_err}); set KBP_CACHE")


@dataclass
class RttResult:
    summary: dict[str, Any]
    kernel_ns: list[int] = field(default_factory=list)   # round trips with kernel stamps
    user_ns: list[int] = field(default_factory=list)     # the same, user-space clocks
    lost: int = 0
    # every measured request's lateness: its actual transmit minus the schedule's intended
    # send time, by the kernel's TX stamp and by the user-space clock before send()
    late_ns: list[int] = field(default_factory=list)
    late_user_ns: list[int] = field(default_factory=list)
    # {sequence number: kernel round trip (ns)} of every measured request with one (the
    # anatomy's key: kbp.bench.anatomy)
    kernel_by_seq: dict[int, int] = field(default_factory=dict)


def check_busy_poll(summary: dict[str, Any]) -> None:
    """The tester must not busy-poll: kbp-rtt sets SO_BUSY_POLL to 0 on its socket and
    prints what it read back (``so_busy_poll_us``; -1: the kernel has no SO_BUSY_POLL, so
    nothing busy-polls).  TesterError when it is missing or another value."""
    got = summary.get("so_busy_poll_us")
    if got is None or int(got) not in (0, -1):
        raise TesterError(f"kbp-rtt's socket has SO_BUSY_POLL = {got} (must be 0: the "
                          "tester would busy-poll the client device's NAPI)")


def _parse_summary(stdout: str, argv: list[str], stderr: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise TesterError(f"tester printed no summary ({' '.join(argv)}): {stderr.strip()[-400:]}")


def uniform_problem(uniform_us: tuple[float, float] | list[float]) -> str | None:
    """Why ``(MIN_US, MAX_US)`` is not a uniform inter-arrival range kbp-rtt takes (None:
    it is): 0 < MIN_US <= MAX_US <= 60 s, as kbp_rtt.c's parse_uniform checks."""
    if len(uniform_us) != 2:
        return f"--uniform takes MIN_US,MAX_US (two numbers), not {list(uniform_us)}"
    lo, hi = (float(x) for x in uniform_us)
    if not 0 < lo <= hi <= 60e6:
        return (f"--uniform {lo:g},{hi:g}: use MIN_US,MAX_US with 0 < MIN_US <= MAX_US "
                "(µs, at most 60 s)")
    return None


def uniform_rate(uniform_us: tuple[float, float] | list[float]) -> float:
    """Mean request rate (1/s) of gaps uniform in [MIN_US, MAX_US]."""
    lo, hi = (float(x) for x in uniform_us)
    return 2e6 / (lo + hi)


def run_rtt(binary: Path, ns: str | None, ip: str, *, port: int, size: int, rate: float,
            poisson: bool, duration: float, warmup: float = 0.5, grace: float = 0.5,
            cpu: int | None = None, fifo: int = 0, seed: int = 1,
            uniform_us: tuple[float, float] | list[float] | None = None) -> RttResult:
    """Open-loop request/response run; round trips in ns.  Inter-arrival times: uniform in
    ``uniform_us`` = (MIN_US, MAX_US) when given (``rate`` and ``poisson`` are then unused:
    the mean rate follows from the range), else exponential (``poisson``) or constant at
    ``rate``."""
    if uniform_us is not None:
        why = uniform_problem(uniform_us)
        if why:
            raise TesterError(why)
        rate, poisson = uniform_rate(uniform_us), False
    with tempfile.NamedTemporaryFile(prefix="kbp-rtt-", suffix=".txt", delete=False) as f:
        samples = Path(f.name)
    argv = [str(binary), "--mode", "rtt", "--ip", ip, "--port", str(port), "--size", str(size),
            "--rate", f"{rate:g}", "--duration", f"{duration:g}", "--warmup", f"{warmup:g}",
            "--grace", f"{grace:g}", "--seed", str(seed), "--out", str(samples)]
    if uniform_us is not None:
        argv += ["--uniform", ",".join(f"{float(x):.12g}" for x in uniform_us)]
    elif poisson:
        argv.append("--poisson")
    if cpu is not None:
        argv += ["--cpu", str(cpu)]
    if fifo:
        argv += ["--fifo", str(fifo)]
    try:
        proc = access.cmd(argv, ns=ns, check=False,
                             timeout=duration + warmup + grace + 30, session=True)
        if proc.returncode != 0:
            raise TesterError(f"tester failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
        summary = _parse_summary(proc.stdout, argv, proc.stderr)
        check_busy_poll(summary)
        res = RttResult(summary)
        for line in samples.read_text().splitlines():
            seq, k, u, *late = line.split()       # late_kernel late_user (older: none)
            for v, dst in zip(late, (res.late_ns, res.late_user_ns), strict=False):
                if int(v) >= 0:
                    dst.append(int(v))
            if int(u) < 0:
                res.lost += 1
                continue
            res.user_ns.append(int(u))
            if int(k) >= 0:
                res.kernel_ns.append(int(k))
                res.kernel_by_seq[int(seq)] = int(k)
        return res
    finally:
        samples.unlink(missing_ok=True)


def run_rate(binary: Path, ns: str | None, ip: str, *, port: int, size: int, rate: float,
             duration: float, grace: float = 0.5, cpu: int | None = None, fifo: int = 0,
             ) -> dict[str, Any]:
    """Constant-rate trial (RFC 2544): sent / received counts."""
    argv = [str(binary), "--mode", "rate", "--ip", ip, "--port", str(port), "--size",
            str(size), "--rate", f"{rate:g}", "--duration", f"{duration:g}", "--warmup", "0",
            "--grace", f"{grace:g}"]
    if cpu is not None:
        argv += ["--cpu", str(cpu)]
    if fifo:
        argv += ["--fifo", str(fifo)]
    limit = duration + grace + 30
    try:
        proc = access.cmd(argv, ns=ns, check=False, timeout=limit, session=True)
    except subprocess.TimeoutExpired as e:
        raise TesterTimeout(f"tester still running {limit:g} s after a {duration:g} s trial "
                            f"at {rate:,.0f} pps; killed") from e
    if proc.returncode != 0:
        raise TesterError(f"tester failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    summary = _parse_summary(proc.stdout, argv, proc.stderr)
    check_busy_poll(summary)
    return summary
