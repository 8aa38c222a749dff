"""The irq-suspend mode (issue 12, item 3) without root: it is skipped with the reason on
kernels without napi-set's irq-suspend-timeout or without EPIOCSPARAMS (read from the netdev
policy and the epoll ioctl, not the version number); it sets the kernel example's values on
every NAPI of the RT device and RPS off there, and puts back exactly what it found, also
when the runner unwinds; the runner swaps the RT application (sockperf <-> kbp-echo) around
it and nowhere else."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_modes import FakeKernel

from kbp import names, sysinfo
from kbp.bench import knobs, modes, workloads
from kbp.bench.knobs import Knob, KnobError
from kbp.bench.modes import AppEnv, AppPlace, IrqSuspendMode, Target, all_modes, napi_knob
from kbp.bench.runner import Aborted, Bench, BenchConfig
from kbp.netdev import (
    NETDEV_A_NAPI_DEFER_HARD_IRQS,
    NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT,
    NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT,
    NETDEV_A_NAPI_THREADED,
    NetdevFeatures,
)

NS, DEV = "kbpb-test-s", "rt-s-test"
T = Target(NS, DEV, 1)
Q = f"/sys/class/net/{DEV}/queues"
REL_612 = "6.12.48+deb13-amd64"


@pytest.fixture(autouse=True)
def _own_lock(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBP_RUN_DIR", str(tmp_path / "run"))


def _feats(*attrs: int, family: bool = True, napi_set: bool = True) -> NetdevFeatures:
    return NetdevFeatures(family=family, napi_get=family, napi_set=napi_set,
                          napi_set_attrs=dict.fromkeys(attrs))


FEATS_612 = _feats(family=True, napi_set=False)            # 6.12: napi-get, no napi-set
FEATS_613 = _feats(NETDEV_A_NAPI_DEFER_HARD_IRQS, NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT,
                   NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT)
FEATS_618 = _feats(NETDEV_A_NAPI_DEFER_HARD_IRQS, NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT,
                   NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT, NETDEV_A_NAPI_THREADED)


def _mode(k: FakeKernel | None = None, feats: NetdevFeatures = FEATS_618, ep: int | None = None,
          napis: tuple[int, ...] = (8193, 8194), queues: tuple[str, ...] = ("rx-0", "rx-1"),
          ) -> IrqSuspendMode:
    return IrqSuspendMode(effector=(k or FakeKernel()).effector,
                          find_napis=lambda t: list(napis), find_rx_queues=lambda t: list(queues),
                          features=lambda: feats, epoll_errno=lambda: ep)


# -- unavailable(): from the netdev policy and the epoll ioctl ------------------------------
def test_unavailable_on_a_kernel_without_irq_suspend_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: REL_612)
    assert _mode(feats=FEATS_612).unavailable() == (
        "IRQ suspension (netdev napi-set irq-suspend-timeout) needs Linux 6.13 or later; "
        f"this kernel is {REL_612} (it has no netdev napi-set)")
    # napi-set without the attribute (a kernel between, or a backport without it)
    no_attr = _feats(NETDEV_A_NAPI_DEFER_HARD_IRQS, NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT)
    why = _mode(feats=no_attr).unavailable()
    assert why == ("IRQ suspension (netdev napi-set irq-suspend-timeout) needs Linux 6.13 or "
                   f"later; this kernel is {REL_612} (its netdev napi-set has no "
                   "irq-suspend-timeout)")
    old = _mode(feats=_feats(family=False, napi_set=False)).unavailable()
    assert old is not None and old.endswith("(it has no netdev netlink family)")


def test_the_policy_decides_not_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 6.12 release string with the attribute in its policy (a backport) can run it; a
    6.13 one without it cannot."""
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: REL_612)
    assert _mode(feats=FEATS_613).unavailable() is None
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: "6.13.0")
    assert "needs Linux 6.13" in (_mode(feats=FEATS_612).unavailable() or "")


def test_unavailable_without_epiocsparams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: "6.8.0-40-generic")
    assert _mode(feats=FEATS_613, ep=errno.ENOTTY).unavailable() == (
        "epoll busy-poll parameters (EPIOCSPARAMS, prefer_busy_poll) need Linux 6.9 or later; "
        "this kernel is 6.8.0-40-generic (the ioctl fails: Inappropriate ioctl for device)")
    why = _mode(feats=FEATS_613, ep=errno.EOPNOTSUPP).unavailable()
    assert why is not None and "CONFIG_NET_RX_BUSY_POLL" in why


def test_the_probes_agree_with_this_kernel() -> None:
    """The real probes on the running kernel: 6.13+ has both (this host: 6.18)."""
    if sysinfo.kernel_version() < (6, 13, 0):
        pytest.skip(reason="the running kernel is older than 6.13")
    assert modes.netdev_features().napi_knob("irq_suspend_timeout")
    assert modes.epoll_params_errno() is None
    assert all_modes()[modes.IRQ_SUSPEND].unavailable() is None


