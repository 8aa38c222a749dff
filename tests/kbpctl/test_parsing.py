"""Parsing and validation: CPU lists, requests, CLI arguments, config files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbp import cli, config, names, sysinfo
from kbp.backends import EnableRequest, Periodic, validate_common
from kbp.errors import EXIT_USAGE, InvalidInput

from .conftest import make_host


@pytest.mark.parametrize(("text", "cpus"), [
    ("0", [0]), ("1,3", [1, 3]), ("0-3", [0, 1, 2, 3]), ("2-3,0,7", [0, 2, 3, 7]),
    (" 1 , 1-2 ", [1, 2]), ("", []),
])
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert sysinfo.parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1;2", "1.5"])
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(InvalidInput):
        sysinfo.parse_cpulist(text)


@pytest.mark.parametrize(("cpus", "text"), [
    ([0], "0"), ([0, 1, 2, 5], "0-2,5"), ([3, 1, 2, 2], "1-3"), ([], ""), ([0, 2, 4], "0,2,4"),
])
def test_format_cpulist(cpus: list[int], text: str) -> None:
    assert sysinfo.format_cpulist(cpus) == text
    assert sysinfo.parse_cpulist(text) == sorted(set(cpus))


def test_validate_cpus(tmp_path: Path) -> None:
    host = make_host(tmp_path, online="0-1,3", possible="0-3")
    assert sysinfo.validate_cpus([0, 3], host) == [0, 3]
    with pytest.raises(InvalidInput, match="CPU 9 does not exist"):
        sysinfo.validate_cpus([9], host)
    with pytest.raises(InvalidInput, match=r"CPU 2 is offline .*echo 1 >"):
        sysinfo.validate_cpus([1, 2], host)
    with pytest.raises(InvalidInput, match="empty CPU list"):
        sysinfo.validate_cpus([], host)


@pytest.mark.parametrize(("rel", "ver"), [
    ("6.18.44-fc-v669", (6, 18, 44)), ("6.1.0-56-amd64", (6, 1, 0)), ("5.12", (5, 12, 0)),
    ("weird", (0, 0, 0)),
])
def test_kernel_version(rel: str, ver: tuple[int, int, int]) -> None:
    assert sysinfo.kernel_version(rel) == ver


def req(**kw: object) -> EnableRequest:
    base: dict[str, object] = {"devices": ["eth1"]}
    base.update(kw)
    return EnableRequest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "msg"), [
    ({"rt_prio": 0}, r"priority 0 is out of range.*1\.\.99"),
    ({"rt_prio": 100}, "priority 100 is out of range"),
    ({"mode": "periodic", "linger_us": 10}, "--linger-us applies to --mode hybrid only"),
    ({"mode": "periodic", "freq_ctl": True}, "--freq-ctl applies to --mode hybrid only"),
    ({"periodic": Periodic()}, "apply to --mode periodic only"),
    ({"mode": "periodic", "periodic": Periodic(interval_us=5)},
     r"--interval-us 5 is out of range \(10\.\.100000\)"),
    ({"mode": "periodic", "periodic": Periodic(round_ms=70_000)},
     r"--round-ms 70000 is out of range \(10\.\.60000\)"),
    ({"mode": "periodic", "periodic": Periodic(min_change=0)},
     r"--min-change 0 is out of range \(1\.\.1000 percent\)"),
    ({"mode": "periodic", "periodic": Periodic(max_round=19)},
     r"--max-round 19 is out of range \(20\.\.1000000\)"),
    ({"mode": "periodic", "periodic": Periodic(min_interval_us=500, max_interval_us=200)},
     "search range is empty"),
    ({"mode": "periodic", "periodic": Periodic(objective="speed")}, "unknown objective"),
    ({"mode": "turbo"}, "unknown mode"),
    ({"mode": "busy", "linger_us": 10}, "--linger-us applies to --mode hybrid only"),
    ({"mode": "busy", "freq_ctl": True}, "--freq-ctl applies to --mode hybrid only"),
    ({"linger_us": -1}, "--linger-us -1 is out of range"),
    ({"linger_us": 2_000_000}, "out of range"),
    ({"quota": 0}, "--quota 0 is out of range"),
    ({"quota": 65}, "--quota 65 is out of range"),
    ({"devices": []}, "no device named"),
    ({"devices": ["a", "a"]}, "named twice"),
    ({"devices": ["a/b"]}, "bad device name"),
    ({"devices": ["x" * 16]}, "bad device name"),
])
def test_validate_common_refuses(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(InvalidInput, match=msg):
        validate_common(req(**kw))


def test_validate_common_accepts() -> None:
    validate_common(req(rt_prio=1, linger_us=0))
    validate_common(req(rt_prio=99, mode="busy", quota=64))
    validate_common(req(freq_ctl=True, linger_us=5))


# -- CLI arguments: one line on stderr, exit 2, nothing changed -----------------------
@pytest.mark.parametrize(("argv", "msg"), [
    (["enable", "eth1", "--cpus", "x"], "bad CPU list"),
    (["enable", "eth1", "--rt-prio", "high"], "not a whole number"),
    (["enable", "eth1", "--backend", "ebpf"], "invalid choice"),
    (["enable"], "required"),
    (["frobnicate"], "invalid choice"),
])
def test_cli_argument_errors(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]
                             ) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kbpctl: ") and msg in err


@pytest.mark.parametrize(("argv", "msg"), [
    (["disable", "eth1", "--all"], "not both"),
    (["disable"], "or give --all"),
    (["disable", "--all", "--netns", "x"], "drop --netns"),
    (["enable", "eth1", "--rt-prio", "0"], "out of range"),
    (["enable", "eth1", "--mode", "busy", "--linger-us", "5"], "hybrid only"),
    (["status", "--json", "--watch"], "do not mix"),
])
def test_cli_conflicts(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str],
                       run_dir: Path) -> None:
    assert cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err
    assert not run_dir.exists()  # nothing journaled


def test_cli_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["enable", "--help"], ["disable", "--help"], ["status", "--help"],
                 ["apply", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert "example" in capsys.readouterr().out


# -- config ---------------------------------------------------------------------------
GOOD = """
backend = "stock"
[defaults]
mode = "hybrid"
rt_prio = 60
cpus = "1"
linger_us = 20

