"""The benchmark's tracer and tracefs handling on every exit path (issue 9): a bpftrace
interrupted while it loads is reaped, tracefs is unmounted only after its tracers exited,
and a tracefs that stays busy is reported, not dropped.

The TraceFs tests mount a tracefs instance of their own on a temporary directory (tracefs can
be mounted more than once), so /sys/kernel/tracing is never touched.

The RT flow's own ``xmit_to_poll`` (issue 38, item 2) without root or bpftrace: the program
:func:`kbp.bench.trace.program` generates is run by :func:`simulate` (a reading of the few
bpftrace constructs the program uses, in Python) on synthetic tracepoint events, and what it
prints goes through :func:`kbp.bench.trace.parse` and :func:`kbp.bench.trace.xmit_to_poll`,
as in a run: the RT device's NAPI against a heavy device's, a stale transmit, a transmit on
another device.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kbp.bench import trace


def _mounted(path: Path) -> bool:
    return (path / "events").is_dir()


@pytest.fixture
def own_tracefs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip(reason="mounting tracefs needs root")
    mnt = tmp_path / "tracing"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tracefs", "nodev", str(mnt)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(reason=f"cannot mount tracefs here: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        if _mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _holder(cwd: Path) -> subprocess.Popen[str]:
    """A process that keeps ``cwd`` busy, started like bpftrace (own session, pipes)."""
    return subprocess.Popen(["sleep", "60"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_close_waits_for_tracers_then_unmounts(own_tracefs: Path) -> None:
    tfs = trace.TraceFs(path=own_tracefs, mounted_by_us=True)
    kt = tfs.track(trace.KernelTrace())
    kt.proc = _holder(own_tracefs / "events")
    assert trace.umount(own_tracefs) == errno.EBUSY      # really held
    proc = kt.proc
    tfs.close()
    assert proc.returncode is not None          # killed and reaped
    assert kt.proc is None and tfs.tracers == []
    assert not _mounted(own_tracefs) and not tfs.mounted_by_us


def test_close_reports_a_mount_it_cannot_restore(own_tracefs: Path) -> None:
    other = _holder(own_tracefs)                # not a tracer of ours: close() cannot stop it
    try:
        tfs = trace.TraceFs(path=own_tracefs, mounted_by_us=True, busy_timeout=0.3)
        with pytest.raises(trace.TraceFsError, match=r"Device or resource busy.*held by sleep"):
            tfs.close()
        assert _mounted(own_tracefs) and tfs.mounted_by_us   # still to do, still reported
    finally:
        other.kill()
        other.wait()
    tfs.close()                                  # once the holder is gone it succeeds
    assert not _mounted(own_tracefs)


def test_close_leaves_a_mount_it_did_not_make(own_tracefs: Path) -> None:
    tfs = trace.TraceFs(path=own_tracefs)
    tfs.ensure()                                 # already mounted: not ours
    assert not tfs.mounted_by_us
    tfs.close()
    assert _mounted(own_tracefs)


def test_start_interrupted_while_loading_reaps_bpftrace(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """Ctrl-C while bpftrace loads (before READY): the tracer must not be left running."""
    started: list[subprocess.Popen[str]] = []

    def fake_start(_argv: Sequence[str], _ns: str | None = None, **_kw: Any,
                   ) -> subprocess.Popen[str]:
        p = _holder(tmp_path)                  # never prints READY
        started.append(p)
        return p

    def interrupt(_sig: int, _frm: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(trace.access, "popen", fake_start)
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        kt = trace.KernelTrace()
        with pytest.raises(KeyboardInterrupt):
            kt.start(timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    (p,) = started
    try:
        assert p.returncode is not None, "bpftrace left running after Ctrl-C"
        assert kt.proc is None
    finally:
        if p.returncode is None:
            p.kill()
            p.wait()



# -- the RT flow's own xmit_to_poll (issue 38, item 2) ----------------------------------------
XMIT = "tracepoint:net:net_dev_start_xmit"
GRO = "tracepoint:net:napi_gro_receive_entry"
RT_TX, RT_RX = "rt-c-ab12", "rt-s-ab12"          # the tester's end, the RT server's end
HEAVY_TX, HEAVY_RX = "heavy-c-ab12", "heavy-s-ab12"
RT_NAPI, HEAVY_NAPI = 8195, 263
MS = 1_000_000
T0 = 10_000 * MS              # nsecs when the run starts (never 0: @x's 0 is "no entry")

Event = tuple[int, str, dict[str, Any], str]      # (nsecs, probe, args, comm)


def xmit(t: int, dev: str, skb: int, comm: str = "kbp-rtt") -> Event:
    """A transmit on ``dev`` ``t`` ns into the run (made while ``comm`` runs)."""
    return (T0 + t, XMIT, {"name": dev, "skbaddr": skb}, comm)


def gro(t: int, dev: str, napi_id: int, skb: int, comm: str = "swapper/1") -> Event:
    """NAPI ``napi_id`` of ``dev`` hands ``skb`` to GRO ``t`` ns into the run."""
    return (T0 + t, GRO, {"name": dev, "napi_id": napi_id, "skbaddr": skb}, comm)


def _names(e: str) -> str:
    e = re.sub(r"str\(args->(\w+)\)", r'A["\1"]', e)
    e = re.sub(r"args->(\w+)", r'A["\1"]', e)
    e = re.sub(r"\$(\w+)", r"V_\1", e)
    e = re.sub(r"\bnsecs\b", "T", e)
    e = re.sub(r"\bcomm\b", "COMM", e)
    e = re.sub(r"\bcpu\b", "CPU", e)
    return e.replace("||", " or ").replace("&&", " and ")


def _expr(e: str) -> str:
    """A bpftrace expression of the generated program as Python (a map's missing key reads
    as 0, ``/`` is integer division)."""
    e = e.replace("/", "//")
    e = re.sub(r"@(\w+)\[([^\]]*)\]", lambda m: f'M["{m[1]}"].get(({_names(m[2])},), 0)', e)
    return _names(e)


def _statement(st: str) -> str:
    st = st.strip()
    if st.startswith(("printf(", "clear(")):
        return "pass"
    m = re.fullmatch(r"delete\(@(\w+)\[(.*)\]\)", st)
    if m:
        return f'M["{m[1]}"].pop(({_expr(m[2])},), None)'
    m = re.fullmatch(r"@(\w+)\[(.*)\]\s*=\s*(.*)", st)
    if m:
        key, val = f"({_expr(m[2])},)", m[3].strip()
        agg = re.fullmatch(r"(count|max|sum)\((.*)\)", val)
        if agg is None:
            return f'M["{m[1]}"][{key}] = {_expr(val)}'
        old = f'M["{m[1]}"].get({key})'
        new = {"count": f"({old} or 0) + 1", "sum": f"({old} or 0) + ({_expr(agg[2])})",
               "max": f"max(x for x in ({old}, {_expr(agg[2])}) if x is not None)"}[agg[1]]
        return f'M["{m[1]}"][{key}] = {new}'
    m = re.fullmatch(r"\$(\w+)\s*=\s*(.*)", st)
    if m:
        return f"V_{m[1]} = {_expr(m[2])}"
    raise ValueError(f"statement the simulator does not know: {st!r}")


def _body(src: str) -> list[str]:
    """Python lines (indented) of a probe's body: statements, if / else blocks."""
    lines: list[str] = []
    depth, i, stmt = 1, 0, ""
    while i < len(src):
        m = re.match(r"\s*if\s*\((.*?)\)\s*\{", src[i:])
        if m and not stmt.strip():
            lines.append("    " * depth + f"if {_expr(m[1])}:")
            depth, i = depth + 1, i + m.end()
            continue
        m = re.match(r"\s*\}\s*else\s*\{", src[i:])
        if m:
            if stmt.strip():
                lines.append("    " * depth + _statement(stmt))
            stmt = ""
            lines.append("    " * (depth - 1) + "else:")
            i += m.end()
            continue
        c = src[i]
        if c in ";}":
            if stmt.strip():
                lines.append("    " * depth + _statement(stmt))
            stmt = ""
            if c == "}":
                depth -= 1
        else:
            stmt += c
        i += 1
    return lines


