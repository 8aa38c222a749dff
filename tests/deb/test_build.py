"""make deb (packaging/deb.sh) builds kbp-dkms and kbpctl with the files the packages
promise, lintian finds no error, and the maintainer scripts parse.

Skipped when the build dependencies of packaging/debian/control are missing (deb.sh would
install them with apt-get; scripts/setup.sh does, so `make test-host` runs this). Built into
a scratch directory, not out/deb (which a VM run may be reading).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
DATA = REPO / "src" / "kbp" / "data"


def unmet_build_deps() -> str:
    if shutil.which("dpkg-checkbuilddeps") is None:
        return "dpkg-dev"
    p = subprocess.run(["dpkg-checkbuilddeps", str(REPO / "packaging/debian/control")],
                       capture_output=True, text=True, timeout=60)
    return "" if p.returncode == 0 else p.stderr.strip().split("dependencies: ")[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    unmet = unmet_build_deps()
    if unmet:
        pytest.skip(reason=f"build dependencies missing ({unmet}): scripts/setup.sh installs them, "
                    "as make deb does")
    out = tmp_path_factory.mktemp("deb")
    p = subprocess.run([str(REPO / "packaging" / "deb.sh")], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "KBP_DEB_OUT": str(out)})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, p.stdout + p.stderr


def deb(out: Path, name: str) -> Path:
    """The package `name` (architecture all, or the build's for kbp-sod)."""
    debs = sorted(out.glob(f"{name}_{VERSION}-*_*.deb"))
    assert len(debs) == 1, sorted(p.name for p in out.iterdir())
    return debs[0]


def contents(path: Path) -> set[str]:
    lines = subprocess.run(["dpkg-deb", "-c", str(path)], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return {ln.split(None, 5)[5].split(" -> ")[0].lstrip(".") for ln in lines}


def field(path: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(path), name], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_kbp_dkms_has_the_module_source_and_dkms_conf(built: tuple[Path, str]) -> None:
    out, _ = built
    path = deb(out, "kbp-dkms")
    files = contents(path)
    src = f"/usr/src/kbp-{VERSION}"
    want = {f"{src}/dkms.conf", f"{src}/Kbuild", f"{src}/Makefile", f"{src}/uapi/kbp.h",
            *(f"{src}/{p.name}" for p in (REPO / "module").glob("*.[ch]")
              if not p.name.endswith(".mod.c"))}     # modpost's, after a build in the tree
    assert want <= files, sorted(want - files)
    # nothing built, nothing of kbpctl's
    assert not [f for f in files if f.endswith((".o", ".ko", ".cmd", ".mod.c"))]
    assert not [f for f in files if "python3" in f or "systemd" in f]
    assert "dkms" in field(path, "Depends")


def test_kbp_so_dkms_has_the_guest_module_source_and_its_abi_header(
        built: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = built
    path = deb(out, "kbp-so-dkms")
    files = contents(path)
    src = f"/usr/src/kbp-so-{VERSION}"
    want = {f"{src}/dkms.conf", f"{src}/Kbuild", f"{src}/Makefile", f"{src}/kbp_so.h",
            f"{src}/kbp_so_abi.h"}
    want |= {f"{src}/{h.name}" for h in (REPO / "outsource/guest").glob("*.h")}
    want |= {f"{src}/{c.name}" for c in (REPO / "outsource/guest").glob("*.c")}
    assert want <= files, sorted(want - files)
    assert not [f for f in files if f.endswith((".o", ".ko", ".cmd"))]
    assert "dkms" in field(path, "Depends")
    # the ABI header is the file (the tree's is a link to outsource/include/)
    subprocess.run(["dpkg-deb", "-x", str(path), str(tmp_path)], check=True)
    header = tmp_path / src.lstrip("/") / "kbp_so_abi.h"
    assert not header.is_symlink()
    assert header.read_bytes() == (REPO / "outsource/include/kbp_so_abi.h").read_bytes()
    assert 'BUILT_MODULE_NAME[0]="kbp_so"' in (header.parent / "dkms.conf").read_text()


def test_kbp_sod_has_the_daemon_its_unit_user_and_man_page(built: tuple[Path, str],
                                                          tmp_path: Path) -> None:
    """kbp-sod: the confined host daemon, its unit template, its user (sysusers.d), the
    example VM configuration and the man page; linked against libseccomp (shlibs)."""
    out, _ = built
    path = deb(out, "kbp-sod")
    files = contents(path)
    assert "/usr/sbin/kbp-sod" in files, sorted(files)
    assert any(f.endswith("/kbp-sod@.service") for f in files), sorted(files)
    assert any(f.startswith("/usr/lib/sysusers.d/") for f in files), sorted(files)
    assert any("/man8/kbp-sod.8" in f for f in files), sorted(files)
    assert any(f.startswith("/usr/share/doc/kbp-sod/examples/") for f in files), sorted(files)
    assert "libseccomp" in field(path, "Depends")
    subprocess.run(["dpkg-deb", "-x", str(path), str(tmp_path)], check=True)
    ver = subprocess.run([str(tmp_path / "usr/sbin/kbp-sod"), "--version"],
                         capture_output=True, text=True, check=False)
    assert ver.returncode == 0 and VERSION in ver.stdout + ver.stderr, ver


def test_kbpctl_has_the_command_units_config_profile_and_man_page(
        built: tuple[Path, str]) -> None:
    out, _ = built
    path = deb(out, "kbpctl")
    files = contents(path)
    want = {"/usr/bin/kbpctl", "/usr/lib/python3/dist-packages/kbp/cli.py",
            "/usr/lib/python3/dist-packages/kbp/generator.py",
            "/lib/systemd/system/kbp.service", "/lib/systemd/system/kbp-watch.service",
            "/lib/systemd/system/kbp-device@.service",
            "/lib/systemd/system-generators/kbp-generator",
            "/etc/kbp/kbp.toml.example",
            "/usr/lib/tuned/kbp-latency/tuned.conf", "/usr/lib/tuned/kbp-latency/kbp.sh",
            "/usr/share/man/man1/kbpctl.1.gz", "/usr/share/doc/kbpctl/copyright"}
    assert want <= files, sorted(want - files)
    assert not [f for f in files if f.startswith("/usr/src")]
    depends = field(path, "Depends")
    for dep in ("python3-pyroute2", "python3-rich", "python3-prometheus-client", "python3"):
        assert dep in depends, depends
    assert "matplotlib" not in depends and "matplotlib" in field(path, "Suggests")
    assert "kbp-dkms" in field(path, "Recommends")


def test_units_and_maintainer_scripts(built: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = built
    for name in ("kbpctl", "kbp-dkms"):
        subprocess.run(["dpkg-deb", "-x", str(deb(out, name)), str(tmp_path / "root")],
                       check=True)
        subprocess.run(["dpkg-deb", "-e", str(deb(out, name)), str(tmp_path / name)],
                       check=True)
        for script in ("preinst", "postinst", "prerm", "postrm"):
            f = tmp_path / name / script
            if f.exists():
                p = subprocess.run(["sh", "-n", str(f)], capture_output=True, text=True)
                assert p.returncode == 0, f"{name} {script}: {p.stderr}"
    unitdir = tmp_path / "root" / "lib" / "systemd" / "system"
    for unit in ("kbp.service", "kbp-watch.service", "kbp-device@.service"):
        assert (unitdir / unit).read_text() == (DATA / unit).read_text().replace(
            "/usr/local/bin/kbpctl", "/usr/bin/kbpctl")
    assert "/usr/local" not in (unitdir / "kbp.service").read_text()
    # the removal guard and the headers hint are there
    assert "kbpctl disable --all" in (tmp_path / "kbp-dkms" / "prerm").read_text()
    assert "linux-headers-$kver" in (tmp_path / "kbp-dkms" / "postinst").read_text()
    assert "kbpctl disable --all" in (tmp_path / "kbpctl" / "prerm").read_text()
    assert (tmp_path / "kbpctl" / "conffiles").read_text().split() == [
        "/etc/kbp/kbp.toml.example"]
    man = subprocess.run(["man", "-l", str(tmp_path / "root/usr/share/man/man1/kbpctl.1.gz")],
                         capture_output=True, text=True, env={**os.environ, "MANWIDTH": "100"})
    if man.returncode == 0:
        for text in ("kbpctl apply", "kbpctl exporter", "/etc/kbp/kbp.toml"):
            assert text in man.stdout


def test_lintian_is_clean(built: tuple[Path, str]) -> None:
    _, log = built
    if "lintian is not installed" in log:
        pytest.skip(reason="lintian is not installed (scripts/setup.sh installs it)")
    assert "deb: lintian: no errors" in log, log[-3000:]
    tags = [ln for ln in log.splitlines() if ln[:3] in ("E: ", "W: ", "I: ", "P: ", "X: ")]
    assert tags == [], "lintian tags without an override (docs/packaging.md):\n" + \
        "\n".join(tags)
