"""Fixtures of the in-guest suite: the module, the two hub NICs, traffic, dmesg.

Topology (built once, rebuilt by tests that tear it down):

    init netns                          netns "kbppeer"
    $KBP_NIC0 198.18.100.1/24  <-hub->  $KBP_NIC1 198.18.100.2/24

The device under test is $KBP_NIC0 (virtio-net): traffic sent from the peer namespace
arrives there through real virtio interrupts, which are affined to the poller's CPU (1);
NIC1's interrupts, the sender and the tester go to CPU 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

HERE = Path(__file__).resolve().parent
IN_VM = os.environ.get("KBP_IN_VM") == "1"
NS = "kbppeer"
SERVER_IP = "198.18.100.1"
CLIENT_IP = "198.18.100.2"
POLL_CPU = 1

# Lines that must never appear in dmesg.
SPLAT = re.compile(
    r"WARNING:|BUG:|Oops|general protection|lockdep|possible circular locking|"
    r"possible recursive locking|INFO: task .* blocked|rcu.*stall|"
    r"Call Trace:|refcount_t:|use-after-free|kernel NULL pointer|"
    r"unregister_netdevice: waiting|hung_task")

T = TypeVar("T")

#: Per-test time limit (setup + call + teardown), seconds.  The slowest tests take about
#: a minute under TCG on a loaded host; a hang must fail well inside the rig's 20 minutes.
#: ``@pytest.mark.timeout(N)`` raises it for one test, $KBP_TEST_TIMEOUT for all.
DEFAULT_TIMEOUT = float(os.environ.get("KBP_TEST_TIMEOUT", "240"))
#: After the limit the test gets this long to unwind; a test still stuck then (blocked in
#: the kernel, where no signal reaches it) gets a second dump and the guest is rebooted
#: (sysrq-b), which ends the VM run at once instead of at the rig's timeout.
TIMEOUT_GRACE = float(os.environ.get("KBP_TEST_TIMEOUT_GRACE", "60"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"timeout(seconds): this test's time limit in the guest "
                   f"(default {DEFAULT_TIMEOUT:.0f} s, $KBP_TEST_TIMEOUT)")
    config.addinivalue_line(
        "markers", "smoke: the smoke test of a flavour that does not run the whole suite in "
                   "`make test` (vm/README.md, 'Which flavours run what'): load, attach at the "
                   "defaults, traffic through the poller, driver and threaded changes, detach")
    config.addinivalue_line(
        "markers", "long: only in `make test-vm-all`, not in `make test`: a long run whose "
                   "path another test of `make test` covers (vm/README.md says which)")
    config.addinivalue_line(
        "markers", "rt: run with the smoke tests on the PREEMPT_RT flavours of `make test`: "
                   "a busy poller at kbpctl's default SCHED_FIFO priority, where PREEMPT_RT "
                   "turns CPU starvation into RCU stalls and hung commands")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IN_VM:
        return
    skip = pytest.mark.skip(reason="in-guest test: runs inside the VM rig (python3 -m vm test)")
    for item in items:
        item.add_marker(skip)


# -- per-test timeout ------------------------------------------------------------------
def _console(text: str) -> None:
    """Straight to the serial console: pytest captures fds 1 and 2 during a test."""
    try:
        with open("/dev/console", "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        sys.__stderr__.write(text + "\n")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return "?"


def task_states() -> str:
    """Every task (pid, state, wchan, comm) and the kernel stack of each D and R task."""
    rows, stacks = [], []
    for d in sorted((p for p in Path("/proc").iterdir() if p.name.isdigit()),
                    key=lambda p: int(p.name)):
        for t in sorted(d.glob("task/*"), key=lambda p: int(p.name)):
            stat = _read(f"{t}/stat")
            if ")" not in stat:
                continue
            comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
            wchan = _read(f"{t}/wchan")
            rows.append(f"{t.name:>6} {state} {wchan or '-':28} {comm}")
            if state in "DR" and int(t.name) != threading.get_native_id():
                stacks.append(f"--- {t.name} {comm} ({state})\n{_read(f'{t}/stack')}")
    return "\n".join(["   pid S wchan                        comm", *rows,
                      "kernel stacks of D and R tasks:", *stacks])


def dump_task_states(why: str) -> None:
    """Task states on the console: /proc first (works even when printk does not), then
    the kernel's own sysrq-w (blocked tasks with their stacks, busy workqueues) from
    dmesg.  Not sysrq-t: a thousand console lines at 115200 baud for little more."""
    _console(f"KBP-TEST-TIMEOUT {why}; task states follow")
    _console(task_states())
    try:
        before = len(sh("dmesg", timeout=30).stdout.splitlines())
        Path("/proc/sysrq-trigger").write_text("w")
        # without timestamps: these are a dump, not splats for the rig's console scan
        lines = sh("dmesg --notime", timeout=30).stdout.splitlines()[before:]
        _console("sysrq-w (dmesg):\n" + "\n".join(lines))
    except (OSError, AssertionError, subprocess.SubprocessError) as exc:
        _console(f"sysrq dump failed: {exc!r}")
    _console(f"KBP-TEST-TIMEOUT end of task states ({why})")


class _Timeout(Exception):
    """Raised in the main thread when a test exceeds its limit."""


class _Watchdog:
    """A thread that, after ``seconds``, dumps task states and interrupts the test with
    SIGALRM; if the test is still stuck ``TIMEOUT_GRACE`` later, dumps again and
    reboots the guest.  Threads, not only an alarm: a SIGALRM handler cannot run while
    the main thread is blocked in the kernel, which is when the dump matters most."""

    def __init__(self, nodeid: str, seconds: float) -> None:
        self.nodeid, self.seconds = nodeid, seconds
        self.done = threading.Event()
        self.fired = False
        self.main = threading.main_thread().ident
        self.thread = threading.Thread(target=self._run, name="kbp-test-timeout",
                                       daemon=True)

    def _run(self) -> None:
        if self.done.wait(self.seconds):
            return
        self.fired = True
        dump_task_states(f"{self.nodeid} exceeded its {self.seconds:.0f} s timeout")
        if self.done.is_set():
            return
        assert self.main is not None
        signal.pthread_kill(self.main, signal.SIGALRM)
        if self.done.wait(TIMEOUT_GRACE):
            return
        dump_task_states(f"{self.nodeid} still stuck {TIMEOUT_GRACE:.0f} s after its "
                         f"timeout (blocked in the kernel?)")
        _console(f"KBP-TEST-TIMEOUT {self.nodeid}: rebooting the guest (sysrq-b)")
        with contextlib.suppress(OSError):
            Path("/proc/sysrq-trigger").write_text("b")

    def alarm(self, _signum: int, _frame: object) -> None:
        if self.fired and not self.done.is_set():
            raise _Timeout(f"{self.nodeid} exceeded its {self.seconds:.0f} s timeout "
                           f"(task states on the console, KBP-TEST-TIMEOUT)")


def time_limit(item: pytest.Item) -> float:
    m = item.get_closest_marker("timeout")
    return float(m.args[0]) if m else DEFAULT_TIMEOUT


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item,
                            nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Setup, call and teardown of every in-guest test run under its time limit."""
    if not IN_VM:
        yield
        return
    dog = _Watchdog(item.nodeid, time_limit(item))
    old = signal.signal(signal.SIGALRM, dog.alarm)
    dog.thread.start()
    try:
        yield
    finally:
        dog.done.set()
        signal.signal(signal.SIGALRM, old)


