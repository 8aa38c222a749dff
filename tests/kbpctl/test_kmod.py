"""kbp.kmod (client of the module's genl family) and the kmod backend, offline.

The module cannot be loaded on this host; the lead runs the client against the real module
in the VM. Here: the message classes mirror module/uapi/kbp.h exactly, requests encode to
the bytes the kernel expects, replies (hand-packed like the kernel packs them) decode to the
dataclasses, errors carry errno + extack, and an absent module is an explicit error.
"""

from __future__ import annotations

import dataclasses
import errno
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from kbp import backends, kmod, names
from kbp.backends import EnableRequest
from kbp.backends import kmod as kmod_backend
from kbp.errors import EXIT_UNAVAILABLE, Unavailable
from kbp.netdev import Link
from kbp.problems import DETACHED, MISPLACED, MODULE_SILENT, NEEDS_ROOT, Problem
from kbp.system.journal import StateDir

from .conftest import REPO

UAPI = REPO / "module/uapi/kbp.h"


def uapi_enums() -> dict[str, int]:
    """Every enumerator of kbp.h with its value (C rules: implicit = previous + 1)."""
    text = re.sub(r"/\*.*?\*/", "", UAPI.read_text(), flags=re.S)
    out: dict[str, int] = {}
    for body in re.findall(r"enum\s+\w+\s*\{(.*?)\};", text, flags=re.S):
        val = -1
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            name, _, expr = item.partition("=")
            val = int(expr.strip(), 0) if expr.strip() else val + 1
            out[name.strip()] = val
    return out


@pytest.fixture(scope="module")
def enums() -> dict[str, int]:
    if not UAPI.exists():
        pytest.skip(reason=f"{UAPI} is not in this checkout")
    return uapi_enums()


def test_constants_match_uapi(enums: dict[str, int]) -> None:
    assert re.search(r'KBP_GENL_NAME\s+"(\w+)"', UAPI.read_text())[1] == kmod.KBP_GENL_NAME
    for name, val in enums.items():
        if name.startswith("__"):
            continue
        assert getattr(kmod, name) == val, name


@pytest.mark.parametrize(("cls", "prefix"), [
    (kmod.kbpmsg, "KBP_A_"), (kmod.kbp_napi, "KBP_NAPI_A_"), (kmod.kbp_map_entry, "KBP_MAP_A_"),
    (kmod.kbp_netap_state, "KBP_NETAP_A_"),
])
def test_message_classes_mirror_uapi(enums: dict[str, int], cls: Any, prefix: str) -> None:
    ours = {name: aid for aid, name, *_ in cls.nla_map}
    theirs = {k: v for k, v in enums.items() if k.startswith(prefix)}
    assert ours == theirs


def test_modes_match_vocabulary(enums: dict[str, int]) -> None:
    for mode, mid in names.MODE_IDS.items():
        assert enums[f"KBP_MODE_{mode.upper()}"] == mid
    assert kmod.mode_id("hybrid") == 2 and kmod.mode_name(1) == "busy"
    with pytest.raises(ValueError):
        kmod.mode_id("turbo")


def test_objectives_match_vocabulary(enums: dict[str, int]) -> None:
    for obj, oid in names.OBJECTIVE_IDS.items():
        assert enums[f"KBP_OBJECTIVE_{obj.upper().replace('-', '_')}"] == oid
    assert kmod.objective_id("bytes-per-cpu") == 1 and kmod.objective_id(0) == 0
    assert kmod.objective_name(1) == "bytes-per-cpu" and kmod.objective_name(7) == "7"
    with pytest.raises(ValueError, match="unknown objective 'packets'"):
        kmod.objective_id("packets")


# -- byte-level encoding --------------------------------------------------------------
NESTED = 0x8000


def nla(atype: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def u32(atype: int, v: int) -> bytes:
    return nla(atype, struct.pack("=I", v))


def u64(atype: int, v: int) -> bytes:
    return nla(atype, struct.pack("=Q", v))


def genl(cmd: int, attrs: bytes, mtype: int = 0x20, flags: int = 0, seq: int = 0) -> bytes:
    body = struct.pack("=BBH", cmd, kmod.KBP_GENL_VERSION, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), mtype, flags, seq, 0) + body


def encoded(msg: Any) -> bytes:
    msg["header"]["type"] = 0x20
    msg["header"]["flags"] = 0
    msg["header"]["sequence_number"] = 0
    msg["header"]["pid"] = 0
    msg.encode()
    return bytes(msg.data)


def test_encode_attach() -> None:
    m = kmod.build_attach("eth1", netns_fd=5, cpu=2, queue_map={1: 3, 0: 2}, mode="hybrid",
                          linger_us=50, quota=32, rt_prio=60, freq_ctl=True)
    entry = lambda i, c: nla(kmod.KBP_A_MAP_ENTRY | NESTED,  # noqa: E731
                             u32(kmod.KBP_MAP_A_NAPI_INDEX, i) + u32(kmod.KBP_MAP_A_CPU, c))
    want = genl(kmod.KBP_CMD_DEV_ATTACH,
                nla(kmod.KBP_A_IFNAME, b"eth1\0") + u32(kmod.KBP_A_NETNS_FD, 5)
                + u32(kmod.KBP_A_CPU, 2)
                + nla(kmod.KBP_A_QUEUE_MAP | NESTED, entry(0, 2) + entry(1, 3))
                + u32(kmod.KBP_A_MODE, kmod.KBP_MODE_HYBRID) + u32(kmod.KBP_A_LINGER_US, 50)
                + u32(kmod.KBP_A_QUOTA, 32) + u32(kmod.KBP_A_RT_PRIO, 60)
                + u32(kmod.KBP_A_FREQ_CTL, 1))
    assert encoded(m) == want


