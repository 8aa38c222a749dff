"""kbpctl on Debian 12's pyroute2 (0.7.2), which the kbpctl Debian package runs on: the
controller's policy attributes (kbp.genlctrl) and sockets in a named netns (netdev.in_netns).

Run against this machine's kernel (a read-only generic netlink dump, no root, no netns):
kbp's own message class (the one used with pyroute2 0.7.2) must read the ``netdev``
family's napi-set policy exactly as the installed pyroute2 reads it, when that one decodes
policies itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from kbp import genlctrl, netdev


@pytest.fixture
def client() -> Iterator[netdev.NetdevClient]:
    c = netdev.NetdevClient()
    if c.sock is None or not c.features().napi_set:
        pytest.skip(reason="this kernel has no netdev napi-set (Linux 6.13+)")
    yield c


def test_getpolicy_value_is_the_kernels() -> None:
    assert genlctrl.CTRL_CMD_GETPOLICY == 10


def test_kbp_ctrlmsg_reads_the_napi_set_policy(client: netdev.NetdevClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netdev, "ctrlmsg", genlctrl._ctrlmsg)
    ours = client._op_policy(netdev.NETDEV_CMD_NAPI_SET)
    assert netdev.NETDEV_A_NAPI_ID in ours
    assert ours[netdev.NETDEV_A_NAPI_DEFER_HARD_IRQS] == 2**31 - 1
    if genlctrl._decodes_policies():
        monkeypatch.setattr(netdev, "ctrlmsg", genlctrl._nl.ctrlmsg)
        assert client._op_policy(netdev.NETDEV_CMD_NAPI_SET) == ours


class _OldIPRoute:
    """IPRoute as Debian 12's pyroute2 0.7.2 has it: no ``netns=`` keyword."""

    def __new__(cls, **kw: object) -> object:
        if "netns" in kw:
            raise TypeError("NetlinkSocketBase.__init__() got an unexpected keyword "
                            "argument 'netns'")
        from pyroute2.iproute import IPRoute
        return IPRoute(**kw)


@pytest.mark.root
@pytest.mark.netns
def test_in_netns_without_the_netns_keyword() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip(reason="needs root and ip(8)")
    ns = f"kbp-compat-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "kbpc0", "type", "veth", "peer", "name",
                        "kbpc1"], check=True)
        home = os.stat("/proc/thread-self/ns/net").st_ino
        with netdev.in_netns(_OldIPRoute, ns) as ipr:
            names = {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        assert names == {"lo", "kbpc0", "kbpc1"}
        assert os.stat("/proc/thread-self/ns/net").st_ino == home
        with pytest.raises(FileNotFoundError):
            netdev.in_netns(_OldIPRoute, f"{ns}-missing")
        assert not os.path.exists(f"/run/netns/{ns}-missing")
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
