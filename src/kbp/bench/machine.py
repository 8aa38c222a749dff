"""What the benchmark ran on, and how busy the machine was (for the record)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from kbp import sysinfo
from kbp.bench.sysstat import power_meter


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_model() -> str:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def is_qemu_guest() -> bool:
    vendor = (_read("/sys/class/dmi/id/sys_vendor") or "") + " " + cpu_model()
    return "QEMU" in vendor


def loadavg() -> tuple[float, float, float]:
    a, b, c = (_read("/proc/loadavg") or "0 0 0").split()[:3]
    return float(a), float(b), float(c)


def qemu_running() -> list[str]:
    proc = subprocess.run(["pgrep", "-f", "qemu-system"], capture_output=True, text=True)
    return proc.stdout.split()


def quiet_report() -> dict[str, Any]:
    la = loadavg()
    q = qemu_running()
    return {"loadavg": list(la), "qemu_processes": len(q),
            "quiet": la[0] < 0.5 and not q}


def describe() -> dict[str, Any]:
    mem_kb = 0
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    flags = _read("/proc/cpuinfo") or ""
    return {
        "hostname": platform.node(),
        "kernel": sysinfo.kernel_release(),
        "kernel_version": platform.version(),
        "cpu_model": cpu_model(),
        "cpus_online": sysinfo.format_cpulist(sysinfo.online_cpus()),
        "ncpu": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1),
        "virtualized": " hypervisor" in flags,
        "qemu_guest": is_qemu_guest(),
        "cpuidle": {"driver": _read("/sys/devices/system/cpu/cpuidle/current_driver"),
                    "governor": _read("/sys/devices/system/cpu/cpuidle/current_governor")},
        "cpufreq": "yes" if Path("/sys/devices/system/cpu/cpu0/cpufreq").exists() else
                   "no cpufreq (frequency not controllable here)",
        "power_meter": power_meter(),
        "python": platform.python_version(),
    }


def tool_versions() -> dict[str, str]:
    out = {}
    for tool, argv in (("sockperf", ["sockperf", "--version"]),
                       ("iperf3", ["iperf3", "--version"]),
                       ("bpftrace", ["bpftrace", "--version"])):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            out[tool] = ((p.stdout or p.stderr).strip().splitlines() or ["?"])[0]
        except (OSError, subprocess.TimeoutExpired):
            out[tool] = "missing"
    return out
