"""What the exporter tests share: a scrape of /metrics over HTTP into samples, and whether
Debian 12's python3 with its packaged libraries (what the kbpctl package and the container
image run on) is here to run kbpctl."""

from __future__ import annotations

import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

#: (metric name, its labels) -> value
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
DEBIAN_PYTHON = "/usr/bin/python3"


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def debian_python_reason() -> str | None:
    """Why Debian 12's python3 with its python3-pyroute2, -rich and -prometheus-client
    cannot run kbpctl here; None when it can."""
    p = subprocess.run([DEBIAN_PYTHON, "-c", "import prometheus_client, pyroute2, rich; "
                        "print(prometheus_client.__file__)"], capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0 or not p.stdout.startswith("/usr/lib/python3/"):
        return ("Debian's python3-prometheus-client, -pyroute2 and -rich are not installed "
                "(scripts/setup.sh installs them)")
    return None
