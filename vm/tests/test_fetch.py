"""Fixing up an extracted headers tree so it builds from wherever the cache is."""

from __future__ import annotations

from pathlib import Path

import pytest

from vm import apt, fetch, flavours
from vm.paths import KernelTree
from vm.util import RigError


def _tree(tmp_path: Path, makefile: str) -> KernelTree:
    tree = KernelTree("7.2.12+deb14-amd64", tmp_path)
    tree.headers.mkdir(parents=True)
    (tree.headers / "Makefile").write_text(makefile)
    return tree


def test_debian12_headers_makefile(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "include /usr/src/linux-headers-6.12.117+deb12-common/Makefile\n")
    fetch._fix_headers_makefile(tree)
    assert (tree.headers / "Makefile").read_text() == (
        "include $(dir $(lastword $(MAKEFILE_LIST)))../linux-headers-6.12.117+deb12-common"
        "/Makefile\n")


def test_7x_headers_makefile_output_dir(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "KBUILD_OUTPUT=/usr/src/linux-headers-7.2.12+deb14-amd64\n"
                           "include /usr/src/linux-headers-7.2.12+deb14-common/Makefile\n")
    fetch._fix_headers_makefile(tree)
    text = (tree.headers / "Makefile").read_text()
    assert "/usr/src" not in text
    assert text.startswith("KBUILD_OUTPUT := $(patsubst %/,%,$(dir $(abspath ")


def test_unexpected_headers_layout_is_an_error(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "obj-y += nothing\n")
    with pytest.raises(RigError, match="Debian headers layout changed"):
        fetch._fix_headers_makefile(tree)


def test_merged_usr_tree_finds_modules_and_image(tmp_path: Path) -> None:
    tree = KernelTree("7.2.12+deb14-amd64", tmp_path)
    mods = tree.root / "usr" / "lib" / "modules" / tree.kver
    mods.mkdir(parents=True)
    (mods / "vmlinuz").write_text("")
    (mods / "config").write_text("")
    fetch._merge_usr(tree.root)
    assert tree.modules.is_dir()
    assert tree.vmlinuz == tree.modules / "vmlinuz" and tree.vmlinuz.exists()
    assert tree.config.exists()


def test_private_apt_state_only_for_other_releases(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBP_VM_CACHE", str(tmp_path))
    assert apt.options(flavours.HOST) == []
    opts = apt.options(flavours.FORKY)
    assert f"Dir::Etc::SourceList={tmp_path}/apt/forky/sources.list" in opts
    assert "Dir::Etc::SourceParts=-" in opts
    assert not apt.has_lists(flavours.FORKY)


def test_unresolvable_flavour_names_itself_and_its_lists(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBP_VM_CACHE", str(tmp_path))
    monkeypatch.setattr(apt, "has_lists", lambda rel: True)
    monkeypatch.setattr(apt, "search", lambda pattern, rel: "")
    with pytest.raises(RigError, match=r"flavour 7\.2-amd64 .*forky lists"):
        fetch.resolve("7.2-amd64", may_update=False)
