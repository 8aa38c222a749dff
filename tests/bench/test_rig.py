"""``kbpctl bench vm``: one entry point for the bench's scenarios in a rig guest and the rig's
experiments by name (kbp.bench.rig). What is checked: each name starts the command that runs
it (the experiment's module, where it runs, its QEMU extras, the options passed through),
refusals come before anything starts, and every experiment in vm/experiments has a name."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from kbp import cli as kbpctl
from kbp.bench import rig, scenarios

ROOT = Path(__file__).resolve().parents[2]
BENCH = {n: s.title for n, s in scenarios.all_scenarios().items()}


def _args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    return rig.parser(BENCH).parse_known_args(argv)


def _command(argv: list[str], out: Path = Path("/o")) -> list[str]:
    a, rest = _args(argv)
    return rig.command(a, rest, out, ROOT)


def test_every_experiment_file_has_exactly_one_name() -> None:
    files = {p.stem for p in (ROOT / "vm" / "experiments").glob("*.py") if p.stem != "__init__"}
    named = [e.module for e in rig.EXPERIMENTS.values()]
    assert sorted(named) == sorted(files)
    assert not set(rig.EXPERIMENTS) & set(BENCH), "an experiment hides a bench scenario"


def test_guest_experiment_runs_its_module_in_one_guest_with_the_options_passed_on() -> None:
    cmd = _command(["--scenario", "class-split", "--flavour", "7.2-amd64", "--reps", "3",
                    "--quotas", "1,8"])
    assert cmd[:5] == [sys.executable, "-m", "vm", "run", "7.2-amd64"]
    assert cmd[cmd.index("--out") + 1] == "/o"
    assert cmd[cmd.index("--smp") + 1] == "2" and cmd[cmd.index("--timeout") + 1] == "3600"
    assert f"PYTHONPATH={ROOT / 'src'}" in cmd
    tail = cmd[cmd.index("--") + 1:]
    assert tail == [".venv/bin/python", "-m", "vm.experiments.class_split", "--reps", "3",
                    "--quotas", "1,8"]


def test_a_double_dash_passes_the_experiments_own_help_on() -> None:
    cmd = _command(["--scenario", "freq", "--", "--help"])
    assert cmd[cmd.index("--") + 1:] == [".venv/bin/python", "-m", "vm.experiments.freq_measure",
                                         "--help"]


def test_inversion_gets_its_sub_command_and_the_third_nic() -> None:
    cmd = _command(["--scenario", "inversion", "--flavour", "6.12-rt-amd64", "--seconds", "12"])
    head, tail = cmd[:cmd.index("--")], cmd[cmd.index("--") + 1:]
    assert "--qemu-arg=-netdev" in head and "--qemu-arg=hubport,id=n2,hubid=0" in head
    assert "--qemu-arg=virtio-net-pci,netdev=n2,mac=52:54:00:4b:50:02" in head
    assert tail == [".venv/bin/python", "-m", "vm.experiments.inversion", "run", "--seconds",
                    "12"]


def test_host_experiment_boots_its_own_guests_with_flavour_and_out() -> None:
    cmd = _command(["--scenario", "outsource-scale", "--guests", "1,2"], Path("/r"))
    assert cmd == [sys.executable, "-m", "vm.experiments.outsource_scale", "--flavour",
                   "6.12-amd64", "--out", "/r", "--guests", "1,2"]


@pytest.mark.parametrize("name", ["outsource-rtt", "outsource-scale"])
def test_host_experiments_take_the_flavour_and_out_they_are_given(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The options kbp.bench.rig adds are the experiment's own: its parser accepts them and
    stops only at the one that is not."""
    import importlib
    mod = importlib.import_module(f"vm.experiments.{rig.EXPERIMENTS[name].module}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--flavour", "6.12-amd64", "--out", "/tmp/x", "--no-such-option"])
    assert e.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_bench_scenario_runs_kbp_bench_in_the_guest_with_kbp_ko() -> None:
    cmd = _command(["--scenario", "shared-cpu", "--nic-pair", "--modes", "napi,hybrid-part"])
    script = cmd[-1]
    assert cmd[-3:-1] == ["sh", "-c"]
    assert script.startswith('insmod "$KBP_KO" && modprobe veth && ')
    assert "-m kbp.bench --emulated --scenario shared-cpu --modes napi,hybrid-part" in script
    assert script.endswith('--out "$KBP_OUT" --nic-pair "$KBP_NIC1,$KBP_NIC0"')
    assert "--scenario" not in _command(["--smoke"])[-1]     # the bench's default scenario


@pytest.mark.parametrize(("argv", "text"), [
    (["--scenario", "class-split", "--nic-pair"], "--nic-pair is the bench scenarios'"),
    (["--scenario", "outsource-rtt", "--smp", "4"], "--smp: for one guest"),
    (["--scenario", "outsource-scale", "--smp", "2", "--timeout", "60"],
     "--smp and --timeout: for one guest"),
])
def test_refusals_say_why(argv: list[str], text: str) -> None:
    with pytest.raises(rig.RigError, match=text):
        _command(argv)


def test_kbpctl_bench_vm_refuses_an_unknown_scenario_before_starting_anything(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: started.append(cmd))
    with pytest.raises(SystemExit) as e:
        kbpctl.main(["bench", "vm", "--scenario", "no-such"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown scenario 'no-such'" in err and "class-split" in err and "shared-cpu" in err
    assert started == []
    assert kbpctl.main(["bench", "vm", "--scenario", "class-split", "--nic-pair"]) == 2
    assert "--nic-pair is the bench scenarios'" in capsys.readouterr().err
    assert started == []


def test_kbpctl_bench_vm_starts_the_command_from_the_checkout(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict = {}

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
        seen.update(cmd=cmd, **kw)
        return subprocess.CompletedProcess(cmd, 3)
    monkeypatch.setattr(subprocess, "run", fake_run)
    out = tmp_path / "res"
    assert kbpctl.main(["bench", "vm", "--scenario", "outsource-rtt", "--out", str(out),
                        "--reps", "2"]) == 3          # the experiment's exit status
    assert seen["cwd"] == ROOT and out.is_dir()
    assert seen["cmd"][1:4] == ["-m", "vm.experiments.outsource_rtt", "--flavour"]


def test_help_lists_every_scenario_and_experiment(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        kbpctl.main(["bench", "vm", "--help"])
    text = capsys.readouterr().out
    for name in [*BENCH, *rig.EXPERIMENTS]:
        assert f"  {name} " in text
