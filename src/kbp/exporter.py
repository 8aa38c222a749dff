"""``kbpctl exporter``: kbp's counters as Prometheus metrics (prometheus_client).

Every scrape reads one :class:`kbp.backends.Status` -- what ``kbpctl status`` shows -- and
turns it into metric families (:class:`KbpCollector`). Each part of that ("section") is
built on its own: a section that fails (a device deleted half-way through, the module
unloaded between two reads) is left out of that scrape and counted in
``kbp_exporter_errors_total{section}``; the other sections are served as usual.

Naming: counters end in ``_total``; times are in seconds (the module's and the threads'
nanosecond counters are divided by 1e9: ``poll_ns`` becomes ``kbp_poller_poll_seconds_total``),
intervals too (``interval_us`` becomes ``..._interval_seconds``). Counter names come from
:mod:`kbp.names`. docs/kbpctl.md "Monitoring" lists every metric.

Given the config file kbpctl applies (``KbpCollector(config=PATH)``; the Kubernetes node agent,
:mod:`kbp.nodeagent`, passes its kbp.toml), a scrape also says which backends that file asks
for by name (``kbp_backend_required{backend}``): with ``kbp_module_loaded`` 0 that is "the
config asks for the module, and it is not there", which no status can say.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kbp import config, names, problems
from kbp.backends import DeviceStatus, NapiStatus, PollerStatus, Status
from kbp.errors import InvalidInput, NotRoot, OperationFailed

PREFIX = "kbp"
DEFAULT_LISTEN = "127.0.0.1:9717"
TEXTFILE_NAME = "kbp.prom"

POLLER_LABELS = ("cpu", "mode", "class", "backend", "device")
DEVICE_LABELS = ("device", "netns", "backend", "mode", "class")
NAPI_LABELS = ("device", "netns", "backend", "napi", "cpu")
THREAD_LABELS = (*NAPI_LABELS, "comm")

# Sections of a scrape, in the order they are built (kbp_exporter_errors_total{section}).
SECTIONS = ("status", "backends", "kernel", "pollers", "periodic", "devices", "napis",
            "threads", "problems")

# Problem kinds: what kbp_problems{kind} counts. Each problem status reports carries its kind,
# given where it is found (kbp.problems.Problem); no sentence is read for it.
PROBLEM_KIND_NAMES = problems.KINDS


def metric_name(counter: str) -> str:
    """A counter's name in metrics: ``poll_ns`` -> ``poll_seconds`` (converted to seconds)."""
    return counter[:-3] + "_seconds" if counter.endswith("_ns") else counter


def metric_value(counter: str, v: int | float) -> float:
    """A counter's value in the unit of :func:`metric_name`."""
    return v / 1e9 if counter.endswith("_ns") else float(v)


def _s(v: object) -> str:
    """A label value ("" for None)."""
    return "" if v is None else str(v)


