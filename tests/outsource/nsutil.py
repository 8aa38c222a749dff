"""Host-test helpers for a confined kbp-sod: sockets made inside a VM's network namespace,
/proc/PID/status, and a system call made by another process (ptrace injection, x86-64)."""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import socket
import threading
from pathlib import Path

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def socket_in(ns: str, family: int = socket.AF_INET,
              kind: int = socket.SOCK_DGRAM) -> socket.socket:
    """A socket of network namespace ``/run/netns/NS`` (a socket keeps the netns it was
    made in; a short-lived thread enters it, the test's own threads stay where they are)."""
    out: dict[str, object] = {}

    def make() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {ns}")
            out["s"] = socket.socket(family, kind)
        except BaseException as e:  # handed to the caller's thread
            out["e"] = e
        finally:
            os.close(fd)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]  # type: ignore[misc]
    return out["s"]  # type: ignore[return-value]


def status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict of its fields (values stripped)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}


# ---- ptrace ---------------------------------------------------------------------------
PTRACE_PEEKTEXT, PTRACE_GETREGS, PTRACE_SETREGS = 1, 12, 13
PTRACE_SINGLESTEP, PTRACE_DETACH = 9, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
WALL = 0x40000000
SYS = {"getpid": 39, "socket": 41, "openat": 257, "close": 3}
_REGS = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
         "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
         "gs_base", "ds", "es", "fs", "gs")


class _Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in _REGS]


_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


def can_inject() -> str:
    """"" when inject() can run here, else why not."""
    if platform.machine() != "x86_64":
        return "the injector is x86-64 only"
    if os.geteuid() != 0:
        return "needs root (CAP_SYS_PTRACE: the daemon is not dumpable)"
    try:
        if Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() == "3":
            return "ptrace is off (yama ptrace_scope 3)"
    except OSError:
        pass
    return ""


def _pt(req: int, pid: int, addr: int = 0, data: object = None) -> int:
    ctypes.set_errno(0)
    ptr = ctypes.cast(ctypes.pointer(data), ctypes.c_void_p) if data is not None else None
    r = _libc.ptrace(req, pid, ctypes.c_void_p(addr), ptr)
    err = ctypes.get_errno()
    if r == -1 and err:
        raise OSError(err, f"ptrace({req}) of {pid}: {os.strerror(err)}")
    return int(r)


def inject(pid: int, nr: int, *args: int) -> tuple[str, int]:
    """Makes process ``pid``, asleep in a system call, make system call ``nr`` itself (so
    that its own seccomp filter judges it), then puts it back as it was.  Returns
    ``("result", value)`` or ``("killed", signal)``.  The process must be our child or
    we must be root."""
    _pt(PTRACE_SEIZE, pid)
    try:
        _pt(PTRACE_INTERRUPT, pid)
        _, st = os.waitpid(pid, WALL)
        if not os.WIFSTOPPED(st):
            raise RuntimeError(f"{pid} did not stop: {st:#x}")
        saved = _Regs()
        _pt(PTRACE_GETREGS, pid, 0, saved)
        # stopped in a system call: the two bytes before rip are its `syscall` (0f 05)
        word = _libc.ptrace(PTRACE_PEEKTEXT, pid, ctypes.c_void_p(saved.rip - 2), None)
        if word & 0xFFFF != 0x050F:
            raise RuntimeError(f"{pid} is not stopped after a syscall instruction")
        regs = _Regs()
        ctypes.memmove(ctypes.byref(regs), ctypes.byref(saved), ctypes.sizeof(saved))
        regs.rip = saved.rip - 2
        regs.rax = nr
        regs.orig_rax = (1 << 64) - 1  # no syscall restart logic on the way back
        for name, val in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9")[:len(args)], args,
                             strict=True):
            setattr(regs, name, val & ((1 << 64) - 1))
        _pt(PTRACE_SETREGS, pid, 0, regs)
        _pt(PTRACE_SINGLESTEP, pid)
        _, st = os.waitpid(pid, WALL)
        if os.WIFSIGNALED(st):
            return "killed", os.WTERMSIG(st)
        if os.WIFEXITED(st):
            return "killed", 0
        after = _Regs()
        _pt(PTRACE_GETREGS, pid, 0, after)
        res = after.rax - (1 << 64) if after.rax >= 1 << 63 else after.rax
        _pt(PTRACE_SETREGS, pid, 0, saved)
        _pt(PTRACE_DETACH, pid)
        return "result", int(res)
    except BaseException:
        try:
            os.kill(pid, signal.SIGCONT)
            _libc.ptrace(PTRACE_DETACH, pid, None, None)
        except OSError:
            pass
        raise