def test_encode_small_requests() -> None:
    assert encoded(kmod.build_detach(7)) == genl(kmod.KBP_CMD_DEV_DETACH,
                                                 u32(kmod.KBP_A_IFINDEX, 7))
    assert encoded(kmod.build_poller_get()) == genl(kmod.KBP_CMD_POLLER_GET, b"")
    assert encoded(kmod.build_poller_get(3)) == genl(kmod.KBP_CMD_POLLER_GET,
                                                     u32(kmod.KBP_A_CPU, 3))
    assert encoded(kmod.build_poller_set(1, mode="busy", rt_prio=0, freq_ctl=False)) == genl(
        kmod.KBP_CMD_POLLER_SET, u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_MODE, 1)
        + u32(kmod.KBP_A_RT_PRIO, 0) + u32(kmod.KBP_A_FREQ_CTL, 0))
    assert encoded(kmod.build_dev_get("veth0", 9)) == genl(
        kmod.KBP_CMD_DEV_GET, nla(kmod.KBP_A_IFNAME, b"veth0\0") + u32(kmod.KBP_A_NETNS_FD, 9))
    # neither a CPU nor a map: each NAPI on its interrupt's CPU (the module decides)
    assert encoded(kmod.build_attach("eth1")) == genl(
        kmod.KBP_CMD_DEV_ATTACH, nla(kmod.KBP_A_IFNAME, b"eth1\0"))
    # a CPU with a poller for each of several devices: name the device
    assert encoded(kmod.build_poller_get(1, "rt", "eth1")) == genl(
        kmod.KBP_CMD_POLLER_GET, u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_CLASS, 0)
        + nla(kmod.KBP_A_IFNAME, b"eth1\0"))


# -- decoding replies packed the way kbp_genl.c packs them ----------------------------
PAD = nla(kmod.KBP_A_PAD, b"")


def poller_reply(pid: int = 4242) -> bytes:
    counters = b"".join(PAD + u64(a, v) for a, v in (
        (kmod.KBP_A_PASSES, 10), (kmod.KBP_A_EMPTY_PASSES, 4), (kmod.KBP_A_PACKETS, 1 << 40),
        (kmod.KBP_A_WAKEUPS, 3), (kmod.KBP_A_SLEEPS, 3), (kmod.KBP_A_SLEEP_NS, 5000),
        (kmod.KBP_A_POLL_NS, 7000), (kmod.KBP_A_FREQ_CHANGES, 6), (kmod.KBP_A_YIELDS, 9),
        (kmod.KBP_A_RESPAWNS, 0), (kmod.KBP_A_REPAIRS, 1), (kmod.KBP_A_GAVE_WAY, 12),
        (kmod.KBP_A_WAKE_DELAY_NS, 3_000_000), (kmod.KBP_A_WAKE_DELAY_MAX_NS, 90_000),
        (kmod.KBP_A_TAKEOVERS, 2)))
    return genl(kmod.KBP_CMD_POLLER_GET,
                u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_CLASS, 1)
                + nla(kmod.KBP_A_NICE, (-5).to_bytes(4, "little", signed=True))
                + u32(kmod.KBP_A_PID, pid) + u32(kmod.KBP_A_MODE, 2)
                + u32(kmod.KBP_A_LINGER_US, 20) + u32(kmod.KBP_A_QUOTA, 64)
                + u32(kmod.KBP_A_RT_PRIO, 50) + u32(kmod.KBP_A_FREQ_CTL, 1)
                + u32(kmod.KBP_A_NAPIS, 2) + counters)


def dev_reply(pid: int = 4242, name: bytes = b"eth1", inum: int = 4026531840) -> bytes:
    def napi(i: int, nid: int) -> bytes:
        return nla(kmod.KBP_A_NAPI | NESTED,
                   u32(kmod.KBP_NAPI_A_INDEX, i) + u32(kmod.KBP_NAPI_A_ID, nid)
                   + u32(kmod.KBP_NAPI_A_CPU, 1) + u32(kmod.KBP_NAPI_A_PID, pid)
                   + nla(kmod.KBP_NAPI_A_PAD, b"") + u64(kmod.KBP_NAPI_A_PACKETS, 100 + i)
                   + u64(kmod.KBP_NAPI_A_POLLS, 10 + i))
    return genl(kmod.KBP_CMD_DEV_GET,
                u32(kmod.KBP_A_IFINDEX, 5) + nla(kmod.KBP_A_IFNAME, name + b"\0")
                + u32(kmod.KBP_A_NETNS_INUM, inum)
                + u32(kmod.KBP_A_STATE, kmod.KBP_STATE_ACTIVE) + u32(kmod.KBP_A_CPU, 1)
                + u32(kmod.KBP_A_MODE, 1) + napi(0, 8193) + napi(1, 8194)
                + u32(kmod.KBP_A_NAPIS, 2) + PAD + u64(kmod.KBP_A_PACKETS, 201)
                + u64(kmod.KBP_A_POLLS, 21))


