"""One vocabulary for the module, kbpctl, docs and benchmark output.

The kernel module's generic netlink attributes (module/uapi/kbp.h) carry the same
names: KBP_A_<NAME upper-case> for knobs and counters, KBP_MODE_<MODE> for modes. The
module's ids of modes, classes and objectives, the knobs' ranges and defaults and the poller
counters with their help texts come from the family's spec (module/netlink/kbp.yaml, through
the generated :mod:`kbp._spec`).
"""

import re
from typing import Final, TypedDict

from kbp import _spec

# Poller modes: busy (KBP), hybrid (EE-KBP), periodic (NetAP).
MODE_BUSY: Final = "busy"
MODE_HYBRID: Final = "hybrid"
MODE_PERIODIC: Final = "periodic"
MODE_IDS: Final[dict[str, int]] = dict(_spec.ENUMS["mode"])  # enum kbp_mode
MODES: Final = tuple(MODE_IDS)
MODE_NAMES: Final = {v: k for k, v in MODE_IDS.items()}

# Knobs of a poller / an attachment.
KNOBS: Final = ("mode", "linger_us", "quota", "rt_prio", "freq_ctl", "cpu")
DEFAULT_QUOTA: Final = _spec.KBP_QUOTA_MAX     # the NAPI weight: the most, and rt's default
DEFAULT_LINGER_US: Final = 0

# Knobs of mode periodic (NetAP; docs/netap.md), the module's attribute names
# (module/uapi/kbp.h KBP_A_*) and their accepted ranges and defaults (the spec's checks and
# definitions, module/kbp_spec.h).
# interval_us set: a fixed interval, no search; left out: the golden-section search picks it
# between min_interval_us and max_interval_us, in rounds of round_ms, maximizing objective.
PERIODIC_KNOBS: Final = ("interval_us", "round_ms", "min_interval_us", "max_interval_us",
                         "min_change", "max_round", "objective")
PERIODIC_RANGES: Final[dict[str, tuple[int, int]]] = {
    k: _spec.RANGES[k] for k in ("interval_us", "round_ms", "min_interval_us",
                                 "max_interval_us",
                                 "min_change",     # percent of the previous round (MinChange)
                                 "max_round")}     # MaxRound
# What the search maximizes per round: bytes received (the paper's), or bytes per CPU-second
# of the polling context (beyond the paper: counts what the polling costs).
OBJECTIVE_BYTES: Final = "bytes"
OBJECTIVE_BYTES_PER_CPU: Final = "bytes-per-cpu"
OBJECTIVE_IDS: Final[dict[str, int]] = dict(_spec.ENUMS["objective"])  # enum kbp_objective
OBJECTIVES: Final = tuple(OBJECTIVE_IDS)


class PeriodicDefaults(TypedDict):
    """The knobs' defaults (:data:`PERIODIC_DEFAULTS`): numbers, ``objective`` a name."""

    round_ms: int
    min_interval_us: int
    max_interval_us: int
    min_change: int
    max_round: int
    objective: str


PERIODIC_DEFAULTS: Final[PeriodicDefaults] = {
    "round_ms": _spec.KBP_ROUND_MS_DEF,
    "min_interval_us": _spec.KBP_NETAP_MIN_INTERVAL_US,    # MinInterval
    "max_interval_us": _spec.KBP_NETAP_MAX_INTERVAL_US,    # MaxInterval
    "min_change": _spec.KBP_NETAP_MIN_CHANGE_PCT_DEF,
    "max_round": _spec.KBP_NETAP_MAX_ROUND_DEF,
    "objective": OBJECTIVE_BYTES}

# Poller classes (the outsourcing method's RT/non-RT split on one CPU; docs/design.md
# "Classes"): a CPU may run one poller of each. rt: the poller of the RT devices (any mode,
# SCHED_FIFO by default). non-rt: the poller of the heavy devices whose interrupts land on a CPU
# with an RT poller: SCHED_OTHER (nice), hybrid only, a small quota, and it gives the CPU away
# between polls as soon as a woken task (the RT poller) needs it. Module ids: enum kbp_class.
CLASS_RT: Final = "rt"
CLASS_NON_RT: Final = "non-rt"
CLASS_IDS: Final[dict[str, int]] = dict(_spec.ENUMS["class"])  # enum kbp_class
CLASSES: Final = tuple(CLASS_IDS)
CLASS_NAMES: Final = {v: k for k, v in CLASS_IDS.items()}
NONRT_DEFAULT_QUOTA: Final = _spec.KBP_NONRT_QUOTA_DEF  # packets per NAPI per poll, non-rt
NICE_RANGE: Final = _spec.RANGES["nice"]  # non-rt: the poller's nice (< 0 needs CAP_SYS_NICE)
# The module's poller threads: one per CPU and device, named <prefix>/<cpu>:<device> with the
# prefix of its class (module/kbp_poller.c, kbp_classes[].prefix and the thread's name);
# poller_name builds it, and every message of kbpctl and the bench names a poller so.
POLLER_THREAD_PREFIX: Final[dict[str, str]] = {CLASS_RT: "kbp", CLASS_NON_RT: "kbpn"}


