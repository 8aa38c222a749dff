"""Flavour -> Debian package resolution (pure parsing of apt-cache output)."""

from __future__ import annotations

import pytest

from vm import flavours
from vm.flavours import Dep

SEARCH = """\
linux-image-6.1.0-9-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-56-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-56-cloud-amd64-unsigned - Linux 6.1 for x86-64 cloud
linux-image-6.1.0-56-rt-amd64-unsigned - Linux 6.1 for 64-bit PCs, PREEMPT_RT
linux-image-6.12.99+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.117+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.117+deb12-cloud-amd64-unsigned - Linux 6.12 for x86-64 cloud
linux-image-6.12.115+deb12-rt-amd64-unsigned - Linux 6.12 for 64-bit PCs, PREEMPT_RT
linux-image-6.12.117+deb12-rt-amd64-unsigned - Linux 6.12 for 64-bit PCs, PREEMPT_RT
linux-image-6.12.118+bpo-amd64-unsigned - Linux 6.12 for 64-bit PCs (backports)
"""


@pytest.mark.parametrize(("flavour", "kver"), [
    ("6.12-amd64", "6.12.117+deb12-amd64"),
    ("6.12-rt-amd64", "6.12.117+deb12-rt-amd64"),
    ("6.1-amd64", "6.1.0-56-amd64"),
])
def test_newest_kver(flavour: str, kver: str) -> None:
    names = flavours.parse_search(SEARCH)
    assert flavours.newest_kver(flavours.get(flavour), names) == kver


def test_numeric_not_lexical_order() -> None:
    names = ["linux-image-6.12.99+deb12-amd64-unsigned",
             "linux-image-6.12.100+deb12-amd64-unsigned"]
    assert flavours.newest_kver(flavours.get("6.12-amd64"), names) == "6.12.100+deb12-amd64"


def test_nothing_matches() -> None:
    assert flavours.newest_kver(flavours.get("6.1-amd64"), flavours.parse_search("")) is None
    assert flavours.newest_kver(flavours.get("6.1-amd64"),
                                ["linux-image-6.1.0-56-amd64"]) is None  # signed, not -unsigned


def test_unknown_flavour() -> None:
    with pytest.raises(KeyError, match=r"known: 6\.12-amd64"):
        flavours.get("5.10-amd64")


def test_defaults_are_known() -> None:
    assert set(flavours.DEFAULT_FLAVOURS) <= set(flavours.FLAVOURS)


SHOW = """\
Package: linux-image-6.12.117+deb12-amd64-unsigned
Source: linux-6.12
Version: 6.12.117-1~deb12u1
Depends: kmod, linux-base (>= 4.12~),
 initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool
Description: Linux 6.12 for 64-bit PCs

Package: linux-headers-6.12.117+deb12-amd64
Version: 6.12.117-1~deb12u1
Depends: linux-base (>= 4.12~), linux-headers-6.12.117+deb12-common (= 6.12.117-1~deb12u1), \
linux-image-6.12.117+deb12-amd64 (= 6.12.117-1~deb12u1) | \
linux-image-6.12.117+deb12-amd64-unsigned (= 6.12.117-1~deb12u1), \
linux-kbuild-6.12.117+deb12, gcc-12
"""


def test_parse_stanzas() -> None:
    img, hdr = flavours.parse_stanzas(SHOW)
    assert img["Package"] == "linux-image-6.12.117+deb12-amd64-unsigned"
    assert img["Version"] == "6.12.117-1~deb12u1"
    assert img["Depends"].endswith("| linux-initramfs-tool")  # continuation joined
    assert hdr["Package"] == "linux-headers-6.12.117+deb12-amd64"


def test_parse_depends_alternatives_and_versions() -> None:
    deps = flavours.parse_depends("a, b (>= 1.0~) | c:any (= 2-1), d")
    assert deps == [[Dep("a")], [Dep("b", ">=", "1.0~"), Dep("c", "=", "2-1")], [Dep("d")]]
    with pytest.raises(ValueError):
        flavours.parse_depends("a (>= )")


def test_header_deps_612() -> None:
    hdr = flavours.parse_stanzas(SHOW)[1]
    d = flavours.header_deps(hdr["Depends"])
    assert d.common.apt_spec() == "linux-headers-6.12.117+deb12-common=6.12.117-1~deb12u1"
    assert d.kbuild.apt_spec() == "linux-kbuild-6.12.117+deb12"


