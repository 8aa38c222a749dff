"""kbpctl on this machine's real kernel: netns + veth testbeds (GRO on, so veth uses NAPI).

Every test builds its own namespaces (kbp.bench.testbed) and its own journal directory; teardown
runs ``kbpctl disable --all`` and deletes the namespaces, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kbp import names, sysinfo
from kbp.bench import testbed
from kbp.bench.testbed import VethLink
from kbp.netdev import NetdevClient, get_link
from kbp.snapshot import setting, snapshot
from kbp.system import access

from .conftest import UserKbpctl, netns_skip_reason

pytestmark = [pytest.mark.netns, pytest.mark.root,
              pytest.mark.skipif(netns_skip_reason() is not None,
                                 reason=netns_skip_reason() or "")]

KBPCTL = [sys.executable, "-m", "kbp.cli"]
PORT = 19750

ECHO_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
while True:
    d, a = s.recvfrom(2048)
    s.sendto(d, a)
"""

PING_CLIENT = """
import json, socket, sys, time
ip, port, count, until = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.5)
ok = lost = i = 0
stop = time.time() + until
try:
    while (count and i < count) or (not count and time.time() < stop):
        msg = b"%d" % i
        i += 1
        s.sendto(msg, (ip, port))
        try:
            while True:
                d, _ = s.recvfrom(2048)
                if d == msg:
                    ok += 1
                    break
        except TimeoutError:
            lost += 1
except KeyboardInterrupt:
    pass
print(json.dumps({"ok": ok, "lost": lost}))
"""


class Bed:
    """A testbed plus a kbpctl that journals into a private directory."""

    def __init__(self, tb: testbed.Testbed, run_dir: Path) -> None:
        self.tb = tb
        self.run_dir = run_dir
        self.link: VethLink = tb.links[0]
        self.env = dict(os.environ, KBP_RUN_DIR=str(run_dir))

    def kbpctl(self, *args: str, env: dict[str, str] | None = None, expect: int | None = 0,
               ) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*KBPCTL, *args], capture_output=True, text=True, timeout=120,
                           env={**self.env, **(env or {})})
        if expect is not None:
            assert p.returncode == expect, (args, p.returncode, p.stdout, p.stderr)
        return p

    def snap(self) -> dict[str, Any]:
        return {"server": snapshot(self.link.dev_b, self.tb.server),
                "client": snapshot(self.link.dev_a, self.tb.client)}

    def enable_both(self, *opts: str, env: dict[str, str] | None = None) -> None:
        self.kbpctl("enable", self.link.dev_b, "--netns", self.tb.server, *opts, env=env)
        self.kbpctl("enable", self.link.dev_a, "--netns", self.tb.client, *opts, env=env)

    def disable_both(self) -> None:
        self.kbpctl("disable", self.link.dev_b, "--netns", self.tb.server)
        self.kbpctl("disable", self.link.dev_a, "--netns", self.tb.client)

    def echo_server(self) -> None:
        self.tb.popen(self.tb.server, [sys.executable, "-c", ECHO_SERVER, self.link.ip_b,
                                       str(PORT)])
        self.ping(3)  # wait until it answers

    def ping(self, count: int, tries: int = 20) -> dict[str, int]:
        for _ in range(tries):
            out = json.loads(access.cmd([sys.executable, "-c", PING_CLIENT,
                                            self.link.ip_b, str(PORT), str(count),
                                            "0"], ns=self.tb.client).stdout)
            if out["ok"]:
                return out
            time.sleep(0.1)
        return out

    def journals(self) -> list[Path]:
        return sorted(self.run_dir.rglob("*.jsonl"))

    def status(self) -> dict[str, Any]:
        return json.loads(self.kbpctl("status", "--json").stdout)


@contextlib.contextmanager
def new_bed(prefix: str | None = None) -> Iterator[Bed]:
    """A veth testbed with a journal dir others can read (status works without root), like
    /run/kbp; on the way out, whatever a failing test left enabled is restored before the
    netns go away. ``prefix``: the testbed's names (default: the testbed's own)."""
    top = Path(tempfile.mkdtemp(prefix=f"{prefix or 'kbp'}-test-"))
    top.chmod(0o755)
    with testbed.Testbed(**({"prefix": prefix} if prefix else {})) as tb:
        b = Bed(tb, top / "run")
        try:
            yield b
        finally:
            subprocess.run([*KBPCTL, "disable", "--all"], env=b.env, capture_output=True,
                           timeout=120)
            shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def bed() -> Iterator[Bed]:
    with new_bed() as b:
        yield b


def napi_threads(b: Bed, netns: str, dev: str) -> list[sysinfo.TaskStat]:
    link = get_link(dev, netns)
    assert link is not None
    with NetdevClient(netns) as c:
        napis = c.napis(link.ifindex)
    return [st for st in (sysinfo.read_stat(n.pid) for n in napis if n.pid) if st]


def device_status(st: dict[str, Any], dev: str) -> dict[str, Any]:
    (d,) = [d for d in st["devices"] if d["name"] == dev]
    return d


