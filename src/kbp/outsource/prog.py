"""The policy program: BPF ``fmod_ret`` on ``update_socket_protocol(family, type,
protocol)``, hand-assembled.

``__sys_socket()`` calls ``update_socket_protocol()`` (6.6+, the hook MPTCP uses) for every
``socket(2)`` and creates the socket with the protocol it returns.  The program returns
``KBP_SO_PROTO`` (253) for a UDP socket -- ``family`` in the policy's families,
``type & SOCK_TYPE_MASK == SOCK_DGRAM`` (``type`` still carries SOCK_NONBLOCK/SOCK_CLOEXEC
there), ``protocol`` 0 or IPPROTO_UDP -- created by a task of the policy's cgroup, and
``protocol`` unchanged otherwise (a 0 return lets the original function run, which returns
``protocol``: the same thing).

Cgroup match: ``bpf_get_current_ancestor_cgroup_id(level) == id`` -- the cgroup and every
cgroup below it -- or, with ``subtree=False``, ``bpf_get_current_cgroup_id() == id``, the
cgroup alone.  Both helpers are in ``bpf_base_func_proto()`` (6.12's kernel/bpf/helpers.c),
which tracing programs get.

Only the instructions this program needs are encoded (include/uapi/linux/bpf.h,
Documentation/bpf/standardization/instruction-set.rst): 8-byte ``struct bpf_insn`` =
opcode, dst_reg:4 | src_reg:4, s16 offset, s32 imm.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

KBP_SO_PROTO = 253
AF_INET = 2
AF_INET6 = 10
SOCK_DGRAM = 2
SOCK_TYPE_MASK = 0xF
IPPROTO_UDP = 17

FUNC_GET_CURRENT_CGROUP_ID = 80
FUNC_GET_CURRENT_ANCESTOR_CGROUP_ID = 123

# instruction classes, sizes, modes, operations, sources
_LD, _LDX, _ALU, _JMP, _JMP32, _ALU64 = 0x00, 0x01, 0x04, 0x05, 0x06, 0x07
_DW, _IMM, _MEM = 0x18, 0x00, 0x60
_K, _X = 0x00, 0x08
_MOV, _AND = 0xB0, 0x50
_JA, _JEQ, _JNE, _CALL, _EXIT = 0x00, 0x10, 0x50, 0x80, 0x90

R0, R1, R2, R3, R6, R7 = 0, 1, 2, 3, 6, 7


@dataclass
class Insn:
    """One instruction; ``target``: a label a jump's offset is resolved to."""

    op: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0
    target: str | None = None
    wide: int | None = None      # ld_imm64's upper 32 bits (a second 8-byte slot)


def mov64_reg(dst: int, src: int) -> Insn:          # dst = src
    return Insn(_ALU64 | _MOV | _X, dst, src)


def mov32_reg(dst: int, src: int) -> Insn:          # dst = (u32)src
    return Insn(_ALU | _MOV | _X, dst, src)


def mov64_imm(dst: int, imm: int) -> Insn:          # dst = imm
    return Insn(_ALU64 | _MOV | _K, dst, imm=imm)


def mov32_imm(dst: int, imm: int) -> Insn:          # dst = (u32)imm
    return Insn(_ALU | _MOV | _K, dst, imm=imm)


def and32_imm(dst: int, imm: int) -> Insn:          # dst = (u32)(dst & imm)
    return Insn(_ALU | _AND | _K, dst, imm=imm)


def ldx_dw(dst: int, src: int, off: int) -> Insn:   # dst = *(u64 *)(src + off)
    return Insn(_LDX | _MEM | _DW, dst, src, off)


def ld_imm64(dst: int, value: int) -> Insn:         # dst = value (two slots)
    return Insn(_LD | _IMM | _DW, dst, imm=value & 0xFFFFFFFF, wide=(value >> 32) & 0xFFFFFFFF)


