"""Child processes of the benchmark: started in their own session (so a Ctrl-C reaches only
the benchmark, which then stops them in order), always reaped, never left behind."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Sequence

from kbp.testbed import ns_cmd


def start(ns: str | None, argv: Sequence[str], *, stdout: int = subprocess.PIPE,
          stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(ns_cmd(ns, argv), stdout=stdout, stderr=stderr, text=True,
                            start_new_session=True)


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 5.0,
         ) -> tuple[str, str]:
    """Signal a child (if it still runs), wait for it, and return what it printed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out or "", err or ""


def run(ns: str | None, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a child to completion; on timeout or any exception (Ctrl-C) stop it first."""
    proc = start(ns, argv)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop(proc, signal.SIGINT, timeout=2.0)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
