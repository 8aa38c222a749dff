"""One vocabulary for the module, kbpctl, docs and benchmark output.

The kernel module's generic netlink attributes (module/uapi/kbp.h) carry the same
names: KBP_A_<NAME upper-case> for knobs and counters, KBP_MODE_<MODE> for modes.
"""

from typing import Final

# Poller modes: busy (KBP), hybrid (EE-KBP), periodic (NetAP).
MODE_BUSY: Final = "busy"
MODE_HYBRID: Final = "hybrid"
MODE_PERIODIC: Final = "periodic"
MODES: Final = (MODE_BUSY, MODE_HYBRID, MODE_PERIODIC)
MODE_IDS: Final = {MODE_BUSY: 1, MODE_HYBRID: 2, MODE_PERIODIC: 3}
MODE_NAMES: Final = {v: k for k, v in MODE_IDS.items()}

# Knobs of a poller / an attachment.
KNOBS: Final = ("mode", "linger_us", "quota", "rt_prio", "freq_ctl", "cpu")
DEFAULT_QUOTA: Final = 64
DEFAULT_LINGER_US: Final = 0

# Knobs of mode periodic (NetAP; docs/netap.md), the module's attribute names
# (module/uapi/kbp.h KBP_A_*) and their accepted ranges (module/kbp_netap.h, kbp_priv.h).
# interval_us set: a fixed interval, no search; left out: the golden-section search picks it
# between min_interval_us and max_interval_us, in rounds of round_ms, maximizing objective.
PERIODIC_KNOBS: Final = ("interval_us", "round_ms", "min_interval_us", "max_interval_us",
                         "min_change", "max_round", "objective")
PERIODIC_RANGES: Final = {
    "interval_us": (10, 100_000),
    "round_ms": (10, 60_000),
    "min_interval_us": (10, 100_000),
    "max_interval_us": (10, 100_000),
    "min_change": (1, 1000),          # percent of the previous round (MinChange)
    "max_round": (20, 1_000_000),     # MaxRound
}
PERIODIC_DEFAULTS: Final = {"round_ms": 1000, "min_interval_us": 100, "max_interval_us": 4000,
                            "min_change": 20, "max_round": 300, "objective": "bytes"}
# What the search maximizes per round: bytes received (the paper's), or bytes per CPU-second
# of the polling context (beyond the paper: counts what the polling costs).
OBJECTIVE_BYTES: Final = "bytes"
OBJECTIVE_BYTES_PER_CPU: Final = "bytes-per-cpu"
OBJECTIVES: Final = (OBJECTIVE_BYTES, OBJECTIVE_BYTES_PER_CPU)
OBJECTIVE_IDS: Final = {OBJECTIVE_BYTES: 0, OBJECTIVE_BYTES_PER_CPU: 1}

# Poller classes (the outsourcing method's RT/non-RT split on one CPU; docs/design.md
# "Classes"): a CPU may run one poller of each. rt: the poller of the RT devices (any mode,
# SCHED_FIFO by default). non-rt: the poller of the heavy devices whose interrupts land on a CPU
# with an RT poller: SCHED_OTHER (nice), hybrid only, a small quota, and it gives the CPU away
# between polls as soon as a woken task (the RT poller) needs it. Module ids: enum kbp_class.
CLASS_RT: Final = "rt"
CLASS_NON_RT: Final = "non-rt"
CLASSES: Final = (CLASS_RT, CLASS_NON_RT)
CLASS_IDS: Final = {CLASS_RT: 0, CLASS_NON_RT: 1}
CLASS_NAMES: Final = {v: k for k, v in CLASS_IDS.items()}
NONRT_DEFAULT_QUOTA: Final = 8   # packets per NAPI per poll of a non-rt poller
NICE_RANGE: Final = (-20, 19)    # non-rt: the poller's nice (below 0 needs CAP_SYS_NICE)

# Per-poller counters (read-only), with what each counts (docs, the exporter's HELP text).
# A name ending in _ns counts nanoseconds.
POLLER_COUNTER_HELP: Final[dict[str, str]] = {
    "passes": "loop iterations over the poller's NAPIs",
    "empty_passes": "passes that found no work",
    "packets": "packets (work units) returned by NAPI poll functions",
    "wakeups": "times the poller was woken from sleep (hybrid)",
    "sleeps": "times the poller went to sleep (hybrid)",
    "sleep_ns": "time spent asleep",
    "poll_ns": "time spent inside NAPI poll (protocol processing included)",
    "freq_changes": "CPU frequency changes made by freq_ctl (hybrid)",
    "yields": "times a poller that was not going to sleep gave its CPU to other tasks",
    "respawns": "poller threads replaced after a driver deleted a NAPI under it",
    "repairs": "NAPIs put back on the poller after a driver's napi_disable/enable",
    "gave_way": "non-rt: polls after which it gave the CPU to a woken task at once",
    "wake_delay_ns": "sum of wake-up-to-running delays of the poller's thread (run_delay)",
    "wake_delay_max_ns": "the longest of those wake-up-to-running delays",
    "takeovers": ("NAPIs a load kept scheduled in softirq (never idle) that the poller asked "
                  "to hand over at attach or reconcile"),
}
POLLER_COUNTERS: Final[tuple[str, ...]] = tuple(POLLER_COUNTER_HELP)
# The POLLER_COUNTERS that are the largest value seen, not a running sum (a gauge to Prometheus).
POLLER_MAXIMA: Final[tuple[str, ...]] = ("wake_delay_max_ns",)

# Per-device and per-NAPI counters (read-only).
DEVICE_COUNTER_HELP: Final[dict[str, str]] = {
    "packets": "packets received (kmod: polled by the module; stock: the device's rx_packets)",
    "polls": "NAPI polls made by the module's pollers (kmod only)",
}
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
