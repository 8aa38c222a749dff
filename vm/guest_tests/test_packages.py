"""The Debian packages (make deb) in the guest: install, DKMS build, serve, refuse, purge.

The guest's userland is this machine's Debian 12 (the host's / over 9p, a RAM overlay on
top: vm/README.md), so dpkg, DKMS and the kbpctl package's Depends are the host's, and
whatever the packages do vanishes with the guest. Without an apt mirror in the guest the
packages go in with ``dpkg -i`` (scripts/setup.sh installs their Depends on the host), and
the kernel headers go in as an operator's ``apt install linux-headers-$(uname -r)`` would
put them, from the rig's cache: /usr/src/linux-headers-<kver> (and -common), then the hook
that package's postinst runs (/etc/kernel/header_postinst.d/dkms).

The story, in the order an operator meets it: kbp-dkms and kbpctl installed before the
headers (DKMS skips the build, the postinst names the headers package); the headers
installed (DKMS builds kbp.ko for the running kernel); ``modprobe kbp`` and the packaged
``kbpctl enable``; the packages installed again over themselves (an upgrade's maintainer
script paths) with the device still served; ``dpkg --purge`` refused while it is, saying why;
``kbpctl disable --all``; the tuned profile's script applying /etc/kbp/kbp.toml and taking
kbp off again, and kbp-generator ordering kbp.service after the device it names; the purge
(kbp.ko unloaded), and no file left behind (``dpkg -L`` and a before/after listing).

DKMS's compile of kbp.ko alone takes about 6 minutes under TCG, so `make test` runs the
story without it (the rig's own build of kbp.ko loaded instead, the tuned script and the
generator left to the host tests: ~100 s) and the whole story is ``long`` (`make
test-vm-all`). Kernels whose modules the rig builds in a chroot (Debian 13's and 7.x:
another gcc and glibc than the guest's userland) cannot run DKMS here: the long test skips
on them, saying so; the short one runs everywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import POLL_CPU, Topo, detach_all, kbp_threads, module_loaded, wait_for

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "out" / "deb"
KVER = os.uname().release
# Debian's tools at their paths, not the venv's kbpctl (first in the rig's PATH)
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root",
       "DEBIAN_FRONTEND": "noninteractive"}
DEPENDS = ("dkms", "python3-pyroute2", "python3-rich", "python3-prometheus-client")
PACKAGES = ("kbpctl", "kbp-dkms")
# side effects that are not the packages' files: dpkg's and apt's own state and logs, what
# DKMS keeps for every module it builds (its tree's top directory, the module signing key it
# makes on its first build), and /run: kbpctl's runtime state under /run/kbp is shared with
# every kbpctl on the machine (the rig's own, which earlier tests of the suite ran) and is
# not the package's to remove (the postrm says why; no journal may be left: checked below)
IGNORED = re.compile(r"^(/var/lib/dpkg/|/var/log/|/var/cache/|/var/lib/dkms/?$|"
                     r"/var/lib/dkms/mok\.(key|pub)$|/run/)")

pytestmark = pytest.mark.timeout(1200)


def run(*argv: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=ENV)
    if check:
        assert p.returncode == 0, f"{' '.join(argv)}: {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def debs() -> list[Path]:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    found = [sorted(OUT.glob(f"{name}_{version}-*_all.deb")) for name in ("kbp-dkms", "kbpctl")]
    if not all(found):
        pytest.skip(reason=f"no kbp-dkms/kbpctl {version} packages in {OUT}: run make deb "
                    "(make test-vm does)")
    return [f[-1] for f in found]


def installed(pkg: str) -> bool:
    p = run("dpkg-query", "-W", "-f", "${db:Status-Status}", pkg, check=False)
    return p.stdout.strip() == "installed"


def headers() -> tuple[Path, Path]:
    """The rig's extracted headers of the running kernel and its -common directory."""
    ko = os.environ.get("KBP_KO")
    if not ko:
        pytest.skip(reason="the rig built no kbp.ko, so its kernel tree is unknown")
    root = Path(ko).parents[2] / "root"
    flavour = root / "usr" / "src" / f"linux-headers-{KVER}"
    common = root / "usr" / "src" / Path(os.readlink(f"/lib/modules/{KVER}/source")).name
    assert (flavour / "Makefile").exists() and common.is_dir(), (flavour, common)
    return flavour, common


def same_compiler(flavour_headers: Path) -> str | None:
    """None if the guest's gcc is the one the kernel was built with, else why not."""
    conf = (flavour_headers / "include" / "config" / "auto.conf").read_text()
    m = re.search(r'^CONFIG_CC_VERSION_TEXT="?(.*?)"?$', conf, re.M)
    kernel_gcc = m.group(1) if m else "?"
    gcc = run("gcc", "-dumpfullversion", check=False).stdout.strip()
    if gcc and kernel_gcc.endswith(f" {gcc}"):
        return None
    return (f"{KVER} was built with {kernel_gcc!r}, the guest's userland (this host's Debian "
            f"12) has gcc {gcc or 'none'}: the rig builds this kernel's modules in a chroot of "
            "its release, DKMS in the guest cannot (vm/README.md)")


