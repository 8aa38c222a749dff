"""A kbp-sod started by hand (the tests of its command line, confinement and of several VMs),
and the specs of its VMs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from . import sodclient as sc
from .conftest import RAM_SIZE


class Daemon:
    """One kbp-sod started by hand, its files in a directory of the test."""

    def __init__(self, binary: Path, d: Path, spec: dict[str, str] | list[dict[str, str]],
                 prefix: list[str] | None = None, flags: list[str] | None = None,
                 config: bool = False, preexec: Callable[[], None] | None = None) -> None:
        self.dir = d
        d.mkdir(parents=True, exist_ok=True)
        self.log_path = d / f"sod.{time.monotonic_ns()}.log"
        specs = spec if isinstance(spec, list) else [spec]
        args = []
        for i, one in enumerate(specs):
            if config:
                conf = d / f"vm{i}.conf"
                conf.write_text("# written by the test\n" + "".join(
                    f"{k} = {v}\n" for k, v in one.items()))
                args += ["--config", str(conf)]
            else:
                args += ["--vm", ",".join(f"{k}={v}" for k, v in one.items())]
        self.argv = [*(prefix or []), str(binary), *args, *(flags or [])]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=preexec)
        self.specs = specs
        self.spec = specs[0]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 10) -> None:
        end = time.monotonic() + timeout
        while "kbp-sod: ready" not in self.log():
            assert self.proc.poll() is None, f"kbp-sod exited:\n{self.log()}"
            assert time.monotonic() < end, f"kbp-sod not ready:\n{self.log()}"
            time.sleep(0.01)

    def wait_exit(self, timeout: float = 10) -> int:
        return self.proc.wait(timeout)

    def guest(self, i: int = 0) -> sc.Guest:
        g = sc.Guest(self.specs[i]["socket"], self.specs[i]["ram"])
        g.attach()
        return g

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def vm_spec(d: Path, name: str = "t", ns: str = "", **kw: str) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    ram = d / f"{name}.ram"
    if not ram.exists():
        fd = os.open(ram, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, RAM_SIZE)
        os.close(fd)
    spec = {"name": name, "region": str(d / f"{name}.region"),
            "socket": str(d / f"{name}.sock"), "ram": str(ram), "queues": "2",
            "entries": "16"}
    if ns:
        spec["netns"] = ns
    spec.update(kw)
    return spec
