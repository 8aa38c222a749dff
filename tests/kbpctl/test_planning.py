"""Planning (pure): what the stock backend changes, in which order, and apply's plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbp import config, netdev, sysinfo
from kbp.backends import kmod as kmod_backend
from kbp.backends import stock
from kbp.errors import InvalidInput, Unavailable
from kbp.netdev import Link
from kbp.system.journal import Change, Record

from .conftest import make_host


def _net_dev(*names: str) -> str:
    head = "Inter-|   Receive |  Transmit\n face |bytes    packets|bytes    packets\n"
    return head + "".join(f"{n:>6}: 0 0 0 0\n" for n in names)


def test_same_named_elsewhere_by_each_netns_once(tmp_path: Path) -> None:
    """The other network namespaces come from every process's /proc/PID/ns/net (one read
    of /proc/PID/net/dev per namespace) and from ip netns's names; ours is left out, and a
    namespace is named after the first that shows it."""
    host = make_host(tmp_path)
    nsdir = tmp_path / "run-netns"
    nsdir.mkdir()
    ours, theirs, third = (tmp_path / f"ns{i}" for i in range(3))
    for f in (ours, theirs, third):
        f.write_text("")
    (host.proc / "self/ns").mkdir(parents=True)
    (host.proc / "self/ns/net").hardlink_to(ours)
    procs = {1: (ours, "systemd", ("lo", "eth0")), 40: (theirs, "nginx", ("lo", "eth0")),
             41: (theirs, "nginx", ("lo", "eth0")), 50: (third, "app", ("lo", "verylongname7")),
             60: (tmp_path / "gone", "x", ())}
    for pid, (ns, comm, devs) in procs.items():
        d = host.proc / str(pid)
        (d / "ns").mkdir(parents=True)
        (d / "net").mkdir()
        if ns.exists():
            (d / "ns/net").hardlink_to(ns)
        (d / "net/dev").write_text(_net_dev(*devs))
        (d / "comm").write_text(comm + "\n")
    assert netdev.devices_elsewhere(None, host, nsdir) == {
        "the netns of pid 40 (nginx)": ["lo", "eth0"],
        "the netns of pid 50 (app)": ["lo", "verylongname7"]}
    assert netdev.same_named_elsewhere("eth0", None, host, netns_dir=nsdir) == \
        ["the netns of pid 40 (nginx)"]
    assert netdev.same_named_elsewhere("verylongname0", None, host, netns_dir=nsdir) == \
        ["the netns of pid 50 (app)"]                 # napi/verylongna... either way
    assert netdev.same_named_elsewhere("eth1", None, host, netns_dir=nsdir) == []
    (nsdir / "blue").hardlink_to(theirs)   # a name ip netns cannot enter: found by its pids
    assert "the netns of pid 40 (nginx)" in netdev.devices_elsewhere(None, host, nsdir)
    threads, others = netdev.napi_threads_by_name("eth0", None, host)
    assert threads == [] and "the netns of pid 40 (nginx)" in others


class _NoMsi:
    def __init__(self, msi: list[int]) -> None:
        self.msi = msi

    def msi_irqs(self, dev: str) -> list[int]:
        return self.msi


def test_queue_irqs_by_name_refused_when_another_netns_has_the_name(tmp_path: Path) -> None:
    """A device without MSI IRQs in sysfs has its queue IRQs looked for by name among all of
    /proc/interrupts: with a device of the same name in another netns, whose IRQs those may
    be, the stock backend refuses to move them; among the device's own MSI IRQs the name is
    exact."""
    host = make_host(tmp_path)
    (host.proc / "interrupts").write_text(
        "           CPU0       CPU1\n"
        " 40:          1          0  PCI-MSIX  1-edge      eth7-rx-0\n"
        " 41:          1          0  PCI-MSIX  2-edge      eth7-rx-1\n")
    (host.proc / "self/ns").mkdir(parents=True)
    (host.proc / "self/ns/net").write_text("")
    d = host.proc / "70"
    (d / "ns").mkdir(parents=True)
    (d / "net").mkdir()
    (d / "ns/net").write_text("")                     # another namespace
    (d / "net/dev").write_text(_net_dev("lo", "eth8"))
    (d / "comm").write_text("app\n")
    be = stock.StockBackend(host=host)
    assert be._queue_irqs_by_name(_NoMsi([]), "eth7", None) == [40, 41]
    (d / "net/dev").write_text(_net_dev("lo", "eth7"))
    with pytest.raises(Unavailable, match=r"eth7 lists no MSI IRQs in sysfs, so its queue IRQs "
                       r"can only be found by name in /proc/interrupts \(IRQ 40, 41\), and the "
                       r"netns of pid 70 \(app\) has a device whose IRQs can carry such names"):
        be._queue_irqs_by_name(_NoMsi([]), "eth7", None)
    assert be._queue_irqs_by_name(_NoMsi([41]), "eth7", None) == [41]


def test_thread_and_irq_names_that_collide() -> None:
    collide = sysinfo.napi_names_collide
    assert collide("eth0", "eth0") and not collide("eth0", "eth1")
    assert not collide("eth1", "eth10") and not collide("eth0", "eth0-1")
    assert collide("eth0", "eth0-123456")      # napi/eth0-123456-7 cut: napi/eth0-12345
    assert collide("verylongname0", "verylongname1") and not collide("verylongname0", "verylongnb")
    irqs = sysinfo.irq_names_collide
    assert irqs("eth1", "eth1") and irqs("eth1", "eth1-vf0") and not irqs("eth1", "eth10")


def test_plan_threaded_per_napi_and_sysfs() -> None:
    p = stock.plan_threaded("ns", "eth1", 7, [300, 301], 1)
    assert [(x.kind, x.key["napi_id"], x.key["knob"], x.new) for x in p] == \
        [("napi", 300, "threaded", 1), ("napi", 301, "threaded", 1)]
    assert all(x.key["netns"] == "ns" and x.key["ifindex"] == 7 for x in p)
    (s,) = stock.plan_threaded(None, "eth1", 7, None, 2)
    assert (s.kind, s.key["attr"], s.key["dev"], s.new) == ("sysfs", "threaded", "eth1", "2")


def test_assign_cpus_round_robin() -> None:
    assert stock.assign_cpus(5, [2, 3]) == [2, 3, 2, 3, 2]
    assert stock.assign_cpus(1, [0, 1, 2]) == [0]
    assert stock.assign_cpus(0, [1]) == []


def _task(pid: int, comm: str = "napi/eth1-300") -> sysinfo.TaskStat:
    return sysinfo.TaskStat(pid=pid, comm=comm, state="S", ppid=2, flags=sysinfo.PF_KTHREAD,
                            starttime=1000 + pid, last_cpu=0, rt_priority=0, policy=0)


def test_plan_threads_binds_then_raises_priority() -> None:
    p = stock.plan_threads([_task(10), _task(11)], [1, 3], 50, [0, -5])
    assert [(x.kind, x.key["pid"]) for x in p] == \
        [("affinity", 10), ("sched", 10), ("affinity", 11), ("sched", 11)]
    assert p[0].new == [1] and p[2].new == [3]
    assert p[1].new == {"policy": "SCHED_FIFO", "priority": 50, "nice": 0}
    assert p[3].new["nice"] == -5  # nice is kept, only the policy changes
    assert p[0].key == {"pid": 10, "starttime": 1010, "comm": "napi/eth1-300"}


@pytest.mark.parametrize(("napi_irqs", "name_irqs", "cpus", "want"), [
    ([40, 41], [], [1, 2], {40: "1", 41: "2"}),        # napi-get knows each NAPI's IRQ
    ([None, None], [50, 51], [1, 2], {50: "1", 51: "2"}),  # paired by queue order
    ([], [50, 51, 52], [1, 2], {50: "1-2", 51: "1-2", 52: "1-2"}),  # counts differ
    ([], [], [1], {}),                                    # veth: no IRQ at all
    ([40, None], [], [1, 2], {}),                         # partial: fall back (no names)
])
def test_irq_targets(napi_irqs: list[int | None], name_irqs: list[int], cpus: list[int],
                     want: dict[int, str]) -> None:
    assert stock.irq_targets(napi_irqs, name_irqs, cpus) == want
    plan = stock.plan_irqs(want)
    assert [(x.key["irq"], x.new) for x in plan] == sorted(want.items())


@pytest.mark.parametrize(("linger", "want"), [
    (0, (0, 0)), (1, (1, 1000)), (5, (1, 5000)), (10, (1, 10000)), (25, (3, 10000)),
    (30, (3, 10000)), (1000, (100, 10000)),
])
def test_linger_values(linger: int, want: tuple[int, int]) -> None:
    assert stock.linger_values(linger) == want


def test_plan_linger() -> None:
    p = stock.plan_linger(None, "eth1", 3, [300], 30)
    assert [(x.key["knob"], x.new) for x in p] == [("defer_hard_irqs", 3),
                                                     ("gro_flush_timeout", 10000)]
    p = stock.plan_linger(None, "eth1", 3, None, 30)
    assert [(x.key["attr"], x.new) for x in p] == [("napi_defer_hard_irqs", "3"),
                                                     ("gro_flush_timeout", "10000")]


def _link(kind: str | None, up: bool) -> Link:
    return Link(ifindex=3, name="x", kind=kind, operstate="UP" if up else "DOWN", up=up,
                rx_packets=0)


def test_no_napi_messages() -> None:
    m = stock.no_napi_message("veth0", _link("veth", True), None)
    assert m == ("veth0 has no NAPI instance (veth uses NAPI only with GRO on: "
                 "ethtool -K veth0 gro on)")
    m = stock.no_napi_message("veth0", _link("veth", True), "blue")
    assert "ip netns exec blue ethtool -K veth0 gro on" in m
    assert "ip link set veth0 up" in stock.no_napi_message("veth0", _link("veth", False), None)
    assert "bridge devices do not use NAPI" in stock.no_napi_message("br0", _link("bridge", True),
                                                                      None)
    assert "ip link set eth1 up" in stock.no_napi_message("eth1", _link(None, False), None)


INTERRUPTS = """\
           CPU0       CPU1
  24:          1          0  IO-APIC   5-edge      ACPI:Ged
  40:          0        100  PCI-MSIX-0000:00:04.0   0-edge      eth1
  41:         10          0  PCI-MSIX-0000:00:04.0   1-edge      eth1-TxRx-0
  43:         10          0  PCI-MSIX-0000:00:04.0   3-edge      eth1-TxRx-10
  42:         10          0  PCI-MSIX-0000:00:04.0   2-edge      eth1-TxRx-2
  44:          0          0  PCI-MSIX-0000:00:05.0   0-edge      eth10-TxRx-0
  45:          0          0  PCI-MSIX-0000:00:05.0   1-edge      virtio2-input.0
