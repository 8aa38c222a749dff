"""Other tasks on polling CPUs (``kbpctl status``): a fake /proc tree, then this host's /proc.

A busy poller owns its CPU, so status lists, for each polling CPU, the user tasks pinned to
it (Cpus_allowed_list is exactly that CPU) or runnable on it (stat state R, field 39
``processor``), and the kernel threads runnable on it; sleeping per-CPU kernel threads
(ksoftirqd/N, migration/N, ...) are left out, and so are the polling threads and kbpctl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbp import backends, kmod, sysinfo
from kbp.backends import DeviceStatus, NapiStatus, PollerStatus, PollingCpu, Status
from kbp.backends import kmod as kmod_backend
from kbp.backends import stock as stock_backend
from kbp.render import cpu_poller_lines, status_view
from kbp.sysinfo import FreqReport, Host
from kbp.system.journal import StateDir

from .conftest import make_host


def stat_line(tid: int, comm: str, state: str, cpu: int, flags: int = 0, prio: int = 0,
              policy: int = 0) -> str:
    """A /proc/PID/stat line: fields 3..52 after ``pid (comm)``."""
    f = ["0"] * 50
    f[0], f[1], f[6], f[19] = state, "1", str(flags), "100"
    f[36], f[37], f[38] = str(cpu), str(prio), str(policy)
    return f"{tid} ({comm}) {' '.join(f)}\n"


def add_task(host: Host, pid: int, comm: str, state: str, cpu: int, allowed: str,
             tid: int | None = None, kthread: bool = False, prio: int = 0) -> None:
    d = host.proc / str(pid) / "task" / str(tid or pid)
    d.mkdir(parents=True, exist_ok=True)
    flags = sysinfo.PF_KTHREAD if kthread else 0
    policy = os.SCHED_FIFO if prio else os.SCHED_OTHER
    (d / "stat").write_text(stat_line(tid or pid, comm, state, cpu, flags, prio, policy))
    (d / "status").write_text(f"Name:\t{comm}\nState:\t{state}\nCpus_allowed:\tf\n"
                              f"Cpus_allowed_list:\t{allowed}\nvoluntary_ctxt_switches:\t1\n")


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = make_host(tmp_path, online="0-3", possible="0-3")
    add_task(h, 100, "memcached", "S", 3, "3")                   # pinned, sleeping
    add_task(h, 100, "mc-worker", "R", 3, "3", tid=101)          # pinned thread, runnable
    add_task(h, 200, "make", "R", 3, "0-3")                      # runnable there now
    add_task(h, 201, "make", "R", 1, "0-3")                      # runnable elsewhere
    add_task(h, 202, "sshd", "S", 3, "0-3")                      # may run there, sleeps
    add_task(h, 203, "pinned-zombie", "Z", 3, "3")
    add_task(h, 300, "ksoftirqd/3", "R", 3, "3", kthread=True)   # runnable: waiting
    add_task(h, 301, "migration/3", "S", 3, "3", kthread=True, prio=99)
    add_task(h, 302, "kworker/3:1", "I", 3, "3", kthread=True)
    add_task(h, 303, "rcuc/3", "R", 3, "3", kthread=True, prio=1)
    add_task(h, 400, "kbp/3", "R", 3, "3", kthread=True, prio=50)  # the poller
    add_task(h, 500, "app", "S", 2, "2")                         # pinned to a non-polling CPU
    (h.proc / "self").mkdir()                                    # not a pid: ignored
    return h


def test_tasks_on_a_polling_cpu(host: Host) -> None:
    got = sysinfo.tasks_on_cpus([3], exclude=[400], host=host)
    assert list(got) == [3]
    rows = [(t.pid, t.tid, t.comm, t.state, t.pinned, t.kthread) for t in got[3]]
    assert rows == [
        (100, 100, "memcached", "S", True, False),
        (100, 101, "mc-worker", "R", True, False),
        (200, 200, "make", "R", False, False),
        (300, 300, "ksoftirqd/3", "R", True, True),
        (303, 303, "rcuc/3", "R", True, True),
    ]
    rcuc = got[3][-1]
    assert (rcuc.policy, rcuc.priority) == ("SCHED_FIFO", 1)


def test_exclude_by_pid_or_tid_and_several_cpus(host: Host) -> None:
    got = sysinfo.tasks_on_cpus([1, 3], exclude=[100, 400, 300, 303, 200], host=host)
    assert {c: [t.tid for t in ts] for c, ts in got.items()} == {1: [201], 3: []}
    got = sysinfo.tasks_on_cpus([3], exclude=[101], host=host)
    assert 101 not in [t.tid for t in got[3]] and 100 in [t.tid for t in got[3]]


def test_vanished_and_unreadable_tasks_are_skipped(host: Host) -> None:
    (host.proc / "100/task/100/status").unlink()     # gone between stat and status
    (host.proc / "100/task/101/status").unlink()     # runnable there: listed, pinned unknown
    (host.proc / "600/task").mkdir(parents=True)       # a process whose threads are gone
    (host.proc / "200/task/200/stat").write_text("garbage")
    got = sysinfo.tasks_on_cpus([3], exclude=[400], host=host)
    assert [(t.tid, t.pinned) for t in got[3]] == [(101, False), (300, True), (303, True)]


def test_allowed_cpus(tmp_path: Path) -> None:
    p = tmp_path / "status"
    p.write_text("Name:\tx\nCpus_allowed_list:\t0-2,5\n")
    assert sysinfo.allowed_cpus(p) == [0, 1, 2, 5]
    p.write_text("Name:\tx\n")
    assert sysinfo.allowed_cpus(p) is None
    assert sysinfo.allowed_cpus(tmp_path / "nope") is None


# -- in status: JSON and text ---------------------------------------------------------
def poller(cpu: int, pid: int, mode: str = "busy") -> PollerStatus:
    return PollerStatus(cpu=cpu, pid=pid, mode=mode, linger_us=0, quota=64, napis=1,
                        policy="SCHED_FIFO", priority=50,
                        counters={"yields": 7, "passes": 10}, freq_ctl=False)


def test_polling_cpus_leave_out_pollers_and_napi_threads(host: Host) -> None:
    thread = backends.ThreadStatus(pid=303, comm="rcuc/3", cpus=[3], last_cpu=3,
                                   policy="SCHED_FIFO", priority=1, counters={})
    dev = DeviceStatus(name="eth1", netns=None, ifindex=5, kind=None, backend="kmod",
                       mode="busy", napis=[NapiStatus(id=1, cpu=3, thread=thread)])
    unserved = DeviceStatus(name="eth0", netns=None, ifindex=2, kind=None, backend=None,
                            napis=[NapiStatus(id=2, cpu=1)])
    cpus = backends.polling_cpus([dev, unserved], [poller(3, 400)], host)
    assert [(c.cpu, c.busy) for c in cpus] == [(3, True)]
    assert [t.tid for t in cpus[0].tasks] == [100, 101, 200, 300]
    assert backends.polling_cpus([unserved], [], host) == []
    hybrid = backends.polling_cpus([], [poller(3, 400, "hybrid")], host)
    assert not hybrid[0].busy


def a_status(cpus: list[PollingCpu]) -> Status:
    return Status(kernel="6.12.0", auto="kmod", backends={}, devices=[],
                  pollers=[poller(3, 400)], cpufreq=FreqReport(False, [], "no cpufreq"),
                  polling_cpus=cpus)


def render(st: Status) -> str:
    from rich.console import Console
    con = Console(width=250, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    con.print(status_view(st))
    return con.export_text()


def test_status_json_and_text_show_the_tasks(host: Host) -> None:
    cpus = backends.polling_cpus([], [poller(3, 400)], host)
    st = a_status(cpus)
    js = json.loads(json.dumps(st.to_json()))
    (pc,) = js["polling_cpus"]
    assert pc["cpu"] == 3 and pc["busy"] is True
    assert pc["tasks"][0] == {"pid": 100, "tid": 100, "comm": "memcached", "state": "S",
                              "pinned": True, "kthread": False, "policy": "SCHED_OTHER",
                              "priority": 0}
    assert js["pollers"][0]["counters"]["yields"] == 7
    text = render(st)
    assert "other tasks on polling CPUs" in text
    assert "100/101" in text and "mc-worker" in text and "[ksoftirqd/3]" in text
    assert "pinned, runnable here" in text and "3 (busy)" in text
    assert "yields" in text
    assert "! CPU 3: a busy poller owns it; 3 other tasks there run only when it yields" in text


def test_status_text_says_when_no_task_competes() -> None:
    text = render(a_status([PollingCpu(cpu=3, busy=True), PollingCpu(cpu=5, busy=False)]))
    assert "polling CPUs 3,5: no other task is pinned to them or runnable on them" in text
    assert "busy poller owns it" not in text


# -- on this host's /proc -------------------------------------------------------------
@pytest.fixture
def spinner() -> Iterator[tuple[int, int]]:
    """A child busy-looping pinned to the last CPU this process may use: (pid, cpu)."""
    cpu = max(os.sched_getaffinity(0))
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                         preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        yield p.pid, cpu
    finally:
        p.kill()
        p.wait()


def test_a_pinned_spinner_shows_up_on_this_host(spinner: tuple[int, int],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pid, cpu = spinner
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until it runs its loop (pinned from the start)
        st = sysinfo.read_stat(pid)
        if st is not None and st.comm.startswith("python"):
            break
        time.sleep(0.05)

    class Module:  # a synthetic poller on the spinner's CPU, nothing attached
        def close(self) -> None:
            pass

        def devices(self) -> list[kmod.Device]:
            return []

        def pollers(self) -> list[kmod.Poller]:
            return [kmod.Poller(cpu=cpu, pid=None, mode="busy", rt_prio=50)]

    real = kmod_backend.KmodBackend
    monkeypatch.setattr(kmod_backend, "KmodBackend",
                        lambda state=None: real(state=state, client=Module))
    monkeypatch.setattr(stock_backend.StockBackend, "describe",
                        lambda self, *a, **k: ([], []))
    st = backends.status(state=StateDir(tmp_path))
    (pc,) = st.polling_cpus
    assert pc.cpu == cpu and pc.busy
    mine = [t for t in pc.tasks if t.pid == pid]
    assert mine and mine[0].pinned and not mine[0].kthread
    assert os.getpid() not in {t.pid for t in pc.tasks}


def test_polling_cpus_say_each_classes_poll_sizes_and_waits(host: Host) -> None:
    """kbpctl status, per polling CPU: the module's counters (packets per poll against the
    quota, wake-up-to-running delays, gave_way) and the scheduler's run_delay per run for
    every polling thread, stock NAPI threads included."""
    for pid, stat in ((400, "9000000 3000000 1500\n"), (401, "5000000 45000000 1000\n"),
                      (303, "1000 2000000 400\n")):
        (host.proc / str(pid)).mkdir(exist_ok=True)
        (host.proc / str(pid) / "schedstat").write_text(stat)
    rt = PollerStatus(cpu=3, pid=400, mode="hybrid", linger_us=0, quota=64, napis=1,
                      policy="SCHED_FIFO", priority=50, device="eth1",
                      counters={"packets": 1901, "wakeups": 1901,
                                "wake_delay_ns": 22_812_000, "wake_delay_max_ns": 1_436_000})
    nrt = PollerStatus(cpu=3, pid=401, mode="hybrid", linger_us=0, quota=8, napis=2,
                       policy="SCHED_OTHER", priority=0, cls="non-rt", device="eth2",
                       counters={"packets": 78_000, "gave_way": 3_858,
                                 "wakeups": 0, "wake_delay_ns": 0})

    def napi(i: int, pid: int, packets: int, polls: int) -> NapiStatus:
        return NapiStatus(id=i, cpu=3, counters={"packets": packets, "polls": polls},
                          thread=backends.ThreadStatus(pid=pid, comm="", cpus=[3], last_cpu=3,
                                                       policy=None, priority=None, counters={}))
    # the module counts polls per NAPI: a poller's poll size is over the NAPIs it polls
    rt_dev = DeviceStatus(name="eth1", netns=None, ifindex=5, kind=None, backend="kmod",
                          napis=[napi(1, 400, 1901, 1901)])
    nrt_dev = DeviceStatus(name="eth2", netns=None, ifindex=6, kind=None, backend="kmod",
                           napis=[napi(2, 401, 40_000, 5_000), napi(3, 401, 38_000, 4_875),
                                  napi(4, 999, 5, 5)])
    thread = backends.ThreadStatus(pid=303, comm="napi/eth3-7", cpus=[3], last_cpu=3,
                                   policy="SCHED_OTHER", priority=0, counters={})
    stock = DeviceStatus(name="eth3", netns=None, ifindex=7, kind=None, backend="stock",
                         mode="hybrid", cls="non-rt", napis=[NapiStatus(id=7, cpu=3,
                                                                        thread=thread)])
    (pc,) = backends.polling_cpus([rt_dev, nrt_dev, stock], [rt, nrt], host)
    # each module poller by its thread's name: per CPU, class and device (kbp_poller.c)
    loads = {p.comm: p.load for p in pc.pollers}
    rt_load, nrt_load = loads["kbp/3:eth1"], loads["kbpn/3:eth2"]
    assert rt_load.packets_per_poll == 1.0 and rt_load.quota == 64
    assert rt_load.wake_delay_mean_us == 12.0 and rt_load.wake_delay_max_us == 1436.0
    assert rt_load.wait_mean_us == 2.0 and rt_load.runs == 1500
    assert nrt_load.packets_per_poll == 7.899 and nrt_load.gave_way == 3858
    assert nrt_load.wake_delay_mean_us is None       # never woken: no mean
    assert loads["napi/eth3-7"].packets_per_poll is None    # the kernel does not count it
    assert loads["napi/eth3-7"].wait_mean_us == 5.0
    js = json.loads(json.dumps(a_status([pc]).to_json()))
    got = {p["comm"]: p["load"] for p in js["polling_cpus"][0]["pollers"]}
    assert got["kbpn/3:eth2"]["packets_per_poll"] == 7.899
    assert got["kbp/3:eth1"]["quota"] == 64
    assert [p["devices"] for p in js["polling_cpus"][0]["pollers"]] == [
        ["eth1"], ["eth3"], ["eth2"]]                     # rt first, then by pid
    lines = [t.plain for t in cpu_poller_lines([pc])]
    assert lines[1] == ("  rt kbp/3:eth1: 1.0 packets per poll (quota 64); wake-up to running "
                        "12.0 us mean, 1,436.0 us max over 1,901 wake-ups; runnable but "
                        "waiting 2.0 us per run (schedstat, 1,500 runs)")
    assert lines[3] == ("  non-rt kbpn/3:eth2: 7.9 packets per poll (quota 8), gave way 3,858 "
                        "times; runnable but waiting 45.0 us per run (schedstat, 1,000 runs)")
    assert lines[2] == ("  non-rt napi/eth3-7: runnable but waiting 5.0 us per run "
                        "(schedstat, 400 runs)")
    assert "packets per poll" in render(a_status([pc]))
