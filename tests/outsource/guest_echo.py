"""Run in the guest by test_guest_vm.py (not collected: no test_ prefix), before
guest_sockets.py: the operator's path. ``kbpctl outsource set --cgroup`` makes the UDP
sockets of an **unmodified** ``sockperf server`` in that cgroup outsourced ones; a host
client (``sockperf ping-pong`` in the VM's netns, run by the host side on request) gets its
answers through kbp-sod, one copy per datagram, without the guest's virtio-net or NET_RX;
a second sockperf server outside the cgroup keeps the guest's own stack and answers the
same client over the tap NIC; ``kbpctl outsource status`` names the socket's process and
its counters; ``clear`` puts socket() back.  On a kernel without the hook (6.1) the policy
is refused with that reason and only the stack path runs.

The host side reads ``$KBP_OUT/client.TAG.req`` (JSON: target, port) and answers with
``client.TAG.json`` (sockperf's message counts).  Prints KBP-SO-ECHO-OK at the end."""

import json
import os
import re
import subprocess
import sys
import time

from kbp.bench.sysstat import PROC, read_percpu_table

OUT = os.environ["KBP_OUT"]
CG = "/sys/fs/cgroup/kbp-so-echo"
TAP_IP = os.environ.get("KBP_SO_TAP_GUEST_IP", "10.78.0.2")
PREFIX = 24
PORT_SO, PORT_STACK = 11112, 11111
KBPCTL = [sys.executable, "-m", "kbp.cli"]


def kbpctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KBPCTL, *args], capture_output=True, text=True, check=False)


def proc_kbp_so() -> tuple[dict[str, str], list[dict[str, str]]]:
    head: dict[str, str] = {}
    socks = []
    with open("/proc/kbp_so") as f:
        for line in f:
            kind, *pairs = line.split()
            kv = dict(p.split("=", 1) for p in pairs if "=" in p)
            if kind == "kbp_so":
                head = kv
            elif kind == "sock":
                socks.append(kv)
    return head, socks


def so_socket(port: int) -> dict[str, str] | None:
    found = [s for s in proc_kbp_so()[1] if s["local"].endswith(f":{port}")]
    assert len(found) <= 1, found
    return found[0] if found else None


def nic_by_mac(mac: str) -> str:
    for dev in os.listdir("/sys/class/net"):
        with open(f"/sys/class/net/{dev}/address") as f:
            if f.read().strip() == mac:
                return dev
    raise AssertionError(f"no NIC with MAC {mac}")


def nic_counters(nic: str) -> dict[str, int]:
    virtio = os.path.basename(os.path.realpath(f"/sys/class/net/{nic}/device"))
    irqs = sum(sum(counts) for name, counts in read_percpu_table(PROC / "interrupts").items()
               if name.split()[-1].startswith(f"{virtio}-"))
    with open(f"/sys/class/net/{nic}/statistics/rx_packets") as f:
        rx = int(f.read())
    net_rx = sum(read_percpu_table(PROC / "softirqs")["NET_RX"])
    return {"irqs": irqs, "rx_packets": rx, "net_rx": net_rx}


def client(tag: str, target: str, port: int) -> dict[str, int]:
    """Ask the host side to run its client against target:port; its counts."""
    req, rsp = f"{OUT}/client.{tag}.req", f"{OUT}/client.{tag}.json"
    with open(req + ".tmp", "w") as f:
        json.dump({"target": target, "port": port}, f)
    os.rename(req + ".tmp", req)
    print(f"KBP-SO-CLIENT {tag} {target}:{port}", flush=True)
    end = time.monotonic() + 180
    while not os.path.exists(rsp):
        assert time.monotonic() < end, f"no answer from the host side for {tag}"
        time.sleep(0.1)
    time.sleep(0.1)
    with open(rsp) as f:
        out = json.load(f)
    print(f"KBP-SO-CLIENT-DONE {tag} {out}", flush=True)
    assert out["rc"] == 0 and out["received"] > 0, out
    return out


def server(port: int, ip: str, cgroup: str | None) -> subprocess.Popen[bytes]:
    cmd = f"exec sockperf server -i {ip} -p {port}"
    if cgroup:
        cmd = f"echo $$ > {cgroup}/cgroup.procs && {cmd}"
    return subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stack_path(nic: str, srv: subprocess.Popen[bytes]) -> None:
    """The unselected server answers over the tap: the guest's stack carries it."""
    before, socks0 = nic_counters(nic), proc_kbp_so()[1]
    got = client("stack", TAP_IP, PORT_STACK)
    after = nic_counters(nic)
    assert srv.poll() is None
    assert after["rx_packets"] - before["rx_packets"] >= got["sent"], (before, after, got)
    assert after["net_rx"] > before["net_rx"], (before, after)
    # and none of the outsourced sockets moved
    assert [s["copies"] for s in proc_kbp_so()[1]] == [s["copies"] for s in socks0]


#: what the outsourced sockets of this script moved in all: the host side checks the
#: daemon's counters (which hold the whole boot's traffic) against it
TOTAL = {"copies": 0, "bytes_in": 0, "bytes_out": 0}


