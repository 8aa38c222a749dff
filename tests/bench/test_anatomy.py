"""--anatomy without a kernel: the bpftrace program's keys, the parsing of its lines (a real
capture from this host and synthetic ones), the segments, the meanwhile counters, a run's
record, the pooled summary, the report section and the plot."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kbp.bench import anatomy, report, trace
from kbp.bench.anatomy import COUNTERS, N_COUNTERS, SEGMENTS, STATE

DATA = Path(__file__).parent / "data" / "anatomy-napi-flood.jsonl"
RT_CPU = 1


def tag(seq: int) -> int:
    """What the X probe prints for sockperf sequence number ``seq``."""
    return int.from_bytes(seq.to_bytes(8, "big"), "little") + 1


def counters(**kw: float) -> list[int]:
    vals = [0] * (N_COUNTERS + len(STATE))
    for k, v in kw.items():
        if k in COUNTERS:
            vals[COUNTERS.index(k)] = int(v)
        else:
            vals[N_COUNTERS + STATE.index(k)] = int(v)
    return vals


def ka(*fields: object) -> str:
    return "KA " + " ".join(str(f) for f in fields)


def one_request(seq: int, x: int, *, app_tid: int = 77, gro_merged: bool = False,
                no_d: bool = False, x_snap: list[int] | None = None,
                v_snap: list[int] | None = None) -> list[str]:
    """The lines of one request whose events are 10 µs apart from X (ns): G polled in a
    poller that switched in 2 µs after X, R 5 µs after that poller's start, D, the app
    switched in at D + 4 µs, V, Y, Z."""
    t = tag(seq)
    lines = [ka("X", t, x, 0, *(x_snap or counters())),
             ka("G", t, x + 10_000, RT_CPU, 4711, anatomy.CTX_POLLER, x + 2_000, x + 1_000)]
    if not gro_merged:
        lines.append(ka("R", t, x + 20_000, RT_CPU, anatomy.CTX_POLLER, x + 2_000))
        if not no_d:
            lines.append(ka("D", t, x + 30_000, RT_CPU))
    lines += [ka("V", app_tid, x + 50_000, RT_CPU, x + 34_000, x + 31_000,
                 *(v_snap or counters())),
              ka("Y", t, x + 60_000, RT_CPU, app_tid),
              ka("Z", t, x + 70_000, 0)]
    return lines


def as_json(lines: list[str]) -> str:
    return "\n".join(json.dumps({"type": "printf", "data": ln + "\n"}) for ln in lines)


def test_tags_carry_the_sockperf_sequence_number() -> None:
    for seq in (0, 1, 255, 256, 2**40 + 3):
        assert anatomy.seq_of(tag(seq)) == seq
    with pytest.raises(ValueError):
        anatomy.seq_of(0)                 # a map read as absent: no request
    assert anatomy.port_be(11111) == 26411     # 0x2b67 in network order, read little-endian
    with pytest.raises(ValueError):
        anatomy.port_be(0)


def test_probes_key_on_the_devices_port_cpu_and_roles() -> None:
    spec = anatomy.Spec("rt-c-1", "rt-s-1", 11111, 3, (4711, 4712),
                        {100: "app", 200: "poller", 300: "heavy_receiver", 9: "ksoftirqd"})
    prog = "\n".join(anatomy.probes(spec))
    assert '$nm == "rt-c-1" && $dport == 26411' in prog       # X: requests on the client
    assert '$nm == "rt-s-1" && $sport == 26411' in prog       # Y: replies on the server
    assert "cpu == 3" in prog
    # one program per tracepoint: each one costs every packet, the flood's too
    heads = [p.split("{")[0].split("/")[0].strip() for p in anatomy.probes(spec)]
    assert len(heads) == len(set(heads)), heads
    assert "$n->napi_id == 4711 || $n->napi_id == 4712" in prog
    assert "if ($q == 100) { $k = 1; }" in prog and "if ($q == 300) { $k = 4; }" in prog
    assert "if ($q == 9) { $k = 6; }" in prog
    assert "(tid == 100 || pid == 100)" in prog            # the app's recvfrom()
    # without napi ids the RT NAPIs are the server device's by name
    by_name = "\n".join(anatomy.probes(anatomy.Spec("a", "b", 1, 0)))
    assert '$n->dev->name == "b"' in by_name
    # one program with the delays' probes; END clears the anatomy's state maps
    full = trace.program([200], [100], tx_dev="rt-c-1", rx_dev="rt-s-1",
                         extra=anatomy.probes(spec), extra_clears=anatomy.cleared(spec))
    assert full.count("tracepoint:net:net_dev_start_xmit") == 2    # xmit_to_poll's + ours
    assert "clear(@rq);" in full and "clear(@c);" in full and "clear(@hw)" not in full
    assert "clear(@rp);" in full
    assert "irq_handler_entry" not in full and "@ir" not in full    # veth: no interrupt


def test_over_nic_ports_the_received_packets_say_which_request() -> None:
    """--nic-pair: the server's skb is not the tester's, so X records no skb; G reads the
    sequence number from what the server port's NAPIs received (at data, within the linear
    part), Z from what the tester port's received, and I is the server's receive IRQs."""
    spec = anatomy.Spec("eth1", "eth0", 11111, 1, (8194,), {100: "app"}, wire=True,
                        rx_irqs=(25, 28), tx_napi_ids=(8193,))
    progs = anatomy.probes(spec)
    prog = "\n".join(progs)
    xmit = next(p for p in progs if p.startswith("tracepoint:net:net_dev_start_xmit"))
    assert "@rq" not in xmit and "@rs" not in xmit and "@rp" not in xmit
    gro = next(p for p in progs if p.startswith("tracepoint:net:napi_gro_receive_entry"))
    assert "if ($id == 8194) {" in gro and "if ($id == 8193) {" in gro
    assert "$p = $skb->data; $room = $skb->len - $skb->data_len;" in gro
    assert "$dport == 26411 && $tag != 0" in gro and "$sport == 26411 && $tag != 0" in gro
    assert "@rq[$a] = $tag;" in gro and "@ir[0]" in gro
    rx = next(p for p in progs if p.startswith("tracepoint:net:netif_rx"))
    assert 'str(args->name) == "eth0"' in rx and 'str(args->name) == "eth1"' in rx
    assert "tracepoint:irq:irq_handler_entry /args->irq == 25 || args->irq == 28/" in prog
    assert set(anatomy.cleared(spec)) & {"@rs", "@rp"} == set()
    # no napi ids (before 6.9): the ports by name
    named = "\n".join(anatomy.probes(anatomy.Spec("eth1", "eth0", 1, 0, wire=True)))
    assert 'if (str(args->name) == "eth0") {' in named
    assert 'if (str(args->name) == "eth1") {' in named
    # no receive IRQs known: no I, and no probe on every hardIRQ for it
    assert "irq_handler_entry" not in named and "@ir" not in named
    with pytest.raises(ValueError):
        anatomy.Spec("a", "b", 1, 0, rx_irqs=(3,))     # IRQs key the NIC ports' probes only


@pytest.mark.parametrize("bad", [{"tx_dev": "a b"}, {"rx_dev": 'x"; system("id'},
                                 {"port": 70000}, {"roles": {5: "boss"}},
                                 {"roles": {0: "app"}}])
def test_spec_refuses_what_cannot_go_into_the_program(bad: dict[str, object]) -> None:
    args: dict[str, object] = {"tx_dev": "a", "rx_dev": "b", "port": 1, "rt_cpu": 0}
    args.update(bad)
    with pytest.raises(ValueError):
        anatomy.Spec(**args)  # type: ignore[arg-type]


def test_segments_add_up_and_each_says_what_it_measured() -> None:
    x = 1_000_000_000
    reqs = anatomy.parse(as_json(one_request(5, x)))
    q = reqs[5]
    assert q.complete() and q.in_order()
    seg = q.segments()
    assert list(seg) == list(SEGMENTS)
    assert sum(seg.values()) == 70_000                       # Z - X
    assert seg == {"wire": 0, "poll_wait": 2_000, "poll": 8_000, "stack_wait": 0,
                   "stack_queue": 10_000, "stack": 10_000, "app_wake": 4_000, "app_recv": 16_000,
                   "app_reply": 10_000, "reply": 10_000}


@pytest.mark.parametrize(("irq", "wire"), [(1_500, 1_500), (-5, 0), (3_000, 0), (None, 0)])
def test_the_server_ports_interrupt_splits_the_wait_for_the_poll(irq: int | None,
                                                                 wire: int) -> None:
    """G's I between X and the poll's start (2 µs after X) cuts poll_wait into the wire's
    part and the host's; one before X (an earlier packet's) or after the poll began (a
    busy poller had it already) leaves poll_wait whole; the sum stays Z - X."""
    x = 1_000_000_000
    lines = one_request(5, x)
    if irq is not None:
        lines = [ln + f" {x + irq}" if ln.startswith("KA G") else ln for ln in lines]
    seg = anatomy.parse("\n".join(lines))[5].segments()
    assert (seg["wire"], seg["poll_wait"]) == (wire, 2_000 - wire)
    assert sum(seg.values()) == 70_000


def test_lines_out_of_time_order_and_text_output_parse_alike() -> None:
    lines = [ln for s in range(20) for ln in one_request(s, 10**9 + s * 200_000)]
    shuffled = lines[:]
    random.Random(3).shuffle(shuffled)      # per-CPU buffers: no global order
    a = anatomy.parse(as_json(lines))
    b = anatomy.parse("\n".join(shuffled))
    assert len(a) == len(b) == 20
    assert all(a[s].segments() == b[s].segments() for s in a)


def test_recv_belongs_to_the_reply_the_thread_sends_next() -> None:
    """Two app threads; each reply takes the last recvfrom() of its own thread before it."""
    x = 10**9
    lines = one_request(1, x, app_tid=7) + one_request(2, x + 5_000, app_tid=8)
    reqs = anatomy.parse("\n".join(lines))
    assert reqs[1].v == x + 50_000 and reqs[2].v == x + 55_000
    assert reqs[1].a == x + 34_000


def test_gro_merged_request_takes_the_stack_entry_of_the_one_it_rode_with() -> None:
    """Two requests in one poll: GRO made one skb of them, so only the first has R and D."""
    x = 10**9
    first = one_request(1, x)
    # the second's G in the same poll, before the first's R (served by a second app thread)
    second = one_request(2, x + 1_000, gro_merged=True, app_tid=78)
    reqs = anatomy.parse("\n".join(first + second))
    q = reqs[2]
    assert q.merged_with == 1 and q.r == reqs[1].r and q.d == reqs[1].d
    assert q.complete() and q.in_order()


def test_no_data_ready_and_stale_stack_entries() -> None:
    x = 10**9
    reqs = anatomy.parse("\n".join(one_request(1, x, no_d=True)))
    assert reqs[1].no_data_ready and reqs[1].d == reqs[1].r
    assert reqs[1].segments()["stack"] == 0
    # an R long after the reply: the skb's address reused by another packet -> not its R
    stale = [ln for ln in one_request(2, x) if not ln.startswith("KA R")]
    stale.append(ka("R", tag(2), x + 5_000_000, RT_CPU, anatomy.CTX_SOFTIRQ, x + 4_000_000))
    q = anatomy.parse("\n".join(stale))[2]
    assert q.r is None and q.missing() == "R"


def test_meanwhile_counts_work_in_progress_at_each_snapshot() -> None:
    """At X the heavy receiver has run 3 µs of a slice that began 5 µs ago, 2 µs of which
    were a NET_RX softirq still running; at V ksoftirqd had 40 µs more and NET_RX 25 µs."""
    x = 10**9
    hr = COUNTERS.index("heavy_receiver")
    xs = counters(heavy_receiver=1_000, in_ns=x - 5_000, role=hr, softirq_at_in=0,
                  softirq_ns=x - 2_000, softirq_vec=anatomy.NET_RX_VEC)
    snap = anatomy.Snapshot.of(x, xs)
    assert snap.values[COUNTERS.index("softirq_net_rx")] == 2_000
    assert snap.values[hr] == 1_000 + 3_000
    vs = counters(heavy_receiver=4_000, ksoftirqd=40_000, softirq_net_rx=27_000, polls_other=3,
                  packets_other=150)
    q = anatomy.parse("\n".join(one_request(1, x, x_snap=xs, v_snap=vs)))[1]
    mw = q.meanwhile()
    assert mw is not None
    assert mw["ksoftirqd"] == 40_000 and mw["softirq_net_rx"] == 25_000
    assert mw["heavy_receiver"] == 0 and mw["polls_other"] == 3 and mw["packets_other"] == 150


def test_real_capture_from_this_host() -> None:
    """60 requests of a napi run under the TCP flood (6.18, PREEMPT_NONE, 2 CPUs, RT CPU 1):
    the request polled in the sender's softirq on CPU 0, taken up the stack by the RT CPU's
    NET_RX after RPS, every segment >= 0, the heavy flow's backlog polls seen meanwhile."""
    out = DATA.read_text()
    reqs = anatomy.parse(out)
    whole = [q for q in reqs.values() if q.complete() and q.in_order()]
    assert len(reqs) == 60 and len(whole) >= 55
    for q in whole:
        seg = q.segments()
        assert min(seg.values()) >= 0 and sum(seg.values()) == (q.z or 0) - (q.x or 0)
        assert q.g_cpu == 0 and q.g_ctx == anatomy.CTX_SOFTIRQ
        assert q.r_cpu == RT_CPU and q.r_ctx == anatomy.CTX_SOFTIRQ
    assert sum((q.meanwhile() or {}).get("packets_other", 0) for q in whole) > 0
    assert anatomy.poll_sizes(out) and max(anatomy.poll_sizes(out)) <= 64
    assert any(t["comm"] for t in anatomy.other_tasks(out))
    measured = {q.seq: (q.z or 0) - (q.x or 0) + 500 for q in whole}
    rec = anatomy.run_record(out, measured, RT_CPU)
    assert rec["traced"] == len(whole) and rec["p99_us"] == max(measured.values()) / 1e3
    assert rec["tail"] == []            # nothing above the p99 of 58 samples (nearest rank)
    for q in whole:
        s = anatomy.sample(q, measured[q.seq], RT_CPU)
        assert 0.9 < s["explained"] < 1.0 and s["remainder_us"] == 0.5
        assert s["stack"]["on_rt_cpu"] and s["poll"]["context"] == "softirq"


