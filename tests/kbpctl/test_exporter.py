"""``kbpctl exporter`` (issue 26, item 2): kbp's status as Prometheus metrics.

A Status built here goes through KbpCollector; the exposition is parsed back with
prometheus_client's own parser, so names, labels, values and HELP are checked as a
Prometheus server would read them. No root, no netns (test_exporter_netns.py scrapes a real
stock-backend device over HTTP)."""

from __future__ import annotations

import ast
import dataclasses
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kbp import cli, exporter, names, periodicd, problems, rps
from kbp.backends import (
    BackendInfo,
    CpuPoller,
    DeviceStatus,
    NapiStatus,
    OrphanJournal,
    PollerStatus,
    PollingCpu,
    Status,
    ThreadStatus,
    preempt_notes,
)
from kbp.backends import kmod as kmod_backend
from kbp.backends import stock as stock_backend
from kbp.backends.kmod import KmodBackend, periodic_drift
from kbp.backends.stock import StockBackend
from kbp.errors import EXIT_FAILED, EXIT_USAGE
from kbp.exporter import KbpCollector, metric_name
from kbp.kmod import NapiInfo
from kbp.problems import Problem
from kbp.sysinfo import FreqReport, PreemptModel
from kbp.system.journal import Record, StateDir

SRC = str(Path(__file__).resolve().parents[2] / "src")
PREEMPT_NOTE = ("CPU 1: preemption model none: the rt NAPI thread napi/a-1 (SCHED_FIFO) may "
                "wait for the non-rt thread napi/b-2 as long as its NAPI keeps getting "
                "scheduled")


def _counters(base: int) -> dict[str, int | None]:
    """Every poller counter, each with its own value (base + its index)."""
    return {c: base + i for i, c in enumerate(names.POLLER_COUNTERS)}


def make_status() -> Status:
    busy = PollerStatus(cpu=1, pid=501, mode="busy", linger_us=None, quota=64, napis=1,
                        policy="SCHED_FIFO", priority=50, counters=_counters(1_000_000),
                        cls=names.CLASS_RT)
    nonrt = PollerStatus(cpu=1, pid=502, mode="hybrid", linger_us=20, quota=8, napis=1,
                         policy="SCHED_OTHER", priority=0, counters=_counters(2_000_000),
                         cls=names.CLASS_NON_RT, nice=5)
    per = PollerStatus(cpu=2, pid=503, mode="periodic", linger_us=None, quota=64, napis=1,
                       policy="SCHED_FIFO", priority=50,
                       counters=dict.fromkeys(names.POLLER_COUNTERS),
                       periodic={"interval_us": 500, "netap": True, "handbacks": 7,
                                 "search": {"interval_us": 250, "converged": True,
                                            "restarts": 3, "objective": "bytes-per-cpu",
                                            "last_objective": 123456}})
    eth1 = DeviceStatus(name="eth1", netns=None, ifindex=3, kind=None, backend="kmod",
                        mode="busy", cpus=[1], counters={"packets": 900, "polls": 45},
                        cls=names.CLASS_RT,
                        napis=[NapiStatus(id=8193, index=0, cpu=1, state="polled",
                                          counters={"packets": 900, "polls": 45})])
    thread = ThreadStatus(pid=777, comm="napi/veth0-8200", cpus=[1], last_cpu=1,
                          policy="SCHED_FIFO", priority=50,
                          counters={**dict.fromkeys(names.POLLER_COUNTERS),
                                    "poll_ns": 2_500_000_000, "sleeps": 42})
    veth0 = DeviceStatus(name="veth0", netns="blue", ifindex=4, kind="veth", backend="stock",
                         mode="periodic", cpus=[1], counters={"packets": 321, "polls": None},
                         cls=names.CLASS_RT,
                         napis=[NapiStatus(id=8200, index=0, irq=None, cpu=1, threaded=1,
                                           thread=thread,
                                           counters={"packets": None, "polls": None})],
                         periodic={"interval_us": 400, "objective": "bytes",
                                   "search": {"converged": False, "restarts": 1},
                                   "service": {"running": True, "rounds": 12,
                                               "last": {"bytes": 5000, "value": 5000}}},
                         problems=[rps.drift_problem("veth0", rps.Rps(
                             [rps.RpsQueue("rx-0", "3", 0)], 0))])
    gone = DeviceStatus(name="veth9", netns="blue", ifindex=None, kind=None, backend="stock",
                        mode="hybrid", complete=False,
                        problems=[Problem(problems.DEVICE_GONE, "veth9 is gone: 'kbpctl "
                                          "disable veth9' restores the rest and forgets it"),
                                  Problem(problems.INTERRUPTED, "enable was interrupted after 2 "
                                          "change(s): 'kbpctl disable veth9' restores, 'kbpctl "
                                          "enable' or 'kbpctl apply' redoes it")])
    eth0 = DeviceStatus(name="eth0", netns=None, ifindex=2, kind=None, backend=None,
                        managed=False, counters={"packets": 77, "polls": None})
    return Status(kernel="6.18.0-test", auto="kmod",
                  backends={"kmod": BackendInfo(True, "kbp module loaded"),
                            "stock": BackendInfo(True, "")},
                  devices=[eth0, eth1, veth0, gone], pollers=[busy, nonrt, per],
                  cpufreq=FreqReport(False),
                  preempt={"model": "none", "source": "uname -v", "preempts_kernel": False,
                           "notes": [Problem(problems.PREEMPT, PREEMPT_NOTE)]},
                  orphans=[OrphanJournal("bench-knobs", 4242, "/run/kbp/bench-knobs-4242.jsonl",
                                         3)])


