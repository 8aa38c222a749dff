"""The traffic of the benchmark: the RT application, the competing flood, EE-KBP's Table 2.

* RT application: an unmodified ``sockperf server`` (UDP echo of sockperf's ping-pong
  messages), pinned to the app's CPU (the RT CPU by default), default scheduling policy.
  The mode irq-suspend runs ``kbp-echo`` in its place (src/kbp/data/kbp_echo.c: an epoll
  UDP echo server that asks for IRQ suspension, which sockperf cannot): same address, port
  and placement; both are an :class:`RtApp`, so the runner starts, places and stops either.
* Competing load ("heavy receiver", rt-socket-outsourcing Sect. IV-A): an ``iperf3`` UDP flood
  at full speed through a second veth pair, the client on the flood sender's CPU, the server
  on the heavy receiver's.  Its receive NAPI runs in NET_RX softirq on the flood sender's CPU
  (veth polls on the transmitting CPU).
* TCP heavy sender (``rtt-tcp``): the same with an iperf3 TCP stream at full speed
  (``Flood(proto="tcp")``): fewer, larger segments, GRO and ACKs back to the sender.
* Bulk streams (scenario ``stream``, NetAP's workload): :class:`Stream`, one iperf3 TCP or
  UDP stream at full speed from the tester's CPU to a receiver over the RT device, for a
  fixed time with a warm-up iperf3 leaves out of its figures (``-O``).
* EE-KBP Table 2: six constant-interval traffic conditions (80 Mbit/s and 1 Gbit/s, frames
  of 1518 / 512 / 64 bytes), scaled by one factor to what this machine can carry.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kbp import names, sysinfo
from kbp.bench import netstats
from kbp.bench.modes import AppPlace
from kbp.system import access

SOCKPERF_PORT = 11111           # the RT application's port (sockperf's default; kbp-echo's too)
IPERF_PORT = 5201
IPERF_TCP_PORT = 5202           # the TCP heavy sender's server (its own, next to the flood's)
IPERF_STREAM_PORT = 5203        # the stream scenario's receiver (bulk TCP and UDP streams)


class MissingTool(RuntimeError):
    pass


APT_PACKAGES = {"sockperf": "sockperf", "iperf3": "iperf3", "bpftrace": "bpftrace",
                "ethtool": "ethtool", "ip": "iproute2", "taskset": "util-linux",
                "gcc": "gcc"}


def missing_tools(tools: list[str]) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]


def require_tools(tools: list[str]) -> None:
    miss = missing_tools(tools)
    if miss:
        pkgs = " ".join(sorted({APT_PACKAGES.get(t, t) for t in miss}))
        raise MissingTool(f"missing {', '.join(miss)}: install with "
                          f"'apt-get install {pkgs}' (or run 'python -m kbp.bench setup')")


def _udp_port_bound(ns: str, port: int) -> bool:
    out = access.cmd(["cat", "/proc/net/udp"], ns=ns, check=False).stdout
    want = f":{port:04X}"
    return any(line.split()[1].endswith(want) for line in out.splitlines()[1:]
               if len(line.split()) > 1)


@dataclass
class RtApp:
    """The RT application: a UDP echo server on the RT pair's server address, started pinned
    to ``cpu``, then placed (CPU, SCHED_FIFO priority) from outside, as chrt and taskset
    would: the application's code does not change.  Subclasses give the command and how to
    tell it is ready."""

    name: ClassVar[str] = ""
    reads_stdout: ClassVar[bool] = False    # False: stdout to /dev/null (nobody reads it)
    ns: str
    ip: str
    cpu: int
    port: int = SOCKPERF_PORT
    proc: subprocess.Popen[str] | None = None
    cpu_now: int = -1
    fifo_now: int = 0

    def argv(self) -> list[str]:
        raise NotImplementedError

    def wait_ready(self, deadline: float) -> None:
        raise NotImplementedError

    def start(self, timeout: float = 10.0) -> None:
        self.cpu_now = self.cpu
        self.fifo_now = 0
        self.proc = access.popen(["taskset", "-c", str(self.cpu), *self.argv()], ns=self.ns,
                                    session=True, stdout=subprocess.PIPE if self.reads_stdout
                                    else subprocess.DEVNULL)
        try:
            self.wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise

    def _exited(self) -> None:
        """Raise why the server is gone (it was, when this is called)."""
        assert self.proc is not None
        _, err = access.stop(self.proc)
        self.proc = None
        raise RuntimeError(f"{self.name} server exited: {err.strip()[-300:]}")

    def pids(self) -> list[int]:
        """The server's threads (the process after taskset/ip-netns exec'd into it)."""
        if self.proc is None:
            return []
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{self.proc.pid}/task"))
        except OSError:
            return [self.proc.pid]

    def move(self, cpu: int) -> None:
        """Re-pin every thread of the running server to ``cpu``."""
        for tid in self.pids():
            with contextlib.suppress(OSError):
                sysinfo.set_affinity(tid, [cpu])
        self.cpu_now = cpu

    def set_fifo(self, prio: int) -> None:
        """SCHED_FIFO ``prio`` for every thread of the running server (0: back to
        SCHED_OTHER).  The application's code is unchanged, as with chrt."""
        for tid in self.pids():
            with contextlib.suppress(OSError):
                sysinfo.set_policy(tid, "SCHED_FIFO" if prio > 0 else "SCHED_OTHER", prio)
        self.fifo_now = prio

    def place(self, where: AppPlace) -> None:
        """Run on ``where.cpu`` at ``where.fifo`` (0: default policy), changing only what
        differs from now."""
        if self.cpu_now != where.cpu:
            self.move(where.cpu)
        if self.fifo_now != where.fifo:
            self.set_fifo(where.fifo)

    def stop(self) -> str:
        """Stop the server (SIGTERM); what it printed on stdout ("" when it was not running)."""
        if self.proc is None:
            return ""
        out, _err = access.stop(self.proc)
        self.proc = None
        return out


