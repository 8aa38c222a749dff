"""The stock backend's mode periodic on this machine's kernel (netns + veth, GRO on: NAPI).

``kbpctl enable DEV --mode periodic --backend stock`` sets IRQ deferral (napi_defer_hard_irqs
8, gro_flush_timeout = the interval) and, without ``--interval-us``, starts the search service
(kbp.periodicd) that rewrites gro_flush_timeout every round. These tests run it with 50 ms
rounds under a UDP stream and check, round by round, that what the kernel reports (napi-get)
is what the service's state file says it applied, that the service's history replays through
kbp.netap to the same intervals, and that disable -- also after the service or kbpctl was
killed -- puts back exactly the snapshot taken before. No assertion on timing: loops wait for
progress with a generous deadline and fail only if none comes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kbp import netap, periodicd, rps
from kbp.bench import testbed
from kbp.netdev import NetdevClient, NetFS, get_link
from kbp.snapshot import setting
from kbp.system import access
from kbp.system.journal import StateDir

from .conftest import netns_skip_reason
from .test_integration import Bed, _refused, device_status, kill_paused, new_bed

pytestmark = [pytest.mark.netns, pytest.mark.root,
              pytest.mark.skipif(netns_skip_reason() is not None,
                                 reason=netns_skip_reason() or "")]

STREAM = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
i = 0
while True:
    s.sendto(b"x" * 1000, (sys.argv[1], 9))
    i += 1
    if i % 4 == 0:
        time.sleep(0.0005)
"""
ROUND_MS = "50"


@pytest.fixture
def bed() -> Iterator[Bed]:
    with new_bed() as b:
        yield b


def stream(b: Bed) -> None:
    b.tb.popen(b.tb.client, [sys.executable, "-c", STREAM, b.link.ip_b])


def state_path(b: Bed) -> Path:
    return periodicd.state_file(b.run_dir, b.link.dev_b, b.tb.server)


def service_state(b: Bed) -> dict[str, Any]:
    d = periodicd.read_state(state_path(b))
    assert d is not None, "no state file of the periodic service"
    return d


def kernel_knobs(b: Bed) -> tuple[int | None, int | None]:
    """(defer_hard_irqs, gro_flush_timeout ns) of the device's NAPI, as napi-get reports."""
    link = get_link(b.link.dev_b, b.tb.server)
    assert link is not None
    with NetdevClient(b.tb.server) as c:
        (n,) = c.napis(link.ifindex)
    return n.defer_hard_irqs, n.gro_flush_timeout


