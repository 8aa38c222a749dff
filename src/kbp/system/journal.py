"""Write-ahead journal of every change kbpctl makes, so ``disable`` restores exactly what was
there -- also after kbpctl was killed half-way.

One journal per enabled device, ``<run dir>/default/<dev>.jsonl`` for the current netns and
``<run dir>/netns/<netns>/<dev>.jsonl`` for a named one; the run dir is /run/kbp (tmpfs:
state does not survive a reboot, and neither do the settings it records). Each line is a JSON
record, written and fsync'ed *before* the change it describes is made:

``{"op": "begin", "backend": ..., "dev": ..., "netns": ..., "ifindex": ..., "request": {...}}``
``{"op": "change", "step": N, "kind": ..., "key": {...}, "old": ..., "new": ...}``
``{"op": "done"}`` -- the enable completed.

A process that changes the machine for its own lifetime (a benchmark: a global sysctl, NIC
ports moved into its namespaces) keeps the same records in
``<run dir>/process/<owner>-<pid>.jsonl``; when it dies without restoring, the next process
of that owner replays the orphan (:meth:`StateDir.orphans`) with :func:`restore`, as
``disable`` replays a device's.  One lock (:meth:`StateDir.lock`) serializes all of them.

Restoring replays the changes newest first, setting each target back to ``old``. That is
idempotent (a change journaled but never made is "restored" to the value it still has), and
when a key was changed twice the oldest ``old`` wins. Targets that no longer exist (a NAPI
thread that stopped, a device that was deleted) are skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from kbp.system import access

DEFAULT_RUN_DIR = Path("/run/kbp")
ENV_RUN_DIR = "KBP_RUN_DIR"
ENV_PAUSE_STEP = "KBP_TEST_PAUSE_AFTER_STEP"
ENV_PAUSE_PHASE = "KBP_TEST_PAUSE_PHASE"  # "applied" (default) or "journaled"


def run_dir() -> Path:
    return Path(os.environ.get(ENV_RUN_DIR, str(DEFAULT_RUN_DIR)))


_held = threading.local()      # the roots whose lock this thread holds, with the depth


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""What a handler's ``get`` returns when its target no longer exists."""


class TargetGone(Exception):
    """A handler's ``set`` found its target gone (nothing to restore)."""


class Handler(Protocol):
    """Reads and writes one kind of setting, identified by a JSON-able key."""

    def get(self, key: Mapping[str, Any]) -> Any: ...

    def set(self, key: Mapping[str, Any], value: Any) -> None: ...


Effector = Mapping[str, Handler]


@dataclass
class Change:
    step: int
    kind: str
    key: dict[str, Any]
    old: Any
    new: Any


