"""The part modes (hybrid-part, busy-part, stock-hybrid-part: RT and heavy receive work split by
class on the RT CPU itself, issue 24) without root: where they are offered and where refused
with the reason, which device gets which EnableRequest on which role's CPU (any CPU count),
the heavy device's per-packet NAPI put back, the stock backend's class checked after enable;
the per-mode heavy throughput in the shared-cpu and rt-split summaries, JSON and report; one
colour per mode in the plots."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kbp import names
from kbp.bench import heavy as hs
from kbp.bench import modes, plots, report, scenarios
from kbp.bench import parts as pt
from kbp.bench import placement as pl
from kbp.bench.modes import AppEnv, AppPlace, Target, availability
from kbp.bench.runner import Aborted, Bench, BenchConfig

PARTS = ("stock-hybrid-part", "hybrid-part", "busy-part")


def _own() -> dict[str, Any]:
    """Fresh adapters of the heavy-receiver scenarios' own modes (exclusive CPU and part)."""
    return scenarios.get("rt-split").make_modes()


def _bench(layout: list[int], **kw: Any) -> Bench:
    return Bench(BenchConfig(**kw), cpus_available=lambda: layout)


# -- where they are offered ------------------------------------------------------------------
@pytest.mark.parametrize("scen", ["rt-split", "shared-cpu"])
def test_offered_wherever_the_exclusive_modes_are(scen: str) -> None:
    s = scenarios.get(scen)
    assert set(PARTS) <= set(s.own_modes) and set(PARTS) <= set(s.make_modes())
    assert set(PARTS) <= set(scenarios.default_modes(s))
    assert "exclusive" in s.own_modes                # the yardstick stays
    for m in PARTS:
        assert "class non-rt" in s.own_modes[m] and "nothing moved" in s.own_modes[m]
    b = _bench([0, 1], scenario=scen, modes=["napi", "exclusive", *PARTS])
    b.plan()
    assert b.cfg.modes == ["napi", "exclusive", *PARTS]
    assert {"hybrid-part", "busy-part"} <= set(modes.named(lambda i: i.module))


@pytest.mark.parametrize("scen", ["rt-split", "shared-cpu"])
def test_the_repoll0_variant_runs_only_when_named(scen: str) -> None:
    """stock-hybrid-part-repoll0 (the split without the heavy NAPIs' deferral) is offered for
    an interleaved comparison with stock-hybrid-part, but never among a scenario's defaults
    (it would lengthen every default run by a mode)."""
    s = scenarios.get(scen)
    v = "stock-hybrid-part-repoll0"
    info = modes.catalog()[v]
    assert v in s.own_modes and info.on_request and "--repoll-us 0" in info.summary
    assert v not in scenarios.default_modes(s)
    assert not any(modes.catalog()[m].on_request for m in scenarios.default_modes(s))
    b = _bench([0, 1], scenario=scen, modes=["napi", "stock-hybrid-part", v])
    b.plan()
    assert b.cfg.modes == ["napi", "stock-hybrid-part", v]
    assert s.make_modes()[v].repoll_us == 0 and s.make_modes()["stock-hybrid-part"].repoll_us \
        is None


def test_the_backends_own_checks_judge_the_repoll_variant() -> None:
    """The real backends' static checks: stock takes --repoll-us 0 in class non-rt; the
    module's backend refuses the knob with its reason (so a kmod variant would be refused
    before anything changed)."""
    assert hs.nonrt_refusal(names.BACKEND_STOCK, 0) is None
    why = hs.nonrt_refusal(names.BACKEND_KMOD, 0)
    assert why is not None and "--repoll-us is a knob of the stock backend" in why, why


@pytest.mark.parametrize("scen", ["veth-inline", "stream"])
def test_refused_in_the_scenarios_without_a_heavy_device(scen: str) -> None:
    with pytest.raises(Aborted, match=f"unknown mode 'stock-hybrid-part' for scenario {scen}"):
        _bench([0, 1], scenario=scen, modes=["napi", "stock-hybrid-part"]).plan()


def test_module_part_modes_unavailable_without_the_module(monkeypatch: pytest.MonkeyPatch,
                                                          ) -> None:
    from kbp.backends.kmod import KmodBackend
    monkeypatch.setattr(KmodBackend, "available", lambda self: (False, "kbp module not loaded"))
    own = _own()
    why = availability(["hybrid-part", "busy-part"], own)
    for m in ("hybrid-part", "busy-part"):
        assert why[m] is not None and why[m].startswith("kbp module not loaded (runs in the VM "
                                                        "rig"), why[m]


