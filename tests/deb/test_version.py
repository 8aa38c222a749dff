"""One version for everything: packaging/deb.sh refuses to build when pyproject.toml,
module/dkms.conf, module/kbp_main.c, outsource/guest/dkms.conf, outsource/guest/kbp_so_main.c,
src/kbp/__init__.py, packaging/debian/changelog and the README's manual DKMS commands
disagree, and names the ones that do."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FILES = ["pyproject.toml", "module/dkms.conf", "module/kbp_main.c", "src/kbp/__init__.py",
         "packaging/debian/changelog", "packaging/deb.sh", "README.md",
         "outsource/guest/dkms.conf", "outsource/guest/kbp_so_main.c"]

pytestmark = pytest.mark.skipif(shutil.which("dpkg-parsechangelog") is None,
                                reason="dpkg-dev is not installed (scripts/setup.sh installs it)")


def version_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(root / "packaging" / "deb.sh"), "version"],
                          capture_output=True, text=True, timeout=60)


def copy(tmp: Path) -> Path:
    for f in FILES:
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, tmp / f)
    return tmp


def test_the_sources_agree() -> None:
    p = version_check(REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == tomllib.loads((REPO / "pyproject.toml").read_text())[
        "project"]["version"]


@pytest.mark.parametrize(("path", "old", "new"), [
    ("module/dkms.conf", 'PACKAGE_VERSION="{v}"', 'PACKAGE_VERSION="9.9.9"'),
    ("outsource/guest/dkms.conf", 'PACKAGE_VERSION="{v}"', 'PACKAGE_VERSION="9.9.9"'),
    ("outsource/guest/kbp_so_main.c", 'MODULE_VERSION("{v}");', 'MODULE_VERSION("9.9.9");'),
    ("packaging/debian/changelog", "kbp ({v}-", "kbp (9.9.9-"),
    ("src/kbp/__init__.py", '__version__ = "{v}"', '__version__ = "9.9.9"'),
    ("README.md", "dkms install kbp/{v}", "dkms install kbp/9.9.9"),
])
def test_a_disagreeing_source_stops_the_build(tmp_path: Path, path: str, old: str,
                                              new: str) -> None:
    root = copy(tmp_path)
    v = version_check(REPO).stdout.strip()
    f = root / path
    text = f.read_text()
    assert old.format(v=v) in text
    f.write_text(text.replace(old.format(v=v), new, 1))
    p = version_check(root)
    assert p.returncode != 0
    assert "the version sources disagree" in p.stderr and path in p.stderr, p.stderr
    assert "9.9.9" in p.stderr
