"""The stock backend's periodic service: NetAP's interval search from user space.

``kbpctl enable DEV --mode periodic --backend stock`` (without ``--interval-us``) journals
and starts one service per device, ``python -m kbp.periodicd``, a detached process in its own
session (in the device's netns, through ``ip netns exec``, so its rtnetlink, netdev netlink and
sysfs are the device's). Every ``round_ms`` it reads the round's objective, feeds
:class:`kbp.netap.Search` (the module's search, ported) and writes the next interval to the
device's ``gro_flush_timeout`` (docs/netap.md, "The stock backend").

Its lifecycle, and why it can never leave a setting unjournaled:

- It is a journal change itself (kind ``periodicd``, journaled before it is started, after the
  settings it drives): ``disable`` replays the journal newest first, so it stops the service
  (SIGTERM through a pidfd opened on pid + start time, then SIGKILL) *before* it restores
  ``gro_flush_timeout`` and the rest, and a crashed service costs nothing (the journal has the
  values from before ``enable``).
- It writes only the ``gro_flush_timeout`` targets its device's journal lists, only while that
  journal is complete and still the one it was started for (the begin time), and only while
  holding the state directory's lock, which ``enable``/``disable`` hold for their whole run: it
  never writes between a restore and the removal of the journal.
- It exits on its own when the journal is removed or replaced, the device or its netns is
  gone (its state file then says why), or on SIGTERM (writing nothing).
- Its state (search, interval, last round, history) is a JSON file next to the journal,
  ``DEV.periodic.json``, rewritten atomically every round; ``kbpctl status`` shows it and
  reports a service that died as a problem.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbp import names, netap, sysinfo
from kbp.problems import PERIODIC_SERVICE, Problem
from kbp.system import journal
from kbp.system.journal import Record, StateDir, TargetGone, read_record

KIND = journal.KIND_PERIODICD
RUNNING = "running"
#: napi_defer_hard_irqs while periodic: empty polls before the IRQ is re-armed (the module's
#: KBP_PERIODIC_IDLE_POLLS; why 8: docs/netap.md)
DEFER_HARD_IRQS = 8
HISTORY = 64            # rounds kept in the state file
STOP_TIMEOUT_S = 5.0    # SIGTERM, then SIGKILL
LOCK_WAIT_S = 0.05      # a round's write waits this long for the state lock, then skips


# -- files -------------------------------------------------------------------------------
def state_file(root: Path, dev: str, netns: str | None) -> Path:
    j = StateDir(root).journal_path(dev, netns)
    return j.with_name(f"{dev}.periodic.json")


def log_file(root: Path, dev: str, netns: str | None) -> Path:
    return state_file(root, dev, netns).with_name(f"{dev}.periodic.log")


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def write_state(path: Path, obj: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(obj, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def service_key(dev: str, netns: str | None, ifindex: int | None, started: float
                ) -> dict[str, Any]:
    """The journal key of a device's service: the device, and the begin time of the journal
    it belongs to (a service belongs to one enable)."""
    return {"dev": dev, "netns": netns, "ifindex": ifindex, "journal": started}


def alive(info: Mapping[str, Any], host: sysinfo.Host = sysinfo.HOST) -> bool:
    """The process a state file names still runs (pid and start time, not a zombie)."""
    pid, start = info.get("pid"), info.get("starttime")
    if not isinstance(pid, int) or not isinstance(start, int):
        return False
    st = sysinfo.read_stat(pid, host)
    return st is not None and st.starttime == start and st.state not in ("Z", "X")


def _signal(info: Mapping[str, Any], sig: int) -> bool:
    """Send ``sig`` through a pidfd opened on the process the state file names, after
    checking its start time: no race with pid reuse. False: it is gone."""
    try:
        fd = os.pidfd_open(int(info["pid"]))
    except (ProcessLookupError, KeyError, ValueError, TypeError):
        return False
    try:
        if not alive(info):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def _wait_gone(info: Mapping[str, Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(info):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def stop(root: Path, key: Mapping[str, Any]) -> None:
    """Stop the device's service (if its state file is this journal's) and forget it."""
    path = state_file(root, key["dev"], key.get("netns"))
    info = read_state(path)
    ours = info is not None and info.get("journal") == key.get("journal")
    if ours and info is not None and _signal(info, signal.SIGTERM) and \
            not _wait_gone(info, STOP_TIMEOUT_S):
        _signal(info, signal.SIGKILL)
        if not _wait_gone(info, 2.0):
            raise OSError(errno.EBUSY, f"periodic service pid {info.get('pid')} of "
                                       f"{key['dev']} does not exit")
    for p in (path, log_file(root, key["dev"], key.get("netns"))):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def spawn(root: Path, key: Mapping[str, Any]) -> dict[str, Any]:
    """Start the device's service, detached (own session, stdio to its log file), running
    this very kbp package; its pid and start time go to the state file at once."""
    import kbp
    dev, netns = key["dev"], key.get("netns")
    argv = [sys.executable, "-m", "kbp.periodicd", "--run-dir", str(root), "--dev", dev,
            "--journal", repr(float(key["journal"]))]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv, "--netns", netns]
    pkg = str(Path(kbp.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("KBP_TEST_PAUSE_AFTER_STEP", None)
    path = state_file(root, dev, netns)
    # the state file first (pid unknown yet): killed from here on, disable still finds the
    # service's files to remove (the process itself exits once the journal is gone)
    info: dict[str, Any] = {"pid": None, "starttime": None, "dev": dev, "netns": netns,
                            "journal": key["journal"], "status": "starting",
                            "since": time.time()}
    write_state(path, info)
    with open(log_file(root, dev, netns), "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True, cwd="/", env=env)
    st = sysinfo.read_stat(proc.pid)
    info.update(pid=proc.pid, starttime=st.starttime if st else None)
    write_state(path, info)
    return info


class ServiceHandler:
    """Journal kind ``periodicd``: value ``"running"`` (a service of this journal has been
    started and not stopped) or None. Setting None stops it; setting "running" starts it."""

    def __init__(self, state: StateDir) -> None:
        self.root = state.root

    def get(self, key: Mapping[str, Any]) -> Any:
        info = read_state(state_file(self.root, key["dev"], key.get("netns")))
        return RUNNING if info is not None and info.get("journal") == key.get("journal") \
            else None

    def set(self, key: Mapping[str, Any], value: Any) -> None:
        if value == RUNNING:
            spawn(self.root, key)
        else:
            stop(self.root, key)


# -- status ------------------------------------------------------------------------------
def search_fields(s: netap.Search) -> dict[str, Any]:
    st = s.state()
    out = {k: st[k] for k in ("round", "interval_us", "low_us", "high_us", "range_lo_us",
                              "range_hi_us", "distance_us", "restarts")}
    out["converged"] = bool(st["converged"])
    out["started_by"] = netap.START_NAMES[st["started_by"]]
    return out


def first_interval(periodic: Mapping[str, Any]) -> int:
    """The interval ``enable`` sets: the fixed one, or the search's first probe."""
    if periodic.get("interval_us") is not None:
        return int(periodic["interval_us"])
    return netap.Search(params(periodic)).interval_us