def _probes(program: str) -> list[tuple[str, str]]:
    """(header, body) of each probe: the body is what its outer braces hold."""
    out: list[tuple[str, str]] = []
    depth, head, body = 0, "", ""
    for c in program:
        if depth == 0:
            if c == "{":
                depth = 1
            else:
                head += c
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth == 0:
            out.append((head, body))
            head = body = ""
        else:
            body += c
    return out


def simulate(program: str, events: Sequence[Event]) -> str:
    """Run ``program`` on ``events`` the way bpftrace would, and print its maps at exit as
    ``bpftrace -f json`` does (one JSON object a map; maps END clears are not printed)."""
    probes: list[tuple[str, str | None, Any]] = []
    for head, body in _probes(program):
        m = re.fullmatch(r"(\S+)\s*(?:/(.*)/)?", head.strip(), flags=re.S)
        assert m is not None, head
        name, pred = m[1], m[2]
        lines = ["def probe(A, T, COMM, CPU, M):", "    V_d = V_b = 0", *_body(body + "}")]
        if pred:
            lines.insert(2, f"    if not ({_expr(pred)}): return")
        ns: dict[str, Any] = {}
        exec("\n".join(lines), ns)         # the test's own translation of the program
        probes.append((name, pred, ns["probe"]))
    maps: dict[str, dict[tuple[Any, ...], int]] = defaultdict(dict)
    for t, probe, args, comm in events:
        for name, _pred, fn in probes:
            if name == probe:
                fn(args, t, comm, 0, maps)
    cleared = set(re.findall(r"clear\(@(\w+)\)", program))
    out = []
    for name, entries in maps.items():
        if name in cleared or not entries:
            continue
        data = {",".join(str(k) for k in key): v for key, v in entries.items()}
        out.append(json.dumps({"type": "map", "data": {f"@{name}": data}}))
    return "\n".join(out) + "\n"


