"""The host side of socket outsourcing in the rig: kbp-sod beside QEMU (docs/design.md 11).

``python3 -m vm run FLAVOUR --sod NETNS ...`` boots the guest with its RAM in a shared file
(``memory-backend-file,share=on``) that a kbp-sod started here maps, QEMU's stock
``ivshmem-doorbell`` connected to the daemon's ivshmem server socket, and kbp_so.ko built
for the flavour (``KBP_SO_KO`` in the guest).  The daemon makes the guest's outsourced
sockets in the network namespace NETNS (the caller's: it puts its peers there).  With
``--sod-tap IFNAME`` QEMU runs in NETNS too and the guest gets a third virtio-net NIC on a
tap of that name there (MAC ``TAP_MAC``, ``KBP_SO_TAP_MAC`` in the guest): the path a host
peer in NETNS takes to the guest's own stack, beside the outsourced one, for comparisons.

The daemon's files (its log ``sod.log``, ``sod.pid``, the region and the RAM file) are in
``--sod-dir`` (default: a directory removed after the run), so a test can read the
daemon's counters and log afterwards, or kill it mid-run by its pid.

kbp-sod confines itself (docs/design.md 11.6): started here as root, it joins NETNS for good
(one VM per netns: a second daemon for the same netns is refused), then serves as the user
``kbp-sod`` (``nobody`` where that user does not exist) with CAP_NET_BIND_SERVICE only
(``bind-low-ports=yes``: a guest's root may bind ports below 1024, as on its own stack),
no_new_privs and its seccomp filter.  The guest's RAM file is 0600.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vm import paths
from vm.util import RigError, note, run

SOD_DIR = paths.REPO_ROOT / "outsource" / "sod"
GUEST_MODULE_DIR = paths.REPO_ROOT / "outsource" / "guest"
#: MAC of the tap NIC (the hub NICs are 52:54:00:4b:50:00/01)
TAP_MAC = "52:54:00:4b:50:10"
#: the pc machine keeps RAM below the PCI hole up to 3.5 GiB: there a file offset is the
#: guest-physical address, which is what kbp-sod's default mapping assumes
MAX_MEMORY_MB = 3072
READY = "kbp-sod: ready"


@dataclass(frozen=True)
class SodSpec:
    netns: str
    tap: str = ""
    dir: Path | None = None
    entries: int = 64
    poll: bool = False
    rt_prio: int = 0


def check(spec: SodSpec, memory_mb: int) -> None:
    """Refuse what cannot work, before anything is built or started."""
    if memory_mb > MAX_MEMORY_MB:
        raise RigError(f"--sod: --memory {memory_mb} is above {MAX_MEMORY_MB} MiB; kbp-sod "
                       "maps guest RAM as one range below the PCI hole")
    if not spec.netns or "/" in spec.netns:
        raise RigError(f"--sod {spec.netns!r}: name a network namespace (ip netns add NAME)")
    if not Path("/run/netns", spec.netns).exists():
        raise RigError(f"--sod {spec.netns}: no such network namespace "
                       f"(create it with: ip netns add {spec.netns})")
    if spec.tap and (len(spec.tap) > 15 or "/" in spec.tap):
        raise RigError(f"--sod-tap {spec.tap!r}: not a valid interface name")


def build_daemon() -> Path:
    """kbp-sod, built from outsource/sod (make knows whether it is up to date)."""
    run(["make", "-s", "-C", str(SOD_DIR), "kbp-sod"], what="kbp-sod build", quiet=True)
    return SOD_DIR / "kbp-sod"


def qemu_args(spec: SodSpec, workdir: Path, memory_mb: int, queues: int) -> list[str]:
    ram = (workdir / "ram.path").read_text()
    args = ["-object", f"memory-backend-file,id=kbpram,mem-path={ram},share=on,"
                       f"size={memory_mb}M",
            "-machine", "memory-backend=kbpram",
            "-chardev", f"socket,path={workdir / 'sod.sock'},id=kbpso",
            "-device", f"ivshmem-doorbell,chardev=kbpso,vectors={queues}"]
    if spec.tap:
        args += ["-netdev", f"tap,id=kbptap,ifname={spec.tap},script=no,downscript=no",
                 "-device", f"virtio-net-pci,netdev=kbptap,mac={TAP_MAC}"]
    return args


def qemu_prefix(spec: SodSpec) -> list[str]:
    """QEMU runs in the namespace when it has a tap there (it makes the tap)."""
    return ["ip", "netns", "exec", spec.netns] if spec.tap else []


def _ram_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path("/tmp")


def daemon_user() -> str:
    """The user kbp-sod serves as: the package's ``kbp-sod``, else ``nobody``."""
    try:
        pwd.getpwnam("kbp-sod")
    except KeyError:
        return "nobody"
    return "kbp-sod"


