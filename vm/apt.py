"""The few apt commands the rig uses (read-only queries and downloads; never installs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vm.util import RigError, note, run


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}


_searches: dict[str, str] = {}


def search(pattern: str) -> str:
    """``apt-cache search --names-only PATTERN`` output (empty string: nothing found).

    Remembered for the life of the process (until update()): fetching several flavours
    asks the same question, and each apt-cache call costs ~0.5 s."""
    if pattern not in _searches:
        _searches[pattern] = run(["apt-cache", "search", "--names-only", pattern],
                                 env=_apt_env(), what="apt-cache search").stdout
    return _searches[pattern]


def show(packages: list[str]) -> str:
    """``apt-cache show`` of the candidate versions; packages apt does not know are
    simply absent from the output."""
    proc = subprocess.run(["apt-cache", "show", "--no-all-versions", *packages],
                          env=_apt_env(), text=True, capture_output=True)
    return proc.stdout


def update() -> None:
    """``apt-get update``: refresh the package lists (point releases come and go)."""
    if os.geteuid() != 0:
        raise RigError("the apt package lists need refreshing but apt-get update needs root; "
                       "run `sudo apt-get update` and retry")
    note("refreshing the package lists (apt-get update)")
    run(["apt-get", "update", "-q"], env=_apt_env(), what="apt-get update")
    _searches.clear()


def download(specs: list[str], dest: Path) -> list[Path]:
    """``apt-get download`` the given ``name[=version]`` specs into ``dest``; the .debs."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = ["apt-get", "download", "-q"]
    if os.geteuid() == 0:
        # apt drops to the _apt user to download, which cannot write into a root-owned
        # cache directory; download as root instead of loosening the directory's mode.
        argv += ["-o", "APT::Sandbox::User=root"]
    run([*argv, *specs], cwd=dest, env=_apt_env(), what="apt-get download")
    return sorted(dest.glob("*.deb"))
