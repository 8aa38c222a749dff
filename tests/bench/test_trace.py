"""The benchmark's tracer and tracefs handling on every exit path (issue 9): a bpftrace
interrupted while it loads is reaped, tracefs is unmounted only after its tracers exited,
and a tracefs that stays busy is reported, not dropped.

The TraceFs tests mount a tracefs instance of their own on a temporary directory (tracefs can
be mounted more than once), so /sys/kernel/tracing is never touched.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kbp.bench import trace


def _mounted(path: Path) -> bool:
    return (path / "events").is_dir()


@pytest.fixture
def own_tracefs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip(reason="mounting tracefs needs root")
    mnt = tmp_path / "tracing"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tracefs", "nodev", str(mnt)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(reason=f"cannot mount tracefs here: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        if _mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _holder(cwd: Path) -> subprocess.Popen[str]:
    """A process that keeps ``cwd`` busy, started like bpftrace (own session, pipes)."""
    return subprocess.Popen(["sleep", "60"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_close_waits_for_tracers_then_unmounts(own_tracefs: Path) -> None:
    tfs = trace.TraceFs(path=own_tracefs, mounted_by_us=True)
    kt = tfs.track(trace.KernelTrace())
    kt.proc = _holder(own_tracefs / "events")
    assert trace.umount(own_tracefs) == errno.EBUSY      # really held
    proc = kt.proc
    tfs.close()
    assert proc.returncode is not None          # killed and reaped
    assert kt.proc is None and tfs.tracers == []
    assert not _mounted(own_tracefs) and not tfs.mounted_by_us


def test_close_reports_a_mount_it_cannot_restore(own_tracefs: Path) -> None:
    other = _holder(own_tracefs)                # not a tracer of ours: close() cannot stop it
    try:
        tfs = trace.TraceFs(path=own_tracefs, mounted_by_us=True, busy_timeout=0.3)
        with pytest.raises(trace.TraceFsError, match=r"Device or resource busy.*held by sleep"):
            tfs.close()
        assert _mounted(own_tracefs) and tfs.mounted_by_us   # still to do, still reported
    finally:
        other.kill()
        other.wait()
    tfs.close()                                  # once the holder is gone it succeeds
    assert not _mounted(own_tracefs)


def test_close_leaves_a_mount_it_did_not_make(own_tracefs: Path) -> None:
    tfs = trace.TraceFs(path=own_tracefs)
    tfs.ensure()                                 # already mounted: not ours
    assert not tfs.mounted_by_us
    tfs.close()
    assert _mounted(own_tracefs)


def test_start_interrupted_while_loading_reaps_bpftrace(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """Ctrl-C while bpftrace loads (before READY): the tracer must not be left running."""
    started: list[subprocess.Popen[str]] = []

    def fake_start(_argv: Sequence[str], _ns: str | None = None, **_kw: Any,
                   ) -> subprocess.Popen[str]:
        p = _holder(tmp_path)                  # never prints READY
        started.append(p)
        return p

    def interrupt(_sig: int, _frm: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(trace.sysaccess, "popen", fake_start)
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        kt = trace.KernelTrace()
        with pytest.raises(KeyboardInterrupt):
            kt.start(timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    (p,) = started
    try:
        assert p.returncode is not None, "bpftrace left running after Ctrl-C"
        assert kt.proc is None
    finally:
        if p.returncode is None:
            p.kill()
            p.wait()
