"""``kbpctl outsource idle``: kbp_so's idle path (docs/design.md 11.11) on, off, or shown.

The knob is kbp_so's module parameter ``idle_poll_us`` (0: off; 1..2000: an idle vCPU polls
every completion ring that long, then announces in ``need_irq`` that it halts). The kernel
checks everything when it is written and refuses with an errno; /proc/kbp_so's ``idle=``
then says why (``unavailable:<why>``). This module turns that pair into one sentence an
operator can act on. No state is recorded: the parameter is the state, and 0 is the
module's default, so ``--off`` puts back what loading the module set.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from kbp.errors import InvalidInput, NotRoot, OperationFailed, Unavailable
from kbp.outsource import _spec, procfile
from kbp.system import access

PARAMS = Path("/sys/module/kbp_so/parameters")
MAX_US = _spec.IDLE_POLL_US_MAX   # the module's range (kbp_so_proc.yaml)

#: /proc/kbp_so's ``idle=unavailable:<why>``, said for an operator
WHY = {
    "idle=-boot-option": "the kernel was booted with idle= (poll, halt or nomwait): its idle "
                         "loop never asks cpuidle; boot without it",
    "cpuidle.off": "the kernel was booted with cpuidle.off=1 (or has no cpuidle); boot "
                   "without it",
    "host-without-need_irq": "this kbp-sod does not honour need_irq (KBP_SO_FEAT_NEED_IRQ): "
                             "update the host daemon",
    "cpuidle-busy": "cpuidle refused a second driver",
}


def explain(err: int, idle_state: str | None) -> str:
    """Why writing idle_poll_us failed with ``err``, from /proc/kbp_so's ``idle=``."""
    why = (idle_state or "").removeprefix("unavailable:")
    if idle_state and idle_state.startswith("unavailable:"):
        if why in WHY:
            return WHY[why]
        # any other reason is the name of the cpuidle driver that holds the slot
        return (f"the cpuidle driver {why!r} holds the slot (cpuidle has one driver); "
                f"kbp_so does not take it away: boot without it, or use poll_us instead")
    if err == errno.ENODEV:
        return "no kbp-sod device is attached"
    return os.strerror(err)


def current(params: Path = PARAMS, proc: Path | None = None) -> dict[str, object]:
    """The idle path now: ``idle`` (on/off/unavailable:...), ``idle_poll_us``."""
    if not (params / "idle_poll_us").exists():
        raise Unavailable("kbp_so is not loaded, or too old for the idle path "
                          f"(no {params / 'idle_poll_us'})")
    us = int((params / "idle_poll_us").read_text())
    mod = procfile.read(proc)
    state = mod.text.get("idle", "?") if mod else "?"
    return {"idle": state, "idle_poll_us": us}


def set_idle(us: int, params: Path = PARAMS, proc: Path | None = None) -> dict[str, object]:
    """Writes idle_poll_us (0: off); raises with the reason when the kernel refuses."""
    if not 0 <= us <= MAX_US:
        raise InvalidInput(f"--poll-us {us}: 1..{MAX_US} microseconds (or --off)")
    current(params, proc)   # loaded, and new enough
    if os.geteuid() != 0:
        raise NotRoot("kbpctl outsource idle changes a module parameter: run it as root")
    try:
        access.write(params / "idle_poll_us", us)
    except OSError as e:
        mod = procfile.read(proc)
        raise OperationFailed(f"kbp_so refused idle_poll_us={us} "
                              f"({errno.errorcode.get(e.errno or 0, e.errno)}): "
                              f"{explain(e.errno or 0, mod.text.get('idle') if mod else None)}"
                              ) from None
    return current(params, proc)
