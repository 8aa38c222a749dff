"""kbp.contention: the warnings for non-RT receive work that meets a poller on its CPU."""

from __future__ import annotations

import pytest

from kbp import contention
from kbp.sysinfo import online_cpus

RT_612 = "#1 SMP PREEMPT_RT Debian 6.12.117-1~deb12u1 (2026-09-01)"
RT_72 = "#1 SMP PREEMPT_RT Debian 7.2.12-1 (2026-10-22)"
PLAIN = "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1"


@pytest.mark.parametrize(("version", "release", "config", "lock"), [
    (RT_612, "6.12.117+deb12-rt-amd64", None, True),          # every RT kernel before 6.18
    (RT_72, "7.2.12+deb14-rt-amd64", "# CONFIG_PREEMPT_RT_NEEDS_BH_LOCK is not set\n", False),
    (RT_72, "7.2.12+deb14-rt-amd64", "CONFIG_PREEMPT_RT_NEEDS_BH_LOCK=y\n", True),
    (PLAIN, "6.12.117+deb12-amd64", None, False),
])
def test_has_bh_lock(version: str, release: str, config: str | None, lock: bool) -> None:
    assert contention.has_bh_lock(version, release, config) is lock


def test_prio_note_only_above_the_irq_threads_with_the_lock() -> None:
    assert contention.prio_note(50, True) is None
    assert contention.prio_note(51, False) is None
    note = contention.prio_note(51, True)
    assert note is not None and "above the interrupt threads (FIFO 50)" in note
    assert "--rt-prio 50" in note


def test_foreign_irq_note_says_how_to_move_them() -> None:
    f = contention.ForeignIrqs("eth2", None, (28, 29), (1,))
    note = contention.foreign_irq_note(f, [0, 1])
    assert note.startswith("note: eth2 (not served by kbp) has its interrupts (IRQ 28, 29) "
                           "on polling CPU 1")
    assert note.endswith("move them: echo 0 > /proc/irq/28/smp_affinity_list; "
                         "echo 0 > /proc/irq/29/smp_affinity_list")
    alone = contention.foreign_irq_note(contention.ForeignIrqs("e", "ns", (5,), (0,)), [0])
    assert "in netns ns" in alone and "move them" not in alone  # no other CPU to move to


def test_foreign_irqs_of_this_machine_are_on_the_cpus_they_name() -> None:
    """Against the real /proc: every device found has an IRQ on the CPUs asked about, and
    a served device is never named."""
    cpus = online_cpus()
    found = contention.foreign_irqs(cpus, [])
    for f in found:
        assert f.irqs and set(f.cpus) <= set(cpus)
    if found:
        again = contention.foreign_irqs(cpus, [(found[0].dev, found[0].netns)])
        assert (found[0].dev, found[0].netns) not in {(f.dev, f.netns) for f in again}


def test_check_isolate_needs_a_cpu_without_a_poller() -> None:
    from kbp.errors import InvalidInput
    contention.check_isolate([1], [0, 1])
    with pytest.raises(InvalidInput, match=r"without --cpus the pollers use every online "
                                           r"CPU: give --cpus a subset, or drop --isolate"):
        contention.check_isolate(None, [0, 1])
    with pytest.raises(InvalidInput, match=r"CPUs 0-1 are every online CPU"):
        contention.check_isolate([0, 1], [0, 1])


def test_isolate_is_journaled_only_when_asked_for() -> None:
    """Journals written before --isolate existed compare equal in apply's plan."""
    from kbp.backends import EnableRequest
    assert "isolate" not in EnableRequest(["eth1"]).settings()
    assert EnableRequest(["eth1"], isolate=True).settings()["isolate"] is True
