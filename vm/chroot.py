"""Build chroots: a minimal Debian of another release, to build modules for its kernels.

Debian 13's headers want gcc-14 and forky's gcc-16, and their kbuild host programs
(fixdep, modpost, objtool) are linked against a newer glibc than Debian 12's, so a module
for those kernels cannot be built on the host.  ``ensure()`` makes
``<cache>/chroots/<release>/`` with ``debootstrap --variant=minbase`` once, then installs
what the flavour's headers depend on (``fetch.Resolved.tools``) into it.  ``make()`` runs
a command in it inside a private mount namespace (``unshare --mount``) that bind-mounts the
rig's cache at the same path and mounts /proc (objtool reads it): every mount disappears
with the namespace, so nothing is left mounted on the host, whatever happens.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

from vm import paths
from vm.flavours import Release
from vm.util import RigError, Stopwatch, file_lock, note, run

MIRROR = "http://deb.debian.org/debian"
#: Always in a build chroot besides the headers' own dependencies.
BASE_TOOLS = ("make", "ca-certificates")
APT_CONF = """\
// kbp build chroot: testing suites' Release files can be past Valid-Until on mirrors
Acquire::Check-Valid-Until "false";
APT::Install-Recommends "false";
"""


def root_dir(release: Release) -> Path:
    return paths.cache_root() / "chroots" / release.name


def _stamp(release: Release) -> Path:
    return root_dir(release).with_suffix(".json")


def _installed(release: Release) -> set[str]:
    try:
        return set(json.loads(_stamp(release).read_text())["tools"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _namespace_script(root: Path, command: list[str], *, cwd: str = "/") -> list[str]:
    """argv that runs ``command`` chrooted in ``root`` in a private mount namespace with
    the cache, /dev and /proc mounted inside (gone when the namespace ends)."""
    cache = paths.cache_root()
    script = "; ".join((
        "set -e",
        f"mount --rbind /dev {shlex.quote(str(root / 'dev'))}",
        f"mount -t proc proc {shlex.quote(str(root / 'proc'))}",
        f"mount --bind {shlex.quote(str(cache))} {shlex.quote(str(root) + str(cache))}",
        f"cp -L /etc/resolv.conf {shlex.quote(str(root / 'etc' / 'resolv.conf'))} || true",
        f"cd {shlex.quote(str(root))}",
        f"exec chroot {shlex.quote(str(root))} sh -c "
        + shlex.quote(f"cd {shlex.quote(cwd)} && exec {shlex.join(command)}"),
    ))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def _in_chroot(root: Path, command: list[str], *, what: str, quiet: bool = True) -> None:
    (Path(str(root) + str(paths.cache_root()))).mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C",
           "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}
    run(_namespace_script(root, command), what=what, env=env, quiet=quiet)


def _debootstrap(release: Release, root: Path) -> None:
    if os.geteuid() != 0:
        raise RigError(f"building the {release.name} build chroot needs root (debootstrap)")
    if shutil.which("debootstrap") is None and not Path("/usr/sbin/debootstrap").exists():
        raise RigError("debootstrap is not installed (run `python3 -m vm setup`)")
    script = Path("/usr/share/debootstrap/scripts") / release.debootstrap_script
    if not script.exists():
        raise RigError(f"debootstrap has no script {script} for {release.name}; "
                       "install a newer debootstrap")
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    clock = Stopwatch()
    note(f"{release.name}: making the build chroot {root} (debootstrap --variant=minbase; "
         "once, cached)")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_TOOLS)}",
         release.name, partial, MIRROR, script],
        what=f"debootstrap of the {release.name} build chroot (archive {MIRROR})")
    (partial / "etc" / "apt" / "apt.conf.d" / "99kbp").write_text(APT_CONF)
    (partial / "etc" / "apt" / "sources.list").write_text(
        "".join(f"{line}\n" for line in release.sources))
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    _stamp(release).write_text(json.dumps({"tools": list(BASE_TOOLS)}) + "\n")
    note(f"{release.name}: build chroot ready in {clock():.0f} s")


def ensure(release: Release, tools: list[str]) -> Path:
    """The build chroot of ``release`` with ``tools`` installed; made on first use."""
    if release.is_host:
        raise RigError("the host's own release needs no build chroot")
    root = root_dir(release)
    with file_lock(root.with_name(root.name + ".lock"), f"{release.name} build chroot"):
        if not _stamp(release).exists() or not (root / "usr" / "bin").is_dir():
            _debootstrap(release, root)
        have = _installed(release)
        missing = [t for t in tools if t not in have]
        if missing:
            note(f"{release.name}: installing {' '.join(missing)} in the build chroot")
            _in_chroot(root, ["apt-get", "update", "-q"],
                       what=f"apt-get update in the {release.name} build chroot")
            _in_chroot(root, ["apt-get", "install", "-y", "-q", *missing],
                       what=f"apt-get install {' '.join(missing)} in the {release.name} "
                            "build chroot")
            _stamp(release).write_text(json.dumps({"tools": sorted(have | set(missing))})
                                       + "\n")
    return root


def make(release: Release, tools: list[str], argv: list[str], *, what: str) -> None:
    """Run ``argv`` (paths under the rig's cache) in ``release``'s build chroot."""
    _in_chroot(ensure(release, tools), argv, what=what, quiet=False)
