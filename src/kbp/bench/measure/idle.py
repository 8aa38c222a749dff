"""One mode's idle cost: the mode on with no traffic, the CPU time of its poller threads and
the RT application, the CPUs' time and interrupts, the poller counters."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kbp.bench import machine, modes, parts, sysstat
from kbp.bench.modes import search_state
from kbp.bench.schema import IdleRun

if TYPE_CHECKING:
    from kbp.bench.runner import Bench


def idle_run(bench: Bench, mode_name: str) -> IdleRun:
    """``mode_name`` on, no traffic for cfg.idle_duration: CPU time of its poller threads
    and the RT app, the CPUs' time and interrupts, the poller counters."""
    cfg = bench.cfg
    assert bench.server is not None
    mode = bench.modes[mode_name]
    desc = f"idle cost · {mode_name} ({cfg.idle_duration:g} s, no traffic)"
    bench.note(desc)
    rec: IdleRun = {"mode": mode_name, "part": parts.IDLE, "duration": cfg.idle_duration,
                    "waited_for_quiet_s": bench._wait_quiet(desc),
                    "quiet": machine.quiet_report()}
    with bench._mode(mode):
        threads = mode.threads()
        nonrt = modes.nonrt_threads(mode)
        app = bench.server.pids()
        rec["app"] = bench.server.name
        rec["mode_setup"] = mode.describe()
        time.sleep(parts.IDLE_SETTLE_S)       # setup's own work out of the window
        c0 = mode.counters()
        s0 = sysstat.Snapshot.take(list(threads) + list(nonrt) + app)
        time.sleep(cfg.idle_duration)
        s1 = sysstat.Snapshot.take(list(threads) + list(nonrt) + app)
        c1 = mode.counters()
        state = search_state(mode)
        if state is not None:
            rec["search"] = state
    rec["poller_threads"] = {str(p): n for p, n in threads.items()}
    if nonrt:
        rec["nonrt_threads"] = {str(p): n for p, n in nonrt.items()}
    rec["app_threads"] = [str(p) for p in app]
    rec["sys"] = sysstat.delta(s0, s1, {**threads, **nonrt, **dict.fromkeys(app, rec["app"])},
                               sysstat.thread_roles(threads, nonrt, app))
    rec["poller"] = modes.counters_moved(c0, c1)
    bench.results["idle"].append(rec)
    bench.advance(parts.idle_seconds(cfg), desc)
    return rec
