"""vm/experiments/outsource_scale.py's pure parts: the plan, the names, the summary, the table
(no VM: the bench's guest and host sides need root, QEMU and minutes)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    from vm.experiments import outsource_scale
    return outsource_scale


def test_plan_has_every_mode_once_per_rep_and_is_seeded(scale: ModuleType) -> None:
    modes = scale.parse_modes("napi,kbp,outsource,outsource-idle")
    plan = scale.build_plan(modes, 3, 1, 2)
    assert len(plan) == 12
    for rep in range(3):
        assert sorted(plan[rep * 4:rep * 4 + 4]) == sorted(modes)
    assert plan == scale.build_plan(modes, 3, 1, 2)
    orders = {tuple(scale.build_plan(modes, 3, s, n)) for s in (1, 2) for n in (1, 2, 4)}
    assert len(orders) > 1  # seeded per seed and N, not one fixed order
    assert scale.parse_guests("1, 2,4") == [1, 2, 4]
    for bad in ("0", "x", ""):
        with pytest.raises(SystemExit, match="--guests"):
            scale.parse_guests(bad)
    with pytest.raises(SystemExit, match="--modes"):
        scale.parse_modes("napi,busy")


def test_guest_names_differ_and_fit_ifnamsiz(scale: ModuleType, tmp_path: Path) -> None:
    names = scale.guest_names(4, tmp_path, 1234567)
    for field in ("netns", "tap", "lock", "dir"):
        assert len({getattr(g, field) for g in names}) == 4
    assert all(len(g.tap) <= 15 for g in scale.guest_names(99, tmp_path, 99999))
    assert names[3].xchg == tmp_path / "n4" / "g3" / "xchg"


def test_header_delta_keeps_unknown_keys(scale: ModuleType) -> None:
    before = {"state": "attached", "epoch": "1", "completions_irq": "10", "irqs": "4"}
    after = {"state": "attached", "epoch": "1", "completions_irq": "25", "irqs": "9",
             "completions_idle": "7", "mode": "x"}
    assert scale.header_delta(before, after) == {
        "state": "attached", "epoch": 0, "completions_irq": 15, "irqs": 5,
        "completions_idle": 7, "mode": "x"}
    assert scale.header_delta({"state": "attached"}, {"state": "host-dead"}) == {
        "state": "attached->host-dead"}


def test_iperf_mbps(scale: ModuleType) -> None:
    doc = {"end": {"sum_received": {"bits_per_second": 12.5e6}}}
    assert scale.iperf_mbps(json.dumps(doc)) == 12.5
    assert scale.iperf_mbps('{"error": "unable to connect"}') is None
    assert scale.iperf_mbps("not json") is None


def _run(guest: int, mode: str, rep: int, mean: float, *, error: str | None = None,
         msgs: int = 100, mbps: float | None = 50.0) -> dict:
    counters = {"irq_kbp_so": 2 * msgs if mode.startswith("outsource") else 0,
                "irq_nic": 3 * msgs, "irq_devices": 5 * msgs, "net_rx": msgs}
    return {"guest": guest, "mode": mode, "rep": rep, "step": 0, "error": error,
            "sockperf_rc": 0, "messages": 0 if error else msgs,
            "rtt_us": {"n": msgs, "mean": None if error else mean,
                       "p50": None if error else mean, "p99": None if error else 2 * mean,
                       "sd": None if error else 1.0},
            "throughput_mbps": None if error else mbps, "guest_counters": counters,
            "per_message": {k: v / msgs for k, v in counters.items()},
            "host_cpu_us_per_message": {"qemu": 30.0, "kbp_sod": 10.0 if not error else 0.0},
            "so_header": {} if error else {"state": "attached", "completions_irq": rep + 1}}


def _round() -> dict:
    runs = [_run(0, "napi", 0, 100.0), _run(0, "napi", 1, 200.0),
            _run(0, "outsource", 0, 50.0), _run(0, "outsource", 1, 50.0, mbps=100.0),
            _run(1, "napi", 0, 400.0), _run(1, "outsource", 0, 100.0),
            _run(0, "outsource-idle", 0, 0, error="no idle_poll_us"),
            _run(1, "outsource-idle", 0, 0, error="no idle_poll_us")]
    return {"guests": 2, "plan": [], "vm_rc": [0, 0], "runs": runs}


def test_summary_medians_and_ratios_per_guest_and_rep(scale: ModuleType) -> None:
    rows = {(r["guest"], r["mode"]): r for r in scale.summarize_round(_round())}

    def med(row: dict, key: str) -> float | None:
        return row["summary"][key]["median"]

    def ratio(row: dict, key: str) -> float | None:
        return row["summary"][key].get("ratio_to_napi", {}).get("median")

    napi, so = rows[0, "napi"], rows[0, "outsource"]
    assert med(napi, "mean") == 150.0 and ratio(napi, "mean") is None
    assert (napi["summary"]["mean"]["min"], napi["summary"]["mean"]["max"]) == (100.0, 200.0)
    # per repetition 50/100 and 50/200, then the median (not 50/150)
    assert ratio(so, "mean") == pytest.approx((0.5 + 0.25) / 2)
    assert med(so, "mbps") == 75.0 and ratio(so, "mbps") == pytest.approx(1.5)
    assert med(so, "irq_kbp_so") == 2.0 and med(so, "irq_nic") == 3.0
    assert med(so, "cpu") == 40.0
    assert so["so_header"]["completions_irq"]["median"] == 1.5
    assert "state" not in so["so_header"]
    assert ratio(rows[1, "outsource"], "mean") == 0.25
    every = rows["all", "outsource"]
    assert med(every, "mean") == 50.0 and ratio(every, "mean") == pytest.approx(0.25)
    idle = rows[0, "outsource-idle"]
    assert idle["errors"] == ["no idle_poll_us"] and (idle["failed"], idle["runs"]) == (1, 1)
    assert med(idle, "msgs") is None and rows[0, "outsource"]["failed"] == 0


def test_render_shows_ratios_failures_and_the_emulation_note(scale: ModuleType) -> None:
    doc = {"flavour": "6.12-amd64", "accel": "tcg", "vcpus": 1, "mps": 1000, "size": 64,
           "load": "iperf3", "load_bitrate": "", "seconds": 3, "reps": 2,
           "rounds": [_round()]}
    text = scale.render(doc)
    assert "EMULATED" in text and "### N = 2 guest(s)" in text
    assert "| 0 | outsource | 50 x0.38 |" in text
    assert "| 1 | outsource-idle (1 of 1 failed: no idle_poll_us) | - |" in text
    assert "| all | napi | 200 [100-400] |" in text
    assert "| guest | mode | completions_irq |" in text
    head = next(line for line in text.splitlines() if line.startswith("| guest | mode | RTT"))
    assert head.count("|") == len(scale.COLUMNS) + 3
    assert all(line.count("|") == head.count("|") for line in text.splitlines()
               if line.startswith(("| 0 |", "| 1 |", "| all |")) and line.count("|") > 6)
