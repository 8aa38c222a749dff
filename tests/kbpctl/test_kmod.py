"""kbp.kmod (client of the module's genl family) and the kmod backend, offline.

The module cannot be loaded on this host; the lead runs the client against the real module
in the VM. Here: the message classes mirror module/uapi/kbp.h exactly, requests encode to
the bytes the kernel expects, replies (hand-packed like the kernel packs them) decode to the
dataclasses, errors carry errno + extack, and an absent module is an explicit error.
"""

from __future__ import annotations

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
from kbp.state import StateDir

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
    with pytest.raises(ValueError):
        kmod.build_attach("eth1")


# -- decoding replies packed the way kbp_genl.c packs them ----------------------------
PAD = nla(kmod.KBP_A_PAD, b"")


def poller_reply() -> bytes:
    counters = b"".join(PAD + u64(a, v) for a, v in (
        (kmod.KBP_A_PASSES, 10), (kmod.KBP_A_EMPTY_PASSES, 4), (kmod.KBP_A_PACKETS, 1 << 40),
        (kmod.KBP_A_WAKEUPS, 3), (kmod.KBP_A_SLEEPS, 3), (kmod.KBP_A_SLEEP_NS, 5000),
        (kmod.KBP_A_POLL_NS, 7000), (kmod.KBP_A_FREQ_CHANGES, 6), (kmod.KBP_A_RESPAWNS, 0),
        (kmod.KBP_A_REPAIRS, 1)))
    return genl(kmod.KBP_CMD_POLLER_GET,
                u32(kmod.KBP_A_CPU, 1) + u32(kmod.KBP_A_PID, 4242) + u32(kmod.KBP_A_MODE, 2)
                + u32(kmod.KBP_A_LINGER_US, 20) + u32(kmod.KBP_A_QUOTA, 64)
                + u32(kmod.KBP_A_RT_PRIO, 50) + u32(kmod.KBP_A_FREQ_CTL, 1)
                + u32(kmod.KBP_A_NAPIS, 2) + counters)


def dev_reply() -> bytes:
    def napi(i: int, nid: int) -> bytes:
        return nla(kmod.KBP_A_NAPI | NESTED,
                   u32(kmod.KBP_NAPI_A_INDEX, i) + u32(kmod.KBP_NAPI_A_ID, nid)
                   + u32(kmod.KBP_NAPI_A_CPU, 1) + u32(kmod.KBP_NAPI_A_PID, 4242)
                   + nla(kmod.KBP_NAPI_A_PAD, b"") + u64(kmod.KBP_NAPI_A_PACKETS, 100 + i)
                   + u64(kmod.KBP_NAPI_A_POLLS, 10 + i))
    return genl(kmod.KBP_CMD_DEV_GET,
                u32(kmod.KBP_A_IFINDEX, 5) + nla(kmod.KBP_A_IFNAME, b"eth1\0")
                + u32(kmod.KBP_A_NETNS_INUM, 4026531840)
                + u32(kmod.KBP_A_STATE, kmod.KBP_STATE_ACTIVE) + u32(kmod.KBP_A_CPU, 1)
                + u32(kmod.KBP_A_MODE, 1) + napi(0, 8193) + napi(1, 8194)
                + u32(kmod.KBP_A_NAPIS, 2) + PAD + u64(kmod.KBP_A_PACKETS, 201)
                + u64(kmod.KBP_A_POLLS, 21))


def decode(raw: bytes) -> Any:
    m = kmod.kbpmsg(raw)
    m.decode()
    return m


def test_decode_poller() -> None:
    p = kmod._poller_from(decode(poller_reply()))
    assert (p.cpu, p.pid, p.mode, p.linger_us, p.quota, p.rt_prio, p.freq_ctl, p.napis) == \
        (1, 4242, "hybrid", 20, 64, 50, True, 2)
    assert p.counters() == {"passes": 10, "empty_passes": 4, "packets": 1 << 40, "wakeups": 3,
                            "sleeps": 3, "sleep_ns": 5000, "poll_ns": 7000, "freq_changes": 6,
                            "respawns": 0, "repairs": 1}
    assert list(p.counters()) == list(names.POLLER_COUNTERS)


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

    def __call__(self) -> FakeModule:  # the client factory
        return self

    def close(self) -> None:
        pass

    def device(self, dev: str, netns: str | None = None) -> kmod.Device | None:
        a = self.attached.get(dev)
        if a is None:
            return None
        return kmod.Device(ifindex=5, ifname=dev, state="active", cpu=a["cpu"],
                           mode=kmod.mode_name(kmod.mode_id(a["mode"])) if a["mode"] else None,
                           napis=[kmod.NapiInfo(index=0, id=8193, cpu=a["cpu"], pid=None)])

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
