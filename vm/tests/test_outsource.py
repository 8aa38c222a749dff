"""The rig's kbp-sod side (vm/outsource.py): refusals, QEMU's arguments, the daemon's life."""

from __future__ import annotations

import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from vm import cli, outsource, qemu, run
from vm.util import RigError


def test_refusals_name_the_fix() -> None:
    with pytest.raises(RigError, match="above 3072 MiB"):
        outsource.check(outsource.SodSpec("x"), 4096)
    with pytest.raises(RigError, match="ip netns add kbp-no-such-ns"):
        outsource.check(outsource.SodSpec("kbp-no-such-ns"), 1024)
    with pytest.raises(RigError, match="name a network namespace"):
        outsource.check(outsource.SodSpec("a/b"), 1024)


def test_sod_options_need_sod() -> None:
    args = cli.parser().parse_args(["run", "6.12-amd64", "--sod-poll", "--ko",
                                    "/nonexistent.ko"])
    args.command = ["true"]
    with pytest.raises(RigError, match="need --sod NETNS"):
        cli.cmd_run(args)


def test_qemu_arguments_share_ram_and_add_the_doorbell_and_tap(tmp_path: Path) -> None:
    (tmp_path / "ram.path").write_text("/dev/shm/x.ram")
    args = outsource.qemu_args(outsource.SodSpec("ns", tap="t0"), tmp_path, 1024, 2)
    joined = " ".join(args)
    assert "memory-backend-file,id=kbpram,mem-path=/dev/shm/x.ram,share=on,size=1024M" in joined
    assert "-machine memory-backend=kbpram" in joined
    assert f"socket,path={tmp_path / 'sod.sock'},id=kbpso" in joined
    assert "ivshmem-doorbell,chardev=kbpso,vectors=2" in joined
    assert "tap,id=kbptap,ifname=t0,script=no,downscript=no" in joined
    assert f"mac={outsource.TAP_MAC}" in joined
    assert outsource.qemu_prefix(outsource.SodSpec("ns", tap="t0")) == [
        "ip", "netns", "exec", "ns"]
    assert outsource.qemu_prefix(outsource.SodSpec("ns")) == []
    assert "tap" not in " ".join(outsource.qemu_args(outsource.SodSpec("ns"), tmp_path,
                                                     1024, 2))


def test_daemon_command_line(tmp_path: Path) -> None:
    """What the rig (and test_guest_vm.py's restart) start kbp-sod with: the VM's netns,
    ports below 1024 for the guest's root, a user to drop to."""
    argv = outsource.daemon_argv(outsource.SodSpec("ns9"), Path("/b/kbp-sod"), tmp_path,
                                 "/dev/shm/r.ram", 2, socket="s2")
    assert argv[:2] == ["/b/kbp-sod", "--vm"]
    spec = dict(kv.split("=", 1) for kv in argv[2].split(","))
    assert spec["netns"] == "ns9" and spec["bind-low-ports"] == "yes"
    assert spec["socket"] == str(tmp_path / "s2") and spec["queues"] == "2"
    assert argv[3:] == ["--user", outsource.daemon_user()]
    assert outsource.daemon_user() in ("kbp-sod", "nobody")


def test_accel_and_guest_env() -> None:
    m = qemu.Machine(Path("/k"), Path("/i"), "", accel="kvm")
    assert m.argv()[m.argv().index("-accel") + 1] == "kvm"
    assert qemu.Machine(Path("/k"), Path("/i"), "").argv()[6:8] == [
        "-accel", "tcg,thread=multi"]
    spec = run.RunSpec("6.12-amd64", ["true"], so_ko=Path("/b/kbp_so.ko"),
                       sod=outsource.SodSpec("ns", tap="t0"))
    env = run.guest_env(spec, "k")
    assert env["KBP_SO_KO"] == "/b/kbp_so.ko" and env["KBP_SO_TAP_MAC"] == outsource.TAP_MAC
    assert "KBP_SO_TAP_MAC" not in run.guest_env(
        run.RunSpec("6.12-amd64", ["true"], sod=outsource.SodSpec("ns")), "k")


def test_serve_starts_and_stops_the_daemon(tmp_path: Path) -> None:
    """The real daemon: ready, its files where asked, SIGTERM at the end, RAM file gone."""
    if shutil.which("ip") is None or subprocess.run(["id", "-u"], capture_output=True,
                                                    text=True).stdout.strip() != "0":
        pytest.skip(reason="needs root and iproute2 (a network namespace)")
    ns = f"kbp-vmt-{tmp_path.name[-12:]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        spec = outsource.SodSpec(ns, dir=tmp_path / "sod")
        outsource.check(spec, 64)
        binary = outsource.build_daemon()
        with outsource.serve(spec, binary, 64, 2, tmp_path) as d:
            pid = int((d / "sod.pid").read_text())
            ram = Path((d / "ram.path").read_text())
            assert ram.stat().st_size == 64 << 20
            assert ram.stat().st_mode & 0o777 == 0o600, oct(ram.stat().st_mode)
            # confined: the daemon user, only CAP_NET_BIND_SERVICE, no_new_privs, seccomp
            status = dict(line.split(":\t", 1) for line in
                          Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
            uid = pwd.getpwnam(outsource.daemon_user()).pw_uid
            assert status["Uid"].split() == [str(uid)] * 4, status["Uid"]
            assert int(status["CapEff"], 16) == 1 << 10, status["CapEff"]  # NET_BIND_SERVICE
            assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
            assert Path(f"/proc/{pid}").exists()
            assert outsource.READY in (d / "sod.log").read_text()
        assert not Path(f"/proc/{pid}/cmdline").exists() or \
            b"kbp-sod" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert not ram.exists()
        assert "stopped" in (tmp_path / "sod" / "sod.log").read_text()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