NMI:          0          0   Non-maskable interrupts
"""


def test_device_irqs(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    (host.proc / "interrupts").write_text(INTERRUPTS)
    irqs = sysinfo.device_irqs("eth1", None, host)
    # queue IRQs only (not the bare "eth1" link IRQ, not eth10's), by queue number
    assert [q.irq for q in irqs] == [41, 42, 43]
    assert [q.irq for q in sysinfo.device_irqs("eth1", [41, 42], host)] == [41, 42]
    assert sysinfo.device_irqs("veth0", None, host) == []


def _stat_line(pid: int, comm: str, flags: int, start: int, cpu: int = 1) -> str:
    # fields 3.. of proc(5) stat; flags is field 9, starttime 22, processor 39
    rest = ["S", "2", "0", "0", "0", "-1", str(flags)] + ["0"] * 12 + [str(start)] + \
        ["0"] * 16 + [str(cpu), "50", "1"] + ["0"] * 10
    return f"{pid} ({comm}) " + " ".join(rest)


def test_read_stat_and_find_napi_threads(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    tasks = {
        101: ("napi/eth1-300", sysinfo.PF_KTHREAD),
        102: ("napi/eth1-301", sysinfo.PF_KTHREAD),
        103: ("napi/eth10-302", sysinfo.PF_KTHREAD),         # another device
        104: ("napi/verylongna", sysinfo.PF_KTHREAD),        # cut to 15 characters
        105: ("napi/eth1-300", 0),                           # a user task named like it
        106: ("ksoftirqd/0", sysinfo.PF_KTHREAD),
    }
    for pid, (comm, flags) in tasks.items():
        (host.proc / str(pid)).mkdir()
        (host.proc / str(pid) / "stat").write_text(_stat_line(pid, comm, flags, 5000 + pid))
    st = sysinfo.read_stat(101, host)
    assert st is not None
    assert (st.comm, st.ppid, st.starttime, st.last_cpu, st.rt_priority, st.policy) == \
        ("napi/eth1-300", 2, 5101, 1, 50, 1)
    assert sysinfo.read_stat(999, host) is None
    assert [t.pid for t in sysinfo.find_napi_threads("eth1", host)] == [101, 102]
    assert [t.pid for t in sysinfo.find_napi_threads("verylongname0", host)] == [104]
    tid = sysinfo.task_id(101, host)
    assert tid is not None and sysinfo.same_task(tid, host)
    assert not sysinfo.same_task(sysinfo.TaskId(101, 1, "x"), host)


def test_cpufreq_reports(tmp_path: Path) -> None:
    host = make_host(tmp_path, online="0-1")
    none = sysinfo.cpufreq(None, host)
    assert not none.available and "no cpufreq" in none.note
    for c in (0, 1):
        d = host.sys / f"devices/system/cpu/cpu{c}/cpufreq"
        d.mkdir(parents=True)
        for f, v in (("scaling_governor", "schedutil"), ("scaling_driver", "intel_pstate"),
                     ("scaling_min_freq", "800000"), ("scaling_max_freq", "3500000"),
                     ("scaling_cur_freq", "1200000"), ("cpuinfo_min_freq", "800000"),
                     ("cpuinfo_max_freq", "3500000")):
            (d / f).write_text(v + "\n")
    rep = sysinfo.cpufreq([1], host)
    assert rep.available and [c.cpu for c in rep.cpus] == [1]
    assert rep.cpus[0].max_khz == 3_500_000 and rep.cpus[0].governor == "schedutil"
    assert "SCHED_FIFO" in rep.note and "max frequency" in rep.note
    (host.sys / "devices/system/cpu/cpu1/cpufreq/scaling_governor").write_text("powersave\n")
    assert "does not follow" in sysinfo.cpufreq([1], host).note
    assert "mixed" in sysinfo.cpufreq([0, 1], host).note
    (host.sys / "devices/system/cpu/cpu1/cpufreq/scaling_governor").write_text("userspace\n")
    assert "freq_ctl" in sysinfo.cpufreq([1], host).note


def test_freq_ctl_needs_userspace_governor(tmp_path: Path) -> None:
    host = make_host(tmp_path, online="0-1")
    with pytest.raises(Unavailable, match="CPU 1 has no cpufreq policy"):
        kmod_backend.check_freq_ctl([1], host)
    d = host.sys / "devices/system/cpu/cpu1/cpufreq"
    d.mkdir(parents=True)
    (d / "scaling_governor").write_text("schedutil\n")
    with pytest.raises(InvalidInput, match=r"needs the userspace governor on CPU 1 \(it has "
                                           r"schedutil\): echo userspace > .*cpu1/cpufreq"):
        kmod_backend.check_freq_ctl([1], host)
    (d / "scaling_governor").write_text("userspace\n")
    kmod_backend.check_freq_ctl([1], host)


# -- apply's plan ---------------------------------------------------------------------
def _rec(dev: str, netns: str | None = None, backend: str = "stock", complete: bool = True,
         **settings: object) -> Record:
    req = config.DeviceConfig(name=dev).request().resolved(backend).settings()
    req.update(settings)
    return Record(path=Path(f"/x/{dev}"), backend=backend, dev=dev, netns=netns, ifindex=1,
                  request=req, changes=[Change(1, "sysfs", {}, "0", "1")], complete=complete)


def test_apply_plan() -> None:
    cfg = config.parse("""