def jeq32_imm(dst: int, imm: int, label: str) -> Insn:   # if (u32)dst == imm goto label
    return Insn(_JMP32 | _JEQ | _K, dst, imm=imm, target=label)


def jne32_imm(dst: int, imm: int, label: str) -> Insn:   # if (u32)dst != imm goto label
    return Insn(_JMP32 | _JNE | _K, dst, imm=imm, target=label)


def jne_reg(dst: int, src: int, label: str) -> Insn:     # if dst != src goto label (64 bit)
    return Insn(_JMP | _JNE | _X, dst, src, target=label)


def call(func: int) -> Insn:                             # r0 = helper(r1..r5)
    return Insn(_JMP | _CALL, imm=func)


def exit_() -> Insn:                                     # return r0
    return Insn(_JMP | _EXIT)


def assemble(items: list[Insn | str]) -> bytes:
    """Encode ``items`` (instructions and label names, a label marking the next
    instruction), resolving jump targets to offsets counted in 8-byte slots."""
    labels: dict[str, int] = {}
    slot = 0
    for it in items:
        if isinstance(it, str):
            labels[it] = slot
        else:
            slot += 2 if it.wide is not None else 1
    out = bytearray()
    slot = 0
    for it in items:
        if isinstance(it, str):
            continue
        off = it.off
        size = 2 if it.wide is not None else 1
        if it.target is not None:
            off = labels[it.target] - (slot + size)
        out += struct.pack("<BBhi", it.op, (it.src << 4) | it.dst, off,
                           _s32(it.imm))
        if it.wide is not None:
            out += struct.pack("<BBhi", 0, 0, 0, _s32(it.wide))
        slot += size
    return bytes(out)


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def policy_insns(families: tuple[int, ...], cgroup_id: int, level: int | None) -> bytes:
    """The program: ``families`` a non-empty subset of (AF_INET, AF_INET6); ``level`` the
    cgroup's depth below the hierarchy's root for the subtree match, None for the exact
    one."""
    if not families or not set(families) <= {AF_INET, AF_INET6}:
        raise ValueError(f"families must be AF_INET and/or AF_INET6, not {families}")
    # ctx (r1) is the u64 array of the arguments: [0] family, [1] type, [2] protocol
    prog: list[Insn | str] = [
        mov64_reg(R6, R1),                      # r6 = ctx
        ldx_dw(R7, R6, 16),                     # r7 = protocol: the default return value
        ldx_dw(R2, R6, 0),                      # r2 = family
    ]
    for i, fam in enumerate(families):          # family in the policy's families?
        last = i == len(families) - 1
        prog.append(jne32_imm(R2, fam, "keep") if last else jeq32_imm(R2, fam, "family_ok"))
    prog += [
        "family_ok",
        ldx_dw(R3, R6, 8),                      # r3 = type
        and32_imm(R3, SOCK_TYPE_MASK),          # without SOCK_NONBLOCK / SOCK_CLOEXEC
        jne32_imm(R3, SOCK_DGRAM, "keep"),      # UDP sockets only
        jeq32_imm(R7, 0, "proto_ok"),           # protocol 0 (the default for DGRAM) ...
        jne32_imm(R7, IPPROTO_UDP, "keep"),     # ... or IPPROTO_UDP
        "proto_ok",
    ]
    if level is None:
        prog.append(call(FUNC_GET_CURRENT_CGROUP_ID))           # r0 = the task's cgroup
    else:
        prog += [mov64_imm(R1, level),
                 call(FUNC_GET_CURRENT_ANCESTOR_CGROUP_ID)]     # r0 = its ancestor at level
    prog += [
        ld_imm64(R1, cgroup_id),
        jne_reg(R0, R1, "keep"),                # not in the policy's cgroup
        mov32_imm(R7, KBP_SO_PROTO),            # outsourced: kbp_so's protocol
        "keep",
        mov32_reg(R0, R7),                      # return r7
        exit_(),
    ]
    return assemble(prog)
