"""The host's half of guest_echo.py: the tap's address, and a sockperf client on request.

The guest asks through the rig's --out directory (``client.TAG.req``: target, port); the
client runs in the VM's netns, where both kbp-sod's host sockets and the tap live, and its
message counts go back as ``client.TAG.json``.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

from vm import outsource

TAP = "kbpsotap0"
HOST_IP, PREFIX = "10.78.0.1", 24
#: a short ping-pong: enough messages to tell per-message counts from noise
CLIENT_SECONDS, CLIENT_MPS = 2, 200
_TOTAL = re.compile(r"\[Total Run\].*SentMessages=(\d+); ReceivedMessages=(\d+)")


def configure_tap(ns: str) -> None:
    """The host's address on the tap, once QEMU has made it (the rig's helper)."""
    outsource.configure_tap(ns, TAP, f"{HOST_IP}/{PREFIX}")


def run_client(ns: str, target: str, port: int) -> dict[str, object]:
    p = subprocess.run(["ip", "netns", "exec", ns, "sockperf", "ping-pong", "-i", target,
                        "-p", str(port), "-t", str(CLIENT_SECONDS), "--mps",
                        str(CLIENT_MPS), "-m", "64"], capture_output=True, text=True,
                       timeout=120, check=False)
    m = _TOTAL.search(p.stdout + p.stderr)
    return {"rc": p.returncode, "sent": int(m.group(1)) if m else 0,
            "received": int(m.group(2)) if m else 0, "tail": (p.stdout + p.stderr)[-400:]}


class ClientServer:
    """Answers the guest's client requests until stopped; what it ran, in ``done``."""

    def __init__(self, out: Path, ns: str) -> None:
        self.out, self.ns = out, ns
        self.done: dict[str, dict[str, object]] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ClientServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for req in sorted(self.out.glob("client.*.req")):
                tag = req.name.split(".")[1]
                if tag in self.done:
                    continue
                try:
                    ask = json.loads(req.read_text())
                    res = run_client(self.ns, str(ask["target"]), int(ask["port"]))
                except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
                    self.errors.append(f"{tag}: {e!r}")
                    res = {"rc": -1, "sent": 0, "received": 0, "tail": repr(e)}
                self.done[tag] = res
                tmp = self.out / f"client.{tag}.json.tmp"
                tmp.write_text(json.dumps(res))
                tmp.rename(self.out / f"client.{tag}.json")
