"""A multi-queue virtio-net NIC for the guest (``--mq-nic``): QEMU's virtio-net with
``mq=on`` on a multi-queue tap, the queue layout of a real multi-queue NIC (an RX and a TX
virtqueue per queue pair, an MSI-X vector each), which the rig's hub NICs cannot have
(QEMU's hub has one queue).

QEMU runs in a network namespace of its own that the rig makes for the run (so the tap,
which QEMU makes, never appears in the host's namespace) and removes afterwards; the
tap's host end gets ``HOST_IP``.  In the guest the NIC has the MAC ``MAC``
(``KBP_MQ_MAC``), ``QUEUES`` queue pairs, and ``KBP_MQ_HOST_IP`` to talk to: a TCP SYN
to a closed port there comes back as a RST on the RX queue of the TX queue it left on
(the tap's flow steering follows the guest's queue), so a sender pinned to a CPU makes
traffic on that CPU's queue.  Needs root (a netns and a tap); refused without.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator

from vm import outsource
from vm.util import RigError

#: the guest's MAC of the NIC (the hub NICs are 52:54:00:4b:50:00/01, the sod tap's :10)
MAC = "52:54:00:4b:50:20"
TAP = "kbpmq0"
HOST_IP = "198.18.120.1"
GUEST_IP = "198.18.120.2"
PREFIX = 24
QUEUES = 2


def qemu_args(queues: int = QUEUES) -> list[str]:
    """The NIC: a multi-queue tap QEMU makes (no vhost: TCG), virtio-net with ``mq=on``
    and a vector per virtqueue plus config and control."""
    return ["-netdev", f"tap,id=kbpmq,ifname={TAP},script=no,downscript=no,vhost=off,"
                       f"queues={queues}",
            "-device", f"virtio-net-pci,netdev=kbpmq,mac={MAC},mq=on,"
                       f"vectors={2 * queues + 2}"]


def guest_env() -> dict[str, str]:
    return {"KBP_MQ_MAC": MAC, "KBP_MQ_HOST_IP": HOST_IP, "KBP_MQ_GUEST_IP": GUEST_IP,
            "KBP_MQ_PREFIX": str(PREFIX), "KBP_MQ_QUEUES": str(QUEUES)}


def check() -> None:
    if os.geteuid() != 0:
        raise RigError("--mq-nic needs root (a network namespace and a tap for QEMU)")


@contextlib.contextmanager
def netns() -> Iterator[str]:
    """A network namespace for QEMU and its tap, configured once QEMU has made the tap
    (in a thread: QEMU starts after this yields); removed at the end."""
    check()
    name = f"kbpmq-{os.getpid()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                       check=False)
    if r.returncode:
        raise RigError(f"--mq-nic: ip netns add {name}: {r.stderr.strip()}")
    tap = threading.Thread(target=_configure, args=(name,), daemon=True)
    tap.start()
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _configure(ns: str) -> None:
    """The tap's host end; a failure is the guest test's to see (no traffic comes back)."""
    with contextlib.suppress(RigError):
        outsource.configure_tap(ns, TAP, f"{HOST_IP}/{PREFIX}")


def qemu_prefix(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]