def _rt_flow(events: Sequence[Event], napi_ids: Sequence[int] = (RT_NAPI,),
             ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The RT flow's xmit_to_poll and its matching counts, as a run records them."""
    kt = trace.KernelTrace(tx_dev=RT_TX, rx_dev=RT_RX, rt_napi_ids=napi_ids)
    return kt.xmit_record(trace.parse(simulate(kt.program(), events)))


def test_xmit_to_poll_is_the_rt_napis_only() -> None:
    """The -part modes' review: the heavy device's NAPI (263) had 50x the RT flow's matches
    and was reported as the RT flow's.  Heavy transmits made while the tester is the running
    task (comm kbp-rtt) and polled by the heavy NAPI must not count."""
    ev: list[Event] = []
    for i in range(3):                            # the RT flow: 5, 7, 9 us
        ev += [xmit(i * MS, RT_TX, 0x1000 + i), gro(i * MS + 5_000 + 2_000 * i, RT_RX,
                                                      RT_NAPI, 0x1000 + i)]
    for i in range(150):                          # the flood, 1 ms each, under comm kbp-rtt
        ev += [xmit(i * 10_000, HEAVY_TX, 0x9000 + i),
               gro(i * 10_000 + MS, HEAVY_RX, HEAVY_NAPI, 0x9000 + i)]
    xs, match = _rt_flow(sorted(ev, key=lambda e: e[0]))
    assert xs is not None and xs["n"] == 3 and xs["max"] == 9_000
    assert match["napi_ids"] == [RT_NAPI] and set(match["per_napi"]) == {str(RT_NAPI)}
    assert (match["xmits"], match["matched"], match["stale"], match["foreign"],
            match["unmatched"]) == (3, 3, 0, 0, 0)


def test_parse_keys_on_the_rt_napi_not_the_busiest() -> None:
    """bpftrace output with two NAPIs' histograms (what the comm-filtered program printed):
    only the RT NAPI's samples are the RT flow's; the other NAPI's are counted as foreign."""
    out = "\n".join(json.dumps({"type": "map", "data": d}) for d in (
        {"@h": {f"0,{HEAVY_NAPI},1000000": 400_000, f"0,{RT_NAPI},5000": 7_000,
                f"0,{RT_NAPI},9000": 40}},
        {"@mx": {f"0,{HEAVY_NAPI}": 2_900_000_000, f"0,{RT_NAPI}": 9_050}},
        {"@sm": {f"0,{HEAVY_NAPI}": 400_000 * 1_000_000,
                 f"0,{RT_NAPI}": 7_000 * 5_000 + 40 * 9_000}}))
    xs, match = trace.xmit_to_poll(trace.parse(out), [RT_NAPI])
    assert xs is not None and xs["n"] == 7_040 and xs["max"] == 9_050
    assert match["matched"] == 7_040 and match["foreign"] == 400_000
    assert match["foreign_napis"] == {str(HEAVY_NAPI): 400_000}
    assert match["xmits"] is None and match["unmatched"] is None   # no @xn: not counted


def test_a_stale_xmit_does_not_match() -> None:
    """An RT transmit whose skb address turns up at the RT NAPI more than the bound later
    (2.9 s: the review's max) is dropped as stale, not reported as a 2.9 s delay; a fresh one
    beside it still counts."""
    ev = [xmit(0, RT_TX, 0xA), xmit(MS, RT_TX, 0xB), gro(MS + 8_000, RT_RX, RT_NAPI, 0xB),
          gro(2_900 * MS, RT_RX, RT_NAPI, 0xA)]
    xs, match = _rt_flow(ev)
    assert xs is not None and xs["n"] == 1 and xs["max"] == 8_000
    assert (match["matched"], match["stale"], match["unmatched"]) == (1, 1, 0)
    assert match["stale_ns"] == trace.STALE_NS < 2_900 * MS
    # the entry is consumed: the same address once more is no match at all
    ev.append(gro(2_901 * MS, RT_RX, RT_NAPI, 0xA))
    _xs, again = _rt_flow(ev)
    assert (again["matched"], again["stale"]) == (1, 1)


def test_a_transmit_on_another_device_is_not_matched() -> None:
    """The tester is the running task (comm kbp-rtt) while a packet goes out on the heavy
    device, and that skb's address later reaches the RT NAPI: no match (the xmit side is the
    RT client device's, whoever sends); an RT skb whose address first turns up at another
    NAPI is foreign, not a sample."""
    ev = [xmit(0, HEAVY_TX, 0xC), gro(20_000, RT_RX, RT_NAPI, 0xC),
          xmit(MS, RT_TX, 0xD), gro(MS + 30_000, HEAVY_RX, HEAVY_NAPI, 0xD)]
    xs, match = _rt_flow(ev)
    assert xs is None
    assert (match["xmits"], match["matched"], match["stale"], match["foreign"]) == (1, 0, 0, 1)
    assert match["foreign_napis"] == {str(HEAVY_NAPI): 1}


def test_keyed_by_the_rx_device_without_napi_ids() -> None:
    """No napi-get (before 6.9: the 6.1 guest) or no NAPI listed: the receive side is keyed
    on the RT server device's name instead, and the record says so."""
    ev = [xmit(0, RT_TX, 0xE), gro(6_000, RT_RX, 77, 0xE),
          xmit(MS, RT_TX, 0xF), gro(MS + 9_000, HEAVY_RX, HEAVY_NAPI, 0xF)]
    xs, match = _rt_flow(ev, napi_ids=[])
    assert xs is not None and xs["n"] == 1 and xs["max"] == 6_000
    assert match["keyed_by"] == "rx_dev" and match["napi_ids"] == []
    assert (match["tx_dev"], match["rx_dev"]) == (RT_TX, RT_RX)
    assert match["foreign_napis"] == {str(HEAVY_NAPI): 1}
    prog = trace.program(tx_dev=RT_TX, rx_dev=RT_RX)
    assert "args->napi_id ==" not in prog and "comm" not in prog
    assert _rt_flow([])[1]["keyed_by"] == "napi_id"


def test_program_refuses_a_device_name_it_cannot_quote() -> None:
    with pytest.raises(ValueError, match="device name"):
        trace.program(tx_dev='x" || 1 == 1 || "', rx_dev=RT_RX)
    bare = trace.program()
    assert "net_dev_start_xmit" not in bare and "napi_gro_receive_entry" not in bare


def test_a_run_records_why_xmit_to_poll_is_missing() -> None:
    """Over a NIC pair the RT flow's transmit and poll are different skbs: not traced, and
    the record says why; a trace that saw none of the tester's transmits says so too."""
    from kbp.bench.measure import latency
    xs, match = latency.xmit_match(trace.KernelTrace(), {}, {"sent": 10})
    assert xs is None and "--nic-pair" in match["skipped"]
    kt = trace.KernelTrace(tx_dev=RT_TX, rx_dev=RT_RX, rt_napi_ids=[RT_NAPI])
    _xs, match = latency.xmit_match(kt, trace.parse(simulate(kt.program(), [])),
                                    {"sent": 10, "warmup_sent": 2})
    assert "sent 12 requests" in match["problem"] and RT_TX in match["problem"]
    _xs, match = latency.xmit_match(kt, trace.parse(simulate(kt.program(), [
        xmit(0, RT_TX, 0x1), gro(4_000, RT_RX, RT_NAPI, 0x1)])), {"sent": 1})
    assert "problem" not in match and match["matched"] == 1
