"""kbp_so.ko in a real guest against kbp-sod on the host: QEMU's stock ivshmem-doorbell
connected to the daemon's ivshmem server socket, the guest's RAM a shared file the daemon
maps (memory-backend-file, share=on), the module probes the device, checks the region,
attaches, and its private UDP protocol's operations are requests served by a host socket
in the VM's netns (docs/design.md 11): socket/bind/getsockname/close, and send/receive
with a UDP echo server there, one copy per datagram between the host socket and the
guest process's pinned pages, none through the guest's network stack; a signal or
SO_RCVTIMEO cancels a blocked receive and leaves nothing pinned; /proc/kbp_so, sockopts,
shutdown, IPv6; last, this side SIGKILLs kbp-sod when the guest prints KBP-SO-KILL-SOD
and the guest checks the module's dead-host handling (guest_sockets.py).  Boots the rig's Debian
6.12 guest under TCG (about a minute): opt in with KBP_SO_VM=1
(KBP_SO_VM_FLAVOUR=7.2-rt-amd64 for another kernel); needs root (the netns) and the
rig's cached kernel (KBP_VM_CACHE)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kbp import sysaccess

from . import sodclient as sc
from .conftest import REPO, make_sod
from .netns import netns

FLAVOUR = os.environ.get("KBP_SO_VM_FLAVOUR", "6.12-amd64")
#: "1": after the kill, a new kbp-sod on the same region (the epoch releases the orphans)
RESTART = os.environ.get("KBP_SO_VM_RESTART", "0")
#: the rig's cache directory of each flavour's kernel (to skip rather than download)
KERNEL_GLOB = {"6.12-amd64": "6.12.*+deb12-amd64", "6.12-rt-amd64": "6.12.*+deb12-rt-amd64",
               "6.1-amd64": "6.1.*-amd64", "7.2-amd64": "7.2.*+deb14-amd64",
               "7.2-rt-amd64": "7.2.*+deb14-rt-amd64"}

GUEST_SCRIPT = Path(__file__).with_name("guest_sockets.py")
GUEST_MB = 1024  # pc machine: all of it below the PCI hole, file offset = guest-physical

#: run in the VM's netns: echoes every datagram, counts them in a file
ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
n = 0
while True:
    data, addr = s.recvfrom(65535)
    s.sendto(data, addr)
    n += 1
    open(sys.argv[2], "w").write(str(n))
"""


def _counters(region_path: str, queues: int) -> dict[str, int]:
    """The daemon's per-queue counters, summed."""
    with open(region_path, "rb") as f:
        region = f.read()
    qoff = struct.unpack_from("<I", region, sc.H["queue_offset"][0])[0]
    qstride = struct.unpack_from("<I", region, sc.H["queue_stride"][0])[0]
    total = {k: 0 for k in ("requests", "completions", "doorbells", "irqs", "copies",
                            "bytes_in", "bytes_out", "rejects")}
    for q in range(queues):
        for k in total:
            off, fmt = sc.Q[k]
            total[k] += struct.unpack_from(fmt, region, qoff + q * qstride + off)[0]
    return total


def test_guest_module_attaches_and_its_sockets_are_served(sod_bin: Path,
                                                          tmp_path: Path) -> None:
    if os.environ.get("KBP_SO_VM") != "1":
        pytest.skip(reason="boots a VM (about a minute under TCG): set KBP_SO_VM=1")
    cache = Path(os.environ.get("KBP_VM_CACHE", REPO / ".cache" / "vm"))
    if FLAVOUR not in KERNEL_GLOB:
        pytest.skip(reason=f"KBP_SO_VM_FLAVOUR={FLAVOUR}: one of {', '.join(KERNEL_GLOB)}")
    if not any(cache.glob(f"kernels/{KERNEL_GLOB[FLAVOUR]}")):
        pytest.skip(reason=f"the rig has no cached {FLAVOUR} kernel in {cache}")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip(reason="needs root and iproute2 for the VM's netns")
    with netns("kbpso-vm") as ns:
        port_file, count_file = tmp_path / "echo.port", tmp_path / "echo.count"
        echo = sysaccess.popen([sys.executable, "-c", ECHO, str(port_file), str(count_file)],
                               ns=ns, stdout=None, stderr=None)
        try:
            end = time.monotonic() + 10
            while not port_file.exists() or not port_file.read_text():
                assert echo.poll() is None and time.monotonic() < end, "echo server"
                time.sleep(0.02)
            _run_guest(sod_bin, tmp_path, cache, ns, int(port_file.read_text()), count_file)
        finally:
            echo.kill()
            echo.wait()