@dataclass
class Record:
    """The journal of one device, as read back."""

    path: Path
    backend: str
    dev: str
    netns: str | None
    ifindex: int | None
    request: dict[str, Any]
    changes: list[Change] = field(default_factory=list)
    complete: bool = False
    started: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.changes)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateDir:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else run_dir()

    def journal_path(self, dev: str, netns: str | None) -> Path:
        if "/" in dev or (netns and "/" in netns):
            raise ValueError("device and netns names cannot contain '/'")
        return (self.root / "netns" / netns / f"{dev}.jsonl") if netns else \
            (self.root / "default" / f"{dev}.jsonl")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialize everything in kbp that changes the machine: kbpctl's commands and a
        benchmark's global settings take this one lock (``<run dir>/lock``, an flock: released
        when the process dies).  Taken again by the thread that holds it, it is already held
        (a benchmark holding it enables a backend in-process); another thread or process
        waits, after saying on stderr which process it waits for."""
        held = _held.__dict__.setdefault("roots", {})
        key = os.path.realpath(self.root)
        if key in held:
            held[key] += 1
            try:
                yield
            finally:
                held[key] -= 1
            return
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        path = self.root / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                print(f"kbp: waiting for {path}, held by pid {holder}", file=sys.stderr,
                      flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            held[key] = 1
            try:
                yield
            finally:
                del held[key]
        finally:
            os.close(fd)

    # -- journals of one process's own changes (a benchmark's) ----------------------------
    @staticmethod
    def process_of(path: Path) -> tuple[str, int]:
        """The owner and pid a process journal's name carries (:meth:`process_path`)."""
        owner, _, pid = path.stem.rpartition("-")
        return owner, int(pid)

    def process_path(self, owner: str, pid: int | None = None) -> Path:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", owner):
            raise ValueError(f"bad journal owner {owner!r}")
        return self.root / "process" / f"{owner}-{pid or os.getpid()}.jsonl"

    def begin_process(self, owner: str, pid: int | None = None) -> JournalFile:
        """A journal of this process's own changes (``<run dir>/process/<owner>-<pid>.jsonl``,
        the same records as a device's), replayed by :meth:`orphans`' caller once the
        process is gone; ``pid``: another process's (tests)."""
        pid = pid or os.getpid()
        return self._begin(self.process_path(owner, pid),
                           {"backend": owner, "dev": "", "netns": None, "ifindex": None,
                            "request": {"pid": pid}})

    def orphans(self, owner: str | None, *, own: bool = False) -> list[Record]:
        """The process journals of ``owner`` (None: of every owner) whose process is gone
        (``own``: this process's too), oldest pid first; unreadable ones are left alone."""
        out: list[Record] = []
        for p in sorted((self.root / "process").glob(f"{owner or '*'}-*.jsonl")):
            try:
                _, pid = self.process_of(p)
                if pid == os.getpid() and not own:
                    continue
                if pid != os.getpid() and access.pid_alive(pid):
                    continue
                rec = read_record(p)
            except (ValueError, OSError, KeyError):
                continue
            if rec is not None:
                out.append(rec)
        return out

    def replay_orphans(self, owner: str, effector: Effector, what: str, *,
                       own: bool = False) -> tuple[list[Record], list[str]]:
        """Replay each of :meth:`orphans` with :func:`restore`, oldest first: one put back
        is removed, one that could not all be is kept for the next try.  Returns the records
        put back and one line per journal kept (``what`` names what its process had set:
        "a killed benchmark's settings").  Call it holding :meth:`lock`."""
        done: list[Record] = []
        kept: list[str] = []
        for rec in self.orphans(owner, own=own):
            try:
                restore(rec, effector)
            except access.RestoreError as e:
                kept.append(f"{what} ({rec.path}) could not all be put back: {e} "
                            f"(journal kept)")
                continue
            remove_record(rec.path)
            done.append(rec)
        return done, kept

    def records(self) -> list[Record]:
        paths: list[Path] = []
        if (self.root / "default").is_dir():
            paths += sorted((self.root / "default").glob("*.jsonl"))
        if (self.root / "netns").is_dir():
            paths += sorted((self.root / "netns").glob("*/*.jsonl"))
        out = []
        for p in paths:
            rec = read_record(p)
            if rec is not None:
                out.append(rec)
        return out

    def record(self, dev: str, netns: str | None) -> Record | None:
        p = self.journal_path(dev, netns)
        return read_record(p) if p.exists() else None

    def begin(self, backend: str, dev: str, netns: str | None, ifindex: int | None,
              request: Mapping[str, Any]) -> JournalFile:
        return self._begin(self.journal_path(dev, netns),
                           {"backend": backend, "dev": dev, "netns": netns,
                            "ifindex": ifindex, "request": dict(request)})

    def _begin(self, path: Path, head: Mapping[str, Any]) -> JournalFile:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        j = JournalFile(path, fresh=True)
        j.write({"op": "begin", **head, "time": time.time()})
        _fsync_dir(path.parent)
        return j

    def rebegin(self, record: Record, request: Mapping[str, Any]) -> JournalFile:
        """Continue ``record``'s journal under a new request (an in-place change, e.g. of a
        device's class): the file is rewritten with ``request`` and every change so far,
        without ``done``, and atomically replaces the old one, so a kill at any point leaves
        either the old complete journal or the new incomplete one, and ``disable`` restores
        from either. Further changes append as usual."""
        path = record.path
        tmp = path.with_suffix(".rebegin")
        lines = [{"op": "begin", "backend": record.backend, "dev": record.dev,
                  "netns": record.netns, "ifindex": record.ifindex, "request": dict(request),
                  "time": record.started}]
        lines += [{"op": "change", "step": c.step, "kind": c.kind, "key": c.key,
                   "old": c.old, "new": c.new} for c in record.changes]
        j = JournalFile(tmp, fresh=True)
        try:
            for obj in lines:
                j.write(obj)
        finally:
            j.close()
        tmp.replace(path)
        _fsync_dir(path.parent)
        out = JournalFile(path)
        out.steps = max((c.step for c in record.changes), default=0)
        return out


