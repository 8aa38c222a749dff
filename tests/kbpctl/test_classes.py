"""Poller classes in kbpctl (issue 24): --class rt|non-rt and --nice, their refusals, the
journal, the stock backend's non-rt (SCHED_OTHER NAPI threads at a nice, changed in place),
status (class per device and poller, the preemption model) and the [rt_class] rule's
non_rt = "poll".

The refusals and the pure parts run anywhere; the stock backend's round trip runs on a
netns + veth testbed of this machine's kernel (root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kbp import cli, config, names, rtclass, sysinfo
from kbp.backends import (
    CpuPoller,
    DeviceStatus,
    EnableRequest,
    NapiStatus,
    PollingCpu,
    Status,
    ThreadStatus,
    changed_settings,
    check_nice_capability,
    deferred_pids,
    preempt_notes,
    stock,
    validate_common,
)
from kbp.backends.stock import StockBackend
from kbp.errors import InvalidInput, NotRoot
from kbp.problems import PREEMPT, Problem
from kbp.render import cpu_poller_lines, preempt_lines
from kbp.sysinfo import FreqReport, PreemptModel
from kbp.system.journal import Change, Record

from .conftest import make_host, netns_skip_reason

if TYPE_CHECKING:
    from .test_integration import Bed

HYBRID_ONLY = ("the non-rt poller is hybrid only: it sleeps when idle and gives way to the "
               "RT poller; use --mode hybrid")


# -- refusals -------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "msg"), [
    (["--class", "non-rt", "--mode", "busy"], HYBRID_ONLY),
    (["--class", "non-rt", "--mode", "periodic"], HYBRID_ONLY),
    (["--class", "non-rt", "--rt-prio", "50"],
     "--class non-rt with --rt-prio 50: non-rt pollers run SCHED_NORMAL; drop --rt-prio or "
     "use --nice"),
    (["--nice", "5"], "--nice 5 applies to --class non-rt only"),
    (["--class", "rt", "--nice", "0"], "drop --nice or add --class non-rt"),
    (["--class", "non-rt", "--nice", "20"], "--nice 20 is out of range (-20..19)"),
    (["--class", "non-rt", "--nice", "-21"], "--nice -21 is out of range (-20..19)"),
    (["--class", "non-rt", "--freq-ctl"], "the CPU's frequency belongs to its rt poller"),
    (["--repoll-us", "20"], "--repoll-us 20 applies to --class non-rt only"),
    (["--class", "non-rt", "--repoll-us", "1001"],
     "--repoll-us 1001 is out of range (0..1000; 0 leaves the heavy NAPIs' deferral as it is)"),
    (["--class", "non-rt", "--repoll-us", "-1"], "--repoll-us -1 is out of range"),
    (["--class", "non-rt", "--repoll-us", "20", "--backend", "kmod"],
     "--repoll-us is a knob of the stock backend's non-rt class"),
])
def test_enable_refuses_with_the_reason_and_the_fix(argv: list[str], msg: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any backend is picked or anything is read (exit 2)."""
    assert cli.main(["enable", "eth1", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_unknown_class_is_refused_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["enable", "eth1", "--class", "bulk"])
    assert exit_.value.code == 2
    assert "invalid choice: 'bulk'" in capsys.readouterr().err
    with pytest.raises(InvalidInput, match=r"unknown class 'bulk': use --class rt or non-rt"):
        validate_common(EnableRequest(["eth1"], cls="bulk"))
    with pytest.raises(InvalidInput, match=r"device\[0\]\.class: unknown class 'bulk'"):
        config.parse('[[device]]\nname = "eth1"\nclass = "bulk"\n')


def test_stock_non_rt_takes_no_linger() -> None:
    req = EnableRequest(["eth1"], cls=names.CLASS_NON_RT, linger_us=20).resolved("stock")
    with pytest.raises(InvalidInput, match=r"stock non-rt NAPI threads do not linger.*drop "
                                           r"--linger-us"):
        StockBackend()._check_static(req)


# -- the request and its journal ------------------------------------------------------
@pytest.mark.parametrize("backend", ["stock", "kmod"])
def test_non_rt_resolves_to_sched_normal_and_journals_class_and_nice(backend: str) -> None:
    req = EnableRequest(["eth1"], cls=names.CLASS_NON_RT).resolved(backend)
    assert (req.rt_prio, req.nice) == (0, 0)
    assert req.settings()["class"] == "non-rt" and req.settings()["nice"] == 0
    validate_common(req)  # rt_prio 0 is fine for non-rt on every backend
    assert EnableRequest(["eth1"], cls="non-rt", nice=-3).resolved(backend).settings()[
        "nice"] == -3


def test_rt_journals_as_before_the_classes() -> None:
    """Journals written before the classes stay in sync: rt adds no key."""
    rt = EnableRequest(["eth1"], cpus=[1]).resolved("stock").settings()
    assert "class" not in rt and "nice" not in rt
    old = dict(rt)  # what an older kbpctl journaled
    assert changed_settings(old, rt) == []


def test_a_class_change_is_a_change_both_ways() -> None:
    rt0 = EnableRequest(["eth1"], rt_prio=0).resolved("kmod").settings()
    non_rt = EnableRequest(["eth1"], cls="non-rt").resolved("kmod").settings()
    assert changed_settings(non_rt, rt0) == ["class", "nice"]   # journaled non-rt, want rt
    assert changed_settings(rt0, non_rt) == ["class", "nice"]
    nice5 = EnableRequest(["eth1"], cls="non-rt", nice=5).resolved("kmod").settings()
    assert changed_settings(non_rt, nice5) == ["nice"]
    # --repoll-us: journaled only when given, so older journals stay in sync
    assert "repoll_us" not in non_rt
    r50 = EnableRequest(["eth1"], cls="non-rt", repoll_us=50).resolved("stock").settings()
    assert r50["repoll_us"] == 50 and changed_settings(non_rt, r50) == ["repoll_us"]


def test_config_class_and_nice() -> None:
    cfg = config.parse('[defaults]\ncpus = "1"\n[[device]]\nname = "eth1"\n'
                       '[[device]]\nname = "eth2"\nclass = "non-rt"\nnice = 5\n')
    a, b = (d.request() for d in cfg.devices)
    assert (a.cls, a.nice) == ("rt", None)
    assert (b.cls, b.nice, b.cpus) == ("non-rt", 5, [1])
    cfg = config.parse('[[device]]\nname = "eth2"\nclass = "non-rt"\nrepoll_us = 0\n')
    assert cfg.devices[0].request().repoll_us == 0


# -- CAP_SYS_NICE ---------------------------------------------------------------------
def _status_file(tmp_path: Path, cap_eff: int) -> Path:
    p = tmp_path / "status"
    p.write_text(f"Name:\tkbpctl\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff:016x}\n")
    return p


def test_negative_nice_needs_cap_sys_nice(tmp_path: Path) -> None:
    without = _status_file(tmp_path, (1 << 12) | (1 << 21))  # NET_ADMIN, SYS_ADMIN only
    req = EnableRequest(["eth1"], cls="non-rt", nice=-5)
    with pytest.raises(NotRoot, match=r"--nice -5 raises the pollers' priority, which needs "
                                      r"CAP_SYS_NICE.*use --nice 0 or above"):
        check_nice_capability(req, without)
    check_nice_capability(EnableRequest(["eth1"], cls="non-rt", nice=0), without)
    check_nice_capability(EnableRequest(["eth1"], cls="non-rt", nice=19), without)
    check_nice_capability(req, _status_file(tmp_path, 1 << sysinfo.CAP_SYS_NICE))
    assert sysinfo.has_capability(23, tmp_path / "absent") is None
    check_nice_capability(req, tmp_path / "absent")  # unknown: the kernel decides


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="dropping a capability needs root and setpriv")
def test_without_cap_sys_nice_kbpctl_refuses_a_negative_nice() -> None:
    """A process without CAP_SYS_NICE (a container with CAP_NET_ADMIN only): refused before
    anything is looked at, exit 77; nice 0 and above pass that check."""
    drop = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", "--"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([*drop, sys.executable, "-m", "kbp.cli", "enable", "kbpnone0",
                        "--class", "non-rt", "--nice", "-5"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 77, p.stderr
    assert "needs CAP_SYS_NICE" in p.stderr
    p = subprocess.run([*drop, sys.executable, "-m", "kbp.cli", "enable", "kbpnone0",
                        "--class", "non-rt", "--nice", "5", "--backend", "stock"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert "CAP_SYS_NICE" not in p.stderr and "no device kbpnone0" in p.stderr


# -- the preemption model -------------------------------------------------------------
def test_preempt_model_from_debugfs_then_uname(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    plain = "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1"
    assert sysinfo.preempt_model(host, plain) == PreemptModel(sysinfo.PREEMPT_UNKNOWN,
                                                              "uname -v")
    assert sysinfo.preempt_model(host, "#1 SMP PREEMPT_RT Debian").model == "rt"
    assert sysinfo.preempt_model(host, "#1 SMP PREEMPT Tue").model == "full"
    assert sysinfo.preempt_model(host, "#1 SMP Tue").model == sysinfo.PREEMPT_UNKNOWN
    dbg = host.sys / "kernel/debug/sched"
    dbg.mkdir(parents=True)
    (dbg / "preempt").write_text("none (voluntary) full lazy\n")
    m = sysinfo.preempt_model(host, plain)
    assert m == PreemptModel("voluntary", "debugfs") and not m.preempts_kernel
    (dbg / "preempt").write_text("none voluntary full (lazy)\n")
    assert sysinfo.preempt_model(host, plain).preempts_kernel


def _cpu(cpu: int, *pollers: tuple[str, str]) -> PollingCpu:
    return PollingCpu(cpu, False, [], [CpuPoller(cls, backend, 10 + i, f"t{i}", None, None, None)
                                        for i, (cls, backend) in enumerate(pollers)])


def test_preempt_note_only_for_stock_rt_and_non_rt_on_one_cpu_without_preemption() -> None:
    both = _cpu(1, ("rt", "stock"), ("non-rt", "stock"))
    cpus = [both, _cpu(2, ("rt", "stock")), _cpu(3, ("rt", "kmod"), ("non-rt", "kmod"))]
    (note,) = preempt_notes(PreemptModel("none", "debugfs"), cpus)
    assert note.kind == PREEMPT
    assert note.text.startswith("CPU 1: preemption model none: the rt NAPI thread t0 "
                                "(SCHED_FIFO) may wait for the non-rt thread t1 as long as "
                                "its NAPI keeps getting scheduled")
    assert "IRQ deferral, which --class non-rt sets, is off on it" in note.text
    # class non-rt's deferral on the non-rt thread's NAPIs (pid 11): one poll is left
    (note,) = preempt_notes(PreemptModel("none", "debugfs"), cpus, deferred={11})
    assert note.text.startswith("CPU 1: preemption model none: the rt NAPI thread t0 "
                                "(SCHED_FIFO) may wait for one poll (up to 64 packets) of "
                                "the non-rt thread t1: IRQ deferral makes it sleep")
    assert preempt_notes(PreemptModel("full", "debugfs"), cpus) == []


def test_deferred_pids_are_the_threads_of_napis_with_both_deferral_settings() -> None:
    def napi(pid: int, defer: int, gro_ns: int) -> NapiStatus:
        t = ThreadStatus(pid=pid, comm="", cpus=[1], last_cpu=1, policy=None, priority=None,
                         counters={})
        return NapiStatus(id=pid, cpu=1, thread=t, defer_hard_irqs=defer,
                          gro_flush_timeout_ns=gro_ns)
    dev = DeviceStatus(name="eth2", netns=None, ifindex=6, kind=None, backend="stock",
                       napis=[napi(1, 2, 20_000), napi(2, 0, 20_000), napi(3, 2, 0),
                              NapiStatus(id=4, cpu=1, defer_hard_irqs=2,
                                         gro_flush_timeout_ns=20_000)])
    assert deferred_pids([dev]) == {1}


def test_status_shows_classes_pollers_per_cpu_and_the_model() -> None:
    d = DeviceStatus("eth2", None, 3, None, "stock", cls="non-rt", nice=5)
    cpu = PollingCpu(1, False, [], [
        CpuPoller("rt", "kmod", 100, "kbp/1:eth0", "SCHED_FIFO", 50, 0, ["eth0"]),
        CpuPoller("non-rt", "stock", 101, "napi/eth2-9", "SCHED_OTHER", 0, 5, ["eth2"])])
    st = Status("6.18", "stock", {}, [d], [], FreqReport(False, [], ""), [cpu],
                preempt={"model": "none", "source": "debugfs", "preempts_kernel": False,
                         "notes": [Problem(PREEMPT, "CPU 1: ...")]})
    js = st.to_json()
    assert js["preempt"]["notes"] == ["CPU 1: ..."]   # the sentences, as before
    assert js["devices"][0]["class"] == "non-rt" and js["devices"][0]["nice"] == 5
    assert "cls" not in js["devices"][0]
    assert [p["class"] for p in js["polling_cpus"][0]["pollers"]] == ["rt", "non-rt"]
    assert js["preempt"]["model"] == "none"
    assert [t.plain for t in cpu_poller_lines([cpu])] == [
        "CPU 1 pollers: rt kbp/1:eth0 FIFO/50; non-rt napi/eth2-9 OTHER/0 nice 5 (eth2)"]
    lines = [t.plain for t in preempt_lines(st)]
    assert lines[0].startswith("preemption model: none (from debugfs)")
    assert lines[1] == "! CPU 1: ..."


# -- the [rt_class] rule: non_rt = "poll" ----------------------------------------------
BACKENDS = {"auto": "stock", "stock": "stock", "kmod": "kmod"}


def _cls(dev: str, rt: bool, irq_cpus: tuple[int, ...]) -> rtclass.DeviceClass:
    return rtclass.DeviceClass(dev, None, names.CLASS_RT if rt else names.CLASS_NON_RT,
                               f"{dev} is {'rt' if rt else 'non-rt'}", irq_cpus=irq_cpus)


def _rec(d: config.DeviceConfig, backend: str = "stock") -> Record:
    return Record(path=Path(f"/x/{d.name}"), backend=backend, dev=d.name, netns=d.netns,
                  ifindex=1, request=d.request().resolved(backend).settings(),
                  changes=[Change(1, "sysfs", {}, "0", "1")], complete=True)


RULE = '[rt_class]\nrtnet_prio = 51\n{extra}[defaults]\ncpus = "1"\nlinger_us = 20\n'


def test_rule_serves_non_rt_devices_on_rt_cpus_with_class_non_rt() -> None:
    cfg = config.parse(RULE.format(extra="nice = 3\n"))
    classes = [_cls("rt0", True, (1,)), _cls("heavy", False, (1,)),
               _cls("elsewhere", False, (0,)), _cls("veth0", False, ())]
    acts = {a.dev: a for a in config.plan(cfg, [], BACKENDS, {}, classes)}
    assert set(acts) == {"rt0", "heavy"}
    h = acts["heavy"]
    assert h.op == "enable" and h.why.startswith("non-rt class on CPU 1 (its queue interrupts "
                                                 "share it with an RT poller): heavy is non-rt")
    assert h.request is not None
    assert (h.request.cls, h.request.nice, h.request.cpus, h.request.rt_prio,
            h.request.linger_us, h.request.mode) == ("non-rt", 3, [1], 0, None, "hybrid")
    leave = config.parse(RULE.format(extra='non_rt = "leave"\n'))
    assert {a.dev for a in config.plan(leave, [], BACKENDS, {}, classes)} == {"rt0"}


def test_rule_reclassifies_a_device_crossing_rtnet_prio() -> None:
    cfg = config.parse(RULE.format(extra=""))
    as_non_rt = _rec(cfg.non_rt_device("eth1", None, [1]))
    up = config.plan(cfg, [as_non_rt], BACKENDS, {}, [_cls("eth1", True, (1,))])
    assert [(a.op, a.why) for a in up] == [("reenable", "class, linger_us, nice, rt_prio "
                                                        "changed")]
    as_rt = _rec(cfg.class_device("eth1", None))
    down = config.plan(cfg, [as_rt, _rec(cfg.class_device("rt0", None))], BACKENDS, {},
                       [_cls("eth1", False, (1,)), _cls("rt0", True, (1,))])
    assert {a.dev: a.op for a in down} == {"eth1": "reenable", "rt0": "keep"}


def test_rule_keys_are_checked() -> None:
    with pytest.raises(InvalidInput, match=r"rt_class\.non_rt 'drop': use \"poll\""):
        config.parse(RULE.format(extra='non_rt = "drop"\n'))
    with pytest.raises(InvalidInput, match=r"rt_class\.nice 20 is out of range \(-20\.\.19\)"):
        config.parse(RULE.format(extra="nice = 20\n"))
    rule = rtclass.RtClassRule(51, (), "poll", 4)
    assert rtclass.RtClassRule.from_json(rule.to_json()) == rule
    assert rtclass.RtClassRule.from_json({"rtnet_prio": 51, "netns": []}).non_rt == "leave"


def test_shares_rt_cpu() -> None:
    heavy = _cls("heavy", False, (0, 1))
    assert rtclass.shares_rt_cpu(heavy, {1}) == [0, 1]   # served where its IRQs land
    assert rtclass.shares_rt_cpu(heavy, {2}) == []
    assert rtclass.shares_rt_cpu(heavy, None) == [0, 1]  # an RT poller on every CPU
    assert rtclass.shares_rt_cpu(_cls("rt", True, (1,)), {1}) == []


# -- the stock backend on this kernel -------------------------------------------------
needs_netns = pytest.mark.skipif(netns_skip_reason() is not None,
                                 reason=netns_skip_reason() or "")


@needs_netns
@pytest.mark.netns
@pytest.mark.root
def test_stock_non_rt_round_trip_in_place_and_exact_restore() -> None:
    """A thread already SCHED_OTHER nice 3 on every CPU: non-rt at nice 7 on CPU 0, then
    rt and back to non-rt in place (the same thread, threaded NAPI never off, no packet
    lost), status, and disable puts nice 3 and the affinity back."""
    from kbp.netdev import NetdevClient, get_link
    from kbp.snapshot import snapshot
    from kbp.system import access

    from .test_integration import PING_CLIENT, PORT, new_bed

    with new_bed() as bed:
        ns, dev = bed.tb.server, bed.link.dev_b
        access.write(f"/sys/class/net/{dev}/threaded", "1\n", ns)

        def thread() -> sysinfo.TaskStat:
            link = get_link(dev, ns)
            assert link is not None
            with NetdevClient(ns) as c:
                (n,) = c.napis(link.ifindex)
            st = sysinfo.read_stat(n.pid)
            assert st is not None
            return st

        t0 = thread()
        os.setpriority(os.PRIO_PROCESS, t0.pid, 3)

        def deferral() -> tuple[int, int]:
            link = get_link(dev, ns)
            assert link is not None
            with NetdevClient(ns) as c:
                (n,) = c.napis(link.ifindex)
            return n.defer_hard_irqs, n.gro_flush_timeout

        # what the operator had set: class rt puts it back, disable too
        access.write(f"/sys/class/net/{dev}/gro_flush_timeout", "5000\n", ns)
        assert deferral() == (0, 5000)
        before = snapshot(dev, ns)
        bed.echo_server()
        out = bed.kbpctl("enable", dev, "--netns", ns, "--cpus", "0", "--class", "non-rt",
                         "--nice", "7").stdout
        assert "class non-rt, hybrid, re-polled every 20 us (IRQ deferral), 1 NAPI thread " \
               "on CPU 0, SCHED_NORMAL nice 7" in out
        assert deferral() == (stock.NON_RT_DEFER, stock.NON_RT_REPOLL_US * 1000)
        s = sysinfo.get_sched(t0.pid)
        assert (s.policy, s.priority, s.nice, s.cpus) == ("SCHED_OTHER", 0, 7, [0])
        (journal,) = bed.journals()
        begin = json.loads(journal.read_text().splitlines()[0])
        assert (begin["request"]["class"], begin["request"]["nice"]) == ("non-rt", 7)

        st = bed.status()
        d = next(x for x in st["devices"] if x["name"] == dev)
        assert (d["class"], d["nice"], d["rt_prio"], d["problems"]) == ("non-rt", 7, 0, [])
        assert d["napis"][0]["thread"]["nice"] == 7
        (pc,) = [c for c in st["polling_cpus"] if c["cpu"] == 0]
        assert [(p["class"], p["pid"]) for p in pc["pollers"]] == [("non-rt", t0.pid)]
        assert st["preempt"]["model"] == sysinfo.preempt_model().model

        pinger = access.popen([sys.executable, "-c", PING_CLIENT, bed.link.ip_b,
                                  str(PORT), "0", "60"], ns=bed.tb.client)
        try:
            out = bed.kbpctl("enable", dev, "--netns", ns, "--cpus", "0").stdout
            assert "class changed in place" in out
            s = sysinfo.get_sched(t0.pid)
            assert (s.policy, s.priority, s.nice, s.cpus) == ("SCHED_FIFO", 50, 3, [0])
            assert deferral() == (0, 5000)
            bed.kbpctl("enable", dev, "--netns", ns, "--cpus", "0", "--class", "non-rt",
                       "--nice", "7")
            assert deferral() == (stock.NON_RT_DEFER, stock.NON_RT_REPOLL_US * 1000)
        finally:
            pinger.send_signal(2)
            res, err = pinger.communicate(timeout=30)
        assert thread().pid == t0.pid  # threaded NAPI stayed on: the same thread throughout
        kinds = [json.loads(line).get("kind") for line in journal.read_text().splitlines()]
        # threaded was on already and stayed on; the class changes are policy and deferral
        # changes only (the NAPI's defer_hard_irqs and gro_flush_timeout each time)
        defer = ["napi", "napi"]
        assert kinds == [None, "affinity", "sched", *defer, "sched", *defer, "sched", *defer,
                         None]
        ping = json.loads(res)
        assert ping["ok"] > 0 and ping["lost"] == 0, (ping, err)
        assert sysinfo.get_sched(t0.pid).nice == 7

        bed.kbpctl("disable", dev, "--netns", ns)
        assert snapshot(dev, ns) == before
        s = sysinfo.get_sched(t0.pid)
        assert (s.policy, s.nice) == ("SCHED_OTHER", 3)
        assert deferral() == (0, 5000)


@needs_netns
@pytest.mark.netns
@pytest.mark.root
def test_stock_non_rt_repoll_us_zero_then_in_place_and_restore() -> None:
    """--repoll-us 0 leaves the operator's deferral as it is; --repoll-us 50 changes it in
    place (the same thread, journaled); disable puts the operator's values back."""
    from kbp.netdev import NetdevClient, get_link
    from kbp.system import access

    from .test_integration import new_bed

    with new_bed() as bed:
        ns, dev = bed.tb.server, bed.link.dev_b

        def deferral() -> tuple[int, int, int]:
            link = get_link(dev, ns)
            assert link is not None
            with NetdevClient(ns) as c:
                (n,) = c.napis(link.ifindex)
            return n.defer_hard_irqs, n.gro_flush_timeout, n.pid

        access.write(f"/sys/class/net/{dev}/napi_defer_hard_irqs", "1\n", ns)
        access.write(f"/sys/class/net/{dev}/gro_flush_timeout", "7000\n", ns)
        out = bed.kbpctl("enable", dev, "--netns", ns, "--cpus", "0", "--class", "non-rt",
                         "--repoll-us", "0").stdout
        assert "IRQ deferral left as found (--repoll-us 0)" in out
        defer, gro, pid = deferral()
        assert (defer, gro) == (1, 7000)
        out = bed.kbpctl("enable", dev, "--netns", ns, "--cpus", "0", "--class", "non-rt",
                         "--repoll-us", "50").stdout
        assert "re-polled every 50 us" in out and "--repoll-us changed in place" in out
        assert deferral() == (stock.NON_RT_DEFER, 50_000, pid)
        (journal,) = bed.journals()
        assert json.loads(journal.read_text().splitlines()[0])["request"]["repoll_us"] == 50
        bed.kbpctl("disable", dev, "--netns", ns)
        assert deferral()[:2] == (1, 7000)


@needs_netns
@pytest.mark.netns
@pytest.mark.root
def test_stock_rt_and_non_rt_on_one_cpu_status() -> None:
    """Both ends of a veth pair on CPU 0, one rt and one non-rt: status lists both pollers
    of CPU 0 with their class, rt first, and notes the wait where the model is none or
    voluntary."""
    from .test_integration import new_bed

    with new_bed() as bed:
        bed.kbpctl("enable", bed.link.dev_a, "--netns", bed.tb.client, "--cpus", "0")
        bed.kbpctl("enable", bed.link.dev_b, "--netns", bed.tb.server, "--cpus", "0",
                   "--class", "non-rt")
        st = bed.status()
        (pc,) = [c for c in st["polling_cpus"] if c["cpu"] == 0]
        assert [(p["class"], p["policy"]) for p in pc["pollers"]] == [
            ("rt", "SCHED_FIFO"), ("non-rt", "SCHED_OTHER")]
        notes = st["preempt"]["notes"]
        if st["preempt"]["preempts_kernel"]:
            assert notes == []
        else:
            (note,) = notes
            assert note.startswith("CPU 0: preemption model ")
            # class non-rt's IRQ deferral is on: one poll is what is left to wait for
            assert "may wait for one poll (up to 64 packets) of the non-rt thread" in note
        (d,) = [x for x in st["devices"] if x["name"] == bed.link.dev_b]
        assert [(n["defer_hard_irqs"], n["gro_flush_timeout_ns"]) for n in d["napis"]] == [
            (stock.NON_RT_DEFER, stock.NON_RT_REPOLL_US * 1000)]
        human = bed.kbpctl("status").stdout
        assert "CPU 0 pollers: rt napi/" in human and "preemption model:" in human
        check_status_trace(bed)
        bed.kbpctl("disable", "--all")


def check_status_trace(bed: Bed) -> None:
    """``status --trace``: with round trips crossing both threads, each thread's traced
    polls (stock counts none itself), the rt thread's wake-ups and whom it waited behind,
    consistent with the caused waits of the threads it waited behind; the text says so."""
    from kbp.bench import trace
    from kbp.system import access

    from .test_integration import PING_CLIENT, PORT
    if (why := trace.unavailable()) is not None:
        bad = bed.kbpctl("status", "--trace", "1").stdout
        assert f"not traced: {why}" in bad
        pytest.skip(f"status --trace cannot trace here (it needs root, bpftrace and "
                    f"tracefs): {why}; the refusal text was checked instead")
    bed.echo_server()
    pinger = access.popen([sys.executable, "-c", PING_CLIENT, bed.link.ip_b, str(PORT), "0",
                           "30"], ns=bed.tb.client)
    try:
        st = json.loads(bed.kbpctl("status", "--json", "--trace", "2").stdout)
        human = bed.kbpctl("status", "--trace", "1").stdout
    finally:
        pinger.send_signal(2)
        res, _ = pinger.communicate(timeout=30)
    assert json.loads(res)["ok"] > 0
    assert st["trace"] == {"seconds": 2.0, "threads": 2, "error": None}
    (pc,) = [c for c in st["polling_cpus"] if c["cpu"] == 0]
    rt, non_rt = pc["pollers"]
    for p in (rt, non_rt):
        ld = p["load"]
        assert ld["traced_s"] == 2.0 and ld["polls"] > 0, p
        # > 0, not >= 1: the non-rt NAPI's deferral re-polls it empty twice after each burst
        assert 1 <= ld["poll_max"] <= ld["quota"] and ld["packets_per_poll"] > 0, ld
        assert 0 <= ld["full_polls"] <= ld["polls"]
    ld = rt["load"]
    assert ld["traced_wakeups"] > 0 and ld["traced_wait_max_us"] >= ld["traced_wait_mean_us"]
    behind = ld["waited_behind"]
    assert behind and sum(b["waits"] for b in behind) <= ld["traced_wakeups"]
    assert non_rt["load"]["waited_behind"] is None
    for b in behind:
        if b["pid"] == non_rt["pid"]:
            assert non_rt["load"]["caused"]["waits"] == b["waits"]
    assert "packets per poll over" in human and "(traced 1 s)" in human
    assert f"rt {rt['comm']}: " in human and "woken " in human