# -- the main round trip --------------------------------------------------------------
def test_enable_status_traffic_disable_restores(bed: Bed) -> None:
    before = bed.snap()
    assert before["server"]["napis"], "veth with GRO on must have a NAPI"
    bed.echo_server()
    bed.enable_both("--cpus", "1", "--rt-prio", "50", "--linger-us", "30")

    for ns, dev in ((bed.tb.server, bed.link.dev_b), (bed.tb.client, bed.link.dev_a)):
        threads = napi_threads(bed, ns, dev)
        assert threads, f"no NAPI kthread for {dev}"
        for t in threads:
            s = sysinfo.get_sched(t.pid)
            assert t.comm.startswith(f"napi/{dev}-")
            assert (s.policy, s.priority, s.cpus) == ("SCHED_FIFO", 50, [1])

    (t,) = napi_threads(bed, bed.tb.server, bed.link.dev_b)
    c0 = sysinfo.task_counters(t.pid)
    res = bed.ping(500)
    assert res["ok"] >= 490, res  # UDP ping-pong works through the polled path
    c1 = sysinfo.task_counters(t.pid)
    assert c1.sleeps is not None and c0.sleeps is not None and c1.sleeps > c0.sleeps
    assert (c1.poll_ns or 0) > (c0.poll_ns or 0)  # the NAPI thread did the receive work

    st = bed.status()
    assert st["schema"] == "kbpctl-status/1" and st["auto_backend"] == "stock"
    d = device_status(st, bed.link.dev_b)
    assert (d["backend"], d["mode"], d["linger_us"], d["rt_prio"], d["netns"]) == \
        ("stock", "hybrid", 30, 50, bed.tb.server)
    assert d["complete"] and d["problems"] == [] and d["cpus"] == [1]
    (n,) = d["napis"]
    assert n["threaded"] == 1 and n["cpu"] == 1
    assert (n["defer_hard_irqs"], n["gro_flush_timeout_ns"]) == (3, 10_000)
    th = n["thread"]
    assert (th["policy"], th["priority"], th["cpus"]) == ("SCHED_FIFO", 50, [1])
    assert set(th["counters"]) == set(names.POLLER_COUNTERS)   # the one vocabulary
    assert d["counters"]["packets"] >= 500
    (pc,) = st["polling_cpus"]  # both NAPI threads poll on CPU 1, and are not listed there
    assert pc["cpu"] == 1 and not pc["busy"]
    assert th["pid"] not in {t["tid"] for t in pc["tasks"]}
    human = bed.kbpctl("status").stdout
    assert bed.link.dev_b in human and "FIFO/50" in human

    bed.disable_both()
    assert bed.snap() == before
    assert bed.journals() == []
    assert bed.ping(20)["ok"] >= 19  # and the stock path still works


def test_restores_non_default_prior_settings(bed: Bed) -> None:
    """Threaded NAPI already on (thread SCHED_OTHER on every CPU), defer/gro set: disable
    puts exactly that back, the same thread included."""
    ns, dev = bed.tb.server, bed.link.dev_b
    access.write(f"/sys/class/net/{dev}/threaded", "1\n", ns)
    access.write(f"/sys/class/net/{dev}/napi_defer_hard_irqs", "2\n", ns)
    access.write(f"/sys/class/net/{dev}/gro_flush_timeout", "5000\n", ns)
    (t0,) = napi_threads(bed, ns, dev)
    os.setpriority(os.PRIO_PROCESS, t0.pid, 5)
    before = bed.snap()
    assert setting(before["server"], "sched", {"pid": t0.pid, "comm": t0.comm})["nice"] == 5

    bed.kbpctl("enable", dev, "--netns", ns, "--cpus", "0", "--rt-prio", "40",
               "--linger-us", "100")
    (t1,) = napi_threads(bed, ns, dev)
    assert t1.pid == t0.pid
    s = sysinfo.get_sched(t1.pid)
    assert (s.policy, s.priority, s.cpus) == ("SCHED_FIFO", 40, [0])
    bed.kbpctl("disable", dev, "--netns", ns)
    assert bed.snap() == before


@pytest.mark.parametrize("features", ["sysfs", "legacy"])
def test_older_kernel_paths(bed: Bed, features: str) -> None:
    """The per-device sysfs path (kernels before napi-set) and the legacy path (no netdev
    netlink at all: 6.1), forced on this kernel with KBP_STOCK_FEATURES."""
    env = {"KBP_STOCK_FEATURES": features}
    before = bed.snap()
    bed.echo_server()
    bed.kbpctl("enable", bed.link.dev_b, "--netns", bed.tb.server, "--cpus", "1",
               "--linger-us", "20", env=env)
    kinds = {json.loads(line).get("kind") for p in bed.journals()
             for line in p.read_text().splitlines()}
    assert "sysfs" in kinds and "napi" not in kinds
    (t,) = napi_threads(bed, bed.tb.server, bed.link.dev_b)
    s = sysinfo.get_sched(t.pid)
    assert (s.policy, s.cpus) == ("SCHED_FIFO", [1])
    assert bed.ping(100)["ok"] >= 95
    st = json.loads(bed.kbpctl("status", "--json", env=env).stdout)
    d = device_status(st, bed.link.dev_b)
    assert d["backend"] == "stock" and d["napis"] and d["napis"][0]["thread"]["pid"] == t.pid
    bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server)
    assert bed.snap() == before


@contextlib.contextmanager
def same_named_elsewhere(dev: str, threaded: bool = True) -> Iterator[str]:
    """Another netns (a container's, say) with a veth named ``dev`` too, GRO on (so it has
    a NAPI) and, with ``threaded``, its NAPI thread ``napi/<dev>-<id>`` running."""
    ns = f"kbpdup{os.getpid()}"
    access.cmd(["ip", "netns", "add", ns])
    try:
        access.cmd(["ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name",
                    "kbpdupp0", "netns", ns])
        for d in (dev, "kbpdupp0"):
            access.cmd(["ethtool", "-K", d, "gro", "on"], ns=ns)
            access.cmd(["ip", "link", "set", d, "up"], ns=ns)
        if threaded:
            access.write(access.net_path(dev, "threaded"), "1", ns=ns)
        yield ns
    finally:
        access.cmd(["ip", "netns", "del", ns], check=False)


