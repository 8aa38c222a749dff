"""Scenario ``veth-inline`` (the default): the RT flow over veth, with and without a flood.

Two veth pairs between the client and server namespaces: ``rt`` carries the RT
request/response flow (tester -> sockperf server), ``flood`` an iperf3 UDP flood at full
speed from the flood sender to the heavy receiver.  veth has no interrupt: ``veth_xmit()``
schedules the peer's NAPI on the CPU that transmits, so in napi mode the RT device's NAPI
runs in NET_RX softirq inline at the end of the tester's ``send()``, on the tester's CPU, and
the flood's on the flood sender's.  What the flood does to the RT flow in napi mode therefore
depends on the placement: on 2 and 3 CPUs tester and flood sender share a CPU and their
softirq work meets there; from 4 CPUs on they do not, and the flood barely reaches napi.  The
kbp modes move the RT NAPI into a thread on the RT CPU.  (Interrupt-driven contention on the
RT CPU is another scenario's subject: ``shared-cpu``.)

Parts: ``rtt`` (conditions ``load-off`` / ``load-on``, alternating which comes first),
``table2`` (no load), ``rfc2544`` (no load).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from kbp.bench import parts as pt
from kbp.bench import placement as pl
from kbp.bench import plots, report
from kbp.bench.scenarios import Scenario
from kbp.bench.schema import Results, Samples, Summary

if TYPE_CHECKING:
    from kbp.bench.runner import Bench, BenchConfig

LOADS = ("off", "on")
CONDITIONS: dict[str, str] = {
    "load-off": "RT flow, no competing load (idle baseline)",
    "load-on": "RT flow with the competing flood (iperf3 UDP from the flood sender's CPU)",
}


class VethInline(Scenario):
    name = "veth-inline"
    title = ("RT flow over veth with and without a flood (UDP; --flood tcp) on a second "
             "pair; the RT NAPI runs inline in the tester's send() in napi mode")
    links = ("rt", "flood")
    parts = (pt.RTT, pt.TABLE2, pt.RFC2544)
    rt_roles: tuple[str, ...] = ()
    app_policy = "other"
    flood: str | None = "udp"
    role_doc: ClassVar[dict[str, str]] = {
        pl.TESTER: "in napi mode also the RT device's NAPI (veth polls on the transmitting "
                   "CPU)",
        pl.FLOOD: "iperf3 client (the flood) and, in every mode, the flood's receive "
                  "NAPI (veth)",
        pl.HEAVY: "iperf3 server (the heavy receiver)",
    }

    @staticmethod
    def _flood(cfg: BenchConfig) -> bool:
        return pt.RTT in (cfg.parts or []) and "on" in cfg.loads

    def roles(self, cfg: BenchConfig) -> tuple[str, ...]:
        return (pl.TESTER, pl.RT, pl.FLOOD, pl.HEAVY) if self._flood(cfg) else \
            (pl.TESTER, pl.RT)

    def tools(self, cfg: BenchConfig) -> list[str]:
        return ["iperf3"] if self._flood(cfg) else []

    def check(self, cfg: BenchConfig) -> None:
        from kbp.bench.runner import Aborted
        bad = [x for x in cfg.loads if x not in LOADS]
        if bad:
            raise Aborted(f"unknown load {bad[0]!r}: use {', '.join(LOADS)}")

    def plan_seconds(self, cfg: BenchConfig, n_modes: int) -> float:
        return pt.plan_seconds(cfg, n_modes, len(cfg.loads))

    def run(self, bench: Bench) -> None:
        cfg, tb, place = bench.cfg, bench.tb, bench.placement
        assert tb is not None and place is not None
        flood = None
        if self._flood(cfg):
            flood = pt.start_flood(bench)
        for rep in range(cfg.reps):
            if pt.RTT in (cfg.parts or []):
                loads = cfg.loads if rep % 2 == 0 else list(reversed(cfg.loads))
                for load in loads:
                    pt.latency_block(bench, rep, f"load-{load}",
                                        load=flood if load == "on" else None,
                                        load_name="competing flood")
            if pt.TABLE2 in (cfg.parts or []):
                pt.table2(bench, rep)
            if pt.RFC2544 in (cfg.parts or []):
                pt.rfc2544(bench, rep)

    def summarize(self, results: Results) -> Summary:
        return report.summarize(results)

    def render(self, results: Results) -> str:
        return "\n".join([*report.rtt_sections(results, CONDITIONS),
                          *report.table2_section(results), *report.rfc_section(results)])

    def plots(self, results: Results, samples: Samples, out: Path,
              ) -> list[Path]:
        return plots.standard(results, samples, out, CONDITIONS)


SCENARIO = VethInline()
