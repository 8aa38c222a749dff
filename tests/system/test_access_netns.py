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
