"""A minimal writer for the ``newc`` cpio format the kernel unpacks as an initramfs.

Written in Python so that device nodes (/dev/console) can go into the archive without root
and without the cpio tool.  Archives can be concatenated: the kernel unpacks them in turn,
which is how ``run`` adds a small per-run archive to the cached base one.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field

_TRAILER = "TRAILER!!!"


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


@dataclass
class Archive:
    """Entries in insertion order; parents must be added before their children."""

    mtime: int = 0
    _chunks: list[bytes] = field(default_factory=list)
    _ino: int = 0
    _names: set[str] = field(default_factory=set)

    def _add(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0),
             nlink: int = 1) -> None:
        name = name.strip("/")
        if not name or name in self._names:
            raise ValueError(f"bad or duplicate cpio entry name {name!r}")
        self._names.add(name)
        self._ino += 1
        self._chunks.append(_entry(name, mode, data, self._ino, self.mtime, rdev, nlink))

    def dir(self, name: str, perm: int = 0o755) -> None:
        self._add(name, stat.S_IFDIR | perm, nlink=2)

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self._add(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        self._add(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int, perm: int = 0o600) -> None:
        self._add(name, stat.S_IFCHR | perm, rdev=(major, minor))

    def has(self, name: str) -> bool:
        return name.strip("/") in self._names

    def bytes(self) -> bytes:
        trailer = _entry(_TRAILER, 0, b"", 0, 0, (0, 0), 1)
        return b"".join([*self._chunks, trailer])


def _entry(name: str, mode: int, data: bytes, ino: int, mtime: int,
           rdev: tuple[int, int], nlink: int) -> bytes:
    encoded = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, nlink, mtime, len(data), 0, 0, rdev[0], rdev[1],
              len(encoded), 0)
    header = b"070701" + b"".join(b"%08x" % f for f in fields)
    head = header + encoded
    return head + _pad4(len(head)) + data + _pad4(len(data))


def read_names(blob: bytes) -> list[tuple[str, int, bytes]]:
    """(name, mode, data) of every entry in ``blob`` (concatenated archives allowed).

    For tests and debugging: the inverse of :class:`Archive`.
    """
    out = []
    pos = 0
    while pos < len(blob):
        if blob[pos:pos + 4] == b"\0\0\0\0":
            pos += 4
            continue
        if blob[pos:pos + 6] != b"070701":
            raise ValueError(f"bad cpio magic at offset {pos}")
        fields = [int(blob[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name_start = pos + 110
        name = blob[name_start:name_start + namesize - 1].decode()
        data_start = name_start + namesize
        data_start += -data_start % 4
        data = blob[data_start:data_start + size]
        pos = data_start + size
        pos += -pos % 4
        if name != _TRAILER:
            out.append((name, mode, data))
    return out