def find(roots: list[str], *opts: str) -> set[str]:
    p = run("find", *[r for r in roots if os.path.lexists(r)], "-xdev", *opts, check=False)
    return {ln for ln in p.stdout.splitlines() if not IGNORED.match(ln)}


#: listed whole: where the packages' scripts, dpkg's conffiles, deb-systemd-helper and DKMS
#: write (a few thousand entries: a whole /usr over 9p under TCG takes minutes)
DEEP = ["/etc", "/run", "/usr/src", "/lib/systemd", "/usr/lib/tuned", "/var/lib/systemd",
        "/var/lib/dkms", f"/lib/modules/{KVER}/updates"]


def scan_roots(packages: list[Path]) -> list[str]:
    """Every directory above a file of the packages, plus /var/lib and the kernel's
    modules directory: listed one level deep (a leftover inside one of the packages' own
    directories keeps that directory, which its parent's listing shows)."""
    roots = {"/var/lib", f"/lib/modules/{KVER}"}
    for deb in packages:
        for line in run("dpkg-deb", "-c", str(deb)).stdout.splitlines():
            path = Path(line.split(None, 5)[5].lstrip(".").split(" -> ")[0])
            roots.update(str(d) for d in path.parents)
    return sorted(roots)


def listing(shallow: list[str]) -> set[str]:
    return find(DEEP) | find(shallow, "-maxdepth", "1")


def dev_links() -> None:
    """/dev/fd and /dev/std*: udev makes them on a real system, the rig's /init does not
    (devtmpfs alone); DKMS's `<(...)` needs /dev/fd."""
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        if not os.path.lexists(f"/dev/{name}"):
            os.symlink(target, f"/dev/{name}")


@contextlib.contextmanager
def headers_installed(flavour: Path, common: Path) -> Iterator[None]:
    links = [Path("/usr/src") / flavour.name, Path("/usr/src") / common.name]
    for link, target in zip(links, (flavour, common), strict=True):
        link.symlink_to(target)
    try:
        yield
    finally:
        for link in links:
            link.unlink(missing_ok=True)


def served_by_kmod(nic: str) -> bool:
    """The module serves ``nic`` (asked over genl from this process: a kbpctl status call
    costs seconds under TCG)."""
    from kbp import kmod
    return kmod.device(nic) is not None


@pytest.mark.long
def test_packages_serve_refuse_and_purge_cleanly(topo: Topo) -> None:
    """Everything but DKMS's compile (~100-115 s under TCG; `make test-vm-all`: make test's
    budget, vm/README.md). kbp.ko is the rig's build of the same source, loaded by hand, as
    an operator's `modprobe kbp` would."""
    story(topo, dkms_build=False)


@pytest.mark.long
def test_packages_dkms_build_and_the_boot_pieces(topo: Topo) -> None:
    """The whole story (~11 min under TCG, ~6 of them DKMS building kbp.ko): the headers
    arrive and DKMS builds kbp.ko for the running kernel, modprobe loads it; the tuned
    profile's script and kbp-generator as installed."""
    story(topo, dkms_build=True)


