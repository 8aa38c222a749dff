"""Smoke test of the VM rig itself: NICs, the module, netns and the hub between the NICs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("KBP_IN_VM") != "1",
                                reason="in-guest test: run it with `python3 -m vm test`")


def sh(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr.strip()}"
    return proc.stdout


def _netns_of(nic: str) -> str | None:
    """The named netns ``nic`` is in (None: this one)."""
    if Path(f"/sys/class/net/{nic}").exists():
        return None
    for line in sh("ip", "netns", "list").splitlines():
        ns = line.split()[0]
        if subprocess.run(["ip", "-n", ns, "link", "show", nic],
                          capture_output=True).returncode == 0:
            return ns
    raise AssertionError(f"{nic} is in no netns")


def _is_up(nic: str, ns: str | None) -> bool:
    """Administratively up (the UP flag, whatever the operational state)."""
    flags = sh("ip", *(["-n", ns] if ns else []), "-br", "link", "show", nic).split()[-1]
    return "UP" in flags.strip("<>").split(",")


def test_environment() -> None:
    assert os.environ["KBP_IN_VM"] == "1"
    assert os.uname().release == os.environ["KBP_KVER"]
    assert Path(f"/lib/modules/{os.environ['KBP_KVER']}/modules.dep").exists()


@pytest.mark.smoke
@pytest.mark.parametrize("var", ["KBP_NIC0", "KBP_NIC1"])
def test_nic_is_virtio_net(var: str) -> None:
    nic = os.environ[var]
    ns = _netns_of(nic)  # the suite's topology may have moved it into a netns
    info = sh(*(["ip", "netns", "exec", ns] if ns else []), "ethtool", "-i", nic)
    assert "driver: virtio_net" in info, info


@pytest.mark.smoke
def test_insmod_built_module() -> None:
    """KBP_KO loads (and unloads again, unless another test had it loaded already)."""
    ko = Path(os.environ["KBP_KO"])
    assert ko.is_file(), f"KBP_KO={ko} is not a file"
    name = sh("modinfo", "-F", "name", str(ko)).strip() or ko.stem
    if Path(f"/sys/module/{name}").is_dir():
        return  # loaded by the suite's fixtures: loading works
    sh("insmod", str(ko))
    try:
        assert Path(f"/sys/module/{name}").is_dir()
    finally:
        sh("rmmod", name)
    assert not Path(f"/sys/module/{name}").exists()


def test_modprobe_from_flavour_modules() -> None:
    sh("modprobe", "veth")
    assert Path("/sys/module/veth").is_dir()


@pytest.fixture
def peer_netns() -> Iterator[str]:
    """KBP_NIC1 in a netns (a fresh one unless the suite put it in one already); both NICs
    up, with 198.18.0.1/24 (NIC0) and 198.18.0.2/24 (NIC1) added.  Everything this
    changed is undone afterwards, so the suite's own topology survives."""
    nic0, nic1 = os.environ["KBP_NIC0"], os.environ["KBP_NIC1"]
    ns = _netns_of(nic1)
    own = ns is None
    if ns is None:
        ns = f"kbp-rig-{uuid.uuid4().hex[:6]}"
        sh("ip", "netns", "add", ns)
    was_up = _is_up(nic0, None), (not own and _is_up(nic1, ns))
    try:
        if own:
            sh("ip", "link", "set", nic1, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", "198.18.0.2/24", "dev", nic1)
        sh("ip", "-n", ns, "link", "set", nic1, "up")
        sh("ip", "addr", "add", "198.18.0.1/24", "dev", nic0)
        sh("ip", "link", "set", nic0, "up")
        yield ns
    finally:
        subprocess.run(["ip", "addr", "del", "198.18.0.1/24", "dev", nic0], check=False)
        subprocess.run(["ip", "-n", ns, "addr", "del", "198.18.0.2/24", "dev", nic1],
                       check=False)
        if not was_up[0]:
            subprocess.run(["ip", "link", "set", nic0, "down"], check=False)
        if own:
            # Deleting the netns returns the physical NIC to the initial namespace.
            subprocess.run(["ip", "netns", "del", ns], check=False)
        elif not was_up[1]:
            subprocess.run(["ip", "-n", ns, "link", "set", nic1, "down"], check=False)


def test_ping_across_hub(peer_netns: str) -> None:
    out = sh("ping", "-c", "3", "-i", "0.2", "-W", "5", "198.18.0.2")
    assert " 0% packet loss" in out, out
    out = sh("ip", "netns", "exec", peer_netns, "ping", "-c", "1", "-W", "5", "198.18.0.1")
    assert " 0% packet loss" in out, out


_TOGGLER = r"""
import os, socket, sys, time
port, secs = int(sys.argv[1]), float(sys.argv[2])
os.sched_setaffinity(0, {0})
end, n = time.monotonic() + secs, 0
while time.monotonic() < end:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 29, 1)      # SO_TIMESTAMP, as ping(8) opens one
    time.sleep(0.005)                           # the deferred static_branch_enable runs
    s.close()
    time.sleep(0.005)
    n += 1
print(n)
"""


def test_timestamp_sockets_under_receive_patch_no_text() -> None:
    """The rig holds netstamp_needed_key on (vm/guest_init.sh, vm/README.md "Oops: int3"):
    SO_TIMESTAMP sockets opened and closed on one vCPU while the other receives over
    loopback.  Without the holder each open/close patches __netif_receive_skb_core and
    QEMU 7.2's TCG panicked the guest ("Oops: int3") within about a second, on 6.12-rt,
    7.2 and 7.2-rt alike, with no kbp module loaded."""
    assert Path("/run/kbp-netstamp-held").exists(), "the init's holder did not start"
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.2)
    port = rx.getsockname()[1]
    flood = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-c",
         "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         "while True: s.sendto(b'x' * 64, ('127.0.0.1', int(sys.argv[1])))", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        toggles = int(sh(sys.executable, "-c", _TOGGLER, str(port), "5"))
    finally:
        flood.kill()
        flood.wait()
    got = 0
    with rx:
        while got < 100_000:
            try:
                rx.recv(2048)
            except TimeoutError:
                break
            got += 1
    assert toggles > 100, toggles
    assert got > 0, "no packet was received while the sockets came and went"
