"""freq_ctl (EE-KBP Sect. 4.2) and kbpctl's cpufreq report, through the kernel's own cpufreq.

QEMU TCG guests have no frequency control, so these tests register the test-only driver
vm/testdata/kbp_test_cpufreq (three operating points: 800, 1600, 2400 MHz; its
target_index() only records the choice) and read back what the cpufreq core reports:
scaling_cur_freq and the core's transition statistics (stats/total_trans, trans_table).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    NS,
    POLL_CPU,
    SERVER_IP,
    Flow,
    Topo,
    detach_all,
    dmesg_lines,
    sh,
    task_state,
    wait_for,
)
from test_bad_input import refused
from test_kbpctl_kmod import kbpctl

CPUFREQ = Path(f"/sys/devices/system/cpu/cpu{POLL_CPU}/cpufreq")
KO = Path(os.environ.get("KBP_TEST_MODULES", "/nonexistent")) / "kbp_test_cpufreq.ko"
MIN, MID, MAX = 800_000, 1_600_000, 2_400_000
KERNEL = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])


def rd(name: str) -> str:
    return (CPUFREQ / name).read_text().strip()


def transitions() -> int:
    return int(rd("stats/total_trans"))


def set_governor(gov: str) -> None:
    (CPUFREQ / "scaling_governor").write_text(gov + "\n")
    assert rd("scaling_governor") == gov


@pytest.fixture()
def no_cpufreq() -> None:
    if CPUFREQ.exists():
        pytest.skip(reason=f"this guest already has a cpufreq driver ({rd('scaling_driver')})")


@pytest.fixture()
def cpufreq(kmod) -> Iterator[None]:
    """The test cpufreq driver registered, CPU POLL_CPU under schedutil (Debian's default)."""
    if not KO.exists():
        pytest.skip(reason=f"test cpufreq driver not built ({KO})")
    if CPUFREQ.exists():
        pytest.skip(reason=f"this guest already has a cpufreq driver ({rd('scaling_driver')})")
    sh(f"insmod {KO}")
    sh("modprobe cpufreq_userspace")
    try:
        assert rd("scaling_driver") == "kbp-test"
        set_governor("schedutil")
        yield
    finally:
        detach_all()    # as _clean_kbp does, but before the driver goes: detach restores
        kmod.poller_set(POLL_CPU, freq_ctl=False)   # CPU knobs outlive pollers: reset it
        sh("rmmod kbp_test_cpufreq")
        assert not CPUFREQ.exists()


def any_burst_left_the_cpu_high(kmod, per_burst: int, bursts: int = 12) -> list[str]:
    """Bursts of ``per_burst`` datagrams to NIC0 while the other CPU reads cpuinfo_cur_freq
    in a loop, the driver's ->get() taking 300 us (get_delay_us) with the policy's rwsem
    held, and the poller lingering 3 ms after each burst (so that its sleep comes at a
    random point of the reader's cycle); after each burst, once the poller sleeps: the
    frequency it left, if not MIN."""
    delay = Path("/sys/module/kbp_test_cpufreq/parameters/get_delay_us")
    linger = kmod.poller(POLL_CPU).linger_us
    kmod.poller_set(POLL_CPU, linger_us=3000)
    delay.write_text("300\n")
    reader = subprocess.Popen(
        ["taskset", "-c", str(1 - POLL_CPU), sys.executable, "-c",
         f"import os\nfd = os.open('{CPUFREQ}/cpuinfo_cur_freq', os.O_RDONLY)\n"
         "while True:\n    os.pread(fd, 32, 0)\n"])
    sender = subprocess.Popen(
        ["ip", "netns", "exec", NS, "taskset", "-c", str(1 - POLL_CPU), sys.executable, "-c",
         "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         "for line in sys.stdin:\n"
         f"    for _ in range({per_burst}):\n"
         f"        s.sendto(b'x', ('{SERVER_IP}', 9))\n"
         "    print('sent', flush=True)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert sender.stdin is not None and sender.stdout is not None
    high = []
    try:
        for i in range(bursts):
            woke = kmod.poller(POLL_CPU).wakeups
            sender.stdin.write("go\n")
            sender.stdin.flush()
            assert sender.stdout.readline() == "sent\n"
            wait_for(lambda w=woke: (p := kmod.poller(POLL_CPU)).wakeups > w
                     and task_state(p.pid) == "S", 5,
                     what=f"burst {i} to wake the poller and the poller to sleep again")
            if (khz := int(rd("scaling_cur_freq"))) != MIN:
                high.append(f"burst {i}: {khz} kHz while asleep")
    finally:
        for proc in (sender, reader):
            proc.kill()
            proc.wait()
        delay.write_text("0\n")
        kmod.poller_set(POLL_CPU, linger_us=linger)
    return high


def test_freq_ctl_refused_without_cpufreq(kmod, topo: Topo, no_cpufreq: None) -> None:
    line = refused(kmod, errno.EOPNOTSUPP, "no cpufreq policy",
                   lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid", freq_ctl=True))
    assert f"CPU {POLL_CPU}" in line
    p = kbpctl("enable", topo.nic0, "--backend", "kmod", "--cpus", str(POLL_CPU),
               "--freq-ctl", check=False)
    assert p.returncode == 69 and "has no cpufreq policy" in p.stderr, p.stderr
    st = json.loads(kbpctl("status", "--json").stdout)
    assert st["cpufreq"]["available"] is False and "no cpufreq" in st["cpufreq"]["note"]


def test_freq_ctl_needs_userspace_governor_and_hybrid(kmod, topo: Topo, cpufreq: None) -> None:
    line = refused(kmod, errno.EOPNOTSUPP, "needs governor userspace",
                   lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid", freq_ctl=True))
    assert "schedutil" in line
    set_governor("userspace")
    refused(kmod, errno.EINVAL, "needs mode hybrid",
            lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, mode="busy", freq_ctl=True))
    line = refused(kmod, errno.ERANGE, "out of range",
                   lambda: kmod.poller_set(POLL_CPU, freq_ctl=2))
    assert "freq_ctl 2 out of range" in line


def test_freq_ctl_lowers_while_asleep_raises_on_wake_restores(kmod, flow: Flow,
                                                              cpufreq: None) -> None:
    set_governor("userspace")
    (CPUFREQ / "scaling_setspeed").write_text(f"{MID}\n")   # the operator's frequency
    assert int(rd("scaling_cur_freq")) == MID
    t0 = transitions()
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid", freq_ctl=True)
    p = kmod.poller(POLL_CPU)
    assert p.freq_ctl is True
    wait_for(lambda: task_state(p.pid) == "S", 5, what="hybrid poller to sleep")
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU at its minimum")

    bursts, per_burst = 20, 8
    flow.start_sink(expect=bursts * per_burst)
    a = kmod.poller(POLL_CPU)
    flow.send(bursts * per_burst, rate=per_burst * 10, burst=per_burst)   # 10 bursts/s
    assert flow.result()["unique"] == bursts * per_burst
    wait_for(lambda: task_state(p.pid) == "S", 5, what="hybrid poller to sleep again")
    b = kmod.poller(POLL_CPU)
    woke = b.wakeups - a.wakeups
    ups_downs = b.freq_changes - a.freq_changes
    # asleep at min before and after: every raise (on wake) has its lowering (before sleep)
    assert woke >= bursts and ups_downs % 2 == 0, (woke, ups_downs)
    assert 2 * bursts <= ups_downs <= 2 * (b.passes - a.passes), (woke, ups_downs)
    assert int(rd("scaling_cur_freq")) == MIN
    # the cpufreq core saw exactly the changes kbp counted: min <-> max only
    assert transitions() - t0 == b.freq_changes, (transitions() - t0, b.freq_changes)
    table = rd("stats/trans_table")
    assert str(MAX) in table and str(MIN) in table

    # a reader of the policy's sysfs holds its rwsem over and over (a monitoring agent at its
    # worst): every sleep still lowers the CPU. A lowering that only tried the lock was
    # skipped whenever the reader held it, leaving the idle CPU at its maximum
    high = any_burst_left_the_cpu_high(kmod, per_burst)
    assert not high, f"lowerings skipped: {high}"

    # turning freq_ctl off gives the CPU its frequency back, the poller keeps serving
    kmod.poller_set(POLL_CPU, freq_ctl=False)
    wait_for(lambda: int(rd("scaling_cur_freq")) == MID, 5, what="the operator's frequency")
    assert kmod.poller(POLL_CPU).freq_ctl is False
    changes = kmod.poller(POLL_CPU).freq_changes
    time.sleep(0.5)
    assert kmod.poller(POLL_CPU).freq_changes == changes   # off means off

    # on again, then detach: the frequency found at attach comes back when the poller stops
    kmod.poller_set(POLL_CPU, freq_ctl=True)
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU at its minimum")
    kmod.detach(flow.t.nic0)
    wait_for(lambda: not kmod.pollers(), 10, what="the poller to stop")
    wait_for(lambda: int(rd("scaling_cur_freq")) == MID, 5, what="the operator's frequency back")
    assert rd("scaling_governor") == "userspace"


def test_governor_change_and_driver_removal_under_freq_ctl(kmod, flow: Flow,
                                                          cpufreq: None) -> None:
    set_governor("userspace")
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid", freq_ctl=True)
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU at its minimum")
    # the operator hands the CPU to another governor: it owns the frequency from now on
    set_governor("performance")
    flow.start_sink(expect=200)
    flow.send(200, rate=400, burst=4)
    assert flow.result()["unique"] == 200
    assert int(rd("scaling_cur_freq")) == MAX
    c = kmod.poller(POLL_CPU).freq_changes
    flow.start_sink(expect=100)
    flow.send(100, rate=400, burst=4)
    assert flow.result()["unique"] == 100
    assert kmod.poller(POLL_CPU).freq_changes == c
    # the cpufreq driver goes away under the poller: traffic keeps flowing
    set_governor("userspace")
    sh("rmmod kbp_test_cpufreq")
    flow.start_sink(expect=100)
    flow.send(100, rate=400, burst=4)
    assert flow.result()["unique"] == 100
    kmod.detach(flow.t.nic0)
    wait_for(lambda: not kmod.pollers(), 10, what="the poller to stop")
    sh(f"insmod {KO}")          # for the fixture's teardown


def test_driver_replaced_under_a_sleeping_poller_forgets_the_old_frequency(
        kmod, flow: Flow, cpufreq: None) -> None:
    """What kbp saved belongs to the policy it saved it from.  The poller lowers the CPU
    (saving the operator's MAX), the cpufreq driver is replaced while the poller sleeps (no
    kbp code runs meanwhile), the operator sets MID under the new policy.  Before, kbp.ko
    kept the old policy's MAX and 'restored' it at detach: the CPU ended at 2.4 GHz
    instead of the operator's 1.6 GHz (seen intermittently in CI after the previous test
    left such a value behind)."""
    set_governor("userspace")
    (CPUFREQ / "scaling_setspeed").write_text(f"{MAX}\n")
    kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid", freq_ctl=True)
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU at its minimum")
    sh("rmmod kbp_test_cpufreq")           # the policy kbp saved MAX from goes away
    sh(f"insmod {KO}")
    set_governor("userspace")
    (CPUFREQ / "scaling_setspeed").write_text(f"{MID}\n")   # the operator's, new policy
    assert int(rd("scaling_cur_freq")) == MID
    flow.start_sink(expect=40)             # wake the poller: it raises, then lowers again
    flow.send(40, rate=400, burst=4)
    assert flow.result()["unique"] == 40
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU at its minimum")
    kmod.detach(flow.t.nic0)
    wait_for(lambda: not kmod.pollers(), 10, what="the poller to stop")
    wait_for(lambda: int(rd("scaling_cur_freq")) == MID, 5,
             what=f"the new policy's operator frequency {MID} (not the old policy's {MAX})")


def test_kbpctl_reports_cpufreq_and_drives_freq_ctl(kmod, topo: Topo, cpufreq: None) -> None:
    st = json.loads(kbpctl("status", "--json").stdout)["cpufreq"]
    row = next(c for c in st["cpus"] if c["cpu"] == POLL_CPU)
    assert st["available"] is True and "schedutil" in st["note"]
    assert (row["governor"], row["driver"], row["hw_min_khz"], row["hw_max_khz"]) == \
        ("schedutil", "kbp-test", MIN, MAX)
    assert row["min_khz"] == int(rd("scaling_min_freq")) and row["max_khz"] == MAX

    p = kbpctl("enable", topo.nic0, "--backend", "kmod", "--cpus", str(POLL_CPU),
               "--freq-ctl", check=False)
    assert p.returncode == 2 and "needs the userspace governor" in p.stderr, p.stderr
    assert kmod.device(topo.nic0) is None

    set_governor("userspace")
    (CPUFREQ / "scaling_setspeed").write_text(f"{MID}\n")
    out = kbpctl("enable", topo.nic0, "--backend", "kmod", "--cpus", str(POLL_CPU),
                 "--rt-prio", "0", "--freq-ctl").stdout
    assert "freq_ctl" in out, out
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU at its minimum")
    st = json.loads(kbpctl("status", "--json").stdout)
    poller = next(p for p in st["pollers"] if p["cpu"] == POLL_CPU)
    assert poller["freq_ctl"] is True and poller["counters"]["freq_changes"] >= 1
    assert "freq_ctl" in st["cpufreq"]["note"]
    assert next(c for c in st["cpufreq"]["cpus"] if c["cpu"] == POLL_CPU)["cur_khz"] == MIN
    kbpctl("status")                       # the table renders with the freq_ctl column
    kbpctl("disable", topo.nic0)
    assert kmod.device(topo.nic0) is None
    wait_for(lambda: not kmod.pollers(), 10, what="the poller to stop")
    wait_for(lambda: int(rd("scaling_cur_freq")) == MID, 5, what="the operator's frequency back")


def test_non_rt_sibling_keeps_the_cpu_up(kmod, topo: Topo, cpufreq: None) -> None:
    """freq_ctl is the CPU's: the rt poller kbp/N (freq_ctl, its device idle) sleeps while
    the non-rt poller kbpn/N polls a heavy device on the same CPU.  Before, kbp/N lowered
    the CPU to its minimum at every sleep while kbpn/N was polling, and kbpn/N never
    raised it.  Now the CPU goes down only when the last of its pollers sleeps, and up when
    the first wakes: with the heavy device saturating kbpn/N it stays at the maximum; once
    the heavy device is detached it is lowered again."""
    from test_real_nic import KO as NIC_KO
    from test_real_nic import ktn_device, total
    if not NIC_KO.exists():
        pytest.skip(reason=f"test NIC not built ({NIC_KO})")
    set_governor("userspace")
    kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid", freq_ctl=True)
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU at its minimum")
    here = f"{POLL_CPU},{POLL_CPU}"
    with ktn_device(queues=2, cpus=here, rate=3000, cost_ns=200000) as dev:
        kmod.attach(dev, cpu=POLL_CPU, mode="hybrid", cls="non-rt")
        k0 = total("by_kbpn", dev)
        wait_for(lambda: total("by_kbpn", dev) > k0 + 500, 20, what="kbpn to carry it")
        seen = []
        for _ in range(20):
            seen.append(int(rd("scaling_cur_freq")))
            time.sleep(0.05)
        assert seen.count(MAX) >= 18, seen       # at most a pass's worth at the minimum
        kmod.detach(dev)
    wait_for(lambda: int(rd("scaling_cur_freq")) == MIN, 5, what="the CPU lowered again")


@pytest.mark.skipif(KERNEL < (6, 10), reason="napi->irq (netif_napi_set_irq(), the "
                    "CPU a NAPI gets from its interrupt) is 6.10+")
def test_freq_ctl_checked_on_the_cpu_a_device_gets_when_up(kmod, topo: Topo,
                                                          cpufreq: None) -> None:
    """A device attached while down with freq_ctl and no CPU named gets its CPU from its
    NAPIs' interrupt when it comes up (the test NIC says its NAPIs' interrupt is NIC0's,
    on a CPU whose governor is schedutil); that CPU is checked then.  Before,
    NETDEV_UP checked only knob conflicts: a freq_ctl poller started under schedutil,
    the governor the check refuses.  Now the device stays in standby, the reason logged."""
    from conftest import pin_irqs
    from test_real_nic import KO as NIC_KO
    from test_real_nic import ktn_device
    if not NIC_KO.exists():
        pytest.skip(reason=f"test NIC not built ({NIC_KO})")
    irq = pin_irqs(topo.nic0, POLL_CPU)[0]
    with ktn_device(queues=1, irq=irq, rate=100) as dev:
        sh(f"ip link set {dev} down")
        kmod.attach(dev, mode="hybrid", freq_ctl=True)      # no CPU: the interrupt's
        assert kmod.device(dev).state == "standby"
        mark = len(dmesg_lines())
        sh(f"ip link set {dev} up")
        time.sleep(0.5)
        d = kmod.device(dev)
        assert d.state == "standby" and not d.napis, d
        assert not kmod.pollers()
        lines = dmesg_lines()[mark:]
        # the CPU the interrupt's effective affinity gives (the move to POLL_CPU takes
        # effect at its next interrupt): under schedutil too, Debian's default
        assert any("refused: freq_ctl needs governor userspace" in ln for ln in lines), lines
