"""``kbpctl disable --all`` also puts back what a killed ``kbpctl bench`` left set outside its
namespaces (busypoll's global sysctls), from that benchmark's journal.  Before, only the next
benchmark did: an operator who killed one and ran ``disable --all`` kept busy_read at 50.

The knob here is a file of the test's own (the journal's file kind writes any path), so the
test changes nothing of the machine's; kbpctl runs as a process of its own, as an operator
runs it, with the test's journal directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kbp.bench import knobs, nicpair
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


def test_nic_ports_that_cannot_be_put_back_fail_and_keep_the_journal(run_dir: Path) -> None:
    """A killed benchmark's NIC pair journal naming a port that is nowhere (no such ifindex,
    its namespace gone): disable --all fails naming the journal, which stays for the next
    try.  Before, the failure was printed among the ports put back and the exit was 0."""
    f = journal.StateDir().begin_process(nicpair.OWNER, _dead_pid())
    f.change(nicpair.KIND, {"name": "kbpgone0", "ifindex": 2_000_000_000,
                            "netns": "kbp-test-gone"},
             {"up": True, "mtu": 1500, "addrs": [], "irqs": {}}, "moved")
    f.close()
    r = _disable_all()
    assert r.returncode != 0, r
    assert f"a killed benchmark's NIC ports ({f.path}) could not all be put back" in r.stderr
    assert "kbpgone0 (ifindex 2000000000) is not back in this namespace" in r.stderr
    assert "journal kept" in r.stderr and f.path.exists()


def test_status_and_exporter_show_a_killed_benchmarks_journal_until_it_is_put_back(
        run_dir: Path, tmp_path: Path) -> None:
    knob = tmp_path / "busy_read"
    knob.write_text("50\n")
    pid = _dead_pid()
    j = _bench_journal(pid, knob, "0", "50")
    live = _bench_journal(os.getpid(), tmp_path / "busy_poll", "0", "50")   # this test: alive

    def status(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*KBPCTL, "status", *extra], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    st = json.loads(status("--json").stdout)
    assert st["orphans"] == [{"owner": knobs.OWNER, "pid": pid, "path": str(j),
                              "changes": 1}], st["orphans"]
    text = " ".join(status().stdout.split())
    assert (f"! a killed {knobs.OWNER} process (pid {pid}) left 1 change set ({j}): "
            "kbpctl disable --all puts them back") in text, text
    assert _scrape(tmp_path) == ({"killed_process": 1.0}, {(knobs.OWNER, str(pid)): 1.0})
    assert _disable_all().returncode == 0
    assert json.loads(status("--json").stdout)["orphans"] == []
    assert _scrape(tmp_path) == ({}, {})
    assert live.exists()


def _scrape(tmp_path: Path) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """What ``kbpctl exporter --once`` says of killed processes: kbp_problems' non-zero
    kinds, kbp_killed_process_changes by (owner, pid)."""
    out = tmp_path / "textfile"
    out.mkdir(exist_ok=True)
    r = subprocess.run([*KBPCTL, "exporter", "--once", "--textfile", str(out)],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    fams = {f.name: f for f in text_string_to_metric_families((out / "kbp.prom").read_text())}
    kinds = {s.labels["kind"]: s.value for s in fams["kbp_problems"].samples if s.value}
    changes = {(s.labels["owner"], s.labels["pid"]): s.value
               for s in fams["kbp_killed_process_changes"].samples}
    return kinds, changes