def daemon_argv(spec: SodSpec, binary: Path, workdir: Path, ram: Path | str, queues: int,
                socket: str = "sod.sock") -> list[str]:
    """kbp-sod's command line for the guest whose files are in ``workdir`` (a test starts a
    second daemon on the same region with another ``socket``: a new epoch)."""
    vm = (f"name=vm,region={workdir / 'region'},socket={workdir / socket},ram={ram},"
          f"queues={queues},entries={spec.entries},netns={spec.netns},bind-low-ports=yes,"
          # more sockets than a queue has slots: a guest test parks past a full ring
          f"max-sockets=256")
    argv = [str(binary), "--vm", vm, "--user", daemon_user()]
    if spec.poll:
        argv.append("--poll")
    if spec.rt_prio:
        argv += ["--rt-prio", str(spec.rt_prio)]
    return argv


def configure_tap(netns: str, tap: str, address: str, timeout: float = 120) -> None:
    """The host's end of ``--sod-tap``: QEMU makes the tap when it starts; once it is there,
    give it ``address`` (CIDR) and bring it up. No IPv6 on it: its neighbour discovery and
    MLD would reach the guest's NIC at any time, and the guest counts what its NICs get."""
    end = time.monotonic() + timeout
    while subprocess.run(["ip", "-n", netns, "link", "show", tap], capture_output=True,
                         check=False).returncode != 0:
        if time.monotonic() > end:
            raise RigError(f"QEMU made no tap {tap} in netns {netns}")
        time.sleep(0.05)
    for argv in (["ip", "netns", "exec", netns, "sysctl", "-qw",
                  f"net.ipv6.conf.{tap}.disable_ipv6=1"],
                 ["ip", "-n", netns, "addr", "add", address, "dev", tap],
                 ["ip", "-n", netns, "link", "set", tap, "up"]):
        run(argv, what=f"configuring {tap}", quiet=True)


@contextlib.contextmanager
def serve(spec: SodSpec, binary: Path, memory_mb: int, queues: int,
          tmp: Path) -> Iterator[Path]:
    """kbp-sod for one guest, its files in ``spec.dir`` or ``tmp``: yields that directory.

    The RAM file is sparse: the guest's pages are allocated as it touches them.  The daemon
    gets SIGTERM at the end (and SIGKILL if it does not stop in 10 s)."""
    workdir = (spec.dir or tmp / "sod").resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    ram = _ram_dir() / f"kbp-so-{os.getpid()}-{workdir.name}.ram"  # tmpfs: no writeback
    ram.unlink(missing_ok=True)
    # the guest's memory: readable by QEMU and the daemon (both start as root), nobody else
    fd = os.open(ram, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, memory_mb << 20)
    finally:
        os.close(fd)
    for stale in ("sod.sock", "region", "sod.pid", "ram.path"):
        (workdir / stale).unlink(missing_ok=True)
    argv = daemon_argv(spec, binary, workdir, ram, queues)
    log_path = workdir / "sod.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    (workdir / "sod.pid").write_text(f"{proc.pid}\n")
    (workdir / "ram.path").write_text(str(ram))
    try:
        end = time.monotonic() + 10
        while READY not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > end:
                raise RigError("kbp-sod did not start:\n"
                               + log_path.read_text(errors="replace")[-2000:])
            time.sleep(0.02)
        note(f"kbp-sod (pid {proc.pid}) serves the guest: {queues} queues, host sockets in "
             f"netns {spec.netns}, files in {workdir}")
        yield workdir
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        ram.unlink(missing_ok=True)  # the guest's memory: large, of no use afterwards
        note(f"kbp-sod exited with status {proc.returncode}")
