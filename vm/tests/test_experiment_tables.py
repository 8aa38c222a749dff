"""The rig's experiments summarise and tabulate like the bench (kbp.bench.stats.mode_summaries,
kbp.bench.report.summary_table): per cell the median over the repetitions, its spread and the
median of the ratios to napi's run of the same repetition -- not the ratio of the medians,
which class-split and outsource-rtt printed before -- and find kbp.ko's pollers by the
module's word."""

from __future__ import annotations

from typing import Any

import pytest

from kbp import kmod
from vm.experiments import class_split, inversion, outsource_rtt

# napi 100 then 300 (median 200); the other mode 60 then 90 (median 75): per repetition
# x0.60 and x0.30, median x0.45; the ratio of the medians would be x0.38
NAPI = (100.0, 300.0)
OTHER = (60.0, 90.0)


def _row(line_start: str, text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(line_start))
    return [c.strip() for c in line.strip("|").split("|")]


def test_class_split_table_pairs_repetitions_and_shows_the_spread() -> None:
    runs: list[dict[str, Any]] = []
    for rep in range(2):
        runs += [{"mode": "hybrid-part:q4", "rep": rep, "mean": OTHER[rep], "heavy_fps": 900.0},
                 {"mode": "hybrid", "rep": rep, "mean": OTHER[rep], "cpu_busy": 0.5},
                 {"mode": "napi", "rep": rep, "mean": NAPI[rep], "heavy_fps": 1000.0}]
    text = class_split.table(runs)
    head = _row("| mode |", text)
    assert head[:2] == ["mode", "mean (us)"] and len(head) == len(class_split.COLUMNS) + 1
    # MODES' order, a quota variant after its base's place
    modes = [ln.split("|")[1].strip() for ln in text.splitlines()[2:]]
    assert modes == ["napi", "hybrid", "hybrid-part:q4"]
    assert _row("| napi |", text)[1] == "200 [100-300]"
    assert _row("| hybrid |", text)[1] == "75 [60-90] x0.45"
    assert _row("| hybrid-part:q4 |", text)[head.index("heavy_fps (frames/s)")] == "900 x0.90"
    assert _row("| hybrid |", text)[head.index("heavy_fps (frames/s)")] == "-"


def _rtt_run(mode: str, rep: int, mean: float) -> dict[str, Any]:
    return {"mode": mode, "rep": rep, "messages": 1000,
            "rtt_us": {"mean": mean, "p50": mean, "p99": 2 * mean, "p99.9": 3 * mean,
                       "sd": 1.0},
            "per_message": {"irq_nic": 1.0, "irq_kbp_so": 0.0, "irq_devices": 2.0,
                            "net_rx": 1.0},
            "host_cpu_us_per_message": {"qemu": 30.0, "kbp_sod": 0.0}}


def test_outsource_rtt_render_pairs_repetitions_and_says_emulated() -> None:
    runs = [_rtt_run(m, rep, v[rep]) for rep in range(2)
            for m, v in (("outsource", OTHER), ("napi", NAPI))]
    doc = {"flavour": "6.12-amd64", "accel": "tcg", "mps": 1000, "size": 64, "seconds": 3,
           "plan": ["napi", "outsource"] * 2, "runs": runs}
    text = outsource_rtt.render(doc)
    assert "TCG: guest times emulated" in text and "medians of 2 [min-max]" in text
    assert _row("| outsource |", text)[1:3] == ["75 [60-90] x0.45", "75 [60-90] x0.45"]
    assert _row("| napi |", text)[1] == "200 [100-300]"
    # a ratio to napi's 0 is no ratio: kbp_so's interrupts per message stay a plain 0
    assert _row("| outsource |", text)[len(outsource_rtt.RTT_COLUMNS) + 1] == "0"


def test_class_split_finds_the_pollers_by_the_modules_word_not_by_name() -> None:
    """The pollers' threads are per device (kbp/<cpu>:<dev>, kbpn/<cpu>:<dev>): the fixed
    names kbp/<cpu> and kbpn/<cpu> the experiment looked for matched none, so cpu_rt_poller
    and cpu_nrt_poller were 0 in every run."""
    cpu, other = class_split.POLL_CPU, class_split.OTHER_CPU
    pollers = [kmod.Poller(cpu=cpu, cls="rt", pid=11, ifname="eth0"),
               kmod.Poller(cpu=cpu, cls="non-rt", pid=12, ifname="ktn0"),
               kmod.Poller(cpu=other, cls="rt", pid=13, ifname="eth1"),
               kmod.Poller(cpu=cpu, cls="rt", pid=0, ifname="eth2")]    # pid unknown
    who = class_split.roles(123, class_split.poll_cpu_pollers(pollers))
    assert (who["rt_poller"], who["nrt_poller"], who["server"]) == ([11], [12], [123])


def test_inversion_takes_the_rt_poller_of_its_device_or_says_what_there_is() -> None:
    pollers = [kmod.Poller(cpu=1, cls="non-rt", pid=20, ifname="eth0"),
               kmod.Poller(cpu=1, cls="rt", pid=21, ifname="eth1"),
               kmod.Poller(cpu=1, cls="rt", pid=22, ifname="eth0")]
    assert inversion.poller_pid(pollers, 1, "eth0") == 22
    with pytest.raises(AssertionError, match=r"no kbp poller of eth0 on CPU 0; the module "
                       r"has: eth0 on CPU 1 \(non-rt, pid 20\)"):
        inversion.poller_pid(pollers, 0, "eth0")
