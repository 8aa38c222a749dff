"""Kernel flavours and the pure parsing that maps a flavour to Debian packages.

A flavour names a *series* of Debian kernels, not one release: point releases drop off the
mirror, so ``fetch`` always resolves the newest package that the apt lists offer.  Nothing
here runs a command; ``vm.apt`` feeds it the text that apt-cache prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """Where a flavour's packages come from and what builds modules for it.

    ``HOST`` is the host's own apt configuration (Debian 12) and compiler.  Any other
    release has its own apt lists in the rig's cache (``sources`` lines, nothing added to
    the host's sources) and builds in a debootstrap chroot of that release, because its
    headers need its compiler (gcc-14, gcc-16) and its kbuild tools need its glibc.
    """

    name: str
    sources: tuple[str, ...] = ()
    #: debootstrap's script for the release (bookworm's debootstrap has none for forky;
    #: sid's works for it).
    debootstrap_script: str = ""

    @property
    def is_host(self) -> bool:
        return not self.sources


HOST = Release("bookworm")
TRIXIE = Release("trixie", ("deb http://deb.debian.org/debian trixie main",
                            "deb http://deb.debian.org/debian-security trixie-security main"),
                 "trixie")
FORKY = Release("forky", ("deb http://deb.debian.org/debian forky main",), "sid")
RELEASES: dict[str, Release] = {r.name: r for r in (HOST, TRIXIE, FORKY)}


@dataclass(frozen=True)
class Flavour:
    name: str
    summary: str
    #: Matches the full name of the image package; group ``kver`` is the kernel release
    #: (``uname -r``) and group ``order`` the number that grows with each new release.
    image_re: re.Pattern[str]
    release: Release = HOST
    #: The image package of a kernel release: Debian 12 and 13 ship an ``-unsigned`` one;
    #: from 7.x the image package is a metapackage of linux-binary/modules/base-<kver>.
    image_suffix: str = "-unsigned"

    def image_package(self, kver: str) -> str:
        return f"linux-image-{kver}{self.image_suffix}"


def _image_re(kver: str, suffix: str = "-unsigned") -> re.Pattern[str]:
    return re.compile(rf"^linux-image-(?P<kver>{kver}){re.escape(suffix)}$")


FLAVOURS: dict[str, Flavour] = {f.name: f for f in (
    Flavour("6.12-amd64", "Debian 12 security/updates kernel 6.12, generic amd64",
            _image_re(r"6\.12\.(?P<order>\d+)\+deb12-amd64")),
    Flavour("6.12-rt-amd64", "Debian 12 kernel 6.12 with PREEMPT_RT",
            _image_re(r"6\.12\.(?P<order>\d+)\+deb12-rt-amd64")),
    Flavour("6.1-amd64", "Debian 12 stock kernel 6.1 (ABI-numbered), generic amd64",
            _image_re(r"6\.1\.0-(?P<order>\d+)-amd64")),
    Flavour("deb13-6.12-amd64", "Debian 13 (trixie) kernel 6.12, generic amd64, gcc-14",
            _image_re(r"6\.12\.(?P<order>\d+)\+deb13(?:\.\d+)?-amd64"), TRIXIE),
    Flavour("deb13-6.12-rt-amd64", "Debian 13 (trixie) kernel 6.12 with PREEMPT_RT, gcc-14",
            _image_re(r"6\.12\.(?P<order>\d+)\+deb13(?:\.\d+)?-rt-amd64"), TRIXIE),
    Flavour("7.2-amd64", "Debian forky kernel 7.2 (upstream's newest line), amd64, gcc-16",
            _image_re(r"7\.2\.(?P<order>\d+)\+deb14-amd64", ""), FORKY, ""),
    Flavour("7.2-rt-amd64", "Debian forky kernel 7.2 with PREEMPT_RT, gcc-16",
            _image_re(r"7\.2\.(?P<order>\d+)\+deb14-rt-amd64", ""), FORKY, ""),
)}

DEFAULT_FLAVOURS: tuple[str, ...] = ("6.12-amd64", "6.12-rt-amd64", "6.1-amd64")

#: What ``apt-cache search --names-only`` is asked for; the flavour regexes filter it.
IMAGE_SEARCH = r"^linux-image-"


def get(name: str) -> Flavour:
    try:
        return FLAVOURS[name]
    except KeyError:
        known = ", ".join(FLAVOURS)
        raise KeyError(f"unknown flavour {name!r} (known: {known})") from None


def headers_package(kver: str) -> str:
    return f"linux-headers-{kver}"


def parse_search(output: str) -> list[str]:
    """Package names from ``apt-cache search`` output (``name - description`` lines)."""
    names = []
    for line in output.splitlines():
        name, sep, _ = line.partition(" - ")
        if sep and name.strip():
            names.append(name.strip())
    return names


def newest_kver(flavour: Flavour, package_names: list[str]) -> str | None:
    """The kernel release of the newest image package of ``flavour``, or None."""
    best: tuple[int, str] | None = None
    for name in package_names:
        m = flavour.image_re.match(name)
        if m:
            key = (int(m["order"]), m["kver"])
            if best is None or key > best:
                best = key
    return best[1] if best else None


@dataclass(frozen=True)
class Dep:
    """One package relation: ``name (op version)``; op and version empty if unversioned."""

    name: str
    op: str = ""
    version: str = ""

    def apt_spec(self) -> str:
        """What to pass to ``apt-get download``: pinned only for an exact ``=`` relation."""
        return f"{self.name}={self.version}" if self.op == "=" else self.name


_DEP_RE = re.compile(r"^\s*(?P<name>[a-z0-9][a-z0-9+.\-]*)(?::[a-z0-9]+)?"
                     r"\s*(?:\(\s*(?P<op><<|<=|=|>=|>>)\s*(?P<version>[^)\s]+)\s*\))?\s*$")


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """The stanzas of ``apt-cache show`` output as field dicts (continuations joined)."""
    stanzas: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    key = None
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if fields:
                stanzas.append(fields)
            fields, key = {}, None
            continue
        if line[0] in " \t":
            if key:
                fields[key] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        key = name if sep else None
        if key:
            fields[key] = value.strip()
    return stanzas


def parse_depends(value: str) -> list[list[Dep]]:
    """A Depends field as a list of alternatives (``a | b`` gives one list of two)."""
    result = []
    for group in value.split(","):
        if not group.strip():
            continue
        alts = []
        for alt in group.split("|"):
            m = _DEP_RE.match(alt)
            if not m:
                raise ValueError(f"cannot parse package relation {alt.strip()!r}")
            alts.append(Dep(m["name"], m["op"] or "", m["version"] or ""))
        result.append(alts)
    return result


@dataclass(frozen=True)
class HeaderDeps:
    common: Dep
    kbuild: Dep


def header_deps(depends: str) -> HeaderDeps:
    """Pick the ``linux-headers-*-common[-rt]`` and ``linux-kbuild-*`` packages that a
    ``linux-headers-<kver>`` package depends on."""
    common = kbuild = None
    for alts in parse_depends(depends):
        for dep in alts:
            if re.fullmatch(r"linux-headers-.*-common(?:-rt)?", dep.name):
                common = dep
            elif dep.name.startswith("linux-kbuild-"):
                kbuild = dep
    if common is None or kbuild is None:
        raise ValueError(f"headers package has no -common or linux-kbuild dependency: {depends}")
    return HeaderDeps(common, kbuild)


def image_parts(depends: str, kver: str) -> list[Dep]:
    """The packages of one kernel release that an image metapackage pins with ``=``
    (7.x: ``linux-binary-<kver>``, ``linux-modules-<kver>``, ``linux-base-<kver>``).
    Empty for Debian 12/13's ``-unsigned`` images, which hold the files themselves."""
    return [dep for alts in parse_depends(depends) for dep in alts
            if dep.op == "=" and dep.name.startswith("linux-") and kver in dep.name]


def build_tools(*depends: str) -> list[str]:
    """What a chroot needs to build against these headers: every dependency of the
    headers and kbuild packages that is not itself a kernel package (the compiler,
    pahole, the libraries of kbuild's host programs), first alternative of each."""
    names = []
    for value in depends:
        for alts in parse_depends(value):
            name = alts[0].name
            if not name.startswith("linux-") and name not in names:
                names.append(name)
    return names
