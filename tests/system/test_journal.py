"""kbp's one lock and the process journals (kbp.system.journal): what a benchmark killed
with SIGKILL leaves for the next one, in kbpctl's own journal format."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from kbp.system import access, journal
from kbp.system.journal import StateDir


def _dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def test_orphans_are_the_journals_of_dead_processes_of_that_owner(tmp_path: Path) -> None:
    import os
    st = StateDir(tmp_path)
    dead = _dead_pid()
    for owner, pid in (("bench-knobs", dead), ("bench-knobs", os.getpid()),
                       ("bench-knobs", 1), ("nicpair", dead)):       # pid 1: alive
        j = st.begin_process(owner, pid)
        j.change("file", {"path": "/x"}, "0", "1")
        j.close()
    (tmp_path / "process" / "bench-knobs-junk.jsonl").write_text("{")
    got = st.orphans("bench-knobs")
    assert [(r.path.name, r.request, [c.old for c in r.changes]) for r in got] == \
        [(f"bench-knobs-{dead}.jsonl", {"pid": dead}, ["0"])]
    assert {r.path.name for r in st.orphans("bench-knobs", own=True)} == \
        {f"bench-knobs-{dead}.jsonl", f"bench-knobs-{os.getpid()}.jsonl"}
    assert [r.path.name for r in st.orphans("nicpair")] == [f"nicpair-{dead}.jsonl"]
    assert st.records() == []                    # not devices: kbpctl status does not list them
    assert StateDir(tmp_path / "none").orphans("nicpair") == []
    with pytest.raises(ValueError, match="bad journal owner"):
        st.process_path("../x")


def test_a_handler_with_several_steps_reports_each_failed_one(tmp_path: Path) -> None:
    """A handler whose put-back has several steps (a NIC port) raises RestoreError: the
    replay names each failed step and still tries the other changes."""
    j = StateDir(tmp_path).begin_process("nicpair", _dead_pid())
    j.change("multi", {"n": 1}, "a", "b")
    j.change("multi", {"n": 2}, "a", "b")
    j.close()
    (rec,) = StateDir(tmp_path).orphans("nicpair")
    tried: list[int] = []

    class Multi:
        def get(self, key: dict[str, int]) -> str:
            return "b"

        def set(self, key: dict[str, int], value: str) -> None:
            tried.append(key["n"])
            if key["n"] == 2:
                raise access.RestoreError([RuntimeError("step x"), RuntimeError("step y")],
                                          ["skipped z"])

    with pytest.raises(access.RestoreError) as ei:
        journal.restore(rec, {"multi": Multi()})
    assert tried == [2, 1]
    assert [str(e) for e in ei.value.errors] == ["step x", "step y"]
    assert ei.value.notes == ["skipped z"]


def test_the_one_lock_is_held_again_by_its_thread_and_waited_for_by_others(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """kbpctl and a benchmark take the same lock: the thread holding it takes it again
    (a benchmark enables a backend in-process); another thread waits, saying for whom."""
    import os
    st = StateDir(tmp_path)
    got = threading.Event()

    def other() -> None:
        with st.lock():
            got.set()

    with st.lock():
        with StateDir(tmp_path).lock():                  # same thread: no deadlock
            pass
        assert (tmp_path / "lock").read_text().strip() == str(os.getpid())
        th = threading.Thread(target=other)
        th.start()
        assert not got.wait(0.3)                         # still held after the inner exit
    assert got.wait(5)
    th.join()
    assert f"waiting for {tmp_path / 'lock'}, held by pid {os.getpid()}" in capfd.readouterr().err