# -- shell helpers ----------------------------------------------------------------------
def sh(cmd: str, ns: str | None = None, check: bool = True,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", ns, "sh", "-c", cmd] if ns else ["sh", "-c", cmd]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd!r} (ns={ns}) failed {p.returncode}: {p.stderr.strip()}")
    return p


def spawn(argv: list[str], ns: str | None = None) -> subprocess.Popen[str]:
    full = ["ip", "netns", "exec", ns, *argv] if ns else argv
    return subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(p: subprocess.Popen[str], timeout: float = 30) -> str:
    if p.poll() is None:
        p.terminate()
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    return out


def net_rx_softirqs() -> list[int]:
    """NET_RX softirq counts per CPU, from /proc/softirqs."""
    for line in Path("/proc/softirqs").read_text().splitlines():
        if line.strip().startswith("NET_RX:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("no NET_RX line in /proc/softirqs")


def _udp_counter(name: str) -> int:
    rows = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines()
            if ln.startswith("Udp:")]
    return int(rows[1][rows[0].index(name)])


def udp_in_datagrams() -> int:
    return _udp_counter("InDatagrams")


def udp_seen() -> int:
    """Datagrams that reached UDP in the init netns (delivered or to a closed port)."""
    return _udp_counter("InDatagrams") + _udp_counter("NoPorts")


def task_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def spinning(pid: int, seconds: float = 2.0) -> bool:
    """The task is running (R) in most samples over ``seconds``: a busy poller gives its
    CPU away for 50 us now and then when another task is runnable there (design.md 2)."""
    running = 0
    for _ in range(20):
        running += task_state(pid) == "R"
        time.sleep(seconds / 20)
    return running >= 10


def task_cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])          # utime + stime


