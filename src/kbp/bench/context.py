"""The benchmark's run context: what a run holds on to and puts back.

:class:`Signals` is the run's SIGINT/SIGTERM handling (its state here, not in module
globals); :class:`RunContext` (below) is the testbed, the RT application, the modes' lifecycle
and every restore of a run on one exit stack.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Signals:
    """SIGINT and SIGTERM in the benchmark process unwind like Ctrl-C, so everything is
    restored; while a mode puts back what it changed they wait (:meth:`held`)."""

    main_pid: int = 0
    interrupted: bool = False
    hold: int = 0               # > 0: a mode is putting back what it changed (held)

    def handler(self, sig: int, _frm: Any) -> None:
        """SIGINT or SIGTERM in the benchmark process: unwind like Ctrl-C, so everything is
        restored.  Python drops an exception raised while it runs an at-fork callback
        (pyroute2 forks to enter namespaces; logging registers one: "Exception ignored in
        _releaseLock"), and the benchmark then ran to its end: the flag makes the next
        checkpoint raise it again.  A forked helper inherits this handler: it must just die,
        never run the cleanup."""
        if os.getpid() != self.main_pid:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return
        self.interrupted = True
        if self.hold:
            return                  # raised when the mode is off again (held)
        raise KeyboardInterrupt

    def checkpoint(self) -> None:
        """Raise the interrupt again if its first KeyboardInterrupt was swallowed."""
        if self.interrupted:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM wait while a mode puts back what it changed: one arriving
        inside ``kbpctl disable`` stopped it half way, leaving its journal (and the settings
        of a namespace about to be deleted) behind.  The handler only notes the signal
        meanwhile; it unwinds as usual right after.  (Blocking the signals would not do: the
        kernel hands a process-directed signal to another thread, and Python runs the
        handler in this one.)"""
        self.hold += 1
        try:
            yield
        finally:
            self.hold -= 1
            if not self.hold and self.interrupted:
                raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[Signals]:
        """This process's SIGTERM (and SIGINT, unless it is ignored) go to :meth:`handler`
        until the block ends; the old handlers are put back then."""
        self.main_pid = os.getpid()
        self.interrupted = False
        old_term = signal.signal(signal.SIGTERM, self.handler)
        old_int = signal.getsignal(signal.SIGINT)
        if old_int is signal.default_int_handler:       # not when SIGINT is ignored
            signal.signal(signal.SIGINT, self.handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, old_term)
            if old_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, old_int)