# -- setup / teardown against a fake kernel --------------------------------------------------
def _kernel(rps: str = "00000000,00000002", flows: str = "0") -> FakeKernel:
    """The RT device's RPS files and its two NAPIs' attributes (napi_knob paths), as a
    6.13+ kernel has them, at values of its own."""
    k = FakeKernel()
    for q in ("rx-0", "rx-1"):
        k.files[(NS, f"{Q}/{q}/rps_cpus")] = rps
        k.files[(NS, f"{Q}/{q}/rps_flow_cnt")] = flows
    for nid, vals in ((8193, ("0", "0", "0")), (8194, ("2", "20000", "0"))):
        for attr, v in zip(("defer-hard-irqs", "gro-flush-timeout", "irq-suspend-timeout"),
                           vals, strict=True):
            k.files[(NS, napi_knob(nid, attr, NS).path)] = v
    return k


def test_setup_sets_every_napi_and_rps_off_teardown_restores_exactly() -> None:
    k = _kernel(flows="256")
    before = dict(k.files)
    m = _mode(k)
    assert m.app() == names.APP_KBP_ECHO and not m.spins
    assert m.app_place(AppPlace(1, 51), AppEnv()) == AppPlace(1, 51)   # placed like sockperf
    m.setup(T)
    for nid in (8193, 8194):
        assert k.files[(NS, napi_knob(nid, "defer-hard-irqs", NS).path)] == "2"
        assert k.files[(NS, napi_knob(nid, "gro-flush-timeout", NS).path)] == "20000"
        assert k.files[(NS, napi_knob(nid, "irq-suspend-timeout", NS).path)] == "20000000"
    for q in ("rx-0", "rx-1"):
        assert k.files[(NS, f"{Q}/{q}/rps_cpus")] == "00000000,00000000"   # same width
        assert k.files[(NS, f"{Q}/{q}/rps_flow_cnt")] == "0"
    d = m.describe()
    assert d["app"] == "kbp-echo" and d["epoll_params"]["prefer_busy_poll"] == 1
    assert d["found"][f"netdev napi 8194 gro-flush-timeout (netns {NS})"] == "20000"
    m.teardown()
    assert k.files == before
    assert m.describe()["found"] == {}


def test_rps_already_off_is_left_alone() -> None:
    k = _kernel(rps="0")
    m = _mode(k)
    m.setup(T)
    assert not [p for _, p, _ in k.log if "rps" in p]
    m.teardown()


def test_a_device_without_napi_is_an_error_before_anything_changes() -> None:
    k = _kernel()
    before = dict(k.files)
    m = _mode(k, napis=())
    with pytest.raises(RuntimeError, match="no NAPI instance"):
        m.setup(T)
    m.teardown()
    assert k.files == before and k.log == []


def test_half_done_setup_is_restored_and_a_failed_restore_is_named() -> None:
    k = _kernel()
    before = dict(k.files)
    bad = (NS, napi_knob(8194, "irq-suspend-timeout", NS).path)
    k.fail_writes[bad] = 0
    m = _mode(k)
    with pytest.raises(KnobError, match="8194 irq-suspend-timeout"):  # the bench's name
        m.setup(T)
    assert k.files != before                        # the knobs before it were changed
    k.fail_writes.clear()
    m.teardown()
    assert k.files == before
    k2 = _kernel()
    m2 = _mode(k2)
    m2.setup(T)
    k2.fail_writes[(NS, napi_knob(8193, "defer-hard-irqs", NS).path)] = 0
    with pytest.raises(KnobError, match=r"not restored: restoring defer_hard_irqs of NAPI 8193 "
                                        r"\(netns kbpb-test-s\) to '0'"):
        m2.teardown()
    assert k2.files[(NS, f"{Q}/rx-0/rps_cpus")] == "00000000,00000002"   # the rest is back


def test_zero_mask() -> None:
    assert modes.zero_mask("2") == "0"
    assert modes.zero_mask("ff,00000001") == "00,00000000"


def test_napi_knob_paths_round_trip() -> None:
    k = napi_knob(8193, "irq-suspend-timeout", NS)
    assert str(k) == f"netdev napi 8193 irq-suspend-timeout (netns {NS})"
    assert k.napi == (8193, "irq_suspend_timeout")
    assert Knob(f"{Q}/rx-0/rps_cpus", NS).napi is None
    with pytest.raises(ValueError):
        napi_knob(1, "threaded", NS)