def poller_name(cpu: int | str, cls: str = CLASS_RT, device: str | None = None) -> str:
    """The module's name of its poller thread on ``cpu`` of class ``cls`` serving
    ``device``: ``kbp/1:eth0``, ``kbpn/1:eth2``
    (module/kbp_poller.c names each thread so; ``ps`` shows its first 15 characters).
    Without ``device`` (a poller not yet attached, or a module before per-device pollers)
    ``kbp/1``."""
    head = f"{POLLER_THREAD_PREFIX.get(cls, cls)}/{cpu}"
    return f"{head}:{device}" if device else head


# Per-poller counters (read-only), with what each counts (docs, the exporter's HELP text):
# the attributes of the module's poller-get reply that the spec marks as counters, in the
# reply's order, their docs without the mark (module/netlink/kbp.yaml: a counter's doc is
# "counter: <help>" or "counter, <where it counts>: <help>"). A counter added to the spec
# and to the reply is one here, in kbp.kmod.Poller, kbpctl status and the exporter.
# A name ending in _ns counts nanoseconds.
_COUNTER_DOC: Final = re.compile(r"counter(?:, ([^:]+))?: (.+)")


def counter_help(doc: str) -> str | None:
    """A counter's help text from its attribute's doc in the spec ("counter: X" -> X,
    "counter, non-rt: X" -> "non-rt: X"); None when the doc does not mark a counter."""
    m = _COUNTER_DOC.fullmatch(doc)
    if m is None:
        return None
    return f"{m[1]}: {m[2]}" if m[1] else m[2]


_KBP_DOCS: Final = {a.name: a.doc for a in _spec.ATTRIBUTE_SETS["kbp"]}
#: every counter of the module's pollers (kbp.kmod.Poller's), with its help text
MODULE_POLLER_COUNTER_HELP: Final[dict[str, str]] = {
    a.replace("-", "_"): h for a in _spec.REPLIES["poller-get"]
    if (h := counter_help(_KBP_DOCS[a])) is not None}
# The module's poller counters that count the work of one mode and are shown with that
# mode's state (kbpctl status's "periodic", the exporter's kbp_poller_periodic_*), not as
# poller counters (a stock backend's thread has none of them): the one rule that keeps a
# counter of the spec out of POLLER_COUNTERS. The spec marks them ("counter, periodic: ...").
PERIODIC_COUNTERS: Final[tuple[str, ...]] = tuple(
    c for c, h in MODULE_POLLER_COUNTER_HELP.items() if h.startswith("periodic: "))
POLLER_COUNTER_HELP: Final[dict[str, str]] = {
    c: h for c, h in MODULE_POLLER_COUNTER_HELP.items() if c not in PERIODIC_COUNTERS}
POLLER_COUNTERS: Final[tuple[str, ...]] = tuple(POLLER_COUNTER_HELP)
# The POLLER_COUNTERS that are the largest value seen, not a running sum (a gauge to
# Prometheus). The spec marks them ("counter, maximum: ...").
POLLER_MAXIMA: Final[tuple[str, ...]] = tuple(
    c for c, h in POLLER_COUNTER_HELP.items() if h.startswith("maximum: "))

# Per-device and per-NAPI counters (read-only): the counters of the module's dev-get reply
# (each of its NAPI records has them too), with the spec's help text. The stock backend has
# no counter of its own: it reports the kernel's statistic that STOCK_DEVICE_COUNTERS names
# for a counter, and none for the others.
STOCK_DEVICE_COUNTERS: Final[dict[str, str]] = {"packets": "the device's rx_packets"}
DEVICE_COUNTER_HELP: Final[dict[str, str]] = {
    a: h + (f" (kmod; stock: {STOCK_DEVICE_COUNTERS[a]})" if a in STOCK_DEVICE_COUNTERS
            else " (kmod only)")
    for a in _spec.REPLIES["dev-get"] if (h := counter_help(_KBP_DOCS[a])) is not None}
DEVICE_COUNTERS: Final[tuple[str, ...]] = tuple(DEVICE_COUNTER_HELP)

# Backends of kbpctl.
BACKEND_KMOD: Final = "kmod"
BACKEND_STOCK: Final = "stock"
BACKENDS: Final = ("auto", BACKEND_KMOD, BACKEND_STOCK)

# Benchmark mode names: kbp.bench.modes, whose table says what each mode is (the kbp module's
# modes under the names above, the stock backend's as stock-<mode>).

# The benchmark's RT applications: sockperf's server in every mode but irq-suspend, which
# needs an epoll application that asks for IRQ suspension (kbp-echo, src/kbp/data/kbp_echo.c).
APP_SOCKPERF: Final = "sockperf"
APP_KBP_ECHO: Final = "kbp-echo"
RT_APPS: Final = (APP_SOCKPERF, APP_KBP_ECHO)