def test_threads_by_name_refused_when_another_netns_has_the_name(bed: Bed) -> None:
    """Without netdev napi-get (before 6.9; forced here with KBP_STOCK_FEATURES=legacy) a
    NAPI thread is known only by its name, napi/<dev>-<id>, which another netns's device of
    the same name shares: enable refuses, before changing anything, rather than make that
    namespace's thread SCHED_FIFO and pin it (it did, when the device was threaded already);
    status names the ambiguity and lists neither thread; with the other device gone, enable
    finds its one thread."""
    s, dev = bed.tb.server, bed.link.dev_b
    legacy = {"KBP_STOCK_FEATURES": "legacy"}
    access.write(access.net_path(dev, "threaded"), "1", ns=s)   # its thread exists already
    (ours,) = sysinfo.find_napi_threads(dev)          # by name: before the other comes
    with same_named_elsewhere(dev) as other:
        theirs = [t for t in sysinfo.find_napi_threads(dev) if t.pid != ours.pid]
        assert len(theirs) == 1, theirs
        was = sysinfo.get_sched(theirs[0].pid)
        _refused(bed, ["enable", dev, "--netns", s, "--cpus", "1"], 69,
                 f"{dev}'s NAPI threads can only be found by name (napi/{dev}-<id>) on this "
                 f"kernel, which has no netdev napi-get (Linux 6.9), and netns {other} has a "
                 "device whose threads carry the same names; kbpctl does not change another "
                 "namespace's threads: use the kbp module (--backend kmod)", env=legacy)
        assert sysinfo.get_sched(theirs[0].pid) == was
        assert sysinfo.get_sched(ours.pid).policy == "SCHED_OTHER"
        st = json.loads(bed.kbpctl("status", "--json", "--netns", s, dev, env=legacy).stdout)
        d = device_status(st, dev)
        assert d["napis"] == [] and len(d["problems"]) == 1, d
        assert f"netns {other} has a device whose threads carry the same names: status " \
            f"shows none of them, and 'kbpctl enable {dev}' refuses it" in d["problems"][0]
    bed.kbpctl("enable", dev, "--netns", s, "--cpus", "1", env=legacy)
    s_ = sysinfo.get_sched(ours.pid)
    assert (s_.policy, s_.cpus) == ("SCHED_FIFO", [1])
    d = device_status(json.loads(bed.kbpctl("status", "--json", env=legacy).stdout), dev)
    assert [n["thread"]["pid"] for n in d["napis"]] == [ours.pid] and d["problems"] == []
    bed.kbpctl("disable", dev, "--netns", s)


