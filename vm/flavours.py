"""Kernel flavours and the pure parsing that maps a flavour to Debian packages.

A flavour names a *series* of Debian kernels, not one release: point releases drop off the
mirror, so ``fetch`` always resolves the newest package that the apt lists offer.  Nothing
here runs a command; ``vm.apt`` feeds it the text that apt-cache prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Flavour:
    name: str
    summary: str
    #: Matches the full name of the image package; group ``kver`` is the kernel release
    #: (``uname -r``) and group ``order`` the number that grows with each new release.
    image_re: re.Pattern[str]


FLAVOURS: dict[str, Flavour] = {f.name: f for f in (
    Flavour("6.12-amd64", "Debian 12 security/updates kernel 6.12, generic amd64",
            re.compile(r"^linux-image-(?P<kver>6\.12\.(?P<order>\d+)\+deb12-amd64)-unsigned$")),
    Flavour("6.12-rt-amd64", "Debian 12 kernel 6.12 with PREEMPT_RT",
            re.compile(r"^linux-image-(?P<kver>6\.12\.(?P<order>\d+)\+deb12-rt-amd64)-unsigned$")),
    Flavour("6.1-amd64", "Debian 12 stock kernel 6.1 (ABI-numbered), generic amd64",
            re.compile(r"^linux-image-(?P<kver>6\.1\.0-(?P<order>\d+)-amd64)-unsigned$")),
)}

DEFAULT_FLAVOURS: tuple[str, ...] = ("6.12-amd64", "6.12-rt-amd64", "6.1-amd64")

#: What ``apt-cache search --names-only`` is asked for; the flavour regexes filter it.
IMAGE_SEARCH = r"^linux-image-.*-unsigned$"


def get(name: str) -> Flavour:
    try:
        return FLAVOURS[name]
    except KeyError:
        known = ", ".join(FLAVOURS)
        raise KeyError(f"unknown flavour {name!r} (known: {known})") from None


def image_package(kver: str) -> str:
    return f"linux-image-{kver}-unsigned"


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
