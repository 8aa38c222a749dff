"""kbp.system.access in another network namespace: what is read and written is that
namespace's, and a failure keeps the kernel's errno across ``ip netns exec``."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator

import pytest

from kbp.system import access

pytestmark = [pytest.mark.root, pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (netns)")]


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"kbpsa-{uuid.uuid4().hex[:6]}"
    with access.Journal() as j:
        access.cmd(["ip", "netns", "add", name])
        j.defer(access.cmd, ["ip", "netns", "del", name], check=False)
        yield name


def test_netns_write_is_that_namespaces(ns: str) -> None:
    mtu = access.net_path("lo", "mtu")
    here = access.read(mtu)
    access.write(mtu, "1280", ns)
    assert access.read(mtu, ns) == "1280"
    assert access.read(mtu) == here
    assert access.exists(access.net_path("lo"), ns)
    assert "lo" in access.listdir("/sys/class/net", ns)
    assert access.cmd(["cat", mtu], ns=ns).stdout.strip() == "1280"


def test_netns_failure_keeps_errno(ns: str) -> None:
    with pytest.raises(OSError) as e:
        access.write(access.net_path("lo", "mtu"), "not-a-number", ns)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        access.read(access.net_path("nosuchdev0", "mtu"), ns)
    assert e.value.errno == errno.ENOENT
    with pytest.raises(OSError) as e:
        access.read("/proc/version", "kbp-no-such-netns")
    assert e.value.errno == errno.EIO


def test_settings_changed_through_handlers_in_memory_are_put_back(ns: str) -> None:
    """The bench's testbed settings: RPS masks (sysfs) and GRO changed through kbpctl's
    handlers on an in-memory journal, put back newest first by Executor.restore(); once the
    device and then the namespace are gone, the undo is a note, not a failure."""
    from kbp.bench import steer
    from kbp.system.journal import KIND_GRO, Executor

    access.cmd(["ip", "link", "add", "kbpsa0", "type", "veth", "peer", "name", "kbpsa1"], ns=ns)
    access.cmd(["ip", "link", "set", "kbpsa0", "up"], ns=ns)
    access.cmd(["ethtool", "-K", "kbpsa0", "gro", "on"], ns=ns)
    before = (steer.read_rps(ns, "kbpsa0"), steer.gro_on(ns, "kbpsa0"))
    ex = steer.changes()
    ex.apply(KIND_GRO, {"netns": ns, "dev": "kbpsa0"}, False)
    steer.steer_rps(ex, ns, "kbpsa0", 0)
    assert steer.gro_on(ns, "kbpsa0") is False
    assert all(int(m.replace(",", ""), 16) == 1 for m in steer.read_rps(ns, "kbpsa0").values())
    assert [c.kind for c in ex.changes] == [KIND_GRO] + ["sysfs"] * len(before[0])
    assert ex.restore() == []
    assert (steer.read_rps(ns, "kbpsa0"), steer.gro_on(ns, "kbpsa0")) == before
    assert ex.changes == []
    # gone targets: a device deleted, then its whole namespace
    again: Executor = steer.changes()
    steer.steer_rps(again, ns, "kbpsa0", 0)
    again.apply(KIND_GRO, {"netns": ns, "dev": "kbpsa0"}, False)
    access.cmd(["ip", "link", "del", "kbpsa0"], ns=ns)
    notes = again.restore()
    assert notes and all("gone, nothing to restore" in n for n in notes), notes
    other = f"{ns}x"
    access.cmd(["ip", "netns", "add", other])
    try:
        access.cmd(["ip", "link", "add", "kbpsa2", "type", "veth", "peer", "name", "kbpsa3"],
                   ns=other)
        last = steer.changes()
        steer.steer_rps(last, other, "kbpsa2", 0)
    finally:
        access.cmd(["ip", "netns", "del", other])
    notes = last.restore()
    assert notes and all("gone, nothing to restore" in n for n in notes), notes
