"""The systemd side of boot-time configuration: kbp-generator's output for a kbp.toml, and
``systemd-analyze verify`` of the shipped units with it (clean: no message at all).

The units are verified as the kbpctl package installs them (kbpctl at /usr/bin, the same
sed as packaging/debian/rules) in a scratch root that has this machine's systemd units,
placeholder executables, and the generator's output in /etc/systemd/system (systemd-analyze
--root does not read /run/systemd/generator: a drop-in there is the same drop-in).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbp import generator

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "src" / "kbp" / "data"
UNITS = ["kbp.service", "kbp-watch.service", "kbp-device@.service"]
TEMPLATE = Path("/lib/systemd/system/kbp-device@.service")
CONFIG = """
backend = "kmod"
[defaults]
cpus = "1"
[[device]]
name = "eth1"
[[device]]
name = "veth-srv"
[[device]]
name = "veth0"
netns = "blue"
[[device]]
name = "eth1"
mode = "busy"
"""


def test_escape_matches_systemd_escape() -> None:
    names = ["eth1", "veth-srv", "enp3s0f0.100", ".hidden", "br@x", "wlp2s0", "ä"]
    assert [generator.escape(n) for n in names] == [
        "eth1", "veth\\x2dsrv", "enp3s0f0.100", "\\x2ehidden", "br\\x40x", "wlp2s0",
        "\\xc3\\xa4"]
    tool = shutil.which("systemd-escape")
    if tool:
        out = subprocess.run([tool, *names], capture_output=True, text=True, check=True)
        assert out.stdout.split() == [generator.escape(n) for n in names]


def test_generator_orders_both_services_after_the_named_devices(tmp_path: Path) -> None:
    cfg = tmp_path / "kbp.toml"
    cfg.write_text(CONFIG)
    out = tmp_path / "gen"
    assert generator.generate(cfg, out, TEMPLATE) == ["eth1", "veth-srv"]
    for svc in generator.SERVICES:
        text = (out / f"{svc}.d" / generator.DROPIN).read_text()
        lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
        assert lines == ["[Unit]",
                         "Wants=sys-subsystem-net-devices-eth1.device",
                         "After=sys-subsystem-net-devices-eth1.device",
                         "Wants=sys-subsystem-net-devices-veth\\x2dsrv.device",
                         "After=sys-subsystem-net-devices-veth\\x2dsrv.device"]
    link = out / "sys-subsystem-net-devices-veth\\x2dsrv.device.wants" / \
        "kbp-device@veth\\x2dsrv.service"
    assert os.readlink(link) == str(TEMPLATE)
    # the device in netns blue has no device unit of this systemd: nothing for it
    assert not list(out.glob("*veth0*"))


def test_generator_without_config_or_devices_writes_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "kbp.toml"
    cfg.write_text('backend = "stock"\n[rt_class]\nrtnet_prio = 51\n')
    assert generator.generate(cfg, tmp_path / "gen", TEMPLATE) == []
    assert not (tmp_path / "gen").exists()
    p = subprocess.run([sys.executable, str(DATA / "kbp-generator"), str(tmp_path / "gen2")],
                       capture_output=True, text=True, timeout=30,
                       env={**os.environ, "KBP_GENERATOR_CONFIG": str(tmp_path / "none")})
    assert p.returncode == 0 and not p.stderr and not (tmp_path / "gen2").exists()


def test_generator_never_fails_the_boot_on_a_bad_config(tmp_path: Path) -> None:
    cfg = tmp_path / "kbp.toml"
    for text in ("[[device]\nname = 'eth1'", "[[device]]\nmode = 'busy'\n",
                 "device = 'eth1'\n", "[[device]]\nname = '../x'\n"):
        cfg.write_text(text)
        p = subprocess.run([sys.executable, str(DATA / "kbp-generator"), str(tmp_path / "gen")],
                           capture_output=True, text=True, timeout=30,
                           env={**os.environ, "KBP_GENERATOR_CONFIG": str(cfg)})
        assert p.returncode == 0, p.stderr
        assert p.stderr.startswith(f"kbp-generator: {cfg}: ") and "no device dep" in p.stderr
        assert not (tmp_path / "gen").exists()


def scratch_root(root: Path) -> Path:
    """This machine's system units, kbp's as packaged, placeholder executables."""
    unitdir = root / "lib" / "systemd" / "system"
    shutil.copytree("/lib/systemd/system", unitdir, symlinks=True)
    for u in UNITS:
        (unitdir / u).write_text((DATA / u).read_text().replace("/usr/local/bin/kbpctl",
                                                                "/usr/bin/kbpctl"))
    for exe in ("usr/bin/kbpctl", "bin/sh", "bin/systemctl"):
        (root / exe).parent.mkdir(parents=True, exist_ok=True)
        (root / exe).write_text("#!/bin/sh\n")
        (root / exe).chmod(0o755)
    return root


def verify(root: Path, *units: str) -> str:
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}",
                        *(f"/lib/systemd/system/{u}" for u in units)],
                       capture_output=True, text=True, timeout=120)
    return f"rc {p.returncode}\n{p.stdout}{p.stderr}".strip()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None or
                    not Path("/lib/systemd/system/multi-user.target").exists(),
                    reason="systemd-analyze and the system's units are needed (Debian: systemd)")
def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    root = scratch_root(tmp_path / "root")
    cfg = tmp_path / "kbp.toml"
    cfg.write_text(CONFIG)
    generator.generate(cfg, root / "etc" / "systemd" / "system", TEMPLATE)
    assert verify(root, "kbp.service", "kbp-watch.service",
                  "kbp-device@eth1.service", "kbp-device@veth\\x2dsrv.service") == "rc 0"
    # the check has teeth: a misspelt key and a missing executable are reported
    unit = root / "lib" / "systemd" / "system" / "kbp-device@.service"
    unit.write_text(unit.read_text().replace("ExecCondition=", "ExecCondtion="))
    (root / "usr" / "bin" / "kbpctl").unlink()
    out = verify(root, "kbp.service", "kbp-device@eth1.service")
    assert "Unknown key 'ExecCondtion'" in out and "/usr/bin/kbpctl" in out, out
