"""Poller classes: an rt and a non-rt poller on one CPU (the outsourcing method's RT/non-RT
split by priority, issue 24; docs/design.md "Classes").

The RT device is the rig's virtio NIC (NIC0, interrupts on POLL_CPU), the heavy non-RT
device the test NIC (vm/testdata/kbp_test_nic) with its queues on the same CPU: every frame
it delivers carries its queue and a sequence number, so a reclassification, a CPU going
offline or rmmod under traffic shows a lost or reordered frame.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import POLL_CPU, Flow, Topo, sh, wait_for
from test_bad_input import refused
from test_hardening import cpu_online
from test_kbpctl_kmod import kbpctl
from test_real_nic import (
    KO,
    assert_in_order,
    hooked,
    kbp_carries,
    ktn_device,
    rmmod_hands_back,
    total,
)

from kbp.pollertrace import TOP_BEHIND

pytestmark = pytest.mark.skipif(not KO.exists(), reason="kbp_test_nic.ko not built "
                                "(python3 -m vm test builds every vm/testdata module)")

QUEUES_HERE = f"{POLL_CPU},{POLL_CPU}"


def pollers_on(kmod, cpu: int) -> dict[str, object]:
    """The pollers of ``cpu`` by class."""
    return {p.cls: p for p in kmod.pollers() if p.cpu == cpu}


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def preemption_model() -> str:
    """kbp.sysinfo's reading of the preemption model (debugfs' sched/preempt, mounted here
    first if it is not, else uname): none, voluntary, full, lazy, rt or unknown."""
    from kbp import sysinfo
    if not Path("/sys/kernel/debug/sched").exists():
        sh("mount -t debugfs none /sys/kernel/debug", check=False)
    return sysinfo.preempt_model().model


@pytest.mark.smoke
def test_rt_and_non_rt_pollers_share_a_cpu(kmod, flow: Flow) -> None:
    """Two pollers on one CPU: kbp/N (rt, FIFO) serves the RT NIC, kbpn/N (non-rt,
    SCHED_OTHER at its nice, quota 8) the heavy device; each carries its own device's
    packets, nothing lost or reordered, and the rt poller's wake-up delays are counted."""
    with ktn_device(queues=2, cpus=QUEUES_HERE, rate=2000) as dev:
        kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid", rt_prio=50)
        kmod.attach(dev, cpu=POLL_CPU, mode="hybrid", cls="non-rt", nice=5)
        ps = pollers_on(kmod, POLL_CPU)
        assert set(ps) == {"rt", "non-rt"}, ps
        rt, nrt = ps["rt"], ps["non-rt"]
        assert (nrt.mode, nrt.quota, nrt.rt_prio, nrt.nice) == ("hybrid", 8, 0, 5), nrt
        assert (rt.quota, rt.rt_prio) == (64, 50), rt
        assert comm(rt.pid) == f"kbp/{POLL_CPU}:{flow.t.nic0}" == rt.name
        assert comm(nrt.pid) == f"kbpn/{POLL_CPU}:{dev}" == nrt.name   # kbpctl's name for it
        assert os.sched_getscheduler(nrt.pid) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, nrt.pid) == 5
        assert os.sched_getscheduler(rt.pid) == os.SCHED_FIFO
        assert {n.pid for n in kmod.device(dev).napis} == {nrt.pid}
        assert {n.pid for n in kmod.device(flow.t.nic0).napis} == {rt.pid}
        assert {d.ifname: d.cls for d in kmod.devices()} == {flow.t.nic0: "rt", dev: "non-rt"}

        n0 = total("by_kbpn", dev)
        kbp_carries(dev)
        assert total("by_kbpn", dev) > n0 + 300, "the test NIC's frames went to kbp/N"
        n = 1000
        flow.start_sink(expect=n)
        a, k0 = pollers_on(kmod, POLL_CPU), total("by_kbp", dev)
        flow.send(n, rate=500)
        res = flow.result()
        b, k1 = pollers_on(kmod, POLL_CPU), total("by_kbp", dev)
        assert res["unique"] == n, res
        assert b["rt"].packets - a["rt"].packets >= n
        # the rt poller saw the NIC's datagrams only: the test NIC's frames went to kbpn
        assert b["rt"].packets - a["rt"].packets < n + (k1 - k0) // 2
        assert b["non-rt"].packets - a["non-rt"].packets >= (k1 - k0) // 2
        woke = b["rt"].wakeups - a["rt"].wakeups
        assert woke > 0
        # the scheduler's run_delay: a lower bound that stays put for wake-ups that preempt
        # at once (design.md, "Classes": wake_delay_ns); consistent, and the longest within the sum
        assert b["rt"].wake_delay_ns >= a["rt"].wake_delay_ns
        assert b["rt"].wake_delay_max_ns <= b["rt"].wake_delay_ns
        assert (b["rt"].wake_delay_max_ns > 0) == (b["rt"].wake_delay_ns > 0)
        # kbpctl status: each class's poll sizes (the quota caps the non-rt poller's) and
        # the waits, per CPU, from the module's counters and the scheduler's schedstat
        st = json.loads(kbpctl("status", "--json").stdout)
        (pc,) = [c for c in st["polling_cpus"] if c["cpu"] == POLL_CPU]
        load = {p["class"]: p["load"] for p in pc["pollers"]}
        assert 1 <= load["non-rt"]["packets_per_poll"] <= 8, load
        assert load["non-rt"]["quota"] == 8 and load["rt"]["quota"] == 64
        assert load["rt"]["wakeups"] >= woke and load["rt"]["runs"] > 0
        assert load["rt"]["wake_delay_max_us"] is not None
        out = kbpctl("status").stdout
        assert f"non-rt kbpn/{POLL_CPU}:" in out and "packets per poll (quota 8)" in out, out
        assert_in_order(dev)


