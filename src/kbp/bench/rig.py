"""``kbpctl bench vm``: the benchmark, and the rig's experiments, in QEMU guests of the VM rig.

One entry point for everything that measures kbp.ko (which this host cannot load): the
bench's own scenarios run inside one guest with kbp.ko loaded (``--scenario shared-cpu``
...), and the rig's experiments, which need what the bench's testbed does not have (the test
NIC's in-kernel heavy flow, a third NIC on the hub, the test cpufreq driver, several guests
with kbp-sod), run by name the same way (``--scenario class-split`` ...).  Every option this
command does not know goes to the scenario or the experiment unchanged, so each one's own
``--help`` stays the reference (``kbpctl bench vm --scenario class-split -- --help``).

Guest timings are emulated (QEMU TCG here): compare modes within one run; counts (packets,
interrupts, wake-ups) and CPU time are real.  Runs from a kbp checkout (the rig's kernels and
the experiments live beside the package, not in it).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

#: one guest's vCPUs and timeout (s) unless told otherwise
GUEST_SMP, GUEST_TIMEOUT = 2, 3600

#: the third NIC on the rig's hub (MAC :02) that the inversion experiment floods from
_FLOOD_NIC = ("-netdev", "hubport,id=n2,hubid=0",
              "-device", "virtio-net-pci,netdev=n2,mac=52:54:00:4b:50:02")


@dataclass(frozen=True)
class Experiment:
    """A rig experiment: ``vm/experiments/<module>.py``, run in one guest (``guest``) or
    driving its own guests from the host (``host``)."""

    module: str
    where: str
    what: str
    verb: tuple[str, ...] = ()          # its sub-command for a measurement, if it has them
    qemu: tuple[str, ...] = ()          # extra QEMU arguments (guest experiments)


EXPERIMENTS: dict[str, Experiment] = {
    "class-split": Experiment(
        "class_split", "guest",
        "RT and non-RT receive work on one CPU: kbp.ko's non-rt class against napi, the stock "
        "NAPI thread and an exclusive CPU, the heavy flow from the test NIC (--quotas: the "
        "non-rt quota sweep)"),
    "inversion": Experiment(
        "inversion", "guest",
        "softirq-lock inversion and foreign softirq work in kbp's poller under a flood on "
        "another NIC (PREEMPT_RT kernels; adds the third NIC on the rig's hub)",
        verb=("run",), qemu=_FLOOD_NIC),
    "freq": Experiment(
        "freq_measure", "guest",
        "freq_ctl: time in each CPU frequency, idle and under bursts (the test cpufreq "
        "driver)"),
    "outsource-rtt": Experiment(
        "outsource_rtt", "host",
        "an RT server's round trip through an outsourced socket (kbp_so, kbp-sod) against "
        "the guest's stack, napi and kbp, in one guest"),
    "outsource-scale": Experiment(
        "outsource_scale", "host",
        "N RT guests at once, each beside a heavy non-RT flow: round trip, interrupts and host "
        "CPU per way of reaching the RT server (--guests 1,2,4)"),
}


class RigError(Exception):
    """A refused request, with what to do instead."""


def checkout() -> Path:
    """The kbp checkout this package runs from (its ``vm/`` beside ``src/``)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "vm" / "experiments").is_dir():
        raise RigError(f"runs from a kbp checkout: no vm/experiments under {root} (this kbp "
                       "is installed, not checked out)")
    return root


def help_text(bench_scenarios: dict[str, str]) -> str:
    rows = []
    for name, what in [*((n, f"[bench] {w}") for n, w in bench_scenarios.items()),
                       *((n, f"[{e.where}] {e.what}") for n, e in EXPERIMENTS.items())]:
        lines = textwrap.wrap(what, 78, break_on_hyphens=False) or [""]
        rows += [f"  {name:<16} {lines[0]}", *(" " * 19 + x for x in lines[1:])]
    return (__doc__ or "").split("\n\n", 1)[1] + "\nScenarios (--scenario):\n" + "\n".join(
        rows) + ("\n\n[bench]: kbp.bench in one guest with kbp.ko loaded (its statistics, "
                 "results.json and report); [guest]: an experiment in one guest with the "
                 "flavour's kernel; [host]: an experiment that boots its own guests (root on "
                 "the host: taps, namespaces).")


