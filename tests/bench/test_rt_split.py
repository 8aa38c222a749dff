"""The rt-split scenario without root: its roles and the exclusive mode's non-RT CPU on fake
1- to 5-CPU layouts, bad input refused in plan() (before anything changes), the summary and
report from synthetic records (Table 3's mean/p99/SD, heavy Gbit/s, RT CPU use, ratios to
napi of the same repetition, the steering check), the exclusive mode's moves with the system
calls faked, and the CLI's --uniform and presets."""

from __future__ import annotations

from typing import Any

import pytest

from kbp.bench import cli, modes, placement, report, scenarios
from kbp.bench import heavy as hs
from kbp.bench.runner import Aborted, Bench, BenchConfig
from kbp.bench.scenarios import rt_split
from kbp.system import journal


def _excl_modes() -> dict[str, Any]:
    """Fresh adapters of the exclusive CPU modes (exclusive and the -excl modes)."""
    return modes.make_modes(modes.named(lambda i: i.category == modes.EXCL))


def _bench(layout: list[int], **kw: Any) -> Bench:
    kw.setdefault("scenario", "rt-split")
    return Bench(BenchConfig(**kw), cpus_available=lambda: layout)


def test_registered() -> None:
    s = scenarios.get("rt-split")
    assert s is rt_split.SCENARIO
    assert s.links == ("rt", "heavy") and s.parts == ("rtt",)
    assert s.rt_roles == ("heavy",) and s.app_policy == "fifo"
    assert scenarios.default_modes(s) == ("napi", "threaded", "exclusive", "stock-hybrid",
                                          "hybrid", "busy", "stock-hybrid-excl", "hybrid-excl",
                                          "busy-excl", "stock-hybrid-part", "hybrid-part",
                                          "busy-part")
    assert set(s.make_modes()) == {"exclusive", "stock-hybrid-excl", "hybrid-excl",
                                   "busy-excl", "stock-hybrid-part", "hybrid-part", "busy-part",
                                   "stock-hybrid-part-repoll0"}
    both = s.make_modes()["stock-hybrid-excl"]
    assert both.inner.name == "stock-hybrid" and both.spins is False
    assert hs.exclusive_like("busy-excl") and not hs.exclusive_like("busy")
    assert s.make_modes()["exclusive"] is not s.make_modes()["exclusive"]   # fresh per run
    assert "exclusive" in cli.description()


@pytest.mark.parametrize(("layout", "cpus", "nonrt"), [
    ([0, 1], {"tester": 0, "rt": 1, "flood": 0, "heavy": 1, "app": 1, "harness": 0}, 0),
    ([0, 1, 2], {"tester": 0, "rt": 1, "flood": 2, "heavy": 1, "app": 1, "harness": 0}, 2),
    ([0, 1, 2, 3], {"tester": 0, "rt": 1, "flood": 2, "heavy": 1, "app": 1, "harness": 3}, 3),
    ([0, 1, 2, 3, 4], {"tester": 0, "rt": 1, "flood": 2, "heavy": 1, "app": 1, "harness": 3},
     4),
    ([4, 7], {"tester": 4, "rt": 7, "flood": 4, "heavy": 7, "app": 7, "harness": 4}, 4),
])
def test_roles_and_the_non_rt_cpu(layout: list[int], cpus: dict[str, int], nonrt: int,
                                  ) -> None:
    b = _bench(layout)
    p = b.plan()
    assert dict(p.cpus) == cpus
    assert hs.nonrt_cpu(p) == nonrt != p.cpu("rt")
    assert b.cfg.parts == ["rtt"]                       # default_parts: no rtt-tcp, no idle
    assert b.cfg.modes == list(scenarios.default_modes(rt_split.SCENARIO))
    assert b.app_fifo() == 51


