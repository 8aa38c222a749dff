"""Where things live: the repository, the cache and the per-kernel tree inside it.

Cache layout (default ``<repo>/.cache/vm``, or ``$KBP_VM_CACHE``)::

    flavours/<flavour>.json        which kernel ``fetch`` last resolved for a flavour
    kernels/<kver>/root/           the extracted .debs: boot/, lib/modules/<kver>/, usr/src/,
                                   usr/lib/linux-kbuild-*/ (layout kept so symlinks resolve)
    kernels/<kver>/fetched.json    stamp written last: the tree is complete
    kernels/<kver>/initramfs.cpio  the base initramfs (busybox, early modules, /init)
    kernels/<kver>/build/<tag>/    one private copy of a module's sources per module dir
    kernels/<kver>/test-modules/   the .ko files of every vm/testdata/* module (KBP_TEST_MODULES)
    logs/                          console logs written by ``test``
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VM_DIR = REPO_ROOT / "vm"
TESTDATA = VM_DIR / "testdata"
HELLO_MODULE = TESTDATA / "hello"
DEFAULT_MODULE = REPO_ROOT / "module"
GUEST_TESTS = VM_DIR / "guest_tests"


def cache_root() -> Path:
    env = os.environ.get("KBP_VM_CACHE")
    return Path(env).resolve() if env else REPO_ROOT / ".cache" / "vm"


@dataclass(frozen=True)
class KernelTree:
    """The extracted files of one kernel release (``kver``) in the cache."""

    kver: str
    dir: Path

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def stamp(self) -> Path:
        return self.dir / "fetched.json"

    def _boot_file(self, name: str) -> Path:
        """``/boot/<name>-<kver>`` (Debian 12, 13), else ``/usr/lib/modules/<kver>/<name>``
        (Debian from 7.x ships the image and config inside the modules directory)."""
        boot = self.root / "boot" / f"{name}-{self.kver}"
        inside = self.modules / name
        return inside if not boot.exists() and inside.exists() else boot

    @property
    def vmlinuz(self) -> Path:
        return self._boot_file("vmlinuz")

    @property
    def config(self) -> Path:
        return self._boot_file("config")

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.kver

    @property
    def headers(self) -> Path:
        return self.root / "usr" / "src" / f"linux-headers-{self.kver}"

    @property
    def initramfs(self) -> Path:
        return self.dir / "initramfs.cpio"

    @property
    def test_modules(self) -> Path:
        return self.dir / "test-modules"

    def build_dir(self, module_dir: Path) -> Path:
        """A private build directory for ``module_dir`` against this kernel."""
        src = module_dir.resolve()
        tag = hashlib.sha256(os.fsencode(src)).hexdigest()[:8]
        return self.dir / "build" / f"{src.name}-{tag}"


def kernel_tree(kver: str) -> KernelTree:
    return KernelTree(kver, cache_root() / "kernels" / kver)


def flavour_pointer(flavour: str) -> Path:
    return cache_root() / "flavours" / f"{flavour}.json"
