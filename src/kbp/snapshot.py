"""Everything kbpctl may touch for a device, as one JSON-able dict.

``kbpctl snapshot DEV`` prints it; tests compare a snapshot taken before ``enable`` with
one taken after ``disable`` to prove that "off" restores the machine.

The settings are kbpctl's own change model read back: the device is found once
(:func:`device`: its NAPIs, receive queues, NAPI threads and queue IRQs), then every kind of
:func:`kbp.system.settings.system_effector` names its keys of that device and reads them
with the ``get()`` that ``enable`` journals and ``disable`` compares.  A kind added there is
in the snapshot with it (a kind with no keys of the device is left out).  Each setting is
labelled as journals and errors name it (:func:`kbp.system.journal.describe`); one that is
not there reads null.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kbp import sysinfo
from kbp.errors import InvalidInput
from kbp.netdev import NetdevClient, NetFS, clients, get_link, napi_threads_by_name
from kbp.sysinfo import HOST, Host
from kbp.system import journal
from kbp.system.journal import MISSING
from kbp.system.settings import Device, system_effector


def setting(snap: dict[str, Any], kind: str, key: dict[str, Any]) -> Any:
    """One setting of a snapshot, by its kind and change key (KeyError: not in it)."""
    return snap["settings"][kind][journal.describe(kind, key)]


def device(dev: str, netns: str | None, client: Callable[[str | None], NetdevClient],
           host: Host = HOST) -> Device:
    """What of ``dev`` the kinds can change, found once (InvalidInput: no such device)."""
    link = get_link(dev, netns)
    if link is None:
        raise InvalidInput(f"no device {dev} in {('netns ' + netns) if netns else 'this netns'}")
    fs = NetFS(netns)
    napis = tuple(client(netns).napis(link.ifindex))
    pids = {n.pid for n in napis if n.pid}
    if not napis:  # no napi-get: threads by name, none when another netns's could match
        pids |= {t.pid for t in napi_threads_by_name(dev, netns, host)[0]}
    tasks = tuple(t for p in sorted(pids) if (t := sysinfo.task_id(p, host)) is not None)
    irqs = {n.irq for n in napis if n.irq is not None}
    irqs |= {q.irq for q in sysinfo.device_irqs(dev, fs.msi_irqs(dev) or None, host)}
    return Device(netns, dev, link.ifindex, napis, tuple(fs.rx_queues(dev, [])), tasks,
                  tuple(sorted(irqs)))


def snapshot(dev: str, netns: str | None = None, host: Host = HOST) -> dict[str, Any]:
    with clients() as client:
        d = device(dev, netns, client, host)
        settings: dict[str, dict[str, Any]] = {}
        for kind, h in system_effector(client, NetFS, host).items():
            keys = h.keys(d)
            if not keys:
                continue
            many = getattr(h, "get_many", None)
            values = many(keys) if many is not None else [h.get(k) for k in keys]
            settings[kind] = {journal.describe(kind, k): None if v is MISSING else v
                              for k, v in zip(keys, values, strict=True)}
    return {"dev": dev, "netns": netns, "ifindex": d.ifindex,
            "napis": [n.id for n in d.napis], "settings": settings}