def test_napi_knobs_go_through_netdev(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's knob handlers read a NAPI knob with napi-get and write it with napi-set
    in the knob's netns (kbpctl's NapiHandler); an attribute napi-get does not report is an
    error, not a value; the mode's teardown closes the netdev sockets."""
    from kbp import netdev
    calls: list[tuple[Any, ...]] = []
    vals = {"irq_suspend_timeout": 7, "defer_hard_irqs": 1}

    class _Client:
        def __init__(self, netns: str | None) -> None:
            calls.append(("open", netns))

        def napi(self, nid: int) -> Any:
            return netdev.Napi(nid, 3, **vals)

        def napi_set(self, nid: int, **kw: int) -> None:
            calls.append(("set", nid, kw))
            vals.update(kw)

        def close(self) -> None:
            calls.append(("close",))

    monkeypatch.setattr(netdev, "NetdevClient", _Client)
    m = _mode()
    m.effector = knobs.kernel_effector()
    ist = napi_knob(5, "irq-suspend-timeout", NS)
    assert knobs.read(m.effector, ist) == "7"
    ch = knobs.Changes(m.effector, state=None)
    ch.apply([(ist, "20000000")])
    with pytest.raises(KnobError, match="napi-get does not report gro_flush_timeout"):
        knobs.read(m.effector, napi_knob(5, "gro-flush-timeout", NS))
    ch.restore()
    m.teardown()
    assert calls == [("open", NS), ("set", 5, {"irq_suspend_timeout": 20000000}),
                     ("set", 5, {"irq_suspend_timeout": 7}), ("close",)]


# -- the runner swaps the RT application around the mode ------------------------------------
@dataclass
class _App:
    name: str
    log: list[str]
    places: list[AppPlace] = field(default_factory=list)
    port: int = workloads.SOCKPERF_PORT
    ns: str = NS
    ip: str = "198.18.0.2"
    cpu: int = 1

    def start(self) -> None:
        self.log.append(f"start {self.name}")

    def stop(self) -> str:
        self.log.append(f"stop {self.name}")
        return ""

    def place(self, where: AppPlace) -> None:
        self.places.append(where)
        self.log.append(f"place {self.name} {where.cpu}/{where.fifo}")


def _bench(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> Bench:
    b = Bench(BenchConfig(), cpus_available=lambda: [0, 1])
    b.plan()
    b.server = _App(names.APP_SOCKPERF, log)  # type: ignore[assignment]
    b.results = {"modes": {}}
    monkeypatch.setattr(b, "target", lambda: T)
    monkeypatch.setattr(workloads, "rt_app",
                        lambda name, ns, ip, cpu, port: _App(name, log, port=port, ns=ns,
                                                             ip=ip, cpu=cpu))
    return b


class _Plain(modes._Defaults):
    name = "plain"
    spins = False

    def unavailable(self) -> None:
        return None

    def setup(self, t: Target) -> None:
        pass

    def teardown(self) -> None:
        pass


def test_runner_swaps_in_kbp_echo_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    b = _bench(monkeypatch, log)
    k = _kernel()
    before = dict(k.files)
    with b._mode(_mode(k)):
        assert b.server is not None and b.server.name == names.APP_KBP_ECHO
        assert k.files != before
        assert log[-1] == "place kbp-echo 1/0"
    assert b.server.name == names.APP_SOCKPERF and k.files == before
    assert log == ["stop sockperf", "start kbp-echo", "place kbp-echo 1/0",
                   "stop kbp-echo", "start sockperf", "place sockperf 1/0"]
    log.clear()
    with b._mode(_Plain()):
        pass
    assert log == ["place sockperf 1/0", "place sockperf 1/0"]     # no swap for the others


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_runner_restores_and_swaps_back_on_exception(monkeypatch: pytest.MonkeyPatch,
                                                     exc: type[BaseException]) -> None:
    log: list[str] = []
    b = _bench(monkeypatch, log)
    k = _kernel()
    before = dict(k.files)
    with pytest.raises(exc), b._mode(_mode(k)):
        raise exc()
    assert k.files == before
    assert b.server is not None and b.server.name == names.APP_SOCKPERF
    assert log[-2:] == ["start sockperf", "place sockperf 1/0"]


def test_runner_stops_when_irq_suspend_cannot_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    b = _bench(monkeypatch, log)
    k = _kernel()
    with pytest.raises(Aborted, match="irq-suspend could not put back"), b._mode(_mode(k)):
        k.fail_writes[(NS, napi_knob(8193, "irq-suspend-timeout", NS).path)] = 0
    assert any("irq_suspend_timeout of NAPI 8193" in p for p in b.results["restore_problems"])
    assert b.server is not None and b.server.name == names.APP_SOCKPERF


def test_every_other_mode_keeps_sockperf() -> None:
    for name, m in all_modes().items():
        want = names.APP_KBP_ECHO if name == modes.IRQ_SUSPEND else names.APP_SOCKPERF
        assert m.app() == want, name
    assert set(workloads.RT_APPS) == set(names.RT_APPS)
    with pytest.raises(ValueError, match="unknown RT application"):
        workloads.rt_app("nginx", NS, "198.18.0.2", 1)
