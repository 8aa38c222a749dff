"""The tuned profile kbp-latency and its Kubernetes twin.

tuned itself cannot run here (its daemon needs D-Bus and polkit, and this machine's PID 1
is not systemd), so the profile is checked with tuned's own profile loader: the code the
daemon loads profiles with resolves ``include=network-latency`` (and its includes) from
Debian's tuned package, merges them and expands ``${i:PROFILE_DIR}``. scripts/setup.sh
unpacks that package into .cache/tuned (not installed: it would pull in dbus and polkitd);
an installed tuned is used as well. The [script] is run here with stand-ins for kbpctl and
systemctl, on both of its paths (systemd running or not).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "contrib" / "tuned" / "kbp-latency"
NTO = REPO / "contrib" / "kubernetes" / "kbp-latency-tuned.yaml"
UNPACKED = Path(os.environ.get("KBP_TUNED_ROOT", str(REPO / ".cache" / "tuned" / "root")))

LOAD = """
import json, sys
from tuned.profiles.factory import Factory
from tuned.profiles.loader import Loader
from tuned.profiles.locator import Locator
from tuned.profiles.merger import Merger
from tuned.profiles.variables import Variables
from tuned.utils.global_config import GlobalConfig
dirs, main_conf, name = sys.argv[1].split(":"), sys.argv[2], sys.argv[3]
p = Loader(Locator(dirs), Factory(), Merger(), GlobalConfig(main_conf), Variables()).load([name])
print(json.dumps({"main": dict(p.options),
                  "units": {n: {k: v for k, v in u.options.items()} for n, u in p.units.items()}}))
"""


def tuned_root() -> Path | None:
    for root in (UNPACKED, Path("/")):
        if (root / "usr/lib/python3/dist-packages/tuned/profiles/loader.py").exists() and \
                (root / "usr/lib/tuned/network-latency/tuned.conf").exists():
            return root
    return None


def load(profile_dir: Path, name: str) -> dict:
    root = tuned_root()
    if root is None:
        pytest.skip(reason=f"tuned's profile loader is neither unpacked in {UNPACKED} nor "
                    "installed (scripts/setup.sh unpacks Debian's tuned package there)")
    p = subprocess.run(
        [sys.executable, "-c", LOAD, f"{root}/usr/lib/tuned:{profile_dir}",
         str(root / "etc/tuned/tuned-main.conf"), name],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(root / "usr/lib/python3/dist-packages")})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_kbp_latency_is_network_latency_plus_the_script() -> None:
    prof = load(PROFILE.parent, "kbp-latency")
    units = prof["units"]
    assert "kbp" in prof["main"]["summary"]
    # network-latency's own settings and, through it, latency-performance's
    assert units["sysctl"]["net.core.busy_read"] == "50"
    assert units["cpu"]["governor"] == "performance"
    assert units["script"]["script"] == [str(PROFILE / "kbp.sh")]


def test_the_kubernetes_tuned_object_carries_the_same_profile(tmp_path: Path) -> None:
    text = NTO.read_text()
    m = re.search(r"^      data: \|\n((?:        .*\n)+)", text, re.M)
    assert m, "no profile data block in the Tuned object"
    data = "".join(line[8:] + "\n" for line in m.group(1).splitlines())
    assert re.search(r"^\s+- name: kbp-latency$", text, re.M)
    assert re.search(r"^      profile: kbp-latency$", text, re.M)
    (tmp_path / "kbp-latency").mkdir()
    (tmp_path / "kbp-latency" / "tuned.conf").write_text(data)
    nto = load(tmp_path, "kbp-latency")
    host = load(PROFILE.parent, "kbp-latency")
    # all of it but the [script] NTO does not support (the nodes' kbp.service does that)
    assert nto["main"] == host["main"]
    assert "script" not in nto["units"]
    assert {k: v for k, v in host["units"].items() if k != "script"} == nto["units"]


def run_script(tmp_path: Path, action: str, systemd: bool,
               config: bool = True, watch_active: bool = False) -> list[str]:
    """kbp.sh ACTION with kbpctl and systemctl stand-ins that log their arguments."""
    log = tmp_path / "log"
    log.write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool, rc in (("kbpctl", 0), ("systemctl", 0)):
        (bin_dir / tool).write_text(
            f'#!/bin/sh\necho "{tool} $*" >> {log}\n'
            + ('case "$*" in "-q is-active kbp-watch.service") exit '
               f'{0 if watch_active else 3};; "is-system-running") echo running;; esac\n'
               if tool == "systemctl" else "") + f"exit {rc}\n")
        (bin_dir / tool).chmod(0o755)
    cfg = tmp_path / "kbp.toml"
    if config:
        cfg.write_text('[[device]]\nname = "eth1"\n')
    p = subprocess.run(
        ["sh", str(PROFILE / "kbp.sh"), action], capture_output=True, text=True, timeout=30,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "KBP_CONFIG": str(cfg),
             "KBP_SYSTEMD_DIR": str(tmp_path if systemd else tmp_path / "none")})
    assert p.returncode == 0, p.stderr
    return [ln for ln in log.read_text().splitlines() if "is-system-running" not in ln]


def test_script_without_systemd_runs_kbpctl(tmp_path: Path) -> None:
    assert run_script(tmp_path, "start", systemd=False) == [
        f"kbpctl apply --config {tmp_path / 'kbp.toml'}"]
    assert run_script(tmp_path, "stop", systemd=False) == ["kbpctl disable --all"]


def test_script_with_systemd_goes_through_kbp_service(tmp_path: Path) -> None:
    assert run_script(tmp_path, "start", systemd=True) == [
        "systemctl -q is-active kbp-watch.service",
        "systemctl reload-or-restart kbp.service"]
    assert run_script(tmp_path, "start", systemd=True, watch_active=True) == [
        "systemctl -q is-active kbp-watch.service"]
    assert run_script(tmp_path, "stop", systemd=True) == [
        "systemctl stop kbp.service kbp-watch.service"]


def test_script_without_config_is_network_latency(tmp_path: Path) -> None:
    assert run_script(tmp_path, "start", systemd=False, config=False) == []
