"""One RT latency run of a mode: kernel-timestamped round trips of the RT request/response
flow (kbp-rtt), with the run's CPU time, interrupts, softirqs, poller counters and
kernel-side delays (bpftrace), the RT CPU's receive check (``rt_cpu_check``) and the tester's
lateness; samples pooled per part|condition|mode in ``bench.samples``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from kbp.bench import (
    anatomy,
    foreign,
    heavy,
    machine,
    modes,
    nicpair,
    parts,
    schema,
    steer,
    sysstat,
    tester,
    trace,
    workloads,
)
from kbp.bench import placement as placement_
from kbp.bench.modes import search_state
from kbp.bench.schema import KernelDelay, LatencyRun
from kbp.bench.stats import summarize, tail_summary
from kbp.bench.testbed import Testbed

if TYPE_CHECKING:
    from kbp.bench.runner import Bench


def latency_run(bench: Bench, mode_name: str, rep: int, *, part: str, condition: str, size: int,
                rate: float, poisson: bool, duration: float,
                uniform_us: list[float] | None = None) -> LatencyRun:
    """One RT latency run of ``mode_name``: the record, also appended to results.
    ``uniform_us`` (MIN_US, MAX_US): inter-arrival times uniform in that range instead
    of ``rate`` / ``poisson`` (the record's rate is then the range's mean rate).  A run
    another process disturbed on the RT CPU (:mod:`kbp.bench.foreign`) is recorded under
    ``results["disturbed_runs"]`` and run again, at most ``foreign.RERUNS`` times; the
    last attempt is kept whatever it saw (its ``foreign_cpu`` says so)."""
    t_start = time.monotonic()
    for attempt in range(foreign.RERUNS + 1):
        rec, kernel_ns = _attempt(bench, mode_name, rep, part=part, condition=condition,
                                  size=size, rate=rate, poisson=poisson, duration=duration,
                                  uniform_us=uniform_us)
        fc = rec.get("foreign_cpu") or {}
        if not fc.get("disturbed") or attempt == foreign.RERUNS:
            break
        bench.note(f"rep {rep + 1} · {part} {condition} · {mode_name}: "
                   f"{fc['foreign_user_s']:.2f} s of another process's user time on the RT "
                   f"CPU (limit {fc['limit_s']:.2f} s): run again")
        bench.results.setdefault("disturbed_runs", []).append(
            {"rep": rep, "mode": mode_name, "part": part, "condition": condition,
             "attempt": attempt, "foreign_cpu": fc, "rtt_ns": rec.get("rtt_ns")})
    rec["attempts"] = attempt + 1
    key = schema.sample_key(part, condition, mode_name)
    bench.samples.setdefault(key, []).extend(kernel_ns)
    bench.results["runs"].append(rec)
    rec["took_s"] = time.monotonic() - t_start
    desc = f"rep {rep + 1}/{bench.cfg.reps} · {part} {condition} · {mode_name}"
    chk = rec.get("rt_cpu_check")
    if chk is not None and not chk["passed"]:
        bench.results.setdefault("rt_cpu_check_failed", []).append(desc)
        from kbp.bench.runner import Aborted
        raise Aborted(
            f"{desc}: the RT CPU processed {chk['processed']:,} packets, more than "
            f"{steer.rt_cpu_expected_words(chk)} allow (limit {chk['limit']:,.0f}: slack "
            f"{chk['slack']:,.0f}): "
            "replies, ACKs or other receive work ran on the RT CPU, so the run would "
            "measure the testbed, not the mode")
    bench.advance(bench.latency_plan(duration), desc)
    return rec


def _attempt(bench: Bench, mode_name: str, rep: int, *, part: str, condition: str,
             size: int, rate: float, poisson: bool, duration: float,
             uniform_us: list[float] | None) -> tuple[LatencyRun, list[int]]:
    """One attempt at the run: its record and kernel round trips (ns), appended nowhere."""
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
    kt: trace.KernelTrace | None = None
    with bench._mode(mode):
        threads = mode.threads()
        nonrt = modes.nonrt_threads(mode)
        app = bench.server.pids()
        pids = list(threads) + list(nonrt) + app
        rec["mode_setup"] = mode.describe()
        rec["app"] = bench.server.name
        rec["app_cpu"] = bench.server.cpu_now
        rec["app_fifo"] = bench.server.fifo_now
        if not bench.trace_reason:
            devs = xmit_devices(bench)
            extra = anatomy_probes(bench, devs, threads, nonrt, app) if cfg.anatomy else {}
            kt = bench.tfs.track(trace.KernelTrace(poller_pids=list(threads), app_pids=app,
                                                  cpu=pl.cpu(placement_.HARNESS), **devs,
                                                  **extra))
            try:
                kt.start()
            except (RuntimeError, ValueError) as e:   # ValueError: a device name to refuse
                rec["kernel_delay_error"] = str(e)
                kt = None
        try:
            ends = [probe() for probe in bench.probes]
            c0 = mode.counters()
            f0 = _foreign_mark(pl.cpu(placement_.RT))
            s0 = sysstat.Snapshot.take(pids)
            res = tester.run_rtt(bench.binary, bench.tb.client, target_ip(bench.tb), port=
                                 workloads.SOCKPERF_PORT, size=size, rate=rate,
                                 poisson=poisson, duration=duration, warmup=cfg.warmup,
                                 cpu=pl.cpu(placement_.TESTER), fifo=cfg.tester_prio,
                                 seed=cfg.seed * 1000 + rep, uniform_us=uniform_us)
            s1 = sysstat.Snapshot.take(pids)
            f1 = _foreign_mark(pl.cpu(placement_.RT))
            c1 = mode.counters()
            state = search_state(mode)
            if state is not None:
                rec["search"] = state
            for end in ends:
                end(rec)
        finally:
            kd = kt.stop() if kt is not None else {}
    names_ = {**threads, **nonrt, **dict.fromkeys(app, rec["app"])}
    roles = sysstat.thread_roles(threads, nonrt, app)
    rec["tester"] = res.summary
    rec["rtt_ns"] = summarize(res.kernel_ns)
    rec["rtt_user_ns"] = summarize(res.user_ns)
    rec["lost"] = res.lost
    rec["rtt_tail"] = tail_summary(res.kernel_ns, lost=res.lost, seed=cfg.seed * 1000 + rep)
    rec["lateness_ns"] = summarize(res.late_ns)
    rec["lateness_user_ns"] = summarize(res.late_user_ns)
    if part == parts.RTT and rec.get("rt_cpu_rx"):
        tsum = res.summary
        rec["rt_cpu_check"] = steer.rt_cpu_check(
            int(rec["rt_cpu_rx"].get("packets_processed") or 0),
            int((rec.get("heavy") or {}).get("rx_packets") or 0),
            int(tsum.get("sent") or 0) + int(tsum.get("warmup_sent") or 0),
            heavy_moved=heavy.exclusive_like(mode_name))
    rec["sys"] = sysstat.delta(s0, s1, names_, roles)
    rec["poller"] = modes.counters_moved(c0, c1)
    if kt is not None:
        xs, match = xmit_match(kt, kd, res.summary)
        # the delays are bpftrace histograms' summaries (kbp.bench.stats.hist_summary):
        # Stats' keys, xmit_to_poll's with its buckets too
        rec["kernel_delay"] = cast(KernelDelay, {
            "xmit_to_poll": xs, "xmit_to_poll_match": match,
            "netrx_raise_to_entry": {k: trace.without_buckets(v) for k, v in
                                     (kd.get("netrx_raise_to_entry") or {}).items()},
            "poller_wake_to_run": trace.merged(kd, "poller_wake_to_run"),
            "app_wake_to_run": trace.merged(kd, "app_wake_to_run"),
        })
        if cfg.anatomy:
            rec["anatomy"] = anatomy.run_record(kt.output, res.kernel_by_seq,
                                                pl.cpu(placement_.RT))
    else:
        rec["kernel_delay"] = None
        rec["kernel_delay_skipped"] = bench.trace_reason or rec.get("kernel_delay_error")
        if cfg.anatomy:
            rec["anatomy_error"] = str(rec["kernel_delay_skipped"])
    rt_cpu = pl.cpu(placement_.RT)
    user = ((rec["sys"].get("cpu") or {}).get(str(rt_cpu)) or {}).get("seconds") or {}
    if f0 is not None and f1 is not None and user:
        rec["foreign_cpu"] = foreign.check(f0, f1, float(user.get("user", 0.0)) +
                                           float(user.get("nice", 0.0)), rec["sys"]["wall_s"])
    return rec, res.kernel_ns


def target_ip(tb: Testbed) -> str:
    return tb.link("rt").ip_b


NIC_PAIR_NO_XMIT = ("not traced: the RT pair is NIC ports (--nic-pair), where the skb the "
                    "server's NAPI polls is not the one the tester transmitted, so a match "
                    "by skb address would pair unrelated packets")


def xmit_devices(bench: Bench) -> dict[str, Any]:
    """The :class:`kbp.bench.trace.KernelTrace` arguments of xmit_to_poll for this run: the
    RT client device (tx_dev), the RT server device (rx_dev) and its NAPI ids, read with
    napi-get now, with the mode on (:func:`kbp.bench.modes.rt_napi_ids`; a failure is
    recorded and the trace keys on rx_dev's name).  Nothing over a NIC pair."""
    assert bench.tb is not None
    rt = bench.tb.link("rt")
    if rt.kind != "veth":
        return {}
    try:
        ids, err = modes.rt_napi_ids(bench.target()), None
    except Exception as e:            # no netdev family, the device gone: keyed by name
        ids, err = [], f"napi-get: {e}"
    return {"tx_dev": rt.dev_a, "rx_dev": rt.dev_b, "rt_napi_ids": ids, "napi_error": err}


def anatomy_probes(bench: Bench, devs: dict[str, Any], threads: dict[int, str],
                   nonrt: dict[int, str], app: list[int]) -> dict[str, Any]:
    """The :class:`kbp.bench.trace.KernelTrace` arguments that add --anatomy's probes
    (:mod:`kbp.bench.anatomy`) for this run: the RT pair, the RT CPU and who is who on it
    (the mode's pollers and non-rt pollers, the app, the heavy receiver and its device's
    NAPI threads, the RT CPU's ksoftirqd; a thread keeps the first of these it has)."""
    assert bench.placement is not None
    rt_cpu = bench.placement.cpu(placement_.RT)
    roles: dict[int, str] = {}
    heavy_side = bench.heavy
    groups: list[tuple[str, Any]] = [("app", app), ("poller", threads),
                                     ("nonrt_poller", nonrt)]
    if heavy_side is not None:
        groups += [("heavy_receiver", heavy_side.receiver_pids()),
                   ("heavy_napi", heavy_side.napi_threads())]
    ks = steer.ksoftirqd(rt_cpu)
    groups.append(("ksoftirqd", [ks] if ks else []))
    for role, pids in groups:
        for pid in pids:
            roles.setdefault(int(pid), role)
    spec = anatomy.Spec(port=workloads.SOCKPERF_PORT, rt_cpu=rt_cpu, roles=roles,
                        **(veth_devices(devs) if devs else nic_devices(bench)))
    return {"extra_probes": anatomy.probes(spec), "extra_clears": anatomy.cleared(spec)}


def veth_devices(devs: dict[str, Any]) -> dict[str, Any]:
    """The anatomy's devices over the veth pair: xmit_to_poll's (:func:`xmit_devices`)."""
    return {"tx_dev": devs["tx_dev"], "rx_dev": devs["rx_dev"],
            "rt_napi_ids": tuple(devs.get("rt_napi_ids") or ())}


def nic_devices(bench: Bench) -> dict[str, Any]:
    """The anatomy's devices over NIC ports (--nic-pair): the tester's and the server's
    port, their NAPI ids (napi-get now, with the mode on; none before Linux 6.9: the probes
    key on the names) and the server port's receive interrupts."""
    assert bench.tb is not None
    rt = bench.tb.link("rt")

    def ids(dev: str, netns: str) -> tuple[int, ...]:
        try:
            return tuple(modes.napi_ids(dev, netns))
        except Exception:            # no netdev family: keyed by the device's name
            return ()
    return {"tx_dev": rt.dev_a, "rx_dev": rt.dev_b, "wire": True,
            "rt_napi_ids": ids(rt.dev_b, rt.ns_b), "tx_napi_ids": ids(rt.dev_a, rt.ns_a),
            "rx_irqs": tuple(nicpair.receive_irqs(bench.server_port_irqs() or ()))}


def xmit_match(kt: trace.KernelTrace, kd: dict[str, Any], sent: dict[str, Any],
               ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """xmit_to_poll and its ``xmit_to_poll_match`` record (:meth:`kbp.bench.trace.
    KernelTrace.xmit_record`); ``skipped`` when it was not traced, ``problem`` when the
    tester sent requests and the trace saw no transmit on the RT client device."""
    if not kt.tx_dev:
        return None, {"skipped": NIC_PAIR_NO_XMIT}
    xs, match = kt.xmit_record(kd)
    requests = int(sent.get("sent") or 0) + int(sent.get("warmup_sent") or 0)
    if requests and not match.get("xmits"):
        match["problem"] = (f"the tester sent {requests:,} requests and the trace saw no "
                            f"transmit on {kt.tx_dev} (net_dev_start_xmit's device name "
                            "not read as expected by this bpftrace?)")
    return xs, match


def _foreign_mark(cpu: int) -> foreign.Mark | None:
    """The foreign-CPU check's mark now (None where /proc cannot be read)."""
    try:
        return foreign.Mark.take(cpu)
    except OSError:
        return None