def params(periodic: Mapping[str, Any]) -> netap.Params:
    d = names.PERIODIC_DEFAULTS
    return netap.Params(int(periodic.get("min_interval_us") or d["min_interval_us"]),
                        int(periodic.get("max_interval_us") or d["max_interval_us"]),
                        int(periodic.get("min_change") or d["min_change"]),
                        int(periodic.get("max_round") or d["max_round"]))


def describe(root: Path, rec: Record) -> tuple[dict[str, Any], list[Problem]]:
    """A stock periodic device's ``periodic`` status and its problems."""
    per = dict(rec.request.get("periodic") or {})
    out: dict[str, Any] = {"interval_us": per.get("interval_us"), "search": None,
                           "defer_hard_irqs": DEFER_HARD_IRQS,
                           "objective": per.get("objective"), "round_ms": per.get("round_ms"),
                           "service": None}
    if per.get("interval_us") is not None:
        return out, []
    info = read_state(state_file(root, rec.dev, rec.netns))
    problems = []
    if info is None or info.get("journal") != rec.started:
        if rec.complete:
            problems.append(Problem(PERIODIC_SERVICE, f"the periodic service of {rec.dev} was "
                                    "never started: 'kbpctl apply' or enable again starts it"))
        return out, problems
    running = alive(info)
    svc = {k: info.get(k) for k in ("pid", "status", "reason", "rounds", "idle_rounds",
                                    "applied_us", "last", "write_errors", "updated")}
    svc["running"] = running
    out["service"] = svc
    out["search"] = info.get("search")
    out["interval_us"] = info.get("applied_us")
    if not running and rec.complete:
        why = f" ({info['reason']})" if info.get("reason") else \
            " (killed, or crashed: see " \
            f"{log_file(root, rec.dev, rec.netns)})"
        stays = f" stays at {info['applied_us']} us" if info.get("applied_us") else " stays"
        problems.append(Problem(
            PERIODIC_SERVICE,
            f"the periodic service (pid {info.get('pid')}) is not running{why}: the "
            f"interval{stays} and no longer adapts; 'kbpctl disable {rec.dev}' restores the "
            "device, 'kbpctl apply' or enable again restarts the search"))
    return out, problems