# long: bpftrace enables the sched and net tracepoints while both pollers run, which patches
# kernel text under QEMU TCG's stale-int3 race (vm/README.md, "Oops: int3"): in CI it took
# the 6.12 suite down in 3 of 5 boots (int3 in __schedule, then in kbp_poll_napi's
# tracepoint site), twice in a row once; make test-vm-all runs it.
@pytest.mark.long
def test_status_trace_on_the_modules_pollers(kmod, flow: Flow) -> None:
    """kbpctl status --trace on kbp.ko's two pollers of one CPU (kbp/N rt on the NIC, kbpn/N
    non-rt on the test NIC at 2000 frames/s): the rt poller's wake-ups are traced and each
    wait is charged to a task; whatever the non-rt poller caused is the rt poller's waits
    behind it; the poll sizes stay the module's counters (its pollers poll without
    napi:napi_poll), the non-rt one's within its quota.  Timings are emulated (TCG):
    nothing about how long a wait took is asserted.  About 90 s, most of it bpftrace's
    start (60-70 s under this load; kbp.pollertrace.START_TIMEOUT_S)."""
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not in this guest image (kbpctl status --trace needs it)")
    secs = 4
    with ktn_device(queues=2, cpus=QUEUES_HERE, rate=2000) as dev:
        kmod.attach(flow.t.nic0, cpu=POLL_CPU, mode="hybrid", rt_prio=50)
        kmod.attach(dev, cpu=POLL_CPU, mode="hybrid", cls="non-rt")
        flow.start_sink()
        flow.start_sender(rate=300)
        try:
            st = json.loads(kbpctl("status", "--json", "--trace", str(secs)).stdout)
        finally:
            sent = flow.stop_sender()
        assert sent and sent["sent"] > 0, sent
        assert st["trace"]["error"] is None and st["trace"]["seconds"] == secs, st["trace"]
        (pc,) = [c for c in st["polling_cpus"] if c["cpu"] == POLL_CPU]
        by = {p["class"]: p for p in pc["pollers"]}
        rt, nrt = by["rt"]["load"], by["non-rt"]["load"]
        print("trace:", json.dumps({"rt": rt, "non-rt": nrt}))   # what it saw (-s shows it)
        assert st["trace"]["threads"] >= 2, st["trace"]
        assert rt["traced_s"] == secs and nrt["traced_s"] == secs
        assert rt["traced_wakeups"] > 0, rt
        assert 1 <= nrt["packets_per_poll"] <= 8 and nrt["quota"] == 8, nrt
        behind = rt["waited_behind"]
        assert behind and sum(b["waits"] for b in behind) <= rt["traced_wakeups"], rt
        assert all(b["max_us"] >= 0 and b["comm"] for b in behind), behind
        kbpn = [b for b in behind if b["pid"] == by["non-rt"]["pid"]]
        caused = nrt.get("caused") or {"waits": 0}
        if kbpn:              # the one rt thread here: what kbpn caused is its waits behind it
            assert caused["waits"] == kbpn[0]["waits"], (caused, behind)
        else:                 # not among the top entries: none, or the list is full
            assert caused["waits"] == 0 or len(behind) == TOP_BEHIND, (caused, behind)


