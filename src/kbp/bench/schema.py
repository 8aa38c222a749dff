"""The results document of a benchmark (``results.json``, schema ``kbp-bench/N``): its
version, its shape as TypedDicts, and the one place where older documents are read.

:data:`SCHEMA` is the version every results.json is written with (:func:`dump`).  The
TypedDicts say what the document holds: the run's configuration (:class:`RunConfig`), one
record per latency run (:class:`LatencyRun`), RFC 2544 search (:class:`ThroughputRun`),
idle-cost run (:class:`IdleRun`) and stream (:class:`StreamRun`), each mode's status
(:class:`ModeStatus`) and summary (:data:`ModeSummary`), the CPUs by role
(:class:`PlacementDoc`) and the whole document (:class:`Results`).  The JSON stays plain
JSON: a TypedDict is a dict, so the writers and readers keep indexing it, and a reader's key
is one a type checker can check.

A key marked ``Required`` is one every writer has written (kbp-bench/1 once upgraded) and
a reader relies on: the report indexes a run's ``rep``, ``mode``, ``part`` and ``condition``
and a search's frame, rates and bound; a placement is its ``cpus``, a mode's status its
``status``, a scenario its ``name``.  The others may be missing (an interrupted run, a
document from before the key existed).
:func:`load` reads a results.json of any version this code knows (or takes a dict), brings
it to today's shape in place (:func:`upgrade`: kbp-bench/1's one-scenario, two-CPU form;
modes under older names, :func:`kbp.bench.modes.aliases`), refuses a newer version or a
document without its required keys (:class:`SchemaError`, naming the version or the key's
path, ``runs[3].condition``) and returns it.  :func:`load_samples` and :func:`dump_samples`
do the same for the raw samples beside it (samples.json.gz).
"""

# no ``from __future__ import annotations``: Required[] must be seen by TypedDict at class
# creation (Python 3.11 does not see it in a string annotation)