def _num(v: object) -> float | None:
    """A number from status's JSON-ish dicts (None: absent or not a number)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    return None


def _poller_labels(p: PollerStatus) -> list[str]:
    return [str(p.cpu), _s(p.mode), p.cls, names.BACKEND_KMOD,
            _s(p.device)]


def _device_labels(d: DeviceStatus) -> list[str]:
    return [d.name, _s(d.netns), _s(d.backend), _s(d.mode), _s(d.cls)]


def _napi_labels(d: DeviceStatus, n: NapiStatus) -> list[str]:
    napi = str(n.id) if n.id is not None else f"#{n.index}"
    return [d.name, _s(d.netns), _s(d.backend), napi, _s(n.cpu)]


def device_state(d: DeviceStatus) -> str:
    """off (not served), incomplete (an interrupted enable), degraded (served, with
    problems) or serving."""
    if not d.backend:
        return "off"
    if not d.complete:
        return "incomplete"
    return "degraded" if d.problems else "serving"


# -- the sections --------------------------------------------------------------------------
def backend_metrics(st: Status) -> Iterator[Metric]:
    up = GaugeMetricFamily(f"{PREFIX}_up", "1: the exporter read kbp's status in this scrape "
                           "(0: it could not; see kbp_exporter_errors_total)", value=1)
    yield up
    kmod = st.backends.get(names.BACKEND_KMOD)
    yield GaugeMetricFamily(f"{PREFIX}_module_loaded",
                            "1: the kbp kernel module is loaded and answers (kmod backend)",
                            value=1 if kmod is not None and kmod.available else 0)
    av = GaugeMetricFamily(f"{PREFIX}_backend_available",
                           "1: the backend can serve devices now; label auto=1 on the one "
                           "'--backend auto' picks", labels=["backend", "auto"])
    for name, info in sorted(st.backends.items()):
        av.add_metric([name, "1" if name == st.auto else "0"], 1 if info.available else 0)
    yield av


def kernel_metrics(st: Status) -> Iterator[Metric]:
    p = st.preempt or {}
    info = InfoMetricFamily(f"{PREFIX}_kernel", "The running kernel and its preemption model "
                            "(preempts_kernel=true: a woken RT poller preempts kernel code at "
                            "once: full, lazy, rt)",
                            labels=["release", "preempt_model", "preempt_source",
                                    "preempts_kernel"])
    info.add_metric([st.kernel, _s(p.get("model")), _s(p.get("source")),
                     "true" if p.get("preempts_kernel") else "false"], {})
    yield info


def poller_metrics(st: Status) -> Iterator[Metric]:
    who = ("the kbp module's poller of a CPU, class and device (kbp/<cpu>:<device>, or "
           "kbpn/<cpu>:<device> for class non-rt)")
    for c in names.POLLER_COUNTERS:
        help_ = f"{names.POLLER_COUNTER_HELP[c]}: {who}"
        if c.endswith("_ns"):
            help_ += ", in seconds"
        fam: GaugeMetricFamily | CounterMetricFamily
        if c in names.POLLER_MAXIMA:
            fam = GaugeMetricFamily(f"{PREFIX}_poller_{metric_name(c)}", help_,
                                    labels=POLLER_LABELS)
        else:
            fam = CounterMetricFamily(f"{PREFIX}_poller_{metric_name(c)}", help_,
                                      labels=POLLER_LABELS)
        for p in st.pollers:
            v = p.counters.get(c)
            if v is not None:
                fam.add_metric(_poller_labels(p), metric_value(c, v))
        yield fam
    napis = GaugeMetricFamily(f"{PREFIX}_poller_napis", "NAPIs the poller serves",
                              labels=POLLER_LABELS)
    quota = GaugeMetricFamily(f"{PREFIX}_poller_quota", "packets per NAPI per pass",
                              labels=POLLER_LABELS)
    linger = GaugeMetricFamily(f"{PREFIX}_poller_linger_seconds", "hybrid: how long the poller "
                               "keeps polling after the last packet before it sleeps",
                               labels=POLLER_LABELS)
    prio = GaugeMetricFamily(f"{PREFIX}_poller_rt_priority", "SCHED_FIFO priority of the "
                             "poller thread (0: SCHED_NORMAL)", labels=POLLER_LABELS)
    for p in st.pollers:
        lab = _poller_labels(p)
        if p.napis is not None:
            napis.add_metric(lab, p.napis)
        if p.quota is not None:
            quota.add_metric(lab, p.quota)
        if p.linger_us is not None:
            linger.add_metric(lab, p.linger_us / 1e6)
        if p.priority is not None:
            prio.add_metric(lab, p.priority if p.policy in (None, "SCHED_FIFO", "SCHED_RR")
                            else 0)
    yield from (napis, quota, linger, prio)


def _search_metrics(fams: dict[str, Any], lab: list[str], per: Mapping[str, Any],
                    objective: float | None, objective_name: object) -> None:
    """The interval, objective and search state of one periodic poller or device."""
    s = per.get("search") if isinstance(per.get("search"), dict) else {}
    assert isinstance(s, dict)
    interval = _num(s.get("interval_us"))
    if interval is None:
        interval = _num(per.get("interval_us"))
    if interval is not None:
        fams["interval"].add_metric(lab, interval / 1e6)
    if objective is not None:
        fams["objective"].add_metric([*lab, _s(objective_name or names.OBJECTIVE_BYTES)],
                                     objective)
    if _num(s.get("converged")) is not None:
        fams["converged"].add_metric(lab, _num(s.get("converged")) or 0.0)
    if _num(s.get("restarts")) is not None:
        fams["restarts"].add_metric(lab, _num(s.get("restarts")) or 0.0)


def _periodic_families(kind: str, labels: tuple[str, ...]) -> dict[str, Any]:
    p = f"{PREFIX}_{kind}_periodic"
    return {
        "interval": GaugeMetricFamily(f"{p}_interval_seconds", "mode periodic (NetAP): the "
                                      "polling interval now (fixed, or the search's current "
                                      "round)", labels=labels),
        "objective": GaugeMetricFamily(f"{p}_objective", "mode periodic, interval searched: "
                                       "the objective's value in the last round (objective="
                                       "bytes: bytes received; bytes-per-cpu: bytes per "
                                       "CPU-second of the polling context)",
                                       labels=[*labels, "objective"]),
        "converged": GaugeMetricFamily(f"{p}_search_converged", "1: the interval search "
                                       "converged (0: still narrowing)", labels=labels),
        "restarts": CounterMetricFamily(f"{p}_search_restarts", "times the interval search "
                                        "restarted", labels=labels),
    }


def periodic_metrics(st: Status) -> Iterator[Metric]:
    """NetAP: the kmod pollers' and the stock devices' interval, objective and search."""
    pf = _periodic_families("poller", POLLER_LABELS)
    handbacks = CounterMetricFamily(f"{PREFIX}_poller_periodic_handbacks",
                                    "mode " + names.MODULE_POLLER_COUNTER_HELP["handbacks"],
                                    labels=POLLER_LABELS)
    for p in st.pollers:
        per = p.periodic
        if not per:
            continue
        lab = _poller_labels(p)
        s = per.get("search") if isinstance(per.get("search"), dict) else {}
        assert isinstance(s, dict)
        last = s.get("last_objective", s.get("last_work"))
        _search_metrics(pf, lab, per, _num(last), s.get("objective") or per.get("objective"))
        if _num(per.get("handbacks")) is not None:
            handbacks.add_metric(lab, _num(per.get("handbacks")) or 0.0)
    df = _periodic_families("device", DEVICE_LABELS)
    running = GaugeMetricFamily(f"{PREFIX}_device_periodic_service_running",
                                "stock mode periodic: 1 while the search service "
                                "(kbp.periodicd) runs", labels=DEVICE_LABELS)
    rounds = CounterMetricFamily(f"{PREFIX}_device_periodic_rounds", "stock mode periodic: "
                                 "rounds the search service measured", labels=DEVICE_LABELS)
    for d in st.devices:
        per = d.periodic
        if not d.backend or not per:
            continue
        lab = _device_labels(d)
        svc = per.get("service") if isinstance(per.get("service"), dict) else None
        last = (svc or {}).get("last")
        value = _num(last.get("value")) if isinstance(last, dict) else None
        _search_metrics(df, lab, per, value, per.get("objective"))
        if svc is not None:
            running.add_metric(lab, 1 if svc.get("running") else 0)
            if _num(svc.get("rounds")) is not None:
                rounds.add_metric(lab, _num(svc.get("rounds")) or 0.0)
    yield from (*pf.values(), handbacks, *df.values(), running, rounds)


def device_metrics(st: Status) -> Iterator[Metric]:
    enabled = GaugeMetricFamily(
        f"{PREFIX}_device_enabled", "1: kbp serves the device (backend, mode, class say how); "
        "state: serving, degraded (served, with problems: kbpctl status), incomplete (an "
        "enable was interrupted) or off (0)", labels=[*DEVICE_LABELS, "state"])
    fams = _device_counter_families("device", "", DEVICE_LABELS)
    for d in st.devices:
        lab = _device_labels(d)
        enabled.add_metric([*lab, device_state(d)], 1 if d.backend else 0)
        _add_counters(fams, lab, d.counters)
    yield enabled
    yield from fams.values()


def _device_counter_families(kind: str, help_suffix: str, labels: Sequence[str]
                             ) -> dict[str, CounterMetricFamily]:
    """kbp_<kind>_<counter> for each of names.DEVICE_COUNTERS (a device's or a NAPI's)."""
    return {c: CounterMetricFamily(f"{PREFIX}_{kind}_{c}",
                                   names.DEVICE_COUNTER_HELP[c] + help_suffix, labels=labels)
            for c in names.DEVICE_COUNTERS}


def _add_counters(fams: Mapping[str, CounterMetricFamily], labels: list[str],
                  counters: Mapping[str, int | None]) -> None:
    """One sample per family whose counter was read (None: not read, no sample)."""
    for c, fam in fams.items():
        v = counters.get(c)
        if v is not None:
            fam.add_metric(labels, v)


def napi_metrics(st: Status) -> Iterator[Metric]:
    fams = _device_counter_families("napi", ", per NAPI", NAPI_LABELS)
    info = InfoMetricFamily(f"{PREFIX}_napi", "1 per NAPI of a device kbp serves: the CPU "
                            "that polls it (cpu=\"\": not pinned), its IRQ and its state",
                            labels=[*NAPI_LABELS, "irq", "threaded", "state"])
    for d in st.devices:
        if not d.backend:
            continue
        for n in d.napis:
            lab = _napi_labels(d, n)
            info.add_metric([*lab, _s(n.irq), _s(n.threaded), _s(n.state)], {})
            _add_counters(fams, lab, n.counters)
    yield info
    yield from fams.values()


def thread_metrics(st: Status) -> Iterator[Metric]:
    """The polling thread of each NAPI of a served device, from /proc (the stock backend's
    NAPI threads; the kmod backend's poller thread of the NAPI)."""
    threads = [(d, n) for d in st.devices if d.backend for n in d.napis if n.thread]
    for c in names.POLLER_COUNTERS:
        if not any(n.thread and n.thread.counters.get(c) is not None for _, n in threads):
            continue  # not read from /proc: no family
        help_ = (f"{names.POLLER_COUNTER_HELP[c]}: the NAPI's polling thread, read from "
                 "/proc/<pid> (poll: its CPU time, schedstat; sleeps: its voluntary context "
                 "switches)")
        fam = CounterMetricFamily(f"{PREFIX}_napi_thread_{metric_name(c)}", help_,
                                  labels=THREAD_LABELS)
        for d, n in threads:
            assert n.thread is not None
            v = n.thread.counters.get(c)
            if v is not None:
                fam.add_metric([*_napi_labels(d, n), n.thread.comm], metric_value(c, v))
        yield fam
    prio = GaugeMetricFamily(f"{PREFIX}_napi_thread_rt_priority", "SCHED_FIFO/RR priority of "
                             "the NAPI's polling thread (0: SCHED_OTHER)", labels=THREAD_LABELS)
    for d, n in threads:
        assert n.thread is not None
        t = n.thread
        prio.add_metric([*_napi_labels(d, n), t.comm],
                        t.priority if t.policy in ("SCHED_FIFO", "SCHED_RR") else 0)
    yield prio


def required_backends(cfg: config.Config) -> set[str]:
    """The backends ``cfg`` asks for by name (kmod, stock): each ``[[device]]``'s, and the
    ``[rt_class]`` rule's (``[defaults]`` backend, else the file's). ``auto`` asks for
    neither: it takes the module when it is loaded, else the stock backend."""
    wanted = {d.backend for d in cfg.devices}
    if cfg.rt_class is not None:
        wanted.add(str(cfg.defaults.get("backend", cfg.backend)))
    return wanted & {names.BACKEND_KMOD, names.BACKEND_STOCK}


def config_metrics(path: Path) -> Iterator[Metric]:
    """kbp_backend_required{backend}: what the config file at ``path`` asks for (read afresh
    at every scrape, as ``apply --watch`` reads it; a file that does not load fails the
    section, counted in kbp_exporter_errors_total{section="config"})."""
    wanted = required_backends(config.load(path))
    fam = GaugeMetricFamily(f"{PREFIX}_backend_required", "1: the config file kbpctl "
                            "applies asks for this backend by name (backend = \"kmod\" or "
                            "\"stock\" for a [[device]] or the [rt_class] rule; \"auto\" asks "
                            "for neither); kmod 1 with kbp_module_loaded 0: the config asks for "
                            "the kbp module and it is not loaded", labels=["backend"])
    for b in (names.BACKEND_KMOD, names.BACKEND_STOCK):
        fam.add_metric([b], 1 if b in wanted else 0)
    yield fam


def problem_metrics(st: Status) -> Iterator[Metric]:
    counts = dict.fromkeys(PROBLEM_KIND_NAMES, 0)
    per_dev = GaugeMetricFamily(f"{PREFIX}_device_problems", "problems kbpctl status reports "
                                "for the device", labels=[*DEVICE_LABELS])
    for d in st.devices:
        if not d.backend:  # status shows problems of served devices only
            continue
        for p in d.problems:
            counts[p.kind] += 1
        per_dev.add_metric(_device_labels(d), len(d.problems))
    note: problems.Problem
    for note in (st.preempt or {}).get("notes") or []:
        counts[note.kind] += 1
    killed = GaugeMetricFamily(f"{PREFIX}_killed_process_changes", "changes a killed "
                               "process left set (owner bench-knobs: a benchmark's global "
                               "sysctls; nicpair: its NIC ports), from its journal; 'kbpctl "
                               "disable --all' puts them back", labels=["owner", "pid"])
    for o in st.orphans:
        counts[o.problem.kind] += 1
        killed.add_metric([o.owner, str(o.pid)], o.changes)
    fam = GaugeMetricFamily(f"{PREFIX}_problems", "problems kbpctl status reports now, by "
                            "kind (docs/kbpctl.md, Monitoring); 'kbpctl status' says what to "
                            "do about each", labels=["kind"])
    for k, n in counts.items():
        fam.add_metric([k], n)
    yield fam
    yield per_dev
    yield killed


Section = Callable[[Status], Iterable[Metric]]
BUILDERS: dict[str, Section] = {
    "backends": backend_metrics,
    "kernel": kernel_metrics,
    "pollers": poller_metrics,
    "periodic": periodic_metrics,
    "devices": device_metrics,
    "napis": napi_metrics,
    "threads": thread_metrics,
    "problems": problem_metrics,
}


class KbpCollector(Collector):
    """kbp's metrics, built per scrape from ``status()`` (default :func:`kbp.backends.status`).

    A section that raises is left out of the scrape, counted in
    ``kbp_exporter_errors_total{section}`` and reported on stderr (once per new message);
    when the status itself cannot be read, only ``kbp_up 0`` and the exporter's own metrics
    are served (and, with ``config``, the section of that name: :func:`config_metrics`)."""

    def __init__(self, status: Callable[[], Status] | None = None,
                 builders: Mapping[str, Section] | None = None,
                 warn: Callable[[str], None] | None = None,
                 config: Path | None = None) -> None:
        if status is None:
            from kbp import backends
            status = backends.status
        self._status = status
        self.builders = dict(BUILDERS if builders is None else builders)
        self.config = config
        self.errors = dict.fromkeys(("status", *self.builders,
                                     *(("config",) if config is not None else ())), 0)
        self._warn = warn or _stderr
        self._said: dict[str, str] = {}
        self._lock = threading.Lock()  # scrapes run one at a time (status reads netlink)

    def _failed(self, section: str, e: BaseException) -> None:
        self.errors[section] = self.errors.get(section, 0) + 1
        msg = f"{type(e).__name__}: {e}"
        if self._said.get(section) != msg:
            self._said[section] = msg
            self._warn(f"kbpctl exporter: section {section} left out of the scrape ({msg})")

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            out = list(self._collect())
        yield from out

    def _collect(self) -> Iterator[Metric]:
        t0 = time.monotonic()
        try:
            st: Status | None = self._status()
        except Exception as e:
            self._failed("status", e)
            st = None
        if st is None:
            yield GaugeMetricFamily(f"{PREFIX}_up", "1: the exporter read kbp's status in "
                                    "this scrape (0: it could not; see "
                                    "kbp_exporter_errors_total)", value=0)
        else:
            for name, build in self.builders.items():
                try:
                    fams = list(build(st))  # whole or not at all
                except Exception as e:
                    self._failed(name, e)
                    continue
                yield from fams
        if self.config is not None:  # the file, not the status: served either way
            try:
                yield from list(config_metrics(self.config))
            except Exception as e:
                self._failed("config", e)
        err = CounterMetricFamily(f"{PREFIX}_exporter_errors", "scrape sections the exporter "
                                  "left out because reading or building them failed (the "
                                  "message is on the exporter's stderr)", labels=["section"])
        for name, n in self.errors.items():
            err.add_metric([name], n)
        yield err
        yield GaugeMetricFamily(f"{PREFIX}_exporter_scrape_duration_seconds",
                                "how long this scrape took to read and build",
                                value=time.monotonic() - t0)


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def registry(collector: Collector | None = None) -> CollectorRegistry:
    """A registry holding only kbp's collector (no process metrics of the exporter)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector or KbpCollector())
    return reg


def exposition(reg: CollectorRegistry) -> str:
    """The text exposition of one scrape."""
    return generate_latest(reg).decode()


# -- the command ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """``ADDR:PORT`` (``[v6addr]:PORT`` for IPv6); PORT 0 picks a free port."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.%\w]+)\]:(\d+)|([^:\[\]\s]+):(\d+)", text)
    if not m:
        raise InvalidInput(f"--listen {text!r} is not ADDR:PORT (e.g. 127.0.0.1:9717, "
                           "[::1]:9717, 0.0.0.0:9717 for every address)")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise InvalidInput(f"--listen {text!r}: port {port} is out of range (0..65535)")
    return Listen(host, port)