@dataclass
class SockperfServer(RtApp):
    """``sockperf server``: the RT application of every mode but irq-suspend."""

    name: ClassVar[str] = names.APP_SOCKPERF

    def argv(self) -> list[str]:
        return ["sockperf", "server", "-i", self.ip, "-p", str(self.port)]

    def wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._exited()
            if _udp_port_bound(self.ns, self.port):
                return
            time.sleep(0.05)
        raise RuntimeError("sockperf server did not bind its port")


# IRQ suspension's epoll parameters, as the kernel's example sets them
# (tools/testing/selftests/net/busy_poll_test.sh): no busy-poll time of its own (epoll_wait
# polls the NAPI once before it sleeps), a budget of 16, prefer_busy_poll on (what arms
# irq-suspend-timeout), 8 events per epoll_wait.
ECHO_BUSY_POLL_USECS = 0
ECHO_BUSY_POLL_BUDGET = 16
ECHO_PREFER_BUSY_POLL = 1
ECHO_MAX_EVENTS = 8


@dataclass
class EchoServer(RtApp):
    """``kbp-echo`` (src/kbp/data/kbp_echo.c): epoll UDP echo that sets ``EPIOCSPARAMS``
    on its epoll context; the RT application of irq-suspend."""

    name: ClassVar[str] = names.APP_KBP_ECHO
    reads_stdout: ClassVar[bool] = True     # "ready", and a JSON summary when it stops
    busy_poll_usecs: int = ECHO_BUSY_POLL_USECS
    busy_poll_budget: int = ECHO_BUSY_POLL_BUDGET
    prefer_busy_poll: int = ECHO_PREFER_BUSY_POLL
    max_events: int = ECHO_MAX_EVENTS
    summary: dict[str, Any] = field(default_factory=dict)   # what it said when it stopped

    def argv(self) -> list[str]:
        from kbp.bench import tester
        return [str(tester.build(tester.ECHO_SOURCE)), "--ip", self.ip,
                "--port", str(self.port), "--busy-poll-usecs", str(self.busy_poll_usecs),
                "--busy-poll-budget", str(self.busy_poll_budget),
                "--prefer-busy-poll", str(self.prefer_busy_poll),
                "--max-events", str(self.max_events)]

    def wait_ready(self, deadline: float) -> None:
        """Until it prints "ready" (bound, epoll parameters set), read unbuffered so
        nothing it prints later is lost to ``stop``."""
        assert self.proc is not None and self.proc.stdout is not None
        fd, got = self.proc.stdout.fileno(), b""
        while b"\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("kbp-echo did not say it was ready")
            if select.select([fd], [], [], min(left, 0.1))[0]:
                chunk = os.read(fd, 64)
                if not chunk:
                    self.proc.wait()
                    self._exited()
                got += chunk
            elif self.proc.poll() is not None:
                self._exited()
        if got.split(b"\n", 1)[0] != b"ready":
            raise RuntimeError(f"kbp-echo said {got!r} instead of ready")

    def stop(self) -> str:
        out = super().stop()
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    self.summary = dict(json.loads(line))
                break
        return out


