"""Device counters from iproute2's JSON (``ip -j -s link``), inside a network namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kbp.netdev import proc_net_dev_rows
from kbp.system import access


def link_stats(ns: str | None, dev: str) -> dict[str, Any]:
    """``stats64`` of a device: {"rx": {"packets", "bytes", "dropped", ...}, "tx": {...}};
    {} when the device is gone or ip prints nothing usable."""
    p = access.cmd(["ip", "-j", "-s", "link", "show", "dev", dev], ns=ns, check=False)
    return parse_link_stats(p.stdout)


def parse_link_stats(text: str) -> dict[str, Any]:
    try:
        rows = json.loads(text or "[]")
    except json.JSONDecodeError:
        return {}
    if not rows or not isinstance(rows, list):
        return {}
    st = rows[0].get("stats64") or rows[0].get("stats") or {}
    return st if isinstance(st, dict) else {}


def rx_packets(ns: str | None, dev: str) -> int:
    """Packets the device received (0 when it cannot be read)."""
    return int((link_stats(ns, dev).get("rx") or {}).get("packets") or 0)


def proc_net_dev(pid: int, dev: str, proc: Path = Path("/proc")) -> dict[str, int] | None:
    """A device's receive counters as a process in its namespace sees them
    (``/proc/PID/net/dev``: no child process, so a measurement window can be read tightly):
    {"packets", "bytes", "dropped"}; None when the process or the device is gone."""
    try:
        text = (proc / str(pid) / "net" / "dev").read_text()
    except OSError:
        return None
    return parse_proc_net_dev(text, dev)


def parse_proc_net_dev(text: str, dev: str) -> dict[str, int] | None:
    f = proc_net_dev_rows(text).get(dev)
    if f is None or len(f) < 4:
        return None
    return {"bytes": int(f[0]), "packets": int(f[1]), "dropped": int(f[3])}
