"""Scenarios of the benchmark: what testbed, load and measurements one ``kbpctl bench`` runs.

A scenario is one file in this package defining ``SCENARIO``, an instance of a subclass of
:class:`Scenario`; :func:`all_scenarios` finds every such file (the default first, then by
name), and ``--help``, ``--scenario`` and the refusal of unknown names follow from it.
The runner (:mod:`kbp.bench.runner`) does what every scenario shares: checks, the placement
of roles to CPUs, the testbed (veth pairs named by the scenario's ``links``; the first,
``rt``, carries the RT flow), the RT application (sockperf server) on the RT pair, the modes,
tracefs, Ctrl-C.  It hands itself to ``run`` as the
session: ``order(rep)``, ``latency_run(...)``, ``rfc2544(...)``, ``note(...)``,
``placement``, ``tb``, and for a scenario's own measurements ``mode_on(mode)`` (the mode on,
with its quirks) and ``advance(planned_s, desc)`` (progress).  Reusable measurements (the
RT latency block, Table 2, RFC 2544) and tables live in :mod:`kbp.bench.parts` and
:mod:`kbp.bench.report`.

=============  =================================================================================
veth-inline    the default: RT flow over veth, with and without an iperf3 UDP flood; on veth the
               RT NAPI runs inline at the end of the tester's send() (on the tester's CPU), so in
               napi mode the flood reaches it only where tester and flood sender share a CPU
shared-cpu     the papers' situation (``make demo``): RPS steers both server devices' receive
               processing to the RT CPU, where the RT app and the heavy receiver run; the kbp
               modes take the RT device off RPS onto the poller, the flood stays on the backlog
stream         NetAP's throughput workload: iperf3 bulk TCP and UDP streams from the tester to
               a receiver over the RT device; bandwidth, CPU time of the polling context,
               interrupts (veth: NET_RX softirqs) per packet, the periodic modes' interval
rt-split       rt-socket-outsourcing Sect. IV-A / Table 3: RT UDP request/response at random
               gaps uniform in 1-10 ms and an iperf3 TCP heavy receiver, both received on the
               RT CPU (shared-cpu's RPS); RT mean/p99/SD, heavy Gbit/s, RT CPU use; its own
               mode ``exclusive`` (the exclusive CPU method) moves the heavy receiver and its
               receive processing to a non-RT CPU
=============  =================================================================================

The placement rules (:mod:`kbp.bench.placement`) place only the roles ``roles(cfg)`` names;
the RT pair, the RT app and the tester are the runner's, everything else (a load, RPS
steering, extra tracepoints) the scenario's own ``run`` sets up and registers for undoing
with ``bench.tb.defer`` so Ctrl-C or a crash leaves nothing behind.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kbp.bench import modes
from kbp.bench.schema import Results, Samples, Summary

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig

DEFAULT = "veth-inline"


class UnknownScenario(ValueError):
    pass


#: what a scenario's report says its cells are, unless it says otherwise (``measures``)
ROUND_TRIPS = "Kernel-timestamped round trips (SO_TIMESTAMPING software stamps), microseconds."


class Scenario:
    """What every scenario is, and the defaults of what a scenario may leave out.

    A scenario sets ``name``, ``title``, ``links``, ``parts`` and implements the methods that
    raise NotImplementedError here; the other members have defaults (read directly, never
    with getattr)."""

    name: str
    title: str                  # what it measures, one line (results.md, --help)
    links: tuple[str, ...]      # veth pairs by role; the first is the RT pair ("rt")
    parts: tuple[str, ...]      # the measurements it can run (--parts), in order
    #: what runs in each role it adds (results' placement.runs)
    role_doc: ClassVar[dict[str, str]] = {}
    rt_roles: tuple[str, ...] = ()   # roles it puts on the RT CPU (placement.plan's on_rt)
    app_policy: str = "other"        # the RT app's class unless --app-policy: fifo | other
    measures: str = ROUND_TRIPS      # the report header's sentence on what the cells are
    #: the modes when --modes is not given (empty: every mode every scenario offers,
    #: kbp.bench.modes.standard_modes; :meth:`modes_by_default` may decide instead)
    default_modes: tuple[str, ...] = ()
    #: the parts when --parts is not given (None: all of its own and the runner's)
    default_parts: tuple[str, ...] | None = None
    #: what a CLI preset (--smoke, --demo) means for it: {preset: {config field: value}},
    #: applied over the preset's own values
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    #: the kind of its flood when --flood is not given (parts.FLOODS); None: it has no flood
    #: to choose and refuses --flood
    flood: str | None = None
    #: its ``run`` binds a heavy receiver (kbp.bench.heavy.bind_heavy), so it offers the
    #: modes that move or split the heavy flow (kbp.bench.modes.HEAVY_CATEGORIES)
    binds_heavy: bool = False

    # -- its modes, from kbp.bench.modes' table --------------------------------------------
    def offers(self, mode: str) -> bool:
        """``mode`` (today's name) runs in this scenario."""
        info = modes.catalog().get(mode)
        return info is not None and (self.binds_heavy or not info.heavy)

    def mode_names(self) -> tuple[str, ...]:
        """Every mode it offers, in table order (--modes)."""
        return tuple(m for m in modes.catalog() if self.offers(m))

    @property
    def own_modes(self) -> dict[str, str]:
        """{mode: summary} of the modes it offers beyond the ones every scenario has."""
        common = set(modes.standard_modes())
        return {m: modes.catalog()[m].summary for m in self.mode_names() if m not in common}

    def make_modes(self) -> dict[str, modes.Mode]:
        """Fresh adapters of :attr:`own_modes` (one set per run; ``run`` binds them)."""
        return modes.make_modes(self.own_modes)

    def modes_by_default(self) -> tuple[str, ...]:
        """The modes a run compares when none are named."""
        return self.default_modes or modes.standard_modes()

    # -- what every scenario implements ----------------------------------------------------
    def roles(self, cfg: BenchConfig) -> tuple[str, ...]:
        """The roles (kbp.bench.placement.ROLES) this configuration places on CPUs."""
        raise NotImplementedError

    def tools(self, cfg: BenchConfig) -> list[str]:
        """Programs it needs besides the runner's (ip, ethtool, taskset, sockperf)."""
        raise NotImplementedError

    def check(self, cfg: BenchConfig) -> None:
        """Refuse a configuration it cannot run (raise runner.Aborted with the reason)."""
        raise NotImplementedError

    def plan_seconds(self, cfg: BenchConfig, n_modes: int) -> float:
        """Planned run time (the progress bar's total)."""
        raise NotImplementedError

    #: --heavy-napi values the scenario offers (empty: only the default, "sender")
    heavy_napi_choices: tuple[str, ...] = ()

    def modes_overhead_s(self, cfg: BenchConfig, mode_names: Sequence[str]) -> float:
        """Planned seconds the named modes add over :meth:`plan_seconds`' per-run estimate
        (their setup under load, settles): 0 unless a scenario measured them."""
        return 0.0

    def run(self, bench: Bench) -> None:
        """Every repetition of every part; records land in bench.results / bench.samples."""
        raise NotImplementedError

    def summarize(self, results: Results) -> Summary:
        """results["summary"] from results["runs"] and the other raw records."""
        raise NotImplementedError

    def render(self, results: Results) -> str:
        """The scenario's markdown tables (the runner adds the header and footer)."""
        raise NotImplementedError

    def plots(self, results: Results, samples: Samples, out: Path,
              ) -> list[Path]:
        """PNG plots written to ``out``."""
        raise NotImplementedError


def default_modes(scen: Scenario) -> tuple[str, ...]:
    """The modes a run of ``scen`` compares when none are named: its ``default_modes``,
    else every mode every scenario offers; never a comparison variant (``on_request``)."""
    cat = modes.catalog()
    return tuple(m for m in scen.modes_by_default() if not cat[m].on_request)


@cache
def all_scenarios() -> dict[str, Scenario]:
    """Every scenario of this package (a module defining ``SCENARIO``), by name; the
    default first, then alphabetical."""
    found: dict[str, Scenario] = {}
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        scen = getattr(mod, "SCENARIO", None)
        if scen is not None:
            found[scen.name] = scen
    return {k: found[k] for k in sorted(found, key=lambda n: (n != DEFAULT, n))}


def get(name: str) -> Scenario:
    """The scenario called ``name``; unknown names are refused with the known ones."""
    known = all_scenarios()
    if name not in known:
        raise UnknownScenario(f"unknown scenario {name!r}: choose from {', '.join(known)}")
    return known[name]
