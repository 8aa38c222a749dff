"""A network namespace with its loopback up, for the tests whose VM sockets live in one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from kbp.system import access


@contextmanager
def netns(prefix: str) -> Iterator[str]:
    """``PREFIX-PID``, made with lo up, deleted on the way out whatever happened."""
    ns = f"{prefix}-{os.getpid()}"
    access.cmd(["ip", "netns", "add", ns])
    try:
        access.cmd(["ip", "link", "set", "lo", "up"], ns=ns)
        yield ns
    finally:
        access.cmd(["ip", "netns", "del", ns], check=False)