def parser(bench_scenarios: dict[str, str]) -> argparse.ArgumentParser:
    vp = argparse.ArgumentParser(prog="kbpctl bench vm", description=help_text(bench_scenarios),
                                 allow_abbrev=False,   # an experiment's --o... is its own
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    vp.add_argument("--scenario", default=None, metavar="NAME",
                    help="a bench scenario (default: the bench's) or a rig experiment above")
    vp.add_argument("--flavour", default="6.12-amd64", help="the rig kernel (default %(default)s)")
    vp.add_argument("--out", type=Path, default=None, help="where results land on the host")
    vp.add_argument("--timeout", type=int, default=None, metavar="S",
                    help=f"the guest's timeout (default {GUEST_TIMEOUT} s)")
    vp.add_argument("--smp", type=int, default=None, metavar="N",
                    help=f"the guest's vCPUs (default {GUEST_SMP}; 4 gives every role its own "
                         "CPU)")
    vp.add_argument("--nic-pair", action="store_true",
                    help="bench scenarios: carry the RT flow over the rig's two hub-joined "
                         "virtio NICs (tester: $KBP_NIC1, server: $KBP_NIC0): real virtio "
                         "interrupts, so busy and hybrid meet the shared-cpu contention too")
    return vp


def _vm_run(a: argparse.Namespace, out: Path, src: Path, qemu: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "vm", "run", a.flavour, "--build", "--out", str(out),
            "--timeout", str(a.timeout or GUEST_TIMEOUT), "--smp", str(a.smp or GUEST_SMP),
            "--env", f"PYTHONPATH={src}",
            *(f"--qemu-arg={q}" for q in qemu), "--"]


def command(a: argparse.Namespace, rest: list[str], out: Path, root: Path) -> list[str]:
    """The command that runs ``a.scenario`` (validated here, before anything starts)."""
    rest = rest[1:] if rest[:1] == ["--"] else rest
    src = root / "src"
    exp = EXPERIMENTS.get(a.scenario or "")
    if exp is None:
        inner = shlex.join([".venv/bin/python", "-m", "kbp.bench", "--emulated", *(
            ["--scenario", a.scenario] if a.scenario else []), *rest]) + ' --out "$KBP_OUT"' + (
            ' --nic-pair "$KBP_NIC1,$KBP_NIC0"' if a.nic_pair else "")
        return [*_vm_run(a, out, src, ()), "sh", "-c",
                f'insmod "$KBP_KO" && modprobe veth && {inner}']
    if a.nic_pair:
        raise RigError(f"--nic-pair is the bench scenarios'; {a.scenario} sets up its own NICs")
    mod = ["-m", f"vm.experiments.{exp.module}", *exp.verb]
    if exp.where == "guest":
        return [*_vm_run(a, out, src, exp.qemu), ".venv/bin/python", *mod, *rest]
    given = [o for o, v in (("--smp", a.smp), ("--timeout", a.timeout)) if v is not None]
    if given:
        raise RigError(f"{' and '.join(given)}: for one guest; {a.scenario} boots its own "
                       f"guests and sizes them itself: kbpctl bench vm --scenario {a.scenario} "
                       "-- --help")
    return [sys.executable, *mod, "--flavour", a.flavour, "--out", str(out), *rest]


def run(argv: list[str], bench_scenarios: dict[str, str], default_out: Path) -> int:
    vp = parser(bench_scenarios)
    a, rest = vp.parse_known_args(argv)
    if a.scenario is not None and a.scenario not in bench_scenarios and \
            a.scenario not in EXPERIMENTS:
        vp.error(f"unknown scenario {a.scenario!r}: bench scenarios "
                 f"{', '.join(bench_scenarios)}; rig experiments {', '.join(EXPERIMENTS)}")
    try:
        root = checkout()
        out = (a.out or default_out).resolve()
        cmd = command(a, rest, out, root)
    except RigError as e:
        print(f"kbpctl bench vm: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    print(f"running: {shlex.join(cmd)}", file=sys.stderr)
    return subprocess.run(cmd, cwd=root).returncode
