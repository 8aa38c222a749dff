"""A busy poller never sleeps, yet RCU-tasks and livepatch transitions still complete."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import POLL_CPU, Topo, sh, spinning, wait_for

TRACING = Path("/sys/kernel/tracing")


@pytest.mark.rt
def test_rcu_tasks_grace_periods_complete_with_busy_poller(kmod, topo: Topo) -> None:
    """Turning the function tracer off waits for RCU-tasks grace periods (ftrace_shutdown)."""
    if not (TRACING / "current_tracer").exists():
        sh(f"mount -t tracefs nodev {TRACING}", check=False)
    if "function" not in (TRACING / "available_tracers").read_text().split():
        pytest.skip(reason="this kernel has no function tracer")
    kmod.attach(topo.nic0, cpu=POLL_CPU, mode="busy")
    pid = kmod.poller(POLL_CPU).pid
    time.sleep(0.3)
    assert spinning(pid)
    t0 = time.monotonic()
    (TRACING / "set_ftrace_filter").write_text("cmdline_proc_show\n")
    (TRACING / "current_tracer").write_text("function\n")
    (TRACING / "current_tracer").write_text("nop\n")
    (TRACING / "set_ftrace_filter").write_text("\n")
    took = time.monotonic() - t0
    assert took < 60, f"ftrace on/off took {took:.1f}s with a busy poller"
    assert kmod.poller(POLL_CPU).sleeps == 0


def test_livepatch_transition_completes_with_busy_poller(kmod, topo: Topo) -> None:
    ko = Path(os.environ.get("KBP_TEST_MODULES", "/nonexistent")) / "kbp_test_klp.ko"
    if not ko.exists():
        pytest.skip(reason=f"test livepatch module not built ({ko})")
    kmod.attach(topo.nic0, cpu=POLL_CPU, mode="busy")
    time.sleep(0.3)
    sh(f"insmod {ko}")
    lp = Path("/sys/kernel/livepatch/kbp_test_klp")
    try:
        wait_for(lambda: (lp / "transition").read_text().strip() == "0", 60, 0.2,
                 "the livepatch transition to complete")
        assert Path("/proc/cmdline").read_text().strip() == "kbp test livepatch"
        (lp / "enabled").write_text("0")
        wait_for(lambda: not lp.exists(), 60, 0.2, "the livepatch to be disabled")
    finally:
        if lp.exists() and (lp / "enabled").read_text().strip() == "1":
            (lp / "enabled").write_text("0")
            wait_for(lambda: not lp.exists(), 60, 0.2, "the livepatch to be disabled")
        sh("rmmod kbp_test_klp", check=False)
    assert Path("/proc/cmdline").read_text().strip() != "kbp test livepatch"
    assert spinning(kmod.poller(POLL_CPU).pid)
