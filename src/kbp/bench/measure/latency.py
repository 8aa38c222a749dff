"""One RT latency run of a mode: kernel-timestamped round trips of the RT request/response
flow (kbp-rtt), with the run's CPU time, interrupts, softirqs, poller counters and
kernel-side delays (bpftrace), the RT CPU's receive check (``rt_cpu_check``) and the tester's
lateness; samples pooled per part|condition|mode in ``bench.samples``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kbp.bench import machine, parts, schema, steer, sysstat, tester, trace, workloads
from kbp.bench import placement as placement_
from kbp.bench.modes import search_state
from kbp.bench.schema import LatencyRun
from kbp.bench.stats import summarize, tail_summary
from kbp.bench.testbed import Testbed

if TYPE_CHECKING:
    from kbp.bench.runner import Bench


def latency_run(bench: Bench, mode_name: str, rep: int, *, part: str, condition: str, size: int,
                rate: float, poisson: bool, duration: float,
                uniform_us: list[float] | None = None) -> LatencyRun:
    """One RT latency run of ``mode_name``: the record, also appended to results.
    ``uniform_us`` (MIN_US, MAX_US): inter-arrival times uniform in that range instead
    of ``rate`` / ``poisson`` (the record's rate is then the range's mean rate)."""
    cfg = bench.cfg
    assert bench.tb is not None and bench.binary is not None and bench.server is not None
    assert bench.placement is not None and bench.scenario is not None
    pl = bench.placement
    mode = bench.modes[mode_name]
    desc = f"rep {rep + 1}/{cfg.reps} · {part} {condition} · {mode_name}"
    bench.note(desc)
    if uniform_us is not None:
        rate, poisson = tester.uniform_rate(uniform_us), False
    rec: LatencyRun = {"rep": rep, "mode": mode_name, "scenario": bench.scenario.name,
                       "part": part, "condition": condition, "rate": rate,
                       "poisson": poisson, "payload": size, "duration": duration}
    if uniform_us is not None:
        rec["uniform_us"] = list(uniform_us)
    rec["waited_for_quiet_s"] = bench._wait_quiet(desc)
    rec["quiet"] = machine.quiet_report()
    t_start = time.monotonic()
    kt: trace.KernelTrace | None = None
    with bench._mode(mode):
        threads = mode.threads()
        app = bench.server.pids()
        rec["mode_setup"] = mode.describe()
        rec["app"] = bench.server.name
        rec["app_cpu"] = bench.server.cpu_now
        rec["app_fifo"] = bench.server.fifo_now
        if not bench.trace_reason:
            kt = bench.tfs.track(trace.KernelTrace(poller_pids=list(threads), app_pids=app,
                                                  cpu=pl.cpu(placement_.HARNESS)))
            try:
                kt.start()
            except RuntimeError as e:
                rec["kernel_delay_error"] = str(e)
                kt = None
        try:
            ends = [probe() for probe in bench.probes]
            c0 = mode.counters()
            s0 = sysstat.Snapshot.take(list(threads) + app)
            res = tester.run_rtt(bench.binary, bench.tb.client, target_ip(bench.tb), port=
                                 workloads.SOCKPERF_PORT, size=size, rate=rate,
                                 poisson=poisson, duration=duration, warmup=cfg.warmup,
                                 cpu=pl.cpu(placement_.TESTER), fifo=cfg.tester_prio,
                                 seed=cfg.seed * 1000 + rep, uniform_us=uniform_us)
            s1 = sysstat.Snapshot.take(list(threads) + app)
            c1 = mode.counters()
            state = search_state(mode)
            if state is not None:
                rec["search"] = state
            for end in ends:
                end(rec)
        finally:
            kd = kt.stop() if kt is not None else {}
    names_ = {**threads, **dict.fromkeys(app, rec["app"])}
    rec["tester"] = res.summary
    rec["rtt_ns"] = summarize(res.kernel_ns)
    rec["rtt_user_ns"] = summarize(res.user_ns)
    rec["lost"] = res.lost
    rec["rtt_tail"] = tail_summary(res.kernel_ns, lost=res.lost, seed=cfg.seed * 1000 + rep)
    rec["lateness_ns"] = summarize(res.late_ns)
    rec["lateness_user_ns"] = summarize(res.late_user_ns)
    if part == parts.RTT and rec.get("rt_cpu_rx"):
        tsum = res.summary
        chk = rec["rt_cpu_check"] = steer.rt_cpu_check(
            int(rec["rt_cpu_rx"].get("packets_processed") or 0),
            int((rec.get("heavy") or {}).get("rx_packets") or 0),
            int(tsum.get("sent") or 0) + int(tsum.get("warmup_sent") or 0))
    rec["sys"] = sysstat.delta(s0, s1, names_)
    rec["poller"] = {k: (c1[k] - (c0.get(k) or 0)) for k in c1 if c1[k] is not None}
    if kt is not None:
        napi_id, xs, other = trace.rt_napi(kd)
        rec["kernel_delay"] = {
            "xmit_to_poll": xs, "xmit_to_poll_napi_id": napi_id,
            "xmit_to_poll_other": other,
            "netrx_raise_to_entry": {k: _nobuckets(v) for k, v in
                                     (kd.get("netrx_raise_to_entry") or {}).items()},
            "poller_wake_to_run": trace.merged(kd, "poller_wake_to_run"),
            "app_wake_to_run": trace.merged(kd, "app_wake_to_run"),
        }
    else:
        rec["kernel_delay"] = None
        rec["kernel_delay_skipped"] = bench.trace_reason or rec.get("kernel_delay_error")
    key = schema.sample_key(part, condition, mode_name)
    bench.samples.setdefault(key, []).extend(res.kernel_ns)
    bench.results["runs"].append(rec)
    rec["took_s"] = time.monotonic() - t_start
    chk = rec.get("rt_cpu_check")
    if chk is not None and not chk["passed"]:
        bench.results.setdefault("rt_cpu_check_failed", []).append(desc)
        from kbp.bench.runner import Aborted
        raise Aborted(
            f"{desc}: the RT CPU processed {chk['processed']:,} packets, more than the "
            f"heavy device's {chk['heavy_packets']:,} + {chk['requests']:,} RT requests "
            f"allow (limit {chk['limit']:,.0f}: +{chk['margin']:.0%} + {chk['slack']}): "
            "replies, ACKs or other receive work ran on the RT CPU, so the run would "
            "measure the testbed, not the mode")
    bench.advance(bench.latency_plan(duration), desc)
    return rec


def target_ip(tb: Testbed) -> str:
    return tb.link("rt").ip_b


def _nobuckets(s: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in s.items() if k != "buckets"}
