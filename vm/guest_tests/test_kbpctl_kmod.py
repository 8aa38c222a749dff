"""kbpctl drives the real module: enable/status/disable through the kmod backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from conftest import NS, POLL_CPU, Flow, Topo, spinning


def kbpctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("kbpctl") or os.path.join(os.path.dirname(os.environ.get(
        "KBP_PYTHON", "python3")), "kbpctl")
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KBP_RUN_DIR": "/run/kbp-guest-test"})
    if check:
        assert p.returncode == 0, f"kbpctl {' '.join(args)}: {p.returncode} {p.stderr}"
    return p


def test_auto_picks_the_module_and_round_trips(kmod, flow: Flow) -> None:
    nic = flow.t.nic0
    out = kbpctl("enable", nic, "--mode", "busy", "--cpus", str(POLL_CPU), "--rt-prio", "0")
    assert "kmod" in out.stdout + out.stderr
    dev = kmod.device(nic)
    assert dev is not None and dev.napi_count and all(n.cpu == POLL_CPU for n in dev.napis)
    poller = kmod.poller(POLL_CPU)
    assert poller.mode == "busy" and spinning(poller.pid)

    flow.start_sink(expect=300)
    flow.send(300, rate=500)
    assert flow.result()["unique"] == 300
    status = json.loads(kbpctl("status", "--json").stdout)
    assert nic in json.dumps(status) and "kmod" in json.dumps(status)

    kbpctl("disable", nic)
    assert kmod.device(nic) is None
    assert kmod.pollers() == []


def test_netns_device_and_conflict(kmod, topo: Topo) -> None:
    kbpctl("enable", topo.nic1, "--netns", NS, "--backend", "kmod", "--mode", "hybrid",
           "--cpus", str(POLL_CPU), "--rt-prio", "0")
    assert kmod.device(topo.nic1, netns=NS) is not None
    # the poller of CPU 1 runs hybrid for NIC1: a busy request for NIC0 is refused, whole
    p = kbpctl("enable", topo.nic0, "--backend", "kmod", "--mode", "busy",
               "--cpus", str(POLL_CPU), "--rt-prio", "0", check=False)
    assert p.returncode != 0
    assert "other devices" in p.stderr or "EBUSY" in p.stderr, p.stderr
    assert kmod.device(topo.nic0) is None
    kbpctl("disable", "--all")
    assert kmod.devices() == []