# -- the service -----------------------------------------------------------------------------
@dataclass
class Sample:
    rx_bytes: int | None
    cpu_ns: int
    t_ns: int


class Gone(Exception):
    """The device, its netns or its journal is gone: the service ends."""


class Service:
    def __init__(self, root: Path, dev: str, netns: str | None, journal: float) -> None:
        self.root = root
        self.dev = dev
        self.netns = netns
        self.journal = journal
        self.jpath = StateDir(root).journal_path(dev, netns)
        self.spath = state_file(root, dev, netns)
        self.rounds = 0
        self.idle_rounds = 0
        self.write_errors = 0
        self.history: list[dict[str, Any]] = []
        self.last: dict[str, Any] | None = None
        self.reason: str | None = None
        self.ns_ino = os.stat("/proc/self/ns/net").st_ino
        from kbp.netdev import NetdevClient, NetFS
        self.client = NetdevClient(None)
        self.fs = NetFS(None)

    # -- the journal says what is ours -------------------------------------------------
    def record(self) -> Record:
        rec = read_record(self.jpath)
        if rec is None or rec.started != self.journal:
            raise Gone("")  # disabled or re-enabled: not ours any more, and nothing to say
        info = read_state(self.spath)
        if info is not None and info.get("journal") == self.journal and \
                info.get("pid") not in (None, os.getpid()):
            raise Gone("")  # another service of this journal took over (cannot happen)
        return rec

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """The state dir's lock, if it comes free within LOCK_WAIT_S. Never blocks for long:
        enable/disable hold it for their whole run (and disable, holding it, stops this
        service); other devices' services hold it for a write."""
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        yield False
                        return
                    time.sleep(0.002)
            yield True
        finally:
            os.close(fd)

    def check_device(self, rec: Record) -> None:
        """Gone: the device, or its netns, is gone. The service runs in the device's netns
        (``ip netns exec`` mounted that netns's sysfs), so /sys/class/net is the device's:
        a file read per round, not an rtnetlink dump (pyroute2 costs ms per call)."""
        if self.netns:
            try:
                if os.stat(f"/run/netns/{self.netns}").st_ino != self.ns_ino:
                    raise Gone(f"netns {self.netns} is gone")
            except FileNotFoundError:
                raise Gone(f"netns {self.netns} is gone") from None
        try:
            idx = self.fs.read(self.dev, "ifindex")
        except OSError:
            idx = None
        if idx is None or int(idx) != rec.ifindex:
            raise Gone(f"{self.dev} is gone")

    # -- the objective ----------------------------------------------------------------
    def sample(self, rec: Record) -> Sample:
        """The device's rx_bytes (sysfs statistics: the same counter as rtnetlink's
        IFLA_STATS64), its NAPI threads' CPU ns, and the time."""
        rx = None
        with contextlib.suppress(OSError, ValueError, TypeError):
            rx = int(self.fs.read(self.dev, "statistics/rx_bytes") or "")
        cpu = 0
        for t in threads(rec):
            if sysinfo.same_task(t):
                cpu += sysinfo.task_counters(t.pid).poll_ns or 0
        return Sample(rx, cpu, time.monotonic_ns())

    # -- writing -----------------------------------------------------------------------
    def apply(self, rec: Record, interval_us: int) -> None:
        ns = interval_us * 1000
        for c in rec.changes:
            try:
                if c.kind == journal.KIND_NAPI and c.key.get("knob") == "gro_flush_timeout":
                    self.client.napi_set(int(c.key["napi_id"]), gro_flush_timeout=ns)
                elif c.kind == journal.KIND_SYSFS and c.key.get("attr") == "gro_flush_timeout":
                    self.fs.write(self.dev, "gro_flush_timeout", str(ns))
            except (OSError, TargetGone) as e:
                self.write_errors += 1
                print(f"kbp.periodicd {self.dev}: writing {ns} ns: {e}", file=sys.stderr,
                      flush=True)

    def state(self, s: netap.Search, applied: int, status: str) -> dict[str, Any]:
        st = sysinfo.read_stat(os.getpid())
        return {"pid": os.getpid(), "starttime": st.starttime if st else None,
                "dev": self.dev, "netns": self.netns, "journal": self.journal,
                "status": status, "reason": self.reason, "rounds": self.rounds,
                "idle_rounds": self.idle_rounds, "applied_us": applied,
                "write_errors": self.write_errors, "search": search_fields(s),
                "last": self.last, "history": self.history[-HISTORY:],
                "updated": time.time()}

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        try:
            rec = self.record()
        except Gone:
            return 0
        per = dict(rec.request.get("periodic") or {})
        objective = per.get("objective") or names.OBJECTIVE_BYTES
        round_ns = int(per.get("round_ms") or names.PERIODIC_DEFAULTS["round_ms"]) * 1_000_000
        s = netap.Search(params(per))
        applied = s.interval_us  # enable set the first probe
        prev = self.sample(rec)
        next_t = prev.t_ns + round_ns
        status = "running"
        try:
            while True:
                now = time.monotonic_ns()
                if next_t > now:
                    time.sleep((next_t - now) / 1e9)
                next_t += round_ns
                if next_t <= time.monotonic_ns():  # fell behind (stopped, starved): resync
                    next_t = time.monotonic_ns() + round_ns
                rec = self.record()
                self.check_device(rec)
                cur = self.sample(rec)
                if not rec.complete:  # enable still running (or killed): wait for it
                    prev = cur
                    status = "waiting for enable to complete"
                    continue
                status = "running"
                ran_us = s.interval_us
                value = objective_value(objective, prev, cur, round_ns)
                prev = cur
                self.rounds += 1
                self.last = value
                if value["value"] is None:
                    self.idle_rounds += 1  # no bytes: the search pauses, as the module's
                else:
                    s.round_end(value["value"])
                self.history.append({"n": self.rounds, "ran_us": ran_us,
                                     "applied_us": applied, "value": value["value"],
                                     "next_us": s.interval_us})
                del self.history[:-HISTORY]
                with self.locked() as got:
                    if not got:
                        continue  # enable/disable at work: next round
                    rec = self.record()
                    if s.interval_us != applied:
                        self.apply(rec, s.interval_us)
                        applied = s.interval_us
                    write_state(self.spath, self.state(s, applied, status))
        except Gone as e:
            self.reason = str(e) or None
            if self.reason:
                self.finish(s, applied, "exited")
            return 0
        except Exception as e:  # a bug or a broken kernel interface: say so, then exit
            traceback.print_exc()
            self.reason = f"error: {e}"
            self.finish(s, applied, "exited")
            return 1

    def finish(self, s: netap.Search, applied: int, status: str) -> None:
        """Say why it ended, in the state file (if the journal is still ours)."""
        print(f"kbp.periodicd {self.dev}: {self.reason}", file=sys.stderr, flush=True)
        with contextlib.suppress(Gone, OSError), self.locked() as got:
            if got:
                self.record()
                write_state(self.spath, self.state(s, applied, status))


