"""The stock periodic pieces that need no root: planning, the objective, the service's journal
handler and its status (a fake service: a sleeping child process)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbp import names, netap, periodicd
from kbp.backends import stock
from kbp.periodicd import Sample, ServiceHandler, objective_value
from kbp.problems import PERIODIC_SERVICE
from kbp.system.journal import Record, StateDir


def test_plan_periodic_per_napi_and_per_device() -> None:
    steps = stock.plan_periodic("ns", "veth0", 7, [3, 4], 2510)
    assert [(s.kind, s.key["knob"], s.key["napi_id"], s.new) for s in steps] == [
        ("napi", "defer_hard_irqs", 3, 8), ("napi", "gro_flush_timeout", 3, 2_510_000),
        ("napi", "defer_hard_irqs", 4, 8), ("napi", "gro_flush_timeout", 4, 2_510_000)]
    steps = stock.plan_periodic(None, "eth1", 2, None, 100)
    assert [(s.kind, s.key["attr"], s.new) for s in steps] == [
        ("sysfs", "napi_defer_hard_irqs", "8"), ("sysfs", "gro_flush_timeout", "100000")]
    assert periodicd.DEFER_HARD_IRQS == 8


def test_first_interval() -> None:
    search = {"interval_us": None, "round_ms": 50, "min_interval_us": 100,
              "max_interval_us": 1000, "min_change": 20, "max_round": 300,
              "objective": "bytes"}
    assert periodicd.first_interval(search) == netap.Search(netap.Params(100, 1000)).interval_us
    assert periodicd.first_interval({**search, "interval_us": 777}) == 777


@pytest.mark.parametrize(("objective", "prev", "cur", "value"), [
    (names.OBJECTIVE_BYTES, Sample(1000, 0, 0), Sample(6000, 0, 50_000_000), 5000),
    # overslept by half a round: scaled back to the nominal round
    (names.OBJECTIVE_BYTES, Sample(0, 0, 0), Sample(7500, 0, 75_000_000), 5000),
    (names.OBJECTIVE_BYTES_PER_CPU, Sample(0, 10, 0), Sample(5000, 2_000_010, 50_000_000),
     2_500_000),
    # no CPU time seen: a 1 us floor, not a division by zero
    (names.OBJECTIVE_BYTES_PER_CPU, Sample(0, 0, 0), Sample(5, 0, 50_000_000), 5_000_000),
    (names.OBJECTIVE_BYTES, Sample(100, 0, 0), Sample(100, 0, 50_000_000), None),  # idle
    (names.OBJECTIVE_BYTES, Sample(100, 0, 0), Sample(50, 0, 50_000_000), None),   # reset
    (names.OBJECTIVE_BYTES, Sample(None, 0, 0), Sample(50, 0, 50_000_000), None),
])
def test_objective(objective: str, prev: Sample, cur: Sample, value: int | None) -> None:
    assert objective_value(objective, prev, cur, 50_000_000)["value"] == value


def _record(root: Path, started: float, complete: bool = True) -> Record:
    path = StateDir(root).journal_path("veth0", "ns")
    return Record(path=path, backend="stock", dev="veth0", netns="ns", ifindex=7,
                  request={"mode": "periodic", "periodic": {
                      "interval_us": None, "round_ms": 50, "min_interval_us": 100,
                      "max_interval_us": 4000, "min_change": 20, "max_round": 300,
                      "objective": "bytes"}}, complete=complete, started=started)


def test_handler_and_status_follow_the_state_file(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "netns" / "ns").mkdir(parents=True)
    key = periodicd.service_key("veth0", "ns", 7, 123.5)
    h = ServiceHandler(StateDir(root))
    assert h.get(key) is None
    path = periodicd.state_file(root, "veth0", "ns")
    assert path == root / "netns" / "ns" / "veth0.periodic.json"

    # a state file of another journal (an older enable) is not this journal's service
    periodicd.write_state(path, {"pid": None, "journal": 1.0})
    assert h.get(key) is None
    info, problems = periodicd.describe(root, _record(root, 123.5))
    assert info["service"] is None and "never started" in problems[0].text
    assert [p.kind for p in problems] == [PERIODIC_SERVICE]

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from kbp import sysinfo
        st = sysinfo.read_stat(child.pid)
        assert st is not None
        periodicd.write_state(path, {"pid": child.pid, "starttime": st.starttime,
                                     "journal": 123.5, "status": "running", "rounds": 4,
                                     "applied_us": 1590, "search": {"round": 5}})
        periodicd.log_file(root, "veth0", "ns").write_text("log\n")
        assert h.get(key) == periodicd.RUNNING
        info, problems = periodicd.describe(root, _record(root, 123.5))
        assert problems == [] and info["service"]["running"] and info["interval_us"] == 1590
        assert info["search"] == {"round": 5}
        # a wrong start time is another process: not signalled, reported as not running
        periodicd.write_state(path, {"pid": child.pid, "starttime": st.starttime + 1,
                                     "journal": 123.5, "applied_us": 1590})
        _, problems = periodicd.describe(root, _record(root, 123.5))
        assert "is not running" in problems[0].text and "stays at 1590 us" in problems[0].text
        assert [p.kind for p in problems] == [PERIODIC_SERVICE]
        _, problems = periodicd.describe(root, _record(root, 123.5, complete=False))
        assert problems == []  # the interrupted enable is the problem to report
        periodicd.write_state(path, {"pid": child.pid, "starttime": st.starttime,
                                     "journal": 123.5})
        h.set(key, None)  # stop: SIGTERM, wait, files removed
        deadline = time.monotonic() + 30
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert child.returncode == -15
        assert not path.exists() and not periodicd.log_file(root, "veth0", "ns").exists()
        assert h.get(key) is None
    finally:
        child.kill()
        child.wait()


def test_threads_from_the_journal(tmp_path: Path) -> None:
    from kbp.system.journal import Change
    rec = _record(tmp_path, 1.0)
    rec.changes = [Change(1, "napi", {"knob": "threaded"}, 0, 1),
                   Change(2, "affinity", {"pid": 5, "starttime": 9, "comm": "napi/x-1"},
                          [0], [1]),
                   Change(3, "sched", {"pid": 5, "starttime": 9, "comm": "napi/x-1"}, {}, {})]
    assert periodicd.threads(rec) == [periodicd.sysinfo.TaskId(5, 9, "napi/x-1")]