def scrape(collector: KbpCollector) -> dict[str, Sample | object]:
    """Families by name, as Prometheus parses the exposition."""
    text = exporter.exposition(exporter.registry(collector))
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict[str, object], name: str) -> list[Sample]:
    out = [s for f in fams.values() for s in f.samples  # type: ignore[attr-defined]
           if s.name == name]
    assert out or name.removesuffix("_total") in fams, f"no {name}"
    return out


def value(fams: dict[str, object], name: str, **labels: str) -> float:
    got = [s for s in samples(fams, name) if all(s.labels.get(k) == v for k, v in
                                                  labels.items())]
    assert len(got) == 1, (name, labels, samples(fams, name))
    return float(got[0].value)


@pytest.fixture
def fams() -> dict[str, object]:
    return scrape(KbpCollector(make_status, warn=_no_warning))


def _no_warning(text: str) -> None:
    raise AssertionError(f"unexpected warning: {text}")


# -- what is exported ------------------------------------------------------------------------
def test_every_poller_counter_with_its_labels_unit_and_help(fams: dict[str, object]) -> None:
    rt = {"cpu": "1", "mode": "busy", "class": "rt", "backend": "kmod"}
    nonrt = {"cpu": "1", "mode": "hybrid", "class": "non-rt", "backend": "kmod"}
    for i, c in enumerate(names.POLLER_COUNTERS):
        gauge = c in names.POLLER_MAXIMA
        fam_name = f"kbp_poller_{metric_name(c)}"
        sample = fam_name if gauge else fam_name + "_total"
        fam = fams[fam_name]
        assert fam.type == ("gauge" if gauge else "counter")  # type: ignore[attr-defined]
        assert fam.documentation.startswith(names.POLLER_COUNTER_HELP[c])  # type: ignore
        scale = 1e9 if c.endswith("_ns") else 1
        assert value(fams, sample, **rt) == pytest.approx((1_000_000 + i) / scale)
        assert value(fams, sample, **nonrt) == pytest.approx((2_000_000 + i) / scale)
        # the periodic poller reports none of them: no sample, not a zero
        assert not [s for s in samples(fams, sample) if s.labels["cpu"] == "2"]
        assert {frozenset(s.labels) for s in samples(fams, sample)} == {
            frozenset(exporter.POLLER_LABELS)}
    assert "kbp_poller_poll_seconds_total" in {s for f in fams.values()
                                               for s in (x.name for x in f.samples)}  # type: ignore
    assert "kbp_poller_poll_ns_total" not in fams
    assert value(fams, "kbp_poller_quota", **nonrt) == 8
    assert value(fams, "kbp_poller_linger_seconds", **nonrt) == pytest.approx(20e-6)
    assert value(fams, "kbp_poller_rt_priority", **rt) == 50
    assert value(fams, "kbp_poller_rt_priority", **nonrt) == 0


