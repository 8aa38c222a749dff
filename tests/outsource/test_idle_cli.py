"""``kbpctl outsource idle`` on the host: the refusal sentences and the parameter writes,
against a stand-in for /sys/module/kbp_so/parameters and /proc/kbp_so (the kernel's side is
tested in the guest: guest_sockets.py's idle scenarios and test_guest_vm.py's short boots)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from kbp import cli
from kbp.errors import InvalidInput, Unavailable
from kbp.outsource import idle

HEAD = ("kbp_so state=attached epoch=1 queues=2 sockets=0 pinned_pages=0 orphan_pages=0 "
        "fallbacks=0 host_timeout_ms=3000 poll_us=0 idle={idle} idle_poll_us={us} irqs=0 "
        "completions_irq=0 completions_polled=0 completions_syscall=0 completions_idle=0 "
        "completions_tick=0 idle_poll_ns=0 idle_halts=0 idle_races=0\n")


def _module(tmp: Path, idle_state: str = "off", us: int = 0) -> tuple[Path, Path]:
    params, proc = tmp / "parameters", tmp / "kbp_so"
    params.mkdir()
    (params / "idle_poll_us").write_text(f"{us}\n")
    proc.write_text(HEAD.format(idle=idle_state, us=us))
    return params, proc


@pytest.mark.parametrize("why,words", [
    ("idle=-boot-option", "booted with idle="),
    ("cpuidle.off", "cpuidle.off=1"),
    ("host-without-need_irq", "does not honour need_irq"),
    ("acpi_idle", "the cpuidle driver 'acpi_idle' holds the slot"),
])
def test_each_refusal_is_said_for_an_operator(why: str, words: str) -> None:
    assert words in idle.explain(errno.EBUSY, f"unavailable:{why}")


def test_no_device_and_unknown_errors() -> None:
    assert idle.explain(errno.ENODEV, "off") == "no kbp-sod device is attached"
    assert idle.explain(errno.EIO, None) == "Input/output error"


def test_current_reads_the_parameter_and_proc(tmp_path: Path) -> None:
    params, proc = _module(tmp_path, "on", 2000)
    assert idle.current(params, proc) == {"idle": "on", "idle_poll_us": 2000}


def test_not_loaded_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="kbp_so is not loaded"):
        idle.current(tmp_path / "nothing", tmp_path / "no-proc")


@pytest.mark.parametrize("us", [-1, 2001])
def test_out_of_range_is_refused_before_any_write(tmp_path: Path, us: int) -> None:
    params, proc = _module(tmp_path)
    with pytest.raises(InvalidInput, match=r"1\.\.2000"):
        idle.set_idle(us, params, proc)
    assert (params / "idle_poll_us").read_text() == "0\n"


def test_set_writes_and_reads_back(tmp_path: Path) -> None:
    params, proc = _module(tmp_path)
    idle.set_idle(150, params, proc)
    assert (params / "idle_poll_us").read_text() == "150"


def test_cli_refuses_a_zero_window(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["outsource", "idle", "--poll-us", "0"]) == 2
    assert "--off turns it off" in capsys.readouterr().err


def test_cli_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["outsource", "idle", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--poll-us 2000" in out and "cpuidle" in out and "--off" in out
