"""The polling threads' priority: each backend's default per mode, and the stock backend's
busy mode, whose NAPI threads run SCHED_NORMAL and refuse a SCHED_FIFO priority.

Upstream's threaded busy polling never sleeps once woken and yields only at cond_resched():
at SCHED_FIFO it would leave the other tasks of its CPU only what RT throttling spares (5 %,
nothing with sched_rt_runtime_us=-1; measured in the 7.2 guest: 100 % of its CPU). A knob that
can starve a CPU is a bug whatever the default, so an explicit priority is refused there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kbp import backends, cli, config, names, sysinfo
from kbp.backends import (
    DeviceStatus,
    EnableRequest,
    NapiStatus,
    ThreadStatus,
    default_rt_prio,
    stock,
    validate_common,
)
from kbp.backends import kmod as kmod_backend
from kbp.errors import EXIT_USAGE, InvalidInput
from kbp.problems import SCHED_DRIFT
from kbp.system.journal import Change, Record

BUSY, HYBRID = names.MODE_BUSY, names.MODE_HYBRID
STOCK, KMOD = names.BACKEND_STOCK, names.BACKEND_KMOD


# -- the default, per backend and mode ----------------------------------------------------
@pytest.mark.parametrize(("backend", "mode", "prio"), [
    (STOCK, HYBRID, 50), (STOCK, BUSY, 0), (KMOD, HYBRID, 50), (KMOD, BUSY, 50),
])
def test_default_rt_prio_per_backend_and_mode(backend: str, mode: str, prio: int) -> None:
    assert default_rt_prio(backend, mode) == prio
    be: Any = stock.StockBackend() if backend == STOCK else kmod_backend.KmodBackend()
    assert be.default_rt_prio(mode) == prio
    req = EnableRequest(["eth1"], mode=mode)
    assert req.rt_prio is None  # left out: the backend decides
    assert req.resolved(backend).rt_prio == prio
    assert req.resolved(backend).settings()["rt_prio"] == prio  # what the journal gets
    assert req.rt_prio is None  # resolved() makes a copy
    assert EnableRequest(["eth1"], mode=mode, rt_prio=7).resolved(backend).rt_prio == 7


def test_default_rt_prio_unknown_backend() -> None:
    with pytest.raises(InvalidInput, match="unknown backend"):
        default_rt_prio("auto", BUSY)


def test_validate_common_leaves_an_unresolved_priority_to_the_backend() -> None:
    validate_common(EnableRequest(["eth1"], mode=BUSY))
    validate_common(EnableRequest(["eth1"]))


def test_cli_rt_prio_defaults_to_none() -> None:
    args = cli.build_parser().parse_args(["enable", "eth1"])
    assert args.rt_prio is None


# -- stock busy: SCHED_FIFO refused, before anything changes ------------------------------
@pytest.mark.parametrize("prio", [1, 50, 99])
def test_stock_busy_refuses_a_fifo_priority(prio: int) -> None:
    be = stock.StockBackend()
    with pytest.raises(InvalidInput) as e:
        be._check_static(EnableRequest(["eth1"], mode=BUSY, rt_prio=prio).resolved(STOCK))
    msg = str(e.value)
    assert "\n" not in msg
    # why: it never sleeps and yields only at cond_resched(), which SCHED_FIFO makes useless
    assert f"--rt-prio {prio}" in msg and "--mode busy" in msg and "starve" in msg
    assert "cond_resched()" in msg and "RT throttling" in msg and "sched_rt_runtime_us" in msg
    assert "isolated CPU is no exception" in msg
    # what to do instead
    assert "Leave the priority out (or give 0" in msg and "SCHED_NORMAL" in msg
    assert "rt_prio in kbp.toml" in msg
    assert "--backend kmod --mode busy" in msg and "--mode hybrid" in msg


def test_stock_busy_accepts_no_priority_and_zero(tmp_path: Path) -> None:
    be = stock.StockBackend()
    be._check_static(EnableRequest(["eth1"], mode=BUSY).resolved(STOCK))
    be._check_static(EnableRequest(["eth1"], mode=BUSY, rt_prio=0).resolved(STOCK))
    # hybrid keeps SCHED_FIFO 1..99
    be._check_static(EnableRequest(["eth1"]).resolved(STOCK))
    with pytest.raises(InvalidInput, match=r"priority 0 is out of range.*1\.\.99"):
        be._check_static(EnableRequest(["eth1"], rt_prio=0).resolved(STOCK))


def test_kmod_busy_keeps_fifo() -> None:
    kmod_backend.KmodBackend()._check_static(EnableRequest(["eth1"], mode=BUSY, rt_prio=50))
    assert kmod_backend.attachment(EnableRequest(["eth1"], mode=BUSY), [1], 1)["rt_prio"] == 50


def test_cli_refuses_stock_busy_fifo_with_nothing_changed(
        capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    assert cli.main(["enable", "eth1", "--backend", "stock", "--mode", "busy",
                     "--rt-prio", "50"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("kbpctl: --rt-prio 50 ")
    assert "SCHED_NORMAL" in err and "--backend kmod" in err
    assert not run_dir.exists()  # nothing journaled


def test_enable_refuses_before_any_system_access(monkeypatch: pytest.MonkeyPatch) -> None:
    def touched(*a: object, **k: object) -> None:
        raise AssertionError("the system was touched before the refusal")
    monkeypatch.setattr(stock, "require_root", touched)
    monkeypatch.setattr(stock, "check_netns", touched)
    be = stock.StockBackend()
    for call in (be.enable, be.check):
        with pytest.raises(InvalidInput, match="--rt-prio 60 with the stock backend's"):
            call(EnableRequest(["eth1"], mode=BUSY, rt_prio=60))


# -- what enable prints --------------------------------------------------------------------
class RecordingBackend:
    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[EnableRequest] = []

    def enable(self, req: EnableRequest) -> backends.EnableResult:
        self.requests.append(req)
        return backends.EnableResult(self.name, "", [backends.DeviceResult(
            d, req.netns, self.name, 1, req.cpus or [0], 2) for d in req.devices])


@pytest.mark.parametrize(("backend", "mode", "sched"), [
    (STOCK, BUSY, "SCHED_NORMAL"), (STOCK, HYBRID, "SCHED_FIFO 50"),
    (KMOD, BUSY, "SCHED_FIFO 50"), (KMOD, HYBRID, "SCHED_FIFO 50"),
])
def test_enable_resolves_the_default_and_says_it(
        backend: str, mode: str, sched: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    be = RecordingBackend(backend)
    monkeypatch.setattr(backends, "get", lambda name, state=None: be)
    assert cli.main(["enable", "eth1", "--backend", backend, "--mode", mode,
                     "--cpus", "1"]) == 0
    out, err = capsys.readouterr()
    (req,) = be.requests
    assert req.rt_prio == (0 if sched == "SCHED_NORMAL" else 50)
    assert f"CPU 1, {sched} (2 changes journaled)" in out
    flat = " ".join(err.split())
    if backend == STOCK and mode == BUSY:
        assert "busy NAPI thread on CPU 1 never sleeps" in flat
        assert "SCHED_NORMAL" in flat and "fairly" in flat and "RT throttling" not in flat


def test_busy_notice_of_stock_busy_at_sched_normal() -> None:
    flat = " ".join(cli.busy_notice(STOCK, [(2, "eth1"), (3, "eth1")], 0).split())
    assert "busy NAPI threads on CPUs 2-3 never sleep" in flat
    assert "They run SCHED_NORMAL" in flat and "share the CPU with it fairly" in flat
    assert "only when it yields" not in flat and "--mode hybrid" in flat


# -- the threads' scheduling: plan and drift check -----------------------------------------
def _task(pid: int) -> sysinfo.TaskStat:
    return sysinfo.TaskStat(pid=pid, comm=f"napi/eth1-{pid}", state="S", ppid=2,
                            flags=sysinfo.PF_KTHREAD, starttime=1000 + pid, last_cpu=0,
                            rt_priority=0, policy=0)


def test_plan_threads_at_zero_is_sched_normal_with_nice_kept() -> None:
    p = stock.plan_threads([_task(10), _task(11)], [1, 1], 0, [0, -5])
    assert [(x.kind, x.key["pid"]) for x in p] == \
        [("affinity", 10), ("sched", 10), ("affinity", 11), ("sched", 11)]
    assert p[1].new == {"policy": "SCHED_OTHER", "priority": 0, "nice": 0}
    assert p[3].new == {"policy": "SCHED_OTHER", "priority": 0, "nice": -5}
    assert stock.thread_sched(0) == ("SCHED_OTHER", 0)
    assert stock.thread_sched(50) == ("SCHED_FIFO", 50)


def test_sched_zero_is_set_and_restored_through_the_handler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A NAPI thread already SCHED_OTHER is left alone (nothing journaled); one that is not
    (someone made it FIFO) is changed, and disable puts FIFO back."""
    from kbp.system.journal import Executor
    from kbp.system.settings import SchedHandler
    cur = {"policy": "SCHED_OTHER", "priority": 0, "nice": 0}
    calls: list[tuple[str, int, int | None]] = []
    monkeypatch.setattr(SchedHandler, "_alive", lambda self, key: True)
    monkeypatch.setattr(sysinfo, "get_sched", lambda pid: sysinfo.Sched(
        cur["policy"], cur["priority"], cur["nice"], [1]))

    def set_policy(pid: int, policy: str, prio: int, nice: int | None = None) -> None:
        calls.append((policy, prio, nice))
        cur.update(policy=policy, priority=prio)
    monkeypatch.setattr(sysinfo, "set_policy", set_policy)

    class Journal:
        def __init__(self) -> None:
            self.changes: list[Change] = []

        def change(self, kind: str, key: Any, old: Any, new: Any) -> Change:
            c = Change(len(self.changes) + 1, kind, dict(key), old, new)
            self.changes.append(c)
            return c

    (step,) = [s for s in stock.plan_threads([_task(10)], [1], 0, [0]) if s.kind == "sched"]
    j = Journal()
    ex = Executor(j, {"sched": SchedHandler()}, lambda what: None)  # type: ignore[arg-type]
    assert ex.apply(step.kind, step.key, step.new) is None and calls == [] and not j.changes
    cur.update(policy="SCHED_FIFO", priority=50)
    c = ex.apply(step.kind, step.key, step.new)
    assert c is not None and calls == [("SCHED_OTHER", 0, 0)]
    assert c.old == {"policy": "SCHED_FIFO", "priority": 50, "nice": 0}
    SchedHandler().set(step.key, c.old)  # what restore does
    assert calls[-1] == ("SCHED_FIFO", 50, 0) and cur["policy"] == "SCHED_FIFO"