[[device]]
name = "eth1"

[[device]]
name = "veth0"
netns = "blue"
cpus = "0-1"
rt_prio = 70
backend = "auto"
"""


def test_config_parse() -> None:
    cfg = config.parse(GOOD)
    assert cfg.backend == "stock"
    a, b = cfg.devices
    assert (a.name, a.netns, a.backend, a.mode, a.cpus, a.rt_prio, a.linger_us) == \
        ("eth1", None, "stock", "hybrid", [1], 60, 20)
    assert (b.name, b.netns, b.backend, b.cpus, b.rt_prio, b.linger_us) == \
        ("veth0", "blue", "auto", [0, 1], 70, 20)
    r = b.request()
    assert r.devices == ["veth0"] and r.netns == "blue" and r.rt_prio == 70


@pytest.mark.parametrize(("text", "msg"), [
    ("backend = 'ebpf'", "unknown backend"),
    ("bakend = 'stock'", "did you mean backend"),
    ("[defaults]\nrt_priority = 5", "did you mean rt_prio"),
    ("[[device]]\nname = 'a'\ncpu = '1'", "did you mean cpus"),
    ("[[device]]\ncpus = '1'", "needs name"),
    ("[[device]]\nname = 'a'\nrt_prio = 'high'", "expected an integer"),
    ("[[device]]\nname = 'a'\nfreq_ctl = 1", "expected true or false"),
    ("[[device]]\nname = 'a'\n[[device]]\nname = 'a'", "listed twice"),
    ("[[device]]\nname = 'a'\ncpus = 'x'", "bad CPU list"),
    ("device = 'a'", "[[device]]"),
    ("this is not toml", "kbp.toml"),
])
def test_config_refuses(text: str, msg: str) -> None:
    with pytest.raises(InvalidInput, match=msg.replace("[", r"\[").replace("]", r"\]")):
        config.parse(text)


def test_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no config file"):
        config.load(tmp_path / "nope.toml")


def test_example_config_parses() -> None:
    from importlib.resources import files
    text = files("kbp").joinpath("data/kbp.toml.example").read_text()
    cfg = config.parse(text)
    assert cfg.devices and all(d.mode in names.MODES for d in cfg.devices)


def test_periodic_cli_knobs_reach_the_request() -> None:
    """The periodic knobs of ``kbpctl enable`` land in the request (defaults filled in),
    refuse a fixed interval together with a search knob, and refuse other modes."""
    parser = cli.build_parser()
    args = parser.parse_args(["enable", "eth1", "--mode", "periodic", "--round-ms", "500",
                              "--max-interval-us", "1000", "--objective", "bytes-per-cpu"])
    p = cli._periodic_args(args)
    assert p == Periodic(round_ms=500, max_interval_us=1000, objective="bytes-per-cpu")
    assert p is not None and p.search
    fixed = cli._periodic_args(parser.parse_args(["enable", "eth1", "--mode", "periodic",
                                                  "--interval-us", "250"]))
    assert fixed is not None and fixed.interval_us == 250 and not fixed.search
    with pytest.raises(InvalidInput, match="--round-ms would do nothing"):
        cli._periodic_args(parser.parse_args(["enable", "eth1", "--mode", "periodic",
                                              "--interval-us", "250", "--round-ms", "100"]))
    with pytest.raises(InvalidInput, match="--interval-us applies to --mode periodic only"):
        cli._periodic_args(parser.parse_args(["enable", "eth1", "--interval-us", "250"]))
    # mode periodic without knobs: the defaults, journaled as such
    req = EnableRequest(devices=["eth1"], mode="periodic").resolved("kmod")
    assert req.periodic == Periodic() and req.settings()["periodic"]["max_interval_us"] == 4000
    assert EnableRequest(devices=["eth1"]).resolved("kmod").settings()["periodic"] is None


def test_periodic_config_keys() -> None:
    cfg = config.parse('[[device]]\nname = "eth1"\nmode = "periodic"\nround_ms = 200\n'
                       'objective = "bytes-per-cpu"\n')
    req = cfg.devices[0].request()
    assert req.periodic == Periodic(round_ms=200, objective="bytes-per-cpu")
    bad = config.parse('[[device]]\nname = "eth1"\nround_ms = 200\n')
    with pytest.raises(InvalidInput, match="round_ms applies to mode periodic only"):
        bad.devices[0].request()


@pytest.mark.parametrize(("argv", "msg"), [
    (["enable", "eth1", "--mode", "periodic", "--interval-us", "5"],
     "--interval-us 5 is out of range (10..100000)"),
    (["enable", "eth1", "--mode", "busy", "--max-round", "50"],
     "--max-round applies to --mode periodic only, not busy"),
])
def test_cli_periodic_refusals(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]
                               ) -> None:
    """Refused with the range or the reason, exit 2, before any system access."""
    assert cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("kbpctl: ") and msg in err