def decode(raw: bytes) -> Any:
    m = kmod.kbpmsg(raw)
    m.decode()
    return m


def test_no_class_attribute_is_rt_at_the_decoder() -> None:
    """A reply without KBP_A_CLASS (a module without classes) is class rt at the decoder,
    so no reader spells the rule again: the poller, its status row and its device."""
    raw = genl(kmod.KBP_CMD_POLLER_GET, u32(kmod.KBP_A_CPU, 3) + u32(kmod.KBP_A_MODE, 1)
               + nla(kmod.KBP_A_IFNAME, b"eth1\0"))
    p = kmod._poller_from(decode(raw))
    assert (p.cls, p.name) == (names.CLASS_RT, "kbp/3:eth1")
    assert kmod._device_from(decode(dev_reply())).cls == names.CLASS_RT
    from kbp.backends import PollerStatus
    ps = PollerStatus(cpu=3, pid=None, mode="hybrid", linger_us=0, quota=64, napis=1,
                      policy=None, priority=None, counters={}, device="eth1")
    assert (ps.cls, ps.name) == (names.CLASS_RT, "kbp/3:eth1")


def test_decode_poller() -> None:
    p = kmod._poller_from(decode(poller_reply()))
    assert (p.cpu, p.pid, p.mode, p.linger_us, p.quota, p.rt_prio, p.freq_ctl, p.napis) == \
        (1, 4242, "hybrid", 20, 64, 50, True, 2)
    assert (p.cls, p.nice) == ("non-rt", -5)
    assert p.counters() == {"passes": 10, "empty_passes": 4, "packets": 1 << 40, "wakeups": 3,
                            "sleeps": 3, "sleep_ns": 5000, "poll_ns": 7000, "freq_changes": 6,
                            "yields": 9, "respawns": 0, "repairs": 1, "gave_way": 12,
                            "wake_delay_ns": 3_000_000, "wake_delay_max_ns": 90_000,
                            "takeovers": 2}
    assert list(p.counters()) == list(names.POLLER_COUNTERS)


#: kmod.Poller's fields before its counters came from the spec (issue 39 item 4): the
#: attributes kbpctl, the bench and the guest tests read, in their order
POLLER_FIELDS = (
    "cpu", "cls", "nice", "pid", "mode", "linger_us", "quota", "rt_prio", "freq_ctl", "napis",
    "passes", "empty_passes", "packets", "wakeups", "sleeps", "sleep_ns", "poll_ns",
    "freq_changes", "yields", "respawns", "repairs", "handbacks", "gave_way", "wake_delay_ns",
    "wake_delay_max_ns", "takeovers", "interval_us", "netap", "round_ms", "min_interval_us",
    "max_interval_us", "min_change", "max_round", "objective", "search", "ifindex", "ifname",
    "netns_inum", "state")


def test_poller_fields_are_the_specs_counters() -> None:
    fields = dataclasses.fields(kmod.Poller)
    assert tuple(f.name for f in fields) == POLLER_FIELDS
    # the counters: the spec's (names.MODULE_POLLER_COUNTER_HELP), after napis
    at = POLLER_FIELDS.index("napis") + 1
    counters = tuple(names.MODULE_POLLER_COUNTER_HELP)
    assert tuple(kmod.POLLER_COUNTER_ATTRS) == counters == POLLER_FIELDS[at:at + len(counters)]
    for f in fields[at:at + len(counters)]:
        assert (f.type, f.default) == ("int | None", None), f.name
        assert kmod.POLLER_COUNTER_ATTRS[f.name] == "KBP_A_" + f.name.upper()
    assert kmod.Poller(cpu=1).takeovers is None
    assert kmod.Poller(cpu=1, handbacks=3).handbacks == 3


def test_decode_every_counter_of_the_spec() -> None:
    """_poller_from reads each counter the spec's poller-get reply has into its field."""
    want = {c: (i + 1) << 33 for i, c in enumerate(kmod.POLLER_COUNTER_ATTRS)}
    raw = genl(kmod.KBP_CMD_POLLER_GET, u32(kmod.KBP_A_CPU, 1) + b"".join(
        PAD + u64(getattr(kmod, a), want[c]) for c, a in kmod.POLLER_COUNTER_ATTRS.items()))
    p = kmod._poller_from(decode(raw))
    assert {c: getattr(p, c) for c in want} == want
    assert p.counters() == {c: want[c] for c in names.POLLER_COUNTERS}
    assert (p.cpu, p.napis, p.interval_us) == (1, None, None)


def test_a_field_named_as_a_counter_is_refused() -> None:
    with pytest.raises(TypeError, match="a field named as a counter of the spec: packets"):
        @kmod._with_counters(after="napis")
        class Twice:
            napis: int | None = None
            packets: int | None = None
    with pytest.raises(TypeError, match="no field 'napis'"):
        @kmod._with_counters(after="napis")
        class NoAnchor:
            cpu: int | None = None