def test_devices_napis_and_threads(fams: dict[str, object]) -> None:
    en = {(s.labels["device"], s.labels["state"], s.labels["backend"], s.labels["mode"],
           s.labels["class"], s.labels["netns"]): s.value
          for s in samples(fams, "kbp_device_enabled")}
    assert en == {("eth0", "off", "", "", "", ""): 0, ("eth1", "serving", "kmod", "busy", "rt",
                                                         ""): 1,
                  ("veth0", "degraded", "stock", "periodic", "rt", "blue"): 1,
                  ("veth9", "incomplete", "stock", "hybrid", "", "blue"): 1}
    assert value(fams, "kbp_device_packets_total", device="eth1", backend="kmod") == 900
    assert value(fams, "kbp_device_polls_total", device="eth1") == 45
    assert value(fams, "kbp_device_packets_total", device="veth0", netns="blue") == 321
    assert value(fams, "kbp_device_packets_total", device="eth0", backend="") == 77
    assert {s.labels["device"] for s in samples(fams, "kbp_device_polls_total")} == {"eth1"}
    assert fams["kbp_device_packets"].documentation == \
        names.DEVICE_COUNTER_HELP["packets"]  # type: ignore[attr-defined]
    assert value(fams, "kbp_napi_packets_total", device="eth1", napi="8193", cpu="1") == 900
    assert value(fams, "kbp_napi_polls_total", device="eth1", napi="8193") == 45
    assert value(fams, "kbp_napi_info", device="veth0", napi="8200", threaded="1") == 1
    th = {"device": "veth0", "netns": "blue", "napi": "8200", "cpu": "1",
          "comm": "napi/veth0-8200", "backend": "stock"}
    assert value(fams, "kbp_napi_thread_poll_seconds_total", **th) == pytest.approx(2.5)
    assert value(fams, "kbp_napi_thread_sleeps_total", **th) == 42
    assert value(fams, "kbp_napi_thread_rt_priority", **th) == 50
    assert "kbp_napi_thread_wakeups" not in fams   # /proc has no such thing: no family


def test_periodic_interval_and_objective(fams: dict[str, object]) -> None:
    p = {"cpu": "2", "mode": "periodic", "class": "rt", "backend": "kmod"}
    # the search's running round, not the knob it started from
    assert value(fams, "kbp_poller_periodic_interval_seconds", **p) == pytest.approx(250e-6)
    assert value(fams, "kbp_poller_periodic_objective", objective="bytes-per-cpu",
                 **p) == 123456
    assert value(fams, "kbp_poller_periodic_search_converged", **p) == 1
    assert value(fams, "kbp_poller_periodic_search_restarts_total", **p) == 3
    assert value(fams, "kbp_poller_periodic_handbacks_total", **p) == 7
    d = {"device": "veth0", "netns": "blue", "backend": "stock"}
    assert value(fams, "kbp_device_periodic_interval_seconds", **d) == pytest.approx(400e-6)
    assert value(fams, "kbp_device_periodic_objective", objective="bytes", **d) == 5000
    assert value(fams, "kbp_device_periodic_search_converged", **d) == 0
    assert value(fams, "kbp_device_periodic_service_running", **d) == 1
    assert value(fams, "kbp_device_periodic_rounds_total", **d) == 12
    assert len(samples(fams, "kbp_poller_periodic_interval_seconds")) == 1