[defaults]
rt_prio = 50
[[device]]
name = "new"
[[device]]
name = "same"
[[device]]
name = "changed"
rt_prio = 60
[[device]]
name = "halfdone"
[[device]]
name = "drifted"
[[device]]
name = "switch"
backend = "kmod"
""")
    recs = [_rec("same"), _rec("changed"), _rec("halfdone", complete=False), _rec("drifted"),
            _rec("switch"), _rec("gone"), _rec("gone", netns="blue")]
    problems = {("drifted", None): ["NAPI 3 is not threaded"]}
    acts = config.plan(cfg, recs, {"auto": "stock", "stock": "stock", "kmod": "kmod"}, problems)
    got = {(a.dev, a.netns): (a.op, a.backend, a.why) for a in acts}
    assert got == {
        ("new", None): ("enable", "stock", "not enabled"),
        ("same", None): ("keep", "stock", "in sync"),
        ("changed", None): ("reenable", "stock", "rt_prio changed"),
        ("halfdone", None): ("reenable", "stock", "enable was interrupted"),
        ("drifted", None): ("reenable", "stock", "NAPI 3 is not threaded"),
        ("switch", None): ("reenable", "kmod", "backend stock -> kmod"),
        ("gone", None): ("disable", "stock", "not in the config"),
        ("gone", "blue"): ("disable", "stock", "not in the config"),
    }


def test_unit_file() -> None:
    import configparser
    from importlib.resources import files
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.read_string(files("kbp").joinpath("data/kbp.service").read_text())
    svc = cp["Service"]
    assert svc["Type"] == "oneshot" and svc["RemainAfterExit"] == "yes"
    assert svc["ExecStart"].endswith("kbpctl apply")
    assert svc["ExecStop"].endswith("kbpctl disable --all")
    assert cp["Install"]["WantedBy"] == "multi-user.target"


def test_watch_unit_file() -> None:
    """kbp-watch.service: the loop gets SIGTERM alone, then disable restores everything."""
    import configparser
    from importlib.resources import files
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.read_string(files("kbp").joinpath("data/kbp-watch.service").read_text())
    svc = cp["Service"]
    assert svc["Type"] == "simple" and svc["KillMode"] == "mixed"
    assert svc["ExecStart"].endswith("kbpctl apply --watch 5")
    assert svc["ExecStopPost"].endswith("kbpctl disable --all")
    assert cp["Unit"]["Conflicts"] == "kbp.service"
