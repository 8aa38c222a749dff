"""``fetch``: resolve a flavour to the newest Debian kernel and extract it into the cache.

Nothing is installed on the host: ``apt-get download`` + ``dpkg-deb -x`` into
``<cache>/kernels/<kver>/root``.  The tree keeps the Debian layout (usr/src, usr/lib) so
the relative ``scripts``/``tools`` symlinks of the headers resolve.  A stamp file written
last marks a complete tree, which makes a second fetch of the same release instant.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from vm import apt, flavours, paths
from vm.paths import KernelTree
from vm.util import RigError, Stopwatch, file_lock, note, run


@dataclass(frozen=True)
class Resolved:
    flavour: str
    kver: str
    version: str
    specs: tuple[str, ...]
    #: Packages a build chroot needs for these headers (compiler, pahole, kbuild's
    #: libraries); only used for flavours of another release than the host's.
    tools: tuple[str, ...] = ()


def _resolve_once(flavour: flavours.Flavour) -> Resolved | None:
    rel = flavour.release
    if not apt.has_lists(rel):
        return None
    kver = flavours.newest_kver(flavour,
                                flavours.parse_search(apt.search(flavours.IMAGE_SEARCH, rel)))
    if kver is None:
        return None
    image_pkg, headers_pkg = flavour.image_package(kver), flavours.headers_package(kver)
    found = {f.get("Package"): f for f in
             flavours.parse_stanzas(apt.show([image_pkg, headers_pkg], rel))}
    img, hdr = found.get(image_pkg), found.get(headers_pkg)
    if img is None or hdr is None:
        return None
    deps = flavours.header_deps(hdr.get("Depends", ""))
    parts = flavours.image_parts(img.get("Depends", ""), kver)
    specs = (f"{img['Package']}={img['Version']}", *(p.apt_spec() for p in parts),
             f"{hdr['Package']}={hdr['Version']}", deps.common.apt_spec(),
             deps.kbuild.apt_spec())
    tools: tuple[str, ...] = ()
    if not rel.is_host:
        kbuild = next((f for f in flavours.parse_stanzas(apt.show([deps.kbuild.name], rel))
                       if f.get("Package") == deps.kbuild.name), {})
        tools = tuple(flavours.build_tools(hdr.get("Depends", ""), kbuild.get("Depends", "")))
    return Resolved(flavour.name, kver, img["Version"], specs, tools)


def resolve(name: str, *, may_update: bool = True) -> Resolved:
    """The newest kernel of flavour ``name`` that apt knows; refreshes the lists once."""
    flavour = flavours.get(name)
    found = _resolve_once(flavour)
    if found is None and may_update:
        note(f"no kernel for flavour {name} in the {flavour.release.name} apt lists; "
             "refreshing them")
        apt.update(flavour.release)
        found = _resolve_once(flavour)
    if found is None:
        where = ("check /etc/apt/sources.list has bookworm and bookworm-security main"
                 if flavour.release.is_host else
                 f"the rig's {flavour.release.name} lists ({apt.state_dir(flavour.release)}) "
                 f"come from: {'; '.join(flavour.release.sources)}")
        raise RigError(
            f"no linux-image for flavour {name} on the mirror (no package matches "
            f"{flavour.image_re.pattern}, or its linux-headers package is missing); {where}")
    return found


def _read_json(path: Path) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def _fix_headers_makefile(tree: KernelTree) -> None:
    """Make the flavour headers' Makefile work where the cache puts it.

    Debian ships ``include /usr/src/linux-headers-<x>-common/Makefile``; we rewrite the
    absolute path relative to the Makefile itself, so the cache can live (and move)
    anywhere without anything in /usr/src.  From 7.x the Makefile also sets
    ``KBUILD_OUTPUT=/usr/src/linux-headers-<kver>``, which kbuild checks exists: it becomes
    the Makefile's own directory, computed when the line is read.
    """
    makefile = tree.headers / "Makefile"
    text = makefile.read_text()
    new, n = re.subn(r"^include /usr/src/(linux-headers-[^/\s]+)/Makefile$",
                     r"include $(dir $(lastword $(MAKEFILE_LIST)))../\1/Makefile",
                     text, flags=re.MULTILINE)
    if n != 1:
        raise RigError(f"{makefile}: expected one `include /usr/src/...-common/Makefile` "
                       f"line, found {n}; the Debian headers layout changed:\n{text}")
    new = re.sub(r"^KBUILD_OUTPUT\s*:?=\s*/usr/src/linux-headers-[^/\s]+/?$",
                 "KBUILD_OUTPUT := $(patsubst %/,%,$(dir $(abspath "
                 "$(lastword $(MAKEFILE_LIST)))))", new, flags=re.MULTILINE)
    makefile.write_text(new)


def _depmod(tree: KernelTree) -> None:
    depmod = shutil.which("depmod") or next(
        (p for p in ("/usr/sbin/depmod", "/sbin/depmod") if Path(p).exists()), None)
    if depmod is None:
        raise RigError("depmod not found; install kmod (python3 -m vm setup)")
    run([depmod, "-b", tree.root, tree.kver], what=f"depmod for {tree.kver}")


def _check_tree(tree: KernelTree) -> None:
    for path in (tree.vmlinuz, tree.config, tree.modules / "modules.dep",
                 tree.headers / "Makefile", tree.headers / "scripts" / "Makefile.build"):
        if not path.exists():
            raise RigError(f"extracted kernel tree is incomplete: {path} is missing")


def _download_and_extract(r: Resolved, tree: KernelTree) -> None:
    partial = tree.dir.with_name(tree.dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    debs = apt.download(list(r.specs), partial / "debs", flavours.get(r.flavour).release)
    root = partial / "root"
    for deb in debs:
        run(["dpkg-deb", "-x", deb, root], what=f"extracting {deb.name}")
    _merge_usr(root)
    shutil.rmtree(partial / "debs")
    shutil.rmtree(tree.dir, ignore_errors=True)
    partial.rename(tree.dir)


def _merge_usr(root: Path) -> None:
    """Debian 13 and later ship ``/usr/lib/modules`` (merged /usr); give the tree the
    ``lib -> usr/lib`` link an installed system has, so depmod -b, the initramfs and the
    guest's 9p root find the modules where Debian 12's layout puts them."""
    if (root / "usr" / "lib" / "modules").is_dir() and not (root / "lib").exists():
        (root / "lib").symlink_to("usr/lib")


def _prune(flavour: flavours.Flavour, keep: str) -> None:
    """Delete older kernels of the same flavour that no flavour pointer refers to."""
    kernels = paths.cache_root() / "kernels"
    if not kernels.is_dir():
        return
    pointed = {ptr.get("kver") for p in (paths.cache_root() / "flavours").glob("*.json")
               if (ptr := _read_json(p))}
    for kdir in kernels.iterdir():
        kver = kdir.name
        if (kdir.is_dir() and kver != keep and kver not in pointed
                and flavour.image_re.match(flavour.image_package(kver))):
            note(f"removing superseded kernel {kver} from the cache")
            shutil.rmtree(kdir, ignore_errors=True)


def fetch(name: str, *, force: bool = False) -> KernelTree:
    """Make sure the newest kernel of flavour ``name`` is extracted in the cache."""
    flavour = flavours.get(name)
    clock = Stopwatch()
    with file_lock(paths.cache_root() / ".fetch.lock", "fetch"):
        r = resolve(name)
        tree = paths.kernel_tree(r.kver)
        stamp = _read_json(tree.stamp)
        if not force and stamp and stamp.get("version") == r.version:
            note(f"{name}: {r.kver} ({r.version}) already in {tree.dir}")
        else:
            note(f"{name}: fetching {r.kver} ({r.version}): {' '.join(r.specs)}")
            try:
                _download_and_extract(r, tree)
            except RigError as exc:
                # A point release may have dropped off the mirror since the lists were
                # refreshed: refresh, resolve again (maybe to a newer kernel), retry once.
                note(f"download failed; refreshing the lists and retrying ({exc})")
                apt.update(flavour.release)
                r = resolve(name, may_update=False)
                tree = paths.kernel_tree(r.kver)
                _download_and_extract(r, tree)
            _fix_headers_makefile(tree)
            _depmod(tree)
            _check_tree(tree)
            fetched = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            _write_json(tree.stamp, {**asdict(r), "specs": " ".join(r.specs),
                                     "tools": " ".join(r.tools), "fetched": fetched})
            note(f"{name}: {r.kver} extracted to {tree.dir} in {clock():.1f} s")
        _write_json(paths.flavour_pointer(name), {"kver": r.kver, "version": r.version})
        _prune(flavour, keep=r.kver)
    return tree


def build_tools(tree: KernelTree) -> list[str]:
    """What the build chroot needs for ``tree``'s headers, as resolved when fetched."""
    stamp = _read_json(tree.stamp) or {}
    tools = str(stamp.get("tools", "")).split()
    if not tools:
        raise RigError(f"{tree.stamp} names no build tools; run `python3 -m vm fetch --force`")
    return tools


def ensure(name: str) -> KernelTree:
    """The kernel last fetched for flavour ``name`` (no apt query); fetch it if absent."""
    flavours.get(name)
    pointer = _read_json(paths.flavour_pointer(name))
    if pointer and "kver" in pointer:
        tree = paths.kernel_tree(pointer["kver"])
        if tree.stamp.exists():
            return tree
    note(f"{name}: not in the cache yet; fetching it")
    return fetch(name)
