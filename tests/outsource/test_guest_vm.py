"""kbp_so.ko in a real guest against kbp-sod on the host: QEMU's stock ivshmem-doorbell
connected to the daemon's ivshmem server socket, the module probes the device, checks the
region, attaches, and its private UDP protocol's socket/bind/getsockname/close are requests
served by a host socket (docs/design.md 11).  Boots the rig's Debian 6.12 guest under TCG
(about a minute): opt in with KBP_SO_VM=1 (KBP_SO_VM_FLAVOUR=7.2-rt-amd64 for another
kernel); needs the rig's cached kernel (KBP_VM_CACHE)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import sodclient as sc
from .conftest import REPO, make_sod

FLAVOUR = os.environ.get("KBP_SO_VM_FLAVOUR", "6.12-amd64")
#: the rig's cache directory of each flavour's kernel (to skip rather than download)
KERNEL_GLOB = {"6.12-amd64": "6.12.*+deb12-amd64", "6.12-rt-amd64": "6.12.*+deb12-rt-amd64",
               "6.1-amd64": "6.1.*-amd64", "7.2-amd64": "7.2.*+deb14-amd64",
               "7.2-rt-amd64": "7.2.*+deb14-rt-amd64"}

GUEST_SCRIPT = Path(__file__).with_name("guest_sockets.py")


def test_guest_module_attaches_and_its_sockets_are_served(sod_bin: Path,
                                                          tmp_path: Path) -> None:
    if os.environ.get("KBP_SO_VM") != "1":
        pytest.skip(reason="boots a VM (about a minute under TCG): set KBP_SO_VM=1")
    cache = Path(os.environ.get("KBP_VM_CACHE", REPO / ".cache" / "vm"))
    if FLAVOUR not in KERNEL_GLOB:
        pytest.skip(reason=f"KBP_SO_VM_FLAVOUR={FLAVOUR}: one of {', '.join(KERNEL_GLOB)}")
    if not any(cache.glob(f"kernels/{KERNEL_GLOB[FLAVOUR]}")):
        pytest.skip(reason=f"the rig has no cached {FLAVOUR} kernel in {cache}")
    s = make_sod(sod_bin, tmp_path)
    s.start()
    try:
        script = GUEST_SCRIPT.relative_to(REPO)  # the guest runs in the repository
        cmd = [sys.executable, "-m", "vm", "run", FLAVOUR, "--build",
               "--module-dir", "outsource/guest", "--timeout", "400", "--memory", "1024",
               "--qemu-arg=-chardev", f"--qemu-arg=socket,path={s.sock},id=kso",
               "--qemu-arg=-device",
               f"--qemu-arg=ivshmem-doorbell,chardev=kso,vectors={s.queues}",
               "--", "sh", "-c",
               f'insmod "$KBP_KO" && dmesg | grep kbp_so; python3 {script} && '
               "rmmod kbp_so && echo KBP-SO-UNLOADED"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "KBP_VM_CACHE": str(cache)}, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        assert "attached: ivshmem ID 1, epoch 1" in out, out[-6000:]
        assert "NOP round trip ok" in out
        assert "KBP-SO-GUEST-OK" in out and "KBP-SO-UNLOADED" in out, out[-6000:]
        assert "client connected" in s.log(), s.log()
        end = time.monotonic() + 5  # QEMU has exited; the daemon sees the EOF soon after
        while "client gone" not in s.log():
            assert time.monotonic() < end, s.log()
            time.sleep(0.02)
        # the host's counters: the NOP, SOCKET, BIND, GETNAME, the refused BIND, CLOSE
        with open(s.region, "rb") as f:
            region = f.read()
        hdr_off, stride = sc.H["queue_offset"][0], sc.H["queue_stride"][0]
        qoff = struct.unpack_from("<I", region, hdr_off)[0]
        qstride = struct.unpack_from("<I", region, stride)[0]
        total = {k: 0 for k in ("requests", "completions", "doorbells", "irqs")}
        for q in range(s.queues):
            for k in total:
                off, fmt = sc.Q[k]
                total[k] += struct.unpack_from(fmt, region, qoff + q * qstride + off)[0]
        assert total["requests"] >= 5 and total["completions"] == total["requests"], total
        assert total["doorbells"] >= 1 and total["irqs"] >= 1, total
        assert struct.unpack_from("<I", region, sc.H["guest_state"][0])[0] == \
            sc.GUEST_ABSENT  # the module detached at rmmod
    finally:
        assert s.stop() == 0
