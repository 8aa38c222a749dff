"""Fixtures shared by the benchmark's tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def enabled_requests(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """kbpctl's backends replaced by one that records each EnableRequest (and finds no
    polling threads): what a bench mode would ask kbpctl for, with nothing changed."""
    import kbp.backends as b
    from kbp.backends import probe
    reqs: list[Any] = []

    class _Be:
        def enable(self, req: Any) -> None:
            reqs.append(req)

        def disable(self, devs: list[str], netns: str | None) -> None:
            pass

    monkeypatch.setattr(b, "get", lambda name: _Be())
    monkeypatch.setattr(probe, "poller_threads", lambda *a, **k: {})
    return reqs
