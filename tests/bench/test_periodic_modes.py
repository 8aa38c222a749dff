"""The benchmark's periodic modes (issue 10, item 5), without root: ``periodic`` (kbp.ko's
poller) and ``stock-periodic`` (kbpctl's stock backend) are entries like the other backend
modes (planned, described, in --help), refused with the reason where they cannot run (the
module not loaded; a backend that does not offer mode periodic yet), enable with the bench's
periodic knobs, and read the search state (converged interval) into the records."""

from __future__ import annotations

from typing import Any

import pytest

from kbp import names
from kbp.bench import modes
from kbp.bench.modes import PeriodicMode, Target, all_modes, availability, search_state
from kbp.bench.runner import Aborted, Bench, BenchConfig
from kbp.errors import InvalidInput

T = Target("kbpb-test-s", "rt-s-test", 1, 50, periodic={"round_ms": 200})
PERIODIC = (modes.PERIODIC, modes.STOCK_PERIODIC)


def test_entries_like_the_other_backend_modes() -> None:
    ms = all_modes()
    assert modes.PERIODIC == names.MODE_PERIODIC == "periodic"
    assert modes.STOCK_PERIODIC == "stock-periodic"
    assert list(modes.standard_modes()) == list(ms)
    per, stock = ms["periodic"], ms["stock-periodic"]
    assert isinstance(per, PeriodicMode) and isinstance(stock, PeriodicMode)
    assert (per.backend, per.kbp_mode) == (names.BACKEND_KMOD, names.MODE_PERIODIC)
    assert (stock.backend, stock.kbp_mode) == (names.BACKEND_STOCK, names.MODE_PERIODIC)
    assert not per.spins and not stock.spins
    from kbp.bench.cli import description
    text = description()
    for name in PERIODIC:
        assert f"\n{name:<13}  " in text and "NetAP" in modes.catalog()[name].summary
    assert "``periodic``" in (modes.__doc__ or "")
    assert "``stock-periodic``" in (modes.__doc__ or "")
    assert modes.PERIODIC in modes.named(lambda i: i.module)


def test_planned_in_any_scenario() -> None:
    for scen in ("veth-inline", "shared-cpu", "stream"):
        b = Bench(BenchConfig(scenario=scen, modes=["napi", *PERIODIC]),
                  cpus_available=lambda: [0, 1])
        b.plan()
        assert b.cfg.modes == ["napi", *PERIODIC]


def test_the_bench_knobs_go_through_kbpctl_validation() -> None:
    b = Bench(BenchConfig(scenario="stream", modes=["napi", "periodic"],
                          periodic_round_ms=5), cpus_available=lambda: [0, 1])
    with pytest.raises(Aborted, match=r"round-ms 5 is out of range \(10\.\.60000\)"):
        b.plan()
    b = Bench(BenchConfig(scenario="stream", modes=["napi", "stock-periodic"],
                          periodic_interval_us=5), cpus_available=lambda: [0, 1])
    with pytest.raises(Aborted, match=r"interval-us 5 is out of range"):
        b.plan()
    # not checked when no periodic mode runs
    Bench(BenchConfig(scenario="stream", modes=["napi"], periodic_round_ms=5),
          cpus_available=lambda: [0, 1]).plan()
    ok = Bench(BenchConfig(periodic_interval_us=500), cpus_available=lambda: [0, 1])
    assert ok.periodic_knobs() == {"interval_us": 500}
    assert Bench(BenchConfig()).periodic_knobs() == {"round_ms": 200}


def test_refused_with_the_reason_where_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the module: the module's hint. A backend that refuses mode periodic (the
    placeholder until kbpctl is wired): its own words."""
    import kbp.backends as b

    class _Be:
        def __init__(self, ok: bool, refuse: str | None) -> None:
            self.ok, self.refuse = ok, refuse

        def available(self) -> tuple[bool, str]:
            return self.ok, "ok" if self.ok else "kbp module not loaded"

        def _check_static(self, req: Any) -> None:
            assert req.mode == names.MODE_PERIODIC and req.devices == ["lo"]
            if self.refuse:
                raise InvalidInput(self.refuse)

    be: dict[str, _Be] = {}
    monkeypatch.setattr(b, "get", lambda name: be[name])
    be["kmod"], be["stock"] = _Be(False, None), _Be(True, None)
    why = availability(list(PERIODIC))
    assert "kbp module not loaded" in (why["periodic"] or "")
    assert modes.VM_HINT in (why["periodic"] or "")
    assert why["stock-periodic"] is None
    be["kmod"] = _Be(True, "mode periodic is not available with the kmod backend yet")
    be["stock"] = _Be(True, "mode periodic is not available with the stock backend yet")
    why = availability(list(PERIODIC))
    assert why["periodic"] == ("kbpctl kmod backend refuses --mode periodic: mode periodic is "
                               "not available with the kmod backend yet")
    assert "stock backend refuses --mode periodic" in (why["stock-periodic"] or "")
    be["kmod"] = _Be(True, None)
    assert availability(["periodic"]) == {"periodic": None}


def test_this_hosts_backends_say_why_or_accept() -> None:
    """The real backends on this host: the module's modes need it loaded; stock-periodic is
    refused with the stock backend's own reason until kbpctl offers it (then: runnable)."""
    why = availability(list(PERIODIC))
    assert why["periodic"] is None or "module" in why["periodic"] or \
        "refuses --mode periodic" in why["periodic"]
    s = why["stock-periodic"]
    assert s is None or "stock backend" in s


