"""The generic netlink family "kbp" as module/netlink/kbp.yaml describes it, for kbpctl.

Generated from module/netlink/kbp.yaml by ``tools/kbp_spec.py gen``: do not edit. The
constants carry their C names (module/uapi/kbp.h, module/kbp_spec.h); the tables below
give kmod.py its message classes, names.py its ids, ranges, defaults and poller
counters (the attributes' docs, REPLIES), netap.py its constants.
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Attr(NamedTuple):
    """One attribute of an attribute set."""

    value: int
    name: str              # the spec's name: linger-us
    c_name: str            # its uapi name: KBP_A_LINGER_US
    type: str              # the spec's type: unused, pad, u32, u64, s32, string, nest
    nested: str = ""       # nest: the attribute set inside
    enum: str = ""         # the enum of its values (ENUMS)
    multi: bool = False    # it may come more than once
    doc: str = ""          # the spec's doc, on one line (counters: "counter: ...")


FAMILY: Final = "kbp"
VERSION: Final = 1

# -- module/uapi/kbp.h
KBP_GENL_NAME: Final = "kbp"
KBP_GENL_VERSION: Final = 1
# enum kbp_mode
KBP_MODE_BUSY: Final = 1
KBP_MODE_HYBRID: Final = 2
KBP_MODE_PERIODIC: Final = 3
# enum kbp_objective
KBP_OBJECTIVE_BYTES: Final = 0
KBP_OBJECTIVE_BYTES_PER_CPU: Final = 1
# enum kbp_class
KBP_CLASS_RT: Final = 0
KBP_CLASS_NON_RT: Final = 1
# enum kbp_state
KBP_STATE_ACTIVE: Final = 1
KBP_STATE_STANDBY: Final = 2
KBP_STATE_STOPPING: Final = 3
KBP_STATE_STUCK: Final = 4
# enum kbp_cmd
KBP_CMD_UNSPEC: Final = 0
KBP_CMD_POLLER_GET: Final = 1
KBP_CMD_POLLER_SET: Final = 2
KBP_CMD_DEV_ATTACH: Final = 3
KBP_CMD_DEV_DETACH: Final = 4
KBP_CMD_DEV_GET: Final = 5
# enum kbp_attr
KBP_A_UNSPEC: Final = 0
KBP_A_PAD: Final = 1
KBP_A_CPU: Final = 2
KBP_A_MODE: Final = 3
KBP_A_LINGER_US: Final = 4
KBP_A_QUOTA: Final = 5
KBP_A_PID: Final = 6
KBP_A_IFINDEX: Final = 7
KBP_A_IFNAME: Final = 8
KBP_A_NETNS_FD: Final = 9
KBP_A_NETNS_INUM: Final = 10
KBP_A_QUEUE_MAP: Final = 11
KBP_A_MAP_ENTRY: Final = 12
KBP_A_NAPI: Final = 13
KBP_A_NAPIS: Final = 14
KBP_A_PASSES: Final = 15
KBP_A_EMPTY_PASSES: Final = 16
KBP_A_PACKETS: Final = 17
KBP_A_WAKEUPS: Final = 18
KBP_A_SLEEPS: Final = 19
KBP_A_SLEEP_NS: Final = 20
KBP_A_POLL_NS: Final = 21
KBP_A_POLLS: Final = 22
KBP_A_RESPAWNS: Final = 23
KBP_A_REPAIRS: Final = 24
KBP_A_RT_PRIO: Final = 25
KBP_A_STATE: Final = 26
KBP_A_FREQ_CTL: Final = 27
KBP_A_FREQ_CHANGES: Final = 28
KBP_A_YIELDS: Final = 29
KBP_A_INTERVAL_US: Final = 30
KBP_A_NETAP: Final = 31
KBP_A_ROUND_MS: Final = 32
KBP_A_MIN_INTERVAL_US: Final = 33
KBP_A_MAX_INTERVAL_US: Final = 34
KBP_A_MIN_CHANGE: Final = 35
KBP_A_MAX_ROUND: Final = 36
KBP_A_HANDBACKS: Final = 37
KBP_A_NETAP_STATE: Final = 38
KBP_A_OBJECTIVE: Final = 39
KBP_A_CLASS: Final = 40
KBP_A_NICE: Final = 41
KBP_A_GAVE_WAY: Final = 42
KBP_A_WAKE_DELAY_NS: Final = 43
KBP_A_WAKE_DELAY_MAX_NS: Final = 44
KBP_A_TAKEOVERS: Final = 45
# enum kbp_map_attr
KBP_MAP_A_UNSPEC: Final = 0
KBP_MAP_A_NAPI_INDEX: Final = 1
KBP_MAP_A_CPU: Final = 2
# enum kbp_napi_attr
KBP_NAPI_A_UNSPEC: Final = 0
KBP_NAPI_A_PAD: Final = 1
KBP_NAPI_A_INDEX: Final = 2
KBP_NAPI_A_ID: Final = 3
KBP_NAPI_A_CPU: Final = 4
KBP_NAPI_A_PID: Final = 5
KBP_NAPI_A_PACKETS: Final = 6
KBP_NAPI_A_POLLS: Final = 7
# enum kbp_netap_attr
KBP_NETAP_A_UNSPEC: Final = 0
KBP_NETAP_A_PAD: Final = 1
KBP_NETAP_A_ROUND: Final = 2
KBP_NETAP_A_ROUNDS: Final = 3
KBP_NETAP_A_INTERVAL_US: Final = 4
KBP_NETAP_A_LOW_US: Final = 5
KBP_NETAP_A_HIGH_US: Final = 6
KBP_NETAP_A_RANGE_LO_US: Final = 7
KBP_NETAP_A_RANGE_HI_US: Final = 8
KBP_NETAP_A_DISTANCE_US: Final = 9
KBP_NETAP_A_CONVERGED: Final = 10
KBP_NETAP_A_RESTARTS: Final = 11
KBP_NETAP_A_LAST_OBJECTIVE: Final = 12
KBP_NETAP_A_OBJECTIVE: Final = 13
KBP_NETAP_A_LAST_BYTES: Final = 14
KBP_NETAP_A_LAST_CPU_NS: Final = 15
# the name of KBP_NETAP_A_LAST_OBJECTIVE when it counted packets
KBP_NETAP_A_LAST_WORK: Final = 12

# -- module/kbp_spec.h (scope kernel) and the kernel's own constants
# quota: packets per NAPI per pass, at most the NAPI weight
# (NAPI_POLL_WEIGHT); also the default of an rt poller
KBP_QUOTA_MAX: Final = 64
# quota of a non-rt poller by default (docs/design.md, "Classes")
KBP_NONRT_QUOTA_DEF: Final = 8
# linger_us: 1 s
KBP_LINGER_US_MAX: Final = 1000000
# above it, linger_us needs CAP_SYS_NICE (kbp_genl.c, kbp_takes_cpu())
KBP_LINGER_US_FREE: Final = 100
# rt_prio: MAX_RT_PRIO - 1
KBP_RT_PRIO_MAX: Final = 99
# nice of a non-rt poller: MIN_NICE
KBP_NICE_MIN: Final = -20
# MAX_NICE
KBP_NICE_MAX: Final = 19
# entries of a queue map (KBP_A_QUEUE_MAP)
KBP_MAP_MAX: Final = 256
# periodic: the interval while the search is off, by default
KBP_INTERVAL_US_DEF: Final = 1000
# periodic: a search round, by default
KBP_ROUND_MS_DEF: Final = 1000
KBP_ROUND_MS_MIN: Final = 10
# 1 min
KBP_ROUND_MS_MAX: Final = 60000
# NetAP's MinInterval (Park et al. 2020, Sect. 3.4.3): min_interval_us
# by default; an interval_us or min_interval_us below it needs
# CAP_SYS_NICE (kbp_genl.c, kbp_takes_cpu())
KBP_NETAP_MIN_INTERVAL_US: Final = 100
# NetAP's MaxInterval: max_interval_us by default
KBP_NETAP_MAX_INTERVAL_US: Final = 4000
# min_change by default (the paper gives no value)
KBP_NETAP_MIN_CHANGE_PCT_DEF: Final = 20
# max_round by default (the paper gives no value)
KBP_NETAP_MAX_ROUND_DEF: Final = 300
# interval_us, min_interval_us, max_interval_us: the range
KBP_NETAP_INTERVAL_US_LO: Final = 10
KBP_NETAP_INTERVAL_US_HI: Final = 100000
# min_change, in percent of the last round
KBP_NETAP_MIN_CHANGE_PCT_LO: Final = 1
KBP_NETAP_MIN_CHANGE_PCT_HI: Final = 1000
# above the longest search (17 rounds, for the range 10..100000 us)
KBP_NETAP_MAX_ROUND_LO: Final = 20
KBP_NETAP_MAX_ROUND_HI: Final = 1000000
# KBP_A_IFNAME holds at most IFNAMSIZ - 1 characters
IFNAMSIZ: Final = 16

#: enums by name: entry -> value
ENUMS: Final[dict[str, dict[str, int]]] = {
    "mode": {"busy": 1, "hybrid": 2, "periodic": 3},
    "objective": {"bytes": 0, "bytes-per-cpu": 1},
    "class": {"rt": 0, "non-rt": 1},
    "state": {"active": 1, "standby": 2, "stopping": 3, "stuck": 4},
}
#: commands: name -> value
COMMANDS: Final[dict[str, int]] = {
    "unspec": 0,
    "poller-get": 1,
    "poller-set": 2,
    "dev-attach": 3,
    "dev-detach": 4,
    "dev-get": 5,
}
#: attribute sets by name (a subset: the attributes of its set that it holds)
ATTRIBUTE_SETS: Final[dict[str, tuple[Attr, ...]]] = {
    "kbp": (
        Attr(0, "unspec", "KBP_A_UNSPEC", "unused"),
        Attr(1, "pad", "KBP_A_PAD", "pad"),
        Attr(2, "cpu", "KBP_A_CPU", "u32"),
        Attr(3, "mode", "KBP_A_MODE", "u32", "", "mode"),
        Attr(4, "linger-us", "KBP_A_LINGER_US", "u32",
             doc="hybrid: spin this long after the last packet"),
        Attr(5, "quota", "KBP_A_QUOTA", "u32", doc="packets per NAPI per pass (1..NAPI weight)"),
        Attr(6, "pid", "KBP_A_PID", "u32", doc="poller kthread pid"),
        Attr(7, "ifindex", "KBP_A_IFINDEX", "u32"),
        Attr(8, "ifname", "KBP_A_IFNAME", "string"),
        Attr(9, "netns-fd", "KBP_A_NETNS_FD", "u32", doc="fd of a netns"),
        Attr(10, "netns-inum", "KBP_A_NETNS_INUM", "u32", doc="inode number of the device's netns"),
        Attr(11, "queue-map", "KBP_A_QUEUE_MAP", "nest", "queue-map"),
        Attr(12, "map-entry", "KBP_A_MAP_ENTRY", "nest", "map-entry", "", True),
        Attr(13, "napi", "KBP_A_NAPI", "nest", "napi", "", True, doc="one per NAPI"),
        Attr(14, "napis", "KBP_A_NAPIS", "u32", doc="number of NAPIs"),
        Attr(15, "passes", "KBP_A_PASSES", "u64",
             doc="counter: loop iterations over the poller's NAPIs"),
        Attr(16, "empty-passes", "KBP_A_EMPTY_PASSES", "u64",
             doc="counter: passes that found no work"),
        Attr(17, "packets", "KBP_A_PACKETS", "u64",
             doc="counter: packets (work units) returned by NAPI poll functions"),
        Attr(18, "wakeups", "KBP_A_WAKEUPS", "u64",
             doc="counter: times the poller was woken from sleep (hybrid, periodic)"),
        Attr(19, "sleeps", "KBP_A_SLEEPS", "u64",
             doc="counter: times the poller went to sleep (hybrid, periodic)"),
        Attr(20, "sleep-ns", "KBP_A_SLEEP_NS", "u64", doc="counter: time spent asleep"),
        Attr(21, "poll-ns", "KBP_A_POLL_NS", "u64",
             doc="counter: time spent inside NAPI poll (protocol processing included)"),
        Attr(22, "polls", "KBP_A_POLLS", "u64", doc="counter: NAPI polls"),
        Attr(23, "respawns", "KBP_A_RESPAWNS", "u64",
             doc="counter: poller threads replaced after a driver deleted a NAPI under it"),
        Attr(24, "repairs", "KBP_A_REPAIRS", "u64",
             doc="counter: NAPIs put back on the poller after a driver's napi_disable/enable"),
        Attr(25, "rt-prio", "KBP_A_RT_PRIO", "u32",
             doc="0 = SCHED_NORMAL, 1..99 = SCHED_FIFO priority"),
        Attr(26, "state", "KBP_A_STATE", "u32", "", "state", doc="devices and pollers"),
        Attr(27, "freq-ctl", "KBP_A_FREQ_CTL", "u32",
             doc="0/1: hybrid lowers the CPU frequency while asleep (userspace governor needed)"),
        Attr(28, "freq-changes", "KBP_A_FREQ_CHANGES", "u64",
             doc="counter: CPU frequency changes made by freq_ctl (hybrid)"),
        Attr(29, "yields", "KBP_A_YIELDS", "u64",
             doc="counter: times a poller that was not going to sleep gave its CPU to other tasks"),
        Attr(30, "interval-us", "KBP_A_INTERVAL_US", "u32",
             doc="periodic: polling interval while the search is off"),
        Attr(31, "netap", "KBP_A_NETAP", "u32",
             doc="periodic, 0/1: golden-section search of the interval"),
        Attr(32, "round-ms", "KBP_A_ROUND_MS", "u32", doc="periodic: length of a search round"),
        Attr(33, "min-interval-us", "KBP_A_MIN_INTERVAL_US", "u32",
             doc="periodic: search range (MinInterval)"),
        Attr(34, "max-interval-us", "KBP_A_MAX_INTERVAL_US", "u32",
             doc="periodic: search range (MaxInterval), a latency cap"),
        Attr(35, "min-change", "KBP_A_MIN_CHANGE", "u32",
             doc=("periodic: % change of a round's objective that restarts a converged search "
                  "(MinChange)")),
        Attr(36, "max-round", "KBP_A_MAX_ROUND", "u32",
             doc="periodic: rounds after which the search restarts"),
        Attr(37, "handbacks", "KBP_A_HANDBACKS", "u64",
             doc=("counter, periodic: polls that let the driver complete the NAPI and unmask "
                  "its IRQ (idle, or the NAPI was being taken away)")),
        Attr(38, "netap-state", "KBP_A_NETAP_STATE", "nest", "netap-state", doc="periodic"),
        Attr(39, "objective", "KBP_A_OBJECTIVE", "u32", "", "objective",
             doc="what the search maximizes (periodic knob)"),
        Attr(40, "class", "KBP_A_CLASS", "u32", "", "class",
             doc="which of a CPU's pollers (attach, poller-get/set)"),
        Attr(41, "nice", "KBP_A_NICE", "s32",
             doc="non-rt poller's nice (-20..19; below 0 needs CAP_SYS_NICE)"),
        Attr(42, "gave-way", "KBP_A_GAVE_WAY", "u64",
             doc="counter, non-rt: polls after which it gave the CPU to a woken task at once"),
        Attr(43, "wake-delay-ns", "KBP_A_WAKE_DELAY_NS", "u64",
             doc="counter: sum of wake-up-to-running delays of the poller's thread (run_delay)"),
        Attr(44, "wake-delay-max-ns", "KBP_A_WAKE_DELAY_MAX_NS", "u64",
             doc="counter, maximum: the longest of those wake-up-to-running delays"),
        Attr(45, "takeovers", "KBP_A_TAKEOVERS", "u64",
             doc=("counter: NAPIs a load kept scheduled in softirq (never idle) that the "
                  "poller asked to hand over at attach or reconcile")),
    ),
    "queue-map": (
        Attr(12, "map-entry", "KBP_A_MAP_ENTRY", "nest", "map-entry", "", True),
    ),
    "map-entry": (
        Attr(0, "unspec", "KBP_MAP_A_UNSPEC", "unused"),
        Attr(1, "napi-index", "KBP_MAP_A_NAPI_INDEX", "u32",
             doc="position of the NAPI in the device (0 = first added)"),
        Attr(2, "cpu", "KBP_MAP_A_CPU", "u32"),
    ),
    "napi": (
        Attr(0, "unspec", "KBP_NAPI_A_UNSPEC", "unused"),
        Attr(1, "pad", "KBP_NAPI_A_PAD", "pad"),
        Attr(2, "index", "KBP_NAPI_A_INDEX", "u32"),
        Attr(3, "id", "KBP_NAPI_A_ID", "u32", doc="napi_id (0 when the kernel gave none)"),
        Attr(4, "cpu", "KBP_NAPI_A_CPU", "u32"),
        Attr(5, "pid", "KBP_NAPI_A_PID", "u32", doc="pid of the poller serving it"),
        Attr(6, "packets", "KBP_NAPI_A_PACKETS", "u64",
             doc="counter: the device's packets (KBP_A_PACKETS), this NAPI's share"),
        Attr(7, "polls", "KBP_NAPI_A_POLLS", "u64",
             doc="counter: the device's polls (KBP_A_POLLS), this NAPI's share"),
    ),
    "netap-state": (
        Attr(0, "unspec", "KBP_NETAP_A_UNSPEC", "unused"),
        Attr(1, "pad", "KBP_NETAP_A_PAD", "pad"),
        Attr(2, "round", "KBP_NETAP_A_ROUND", "u32", doc="rounds since the (re)start"),
        Attr(3, "rounds", "KBP_NETAP_A_ROUNDS", "u64", doc="rounds since the poller went periodic"),
        Attr(4, "interval-us", "KBP_NETAP_A_INTERVAL_US", "u32",
             doc="interval of the running round"),
        Attr(5, "low-us", "KBP_NETAP_A_LOW_US", "u32", doc="probe interval_low (the longer one)"),
        Attr(6, "high-us", "KBP_NETAP_A_HIGH_US", "u32", doc="probe interval_high"),
        Attr(7, "range-lo-us", "KBP_NETAP_A_RANGE_LO_US", "u32", doc="bracket of the search"),
        Attr(8, "range-hi-us", "KBP_NETAP_A_RANGE_HI_US", "u32"),
        Attr(9, "distance-us", "KBP_NETAP_A_DISTANCE_US", "u32"),
        Attr(10, "converged", "KBP_NETAP_A_CONVERGED", "u32", doc="0/1"),
        Attr(11, "restarts", "KBP_NETAP_A_RESTARTS", "u32"),
        Attr(12, "last-objective", "KBP_NETAP_A_LAST_OBJECTIVE", "u64",
             doc="the objective's value in the last round (bytes, or bytes per CPU-second)"),
        Attr(13, "objective", "KBP_NETAP_A_OBJECTIVE", "u32", "", "objective", doc="of the search"),
        Attr(14, "last-bytes", "KBP_NETAP_A_LAST_BYTES", "u64", doc="bytes of the last round"),
        Attr(15, "last-cpu-ns", "KBP_NETAP_A_LAST_CPU_NS", "u64",
             doc="CPU time of the poller thread in the last round"),
    ),
}
#: the attributes of each command's reply, in their order (a do and a dump reply alike)
REPLIES: Final[dict[str, tuple[str, ...]]] = {
    "poller-get": (
        "ifindex", "ifname", "netns-inum", "state", "cpu", "class", "nice", "pid", "mode",
        "linger-us", "quota", "rt-prio", "freq-ctl", "napis", "passes", "empty-passes", "packets",
        "wakeups", "sleeps", "sleep-ns", "poll-ns", "freq-changes", "yields", "respawns", "repairs",
        "handbacks", "gave-way", "wake-delay-ns", "wake-delay-max-ns", "takeovers", "interval-us",
        "netap", "round-ms", "min-interval-us", "max-interval-us", "min-change", "max-round",
        "objective", "netap-state",
    ),
    "dev-get": (
        "ifindex", "ifname", "netns-inum", "state", "class", "cpu", "mode", "napi", "napis",
        "packets", "polls",
    ),
}
#: the knobs' accepted ranges (their attributes' checks): knob -> (min, max)
RANGES: Final[dict[str, tuple[int, int]]] = {
    "linger_us": (0, 1000000),
    "quota": (1, 64),
    "rt_prio": (0, 99),
    "freq_ctl": (0, 1),
    "interval_us": (10, 100000),
    "netap": (0, 1),
    "round_ms": (10, 60000),
    "min_interval_us": (10, 100000),
    "max_interval_us": (10, 100000),
    "min_change": (1, 1000),
    "max_round": (20, 1000000),
    "nice": (-20, 19),
}