def test_encode_periodic_knobs() -> None:
    m = kmod.build_attach("eth1", cpu=1, mode="periodic", interval_us=500, netap=1,
                          round_ms=200, min_interval_us=100, max_interval_us=2000,
                          min_change=30, max_round=50)
    want = genl(kmod.KBP_CMD_DEV_ATTACH,
                nla(kmod.KBP_A_IFNAME, b"eth1\0") + u32(kmod.KBP_A_CPU, 1)
                + u32(kmod.KBP_A_MODE, kmod.KBP_MODE_PERIODIC)
                + u32(kmod.KBP_A_INTERVAL_US, 500) + u32(kmod.KBP_A_NETAP, 1)
                + u32(kmod.KBP_A_ROUND_MS, 200) + u32(kmod.KBP_A_MIN_INTERVAL_US, 100)
                + u32(kmod.KBP_A_MAX_INTERVAL_US, 2000) + u32(kmod.KBP_A_MIN_CHANGE, 30)
                + u32(kmod.KBP_A_MAX_ROUND, 50))
    assert encoded(m) == want
    assert encoded(kmod.build_poller_set(1, netap=0)) == genl(
        kmod.KBP_CMD_POLLER_SET, u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_NETAP, 0))
    with pytest.raises(ValueError, match="unknown knob 'interval'"):
        kmod.build_poller_set(1, interval=5)
    # the class and the non-rt poller's nice (s32)
    assert encoded(kmod.build_poller_set(1, cls="non-rt", nice=-3)) == genl(
        kmod.KBP_CMD_POLLER_SET, u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_CLASS, 1)
        + nla(kmod.KBP_A_NICE, (-3).to_bytes(4, "little", signed=True)))
    with pytest.raises(ValueError, match="unknown class 'nrt'"):
        kmod.build_attach("eth1", cpu=1, cls="nrt")
    # objective by id (kbpctl passes names.OBJECTIVE_IDS[...]) or by name
    for obj in (1, "bytes-per-cpu"):
        assert encoded(kmod.build_poller_set(1, objective=obj)) == genl(
            kmod.KBP_CMD_POLLER_SET, u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_OBJECTIVE, 1))


def test_decode_periodic_poller_and_status_line() -> None:
    nest = nla(kmod.KBP_A_NETAP_STATE | NESTED, b"".join((
        u32(kmod.KBP_NETAP_A_ROUND, 3), nla(kmod.KBP_NETAP_A_PAD, b""),
        u64(kmod.KBP_NETAP_A_ROUNDS, 40), u32(kmod.KBP_NETAP_A_INTERVAL_US, 1590),
        u32(kmod.KBP_NETAP_A_LOW_US, 2510), u32(kmod.KBP_NETAP_A_HIGH_US, 1590),
        u32(kmod.KBP_NETAP_A_RANGE_LO_US, 100), u32(kmod.KBP_NETAP_A_RANGE_HI_US, 4000),
        u32(kmod.KBP_NETAP_A_DISTANCE_US, 2410), u32(kmod.KBP_NETAP_A_CONVERGED, 0),
        u32(kmod.KBP_NETAP_A_RESTARTS, 2), nla(kmod.KBP_NETAP_A_PAD, b""),
        u64(kmod.KBP_NETAP_A_LAST_OBJECTIVE, 12345), u32(kmod.KBP_NETAP_A_OBJECTIVE, 1),
        nla(kmod.KBP_NETAP_A_PAD, b""), u64(kmod.KBP_NETAP_A_LAST_BYTES, 1234),
        nla(kmod.KBP_NETAP_A_PAD, b""), u64(kmod.KBP_NETAP_A_LAST_CPU_NS, 100_000_000))))
    raw = genl(kmod.KBP_CMD_POLLER_GET,
               u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_MODE, kmod.KBP_MODE_PERIODIC)
               + PAD + u64(kmod.KBP_A_HANDBACKS, 7) + u32(kmod.KBP_A_INTERVAL_US, 1000)
               + u32(kmod.KBP_A_NETAP, 1) + u32(kmod.KBP_A_ROUND_MS, 1000)
               + u32(kmod.KBP_A_OBJECTIVE, 1) + nest)
    p = kmod._poller_from(decode(raw))
    assert (p.mode, p.handbacks, p.interval_us, p.netap, p.round_ms, p.objective) == \
        ("periodic", 7, 1000, True, 1000, "bytes-per-cpu")
    assert p.search == kmod.NetapState(round=3, rounds=40, interval_us=1590, low_us=2510,
                                       high_us=1590, range_lo_us=100, range_hi_us=4000,
                                       distance_us=2410, converged=False, restarts=2,
                                       objective="bytes-per-cpu", last_objective=12345,
                                       last_bytes=1234, last_cpu_ns=100_000_000)
    assert p.search.last_work == 12345     # the old name still reads
    from kbp.backends import PollerStatus
    from kbp.backends.kmod import _periodic
    from kbp.render import periodic_line
    ps = PollerStatus(cpu=1, pid=None, mode="periodic", linger_us=0, quota=64, napis=1,
                      policy=None, priority=None, counters={}, periodic=_periodic(p))
    line = periodic_line(ps)
    assert line.startswith("kbp/1 periodic: 7 hand-backs to interrupts, search round 3")
    assert "interval 1590 us" in line and "probes 2510/1590 us in 100..4000 us" in line
    assert line.endswith("objective bytes-per-cpu: last round 12345 bytes per CPU-second "
                         "(1234 bytes in 100ms of CPU)"), line
    p.search.objective, p.search.last_objective = "bytes", 1234
    assert periodic_line(PollerStatus(
        cpu=1, pid=None, mode="periodic", linger_us=0, quota=64, napis=1, policy=None,
        priority=None, counters={}, periodic=_periodic(p))).endswith(
        "objective bytes: last round 1234 bytes")
    p.search = None
    p.netap = False
    assert periodic_line(PollerStatus(cpu=1, pid=None, mode="periodic", linger_us=0, quota=64,
                                      napis=1, policy=None, priority=None, counters={},
                                      periodic=_periodic(p))).endswith("fixed interval 1000 us")
    p.mode = "hybrid"
    assert _periodic(p) is None