def test_header_deps_rt_and_61() -> None:
    rt = flavours.header_deps(
        "linux-base (>= 4.12~), linux-headers-6.12.117+deb12-common-rt (= 6.12.117-1~deb12u1),"
        " linux-kbuild-6.12.117+deb12, gcc-12")
    assert rt.common.name == "linux-headers-6.12.117+deb12-common-rt"
    old = flavours.header_deps("linux-headers-6.1.0-56-common (= 6.1.192-2), "
                               "linux-kbuild-6.1 (>= 6.1.192-2), linux-compiler-gcc-12-x86")
    assert old.common.apt_spec() == "linux-headers-6.1.0-56-common=6.1.192-2"
    assert old.kbuild.apt_spec() == "linux-kbuild-6.1"  # >=: the candidate is fine


def test_header_deps_missing() -> None:
    with pytest.raises(ValueError, match="no -common or linux-kbuild"):
        flavours.header_deps("gcc-12")


NEW_SEARCH = """\
linux-image-6.12.115+deb13-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.115+deb13.1-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.117+deb13-rt-amd64-unsigned - Linux 6.12 for 64-bit PCs, PREEMPT_RT
linux-image-6.12.117+deb13-cloud-amd64-unsigned - Linux 6.12 for x86-64 cloud
linux-image-7.2.9+deb14-amd64 - Linux 7.2.9 for 64-bit PCs
linux-image-7.2.12+deb14-amd64 - Linux 7.2.12 for 64-bit PCs
linux-image-7.2.12+deb14-amd64-dbg - Linux 7.2.12 for 64-bit PCs (debug symbols)
linux-image-7.2.12+deb14-rt-amd64 - Linux 7.2.12 for 64-bit PCs, PREEMPT_RT
linux-image-amd64 - Linux for 64-bit PCs (meta-package)
"""


@pytest.mark.parametrize(("flavour", "kver", "release"), [
    ("deb13-6.12-amd64", "6.12.115+deb13.1-amd64", "trixie"),
    ("deb13-6.12-rt-amd64", "6.12.117+deb13-rt-amd64", "trixie"),
    ("7.2-amd64", "7.2.12+deb14-amd64", "forky"),
    ("7.2-rt-amd64", "7.2.12+deb14-rt-amd64", "forky"),
])
def test_newer_releases(flavour: str, kver: str, release: str) -> None:
    fl = flavours.get(flavour)
    assert flavours.newest_kver(fl, flavours.parse_search(NEW_SEARCH)) == kver
    assert fl.release.name == release and not fl.release.is_host
    assert flavours.parse_search(NEW_SEARCH).count(fl.image_package(kver)) == 1


def test_debian12_flavours_use_the_host_lists() -> None:
    for name in flavours.DEFAULT_FLAVOURS:
        assert flavours.get(name).release.is_host


def test_image_parts_of_a_7x_metapackage() -> None:
    depends = ("dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, "
               "linux-base-7.2.12+deb14-amd64 (= 7.2.12-1), "
               "linux-binary-7.2.12+deb14-amd64 (= 7.2.12-1), "
               "linux-modules-7.2.12+deb14-amd64 (= 7.2.12-1)")
    parts = flavours.image_parts(depends, "7.2.12+deb14-amd64")
    assert [p.apt_spec() for p in parts] == [
        "linux-base-7.2.12+deb14-amd64=7.2.12-1", "linux-binary-7.2.12+deb14-amd64=7.2.12-1",
        "linux-modules-7.2.12+deb14-amd64=7.2.12-1"]
    # Debian 12's -unsigned image holds its files itself.
    assert flavours.image_parts("kmod, linux-base (>= 4.12~)", "6.12.117+deb12-amd64") == []


def test_build_tools_are_the_non_kernel_dependencies() -> None:
    hdr = ("gcc-16-for-host, linux-base (>= 4.12~), linux-headers-7.2.12+deb14-common "
           "(= 7.2.12-1), linux-kbuild-7.2.12+deb14")
    kbuild = "pahole, libc6 (>= 2.38), libelf1t64 (>= 0.144), libssl3t64 | libssl3, zlib1g"
    assert flavours.build_tools(hdr, kbuild) == [
        "gcc-16-for-host", "pahole", "libc6", "libelf1t64", "libssl3t64", "zlib1g"]