def read_record(path: Path) -> Record | None:
    """Parse a journal; a torn last line (killed while writing) is ignored."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    rec: Record | None = None
    for i, line in enumerate(lines):
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
        op = d.get("op")
        if op == "begin":
            rec = Record(path=path, backend=d["backend"], dev=d["dev"], netns=d.get("netns"),
                         ifindex=d.get("ifindex"), request=d.get("request", {}),
                         started=d.get("time", 0.0))
        elif rec is None:
            continue
        elif op == "change":
            rec.changes.append(Change(d["step"], d["kind"], d["key"], d["old"], d["new"]))
        elif op == "done":
            rec.complete = True
    return rec


class JournalFile:
    """The append-only, fsync'ed journal file of one device."""

    def __init__(self, path: Path, fresh: bool = False) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0)
        self.fd = os.open(path, flags, 0o644)
        self.steps = 0

    def write(self, obj: Mapping[str, Any]) -> None:
        data = (json.dumps(obj, sort_keys=True) + "\n").encode()
        os.write(self.fd, data)
        os.fsync(self.fd)

    def change(self, kind: str, key: Mapping[str, Any], old: Any, new: Any) -> Change:
        self.steps += 1
        c = Change(self.steps, kind, dict(key), old, new)
        self.write({"op": "change", "step": c.step, "kind": kind, "key": c.key,
                    "old": old, "new": new})
        return c

    def done(self) -> None:
        self.write({"op": "done"})

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        """Close it and delete it: everything it records was put back."""
        self.close()
        remove_record(self.path)


