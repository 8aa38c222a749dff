"""kbp.ko under everything real NICs and operators do to it, at once, under traffic.

Two ports of one test-NIC adapter (vm/testdata/kbp_test_nic) carry traffic on every queue
while a seeded random sequence of events runs for $KBP_STRESS_SECONDS (default 30, the
short form ``make test`` runs on 6.12 with SLUB debugging; ``make stress`` runs it for
$STRESS_MINUTES on every rig kernel):

* adapter-wide resets (every port's NAPIs deleted and added again at once, each port from
  its own work item, without rtnl) and single-port resets;
* channel changes (``ethtool -L``: NAPIs deleted and added under rtnl);
* reclassification (a port detached and attached again in the other poller class);
* detach and attach with a default CPU, or a queue map (the test NIC has no IRQ, so no
  CPU from one);
* ``rmmod kbp`` and a new load;
* on 6.17+, netlink ``napi-set threaded disabled`` on a port's NAPIs.

The ports are folded onto one CPU for half of the attaches (one poller each there), and
the reconcile work runs every 5 ms, so kbp's hooks race the deletions.  At the end every
port is attached again and must carry traffic through kbp; what is reported and asserted:
the events done, frames lost beyond the driver's own ring drops (0), frames reordered (0);
a kernel splat fails the run (the rig's check, with ``slub_debug=FZP`` in make test), a
hang fails it at the per-test timeout.  One ``KBP-STRESS {json}`` line on the console
carries the counts (``make stress`` collects them).
"""

from __future__ import annotations

import errno
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import POLL_CPU, load_module, module_loaded, sh, wait_for
from test_real_nic import (
    KERNEL,
    KO,
    PARAMS,
    hooked,
    kbp_carries,
    ktn_ports,
    reconcile_every,
    stats,
)

SECONDS = float(os.environ.get("KBP_STRESS_SECONDS", "30"))
SEED = int(os.environ.get("KBP_STRESS_SEED", "0")) or int(time.time())
PORTS = 2
QUEUES = 3

pytestmark = pytest.mark.skipif(not KO.exists(), reason="kbp_test_nic.ko not built "
                                "(python3 -m vm test builds every vm/testdata module)")


#: a command that hangs is left to the per-test watchdog, which dumps every task's state
#: and kernel stack before it fails the test (conftest.py)
HANG = SECONDS + 3600


def _console(line: str) -> None:
    with open("/dev/console", "w") as f:
        f.write(line + "\n")


