"""Run in the guest by test_guest_vm.py (not collected): widely used UDP servers from Debian,
unmodified, in their packaged default configurations, with their sockets outsourced by the
policy (kbpctl outsource set, the BPF redirect; Linux 6.6+): dnsmasq (DNS forwarder:
wildcard sockets with IP_PKTINFO, SIOCGIFNAME on its interfaces) and ntpsec's ntpd (NTP:
a socket per address, SO_TIMESTAMPNS).  Both are started in the policy's cgroup; the host
side queries them in the VM's network namespace (where kbp-sod's sockets live) when it
reads KBP-SO-SERVERS-READY, and writes what it got into servers.verdict in the out dir.
Here: /proc/kbp_so lists their sockets, and the guest's NICs carried none of the queries.

Before issue 37, dnsmasq exited at start ("failed to find list of interfaces": SIOCGIFNAME
was EOPNOTSUPP) and would have needed IP_PKTINFO (ENOPROTOOPT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
CG = "/sys/fs/cgroup/kbpso-servers"
NTPSEC = Path(os.environ.get("KBP_SO_NTPSEC", ""))
OUT = Path(os.environ.get("KBP_SO_OUT", "/nonexistent"))


def kbpctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kbp.cli", "outsource", *args],
                          env={**os.environ, "PYTHONPATH": SRC}, capture_output=True,
                          text=True, check=False)


def rx_packets() -> dict[str, int]:
    return {d: int((Path("/sys/class/net") / d / "statistics/rx_packets").read_text())
            for d in os.listdir("/sys/class/net")}


def in_cgroup(argv: list[str]) -> subprocess.Popen[str]:
    """argv started as a member of the policy's cgroup (its sockets: protocol 253)."""
    return subprocess.Popen(["sh", "-c", f'echo $$ > {CG}/cgroup.procs && exec "$@"', "sh",
                             *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def main() -> None:
    assert NTPSEC.is_dir(), f"no ntpsec unpacked (KBP_SO_NTPSEC={NTPSEC}): scripts/setup.sh"
    os.makedirs(CG, exist_ok=True)
    Path("/var/lib/ntpsec").mkdir(parents=True, exist_ok=True)   # its default driftfile's
    p = kbpctl("set", "--cgroup", CG, "--family", "both")
    assert p.returncode == 0, p.stdout + p.stderr
    servers: list[subprocess.Popen[str]] = []
    try:
        rx0 = rx_packets()
        servers.append(in_cgroup(["dnsmasq", "-k", "--log-facility=-"]))
        servers.append(in_cgroup([str(NTPSEC / "usr/sbin/ntpd"), "-n", "-c",
                                  str(NTPSEC / "etc/ntpsec/ntp.conf")]))
        time.sleep(3)
        for s in servers:
            assert s.poll() is None, (s.args, s.communicate()[0][-3000:])
        with open("/proc/kbp_so") as f:
            socks = f.read().splitlines()[1:]
        ports = {ln.split(" local=")[1].split()[0].rsplit(":", 1)[1] for ln in socks
                 if " local=" in ln and "local=-" not in ln}
        print("KBP-SO-SERVERS-SOCKETS", sorted(ports), flush=True)
        assert {"53", "123"} <= ports, socks
        print("KBP-SO-SERVERS-READY", flush=True)
        verdict = OUT / "servers.verdict"
        end = time.monotonic() + 120
        while not verdict.exists():
            assert time.monotonic() < end, "the host never queried"
            time.sleep(0.2)
        got = json.loads(verdict.read_text())
        print("KBP-SO-SERVERS-VERDICT", got, flush=True)
        rx1 = rx_packets()
        # the queries came through kbp-sod: no guest NIC carried them
        nics = {d: rx1[d] - rx0.get(d, 0) for d in rx1 if d != "lo"}
        assert not any(nics.values()), nics
        for s in servers:
            assert s.poll() is None, (s.args, s.communicate()[0][-3000:])
    finally:
        for s in servers:
            s.terminate()
        for s in servers:
            try:
                out = s.communicate(timeout=20)[0]
            except subprocess.TimeoutExpired:
                s.kill()
                out = s.communicate()[0]
            print(f"--- {s.args[-1] if s.args else s}: {out[-1500:]}", flush=True)
        p = kbpctl("clear")
        print(p.stdout, p.stderr, flush=True)
    assert got.get("dns") == "127.0.0.1", got
    assert got.get("ntp_mode") == 4, got
    print("KBP-SO-SERVERS-OK", flush=True)


if __name__ == "__main__":
    main()
