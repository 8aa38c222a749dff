"""Kernel settings a benchmark mode changes (sysctls, a device's sysfs attributes), changed so
that exactly the values found are put back.

A :class:`Knob` is one file under /proc/sys or /sys, as seen from one network namespace (None:
the initial one, where this program runs).  :class:`Changes` writes a set of knobs in order,
remembering each value it found *before* writing it, and ``restore()`` writes those values
back in reverse order, every one even when some fail, then says which failed.  A mode calls
``restore()`` from its teardown, which the runner calls in a ``finally``: an exception or
Ctrl-C half-way through ``apply()`` restores what was already changed.

Knobs of the initial namespace are the whole machine's (busy_read, busy_poll): while a
:class:`Changes` holds one it holds an exclusive lock (``GLOBAL_LOCK``), so two benchmarks
run at once on one machine take turns instead of one "restoring" the other's value.  The
values found for them are journaled (``JOURNAL_DIR/<pid>.json``) while they are changed: a
benchmark killed with SIGKILL cannot restore them, so the next one that takes the lock puts
back what a dead process's journal says first (``recovered``).

The file access goes through :class:`KnobIO`, so the tests can give a fake kernel.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kbp.system import access

SYSCTL_NET_CORE = "/proc/sys/net/core"
GLOBAL_LOCK = Path("/run/lock/kbp-bench-global-knobs.lock")
JOURNAL_DIR = Path("/run/kbp/bench-knobs")


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


@dataclass
class Changes:
    """Knobs set by one mode, with the values they had before."""

    io: KnobIO = field(default_factory=KernelIO)
    found: list[tuple[Knob, str]] = field(default_factory=list)
    lock_path: Path | None = field(default_factory=lambda: GLOBAL_LOCK)  # None: no lock
    journal_dir: Path = field(default_factory=lambda: JOURNAL_DIR)
    recovered: dict[str, str] = field(default_factory=dict)   # put back for a dead process
    restores: access.Journal = field(default_factory=access.Journal)
    _lock_fd: int | None = None

    def _lock(self) -> None:
        """Hold the machine-wide lock (waits while another benchmark holds it)."""
        if self._lock_fd is not None or self.lock_path is None:
            return
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd
        self._recover()

    def _journal(self) -> Path:
        return self.journal_dir / f"{os.getpid()}.json"

    def _write_journal(self) -> None:
        glob = [{"path": k.path, "was": was, **({"napi_set": list(k.napi)} if k.napi else {})}
                for k, was in self.found if k.netns is None]
        if glob:
            access.save_journal(self._journal(), {"pid": os.getpid(), "found": glob})

    def _recover(self) -> None:
        """Put back what benchmarks that died holding global knobs had found (held lock)."""
        for f, data in access.orphan_journals(self.journal_dir, "[0-9]*.json"):
            for e in reversed(data.get("found") or []):
                napi = e.get("napi_set")
                k = Knob(str(e["path"]), None, (int(napi[0]), str(napi[1])) if napi else None)
                self.io.write(k, str(e["was"]))
                self.recovered[str(k)] = str(e["was"])
            f.unlink(missing_ok=True)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)          # closing drops the flock
            self._lock_fd = None

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
            if k.netns is None:
                self._write_journal()      # before the change: SIGKILL after it is covered
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
            if not failed:
                self._journal().unlink(missing_ok=True)
        finally:
            self._unlock()
        if failed:
            raise KnobError("not restored: " + "; ".join(failed))

    def _put_back(self, k: Knob, was: str) -> None:
        self.io.write(k, was)
        if self.io.read(k) != was:
            raise KnobError(f"{k} (wanted {was!r} back)")

    def as_json(self) -> dict[str, str]:
        return {str(k): was for k, was in self.found}


