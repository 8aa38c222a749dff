"""RPS on a served device (offline): what counts as on, what enable turns off, the words.

The netns tests (test_integration.py) do the same on real veth devices; the VM suite with
the module (vm/guest_tests/test_kbpctl_kmod.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kbp import cli, config, rps
from kbp.backends import DeviceStatus, EnableRequest, show_rps
from kbp.netdev import NetFS
from kbp.problems import RPS_ON
from kbp.render import rps_cell
from kbp.rps import Rps, RpsQueue
from kbp.sysinfo import Host


def _rps(*queues: tuple[str | None, int | None], entries: int | None = 0) -> Rps:
    return Rps([RpsQueue(f"rx-{i}", m, f) for i, (m, f) in enumerate(queues)], entries)


@pytest.mark.parametrize(("mask", "cpus"), [
    ("0", []), ("00000000,00000000", []), ("3", [0, 1]), ("00000001,00000004", [2, 32]),
    ("ff", list(range(8))), (None, []), ("", []), ("zz", []),
])
def test_mask_cpus(mask: str | None, cpus: list[int]) -> None:
    assert rps.mask_cpus(mask) == cpus


def test_on_means_a_mask_or_active_rfs() -> None:
    off = _rps(("0", 0), ("00", 0))
    assert not off.on and off.plan_off() == [] and off.cpus == []
    r = _rps(("2", 0), ("0", 0), ("5", 0))
    assert r.on and r.cpus == [0, 1, 2] and not r.rfs
    assert r.plan_off() == [("queues/rx-0/rps_cpus", "0"), ("queues/rx-2/rps_cpus", "0")]
    # rps_flow_cnt steers only while net.core.rps_sock_flow_entries is non-zero
    table_only = _rps(("0", 4096), entries=0)
    assert not table_only.on and table_only.plan_off() == []
    rfs = _rps(("0", 4096), entries=32768)
    assert rfs.on and rfs.rfs and rfs.plan_off() == [("queues/rx-0/rps_flow_cnt", "0")]
    # outside the initial netns the global is not visible: assume it steers
    unknown = _rps(("1", 256), entries=None)
    assert unknown.plan_off() == [("queues/rx-0/rps_cpus", "0"),
                                  ("queues/rx-0/rps_flow_cnt", "0")]


def test_summary_and_one_line_messages() -> None:
    r = _rps(("3", 0))
    assert r.summary() == "rx-0: rps_cpus 3" and r.where() == "CPUs 0-1"
    assert r.summary(turned_off=True) == "rx-0: rps_cpus 3 -> 0"
    many = _rps(*[("f", 0)] * 8)
    assert many.summary() == "rx-0..rx-7: rps_cpus f"
    mixed = _rps(("1", 0), ("2", 128), ("1", 0), entries=1)
    assert mixed.summary() == "rx-0,rx-2: rps_cpus 1; rx-1: rps_cpus 2, rps_flow_cnt 128"
    assert mixed.where() == "CPUs 0-1 or the receiving sockets' CPUs (RFS)"
    note = rps.off_notice("veth0", "blue", r)
    assert note.startswith("kbpctl: note: turned RPS off on veth0 in netns blue "
                           "(rx-0: rps_cpus 3 -> 0)")
    assert "backlog softirq" in note and "'kbpctl disable veth0 --netns blue' restores" in note
    warn = rps.kept_warning("eth1", None, r)
    assert warn.startswith("kbpctl: warning: RPS stays on for eth1 (--keep-rps")
    assert "backlog softirq of CPUs 0-1" in warn
    assert "\n" not in note + warn


def _sysfs(root: Path, dev: str, queues: dict[str, dict[str, str]]) -> NetFS:
    for q, attrs in queues.items():
        d = root / "class/net" / dev / "queues" / q
        d.mkdir(parents=True)
        for a, v in attrs.items():
            (d / a).write_text(v + "\n")
    (root / "class/net" / dev / "queues/tx-0").mkdir(parents=True, exist_ok=True)
    return NetFS(None, sysroot=root)


def test_read_from_sysfs(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "sys/net/core").mkdir(parents=True)
    (proc / rps.SOCK_FLOW_ENTRIES).write_text("0\n")
    host = Host(proc=proc, sys=tmp_path / "sys")
    qs = {f"rx-{i}": {"rps_cpus": "00000000,00000002" if i == 10 else "0",
                      "rps_flow_cnt": "0"} for i in (0, 2, 10)}
    fs = _sysfs(tmp_path / "sys", "eth1", qs)
    r = rps.read(fs, "eth1", host)
    assert r is not None and r.sock_flow_entries == 0
    assert [q.queue for q in r.queues] == ["rx-0", "rx-2", "rx-10"]  # tx-0 left out
    assert r.queues[2].rps_cpus == "00000000,00000002" and r.cpus == [1]
    assert r.plan_off() == [("queues/rx-10/rps_cpus", "0")]
    # CONFIG_RPS off: the queues exist, the files do not
    fs = _sysfs(tmp_path / "sys2", "eth2", {"rx-0": {}})
    assert rps.read(fs, "eth2", host) is None
    assert rps.read(fs, "nosuch", host) is None
    assert rps.sock_flow_entries(Host(proc=tmp_path / "none")) is None


def _ds(**kw: object) -> DeviceStatus:
    return DeviceStatus(name="veth0", netns=None, ifindex=3, kind="veth", **kw)  # type: ignore[arg-type]


def test_status_fields_and_drift() -> None:
    on, off = _rps(("2", 0)), _rps(("0", 0))
    ds = _ds(backend=None)
    show_rps(ds, on, None, True)  # not served: shown, not a problem
    assert ds.rps is not None and ds.rps.on and ds.rps.cpus == [1] and ds.keep_rps is None
    assert ds.problems == [] and rps_cell(ds) == "on: CPU 1"
    ds = _ds(backend="stock")
    show_rps(ds, on, EnableRequest(["veth0"]).settings(), True)  # came back after enable
    assert ds.keep_rps is False and len(ds.problems) == 1 and "RPS is on" in ds.problems[0].text
    assert ds.problems[0].kind == RPS_ON
    ds = _ds(backend="stock")
    show_rps(ds, on, EnableRequest(["veth0"], keep_rps=True).settings(), True)
    assert ds.keep_rps is True and ds.problems == [] and rps_cell(ds) == "kept on: CPU 1"
    ds = _ds(backend="kmod")
    show_rps(ds, off, {"mode": "hybrid"}, True)  # a journal from before keep_rps existed
    assert ds.keep_rps is False and ds.problems == [] and rps_cell(ds) == "off"
    ds = _ds(backend="stock")
    show_rps(ds, None, {}, True)
    assert ds.rps is None and rps_cell(ds) == "-"
    rfs = _ds(backend=None)
    show_rps(rfs, _rps(("3", 64), entries=4096), None, True)
    assert rps_cell(rfs) == "on: CPUs 0-1 +RFS"


def test_keep_rps_in_request_config_and_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert EnableRequest(["a"]).settings()["keep_rps"] is False
    cfg = config.parse('[defaults]\nkeep_rps = true\n[[device]]\nname = "a"\n'
                       '[[device]]\nname = "b"\nkeep_rps = false\n')
    a, b = cfg.devices
    assert a.request().keep_rps and not b.request().keep_rps
    with pytest.raises(Exception, match="expected true or false"):
        config.parse('[[device]]\nname = "a"\nkeep_rps = "yes"\n')
    args = cli.build_parser().parse_args(["enable", "eth1", "--keep-rps"])
    assert args.keep_rps is True
    assert cli.build_parser().parse_args(["enable", "eth1"]).keep_rps is False
    with pytest.raises(SystemExit):
        cli.main(["enable", "--help"])
    out = capsys.readouterr().out
    assert "--keep-rps" in out and "rps_cpus" in out and "backlog softirq" in out


def test_apply_reenables_when_keep_rps_changes() -> None:
    from kbp.system.journal import Record
    cfg = config.parse('[[device]]\nname = "a"\nkeep_rps = true\n')
    rec = Record(path=Path("/x/a"), backend="stock", dev="a", netns=None, ifindex=1,
                 request=EnableRequest(["a"]).resolved("stock").settings(), complete=True)
    (act,) = config.plan(cfg, [rec], {"auto": "stock", "stock": "stock", "kmod": "kmod"}, {})
    assert (act.op, act.why) == ("reenable", "keep_rps changed")