def test_module_part_modes_available_with_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    from kbp.backends.kmod import KmodBackend
    monkeypatch.setattr(KmodBackend, "available", lambda self: (True, "kbp module loaded"))
    assert availability(["hybrid-part", "busy-part"], _own()) == {
        "hybrid-part": None, "busy-part": None}
    assert hs.nonrt_refusal(names.BACKEND_KMOD) is None


class _StaticBe:
    """A backend whose static check refuses what ``refuse`` says no to."""

    def __init__(self, refuse: Any) -> None:
        self.refuse = refuse

    def _check_static(self, req: Any) -> None:
        why = self.refuse(req)
        if why:
            from kbp.errors import InvalidInput
            raise InvalidInput(why)

    def available(self) -> tuple[bool, str]:
        return True, "ok"


@pytest.mark.parametrize(("refuse", "expect"), [
    # knows the class: non-rt busy refused (issue 24), non-rt hybrid taken
    (lambda r: "class non-rt is hybrid only" if r.cls == "non-rt" and r.mode == "busy"
     else None, None),
    # refuses the class outright: its own reason
    (lambda r: "unknown class" if r.cls == "non-rt" else None,
     "kbpctl stock backend refuses --class non-rt: unknown class"),
])
def test_stock_non_rt_class_checked_at_runtime(monkeypatch: pytest.MonkeyPatch, refuse: Any,
                                               expect: str | None) -> None:
    import kbp.backends as b
    monkeypatch.setattr(b, "get", lambda name: _StaticBe(refuse))
    why = hs.nonrt_refusal(names.BACKEND_STOCK)
    if expect is None:
        assert why is None
    else:
        assert why is not None and expect in why, why
    m = _own()["stock-hybrid-part"]
    assert m.unavailable() == why


def test_the_stock_backend_serves_the_non_rt_class() -> None:
    """The real stock backend takes a non-rt hybrid request (its class is in)."""
    assert hs.nonrt_refusal(names.BACKEND_STOCK) is None


# -- plumbing: which device gets which request, on which role's CPU ---------------------------
class _Flood:
    server = None


def _heavy(place: pl.Placement) -> hs.HeavySide:
    return hs.HeavySide("ns-s", "heavy-s-ab", place.cpu(pl.RT), hs.nonrt_cpu(place),
                              _Flood(), cpu_now=place.cpu(pl.RT))  # type: ignore[arg-type]


