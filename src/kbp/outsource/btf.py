"""Find a function's BTF type id in the kernel's BTF (/sys/kernel/btf/vmlinux).

A BTF blob is a header, a type section and a string section.  A type's id is its position
in the type section (from 1), so finding one means walking the types before it: each is a
12-byte ``btf_type`` (name_off, info, size/type) followed by kind-specific data whose
length follows from the kind and ``vlen`` (include/uapi/linux/btf.h).  The name is looked
up once in the string section, then compared as an offset: no string is decoded during the
walk (it runs in TCG guests, where Python is ~15x slower).
"""

from __future__ import annotations

import struct
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F
KIND_FUNC = 12

# bytes after the 12-byte btf_type: (fixed, per vlen member), index = kind
_EXTRA: tuple[tuple[int, int], ...] = (
    (0, 0),    # 0 UNKN
    (4, 0),    # 1 INT
    (0, 0),    # 2 PTR
    (12, 0),   # 3 ARRAY
    (0, 12),   # 4 STRUCT
    (0, 12),   # 5 UNION
    (0, 8),    # 6 ENUM
    (0, 0),    # 7 FWD
    (0, 0),    # 8 TYPEDEF
    (0, 0),    # 9 VOLATILE
    (0, 0),    # 10 CONST
    (0, 0),    # 11 RESTRICT
    (0, 0),    # 12 FUNC
    (0, 8),    # 13 FUNC_PROTO
    (4, 0),    # 14 VAR
    (0, 12),   # 15 DATASEC
    (0, 0),    # 16 FLOAT
    (4, 0),    # 17 DECL_TAG
    (0, 0),    # 18 TYPE_TAG
    (0, 12),   # 19 ENUM64
)


class BtfError(Exception):
    """The BTF is missing, malformed, or lacks the name asked for (message says which)."""


def func_id(name: str, path: Path = VMLINUX) -> int:
    """The type id of BTF FUNC ``name`` in ``path`` (BtfError when there is none)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BtfError(f"{path} is missing: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF)"
                       ) from None
    except OSError as e:
        raise BtfError(f"cannot read {path}: {e.strerror}") from None
    return find_func(data, name, str(path))


def find_func(data: bytes, name: str, where: str = "BTF") -> int:
    if len(data) < 24:
        raise BtfError(f"{where}: too short for a BTF header")
    magic, _ver, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
    if magic != BTF_MAGIC:
        raise BtfError(f"{where}: not BTF (magic {magic:#x}; big-endian BTF is not read)")
    type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
    types = hdr_len + type_off
    strs = hdr_len + str_off
    if types + type_len > len(data) or strs + str_len > len(data):
        raise BtfError(f"{where}: sections run past the end")
    # the name's offset(s) in the string section ("\0name\0"; the section starts with "\0")
    want = b"\0" + name.encode() + b"\0"
    offs = set()
    at = data.find(want, strs, strs + str_len)
    while at >= 0:
        offs.add(at + 1 - strs)
        at = data.find(want, at + 1, strs + str_len)
    if not offs:
        raise BtfError(f"{where} has no {name!r}")
    unpack = struct.Struct("<II").unpack_from
    extra = _EXTRA
    pos, end, tid = types, types + type_len, 0
    while pos < end:
        tid += 1
        name_off, info = unpack(data, pos)
        kind = (info >> 24) & 0x1F
        if kind == KIND_FUNC and name_off in offs:
            return tid
        try:
            fixed, per = extra[kind]
        except IndexError:
            raise BtfError(f"{where}: type {tid} has unknown kind {kind} (a newer BTF?)"
                           ) from None
        pos += 12 + fixed + per * (info & 0xFFFF)
    raise BtfError(f"{where} has no function {name!r}")