def remove_record(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(OSError):
        _fsync_dir(path.parent)
    # drop empty netns directories
    if path.parent.parent.name == "netns":
        with contextlib.suppress(OSError):
            path.parent.rmdir()


class PauseHook:
    """Test hook: stop this process (SIGSTOP) at step N so a test can SIGKILL it there.

    ``KBP_TEST_PAUSE_AFTER_STEP=N`` counts changes over the whole command (all devices);
    ``KBP_TEST_PAUSE_PHASE=journaled`` stops after the change is journaled but before it is
    made, ``applied`` (default) after it is made.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get(ENV_PAUSE_STEP)
        self.step = int(raw) if raw else None
        self.phase = env.get(ENV_PAUSE_PHASE, "applied")
        self.count = 0

    def __call__(self, phase: str) -> None:
        if phase == "journaled":
            self.count += 1
        if self.step is not None and self.count == self.step and phase == self.phase:
            os.kill(os.getpid(), signal.SIGSTOP)


class Executor:
    """Makes changes through the handlers: read the current value, journal it, then change
    it -- the one way kbp changes the machine.  The journal is a device's or a process's
    file (``journal``), or only memory (None: a benchmark's testbed, whose namespaces die
    with it); every change made is also kept in ``changes``, and :meth:`restore` undoes them
    the way ``disable`` replays a file (:func:`restore`)."""

    def __init__(self, journal: JournalFile | None, effector: Effector,
                 hook: Callable[[str], None] | None = None) -> None:
        self.journal = journal
        self.effector = effector
        self.hook = hook or (lambda phase: None)
        self.changes: list[Change] = []

    def apply(self, kind: str, key: Mapping[str, Any], new: Any) -> Change | None:
        """Change one setting (None: it already had that value, nothing journaled)."""
        handler = self.effector[kind]
        old = handler.get(key)
        if old is MISSING:
            raise TargetGone(f"{describe(kind, key)} is gone")
        if old == new:
            return None
        if self.journal is not None:
            c = self.journal.change(kind, key, old, new)
        else:
            c = Change(len(self.changes) + 1, kind, dict(key), old, new)
        self.changes.append(c)
        self.hook("journaled")
        handler.set(key, new)
        self.hook("applied")
        return c

    def restore(self) -> list[str]:
        """Undo every change made, newest first (all tried: see :func:`undo`); returns
        the notes on targets that are gone."""
        changes, self.changes = self.changes, []
        return undo(changes, self.effector)


KIND_NAPI = "napi"            # a NAPI's napi-set attribute (settings.NapiHandler)
KIND_SYSFS = "sysfs"          # /sys/class/net/DEV/ATTR in a namespace (settings.SysfsHandler)
KIND_GRO = "gro"              # a device's GRO, on or off (settings.GroHandler)
KIND_FILE = "file"            # a kernel file by path in a namespace (settings.FileHandler)
KIND_SCHED = "sched"          # a task's policy, priority and nice (settings.SchedHandler)
KIND_AFFINITY = "affinity"    # a task's CPU affinity (settings.AffinityHandler)
KIND_IRQ = "irq"              # an IRQ's smp_affinity_list (settings.IrqHandler)
KIND_KMOD_ATTACH = "kmod_attach"  # a device's attachment to kbp.ko (backends/kmod.py)
KIND_PERIODICD = "periodicd"  # a device's periodic service (periodicd.py)
KIND_NIC_PORT = "nic_port"    # a NIC port moved into the bench's namespace (bench/nicpair.py)


def describe(kind: str, key: Mapping[str, Any]) -> str:
    """A change's target in words (for notes and errors)."""
    if kind in (KIND_SCHED, KIND_AFFINITY):
        what = "scheduling" if kind == KIND_SCHED else "CPU affinity"
        return f"{what} of {key.get('comm', '?')} (pid {key.get('pid')})"
    where = f" (netns {key['netns']})" if key.get("netns") else ""
    if kind == KIND_NAPI:
        return f"{key.get('knob')} of NAPI {key.get('napi_id')}{where}"
    if kind == KIND_SYSFS:
        return f"{key.get('dev')}/{key.get('attr')}{where}"
    if kind == KIND_GRO:
        return f"GRO of {key.get('dev')}{where}"
    if kind == KIND_IRQ:
        return f"affinity of IRQ {key.get('irq')}"
    if kind == KIND_PERIODICD:
        return f"periodic service of {key.get('dev')}"
    if kind == KIND_NIC_PORT:
        return f"NIC port {key.get('name')} (moved into netns {key.get('netns')})"
    if kind == KIND_FILE:
        return f"{key.get('path')}{where}"
    if kind == KIND_KMOD_ATTACH:
        return f"attachment of {key.get('dev')} to the kbp module"
    return f"{kind} {dict(key)}"


def restore(record: Record, effector: Effector) -> list[str]:
    """Undo a journal read back from disk (:func:`undo` of its changes)."""
    return undo(record.changes, effector)


def undo(changes: list[Change], effector: Effector) -> list[str]:
    """Undo journaled changes, newest first (every change tried:
    :func:`kbp.system.access.run_all`). Returns notes on skipped targets;
    :class:`kbp.system.access.RestoreError` names the changes that could not be put back
    (its ``notes`` too)."""
    notes: list[str] = []
    errors: list[BaseException] = []

    def put_back(c: Change) -> None:
        handler = effector.get(c.kind)
        if handler is None:
            errors.append(LookupError(f"step {c.step}: unknown kind {c.kind} (journal of a "
                                      "newer kbpctl?)"))
            return
        gone = f"{describe(c.kind, c.key)}: gone, nothing to restore"
        try:
            cur = handler.get(c.key)
            if cur is MISSING:
                notes.append(gone)
                return
            if cur != c.old:
                handler.set(c.key, c.old)
        except TargetGone:
            notes.append(gone)
        except (OSError, access.CmdError) as e:
            if access.is_gone(e):         # its device or namespace went away meanwhile
                notes.append(gone)
            else:
                errors.append(RuntimeError(f"restoring {describe(c.kind, c.key)} to "
                                           f"{c.old!r}: {e}"))
        except access.RestoreError as e:      # a handler whose put-back has several steps
            errors.extend(e.errors)
            notes.extend(e.notes)

    try:
        access.run_all(partial(put_back, c) for c in reversed(changes))
    except access.RestoreError as e:     # not an OSError: a bug, raised as it came
        raise e.errors[0] from None
    if errors:
        raise access.RestoreError(errors, notes)
    return notes
