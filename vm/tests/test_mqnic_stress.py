"""The rig's multi-queue NIC (vm/mqnic.py) and the stress report (vm/stress.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vm import cli, mqnic, run, stress
from vm.util import RigError


def test_mq_nic_qemu_arguments() -> None:
    """A multi-queue tap QEMU makes (no vhost under TCG) and virtio-net with mq=on and a
    vector per virtqueue plus config and control."""
    args = mqnic.qemu_args(2)
    assert args[:2] == ["-netdev", "tap,id=kbpmq,ifname=kbpmq0,script=no,downscript=no,"
                                   "vhost=off,queues=2"]
    assert args[2:] == ["-device", f"virtio-net-pci,netdev=kbpmq,mac={mqnic.MAC},mq=on,"
                                   "vectors=6"]
    assert mqnic.guest_env()["KBP_MQ_MAC"] == mqnic.MAC


def test_mq_nic_option_reaches_the_spec_and_the_guest() -> None:
    args = cli.parser().parse_args(["test", "6.12-amd64", "--mq-nic"])
    spec = cli._spec(args, "6.12-amd64", [])
    assert spec.mq_nic
    env = run.guest_env(spec, "6.12.0")
    assert env["KBP_MQ_MAC"] == mqnic.MAC and env["KBP_MQ_HOST_IP"] == mqnic.HOST_IP
    assert "KBP_MQ_MAC" not in run.guest_env(
        cli._spec(cli.parser().parse_args(["test", "6.12-amd64"]), "6.12-amd64", []),
        "6.12.0")


def test_mq_nic_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(RigError, match="needs root"):
        mqnic.check()


def test_mq_nic_netns_is_made_and_removed() -> None:
    if subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":
        pytest.skip(reason="needs root (ip netns)")
    with mqnic.netns() as ns:
        assert Path("/run/netns", ns).exists()
    assert not Path("/run/netns", ns).exists()


def test_stress_line_and_splats_from_a_console_log(tmp_path: Path) -> None:
    log = tmp_path / "6.12-amd64.log"
    counts = {"events": 12, "lost": 0, "reordered": 0, "seed": 7}
    log.write_text("boot\n[   1.0] kbp: loaded\nKBP-STRESS-SEED 7\n"
                   f"[  60.1] KBP-STRESS {json.dumps(counts)}\n"
                   "[   61.000000] BUG: unable to handle page fault for address: 0\n")
    assert stress.stress_line(log) == counts
    assert stress.splats(log) == ["[   61.000000] BUG: unable to handle page fault for address: 0"]
    assert stress.stress_line(tmp_path / "none.log") is None
    (tmp_path / "cut.log").write_text("KBP-STRESS {\"events\": \n")
    assert stress.stress_line(tmp_path / "cut.log") is None