def _run(mode: str, cond: str, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    lines: list[str] = []
    measured = {}
    for s in range(300):
        x = 10**9 + s * 500_000
        lines += one_request(s, x)
        measured[s] = 70_000 + (rng.randrange(1_000_000) if s % 97 == 0 else 1_000)
    return {"mode": mode, "condition": cond, "part": "rtt",
            "anatomy": anatomy.run_record("\n".join(lines), measured, RT_CPU)}


def test_run_record_summary_section_and_plot(tmp_path: Path) -> None:
    runs = [_run(m, "flood", i) for i, m in enumerate(("napi", "stock-hybrid", "napi"))]
    rec = runs[0]["anatomy"]
    assert isinstance(rec, dict)
    assert rec["samples"] == rec["traced"] == 300 and rec["missing_from"] == {}
    assert len(rec["tail"]) == 3 and rec["named"]       # the 3 slow ones: > p99
    slow = rec["tail"][0]
    assert slow["traced_us"] == 70.0 and slow["remainder_us"] == slow["rtt_us"] - 70.0
    summ = anatomy.summarize(runs)
    assert set(summ["flood"]) == {"napi", "stock-hybrid"}
    napi = summ["flood"]["napi"]
    assert napi["runs"] == 2 and napi["tail_n"] == 6
    assert napi["tail_segments_us"]["app_recv"] == pytest.approx(16.0)
    assert napi["explained_ok"] == 0.0            # the slow ones are mostly unexplained
    assert napi["polled_in"] == {"poller, stack in poller on the RT CPU": 6}
    md = "\n".join(anatomy.section(summ, report.mode_order()))
    assert "**Tail anatomy**" in md and "| napi | 6 |" in md and "| stock-hybrid | 3 |" in md
    assert "slowest named" in md and "seq " in md
    assert "napi: 6 polled in poller, stack in poller on the RT CPU" in md
    png = anatomy.plot(summ, tmp_path, "test", report.mode_order())
    assert png is not None and png.stat().st_size > 1000
    assert anatomy.section({}) == [] and anatomy.plot({}, tmp_path, "t") is None


def test_unavailable_names_the_missing_tracepoints(tmp_path: Path) -> None:
    assert "no tracefs" in (anatomy.unavailable(tmp_path) or "")
    for e in anatomy.EVENTS[:-1]:
        (tmp_path / "events" / e).mkdir(parents=True)
    why = anatomy.unavailable(tmp_path) or ""
    assert anatomy.EVENTS[-1] in why
    (tmp_path / "events" / anatomy.EVENTS[-1]).mkdir(parents=True)
    assert anatomy.unavailable(tmp_path) is None
