"""The QEMU command line (pure) and a supervised QEMU process.

The guest always runs under TCG: /dev/kvm on the development machines cannot run
standard guests.  Two virtio-net NICs sit on one QEMU hub, so whatever one sends the
other receives; the host's / is shared read-only over virtio-9p (tag ``hostroot``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from vm.util import RigError

QEMU = "qemu-system-x86_64"
#: QEMU warnings that are expected with this machine and say nothing about a failure.
KNOWN_STDERR = ("is not connected to host network",)
#: Locally administered MACs of the two hub NICs; /init finds the NICs by these.
MACS = ("52:54:00:4b:50:00", "52:54:00:4b:50:01")


@dataclass(frozen=True)
class Share:
    tag: str
    path: Path
    readonly: bool


@dataclass(frozen=True)
class Machine:
    kernel: Path
    initrd: Path
    append: str
    memory_mb: int = 2048
    smp: int = 2
    cpu: str = "max"
    shares: tuple[Share, ...] = ()
    macs: tuple[str, str] = MACS
    extra: tuple[str, ...] = field(default_factory=tuple)
    #: tcg (default: /dev/kvm here cannot run guests) or kvm (a KVM host: real timings)
    accel: str = "tcg"

    def argv(self, qemu: str = QEMU) -> list[str]:
        argv = [
            qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-accel", "tcg,thread=multi" if self.accel == "tcg" else self.accel,
            "-cpu", self.cpu,
            "-smp", str(self.smp), "-m", str(self.memory_mb),
            "-kernel", str(self.kernel), "-initrd", str(self.initrd), "-append", self.append,
            # The console: ttyS0 <-> QEMU's stdout (a pipe read by the rig).
            "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
        ]
        for i, mac in enumerate(self.macs):
            argv += ["-netdev", f"hubport,id=n{i},hubid=0",
                     "-device", f"virtio-net-pci,netdev=n{i},mac={mac}"]
        for i, share in enumerate(self.shares):
            ro = ",readonly=on" if share.readonly else ""
            argv += ["-fsdev", f"local,id=fs{i},path={share.path},security_model=none,"
                               f"multidevs=remap{ro}",
                     "-device", f"virtio-9p-pci,fsdev=fs{i},mount_tag={share.tag}"]
        return argv + list(self.extra)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the rig dies, so no QEMU outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Terminated(Exception):
    pass


@contextlib.contextmanager
def _signals_as_exception() -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into an exception, so QEMU is always cleaned up (also
    when SIGINT was inherited as ignored, as in a shell's background job)."""
    def handler(signum: int, _frame: object) -> None:
        raise _Terminated(signal.Signals(signum).name)

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@dataclass
class Outcome:
    """How the QEMU process ended."""

    qemu_rc: int | None
    timed_out: bool = False
    interrupted: str | None = None   # the signal's name, e.g. "SIGINT"
    stderr: str = ""


def supervise(argv: list[str], *, on_line: Callable[[str], bool], sink: BinaryIO | None,
              log: BinaryIO | None, timeout: float, grace: float = 30.0) -> Outcome:
    """Run QEMU, copy its console to ``sink``/``log`` and hand each line to ``on_line``.

    ``on_line`` returns True once the guest reported its result; from then on QEMU gets
    ``grace`` seconds to power off before it is killed.  QEMU is always gone on return
    (timeout, Ctrl-C, SIGTERM or an exception included).
    """
    import time

    with tempfile.TemporaryFile() as err, _signals_as_exception():
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=err, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        except FileNotFoundError:
            raise RigError(f"{argv[0]} not found; run `python3 -m vm setup`") from None
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        outcome = Outcome(None)
        partial = b""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    outcome.timed_out = True
                    break
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunk = chunk.replace(b"\r", b"")
                if sink is not None:
                    sink.write(chunk)
                    sink.flush()
                if log is not None:
                    log.write(chunk)
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for raw in lines:
                    if on_line(raw.decode("utf-8", "replace")):
                        deadline = min(deadline, time.monotonic() + grace)
            if partial:
                on_line(partial.decode("utf-8", "replace"))
        except _Terminated as exc:
            outcome.interrupted = str(exc)
        finally:
            if proc.poll() is None:
                # At EOF QEMU is on its way out (power-off, or -no-reboot after a panic):
                # give it a moment; on timeout or a signal, kill it at once.
                ending = not (outcome.timed_out or outcome.interrupted)
                try:
                    proc.wait(timeout=10 if ending else 0)
                except subprocess.TimeoutExpired:
                    proc.kill()
            proc.wait()
            proc.stdout.close()
            if log is not None:
                log.flush()
        outcome.qemu_rc = proc.returncode
        err.seek(0)
        outcome.stderr = "\n".join(
            line for line in err.read().decode("utf-8", "replace").splitlines()
            if line.strip() and not any(k in line for k in KNOWN_STDERR))
    return outcome
