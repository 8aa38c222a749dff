"""Where each role of the benchmark runs: a placement of roles to CPUs, for any CPU count.

Roles (``ROLES``, in the order CPUs are handed out):

===========  ==================================================================================
tester       the tester ``kbp-rtt`` (SCHED_FIFO): stands in for the papers' remote client
rt           the RT CPU: the RT device's poller in the kbp modes; never shared with another role
flood        the flood sender (iperf3 client): stands in for a remote heavy sender
heavy        the heavy receiver (iperf3 server) on the machine under test
app          the RT application (sockperf server); by default on the RT CPU
harness      this program and bpftrace's user-space part; a spare CPU, else the tester's
===========  ==================================================================================

Without pins, from the CPUs this process may use (online and in its affinity):

* 4 or more CPUs: tester, rt, flood, heavy each get a CPU of their own (lowest numbers first,
  in that order); the harness gets the next one when there is a fifth.
* 3 CPUs: the remote side shares one CPU (tester + flood sender, as on 2 CPUs), the RT CPU
  and the heavy receiver get one each: the machine under test keeps its two roles apart.
* 2 CPUs: tester, flood sender and heavy receiver share one CPU, the RT CPU is the other
  (the arrangement of every run before roles existed: ``--load-cpu`` / ``--rt-cpu``).
* 1 CPU: refused (the RT CPU must be a CPU of its own).

A role that gets no CPU of its own shares its partner's (``SHARE_WITH``: flood with the
tester, heavy with the flood sender).  Pins (``--cpus ROLE=CPU,...``) fix roles; the other
roles are placed by the same rules on the CPUs no pinned role uses, or share with their
partner.  Refused before anything changes, with the reason: an unknown role, a CPU that does
not exist or is offline or outside this process's affinity, a role pinned to the RT CPU
(except the app), and more roles than the CPUs leave room for.

A scenario may name roles that belong on the RT CPU (``on_rt``: ``shared-cpu`` puts the
heavy receiver there, its contention): they go to the RT CPU unless pinned, may be pinned
there, and claim no CPU of their own (4 CPUs: tester 0, RT + heavy 1, flood 2, harness 3;
2 CPUs: tester + flood 0, RT + heavy 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbp import sysinfo
from kbp.bench.schema import PlacementDoc
from kbp.errors import KbpctlError

TESTER, RT, FLOOD, HEAVY, APP, HARNESS = "tester", "rt", "flood", "heavy", "app", "harness"
ROLES: tuple[str, ...] = (TESTER, RT, FLOOD, HEAVY)       # the roles that claim CPUs
ALL_ROLES: tuple[str, ...] = (*ROLES, APP, HARNESS)
LABELS: dict[str, str] = {TESTER: "tester", RT: "RT", FLOOD: "flood sender",
                          HEAVY: "heavy receiver", APP: "RT app", HARNESS: "harness"}
SHORT: dict[str, str] = {TESTER: "tester", RT: "RT", FLOOD: "flood", HEAVY: "heavy",
                         APP: "app", HARNESS: "harness"}     # in column headings
# who gets a CPU of its own first when there are too few (the RT CPU always does)
OWN_PRIORITY: tuple[str, ...] = (RT, TESTER, HEAVY, FLOOD)
SHARE_WITH: dict[str, str] = {FLOOD: TESTER, HEAVY: FLOOD}
SYS_CPU = sysinfo.HOST.cpu_dir


class PlacementError(ValueError):
    """A placement that cannot be made (the message says why and what to do)."""


def parse_pins(text: str) -> dict[str, int]:
    """``--cpus tester=0,rt=1``: {role: cpu}."""
    pins: dict[str, int] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        role, eq, cpu = item.partition("=")
        role = role.strip()
        if not eq or not cpu.strip().isdigit():
            raise PlacementError(f"bad --cpus item {item!r}: use ROLE=CPU, e.g. rt=1")
        if role not in ALL_ROLES:
            raise PlacementError(f"unknown role {role!r} in --cpus: roles are "
                                 f"{', '.join(ALL_ROLES)}")
        if role in pins:
            raise PlacementError(f"role {role} is pinned twice in --cpus")
        pins[role] = int(cpu)
    return pins


def available_cpus(sys_cpu: Path = SYS_CPU) -> list[int]:
    """CPUs this process may run on: online and in its affinity."""
    import os
    allowed = set(os.sched_getaffinity(0))
    try:
        online = set(sysinfo.read_cpulist(sys_cpu / "online"))
    except (OSError, KbpctlError):
        online = allowed
    return sorted(allowed & online)


def cpu_problem(cpu: int, available: Sequence[int], sys_cpu: Path = SYS_CPU) -> str:
    """Why ``cpu`` cannot be used (for a refusal)."""
    try:
        present = set(sysinfo.read_cpulist(sys_cpu / "present"))
        online = set(sysinfo.read_cpulist(sys_cpu / "online"))
    except (OSError, KbpctlError):
        present = online = set()
    if present and cpu not in present:
        why = "does not exist"
    elif online and cpu not in online:
        why = "is offline"
    else:
        why = "is not in this process's CPU affinity"
    return f"CPU {cpu} {why} (usable CPUs: {fmt_cpus(available)})"


def fmt_cpus(cpus: Iterable[int]) -> str:
    return ", ".join(str(c) for c in sorted(cpus)) or "none"


@dataclass(frozen=True)
class Placement:
    """{role: CPU} for the roles a scenario uses, and how it came about."""

    cpus: Mapping[str, int]
    available: tuple[int, ...]
    pinned: tuple[str, ...] = ()
    note: str = ""                        # how the roles share, in words

    def cpu(self, role: str) -> int:
        return self.cpus[role]

    def roles_on(self, cpu: int) -> list[str]:
        return [r for r in ALL_ROLES if self.cpus.get(r) == cpu]

    def role_cpus(self) -> dict[str, int]:
        """One entry per CPU a role claims, named by its first role (ROLES order): the
        keys the report's per-CPU columns use (``cpu_<name>_busy_pct``)."""
        out: dict[str, int] = {}
        for r in ROLES:
            c = self.cpus.get(r)
            if c is not None and c not in out.values():
                out[r] = c
        return out

    def cpu_label(self, cpu: int) -> str:
        """The roles on a CPU, as a column heading says them: "tester+flood+heavy"."""
        roles = [r for r in self.roles_on(cpu) if r in ROLES] or self.roles_on(cpu)
        return "+".join(SHORT[r] for r in roles)

    def lines(self) -> list[str]:
        """One line per CPU in use: "CPU 1: RT, RT app"."""
        used = sorted(set(self.cpus.values()))
        return [f"CPU {c}: {', '.join(LABELS[r] for r in self.roles_on(c))}" for c in used]

    def summary(self) -> str:
        by_role = ", ".join(f"{LABELS[r]} {self.cpus[r]}" for r in ALL_ROLES if r in self.cpus)
        return f"CPUs by role: {by_role}" + (f". {self.note}" if self.note else "")

    def to_json(self) -> PlacementDoc:
        return {"cpus": dict(self.cpus), "available": list(self.available),
                "pinned": list(self.pinned), "note": self.note,
                "by_cpu": {str(c): self.roles_on(c) for c in sorted(set(self.cpus.values()))},
                "columns": {k: {"cpu": c, "label": self.cpu_label(c)}
                            for k, c in self.role_cpus().items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Placement:
        """From results.json; also the two-CPU form before roles (rt_cpu, load_cpu)."""
        if "cpus" in d:
            return cls(cpus={k: int(v) for k, v in d["cpus"].items()},
                       available=tuple(d.get("available") or ()),
                       pinned=tuple(d.get("pinned") or ()), note=str(d.get("note") or ""))
        rt, load = int(d.get("rt_cpu", 1)), int(d.get("load_cpu", 0))
        return cls(cpus={TESTER: load, RT: rt, FLOOD: load, HEAVY: load, APP: rt,
                         HARNESS: load}, available=(load, rt),
                   note="from a results.json before roles: --load-cpu/--rt-cpu")


def plan(cpus: Sequence[int], pins: Mapping[str, int] | None = None,
         roles: Sequence[str] = ROLES, on_rt: Sequence[str] = ()) -> Placement:
    """Place ``roles`` (plus app and harness) on ``cpus`` (the usable CPUs), honouring pins;
    the roles in ``on_rt`` (a scenario's allowance) go on the RT CPU unless pinned.

    Raises :class:`PlacementError` with the reason when it cannot be done."""
    avail = tuple(sorted(set(cpus)))
    pins = dict(pins or {})
    bad_rt = [r for r in on_rt if r not in ROLES or r == RT]
    if bad_rt:
        raise PlacementError(f"role {bad_rt[0]!r} cannot be placed on the RT CPU")
    may_share = (RT, APP, *on_rt)
    wanted = [r for r in ROLES if (r in roles or r in pins or r == RT)
              and not (r in on_rt and r not in pins)]
    for role, cpu in pins.items():
        if role not in ALL_ROLES:
            raise PlacementError(f"unknown role {role!r}: roles are {', '.join(ALL_ROLES)}")
        if cpu not in avail:
            raise PlacementError(f"--cpus {role}={cpu}: {cpu_problem(cpu, avail)}")
    if len(avail) < 2:
        raise PlacementError(f"the benchmark needs 2 CPUs (the RT CPU is a CPU of its own); "
                             f"usable here: {fmt_cpus(avail)}")
    if RT in pins:
        shared = [r for r, c in pins.items() if c == pins[RT] and r not in may_share]
        if shared:
            who = _and(["the app", *(f"the {LABELS[r]}" for r in on_rt)])
            raise PlacementError(
                f"--cpus pins {', '.join(shared)} to the RT CPU {pins[RT]}: the RT CPU is "
                f"the RT path's own (KBP Sect. 4.1); only {who} may share it")
    cpu_of: dict[str, int] = {r: c for r, c in pins.items() if r in ROLES}
    taken = set(cpu_of.values())
    free = [c for c in avail if c not in taken]
    if RT not in cpu_of and not free:
        raise PlacementError(
            f"no CPU is left for the RT CPU: the pins ({_fmt_pins(pins)}) use every usable "
            f"CPU ({fmt_cpus(avail)}); pin rt too, or pin fewer roles")
    todo = [r for r in wanted if r not in cpu_of]
    own = [r for r in OWN_PRIORITY if r in todo][:len(free)]
    for role, cpu in zip([r for r in ROLES if r in own], free, strict=False):
        cpu_of[role] = cpu
    for role in (r for r in ROLES if r in todo and r not in own):
        partner = SHARE_WITH.get(role)
        while partner is not None and partner not in cpu_of:
            partner = SHARE_WITH.get(partner)
        if partner is None:
            raise PlacementError(
                f"more roles than CPUs: no CPU is left for the {LABELS[role]} "
                f"({len(avail)} usable CPUs: {fmt_cpus(avail)}; pinned: {_fmt_pins(pins)}); "
                "pin it to a CPU another role may share, or pin fewer roles")
        cpu_of[role] = cpu_of[partner]
    rt_cpu = cpu_of[RT]
    for role in on_rt:
        if role in roles or role in pins:
            cpu_of[role] = pins.get(role, rt_cpu)
    clash = [r for r in ROLES if r not in may_share and cpu_of.get(r) == rt_cpu]
    if clash:
        raise PlacementError(f"more roles than CPUs: the {LABELS[clash[0]]} would share the RT "
                             f"CPU {rt_cpu}; pin roles so that the RT CPU stays alone")
    cpu_of[APP] = pins.get(APP, rt_cpu)
    spare = [c for c in avail if c not in cpu_of.values()]
    if HARNESS in pins:
        if pins[HARNESS] == rt_cpu:
            raise PlacementError(f"--cpus harness={rt_cpu}: the harness (this program, "
                                 "bpftrace) must not run on the RT CPU")
        cpu_of[HARNESS] = pins[HARNESS]
    else:
        cpu_of[HARNESS] = spare[0] if spare else cpu_of[TESTER]
    return Placement(cpus=cpu_of, available=avail, pinned=tuple(sorted(pins)),
                     note=_sharing_note(cpu_of, avail, pins, on_rt))


def _and(xs: Sequence[str]) -> str:
    return xs[0] if len(xs) == 1 else f"{', '.join(xs[:-1])} and {xs[-1]}"


def _fmt_pins(pins: Mapping[str, int]) -> str:
    return ", ".join(f"{r}={c}" for r, c in pins.items()) or "none"


def _sharing_note(cpu_of: Mapping[str, int], avail: Sequence[int],
                  pins: Mapping[str, int], on_rt: Sequence[str] = ()) -> str:
    groups: dict[int, list[str]] = {}
    rt_cpu = cpu_of.get(RT)
    meant = [r for r in on_rt if r in cpu_of and cpu_of[r] == rt_cpu]
    for r in ROLES:
        if r in cpu_of and r not in meant:
            groups.setdefault(cpu_of[r], []).append(r)
    shared = {c: rs for c, rs in groups.items() if len(rs) > 1}
    how = "pinned" if any(r in ROLES for r in pins) else f"{len(avail)} usable CPUs"
    own = len([r for r in ROLES if r in cpu_of]) - len(meant)     # roles that claim a CPU
    by_design = (f"; {_and([LABELS[r] for r in meant])} on the RT CPU {rt_cpu} by the "
                 "scenario's design") if meant else ""
    if not shared:
        return f"{how}: every other role on a CPU of its own{by_design}" if meant else \
            f"{how}: every role on a CPU of its own"
    parts = [f"{_and([LABELS[r] for r in rs])} share CPU {c}" for c, rs in
             sorted(shared.items())]
    tail = "" if how == "pinned" else \
        f" (each role gets a CPU of its own from {own} usable CPUs on)"
    return f"{how}: {'; '.join(parts)}{tail}{by_design}"


@dataclass
class Pins:
    """The user's pins, as options gave them (``--cpus`` and the deprecated aliases)."""

    roles: dict[str, int] = field(default_factory=dict)
    deprecated: list[str] = field(default_factory=list)

    def add_legacy(self, rt_cpu: int | None, load_cpu: int | None) -> None:
        """``--rt-cpu N`` = rt=N; ``--load-cpu N`` = tester, flood, heavy, harness = N."""
        if rt_cpu is not None:
            self.roles.setdefault(RT, rt_cpu)
            self.deprecated.append(f"--rt-cpu {rt_cpu} (now --cpus rt={rt_cpu})")
        if load_cpu is not None:
            for r in (TESTER, FLOOD, HEAVY, HARNESS):
                self.roles.setdefault(r, load_cpu)
            self.deprecated.append(
                f"--load-cpu {load_cpu} (now --cpus tester={load_cpu},flood={load_cpu},"
                f"heavy={load_cpu},harness={load_cpu})")
