"""The NetAP golden-section search (module/kbp_netap.c), tested in user space.

``tests/module/netap/netap_test.c`` drives the search with synthetic throughput curves (see its
header for what it checks); here it is built with gcc and run. A second test compiles the same
file the way the kernel would see it (``__KERNEL__``, only ``<linux/types.h>`` and
``<linux/errno.h>``, no FPU registers, 32 and 64 bit) and checks that the object calls nothing:
no libc, no libgcc helper such as a 64-bit division, which a module cannot link against.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "module"
HARNESS = Path(__file__).resolve().parent / "netap" / "netap_test.c"
CFLAGS = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2"]

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed")

# What the kernel's <linux/types.h> and <linux/errno.h> give kbp_netap.h, and nothing else.
FAKE_TYPES_H = """\
#ifndef _FAKE_LINUX_TYPES_H
#define _FAKE_LINUX_TYPES_H
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef _Bool bool;
enum { false = 0, true = 1 };
#define NULL ((void *)0)
#endif
"""
FAKE_ERRNO_H = "#define EINVAL 22\n#define ERANGE 34\n"


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_gcc
def test_search_harness(tmp_path: Path) -> None:
    assert GCC is not None
    exe = tmp_path / "netap_test"
    build = _run([GCC, *CFLAGS, f"-I{MODULE}", str(HARNESS), str(MODULE / "kbp_netap.c"),
                  "-lm", "-o", str(exe)], tmp_path)
    assert build.returncode == 0, f"gcc failed:\n{build.stdout}{build.stderr}"
    run = _run([str(exe)], tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"netap_test failed (exit {run.returncode}):\n{out}"
    assert ", 0 failed" in out, out


@needs_gcc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "amd64"),
                    reason="the kernel-build flags below are x86 ones")
@pytest.mark.parametrize("bits", ["-m64", "-m32"])
def test_kernel_build_constraints(tmp_path: Path, bits: str) -> None:
    assert GCC is not None
    inc = tmp_path / "include" / "linux"
    inc.mkdir(parents=True)
    (inc / "types.h").write_text(FAKE_TYPES_H)
    (inc / "errno.h").write_text(FAKE_ERRNO_H)
    obj = tmp_path / "kbp_netap.o"
    # -nostdinc: any header beyond the two above fails; -mgeneral-regs-only: any floating
    # point fails (the kernel builds with the FPU off); -fno-pic: no GOT reference to excuse.
    build = _run([GCC, *CFLAGS, bits, "-D__KERNEL__", "-nostdinc", f"-I{tmp_path / 'include'}",
                  f"-I{MODULE}", "-ffreestanding", "-fno-pic", "-mgeneral-regs-only",
                  "-Wmissing-prototypes", "-Wstrict-prototypes",
                  "-Wdeclaration-after-statement", "-c", str(MODULE / "kbp_netap.c"),
                  "-o", str(obj)], tmp_path)
    assert build.returncode == 0, f"gcc failed:\n{build.stdout}{build.stderr}"
    nm = shutil.which("nm")
    assert nm is not None, "gcc is installed but nm (binutils, which gcc needs) is not"
    undef = _run([nm, "-u", str(obj)], tmp_path)
    assert undef.returncode == 0, undef.stderr
    assert undef.stdout.strip() == "", f"kbp_netap.o needs symbols a module lacks:\n{undef.stdout}"
