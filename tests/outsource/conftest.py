"""Fixtures for kbp-sod's host tests: the build, a daemon per test, a fake guest."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .sodclient import Guest

REPO = Path(__file__).resolve().parents[2]
SOD_DIR = REPO / "outsource" / "sod"
RAM_SIZE = 1 << 20


def _make(target: str) -> Path:
    if shutil.which("cc") is None or shutil.which("make") is None:
        pytest.skip(reason="building kbp-sod needs a C compiler (cc) and make")
    proc = subprocess.run(["nice", "-n", "19", "make", "-s", "-C", str(SOD_DIR), target],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"make {target} failed:\n{proc.stdout}{proc.stderr}"
    return SOD_DIR / target


@pytest.fixture(scope="session")
def sod_bin() -> Path:
    _make("abi_dump")
    return _make("kbp-sod")


@pytest.fixture(scope="session")
def sod_asan_bin() -> Path:
    probe = subprocess.run(["cc", "-fsanitize=address,undefined", "-x", "c", "-", "-o",
                            "/dev/null"], input="int main(void){return 0;}",
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(reason="the compiler cannot link with -fsanitize=address,undefined")
    return _make("kbp-sod-asan")


@dataclass
class Sod:
    """One kbp-sod process serving one VM ("t") whose files live in a test directory."""

    binary: Path
    dir: Path
    queues: int = 2
    entries: int = 16
    extra: list[str] = field(default_factory=list)
    netns: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    starts: int = 0

    @property
    def sock(self) -> str:
        return str(self.dir / "t.sock")

    @property
    def ram(self) -> str:
        return str(self.dir / "t.ram")

    @property
    def region(self) -> str:
        return str(self.dir / "t.region")

    def spec(self) -> str:
        return (f"name=t,region={self.region},socket={self.sock},ram={self.ram},"
                f"queues={self.queues},entries={self.entries}"
                + (f",netns={self.netns}" if self.netns else ""))

    def start(self, wait: bool = True, env: dict[str, str] | None = None) -> None:
        self.starts += 1
        self.log_path = self.dir / f"sod.{self.starts}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "--vm", self.spec(), *self.extra],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        if wait:
            end = time.monotonic() + 10
            while "kbp-sod: ready" not in self.log():
                assert self.proc.poll() is None, f"kbp-sod exited:\n{self.log()}"
                assert time.monotonic() < end, f"kbp-sod not ready:\n{self.log()}"
                time.sleep(0.01)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.proc = None
        return rc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def guest(self, attach: bool = True) -> Guest:
        g = Guest(self.sock, self.ram)
        if attach:
            g.attach()
        return g


def make_sod(binary: Path, tmp_path: Path, **kw: object) -> Sod:
    d = tmp_path / "sod"
    d.mkdir(exist_ok=True)
    with open(d / "t.ram", "wb") as f:
        f.truncate(RAM_SIZE)
    return Sod(binary, d, **kw)  # type: ignore[arg-type]


@pytest.fixture
def sod(sod_bin: Path, tmp_path: Path) -> Iterator[Sod]:
    s = make_sod(sod_bin, tmp_path)
    s.start()
    yield s
    if s.proc is not None:
        s.proc.kill()
        s.proc.wait()


@pytest.fixture
def guest(sod: Sod) -> Iterator[Guest]:
    g = sod.guest()
    yield g
    g.close()
