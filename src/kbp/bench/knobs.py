"""Kernel settings a benchmark mode changes (sysctls, a device's sysfs attributes), changed so
that exactly the values found are put back.

A :class:`Knob` is one file under /proc/sys or /sys, as seen from one network namespace (None:
the initial one, where this program runs).  :class:`Changes` writes a set of knobs in order,
remembering each value it found *before* writing it, and ``restore()`` writes those values
back in reverse order, every one even when some fail, then says which failed.  A mode calls
``restore()`` from its teardown, which the runner calls in a ``finally``: an exception or
Ctrl-C half-way through ``apply()`` restores what was already changed.

Knobs of the initial namespace are the whole machine's (busy_read, busy_poll): while a
:class:`Changes` holds one it holds kbp's one lock (:meth:`kbp.system.journal.StateDir.lock`,
the one kbpctl takes), so two benchmarks run at once on one machine take turns instead of one
"restoring" the other's value.  Each value found for them is journaled before it is changed,
in kbpctl's journal format (a process journal, owner ``bench-knobs``): a benchmark killed
with SIGKILL cannot restore them, so the next one that takes the lock replays a dead
process's journal first (``recovered``).

The file access goes through :class:`KnobIO`, so the tests can give a fake kernel.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kbp.system import access, journal

SYSCTL_NET_CORE = "/proc/sys/net/core"
OWNER = "bench-knobs"                  # the benchmark's process journals of global knobs
KINDS = (journal.KIND_FILE, journal.KIND_NAPI)


class KnobError(RuntimeError):
    """A knob that could not be set or put back (the message names it; ``errno``: the
    kernel's answer when a file access failed, else None)."""

    def __init__(self, msg: str, errno: int | None = None) -> None:
        super().__init__(msg)
        self.errno = errno


@dataclass(frozen=True)
class Knob:
    """One kernel setting: ``path`` as seen from ``netns`` (None: the initial namespace);
    with ``napi`` (NAPI id, attribute as :mod:`kbp.netdev` names it) a NAPI's napi-set
    attribute instead, ``path`` then only its name in messages."""

    path: str
    netns: str | None = None
    napi: tuple[int, str] | None = None

    def __str__(self) -> str:
        where = f" (netns {self.netns})" if self.netns else ""
        return f"{self.path}{where}"


class KnobIO(Protocol):
    def exists(self, k: Knob) -> bool: ...

    def read(self, k: Knob) -> str: ...

    def write(self, k: Knob, value: str) -> None: ...


class KernelIO:
    """The real kernel, through :mod:`kbp.system.access` (files of another namespace are
    accessed inside it: /proc/sys/net and /sys/class/net show the namespace of the process
    that opens them); a failure is a KnobError whose ``errno`` is the kernel's."""

    def exists(self, k: Knob) -> bool:
        try:
            return access.exists(k.path, k.netns)
        except OSError:
            return False

    def read(self, k: Knob) -> str:
        try:
            return access.read(k.path, k.netns)
        except OSError as e:
            raise KnobError(f"cannot read {k}: {e}", e.errno) from e

    def write(self, k: Knob, value: str) -> None:
        try:
            access.write(k.path, f"{value}\n", k.netns)
        except OSError as e:
            raise KnobError(f"cannot write {value} to {k}: {e}", e.errno) from e


def net_core_sysctl(name: str, netns: str | None, io: KnobIO) -> Knob:
    """``net.core.<name>`` where it takes effect for a socket in ``netns``: inside the
    namespace when the kernel has it per namespace (the file exists there), else the global
    one in the initial namespace (busy_read and busy_poll are global up to at least 6.18:
    net_core_table, registered for init_net only)."""
    path = f"{SYSCTL_NET_CORE}/{name}"
    if netns is not None and io.exists(Knob(path, netns)):
        return Knob(path, netns)
    return Knob(path)


def _entry(k: Knob) -> tuple[str, dict[str, Any]]:
    """A global knob as a journal record's kind and key."""
    if k.napi is not None:
        return journal.KIND_NAPI, {"path": k.path, "napi_id": k.napi[0], "knob": k.napi[1]}
    return journal.KIND_FILE, {"path": k.path}


def _knob(kind: str, key: Mapping[str, Any]) -> Knob:
    napi = (int(key["napi_id"]), str(key["knob"])) if kind == journal.KIND_NAPI else None
    return Knob(str(key["path"]), None, napi)


@dataclass
class _KnobHandler:
    """The journal's handler of both knob kinds, through the benchmark's own KnobIO (so a
    dead benchmark's journal is replayed the way this one writes); remembers what it put
    back."""

    io: KnobIO
    kind: str
    put_back: dict[str, str]

    def get(self, key: Mapping[str, Any]) -> Any:
        k = _knob(self.kind, key)
        return self.io.read(k) if self.io.exists(k) else journal.MISSING

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        k = _knob(self.kind, key)
        try:
            self.io.write(k, str(value))
        except KnobError as e:
            raise OSError(e.errno or errno.EIO, str(e)) from e
        self.put_back[k.path] = str(value)


@dataclass
class Changes:
    """Knobs set by one mode, with the values they had before."""

    io: KnobIO = field(default_factory=KernelIO)
    found: list[tuple[Knob, str]] = field(default_factory=list)
    state: journal.StateDir | None = field(default_factory=journal.StateDir)  # None: no lock
    recovered: dict[str, str] = field(default_factory=dict)   # put back for a dead process
    restores: access.Journal = field(default_factory=access.Journal)
    _locked: contextlib.ExitStack | None = None    # holds the lock while set
    _file: journal.JournalFile | None = None

    def _lock(self) -> None:
        """Hold kbp's one lock (waits while another benchmark or kbpctl holds it), then put
        back what benchmarks that died holding global knobs had found."""
        if self._locked is not None or self.state is None:
            return
        self._locked = contextlib.ExitStack()
        self._locked.enter_context(self.state.lock())
        effector = {kind: _KnobHandler(self.io, kind, self.recovered) for kind in KINDS}
        for rec in self.state.orphans(OWNER):
            try:
                journal.restore(rec, effector)
            except access.RestoreError as e:
                raise KnobError(f"a killed benchmark's settings ({rec.path}) could not be "
                                f"put back: {e}") from e
            journal.remove_record(rec.path)

    def _journal(self, k: Knob, was: str, value: str) -> None:
        """Write ahead: the value found, before the change (SIGKILL after it is covered)."""
        assert self.state is not None
        if self._file is None:
            self._file = self.state.begin_process(OWNER)
        kind, key = _entry(k)
        self._file.change(kind, key, was, value)

    def apply(self, wanted: Iterable[tuple[Knob, str]]) -> None:
        """Set each knob, in order; each one's old value is remembered before it is written,
        and each write is read back (a kernel that refuses or clamps a value is an error)."""
        wanted = list(wanted)
        if any(k.netns is None for k, _ in wanted):
            self._lock()
        for k, value in wanted:
            was = self.io.read(k)
            self.found.append((k, was))
            self.restores.defer(self._put_back, k, was)
            if k.netns is None and self.state is not None:
                self._journal(k, was, value)
            self.io.write(k, value)
            got = self.io.read(k)
            if got != value:
                raise KnobError(f"{k} reads {got!r} after writing {value!r}")

    def restore(self) -> None:
        """Every remembered value back, last change first; raise KnobError naming the ones
        that could not be put back (after trying them all)."""
        failed: list[str] = []
        try:
            try:
                self.restores.restore()
            except access.RestoreError as e:
                failed = [str(x) for x in e.errors]
            finally:
                self.found.clear()
        finally:
            file, self._file = self._file, None
            if file is not None and failed:
                file.close()                 # kept for the next benchmark to replay
            elif file is not None:
                file.remove()
            locked, self._locked = self._locked, None
            if locked is not None:
                locked.close()
        if failed:
            raise KnobError("not restored: " + "; ".join(failed))

    def _put_back(self, k: Knob, was: str) -> None:
        self.io.write(k, was)
        if self.io.read(k) != was:
            raise KnobError(f"{k} (wanted {was!r} back)")

    def as_json(self) -> dict[str, str]:
        return {str(k): was for k, was in self.found}