def threads_named(prefix: str) -> list[str]:
    """comm of every task whose name starts with ``prefix``."""
    names = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                comm = (d / "comm").read_text().strip()
                if comm.startswith(prefix):
                    names.append(comm)
    return names


def kbp_threads() -> list[str]:
    """The pollers' threads, of both classes (kbp/N rt, kbpn/N non-rt)."""
    return threads_named("kbp/") + threads_named("kbpn/")


def wait_for(pred: Callable[[], T], timeout: float = 10.0, step: float = 0.05,
             what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


# -- dmesg ------------------------------------------------------------------------------
def dmesg_lines() -> list[str]:
    return sh("dmesg").stdout.splitlines()


def dmesg_since(n: int) -> list[str]:
    return dmesg_lines()[n:]


@pytest.fixture(autouse=True)
def dmesg_clean() -> Iterator[list[str]]:
    """Every test leaves dmesg free of warnings, oopses and lockdep splats."""
    before = len(dmesg_lines())
    new: list[str] = []
    yield new
    new.extend(dmesg_lines()[before:])
    bad = [ln for ln in new if SPLAT.search(ln)]
    assert not bad, "dmesg splat:\n" + "\n".join(new[-80:])


# -- module -----------------------------------------------------------------------------
def module_loaded() -> bool:
    return Path("/sys/module/kbp").exists()


def load_module() -> None:
    if not module_loaded():
        sh(f"insmod {os.environ['KBP_KO']}")


def unload_module() -> None:
    if module_loaded():
        sh("rmmod kbp")


@pytest.fixture(scope="session")
def kmod() -> Any:
    load_module()
    from kbp import kmod as k
    return k


def _netns_inum(name: str | None) -> int:
    path = f"/run/netns/{name}" if name else "/proc/self/ns/net"
    return os.stat(path).st_ino


def _netns_of(dev: Any) -> str | None:
    for p in Path("/run/netns").glob("*"):
        if os.stat(p).st_ino == dev.netns_inum:
            return p.name
    return None


def detach_all() -> None:
    """Detach every attached device (in any netns) and wait for the pollers to stop."""
    from kbp import kmod as k
    own = _netns_inum(None)
    for d in k.devices():
        with contextlib.suppress(k.KbpError):
            k.detach(d.ifname, netns=None if d.netns_inum == own else _netns_of(d))
    # a stopped poller is listed until its thread has left kbp's code; the task itself
    # may linger a moment longer on its way out
    wait_for(lambda: not k.pollers() and not kbp_threads(), 10, what="pollers to stop")


@pytest.fixture(autouse=True)
def _clean_kbp() -> Iterator[None]:
    """Leave no device attached and no poller running after a test."""
    yield
    if not module_loaded():
        return
    detach_all()
    assert not kbp_threads(), kbp_threads()


# -- topology ---------------------------------------------------------------------------
@dataclass
class Topo:
    nic0: str
    nic1: str
    ns: str = NS
    server_ip: str = SERVER_IP
    client_ip: str = CLIENT_IP


_virtio: dict[str, str] = {}


def virtio_name(nic: str) -> str:
    """virtioN behind a NIC (remembered: the NIC may sit in another netns later)."""
    if nic not in _virtio:
        link = f"/sys/class/net/{nic}/device"
        target = (os.readlink(link) if os.path.exists(link)
                  else sh(f"readlink {link}", ns=NS).stdout.strip())
        _virtio[nic] = os.path.basename(target)
    return _virtio[nic]


def pin_irqs(nic: str, cpu: int) -> list[int]:
    """Affine every interrupt of a virtio NIC (virtioN-input.0, -output.0, ...) to a CPU."""
    prefix = virtio_name(nic) + "-"
    irqs = []
    for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
        parts = line.split()
        if parts and parts[0].rstrip(":").isdigit() and parts[-1].startswith(prefix):
            irq = int(parts[0].rstrip(":"))
            Path(f"/proc/irq/{irq}/smp_affinity_list").write_text(str(cpu))
            irqs.append(irq)
    assert irqs, f"no interrupts named {prefix}* in /proc/interrupts"
    return irqs


def ping(t: Topo) -> bool:
    """An ICMP echo from the peer netns to the device under test is answered: both NICs
    carry packets, both ways.  ping(8), not a python sender: every test with the topology
    runs this, and a python start-up costs about a second under TCG."""
    p = subprocess.run(["ip", "netns", "exec", t.ns, "ping", "-c", "1", "-W", "1", "-q",
                        t.server_ip], capture_output=True, text=True, timeout=30)
    return p.returncode == 0


def mq_nic() -> str | None:
    """The multi-queue virtio-net NIC of a ``--mq-nic`` boot (vm/mqnic.py), or None."""
    mac = os.environ.get("KBP_MQ_MAC")
    if not mac:
        return None
    for d in Path("/sys/class/net").iterdir():
        with contextlib.suppress(OSError):
            if (d / "address").read_text().strip() == mac:
                return d.name
    return None


def park_mq_nic() -> None:
    """Its interrupts off the poller's CPU, as NIC1's: the tests that count other devices'
    interrupts on the polling CPU (kbp.contention) see only the devices they set up.
    test_real_nic's multi-queue test spreads them, and parks them again at its end."""
    nic = mq_nic()
    if nic is not None:
        pin_irqs(nic, 1 - POLL_CPU)


def build_topology() -> Topo:
    """NIC0 (device under test) interrupts on the poller's CPU, NIC1's on the other one."""
    nic0, nic1 = os.environ["KBP_NIC0"], os.environ["KBP_NIC1"]
    virtio_name(nic0)
    if Path(f"/sys/class/net/{nic1}").exists():
        virtio_name(nic1)
    pin_irqs(nic0, POLL_CPU)
    pin_irqs(nic1, 1 - POLL_CPU)
    park_mq_nic()
    if not Path(f"/run/netns/{NS}").exists():
        sh(f"ip netns add {NS}")
    if Path(f"/sys/class/net/{nic1}").exists():
        sh(f"ip link set {nic1} netns {NS}")
    sh(f"ip addr flush dev {nic0}; ip addr add {SERVER_IP}/24 dev {nic0}; ip link set {nic0} up")
    sh(f"ip addr flush dev {nic1}; ip addr add {CLIENT_IP}/24 dev {nic1}; "
       f"ip link set {nic1} up; ip link set lo up", ns=NS)
    t = Topo(nic0, nic1)
    wait_for(lambda: ping(t), 20, 0.5, "the two NICs to talk")
    return t


@pytest.fixture()
def topo() -> Topo:
    return build_topology()


# -- traffic ----------------------------------------------------------------------------
UDPFLOW = [sys.executable, str(HERE / "udpflow.py")]  # the traffic script


class Flow:
    """A sink in the init netns (on the poller's CPU) and a sender in the peer netns."""

    def __init__(self, t: Topo, port: int = 9000) -> None:
        self.t, self.port = t, port
        self.sink: subprocess.Popen[str] | None = None
        self.sender: subprocess.Popen[str] | None = None

    def start_sink(self, expect: int = 0, timeout: float = 120) -> None:
        self.sink = spawn(["taskset", "-c", str(POLL_CPU), *UDPFLOW, "sink",
                           "--bind", f"{SERVER_IP}:{self.port}",
                           "--expect", str(expect), "--timeout", str(timeout)])
        assert self.sink.stdout is not None
        assert self.sink.stdout.readline().strip() == "ready"

    def send(self, count: int, rate: float, burst: int = 1) -> dict[str, Any]:
        p = sh(" ".join(["taskset", "-c", str(1 - POLL_CPU), *UDPFLOW, "send",
                         "--to", f"{SERVER_IP}:{self.port}", "--count", str(count),
                         "--rate", str(rate), "--burst", str(burst)]),
               ns=NS, timeout=count / rate * 4 + 60)
        return dict(json.loads(p.stdout.strip().splitlines()[-1]))

    def start_sender(self, rate: float) -> None:
        self.sender = spawn(["taskset", "-c", str(1 - POLL_CPU), *UDPFLOW, "send",
                             "--to", f"{SERVER_IP}:{self.port}", "--count", "0",
                             "--rate", str(rate)], ns=NS)

    def stop_sender(self) -> dict[str, Any] | None:
        """Stop the sender of start_sender(); what it says it sent ({"sent": N, ...})."""
        if not self.sender:
            return None
        out = stop(self.sender)
        self.sender = None
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        return dict(json.loads(lines[-1])) if lines else None

    def result(self, timeout: float = 60) -> dict[str, Any]:
        assert self.sink is not None
        if self.sink.poll() is None:
            try:
                out, _ = self.sink.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                out = stop(self.sink)
        else:
            out = self.sink.communicate()[0]
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        assert lines, f"sink printed no result: {out!r}"
        return dict(json.loads(lines[-1]))

    def close(self) -> None:
        self.stop_sender()
        if self.sink and self.sink.poll() is None:
            stop(self.sink)


@pytest.fixture()
def flow(topo: Topo) -> Iterator[Flow]:
    f = Flow(topo)
    yield f
    f.close()


def traffic_flows(t: Topo, seconds: float = 1.0) -> bool:
    """Datagrams from the running sender still reach the init netns' UDP layer."""
    before = udp_seen()
    time.sleep(seconds)
    return udp_seen() > before
