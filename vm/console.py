"""Reading the guest console: the rig's markers and the kernel-splat scan.

Pure: :class:`ConsoleWatcher` is fed complete console lines and records what it saw.

Splat scan
    A *kernel* console line (one carrying a printk timestamp such as ``[   12.345678]``)
    that matches one of :data:`SPLAT_PATTERNS` -- ``BUG:``, ``WARNING:``, ``Oops``,
    lockdep reports, hung tasks, RCU stalls, panics, general protection faults, UBSAN /
    KASAN reports -- is a *splat*.  A run with a splat fails even if the command
    succeeded.  Output of the command itself has no timestamp, so a test printing
    "WARNING:" is not a splat.  Opt out with ``--no-splat-check``, or ignore chosen
    lines with ``--allow-splat REGEX``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

START_RE = re.compile(r"KBP-VM-START (?P<nonce>[0-9a-f]{16})(?: (?P<uptime>\d+(?:\.\d+)?))?")
EXIT_RE = re.compile(r"KBP-VM-EXIT (?P<nonce>[0-9a-f]{16}) (?P<rc>\d{1,3})\b")
FATAL_RE = re.compile(r"kbp-vm-init: FATAL: (?P<msg>.*)")

#: A printk timestamp, optionally followed by a caller id (``[T123]``/``[C1]``).
KERNEL_LINE_RE = re.compile(r"\[\s*\d+\.\d{6}\](?:\[\s*[TC]\d+\])?\s?(?P<msg>.*)")

#: (label, regex) of the kernel messages that fail a run.
SPLAT_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(rx)) for label, rx in (
        ("BUG", r"\bBUG:|kernel BUG at"),
        ("WARNING", r"\bWARNING:"),
        ("Oops", r"\bOops\b"),
        ("lockdep", r"lockdep|possible (?:circular|recursive) locking|inconsistent lock state"),
        ("hung task", r"INFO: task .* blocked for more than"),
        ("RCU stall", r"rcu: INFO: .*detected stall|rcu_\w+ (?:self-)?detected stall"),
        ("panic", r"Kernel panic"),
        ("general protection fault", r"general protection fault"),
        ("UBSAN", r"\bUBSAN:"),
        ("KASAN", r"\bKASAN:"),
    ))


@dataclass(frozen=True)
class Splat:
    label: str
    line: str
    host_time: float


def find_splat(line: str) -> str | None:
    """The label of the splat ``line`` reports, or None (also for non-kernel lines)."""
    m = KERNEL_LINE_RE.search(line)
    if not m:
        return None
    msg = m["msg"]
    for label, rx in SPLAT_PATTERNS:
        if rx.search(msg):
            return label
    return None


#: An oops on an INT3 trap, and the "Code:" line of the oops (bytes around RIP, ``<xx>`` at it).
INT3_OOPS_RE = re.compile(r"\bOops: int3\b")
_BYTE = r"(?:[0-9a-f]{2}|<[0-9a-f]{2}>)"
CODE_RE = re.compile(rf"\bCode: (?P<bytes>{_BYTE}(?: {_BYTE})*)")


def stale_int3(code: str) -> bool | None:
    """Did the trap run an INT3 that memory no longer holds? An INT3 trap leaves RIP just
    after the 0xcc it ran; the oops's ``Code:`` bytes are memory as it is when printed. If the
    byte before ``<RIP>`` is not 0xcc, the instruction was already restored: the CPU ran a
    stale copy of the kernel's text patching (QEMU 7.2's multi-threaded TCG keeps one in its
    translation cache; vm/README.md, "Oops: int3"). None: no ``Code:`` bytes to tell."""
    m = CODE_RE.search(code)
    if not m:
        return None
    words = m["bytes"].split()
    at = next((i for i, w in enumerate(words) if w.startswith("<")), None)
    if not at:
        return None
    return words[at - 1] != "cc"


@dataclass
class ConsoleWatcher:
    """Follows the console of one run (identified by ``nonce``)."""

    nonce: str
    splat_check: bool = True
    allow: tuple[re.Pattern[str], ...] = ()
    started_at: float | None = None
    guest_uptime_at_start: float | None = None
    exit_code: int | None = None
    fatal: str | None = None
    splats: list[Splat] = field(default_factory=list)
    allowed_splats: int = 0
    #: each "Oops: int3" splat's verdict from its Code: line (:func:`stale_int3`), in order
    int3_stale: list[bool | None] = field(default_factory=list)
    _int3_pending: bool = False

    def feed(self, line: str, host_time: float) -> None:
        if self.exit_code is None:
            m = EXIT_RE.search(line)
            if m and m["nonce"] == self.nonce:
                self.exit_code = int(m["rc"])
                return
        if self.started_at is None:
            m = START_RE.search(line)
            if m and m["nonce"] == self.nonce:
                self.started_at = host_time
                if m["uptime"]:
                    self.guest_uptime_at_start = float(m["uptime"])
                return
        m = FATAL_RE.search(line)
        if m and self.fatal is None:
            self.fatal = m["msg"].strip()
        if self._int3_pending and CODE_RE.search(line):
            self.int3_stale[-1] = stale_int3(line)
            self._int3_pending = False
        if self.splat_check:
            label = find_splat(line)
            if label:
                if any(rx.search(line) for rx in self.allow):
                    self.allowed_splats += 1
                else:
                    self.splats.append(Splat(label, line.strip(), host_time))
                    if INT3_OOPS_RE.search(line):
                        self.int3_stale.append(None)
                        self._int3_pending = True

    def only_stale_int3(self) -> bool:
        """Every splat is an int3 oops whose Code: line shows a stale INT3, or the panic on
        its "Fatal exception": QEMU's, not the code under test."""
        if not self.int3_stale or not all(self.int3_stale):
            return False
        return all(INT3_OOPS_RE.search(s.line) or (s.label == "panic" and
                                                   "Fatal exception" in s.line)
                   for s in self.splats)