def story(topo: Topo, dkms_build: bool) -> None:
    t0 = time.monotonic()
    steps: list[str] = []

    def step(what: str) -> None:
        steps.append(f"{time.monotonic() - t0:6.1f} s  {what}")

    packages = debs()
    missing = [p for p in DEPENDS if not installed(p)]
    if missing:
        pytest.skip(reason=f"not installed on the host (the guest's userland): {' '.join(missing)}"
                    " (scripts/setup.sh installs them)")
    if any(installed(p) for p in PACKAGES):
        pytest.skip(reason="kbp's packages are installed on the host already")
    flavour, common = headers()
    if dkms_build and (why := same_compiler(flavour)):
        pytest.skip(reason=why)
    assert not Path(f"/lib/modules/{KVER}/build").exists(), "headers already present"
    rig_module = module_loaded()
    if rig_module:  # the suite's kbp.ko (insmod'ed by other tests): out of the way
        detach_all()
        run("rmmod", "kbp")
    dev_links()
    # man-db's trigger re-indexes every manual page (minutes under TCG); Debian's switch
    # for it is this file (the overlay forgets its removal)
    Path("/var/lib/man-db/auto-update").unlink(missing_ok=True)
    nic = topo.nic0
    cfg = Path("/etc/kbp/kbp.toml")
    roots = scan_roots(packages)
    before = listing(roots)
    step(f"listed {len(before)} paths")
    try:
        # 1. both packages before the headers: DKMS skips the build and says what to install
        p = run("dpkg", "-i", *map(str, packages))
        out = p.stdout + p.stderr
        step("dpkg -i without headers")
        assert "kernel headers for this kernel do not seem to be installed" in out, out
        assert f"apt install linux-headers-{KVER}" in out, out
        assert not list(Path(f"/lib/modules/{KVER}").glob("updates/dkms/kbp.ko*"))
        files = [f for f in run("dpkg", "-L", *PACKAGES).stdout.splitlines()
                 if f.startswith("/") and not os.path.isdir(f)]
        assert "/usr/bin/kbpctl" in files and "/lib/systemd/system/kbp.service" in files

        with contextlib.ExitStack() as stack:
            if dkms_build:
                # 2. the headers arrive: their package's hook has DKMS build kbp.ko
                stack.enter_context(headers_installed(flavour, common))
                p = run("/etc/kernel/header_postinst.d/dkms", KVER)
                step("DKMS build through the headers' hook")
                ko = run("modinfo", "-k", KVER, "-F", "filename", "kbp").stdout.strip()
                # compressed like the kernel's own modules (Debian: .ko.xz)
                assert re.fullmatch(rf"/lib/modules/{re.escape(KVER)}/updates/dkms/kbp\.ko"
                                    r"(\.xz|\.zst|\.gz)?", ko), ko + p.stdout + p.stderr
                run("modprobe", "kbp")
            else:
                run("insmod", os.environ["KBP_KO"])
            assert module_loaded()

            # 3. the packaged kbpctl (Debian's pyroute2) serves a device through the module
            run("kbpctl", "enable", nic, "--backend", "kmod", "--mode", "hybrid",
                "--cpus", str(POLL_CPU))
            assert served_by_kmod(nic)
            step("kbp.ko loaded, kbpctl enable")

            # 4. an upgrade (the same packages again: prerm upgrade, postinst configure with
            #    the old version) keeps the device served by the loaded module
            p = run("dpkg", "-i", *map(str, packages))
            step("dpkg -i again (upgrade) while serving")
            assert module_loaded() and served_by_kmod(nic), p.stdout + p.stderr
            assert "not removed" not in p.stdout + p.stderr

            # 5. removal refuses while the module serves the device, saying why
            p = run("dpkg", "--purge", *PACKAGES, check=False)
            out = p.stdout + p.stderr
            step("dpkg --purge refused")
            assert p.returncode != 0, out
            assert "not removed" in out and nic in out and "kbpctl disable --all" in out, out
            assert all(installed(pkg) for pkg in PACKAGES), out
            assert module_loaded() and kbp_threads() and served_by_kmod(nic)

            # 6. kbp off (and in the long test the tuned profile's script applying kbp.toml
            #    and taking kbp off again, and the installed generator)
            run("kbpctl", "disable", "--all")
            if dkms_build:
                cfg.write_text(f'backend = "kmod"\n[defaults]\nmode = "hybrid"\n'
                               f'cpus = "{POLL_CPU}"\n[[device]]\nname = "{nic}"\n')
                script = "/usr/lib/tuned/kbp-latency/kbp.sh"
                run(script, "start")
                assert served_by_kmod(nic)
                run(script, "stop")
                gen = Path("/run/kbp-test-generator")
                run("/lib/systemd/system-generators/kbp-generator", str(gen))
                dropin = (gen / "kbp.service.d" / "50-kbp-devices.conf").read_text()
                assert f"After=sys-subsystem-net-devices-{nic}.device" in dropin
                assert (gen / f"sys-subsystem-net-devices-{nic}.device.wants" /
                        f"kbp-device@{nic}.service").is_symlink()
                run("rm", "-rf", str(gen), str(cfg))
            wait_for(lambda: not kbp_threads(), 10, what="pollers to stop")
            journals = sorted(str(j) for j in Path("/run/kbp").rglob("*.jsonl"))
            assert not journals, f"journals left after disable --all: {journals}"
            step("kbpctl disable" + (", tuned script start/stop, generator" if dkms_build
                                     else ""))

            # 7. nothing served: the purge goes through and unloads the module
            p = run("dpkg", "--purge", *PACKAGES)
            step("dpkg --purge")
            assert "unloaded kbp.ko" in p.stdout + p.stderr, p.stdout + p.stderr
            assert not module_loaded()
        assert not any(installed(pkg) for pkg in PACKAGES)
        left = [f for f in files if os.path.lexists(f)]
        assert not left, f"files of the packages left after the purge: {left}"
        after = listing(roots)
        step("listed again")
        assert not sorted(after - before), f"left behind: {sorted(after - before)}"
        assert not sorted(before - after), f"removed: {sorted(before - after)}"
    finally:
        print("\n".join(steps))
        cfg.unlink(missing_ok=True)
        if any(installed(pkg) for pkg in PACKAGES):
            run("kbpctl", "disable", "--all", check=False)
            run("dpkg", "--purge", *PACKAGES, check=False)
        if rig_module and not module_loaded():
            run("insmod", os.environ["KBP_KO"])