def _stream(cmd: list[str], env: dict[str, str], on_line, timeout: float) -> tuple[int, str]:
    """Runs the rig, reading its console as it comes; on_line(line) for each line."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            on_line(line)
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, "".join(lines)


def _run_guest(sod_bin: Path, tmp_path: Path, cache: Path, ns: str, echo_port: int,
               count_file: Path) -> None:
    s = make_sod(sod_bin, tmp_path, netns=ns)
    with open(s.ram, "r+b") as f:  # the guest's RAM (sparse): the daemon maps all of it
        f.truncate(GUEST_MB << 20)
    s.start()
    killed: list[float] = []
    # the daemon's counters after its death: a restarted one lays the queues out anew
    dead_counters: list[dict[str, int]] = []

    def on_line(line: str) -> None:
        # the guest's last scenario: the daemon dies mid-traffic (SIGKILL, no cleanup)
        if "KBP-SO-KILL-SOD" in line and not killed and s.proc is not None:
            s.proc.kill()
            s.proc.wait()
            killed.append(time.monotonic())
        # KBP_SO_VM_RESTART=1: then a new daemon (epoch 2) on the same region
        if "KBP-SO-START-SOD" in line and killed and not dead_counters:
            dead_counters.append(_counters(s.region, s.queues))
            s.start()

    try:
        script = GUEST_SCRIPT.relative_to(REPO)  # the guest runs in the repository
        rmem_max = Path("/proc/sys/net/core/rmem_max").read_text().strip()
        cmd = [sys.executable, "-m", "vm", "run", FLAVOUR, "--build",
               "--module-dir", "outsource/guest", "--timeout", "400",
               "--memory", str(GUEST_MB), "--env", f"KBP_SO_ECHO_PORT={echo_port}",
               "--env", f"KBP_SO_HOST_RMEM_MAX={rmem_max}",
               "--env", f"KBP_SO_RESTART={RESTART}",
               "--qemu-arg=-object",
               f"--qemu-arg=memory-backend-file,id=kbpram,mem-path={s.ram},share=on,"
               f"size={GUEST_MB}M",
               "--qemu-arg=-machine", "--qemu-arg=memory-backend=kbpram",
               "--qemu-arg=-chardev", f"--qemu-arg=socket,path={s.sock},id=kso",
               "--qemu-arg=-device",
               f"--qemu-arg=ivshmem-doorbell,chardev=kso,vectors={s.queues}",
               "--", "sh", "-c",
               f'insmod "$KBP_KO" && dmesg | grep kbp_so; python3 {script} && '
               "rmmod kbp_so && echo KBP-SO-UNLOADED; dmesg | grep kbp_so | tail -6"]
        rc, out = _stream(cmd, {**os.environ, "KBP_VM_CACHE": str(cache)}, on_line, 600)
        print(out)  # the guest's console, with pytest -s
        assert rc == 0, out[-6000:]
        assert "attached: ivshmem ID 1, epoch 1" in out, out[-6000:]
        assert "NOP round trip ok" in out
        assert "KBP-SO-GUEST-OK" in out and "KBP-SO-UNLOADED" in out, out[-6000:]
        assert "client connected" in (tmp_path / "sod" / "sod.1.log").read_text()
        assert killed, "the guest never asked for the daemon's death"
        # the watchdog said so, and rmmod gave the orphaned pages back (and said how many)
        assert "kbp-sod is dead (no heartbeat)" in out, out[-6000:]
        if RESTART == "1":  # the new epoch released them, rmmod had none left
            assert "new epoch: released" in out and "dead kbp-sod" not in out, out[-6000:]
            assert dead_counters, "the guest never asked for a new daemon"
        else:
            assert "orphaned page(s) of a dead kbp-sod" in out, out[-6000:]
        data = json.loads(out.split("KBP-SO-DATA ", 1)[1].splitlines()[0])
        # the daemon died without a reset: its counters since the insmod's reset are there
        total = dead_counters[0] if dead_counters else _counters(s.region, s.queues)
        print("guest:", data, "host:", total)
        # the echo server saw every datagram the guest sent it (through the host's netns)
        assert int(count_file.read_text()) == data["echo_sent"], (count_file.read_text(), data)
        # one copy per datagram each way, bytes as the guest counted them; a send in
        # flight when the daemon died may have been copied without the guest knowing
        in_flight = total["copies"] - (data["sent"] + data["recvd"])
        assert in_flight in (0, 1), (total, data)
        assert total["bytes_out"] == data["bytes_out"] + 100 * in_flight, (total, data)
        assert total["bytes_in"] == data["bytes_in"], (total, data)
        assert total["rejects"] == 0, total
        # the guest's stack carried none of it (also asserted in the guest)
        assert all(v == 0 for v in data["rx_packets_delta"].values()), data
        assert data["net_rx_delta"] < 4, data
        # the receive parked at the kill (and maybe a send) never completed
        assert total["requests"] >= 5, total
        assert 0 <= total["requests"] - total["completions"] <= 3, total
        region = Path(s.region).read_bytes()
        assert struct.unpack_from("<I", region, sc.H["guest_state"][0])[0] == \
            sc.GUEST_ABSENT  # the module detached at rmmod
    finally:
        s.stop()