def threads(rec: Record) -> list[sysinfo.TaskId]:
    """The device's NAPI threads, as the journal names them (their scheduling changes)."""
    out = {}
    for c in rec.changes:
        if c.kind == journal.KIND_SCHED and "pid" in c.key:
            out[c.key["pid"]] = sysinfo.TaskId(int(c.key["pid"]), int(c.key["starttime"]),
                                               str(c.key.get("comm", "")))
    return list(out.values())


def objective_value(objective: str, prev: Sample, cur: Sample, round_ns: int
                    ) -> dict[str, Any]:
    """The round's objective. bytes: rx_bytes received, scaled to a nominal round (a round
    the service overslept is not a better round); bytes-per-cpu: rx_bytes per CPU-second of
    the device's NAPI threads. None (idle): no bytes, or the counter went backwards."""
    out: dict[str, Any] = {"bytes": None, "cpu_ns": cur.cpu_ns - prev.cpu_ns,
                           "elapsed_ns": cur.t_ns - prev.t_ns, "value": None}
    if prev.rx_bytes is None or cur.rx_bytes is None:
        return out
    b = cur.rx_bytes - prev.rx_bytes
    out["bytes"] = b
    if b <= 0 or out["elapsed_ns"] <= 0:
        return out
    if objective == names.OBJECTIVE_BYTES_PER_CPU:
        out["value"] = min(b * 1_000_000_000 // max(out["cpu_ns"], 1000), netap.U64)
    else:
        out["value"] = min(b * round_ns // out["elapsed_ns"], netap.U64)
    return out


def _term(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kbp.periodicd",
                                 description="kbp's stock periodic service (started by "
                                             "kbpctl enable --mode periodic; do not run by "
                                             "hand)")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--netns", default=None)
    ap.add_argument("--journal", required=True, type=float)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return Service(args.run_dir, args.dev, args.netns, args.journal).run()


if __name__ == "__main__":
    sys.exit(main())
