"""``kbpctl status --trace``: the program, its output parsed into each polling thread's load,
the text, and the refusals.  The real trace over a veth pair with an rt and a non-rt NAPI
thread on one CPU is tests/kbpctl/test_classes.py::test_stock_rt_and_non_rt_on_one_cpu_status.
"""

from __future__ import annotations

import json

import pytest

from kbp import cli, pollertrace
from kbp.backends import PollerLoad
from kbp.render import load_cell

RT, NON_RT, APP = 400, 401, 77

# what bpftrace -f json prints at exit for a run: the rt thread RT woke 5 times, 3 behind the
# non-rt thread (max 90 us), 2 from idle; both polled
OUTPUT = "\n".join(json.dumps(o) for o in [
    {"type": "attached_probes", "data": {"probes": 4}},
    {"type": "printf", "data": "READY\n"},
    {"type": "map", "data": {"@pn": {str(RT): 10, str(NON_RT): 4}}},
    {"type": "map", "data": {"@pw": {str(RT): 12, str(NON_RT): 200}}},
    {"type": "map", "data": {"@px": {str(RT): 2, str(NON_RT): 64}}},
    {"type": "map", "data": {"@pb": {str(RT): 64, str(NON_RT): 64}}},
    {"type": "map", "data": {"@pf": {str(NON_RT): 3}}},
    {"type": "map", "data": {"@wn": {f"{RT},{NON_RT}": 3, f"{RT},0": 2}}},
    {"type": "map", "data": {"@ws": {f"{RT},{NON_RT}": 150_000, f"{RT},0": 4_000}}},
    {"type": "map", "data": {"@wx": {f"{RT},{NON_RT}": 90_000, f"{RT},0": 3_000}}},
    {"type": "map", "data": {"@bc": {str(NON_RT): "napi/eth2-9", "0": "swapper/3"}}},
])


def test_program_traces_polls_of_every_thread_and_waits_of_the_rt_ones() -> None:
    prog = pollertrace.program([RT, NON_RT], [RT])
    assert f"tracepoint:napi:napi_poll /tid == {RT} || tid == {NON_RT}/" in prog
    assert f"sched_waking /(args->pid == {RT}) && @w[args->pid] == 0/" in prog
    # a waking with no switch-in after it is dropped at the thread's next switch-out
    assert "delete(@w[$p])" in prog and prog.startswith('BEGIN { printf("READY\\n"); }')
    assert "sched_switch" not in pollertrace.program([NON_RT], [])


def test_parse_and_apply_fill_each_load() -> None:
    res = pollertrace.parse(OUTPUT)
    assert res.comms == {NON_RT: "napi/eth2-9", 0: "swapper/3"}
    loads = {RT: PollerLoad(), NON_RT: PollerLoad(), APP: PollerLoad()}
    pollertrace.apply(res, loads, [RT], 2.0)
    rt, nrt = loads[RT], loads[NON_RT]
    assert (rt.polls, rt.packets_per_poll, rt.poll_max, rt.full_polls, rt.quota) == (
        10, 1.2, 2, 0, 64)
    assert (nrt.polls, nrt.packets_per_poll, nrt.poll_max, nrt.full_polls) == (4, 50.0, 64, 3)
    assert (rt.traced_wakeups, rt.traced_wait_mean_us, rt.traced_wait_max_us) == (5, 30.8, 90.0)
    assert rt.waited_behind == [
        {"pid": NON_RT, "comm": "napi/eth2-9", "waits": 3, "mean_us": 50.0, "max_us": 90.0},
        {"pid": 0, "comm": "idle", "waits": 2, "mean_us": 2.0, "max_us": 3.0}]
    assert nrt.caused == {"waits": 3, "mean_us": 50.0, "max_us": 90.0}
    assert rt.caused is None and nrt.waited_behind is None
    assert loads[APP].polls is None and loads[APP].traced_s == 2.0
    text = load_cell(nrt)
    assert "50.0 packets per poll over 4 polls, largest 64, 3 took the whole budget 64 " \
           "(traced 2 s)" in text
    assert "rt waits it ended: 3, 50.0 us mean, 90.0 us max (traced 2 s)" in text
    assert "woken 5 times: waited 30.8 us mean, 90.0 us max (traced 2 s), behind " \
           f"napi/eth2-9 ({NON_RT}) 3x max 90.0 us, idle (0) 2x max 3.0 us" in load_cell(rt)


def test_the_module_s_own_poll_counters_win() -> None:
    ld = PollerLoad(packets_per_poll=7.9, quota=8, gave_way=12)
    pollertrace.apply(pollertrace.parse(OUTPUT), {NON_RT: ld}, [], 1.0)
    assert (ld.packets_per_poll, ld.polls, ld.quota) == (7.9, None, 8)
    assert "7.9 packets per poll (quota 8), gave way 12 times" in load_cell(ld)
    assert ld.caused == {"waits": 3, "mean_us": 50.0, "max_us": 90.0}


@pytest.mark.parametrize(("argv", "msg"), [
    (["--trace", "2", "--watch"], "--trace and --watch do not mix"),
    (["--trace", "-1"], "--trace -1: give SECONDS in (0, 600]"),
    (["--trace", "601"], "--trace 601: give SECONDS in (0, 600]"),
])
def test_status_trace_refusals(argv: list[str], msg: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_why_not_bounds() -> None:
    assert pollertrace.why_not(0) == "--trace 0: give SECONDS in (0, 600]"
    assert pollertrace.why_not(601) is not None
