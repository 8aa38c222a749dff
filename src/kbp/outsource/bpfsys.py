"""The few bpf(2) commands the policy needs, through the raw syscall (ctypes).

Each command packs its ``union bpf_attr`` member by hand (offsets from
include/uapi/linux/bpf.h); the buffer is longer than any member and zero-filled, which
every kernel accepts (it checks that bytes it does not know are zero).  A failure is an
:class:`OSError` with the kernel's errno; PROG_LOAD's also carries the verifier's log.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

# enum bpf_cmd
BPF_PROG_LOAD = 5
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_LINK_CREATE = 28
BPF_LINK_GET_FD_BY_ID = 30

BPF_PROG_TYPE_TRACING = 26     # enum bpf_prog_type
BPF_MODIFY_RETURN = 26         # enum bpf_attach_type

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280, "ppc64le": 361,
            "s390x": 351}
_ATTR_SIZE = 144               # > every member we use; the tail stays zero
_LOG_SIZE = 1 << 16

_libc: list[ctypes.CDLL] = []


def _lib() -> ctypes.CDLL:
    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    return _libc[0]


def _sys_bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(0, f"bpf(2): unknown syscall number on {platform.machine()}")
    ret = int(_lib().syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr,
                            ctypes.c_uint(len(attr))))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def _attr(*fields: tuple[int, str, int]) -> ctypes.Array[ctypes.c_char]:
    """A zeroed bpf_attr with ``(offset, struct format, value)`` fields filled in."""
    buf = ctypes.create_string_buffer(_ATTR_SIZE)
    for off, fmt, val in fields:
        struct.pack_into("<" + fmt, buf, off, val)
    return buf


def _addr(obj: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(obj)


class LoadError(OSError):
    """PROG_LOAD refused the program; ``log`` is the verifier's log (may be empty)."""

    def __init__(self, err: int, log: str) -> None:
        super().__init__(err, os.strerror(err))
        self.log = log


def prog_load(insns: bytes, name: str, attach_btf_id: int) -> int:
    """Load a BPF_PROG_TYPE_TRACING program expecting BPF_MODIFY_RETURN at the vmlinux
    BTF function ``attach_btf_id``; license GPL.  Returns its fd."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(_LOG_SIZE)
    pname = name.encode()[:15]
    attr = _attr((0, "I", BPF_PROG_TYPE_TRACING), (4, "I", len(insns) // 8),
                 (8, "Q", _addr(code)), (16, "Q", _addr(lic)),
                 (24, "I", 1), (28, "I", _LOG_SIZE), (32, "Q", _addr(log)),
                 (68, "I", BPF_MODIFY_RETURN), (108, "I", attach_btf_id))
    struct.pack_into("16s", attr, 48, pname)
    try:
        return _sys_bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        text = log.value.decode(errors="replace").strip()
        raise LoadError(e.errno or 0, text) from None


def link_create(prog_fd: int, attach_type: int = BPF_MODIFY_RETURN) -> int:
    """A bpf_link attaching the tracing program at its own attach point; its fd."""
    return _sys_bpf(BPF_LINK_CREATE, _attr((0, "I", prog_fd), (8, "I", attach_type)))


def obj_pin(fd: int, path: str) -> None:
    p = ctypes.create_string_buffer(path.encode())
    _sys_bpf(BPF_OBJ_PIN, _attr((0, "Q", _addr(p)), (8, "I", fd)))


def obj_get(path: str) -> int:
    p = ctypes.create_string_buffer(path.encode())
    return _sys_bpf(BPF_OBJ_GET, _attr((0, "Q", _addr(p))))


def link_get_fd_by_id(link_id: int) -> int:
    return _sys_bpf(BPF_LINK_GET_FD_BY_ID, _attr((0, "I", link_id)))


def prog_get_fd_by_id(prog_id: int) -> int:
    return _sys_bpf(BPF_PROG_GET_FD_BY_ID, _attr((0, "I", prog_id)))


def _info(fd: int, size: int) -> bytes:
    info = ctypes.create_string_buffer(size)
    _sys_bpf(BPF_OBJ_GET_INFO_BY_FD, _attr((0, "I", fd), (4, "I", size), (8, "Q", _addr(info))))
    return info.raw


def prog_id(fd: int) -> int:
    """The id of the program behind ``fd`` (bpf_prog_info.id)."""
    return int(struct.unpack_from("<I", _info(fd, 64), 4)[0])


def link_ids(fd: int) -> tuple[int, int]:
    """(link id, program id) of the link behind ``fd`` (bpf_link_info)."""
    link_id, pid = struct.unpack_from("<II", _info(fd, 64), 4)
    return int(link_id), int(pid)


# -- the file systems the policy lives in ------------------------------------------------
BPF_FS_MAGIC = 0xCAFE4A11
CGROUP2_SUPER_MAGIC = 0x63677270


def fs_type(path: str) -> int:
    """statfs(2)'s f_type of ``path`` (OSError with errno)."""
    buf = ctypes.create_string_buffer(256)      # struct statfs; f_type is its first long
    if _lib().statfs(path.encode(), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(ctypes.c_long.from_buffer(buf).value) & 0xFFFFFFFF


def mount_bpffs(target: str) -> None:
    """mount -t bpf bpf TARGET (mode 0700)."""
    if _lib().mount(b"bpf", target.encode(), b"bpf", ctypes.c_ulong(0), b"mode=0700") != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def umount(target: str) -> None:
    if _lib().umount2(target.encode(), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)
