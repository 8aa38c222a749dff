"""kbp.system.access without namespaces: errno of a failed access, commands, the journal."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from kbp.system import access
from kbp.system.access import CmdError, Journal, RestoreError


def test_write_and_read_back(tmp_path: Path) -> None:
    p = str(tmp_path / "f")
    Path(p).write_text("1234\n")
    access.write(p, 42)     # truncates, as sysfs's store sees only what this write gives
    assert access.read(p) == "42"
    assert access.exists(p) and not access.exists(p + ".no")
    assert access.listdir(str(tmp_path)) == ["f"]


def test_a_missing_file_is_not_created(tmp_path: Path) -> None:
    """A kernel attribute that is not there is ENOENT (a mistyped or unsupported knob),
    never a new file: a fake tree in a test cannot grow files the kernel lacks."""
    with pytest.raises(OSError) as e:
        access.write(str(tmp_path / "threaded"), "1")
    assert e.value.errno == errno.ENOENT and not (tmp_path / "threaded").exists()


def test_failed_write_keeps_errno(tmp_path: Path) -> None:
    with pytest.raises(OSError) as e:
        access.write(str(tmp_path / "no" / "f"), "1")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(OSError) as e:
        access.write(str(tmp_path), "1")
    assert e.value.errno == errno.EISDIR


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (writes sysfs)")
def test_failed_sysfs_write_keeps_the_kernels_errno() -> None:
    with pytest.raises(OSError) as e:
        access.write("/sys/class/net/lo/mtu", "not-a-number")
    assert e.value.errno == errno.EINVAL


def test_cmd_and_its_failure() -> None:
    assert access.cmd(["echo", "hi"]).stdout == "hi\n"
    assert access.cmd(["false"], check=False).returncode == 1
    with pytest.raises(CmdError, match="false failed") as e:
        access.cmd(["false"])
    assert isinstance(e.value, RuntimeError) and e.value.returncode == 1
    assert access.ns_argv(["ls"], "x") == ["ip", "netns", "exec", "x", "ls"]
    assert access.ns_argv(["ls"]) == ["ls"]


def test_defer_runs_last_first() -> None:
    done: list[int] = []
    with Journal() as j:
        for i in range(3):
            j.defer(done.append, i)
        assert len(j) == 3
    assert done == [2, 1, 0]


def test_restore_on_exception() -> None:
    done: list[str] = []
    with pytest.raises(KeyError), Journal() as j:
        j.defer(done.append, "a")
        raise KeyError("boom")
    assert done == ["a"]


def test_every_step_runs_and_failures_are_named() -> None:
    done: list[str] = []
    j = Journal()
    j.defer(done.append, "first")

    def bad() -> None:
        raise OSError(errno.EBUSY, "busy")

    j.defer(bad)
    j.defer(done.append, "last")
    with pytest.raises(RestoreError, match="busy") as e:
        j.restore()
    assert done == ["last", "first"]
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.EBUSY
    assert len(j) == 0


def test_exec_and_cancel() -> None:
    done: list[str] = []
    j = Journal()
    a = j.defer(done.append, "a")
    b = j.defer(done.append, "b")
    b.cancel()
    a.exec()
    assert done == ["a"] and len(j) == 0
    j.restore()
    assert done == ["a"]


def test_ctrl_c_in_one_step_lets_the_others_run() -> None:
    done: list[str] = []
    j = Journal()
    j.defer(done.append, "first")

    def interrupted() -> None:
        raise KeyboardInterrupt

    j.defer(interrupted)
    j.defer(done.append, "last")
    with pytest.raises(KeyboardInterrupt):
        j.restore()
    assert done == ["last", "first"]


def test_cmd_stops_its_child_on_a_timeout() -> None:
    import subprocess
    with pytest.raises(subprocess.TimeoutExpired):
        access.cmd(["sleep", "30"], timeout=0.2, session=True)
    p = access.popen(["sleep", "30"])
    assert access.stop(p, timeout=2) == ("", "") and p.returncode is not None


def test_a_restore_skips_gone_targets_only_when_asked() -> None:
    """gone_ok: a step whose device or namespace is gone is a note; a refusal still fails
    the restore, and every step runs either way."""
    ran: list[str] = []

    def gone() -> None:
        ran.append("gone")
        raise OSError(errno.ENODEV, "No such device")

    def netns_gone() -> None:
        ran.append("netns")
        raise OSError(errno.EIO, "ip netns exec kbpb-s: Cannot open network namespace")

    def refused() -> None:
        ran.append("refused")
        raise OSError(errno.EPERM, "Operation not permitted")

    j = Journal()
    j.defer(gone)
    j.defer(netns_gone)
    assert len(j.restore(gone_ok=True)) == 2 and ran == ["netns", "gone"]
    j.defer(gone)
    with pytest.raises(RestoreError):
        j.restore()                                  # not asked: gone is a failure
    ran.clear()
    j.defer(refused)
    j.defer(gone)
    with pytest.raises(RestoreError, match="not permitted") as e:
        j.restore(gone_ok=True)
    assert ran == ["gone", "refused"] and len(e.value.errors) == 1 and len(e.value.notes) == 1
