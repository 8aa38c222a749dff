"""Everything kbpctl may touch for a device, as one JSON-able dict.

``kbpctl snapshot DEV`` prints it; tests compare a snapshot taken before ``enable`` with
one taken after ``disable`` to prove that "off" restores the machine.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kbp import sysinfo
from kbp.errors import InvalidInput
from kbp.netdev import NetdevClient, NetFS, get_link
from kbp.rps import RPS_CPUS, RPS_FLOW_CNT
from kbp.sysinfo import HOST, Host

SYSFS_ATTRS = ["threaded", "napi_defer_hard_irqs", "gro_flush_timeout"]
RPS_ATTRS = [RPS_CPUS, RPS_FLOW_CNT]  # per receive queue: queues/rx-N/<attr>


def _task(pid: int, host: Host) -> dict[str, Any] | None:
    st = sysinfo.read_stat(pid, host)
    if st is None:
        return None
    try:
        s = sysinfo.get_sched(pid)
    except ProcessLookupError:
        return None
    return {"pid": pid, "comm": st.comm, "policy": s.policy, "priority": s.priority,
            "nice": s.nice, "cpus": s.cpus}


def snapshot(dev: str, netns: str | None = None, host: Host = HOST) -> dict[str, Any]:
    link = get_link(dev, netns)
    if link is None:
        raise InvalidInput(f"no device {dev} in {('netns ' + netns) if netns else 'this netns'}")
    fs = NetFS(netns)
    out: dict[str, Any] = {"dev": dev, "netns": netns, "ifindex": link.ifindex,
                           "sysfs": fs.read_many(dev, SYSFS_ATTRS),
                           "rps": fs.rx_queues(dev, RPS_ATTRS), "napis": [],
                           "threads": {}, "irqs": {}}
    pids: set[int] = set()
    irqs: set[int] = set()
    with NetdevClient(netns) as c:
        napis = c.napis(link.ifindex)
    for n in napis:
        out["napis"].append({"id": n.id, "threaded": n.threaded,
                             "defer_hard_irqs": n.defer_hard_irqs,
                             "gro_flush_timeout": n.gro_flush_timeout, "irq": n.irq,
                             "pid": n.pid})
        if n.pid:
            pids.add(n.pid)
        if n.irq is not None:
            irqs.add(n.irq)
    if not napis:  # no napi-get: threads by name (may include same-named devices elsewhere)
        pids |= {t.pid for t in sysinfo.find_napi_threads(dev, host)}
    for pid in sorted(pids):
        t = _task(pid, host)
        if t is not None:
            out["threads"][str(pid)] = t
    msi = fs.msi_irqs(dev)
    irqs |= {q.irq for q in sysinfo.device_irqs(dev, msi or None, host)}
    for irq in sorted(irqs):
        with contextlib.suppress(OSError):
            out["irqs"][str(irq)] = sysinfo.read_irq_affinity(irq, host)
    return out
