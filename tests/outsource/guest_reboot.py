"""Run in the guest by test_guest_vm.py (not collected): a parked receive across a kexec
reboot (issue 37, item 4).  Phase 1: a thread blocks in recv() on an outsourced socket (its
buffer pinned and lent to kbp-sod), the page's guest-physical address and the port are
printed (KBP-SO-PARKED), the same kernel and a copy of this boot's initramfs are loaded with
``kbp_so_phase=2`` added to the command line, KBP-SO-KEXEC is printed and ``kexec -e``
reboots into it: the kernel runs device_shutdown(), kbp_so's PCI .shutdown.  The host then
sends datagrams carrying a marker to the port and looks for the marker in the guest's RAM at
that address: before, kbp-sod still held the parked receive and wrote the datagram into what
is now the new kernel's memory.  Phase 2 (the new kernel: this same command, which branches
on the command line) waits for the host's verdict, then exits."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

PROTO = 253
SYS_KEXEC_FILE_LOAD = 320        # x86_64
LINUX_REBOOT_CMD_KEXEC = 0x45584543
OUT = os.environ.get("KBP_SO_OUT", "")
PAGE = mmap.PAGESIZE


def gpa_of(buf: mmap.mmap) -> int:
    """The guest-physical address of the page behind ``buf`` (/proc/self/pagemap, root)."""
    va = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(va // PAGE * 8)
        entry = struct.unpack("<Q", f.read(8))[0]
    assert entry >> 63, f"page at {va:#x} not present"
    return (entry & ((1 << 55) - 1)) * PAGE


def phase1() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, PROTO)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    buf = mmap.mmap(-1, PAGE)
    buf[:] = b"\0" * PAGE          # present, and known
    gpa = gpa_of(buf)

    def receiver() -> None:
        with contextlib.suppress(OSError):
            s.recv_into(buf, PAGE)

    threading.Thread(target=receiver, daemon=True).start()
    end = time.monotonic() + 20
    while int(Path("/sys/module/kbp_so/parameters/pinned_pages").read_text()) < 1:
        assert time.monotonic() < end, "the receive never parked"
        time.sleep(0.05)
    # the new kernel: the same one, this boot's initramfs (PID 1's root), phase 2
    kernel = os.environ["KBP_SO_VMLINUZ"]       # the rig's, in its cache (the host's /)
    initrd = "/tmp/kbp-phase2.cpio"
    subprocess.run(f"cd /proc/1/root && find . -xdev | busybox cpio -o -H newc > {initrd}",
                   shell=True, check=True, stderr=subprocess.DEVNULL)
    cmdline = Path("/proc/cmdline").read_text().strip() + " kbp_so_phase=2"
    libc = ctypes.CDLL(None, use_errno=True)
    kfd, ifd = os.open(kernel, os.O_RDONLY), os.open(initrd, os.O_RDONLY)
    arg = cmdline.encode() + b"\0"
    if libc.syscall(SYS_KEXEC_FILE_LOAD, kfd, ifd, len(arg), arg, 0) != 0:
        raise OSError(ctypes.get_errno(), "kexec_file_load")
    print(f"KBP-SO-PARKED gpa={gpa} port={port}", flush=True)
    print("KBP-SO-KEXEC", flush=True)
    os.sync()
    libc.reboot(LINUX_REBOOT_CMD_KEXEC)         # device_shutdown(), then the new kernel
    print("KBP-SO-KEXEC-RETURNED", ctypes.get_errno(), flush=True)
    sys.exit(1)


def phase2() -> None:
    """The new kernel: the host checks the RAM and writes its verdict into the out dir."""
    print("KBP-SO-PHASE2", flush=True)
    verdict = os.path.join(OUT, "reboot.verdict")
    end = time.monotonic() + 120
    while not os.path.exists(verdict):
        assert time.monotonic() < end, "the host never gave its verdict"
        time.sleep(0.2)
    print("KBP-SO-PHASE2-DONE", Path(verdict).read_text().strip(), flush=True)


if __name__ == "__main__":
    phase2() if sys.argv[1:] == ["phase2"] else phase1()
