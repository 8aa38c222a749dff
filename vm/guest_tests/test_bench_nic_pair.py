"""``kbpctl bench --nic-pair`` over the rig's two hub-joined virtio NICs (issue 12, item 6): the
RT flow crosses real virtio interrupts, in napi mode and in the module's busy mode, and both
NICs are back in the initial namespace afterwards as they were (addresses, MTU, state, IRQ
affinity).  Timings are emulated (TCG); what is asserted is what happened: replies, the RT
port's interrupts on the RT CPU, the poller's counters.  About 60-90 s under TCG.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import NS, sh

REPO = Path(__file__).resolve().parents[2]


def _state(dev: str) -> dict[str, Any]:
    info = json.loads(sh(f"ip -j addr show dev {dev}").stdout)[0]
    return {"ifindex": info["ifindex"], "up": "UP" in info["flags"], "mtu": info["mtu"],
            "addrs": sorted(f"{a['local']}/{a['prefixlen']}" for a in info["addr_info"]
                            if a.get("scope") != "link")}


def _affinities() -> dict[str, str]:
    return {p.parent.name: p.read_text().strip()
            for p in Path("/proc/irq").glob("*/smp_affinity_list")}


# long (make test-vm-all): ~2 min under TCG. In make test the NIC pair's bench run and its
# put-back are test_bench_stream's, the non-rt poller under a heavy device test_classes',
# and the part modes' requests and restore the host suite's (tests/bench/test_part_modes.py,
# test_shared_cpu_netns.py's stock-hybrid-part run)
@pytest.mark.long
@pytest.mark.timeout(420)
def test_bench_over_the_two_virtio_nics_puts_them_back(kmod: Any, tmp_path: Path) -> None:
    nic0, nic1 = os.environ["KBP_NIC0"], os.environ["KBP_NIC1"]
    sh("modprobe veth")                                    # the flood's pair
    if not Path(f"/sys/class/net/{nic1}").exists():      # the suite's topology holds it
        sh(f"ip -n {NS} link set dev {nic1} netns 1")
    before = {n: _state(n) for n in (nic0, nic1)}
    aff = _affinities()
    out = tmp_path / "bench"
    p = subprocess.run(
        [sys.executable, "-m", "kbp.bench", "--scenario", "shared-cpu",
         "--modes", "napi,hybrid-part", "--reps", "1", "--duration", "2", "--parts", "rtt",
         "--rate", "500", "--no-trace",
         "--no-plots", "--nic-pair", f"{nic1},{nic0}", "--out", str(out)],
        capture_output=True, text=True, timeout=360, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())

    # the NICs are back where and as they were, the IRQ affinities too
    assert {n: _state(n) for n in (nic0, nic1)} == before
    assert _affinities() == aff
    assert not res.get("restore_problems"), res["restore_problems"]

    assert "NIC pair" in res["testbed"] and "emulated" in res["testbed"]
    np_ = res["nic_pair"]
    assert (np_["tester_port"], np_["server_port"]) == (nic1, nic0)
    assert np_["irqs"][nic0], "the server port's virtio interrupts were not found"
    rt_cpu = res["placement"]["cpus"]["rt"]
    assert np_["server_irqs_cpu"] == rt_cpu
    runs = {(r["mode"], r["condition"]): r for r in res["runs"]}
    assert set(runs) == {(m, c) for m in ("napi", "hybrid-part") for c in ("idle", "flood")}, \
        res["modes"]
    for key, r in runs.items():
        sent = r["tester"]["sent"]
        assert sent > 0 and r["rtt_ns"]["n"] > 0.5 * sent, (key, r["tester"])
        assert r["rtt_ns"]["p50"] > 0
        assert r["rt_cpu_rx"]["cpu"] == rt_cpu
    # napi: the requests arrived by virtio interrupts, taken on the RT CPU's side
    assert runs[("napi", "idle")]["rt_cpu_rx"]["rt_nic_irqs"] > 0
    # the report names the testbed and counts the RT port's interrupts
    md = (out / "results.md").read_text()
    assert "RT flow alone over the NIC pair" in md and "RT NIC IRQs/s" in md
    # hybrid-part: the rt poller carried them (packets polled at least one per reply)
    for cond in ("idle", "flood"):
        r = runs[("hybrid-part", cond)]
        assert r["poller"].get("packets", 0) >= 0.5 * r["tester"]["sent"], (cond, r["poller"])
    # and the flood's receiver (the heavy device) was served by the same CPU's non-rt poller
    assert runs[("hybrid-part", "flood")]["poller"].get("nonrt_packets", 0) > 0, \
        runs[("hybrid-part", "flood")]["poller"]
