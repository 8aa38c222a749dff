"""/proc/kbp_so's completion counters (issue 28 item 3): parsed by kbp.outsource.procfile, and
shown by ``kbpctl status`` (its ``outsource`` section and JSON object) with what they add up
to.  No root, no namespaces: the file is written by the test under a fake /proc
(:class:`kbp.sysinfo.Host`, the way status's readers are pointed at one)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kbp import backends
from kbp.backends import Status
from kbp.outsource import policy, procfile
from kbp.sysinfo import FreqReport, Host
from kbp.system.journal import StateDir

OLD_HEAD = ("kbp_so state=attached epoch=1 queues=2 sockets=2 pinned_pages=0 orphan_pages=0 "
            "fallbacks=0 host_timeout_ms=3000")
NEW_KEYS = ("poll_us=20 idle=on idle_poll_us=50 irqs=40 completions_irq=40 "
            "completions_polled=300 completions_syscall=100 completions_idle=500 "
            "completions_tick=60 idle_poll_ns=123456789 idle_halts=7 idle_races=2")
NEW_HEAD = f"{OLD_HEAD} {NEW_KEYS}"
SOCK = ("sock ino=12345 uid=0 family=inet local=127.0.0.1:5000 remote=- requests=10 "
        "completions=10 bytes_out=100 bytes_in=100 copies=20 fallbacks=0 errors=0")
OLD_COUNTERS = {"epoch": 1, "queues": 2, "sockets": 2, "pinned_pages": 0, "orphan_pages": 0,
                "fallbacks": 0, "host_timeout_ms": 3000}
NEW_COUNTERS = {"poll_us": 20, "idle_poll_us": 50, "irqs": 40, "completions_irq": 40,
                "completions_polled": 300, "completions_syscall": 100,
                "completions_idle": 500, "completions_tick": 60, "idle_poll_ns": 123456789,
                "idle_halts": 7, "idle_races": 2}


def fake_host(tmp_path: Path, text: str | None) -> Host:
    """A /proc holding only kbp_so (``text``; None: no such file, the module not loaded)."""
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    if text is not None:
        (proc / "kbp_so").write_text(text)
    return Host(proc=proc, sys=tmp_path / "sys")


# -- parsing --------------------------------------------------------------------------------
def test_header_with_the_new_keys() -> None:
    m = procfile.parse(f"{NEW_HEAD} next_thing=x\n{SOCK}\n")
    assert m.counters == {**OLD_COUNTERS, **NEW_COUNTERS}
    assert m.text == {"idle": "on"}
    assert m.extra == {"next_thing": "x"}        # unknown keys kept, as text
    j = m.to_json()
    assert j["idle"] == "on" and j["completions_idle"] == 500 and j["next_thing"] == "x"
    assert j["socks"][0]["completions"] == 10     # the socket's own counter, untouched


def test_header_without_the_new_keys() -> None:
    m = procfile.parse(f"{OLD_HEAD}\n{SOCK}\n")
    assert m.counters == OLD_COUNTERS and m.text == {} and m.extra == {}
    s = procfile.summary(m)
    assert not set(NEW_COUNTERS) & set(s) and "idle" not in s
    assert (s["completions"], s["irqs_per_completion"]) == (None, None)
    assert s["share"] == {"idle": None, "syscall": None, "irq": None, "tick": None}


@pytest.mark.parametrize("idle", ["off", "unavailable:no-haltpoll-driver"])
def test_idle_is_text(idle: str) -> None:
    m = procfile.parse(f"{OLD_HEAD} idle={idle} irqs=0\n")
    assert m.text == {"idle": idle} and m.counters["irqs"] == 0
    assert procfile.summary(m)["idle"] == idle


def test_a_new_counter_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(procfile.ProcFormatError, match="completions_tick is not a number"):
        procfile.parse(f"{OLD_HEAD} completions_tick=many\n")


# -- derived values -------------------------------------------------------------------------
def test_derived_values() -> None:
    s = procfile.summary(procfile.parse(NEW_HEAD))
    assert s["completions"] == 1000
    assert s["irqs_per_completion"] == pytest.approx(0.04)
    assert s["share"] == pytest.approx({"idle": 0.5, "syscall": 0.4, "irq": 0.04,
                                        "tick": 0.06})


def test_derived_values_at_zero_completions() -> None:
    zero = " ".join(f"{k}=0" for k in procfile.COMPLETION_SOURCES)
    s = procfile.summary(procfile.parse(f"{OLD_HEAD} irqs=5 {zero}\n"))
    assert s["completions"] == 0 and s["irqs"] == 5
    assert s["irqs_per_completion"] is None
    assert s["share"] == {"idle": None, "syscall": None, "irq": None, "tick": None}


def test_derived_values_from_a_module_with_some_sources_only() -> None:
    s = procfile.summary(procfile.parse(f"{OLD_HEAD} completions_irq=1 completions_polled=3\n"))
    assert s["completions"] == 4 and s["irqs_per_completion"] is None    # no irqs=
    assert s["share"] == {"idle": None, "syscall": 0.75, "irq": 0.25, "tick": None}


# -- kbpctl status --json ---------------------------------------------------------------------
def test_status_json_has_the_outsource_object(tmp_path: Path) -> None:
    host = fake_host(tmp_path, f"{NEW_HEAD}\n{SOCK}\n")
    st = backends.status(state=StateDir(tmp_path / "run"), host=host)
    o = json.loads(json.dumps(st.to_json()))["outsource"]
    assert o == {"state": "attached", "idle": "on", **OLD_COUNTERS, **NEW_COUNTERS,
                 "completions": 1000, "irqs_per_completion": pytest.approx(0.04),
                 "share": pytest.approx({"idle": 0.5, "syscall": 0.4, "irq": 0.04,
                                         "tick": 0.06})}


def test_status_json_without_the_module_is_null(tmp_path: Path) -> None:
    st = backends.status(state=StateDir(tmp_path / "run"), host=fake_host(tmp_path, None))
    js = st.to_json()
    assert "outsource" in js and js["outsource"] is None


def test_status_goes_on_when_the_file_does_not_parse(tmp_path: Path) -> None:
    o = backends.outsource_status(fake_host(tmp_path, "kbp_so epoch=1\n"))
    assert o is not None and o["error"].startswith("cannot read ")
    assert "no state=" in o["error"]
    assert "socket outsourcing (kbp_so): cannot read" in render(a_status(o))


def test_kbpctl_status_json_on_this_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from kbp import cli
    monkeypatch.setenv("KBP_RUN_DIR", str(tmp_path / "run"))
    assert cli.main(["status", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    if Path("/proc/kbp_so").exists():   # a guest with the module: the object
        assert js["outsource"]["state"] in procfile.STATES
    else:
        assert js["outsource"] is None


def test_outsource_status_keeps_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBP_RUN_DIR", str(tmp_path / "run"))
    fake = tmp_path / "kbp_so"
    fake.write_text(f"{NEW_HEAD}\n")
    monkeypatch.setattr(procfile, "PROC_PATH", fake)
    m = policy.status()["module"]
    assert m == {"state": "attached", **OLD_COUNTERS, **NEW_COUNTERS, "idle": "on"}


# -- the rich view --------------------------------------------------------------------------
def a_status(outsource: dict[str, object] | None) -> Status:
    return Status(kernel="6.12.0", auto="stock", backends={}, devices=[], pollers=[],
                  cpufreq=FreqReport(False, [], "no cpufreq"), outsource=outsource)


def render(st: Status) -> str:
    from rich.console import Console

    from kbp.render import status_view
    with open(os.devnull, "w") as null:
        con = Console(width=250, record=True, file=null)
        con.print(status_view(st))
        return con.export_text()


def test_rich_view_names_every_counter(tmp_path: Path) -> None:
    o = backends.outsource_status(fake_host(tmp_path, f"{NEW_HEAD} next_thing=x\n"))
    text = render(a_status(o))
    assert "socket outsourcing (kbp_so): state attached, idle on (idle_poll_us 50), " \
        "poll_us 20" in text
    for k, v in {**OLD_COUNTERS, **NEW_COUNTERS}.items():
        if k not in ("poll_us", "idle_poll_us"):
            assert f"{k}={v}" in text, k
    assert "next_thing=x" in text
    assert "completions 1000: found by idle 50.0%, syscall 40.0%, irq 4.0%, tick 6.0%" in text
    assert "irqs_per_completion 0.040" in text


def test_rich_view_without_the_module_has_no_section() -> None:
    assert "socket outsourcing" not in render(a_status(None))


def test_rich_view_of_an_older_module() -> None:
    text = render(a_status(procfile.summary(procfile.parse(OLD_HEAD))))
    assert "socket outsourcing (kbp_so): state attached, idle -" in text
    assert "host_timeout_ms=3000" in text and "completions " not in text