def wait_for(pred: Any, what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def service_alive(info: dict[str, Any]) -> bool:
    return periodicd.alive(info)


def journal_kinds(b: Bed) -> list[tuple[str, str | None]]:
    out = []
    for p in b.journals():
        for line in p.read_text().splitlines():
            d = json.loads(line)
            if d.get("op") == "change":
                out.append((d["kind"], d["key"].get("knob") or d["key"].get("attr")))
    return out


def enable(b: Bed, *opts: str, env: dict[str, str] | None = None) -> str:
    return b.kbpctl("enable", b.link.dev_b, "--netns", b.tb.server, "--mode", "periodic",
                    "--backend", "stock", "--cpus", "1", *opts, env=env).stdout


def leftovers(b: Bed) -> list[Path]:
    return [p for p in b.run_dir.rglob("*") if p.is_file() and p.name != "lock"]


# -- the search drives gro_flush_timeout -------------------------------------------------
@pytest.mark.parametrize("features", ["", "sysfs"])
def test_search_drives_gro_flush_timeout_and_disable_restores(bed: Bed, features: str) -> None:
    """Per NAPI (napi-set) and per device (sysfs, the pre-6.13 path)."""
    env = {"KBP_STOCK_FEATURES": features} if features else None
    before = bed.snap()
    stream(bed)
    out = enable(bed, "--round-ms", ROUND_MS, env=env)
    assert "periodic, interval searched in 100..4000 us (rounds of 50 ms," in out \
        and "objective bytes)" in out
    kinds = journal_kinds(bed)
    want = "sysfs" if features else "napi"
    defer = "napi_defer_hard_irqs" if features else "defer_hard_irqs"
    assert (want, defer) in kinds and (want, "gro_flush_timeout") in kinds
    assert kinds[-1] == (periodicd.KIND, None)  # the service last: stopped first

    # the first rounds, while the state file's history still reaches back to round 1
    snap = wait_for(lambda: (lambda x: x if 12 <= x.get("rounds", 0) < periodicd.HISTORY
                             else None)(service_state(bed)), "12 rounds")

    # round by round: what napi-get reports is what the service says it applied (read with
    # the state dir's lock held: the service applies and reports under it)
    seen: set[int] = set()
    checks = rounds = 0
    while len(seen) < 4 or checks < 10:
        with StateDir(bed.run_dir).lock():
            st = service_state(bed)
            knobs = kernel_knobs(bed)
        assert knobs == (8, st["applied_us"] * 1000), (knobs, st)
        seen.add(st["applied_us"])
        if st["rounds"] != rounds:
            checks += 1
            rounds = st["rounds"]
        assert rounds < 3000, ("the interval does not move", seen)
        time.sleep(0.03)

    # the service ran kbp.netap on its measurements: replay its history, from round 1
    hist = snap["history"]
    assert [h["n"] for h in hist] == list(range(1, snap["rounds"] + 1))
    s = netap.Search(netap.Params())
    for h in hist:
        assert h["ran_us"] == s.interval_us, (h, s.state())
        if h["value"] is not None:
            s.round_end(h["value"])
        assert h["next_us"] == s.interval_us, (h, s.state())
    assert periodicd.search_fields(s) == snap["search"]
    assert snap["applied_us"] == s.interval_us

    st = bed.status()
    d = device_status(st, bed.link.dev_b)
    assert (d["backend"], d["mode"], d["problems"]) == ("stock", "periodic", [])
    per = d["periodic"]
    assert per["defer_hard_irqs"] == 8 and per["objective"] == "bytes"
    assert per["service"]["running"] and per["service"]["rounds"] > 0
    assert set(per["search"]) >= {"round", "interval_us", "low_us", "high_us", "distance_us",
                                  "converged", "restarts"}
    human = bed.kbpctl("status").stdout
    assert f"{bed.link.dev_b} ({bed.tb.server}) periodic (defer 8 empty polls): service" in human

    info = service_state(bed)
    bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server)
    assert not service_alive(info)
    assert bed.snap() == before
    assert bed.journals() == [] and leftovers(bed) == []


def test_bytes_per_cpu_objective(bed: Bed) -> None:
    """The objective divides the round's bytes by the NAPI thread's CPU time."""
    stream(bed)
    enable(bed, "--round-ms", ROUND_MS, "--objective", "bytes-per-cpu",
           "--max-interval-us", "1000")
    last = wait_for(lambda: (service_state(bed).get("last") or {}).get("value"),
                    "a measured round")
    st = service_state(bed)
    lst = st["last"]
    assert lst["value"] == lst["bytes"] * 1_000_000_000 // max(lst["cpu_ns"], 1000)
    assert lst["cpu_ns"] > 0 and last > 0
    assert 100 <= st["applied_us"] <= 1000  # the latency cap holds
    d = device_status(bed.status(), bed.link.dev_b)
    assert d["periodic"]["objective"] == "bytes-per-cpu"


def test_fixed_interval_sets_knobs_and_starts_no_service(bed: Bed) -> None:
    before = bed.snap()
    out = enable(bed, "--interval-us", "500")
    assert "periodic, every 500 us" in out
    assert kernel_knobs(bed) == (8, 500_000)
    assert periodicd.KIND not in {k for k, _ in journal_kinds(bed)}
    assert not state_path(bed).exists()
    d = device_status(bed.status(), bed.link.dev_b)
    assert d["periodic"]["interval_us"] == 500 and d["periodic"]["service"] is None
    assert d["problems"] == []
    bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server)
    assert bed.snap() == before and bed.journals() == []


