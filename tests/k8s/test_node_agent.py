"""The DaemonSet's entrypoint, contrib/kubernetes/image/kbp-node-agent, run for real on this
machine's kernel, outside a container: a veth pair in two network namespaces
(kbp.bench.testbed), a kbp.toml naming both ends with the stock backend, kbpctl's journal in a
private directory (KBP_RUN_DIR). It must apply the file (kbpctl status shows both devices
served as the file says), serve kbp_ metrics, follow an edit of the file without a restart,
and on SIGTERM restore every setting exactly (kbpctl snapshot before and after) and exit 0.
Its refusals: an invalid config, a config that asks for the kbp module where it is not
loaded, a device apply cannot serve; each exits non-zero with one clear message, changing
nothing (or restoring what it changed)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kbpctl.promclient import DEBIAN_PYTHON, Samples, debian_python_reason, scrape

from kbp.snapshot import snapshot
from kbp.sysinfo import online_cpus

from .schemas import K8S

AGENT = K8S / "image/kbp-node-agent"
KBPCTL = [sys.executable, "-m", "kbp.cli"]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the node agent changes kernel settings and needs root"
    if shutil.which("ip") is None or shutil.which("ethtool") is None:
        return "iproute2 and ethtool are needed (apt-get install iproute2 ethtool)"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")



@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]

    def said(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        """The first line of the log that holds ``text`` (waiting for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.said().splitlines():
                if text in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} in the agent's output (exit "
                             f"{self.proc.poll()}):\n{self.said()}")

    def url(self) -> str:
        return self.wait_for("exporter serving http://").split()[-1]

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the agent did not stop within {timeout} s:\n"
                                 f"{self.said()}") from None

    def kbpctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*KBPCTL, *args], env=self.env, capture_output=True, text=True,
                              timeout=60)

    def status(self) -> dict[str, Any]:
        p = self.kbpctl("status", "--json")
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)  # type: ignore[no-any-return]


SRC = str(Path(__file__).resolve().parents[2] / "src")


