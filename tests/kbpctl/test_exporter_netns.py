"""``kbpctl exporter`` scraped over HTTP on loopback while real counters move: a veth pair
in two netns (kbp.bench.testbed, named kbpx-*), the server side enabled with the stock backend,
UDP ping-pong through it; then the device deleted under the exporter, then disabled."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import UserKbpctl, netns_skip_reason
from .promclient import Samples, scrape
from .test_integration import KBPCTL, Bed, new_bed

pytestmark = [pytest.mark.netns, pytest.mark.root,
              pytest.mark.skipif(netns_skip_reason() is not None,
                                 reason=netns_skip_reason() or "")]

@pytest.fixture
def kbpx_bed() -> Iterator[Bed]:
    """test_integration's Bed on namespaces and veths named kbpx-*."""
    with new_bed("kbpx") as b:
        yield b


@contextlib.contextmanager
def exporter(bed: Bed, user: UserKbpctl | None = None,
             said: list[str] | None = None) -> Iterator[str]:
    """``kbpctl exporter --listen 127.0.0.1:0`` (as ``user``: uid 65534); yields its
    /metrics URL (from stderr); the lines before it go to ``said``."""
    argv, env, cwd = (KBPCTL, bed.env, None) if user is None else \
        (user.argv, user.env(bed.env), user.cwd)
    p = subprocess.Popen([*argv, "exporter", "--listen", "127.0.0.1:0"], env=env, cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        line = ""
        while not line.startswith("kbpctl exporter: serving "):
            if line and said is not None:
                said.append(line)
            ready, _, _ = select.select([p.stderr], [], [], 30)
            line = p.stderr.readline() if ready else ""
            assert line, "the exporter said nothing for 30 s, or exited"
        assert line.startswith("kbpctl exporter: serving http://127.0.0.1:"), line
        yield line.split()[-1]
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert "Traceback" not in err, err


def pick(samples: Samples, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(lab), v) for (n, lab), v in samples.items()
            if n == name and all(dict(lab).get(k) == w for k, w in labels.items())]


def one(samples: Samples, name: str, **labels: str) -> float:
    got = pick(samples, name, **labels)
    assert len(got) == 1, (name, labels, got)
    return got[0][1]


def test_scrape_while_counters_move(kbpx_bed: Bed) -> None:
    bed = kbpx_bed
    dev, ns = bed.link.dev_b, bed.tb.server
    bed.echo_server()
    bed.kbpctl("enable", dev, "--netns", ns, "--backend", "stock", "--cpus", "1")
    served = {"device": dev, "netns": ns, "backend": "stock", "mode": "hybrid", "class": "rt"}
    with exporter(bed) as url:
        s0 = scrape(url)
        assert one(s0, "kbp_up") == 1
        assert one(s0, "kbp_device_enabled", state="serving", **served) == 1
        assert one(s0, "kbp_problems", kind="device_gone") == 0
        res = bed.ping(300)
        assert res["ok"] >= 290, res
        s1 = scrape(url)
        grew = one(s1, "kbp_device_packets_total", **served) - \
            one(s0, "kbp_device_packets_total", **served)
        assert grew >= 290, grew
        (th0, cpu0), = pick(s0, "kbp_napi_thread_poll_seconds_total", device=dev, netns=ns)
        (th1, cpu1), = pick(s1, "kbp_napi_thread_poll_seconds_total", device=dev, netns=ns)
        assert th0 == th1 and th1["cpu"] == "1" and th1["comm"].startswith(f"napi/{dev}-")
        assert cpu1 > cpu0   # the NAPI thread did the receive work
        assert one(s1, "kbp_napi_thread_sleeps_total", device=dev) > \
            one(s0, "kbp_napi_thread_sleeps_total", device=dev)
        assert one(s1, "kbp_napi_thread_rt_priority", device=dev) == 50
        assert all(v == 0 for _, v in pick(s1, "kbp_exporter_errors_total"))

        # the device vanishes under the exporter: its series say so, the scrape goes on
        subprocess.run(["ip", "-n", ns, "link", "del", dev], check=True, timeout=30)
        for _ in range(50):   # the NAPI thread exits a little after the device goes
            s2 = scrape(url)
            if pick(s2, "kbp_device_enabled", state="degraded", **served):
                break
            time.sleep(0.1)
        assert one(s2, "kbp_up") == 1
        assert one(s2, "kbp_device_enabled", state="degraded", **served) == 1
        assert one(s2, "kbp_problems", kind="device_gone") == 1
        assert not pick(s2, "kbp_device_packets_total", device=dev)
        assert not pick(s2, "kbp_napi_thread_poll_seconds_total", device=dev)
        assert all(v == 0 for _, v in pick(s2, "kbp_exporter_errors_total"))

        bed.kbpctl("disable", dev, "--netns", ns)
        s3 = scrape(url)
        assert not pick(s3, "kbp_device_enabled", device=dev)   # not served, other netns
        assert one(s3, "kbp_problems", kind="device_gone") == 0


def test_not_root_serves_what_it_can_read(kbpx_bed: Bed, user_kbpctl: UserKbpctl) -> None:
    """As uid 65534: the served device from the journal, its NAPIs (in another netns) not,
    counted as needs_root problems; the exporter says what it cannot read."""
    import prometheus_client
    pc = Path(prometheus_client.__file__).parent
    dst = user_kbpctl.target / pc.name
    if not dst.exists():  # an installed kbp whose metadata predates the dependency
        shutil.copytree(pc, dst)   # copies (never over the fixture's hard links)
        for d, _dirs, files in os.walk(dst):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
    bed = kbpx_bed
    dev, ns = bed.link.dev_b, bed.tb.server
    bed.kbpctl("enable", dev, "--netns", ns, "--backend", "stock", "--cpus", "1")
    said: list[str] = []
    with exporter(bed, user_kbpctl, said) as url:
        s = scrape(url)
    assert len(said) == 1 and said[0].startswith("kbpctl exporter: note: not root: "), said
    assert "needs_root" in said[0]
    assert one(s, "kbp_up") == 1
    assert one(s, "kbp_device_enabled", device=dev, netns=ns, backend="stock",
               state="degraded") == 1
    assert one(s, "kbp_problems", kind="needs_root") >= 1
    assert not pick(s, "kbp_napi_info", device=dev)
    assert all(v == 0 for _, v in pick(s, "kbp_exporter_errors_total"))