import gzip
import json
import types
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import (
    Any,
    Required,
    TypedDict,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

PREFIX = "kbp-bench/"
VERSION = 2
#: the schema every results.json is written with
SCHEMA = f"{PREFIX}{VERSION}"
RESULTS_FILE = "results.json"
SAMPLES_FILE = "samples.json.gz"


class SchemaError(ValueError):
    """A results document this code cannot read: a newer or unknown version, or a required
    key missing (the message names the version or the key's path)."""


# -- statistics (kbp.bench.stats) ------------------------------------------------------------
#: :func:`kbp.bench.stats.summarize` of samples: n, mean, sd, min, percentiles, max
Stats = TypedDict("Stats", {
    "n": int, "mean": float | None, "sd": float | None, "min": float | None,
    "max": float | None, "p50": float | None, "p90": float | None, "p99": float | None,
    "p99.9": float | None}, total=False)


class Aggregate(TypedDict, total=False):
    """One metric over repetitions (:func:`kbp.bench.stats.aggregate`), with its ratio to
    the baseline mode of the same repetition (``ratio_to_napi``, the same shape)."""

    n: int
    median: float | None
    min: float | None
    max: float | None
    q1: float | None
    q3: float | None
    ratio_to_napi: "Aggregate"


#: {metric: aggregate} of one mode in one part and condition (the report's table row)
ModeSummary = dict[str, Aggregate]

class TailStat(TypedDict, total=False):
    """One tail statistic of :func:`kbp.bench.stats.tail_summary` (``p99``, ``p99.9``,
    ``max``): the k-th largest of n, its moving-block bootstrap CI, where its tail comes
    from (per repetition, in how many bursts), the same with losses as infinite."""

    value: float
    k: int
    n: int
    above: int
    few: bool
    ci95: list[float | None]
    by_rep: list[int]
    episodes: int
    largest_episode: int
    next_above: float | None
    gap: int
    few_episodes: bool
    with_lost: dict[str, Any]

#: :func:`kbp.bench.stats.tail_summary`; pooled tails carry ``runs`` too
TailSummary = TypedDict("TailSummary", {
    "n": int, "lost": int, "resamples": int, "ci_level": float, "seed": int,
    "ci_method": str, "reps": list[int], "blocks": list[int],
    "p99": TailStat | None, "p99.9": TailStat | None, "max": TailStat | None,
    "runs": int | None}, total=False)


# -- what a run measured (kbp.bench.sysstat) -------------------------------------------------
class CpuTime(TypedDict, total=False):
    seconds: dict[str, float]
    busy_pct: float
    pct: dict[str, float]            # user, system, softirq, irq, steal, ...


class ThreadTime(TypedDict, total=False):
    name: str
    role: str                        # poller, nonrt_poller, app (kbp.bench.sysstat.ROLE_*)
    run_ns: int
    wait_ns: int
    timeslices: int
    cpu_pct: float


class SysDelta(TypedDict, total=False):
    """:func:`kbp.bench.sysstat.delta`: CPU time by CPU ("0", "1", ...), interrupts and
    softirqs per CPU, the threads' CPU time by pid, energy."""

    wall_s: float
    cpu: dict[str, CpuTime]
    hardirqs_total: list[int]
    hardirqs: dict[str, list[int]]
    softirqs: dict[str, list[int]]
    net_rx: list[int]
    threads: dict[str, ThreadTime]
    threads_cpu_pct: dict[str, float]   # the threads' cpu_pct summed by role
    energy: dict[str, Any]


# -- the records -----------------------------------------------------------------------------
class KernelDelay(TypedDict, total=False):
    """bpftrace's kernel-side delays of a latency run (:mod:`kbp.bench.trace`)."""

    xmit_to_poll: Stats | None          # the RT flow's, over the RT server device's NAPIs
    xmit_to_poll_match: dict[str, Any]  # how it was keyed, matched, stale, foreign, ...
    xmit_to_poll_napi_id: str | None    # before issue 38: the NAPI with the most matches
    xmit_to_poll_other: int             # before issue 38: matches on the other NAPIs
    netrx_raise_to_entry: dict[str, Stats]      # by CPU
    poller_wake_to_run: Stats | None
    app_wake_to_run: Stats | None


class LatencyRun(TypedDict, total=False):
    """One RT latency run of a mode (:func:`kbp.bench.measure.latency.latency_run`)."""

    rep: Required[int]
    mode: Required[str]
    part: Required[str]               # rtt, table2, rtt-tcp (kbp.bench.parts)
    condition: Required[str]          # load-off, load-on, flood, ... (the scenario's)
    scenario: str
    rate: float
    poisson: bool
    uniform_us: list[float]
    payload: int
    duration: float
    waited_for_quiet_s: float
    quiet: dict[str, Any]
    mode_setup: dict[str, Any]
    app: str
    app_cpu: int | None
    app_fifo: int | None               # the app's SCHED_FIFO priority (0: default policy)
    search: dict[str, Any]             # the periodic modes' interval search
    tester: dict[str, Any]             # kbp-rtt's counts: sent, received, lost, ...
    rtt_ns: Stats                      # kernel-stamped round trips
    rtt_user_ns: Stats
    lost: int
    rtt_tail: TailSummary
    lateness_ns: Stats
    lateness_user_ns: Stats
    rt_cpu_rx: dict[str, Any]          # NET_RX on the RT CPU (shared-cpu, rt-split)
    nonrt_cpu_rx: dict[str, Any]       # and on the non-RT CPU (rt-split)
    rt_cpu_check: dict[str, Any]       # kbp.bench.steer.rt_cpu_check
    foreign_cpu: dict[str, Any]        # kbp.bench.foreign.check: another process on the RT CPU
    attempts: int                      # 1, or more when disturbed attempts were run again
    heavy: dict[str, Any]              # the heavy device over the run (shared-cpu, rt-split)
    heavy_napi_threads: dict[str, Any]  # --heavy-napi rt-cpu: its NAPI threads' CPU share
    flood_block: dict[str, Any]        # the load's report over the block of runs
    table2: dict[str, Any]             # the Table 2 condition (part table2)
    steering: dict[str, Any]
    sys: SysDelta
    poller: dict[str, float]           # the poller's counters over the run
    kernel_delay: KernelDelay | None
    # --anatomy: where the run's round trips went, request by request (kbp.bench.anatomy)
    anatomy: dict[str, Any]
    anatomy_error: str
    kernel_delay_error: str
    kernel_delay_skipped: str | None
    took_s: float


class ThroughputRun(TypedDict, total=False):
    """One RFC 2544 zero-loss search of a mode (:func:`kbp.bench.measure.throughput.
    search`)."""

    rep: Required[int]
    mode: Required[str]
    frame: Required[int]
    throughput_pps: Required[float]
    throughput_mbps: Required[float]
    bound: Required[str]
    part: str
    condition: str                     # shared-cpu: "flood" (the search under the flood)
    flood_block: dict[str, Any]
    payload: int
    hi: float
    resolution: float
    trial_s: float
    ceiling_probe: dict[str, Any] | None
    trials: list[dict[str, Any]]
    sys: SysDelta | None
    waited_for_quiet_s: float
    quiet: dict[str, Any]
    took_s: float


class IdleRun(TypedDict, total=False):
    """One mode on with no traffic (:func:`kbp.bench.measure.idle.idle_run`)."""

    mode: Required[str]
    part: str
    duration: float
    waited_for_quiet_s: float
    quiet: dict[str, Any]
    app: str
    mode_setup: dict[str, Any]
    search: dict[str, Any]
    poller_threads: dict[str, str]     # pid: name
    nonrt_threads: dict[str, str]      # pid: name (Mode.nonrt_threads(): the -part modes)
    app_threads: list[str]
    sys: SysDelta
    poller: dict[str, float]


class StreamRun(TypedDict, total=False):
    """One bulk stream of a mode (:mod:`kbp.bench.scenarios.stream`)."""

    rep: Required[int]
    mode: Required[str]
    part: Required[str]
    proto: str
    duration: float
    warmup: float
    length: int
    quiet: dict[str, Any]
    mode_setup: dict[str, Any]
    poller_threads: dict[str, str]
    receiver_threads: list[str]
    iperf: dict[str, Any]              # what iperf3 reported (kbp.bench.workloads.Stream)
    sys: SysDelta
    dev: dict[str, int]                # the RT device's packets, bytes, dropped
    dev_source: str                    # where they were read (/proc/PID/net/dev, ip)
    irqs: int | None
    poller: dict[str, float]
    search: dict[str, Any]             # the periodic modes' interval search
    search_samples: list[dict[str, Any]]   # and its state read while the stream ran
    took_s: float


class ModeStatus(TypedDict, total=False):
    """A mode asked for: ``ok`` (it ran) or ``skipped`` with the reason."""

    status: Required[str]
    reason: str | None


# -- the run ---------------------------------------------------------------------------------
class RunConfig(TypedDict, total=False):
    """:class:`kbp.bench.runner.BenchConfig` as written (``to_json``: ``out`` a string)."""

    scenario: str
    modes: list[str]
    reps: int
    parts: list[str] | None
    loads: list[str]
    duration: float
    warmup: float
    rate: float
    frame: int
    poisson: bool
    uniform_us: list[float] | None
    flood: str | None
    heavy_napi: str                   # --heavy-napi: sender or rt-cpu (shared-cpu)
    flood_len: int
    flood_bitrate: str
    tcp_len: int
    stream_warmup: float
    udp_len: int
    periodic_round_ms: int
    periodic_interval_us: int | None
    idle_duration: float
    table2_scale: float
    table2_duration: float
    table2_reps: int | None
    rfc_frames: list[int]
    rfc_trial: float
    rfc_resolution: float
    rfc_reps: int
    rfc_max_pps: float | None
    rfc_loss_tolerance: float
    cpus: dict[str, int]
    nic_pair: list[str] | None
    tester_prio: int
    rt_prio: int
    app_policy: str | None
    budget_s: float | None
    spin_app: str
    trace: bool
    anatomy: bool
    wait_quiet_s: float
    settle_s: float
    seed: int
    emulated: bool | None
    out: str
    command: str
    deprecated: list[str]


class ScenarioDoc(TypedDict, total=False):
    name: Required[str]
    title: str
    parts: list[str] | None


class PlacementColumn(TypedDict):
    cpu: int
    label: str                         # the roles on it: "tester+flood+heavy"


class PlacementDoc(TypedDict, total=False):
    """The CPUs by role (:meth:`kbp.bench.placement.Placement.to_json`), how the RT app
    runs, and what runs in each role."""

    cpus: Required[dict[str, int]]     # role: CPU
    available: list[int]
    pinned: list[str]
    note: str
    by_cpu: dict[str, list[str]]       # CPU: its roles
    columns: dict[str, PlacementColumn]
    app_policy: str
    app_fifo: int                      # the app's SCHED_FIFO priority (0: default policy)
    runs: dict[str, str]               # role: what runs there


class Summary(TypedDict, total=False):
    """The report's summary (:func:`kbp.bench.report.add_summary`): latency runs by part,
    condition and mode; RFC 2544 by frame and mode; idle cost by mode; and what a scenario
    adds (``per_mode``, ``split``, ``stream``, ...)."""

    rtt: dict[str, dict[str, ModeSummary]]
    table2: dict[str, dict[str, ModeSummary]]
    rfc2544: dict[str, dict[str, dict[str, Any]]]
    idle: dict[str, ModeSummary]
    stream: dict[str, dict[str, ModeSummary]]
    per_mode: dict[str, Any]
    equal_work: dict[str, Any]
    split: dict[str, Any]
    steering_check: dict[str, Any]
    rt_cpu_rx: dict[str, Any]
    flood_vs_idle: dict[str, Any]
    acceptance: dict[str, Any]
    anatomy: dict[str, Any]


class Budget(TypedDict, total=False):
    budget_s: float
    reps_asked: int
    reps: int
    planned_s: float
    runnable_modes: int


class Results(TypedDict, total=False):
    """A whole results.json (kbp-bench/2): the run's head (written before the first run),
    the records as they come, the tail (pooled tails, finishing time) and, from the
    report, the summary."""

    schema: Required[str]
    started: str
    finished: str
    command: str
    config: RunConfig
    scenario: ScenarioDoc
    testbed: str
    emulated: bool
    machine: dict[str, Any]
    tools: dict[str, str]
    quiet_before: dict[str, Any]
    quiet_after: dict[str, Any]
    placement: PlacementDoc
    modes: dict[str, ModeStatus]
    runs: list[LatencyRun]
    rfc2544: list[ThroughputRun]
    idle: list[IdleRun]
    idle_skipped: dict[str, str]
    stream: list[StreamRun]
    interrupted: bool
    mode_order_rule: str
    mode_order: dict[str, list[str]]          # repetition: the modes in its order
    settle_after_move_s: float
    settle_after_part: bool        # the settle follows the -part modes too (issue 38)
    kernel_trace: str
    budget: Budget
    tails: dict[str, TailSummary]             # "part|condition|mode": pooled tails
    recovered: list[str]
    restore_problems: list[str]
    rt_cpu_check_failed: list[str]
    disturbed_runs: list[dict[str, Any]]   # attempts discarded by the foreign-CPU check
    waited_for_quiet_s: float
    rt_link_recreated: int
    nic_pair: dict[str, Any]
    testbed_devices: dict[str, dict[str, Any]]
    client_ends: dict[str, Any]
    flood: dict[str, Any]
    heavy_napi: dict[str, Any]          # shared-cpu: where the heavy NAPI polled
    steering: dict[str, Any]
    rt_split: dict[str, Any]
    stream_setup: dict[str, Any]
    summary: Summary
    percentile_definition: str


Samples = dict[str, list[int]]    # "part|condition|mode": kernel round trips (ns)


# -- typed accessors (a part may be missing: an interrupted run, an older writer) -------------
def config_of(doc: Results) -> RunConfig:
    """The run's configuration ({} when the document has none)."""
    return doc.get("config") or RunConfig()


def summary_of(doc: Results) -> Summary:
    """The report's summary ({} before :func:`kbp.bench.report.add_summary`)."""
    return doc.get("summary") or Summary()


def sample_key(part: str, condition: str, mode: str) -> str:
    """The key of a part, condition and mode in the samples and the pooled tails."""
    return f"{part}|{condition}|{mode}"


# -- versions --------------------------------------------------------------------------------
def version_of(doc: Mapping[str, Any]) -> int:
    """The version of a results document (1 for ``kbp-bench/1``); SchemaError for a
    document of another kind or of a version newer than this code reads."""
    s = doc.get("schema")
    if s is None:
        raise SchemaError(f"not a kbp bench results document: no \"schema\" (this kbp "
                          f"reads {PREFIX}1 to {SCHEMA})")
    tail = s[len(PREFIX):] if isinstance(s, str) and s.startswith(PREFIX) else ""
    if not tail.isdigit() or int(tail) < 1:
        raise SchemaError(f"not a kbp bench results document: schema {s!r} (this kbp reads "
                          f"{PREFIX}1 to {SCHEMA})")
    if int(tail) > VERSION:
        raise SchemaError(f"results schema {s} is newer than this kbp reads ({SCHEMA}): "
                          "read it with the kbp that wrote it, or a newer one")
    return int(tail)


def _v1_to_v2(doc: dict[str, Any]) -> None:
    """kbp-bench/1 (0f04fc6): one scenario, so ``scenario`` named the part (in the config
    ``scenarios``, in each run ``scenario``), and two CPUs (``rt_cpu``, ``load_cpu``)."""
    from kbp.bench import scenarios
    from kbp.bench.placement import Placement
    cfg = doc.setdefault("config", {})
    if "scenarios" in cfg:
        cfg["parts"] = cfg.pop("scenarios")
    doc["scenario"] = {"name": scenarios.DEFAULT,
                       "title": scenarios.get(scenarios.DEFAULT).title,
                       "parts": cfg.get("parts")}
    for r in doc.get("runs") or []:
        if "part" not in r:
            r["part"], r["scenario"] = r.get("scenario"), scenarios.DEFAULT
    for s in doc.get("rfc2544") or []:
        s.setdefault("part", "rfc2544")
    doc["placement"] = Placement.from_json(doc.get("placement") or {}).to_json()


#: {version: what brings a document of that version to the next}
UPGRADES: dict[int, Callable[[dict[str, Any]], None]] = {1: _v1_to_v2}


def _today(name: str, old: Mapping[str, str]) -> str:
    """``name`` with an older mode name in it replaced by today's: the whole string, or a
    part of a ``part|condition|mode`` key (tails, samples)."""
    if name in old:
        return old[name]
    if "|" in name:
        return "|".join(old.get(p, p) for p in name.split("|"))
    return name


def _rename_in(x: Any, old: Mapping[str, str]) -> None:
    """Every older mode name in the dicts and lists of ``x`` (keys and string values)
    replaced by today's, in place."""
    if isinstance(x, dict):
        items = [(_today(k, old) if isinstance(k, str) else k, v) for k, v in x.items()]
        x.clear()
        for k, v in items:
            x[k] = _today(v, old) if isinstance(v, str) else v
            _rename_in(v, old)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            if isinstance(v, str):
                x[i] = _today(v, old)
            else:
                _rename_in(v, old)


def rename_old_modes(doc: Results | dict[str, Any]) -> Results:
    """A document written before a mode was renamed (kbp.bench.modes' aliases: the stock
    backend's hybrid modes before 2026-11-27) with today's names, in place; the command
    stays as it was run."""
    from kbp.bench import modes
    command = doc.get("command")
    _rename_in(doc, modes.aliases())
    if command is not None:
        doc["command"] = command
    return cast(Results, doc)


def upgrade(doc: Results | dict[str, Any]) -> Results:
    """``doc`` in today's shape, in place (and returned): older mode names renamed, then
    each version's step up to :data:`VERSION`.  SchemaError for a newer or unknown one."""
    v = version_of(doc)
    rename_old_modes(doc)
    while v < VERSION:
        UPGRADES[v](cast(dict[str, Any], doc))
        v += 1
        doc["schema"] = f"{PREFIX}{v}"
    return cast(Results, doc)


def upgrade_samples(samples: dict[str, list[int]]) -> Samples:
    """A samples.json.gz's ``part|condition|mode`` keys with today's mode names, in place."""
    from kbp.bench import modes
    old = modes.aliases()
    items = [(_today(k, old), v) for k, v in samples.items()]
    samples.clear()
    samples.update(items)
    return samples


# -- required keys ---------------------------------------------------------------------------
@cache
def _hints(tp: Any) -> dict[str, Any]:
    return get_type_hints(tp)


def _inner(tp: Any) -> list[Any]:
    """The types ``tp`` is made of: X and None of ``X | None``, the items of a list or
    dict, the values of a TypedDict."""
    if get_origin(tp) in (Union, types.UnionType, list, dict):
        return list(get_args(tp))
    return list(_hints(tp).values()) if is_typeddict(tp) else []


@cache
def _leads_to_required(tp: Any) -> bool:
    """A value of type ``tp`` has, or may hold, a TypedDict with required keys: the checker
    follows only such paths (the rest of a document is the writers' business)."""
    seen: set[str] = set()
    todo = [tp]
    while todo:
        t = todo.pop()
        if is_typeddict(t) and t.__required_keys__:
            return True
        if repr(t) not in seen:
            seen.add(repr(t))
            todo += _inner(t)
    return False


def _problems(value: Any, tp: Any, path: str) -> Iterator[str]:
    """What is wrong in ``value`` against type ``tp`` at ``path``: a required key missing,
    or something else where an object or a list holding required keys belongs."""
    if not _leads_to_required(tp):
        return
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return
        tp = args[0] if len(args) == 1 else Any
    if is_typeddict(tp):
        if not isinstance(value, dict):
            yield f"{path or 'the document'}: an object expected, found {type(value).__name__}"
            return
        for key in sorted(tp.__required_keys__):
            if key not in value:
                yield f"{_join(path, key)}: required key missing"
        hints = _hints(tp)
        for key, v in value.items():
            if key in hints:
                yield from _problems(v, hints[key], _join(path, key))
    elif get_origin(tp) is list:
        if not isinstance(value, list):
            yield f"{path}: a list expected, found {type(value).__name__}"
            return
        (item,) = get_args(tp) or (Any,)
        for i, v in enumerate(value):
            yield from _problems(v, item, f"{path}[{i}]")
    elif get_origin(tp) is dict:
        if not isinstance(value, dict):
            yield f"{path}: an object expected, found {type(value).__name__}"
            return
        _, item = get_args(tp) or (Any, Any)
        for k, v in value.items():
            yield from _problems(v, item, _join(path, str(k)))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def problems(doc: Any) -> list[str]:
    """What a document of today's shape lacks, by path: every required key missing
    (``runs[3].condition: required key missing``) and anything but an object or a list where
    one holding required keys belongs (``runs: a list expected, found dict``); [] when it is
    whole."""
    return list(_problems(doc, Results, ""))


def check(doc: Any, where: str = "results") -> Results:
    """``doc`` if it has every required key, else SchemaError naming the paths."""
    bad = problems(doc)
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise SchemaError(f"{where}: " + "; ".join(bad[:5]) + more)
    return cast(Results, doc)


# -- reading and writing ---------------------------------------------------------------------
def read(doc: Results | dict[str, Any], where: str = "results") -> Results:
    """A results document (a dict, changed in place) in today's shape, checked."""
    return check(upgrade(doc), where)


def load(src: Path | str | dict[str, Any]) -> Results:
    """A results.json (a path to it or to its run directory, or the parsed dict, upgraded
    in place) in today's shape, checked: SchemaError names a newer version or a missing
    key's path."""
    if isinstance(src, dict):
        return read(src)
    path = Path(src)
    if path.is_dir():
        path = path / RESULTS_FILE
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SchemaError(f"{path}: not JSON ({e})") from e
    if not isinstance(doc, dict):
        raise SchemaError(f"{path}: a JSON object expected, found {type(doc).__name__}")
    try:
        return read(doc, str(path))
    except SchemaError as e:
        msg = str(e)
        raise SchemaError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def dumps(doc: Results | Mapping[str, Any]) -> str:
    """The text of a results.json (what :func:`dump` writes)."""
    return json.dumps(doc, indent=1, default=str) + "\n"


def dump(doc: Results | dict[str, Any], path: Path) -> Path:
    """Write ``doc`` to ``path`` (a results.json); a document without a schema gets
    today's.  Not checked: a run's partial results are written whatever they hold."""
    if isinstance(doc, dict) and "schema" not in doc:
        doc["schema"] = SCHEMA
    path.write_text(dumps(doc))
    return path


def load_samples(src: Path | str) -> Samples:
    """A samples.json.gz (or the one in a run directory; {} when there is none) with
    today's mode names."""
    path = Path(src)
    if path.is_dir():
        path = path / SAMPLES_FILE
    if not path.exists():
        return {}
    with gzip.open(path, "rt") as f:
        return upgrade_samples(json.load(f))


def dump_samples(samples: Samples, path: Path) -> Path:
    """Write the raw samples (``part|condition|mode``: kernel round trips, ns) gzipped."""
    with gzip.open(path, "wt") as f:
        json.dump(samples, f)
    return path


__all__ = ["SCHEMA", "VERSION", "Aggregate", "IdleRun", "LatencyRun", "ModeStatus",
           "ModeSummary", "PlacementDoc", "Results", "RunConfig", "Samples", "SchemaError",
           "StreamRun", "Summary", "ThroughputRun", "check", "config_of", "dump",
           "dump_samples", "dumps", "load", "load_samples", "problems", "read",
           "rename_old_modes", "sample_key", "summary_of", "upgrade", "upgrade_samples",
           "version_of"]
