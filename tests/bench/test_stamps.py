"""The benchmark holds receive timestamps on for its whole run (runner.timestamps_held), so
the kernel's netstamp static key does not flip between runs (see the function's docstring)."""

from __future__ import annotations

import socket

from kbp.bench import runner


def test_the_held_socket_asks_for_timestamps() -> None:
    s = runner.timestamps_held()
    try:
        assert s.getsockopt(socket.SOL_SOCKET, runner.SO_TIMESTAMPNS) == 1
    finally:
        s.close()
