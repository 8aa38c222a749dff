"""``kbpctl disable --all`` also puts back what a killed ``kbpctl bench`` left set outside its
namespaces (busypoll's global sysctls), from that benchmark's journal.  Before, only the next
benchmark did: an operator who killed one and ran ``disable --all`` kept busy_read at 50.

The knob here is a file of the test's own (the journal's file kind writes any path), so the
test changes nothing of the machine's; kbpctl runs as a process of its own, as an operator
runs it, with the test's journal directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kbp.bench import knobs
from kbp.system import journal

KBPCTL = [sys.executable, "-m", "kbp.cli"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="kbpctl disable needs root")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _bench_journal(pid: int, knob: Path, old: str, new: str) -> Path:
    """The journal a benchmark with ``pid`` writes before it sets ``knob`` (knobs.Changes)."""
    f = journal.StateDir().begin_process(knobs.OWNER, pid)
    f.change(journal.KIND_FILE, {"path": str(knob)}, old, new)
    f.close()
    return f.path


def _disable_all() -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KBPCTL, "disable", "--all"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_disable_all_puts_back_a_killed_benchmarks_global_knobs(run_dir: Path,
                                                                 tmp_path: Path) -> None:
    knob = tmp_path / "busy_read"
    knob.write_text("50\n")
    pid = _dead_pid()
    j = _bench_journal(pid, knob, "0", "50")
    r = _disable_all()
    assert r.returncode == 0, r.stderr
    assert knob.read_text() == "0\n"
    assert f"put back {knob} = 0 (a killed benchmark, pid {pid}, had set 50)" in r.stdout
    assert "nothing is enabled" not in r.stdout
    assert not j.exists()
    # done once: a second disable --all finds nothing
    again = _disable_all()
    assert again.returncode == 0 and "nothing is enabled" in again.stdout, again


def test_a_live_benchmarks_knobs_are_left_to_it(run_dir: Path, tmp_path: Path) -> None:
    knob = tmp_path / "busy_poll"
    knob.write_text("50\n")
    j = _bench_journal(os.getpid(), knob, "0", "50")     # this test: alive
    r = _disable_all()
    assert r.returncode == 0 and "nothing is enabled" in r.stdout, r
    assert knob.read_text() == "50\n" and j.exists()


def test_a_knob_that_cannot_be_put_back_fails_and_keeps_the_journal(run_dir: Path,
                                                                      tmp_path: Path) -> None:
    knob = tmp_path / "not-a-file"
    knob.mkdir()                                          # reading it fails (EISDIR)
    j = _bench_journal(_dead_pid(), knob, "0", "50")
    r = _disable_all()
    assert r.returncode != 0
    assert f"a killed benchmark's settings ({j}) could not all be put back" in r.stderr
    assert "journal kept" in r.stderr and j.exists()