def main() -> None:
    nic = nic_by_mac(os.environ["KBP_SO_TAP_MAC"])
    subprocess.run(["ip", "addr", "add", f"{TAP_IP}/{PREFIX}", "dev", nic], check=True)
    subprocess.run(["ip", "link", "set", nic, "up"], check=True)
    head, socks = proc_kbp_so()
    assert head["state"] == "attached" and head["sockets"] == "0", (head, socks)
    plain = server(PORT_STACK, TAP_IP, None)
    os.makedirs(CG, exist_ok=True)
    try:
        # refused before anything changes: a cgroup that does not exist
        r = kbpctl("outsource", "set", "--cgroup", "/sys/fs/cgroup/kbp-no-such-cgroup")
        assert r.returncode != 0 and "kbp-no-such-cgroup" in r.stderr, r
        r = kbpctl("outsource", "set", "--cgroup", CG)
        if r.returncode != 0:
            # only a kernel without the hook may refuse a good policy
            assert "update_socket_protocol" in r.stderr, r
            print(f"KBP-SO-ECHO-NO-HOOK {r.stderr.strip()}", flush=True)
            time.sleep(1.0)
            stack_path(nic, plain)
            return
        try:
            outsourced(nic, plain)
        finally:
            kbpctl("outsource", "clear")
    finally:
        plain.terminate()
        plain.wait()
        # the NIC back down: later scenarios count what the guest's NICs receive
        subprocess.run(["ip", "link", "set", nic, "down"], check=True)


def outsourced(nic: str, plain: subprocess.Popen[bytes]) -> None:
    srv = server(PORT_SO, "0.0.0.0", CG)
    try:
        end = time.monotonic() + 30
        while so_socket(PORT_SO) is None:  # sockperf's socket, made and bound through us
            assert srv.poll() is None, "sockperf server exited"
            assert time.monotonic() < end, proc_kbp_so()
            time.sleep(0.1)
        assert so_socket(PORT_STACK) is None  # the unselected one is not outsourced
        before, sock0 = nic_counters(nic), so_socket(PORT_SO)
        assert sock0 is not None
        got = client("so", "127.0.0.1", PORT_SO)
        after, sock1 = nic_counters(nic), so_socket(PORT_SO)
        assert sock1 is not None and srv.poll() is None
        TOTAL.update({k: int(sock1[k]) for k in TOTAL})  # the socket's whole life
        d = {k: int(sock1[k]) - int(sock0[k]) for k in ("copies", "bytes_in", "bytes_out")}
        print(f"KBP-SO-ECHO-COUNTS sent={got['sent']} received={got['received']} "
              f"sock={d} nic_before={before} nic_after={after}", flush=True)
        # every request the server received and every answer: one copy each (sockperf
        # stops counting at its deadline: the last answer may still be on its way)
        assert 0 <= got["sent"] - got["received"] <= 1, got
        assert d["copies"] == 2 * got["sent"], (d, got)
        assert d["bytes_in"] == d["bytes_out"] > 0, d
        # the guest's virtio-net and NET_RX did not grow with the messages
        assert after["rx_packets"] - before["rx_packets"] < max(5, got["sent"] // 20), (
            before, after)
        assert after["irqs"] - before["irqs"] < max(5, got["sent"] // 20), (before, after)
        assert after["net_rx"] - before["net_rx"] < max(10, got["sent"] // 10), (
            before, after)
        # status names the socket's process and says what /proc/kbp_so says
        st = kbpctl("outsource", "status", "--json")
        assert st.returncode == 0, st
        doc = json.loads(st.stdout)
        text = json.dumps(doc)
        assert str(srv.pid) in text and CG in text, text[:2000]
        # no traffic since sock1 was read: the same count, under the module's name
        assert re.search(rf'"copies": {sock1["copies"]}\b', text), text[:2000]
        stack_path(nic, plain)
    finally:
        srv.terminate()
        srv.wait()
    # the policy off: a new UDP socket in the cgroup is the guest's own again
    r = kbpctl("outsource", "clear")
    assert r.returncode == 0, r
    n0 = len(proc_kbp_so()[1])
    probe = subprocess.run(["sh", "-c", f"echo $$ > {CG}/cgroup.procs && exec "
                            f"{sys.executable} -c 'import socket,time; "
                            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                            "s.bind((\"127.0.0.1\", 0)); "
                            "open(\"/proc/kbp_so\").read().count(\"sock \") == "
                            f"{n0} or exit(3)'"], check=False)
    assert probe.returncode == 0, "a socket made after clear was outsourced"
    end = time.monotonic() + 10
    while proc_kbp_so()[1]:
        assert time.monotonic() < end, proc_kbp_so()
        time.sleep(0.1)
    assert proc_kbp_so()[0]["pinned_pages"] == "0", proc_kbp_so()


if __name__ == "__main__":
    main()
    print("KBP-SO-ECHO-TOTAL " + " ".join(f"{k}={v}" for k, v in TOTAL.items()), flush=True)
    print("KBP-SO-ECHO-OK", flush=True)