def test_up_module_kernel_problems_and_errors(fams: dict[str, object]) -> None:
    assert value(fams, "kbp_up") == 1
    assert value(fams, "kbp_module_loaded") == 1
    assert value(fams, "kbp_backend_available", backend="kmod", auto="1") == 1
    assert value(fams, "kbp_backend_available", backend="stock", auto="0") == 1
    assert value(fams, "kbp_kernel_info", release="6.18.0-test", preempt_model="none",
                 preempts_kernel="false") == 1
    probs = {s.labels["kind"]: s.value for s in samples(fams, "kbp_problems")}
    assert set(probs) == set(exporter.PROBLEM_KIND_NAMES)   # every kind, zeros included
    assert {k: v for k, v in probs.items() if v} == {"rps_on": 1, "device_gone": 1,
                                                      "interrupted": 1, "preempt": 1,
                                                      "killed_process": 1}
    assert value(fams, "kbp_killed_process_changes", owner="bench-knobs", pid="4242") == 3
    assert value(fams, "kbp_device_problems", device="veth9") == 2
    assert value(fams, "kbp_device_problems", device="eth1") == 0
    assert not [s for s in samples(fams, "kbp_device_problems") if s.labels["device"] == "eth0"]
    errs = {s.labels["section"]: s.value for s in samples(fams, "kbp_exporter_errors_total")}
    assert errs == dict.fromkeys(exporter.SECTIONS, 0)
    for f in fams.values():   # every family says what it is
        assert f.documentation, f.name  # type: ignore[attr-defined]
        assert f.name.startswith("kbp_")  # type: ignore[attr-defined]


def test_problem_kinds_of_the_sentences_status_writes(tmp_path: Path) -> None:
    """Each kind, from the code that writes the sentence (not from a copy of its text)."""
    state = StateDir(tmp_path)

    def rec(**req: object) -> Record:
        return Record(path=tmp_path / "x.jsonl", backend="stock", dev="kbpx-nodev", netns=None,
                      ifindex=None, request={"mode": "hybrid", "rt_prio": 50, **req},
                      complete=True)

    km = KmodBackend(state=state)
    st = StockBackend(state=state)
    said: dict[str, list[Problem]] = {
        "module_not_loaded": km._status("kbpx-nodev", None, rec(), None, False).problems,
        "module_silent": km._status("kbpx-nodev", None, rec(), None, True, "EIO").problems,
        "detached": km._status("kbpx-nodev", None, rec(), None, True).problems,
        "needs_root": st._describe_unprivileged("kbpx-nodev", "kbpx-ns", rec()).problems
        + km._status("kbpx-nodev", None, rec(), None, True, "EPERM", needs_root=True).problems,
        "periodic_service": periodicd.describe(tmp_path, rec(periodic={"interval_us": None}))[1],
        "rps_on": [rps.drift_problem("x", rps.Rps([rps.RpsQueue("rx-0", "3", 0)], 0))],
        "no_napi": st._problems(rec(), DeviceStatus("x", None, 1, None, "stock")),
        "ambiguous_name": [stock_backend.ambiguous_threads_problem("x", ["netns blue"])],
    }
    interrupted = rec()
    interrupted.complete = False
    said["interrupted"] = st._problems(interrupted, DeviceStatus("x", None, 1, None, "stock"))

    def napi(threaded: int, thread: ThreadStatus | None) -> DeviceStatus:
        return DeviceStatus("x", None, 1, None, "stock",
                            napis=[NapiStatus(id=5, threaded=threaded, thread=thread)])

    t = ThreadStatus(pid=9, comm="napi/x-5", cpus=[1], last_cpu=1, policy="SCHED_OTHER",
                     priority=0, counters={})
    said["not_threaded"] = st._problems(rec(), napi(0, t))
    said["no_thread"] = st._problems(rec(), napi(1, None))
    said["sched_drift"] = st._problems(rec(), napi(1, t))
    ds = DeviceStatus("x", None, 1, None, "kmod", cpus=[2], periodic_request={
        "interval_us": 500, "round_ms": 1000, "min_interval_us": 100, "max_interval_us": 4000,
        "min_change": 20, "max_round": 300, "objective": "bytes"})
    poller = PollerStatus(cpu=2, pid=1, mode="periodic", linger_us=None, quota=64, napis=1,
                          policy=None, priority=None, counters={},
                          periodic={"interval_us": 900, "netap": False})
    said["periodic_drift"] = periodic_drift(ds, [poller]) + periodic_drift(
        ds, [dataclasses.replace(poller, device="x")])     # named by its device
    said["poller_stuck"] = kmod_backend.stuck_pollers(
        DeviceStatus("x", None, 1, None, "kmod"),
        [dataclasses.replace(poller, device="x", state="stuck"),
         dataclasses.replace(poller, device="y", state="stuck"),
         dataclasses.replace(poller, device="x", state="active")])
    said["misplaced"] = kmod_backend.placement_problems(
        [[0, 0], [1, 1]], [NapiInfo(index=0, id=8193, cpu=0), NapiInfo(index=1, id=8194, cpu=0),
                           NapiInfo(index=2, id=8195, cpu=0)])
    cpus = [PollingCpu(cpu=1, busy=False, pollers=[
        CpuPoller("rt", "stock", 1, "napi/a-1", "SCHED_FIFO", 50, None),
        CpuPoller("non-rt", "stock", 2, "napi/b-2", "SCHED_OTHER", 0, 0)])]
    said["preempt"] = preempt_notes(PreemptModel("none", "uname -v"), cpus)
    said["killed_process"] = [OrphanJournal("nicpair", 7, "/run/kbp/nicpair-7.jsonl",
                                            2).problem]
    for kind, found in said.items():
        assert found, kind
        assert {p.kind for p in found} == {kind}, found
    assert set(said) | {"other", "device_gone", "device_down"} == \
        set(exporter.PROBLEM_KIND_NAMES)