def test_pid_zero_means_unknown(tmp_path: Path) -> None:
    """Outside the initial pid namespace the module reports pids as 0: kmod passes that on,
    status shows no pid and no thread."""
    assert kmod._poller_from(decode(poller_reply(pid=0))).pid == 0
    dev = kmod._device_from(decode(dev_reply(pid=0)))
    assert [n.pid for n in dev.napis] == [0, 0]

    class PidNs(NetnsModule):
        def devices(self) -> list[kmod.Device]:
            return [dev]

        def pollers(self) -> list[kmod.Poller]:
            return [kmod._poller_from(decode(poller_reply(pid=0)))]

    be = kmod_backend.KmodBackend(state=StateDir(tmp_path), client=PidNs())
    (d,), (p,) = be.describe(None, None, [])
    assert p.pid is None and p.policy is None and p.priority == 50
    assert [n.thread for n in d.napis] == [None, None]


def test_decode_device() -> None:
    d = kmod._device_from(decode(dev_reply()))
    assert (d.ifindex, d.ifname, d.netns_inum, d.state, d.cpu, d.mode, d.napi_count,
            d.packets, d.polls) == (5, "eth1", 4026531840, "active", 1, "busy", 2, 201, 21)
    assert [(n.index, n.id, n.cpu, n.pid, n.packets, n.polls) for n in d.napis] == \
        [(0, 8193, 1, 4242, 100, 10), (1, 8194, 1, 4242, 101, 11)]


# -- errors ---------------------------------------------------------------------------
class FakeSock:
    prid = 0x20

    def __init__(self, replies: list[bytes] | None = None, error: Exception | None = None
                 ) -> None:
        self.replies = replies or []
        self.error = error
        self.sent: list[Any] = []

    def nlm_request(self, msg: Any, msg_type: int, msg_flags: int) -> Iterator[Any]:
        self.sent.append((msg, msg_flags))
        if self.error is not None:
            raise self.error
        for raw in self.replies:
            yield decode(raw)

    def close(self) -> None:
        pass


def client_with(sock: FakeSock) -> kmod.Client:
    c = kmod.Client.__new__(kmod.Client)
    c.sock = sock  # type: ignore[assignment]
    return c


def test_kernel_error_carries_errno_and_extack() -> None:
    c = client_with(FakeSock(error=NetlinkError(errno.EBUSY, "poller serves other devices "
                                                             "with other knobs")))
    with pytest.raises(kmod.KbpError) as e:
        c.attach("eth1", cpu=1)
    assert e.value.errno == errno.EBUSY
    assert e.value.message == "poller serves other devices with other knobs"
    assert str(e.value) == "attach eth1: poller serves other devices with other knobs (EBUSY)"
    c = client_with(FakeSock(error=NetlinkError(errno.ENODEV)))
    with pytest.raises(kmod.KbpError) as e:
        c.detach("nope")
    assert e.value.errno == errno.ENODEV and "No such device" in str(e.value)


def test_client_requests_and_parses() -> None:
    sock = FakeSock([poller_reply(), poller_reply()])
    c = client_with(sock)
    ps = c.pollers()
    assert [p.cpu for p in ps] == [1, 1]
    sock = FakeSock([dev_reply()])
    c = client_with(sock)
    d = c.device("eth1")
    assert d is not None and d.ifname == "eth1"
    c = client_with(FakeSock(error=NetlinkError(errno.ENOENT, "device is not attached")))
    assert c.device("eth1") is None


def test_unknown_netns_is_refused_before_sending() -> None:
    sock = FakeSock()
    c = client_with(sock)
    with pytest.raises(kmod.KbpError, match="unknown netns"):
        c.attach("eth1", netns="no-such-netns-kbp", cpu=1)
    assert sock.sent == []


def test_module_not_loaded_is_explicit() -> None:
    if kmod.SYS_MODULE.exists():
        pytest.skip(reason="the kbp module is loaded on this machine")
    with pytest.raises(kmod.ModuleNotLoaded) as e:
        kmod.Client()
    msg = str(e.value)
    assert "modprobe kbp" in msg and "--backend stock" in msg and "\n" not in msg
    assert not kmod.is_loaded()
    with pytest.raises(kmod.ModuleNotLoaded):
        kmod.pollers()
    be = kmod_backend.KmodBackend()
    assert be.available() == (False, "kbp module not loaded")
    with pytest.raises(Unavailable) as u:
        be.enable(EnableRequest(["lo"]))
    assert u.value.exit_code == EXIT_UNAVAILABLE and "modprobe kbp" in str(u.value)


