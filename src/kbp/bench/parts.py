"""Measurements a scenario composes (its ``parts``), each over every runnable mode in the
repetition's rotated order, so no mode always runs first or right after a load starts:

``rtt``      RT latency runs under one condition (``latency_block``), with an optional load
             (a :class:`Load`, e.g. the iperf3 flood) running for the whole block
``table2``   EE-KBP's Table 2 traffic conditions, scaled (``table2``)
``rfc2544``  RFC 2544 zero-loss throughput searches (``rfc2544``)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

from kbp.bench import rfc2544 as rfc
from kbp.bench import workloads

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig

RTT, TABLE2, RFC2544 = "rtt", "table2", "rfc2544"
TABLE2_CONDITIONS = len(workloads.TABLE2)


class Load(Protocol):
    """A competing load that runs for a whole block of latency runs."""

    def start(self) -> None: ...

    def stop(self) -> dict[str, Any]: ...


def latency_seconds(cfg: BenchConfig, duration: float) -> float:
    """Planned seconds of one latency run (run, warm-up, start and stop)."""
    return duration + cfg.warmup + 1.6


def rfc_seconds(cfg: BenchConfig) -> float:
    """Planned seconds of one RFC 2544 search: ceiling probe + ceiling + ~4 halvings (the RT
    path carries far less than the sender can offer) + refinements down to the resolution."""
    trials = 6 + max(1, math.ceil(-math.log2(cfg.rfc_resolution)))
    return trials * (cfg.rfc_trial + 0.8)


def table2_reps(cfg: BenchConfig) -> int:
    return min(cfg.table2_reps or cfg.reps, cfg.reps)


def rfc_reps(cfg: BenchConfig) -> int:
    return min(cfg.rfc_reps, cfg.reps)


def plan_seconds(cfg: BenchConfig, n_modes: int, rtt_conditions: int) -> float:
    """Planned seconds of the parts in cfg.parts (``rtt_conditions`` blocks per rep)."""
    parts = cfg.parts or []
    s = 0.0
    if RTT in parts:
        s += cfg.reps * rtt_conditions * n_modes * latency_seconds(cfg, cfg.duration)
    if TABLE2 in parts:
        s += table2_reps(cfg) * TABLE2_CONDITIONS * n_modes * latency_seconds(
            cfg, cfg.table2_duration)
    if RFC2544 in parts:
        s += rfc_reps(cfg) * len(cfg.rfc_frames) * n_modes * rfc_seconds(cfg)
    return s


def latency_block(bench: Bench, rep: int, condition: str, load: Load | None = None,
                  load_name: str = "load") -> list[dict[str, Any]]:
    """One RT latency run per mode under ``condition``; ``load`` (if any) runs throughout and
    what it reports is kept in every run's ``flood_block``."""
    cfg = bench.cfg
    stats: dict[str, Any] = {}
    block: list[dict[str, Any]] = []
    if load is not None:
        bench.note(f"rep {rep + 1}: starting the {load_name}")
        load.start()
    try:
        for m in bench.order(rep):
            block.append(bench.latency_run(
                m, rep, part=RTT, condition=condition, size=rfc.udp_payload(cfg.frame),
                rate=cfg.rate, poisson=cfg.poisson, duration=cfg.duration))
    finally:
        if load is not None:
            stats = load.stop()
    for r in block:
        r["flood_block"] = stats
    return block


def table2(bench: Bench, rep: int) -> None:
    """The Table 2 conditions (constant inter-arrival), every mode each."""
    cfg = bench.cfg
    if rep >= table2_reps(cfg):
        return
    for cond in workloads.table2(cfg.table2_scale):
        for m in bench.order(rep):
            r = bench.latency_run(m, rep, part=TABLE2, condition=cond.label,
                                  size=rfc.udp_payload(cond.frame), rate=cond.pps,
                                  poisson=False, duration=cfg.table2_duration)
            r["table2"] = cond.to_json()


def rfc2544(bench: Bench, rep: int) -> None:
    """One zero-loss search per frame size and mode."""
    cfg = bench.cfg
    if rep >= rfc_reps(cfg):
        return
    for frame in cfg.rfc_frames:
        for m in bench.order(rep):
            bench.rfc2544(m, rep, frame)
