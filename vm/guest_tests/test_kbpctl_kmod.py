"""kbpctl drives the real module: enable/status/disable through the kmod backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import NS, POLL_CPU, Flow, Topo, spinning

RUN_DIR = "/run/kbp-guest-test"  # the guest tests' kbpctl state (KBP_RUN_DIR)


def kbpctl_path() -> str:
    return shutil.which("kbpctl") or os.path.join(os.path.dirname(os.environ.get(
        "KBP_PYTHON", "python3")), "kbpctl")


def kbpctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([kbpctl_path(), *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KBP_RUN_DIR": RUN_DIR})
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


# -- RPS on the attached NIC ------------------------------------------------------------
def rx_queues(nic: str) -> list[Path]:
    return sorted(Path(f"/sys/class/net/{nic}/queues").glob("rx-*"))


def rps_masks(nic: str) -> dict[str, str]:
    return {q.name: (q / "rps_cpus").read_text().strip() for q in rx_queues(nic)}


def _softnet(cpu: int, column: int) -> int:
    """A /proc/net/softnet_stat column of ``cpu`` (column 13 is the CPU where present)."""
    for i, line in enumerate(Path("/proc/net/softnet_stat").read_text().splitlines()):
        f = [int(x, 16) for x in line.split()]
        if (f[12] if len(f) > 12 else i) == cpu:
            return f[column]
    raise AssertionError(f"CPU {cpu} is not in /proc/net/softnet_stat")


def received_rps(cpu: int) -> int:
    """RPS IPIs ``cpu`` received (column 10). On PREEMPT_RT (backlog threads, 6.10+) RPS
    wakes the target CPU's backlog_napi thread instead, and this stays 0."""
    return _softnet(cpu, 9)


def processed(cpu: int) -> int:
    """Packets ``cpu`` took into the stack (column 1: __netif_receive_skb_core())."""
    return _softnet(cpu, 0)


def nic_status(nic: str) -> dict:
    st = json.loads(kbpctl("status", "--json").stdout)
    (d,) = [d for d in st["devices"] if d["name"] == nic and d["netns"] is None]
    return d


# long: kbpctl's RPS handling (off, the exact masks back, --keep-rps warns, the kmod backend
# too) is make test's on the host (tests/kbpctl/test_integration.py, test_rps*); this adds
# the packets' path on a virtio NIC
@pytest.mark.long
def test_rps_turned_off_and_restored(kmod, flow: Flow) -> None:
    """RPS on the NIC makes the poller hand every packet to a backlog softirq: enable turns
    it off (one line says so), status shows it, disable puts the exact masks back;
    --keep-rps keeps it, warns, and the packets really go through CPU 0's backlog."""
    nic, other = flow.t.nic0, 1 - POLL_CPU
    kmod_args = ["--backend", "kmod", "--mode", "hybrid", "--cpus", str(POLL_CPU),
                 "--rt-prio", "0"]
    orig = rps_masks(nic)
    assert orig, f"{nic} has no rx queues with rps_cpus (CONFIG_RPS?)"
    try:
        for q in rx_queues(nic):
            (q / "rps_cpus").write_text(format(1 << other, "x"))
        masks = rps_masks(nic)

        p = kbpctl("enable", nic, *kmod_args)
        assert p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith(f"kbpctl: note: turned RPS off on {nic} ("), p.stderr
        assert f"'kbpctl disable {nic}' restores it" in p.stderr
        assert all(int(m.replace(",", ""), 16) == 0 for m in rps_masks(nic).values())
        assert kmod.device(nic) is not None
        d = nic_status(nic)
        assert (d["backend"], d["keep_rps"], d["rps"]["on"], d["problems"]) == \
            ("kmod", False, False, [])
        ipis = received_rps(other)
        flow.start_sink(expect=200)
        flow.send(200, rate=400)
        assert flow.result()["unique"] == 200
        assert received_rps(other) == ipis  # nothing steered away from the poller
        kbpctl("disable", nic)
        assert rps_masks(nic) == masks and kmod.device(nic) is None

        p = kbpctl("enable", nic, *kmod_args, "--keep-rps")
        assert p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith(f"kbpctl: warning: RPS stays on for {nic} (--keep-rps"), \
            p.stderr
        assert f"backlog softirq of CPU {other}" in p.stderr
        assert rps_masks(nic) == masks
        d = nic_status(nic)
        assert (d["keep_rps"], d["rps"]["on"], d["rps"]["cpus"], d["problems"]) == \
            (True, True, [other], [])
        on_other = processed(other)
        flow.start_sink(expect=200)
        flow.send(200, rate=400)
        assert flow.result()["unique"] == 200
        # the poller's packets went up the stack from CPU 0's backlog
        assert processed(other) - on_other >= 200
        kbpctl("disable", nic)
        assert rps_masks(nic) == masks
    finally:
        kbpctl("disable", "--all", check=False)
        for q in rx_queues(nic):
            (q / "rps_cpus").write_text(orig[q.name])


