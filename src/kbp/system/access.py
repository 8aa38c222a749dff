"""One way to touch the system and put it back: commands, sysfs/procfs files, restores.

Modelled on the kernel selftests' ``tools/testing/selftests/drivers/net/lib/py``: a command
runs with :func:`cmd` (in a network namespace with ``ns=``), a file under /sys or /proc is
read and written with :func:`read` and :func:`write`, and every change registers the step
that puts it back with :meth:`Journal.defer` right after it is made; leaving the journal's
``with`` block -- normally, on an exception or on Ctrl-C -- runs the steps, last first.

A failed file access raises :class:`OSError` with the kernel's errno, also in another
namespace: there the access runs in a tiny Python helper under ``ip netns exec`` (which
mounts a sysfs of that namespace; /sys/class/net shows the devices of the namespace sysfs
was mounted in, so a ``setns`` alone would not do), and the helper reports the errno back.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CMD_TIMEOUT = 60.0
HELPER_TIMEOUT = 30.0


# -- commands ---------------------------------------------------------------------------------
class CmdError(RuntimeError):
    """A command that exited non-zero (the message has its argv, status and stderr)."""

    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        argv = [str(a) for a in proc.args]
        super().__init__(f"{shlex.join(argv)} failed ({proc.returncode}): "
                         f"{(proc.stderr or '').strip()}")
        self.proc = proc
        self.returncode = proc.returncode


def ns_argv(argv: Sequence[str], ns: str | None = None) -> list[str]:
    """The argv that runs ``argv`` inside network namespace ``ns`` (None: this one)."""
    return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)


def popen(argv: Sequence[str], ns: str | None = None, *, session: bool = False,
          **kw: Any) -> subprocess.Popen[str]:
    """Start a command (in namespace ``ns``), output piped as text unless ``kw`` says
    otherwise; ``session``: in a session of its own, so that a Ctrl-C on the terminal
    reaches only this program, which then stops it in order.  The caller owns the process
    (:func:`stop`)."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    return subprocess.Popen(ns_argv(argv, ns), start_new_session=session, **kw)


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 5.0,
         ) -> tuple[str, str]:
    """Signal a child (if it still runs), wait for it (SIGKILL after ``timeout``), and
    return what it printed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out or "", err or ""


def cmd(argv: Sequence[str], ns: str | None = None, check: bool = True,
        timeout: float | None = CMD_TIMEOUT, *, session: bool = False,
        ) -> subprocess.CompletedProcess[str]:
    """Run a command (in namespace ``ns``) to completion, text output captured; ``check``:
    a non-zero exit raises :class:`CmdError`.  On a timeout (TimeoutExpired) or any
    exception (Ctrl-C) the child is stopped first (SIGINT, then SIGKILL); ``session`` as
    for :func:`popen`."""
    proc = popen(argv, ns, session=session)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop(proc, signal.SIGINT, timeout=2.0)
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check and done.returncode != 0:
        raise CmdError(done)
    return done


# -- sysfs / procfs ---------------------------------------------------------------------------
_HELPER = r"""
import json, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "read":
        with open(path) as f:
            print(json.dumps({"ok": f.read()}))
    elif op == "write":
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, sys.argv[3].encode())
        finally:
            os.close(fd)
        print(json.dumps({"ok": ""}))
    elif op == "exists":
        print(json.dumps({"ok": os.path.exists(path)}))
    elif op == "list":
        print(json.dumps({"ok": sorted(os.listdir(path))}))
    elif op == "readmany":
        out = {}
        for name in sys.argv[3:]:
            try:
                with open(os.path.join(path, name)) as f:
                    out[name] = f.read()
            except FileNotFoundError:
                out[name] = None
        print(json.dumps({"ok": out}))
    elif op == "rxqueues":
        out = {}
        for q in sorted(os.listdir(path)):
            if not q.startswith("rx-"):
                continue
            out[q] = {}
            for name in sys.argv[3:]:
                try:
                    with open(os.path.join(path, q, name)) as f:
                        out[q][name] = f.read()
                except FileNotFoundError:
                    out[q][name] = None
        print(json.dumps({"ok": out}))
except OSError as e:
    print(json.dumps({"errno": e.errno, "msg": e.strerror}))
