"""The per-run script /init sources, the QEMU command line and the CLI's argv split."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vm import cli, console, qemu, run


def _spec(**kw: object) -> run.RunSpec:
    return run.RunSpec(flavour="6.12-amd64", argv=["python3", "-c", "print('a b' \"$x\")"],
                       cwd=Path("/work/main"), **kw)  # type: ignore[arg-type]


def test_run_script_passes_argv_env_and_cwd_through_sh(tmp_path: Path) -> None:
    spec = _spec(ko=Path("/c/kbp.ko"), python="/r/.venv/bin/python", env={"EXTRA": "x y"})
    script = run.run_script(spec, "6.12.117+deb12-amd64", Path("/c/lib/modules/k"), "ab" * 8)
    (tmp_path / "run.sh").write_text(script)
    # Stand-in for busybox chroot: print each argument on its own line.
    probe = (f". {tmp_path}/run.sh; chroot() {{ printf '%s\\n' \"$@\"; }}; "
             "kbp_exec eth0 eth1; echo \"NONCE=$KBPI_NONCE MODS=$KBPI_MODULES\"")
    out = subprocess.run(["sh", "-c", probe], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[:3] == ["/newroot", "/usr/bin/env", "-i"]
    assert "KBP_NIC0=eth0" in out and "KBP_NIC1=eth1" in out
    assert "KBP_KO=/c/kbp.ko" in out and "KBP_KO_DIR=/c" in out
    assert "KBP_KVER=6.12.117+deb12-amd64" in out and "EXTRA=x y" in out
    assert "PATH=/r/.venv/bin:" + run.GUEST_PATH not in out  # no pyvenv.cfg under /r
    assert out[-5:-1] == ["/work/main", "python3", "-c", "print('a b' \"$x\")"]
    assert out[-1] == f"NONCE={'ab' * 8} MODS=/c/lib/modules/k"


def test_guest_env_venv_path(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "pyvenv.cfg").write_text("")
    env = run.guest_env(_spec(python=str(tmp_path / "bin" / "python")), "k")
    assert env["PATH"].startswith(f"{tmp_path / 'bin'}:")
    assert "KBP_KO" not in env and "KBP_OUT" not in env
    assert env["KBP_IN_VM"] == "1" and env["KBP_FLAVOUR"] == "6.12-amd64"


def test_qemu_argv_has_hub_nics_and_shares() -> None:
    m = qemu.Machine(Path("/k"), Path("/i"), "console=ttyS0",
                     shares=(qemu.Share("hostroot", Path("/"), True),
                             qemu.Share("kbpout", Path("/o"), False)))
    argv = m.argv()
    joined = " ".join(argv)
    assert "-accel tcg,thread=multi" in joined and "-no-reboot" in argv
    assert joined.count("hubport,id=n") == 2 and "hubid=0" in joined
    assert f"virtio-net-pci,netdev=n0,mac={qemu.MACS[0]}" in argv
    assert "local,id=fs0,path=/,security_model=none,multidevs=remap,readonly=on" in argv
    assert "local,id=fs1,path=/o,security_model=none,multidevs=remap" in argv


def test_cmdline_keeps_oops_nonfatal() -> None:
    line = run.kernel_cmdline("loglevel=8")
    assert "panic=-1" in line and "oops=panic" not in line and line.endswith("loglevel=8")


def test_split_dashdash() -> None:
    assert cli.split_dashdash(["run", "f", "--", "ip", "--", "x"]) == (
        ["run", "f"], ["ip", "--", "x"])
    assert cli.split_dashdash(["run", "f", "true"]) == (["run", "f", "true"], None)


def test_report_names_the_tcg_text_patching_race_on_an_int3_oops(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The console line of the panic CI saw on 7.2-rt: the report points at vm/README.md."""
    line = "[   85.082413] Oops: int3: 0000 [#1] SMP NOPTI"
    oops = run.RunResult("7.2", 125, None, 4.0, 86.3, [console.Splat("Oops", line, 86.2)],
                         "the guest kernel panicked (see the console)")
    run.report(oops)
    err = capsys.readouterr().err
    assert "QEMU 7.2 TCG racing the kernel's text patching" in err
    assert 'vm/README.md, "Oops: int3"' in err
    other = run.RunResult("7.2", 125, None, 4.0, 86.3,
                          [console.Splat("Oops", "[ 1.0] Oops: general protection fault", 1.0)],
                          "the guest kernel panicked (see the console)")
    run.report(other)
    assert "text patching" not in capsys.readouterr().err