# -- crashes -----------------------------------------------------------------------------------
def test_service_killed_then_disable_restores(bed: Bed) -> None:
    before = bed.snap()
    stream(bed)
    enable(bed, "--round-ms", ROUND_MS)
    info = wait_for(lambda: (lambda s: s if s.get("rounds", 0) >= 3 else None)(
        service_state(bed)), "three rounds")
    os.kill(info["pid"], signal.SIGKILL)
    wait_for(lambda: not service_alive(info), "the service to die")
    d = device_status(bed.status(), bed.link.dev_b)
    assert any(f"periodic service (pid {info['pid']}) is not running" in p
               for p in d["problems"]), d["problems"]
    assert not d["periodic"]["service"]["running"]
    (nid,) = before["server"]["napis"]
    assert kernel_knobs(bed)[1] != setting(before["server"], "napi", {
        "netns": bed.tb.server, "napi_id": nid, "knob": "gro_flush_timeout"})
    bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server)
    assert bed.snap() == before
    assert bed.journals() == [] and leftovers(bed) == []


def test_kbpctl_killed_after_starting_the_service(bed: Bed) -> None:
    """enable stopped right after it started the service (its last step), then SIGKILLed:
    the service waits for a complete journal and changes nothing; disable stops it and
    restores."""
    before = bed.snap()
    stream(bed)
    r = rps.read(NetFS(bed.tb.server), bed.link.dev_b)
    # RPS off (if a default mask turned it on), threaded, affinity, sched, defer, gro,
    # service (veth has no IRQ)
    steps = (len(r.plan_off()) if r is not None else 0) + 6
    kill_paused(bed, ["enable", bed.link.dev_b, "--netns", bed.tb.server, "--mode",
                      "periodic", "--backend", "stock", "--cpus", "1", "--round-ms", ROUND_MS],
                steps)
    assert journal_kinds(bed)[-1] == (periodicd.KIND, None)
    info = service_state(bed)
    first = netap.Search(netap.Params()).interval_us
    # the service runs, but an incomplete journal is not its to act on
    wait_for(lambda: service_state(bed).get("pid") and service_alive(service_state(bed)),
             "the service")
    time.sleep(0.3)  # several rounds (a wait, not an assertion on time)
    assert kernel_knobs(bed) == (8, first * 1000)
    d = device_status(bed.status(), bed.link.dev_b)
    assert not d["complete"] and any("interrupted" in x for x in d["problems"])
    info = service_state(bed)
    bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server)
    assert not service_alive(info)
    assert bed.snap() == before
    assert bed.journals() == [] and leftovers(bed) == []


def test_service_exits_when_its_journal_or_device_goes(bed: Bed) -> None:
    stream(bed)
    enable(bed, "--round-ms", ROUND_MS)
    info = wait_for(lambda: (lambda s: s if s.get("rounds", 0) >= 1 else None)(
        service_state(bed)), "a round")
    (j,) = bed.journals()
    j.unlink()  # someone removed the record: not the service's any more
    wait_for(lambda: not service_alive(info), "the service to exit")
    assert service_state(bed)["status"] == "running"  # it said nothing: not its file now
    for p in leftovers(bed):
        p.unlink()

    enable(bed, "--round-ms", ROUND_MS)
    info = wait_for(lambda: (lambda s: s if s.get("rounds", 0) >= 1 else None)(
        service_state(bed)), "a round")
    access.cmd(["ip", "link", "del", bed.link.dev_b], ns=bed.tb.server)
    wait_for(lambda: not service_alive(info), "the service to exit")
    st = service_state(bed)
    assert st["status"] == "exited" and st["reason"] == f"{bed.link.dev_b} is gone"
    d = device_status(bed.status(), bed.link.dev_b)
    assert any("is gone" in p for p in d["problems"])
    out = bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server).stdout
    assert f"disabled {bed.link.dev_b}" in out
    assert bed.journals() == [] and leftovers(bed) == []


