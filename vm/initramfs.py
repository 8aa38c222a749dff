"""The guest's initramfs: static busybox, the modules needed before the 9p root is
mounted, and ``/init`` (``vm/guest_init.sh``).

The base archive depends only on the kernel and is cached next to it.  Each run appends a
tiny second archive holding ``/kbp/run.sh`` (settings and the command; see ``vm.run``).
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import shutil
from pathlib import Path

from vm.cpio import Archive
from vm.paths import VM_DIR, KernelTree
from vm.util import RigError, note

#: Modules /init needs before it can mount the host root; their dependencies are added
#: from modules.dep.  Built-in ones (e.g. virtio_pci on 6.12) are skipped.
EARLY_MODULES = ("virtio_pci", "virtio_net", "9pnet_virtio", "9p", "overlay")

INIT_SCRIPT = VM_DIR / "guest_init.sh"
BUSYBOX_CANDIDATES = (Path("/bin/busybox"), Path("/usr/bin/busybox"))


def _modname(path: str) -> str:
    """``kernel/fs/9p/9p.ko.xz`` -> ``9p`` (dashes normalised to underscores)."""
    base = path.rsplit("/", 1)[-1]
    base = base.split(".ko", 1)[0]
    return base.replace("-", "_")


def parse_modules_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """modules.dep -> {module name: (path, [dependency paths])}."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        path, sep, rest = line.partition(":")
        if sep:
            deps[_modname(path)] = (path, rest.split())
    return deps


def builtin_names(text: str) -> set[str]:
    """modules.builtin -> the set of built-in module names."""
    return {_modname(line.strip()) for line in text.splitlines() if line.strip()}


def load_order(wanted: tuple[str, ...] | list[str], deps: dict[str, tuple[str, list[str]]],
               builtin: set[str]) -> list[str]:
    """Module paths to insmod, dependencies first, each once.

    Raises KeyError naming a module that is neither a module nor built in.
    """
    order: list[str] = []
    by_path = {path: name for name, (path, _) in deps.items()}

    def visit(name: str) -> None:
        path, needs = deps[name]
        if path in order:
            return
        for dep in needs:
            visit(by_path.get(dep, _modname(dep)))
        order.append(path)

    for name in wanted:
        name = name.replace("-", "_")
        if name in deps:
            visit(name)
        elif name not in builtin:
            raise KeyError(name)
    return order


def _decompress(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".ko":
        return data
    raise RigError(f"{path}: unsupported module compression (only .ko, .ko.xz, .ko.gz)")


def find_busybox() -> Path:
    for cand in BUSYBOX_CANDIDATES:
        if cand.exists():
            if not is_static_elf(cand.read_bytes()):
                raise RigError(f"{cand} is dynamically linked; the initramfs needs "
                               "busybox-static (apt-get install busybox-static)")
            return cand
    raise RigError("busybox not found; apt-get install busybox-static (python3 -m vm setup)")


def is_static_elf(blob: bytes) -> bool:
    """True for a 64-bit little-endian ELF without a PT_INTERP (dynamic loader) header."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        return False
    phoff = int.from_bytes(blob[0x20:0x28], "little")
    phentsize = int.from_bytes(blob[0x36:0x38], "little")
    phnum = int.from_bytes(blob[0x38:0x3A], "little")
    for i in range(phnum):
        off = phoff + i * phentsize
        if int.from_bytes(blob[off:off + 4], "little") == 3:  # PT_INTERP
            return False
    return True


def _build(tree: KernelTree, busybox: Path) -> tuple[bytes, list[str]]:
    deps = parse_modules_dep((tree.modules / "modules.dep").read_text())
    builtin_file = tree.modules / "modules.builtin"
    builtin = builtin_names(builtin_file.read_text()) if builtin_file.exists() else set()
    try:
        order = load_order(EARLY_MODULES, deps, builtin)
    except KeyError as exc:
        raise RigError(f"kernel {tree.kver} has no module or built-in driver {exc}; the "
                       "guest needs virtio-pci, virtio-net, 9p over virtio and overlayfs"
                       ) from None

    arc = Archive()
    for d in ("bin", "dev", "etc", "etc/kbp", "lib", "lib/modules", "mnt", "mnt/lower",
              "mnt/rw", "newroot", "proc", "sys", "tmp", "kbp"):
        arc.dir(d)
    arc.chardev("dev/console", 5, 1)
    arc.chardev("dev/null", 1, 3, perm=0o666)
    arc.file("bin/busybox", busybox.read_bytes(), perm=0o755)
    arc.symlink("bin/sh", "busybox")
    arc.file("init", INIT_SCRIPT.read_bytes(), perm=0o755)
    names = []
    for rel in order:
        name = _modname(rel) + ".ko"
        arc.file(f"lib/modules/{name}", _decompress(tree.modules / rel))
        names.append(name)
    arc.file("etc/kbp/modules", "".join(f"{n}\n" for n in names).encode())
    return arc.bytes(), names


def base(tree: KernelTree) -> Path:
    """The cached base initramfs of ``tree``, rebuilt when /init or busybox changed."""
    busybox = find_busybox()
    key = hashlib.sha256()
    for part in (INIT_SCRIPT.read_bytes(), busybox.read_bytes(), " ".join(EARLY_MODULES).encode(),
                 Path(__file__).read_bytes()):
        key.update(hashlib.sha256(part).digest())
    keyfile = tree.initramfs.with_suffix(".key")
    if tree.initramfs.exists() and keyfile.exists() and keyfile.read_text() == key.hexdigest():
        return tree.initramfs
    blob, names = _build(tree, busybox)
    tmp = tree.initramfs.with_suffix(".tmp")
    tmp.write_bytes(blob)
    tmp.replace(tree.initramfs)
    keyfile.write_text(key.hexdigest())
    note(f"initramfs for {tree.kver}: {len(blob) // 1024} KiB, early modules: "
         + " ".join(n.removesuffix(".ko") for n in names))
    return tree.initramfs


def with_run_config(base_cpio: Path, run_sh: str, dest: Path) -> Path:
    """Write ``base_cpio`` followed by an archive holding ``/kbp/run.sh`` to ``dest``."""
    arc = Archive()
    arc.file("kbp/run.sh", run_sh.encode(), perm=0o644)
    with dest.open("wb") as out, base_cpio.open("rb") as src:
        shutil.copyfileobj(src, out)
        out.write(arc.bytes())
    return dest
