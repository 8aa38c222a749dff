"""Syncing module sources into the per-kernel build copy."""

from __future__ import annotations

import os
from pathlib import Path

from vm import build


def test_sync_copies_sources_skips_products_and_removes_deleted(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "uapi").mkdir(parents=True)
    (src / "Kbuild").write_text("obj-m := kbp.o\n")
    (src / "kbp.c").write_text("int x;\n")
    (src / "uapi" / "kbp.h").write_text("#define X 1\n")
    for product in ("kbp.o", "kbp.ko", ".kbp.o.cmd", "kbp.mod.c", "modules.order"):
        (src / product).write_text("junk")
    build.sync_tree(src, dst)
    assert sorted(build.source_files(dst)) == ["Kbuild", "kbp.c", "uapi/kbp.h"]
    assert not (dst / "kbp.o").exists()

    (dst / "kbp.o").write_text("object")            # a build product in the copy stays
    (src / "kbp.c").unlink()
    (src / "new.c").write_text("int y;\n")
    build.sync_tree(src, dst)
    assert sorted(build.source_files(dst)) == ["Kbuild", "new.c", "uapi/kbp.h"]
    assert (dst / "kbp.o").read_text() == "object"


def test_sync_keeps_mtimes_so_make_is_incremental(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a.c").write_text("1")
    os.utime(src / "a.c", ns=(1_000_000_000, 1_000_000_000))
    build.sync_tree(src, dst)
    assert (dst / "a.c").stat().st_mtime_ns == 1_000_000_000
    os.utime(dst / "a.c", ns=(1_000_000_000, 1_000_000_000))
    build.sync_tree(src, dst)                        # unchanged: not rewritten
    assert (dst / "a.c").stat().st_mtime_ns == 1_000_000_000


def test_modules_from_order(tmp_path: Path) -> None:
    assert build.modules_from_order(tmp_path, "kbp.o\nsub/kbp_test_klp.o\n") == (
        tmp_path / "kbp.ko", tmp_path / "sub" / "kbp_test_klp.ko")
    assert build.modules_from_order(tmp_path, "kernel/extra/hello.ko\n") == (
        tmp_path / "extra" / "hello.ko",)


def test_main_module_prefers_kbp(tmp_path: Path) -> None:
    b = build.Built("k", tmp_path, tmp_path, (tmp_path / "helper.ko", tmp_path / "kbp.ko"))
    assert b.main.name == "kbp.ko"
    b = build.Built("k", tmp_path, tmp_path, (tmp_path / "hello.ko",))
    assert b.main.name == "hello.ko"
