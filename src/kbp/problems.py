"""``kbpctl status``'s problems: one line each, with what to do, and its kind.

The code that finds a problem makes a :class:`Problem` with its kind, so whoever counts
problems (``kbp_problems{kind}``, :mod:`kbp.exporter`) reads the kind and never the words:
rewording a sentence does not change its metric. ``str(problem)`` is the sentence status
prints, in text and in ``--json`` (``"problems": [sentence, ...]``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

INTERRUPTED: Final = "interrupted"              # an enable was interrupted
DEVICE_GONE: Final = "device_gone"              # the device does not exist
NEEDS_ROOT: Final = "needs_root"                # status could not look without root
MODULE_NOT_LOADED: Final = "module_not_loaded"  # a kmod device, the module not loaded
MODULE_SILENT: Final = "module_silent"          # the module did not say how it serves it
DETACHED: Final = "detached"                    # no longer attached to the module
DEVICE_DOWN: Final = "device_down"              # down, or its NAPIs cannot be hooked
NO_NAPI: Final = "no_napi"                      # the device has no NAPI now
NOT_THREADED: Final = "not_threaded"            # a NAPI is not threaded any more
NO_THREAD: Final = "no_thread"                  # a threaded NAPI has no thread
SCHED_DRIFT: Final = "sched_drift"              # a thread's policy, priority or nice changed
PERIODIC_DRIFT: Final = "periodic_drift"        # a periodic poller's knobs changed
POLLER_STUCK: Final = "poller_stuck"            # a module poller did not give a NAPI back
MISPLACED: Final = "misplaced"                  # a NAPI served on another CPU than mapped
PERIODIC_SERVICE: Final = "periodic_service"    # the stock search service never ran or died
RPS_ON: Final = "rps_on"                        # RPS came back on
PREEMPT: Final = "preempt"                      # the preemption model limits an RT poller
AMBIGUOUS_NAME: Final = "ambiguous_name"        # NAPI threads by name, another netns's too
KILLED_PROCESS: Final = "killed_process"        # a killed process's changes are still set
OTHER: Final = "other"                          # none of the above

#: every kind, in the order kbp_problems{kind} lists them
KINDS: Final = (INTERRUPTED, DEVICE_GONE, NEEDS_ROOT, MODULE_NOT_LOADED, MODULE_SILENT,
                DETACHED, DEVICE_DOWN, NO_NAPI, NOT_THREADED, NO_THREAD, SCHED_DRIFT,
                PERIODIC_DRIFT, POLLER_STUCK, MISPLACED, PERIODIC_SERVICE, RPS_ON, PREEMPT,
                AMBIGUOUS_NAME, KILLED_PROCESS, OTHER)


@dataclass(frozen=True)
class Problem:
    """A problem ``kbpctl status`` reports: its ``kind`` (one of :data:`KINDS`) and the
    sentence it prints (``text``, also ``str()``)."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown problem kind {self.kind!r}")

    def __str__(self) -> str:
        return self.text


def texts(problems: Iterable[Problem]) -> list[str]:
    """The sentences of ``problems``: what ``--json`` writes."""
    return [str(p) for p in problems]
