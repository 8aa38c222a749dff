"""kbpctl names each of the module's poller threads as the module does: one thread per CPU,
class and device, ``<prefix>/<cpu>:<device>`` (kbp/1:eth0; kbpn/1:eth2 for class non-rt).
Before, status, its problems and the notes printed kbp/<cpu> (the name of the per-CPU threads
before pollers were per device), and a stuck non-rt poller was called kbp/<cpu>:<dev>: names
an operator finds in no ``ps``."""

from __future__ import annotations

import re
from pathlib import Path

from kbp import names
from kbp.backends import DeviceStatus, PollerStatus
from kbp.backends.kmod import periodic_drift, stuck_pollers

MODULE = Path(__file__).resolve().parents[2] / "module" / "kbp_poller.c"


def test_the_rule_is_the_modules() -> None:
    """The prefixes by class and the name's format, read from the module's source."""
    src = MODULE.read_text()
    prefixes = dict(re.findall(
        r'\[KBP_CLASS_\w+\] = \{[^}]*?\.name = "([^"]+)",[^}]*?\.prefix = "([^"]+)"', src))
    assert prefixes == names.POLLER_THREAD_PREFIX
    assert re.search(r'snprintf\(p->name, sizeof\(p->name\), "%s/%d:%s", p->cls->prefix, '
                     r'cpu,\s*kd->dev->name\)', src), "the module names its threads otherwise"
    assert names.poller_name(1, "rt", "eth0") == "kbp/1:eth0"
    assert names.poller_name(1, "non-rt", "eth2") == "kbpn/1:eth2"
    # the default class is rt (a module without classes: test_kmod's decoder test)
    assert names.poller_name(3, device="eth0") == "kbp/3:eth0"
    assert names.poller_name(3) == "kbp/3"                       # not (yet) serving a device


def _poller(**kw: object) -> PollerStatus:
    base: dict[str, object] = dict(cpu=3, pid=41, mode="hybrid", linger_us=0, quota=8, napis=1,
                                   policy="SCHED_OTHER", priority=0, counters={})
    return PollerStatus(**{**base, **kw})  # type: ignore[arg-type]


def test_a_stuck_non_rt_poller_is_named_by_its_thread() -> None:
    ds = DeviceStatus("eth2", None, 6, None, "kmod")
    (p,) = stuck_pollers(ds, [_poller(cls="non-rt", device="eth2", state="stuck")])
    assert "poller kbpn/3:eth2 is stuck" in p.text
    (p,) = stuck_pollers(ds, [_poller(cls="rt", device="eth2", state="stuck")])
    assert "poller kbp/3:eth2 is stuck" in p.text


def test_periodic_drift_names_the_devices_poller() -> None:
    ds = DeviceStatus("eth1", None, 5, None, "kmod", cpus=[2], periodic_request={
        "interval_us": 500, "round_ms": 1000, "min_interval_us": 100, "max_interval_us": 4000,
        "min_change": 20, "max_round": 300, "objective": "bytes"})
    (p,) = periodic_drift(ds, [_poller(cpu=2, mode="periodic", device="eth1", cls="rt",
                                       periodic={"interval_us": 900, "netap": False})])
    assert p.text.startswith("poller kbp/2:eth1 runs interval_us 900 (enabled with 500)")
