"""Module load order for the initramfs and the static-ELF check for busybox."""

from __future__ import annotations

import struct

import pytest

from vm import initramfs

DEP = """\
kernel/fs/overlayfs/overlay.ko.xz:
kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet.ko.xz:
kernel/fs/netfs/netfs.ko.xz:
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz
kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko.xz \
kernel/net/core/failover.ko.xz
kernel/drivers/net/net_failover.ko.xz: kernel/net/core/failover.ko.xz
kernel/net/core/failover.ko.xz:
"""
BUILTIN = "kernel/drivers/virtio/virtio_pci.ko\nkernel/drivers/virtio/virtio.ko\n"


def test_load_order_dependencies_first_each_once() -> None:
    order = initramfs.load_order(initramfs.EARLY_MODULES, initramfs.parse_modules_dep(DEP),
                                 initramfs.builtin_names(BUILTIN))
    names = [initramfs._modname(p) for p in order]
    assert names == ["failover", "net_failover", "virtio_net", "9pnet", "9pnet_virtio",
                     "netfs", "9p", "overlay"]


def test_missing_module_raises() -> None:
    with pytest.raises(KeyError):
        initramfs.load_order(["virtio_pci"], initramfs.parse_modules_dep(DEP), set())


def test_modname() -> None:
    assert initramfs._modname("kernel/fs/9p/9p.ko.xz") == "9p"
    assert initramfs._modname("kernel/x/snd-hda.ko") == "snd_hda"


def _elf(with_interp: bool) -> bytes:
    phoff, phentsize = 64, 56
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[0x20:0x28] = struct.pack("<Q", phoff)
    header[0x36:0x38] = struct.pack("<H", phentsize)
    header[0x38:0x3A] = struct.pack("<H", 2)
    ph = struct.pack("<I", 1) + bytes(52)             # PT_LOAD
    ph2 = struct.pack("<I", 3 if with_interp else 1) + bytes(52)
    return bytes(header) + ph + ph2


def test_is_static_elf() -> None:
    assert initramfs.is_static_elf(_elf(False))
    assert not initramfs.is_static_elf(_elf(True))
    assert not initramfs.is_static_elf(b"#!/bin/sh\n")