def test_enable_with_the_bench_knobs(enabled_requests: list[Any]) -> None:
    import kbp.backends as b
    reqs = enabled_requests
    ms = all_modes()
    for name in ("periodic", "stock-periodic"):
        ms[name].setup(T)
        d = ms[name].describe()
        assert d["periodic"]["round_ms"] == 200 and "interval searched" in d["how"]
        ms[name].teardown()
    kmod, stock = reqs
    assert (kmod.mode, kmod.rt_prio, kmod.cpus) == ("periodic", 50, [1])
    assert kmod.periodic == b.Periodic(round_ms=200) and kmod.periodic.search
    default = b.EnableRequest(["x"]).rt_prio
    assert (stock.mode, stock.rt_prio) == ("periodic", default)    # the backend's choice
    assert stock.periodic == b.Periodic(round_ms=200)
    fixed = Target(T.netns, T.dev, 1, periodic={"interval_us": 777})
    ms["periodic"].setup(fixed)
    assert reqs[-1].periodic == b.Periodic(interval_us=777) and not reqs[-1].periodic.search
    assert "fixed at 777 us" in ms["periodic"].describe()["how"]
    ms["periodic"].teardown()


def test_kmod_search_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from kbp import kmod
    poller = kmod.Poller(cpu=1, pid=10, mode="periodic", netap=True, interval_us=None,
                         handbacks=2, round_ms=200, ifname=T.dev,
                         search=kmod.NetapState(round=11, rounds=14, interval_us=523,
                                                low_us=523, high_us=554, converged=True,
                                                restarts=0, last_objective=9000))
    other = kmod.Poller(cpu=0, pid=9, mode="hybrid")

    class _Client:
        def __enter__(self) -> _Client:
            return self

        def __exit__(self, *a: Any) -> None:
            pass

        def pollers(self) -> list[Any]:
            return [other, poller]

    monkeypatch.setattr(kmod, "Client", _Client)
    m = all_modes()["periodic"]
    assert isinstance(m, PeriodicMode)
    assert search_state(m) is None or m.target is None      # not on: nothing to read
    m.target = T
    st = search_state(m)
    assert st is not None
    assert st["interval_us"] == 523 and st["converged"] is True and st["searching"]
    assert st["rounds"] == 14 and st["restarts"] == 0 and st["handbacks"] == 2
    assert st["last_objective"] == 9000
    assert st["search"]["low_us"] == 523
    assert st["source"] == "kbp.ko poller kbp/1:rt-s-test"      # its thread's name
    poller.search = None
    poller.netap, poller.interval_us = False, 300
    st = search_state(m)
    assert st is not None and st["interval_us"] == 300 and not st["searching"]
    assert st.get("converged") is None


def test_stock_search_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stock service's state where kbpctl status reports it (a ``periodic`` entry of the
    device), else the interval in force from the NAPIs' gro_flush_timeout."""
    import kbp.backends as b
    napis = [b.NapiStatus(id=1, gro_flush_timeout_ns=600_000, defer_hard_irqs=100),
             b.NapiStatus(id=2, gro_flush_timeout_ns=600_000, defer_hard_irqs=100)]
    dev = b.DeviceStatus(name=T.dev, netns=T.netns, ifindex=3, kind="veth",
                         backend="stock", mode="periodic", napis=napis)

    def status(netns: str | None = None, devices: Any = None) -> Any:
        assert netns == T.netns and list(devices) == [T.dev]
        return type("S", (), {"devices": [dev], "pollers": []})()

    monkeypatch.setattr(b, "status", status)
    m = all_modes()["stock-periodic"]
    m.target = T
    st = search_state(m)
    assert st is not None
    assert st["interval_us"] == 600 and st["interval_from"] == "gro_flush_timeout"
    assert st["gro_flush_timeout_ns"] == [600_000, 600_000] and st["defer_hard_irqs"] == [100]
    dev.periodic = {"search": {"interval_us": 550, "converged": 1,  # type: ignore[attr-defined]
                               "rounds": 12, "restarts": 1, "round": 11}}
    st = search_state(m)
    assert st is not None and st["interval_us"] == 550 and st["converged"] is True
    assert "interval_from" not in st and st["restarts"] == 1

    # the search's own process, where the backend names it, is one of the mode's threads
    from kbp.backends import probe
    monkeypatch.setattr(probe, "poller_threads", lambda *a, **k: {41: "napi/rt-s-test-1"})
    dev.periodic["service_pid"] = 4242  # type: ignore[attr-defined]
    m._threads = m._read_threads()  # type: ignore[attr-defined]
    assert m.threads() == {41: "napi/rt-s-test-1", 4242: "periodic search"}

    def broken(**_k: Any) -> Any:
        raise OSError("netlink gone")
    monkeypatch.setattr(b, "status", broken)
    st = search_state(m)
    assert st is not None and "netlink gone" in st["error"]       # recorded, not raised


def test_non_periodic_modes_have_no_search_state() -> None:
    ms = all_modes()
    for name in ("napi", "defer", "stock-hybrid", "hybrid"):
        assert search_state(ms[name]) is None


def test_runner_records_the_search_state_in_its_runs() -> None:
    import inspect

    from kbp.bench.measure import idle, latency
    src = inspect.getsource(latency._attempt) + inspect.getsource(idle.idle_run)
    assert src.count("search_state(mode)") == 2
