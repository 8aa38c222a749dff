"""Shared fixtures of the kbpctl tests.

Unit tests need no root. Integration tests (marker ``netns``) build namespaces on this
machine's kernel and skip, saying why, when they cannot (not root, no ``ip netns``).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import kbp
from kbp.sysinfo import Host

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


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


# -- kbpctl as an unprivileged user ---------------------------------------------------------
# The checkout (and its .venv) may live where other users cannot enter (a clone under /root,
# a mktemp -d directory: issue 9), so tests that run kbpctl as nobody install kbp and its
# runtime dependencies into a directory anyone can read, and run it with a Python interpreter
# (and standard library) that anyone can run.
@dataclass(frozen=True)
class UserKbpctl:
    """``argv`` runs kbpctl as uid/gid 65534; pass ``env(...)`` and ``cwd`` with it."""

    python: str
    target: Path

    @property
    def argv(self) -> list[str]:
        return [*AS_NOBODY, self.python, "-m", "kbp.cli"]

    @property
    def cwd(self) -> Path:
        return self.target

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PYTHONPATH": str(self.target), "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1"}


def others_can_reach(path: Path) -> bool:
    """Other users can enter ``path`` (a directory) or execute it (a file), and every
    directory on the way to it (symlinks resolved)."""
    p = path.resolve()
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in [p, *p.parents])


def _runtime_dists(name: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``name`` needs at run time (no extras), transitively."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [r for r in importlib.metadata.requires(name) or [] if "extra ==" not in r]
    while todo:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", todo.pop())
        if not m:
            continue
        key = re.sub(r"[-_.]+", "-", m.group(1)).lower()
        if key in seen:
            continue
        try:
            dist = importlib.metadata.distribution(key)
        except importlib.metadata.PackageNotFoundError:
            continue                    # a marker that excludes it here (python_version, ...)
        seen[key] = dist
        todo += [r for r in dist.requires or [] if "extra ==" not in r]
    return list(seen.values())


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link (instant, same inode) if others can read the file, else (or across file
    systems) a copy they can read; copies keep the mtime, so the .pyc files stay valid."""
    if os.stat(src).st_mode & stat.S_IROTH:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, os.stat(dst).st_mode | stat.S_IROTH)


def _probe(python: str, as_nobody: bool) -> str | None:
    code = "import sys, sysconfig, json; print(sys.version_info[:2], sysconfig.get_path('stdlib'))"
    argv = [*(AS_NOBODY if as_nobody else []), python, "-I", "-c", code]
    p = subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=60)
    return p.stdout.strip() if p.returncode == 0 else None


def nobody_python() -> str | None:
    """A Python interpreter of this minor version that uid 65534 can run with its own
    standard library (a venv's base interpreter under /root is not: that user falls back to
    some other stdlib, or to none)."""
    cands = [os.path.realpath(sys.executable),
             os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
             *(shutil.which(n, path="/usr/local/bin:/usr/bin:/bin") or ""
               for n in (f"python{sys.version_info[0]}.{sys.version_info[1]}", "python3"))]
    want = str(tuple(sys.version_info[:2]))
    for c in dict.fromkeys(c for c in cands if c):
        if not others_can_reach(Path(c)):
            continue
        mine = _probe(c, as_nobody=False)
        if mine and mine.startswith(want) and _probe(c, as_nobody=True) == mine:
            return c
    return None


def world_tmpdir() -> Path:
    """A new directory, mode 0755, somewhere every user can reach."""
    for base in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if Path(base).is_dir() and others_can_reach(Path(base)):
            d = Path(tempfile.mkdtemp(prefix="kbp-world-", dir=base))
            d.chmod(0o755)
            return d
    raise RuntimeError("no temporary directory other users can reach")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that runs kbpctl as another user, so they can be selected (-m
    unprivileged: test_private_checkout runs them from a checkout in a 0700 directory)."""
    for item in items:
        if "user_kbpctl" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.unprivileged)


@pytest.fixture(scope="session")
def user_kbpctl() -> Iterator[UserKbpctl]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip(reason="running kbpctl as another user needs root and setpriv")
    python = nobody_python()
    if python is None:
        pytest.skip(reason=f"no Python {sys.version_info[0]}.{sys.version_info[1]} here that "
                           f"uid {NOBODY} can run with its standard library")
    top = world_tmpdir()
    try:
        target = top / "site"
        shutil.copytree(Path(kbp.__file__).parent, target / "kbp", copy_function=_link_or_copy)
        for dist in _runtime_dists("kbp"):
            root = Path(str(dist.locate_file(""))).resolve()
            for f in dist.files or []:
                src = Path(str(dist.locate_file(f))).resolve()
                if not src.is_relative_to(root) or not src.is_file():
                    continue            # scripts in bin/, files pip listed but removed
                dst = target / src.relative_to(root)
                dst.parent.mkdir(parents=True, exist_ok=True)
                if not dst.exists():
                    _link_or_copy(str(src), str(dst))
        # directories made under a umask of 077 (or copied from such) would lock nobody out
        for d, dirs, _files in os.walk(top):
            for n in dirs:
                os.chmod(os.path.join(d, n), 0o755)
        subprocess.run([python, "-m", "compileall", "-q", str(target / "kbp")], check=True,
                       capture_output=True)
        yield UserKbpctl(python=python, target=target)
    finally:
        shutil.rmtree(top, ignore_errors=True)