def test_pins() -> None:
    p = _bench([0, 1, 2, 3], cpus={"rt": 3}).plan()
    assert (p.cpu("rt"), p.cpu("heavy")) == (3, 3)
    assert hs.nonrt_cpu(p) not in (3,)
    with pytest.raises(Aborted, match="only the app and the heavy receiver may share it"):
        _bench([0, 1], cpus={"rt": 1, "flood": 1}).plan()
    with pytest.raises(Aborted, match="needs 2 CPUs"):
        _bench([0]).plan()


@pytest.mark.parametrize(("kw", "match"), [
    ({"loads": ["on", "udp"]}, "unknown load 'udp' for rt-split"),
    ({"poisson": False}, "not --constant"),
    ({"rate": 5000.0}, "not --rate"),
    ({"duration": 0.5}, "at least 1 s"),
    ({"uniform_us": [10000.0, 1000.0]}, "0 < MIN_US <= MAX_US"),
    ({"uniform_us": [0.0, 1000.0]}, "0 < MIN_US <= MAX_US"),
    ({"uniform_us": [1000.0]}, "two numbers"),
    ({"modes": ["napi", "exclusive", "nope"]}, "unknown mode 'nope' for scenario rt-split"),
    ({"modes": ["exclusive", "stock-hybrid"]}, "keep it in --modes"),
])
def test_bad_input_refused_in_plan(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(Aborted, match=match):
        _bench([0, 1], **kw).plan()


def test_exclusive_is_rt_split_and_shared_cpu_only() -> None:
    with pytest.raises(Aborted, match="unknown mode 'exclusive' for scenario veth-inline"):
        _bench([0, 1], scenario="veth-inline", modes=["napi", "exclusive"]).plan()
    _bench([0, 1], modes=["napi", "exclusive"], uniform_us=[500.0, 2000.0]).plan()
    b = _bench([0, 1], scenario="shared-cpu")
    b.plan()
    assert {"exclusive", "stock-hybrid-excl", "hybrid-excl", "busy-excl"} <= set(b.cfg.modes)


def test_uniform_in_other_scenarios_too() -> None:
    b = _bench([0, 1], scenario="shared-cpu", uniform_us=[1000.0, 10000.0])
    b.plan()
    assert report.arrival_words({"uniform_us": [1000, 10000]}) == \
        "random inter-arrival uniform in 1000-10000 µs (182 req/s mean)"
    assert report.arrival_words({"rate": 2000.0, "poisson": True}) == \
        "2000 req/s random (exponential) inter-arrival"


# -- the exclusive mode, system calls faked --------------------------------------------------
class _FakeFlood:
    server = None


class _Rps:
    """The heavy device's rps_cpus files, as kbpctl's sysfs handler reads and writes them
    (``stuck``: writes succeed and change nothing)."""

    def __init__(self, masks: dict[str, str]) -> None:
        self.masks, self.writes, self.stuck = masks, [], False

    def get(self, key: dict[str, Any]) -> str:
        return self.masks[key["attr"].split("/")[1]]

    def set(self, key: dict[str, Any], value: str) -> None:
        q = key["attr"].split("/")[1]
        self.writes.append({q: value})
        if not self.stuck:
            self.masks[q] = value


def _heavy(monkeypatch: pytest.MonkeyPatch) -> tuple[hs.HeavySide, _Rps]:
    files = _Rps({"rx-0": "2"})
    monkeypatch.setattr(hs.steer, "rps_keys", lambda ns, dev: [
        {"netns": ns, "dev": dev, "ifindex": 7, "attr": "queues/rx-0/rps_cpus"}])
    monkeypatch.setattr(hs.steer, "read_rps", lambda ns, dev: dict(files.masks))
    monkeypatch.setattr(modes, "sysfs_net", lambda ns, dev, attr: "0")
    ex = journal.Executor(None, {journal.KIND_SYSFS: files})
    h = hs.HeavySide("ns-s", "heavy-s-ab", 1, 0, _FakeFlood(),  # type: ignore[arg-type]
                     cpu_now=1, ex=ex)
    return h, files


def test_exclusive_moves_and_puts_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from kbp.bench.modes import AppEnv, AppPlace, Target
    h, files = _heavy(monkeypatch)
    m = hs.ExclusiveMode(heavy=h)
    t = Target("ns-s", "rt-s-ab", 1)
    assert m.unavailable() is None and not m.needs_fresh_device(t)
    assert m.app_place(AppPlace(1, 51), AppEnv()) == AppPlace(1, 51)
    m.setup(t)
    assert h.cpu_now == 0 and files.writes == [{"rx-0": "1"}]
    assert m.describe()["nonrt_cpu"] == 0
    m.teardown()
    assert h.cpu_now == 1 and files.writes[-1] == {"rx-0": "2"}
    m.teardown()                                     # twice: nothing more to put back
    assert len(files.writes) == 2
    # both moves journaled in the testbed's steering: its undo leaves the mask it found
    files.masks["rx-0"] = "1"
    h.ex.restore()
    assert files.masks == {"rx-0": "2"}


def test_exclusive_refuses_without_the_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    from kbp.bench.modes import Target
    monkeypatch.setattr(modes, "sysfs_net", lambda ns, dev, attr: "0")
    with pytest.raises(hs.HeavyError,
                       match="only in the rt-split and shared-cpu scenarios"):
        hs.ExclusiveMode().setup(Target("ns", "dev", 1))
    monkeypatch.setattr(modes, "sysfs_net", lambda ns, dev, attr: "1")
    with pytest.raises(hs.HeavyError, match="threaded is 1"):
        hs.ExclusiveMode().setup(Target("ns", "dev", 1))


def test_the_idle_part_skips_the_exclusive_modes_with_the_reason() -> None:
    """The idle part runs before the scenario starts the heavy flow: the exclusive modes have
    nothing to move yet, so they are recorded as skipped (their idle cost is their base
    mode's) instead of failing the whole run (which they did, 2026-11-24)."""
    from kbp.bench import parts
    m = _excl_modes()
    assert "napi's" in (m["exclusive"].idle_problem() or "")
    assert "stock-hybrid's" in (m["stock-hybrid-excl"].idle_problem() or "")
    ran: list[str] = []

    class _B:
        def __init__(self) -> None:
            self.modes = {"napi": modes.NapiMode(), **m}
            self.results: dict[str, Any] = {"idle_skipped": {}}

        def order(self, rep: int) -> list[str]:
            return ["napi", "exclusive", "stock-hybrid-excl"]

        def note(self, s: str) -> None:
            pass

        def idle_run(self, name: str) -> None:
            ran.append(name)
    b = _B()
    parts.idle(b)  # type: ignore[arg-type]
    assert ran == ["napi"]
    assert set(b.results["idle_skipped"]) == {"exclusive", "stock-hybrid-excl"}
    lines = report.idle_section({"summary": {"idle": {"napi": {}}}, "config": {},
                                 "idle_skipped": b.results["idle_skipped"]})
    assert any(line.startswith("- stock-hybrid-excl: ") for line in lines)


def test_mask_that_does_not_stick_is_a_restore_problem(monkeypatch: pytest.MonkeyPatch,
                                                       ) -> None:
    from kbp.bench.knobs import KnobError
    h, files = _heavy(monkeypatch)
    files.stuck = True
    with pytest.raises(KnobError, match="did not stick"):
        h.place(0)


# -- summary and report from synthetic records -------------------------------------------------
def _run(mode: str, rep: int, mean: float, p99: float, sd: float, gbit: float,
         rt_busy: float, rt: int, other: int, cond: str = "tcp") -> dict[str, Any]:
    excl = mode == "exclusive"
    heavy_pps = gbit * 1e9 / 8 / 1514
    on_rt = 150.0 if excl else heavy_pps + 150
    on_other = heavy_pps if excl else 10.0
    cpus = {str(rt): {"busy_pct": rt_busy, "pct": {"softirq": 30.0}},
            str(other): {"busy_pct": 90.0, "pct": {"softirq": 10.0}}}
    rx = {"cpu": rt, "wall_s": 2.0, "processed_per_s": on_rt, "net_rx_per_s": 7000.0,
          "received_rps": 2000, "ksoftirqd_cpu_pct": 10.0}
    return {"rep": rep, "mode": mode, "scenario": "rt-split", "part": "rtt",
            "condition": cond, "tester": {"sent": 360}, "lost": 0,
            "rtt_ns": {"n": 360, "p50": mean * 800, "p99": p99 * 1000, "p99.9": p99 * 1500,
                       "max": p99 * 2000, "mean": mean * 1000, "sd": sd * 1000},
            "sys": {"wall_s": 2.0, "cpu": cpus, "net_rx": [1, 2], "hardirqs_total": [0, 0],
                    "threads": {}},
            "poller": {"poll_ns": 40_000_000} if mode == "stock-hybrid" else {},
            "heavy": {"gbit_s": gbit, "rx_pps": heavy_pps, "wall_s": 2.0,
                      "receiver_cpus": [other if excl else rt]},
            "rt_cpu_rx": rx,
            "nonrt_cpu_rx": {"cpu": other, "wall_s": 2.0, "processed_per_s": on_other},
            "steering": {"rt-s-ab": [] if mode == "stock-hybrid" else [rt],
                         "heavy-s-ab": [other if excl else rt]}}


def _results(layout: list[int], exclusive_ok: bool = True) -> dict[str, Any]:
    p = placement.plan(layout, on_rt=("heavy",))
    rt, other = p.cpu("rt"), hs.nonrt_cpu(p)
    runs = []
    for rep in range(2):
        runs += [_run("napi", rep, 100, 1000, 300, 4.0, 95, rt, other),
                 _run("threaded", rep, 200, 3000, 600, 4.4, 96, rt, other),
                 _run("exclusive", rep, 50, 100, 25, 6.0, 30, rt, other),
                 _run("stock-hybrid", rep, 110, 500, 150, 4.8, 97, rt, other)]
    if not exclusive_ok:
        runs[2]["nonrt_cpu_rx"]["processed_per_s"] = 5.0
    return {"schema": "kbp-bench/2", "scenario": {"name": "rt-split", "title": "t"},
            "placement": {**p.to_json(), "app_policy": "fifo", "app_fifo": 51},
            "runs": runs, "rfc2544": [], "testbed": "test", "machine": {}, "modes": {},
            "rt_split": {"nonrt_cpu": other, "nonrt_roles": p.roles_on(other),
                         "uniform_us": [1000.0, 10000.0]},
            "config": {"reps": 2, "rate": 2000.0, "poisson": False, "frame": 64,
                       "duration": 2.0, "uniform_us": [1000.0, 10000.0]}}


@pytest.mark.parametrize("layout", [[0, 1], [0, 1, 2, 3]])
def test_summary_table3_and_ratios(layout: list[int]) -> None:
    res = _results(layout)
    report.add_summary(res)
    sp = res["summary"]["split"]["tcp"]
    assert sp["napi"]["rtt_mean_us"]["median"] == pytest.approx(100)
    assert sp["napi"]["rtt_sd_us"]["median"] == pytest.approx(300)
    assert "ratio_to_napi" not in sp["napi"]["rtt_p99_us"]
    assert sp["exclusive"]["rtt_p99_us"]["ratio_to_napi"]["median"] == pytest.approx(0.1)
    assert sp["stock-hybrid"]["rtt_sd_us"]["ratio_to_napi"]["median"] == pytest.approx(0.5)
    assert sp["threaded"]["heavy_gbit_s"]["ratio_to_napi"]["median"] == pytest.approx(1.1)
    assert sp["exclusive"]["cpu_rt_busy_pct"]["median"] == pytest.approx(30)
    assert sp["stock-hybrid"]["poller_poll_pct"]["median"] == pytest.approx(2.0)
    assert sp["exclusive"]["heavy_cpus"] == [hs.nonrt_cpu(report.placement_of(res))]
    assert sp["stock-hybrid"]["rps"] == ["heavy:1", "rt:off"]
    chk = res["summary"]["steering_check"]
    assert {m: (d["ok"], d["runs"], d["passed"]) for m, d in chk.items()} == {
        m: (2, 2, True) for m in ("napi", "threaded", "exclusive", "stock-hybrid")}
    md = report.markdown(res)
    assert "**Steering check: PASS**" in md and "exclusive: 2/2 on the non-RT CPU" in md
    assert ("| mode | mean (µs) | p99 (µs) | SD (µs) | p99.9 (µs) | max (µs) | heavy Gbit/s "
            "| RT CPU busy (%) | non-RT CPU busy (%) | lost (%) |") in md
    # tail cells: which largest of the run's 360 round trips, marked (< 10 above)
    assert ("| napi | 100 | 1,000 (k=4 of n=360)† | 300 | 1,500 (k=1 of n=360)† | "
            "2,000 (k=1 of n=360)† | 4 | 95 | 90 | 0 |") in md
    assert ("| exclusive | 50 x0.50 | 100 x0.10 (k=4 of n=360)† | 25 x0.08 | "
            "150 x0.10 (k=1 of n=360)† | 200 x0.10 (k=1 of n=360)† | 6 x1.50 | "
            "30 x0.32 | 90 x1.00 | 0 |") in md
    table = md[md.index("| mode | mean (µs)"):md.index("**Where the receive work ran**")]
    at = [table.index(f"| {m} |") for m in ("napi", "threaded", "exclusive", "stock-hybrid")]
    assert at == sorted(at)                  # napi, threaded, exclusive, the kbp modes
    other = hs.nonrt_cpu(report.placement_of(res))
    assert f"| tcp | exclusive | heavy:{other} rt:1 | CPU {other} | 495 | 150 | 0.00 |" in md
    assert "| tcp | napi | heavy:1 rt:1 | CPU 1 | 330 | 330,401 | 1.00 |" in md
    assert "x134" not in md                  # counters carry no ratio to napi
    assert "random inter-arrival uniform in 1000-10000 µs (182 req/s mean)" in md
    assert "| exclusive | exclusive CPU | 70.5 | 96 | 11.8 |" in md
    assert "Non-RT CPU of mode exclusive: " in md
    assert "CPU0" not in md and "CPU1" not in md


def test_steering_check_fails_honestly() -> None:
    res = _results([0, 1], exclusive_ok=False)
    report.add_summary(res)
    chk = res["summary"]["steering_check"]["exclusive"]
    assert (chk["ok"], chk["runs"], chk["passed"]) == (1, 2, False)
    md = report.markdown(res)
    assert "**Steering check: FAIL**" in md and "exclusive: 1/2 on the non-RT CPU" in md
    assert rt_split.check_line({}).startswith("**Steering check: not evaluated**")


def test_idle_condition_is_not_checked() -> None:
    res = _results([0, 1])
    res["runs"] = [dict(r, condition="idle") for r in res["runs"]]
    report.add_summary(res)
    assert res["summary"]["steering_check"] == {}
    assert "idle" in res["summary"]["split"]


def test_cli_uniform_and_presets() -> None:
    import argparse
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    cfg = cli.config_from_args(p.parse_args(["--scenario", "rt-split", "--uniform",
                                             "500,2000"]))
    assert cfg.uniform_us == [500.0, 2000.0] and cfg.loads == ["on"] and cfg.parts == ["rtt"]
    cfg = cli.config_from_args(p.parse_args(["--scenario", "rt-split", "--smoke"]))
    assert cfg.modes == ["napi", "exclusive", "stock-hybrid"] and cfg.duration == 2.0
    for bad in ("2000,500", "1,2,3", "a,b"):
        with pytest.raises(SystemExit):
            p.parse_args(["--uniform", bad])