def test_non_rt_class_refusals(kmod, topo: Topo) -> None:
    """What a non-rt poller cannot be, refused with the reason before anything changes."""
    nic = topo.nic0
    refused(kmod, errno.EINVAL, "hybrid only",
            lambda: kmod.attach(nic, cpu=POLL_CPU, mode="busy", cls="non-rt"))
    refused(kmod, errno.EINVAL, "hybrid only",
            lambda: kmod.attach(nic, cpu=POLL_CPU, mode="periodic", cls="non-rt"))
    refused(kmod, errno.EINVAL, "SCHED_NORMAL",
            lambda: kmod.attach(nic, cpu=POLL_CPU, mode="hybrid", cls="non-rt", rt_prio=50))
    refused(kmod, errno.EINVAL, "freq_ctl",
            lambda: kmod.attach(nic, cpu=POLL_CPU, mode="hybrid", cls="non-rt",
                                freq_ctl=True))
    refused(kmod, errno.EINVAL, "non-rt poller only",
            lambda: kmod.attach(nic, cpu=POLL_CPU, mode="hybrid", nice=5))
    refused(kmod, errno.ERANGE, "nice 20 out of range",
            lambda: kmod.attach(nic, cpu=POLL_CPU, cls="non-rt", nice=20))
    refused(kmod, errno.EINVAL, "unknown class 7",
            lambda: kmod.attach(nic, cpu=POLL_CPU, cls=7))
    refused(kmod, errno.EINVAL, "hybrid only",
            lambda: kmod.poller_set(POLL_CPU, mode="periodic", cls="non-rt"))
    # poller-set of the non-rt poller: its knobs are its own, the rt one's stay
    kmod.attach(nic, cpu=POLL_CPU, mode="hybrid")
    rt_conf = pollers_on(kmod, POLL_CPU)["rt"]
    kmod.detach(nic)
    # a stopped poller is listed until its thread has left kbp's code (conftest's
    # detach_all waits the same way); under TCG that can outlast the next attach
    wait_for(lambda: "rt" not in pollers_on(kmod, POLL_CPU), 10,
             what="the rt poller to stop after its last device left")
    kmod.poller_set(POLL_CPU, cls="non-rt", nice=3, quota=4)
    kmod.attach(nic, cpu=POLL_CPU, cls="non-rt")
    p = pollers_on(kmod, POLL_CPU)
    assert set(p) == {"non-rt"} and (p["non-rt"].mode, p["non-rt"].nice,
                                      p["non-rt"].quota) == ("hybrid", 3, 4), p
    kmod.detach(nic)
    kmod.attach(nic, cpu=POLL_CPU, mode="hybrid")
    again = pollers_on(kmod, POLL_CPU)["rt"]
    assert (again.quota, again.nice, again.rt_prio) == (rt_conf.quota, 0, rt_conf.rt_prio)


def test_non_rt_poller_gives_way_between_polls(kmod) -> None:
    """A SCHED_FIFO task woken on the CPU (the rt poller's case) takes it from a busy
    non-rt poller at the end of its current poll: the poller counts gave_way.  Under full
    and lazy preemption local_bh_enable() switches first and the count stays ~0, so the
    count is asserted only where the kernel does not preempt kernel code."""
    from kbp import sysinfo
    model = preemption_model()
    if model not in sysinfo.NON_PREEMPTIBLE:
        pytest.skip(reason=f"preemption model {model}: the poll is preempted at "
                    "local_bh_enable(), before kbp's own check (nothing to count)")
    # Busy by the frames' cost, not by their rate: 2 x 4000 frames/s of 20 us each keep
    # the poller in a poll ~16 % of the time. (4 queues at 20,000/s each made the test
    # NIC's hrtimers alone fill the CPU under TCG on a loaded host: the CI of 2026-11-26
    # saw the poller carry nothing for 30 s.)
    with ktn_device(queues=2, cpus=QUEUES_HERE, rate=4000, cost_ns=20000) as dev:
        kmod.attach(dev, cpu=POLL_CPU, cls="non-rt")
        kbp_carries(dev)
        ticker = subprocess.Popen(
            ["chrt", "-f", "10", "taskset", "-c", str(POLL_CPU), "python3", "-c",
             "import time\nwhile True: time.sleep(0.0005)"])
        try:
            a = pollers_on(kmod, POLL_CPU)["non-rt"]
            wait_for(lambda: pollers_on(kmod, POLL_CPU)["non-rt"].gave_way > a.gave_way + 20,
                     30, what="the non-rt poller to give way to the FIFO ticker")
        finally:
            ticker.kill()
            ticker.wait()
        assert_in_order(dev)