def _start_http_server(listen: Listen, reg: CollectorRegistry) -> Any:
    """prometheus_client's /metrics application on a thread-per-request WSGI server, served
    by a daemon thread: what its start_http_server does, which returns the server (to know
    the port bound, and to stop it) only since prometheus-client 0.20 -- Debian 12's 0.16,
    the kbpctl package's, returns nothing."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    family, _, _, _, sockaddr = socket.getaddrinfo(
        listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = family

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = make_server(str(sockaddr[0]), listen.port, make_wsgi_app(reg), Server,
                        handler_class=QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="kbp-exporter-http",
                     daemon=True).start()
    return httpd


def serve(listen: Listen, reg: CollectorRegistry) -> tuple[Any, Listen]:
    """Start the HTTP server (a daemon thread); the server and the address it is bound to.
    Binding failures become one-line errors."""
    try:
        httpd = _start_http_server(listen, reg)
    except socket.gaierror as e:
        raise InvalidInput(f"--listen {listen}: no such address ({e.strerror}): use a local "
                           "IP address, e.g. 127.0.0.1") from None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise OperationFailed(f"--listen {listen}: the port is in use (another exporter "
                                  "running?): stop it or pick another port") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise InvalidInput(f"--listen {listen}: not an address of this host: use one "
                               "of its IP addresses, e.g. 127.0.0.1") from None
        if e.errno == errno.EACCES:
            raise NotRoot(f"--listen {listen}: ports below 1024 need root "
                          "(CAP_NET_BIND_SERVICE): pick a port above 1023") from None
        raise OperationFailed(f"--listen {listen}: {e.strerror or e}") from None
    host, port = httpd.server_address[:2]
    return httpd, Listen(str(host), int(port))


def check_textfile_dir(d: Path) -> Path:
    if not d.is_dir():
        raise InvalidInput(f"--textfile {d}: no such directory (node_exporter's "
                           "--collector.textfile.directory; create it first)")
    if not os.access(d, os.W_OK):
        raise NotRoot(f"--textfile {d}: not writable by this user: run as root or pick a "
                      "directory you can write")
    return d / TEXTFILE_NAME


def write_textfile(path: Path, reg: CollectorRegistry) -> None:
    """DIR/kbp.prom, atomically (a temporary file renamed over it)."""
    from prometheus_client import write_to_textfile
    try:
        write_to_textfile(str(path), reg)
    except OSError as e:
        raise OperationFailed(f"writing {path}: {e.strerror or e}") from None


def not_root_note() -> str | None:
    """What a non-root exporter cannot read (None as root)."""
    if os.geteuid() == 0:
        return None
    return ("kbpctl exporter: note: not root: the kbp module answers CAP_NET_ADMIN only, and "
            "the NAPIs and threads of devices in other network namespaces need root, so "
            "their series are missing (kbp_problems{kind=\"needs_root\"} counts them); "
            "everything else is served")


def run(listen: str | None, textfile: Path | None, interval: float, once: bool,
        out: Callable[[str], None], config: Path | None = None) -> int:
    """``kbpctl exporter``; ``out`` writes one line to stdout.  With ``config`` (the file
    kbpctl applies), also ``kbp_backend_required`` (:func:`config_metrics`)."""
    if not interval > 0:
        raise InvalidInput(f"--interval {interval:g}: use a positive number of seconds")
    if once and listen is not None:
        raise InvalidInput("--once writes one scrape and exits: it serves no HTTP, drop "
                           "--listen")
    addr = parse_listen(listen if listen is not None else DEFAULT_LISTEN) \
        if listen is not None or (textfile is None and not once) else None
    path = check_textfile_dir(textfile) if textfile is not None else None
    reg = registry(KbpCollector(config=config) if config is not None else None)
    if once:
        if path is not None:
            write_textfile(path, reg)
            out(f"wrote {path}")
        else:
            sys.stdout.write(exposition(reg))
            sys.stdout.flush()
        return 0
    note = not_root_note()
    if note:
        _stderr(note)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    httpd = None
    if addr is not None:
        httpd, bound = serve(addr, reg)
        _stderr(f"kbpctl exporter: serving http://{bound}/metrics")
    try:
        if path is not None:
            write_textfile(path, reg)  # the first write's failure is the command's
            _stderr(f"kbpctl exporter: writing {path} every {interval:g} s")
        while not stop.wait(interval):
            if path is not None:
                try:
                    write_textfile(path, reg)
                except OperationFailed as e:
                    _stderr(f"kbpctl exporter: {e} (retrying in {interval:g} s)")
        return 0
    finally:
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