"""


def ns_fs(ns: str, op: str, path: str, *args: str) -> Any:
    """Run one file operation (read, write, exists, list, readmany, rxqueues) in namespace
    ``ns``; its failure is an OSError with the errno the helper saw (EIO: it did not run)."""
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-S", "-c", _HELPER,
                           op, path, *args], capture_output=True, text=True,
                          timeout=HELPER_TIMEOUT)
    if proc.returncode != 0:
        raise OSError(errno.EIO, f"ip netns exec {ns}: {proc.stderr.strip()}")
    res = json.loads(proc.stdout)
    if "errno" in res:
        raise OSError(res["errno"], res["msg"], path)
    return res["ok"]


def read(path: str, ns: str | None = None) -> str:
    """The text of a file as seen from namespace ``ns``, stripped (OSError with errno)."""
    if ns is None:
        with open(path) as f:
            return f.read().strip()
    return str(ns_fs(ns, "read", path)).strip()


def write(path: str | os.PathLike[str], value: object, ns: str | None = None) -> None:
    """Write ``str(value)`` to a file as seen from namespace ``ns``, in one write(2), as the
    kernel's store handlers expect (OSError with the errno the kernel answered).  The file
    must exist: a kernel file is never created (a missing attribute is ENOENT, not a new
    file in a fake or mistyped tree)."""
    if ns is not None:
        ns_fs(ns, "write", os.fspath(path), str(value))
        return
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def exists(path: str, ns: str | None = None) -> bool:
    if ns is None:
        return os.path.exists(path)
    return bool(ns_fs(ns, "exists", path))


def listdir(path: str, ns: str | None = None) -> list[str]:
    """The sorted names in a directory as seen from namespace ``ns`` (OSError with errno)."""
    if ns is None:
        return sorted(os.listdir(path))
    return [str(n) for n in ns_fs(ns, "list", path)]


def net_path(dev: str, attr: str = "") -> str:
    """/sys/class/net/DEV[/ATTR]."""
    return f"/sys/class/net/{dev}/{attr}" if attr else f"/sys/class/net/{dev}"


# -- restores ---------------------------------------------------------------------------------
class RestoreError(RuntimeError):
    """Some restore steps failed (all were tried); ``errors`` has each one's exception,
    ``notes`` what was skipped on purpose (a target that is gone).  The one undo-error type
    of the product: the in-process journal (:class:`Journal`) and the replay of kbpctl's
    journal on disk (:func:`kbp.system.journal.restore`) both raise it."""

    def __init__(self, errors: list[BaseException], notes: list[str] | None = None) -> None:
        super().__init__("not restored: " + "; ".join(str(e) for e in errors))
        self.errors = errors
        self.notes = notes or []


#: what `ip` and `ethtool` say of a device or namespace that is not there
_GONE_TEXT = ("Cannot find device", "does not exist", "Cannot open network namespace",
              "No such device")


def is_gone(e: BaseException) -> bool:
    """Did a step fail because its target is gone (a device deleted, a namespace removed),
    rather than because the kernel refused?"""
    if isinstance(e, OSError) and e.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
        return True
    # a command (or the namespace helper, EIO) that could not reach the namespace or device
    return isinstance(e, CmdError | OSError) and any(t in str(e) for t in _GONE_TEXT)


def run_all(steps: Iterable[Callable[[], object]]) -> None:
    """Run every step, even when one fails (also on a Ctrl-C in one); then raise the first
    KeyboardInterrupt or SystemExit as it came, or :class:`RestoreError` naming every
    failure (the first one's exception is its ``__cause__``).  The undo-error policy of
    every restore in kbp."""
    errors: list[BaseException] = []
    for step in steps:
        try:
            step()
        except BaseException as e:          # Ctrl-C in one step: the others still run
            errors.append(e)
    for err in errors:
        if not isinstance(err, Exception):
            raise err                       # KeyboardInterrupt, SystemExit: as they came
    if errors:
        raise RestoreError(errors) from errors[0]


@dataclass
class Deferred:
    """One registered restore step (``cancel`` it once it is no longer needed)."""

    fn: Callable[..., object]
    args: tuple[object, ...]
    kw: dict[str, Any]
    journal: Journal
    done: bool = False

    def exec(self) -> None:
        """Run it now (once) and take it off the journal."""
        self.cancel()
        self.done = True
        self.fn(*self.args, **self.kw)

    def cancel(self) -> None:
        if self in self.journal.steps:
            self.journal.steps.remove(self)


@dataclass
class Journal:
    """Restore steps, run last first by :meth:`restore` (or on leaving ``with``).

    Every step runs even when an earlier one fails (also on a Ctrl-C in one); then
    :class:`RestoreError` names the failures (the first one's exception is its
    ``__cause__``), or the KeyboardInterrupt is raised again."""

    steps: list[Deferred] = field(default_factory=list)

    def defer(self, fn: Callable[..., object], *args: object, **kw: Any) -> Deferred:
        d = Deferred(fn, args, kw, self)
        self.steps.append(d)
        return d

    def __len__(self) -> int:
        return len(self.steps)

    def restore(self, gone_ok: bool = False) -> list[str]:
        """Run the steps, last first (see the class).  ``gone_ok``: a step whose target is
        gone (:func:`is_gone`: a device deleted, a namespace removed, e.g. after a Ctrl-C)
        had nothing to put back; it is returned as a note instead of failing the restore."""
        def steps() -> Iterator[Callable[[], object]]:
            while self.steps:
                yield self.steps.pop().exec
        try:
            run_all(steps())
        except RestoreError as e:
            gone = [x for x in e.errors if gone_ok and is_gone(x)]
            notes = [f"gone, nothing to restore: {x}" for x in gone]
            real = [x for x in e.errors if x not in gone]
            if real:
                raise RestoreError(real, notes) from real[0]
            return notes
        return []

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


# -- state files ------------------------------------------------------------------------------
def save_json(path: Path, data: dict[str, Any]) -> None:
    """Write a state file atomically (a reader sees the old one or the new one whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
