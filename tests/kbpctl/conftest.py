"""Shared fixtures of the kbpctl tests.

Unit tests need no root. Integration tests (marker ``netns``) build namespaces on this
machine's kernel and skip, saying why, when they cannot (not root, no ``ip netns``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kbp.sysinfo import Host

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private journal directory (KBP_RUN_DIR) so tests never touch /run/kbp."""
    d = tmp_path / "run-kbp"
    monkeypatch.setenv("KBP_RUN_DIR", str(d))
    return d


def make_host(root: Path, online: str = "0-3", possible: str = "0-7") -> Host:
    """A fake /proc and /sys under ``root``."""
    cpu = root / "sys/devices/system/cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "online").write_text(online + "\n")
    (cpu / "possible").write_text(possible + "\n")
    (root / "proc").mkdir(parents=True, exist_ok=True)
    return Host(proc=root / "proc", sys=root / "sys")


def netns_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "integration tests build network namespaces and need root"
    if shutil.which("ip") is None or shutil.which("ethtool") is None:
        return "iproute2 and ethtool are needed (apt-get install iproute2 ethtool)"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces"
    return None
