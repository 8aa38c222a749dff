"""Command line of the VM rig: ``python3 -m vm SUBCOMMAND ...`` (run from the repo root)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from vm import build, fetch, flavours, mqnic, outsource, paths, run, testcmd
from vm.util import EXIT_RIG, PROG, RigError, note

DESCRIPTION = f"""\
Boot Debian kernels under QEMU (TCG) to build, load and test the kbp module.

The guest mounts the host's / read-only over virtio-9p with a tmpfs overlay on top, so
every host tool (python3, the repo's .venv, pytest, iproute2, ethtool, sockperf, iperf3)
is there at its usual path and the command runs in the same directory as on the host.
Writes in the guest go to RAM and vanish at power-off (use --out DIR to keep files).

flavours: {", ".join(flavours.FLAVOURS)}  (each is resolved to the newest Debian
          package on the mirror; nothing is installed on the host)
cache:    $KBP_VM_CACHE, else <repo>/.cache/vm  (now: {paths.cache_root()})

typical use:
  python3 -m vm setup                       # apt-install what the rig needs (root)
  python3 -m vm test                        # all flavours: fetch, build, boot, pytest
  python3 -m vm test 6.12-rt-amd64 -- -k smoke -x
  python3 -m vm run 6.1-amd64 --build -- sh -c 'insmod $KBP_KO && dmesg | tail'
  python3 -m vm run 6.12-amd64 -- ip -br link

exit status: the guest command's status for run; 1 if any flavour failed for test;
  {run.EXIT_SPLAT} command ok but kernel splat, {run.EXIT_TIMEOUT} timeout,
  {EXIT_RIG} the rig failed (download, build, boot), 128+N killed by signal N (130 Ctrl-C).
"""

RUN_EPILOG = f"""\
the guest (contract for the command):
  env   KBP_IN_VM=1  KBP_FLAVOUR  KBP_KVER (uname -r)  KBP_KO (main .ko: kbp.ko, else the
        first one built; unset if none)  KBP_KO_DIR  KBP_TEST_MODULES (dir with the .ko of
        every vm/testdata module)  KBP_NIC0 KBP_NIC1 (the two virtio-net
        NICs, joined by a QEMU hub: what one sends the other receives)  KBP_PYTHON
        KBP_OUT (with --out)  KBP_SO_KO (kbp_so.ko, with --sod)  KBP_SO_TAP_MAC (the
        tap NIC's MAC, with --sod-tap)  PATH (venv bin first)  HOME=/root  TERM=dumb
  root  host / read-only + tmpfs overlay; fresh /proc /sys /dev /run, tracefs, debugfs,
        cgroup2, bpffs; /lib/modules/$KBP_KVER is the flavour's modules (modprobe works)
  nics  down, no addresses; bring BOTH up when using one, or its TX queue stalls on
        the hub and the netdev watchdog fires (a WARNING, i.e. a splat)
  io    stdin /dev/null; stdout+stderr on the serial console (streamed here)

splat scan: kernel console lines (with a printk timestamp) containing BUG:, WARNING:,
  Oops, lockdep, "INFO: task ... blocked", RCU stalls, panics, general protection
  faults, UBSAN:, KASAN: fail the run ({run.EXIT_SPLAT} if the command itself succeeded).
  --no-splat-check turns that off; --allow-splat REGEX ignores matching lines.

exit status: the command's; {run.EXIT_SPLAT} splat (command ok), {run.EXIT_TIMEOUT} timeout, \
{EXIT_RIG} rig/boot failure.
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


def _flavour(name: str) -> str:
    if name not in flavours.FLAVOURS:
        raise argparse.ArgumentTypeError(
            f"unknown flavour {name!r}; known: {', '.join(flavours.FLAVOURS)}")
    return name


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _add_guest_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("guest")
    g.add_argument("--python", default=None, metavar="PY",
                   help="python for the guest tests, exported as KBP_PYTHON (default "
                        "$KBP_VM_PYTHON, else <repo>/.venv/bin/python, else python3)")
    g.add_argument("--timeout", type=float, default=run.DEFAULT_TIMEOUT, metavar="SEC",
                   help="kill QEMU and fail after this long (default %(default).0f)")
    g.add_argument("--memory", type=int, default=2048, metavar="MIB",
                   help="guest RAM; the tmpfs overlay lives in it (default %(default)s)")
    g.add_argument("--smp", type=int, default=2, metavar="N", help="vCPUs (default 2)")
    g.add_argument("--append", default="", metavar="ARGS",
                   help="extra kernel command line, e.g. 'loglevel=8' to see pr_info "
                        "on the console")
    g.add_argument("--env", type=_env_pair, action="append", default=[],
                   metavar="NAME=VALUE", help="extra environment for the command")
    g.add_argument("--quiet", action="store_true",
                   help="do not stream the guest console (it still goes to the log)")
    g.add_argument("--no-splat-check", dest="splat_check", action="store_false",
                   help="do not fail the run on kernel BUG/WARNING/Oops/... lines")
    g.add_argument("--allow-splat", action="append", default=[], metavar="REGEX",
                   help="ignore kernel splat lines matching REGEX (repeatable)")
    a = p.add_argument_group("advanced")
    a.add_argument("--9p-cache", dest="cache_9p", default=run.DEFAULT_9P_CACHE,
                   choices=("loose", "mmap", "none"),
                   help="cache mode of the 9p root (default %(default)s: 10x faster "
                        "stat than none/mmap)")
    a.add_argument("--msize", type=int, default=run.DEFAULT_MSIZE,
                   help="9p message size (default %(default)s)")
    a.add_argument("--cpu", default="max", help="QEMU -cpu model (default %(default)s)")
    a.add_argument("--accel", choices=("tcg", "kvm"), default="tcg",
                   help="QEMU accelerator (default %(default)s: /dev/kvm here cannot run "
                        "guests; kvm on a KVM host, where timings are real)")
    a.add_argument("--qemu-arg", action="append", default=[], metavar="ARG",
                   help="extra QEMU argument (repeatable; use --qemu-arg=-foo)")
    g.add_argument("--mq-nic", action="store_true",
                   help=f"also a multi-queue virtio-net NIC ({mqnic.QUEUES} queue pairs) on a "
                        f"tap in a netns of the run's own (root; guest MAC {mqnic.MAC}, "
                        f"KBP_MQ_MAC, peer KBP_MQ_HOST_IP {mqnic.HOST_IP}): what a real "
                        "multi-queue NIC looks like to the module")


def _spec(args: argparse.Namespace, flavour: str, argv: list[str]) -> run.RunSpec:
    return run.RunSpec(
        flavour=flavour, argv=argv, python=args.python or run.default_python(),
        env=dict(args.env), timeout=args.timeout, memory_mb=args.memory, smp=args.smp,
        cpu=args.cpu, qemu_args=tuple(args.qemu_arg), append=args.append,
        msize=args.msize, cache_9p=args.cache_9p, splat_check=args.splat_check,
        allow_splat=tuple(args.allow_splat), quiet=args.quiet, accel=args.accel,
        mq_nic=args.mq_nic)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python3 -m vm", description=DESCRIPTION,
                                  formatter_class=_Formatter)
    top.add_argument("--cache", type=Path, metavar="DIR",
                     help="cache directory (overrides $KBP_VM_CACHE)")
    sub = top.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser("setup", formatter_class=_Formatter,
                       help="apt-install the host packages the rig needs (root)",
                       description="Install (apt-get, idempotent, quiet) QEMU, busybox-static, "
                                   "gcc-12, make, kmod, dwarves and the tools the guest tests "
                                   "use. Same as `sh vm/setup.sh`.")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("list", help="list the flavours and what the cache holds")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "fetch", formatter_class=_Formatter,
        help="download and extract a flavour's kernel, modules and headers",
        description="Resolve each flavour to the newest Debian package (apt-cache; runs "
                    "apt-get update once if nothing matches), then apt-get download + "
                    "dpkg-deb -x the unsigned image (kernel + modules), the headers, their "
                    "-common package and linux-kbuild into the cache, and run depmod. Instant "
                    "if that release is already there. Prints 'FLAVOUR KVER DIR' per flavour.")
    p.add_argument("flavours", nargs="*", type=_flavour, metavar="FLAVOUR")
    p.add_argument("--all", action="store_true", help="all default flavours")
    p.add_argument("--force", action="store_true", help="download again even if cached")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser(
        "build", formatter_class=_Formatter,
        help="build the out-of-tree module against a flavour's headers",
        description="Copy the module sources to a private per-kernel directory in the cache "
                    "and run `make -C <headers> M=<copy> modules` there (fetching the flavour "
                    "first if needed). Prints the path of each built .ko. With "
                    "--test-modules, also builds every vm/testdata/* module and prints "
                    "their directory (KBP_TEST_MODULES in the guest).")
    p.add_argument("--test-modules", action="store_true",
                   help="also build the vm/testdata test modules")
    p.add_argument("flavour", type=_flavour, metavar="FLAVOUR")
    p.add_argument("--module-dir", type=Path, default=None, metavar="DIR",
                   help="module sources with a Kbuild/Makefile (default module/, or the "
                        "rig's vm/testdata/hello while module/ has no Kbuild)")
    p.add_argument("-j", "--jobs", type=int, default=0, help="make -j (default: CPUs)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser(
        "run", formatter_class=_Formatter, help="boot a flavour and run one command in it",
        description="Boot FLAVOUR under QEMU (TCG) with two virtio-net NICs on one hub, run "
                    "CMD in the guest (as root, in the current directory), stream the console "
                    "and exit with CMD's exit status.",
        epilog=RUN_EPILOG)
    p.add_argument("flavour", type=_flavour, metavar="FLAVOUR")
    p.add_argument("command", nargs="*", metavar="[--] CMD ...",
                   help="the command to run in the guest (put -- before it if it has "
                        "options)")
    m = p.add_argument_group("module")
    m.add_argument("--module-dir", type=Path, default=None, metavar="DIR",
                   help="whose build KBP_KO points at (default as for build)")
    m.add_argument("--build", action="store_true",
                   help="build the module (and the vm/testdata test modules) first")
    m.add_argument("--ko", type=Path, default=None, metavar="PATH",
                   help="export this .ko as KBP_KO instead of a cached build")
    p.add_argument("--log", type=Path, default=None, metavar="FILE",
                   help="also write the console to FILE")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="share host DIR read-write at the same path; exported as KBP_OUT")
    o = p.add_argument_group(
        "socket outsourcing (docs/design.md 11)",
        "Start kbp-sod on the host serving this guest: the guest's RAM is a shared file "
        "the daemon maps, QEMU's ivshmem-doorbell talks to the daemon, kbp_so.ko is built "
        "for the flavour (with --build) and exported as KBP_SO_KO. Example: ip netns add "
        "so; python3 -m vm run 6.12-amd64 --build --sod so -- sh -c 'insmod $KBP_SO_KO'")
    o.add_argument("--sod", metavar="NETNS", default=None,
                   help="serve the guest's outsourced sockets from this existing network "
                        "namespace")
    o.add_argument("--sod-tap", metavar="IFNAME", default="",
                   help="also a virtio-net NIC on a tap IFNAME that QEMU makes in NETNS "
                        f"(guest MAC {outsource.TAP_MAC}, KBP_SO_TAP_MAC): the guest's own "
                        "stack, reachable from NETNS")
    o.add_argument("--sod-dir", type=Path, default=None, metavar="DIR",
                   help="keep the daemon's files here: sod.log, sod.pid, region (default: "
                        "a temporary directory)")
    o.add_argument("--sod-poll", action="store_true", help="kbp-sod --poll (busy-polls)")
    o.add_argument("--sod-rt-prio", type=int, default=0, metavar="N",
                   help="kbp-sod --rt-prio N (SCHED_FIFO)")
    _add_guest_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "test", formatter_class=_Formatter,
        help="fetch + build + run the in-guest pytest suite on each flavour",
        description="For each flavour in turn: fetch, build the module, boot and run "
                    "`$KBP_PYTHON -m pytest -q vm/guest_tests [PYTEST_ARGS]` from the repo "
                    "root; then print one summary line per flavour. Exit 1 if any failed.")
    p.add_argument("flavours", nargs="*", type=_flavour, metavar="FLAVOUR",
                   help=f"default: {' '.join(flavours.DEFAULT_FLAVOURS)}")
    p.add_argument("--all", action="store_true", help="all default flavours")
    p.add_argument("--module-dir", type=Path, default=None, metavar="DIR",
                   help="module to build and test (default as for build)")
    p.add_argument("--log-dir", type=Path, default=None, metavar="DIR",
                   help="console logs, one per flavour (default <cache>/logs)")
    p.add_argument("--tests", default=str(paths.GUEST_TESTS.relative_to(paths.REPO_ROOT)),
                   metavar="PATH", help="pytest target (default %(default)s)")
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS",
                   help="extra pytest arguments, after --")
    _add_guest_options(p)
    p.set_defaults(func=cmd_test)
    for sp in sub.choices.values():  # one-paragraph descriptions: wrap them
        if sp.description and "\n" not in sp.description:
            sp.description = textwrap.fill(sp.description, 92)
    return top