def _status(policy: str, prio: int) -> DeviceStatus:
    th = ThreadStatus(pid=42, comm="napi/eth1-300", cpus=[1], last_cpu=1, policy=policy,
                      priority=prio, counters={})
    return DeviceStatus(name="eth1", netns=None, ifindex=3, kind=None, backend=STOCK,
                        napis=[NapiStatus(id=300, threaded=None, thread=th)])


def _stock_rec(**request: Any) -> Record:
    return Record(path=Path("/x/eth1"), backend=STOCK, dev="eth1", netns=None, ifindex=3,
                  request=request, changes=[Change(1, "sysfs", {}, "0", "1")], complete=True)


def test_drift_check_accepts_sched_normal_for_stock_busy() -> None:
    be = stock.StockBackend()
    busy = _stock_rec(mode=BUSY, rt_prio=0)
    assert be._problems(busy, _status("SCHED_OTHER", 0)) == []
    (p,) = be._problems(busy, _status("SCHED_FIFO", 50))
    assert "runs SCHED_FIFO/50, not SCHED_OTHER/0" in p.text and p.kind == SCHED_DRIFT
    # a journal without rt_prio: the mode's default
    assert be._problems(_stock_rec(mode=BUSY), _status("SCHED_OTHER", 0)) == []
    hybrid = _stock_rec(mode=HYBRID, rt_prio=50)
    assert be._problems(hybrid, _status("SCHED_FIFO", 50)) == []
    (p,) = be._problems(hybrid, _status("SCHED_OTHER", 0))
    assert "not SCHED_FIFO/50" in p.text and p.kind == SCHED_DRIFT


