"""A narrow read of what polls a device: its threads and their counters (for the benchmark).

``status()`` describes every device, poller, CPU and the cpufreq state; a benchmark run only
needs the polling threads of one device (once, after enable) and their counters (before and
after each run).  These two calls read just that::

    threads = poller_threads("stock", "veth0", netns="ns1")      # {pid: comm}
    c0 = poller_counters("stock", threads, cpus=[1])             # names.POLLER_COUNTERS

* ``stock``: the device's threaded-NAPI kthreads (netdev napi-get's pid where the kernel
  reports it, else by name ``napi/<dev>-<id>``, none when another netns has a same-named
  device); counters from the scheduler: ``poll_ns``
  (run time) and ``sleeps`` (voluntary context switches), as ``kbpctl status`` shows them.
* ``kmod``: the module's pollers ``kbp/<cpu>`` (``kbpn/<cpu>`` in class non-rt) on the CPUs
  that poll the device (or ``cpu``); counters as the module reports them.

Read-only; nothing here changes the system.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from kbp import names, sysinfo

Counters = dict[str, int | None]


def poller_threads(backend: str, dev: str, netns: str | None = None,
                   cpu: int | None = None) -> dict[int, str]:
    """The threads polling ``dev`` now: {pid: comm} (empty when none do)."""
    if backend == names.BACKEND_KMOD:
        return _kmod_threads(dev, netns, cpu)
    return _stock_threads(dev, netns)


def poller_counters(backend: str, threads: Mapping[int, str], cpus: Sequence[int] = (),
                    ) -> dict[str, int]:
    """names.POLLER_COUNTERS summed over the pollers of ``cpus`` (kmod) or over
    ``threads`` (stock); counters nobody reports are left out."""
    sources: list[Counters] = []
    if backend == names.BACKEND_KMOD:
        from kbp import kmod
        with kmod.Client() as c:
            for p in c.pollers():
                if p.cpu in cpus:
                    sources.append(p.counters())
    else:
        for pid in threads:
            tc = sysinfo.task_counters(pid)
            sources.append({"poll_ns": tc.poll_ns, "sleeps": tc.sleeps})
    total: dict[str, int] = {}
    for src in sources:
        for k in names.POLLER_COUNTERS:
            v = src.get(k)
            if v is not None:
                total[k] = total.get(k, 0) + int(v)
    return total


def _kmod_threads(dev: str, netns: str | None, cpu: int | None) -> dict[int, str]:
    from kbp import kmod
    with kmod.Client() as c:
        d = c.device(dev, netns)
        cpus = {n.cpu for n in (d.napis if d else []) if n.cpu is not None}
        if d is not None and d.cpu is not None:
            cpus.add(d.cpu)
        if cpu is not None:
            cpus.add(cpu)
        # the device's own pollers: the module runs one per CPU and device
        return {p.pid: p.name for p in c.pollers() if p.cpu in cpus and p.pid and
                (p.ifindex is None or d is None or p.ifindex == d.ifindex)}


def _stock_threads(dev: str, netns: str | None) -> dict[int, str]:
    from kbp.netdev import NetdevClient, get_link, napi_threads_by_name
    pids: set[int] = set()
    with contextlib.suppress(Exception):       # napi-get is 6.9+; fall back to names
        link = get_link(dev, netns)
        if link is not None:
            with NetdevClient(netns) as nc:
                pids = {n.pid for n in nc.napis(link.ifindex) if n.pid}
    out: dict[int, str] = {}
    for pid in pids:
        st = sysinfo.read_stat(pid)
        if st is not None:
            out[pid] = st.comm
    if not out:  # by name, none when another netns's same-named device could match
        out = {t.pid: t.comm for t in napi_threads_by_name(dev, netns)[0]}
    return out
