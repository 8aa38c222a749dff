"""Every bad request is refused with its own errno, one dmesg line, and no state left."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import (
    POLL_CPU,
    Topo,
    dmesg_lines,
    dmesg_since,
    kbp_threads,
    sh,
    threads_named,
)


@pytest.fixture()
def veth_nogro(kmod) -> Iterator[str]:
    """An up veth pair with GRO off: no NAPI instance."""
    sh("modprobe veth; ip link add kbpng0 type veth peer name kbpng1; "
       "ip link set kbpng0 up; ip link set kbpng1 up; "
       "ethtool -K kbpng0 gro off; ethtool -K kbpng1 gro off")
    yield "kbpng0"
    sh("ip link del kbpng0", check=False)


# NL_SET_ERR_MSG_FMT (formatted extack messages) came in Linux 6.2
FORMATTED_EXTACK = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2]) >= (6, 2)


def refused(kmod, code: int, text: str, fn: Callable[[], object],
            log: bool = True) -> str:
    """Run a request that must fail; check errno, extack, the dmesg line, no leftovers."""
    devices_before = [d.ifname for d in kmod.devices()]
    pollers_before = [p.cpu for p in kmod.pollers()]
    threads_before = sorted(kbp_threads())
    mark = len(dmesg_lines())
    with pytest.raises(kmod.KbpError) as exc:
        fn()
    err = exc.value
    assert err.errno == code, f"{err} (wanted {errno.errorcode[code]})"
    refusals = [ln for ln in dmesg_since(mark) if "kbp: refused:" in ln]
    if text.lower() not in err.message.lower():
        # before 6.2 extack has no formatted text: the caller gets the summary, the log
        # line the detail (kbp_tell_msg)
        assert not FORMATTED_EXTACK and log and len(refusals) == 1, (err.message, refusals)
        assert text.lower() in refusals[0].lower(), (err.message, refusals[0])
    if log:
        assert len(refusals) == 1, refusals
        # the whole text (6.2+, "kbp: " before it), or a summary: never the text cut at
        # extack's NETLINK_MAX_FMTMSG_LEN (80 bytes with the NUL).  A summary may be a
        # whole sentence that starts the text ("freq_ctl needs governor userspace").
        full = refusals[0].split("kbp: refused: ", 1)[1]
        msg = err.message.removeprefix("kbp: ")
        cut = msg != full and full.startswith(msg) and len("kbp: " + msg) >= 79
        assert not cut, (err.message, full)
    assert [d.ifname for d in kmod.devices()] == devices_before
    assert [p.cpu for p in kmod.pollers()] == pollers_before
    assert sorted(kbp_threads()) == threads_before
    return refusals[0] if refusals else ""


def test_unknown_device(kmod, topo: Topo) -> None:
    line = refused(kmod, errno.ENODEV, "no device",
                   lambda: kmod.attach("kbpnosuch0", cpu=POLL_CPU))
    assert "kbpnosuch0" in line


def test_device_without_napi(kmod, veth_nogro: str) -> None:
    line = refused(kmod, errno.EOPNOTSUPP, "NAPI",
                   lambda: kmod.attach(veth_nogro, cpu=POLL_CPU))
    assert veth_nogro in line


def test_cpu_out_of_range(kmod, topo: Topo) -> None:
    line = refused(kmod, errno.ERANGE, "CPU",
                   lambda: kmod.attach(topo.nic0, cpu=64))
    assert "64" in line


def test_cpu_offline(kmod, topo: Topo) -> None:
    online = Path(f"/sys/devices/system/cpu/cpu{POLL_CPU}/online")
    online.write_text("0")
    try:
        line = refused(kmod, errno.ENXIO, "offline",
                       lambda: kmod.attach(topo.nic0, cpu=POLL_CPU))
        assert f"CPU {POLL_CPU}" in line
    finally:
        online.write_text("1")


def test_queue_map_cpu_out_of_range(kmod, topo: Topo) -> None:
    refused(kmod, errno.ERANGE, "CPU",
            lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, queue_map={0: 4096}))


def test_queue_map_names_missing_napi(kmod, topo: Topo) -> None:
    line = refused(kmod, errno.EINVAL, "NAPI",
                   lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, queue_map={99: 0}))
    assert "#99" in line


@pytest.mark.parametrize(("mode", "code", "text"), [
    (7, errno.EINVAL, "unknown mode"),
    (0, errno.EINVAL, "unknown mode"),
])
def test_bad_mode(kmod, topo: Topo, mode: object, code: int, text: str) -> None:
    refused(kmod, code, text, lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, mode=mode))


@pytest.mark.parametrize(("knob", "value"), [("quota", 0), ("quota", 65),
                                             ("linger_us", 2_000_000)])
def test_knob_out_of_range(kmod, topo: Topo, knob: str, value: int) -> None:
    refused(kmod, errno.ERANGE, knob,
            lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, **{knob: value}))


def test_attach_twice(kmod, topo: Topo) -> None:
    kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid")
    line = refused(kmod, errno.EEXIST, "already attached",
                   lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid"))
    assert topo.nic0 in line


def test_detach_not_attached(kmod, topo: Topo) -> None:
    line = refused(kmod, errno.ENOENT, "not attached", lambda: kmod.detach(topo.nic0))
    assert topo.nic0 in line


def napi_kthreads(dev: str) -> list[str]:
    return threads_named(f"napi/{dev}-")


def wait_for_none(get: Callable[[], list[str]], timeout: float = 1.0) -> list[str]:
    """What ``get`` still returns after up to ``timeout`` s of waiting for it to be empty."""
    deadline = time.monotonic() + timeout
    while (left := get()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.smoke
def test_threaded_device(kmod, topo: Topo) -> None:
    """Refused while threaded NAPI is on; once it is off, its idle kthreads are reaped."""
    threaded = Path(f"/sys/class/net/{topo.nic0}/threaded")
    threaded.write_text("1")
    try:
        assert napi_kthreads(topo.nic0)
        refused(kmod, errno.EBUSY, "threaded", lambda: kmod.attach(topo.nic0, cpu=POLL_CPU))
    finally:
        threaded.write_text("0")
    # Up to 6.16 the kernel keeps the kthreads of a NAPI until it is deleted, and kbp stops
    # them at attach; from 6.17 turning threaded off stops them (napi_stop_kthread()), so
    # there is nothing left for kbp to reap (design.md section 7).
    kernel_stopped_them = not wait_for_none(lambda: napi_kthreads(topo.nic0))
    mark = len(dmesg_lines())
    dev = kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid")
    assert dev is not None and dev.napi_count
    assert not napi_kthreads(topo.nic0)
    reaped = any("stopping idle threaded-NAPI kthread" in ln for ln in dmesg_since(mark))
    assert reaped != kernel_stopped_them
    kmod.detach(topo.nic0)
    threaded.write_text("1")          # stock threaded NAPI still works afterwards
    try:
        assert napi_kthreads(topo.nic0)
    finally:
        threaded.write_text("0")


def test_knob_conflict_with_running_poller(kmod, topo: Topo) -> None:
    sh("modprobe veth; ip link add kbpcf0 type veth peer name kbpcf1; "
       "ethtool -K kbpcf0 gro on; ip link set kbpcf0 up; ip link set kbpcf1 up")
    try:
        kmod.attach("kbpcf0", cpu=POLL_CPU, mode="busy")
        refused(kmod, errno.EBUSY, "other",
                lambda: kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid"))
        # the same knobs share the CPU: a poller each (one per device), its knobs
        kmod.attach(topo.nic0, cpu=POLL_CPU, mode="busy")
        ps = kmod.pollers()
        assert sorted(p.ifname for p in ps) == sorted(["kbpcf0", topo.nic0]), ps
        assert {(p.cpu, p.mode) for p in ps} == {(POLL_CPU, "busy")}, ps
        refused(kmod, errno.EINVAL, "name the device", lambda: kmod.poller(POLL_CPU),
                log=False)
        assert kmod.poller(POLL_CPU, dev=topo.nic0).ifname == topo.nic0
    finally:
        sh("ip link del kbpcf0", check=False)


def test_knobs_checked_for_a_device_that_is_down(kmod, topo: Topo) -> None:
    """A device that is down gets its CPUs from its NAPIs' IRQs when it comes up; the
    knobs that do not depend on the CPU are checked now all the same.  Before, a down
    device skipped every check: ``--class non-rt --mode periodic`` (or busy, or rt_prio)
    was accepted, and at NETDEV_UP a periodic (busy, SCHED_FIFO) kbpn poller started."""
    sh(f"ip link set {topo.nic0} down")
    try:
        refused(kmod, errno.EINVAL, "hybrid only",
                lambda: kmod.attach(topo.nic0, cls="non-rt", mode="periodic"))
        refused(kmod, errno.EINVAL, "hybrid only",
                lambda: kmod.attach(topo.nic0, cls="non-rt", mode="busy"))
        refused(kmod, errno.EINVAL, "SCHED_NORMAL",
                lambda: kmod.attach(topo.nic0, cls="non-rt", rt_prio=50))
        refused(kmod, errno.EINVAL, "non-rt poller only",
                lambda: kmod.attach(topo.nic0, mode="hybrid", nice=5))
    finally:
        sh(f"ip link set {topo.nic0} up")
    assert not kmod.pollers() and not kbp_threads()


def test_not_admin(kmod, topo: Topo) -> None:
    """Without CAP_NET_ADMIN every command is refused (EPERM) before it is looked at."""
    code = ("import sys; from kbp import kmod\n"
            "try:\n    kmod.pollers()\nexcept kmod.KbpError as e:\n    sys.exit(e.errno)\n")
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "--inh-caps=-all", sys.executable, "-c", code],
                       capture_output=True, text=True, env={"PYTHONPATH": ":".join(sys.path)})
    assert p.returncode == errno.EPERM, p.stderr
