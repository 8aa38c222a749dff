"""The [rt_class] rule (kbp.rtclass): config, classification, apply's plan, status lines.

The parts that read the system run against a fake /proc and /sys; the VM tests
(vm/guest_tests/test_rtclass.py) run the rule against real interrupt threads on 6.12-rt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbp import config, rtclass
from kbp.errors import InvalidInput
from kbp.render import rt_class_lines
from kbp.sysinfo import PF_KTHREAD, Host
from kbp.system.journal import Change, Record

from .conftest import make_host

BACKENDS = {"auto": "kmod", "stock": "stock", "kmod": "kmod"}


def _thread(host: Host, pid: int, comm: str, policy: int, prio: int,
            kthread: bool = True) -> None:
    """A /proc/PID/stat line with the fields parse_stat reads (flags, rt_priority, policy)."""
    f = ["S", "2", "0", "0", "0", "0", str(PF_KTHREAD if kthread else 0)] + ["0"] * 12 + \
        ["100"] + ["0"] * 16 + ["1", str(prio), str(policy)]
    d = host.proc / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(f)}\n")


def _rt_host(tmp_path: Path, realtime: bool = True) -> Host:
    host = make_host(tmp_path)
    if realtime:
        (host.sys / "kernel").mkdir(parents=True)
        (host.sys / "kernel/realtime").write_text("1\n")
    _thread(host, 101, "irq/45-virtio0-input.0", 1, 50)
    _thread(host, 102, "irq/46-virtio0-output.0", 1, 60)
    _thread(host, 103, "irq/47-eth2-TxRx-0", 1, 50)
    _thread(host, 104, "irq/48-eth3-rx-0", 0, 0)       # SCHED_OTHER (chrt -o)
    _thread(host, 105, "ksoftirqd/1", 0, 0)
    _thread(host, 106, "irq/49-fake", 1, 90, kthread=False)  # a user task named like one
    return host


def test_irq_threads_are_the_kernel_threads_named_irq_n(tmp_path: Path) -> None:
    th = rtclass.irq_threads(_rt_host(tmp_path))
    assert sorted(th) == [45, 46, 47, 48]
    assert th[46][0].policy == "SCHED_FIFO" and th[46][0].priority == 60
    assert th[48][0].rt_priority == 0


def test_classify_by_the_highest_queue_interrupt_thread(tmp_path: Path) -> None:
    th = rtclass.irq_threads(_rt_host(tmp_path))
    rt = rtclass.classify("eth1", None, [45, 46], th, 55)
    assert rt.rt and rt.why == "irq/46-virtio0-output.0 (IRQ 46) FIFO 60 >= rtnet_prio 55"
    assert [t.irq for t in rt.threads] == [45, 46]
    low = rtclass.classify("eth2", None, [47], th, 55)
    assert not low.rt and low.why == ("its interrupt threads run below rtnet_prio 55 "
                                      "(highest: irq/47-eth2-TxRx-0 (IRQ 47) FIFO 50)")
    # exactly at the threshold is RT (the paper: "at or above")
    assert rtclass.classify("eth2", None, [47], th, 50).rt
    other = rtclass.classify("eth3", None, [48], th, 1)
    assert not other.rt and "OTHER 0" in other.why
    soft = rtclass.classify("veth0", None, [], th, 1)
    assert not soft.rt and "no queue interrupt" in soft.why
    unthreaded = rtclass.classify("eth4", None, [70], th, 1)
    assert not unthreaded.rt and "no interrupt thread for IRQ 70" in unthreaded.why


def test_queue_irqs_leave_out_config_and_link_interrupts() -> None:
    actions = {28: "virtio0-config", 29: "virtio0-input.0", 30: "virtio0-output.0",
               40: "eth1", 41: "eth1-TxRx-0"}
    assert rtclass.queue_irqs([28, 29, 30], actions) == [29, 30]
    assert rtclass.queue_irqs([40, 41], actions) == [41]
    assert rtclass.queue_irqs([99], actions) == []


def test_rule_refuses_out_of_range_and_non_rt_kernels(tmp_path: Path) -> None:
    rt = _rt_host(tmp_path / "rt")
    plain_v = "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1"
    for bad in (0, 100, -1):
        with pytest.raises(InvalidInput, match=rf"rtnet_prio {bad} is out of range "
                                               r"\(1\.\.99"):
            rtclass.RtClassRule(bad).validate(rt, plain_v)
    rtclass.RtClassRule(99).validate(rt, plain_v)   # the RT patch's /sys/kernel/realtime
    plain = _rt_host(tmp_path / "plain", realtime=False)
    # mainline PREEMPT_RT (Debian's 7.2-rt) has no /sys/kernel/realtime: uname -v says it
    rtclass.RtClassRule(1).validate(plain, "#1 SMP PREEMPT_RT Debian 7.2.12-1 (2026-10-22)")
    with pytest.raises(InvalidInput, match=r"only PREEMPT_RT kernels run every interrupt "
                                           r"handler in a thread.*\[\[device\]\] entries"):
        rtclass.RtClassRule(47).validate(plain, plain_v)


def test_config_parses_rt_class() -> None:
    cfg = config.parse('[rt_class]\nrtnet_prio = 47\nnetns = ["server"]\n'
                       '[defaults]\nmode = "busy"\ncpus = "1"\n')
    assert cfg.rt_class == rtclass.RtClassRule(47, ("server",))
    d = cfg.class_device("eth1", "server")
    assert (d.name, d.netns, d.mode, d.cpus) == ("eth1", "server", "busy", [1])
    assert config.parse("").rt_class is None


@pytest.mark.parametrize(("text", "msg"), [
    ("[rt_class]\nnetns = []\n", r"rt_class: needs rtnet_prio = N .*1\.\.99"),
    ("[rt_class]\nrtnet_prio = 100\n", r"kbp\.toml: rt_class\.rtnet_prio 100 is out of "
                                       r"range \(1\.\.99"),
    ("[rt_class]\nrtnet_prio = \"47\"\n", r"rt_class\.rtnet_prio: expected an integer"),
    ("[rt_class]\nrtnet_prio = 47\nnetns = \"x\"\n", r"rt_class\.netns: expected a list"),
    ("[rt_class]\nrtnet_prio = 47\nrtnet_pri = 3\n", r"rt_class\.rtnet_pri: unknown key \(did you "
                                                r"mean rtnet_prio\?\)"),
    ("rt_class = 47\n", r"rt_class: must be a table"),
])
def test_config_refuses_bad_rt_class(text: str, msg: str) -> None:
    with pytest.raises(InvalidInput, match=msg):
        config.parse(text, Path("/etc/kbp/kbp.toml"))


def _rec(d: config.DeviceConfig, backend: str = "kmod") -> Record:
    """The journal of a device enabled as ``d`` says."""
    req = d.request().resolved(backend).settings()
    return Record(path=Path(f"/x/{d.name}"), backend=backend, dev=d.name, netns=d.netns,
                  ifindex=1, request=req, changes=[Change(1, "sysfs", {}, "0", "1")],
                  complete=True)


def _cls(dev: str, rt: bool, netns: str | None = None) -> rtclass.DeviceClass:
    return rtclass.DeviceClass(dev, netns, rtclass.CLASS_RT if rt else rtclass.CLASS_NONRT,
                               f"{dev} is {'rt' if rt else 'non-rt'}")


def test_plan_serves_the_rt_class_with_the_defaults_and_hands_back_the_rest() -> None:
    cfg = config.parse('[rt_class]\nrtnet_prio = 47\n[defaults]\nmode = "busy"\n'
                       'cpus = "1"\n[[device]]\nname = "named"\nmode = "hybrid"\n')
    recs = [_rec(cfg.class_device("kept", None)), _rec(cfg.class_device("fell", None)),
            _rec(cfg.devices[0])]
    classes = [_cls("new", True), _cls("kept", True), _cls("fell", False),
               _cls("named", False), _cls("ns-dev", True, "server"), _cls("other", False)]
    acts = config.plan(cfg, recs, BACKENDS, {}, classes)
    got = {(a.dev, a.netns): (a.op, a.why) for a in acts}
    assert got == {
        ("new", None): ("enable", "RT class: new is rt"),
        ("ns-dev", "server"): ("enable", "RT class: ns-dev is rt"),
        ("kept", None): ("keep", "in sync"),
        ("named", None): ("keep", "in sync"),  # named: served whatever its class
        ("fell", None): ("disable", "not in the config, and not RT: fell is non-rt"),
    }
    new = next(a for a in acts if a.dev == "new")
    assert new.request is not None and (new.request.mode, new.request.cpus) == ("busy", [1])


def test_plan_without_a_rule_is_unchanged() -> None:
    cfg = config.parse('[[device]]\nname = "eth1"\n')
    acts = config.plan(cfg, [_rec(config.DeviceConfig("gone"))], BACKENDS, {})
    assert {(a.dev, a.op, a.why) for a in acts} == {
        ("eth1", "enable", "not enabled"), ("gone", "disable", "not in the config")}


def test_rule_file_round_trips(tmp_path: Path) -> None:
    assert rtclass.load_rule(tmp_path) is None
    rtclass.save_rule(tmp_path, rtclass.RtClassRule(47, ("a",)))
    assert rtclass.load_rule(tmp_path) == rtclass.RtClassRule(47, ("a",))
    rtclass.save_rule(tmp_path, None)
    assert rtclass.load_rule(tmp_path) is None and not list(tmp_path.iterdir())


def test_status_lines_say_each_devices_class(tmp_path: Path) -> None:
    from kbp.backends import DeviceStatus, Status
    from kbp.sysinfo import FreqReport
    devs = [DeviceStatus("eth1", None, 2, None, "kmod", rt_class=_cls("eth1", True).to_json()),
            DeviceStatus("eth2", None, 3, None, None, rt_class=_cls("eth2", True).to_json()),
            DeviceStatus("eth3", "srv", 4, None, "kmod",
                         rt_class=_cls("eth3", False).to_json()),
            DeviceStatus("eth4", None, 5, None, None)]
    st = Status("6.12", "kmod", {}, devs, [], FreqReport(False, [], ""),
                rt_class={"rtnet_prio": 47, "netns": ["srv"]})
    lines = [t.plain for t in rt_class_lines(st)]
    assert lines == [
        "RT class: devices whose interrupt threads run at SCHED_FIFO/RR >= rtnet_prio 47 "
        "(init netns, srv; kbpctl apply)",
        "  eth1: rt: eth1 is rt",
        "  eth2: rt: eth2 is rt -- not served yet: run kbpctl apply",
        "  eth3 (srv): non-rt: eth3 is non-rt -- served anyway: named in kbp.toml or by "
        "kbpctl enable"]
    assert st.to_json()["rt_class"] == {"rtnet_prio": 47, "netns": ["srv"]}
    st.rt_class = None
    assert rt_class_lines(st) == []


def test_apply_watch_refuses_bad_values(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    from kbp.cli import main
    cfg = tmp_path / "kbp.toml"
    cfg.write_text("")
    assert main(["apply", "--config", str(cfg), "--watch", "0.1"]) == 2
    assert "--watch 0.1 is too short: use 0.5 seconds or more" in capsys.readouterr().err
    assert main(["apply", "--config", str(cfg), "--watch", "1", "--dry-run"]) == 2
    assert "--watch and --dry-run together" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="kbpctl apply needs root (it checks before "
                                               "it converges)")
def test_apply_watch_loops_reports_failed_rounds_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The loop with a config that lists nothing (nothing on the system changes): the first
    round prints, a config edit that does not parse is reported and retried, a fixed one is
    picked up again, SIGTERM ends it with 0."""
    cfg = tmp_path / "kbp.toml"
    cfg.write_text("")
    env = {**os.environ, "KBP_RUN_DIR": str(tmp_path / "run")}
    p = subprocess.Popen([sys.executable, "-m", "kbp.cli", "apply", "--config", str(cfg),
                          "--watch", "0.5"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stderr is not None
        assert "lists no device and kbpctl serves none: nothing to do" in p.stdout.readline()
        cfg.write_text("[rt_class]\nrtnet_prio = 0\n")
        line = p.stderr.readline()
        assert "rtnet_prio 0 is out of range (1..99" in line and "retrying in 0.5 s" in line
        cfg.write_text("")
        time.sleep(1.5)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert out == "", out  # the later rounds changed nothing, so they printed nothing
    assert not (tmp_path / "run" / rtclass.RULE_FILE).exists()
