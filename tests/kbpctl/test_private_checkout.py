"""The suite must not depend on where the checkout lives (issue 9).

A checkout in a directory other users cannot enter (a clone under /root, mode 0700, or any
``mktemp -d``) broke every test that runs kbpctl as an unprivileged user: they ran the
checkout's own .venv.  CI's clone is not in such a directory, so this test makes one: it
copies this checkout's src, tests, vm, tools and module into a fresh 0700 directory, gives
the copy a .venv of its own (its kbp is the copy's src/, editable-style; the dependencies are
this environment's), and runs the tests marked ``unprivileged`` there, collected from the paths
``make test-host`` collects.  About 20 s.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import REPO, netns_skip_reason, nobody_python

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.slow]


def _private_checkout(top: Path) -> Path:
    co = top / "kbp"
    co.mkdir()
    shutil.copy2(REPO / "pyproject.toml", co)
    # tools/ and module/: the spec test reads the netlink spec and what it generates
    for d in ("src", "tests", "vm", "tools", "module"):
        shutil.copytree(REPO / d, co / d,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.o",
                                                      "*.ko", ".*.cmd", "*.mod*"))
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(co / ".venv")], check=True,
                   capture_output=True)
    (sp,) = (co / ".venv/lib").glob("python3*/site-packages")
    # like 'pip install -e .': the copy's src first; then what this environment has installed
    (sp / "kbp-private-checkout.pth").write_text(
        "\n".join([str(co / "src"), *site.getsitepackages()]) + "\n")
    return co


def test_unprivileged_tests_pass_from_a_0700_checkout() -> None:
    if netns_skip_reason():
        pytest.skip(reason=netns_skip_reason() or "")
    if shutil.which("setpriv") is None or nobody_python() is None:
        pytest.skip(reason="no setpriv, or no Python uid 65534 can run: the tests it would "
                           "run skip here too")
    top = Path(tempfile.mkdtemp(prefix="kbp-private-"))
    try:
        assert stat.S_IMODE(top.stat().st_mode) == 0o700
        co = _private_checkout(top)
        py = co / ".venv/bin/python"
        where = subprocess.run([py, "-c", "import kbp; print(kbp.__file__)"],
                               capture_output=True, text=True, check=True, cwd=co).stdout
        assert where.strip() == str(co / "src/kbp/__init__.py")
        # the user kbpctl runs as cannot reach the checkout at all
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "--", "test", "-r", str(co / "src/kbp/cli.py")], cwd="/")
        assert p.returncode == 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.pop("PYTHONPATH", None)
        r = subprocess.run([py, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                            "-m", "unprivileged", "tests", "vm/tests"], cwd=co, env=env,
                           capture_output=True, text=True, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        last = out.strip().splitlines()[-1]
        m = re.search(r"(\d+) passed", last)
        assert m and int(m.group(1)) >= 2, last
        assert not re.search(r"skipped|failed|error", last), out[-4000:]
    finally:
        shutil.rmtree(top, ignore_errors=True)
