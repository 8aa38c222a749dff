"""Small helpers shared by the rig: errors, messages, subprocesses, locks, timing."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

PROG = "kbp-vm"

#: Exit status for failures of the rig itself (download, build, boot), as opposed to a
#: failure of the command run in the guest.  Same meaning as for ``git bisect run``: "this
#: revision could not be tested".
EXIT_RIG = 125


class RigError(Exception):
    """A failure the user can act on; the message says what to do."""


def note(msg: str) -> None:
    """A progress message from the rig (stderr, so stdout stays the guest console)."""
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def warn(msg: str) -> None:
    print(f"{PROG}: warning: {msg}", file=sys.stderr, flush=True)


def run(argv: Sequence[str | os.PathLike[str]], *, what: str, cwd: Path | None = None,
        env: dict[str, str] | None = None, quiet: bool = True,
        ) -> subprocess.CompletedProcess[str]:
    """Run a host command; raise RigError (with its output) if it fails.

    ``what`` says in words what the command was for, so that the error is readable.
    With ``quiet`` the output is captured and shown only on failure; otherwise it goes to
    stderr (stdout is kept for results such as paths and the guest console).
    """
    args = [os.fspath(a) for a in argv]
    try:
        proc = subprocess.run(args, cwd=cwd, env=env, text=True,
                              stdout=subprocess.PIPE if quiet else sys.stderr,
                              stderr=subprocess.STDOUT if quiet else sys.stderr)
    except FileNotFoundError as exc:
        raise RigError(f"{what}: {args[0]} is not installed (run `python3 -m vm setup`)"
                       ) from exc
    if proc.returncode != 0:
        out = (proc.stdout or "").strip()
        tail = "\n".join(out.splitlines()[-40:])
        raise RigError(f"{what} failed (exit {proc.returncode}): {shlex.join(args)}"
                       + (f"\n{tail}" if tail else ""))
    return proc


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if needed); say so if we must wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            note(f"waiting for another kbp-vm process ({what}, lock {path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Stopwatch:
    """Wall-clock seconds since creation (monotonic)."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def restart(self) -> None:
        self.start = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.start
