"""The few apt commands the rig uses (read-only queries and downloads; never installs).

Debian 12's kernels come from the host's own apt configuration.  Other releases (trixie,
forky) get private apt state in the rig's cache, ``<cache>/apt/<release>/`` (sources.list,
lists, archives); the host's sources and lists are never touched for them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vm import paths
from vm.flavours import Release
from vm.util import RigError, note, run


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}


def state_dir(release: Release) -> Path:
    return paths.cache_root() / "apt" / release.name


def options(release: Release) -> list[str]:
    """``-o`` options that point apt at ``release``'s private state (none for the host).

    Check-Valid-Until is off: the forky Release file the archive serves here is past its
    Valid-Until date (a testing suite's InRelease expires within a week), and the rig
    only reads kernel packages that are then checked against the signed lists anyway.
    """
    if release.is_host:
        return []
    d = state_dir(release)
    return ["-o", f"Dir::Etc::SourceList={d / 'sources.list'}", "-o", "Dir::Etc::SourceParts=-",
            "-o", f"Dir::State::Lists={d / 'lists'}", "-o", "Dir::State::Status=/dev/null",
            "-o", f"Dir::Cache={d / 'cache'}", "-o", "Acquire::Check-Valid-Until=false",
            "-o", "Debug::NoLocking=1"]


def _ensure_state(release: Release) -> None:
    if release.is_host:
        return
    d = state_dir(release)
    for sub in ("lists/partial", "cache/archives/partial"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    text = "".join(f"{line}\n" for line in release.sources)
    src = d / "sources.list"
    if not src.exists() or src.read_text() != text:
        src.write_text(text)
        # New sources: the lists are stale until the next update.
        for old in (d / "lists").glob("*_Packages*"):
            old.unlink()


def has_lists(release: Release) -> bool:
    """False for a release whose private lists were never fetched."""
    return release.is_host or any((state_dir(release) / "lists").glob("*_Packages*"))


_searches: dict[tuple[str, str], str] = {}


def search(pattern: str, release: Release) -> str:
    """``apt-cache search --names-only PATTERN`` output (empty string: nothing found).

    Remembered for the life of the process (until update()): fetching several flavours
    asks the same question, and each apt-cache call costs ~0.5 s."""
    key = (release.name, pattern)
    if key not in _searches:
        _ensure_state(release)
        _searches[key] = run(["apt-cache", *options(release), "search", "--names-only",
                              pattern], env=_apt_env(), what="apt-cache search").stdout
    return _searches[key]


def show(packages: list[str], release: Release) -> str:
    """``apt-cache show`` of the candidate versions; packages apt does not know are
    simply absent from the output."""
    _ensure_state(release)
    proc = subprocess.run(["apt-cache", *options(release), "show", "--no-all-versions",
                           *packages], env=_apt_env(), text=True, capture_output=True)
    return proc.stdout


def update(release: Release) -> None:
    """``apt-get update``: refresh the package lists (point releases come and go)."""
    if os.geteuid() != 0:
        raise RigError("the apt package lists need refreshing but apt-get update needs root; "
                       "run `sudo apt-get update` and retry")
    _ensure_state(release)
    where = "" if release.is_host else f" for {release.name}, in {state_dir(release)}"
    note(f"refreshing the package lists (apt-get update){where}")
    run(["apt-get", *options(release), "update", "-q"], env=_apt_env(),
        what=f"apt-get update ({release.name})")
    for key in [k for k in _searches if k[0] == release.name]:
        del _searches[key]


def download(specs: list[str], dest: Path, release: Release) -> list[Path]:
    """``apt-get download`` the given ``name[=version]`` specs into ``dest``; the .debs."""
    dest.mkdir(parents=True, exist_ok=True)
    _ensure_state(release)
    argv = ["apt-get", *options(release), "download", "-q"]
    if os.geteuid() == 0:
        # apt drops to the _apt user to download, which cannot write into a root-owned
        # cache directory; download as root instead of loosening the directory's mode.
        argv += ["-o", "APT::Sandbox::User=root"]
    run([*argv, *specs], cwd=dest, env=_apt_env(), what=f"apt-get download ({release.name})")
    return sorted(dest.glob("*.deb"))
