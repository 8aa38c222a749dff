"""Mode periodic through the kmod backend, offline (a fake module): the request mapped to
the module's knobs, journaled so disable and apply restore and compare, status (JSON and
text), the ``enabled`` line, and the module's refusals as kbpctl messages."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from kbp import backends, cli, config, kmod, names
from kbp.backends import EnableRequest, Periodic
from kbp.backends import kmod as kmod_backend
from kbp.errors import OperationFailed, Unavailable
from kbp.netdev import Link
from kbp.problems import PERIODIC_DRIFT, Problem
from kbp.sysinfo import FreqReport
from kbp.system.journal import StateDir

from .test_kmod import FakeModule

SEARCH = {"netap": 1, "round_ms": 1000, "min_interval_us": 100, "max_interval_us": 4000,
          "min_change": 20, "max_round": 300, "objective": "bytes"}


def sendable(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs this checkout's module client sends (the default objective is left out by
    a client without the objective knob)."""
    return {k: v for k, v in knobs.items()
            if k in kmod.PERIODIC_KNOBS or v != names.OBJECTIVE_BYTES}


class PeriodicModule(FakeModule):
    """A fake module whose pollers run what was attached, as kbp.ko reports it."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: kmod.KbpError | None = None
        self.knows_objective = True
        self.override: dict[str, Any] = {}
        self.requests: list[dict[str, Any]] = []

    def attach(self, dev: str, netns: str | None = None, **kw: Any) -> None:
        self.requests.append(kw)
        if self.refuse is not None:
            raise self.refuse
        if "objective" in kw and not self.knows_objective:   # the strict attribute check
            raise kmod.KbpError(errno.EINVAL, "Unknown attribute type", f"attach {dev}")
        super().attach(dev, netns, **kw)

    def pollers(self) -> list[kmod.Poller]:
        out = []
        for a in self.attached.values():
            knobs = {"interval_us": 1000, "netap": 0, **a, **self.override}
            netap = bool(knobs["netap"])
            p = kmod.Poller(cpu=a["cpu"], pid=None, mode=a["mode"], rt_prio=a["rt_prio"],
                            handbacks=3, interval_us=knobs["interval_us"], netap=netap)
            if netap:
                for k in kmod_backend.SEARCH_KNOBS:
                    setattr(p, k, knobs[k])
                p.search = kmod.NetapState(round=2, rounds=9, interval_us=1590, low_us=2510,
                                           high_us=1590, range_lo_us=knobs["min_interval_us"],
                                           range_hi_us=knobs["max_interval_us"],
                                           distance_us=1490, converged=False, restarts=0)
            out.append(p)
        return out


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[PeriodicModule, Any]:
    mod = PeriodicModule()
    monkeypatch.setattr(kmod_backend, "require_root", lambda what: None)
    monkeypatch.setattr(backends, "get_link", lambda dev, netns=None: Link(
        ifindex=999999, name=dev, kind=None, operstate="UP", up=True, rx_packets=0))
    return mod, kmod_backend.KmodBackend(state=StateDir(tmp_path), client=mod)


def test_periodic_knobs_map_to_the_module() -> None:
    assert kmod_backend.periodic_knobs(Periodic()) == SEARCH
    assert kmod_backend.periodic_knobs(Periodic(interval_us=500)) == \
        {"netap": 0, "interval_us": 500}
    capped = Periodic(round_ms=200, min_interval_us=150, max_interval_us=900, min_change=5,
                      max_round=40, objective=names.OBJECTIVE_BYTES_PER_CPU)
    assert kmod_backend.periodic_knobs(capped) == {
        "netap": 1, "round_ms": 200, "min_interval_us": 150, "max_interval_us": 900,
        "min_change": 5, "max_round": 40, "objective": "bytes-per-cpu"}
    # every knob sent is one the module client encodes
    for per in (Periodic(), Periodic(interval_us=500)):
        kmod.build_attach("eth1", cpu=1, mode="periodic",
                          **sendable(kmod_backend.periodic_knobs(per)))


def test_attachment_of_other_modes_has_no_periodic_knobs() -> None:
    assert "periodic" not in kmod_backend.attachment(EnableRequest(["eth1"]), [3], 1)
    a = kmod_backend.attachment(EnableRequest(["eth1"], mode="periodic").resolved("kmod"),
                                [3], 1)
    assert a["periodic"] == SEARCH and a["mode"] == "periodic" and a["rt_prio"] == 50


def test_default_priority_of_periodic_is_fifo_50() -> None:
    assert kmod_backend.default_rt_prio("periodic") == 50
    assert EnableRequest(["eth1"], mode="periodic").resolved("kmod").rt_prio == 50


@pytest.mark.parametrize(("per", "knobs"), [
    (None, SEARCH),
    (Periodic(interval_us=500), {"netap": 0, "interval_us": 500}),
])
def test_enable_journal_disable(fake: tuple[PeriodicModule, Any], per: Periodic | None,
                                knobs: dict[str, int]) -> None:
    mod, be = fake
    be.enable(EnableRequest(["eth1"], cpus=[1], mode="periodic", periodic=per))
    a = mod.attached["eth1"]
    assert (a["mode"], a["cpu"], a["rt_prio"], a["linger_us"], a["freq_ctl"]) == \
        ("periodic", 1, 50, None, False)
    assert set(a) - {"cpu", "queue_map", "mode", "linger_us", "quota", "rt_prio",
                     "freq_ctl"} == set(sendable(knobs))
    assert {k: a[k] for k in sendable(knobs)} == sendable(knobs)
    (rec,) = be.state.records()
    assert rec.changes[0].new["periodic"] == knobs
    assert rec.request["periodic"] == dataclass_dict(per or Periodic())
    be.disable(["eth1"])
    assert mod.attached == {} and be.state.records() == []


def dataclass_dict(per: Periodic) -> dict[str, Any]:
    from dataclasses import asdict
    return asdict(per)


def test_apply_compares_the_periodic_knobs(fake: tuple[PeriodicModule, Any]) -> None:
    _mod, be = fake
    be.enable(EnableRequest(["eth1"], cpus=[1], mode="periodic",
                            periodic=Periodic(interval_us=500)))
    recs = be.state.records()
    cfg = config.parse('[[device]]\nname = "eth1"\nmode = "periodic"\ncpus = "1"\n'
                       'interval_us = 500\nbackend = "kmod"\n')
    (a,) = config.plan(cfg, recs, {"kmod": "kmod", "auto": "kmod"}, {})
    assert a.op == "keep"
    cfg = config.parse('[[device]]\nname = "eth1"\nmode = "periodic"\ncpus = "1"\n'
                       'interval_us = 700\nbackend = "kmod"\n')
    (a,) = config.plan(cfg, recs, {"kmod": "kmod", "auto": "kmod"}, {})
    assert (a.op, a.why) == ("reenable", "periodic changed")


def test_status_json_shows_knobs_and_search(fake: tuple[PeriodicModule, Any]) -> None:
    _mod, be = fake
    be.enable(EnableRequest(["eth1"], cpus=[1], mode="periodic",
                            periodic=Periodic(round_ms=200, max_interval_us=2000)))
    devs, pollers = be.describe(None, None, be.state.records())
    st = backends.Status(kernel="6.12", auto="kmod", backends={}, devices=devs,
                         pollers=pollers, cpufreq=FreqReport(False, note="no cpufreq"))
    js = json.loads(json.dumps(st.to_json()))
    (d,) = js["devices"]
    assert d["mode"] == "periodic" and d["problems"] == []
    assert d["periodic_request"]["interval_us"] is None
    assert d["periodic_request"]["round_ms"] == 200
    (p,) = js["pollers"]
    per = p["periodic"]
    assert (per["netap"], per["handbacks"], per["round_ms"], per["max_interval_us"],
            per["min_change"], per["max_round"], per["objective"]) == \
        (True, 3, 200, 2000, 20, 300, "bytes")
    assert per["search"]["interval_us"] == 1590 and per["search"]["range_hi_us"] == 2000
    from kbp.render import _backend_cell, periodic_line
    assert _backend_cell(devs[0]) == "kmod periodic search 100..2000us"
    line = periodic_line(pollers[0])
    assert line.startswith("kbp/1 periodic: 3 hand-backs to interrupts, search round 2")
    assert "distance 1490 us (rounds of 200 ms, restart on a change above 20 % or every 300 "\
        "rounds); objective bytes: last round" in line
    from rich.console import Console

    from kbp.render import status_view
    con = Console(width=250, record=True)
    con.print(status_view(st))
    text = " ".join(con.export_text().split())
    assert "kmod periodic search 100..2000us" in text and " ".join(line.split()) in text


def test_status_of_a_fixed_interval(fake: tuple[PeriodicModule, Any]) -> None:
    _mod, be = fake
    be.enable(EnableRequest(["eth1"], cpus=[1], mode="periodic",
                            periodic=Periodic(interval_us=500)))
    (d,), (p,) = be.describe(None, None, be.state.records())
    assert p.periodic == {"interval_us": 500, "netap": False, "handbacks": 3}
    assert d.problems == [] and d.periodic_request is not None
    assert d.periodic_request["interval_us"] == 500
    from kbp.render import _backend_cell
    assert _backend_cell(d) == "kmod periodic every 500us"


def test_status_says_when_the_poller_drifted(fake: tuple[PeriodicModule, Any]) -> None:
    mod, be = fake
    be.enable(EnableRequest(["eth1"], cpus=[1], mode="periodic",
                            periodic=Periodic(interval_us=500)))
    mod.override = {"interval_us": 700}          # kmod.poller_set behind kbpctl's back
    (d,), _ = be.describe(None, None, be.state.records())
    assert d.problems == [Problem(PERIODIC_DRIFT, "poller kbp/1 runs interval_us 700 (enabled "
                                  "with 500): 'kbpctl apply' or enable again")]
    mod.override = {"netap": 1, **{k: v for k, v in SEARCH.items() if k != "netap"}}
    (d,), _ = be.describe(None, None, be.state.records())
    assert len(d.problems) == 1 and "netap 1 (enabled with 0)" in d.problems[0].text
    assert d.problems[0].kind == PERIODIC_DRIFT


# -- refusals -------------------------------------------------------------------------
def test_module_range_refusal_is_a_clear_message(fake: tuple[PeriodicModule, Any]) -> None:
    mod, be = fake
    mod.refuse = kmod.KbpError(errno.ERANGE, "interval_us 5 out of range (10-100000)",
                               "attach eth1")
    with pytest.raises(OperationFailed) as e:
        be.enable(EnableRequest(["eth1"], cpus=[1], mode="periodic",
                                periodic=Periodic(interval_us=500)))
    assert str(e.value) == ("enabling eth1 with the kbp module failed: attach eth1: "
                            "interval_us 5 out of range (10-100000) (ERANGE); every change "
                            "was rolled back")
    assert mod.attached == {} and be.state.records() == []


def test_objective_with_and_without_the_knob(fake: tuple[PeriodicModule, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    mod, be = fake
    cpu_req = EnableRequest(["eth1"], cpus=[1], mode="periodic",
                            periodic=Periodic(objective=names.OBJECTIVE_BYTES_PER_CPU))
    default = EnableRequest(["eth1"], cpus=[1], mode="periodic")
    without = tuple(k for k in kmod.PERIODIC_KNOBS if k != "objective")
    # a module client without the knob: bytes-per-cpu refused before anything changes,
    # the default not sent
    monkeypatch.setattr(kmod, "PERIODIC_KNOBS", without)
    with pytest.raises(Unavailable, match="needs the kbp module's objective knob"):
        be.enable(cpu_req)
    assert mod.attached == {} and be.state.records() == []
    be.enable(default)
    assert "objective" not in mod.attached["eth1"]
    be.disable(["eth1"])
    # a client and a module with the knob: the default is sent too (the module keeps a
    # CPU's knobs across requests, so an earlier bytes-per-cpu would stay)
    monkeypatch.setattr(kmod, "PERIODIC_KNOBS", (*without, "objective"))
    be.enable(default)
    assert mod.attached["eth1"]["objective"] == "bytes"
    be.disable(["eth1"])
    # a module without it: the default retried without the attribute ...
    mod.knows_objective = False
    mod.requests.clear()
    be.enable(default)
    assert ["objective" in r for r in mod.requests] == [True, False]
    assert "objective" not in mod.attached["eth1"]
    be.disable(["eth1"])
    # ... bytes-per-cpu refused in words, and rolled back
    with pytest.raises(OperationFailed) as e:
        be.enable(cpu_req)
    msg = str(e.value)
    assert "the loaded kbp module does not know the objective knob" in msg
    assert "--objective bytes-per-cpu needs a newer kbp.ko" in msg and "[Errno" not in msg
    assert mod.attached == {} and be.state.records() == []


def test_cap_sys_nice_hint_reaches_the_message(fake: tuple[PeriodicModule, Any]) -> None:
    mod, be = fake
    mod.refuse = kmod.KbpError(errno.EPERM, "mode busy and rt_prio > 0 need CAP_SYS_NICE",
                               "attach eth1")
    with pytest.raises(OperationFailed, match="--mode hybrid --rt-prio 0"):
        be.enable(EnableRequest(["eth1"], cpus=[1], mode="busy"))


# -- the enabled line -----------------------------------------------------------------
class _Enabling:
    name = "kmod"

    def enable(self, req: EnableRequest) -> backends.EnableResult:
        return backends.EnableResult("kmod", "", [backends.DeviceResult(
            d, None, "kmod", 1, req.cpus or [0], 1) for d in req.devices])


def test_enabled_line_names_the_knobs(capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "get", lambda name, state=None: _Enabling())
    assert cli.main(["enable", "eth1", "--backend", "kmod", "--mode", "periodic",
                     "--cpus", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("enabled eth1: kmod backend, periodic, interval searched in "
                          "100..4000 us (rounds of 1000 ms, restart on a change above 20 % or "
                          "every 300 rounds, objective bytes), 1 NAPI on CPU 1, SCHED_FIFO 50")
    assert err == ""
    assert cli.main(["enable", "eth1", "--backend", "kmod", "--mode", "periodic",
                     "--interval-us", "500", "--cpus", "1"]) == 0
    assert capsys.readouterr().out.startswith(
        "enabled eth1: kmod backend, periodic, every 500 us, 1 NAPI on CPU 1, SCHED_FIFO 50")