# -- the kmod backend against a fake module -------------------------------------------
class FakeModule:
    """Just enough of kbp.ko: attachments and pollers."""

    def __init__(self) -> None:
        self.attached: dict[str, dict[str, Any]] = {}
        self.fail_attach: int | None = None
        #: serve every NAPI on the attachment's default CPU, whatever the map says (what
        #: the module did for virtio-net's RX queue 1 when it counted TX NAPIs)
        self.ignore_map = False

    def __call__(self) -> FakeModule:  # the client factory
        return self

    def close(self) -> None:
        pass

    def device(self, dev: str, netns: str | None = None) -> kmod.Device | None:
        a = self.attached.get(dev)
        if a is None:
            return None
        qm = dict(a.get("queue_map") or [(0, a["cpu"])])
        napis = [kmod.NapiInfo(index=i, id=8193 + i, cpu=a["cpu"] if self.ignore_map else c,
                               pid=None) for i, c in sorted(qm.items())]
        return kmod.Device(ifindex=5, ifname=dev, state="active", cpu=a["cpu"],
                           mode=kmod.mode_name(kmod.mode_id(a["mode"])) if a["mode"] else None,
                           napis=napis)

    def devices(self) -> list[kmod.Device]:
        return [d for d in (self.device(n) for n in self.attached) if d is not None]

    def attach(self, dev: str, netns: str | None = None, **kw: Any) -> None:
        if self.fail_attach is not None:
            raise kmod.KbpError(self.fail_attach, "poller serves other devices", f"attach {dev}")
        self.attached[dev] = kw

    def detach(self, dev: str, netns: str | None = None) -> None:
        if dev not in self.attached:
            raise kmod.KbpError(errno.ENOENT, "device is not attached")
        del self.attached[dev]

    def pollers(self) -> list[kmod.Poller]:
        cpus = sorted({a["cpu"] for a in self.attached.values()})
        return [kmod.Poller(cpu=c, pid=None, mode="hybrid", rt_prio=50) for c in cpus]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[FakeModule, Any]:
    mod = FakeModule()
    monkeypatch.setattr(kmod_backend, "require_root", lambda what: None)
    monkeypatch.setattr(backends, "get_link", lambda dev, netns=None: Link(
        ifindex=999999, name=dev, kind=None, operstate="UP", up=True, rx_packets=0))
    be = kmod_backend.KmodBackend(state=StateDir(tmp_path), client=mod)
    return mod, be


def test_kmod_enable_disable_journals_the_attachment(fake: tuple[FakeModule, Any]) -> None:
    mod, be = fake
    req = EnableRequest(["eth1"], cpus=[0, 1], mode="busy", rt_prio=70, quota=32)
    res = be.enable(req)
    assert res.devices[0].changes == 1
    a = mod.attached["eth1"]
    assert a["cpu"] == 0 and a["queue_map"] == [(0, 0), (1, 1)]
    assert (a["mode"], a["rt_prio"], a["quota"], a["linger_us"]) == ("busy", 70, 32, None)
    (rec,) = be.state.records()
    assert rec.complete and rec.backend == "kmod" and rec.changes[0].kind == "kmod_attach"
    assert rec.changes[0].old is None
    devs, pollers = be.describe(None, None, be.state.records())
    assert devs[0].backend == "kmod" and devs[0].mode == "busy" and devs[0].managed
    assert pollers[0].priority == 50
    be.enable(req)  # reconfigure: detach, attach again
    assert "eth1" in mod.attached and len(be.state.records()) == 1
    be.disable(["eth1"])
    assert mod.attached == {} and be.state.records() == []


def test_kmod_enable_reports_where_the_module_placed_each_queue(
        fake: tuple[FakeModule, Any]) -> None:
    """enable prints the CPUs the module serves the NAPIs on, read back from it; a queue
    the module did not place where the map says fails the enable (rolled back), and a
    journal whose map the module no longer follows is a problem in status."""
    from kbp.errors import OperationFailed
    mod, be = fake
    res = be.enable(EnableRequest(["eth1"], cpus=[0, 1]))
    assert res.devices[0].cpus == [0, 1] and res.devices[0].napis == 2
    be.disable(["eth1"])
    mod.ignore_map = True
    with pytest.raises(OperationFailed, match=r"NAPI #1 \(id 8194\) is served on CPU 0, "
                                              r"not CPU 1 as enabled"):
        be.enable(EnableRequest(["eth1"], cpus=[0, 1]))
    assert mod.attached == {} and be.state.records() == []
    mod.ignore_map = False
    be.enable(EnableRequest(["eth1"], cpus=[0, 1]))
    mod.ignore_map = True           # the module changed its mind behind kbpctl's back
    devs, _ = be.describe(None, None, be.state.records())
    assert any("NAPI #1 (id 8194) is served on CPU 0, not CPU 1" in p.text
               and p.kind == MISPLACED for p in devs[0].problems), devs[0].problems
    assert kmod_backend.placement_problems(None, []) == []
    # the module's numbering is not kbpctl's (TX NAPIs counted: RX queue 1 is #2)
    odd = [kmod.NapiInfo(index=0, id=8193, cpu=0), kmod.NapiInfo(index=2, id=8195, cpu=0)]
    assert kmod_backend.placement_problems([[0, 0], [1, 1]], odd) == [Problem(
        MISPLACED, "NAPI #2 (id 8195) is served on CPU 0, which the queue map it was enabled "
        "with does not name (it names NAPIs #0, #1)")]
    # fewer queues than when it was enabled (ethtool -L): nothing wrong
    assert kmod_backend.placement_problems([[0, 0], [1, 1]], odd[:1]) == []


