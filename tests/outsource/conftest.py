"""Fixtures for kbp-sod's host tests: the build, a daemon per test, a fake guest."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .sodclient import Guest

if TYPE_CHECKING:
    from .sodproc import Daemon

REPO = Path(__file__).resolve().parents[2]
SOD_DIR = REPO / "outsource" / "sod"
RAM_SIZE = 1 << 20


@pytest.fixture
def peer() -> Iterator[socket.socket]:
    """The host-side client: a plain UDP socket on loopback (5 s receive timeout)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(5)
    yield s
    s.close()


def sod_user() -> str:
    """Who kbp-sod serves as when a test starts it as root: the package's user, or nobody."""
    try:
        pwd.getpwnam("kbp-sod")
        return "kbp-sod"
    except KeyError:
        return "nobody"


#: run the host tests against another build (e.g. the code before a fix: a test written for
#: a defect must fail there); KBP_SOD_TEST_LEGACY=1: that build predates the flags below
OTHER_BIN = os.environ.get("KBP_SOD_TEST_BINARY", "")
LEGACY = os.environ.get("KBP_SOD_TEST_LEGACY") == "1"


def base_flags(netns: str = "") -> list[str]:
    """What every test daemon is started with: a user to drop to (when root), and the
    host's netns allowed when the test gives none (its peers are on the host's lo)."""
    if LEGACY:
        return []
    flags = ["--user", sod_user()] if os.geteuid() == 0 else []
    return flags + ([] if netns else ["--allow-host-netns"])


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
    return Path(OTHER_BIN) if OTHER_BIN else _make("kbp-sod")


@pytest.fixture(scope="session")
def sod_asan_bin() -> Path:
    if OTHER_BIN:
        return Path(OTHER_BIN)
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
                [str(self.binary), "--vm", self.spec(), *base_flags(self.netns), *self.extra],
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


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test starts by hand (sodproc.Daemon): stopped at its end, whatever happened."""
    ds: list[Daemon] = []
    yield ds
    for d in ds:
        d.stop()