@pytest.mark.parametrize("cls", [pytest.param("non-rt", marks=pytest.mark.smoke), "rt"])
def test_attach_under_a_saturating_load_takes_the_napis_over(kmod, cls: str) -> None:
    """A load that fills the CPU keeps the NAPIs in softirq: every poll uses its whole
    budget, so a NAPI never completes and never comes back through the hardIRQ path that
    reaches kbp.  Before kbp asked the softirq to let go (PREFER_BUSY_POLL, counted as
    takeovers) the attach succeeded and kbp carried nothing until the load paused
    (issue 24).  2 queues x 3000 frames/s x 200 us each ask for 1.2 CPUs of POLL_CPU."""
    rate = Path("/sys/module/kbp_test_nic/parameters/rate")
    with ktn_device(queues=2, cpus=QUEUES_HERE, rate=3000, cost_ns=200000) as dev:
        s0 = total("by_softirq", dev)
        wait_for(lambda: total("by_softirq", dev) > s0 + 1000, 30,
                 what="the saturating load to run in softirq")
        kmod.attach(dev, cpu=POLL_CPU, cls=cls)
        try:
            kbp_carries(dev, frames=300, timeout=20)
            p = pollers_on(kmod, POLL_CPU)[cls]
            assert p.takeovers >= 1, p
            assert {n.pid for n in kmod.device(dev).napis} == {p.pid}
        finally:
            rate.write_text("0")
        time.sleep(0.5)
        kmod.detach(dev)
        assert_in_order(dev)


def test_reclassified_under_traffic_loses_nothing(kmod) -> None:
    """rt -> non-rt -> rt while frames flow (what apply --watch does when a device crosses
    rtnet_prio): each detach hands the NAPIs back to softirq, no frame lost or reordered."""
    with ktn_device(queues=2, cpus=QUEUES_HERE, rate=4000) as dev:
        for cls in ("rt", "non-rt", "rt"):
            kmod.attach(dev, cpu=POLL_CPU, cls=cls)
            assert kmod.device(dev).cls == cls
            n0 = total("by_kbpn", dev)
            kbp_carries(dev, frames=200)
            kmod.detach(dev)
            assert (total("by_kbpn", dev) > n0) == (cls == "non-rt"), cls
        time.sleep(0.2)
        assert_in_order(dev)


def test_both_classes_through_cpu_offline_and_rmmod(kmod, topo: Topo) -> None:
    """Both pollers of a CPU under traffic: the CPU goes offline (both devices handed back,
    both pollers stopped), comes back (both attached again to their class), then rmmod:
    the same guarantees as for one poller, nothing lost."""
    if not Path(f"/sys/devices/system/cpu/cpu{POLL_CPU}/online").exists():
        pytest.skip(reason=f"CPU {POLL_CPU} cannot be offlined in this guest")
    with ktn_device(queues=2, cpus=QUEUES_HERE, rate=2000) as dev:
        kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid")
        kmod.attach(dev, cpu=POLL_CPU, cls="non-rt")
        kbp_carries(dev)
        cpu_online(POLL_CPU, False)
        try:
            wait_for(lambda: kmod.device(dev).napi_count == 0 and
                     kmod.device(topo.nic0).napi_count == 0, 10, what="both handed back")
            wait_for(lambda: not pollers_on(kmod, POLL_CPU), 10, what="both pollers stopped")
        finally:
            cpu_online(POLL_CPU, True)
        wait_for(lambda: hooked(kmod, dev, 2), 20, what="the test NIC attached again")
        assert set(pollers_on(kmod, POLL_CPU)) == {"rt", "non-rt"}
        assert kmod.device(dev).cls == "non-rt"
        kbp_carries(dev)
        rmmod_hands_back(dev)