def split_dashdash(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``[opts..., "--", tail...]`` -> (opts, tail); tail is None without a ``--``."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def cmd_setup(_args: argparse.Namespace) -> int:
    return subprocess.call(["sh", str(paths.VM_DIR / "setup.sh")])


def cmd_list(_args: argparse.Namespace) -> int:
    for name, fl in flavours.FLAVOURS.items():
        pointer = fetch._read_json(paths.flavour_pointer(name)) or {}
        cached = pointer.get("kver", "-")
        print(f"{name:15} {cached:28} {fl.summary}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    names = args.flavours or list(flavours.DEFAULT_FLAVOURS if args.all else [])
    if not names:
        raise RigError("name a flavour or pass --all")
    for name in names:
        tree = fetch.fetch(name, force=args.force)
        print(f"{name} {tree.kver} {tree.dir}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    built = build.build(args.flavour, args.module_dir or build.default_module_dir(),
                        jobs=args.jobs)
    for ko in built.kos:
        print(ko)
    if args.test_modules:
        print(build.build_test_modules(args.flavour))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    argv = args.command
    if not argv:
        raise RigError("no command given: python3 -m vm run FLAVOUR -- CMD ...")
    if args.sod is None and (args.sod_tap or args.sod_dir or args.sod_poll or args.sod_rt_prio):
        raise RigError("--sod-tap, --sod-dir, --sod-poll and --sod-rt-prio need --sod NETNS")
    spec = _spec(args, args.flavour, argv)
    spec.log, spec.out_dir = args.log, args.out
    if args.ko is not None:
        if args.build:
            raise RigError("--ko and --build exclude each other")
        spec.ko = args.ko.resolve()
        if not spec.ko.is_file():
            raise RigError(f"--ko {args.ko}: no such file")
    else:
        module_dir = args.module_dir or build.default_module_dir()
        if args.build:
            built: build.Built | None = build.build(args.flavour, module_dir)
        else:
            built = build.existing(fetch.ensure(args.flavour), module_dir)
            if built is None:
                note(f"no build of {module_dir} for {args.flavour}: KBP_KO is unset "
                     "(pass --build to build it)")
        if built is not None:
            spec.ko, spec.ko_dir = built.main, built.build_dir
    spec.test_modules = (build.build_test_modules(args.flavour) if args.build
                         else build.existing_test_modules(args.flavour))
    if args.sod is not None:
        spec.sod = outsource.SodSpec(args.sod, tap=args.sod_tap, dir=args.sod_dir,
                                     poll=args.sod_poll, rt_prio=args.sod_rt_prio)
        outsource.check(spec.sod, spec.memory_mb)
        # KBP_SO_MODULE_DIR: another kbp_so source tree (an old one, for a test's "before")
        so_dir = Path(os.environ.get("KBP_SO_MODULE_DIR", outsource.GUEST_MODULE_DIR))
        so = (build.build(args.flavour, so_dir) if args.build
              else build.existing(fetch.ensure(args.flavour), so_dir))
        if so is None:
            raise RigError(f"--sod: no build of kbp_so.ko for {args.flavour} (add --build)")
        spec.so_ko = so.main

    result = run.run(spec)
    run.report(result)
    return result.rc


def cmd_test(args: argparse.Namespace) -> int:
    names = args.flavours or list(flavours.DEFAULT_FLAVOURS)
    if args.flavours and args.all:
        raise RigError("name flavours or pass --all, not both")
    template = _spec(args, names[0], [])
    return testcmd.test_all(
        names, template=template, module_dir=args.module_dir,
        tests=args.tests, pytest_args=args.pytest_args,
        log_dir=args.log_dir or paths.cache_root() / "logs")


def main(argv: list[str] | None = None) -> int:
    # Everything after the first "--" belongs to the guest command (run) or to pytest
    # (test); argparse must not see it, or it would take its options for ours.
    head, tail = split_dashdash(sys.argv[1:] if argv is None else argv)
    top = parser()
    args, extra = top.parse_known_args(head)
    if extra:
        hint = {"run": " (put -- before the guest command)",
                "test": " (put -- before pytest arguments)"}.get(args.cmd, "")
        top.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if tail is not None:
        if args.cmd == "run":
            args.command = [*args.command, *tail]
        elif args.cmd == "test":
            args.pytest_args = [*args.pytest_args, *tail]
        else:
            top.error(f"{args.cmd} takes no arguments after --")
    if args.cache is not None:
        os.environ["KBP_VM_CACHE"] = str(args.cache.resolve())
    try:
        return int(args.func(args))
    except RigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_RIG
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