def test_kmod_refusal_rolls_back(fake: tuple[FakeModule, Any]) -> None:
    from kbp.errors import OperationFailed
    mod, be = fake
    mod.fail_attach = errno.EBUSY
    with pytest.raises(OperationFailed, match="poller serves other devices"):
        be.enable(EnableRequest(["eth1"], cpus=[1]))
    assert mod.attached == {} and be.state.records() == []


def test_kmod_refuses_device_attached_outside_kbpctl(fake: tuple[FakeModule, Any]) -> None:
    from kbp.errors import InvalidInput
    mod, be = fake
    mod.attached["eth1"] = {"cpu": 1, "mode": "hybrid"}
    with pytest.raises(InvalidInput, match="outside kbpctl"):
        be.enable(EnableRequest(["eth1"], cpus=[1]))
    devs, _ = be.describe(None, None, [])
    assert devs[0].name == "eth1" and not devs[0].managed


def test_attachment_values() -> None:
    r = EnableRequest(["eth1"], linger_us=10)
    assert kmod_backend.attachment(r, [3], 4) == {"cpu": 3, "queue_map": None, "mode": "hybrid",
                                                   "linger_us": 10, "quota": None, "rt_prio": 50,
                                                   "freq_ctl": False}
    assert kmod_backend.attachment(EnableRequest(["eth1"], freq_ctl=True), [3], 4)[
        "freq_ctl"] is True
    assert kmod_backend.attachment(r, [1, 2], 3)["queue_map"] == [[0, 1], [1, 2], [2, 1]]
    assert kmod_backend.attachment(r, [1, 2], None)["queue_map"] == [[0, 1], [1, 2]]


# -- status of a device in another netns, from any netns ------------------------------
class NetnsModule:
    """The module as a process outside the initial netns and outside ``blue`` sees it: the
    DEV_GET dump answers for the caller's netns only, DEV_GET doit with a netns fd answers
    for that netns (ENOENT: not attached; ENODEV: no such device there)."""

    BLUE = 4026532300

    def __init__(self, dump_sees_blue: bool = False, error: int | None = None) -> None:
        self.blue = {"eth1": kmod._device_from(decode(dev_reply(inum=self.BLUE)))}
        self.dump_sees_blue = dump_sees_blue
        self.error = error
        self.asked: list[tuple[str, str | None]] = []

    def __call__(self) -> NetnsModule:
        return self

    def close(self) -> None:
        pass

    def devices(self) -> list[kmod.Device]:
        return list(self.blue.values()) if self.dump_sees_blue else []

    def device(self, dev: str, netns: str | None = None) -> kmod.Device | None:
        self.asked.append((dev, netns))
        if self.error is not None:
            raise kmod.KbpError(self.error, "", f"dev-get {dev}")
        if netns != "blue":
            raise kmod.KbpError(errno.ENODEV, "no device of that name or index in this netns")
        if dev not in self.blue:
            raise kmod.KbpError(errno.ENOENT, "device is not attached")
        return self.blue[dev]

    def pollers(self) -> list[kmod.Poller]:
        return [kmod._poller_from(decode(poller_reply()))]


def journaled(tmp_path: Path, dev: str = "eth1", netns: str | None = "blue") -> StateDir:
    st = StateDir(tmp_path / "run")
    j = st.begin("kmod", dev, netns, 5, EnableRequest([dev], netns=netns, mode="busy").settings())
    j.done()
    j.close()
    return st


def describe(mod: NetnsModule, st: StateDir, netns: str | None,
             devices: list[str] | None) -> list[backends.DeviceStatus]:
    be = kmod_backend.KmodBackend(state=st, client=mod)
    return be.describe(netns, devices, [r for r in st.records() if r.backend == "kmod"])[0]


