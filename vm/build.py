"""``build``: compile an out-of-tree module against a flavour's cached headers.

Each (kernel, module directory) pair gets its own copy of the sources under
``<cache>/kernels/<kver>/build/``, so builds for different kernels never share objects and
the module directory itself stays free of build products.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from vm import chroot, fetch, flavours, paths
from vm.paths import KernelTree
from vm.util import RigError, Stopwatch, file_lock, note, run

MANIFEST = ".kbp-vm-sources"
#: Never copied into the build copy: kbuild products and editor/VCS clutter.
EXCLUDE = (MANIFEST, "*.o", "*.ko", "*.ko.*", "*.mod", "*.mod.c", ".*.cmd", "*.a", "*.dwo",
           "modules.order", "Module.symvers", ".tmp_versions", ".git", "__pycache__",
           ".*.swp", "*~", ".cache.mk")
MAIN_MODULE = "kbp.ko"


@dataclass(frozen=True)
class Built:
    kver: str
    module_dir: Path
    build_dir: Path
    kos: tuple[Path, ...]

    @property
    def main(self) -> Path:
        """kbp.ko if it was built, else the first module in modules.order."""
        for ko in self.kos:
            if ko.name == MAIN_MODULE:
                return ko
        return self.kos[0]


def default_module_dir() -> Path:
    """``module/`` once it has a Kbuild or Makefile, else the rig's hello module."""
    d = paths.DEFAULT_MODULE
    if (d / "Kbuild").exists() or (d / "Makefile").exists():
        return d
    note(f"{d} has no Kbuild or Makefile yet: using the rig's test module "
         f"{paths.HELLO_MODULE} (pass --module-dir to choose)")
    return paths.HELLO_MODULE


def _excluded(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in EXCLUDE)


def source_files(src: Path) -> list[str]:
    """Relative paths of the files under ``src`` that belong in the build copy."""
    out = []
    for dirpath, dirnames, filenames in os.walk(src, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not _excluded(d))
        rel = Path(dirpath).relative_to(src)
        out += [str(rel / f) for f in sorted(filenames) if not _excluded(f)]
    return out


def sync_tree(src: Path, dst: Path) -> None:
    """Make ``dst`` hold the same source files as ``src`` (build products untouched).

    Files are copied with their mtimes, only when size or mtime differ, so make stays
    incremental; files removed from ``src`` since the last sync are removed from ``dst``.
    """
    dst.mkdir(parents=True, exist_ok=True)
    files = source_files(src)
    manifest = dst / MANIFEST
    previous = set(manifest.read_text().splitlines()) if manifest.exists() else set()
    for rel in sorted(previous - set(files)):
        (dst / rel).unlink(missing_ok=True)
    for rel in files:
        s, d = src / rel, dst / rel
        st = s.stat()
        try:
            dt = d.stat()
            if dt.st_size == st.st_size and dt.st_mtime_ns == st.st_mtime_ns:
                continue
        except FileNotFoundError:
            d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d)
    manifest.write_text("".join(f"{f}\n" for f in files))


def modules_from_order(build_dir: Path, order_text: str) -> tuple[Path, ...]:
    """The .ko files named by a modules.order (``x.o`` in 6.x, ``kernel/x.ko`` before)."""
    kos = []
    for line in order_text.splitlines():
        line = line.strip()
        if not line:
            continue
        rel = line.removeprefix("kernel/")
        rel = rel[:-2] + ".ko" if rel.endswith(".o") else rel
        kos.append(build_dir / rel)
    return tuple(kos)


def _collect(tree: KernelTree, module_dir: Path, build_dir: Path) -> Built | None:
    order = build_dir / "modules.order"
    if not order.exists():
        return None
    kos = modules_from_order(build_dir, order.read_text())
    if not kos or not all(k.exists() for k in kos):
        return None
    return Built(tree.kver, module_dir, build_dir, kos)


def existing(tree: KernelTree, module_dir: Path) -> Built | None:
    """The result of an earlier build of ``module_dir`` against ``tree``, if any."""
    return _collect(tree, module_dir.resolve(), tree.build_dir(module_dir))


def build(flavour: str, module_dir: Path, *, jobs: int = 0) -> Built:
    """Build ``module_dir`` against the cached headers of ``flavour``."""
    module_dir = module_dir.resolve()
    if not module_dir.is_dir():
        raise RigError(f"module directory {module_dir} does not exist")
    if not ((module_dir / "Kbuild").exists() or (module_dir / "Makefile").exists()):
        raise RigError(f"{module_dir} has neither a Kbuild nor a Makefile")
    tree = fetch.ensure(flavour)
    build_dir = tree.build_dir(module_dir)
    if any(c.isspace() for c in str(build_dir)):
        raise RigError(f"kbuild cannot handle whitespace in paths: {build_dir} "
                       "(set KBP_VM_CACHE to a path without spaces)")
    clock = Stopwatch()
    with file_lock(build_dir.with_name(build_dir.name + ".lock"), "build"):
        sync_tree(module_dir, build_dir)
        (build_dir / "modules.order").unlink(missing_ok=True)
        # -Werror: a warning from a new compiler or kernel fails the flavour, as it fails
        # DKMS on an operator's machine where the distribution builds with -Werror.
        argv = ["make", "-C", str(tree.headers), f"M={build_dir}",
                f"-j{jobs or os.cpu_count() or 1}", "KCFLAGS=-Werror", "modules"]
        what = f"module build for {tree.kver}"
        release = flavours.get(flavour).release
        if release.is_host:
            note(f"{flavour}: building {module_dir} against {tree.kver} in {build_dir}")
            run(argv, what=what, quiet=False)
        else:
            note(f"{flavour}: building {module_dir} against {tree.kver} in {build_dir}, "
                 f"in the {release.name} build chroot")
            chroot.make(release, fetch.build_tools(tree), argv, what=what)
    built = _collect(tree, module_dir, build_dir)
    if built is None:
        raise RigError(f"make succeeded but {build_dir}/modules.order names no built .ko")
    note(f"{flavour}: built {' '.join(k.name for k in built.kos)} in {clock():.1f} s")
    return built


def test_module_dirs() -> list[Path]:
    """The test-only modules: every directory under vm/testdata with a Kbuild/Makefile."""
    return sorted(d for d in paths.TESTDATA.iterdir()
                  if (d / "Kbuild").exists() or (d / "Makefile").exists())


def build_test_modules(flavour: str) -> Path:
    """Build every vm/testdata module for ``flavour``; gather the .ko files in one
    directory (exported to the guest as KBP_TEST_MODULES) and return it."""
    tree = fetch.ensure(flavour)
    kos = [ko for d in test_module_dirs() for ko in build(flavour, d).kos]
    dest = tree.test_modules
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for ko in kos:
        if (dest / ko.name).exists():
            raise RigError(f"two test modules are called {ko.name}")
        shutil.copy2(ko, dest / ko.name)
    return dest


def existing_test_modules(flavour: str) -> Path | None:
    """The directory of a previous build_test_modules() for ``flavour``, if any."""
    d = fetch.ensure(flavour).test_modules
    return d if d.is_dir() else None
