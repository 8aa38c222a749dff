"""A Ctrl-C that reaches the benchmark while Python runs an at-fork callback is not lost.

pyroute2 forks to enter namespaces and logging registers an at-fork callback; a
KeyboardInterrupt raised there is swallowed by Python ("Exception ignored in ..."), and the
benchmark used to run to its end (exit 0, test_ctrl_c_cleans_up failed now and then).  The
run context's handler (kbp.bench.context.Signals) also sets a flag that its next checkpoint
turns into KeyboardInterrupt.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, signal, sys
from kbp.bench.context import Signals

signals = Signals(main_pid=os.getpid())
signal.signal(signal.SIGINT, signals.handler)

def after_in_parent():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):       # the handler runs here, and Python drops its exception
        pass

os.register_at_fork(after_in_parent=after_in_parent)
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print("fork returned", flush=True)
try:
    signals.checkpoint()
except KeyboardInterrupt:
    print("raised at the checkpoint")
    sys.exit(0)
sys.exit(3)
"""


def test_interrupt_swallowed_in_an_at_fork_callback_is_raised_again() -> None:
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=60)
    assert "Exception ignored" in p.stderr and "KeyboardInterrupt" in p.stderr, p.stderr
    assert p.stdout.splitlines() == ["fork returned", "raised at the checkpoint"], p.stdout
    assert p.returncode == 0, p.stderr


HOLD_SCRIPT = r"""
import os, signal, sys
from kbp.bench.context import Signals

signals = Signals(main_pid=os.getpid())
signal.signal(signal.SIGINT, signals.handler)
try:
    with signals.held():                    # a mode putting back what it changed
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100000):
            pass
        print("teardown finished", flush=True)
except KeyboardInterrupt:
    print("raised after it", flush=True)
    sys.exit(0)
sys.exit(3)
"""


def test_interrupt_waits_until_the_mode_is_off() -> None:
    """A Ctrl-C inside a mode's teardown (kbpctl disable) used to stop it half way and leave
    its journal behind (shared-cpu's Ctrl-C test, now and then): it now waits for the
    teardown, then unwinds."""
    p = subprocess.run([sys.executable, "-c", HOLD_SCRIPT], capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.splitlines() == ["teardown finished", "raised after it"], p.stderr
    assert p.returncode == 0, p.stderr