def test_threads_by_name_refused_when_the_name_comes_during_enable(bed: Bed) -> None:
    """The same name arriving in another netns after the first check: enable checks again
    once the threads are there, refuses and rolls back."""
    s, dev = bed.tb.server, bed.link.dev_b
    before = bed.snap()
    env = {**bed.env, "KBP_STOCK_FEATURES": "legacy", "KBP_TEST_PAUSE_AFTER_STEP": "1"}
    p = subprocess.Popen([*KBPCTL, "enable", dev, "--netns", s, "--cpus", "1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_stopped(p.pid)      # threaded NAPI turned on, its thread not looked for yet
        with same_named_elsewhere(dev) as other:
            os.kill(p.pid, signal.SIGCONT)
            _, err = p.communicate(timeout=60)
            theirs = [t for t in sysinfo.find_napi_threads(dev)
                      if sysinfo.get_sched(t.pid).policy != "SCHED_OTHER"]
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
    assert p.returncode != 0, err
    assert f"netns {other} has a device whose threads carry the same names" in err, err
    assert "every change was rolled back" in err, err
    assert theirs == []
    assert bed.snap() == before and bed.journals() == []


def test_two_queues_round_robin(bed: Bed) -> None:
    """A veth with two RX queues has two NAPIs: --cpus 0-1 puts one thread on each."""
    c, s = bed.tb.client, bed.tb.server
    access.cmd(["ip", "link", "add", "mqc0", "netns", c, "numtxqueues", "2", "numrxqueues", "2",
               "type", "veth", "peer", "name", "mqs0", "netns", s, "numtxqueues", "2",
               "numrxqueues", "2"])
    for ns, dev in ((c, "mqc0"), (s, "mqs0")):
        access.cmd(["ip", "link", "set", dev, "up"], ns=ns)
        access.cmd(["ethtool", "-K", dev, "gro", "on"], ns=ns)
    before = snapshot("mqs0", s)
    assert len(before["napis"]) == 2
    bed.kbpctl("enable", "mqs0", "--netns", s, "--cpus", "0-1")
    threads = napi_threads(bed, s, "mqs0")
    assert sorted(sysinfo.get_sched(t.pid).cpus[0] for t in threads) == [0, 1]
    bed.kbpctl("disable", "--all")
    assert snapshot("mqs0", s) == before


# -- robustness -----------------------------------------------------------------------
@pytest.mark.slow
def test_twenty_cycles_under_traffic(bed: Bed) -> None:
    before = bed.snap()
    bed.echo_server()
    pinger = access.popen([sys.executable, "-c", PING_CLIENT, bed.link.ip_b, str(PORT),
                              "0", "600"], ns=bed.tb.client)
    try:
        for i in range(20):
            cpus = str(i % 2)
            bed.enable_both("--cpus", cpus, "--rt-prio", str(10 + i),
                            *(("--linger-us", "20") if i % 3 else ()))
            (t,) = napi_threads(bed, bed.tb.server, bed.link.dev_b)
            assert sysinfo.get_sched(t.pid).priority == 10 + i
            bed.disable_both()
    finally:
        pinger.send_signal(signal.SIGINT)
        out, err = pinger.communicate(timeout=30)
    res = json.loads(out)
    assert res["ok"] > 0, (res, err)
    assert bed.snap() == before
    assert bed.journals() == []
    assert bed.ping(50)["ok"] >= 48


def _wait_stopped(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = sysinfo.read_stat(pid)
        if st is None:
            raise AssertionError("kbpctl exited instead of pausing")
        if st.state in ("T", "t"):
            return
        time.sleep(0.02)
    raise AssertionError("kbpctl did not reach the pause point")


def kill_paused(bed: Bed, args: list[str], step: int, phase: str | None = None) -> None:
    """``kbpctl ARGS`` run until it pauses after journal step ``step`` (``phase``: where in
    the step; KBP_TEST_PAUSE_*), then SIGKILLed there: a crash half-way."""
    env = {**bed.env, "KBP_TEST_PAUSE_AFTER_STEP": str(step)}
    if phase is not None:
        env["KBP_TEST_PAUSE_PHASE"] = phase
    p = subprocess.Popen([*KBPCTL, *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        _wait_stopped(p.pid)
    finally:
        p.kill()
        p.communicate(timeout=30)


@pytest.mark.parametrize(("step", "phase"), [(1, "applied"), (3, "journaled"), (4, "applied")])
def test_killed_mid_enable_then_disable_restores(bed: Bed, step: int, phase: str) -> None:
    before = bed.snap()
    kill_paused(bed, ["enable", bed.link.dev_b, "--netns", bed.tb.server, "--cpus", "1",
                      "--linger-us", "30"], step, phase)
    assert bed.snap() != before  # it really was half-way
    d = device_status(bed.status(), bed.link.dev_b)
    assert d["backend"] == "stock" and not d["complete"]
    assert any("interrupted" in x for x in d["problems"])
    bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server)
    assert bed.snap() == before
    assert bed.journals() == []


def test_disable_after_the_netns_is_gone(bed: Bed) -> None:
    """A container's netns deleted while kbp served its veth: disable forgets the device
    (its NAPIs and threads went with it) and restores the rest."""
    with testbed.Testbed(prefix="kbpx") as other:
        dev, ns = other.links[0].dev_b, other.server
        bed.kbpctl("enable", dev, "--netns", ns, "--cpus", "1", "--linger-us", "10")
        assert len(bed.journals()) == 1
    st = bed.status()
    assert any("gone" in p or "root" in p for d in st["devices"] if d["name"] == dev
               for p in d["problems"])
    out = bed.kbpctl("disable", dev, "--netns", ns).stdout
    assert "gone, nothing to restore" in out and f"disabled {dev}" in out
    assert bed.journals() == []


# -- configuration --------------------------------------------------------------------
def test_apply_converges(bed: Bed, tmp_path: Path) -> None:
    cfg = tmp_path / "kbp.toml"
    s, c = bed.tb.server, bed.tb.client
    before = bed.snap()

    def write(body: str) -> None:
        cfg.write_text('backend = "stock"\n[defaults]\ncpus = "1"\nrt_prio = 30\n' + body)

    write(f'[[device]]\nname = "{bed.link.dev_b}"\nnetns = "{s}"\n'
          f'[[device]]\nname = "{bed.link.dev_a}"\nnetns = "{c}"\n')
    out = bed.kbpctl("apply", "--config", str(cfg), "--dry-run").stdout
    assert "would enable" in out and bed.journals() == []
    out = bed.kbpctl("apply", "--config", str(cfg)).stdout
    assert out.count(": enable (stock)") == 2
    assert "in sync" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    (t,) = napi_threads(bed, s, bed.link.dev_b)
    assert sysinfo.get_sched(t.pid).priority == 30

    write(f'[[device]]\nname = "{bed.link.dev_b}"\nnetns = "{s}"\nrt_prio = 45\n')
    out = bed.kbpctl("apply", "--config", str(cfg)).stdout
    assert "reenable (stock): rt_prio changed" in out and "disable (stock)" in out
    (t,) = napi_threads(bed, s, bed.link.dev_b)
    assert sysinfo.get_sched(t.pid).priority == 45
    assert snapshot(bed.link.dev_a, c) == before["client"]

    # drift: the thread lost its priority behind kbpctl's back; apply repairs it
    os.sched_setscheduler(t.pid, os.SCHED_OTHER, os.sched_param(0))
    assert "reenable" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    (t,) = napi_threads(bed, s, bed.link.dev_b)
    assert sysinfo.get_sched(t.pid).priority == 45

    write("")
    bed.kbpctl("apply", "--config", str(cfg))
    assert bed.snap() == before and bed.journals() == []


# -- bad input: exit code != 0, one line saying what to do, nothing changed -----------
def _refused(bed: Bed, args: list[str], code: int, text: str, user: UserKbpctl | None = None,
             env: dict[str, str] | None = None) -> None:
    """``user``: run kbpctl as uid 65534 (from the copy that user can read)."""
    before = bed.snap()
    full_env = {**bed.env, **(env or {})}
    if user is not None:
        p = subprocess.run([*user.argv, *args], capture_output=True, text=True, timeout=60,
                           env=user.env(full_env), cwd=user.cwd)
    else:
        p = subprocess.run([*KBPCTL, *args], capture_output=True, text=True, timeout=60,
                           env=full_env)
    assert p.returncode == code, (args, p.returncode, p.stdout, p.stderr)
    assert own_lines(p.stderr) == 1 and p.stderr.startswith("kbpctl: "), p.stderr
    assert p.stdout == "", p.stdout
    assert text in p.stderr, p.stderr
    assert bed.snap() == before
    assert bed.journals() == []


def test_refuses_bad_input(bed: Bed, user_kbpctl: UserKbpctl) -> None:
    s, dev = bed.tb.server, bed.link.dev_b
    en = ["enable", dev, "--netns", s]
    _refused(bed, ["enable", "nosuchdev0", "--netns", s], 2, "no device nosuchdev0 in netns")
    _refused(bed, ["disable", "nosuchdev0", "--netns", s], 2, "no device nosuchdev0")
    _refused(bed, ["enable", dev, "--netns", "kbp-no-such-ns"], 2, "unknown netns")
    _refused(bed, ["status", "--netns", "kbp-no-such-ns"], 2, "unknown netns")
    _refused(bed, [*en, "--cpus", "64"], 2, "CPU 64 does not exist")
    _refused(bed, [*en, "--cpus", "0-99"], 2, "does not exist")
    _refused(bed, [*en, "--rt-prio", "0"], 2, "priority 0 is out of range")
    _refused(bed, [*en, "--rt-prio", "100"], 2, "priority 100 is out of range")
    _refused(bed, [*en, "--mode", "busy", "--linger-us", "10"], 2, "hybrid only")
    _refused(bed, [*en, "--quota", "32", "--backend", "stock"], 2, "--quota is a knob")
    _refused(bed, [*en, "--freq-ctl", "--backend", "stock"], 2, "--freq-ctl is a knob")
    _refused(bed, [*en, "--freq-ctl"], 2, "--freq-ctl is a knob")   # auto: no module here
    _refused(bed, [*en, "--mode", "busy", "--freq-ctl"], 2, "--freq-ctl applies to")
    _refused(bed, ["disable", dev, "--all"], 2, "not both")
    _refused(bed, ["enable", dev, dev, "--netns", s], 2, "named twice")
    _refused(bed, [*en, "--backend", "kmod"], 69, "modprobe kbp")
    _refused(bed, en, 77, "needs root", user=user_kbpctl)
    _refused(bed, ["disable", "--all"], 77, "needs root", user=user_kbpctl)


def test_stock_priority_defaults_and_busy_refuses_fifo(bed: Bed, tmp_path: Path) -> None:
    """Without --rt-prio (or rt_prio in kbp.toml) the stock backend's hybrid NAPI threads run
    SCHED_FIFO 50, journaled as 50, so apply finds them in sync. Its busy mode (upstream
    threaded busy polling: never sleeps) refuses a SCHED_FIFO priority before changing
    anything, on any kernel: from the command line and from kbp.toml."""
    s, dev = bed.tb.server, bed.link.dev_b
    en = ["enable", dev, "--netns", s, "--mode", "busy"]
    _refused(bed, [*en, "--rt-prio", "50"], 2,
             "--rt-prio 50 with the stock backend's --mode busy would starve")
    _refused(bed, [*en, "--backend", "stock", "--rt-prio", "1"], 2, "Leave the priority out")
    cfg = tmp_path / "kbp.toml"
    dev_cfg = f'[[device]]\nname = "{dev}"\nnetns = "{s}"\ncpus = "1"\n'
    cfg.write_text('backend = "stock"\n[defaults]\nmode = "busy"\nrt_prio = 50\n' + dev_cfg)
    _refused(bed, ["apply", "--config", str(cfg)], 2, "rt_prio in kbp.toml")

    before = bed.snap()
    cfg.write_text('backend = "stock"\n' + dev_cfg)
    assert ": enable (stock)" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    (t,) = napi_threads(bed, s, dev)
    s_ = sysinfo.get_sched(t.pid)
    assert (s_.policy, s_.priority, s_.cpus) == ("SCHED_FIFO", 50, [1])
    d = device_status(bed.status(), dev)
    assert (d["mode"], d["rt_prio"], d["problems"]) == ("hybrid", 50, [])
    assert "in sync" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    out = bed.kbpctl(*en[:4], "--cpus", "1").stdout  # the CLI's default: the same
    assert "hybrid, 1 NAPI thread on CPU 1, SCHED_FIFO 50" in out
    assert "in sync" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    cfg.write_text('backend = "stock"\n')
    bed.kbpctl("apply", "--config", str(cfg))
    assert bed.snap() == before and bed.journals() == []


def test_refuses_device_without_napi(bed: Bed) -> None:
    s, dev = bed.tb.server, bed.link.dev_b
    access.cmd(["ethtool", "-K", dev, "gro", "off"], ns=s)
    msg = f"{dev} has no NAPI instance (veth uses NAPI only with GRO on: ip netns exec {s} " \
          f"ethtool -K {dev} gro on)"
    _refused(bed, ["enable", dev, "--netns", s], 2, msg)
    _refused(bed, ["enable", dev, "--netns", s], 2, msg, env={"KBP_STOCK_FEATURES": "legacy"})
    # a device in the list without NAPI refuses the whole command: the good one is untouched
    _refused(bed, ["enable", "lo", "--cpus", "1"], 2, "lo has no NAPI instance")
    access.cmd(["ethtool", "-K", dev, "gro", "on"], ns=s)


def test_refuses_missing_kernel_feature(bed: Bed) -> None:
    with NetdevClient() as c:
        if c.features().napi_busy_poll or sysinfo.kernel_version() >= (6, 19, 0):
            pytest.skip(reason="this kernel has threaded busy polling")
    _refused(bed, ["enable", bed.link.dev_b, "--netns", bed.tb.server, "--mode", "busy"], 69,
             "needs threaded busy polling (NAPI threaded=2), which is in Linux 6.19")


def test_refuses_offline_cpu(bed: Bed, tmp_path: Path) -> None:
    """No CPU can be taken offline here; the check reads .../cpu/online, so point it at a
    copy that says CPU 1 is offline."""
    from kbp.backends import EnableRequest
    from kbp.backends.stock import StockBackend
    from kbp.errors import InvalidInput
    from kbp.system.journal import StateDir
    cpu = tmp_path / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0\n")
    (cpu / "possible").write_text("0-1\n")
    be = StockBackend(state=StateDir(bed.run_dir),
                      host=sysinfo.Host(proc=Path("/proc"), sys=tmp_path / "sys"))
    before = bed.snap()
    with pytest.raises(InvalidInput, match="CPU 1 is offline"):
        be.enable(EnableRequest([bed.link.dev_b], netns=bed.tb.server, cpus=[1]))
    assert bed.snap() == before and bed.journals() == []


def test_status_works_without_root(bed: Bed, user_kbpctl: UserKbpctl) -> None:
    """Without root, status still lists what kbp serves (from the journal) but cannot look
    into other namespaces (setns needs CAP_SYS_ADMIN), and says so."""
    bed.kbpctl("enable", bed.link.dev_b, "--netns", bed.tb.server, "--cpus", "1")
    p = subprocess.run([*user_kbpctl.argv, "status", "--json"], capture_output=True,
                       text=True, env=user_kbpctl.env(bed.env), cwd=user_kbpctl.cwd,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    d = device_status(json.loads(p.stdout), bed.link.dev_b)
    assert (d["backend"], d["mode"], d["rt_prio"]) == ("stock", "hybrid", 50)
    assert any("root" in x for x in d["problems"])


# -- RPS on the served device -----------------------------------------------------------
def rps_attr(ns: str, dev: str, attr: str, q: str = "rx-0") -> str:
    return access.read(f"/sys/class/net/{dev}/queues/{q}/{attr}", ns)


def set_rps_attr(ns: str, dev: str, attr: str, value: str, q: str = "rx-0") -> None:
    access.write(f"/sys/class/net/{dev}/queues/{q}/{attr}", f"{value}\n", ns)


def cpu_mask(cpus: list[int]) -> str:
    return format(sum(1 << c for c in cpus), "x")


def received_rps() -> dict[int, int]:
    """Per CPU: RPS IPIs it received (/proc/net/softnet_stat column 10; 13 is the CPU)."""
    out = {}
    for line in Path("/proc/net/softnet_stat").read_text().splitlines():
        f = [int(x, 16) for x in line.split()]
        out[f[12] if len(f) > 12 else len(out)] = f[9]
    return out


def own_lines(stderr: str) -> int:
    """stderr lines, not counting kbp.contention's notes about other devices' interrupts on
    the polling CPU (this host's own NIC may interrupt the CPU a test polls on)."""
    return sum(1 for ln in stderr.splitlines() if "(not served by kbp)" not in ln)


def rps_changes(b: Bed) -> list[dict[str, Any]]:
    return [c for p in b.journals() for c in map(json.loads, p.read_text().splitlines())
            if c.get("kind") == "sysfs" and "/rps_" in c["key"]["attr"]]


def status_row(text: str, dev: str) -> str:
    (row,) = [ln for ln in text.splitlines() if ln.startswith(f"│ {dev} ")]
    return row


def test_rps_turned_off_and_restored_exactly(bed: Bed) -> None:
    """RPS on the served device: enable turns it off (one line says so), status shows it
    off, RPS set again behind kbpctl's back is a problem, disable puts the exact mask back."""
    from kbp.rps import mask_cpus
    ns, dev = bed.tb.server, bed.link.dev_b
    cpus = sysinfo.online_cpus()
    set_rps_attr(ns, dev, "rps_cpus", cpu_mask(cpus[:1]))
    orig = rps_attr(ns, dev, "rps_cpus")
    before = bed.snap()
    rx0 = {"netns": ns, "dev": dev, "attr": "queues/rx-0/rps_cpus"}
    assert setting(before["server"], "sysfs", rx0) == orig and mask_cpus(orig) == cpus[:1]
    bed.echo_server()

    p = bed.kbpctl("enable", dev, "--netns", ns, "--cpus", str(cpus[-1]))
    assert own_lines(p.stderr) == 1, p.stderr
    assert p.stderr.startswith(f"kbpctl: note: turned RPS off on {dev} in netns {ns} "
                               f"(rx-0: rps_cpus {orig} -> 0)"), p.stderr
    assert f"'kbpctl disable {dev} --netns {ns}' restores it" in p.stderr
    assert mask_cpus(rps_attr(ns, dev, "rps_cpus")) == []
    (c,) = rps_changes(bed)
    assert (c["key"]["attr"], c["old"], c["new"]) == ("queues/rx-0/rps_cpus", orig, "0")
    d = device_status(bed.status(), dev)
    assert d["keep_rps"] is False and d["problems"] == []
    assert (d["rps"]["on"], d["rps"]["cpus"], d["rps"]["rfs"]) == (False, [], False)
    assert [q["queue"] for q in d["rps"]["queues"]] == ["rx-0"]
    assert " off " in status_row(bed.kbpctl("status", "--netns", ns).stdout, dev)
    assert bed.ping(50)["ok"] >= 48

    # RPS back on behind kbpctl's back: status says so, and what to do
    set_rps_attr(ns, dev, "rps_cpus", cpu_mask(cpus))
    d = device_status(bed.status(), dev)
    assert d["rps"]["on"] and d["rps"]["cpus"] == cpus
    assert any(x.startswith("RPS is on (rx-0: rps_cpus") and "kbpctl apply" in x
               for x in d["problems"]), d["problems"]
    human = bed.kbpctl("status").stdout
    assert "RPS is on" in human and f"on: CPU{'s' if len(cpus) > 1 else ''}" in \
        status_row(human, dev)

    bed.kbpctl("disable", dev, "--netns", ns)
    assert rps_attr(ns, dev, "rps_cpus") == orig
    assert bed.snap() == before and bed.journals() == []


def test_keep_rps_leaves_it_on_and_warns(bed: Bed) -> None:
    """--keep-rps: the mask stays, enable warns on one line, status shows it kept, and the
    poller's packets really go to the RPS CPU's backlog (RPS IPIs to that CPU)."""
    ns, dev = bed.tb.server, bed.link.dev_b
    cpus = sysinfo.online_cpus()
    rps_cpu, poll_cpu = cpus[0], cpus[-1]
    set_rps_attr(ns, dev, "rps_cpus", cpu_mask([rps_cpu]))
    orig = rps_attr(ns, dev, "rps_cpus")
    before = bed.snap()
    bed.echo_server()

    p = bed.kbpctl("enable", dev, "--netns", ns, "--cpus", str(poll_cpu), "--keep-rps")
    assert own_lines(p.stderr) == 1, p.stderr
    assert p.stderr.startswith(f"kbpctl: warning: RPS stays on for {dev} in netns {ns} "
                               f"(--keep-rps: rx-0: rps_cpus {orig})"), p.stderr
    assert f"backlog softirq of CPU {rps_cpu}" in p.stderr
    assert rps_attr(ns, dev, "rps_cpus") == orig and rps_changes(bed) == []
    d = device_status(bed.status(), dev)
    assert d["keep_rps"] is True and d["problems"] == []
    assert (d["rps"]["on"], d["rps"]["cpus"]) == (True, [rps_cpu])
    assert d["rps"]["queues"][0]["rps_cpus"] == orig
    human = bed.kbpctl("status").stdout
    assert f"kept on: CPU {rps_cpu}" in status_row(human, dev)
    assert "RPS kept on (--keep-rps)" in human
    if rps_cpu != poll_cpu:
        ipis = received_rps()[rps_cpu]
        assert bed.ping(200)["ok"] >= 190
        assert received_rps()[rps_cpu] > ipis  # the poller handed packets to CPU 0's backlog

    bed.kbpctl("disable", dev, "--netns", ns)
    assert bed.snap() == before and bed.journals() == []


def test_rps_per_queue_masks_restored(bed: Bed) -> None:
    """Two receive queues with different masks (and an RFS flow table): each is turned off
    and each gets its own mask back."""
    from kbp.rps import mask_cpus, sock_flow_entries
    c, s = bed.tb.client, bed.tb.server
    access.cmd(["ip", "link", "add", "rpsc0", "netns", c, "numtxqueues", "2", "numrxqueues",
               "2", "type", "veth", "peer", "name", "rpss0", "netns", s, "numtxqueues", "2",
               "numrxqueues", "2"])
    for ns, dev in ((c, "rpsc0"), (s, "rpss0")):
        access.cmd(["ip", "link", "set", dev, "up"], ns=ns)
        access.cmd(["ethtool", "-K", dev, "gro", "on"], ns=ns)
    cpus = sysinfo.online_cpus()
    set_rps_attr(s, "rpss0", "rps_cpus", cpu_mask(cpus[:1]), q="rx-0")
    set_rps_attr(s, "rpss0", "rps_cpus", cpu_mask(cpus), q="rx-1")
    set_rps_attr(s, "rpss0", "rps_flow_cnt", "100", q="rx-1")
    before = snapshot("rpss0", s)
    rx1 = {"netns": s, "dev": "rpss0", "attr": "queues/rx-1/rps_flow_cnt"}
    assert setting(before, "sysfs", rx1) == "128"  # the kernel rounds up
    p = bed.kbpctl("enable", "rpss0", "--netns", s, "--cpus", "0")
    assert "turned RPS off on rpss0" in p.stderr and own_lines(p.stderr) == 1
    assert [mask_cpus(rps_attr(s, "rpss0", "rps_cpus", q)) for q in ("rx-0", "rx-1")] == \
        [[], []]
    rfs = sock_flow_entries() != 0  # RFS on globally: the flow table steers too
    assert rps_attr(s, "rpss0", "rps_flow_cnt", "rx-1") == ("0" if rfs else "128")
    assert sorted(x["key"]["attr"] for x in rps_changes(bed)) == \
        ["queues/rx-0/rps_cpus", "queues/rx-1/rps_cpus"] + \
        (["queues/rx-1/rps_flow_cnt"] if rfs else [])
    bed.kbpctl("disable", "--all")
    assert snapshot("rpss0", s) == before


def test_failed_enable_leaves_rps_as_it_was(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """An enable that fails after RPS was turned off rolls it back with the rest."""
    from kbp.backends import EnableRequest
    from kbp.backends.stock import StockBackend
    from kbp.errors import OperationFailed
    from kbp.system.journal import StateDir
    ns, dev = bed.tb.server, bed.link.dev_b
    set_rps_attr(ns, dev, "rps_cpus", cpu_mask(sysinfo.online_cpus()))
    before = bed.snap()

    def no_thread(*_a: object, **_k: object) -> None:
        raise OperationFailed(f"no NAPI thread of {dev} appeared")
    monkeypatch.setattr(StockBackend, "_wait_threads", no_thread)
    with pytest.raises(OperationFailed, match="every change was rolled back"):
        StockBackend(state=StateDir(bed.run_dir)).enable(
            EnableRequest([dev], netns=ns, cpus=[0]))
    assert bed.snap() == before and bed.journals() == []


def test_kmod_backend_turns_rps_off_too(bed: Bed) -> None:
    """The kmod backend (against a fake module: it cannot load here) on a real veth: RPS
    off before the attach, back on after the detach, and after a refused attach."""
    import errno as errno_

    from kbp.backends import EnableRequest
    from kbp.backends.kmod import KmodBackend
    from kbp.errors import OperationFailed
    from kbp.rps import mask_cpus
    from kbp.system.journal import StateDir

    from .test_kmod import FakeModule
    ns, dev = bed.tb.server, bed.link.dev_b
    set_rps_attr(ns, dev, "rps_cpus", cpu_mask(sysinfo.online_cpus()[:1]))
    orig = rps_attr(ns, dev, "rps_cpus")
    mod = FakeModule()
    be = KmodBackend(state=StateDir(bed.run_dir), client=mod)
    req = EnableRequest([dev], netns=ns, cpus=[0], rt_prio=0)

    mod.fail_attach = errno_.EBUSY
    with pytest.raises(OperationFailed, match="rolled back"):
        be.enable(req)
    assert rps_attr(ns, dev, "rps_cpus") == orig and bed.journals() == []

    mod.fail_attach = None
    (d,) = be.enable(req).devices
    assert d.rps_off and d.rps is not None and d.rps.summary() == f"rx-0: rps_cpus {orig}"
    assert mask_cpus(rps_attr(ns, dev, "rps_cpus")) == [] and dev in mod.attached
    (rec,) = be.state.records()
    assert [c.kind for c in rec.changes] == ["sysfs", "kmod_attach"]
    (ds,), _ = be.describe(ns, [dev], be.state.records())
    assert ds.rps is not None and not ds.rps.on and ds.keep_rps is False and not ds.problems
    be.disable([dev], ns)
    assert rps_attr(ns, dev, "rps_cpus") == orig and mod.attached == {}

    (d,) = be.enable(EnableRequest([dev], netns=ns, cpus=[0], rt_prio=0,
                                   keep_rps=True)).devices
    assert not d.rps_off and rps_attr(ns, dev, "rps_cpus") == orig
    (ds,), _ = be.describe(ns, [dev], be.state.records())
    assert ds.rps is not None and ds.rps.on and ds.keep_rps is True and not ds.problems
    be.disable([dev], ns)


def test_apply_turns_rps_off_and_keep_rps_in_the_config(bed: Bed, tmp_path: Path) -> None:
    ns, dev = bed.tb.server, bed.link.dev_b
    set_rps_attr(ns, dev, "rps_cpus", cpu_mask(sysinfo.online_cpus()[:1]))
    orig = rps_attr(ns, dev, "rps_cpus")
    before = bed.snap()
    cfg = tmp_path / "kbp.toml"
    dev_cfg = f'backend = "stock"\n[[device]]\nname = "{dev}"\nnetns = "{ns}"\ncpus = "0"\n'
    cfg.write_text(dev_cfg)
    p = bed.kbpctl("apply", "--config", str(cfg))
    assert ": enable (stock)" in p.stdout and f"turned RPS off on {dev}" in p.stderr
    assert rps_attr(ns, dev, "rps_cpus") != orig
    cfg.write_text(dev_cfg + "keep_rps = true\n")
    p = bed.kbpctl("apply", "--config", str(cfg))
    assert "reenable (stock): keep_rps changed" in p.stdout
    assert f"RPS stays on for {dev}" in p.stderr and rps_attr(ns, dev, "rps_cpus") == orig
    assert "in sync" in bed.kbpctl("apply", "--config", str(cfg)).stdout
    cfg.write_text('backend = "stock"\n')
    bed.kbpctl("apply", "--config", str(cfg))
    assert bed.snap() == before and bed.journals() == []


def test_isolate_moves_other_devices_rps_off_the_polling_cpu(bed: Bed) -> None:
    """--isolate (the exclusive-CPU remedy of issue 11): RPS of a device kbp does not serve
    (the client's end) that names the polling CPU loses that CPU while the server's end is
    enabled, journaled in the server's record; disable puts the exact mask back."""
    from kbp.rps import mask_cpus
    cpus = sysinfo.online_cpus()
    if len(cpus) < 2:
        pytest.skip(reason="--isolate needs a CPU without a poller: this machine has one CPU")
    poll = cpus[-1]
    other_ns, other = bed.tb.client, bed.link.dev_a
    set_rps_attr(other_ns, other, "rps_cpus", cpu_mask(cpus))
    orig = rps_attr(other_ns, other, "rps_cpus")
    p = bed.kbpctl("enable", bed.link.dev_b, "--netns", bed.tb.server, "--cpus", str(poll),
                   "--isolate")
    assert mask_cpus(rps_attr(other_ns, other, "rps_cpus")) == cpus[:-1], p.stderr
    moved = [c for c in rps_changes(bed) if c["key"]["dev"] == other]
    assert [(c["key"]["netns"], c["old"]) for c in moved] == [(other_ns, orig)]
    bed.kbpctl("disable", bed.link.dev_b, "--netns", bed.tb.server)
    assert rps_attr(other_ns, other, "rps_cpus") == orig
    p = bed.kbpctl("enable", bed.link.dev_b, "--netns", bed.tb.server, "--isolate",
                   expect=2)
    assert "give --cpus a subset, or drop --isolate" in p.stderr
    assert bed.journals() == []
