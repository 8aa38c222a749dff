"""/proc/kbp_so's keys and kbp_so's parameter ranges, as the guest module writes them.

Generated from outsource/guest/kbp_so_proc.yaml by ``tools/kbp_so_spec.py gen``: do not edit. The
module prints the same keys in the same order (outsource/guest/kbp_so_spec.h).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Key(NamedTuple):
    """One key=value of a /proc/kbp_so line."""

    name: str    # as the file writes it: idle_poll_us
    type: str    # text, u32, s32, u64, s64
    group: str   # '', identity, completions, policy
    doc: str


#: poll_us range 0..this (a caller polls its own request this long)
POLL_US_MAX: Final = 1000
#: idle_poll_us range 0..this (0 off; an idle vCPU polls the rings this long)
IDLE_POLL_US_MAX: Final = 2000
#: host_timeout_ms range, lower end
TIMEOUT_MIN: Final = 200
#: host_timeout_ms range, upper end
TIMEOUT_MAX: Final = 600000

#: the module line (after ``kbp_so``), in order
MODULE_KEYS: Final[tuple[Key, ...]] = (
    Key('state', 'text', 'identity',
        'attached, detached or host-dead'),
    Key('epoch', 'u32', '',
        "the attach's number (0 before the first)"),
    Key('queues', 'u32', '',
        'queues in use'),
    Key('sockets', 'u32', '',
        'outsourced sockets open'),
    Key('pinned_pages', 's32', '',
        'guest pages pinned for requests in flight'),
    Key('orphan_pages', 's32', '',
        'pinned pages of requests whose caller gave up, held until the host answers'),
    Key('fallbacks', 's64', '',
        'counter: requests the module refused itself (EOPNOTSUPP)'),
    Key('host_timeout_ms', 'u32', '',
        'how long a request waits for kbp-sod before the host counts as dead'),
    Key('poll_us', 'u32', '',
        'how long a caller polls for its own completion before sleeping'),
    Key('idle', 'text', '',
        'the idle path: on, off or unavailable:<why>'),
    Key('idle_poll_us', 'u32', '',
        'how long an idle vCPU polls the completion rings before it halts'),
    Key('irqs', 'u64', '',
        'counter: completion interrupts taken'),
    Key('irqs_sent', 'u64', '',
        'counter: interrupts kbp-sod says it raised (since its reset)'),
    Key('completions_irq', 'u64', 'completions',
        "counter: final completions found by the queue's interrupt handler"),
    Key('completions_polled', 'u64', 'completions',
        'counter: final completions found by the caller polling for its own (poll_us)'),
    Key('completions_syscall', 'u64', 'completions',
        "counter: final completions found by another outsourced system call's sweep"),
    Key('completions_idle', 'u64', 'completions',
        'counter: final completions found by an idle vCPU (the idle path)'),
    Key('completions_tick', 'u64', 'completions',
        "counter: final completions found by a busy vCPU's tick-aligned sweep"),
    Key('idle_poll_ns', 'u64', '',
        'counter: time idle vCPUs spent polling the rings'),
    Key('idle_halts', 'u64', '',
        'counter: times an idle vCPU halted after polling'),
    Key('idle_races', 'u64', '',
        'counter: halts called off because a completion arrived meanwhile'),
    Key('refused_netns', 's64', 'policy',
        'counter: sockets refused EPERM for their network namespace'),
    Key('refused_user', 's64', 'policy',
        'counter: sockets refused EPERM for their creator'),
    Key('closes_pending', 's32', 'policy',
        'closes the watchdog still owes the host'),
)
#: a socket's line (after ``sock``), in order
SOCK_KEYS: Final[tuple[Key, ...]] = (
    Key('ino', 'u64', 'identity',
        "the socket's inode (as in /proc/PID/fd's socket:[INO])"),
    Key('uid', 'u32', 'identity',
        "its creator, in the reader's user namespace"),
    Key('family', 'text', 'identity',
        'inet or inet6'),
    Key('local', 'text', 'identity',
        'its local address: ADDR:PORT, [ADDR6]:PORT, or -'),
    Key('remote', 'text', 'identity',
        "its peer's address, as local"),
    Key('requests', 's64', '',
        'counter: requests submitted for the socket'),
    Key('completions', 's64', '',
        'counter: final completions the host posted'),
    Key('bytes_out', 's64', '',
        'counter: bytes sent'),
    Key('bytes_in', 's64', '',
        'counter: bytes received'),
    Key('copies', 's64', '',
        'counter: data requests the host copied for'),
    Key('fallbacks', 's64', '',
        'counter: requests the module refused itself (EOPNOTSUPP)'),
    Key('errors', 's64', '',
        'counter: host completions with an error'),
)
