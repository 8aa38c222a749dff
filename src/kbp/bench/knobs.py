"""Kernel settings a benchmark mode changes (sysctls, a device's sysfs attributes, a NAPI's
napi-set attributes), changed so that exactly the values found are put back.

A :class:`Knob` is one setting as seen from one network namespace (None: the initial one,
where this program runs): a file under /proc/sys or /sys (journal kind ``file``), or with
``napi`` a NAPI's napi-set attribute (kind ``napi``).  :class:`Changes` sets a list of knobs
in order through kbpctl's change model (:class:`kbp.system.journal.Executor` with kbpctl's
handlers, :mod:`kbp.system.settings`): each value found is remembered before the write,
each write is read back, and ``restore()`` undoes them newest first, every one even when
some fail (:func:`kbp.system.journal.undo`, as ``kbpctl disable``), then names the failed.
A mode calls ``restore()`` from its teardown, which the runner calls in a ``finally``: an
exception or Ctrl-C half-way through ``apply()`` restores what was already changed.

Knobs of the initial namespace are the whole machine's (busy_read, busy_poll): while a
:class:`Changes` holds one it holds kbp's one lock (:meth:`kbp.system.journal.StateDir.lock`,
the one kbpctl takes), so two benchmarks run at once on one machine take turns instead of one
"restoring" the other's value.  From the first such knob on, each change is journaled on disk
before it is made (a process journal, owner ``bench-knobs``): a benchmark killed with SIGKILL
cannot restore, so the next one that takes the lock replays a dead process's journal first
(``recovered``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kbp.netdev import NetdevClients
from kbp.system import access, journal, settings
from kbp.system.journal import KIND_FILE, KIND_NAPI, MISSING, Effector, TargetGone

SYSCTL_NET_CORE = "/proc/sys/net/core"
OWNER = "bench-knobs"                  # the benchmark's process journals of global knobs
KILLED = "a killed benchmark's settings"  # what an orphan of OWNER holds, in failure lines


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

    @property
    def kind(self) -> str:
        return KIND_FILE if self.napi is None else KIND_NAPI

    def key(self) -> dict[str, Any]:
        """The knob as a change key of its kind (the journal's record)."""
        key: dict[str, Any] = {"path": self.path}
        if self.napi is not None:
            key |= {"napi_id": self.napi[0], "knob": self.napi[1]}
        if self.netns is not None:
            key["netns"] = self.netns
        return key

    def value(self, text: str) -> Any:
        """A wanted value as its handler takes it (a napi-set attribute is a number)."""
        return text if self.napi is None else int(text)


def kernel_effector(clients: NetdevClients | None = None) -> Effector:
    """kbpctl's handlers of both knob kinds (the napi-set ones through ``clients``)."""
    return {KIND_FILE: settings.FileHandler(),
            KIND_NAPI: settings.NapiHandler(clients or NetdevClients())}


def close(effector: Effector) -> None:
    """Closes what an effector's handlers hold open (napi-set's netlink sockets)."""
    for h in effector.values():
        if isinstance(h, settings.NapiHandler):
            h.close()


def recover(state: journal.StateDir | None = None) -> tuple[list[str], list[str]]:
    """Put back the global knobs that benchmarks killed while they held them had found
    (their process journals), under kbp's lock: what the next benchmark does before it
    starts, for ``kbpctl disable --all``.  Returns (one line per knob put back, one per
    journal that could not all be: it is kept for the next try).  Without such a journal
    it changes nothing, not even the lock's file."""
    st = state or journal.StateDir()
    if not st.orphans(OWNER):
        return [], []
    eff = kernel_effector()
    try:
        with st.lock():
            recs, failed = st.replay_orphans(OWNER, eff, KILLED)
    finally:
        close(eff)
    return [f"put back {journal.describe(c.kind, c.key)} = {c.old} (a killed benchmark, pid "
            f"{st.process_of(rec.path)[1]}, had set {c.new})"
            for rec in recs for c in rec.changes], failed


def read(effector: Effector, k: Knob) -> str | None:
    """A knob's value as text, None when it is not there (KnobError when unreadable)."""
    try:
        v = effector[k.kind].get(k.key())
    except (OSError, access.CmdError) as e:
        raise KnobError(f"cannot read {k}: {e}", getattr(e, "errno", None)) from e
    return None if v is MISSING else str(v)


def net_core_sysctl(name: str, netns: str | None, effector: Effector) -> Knob:
    """``net.core.<name>`` where it takes effect for a socket in ``netns``: inside the
    namespace when the kernel has it per namespace (the file exists there), else the global
    one in the initial namespace (busy_read and busy_poll are global up to at least 6.18:
    net_core_table, registered for init_net only)."""
    path = f"{SYSCTL_NET_CORE}/{name}"
    if netns is not None:
        with contextlib.suppress(KnobError):
            if read(effector, Knob(path, netns)) is not None:
                return Knob(path, netns)
    return Knob(path)


@dataclass
class Changes:
    """Knobs set by one mode, with the values they had before."""

    effector: Effector = field(default_factory=kernel_effector)
    found: list[tuple[Knob, str]] = field(default_factory=list)
    state: journal.StateDir | None = field(default_factory=journal.StateDir)  # None: no lock
    recovered: dict[str, str] = field(default_factory=dict)   # put back for a dead process
    ex: journal.Executor = field(init=False)
    _locked: contextlib.ExitStack | None = None    # holds the lock while set

    def __post_init__(self) -> None:
        self.ex = journal.Executor(None, self.effector)

    def _lock(self) -> None:
        """Hold kbp's one lock (waits while another benchmark or kbpctl holds it), put back
        what benchmarks that died holding global knobs had found, then journal on disk."""
        if self._locked is not None or self.state is None:
            return
        self._locked = contextlib.ExitStack()
        self._locked.enter_context(self.state.lock())
        recs, failed = self.state.replay_orphans(OWNER, self.effector, KILLED)
        if failed:
            raise KnobError("; ".join(failed))
        self.recovered |= {str(c.key.get("path")): str(c.old) for rec in recs
                           for c in rec.changes}
        # write ahead from here on: the value found, before each change
        self.ex.journal = self.state.begin_process(OWNER)

    def apply(self, wanted: Iterable[tuple[Knob, str]]) -> None:
        """Set each knob, in order; each one's old value is remembered before it is written,
        and each write is read back (a kernel that refuses or clamps a value is an error)."""
        wanted = list(wanted)
        if any(k.netns is None for k, _ in wanted):
            self._lock()
        for k, value in wanted:
            try:
                c = self.ex.apply(k.kind, k.key(), k.value(value))
            except TargetGone as e:
                raise KnobError(f"cannot read {k}: {e}") from e
            except (OSError, access.CmdError) as e:
                raise KnobError(f"cannot write {value} to {k}: {e}",
                                getattr(e, "errno", None)) from e
            self.found.append((k, value if c is None else str(c.old)))
            got = read(self.effector, k)
            if got != value:
                raise KnobError(f"{k} reads {got!r} after writing {value!r}")

    def restore(self) -> None:
        """Every remembered value back, last change first; raise KnobError naming the ones
        that could not be put back (after trying them all)."""
        file, self.ex.journal = self.ex.journal, None
        failed: access.RestoreError | None = None
        try:
            self.ex.restore()               # empties ex.changes: a second restore does nothing
        except access.RestoreError as e:
            failed = e
        finally:
            self.found.clear()
            if file is not None and failed:
                file.close()                 # kept for the next benchmark to replay
            elif file is not None:
                file.remove()
            locked, self._locked = self._locked, None
            if locked is not None:
                locked.close()
        if failed:
            raise KnobError(str(failed))

    def as_json(self) -> dict[str, str]:
        return {str(k): was for k, was in self.found}
