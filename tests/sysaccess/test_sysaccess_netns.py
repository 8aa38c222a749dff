"""kbp.sysaccess in another network namespace: what is read and written is that
namespace's, and a failure keeps the kernel's errno across ``ip netns exec``."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator

import pytest

from kbp import sysaccess

pytestmark = [pytest.mark.root, pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (netns)")]


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"kbpsa-{uuid.uuid4().hex[:6]}"
    with sysaccess.Journal() as j:
        sysaccess.cmd(["ip", "netns", "add", name])
        j.defer(sysaccess.cmd, ["ip", "netns", "del", name], check=False)
        yield name


def test_netns_write_is_that_namespaces(ns: str) -> None:
    mtu = sysaccess.net_path("lo", "mtu")
    here = sysaccess.read(mtu)
    sysaccess.write(mtu, "1280", ns)
    assert sysaccess.read(mtu, ns) == "1280"
    assert sysaccess.read(mtu) == here
    assert sysaccess.exists(sysaccess.net_path("lo"), ns)
    assert "lo" in sysaccess.listdir("/sys/class/net", ns)
    assert sysaccess.cmd(["cat", mtu], ns=ns).stdout.strip() == "1280"


def test_netns_failure_keeps_errno(ns: str) -> None:
    with pytest.raises(OSError) as e:
        sysaccess.write(sysaccess.net_path("lo", "mtu"), "not-a-number", ns)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        sysaccess.read(sysaccess.net_path("nosuchdev0", "mtu"), ns)
    assert e.value.errno == errno.ENOENT
    with pytest.raises(OSError) as e:
        sysaccess.read("/proc/version", "kbp-no-such-netns")
    assert e.value.errno == errno.EIO
