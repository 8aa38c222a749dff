"""One RFC 2544 zero-loss throughput search of a mode (:mod:`kbp.bench.rfc2544` decides the
rates; kbp-rtt sends them), each trial with where packets were dropped."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kbp.bench import machine, netstats, rfc2544, sysstat, tester, workloads
from kbp.bench import placement as placement_
from kbp.bench.measure.latency import target_ip
from kbp.bench.schema import ThroughputRun
from kbp.bench.testbed import Testbed

if TYPE_CHECKING:
    from kbp.bench.runner import Bench


def search(bench: Bench, mode_name: str, rep: int, frame: int) -> ThroughputRun:
    """One RFC 2544 zero-loss search of ``mode_name``: the record, also in results."""
    cfg = bench.cfg
    assert bench.tb is not None and bench.binary is not None and bench.placement is not None
    binary = bench.binary
    mode = bench.modes[mode_name]
    tester_cpu = bench.placement.cpu(placement_.TESTER)
    size = rfc2544.udp_payload(frame)
    desc = f"rep {rep + 1}/{cfg.reps} · rfc2544 {frame}B · {mode_name}"
    bench.note(desc)
    waited = bench._wait_quiet(desc)
    quiet = machine.quiet_report()
    t_start = time.monotonic()
    ip = target_ip(bench.tb)

    def trial(rate: float) -> rfc2544.Trial:
        bench.note(f"{desc} · trial {rate:,.0f} pps")
        d0 = _drops(bench.tb)
        t0 = time.monotonic()
        try:
            r = tester.run_rate(binary, bench.tb.client if bench.tb else None, ip,
                                port=workloads.SOCKPERF_PORT, size=size, rate=rate,
                                duration=cfg.rfc_trial, cpu=tester_cpu, fifo=cfg.tester_prio)
        except tester.TesterTimeout as e:
            bench.note(f"{desc} · {e}: counted as a failed trial")
            return timed_out(rate, time.monotonic() - t0, str(e))
        d1 = _drops(bench.tb)
        return rfc2544.Trial(rate=rate, sent=int(r["sent"]), received=int(r["received"]),
                             achieved_rate=float(r["achieved_pps"]),
                             duration_s=float(r["elapsed_s"]),
                             extra={"drops": {k: d1[k] - d0.get(k, 0) for k in d1}})

    with bench._mode(mode):
        s0 = sysstat.Snapshot.take()
        hi = cfg.rfc_max_pps
        probe = None
        if hi is None:
            probe = ceiling_probe(trial)
            hi = max(1000.0, round(probe.achieved_rate * 0.98, -2))
        res = rfc2544.search(trial, hi=hi, resolution=cfg.rfc_resolution,
                             loss_tolerance=cfg.rfc_loss_tolerance)
        s1 = sysstat.Snapshot.take()
    out: ThroughputRun = {
        "rep": rep, "mode": mode_name, "part": "rfc2544", "frame": frame, "payload": size,
        "throughput_pps": res.throughput,
        "throughput_mbps": rfc2544.frame_mbps(res.throughput, frame),
        "bound": res.bound, "hi": hi, "resolution": cfg.rfc_resolution,
        "trial_s": cfg.rfc_trial,
        "ceiling_probe": None if probe is None else
        {"asked": probe.rate, "achieved_pps": probe.achieved_rate, "sent": probe.sent,
         "received": probe.received,
         **{k: probe.extra[k] for k in ("tester_timeout", "timed_out_at")
            if k in probe.extra}},
        "trials": res.trials, "sys": sysstat.delta(s0, s1),
        "waited_for_quiet_s": waited, "quiet": quiet}
    bench.results["rfc2544"].append(out)
    out["took_s"] = time.monotonic() - t_start
    bench.advance(bench.rfc_plan(), desc)
    return out


#: the ceiling probe's rates, highest first: a probe the tester cannot finish (killed after
#: its trial time plus a margin) is retried at the next one
PROBE_RATES = (5_000_000.0, 1_000_000.0, 200_000.0)


def timed_out(rate: float, took_s: float, why: str) -> rfc2544.Trial:
    """A trial whose tester had to be killed: nothing counted as received, nothing achieved,
    so the search records it as failed (sender-limited) and says why in the trial."""
    return rfc2544.Trial(rate=rate, sent=0, received=0, achieved_rate=0.0, duration_s=took_s,
                         extra={"tester_timeout": why})


def ceiling_probe(trial: Callable[[float], rfc2544.Trial],
                  rates: tuple[float, ...] = PROBE_RATES) -> rfc2544.Trial:
    """The first of ``rates`` the tester finishes: what the sender achieves sets the
    search's ceiling.  Every probe timing out leaves the last one (achieved 0, so the search
    is bounded by its 1000 pps minimum and the trials say why)."""
    probe = trial(rates[0])
    killed: list[float] = []
    for rate in rates[1:]:
        if "tester_timeout" not in probe.extra:
            break
        killed.append(probe.rate)
        probe = trial(rate)
    if killed:
        probe.extra["timed_out_at"] = killed
    return probe


def _drops(tb: Testbed | None) -> dict[str, int]:
    """Where packets were dropped: UDP socket buffers in both namespaces, veth counters."""
    if tb is None:
        return {}
    out: dict[str, int] = {}
    for ns, tag in ((tb.server, "server"), (tb.client, "client")):
        snmp = tb.run(ns, ["cat", "/proc/net/snmp"], check=False).stdout.splitlines()
        udp = [line.split()[1:] for line in snmp if line.startswith("Udp:")]
        if len(udp) == 2:
            row = dict(zip(udp[0], (int(x) for x in udp[1]), strict=False))
            out[f"{tag}_udp_rcvbuf_errors"] = row.get("RcvbufErrors", 0)
            out[f"{tag}_udp_sndbuf_errors"] = row.get("SndbufErrors", 0)
            out[f"{tag}_udp_in_errors"] = row.get("InErrors", 0)
    link = tb.link("rt")
    for ns, dev, tag in ((link.ns_a, link.dev_a, "client_dev"),
                         (link.ns_b, link.dev_b, "server_dev")):
        st = netstats.link_stats(ns, dev)
        for way in ("rx", "tx"):
            v = (st.get(way) or {}).get("dropped")
            if v is not None:
                out[f"{tag}_{way}_dropped"] = int(v)
    return out
