"""kbp.genlctrl: the controller's policy attributes decode on Debian 12's pyroute2 (0.7.2),
which the kbpctl Debian package runs on, as on the venv's.

Run against this machine's kernel (a read-only generic netlink dump, no root, no netns):
kbp's own message class (the one used with pyroute2 0.7.2) must read the ``netdev``
family's napi-set policy exactly as the installed pyroute2 reads it, when that one decodes
policies itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kbp import genlctrl, netdev


@pytest.fixture
def client() -> Iterator[netdev.NetdevClient]:
    c = netdev.NetdevClient()
    if c.sock is None or not c.features().napi_set:
        pytest.skip("this kernel has no netdev napi-set (Linux 6.13+)")
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
