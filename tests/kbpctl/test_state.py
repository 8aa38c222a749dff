"""The write-ahead journal: recorded before changed, restored newest-first, kill-safe."""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kbp.system import access, journal
from kbp.system.journal import MISSING, Executor, PauseHook, StateDir, TargetGone


class Box:
    """A fake handler over a dict; checks the journal already holds each change it makes."""

    def __init__(self, values: dict[str, Any], journal_path: Path | None = None) -> None:
        self.values = values
        self.journal_path = journal_path
        self.sets: list[tuple[str, Any]] = []

    def get(self, key: Mapping[str, Any]) -> Any:
        return self.values.get(key["k"], MISSING)

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        if key["k"] not in self.values:
            raise TargetGone(key["k"])
        if self.journal_path is not None:  # write-ahead: the record is on disk already
            last = json.loads(self.journal_path.read_text().splitlines()[-1])
            assert last["op"] == "change" and last["key"] == dict(key) and last["new"] == value
        self.sets.append((key["k"], value))
        self.values[key["k"]] = value


def test_paths(tmp_path: Path) -> None:
    st = StateDir(tmp_path)
    assert st.journal_path("eth1", None) == tmp_path / "default/eth1.jsonl"
    assert st.journal_path("veth0", "blue") == tmp_path / "netns/blue/veth0.jsonl"
    with pytest.raises(ValueError):
        st.journal_path("a/b", None)


def test_env_run_dir(run_dir: Path) -> None:
    assert StateDir().root == run_dir


def test_journal_before_change_and_restore(tmp_path: Path) -> None:
    st = StateDir(tmp_path)
    j = st.begin("stock", "eth1", None, 3, {"mode": "hybrid"})
    box = Box({"a": 0, "b": "x", "c": 5}, j.path)
    ex = Executor(j, {"box": box})
    assert ex.apply("box", {"k": "a"}, 1) is not None
    assert ex.apply("box", {"k": "b"}, "y") is not None
    assert ex.apply("box", {"k": "c"}, 5) is None  # already so: neither journaled nor made
    assert ex.apply("box", {"k": "a"}, 2) is not None  # changed twice
    j.done()
    j.close()
    rec = st.record("eth1", None)
    assert rec is not None and rec.complete and rec.backend == "stock" and rec.ifindex == 3
    assert [(c.step, c.key["k"], c.old, c.new) for c in rec.changes] == \
        [(1, "a", 0, 1), (2, "b", "x", "y"), (3, "a", 1, 2)]
    box.journal_path = None
    notes = journal.restore(rec, {"box": box})
    assert notes == []
    assert box.values == {"a": 0, "b": "x", "c": 5}  # the oldest old value wins
    assert box.sets[-3:] == [("a", 1), ("b", "x"), ("a", 0)]  # newest first


def test_restore_is_idempotent_and_skips_gone_targets(tmp_path: Path) -> None:
    st = StateDir(tmp_path)
    j = st.begin("stock", "eth1", "blue", 3, {})
    j.change("box", {"k": "a"}, 0, 1)  # journaled, but the process died before making it
    j.change("box", {"k": "gone"}, 0, 1)
    j.close()
    rec = st.record("eth1", "blue")
    assert rec is not None and not rec.complete
    box = Box({"a": 0})
    notes = journal.restore(rec, {"box": box})
    assert box.sets == [] and box.values == {"a": 0}
    assert notes == ["box {'k': 'gone'}: gone, nothing to restore"]
    journal.remove_record(rec.path)
    assert st.records() == [] and not (tmp_path / "netns/blue").exists()


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    st = StateDir(tmp_path)
    j = st.begin("stock", "eth1", None, 3, {})
    j.change("box", {"k": "a"}, 0, 1)
    j.close()
    with open(j.path, "a") as f:
        f.write('{"op": "change", "step": 2, "ki')  # killed mid-write
    rec = st.record("eth1", None)
    assert rec is not None and [c.step for c in rec.changes] == [1]


def test_restore_error_keeps_going(tmp_path: Path) -> None:
    class Broken(Box):
        def set(self, key: Mapping[str, Any], value: Any) -> None:
            if key["k"] == "bad":
                raise OSError(5, "I/O error")
            super().set(key, value)

    st = StateDir(tmp_path)
    j = st.begin("stock", "eth1", None, 3, {})
    j.change("box", {"k": "good"}, 0, 1)
    j.change("box", {"k": "bad"}, 0, 1)
    j.close()
    rec = st.record("eth1", None)
    assert rec is not None
    box = Broken({"good": 1, "bad": 1})
    with pytest.raises(access.RestoreError) as e:
        journal.restore(rec, {"box": box})
    assert "bad" in str(e.value) and box.values["good"] == 0


def test_records_listing(tmp_path: Path) -> None:
    st = StateDir(tmp_path)
    for dev, ns in (("b", None), ("a", None), ("v", "blue")):
        st.begin("stock", dev, ns, 1, {}).close()
    assert [(r.dev, r.netns) for r in st.records()] == [("a", None), ("b", None), ("v", "blue")]


def test_lock_is_exclusive(tmp_path: Path) -> None:
    import fcntl
    import os
    st = StateDir(tmp_path)
    with st.lock():
        fd = os.open(tmp_path / "lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)


def test_pause_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    monkeypatch.setattr(journal.os, "kill", lambda pid, sig: sent.append(sig))
    h = PauseHook({"KBP_TEST_PAUSE_AFTER_STEP": "2"})
    for _ in range(3):
        h("journaled")
        h("applied")
    assert sent == [signal.SIGSTOP]
    sent.clear()
    h = PauseHook({"KBP_TEST_PAUSE_AFTER_STEP": "1", "KBP_TEST_PAUSE_PHASE": "journaled"})
    h("journaled")
    assert sent == [signal.SIGSTOP]
    h("applied")
    assert sent == [signal.SIGSTOP]
    sent.clear()
    PauseHook({})("journaled")
    assert sent == []