RT_APPS: dict[str, type[RtApp]] = {SockperfServer.name: SockperfServer,
                                   EchoServer.name: EchoServer}


def rt_app(name: str, ns: str, ip: str, cpu: int, port: int = SOCKPERF_PORT) -> RtApp:
    """The RT application ``name`` (names.RT_APPS), not started."""
    try:
        return RT_APPS[name](ns, ip, cpu, port)
    except KeyError:
        raise ValueError(f"unknown RT application {name!r}: {', '.join(RT_APPS)}") from None


def start_iperf3_server(ns: str, cpu: int, ip: str, port: int,
                        what: str) -> subprocess.Popen[str]:
    """``iperf3 -s`` on ``ip``:``port`` in ``ns``, pinned to ``cpu``; returns once it listens
    (RuntimeError naming ``what`` when it exits or does not listen within 10 s)."""
    server = access.popen(["taskset", "-c", str(cpu), "iperf3", "-s", "-B", ip,
                              "-p", str(port)], ns=ns, session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = access.cmd(["cat", "/proc/net/tcp"], ns=ns, check=False).stdout
        if f":{port:04X}" in out:
            return server
        if server.poll() is not None:
            break
        time.sleep(0.05)
    access.stop(server)
    raise RuntimeError(f"{what} did not listen")


@dataclass
class Flood:
    """iperf3 flood from the client namespace to a heavy receiver in the server one: UDP
    (``proto`` "udp", the default) or a TCP heavy sender (``proto`` "tcp")."""

    client_ns: str
    server_ns: str
    server_ip: str
    server_dev: str
    sender_cpu: int             # the iperf3 client (flood sender role)
    receiver_cpu: int           # the iperf3 server (heavy receiver role)
    length: int = 64            # UDP payload bytes: small datagrams = most softirq work
    bitrate: str = "0"          # iperf3 -b: 0 = as fast as it can
    proto: str = "udp"          # "udp" or "tcp" (length: TCP write size; 0 = iperf3's own)
    port: int = IPERF_PORT
    server: subprocess.Popen[str] | None = None
    client: subprocess.Popen[str] | None = None
    _rx0: int = 0
    _t0: float = 0.0

    def start_server(self) -> None:
        self.server = start_iperf3_server(self.server_ns, self.receiver_cpu, self.server_ip,
                                          self.port, "iperf3 server")

    def rx_packets(self) -> int:
        return netstats.rx_packets(self.server_ns, self.server_dev)

    def client_argv(self) -> list[str]:
        argv = ["taskset", "-c", str(self.sender_cpu), "iperf3", "-c", self.server_ip,
                "-p", str(self.port), "-t", "86400", "-J"]
        if self.proto == "udp":
            return [*argv, "-u", "-b", self.bitrate, "-l", str(self.length)]
        if self.proto != "tcp":
            raise ValueError(f"unknown flood protocol {self.proto!r}: udp or tcp")
        extra = ["-b", self.bitrate] if self.bitrate != "0" else []
        return [*argv, *extra, *(["-l", str(self.length)] if self.length else [])]

    def start(self, warm: float = 1.0) -> None:
        self.client = access.popen(self.client_argv(), ns=self.client_ns, session=True)
        time.sleep(warm)
        if self.client.poll() is not None:
            out, err = access.stop(self.client)
            self.client = None
            raise RuntimeError(f"iperf3 flood exited: {(out + err).strip()[-400:]}")
        self._rx0, self._t0 = self.rx_packets(), time.monotonic()

    def stop(self) -> dict[str, Any]:
        if self.client is None:
            return {}
        rx1, t1 = self.rx_packets(), time.monotonic()
        out, _err = access.stop(self.client, signal.SIGINT, timeout=10)
        self.client = None
        res: dict[str, Any] = {"rx_pps": (rx1 - self._rx0) / max(t1 - self._t0, 1e-9),
                               "proto": self.proto, "payload_bytes": self.length,
                               "bitrate": self.bitrate}
        res.update(iperf_summary(out, self.proto))
        return res

    def stop_server(self) -> None:
        if self.server is not None:
            access.stop(self.server)
            self.server = None


def iperf_summary(out: str, proto: str) -> dict[str, Any]:
    """What an iperf3 -J client reported at its end (empty when it did not)."""
    try:
        end = json.loads(out).get("end", {})
    except (json.JSONDecodeError, AttributeError):
        return {}
    if not isinstance(end, dict):
        return {}
    if proto == "tcp":
        got = end.get("sum_received") or {}
        sent = end.get("sum_sent") or {}
        res = {k: got.get(k) for k in ("bytes", "bits_per_second") if k in got}
        if "retransmits" in sent:
            res["retransmits"] = sent["retransmits"]
        return res
    s = end.get("sum") or {}
    return {k: s.get(k) for k in ("packets", "lost_packets", "lost_percent",
                                  "bits_per_second") if k in s}


@dataclass
class Stream:
    """One iperf3 bulk stream at full speed (NetAP's workload): TCP, or UDP with ``length``
    payload bytes (``-b 0``), from the client namespace on ``sender_cpu`` to an iperf3
    server on ``receiver_cpu``; ``start`` runs it for ``omit`` + ``seconds`` (iperf3 leaves
    the first ``omit`` seconds out of its figures), ``finish`` waits for its JSON."""

    client_ns: str
    server_ns: str
    server_ip: str
    sender_cpu: int
    receiver_cpu: int
    proto: str = "tcp"          # "tcp" or "udp"
    length: int = 0             # UDP payload / TCP write size (0: iperf3's own)
    port: int = IPERF_STREAM_PORT
    server: subprocess.Popen[str] | None = None
    client: subprocess.Popen[str] | None = None

    def start_server(self) -> None:
        if self.server is None:
            self.server = start_iperf3_server(self.server_ns, self.receiver_cpu,
                                              self.server_ip, self.port,
                                              "iperf3 stream receiver")

    def server_pids(self) -> list[int]:
        """The receiver's threads (iperf3 -s after ip-netns/taskset exec'd into it)."""
        if self.server is None:
            return []
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{self.server.pid}/task"))
        except OSError:
            return []

    def client_argv(self, seconds: int, omit: int) -> list[str]:
        if self.proto not in ("tcp", "udp"):
            raise ValueError(f"unknown stream protocol {self.proto!r}: tcp or udp")
        argv = ["taskset", "-c", str(self.sender_cpu), "iperf3", "-c", self.server_ip,
                "-p", str(self.port), "-t", str(seconds), "-O", str(omit), "-J"]
        if self.proto == "udp":
            argv += ["-u", "-b", "0"]
        return [*argv, *(["-l", str(self.length)] if self.length else [])]

    def start(self, seconds: int, omit: int, tries: int = 6) -> None:
        """Start the stream (again, a second later, while the server still finishes the
        previous test: iperf3 serves one at a time)."""
        for i in range(tries):
            self.client = access.popen(self.client_argv(seconds, omit), ns=self.client_ns,
                                          session=True)
            time.sleep(0.3)
            if self.client.poll() is None:
                return
            out, err = access.stop(self.client)
            self.client = None
            if "busy" not in out + err or i == tries - 1:
                raise RuntimeError(f"iperf3 {self.proto} stream exited: "
                                   f"{(out + err).strip()[-400:]}")
            time.sleep(1.0)

    def finish(self, timeout: float = 15.0) -> dict[str, Any]:
        """Wait for the stream's end; what iperf3 reported (``error`` when it did not)."""
        if self.client is None:
            return {}
        try:
            out, err = self.client.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = access.stop(self.client, signal.SIGINT, timeout=10)
        except BaseException:           # Ctrl-C: never leave it behind
            access.stop(self.client, signal.SIGINT, timeout=2.0)
            self.client = None
            raise
        self.client = None
        res = stream_summary(out, self.proto)
        if not res:
            res = {"error": (err or out).strip()[-400:] or "iperf3 printed no result"}
        return res

    def stop(self) -> None:
        if self.client is not None:
            access.stop(self.client, signal.SIGINT, timeout=10)
            self.client = None

    def stop_server(self) -> None:
        if self.server is not None:
            access.stop(self.server)
            self.server = None


def stream_summary(out: str, proto: str) -> dict[str, Any]:
    """An iperf3 -J stream's figures at the receiver: bytes, goodput (bits/s) and, for UDP,
    the datagrams sent, lost and their share; TCP's retransmits (empty: no result)."""
    try:
        js = json.loads(out)
    except (json.JSONDecodeError, TypeError):
        return {}
    end = js.get("end") if isinstance(js, dict) else None
    if not isinstance(end, dict) or not end:
        return {"error": str(js.get("error"))} if isinstance(js, dict) and js.get("error") \
            else {}
    got = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    whole = end.get("sum") or {}
    res: dict[str, Any] = {"proto": proto}
    if proto == "tcp":
        res["bytes"] = got.get("bytes")
        res["bits_per_second"] = got.get("bits_per_second")
        res["seconds"] = got.get("seconds")
        res["retransmits"] = sent.get("retransmits")
        res["sent_bits_per_second"] = sent.get("bits_per_second")
        return res
    src = got or whole
    res["sent_bytes"] = (sent or whole).get("bytes")
    res["packets"] = whole.get("packets", src.get("packets"))
    res["lost_packets"] = whole.get("lost_packets", src.get("lost_packets"))
    res["lost_percent"] = whole.get("lost_percent", src.get("lost_percent"))
    res["seconds"] = src.get("seconds")
    res["sent_bits_per_second"] = (sent or whole).get("bits_per_second")
    if got:
        res["bytes"] = got.get("bytes")
        res["bits_per_second"] = got.get("bits_per_second")
    else:        # older iperf3: the sender's rate less the receiver's loss
        bps, lost = whole.get("bits_per_second"), whole.get("lost_percent")
        res["bits_per_second"] = None if bps is None else \
            bps * (1 - (lost or 0) / 100)
    return res


# -- EE-KBP Table 2 --------------------------------------------------------------------------
TABLE2: tuple[tuple[float, int], ...] = (
    (80e6, 1518), (80e6, 512), (80e6, 64), (1e9, 1518), (1e9, 512), (1e9, 64))


@dataclass(frozen=True)
class Condition:
    """One Table 2 traffic condition, as published and as scaled for this machine."""

    paper_bps: float
    frame: int
    scale: float

    @property
    def label(self) -> str:
        rate = f"{self.paper_bps / 1e9:g}G" if self.paper_bps >= 1e9 else \
            f"{self.paper_bps / 1e6:g}M"
        return f"{rate}/{self.frame}B"

    @property
    def paper_interval_us(self) -> float:
        return self.frame * 8 / self.paper_bps * 1e6

    @property
    def pps(self) -> float:
        return self.paper_bps * self.scale / (self.frame * 8)

    @property
    def scaled_bps(self) -> float:
        return self.paper_bps * self.scale

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "paper_bps": self.paper_bps, "frame": self.frame,
                "paper_interval_us": self.paper_interval_us, "scale": self.scale,
                "scaled_bps": self.scaled_bps, "pps": self.pps,
                "interval_us": 1e6 / self.pps}


def table2(scale: float) -> list[Condition]:
    return [Condition(bps, frame, scale) for bps, frame in TABLE2]