def test_status_of_another_netns_is_the_same_from_anywhere(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setattr(kmod_backend, "_netns_inum",
                        lambda ns: NetnsModule.BLUE if ns == "blue" else 4026531833)
    st = journaled(tmp_path)
    for devices in (["eth1"], None):
        outside = NetnsModule(dump_sees_blue=False)   # e.g. ip netns exec red kbpctl status
        inside = NetnsModule(dump_sees_blue=True)     # initial netns, or blue itself
        (a,), (b,) = describe(outside, st, "blue", devices), describe(inside, st, "blue",
                                                                      devices)
        assert a == b
        assert a.managed and a.netns == "blue" and a.problems == []
        assert a.counters == {"packets": 201, "polls": 21}
        assert [(n.id, n.counters["packets"]) for n in a.napis] == [(8193, 100), (8194, 101)]
        assert outside.asked == [("eth1", "blue")] and inside.asked == []


def test_unmanaged_device_of_another_netns(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmod_backend, "_netns_inum",
                        lambda ns: NetnsModule.BLUE if ns == "blue" else 4026531833)
    monkeypatch.setattr(kmod_backend, "link_names", lambda ns: ["lo", "eth1"])
    st = StateDir(tmp_path / "run")
    mod = NetnsModule()
    (d,) = describe(mod, st, "blue", ["eth1"])
    assert (d.name, d.netns, d.managed, len(d.napis)) == ("eth1", "blue", False, 2)
    (d,) = describe(mod, st, "blue", None)   # every link of blue is asked about
    assert (d.name, d.netns, d.managed) == ("eth1", "blue", False)
    assert ("lo", "blue") in mod.asked
    assert describe(mod, st, None, ["eth1"]) == []   # this netns: the dump is the answer


def test_status_says_why_the_module_cannot_answer(tmp_path: Path) -> None:
    st = journaled(tmp_path)
    (d,) = describe(NetnsModule(error=errno.EPERM), st, "blue", ["eth1"])
    assert d.napis == [] and len(d.problems) == 1 and d.problems[0].kind == MODULE_SILENT
    assert d.problems[0].text.startswith("the kbp module did not say how it serves eth1: "
                                         "dev-get eth1: Operation not permitted")
    class Unprivileged(NetnsModule):
        def devices(self) -> list[kmod.Device]:
            raise kmod.KbpError(errno.EPERM, "", "dev-get")

    (d,) = describe(Unprivileged(), st, None, None)
    assert "'sudo kbpctl status'" in d.problems[0].text and "EPERM" in d.problems[0].text
    assert d.problems[0].kind == NEEDS_ROOT
    (d,) = describe(NetnsModule(), journaled(tmp_path, "eth9"), "blue", ["eth9"])
    assert d.problems == [Problem(DETACHED, "eth9 is not attached to the module any more: "
                                  "'kbpctl apply' or enable again")]


# -- enable: a busy poller owns its CPU -----------------------------------------------
class EnablingBackend:
    def __init__(self, name: str) -> None:
        self.name = name

    def enable(self, req: EnableRequest) -> backends.EnableResult:
        cpus = req.cpus or [0]
        return backends.EnableResult(self.name, "", [backends.DeviceResult(
            d, req.netns, self.name, 2, cpus, 1) for d in req.devices])


@pytest.mark.parametrize("backend", ["kmod", "stock"])
def test_enable_busy_says_the_poller_owns_its_cpu(backend: str, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from kbp import cli
    monkeypatch.setattr(backends, "get", lambda name, state=None: EnablingBackend(name))
    assert cli.main(["enable", "eth1", "eth2", "--backend", backend, "--mode", "busy",
                     "--cpus", "2-3"]) == 0
    out, err = capsys.readouterr()
    assert out.count("enabled eth") == 2 and "note" not in out
    assert err.startswith("kbpctl: note: ") and err.count("kbpctl: note") == 1
    flat = " ".join(err.split())
    if backend == "kmod":  # FIFO 50: the module's poller yields
        assert "own CPUs 2-3" in flat and "~100%" in flat and "only when it yields" in flat
        # a poller per CPU and device, by its thread's name (kbp.names.poller_name)
        assert "busy pollers kbp/<cpu>:eth1, kbp/<cpu>:eth2 own" in flat
        assert out.count("SCHED_FIFO 50") == 2
    else:  # stock busy runs SCHED_NORMAL (upstream threaded busy polling does not yield)
        assert "busy NAPI threads on CPUs 2-3 never sleep" in flat and "~100%" in flat
        assert "SCHED_NORMAL" in flat and "fairly" in flat and "kbp/2" not in flat
        assert out.count("SCHED_NORMAL") == 2
    assert "other CPUs" in flat and "--mode hybrid" in flat
    assert len(err.splitlines()) <= 5
    assert cli.main(["enable", "eth1", "--backend", backend, "--cpus", "2"]) == 0
    assert capsys.readouterr().err == ""


def test_busy_notice_names_one_cpu() -> None:
    from kbp.cli import busy_notice
    flat = " ".join(busy_notice("kmod", [(3, "eth1"), (3, "eth1")], 50).split())
    assert flat.startswith("kbpctl: note: the busy poller kbp/3:eth1 owns CPU 3: it spins")
    flat = " ".join(busy_notice("kmod", [(3, "eth1"), (3, "eth2")], 50).split())
    assert flat.startswith("kbpctl: note: the busy pollers kbp/3:eth1, kbp/3:eth2 own CPU 3: "
                           "each spins")


def test_apply_of_a_busy_device_says_it_too(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from kbp import cli, config
    acts = [config.Action("enable", "eth1", None, "kmod", "listed",
                          EnableRequest(["eth1"], mode="busy", cpus=[1])),
            config.Action("keep", "eth2", None, "kmod", "",
                          EnableRequest(["eth2"], mode="busy", cpus=[2])),
            config.Action("enable", "eth3", None, "kmod", "listed", EnableRequest(["eth3"]))]
    monkeypatch.setattr(config, "load", lambda path: type("Cfg", (), {"path": path})())
    monkeypatch.setattr(config, "converge", lambda cfg, dry_run=False: acts)
    assert cli.main(["apply"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "the busy poller kbp/1:eth1 owns CPU 1" in err and "kbp/2" not in err
    assert cli.main(["apply", "--dry-run"]) == 0
    assert capsys.readouterr().err == ""


def test_cap_sys_nice_refusal_says_what_a_container_may_do() -> None:
    from kbp.backends.kmod import _hint
    e = kmod.KbpError(errno.EPERM, "kbp: mode busy and rt_prio > 0 need CAP_SYS_NICE")
    assert "--mode hybrid --rt-prio 0" in _hint(e)
    assert _hint(kmod.KbpError(errno.EPERM, "Operation not permitted")) == ""
    assert _hint(kmod.KbpError(errno.EBUSY, "CAP_SYS_NICE")) == ""
