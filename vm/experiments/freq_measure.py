"""Measure freq_ctl in the guest: time in each frequency, idle and under bursts (not a test).

    kbpctl bench vm --flavour 6.12-amd64 --scenario freq

Uses the test cpufreq driver (vm/testdata/kbp_test_cpufreq) and the cpufreq core's own
statistics (stats/time_in_state, in 10 ms units; stats/total_trans).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kbp import kmod
from kbp.system import journal, settings
from vm.guest_tests.conftest import (
    POLL_CPU,
    Flow,
    Topo,
    build_topology,
    load_module,
    sh,
)

CF = Path(f"/sys/devices/system/cpu/cpu{POLL_CPU}/cpufreq")


def time_in_state() -> dict[int, int]:
    rows = (ln.split() for ln in (CF / "stats/time_in_state").read_text().splitlines())
    return {int(a): int(b) for a, b in rows}


def share(a: dict[int, int], b: dict[int, int]) -> dict[str, str]:
    d = {k: (b[k] - a[k]) * 10 for k in b}
    tot = sum(d.values()) or 1
    return {f"{k // 1000} MHz": f"{v} ms ({100 * v / tot:.1f}%)" for k, v in d.items()}


def total_trans() -> int:
    return int((CF / "stats/total_trans").read_text())


def main() -> None:
    t = build_topology()
    load_module()
    sh(f"insmod {os.environ['KBP_TEST_MODULES']}/kbp_test_cpufreq.ko")
    sh("modprobe cpufreq_userspace")
    # the governor and speed through the settings layer, put back at the end (the
    # governor's old value first read, so its undo runs last: setspeed only takes a value
    # under userspace)
    ex = journal.Executor(None, {journal.KIND_FILE: settings.FileHandler()})
    try:
        ex.apply(journal.KIND_FILE, {"path": str(CF / "scaling_governor")}, "userspace")
        ex.apply(journal.KIND_FILE, {"path": str(CF / "scaling_setspeed")}, "1600000")
        measure(t)
    finally:
        for note in ex.restore():
            print(f"not put back: {note}")


def measure(t: Topo) -> None:
    for fc in (False, True):
        kmod.attach(t.nic0, cpu=POLL_CPU, mode="hybrid", freq_ctl=fc)
        time.sleep(1)
        a, pa, ta = time_in_state(), kmod.poller(POLL_CPU), total_trans()
        time.sleep(10)
        b, pb = time_in_state(), kmod.poller(POLL_CPU)
        print(f"freq_ctl={fc} idle 10 s: {json.dumps(share(a, b))} "
              f"wakeups {pb.wakeups - pa.wakeups} freq_changes {pb.freq_changes - pa.freq_changes}")
        f = Flow(t)
        f.start_sink(expect=800)
        a, pa = time_in_state(), kmod.poller(POLL_CPU)
        f.send(800, rate=80, burst=8)     # 10 bursts/s for 10 s
        r = f.result()
        b, pb = time_in_state(), kmod.poller(POLL_CPU)
        print(f"freq_ctl={fc} 10 bursts/s x 8 packets for 10 s: {json.dumps(share(a, b))} "
              f"received {r['unique']} wakeups {pb.wakeups - pa.wakeups} "
              f"freq_changes {pb.freq_changes - pa.freq_changes}; cpufreq total_trans since "
              f"1 s after attach {total_trans() - ta}, poller freq_changes since attach "
              f"{pb.freq_changes}")
        f.close()
        kmod.detach(t.nic0)
        time.sleep(0.5)
        print(f"after detach: scaling_cur_freq {(CF / 'scaling_cur_freq').read_text().strip()}")


if __name__ == "__main__":
    main()
