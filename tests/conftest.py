"""Shared by every host test.

Several tests stop a child (the benchmark, a traffic client) with SIGINT, as an operator's
Ctrl-C would.  A shell that starts a command in the background without job control (`make
test &`, `nohup`, some CI runners) starts it with SIGINT ignored, children inherit that
across exec, and a Python child then gets no KeyboardInterrupt: the tests would time out
for a reason that is the harness's, not kbp's.  Give the test process Python's own handler;
its children then start with SIGINT at its default (handlers, unlike SIG_IGN, do not
survive exec).
"""

from __future__ import annotations

import signal

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