@pytest.fixture
def gro(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The heavy device's GRO knobs faked: what was asked, in order."""
    calls: list[tuple[str, Any]] = []
    state = {"gro": False, "gro_max_size": 65536}
    monkeypatch.setattr(pt, "napi_state", lambda ns, dev: calls.append(("state", dev))
                        or dict(state))

    def on(ns: str, dev: str) -> dict[str, Any]:
        calls.append(("per_packet", dev))
        return {"gro": True, "gro_max_size": pt.PER_PACKET_GRO_MAX}
    monkeypatch.setattr(pt, "napi_per_packet", on)
    monkeypatch.setattr(pt, "napi_restore", lambda ns, dev, before: calls.append(
        ("restore", dict(before))))
    return calls


@pytest.mark.parametrize("layout", [[0, 1], [0, 1, 2, 3], [4, 7]])
@pytest.mark.parametrize(("mode", "backend", "kbp_mode", "heavy_prio", "repoll"), [
    ("hybrid-part", "kmod", "hybrid", None, None), ("busy-part", "kmod", "busy", None, None),
    ("stock-hybrid-part", "stock", "hybrid", None, None),
    ("stock-hybrid-part-repoll0", "stock", "hybrid", None, 0)])
def test_which_device_gets_which_request(enabled_requests: list[Any],
                                         gro: list[tuple[str, Any]],
                                         monkeypatch: pytest.MonkeyPatch, layout: list[int],
                                         mode: str, backend: str, kbp_mode: str,
                                         heavy_prio: int | None, repoll: int | None) -> None:
    place = pl.plan(layout, on_rt=(pl.HEAVY,))
    rt = place.cpu(pl.RT)
    m = _own()[mode]
    m.heavy = _heavy(place)
    assert m.backend == backend and not m.moves_load
    monkeypatch.setattr(hs, "thread_placement", lambda pid: {
        "pid": pid, "policy": "SCHED_OTHER", "priority": 0, "cpus": [rt]})
    from kbp.backends import probe
    monkeypatch.setattr(probe, "poller_threads", lambda be, dev, *a, **k: {
        4242: "napi/heavy-s-ab-9"} if dev == "heavy-s-ab" else {7: "kbp/rt"})
    t = Target("ns-s", "rt-s-ab", rt, rt_prio=50)
    m.setup(t)
    rt_req, heavy_req = enabled_requests
    assert (rt_req.devices, rt_req.netns, rt_req.mode, rt_req.cpus, rt_req.cls) == (
        ["rt-s-ab"], "ns-s", kbp_mode, [rt], names.CLASS_RT)
    assert rt_req.rt_prio == (None if mode == "busy-part" and backend == "stock" else 50)
    assert (heavy_req.devices, heavy_req.netns, heavy_req.mode, heavy_req.cpus,
            heavy_req.cls, heavy_req.rt_prio, heavy_req.repoll_us) == (
        ["heavy-s-ab"], "ns-s", "hybrid", [rt], names.CLASS_NON_RT, heavy_prio, repoll)
    # the class's priority is the backend's to fill in: SCHED_NORMAL (0) on both
    assert heavy_req.resolved(backend).rt_prio == 0
    assert gro == [("state", "heavy-s-ab"), ("per_packet", "heavy-s-ab")]
    d = json.loads(json.dumps(m.describe()))
    assert d["part"]["request"] == {"mode": "hybrid", "cls": "non-rt", "cpus": [rt],
                                    "rt_prio": heavy_prio, "nice": None, "repoll_us": repoll}
    assert d["part"]["heavy_napi"] == {"gro": True, "gro_max_size": pt.PER_PACKET_GRO_MAX}
    assert m.threads() == {7: "kbp/rt"}      # the RT poller's only
    assert m.nonrt_threads() == {4242: "napi/heavy-s-ab-9"}   # the heavy device's, non-rt
    assert [t["pid"] for t in d["part"]["nonrt_threads"]] == [4242]
    m.teardown()
    assert gro[-1] == ("restore", {"gro": False, "gro_max_size": 65536})
    m.teardown()                             # twice: nothing more
    assert len(gro) == 3


def test_the_nonrt_pollers_cpu_is_recorded_beside_the_rt_pollers() -> None:
    """Issue 38: a -part mode's non-rt polling thread (kbpn/<cpu>, or the heavy device's
    napi/<dev>-<id>) is in the run's thread CPU time with its role, apart from the RT
    poller's and the app's; modes without one have none."""
    from kbp.bench import sysstat
    a = sysstat.Snapshot(t=0.0, stat={}, irqs={}, softirqs={},
                         threads={7: (0, 0, 0), 4242: (0, 0, 0), 900: (0, 0, 0)})
    b = sysstat.Snapshot(t=2.0, stat={}, irqs={}, softirqs={},
                         threads={7: (200_000_000, 0, 5), 4242: (900_000_000, 0, 9),
                                  900: (20_000_000, 0, 3)})
    d = sysstat.delta(a, b, {7: "kbp/1:rt-s-ab", 4242: "kbpn/1:heavy-s-ab", 900: "sockperf"},
                      {7: sysstat.ROLE_POLLER, 4242: sysstat.ROLE_NONRT_POLLER,
                       900: sysstat.ROLE_APP})
    assert d["threads"]["4242"]["role"] == "nonrt_poller"
    assert d["threads"]["4242"]["cpu_pct"] == pytest.approx(45.0)
    assert d["threads_cpu_pct"] == pytest.approx({"poller": 10.0, "nonrt_poller": 45.0,
                                                  "app": 1.0})
    assert "threads_cpu_pct" not in sysstat.delta(a, b)   # no roles given: as before
    assert modes.nonrt_threads(_own()["exclusive"]) == {}
    assert modes.nonrt_threads(object()) == {}


def test_app_placement_and_fresh_device_are_the_inner_modes() -> None:
    own = _own()
    home, env = AppPlace(1, 51), AppEnv(spin_app="fifo", rt_prio=50)
    assert own["busy-part"].spins and own["busy-part"].app_place(home, env) == AppPlace(1, 51)
    assert not own["hybrid-part"].spins
    assert own["stock-hybrid-part"].app_place(home, env) == home
    assert own["stock-hybrid-part"].app() == names.APP_SOCKPERF


def test_refused_before_anything_changes_without_the_scenario(enabled_requests: list[Any],
                                                              ) -> None:
    m = _own()["hybrid-part"]
    assert "its idle cost is hybrid's" in (m.idle_problem() or "")
    with pytest.raises(hs.HeavyError, match="only in the rt-split and shared-cpu"):
        m.setup(Target("ns", "dev", 1))
    assert enabled_requests == []


def test_stock_class_ignored_stops_the_run(enabled_requests: list[Any],
                                          gro: list[tuple[str, Any]],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A stock backend that ran the heavy device's NAPI thread SCHED_FIFO (it ignored the
    class) would make the run measure something else: setup stops with what it found, and
    teardown still disables and puts GRO back."""
    place = pl.plan([0, 1], on_rt=(pl.HEAVY,))
    m = _own()["stock-hybrid-part"]
    m.heavy = _heavy(place)
    from kbp.backends import probe
    monkeypatch.setattr(probe, "poller_threads", lambda *a, **k: {4242: "napi/heavy-s-ab-9"})
    monkeypatch.setattr(hs, "thread_placement", lambda pid: {
        "pid": pid, "policy": "SCHED_FIFO", "priority": 50, "cpus": [1]})
    with pytest.raises(hs.HeavyError, match="should be SCHED_OTHER on the RT CPU 1"):
        m.setup(Target("ns-s", "rt-s-ab", 1))
    m.teardown()
    assert gro[-1][0] == "restore"


def test_bind_heavy_binds_the_part_modes() -> None:
    place = pl.plan([0, 1], on_rt=(pl.HEAVY,))

    class _B:
        modes = _own()
    h = _heavy(place)
    hs.bind_heavy(_B(), h)  # type: ignore[arg-type]
    assert all(_B.modes[m].heavy is h for m in PARTS)
    assert _B.modes[modes.EXCLUSIVE].heavy is h
    assert [hs.part_like(m) for m in ("hybrid-part", "hybrid", "hybrid-excl")] == [
        True, False, False]
    assert not hs.exclusive_like("stock-hybrid-part")   # the heavy flow stays on the RT CPU


# -- the heavy flow's throughput per mode -----------------------------------------------------
def _shared_run(mode: str, rep: int, cond: str, p999: float, gbit: float,
                ) -> dict[str, Any]:
    n = 20000
    return {"rep": rep, "mode": mode, "scenario": "shared-cpu", "part": "rtt",
            "condition": cond, "tester": {"sent": n}, "lost": 0,
            "rtt_ns": {"n": n, "p50": 20_000, "p99": p999 * 500, "p99.9": p999 * 1000,
                       "max": p999 * 2000, "mean": 30_000, "sd": p999 * 100},
            "sys": {"wall_s": 10.0, "cpu": {}, "net_rx": [], "hardirqs_total": []},
            "heavy": {"rx_packets": int(gbit * 1e9 / 8 / 1514 * 10),
                      "rx_bytes": int(gbit * 1e9 / 8 * 10), "wall_s": 10.0,
                      "gbit_s": gbit if cond == "flood" else 0.0,
                      "rx_pps": gbit * 1e9 / 8 / 1514},
            "rt_cpu_rx": {"cpu": 1, "wall_s": 10.0}, "steering": {}}


def _shared_results() -> dict[str, Any]:
    p = pl.plan([0, 1], on_rt=(pl.HEAVY,))
    runs = []
    for rep in range(3):
        for mode, p999, gbit in (("napi", 1500, 5.0), ("exclusive", 150, 3.0),
                                 ("stock-hybrid-part", 300, 4.5 + rep * 0.1)):
            runs += [_shared_run(mode, rep, "idle", 120, 0.0),
                     _shared_run(mode, rep, "flood", p999, gbit)]
    tails = {f"rtt|flood|{m}": {"runs": 3, "lost": 0, "n": 60000,
                                "p99.9": {"value": v * 1000, "k": 61, "n": 60000, "few": False,
                                          "ci95": [v * 900, v * 1100]}}
             for m, v in (("napi", 1500), ("exclusive", 150), ("stock-hybrid-part", 300))}
    return {"schema": "kbp-bench/2", "scenario": {"name": "shared-cpu", "title": "t"},
            "placement": {**p.to_json(), "app_policy": "fifo", "app_fifo": 51},
            "runs": runs, "rfc2544": [], "testbed": "test", "machine": {}, "modes": {},
            "tails": tails, "flood": {"proto": "tcp"},
            "config": {"reps": 3, "rate": 2000.0, "poisson": True, "frame": 64,
                       "duration": 10.0}}


def test_shared_cpu_heavy_gbit_per_mode_in_json_and_report() -> None:
    res = report.add_summary(_shared_results())
    res = json.loads(json.dumps(res))
    rtt = res["summary"]["rtt"]["flood"]
    assert rtt["napi"]["heavy_gbit_s"]["median"] == pytest.approx(5.0)
    assert rtt["exclusive"]["heavy_gbit_s"]["ratio_to_napi"]["median"] == pytest.approx(0.6)
    pm = res["summary"]["per_mode"]
    assert (pm["condition"], pm["idle_condition"]) == ("flood", "idle")
    assert list(pm["modes"]) == ["napi", "exclusive", "stock-hybrid-part"]
    part = pm["modes"]["stock-hybrid-part"]
    assert part["reps"] == 3 and part["n"] == 20000
    assert part["heavy_gbit_s"]["median"] == pytest.approx(4.6)
    assert (part["heavy_gbit_s"]["min"], part["heavy_gbit_s"]["max"]) == pytest.approx(
        (4.5, 4.7))
    assert part["heavy_gbit_s"]["ratio_to_napi"]["median"] == pytest.approx(0.92)
    assert part["rtt_p99.9_us"]["median"] == pytest.approx(300)
    assert part["idle_rtt_p99.9_us"]["median"] == pytest.approx(120)
    assert part["p99.9_pooled"]["ci95"] == [270_000, 330_000]
    for k in ("rtt_mean_us", "rtt_p99_us", "rtt_sd_us"):
        assert part[k]["median"] is not None, k
    md = report.markdown(res)
    head = ("| mode | reps | RT p99.9 idle (µs) | RT mean (µs) flood | RT p99 (µs) flood | "
            "RT p99.9 (µs) flood | RT SD (µs) flood | RT max (µs) flood | heavy (Gbit/s) "
            "flood | RT p99.9 flood, pooled [95 % CI] (µs) |")
    assert head in md
    row = next(line for line in md.splitlines() if line.startswith("| stock-hybrid-part | 3 |"))
    assert "4.60 [4.50-4.70] x0.92" in row and "300 x0.20 (k=21 of n=20,000)" in row
    assert row.endswith("| 300 [270-330] (k=61 of n=60,000) |")
    assert "Headline: RT round trip idle and under the flood" in md


def test_rt_split_heavy_gbit_per_mode_with_reps_and_ci() -> None:
    from test_rt_split import _results
    res = _results([0, 1])
    res["tails"] = {"rtt|tcp|napi": {"runs": 2, "p99.9": {"value": 1_500_000, "k": 1,
                                                          "n": 720, "few": True,
                                                          "ci95": [1e6, 2e6]}}}
    report.add_summary(res)
    res = json.loads(json.dumps(res))
    pm = res["summary"]["per_mode"]
    assert pm["condition"] == "tcp" and set(pm["modes"]) == {"napi", "threaded", "exclusive",
                                                             "stock-hybrid"}
    assert pm["modes"]["exclusive"]["heavy_gbit_s"]["median"] == pytest.approx(6.0)
    assert pm["modes"]["exclusive"]["reps"] == 2
    md = report.markdown(res)
    assert "Headline: RT response time with the TCP heavy sender" in md
    row = next(line for line in md.splitlines() if line.startswith("| napi | 2 |"))
    assert "| 4 |" in row and row.endswith("| 1,500 [1,000-2,000] (k=1 of n=720)† |")


def test_no_heavy_column_without_a_heavy_device() -> None:
    assert report.per_mode({}, {}, "flood") == {}
    assert report.per_mode_section({}, "flood", "t") == []


# -- plots -----------------------------------------------------------------------------------
def test_one_distinct_colour_per_mode() -> None:
    pal = plots.palette()
    every = report.mode_order()
    assert set(every) <= set(pal)
    cols = [pal[m] for m in every]
    assert len(set(cols)) == len(cols), "two modes share a colour"
    assert plots.color("threaded") != plots.color("exclusive")
    assert len({plots.color(m) for m in PARTS}) == 3
    assert plots.color("no-such-mode") == plots.FALLBACK not in cols
    assert [plots.style(m) for m in ("napi", "exclusive", "hybrid-excl", "busy-part")] == [
        "-", "--", "--", "-."]
    assert set(modes.standard_modes()) <= pal.keys()


def test_a_settle_follows_the_part_modes_and_the_exclusive_ones_only() -> None:
    """Issue 38: -part reconfigures the heavy device under the flood (GRO, RPS, threaded),
    so the next mode waits settle_s after it as after a mode that moves load."""
    from kbp.bench.context import settles_after
    ms = modes.make_modes(["stock-hybrid-part", "exclusive", "napi", "stock-hybrid"])
    assert settles_after(ms["stock-hybrid-part"]) and settles_after(ms["exclusive"])
    assert not settles_after(ms["napi"]) and not settles_after(ms["stock-hybrid"])
