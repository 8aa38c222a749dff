"""A network namespace with its loopback up, for the tests whose VM sockets live in one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from kbp import sysaccess


@contextmanager
def netns(prefix: str) -> Iterator[str]:
    """``PREFIX-PID``, made with lo up, deleted on the way out whatever happened."""
    ns = f"{prefix}-{os.getpid()}"
    sysaccess.cmd(["ip", "netns", "add", ns])
    try:
        sysaccess.cmd(["ip", "link", "set", "lo", "up"], ns=ns)
        yield ns
    finally:
        sysaccess.cmd(["ip", "netns", "del", ns], check=False)