class Stress:
    """The ports, what each is attached as, and the events done."""

    def __init__(self, kmod, devs: list[str], rng: random.Random) -> None:
        self.kmod = kmod
        self.devs = devs
        self.rng = rng
        self.done: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.ncpu = os.cpu_count() or 1

    # -- attachments -----------------------------------------------------------------
    def attach(self, dev: str) -> None:
        """One of the ways an operator attaches, chosen at random; a refusal the module
        gives for a state the stress made (a CPU's knobs taken by the other class's
        choice, a starved poller) is counted, not failed."""
        kind = self.rng.choice(["cpu", "fold", "map"])
        cls = self.rng.choice(["rt", "non-rt"])
        kw: dict[str, object] = {"mode": "hybrid", "cls": cls}
        if kind in ("cpu", "fold"):
            kw["cpu"] = POLL_CPU if kind == "fold" else self.rng.randrange(self.ncpu)
        else:
            kw["queue_map"] = {i: self.rng.randrange(self.ncpu) for i in range(QUEUES)}
        try:
            self.kmod.attach(dev, **kw)
            self.done[f"attach-{kind}"] += 1
        except self.kmod.KbpError as e:
            # EOPNOTSUPP: a reset has every queue down at that instant
            if e.errno not in (errno.EBUSY, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            self.refused[f"attach-{kind}: {e.message}"] += 1

    def detach(self, dev: str) -> None:
        try:
            self.kmod.detach(dev)
        except self.kmod.KbpError as e:
            if e.errno != errno.ENOENT:
                raise

    # -- events ------------------------------------------------------------------------
    def ev_adapter_reset(self) -> None:
        (PARAMS / "adapter_reset").write_text(str(self.rng.randint(1, 4)))

    def ev_port_reset(self) -> None:
        dev = self.rng.choice(self.devs)
        Path(f"/sys/class/net/{dev}/ktn/reset").write_text(str(self.rng.randint(1, 3)))

    def ev_channels(self) -> None:
        dev = self.rng.choice(self.devs)
        sh(f"ethtool -L {dev} combined {self.rng.randint(1, QUEUES)}", timeout=HANG)

    def ev_reattach(self) -> None:
        dev = self.rng.choice(self.devs)
        self.detach(dev)
        self.attach(dev)

    def ev_rmmod(self) -> None:
        sh("rmmod kbp", timeout=HANG)
        load_module()
        for dev in self.devs:
            self.attach(dev)

    def ev_threaded_off(self) -> None:
        """`napi-set threaded disabled` on a device's NAPIs; a NAPI that a reset deleted
        since the listing is gone (ENOENT), as for any netlink user: counted, not a fault."""
        from pyroute2.netlink.exceptions import NetlinkError
        from test_kernel72 import napi_set_threaded, napis_of
        for n in napis_of(self.rng.choice(self.devs)):
            try:
                napi_set_threaded(n.id, "disabled")
            except NetlinkError as e:
                if e.code != errno.ENOENT:
                    raise
                self.refused["threaded_off: NAPI gone (ENOENT)"] += 1

    def events(self) -> list[str]:
        evs = ["adapter_reset", "port_reset", "channels", "reattach", "reattach", "rmmod"]
        if KERNEL >= (6, 17):
            evs.append("threaded_off")
        return evs

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        evs = self.events()
        while time.monotonic() < end:
            ev = self.rng.choice(evs)
            getattr(self, f"ev_{ev}")()
            self.done[ev] += 1
            time.sleep(self.rng.uniform(0.0, 0.2))

    # -- the end ---------------------------------------------------------------------
    def settle(self) -> None:
        """Resets done, every port back to all its queues and attached on POLL_CPU's
        pollers (one each), each carrying traffic through kbp."""
        wait_for(lambda: int((PARAMS / "adapter_reset").read_text()) == 0 and all(
            int(Path(f"/sys/class/net/{d}/ktn/reset").read_text()) == 0
            for d in self.devs), 120, step=0.2, what="the resets to finish")
        if not module_loaded():
            load_module()
        for dev in self.devs:
            self.detach(dev)
            sh(f"ethtool -L {dev} combined {QUEUES}")
            self.kmod.attach(dev, cpu=POLL_CPU, mode="hybrid", cls="rt")
        for dev in self.devs:
            wait_for(lambda d=dev: hooked(self.kmod, d, QUEUES), 20, what=f"{dev} hooked")
            kbp_carries(dev)

    def losses(self) -> dict[str, int]:
        lost = reordered = delivered = dropped = 0
        for dev in self.devs:
            for q in stats(dev)[1].values():
                lost += q["gaps"] - q["ring_dropped"]
                reordered += q["reorders"]
                delivered += q["delivered"]
                dropped += q["ring_dropped"]
        return {"lost": lost, "reordered": reordered, "delivered": delivered,
                "ring_dropped": dropped}


@pytest.mark.timeout(SECONDS + 300)
def test_stress(kmod) -> None:
    rng = random.Random(SEED)
    cpus = ",".join(str(i % (os.cpu_count() or 1)) for i in range(QUEUES))
    with reconcile_every(5), ktn_ports(PORTS, queues=QUEUES, cpus=cpus, rate=2000) as devs:
        _console(f"KBP-STRESS-SEED {SEED}")
        s = Stress(kmod, devs, rng)
        for dev in devs:
            s.attach(dev)
        t0 = time.monotonic()
        s.run(SECONDS)
        s.settle()
        took = time.monotonic() - t0
        out = {"kernel": os.uname().release, "seed": SEED, "seconds": round(took, 1),
               "events": sum(v for k, v in s.done.items() if not k.startswith("attach-")),
               "done": dict(s.done), "refused": dict(s.refused), **s.losses()}
        _console("KBP-STRESS " + json.dumps(out, sort_keys=True))
        assert out["lost"] == 0 and out["reordered"] == 0, out
        assert out["events"] > 0, out
