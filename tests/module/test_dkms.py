"""kbp.ko and kbp_so.ko build with DKMS, warning-free (-Werror), against Debian 12's kernel.

The headers come from the VM rig's cache (``python3 -m vm fetch``), so nothing is installed
on the host; DKMS runs with a private tree. This is what ``dkms install`` does on every
kernel update of an operator's machine, minus the final copy into /lib/modules.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vm import fetch, flavours

REPO = Path(__file__).resolve().parents[2]
# One flavour: DKMS's machinery (dkms.conf, the source tree, MAKE/CLEAN, where the .ko lands)
# is the same for every kernel, and `make test-vm` builds kbp.ko with -Werror against every
# kernel it boots or builds for (6.1, 6.12, 6.12-rt, 7.2, 7.2-rt, Debian 13's two), so the
# other kernels' compile is checked there (~15 s each saved here).
FLAVOURS = [flavours.DEFAULT_FLAVOURS[0]]


#: DKMS package name -> (its source directory, the module it builds): kbp.ko, and kbp_so.ko
#: (socket outsourcing's guest module, whose ABI header is a link the copy resolves)
PACKAGES = {"kbp": ("module", "kbp"), "kbp-so": ("outsource/guest", "kbp_so")}


def _version(src: str = "module") -> str:
    for line in (REPO / src / "dkms.conf").read_text().splitlines():
        if line.startswith("PACKAGE_VERSION="):
            return line.split("=", 1)[1].strip('"')
    raise AssertionError("dkms.conf has no PACKAGE_VERSION")


@pytest.mark.skipif(shutil.which("dkms") is None,
                    reason="dkms is not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("package", sorted(PACKAGES))
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_dkms_builds_against(flavour: str, package: str, tmp_path: Path) -> None:
    tree = fetch.fetch(flavour)
    srcdir, module = PACKAGES[package]
    version = _version(srcdir)
    (tmp_path / "dkms").mkdir()
    src = tmp_path / "source" / f"{package}-{version}"
    shutil.copytree(REPO / srcdir, src,
                    ignore=shutil.ignore_patterns("*.o", "*.ko", "*.mod*", ".*.cmd"))
    p = subprocess.run(
        ["dkms", "build", "--dkmstree", str(tmp_path / "dkms"),
         "--sourcetree", str(tmp_path / "source"), "-m", package, "-v", version,
         "-k", tree.kver, "--kernelsourcedir", str(tree.headers)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "KCFLAGS": "-Werror"})
    log = p.stdout + p.stderr
    built = list((tmp_path / "dkms").rglob(f"{module}.ko"))
    assert p.returncode == 0 and built, log[-3000:]
    info = subprocess.run(["modinfo", "-F", "vermagic", str(built[0])],
                          capture_output=True, text=True, check=True).stdout
    assert info.split()[0] == tree.kver
