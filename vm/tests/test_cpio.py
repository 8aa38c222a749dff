"""The newc writer the initramfs is made with."""

from __future__ import annotations

import stat

import pytest

from vm.cpio import Archive, read_names


def test_roundtrip_and_alignment() -> None:
    a = Archive()
    a.dir("bin")
    a.file("bin/x", b"hello", perm=0o755)
    a.symlink("bin/sh", "busybox")
    a.chardev("dev/console", 5, 1)
    blob = a.bytes()
    assert len(blob) % 4 == 0
    entries = {name: (mode, data) for name, mode, data in read_names(blob)}
    assert entries["bin/x"] == (stat.S_IFREG | 0o755, b"hello")
    assert stat.S_ISLNK(entries["bin/sh"][0]) and entries["bin/sh"][1] == b"busybox"
    assert stat.S_ISCHR(entries["dev/console"][0])
    assert stat.S_ISDIR(entries["bin"][0])


def test_rdev_is_encoded() -> None:
    a = Archive()
    a.chardev("dev/null", 1, 3)
    header = a.bytes()[:110]
    assert header[6 + 8 * 9: 6 + 8 * 11] == b"0000000100000003"


def test_concatenated_archives() -> None:
    a, b = Archive(), Archive()
    a.file("one", b"1")
    b.file("two", b"22")
    assert [n for n, _, _ in read_names(a.bytes() + b.bytes())] == ["one", "two"]


def test_matches_cpio_tool_when_available() -> None:
    import shutil
    import subprocess
    if not shutil.which("cpio"):
        pytest.skip(reason="cpio not installed")
    a = Archive()
    a.dir("d")
    a.file("d/f", b"data\n")
    a.symlink("d/l", "f")
    out = subprocess.run(["cpio", "-t", "--quiet"], input=a.bytes(), capture_output=True,
                         check=True).stdout.decode().split()
    assert out == ["d", "d/f", "d/l"]


def test_duplicates_rejected() -> None:
    a = Archive()
    a.file("x", b"")
    with pytest.raises(ValueError):
        a.file("/x/", b"")
