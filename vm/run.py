"""``run``: boot a flavour under QEMU and run one command in the guest.

The contract with the command (environment variables set in the guest):

=================  ==========================================================
``KBP_IN_VM``      ``1``
``KBP_FLAVOUR``    the flavour, e.g. ``6.12-rt-amd64``
``KBP_KVER``       the guest kernel release (``uname -r``)
``KBP_KO``         absolute path of the built main module (kbp.ko, else the first
                   module built); unset if nothing was built for this kernel
``KBP_KO_DIR``     the directory holding every .ko of that build (unset likewise)
``KBP_TEST_MODULES`` a directory with the .ko of every test module under
                   vm/testdata/ (e.g. kbp_test_klp.ko); unset if not built
``KBP_NIC0``       guest name of the first hub NIC (MAC 52:54:00:4b:50:00)
``KBP_NIC1``       guest name of the second hub NIC (MAC 52:54:00:4b:50:01)
``KBP_PYTHON``     the python the rig picked (``--python``)
``KBP_OUT``        a host directory shared read-write (only with ``--out``)
=================  ==========================================================

plus ``PATH`` (the venv's bin first when ``KBP_PYTHON`` is a venv python), ``HOME=/root``,
``LANG=C.UTF-8``, ``TERM=dumb``, ``PYTHONUNBUFFERED=1`` and any ``--env NAME=VALUE``.
The command runs as root, in the host's current directory, with stdin from /dev/null
and stdout/stderr on the console.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import shlex
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from vm import console, fetch, initramfs, mqnic, outsource, paths, qemu
from vm.util import EXIT_RIG, RigError, Stopwatch, file_lock, note, warn

#: Exit statuses of ``run`` beyond the command's own.
EXIT_SPLAT = 121      # the command succeeded but the kernel logged a splat
EXIT_TIMEOUT = 124    # like timeout(1)

DEFAULT_TIMEOUT = 20 * 60
TAIL_LINES = 40
DEFAULT_MSIZE = 512000
DEFAULT_9P_CACHE = "loose"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class RunSpec:
    flavour: str
    argv: list[str]
    cwd: Path = field(default_factory=Path.cwd)
    ko: Path | None = None
    ko_dir: Path | None = None
    test_modules: Path | None = None
    python: str = "python3"
    env: dict[str, str] = field(default_factory=dict)
    out_dir: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    memory_mb: int = 2048
    smp: int = 2
    cpu: str = "max"
    qemu_args: tuple[str, ...] = ()
    append: str = ""
    msize: int = DEFAULT_MSIZE
    cache_9p: str = DEFAULT_9P_CACHE
    splat_check: bool = True
    allow_splat: tuple[str, ...] = ()
    log: Path | None = None
    quiet: bool = False
    accel: str = "tcg"
    #: kbp-sod beside QEMU, the guest's RAM shared with it (vm/outsource.py)
    sod: outsource.SodSpec | None = None
    #: kbp_so.ko for the flavour, exported as KBP_SO_KO
    so_ko: Path | None = None
    #: a multi-queue virtio-net NIC on a tap (vm/mqnic.py)
    mq_nic: bool = False


@dataclass
class RunResult:
    kver: str
    rc: int
    command_rc: int | None
    boot_s: float | None
    total_s: float
    splats: list[console.Splat]
    reason: str
    interrupted: bool = False
    #: The last console lines (shown by report() when the console was not streamed).
    tail: list[str] = field(default_factory=list)
    quiet: bool = False
    #: it failed only on QEMU TCG's stale INT3 (console.ConsoleWatcher.only_stale_int3)
    stale_int3_only: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0


def default_python() -> str:
    """``$KBP_VM_PYTHON``, else ``<repo>/.venv/bin/python`` if it exists, else python3."""
    env = os.environ.get("KBP_VM_PYTHON")
    if env:
        return env
    venv = paths.REPO_ROOT / ".venv" / "bin" / "python"
    if venv.exists():
        return str(venv)
    note(f"no {venv} (make it with `make venv` or python3 -m venv): the guest uses python3")
    return "python3"


def qemu_lock() -> Path:
    """The machine-wide lock that serialises VMs (``$KBP_VM_LOCK`` overrides it)."""
    return Path(os.environ.get("KBP_VM_LOCK", "/tmp/kbp-vm-qemu.lock"))


def kernel_cmdline(extra: str = "") -> str:
    # panic=-1 + QEMU's -no-reboot: a panic ends the VM at once instead of hanging.
    # Oopses do not panic: the run goes on and the splat scan reports them.
    # tsc=reliable: under TCG the clocksource watchdog otherwise marks the TSC unstable
    # in the middle of a run (read-back delays) and switches the clock under the tests.
    return " ".join(filter(None, ["console=ttyS0,115200", "panic=-1", "printk.time=1",
                                  "loglevel=6", "tsc=reliable", extra]))


def guest_env(spec: RunSpec, kver: str) -> dict[str, str]:
    """The environment of the command (KBP_NIC0/1 are added by /init)."""
    path = GUEST_PATH
    py = Path(spec.python)
    if py.is_absolute() and (py.parent.parent / "pyvenv.cfg").exists():
        path = f"{py.parent}:{path}"
    env = {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb",
           "PYTHONUNBUFFERED": "1", "KBP_IN_VM": "1", "KBP_FLAVOUR": spec.flavour,
           "KBP_KVER": kver, "KBP_PYTHON": spec.python}
    if spec.ko is not None:
        env["KBP_KO"] = str(spec.ko)
        env["KBP_KO_DIR"] = str(spec.ko_dir or spec.ko.parent)
    if spec.test_modules is not None:
        env["KBP_TEST_MODULES"] = str(spec.test_modules)
    if spec.out_dir is not None:
        env["KBP_OUT"] = str(spec.out_dir)
    if spec.so_ko is not None:
        env["KBP_SO_KO"] = str(spec.so_ko)
    if spec.sod is not None and spec.sod.tap:
        env["KBP_SO_TAP_MAC"] = outsource.TAP_MAC
    if spec.mq_nic:
        env.update(mqnic.guest_env())
    env.update(spec.env)
    return env


def run_script(spec: RunSpec, kver: str, modules: Path, nonce: str) -> str:
    """/kbp/run.sh: the settings /init reads and ``kbp_exec NIC0 NIC1`` running the command."""
    q = shlex.quote
    settings = {
        "KBPI_NONCE": nonce, "KBPI_KVER": kver, "KBPI_MODULES": str(modules),
        "KBPI_MSIZE": str(spec.msize), "KBPI_9P_CACHE": spec.cache_9p,
        "KBPI_OUT": str(spec.out_dir) if spec.out_dir else "",
        "KBPI_MAC0": qemu.MACS[0], "KBPI_MAC1": qemu.MACS[1],
    }
    env = " ".join(q(f"{k}={v}") for k, v in guest_env(spec, kver).items())
    lines = [f"{k}={q(v)}" for k, v in settings.items()]
    lines += [
        "kbp_exec() {",
        f'\tchroot /newroot /usr/bin/env -i KBP_NIC0="$1" KBP_NIC1="$2" {env} \\',
        f"\t\t/bin/sh -c 'cd -- \"$0\" || exit 125; exec \"$@\"' {q(str(spec.cwd))} \\",
        f"\t\t{shlex.join(spec.argv)}",
        "}",
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _open_log(path: Path | None) -> Iterator[BinaryIO | None]:
    if path is None:
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        yield fh


def run(spec: RunSpec) -> RunResult:
    """Boot ``spec.flavour``, run ``spec.argv`` in the guest and report how it went."""
    if not spec.argv:
        raise RigError("no command to run in the guest")
    if spec.mq_nic and os.geteuid() != 0:
        # the guest test that wants it skips, saying why
        note(f"{spec.flavour}: --mq-nic needs root (a netns and a tap for QEMU): the guest "
             "gets no multi-queue NIC")
        spec.mq_nic = False
    tree = fetch.ensure(spec.flavour)
    base = initramfs.base(tree)
    modules = tree.modules.resolve()
    nonce = secrets.token_hex(8)
    if spec.out_dir is not None:
        spec.out_dir = spec.out_dir.resolve()
        spec.out_dir.mkdir(parents=True, exist_ok=True)
    shares = [qemu.Share("hostroot", Path("/"), readonly=True)]
    if spec.out_dir is not None:
        shares.append(qemu.Share("kbpout", spec.out_dir, readonly=False))
    watcher = console.ConsoleWatcher(
        nonce, splat_check=spec.splat_check,
        allow=tuple(re.compile(rx) for rx in spec.allow_splat))
    clock = Stopwatch()  # restarted when QEMU starts (after waiting for the VM lock)

    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    test_timeouts: list[str] = []   # the guest suite's KBP-TEST-TIMEOUT lines

    def on_line(line: str) -> bool:
        tail.append(line)
        if line.startswith("KBP-TEST-TIMEOUT") and "rebooting the guest" in line:
            test_timeouts.append(line)
        watcher.feed(line, clock())
        return watcher.exit_code is not None

    with tempfile.TemporaryDirectory(prefix="kbp-vm-") as tmp, _open_log(spec.log) as log:
        initrd = initramfs.with_run_config(base, run_script(spec, tree.kver, modules, nonce),
                                           Path(tmp) / "initrd.cpio")
        sod_bin = None
        if spec.sod is not None:
            outsource.check(spec.sod, spec.memory_mb)
            sod_bin = outsource.build_daemon()
        if spec.mq_nic:
            mqnic.check()
            if spec.sod is not None and spec.sod.tap:
                raise RigError("--mq-nic and --sod-tap: QEMU runs in one netns, not two")
        note(f"{spec.flavour}: booting {tree.kver} ({spec.accel.upper()}, {spec.smp} vCPUs, "
             f"{spec.memory_mb} MiB) to run: {shlex.join(spec.argv)}")
        sink = None if spec.quiet else sys.stdout.buffer
        # One VM at a time on this machine (2 cores, shared): wait for other rig users.
        with file_lock(qemu_lock(), "one QEMU at a time"), contextlib.ExitStack() as stack:
            extra, prefix = list(spec.qemu_args), []
            if spec.sod is not None and sod_bin is not None:
                workdir = stack.enter_context(outsource.serve(
                    spec.sod, sod_bin, spec.memory_mb, spec.smp, Path(tmp)))
                extra = outsource.qemu_args(spec.sod, workdir, spec.memory_mb,
                                            spec.smp) + extra
                prefix = outsource.qemu_prefix(spec.sod)
            if spec.mq_nic:
                ns = stack.enter_context(mqnic.netns())
                extra = mqnic.qemu_args() + extra
                prefix = mqnic.qemu_prefix(ns)
            machine = qemu.Machine(tree.vmlinuz, initrd, kernel_cmdline(spec.append),
                                   spec.memory_mb, spec.smp, spec.cpu, tuple(shares),
                                   extra=tuple(extra), accel=spec.accel)
            clock.restart()
            outcome = qemu.supervise(prefix + machine.argv(), on_line=on_line, sink=sink,
                                     log=log, timeout=spec.timeout)
    result = _result(spec, tree.kver, watcher, outcome, clock())
    if result.command_rc is None and test_timeouts and not result.interrupted:
        result.reason = f"a guest test stayed stuck past its timeout: {test_timeouts[-1]}"
    result.tail, result.quiet = list(tail), spec.quiet
    return result


def _result(spec: RunSpec, kver: str, w: console.ConsoleWatcher, o: qemu.Outcome,
            total: float) -> RunResult:
    boot = w.started_at
    rc = w.exit_code
    if o.interrupted:
        code = 128 + signal.Signals[o.interrupted].value
        return RunResult(kver, code, rc, boot, total, w.splats, f"interrupted ({o.interrupted})",
                         interrupted=True)
    if rc is None:
        if o.timed_out:
            reason = f"timed out after {spec.timeout:.0f} s (QEMU killed)"
            code = EXIT_TIMEOUT
        elif w.fatal:
            reason, code = f"guest setup failed: {w.fatal}", EXIT_RIG
        elif any(s.label == "panic" for s in w.splats):
            reason, code = "the guest kernel panicked (see the console)", EXIT_RIG
        else:
            reason = (f"QEMU exited (status {o.qemu_rc}) before the guest reported an exit "
                      "status: kernel panic or boot failure? see the console above")
            code = EXIT_RIG
        if o.stderr:
            reason += f"\nQEMU said: {o.stderr}"
        return RunResult(kver, code, None, boot, total, w.splats, reason,
                         stale_int3_only=w.only_stale_int3())
    if o.timed_out:
        warn("the guest reported its exit status but did not power off; QEMU was killed")
    if rc == EXIT_RIG and w.fatal:
        return RunResult(kver, EXIT_RIG, None, boot, total, w.splats,
                         f"guest setup failed: {w.fatal}")
    if w.splats:
        code = rc if rc != 0 else EXIT_SPLAT
        return RunResult(kver, code, rc, boot, total, w.splats,
                         f"command exited {rc}; kernel splats: "
                         + ", ".join(sorted({s.label for s in w.splats})),
                         stale_int3_only=w.only_stale_int3())
    return RunResult(kver, rc, rc, boot, total, w.splats,
                     "ok" if rc == 0 else f"command exited {rc}")


def report(result: RunResult) -> None:
    """Say on stderr how the run went (splat lines included)."""
    if result.quiet and not result.ok and result.tail:
        note(f"last {len(result.tail)} console lines:")
        for line in result.tail:
            print(f"  | {line}", file=sys.stderr)
    for s in result.splats[:20]:
        warn(f"kernel splat ({s.label}) at {s.host_time:.1f} s: {s.line}")
    if len(result.splats) > 20:
        warn(f"... and {len(result.splats) - 20} more splat lines")
    if result.stale_int3_only:
        note("an int3 trap where memory holds no int3 any more (the oops's Code: line): QEMU "
             "7.2 TCG ran a stale copy of the kernel's text patching, not the code under test "
             "(vm/README.md, \"Oops: int3\")")
    elif any(console.INT3_OOPS_RE.search(s.line) for s in result.splats):
        note("an int3 trap in kernel text: if the RIP is a static branch or tracepoint site "
             "that was being patched, this is QEMU 7.2 TCG racing the kernel's text patching, "
             "not the code under test (vm/README.md, \"Oops: int3\")")
    boot = f"{result.boot_s:.1f} s" if result.boot_s is not None else "-"
    note(f"{result.kver}: {result.reason} (boot {boot}, total {result.total_s:.1f} s, "
         f"exit {result.rc})")