@contextlib.contextmanager
def agent(tmp: Path, config: Path, *args: str, python: str = "venv") -> Iterator[Agent]:
    """The entrypoint script, the exporter on a free loopback port; with this venv's Python,
    or (``python="debian"``) as the image runs it: Debian's python3 and Debian's libraries,
    kbp from this tree. Whatever it leaves enabled is restored on the way out, also when a
    test fails."""
    env = {**os.environ, "KBP_RUN_DIR": str(tmp / "run"), "KBP_PYTHON": sys.executable}
    if python == "debian":
        env.update(KBP_PYTHON=DEBIAN_PYTHON, PYTHONPATH=SRC, PYTHONNOUSERSITE="1")
    log = tmp / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["sh", str(AGENT), "--config", str(config), "--address",
                                 "127.0.0.1", "--port", "0", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    a = Agent(proc, log, env)
    try:
        yield a
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run([*KBPCTL, "disable", "--all"], env=env, capture_output=True, timeout=120)


def one(samples: Samples, name: str, **labels: str) -> float:
    got = [v for (n, lab), v in samples.items()
           if n == name and all(dict(lab).get(k) == w for k, w in labels.items())]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def served(st: dict[str, Any], dev: str, netns: str) -> dict[str, Any] | None:
    for d in st["devices"]:
        if d["name"] == dev and d.get("netns") == netns and d.get("backend"):
            return d  # type: ignore[no-any-return]
    return None


def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


# -- the real thing: apply, serve, follow an edit, restore on SIGTERM -------------------------
@pytest.mark.netns
@pytest.mark.root
@pytest.mark.parametrize("python", ["venv", "debian"])
def test_applies_serves_follows_edits_and_restores_on_sigterm(tmp_path: Path,
                                                              python: str) -> None:
    """With the venv's Python and libraries, and with Debian 12's (the image's: pyroute2
    0.7.2, prometheus-client 0.16)."""
    from kbp.bench import testbed
    if python == "debian" and (why := debian_python_reason()):
        pytest.skip(reason=why)
    cpu = online_cpus()[-1]
    with testbed.Testbed(prefix="kbpk") as tb:
        link = tb.links[0]
        devs = [(link.dev_b, tb.server), (link.dev_a, tb.client)]
        before = {d: snapshot(d, ns) for d, ns in devs}
        entries = "".join(f'\n[[device]]\nname = "{d}"\nnetns = "{ns}"\n' for d, ns in devs)
        cfg = tmp_path / "kbp.toml"
        head = (f'backend = "stock"\n[defaults]\nmode = "hybrid"\ncpus = "{cpu}"\n'
                "rt_prio = 50\nlinger_us = 20\n")
        cfg.write_text(head + entries)
        with agent(tmp_path, cfg, "--watch", "1", python=python) as a:
            url = a.url()
            # applied: both ends served as the file says
            st = until(lambda: all(served(a.status(), d, ns) for d, ns in devs) and a.status(),
                       20, "both devices served")
            for d, ns in devs:
                got = served(st, d, ns)
                assert got is not None
                assert (got["backend"], got["mode"]) == ("stock", "hybrid"), got
                assert got["cpus"] == [cpu] and not got.get("problems"), got
                now = snapshot(d, ns)
                assert now != before[d]
                sched, aff = now["settings"]["sched"], now["settings"]["affinity"]
                assert [(t["policy"], t["priority"]) for t in sched.values()] == \
                    [("SCHED_FIFO", 50)] * len(now["napis"]), now
                assert list(aff.values()) == [[cpu]] * len(now["napis"]), now
            # served over HTTP: kbp_ metrics of these devices, and what the file asks for
            m = scrape(url)
            assert one(m, "kbp_up") == 1
            assert one(m, "kbp_module_loaded") == 0
            assert one(m, "kbp_backend_required", backend="stock") == 1
            assert one(m, "kbp_backend_required", backend="kmod") == 0
            for d, ns in devs:
                assert one(m, "kbp_device_enabled", device=d, netns=ns, state="serving") == 1
            assert one(m, "kbp_exporter_errors_total", section="config") == 0
            # an edit of the file (a ConfigMap update) converges without a restart
            cfg.write_text(head + entries.split("\n\n")[0] + "\n")
            d, ns = devs[1]
            until(lambda: not served(a.status(), d, ns), 20, "the dropped device disabled")
            assert snapshot(d, ns) == before[d]
            assert served(a.status(), *devs[0]) and a.proc.poll() is None
            # SIGTERM: apply stopped, disable --all, exit 0, everything as it was
            t0 = time.monotonic()
            rc = a.stop()
            assert rc == 0, a.said()
            assert time.monotonic() - t0 < 20
            said = a.said()
            assert "running kbpctl disable --all" in said and "the node is restored" in said
            assert "Traceback" not in said, said
            for d, ns in devs:
                assert snapshot(d, ns) == before[d]
            assert not list((tmp_path / "run").rglob("*.jsonl"))
            assert not any(x.get("backend") for x in a.status()["devices"])


def _apply_pids(config: Path) -> list[int]:
    """kbpctl apply --watch processes converging to ``config``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"apply" in argv and str(config).encode() in argv:
            pids.append(int(d.name))
    return pids


@pytest.mark.root
def test_apply_does_not_outlive_a_killed_agent(tmp_path: Path) -> None:
    """An agent killed outright (SIGKILL, the OOM killer) takes its apply --watch with it
    (PR_SET_PDEATHSIG): before, the child, in its own session, went on converging a node
    that nothing watched any more (found orphaned on this machine after an interrupted
    test run)."""
    cfg = tmp_path / "kbp.toml"
    cfg.write_text('backend = "stock"\n')
    with agent(tmp_path, cfg, "--watch", "1") as a:
        a.wait_for("running kbpctl apply")
        pids = until(lambda: _apply_pids(cfg), 20, "kbpctl apply running")
        a.proc.kill()
        a.proc.wait()
        until(lambda: not _apply_pids(cfg), 20, f"apply {pids} to exit with its agent")


# -- the refusals ----------------------------------------------------------------------------
def run_agent(tmp: Path, toml: str, *args: str, timeout: float = 30) -> tuple[int, str]:
    cfg = tmp / "kbp.toml"
    cfg.write_text(toml)
    with agent(tmp, cfg, *args) as a:
        try:
            rc = a.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent still runs after {timeout} s:\n{a.said()}") \
                from None
        return rc, a.said()


@pytest.mark.root
def test_an_invalid_config_exits_2_changing_nothing(tmp_path: Path) -> None:
    rc, said = run_agent(tmp_path, 'backend = "stock"\n[[device]]\nnmae = "eth1"\n')
    assert rc == 2, said
    assert "kbp-node-agent: the config is invalid:" in said and "nmae" in said
    assert "nothing changed" in said and "exporter serving" not in said
    assert not (tmp_path / "run").exists()


def module_loaded() -> bool:
    return Path("/sys/module/kbp").exists()


@pytest.mark.root
@pytest.mark.skipif(module_loaded(), reason="the kbp module is loaded on this machine")
def test_module_asked_for_and_absent_exits_69_saying_so(tmp_path: Path) -> None:
    rc, said = run_agent(tmp_path, 'backend = "kmod"\n[[device]]\nname = "eth1"\n',
                         "--module-wait", "0")
    assert rc == 69, said
    assert ("asks for backend kmod (eth1), but the kbp module is not loaded on this node: "
            "nothing changed") in said
    assert "kbpctl apply" not in said and not (tmp_path / "run").exists()


@pytest.mark.root
@pytest.mark.skipif(module_loaded(), reason="the kbp module is loaded on this machine")
def test_while_it_waits_for_the_module_the_metrics_say_so(tmp_path: Path) -> None:
    """What the alert KbpModuleNotLoaded reads: kbp_backend_required{backend="kmod"} 1 and
    kbp_module_loaded 0, served while the agent waits for KMM; SIGTERM then ends the wait
    (exit 0, the disable finding nothing to restore)."""
    cfg = tmp_path / "kbp.toml"
    cfg.write_text('backend = "kmod"\n[[device]]\nname = "eth1"\n')
    with agent(tmp_path, cfg, "--module-wait", "60") as a:
        url = a.url()
        a.wait_for("waiting up to 60 s for it")
        m = scrape(url)
        assert one(m, "kbp_backend_required", backend="kmod") == 1
        assert one(m, "kbp_module_loaded") == 0
        assert a.stop() == 0, a.said()
        assert "nothing is enabled" in a.said() and "kbpctl apply" not in a.said()


@pytest.mark.root
@pytest.mark.netns
def test_apply_that_fails_restores_and_exits_nonzero(tmp_path: Path) -> None:
    rc, said = run_agent(tmp_path, 'backend = "stock"\n[[device]]\nname = "kbpk-nosuch0"\n',
                         "--watch", "1")
    assert rc == 2, said
    assert "no device kbpk-nosuch0" in said
    assert "kbpctl apply stopped by itself (exit 2): restoring the node" in said
    assert "the node is restored" in said


@pytest.mark.root
def test_exporter_port_taken_exits_1_changing_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = tmp_path / "kbp.toml"
        cfg.write_text('backend = "stock"\n')
        env = {**os.environ, "KBP_RUN_DIR": str(tmp_path / "run"), "KBP_PYTHON": sys.executable}
        p = subprocess.run(["sh", str(AGENT), "--config", str(cfg), "--port", str(port)],
                           env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1, p.stderr
    assert "the port is in use" in p.stderr and "nothing changed" in p.stderr
    assert not (tmp_path / "run").exists()