# -- refusals and apply ----------------------------------------------------------------------
def test_bad_periodic_input_refused_before_any_change(bed: Bed) -> None:
    en = ["enable", bed.link.dev_b, "--netns", bed.tb.server, "--backend", "stock"]
    per = [*en, "--mode", "periodic"]
    _refused(bed, [*per, "--interval-us", "5"], 2, "--interval-us 5 is out of range (10..100000)")
    _refused(bed, [*per, "--round-ms", "60001"], 2, "--round-ms 60001 is out of range")
    _refused(bed, [*per, "--min-change", "0"], 2, "--min-change 0 is out of range")
    _refused(bed, [*per, "--max-round", "19"], 2, "--max-round 19 is out of range")
    _refused(bed, [*per, "--min-interval-us", "500", "--max-interval-us", "100"], 2,
             "the search range is empty")
    _refused(bed, [*per, "--interval-us", "100", "--round-ms", "50"], 2,
             "--round-ms would do nothing")
    _refused(bed, [*per, "--linger-us", "10"], 2, "--linger-us applies to --mode hybrid only")
    _refused(bed, [*per, "--freq-ctl"], 2, "--freq-ctl applies to --mode hybrid only")
    _refused(bed, [*en, "--interval-us", "100"], 2, "applies to --mode periodic only")
    _refused(bed, [*per, "--objective", "packets"], 2, "invalid choice")
    _refused(bed, [*per, "--cpus", "64"], 2, "CPU 64 does not exist")


def test_apply_starts_and_restarts_the_service(bed: Bed, tmp_path: Path) -> None:
    s, dev = bed.tb.server, bed.link.dev_b
    before = bed.snap()
    cfg = tmp_path / "kbp.toml"
    cfg.write_text(f'backend = "stock"\n[[device]]\nname = "{dev}"\nnetns = "{s}"\n'
                   f'mode = "periodic"\ncpus = "1"\nround_ms = 50\nmax_interval_us = 2000\n')
    assert ": enable (stock)" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    info = wait_for(lambda: (lambda x: x if x.get("pid") else None)(service_state(bed)),
                    "the service")
    assert service_alive(info)
    assert "in sync" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    os.kill(info["pid"], signal.SIGKILL)
    wait_for(lambda: not service_alive(info), "the service to die")
    out = bed.kbpctl("apply", "--config", str(cfg)).stdout
    assert "reenable (stock): the periodic service" in out
    new = wait_for(lambda: (lambda x: x if x.get("pid") and x["pid"] != info["pid"] else None)(
        service_state(bed)), "a new service")
    assert service_alive(new)
    cfg.write_text('backend = "stock"\n')
    bed.kbpctl("apply", "--config", str(cfg))
    assert not service_alive(new)
    assert bed.snap() == before and bed.journals() == [] and leftovers(bed) == []


def test_service_leaves_a_deleted_netns(bed: Bed) -> None:
    """The service runs inside the device's netns, so it would keep a deleted netns (and its
    veth) alive: it sees the name gone and exits, and disable forgets the device."""
    with testbed.Testbed(prefix="kbpx") as other:
        dev, ns = other.links[0].dev_b, other.server
        bed.kbpctl("enable", dev, "--netns", ns, "--mode", "periodic", "--backend", "stock",
                   "--cpus", "1", "--round-ms", ROUND_MS)
        path = periodicd.state_file(bed.run_dir, dev, ns)
        info = wait_for(lambda: (lambda x: x if x and x.get("pid") else None)(
            periodicd.read_state(path)), "the service")
        assert service_alive(info)
    wait_for(lambda: not service_alive(info), "the service to leave the deleted netns")
    st = periodicd.read_state(path)
    assert st is not None and st["status"] == "exited" and st["reason"] == f"netns {ns} is gone"
    out = bed.kbpctl("disable", dev, "--netns", ns).stdout
    assert "gone, nothing to restore" in out and f"disabled {dev}" in out
    assert bed.journals() == [] and leftovers(bed) == []