# -- kbp.toml and apply ----------------------------------------------------------------------
def test_config_leaves_rt_prio_to_the_backend() -> None:
    cfg = config.parse('[defaults]\nmode = "busy"\n[[device]]\nname = "eth1"\n'
                       '[[device]]\nname = "eth2"\nrt_prio = 40\n')
    a, b = cfg.devices
    assert config.DeviceConfig(name="x").rt_prio is None
    assert a.rt_prio is None and a.request().rt_prio is None and b.rt_prio == 40


def _rec(dev: str, backend: str, **settings: Any) -> Record:
    req = EnableRequest([dev]).settings()
    req.update(settings)
    return Record(path=Path(f"/x/{dev}"), backend=backend, dev=dev, netns=None, ifindex=1,
                  request=req, changes=[Change(1, "sysfs", {}, "0", "1")], complete=True)


def test_apply_compares_the_resolved_priority() -> None:
    """The config leaves rt_prio out: apply compares what enable would journal (stock busy:
    0, else 50), so nothing is re-enabled for it; an old stock busy journal at FIFO 50 is."""
    cfg = config.parse("""
[[device]]
name = "sb"
backend = "stock"
mode = "busy"
[[device]]
name = "sh"
backend = "stock"
[[device]]
name = "kb"
backend = "kmod"
mode = "busy"
[[device]]
name = "old"
backend = "stock"
mode = "busy"
[[device]]
name = "new"
backend = "stock"
mode = "busy"
""")
    recs = [_rec("sb", STOCK, mode=BUSY, rt_prio=0), _rec("sh", STOCK, rt_prio=50),
            _rec("kb", KMOD, mode=BUSY, rt_prio=50), _rec("old", STOCK, mode=BUSY, rt_prio=50)]
    acts = config.plan(cfg, recs, {"auto": STOCK, STOCK: STOCK, KMOD: KMOD}, {})
    got = {a.dev: (a.op, a.why) for a in acts}
    assert got == {"sb": ("keep", "in sync"), "sh": ("keep", "in sync"),
                   "kb": ("keep", "in sync"), "old": ("reenable", "rt_prio changed"),
                   "new": ("enable", "not enabled")}
    prio = {a.dev: a.request.rt_prio for a in acts if a.request is not None}
    assert prio == {"sb": 0, "sh": 50, "kb": 50, "old": 0, "new": 0}


def test_apply_refuses_fifo_for_stock_busy_from_the_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config.parse('backend = "stock"\n[defaults]\nrt_prio = 50\nmode = "busy"\n'
                       '[[device]]\nname = "eth1"\n')
    (a,) = config.plan(cfg, [], {"auto": STOCK, STOCK: STOCK, KMOD: KMOD}, {})
    assert a.request is not None and a.request.rt_prio == 50
    with pytest.raises(InvalidInput, match=r"rt_prio in kbp\.toml"):
        stock.StockBackend().check(a.request)
