"""``kbpctl snapshot`` is kbpctl's own handlers read back: every kind's keys of a device with
their ``get()`` values, so a setting changed through any kind shows, a kind added to the
system's handlers is in it, and undoing the change gives the snapshot taken before."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kbp import snapshot as snap_mod
from kbp.netdev import NetFS, clients
from kbp.snapshot import snapshot
from kbp.system import access, journal, settings

pytestmark = [pytest.mark.root, pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (netns)")]

DEV = "kbpsn0"


@pytest.fixture
def ns() -> Iterator[str]:
    """A namespace with a veth pair whose DEV end has a NAPI polled by a thread (GRO on,
    threaded)."""
    name = f"kbpsn-{uuid.uuid4().hex[:6]}"
    with access.Journal() as j:
        access.cmd(["ip", "netns", "add", name])
        j.defer(access.cmd, ["ip", "netns", "del", name], check=False)
        access.cmd(["ip", "link", "add", DEV, "type", "veth", "peer", "name", "kbpsn1"],
                   ns=name)
        for d in (DEV, "kbpsn1"):
            access.cmd(["ip", "link", "set", d, "up"], ns=name)
            access.cmd(["ethtool", "-K", d, "gro", "on"], ns=name)
        access.write(access.net_path(DEV, "threaded"), "1\n", name)
        yield name


def test_every_kind_of_a_device_is_read_through_its_handler(ns: str) -> None:
    s = snapshot(DEV, ns)
    kinds = s["settings"]
    assert s["napis"], "veth with GRO on has a NAPI"
    (nid,) = s["napis"]
    assert kinds["sysfs"][f"{DEV}/threaded (netns {ns})"] == "1"
    assert f"{DEV}/queues/rx-0/rps_cpus (netns {ns})" in kinds["sysfs"]
    assert kinds["gro"] == {f"GRO of {DEV} (netns {ns})": True}
    if f"threaded of NAPI {nid} (netns {ns})" in kinds["napi"]:   # napi-get reports it: 6.18
        assert kinds["napi"][f"threaded of NAPI {nid} (netns {ns})"] == 1
    (label,) = kinds["sched"]
    assert label.startswith(f"scheduling of napi/{DEV}-{nid} (pid ")
    assert kinds["sched"][label]["policy"] == "SCHED_OTHER"
    (aff,) = kinds["affinity"].values()
    assert aff == sorted(os.sched_getaffinity(0))
    assert "file" not in kinds                      # no key of a device: left out


def test_a_change_through_any_kind_shows_and_its_undo_gives_the_snapshot_back(ns: str) -> None:
    """A NAPI thread's scheduling and a sysfs attribute changed through the handlers show in
    the snapshot; undone, the snapshot is the one taken before.  (Not GRO here: turning it
    off on veth deletes the NAPI, and on again makes a new one, which the snapshot shows.)"""
    before = snapshot(DEV, ns)
    with clients() as client:
        d = snap_mod.device(DEV, ns, client)
        (task,) = d.tasks
        ex = journal.Executor(None, settings.system_effector(client, NetFS))
        ex.apply("sched", settings.task_key(task), {"policy": "SCHED_FIFO", "priority": 7,
                                                    "nice": 0})
        ex.apply(journal.KIND_SYSFS, settings.sysfs_key(ns, DEV, d.ifindex, "gro_flush_timeout"),
                 "20000")
        changed = snapshot(DEV, ns)["settings"]
        assert changed["sched"][f"scheduling of {task.comm} (pid {task.pid})"][
            "policy"] == "SCHED_FIFO"
        assert changed["sysfs"][f"{DEV}/gro_flush_timeout (netns {ns})"] == "20000"
        assert ex.restore() == []
    assert snapshot(DEV, ns) == before


def test_a_kind_added_to_the_systems_handlers_is_in_the_snapshot(
        ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    class Mtu:
        """A new kind: the device's MTU (keys and get are all it needs)."""

        def keys(self, d: settings.Device) -> list[dict[str, Any]]:
            return [{"netns": d.netns, "dev": d.dev}]

        def get(self, key: dict[str, Any]) -> Any:
            return int(access.read(access.net_path(key["dev"], "mtu"), key["netns"]))

        def set(self, key: dict[str, Any], value: Any) -> None:
            raise AssertionError("the snapshot only reads")

    real = settings.system_effector
    monkeypatch.setattr(snap_mod, "system_effector",
                        lambda *a, **k: {**real(*a, **k), "mtu": Mtu()})
    assert snapshot(DEV, ns)["settings"]["mtu"] == {f"mtu {{'netns': '{ns}', 'dev': '{DEV}'}}":
                                                    1500}