def _problem_kinds_made(tree: ast.AST) -> set[str]:
    """The kinds kbp.problems' constants name in the kind argument of the ``Problem(KIND,
    ...)`` calls in ``tree`` (``Problem(p.kind, ...)`` passes one on: not counted)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "Problem" and node.args:
            for n in ast.walk(node.args[0]):
                kind = getattr(problems, n.id, None) if isinstance(n, ast.Name) else None
                if kind in problems.KINDS:
                    out.add(kind)
    return out


def test_every_kind_is_given_where_the_problem_is_found() -> None:
    """Issue 39: each kind kbp_problems{kind} reports is set by the code that finds the
    problem (a Problem made there), and the exporter reads the kind, never the sentence: no
    pattern over problem texts is left in it."""
    made: set[str] = set()
    for path in sorted((REPO / "src/kbp").rglob("*.py")):
        made |= _problem_kinds_made(ast.parse(path.read_text(), str(path)))
    assert made == set(problems.KINDS) - {problems.OTHER}, made
    assert exporter.PROBLEM_KIND_NAMES == problems.KINDS
    assert len(set(problems.KINDS)) == len(problems.KINDS)
    assert not hasattr(exporter, "problem_kind") and not hasattr(exporter, "PROBLEM_KINDS")
    tree = ast.parse(Path(exporter.__file__).read_text())
    uses_re = {getattr(top, "name", "<module>") for top in tree.body for n in ast.walk(top)
               if isinstance(n, ast.Name) and n.id == "re"}
    assert uses_re == {"parse_listen"}, uses_re   # --listen ADDR:PORT, not problems
    with pytest.raises(ValueError, match="unknown problem kind"):
        Problem("misplace", "a kind nobody counts")


def test_a_reworded_problem_keeps_its_kind() -> None:
    """The regression issue 39 names: a sentence reworded so that none of the exporter's old
    patterns matches it is still counted under its own kind, never as other; status prints
    the sentence as written, in text and JSON."""
    new = {problems.MISPLACED: "queue 1 polled elsewhere",
           problems.POLLER_STUCK: "kbp/3 hangs on to its NAPIs",
           problems.RPS_ON: "steering is back",
           problems.NEEDS_ROOT: "ask again as the superuser"}
    st = make_status()
    eth1 = next(d for d in st.devices if d.name == "eth1")
    eth1.problems = [Problem(k, t) for k, t in new.items()]
    st.preempt = dict(st.preempt or {}, notes=[Problem(problems.PREEMPT, "CPU 1 may wait")])
    fams = scrape(KbpCollector(lambda: st))
    probs = {s.labels["kind"]: s.value for s in samples(fams, "kbp_problems")}
    assert {k: v for k, v in probs.items() if v} == {
        problems.MISPLACED: 1, problems.POLLER_STUCK: 1, problems.RPS_ON: 2,
        problems.NEEDS_ROOT: 1, problems.DEVICE_GONE: 1, problems.INTERRUPTED: 1,
        problems.PREEMPT: 1, problems.KILLED_PROCESS: 1}
    assert probs[problems.OTHER] == 0
    assert value(fams, "kbp_device_problems", device="eth1") == 4
    js = json.loads(json.dumps(st.to_json()))
    (d,) = [d for d in js["devices"] if d["name"] == "eth1"]
    assert d["problems"] == list(new.values())
    assert js["preempt"]["notes"] == ["CPU 1 may wait"]


# -- faults ----------------------------------------------------------------------------------
def _raising(msg: str) -> Callable[[Status], Iterable[object]]:
    def build(st: Status) -> Iterable[object]:
        yield from exporter.device_metrics(st)  # a half-built section is not served
        raise RuntimeError(msg)
    return build  # type: ignore[return-value]


def test_a_failing_section_is_counted_and_the_rest_served() -> None:
    warned: list[str] = []
    builders = {**exporter.BUILDERS, "devices": _raising("device vanished")}
    col = KbpCollector(make_status, builders=builders, warn=warned.append)  # type: ignore
    fams = scrape(col)
    assert "kbp_device_enabled" not in fams and "kbp_device_packets" not in fams
    assert value(fams, "kbp_up") == 1
    assert value(fams, "kbp_poller_packets_total", cpu="1", **{"class": "rt"}) == 1_000_002
    assert value(fams, "kbp_exporter_errors_total", section="devices") == 1
    assert value(fams, "kbp_exporter_errors_total", section="pollers") == 0
    fams = scrape(col)
    assert value(fams, "kbp_exporter_errors_total", section="devices") == 2
    assert warned == ["kbpctl exporter: section devices left out of the scrape (RuntimeError: "
                      "device vanished)"]   # once per new message, not per scrape

    # over HTTP: 200, the metrics, no traceback
    httpd, bound = exporter.serve(exporter.Listen("127.0.0.1", 0), exporter.registry(col))
    try:
        with urllib.request.urlopen(f"http://{bound}/metrics", timeout=10) as r:
            assert r.status == 200
            body = r.read().decode()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert 'kbp_exporter_errors_total{section="devices"} 3.0' in body
    assert "Traceback" not in body and "kbp_poller_packets_total{" in body


def test_status_unreadable_is_kbp_up_0() -> None:
    def status() -> Status:
        raise OSError(2, "No such file or directory", "/proc/modules")
    warned: list[str] = []
    fams = scrape(KbpCollector(status, warn=warned.append))
    assert value(fams, "kbp_up") == 0
    assert value(fams, "kbp_exporter_errors_total", section="status") == 1
    assert "kbp_device_enabled" not in fams and "kbp_problems" not in fams
    assert warned and "section status" in warned[0] and "/proc/modules" in warned[0]


# -- what the config asks for (kbp_backend_required; the node agent passes its kbp.toml) ------
@pytest.mark.parametrize(("toml", "kmod", "stock"), [
    ('backend = "kmod"\n[[device]]\nname = "eth1"\n', 1, 0),
    ('[[device]]\nname = "eth1"\nbackend = "stock"\n[[device]]\nname = "eth2"\n', 0, 1),
    ('backend = "auto"\n[[device]]\nname = "eth1"\n', 0, 0),       # auto asks for neither
    ('backend = "kmod"\n', 0, 0),                  # no device, no rule: asks for nothing
    ('backend = "kmod"\n[rt_class]\nrtnet_prio = 50\n', 1, 0),  # the rule's devices
    ('[defaults]\nbackend = "stock"\n[rt_class]\nrtnet_prio = 50\n', 0, 1),
    ('backend = "kmod"\n[defaults]\nbackend = "stock"\n[[device]]\nname = "eth1"\n', 0, 1),
])
def test_backend_required_says_what_the_config_asks_for(tmp_path: Path, toml: str, kmod: int,
                                                        stock: int) -> None:
    cfg = tmp_path / "kbp.toml"
    cfg.write_text(toml)
    fams = scrape(KbpCollector(make_status, warn=_no_warning, config=cfg))
    assert value(fams, "kbp_backend_required", backend="kmod") == kmod
    assert value(fams, "kbp_backend_required", backend="stock") == stock
    assert value(fams, "kbp_exporter_errors_total", section="config") == 0
    assert value(fams, "kbp_module_loaded") == 1          # the status' sections as before


def test_backend_required_only_with_a_config() -> None:
    fams = scrape(KbpCollector(make_status, warn=_no_warning))
    assert "kbp_backend_required" not in fams
    assert not [s for s in samples(fams, "kbp_exporter_errors_total")
                if s.labels["section"] == "config"]


def test_config_that_does_not_load_is_a_section_error(tmp_path: Path) -> None:
    """A config edited into something kbpctl refuses (or deleted) fails only its section,
    read afresh at every scrape as apply --watch reads it."""
    cfg = tmp_path / "kbp.toml"
    cfg.write_text('backend = "kmod"\n[[device]]\nnmae = "eth1"\n')
    warned: list[str] = []
    col = KbpCollector(make_status, warn=warned.append, config=cfg)
    fams = scrape(col)
    assert "kbp_backend_required" not in fams
    assert value(fams, "kbp_exporter_errors_total", section="config") == 1
    assert value(fams, "kbp_up") == 1 and "kbp_device_enabled" in fams
    assert len(warned) == 1 and "section config" in warned[0] and "nmae" in warned[0]
    cfg.write_text('backend = "kmod"\n[[device]]\nname = "eth1"\n')   # fixed: served again
    fams = scrape(col)
    assert value(fams, "kbp_backend_required", backend="kmod") == 1
    assert value(fams, "kbp_exporter_errors_total", section="config") == 1


def test_backend_required_is_served_when_the_status_is_not(tmp_path: Path) -> None:
    """The alert 'config asks for the module, it is not loaded' must not depend on the
    status being readable."""
    def status() -> Status:
        raise OSError(2, "No such file or directory", "/proc/modules")
    cfg = tmp_path / "kbp.toml"
    cfg.write_text('backend = "kmod"\n[[device]]\nname = "eth1"\n')
    fams = scrape(KbpCollector(status, warn=lambda _: None, config=cfg))
    assert value(fams, "kbp_up") == 0
    assert value(fams, "kbp_backend_required", backend="kmod") == 1


def test_serves_with_debians_prometheus_client(tmp_path: Path) -> None:
    """The kbpctl package runs on Debian 12's python3-prometheus-client (0.16), whose
    start_http_server returns nothing (0.20 and later return the server): the exporter serves
    /metrics over HTTP with it, and stops cleanly on SIGTERM (what the container image of
    contrib/kubernetes runs)."""
    import shutil
    import signal

    from .promclient import DEBIAN_PYTHON as debian
    from .promclient import debian_python_reason
    if why := debian_python_reason():
        pytest.skip(reason=why)
    assert shutil.which("ip")
    env = {"PYTHONPATH": SRC, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONNOUSERSITE": "1",
           "KBP_RUN_DIR": str(tmp_path / "run")}
    p = subprocess.Popen([debian, "-m", "kbp.cli", "exporter", "--listen", "127.0.0.1:0"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        line = p.stderr.readline()
        assert line.startswith("kbpctl exporter: serving http://127.0.0.1:"), line
        with urllib.request.urlopen(line.split()[-1], timeout=30) as r:
            body = r.read().decode()
        assert r.status == 200 and "\nkbp_up " in body and "kbp_exporter_errors_total" in body
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "Traceback" not in err, err


# -- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize(("listen", "says"), [
    ("9717", "is not ADDR:PORT"),
    ("localhost", "is not ADDR:PORT"),
    ("127.0.0.1:port", "is not ADDR:PORT"),
    ("127.0.0.1:65536", "port 65536 is out of range (0..65535)"),
    ("[::1:9717", "is not ADDR:PORT"),
    ("192.0.2.1:9717", "not an address of this host"),
    ("kbpx-no-such-host.invalid:9717", "no such address"),
])
def test_bad_listen(listen: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["exporter", "--listen", listen]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("kbpctl: --listen ") and says in err, err
    assert err.count("\n") == 1


def test_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "kbp.cli", "exporter", "--listen",
                            f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60,
                           env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin",
                                "KBP_RUN_DIR": str(tmp_path)})
    assert p.returncode == EXIT_FAILED
    assert p.stderr == (f"kbpctl: --listen 127.0.0.1:{port}: the port is in use (another "
                        "exporter running?): stop it or pick another port\n"), p.stderr
    assert p.stdout == ""


def test_config_flag_serves_what_the_file_requires(tmp_path: Path, run_dir: Path) -> None:
    """``kbpctl exporter --config kbp.toml``: kbp_backend_required from that file (the
    Kubernetes alert "module not loaded where the config asks"), absent without it."""
    conf = tmp_path / "kbp.toml"
    conf.write_text('[[device]]\nname = "eth1"\nbackend = "kmod"\n')
    out = tmp_path / "textfile"
    out.mkdir()
    assert cli.main(["exporter", "--once", "--textfile", str(out), "--config", str(conf)]) == 0
    fams = {f.name: f for f in text_string_to_metric_families((out / "kbp.prom").read_text())}
    req = {s.labels["backend"]: s.value for s in fams["kbp_backend_required"].samples}
    assert req == {"kmod": 1.0, "stock": 0.0}, req
    assert cli.main(["exporter", "--once", "--textfile", str(out)]) == 0
    fams = {f.name for f in text_string_to_metric_families((out / "kbp.prom").read_text())}
    assert "kbp_backend_required" not in fams


def test_once_writes_the_textfile(tmp_path: Path, run_dir: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "textfile"
    out.mkdir()
    assert cli.main(["exporter", "--once", "--textfile", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out / 'kbp.prom'}\n"
    assert [p.name for p in out.iterdir()] == ["kbp.prom"]   # no temporary file left
    fams = {f.name: f for f in text_string_to_metric_families((out / "kbp.prom").read_text())}
    assert fams["kbp_up"].samples[0].value == 1
    assert {"kbp_problems", "kbp_kernel_info", "kbp_exporter_errors"} <= set(fams)
    assert cli.main(["exporter", "--once", "--textfile", str(tmp_path / "nope")]) == EXIT_USAGE
    assert "no such directory" in capsys.readouterr().err
    assert cli.main(["exporter", "--once", "--listen", "127.0.0.1:0"]) == EXIT_USAGE
    assert cli.main(["exporter", "--interval", "0"]) == EXIT_USAGE


def test_help_teaches_scrape_and_node_exporter(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["exporter", "--help"])
    text = capsys.readouterr().out
    for want in ("127.0.0.1:9717", "loopback", "targets: ['127.0.0.1:9717']",
                 "--collector.textfile.directory=", "kbp_poller_<counter>_total",
                 "kbp_problems{kind}", "Monitoring"):
        assert want in text, want


def test_status_does_not_import_prometheus_client() -> None:
    code = ("import kbp.cli, sys, json; kbp.cli.build_parser(['status']); "
            "print(json.dumps(sorted(sys.modules)))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, timeout=60, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    mods = json.loads(p.stdout)
    assert not [m for m in mods if m.startswith(("prometheus_client", "kbp.exporter"))]


# -- docs and dashboard ----------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]


def _exported_names() -> set[str]:
    text = exporter.exposition(exporter.registry(KbpCollector(make_status)))
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_docs_list_every_metric() -> None:
    doc = (REPO / "docs/kbpctl.md").read_text()
    monitoring = doc[doc.index("## Monitoring"):doc.index("## Python API")]
    counters = {f"kbp_poller_{metric_name(c)}_total": metric_name(c)
                for c in names.POLLER_COUNTERS}
    for name in _exported_names():
        want = f"`{counters[name]}`" if name in counters else f"`{name}`"
        assert want in monitoring, name
    for kind in exporter.PROBLEM_KIND_NAMES:
        assert f"`{kind}`" in monitoring, kind


def test_grafana_dashboard_uses_exported_metrics() -> None:
    import re
    dash = json.loads((REPO / "contrib/grafana/kbp.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\bkbp_[a-z_]+", e)}
    assert used <= _exported_names(), used - _exported_names()
    assert {"kbp_poller_packets_total", "kbp_poller_wakeups_total",
            "kbp_poller_wake_delay_seconds_total", "kbp_poller_gave_way_total",
            "kbp_device_packets_total", "kbp_problems"} <= used