@pytest.mark.smoke
def test_a_cpus_knobs_do_not_outlive_its_last_device(kmod, topo: Topo) -> None:
    """kbpctl leaves knobs it was not given to the module. Before the fix the module kept a
    CPU's knobs after its last device detached, so `enable --quota 8 --linger-us 300`,
    `disable`, `enable` gave the new poller quota 8 and linger 300 that nobody asked for."""
    nic = topo.nic0
    kbpctl("enable", nic, "--backend", "kmod", "--mode", "hybrid", "--cpus", str(POLL_CPU),
           "--quota", "8", "--linger-us", "300")
    p = kmod.poller(POLL_CPU)
    assert (p.quota, p.linger_us) == (8, 300)
    kbpctl("disable", nic)
    assert kmod.pollers() == []
    kbpctl("enable", nic, "--backend", "kmod", "--mode", "hybrid", "--cpus", str(POLL_CPU))
    try:
        p = kmod.poller(POLL_CPU)
        assert (p.quota, p.linger_us) == (64, 0), (p.quota, p.linger_us)
    finally:
        kbpctl("disable", nic)


def test_the_kernels_ynl_reads_the_module(kmod, topo: Topo) -> None:
    """The kernel's own YNL library (6.12's tools/net/ynl, what its cli.py runs) reads the
    module's pollers and devices from the family's spec alone (docs/design.md, section 4)."""
    repo = Path(__file__).resolve().parents[2]
    ynl_dir = repo / ".cache/ynl-6.12"      # extracted on the host by tests/kbpctl/test_spec.py
    python = "/usr/bin/python3"
    if not (ynl_dir / "tools/net/ynl/lib/ynl.py").exists():
        pytest.skip(reason=f"{ynl_dir} is not there (the host test extracts it)")
    if subprocess.run([python, "-c", "import yaml"], capture_output=True).returncode:
        pytest.skip(reason="the host's python3 has no PyYAML (python3-yaml), which ynl needs")
    kmod.attach(topo.nic0, cpu=POLL_CPU, mode="hybrid", linger_us=20)
    p = subprocess.run([python, str(repo / "tests/kbpctl/ynl_kbp.py"), str(ynl_dir),
                        str(repo / "module/netlink/kbp.yaml"), "live"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    pollers, devices = json.loads(p.stdout)["results"]
    assert [(x["cpu"], x["class"], x["mode"], x["linger-us"], x["napis"]) for x in pollers] == \
        [(x.cpu, x.cls, x.mode, x.linger_us, x.napis) for x in kmod.pollers()]
    dev = kmod.device(topo.nic0)
    (ours,) = [d for d in devices if d["ifname"] == topo.nic0]
    assert (ours["ifindex"], ours["state"], ours["mode"], ours["cpu"]) == \
        (dev.ifindex, "active", "hybrid", POLL_CPU)
    assert [(n["index"], n["cpu"]) for n in ours["napi"]] == \
        [(n.index, n.cpu) for n in dev.napis]
