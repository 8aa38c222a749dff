"""Issue 38: the per-run foreign-CPU check (kbp.bench.foreign) on the real /proc: user time
on a CPU from a process the benchmark did not start counts as foreign, its own does not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbp.bench import foreign, sysstat

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def _cpu_user_s(a: sysstat.Snapshot, b: sysstat.Snapshot, cpu: int) -> float:
    hz = os.sysconf("SC_CLK_TCK")
    return sum((b.stat[cpu][k] - a.stat[cpu][k]) / hz for k in ("user", "nice"))


def _measure(cpu: int, argv: list[str]) -> dict[str, object]:
    a, s0 = foreign.Mark.take(cpu), sysstat.Snapshot.take()
    subprocess.run(argv, check=True)
    time.sleep(1.2)                       # the busy loop runs 1 s
    b, s1 = foreign.Mark.take(cpu), sysstat.Snapshot.take()
    return foreign.check(a, b, _cpu_user_s(s0, s1, cpu), s1.t - s0.t)


@pytest.fixture()
def cpu() -> int:
    return max(os.sched_getaffinity(0))


def test_a_process_the_bench_did_not_start_is_foreign(cpu: int) -> None:
    # sh starts the loop in the background and exits: the loop is reparented away from us
    loop = f"taskset -c {cpu} {sys.executable} -c '{BUSY.format(s=1.0)}' >/dev/null 2>&1 &"
    got = _measure(cpu, ["sh", "-c", loop])
    assert got["disturbed"] is True, got
    assert float(got["foreign_user_s"]) > 0.2, got       # ~1 s, less when the CPU is shared


def test_the_bench_s_own_children_are_not_foreign(cpu: int) -> None:
    child = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c",
                              BUSY.format(s=1.0)])
    try:
        a, s0 = foreign.Mark.take(cpu), sysstat.Snapshot.take()
        time.sleep(0.9)                   # before it exits: its ticks are still readable
        b, s1 = foreign.Mark.take(cpu), sysstat.Snapshot.take()
    finally:
        child.wait()
    got = foreign.check(a, b, _cpu_user_s(s0, s1, cpu), s1.t - s0.t)
    assert float(got["bench_user_s"]) > 0.2, got
    assert got["bench_user_s"] <= got["cpu_user_s"] + 0.05, got


def test_descendants_and_stat_fields(tmp_path: Path) -> None:
    proc = tmp_path
    for pid, ppid, comm in ((1, 0, "init"), (10, 1, "a (x) b"), (11, 10, "c"), (12, 1, "d")):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} " + "0 " * 40)
    assert foreign.descendants(10, proc) == {10, 11}
    assert foreign.descendants(1, proc) == {1, 10, 11, 12}


def test_check_flags_more_than_the_fraction() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    a = foreign.Mark(1, {5: 0})
    b = foreign.Mark(1, {5: hz})          # the bench's threads: 1 s
    quiet = foreign.check(a, b, 1.0 + 0.04, 1.0)
    assert not quiet["disturbed"] and quiet["foreign_user_s"] == pytest.approx(0.04)
    busy = foreign.check(a, b, 1.0 + 0.5, 1.0)
    assert busy["disturbed"] and busy["limit_s"] == pytest.approx(foreign.FOREIGN_MAX_FRACTION)


def test_report_says_which_runs_were_run_again() -> None:
    from kbp.bench import report
    fc = {"foreign_user_s": 0.01, "limit_s": 0.15, "disturbed": False}
    bad = {"foreign_user_s": 0.9, "limit_s": 0.15, "disturbed": True}
    res = {"runs": [{"rep": 0, "mode": "napi", "condition": "idle", "foreign_cpu": fc},
                    {"rep": 1, "mode": "napi", "condition": "flood", "foreign_cpu": bad}],
           "disturbed_runs": [{"rep": 0, "mode": "napi", "condition": "idle",
                               "foreign_cpu": {**bad, "foreign_user_s": 1.6}}]}
    md = "\n".join(report.foreign_section(res))     # type: ignore[arg-type]
    assert "1 attempt(s) discarded and run again, 1 kept run(s) still disturbed" in md
    assert "- discarded: rep 1 idle napi: 1.60 s foreign" in md
    assert "- kept, disturbed: rep 2 flood napi: 0.90 s foreign" in md
    assert report.foreign_section({"runs": []}) == []  # type: ignore[arg-type]
