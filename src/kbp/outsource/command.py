"""``kbpctl outsource set|clear|status``: the parser and the output.  Imports only argparse
at start-up; the work (kbp.outsource.policy) is imported when a command runs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kbp.errors import EXIT_OK

OUTSOURCE_EPILOG = """\
what it does:
  New UDP sockets of the processes in a cgroup v2 (and its descendants) are served by
  kbp_so, the guest module that hands them to the host daemon kbp-sod over shared memory,
  with no change to the applications. A BPF fmod_ret program on the kernel function
  update_socket_protocol() (Linux 6.6+) rewrites socket(AF_INET[6], SOCK_DGRAM, 0 or
  IPPROTO_UDP) to protocol 253, kbp_so's; every other socket keeps the kernel's stack.
  The program's link is pinned at /sys/fs/bpf/kbp/outsource: the policy outlives kbpctl,
  not a reboot. What was created is recorded in /run/kbp/outsource.json.

examples:
  kbpctl outsource set --cgroup /sys/fs/cgroup/rt-app             inet (IPv4) sockets
  kbpctl outsource set --cgroup /sys/fs/cgroup/rt-app --family both
  echo $PID > /sys/fs/cgroup/rt-app/cgroup.procs                    move a process in
  kbpctl outsource status                                           policy, module, sockets
  kbpctl outsource status --json
  kbpctl outsource clear                                            undo it

refused, before anything changes (one line saying why):
  not root (CAP_SYS_ADMIN and CAP_BPF); a cgroup path that is missing or not cgroup v2; a
  kernel without the hook (Linux 6.1: no update_socket_protocol in its BTF) or whose
  verifier rejects the program (the kernel's error and log are quoted); kbp_so not loaded
  or not attached, unless --force (the cgroup's UDP sockets then fail: EPROTONOSUPPORT
  without the module, ENETDOWN until it attaches); a policy already set (run clear first:
  one policy at a time, and a pinned tracing link cannot swap its program in place).

undo:
  kbpctl outsource clear removes the pin (the kernel drops the program), the directory and
  the bpffs mount if set made them, and the record. Sockets already outsourced stay with
  kbp_so until they are closed; new ones use the kernel's UDP again.
"""


IDLE_EPILOG = """\
what it does (docs/design.md 11.11):
  kbp_so becomes the guest's cpuidle driver. An idle vCPU polls every completion ring for
  --poll-us, waking the receivers it finds; then it announces in shared memory that it
  halts, looks once more, and halts. kbp-sod interrupts only vCPUs that announced, so an
  idle RT server takes no interrupt per message while the window covers the gap between
  messages. A busy vCPU finds completions at its next outsourced call or in a sweep that
  rides its tick (two ticks at most). The cost: polling is CPU time the host pays.

examples:
  kbpctl outsource idle                   show it (idle=on|off|unavailable:<why>)
  kbpctl outsource idle --poll-us 2000    on: poll up to 2 ms (1..2000)
  kbpctl outsource idle --off             off: every sleeping waiter asks for its interrupt

refused, with the reason: kbp_so not loaded or without a device; the kernel booted with
  idle= or cpuidle.off=1; another cpuidle driver holds the slot (kbp_so does not take it);
  a kbp-sod that does not honour need_irq. Counters: kbpctl status (completions_idle, ...).
"""


def add_parser(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    o = sub.add_parser("outsource", help="which UDP sockets kbp_so serves (BPF policy)",
                       description="Choose, by cgroup, the UDP sockets kbp_so outsources "
                                   "to the host.",
                       epilog=OUTSOURCE_EPILOG, formatter_class=fmt)
    osub = o.add_subparsers(dest="outsource_cmd", metavar="COMMAND", required=True)
    s = osub.add_parser("set", help="outsource the UDP sockets of a cgroup",
                        epilog=OUTSOURCE_EPILOG, formatter_class=fmt)
    s.add_argument("--cgroup", required=True, metavar="PATH",
                   help="a cgroup v2 directory, e.g. /sys/fs/cgroup/rt-app; its descendants "
                        "are included")
    s.add_argument("--family", choices=("inet", "inet6", "both"), default="inet",
                   help="inet (default): AF_INET sockets; inet6: AF_INET6; both")
    s.add_argument("--force", action="store_true",
                   help="set it even when kbp_so is not loaded or not attached")
    s.set_defaults(func=cmd_set)
    c = osub.add_parser("clear", help="remove the policy, exactly what set made",
                        formatter_class=fmt)
    c.set_defaults(func=cmd_clear)
    t = osub.add_parser("status", help="the policy, kbp_so's state and its sockets",
                        formatter_class=fmt)
    t.add_argument("--json", action="store_true",
                   help="machine-readable (schema kbpctl-outsource/1)")
    t.set_defaults(func=cmd_status)
    i = osub.add_parser("idle", help="kbp_so's idle path: idle vCPUs poll, the host "
                                     "interrupts only halted ones",
                        epilog=IDLE_EPILOG, formatter_class=fmt)
    g = i.add_mutually_exclusive_group()
    g.add_argument("--poll-us", type=int, metavar="US",
                   help="turn it on: idle vCPUs poll up to US microseconds (1..2000)")
    g.add_argument("--off", action="store_true", help="turn it off (the module's default)")
    i.set_defaults(func=cmd_idle)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def cmd_set(args: argparse.Namespace) -> int:
    from kbp.outsource import policy
    st = policy.set_policy(args.cgroup, args.family, args.force)
    fams = "+".join(st["families"])
    _out(f"outsource policy set: new {fams} UDP sockets of {st['cgroup']} and its descendants "
         f"go to kbp_so (program {st['prog_id']}, link {st['link_id']} pinned at {st['pin']}"
         f"{', bpffs mounted by kbpctl' if st['mounted_bpffs'] else ''})")
    if st["module_state"] != "attached":
        what = ("kbp_so is not loaded: their socket() fails with EPROTONOSUPPORT"
                if st["module_state"] is None else
                f"kbp_so is {st['module_state']}: they fail with ENETDOWN until it attaches")
        sys.stderr.write(f"kbpctl: warning (--force): {what}\n")
    return EXIT_OK


def cmd_clear(args: argparse.Namespace) -> int:
    from kbp.outsource import policy
    for line in policy.clear_policy():
        _out(line)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from kbp.outsource import policy
    st = policy.status()
    if args.json:
        _out(json.dumps(st, indent=2))
        return EXIT_OK
    _out("\n".join(status_lines(st)))
    return EXIT_OK


def cmd_idle(args: argparse.Namespace) -> int:
    from kbp.outsource import idle
    if args.poll_us is not None and args.poll_us <= 0:
        from kbp.errors import InvalidInput
        raise InvalidInput(f"--poll-us {args.poll_us}: 1..{idle.MAX_US} (--off turns it off)")
    if args.off or args.poll_us is not None:
        st = idle.set_idle(0 if args.off else args.poll_us)
    else:
        st = idle.current()
    if st["idle"] == "on":
        _out(f"idle path on: idle vCPUs poll kbp_so's rings up to {st['idle_poll_us']} µs, "
             "then announce and halt (cpuidle driver kbp_so)")
    else:
        _out(f"idle path {st['idle']}: every sleeping waiter asks kbp-sod for its interrupt")
    return EXIT_OK


def status_lines(st: dict[str, Any]) -> list[str]:
    out: list[str] = []
    p = st["policy"]
    if p is None:
        out.append("policy: none (kbpctl outsource set --cgroup PATH)")
    elif p.get("cgroup") is None:
        out.append(f"policy: {p['link']}")
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.get("time") or 0))
        out.append(f"policy: {'+'.join(p['families'])} UDP sockets of {p['cgroup']} and its "
                   f"descendants -> kbp_so (set {since}{', --force' if p.get('forced') else ''})")
        out.append(f"  cgroup {p['cgroup_state']} (id {p['cgroup_id']}), program {p['prog_id']}, "
                   f"link {p['link_id']} {p['link']} ({p['pin']})")
    m = st["module"]
    if m is None:
        out.append("kbp_so: not loaded (no /proc/kbp_so)")
    else:
        out.append("kbp_so: " + " ".join(f"{k}={v}" for k, v in m.items()))
    socks = st["sockets"]
    if socks:
        out.append(f"sockets ({len(socks)}):")
    for s in socks:
        who = ", ".join(f"{o['pid']}/{o['comm']}" for o in s["owners"]) or "no process"
        rest = " ".join(f"{k}={v}" for k, v in s.items()
                        if k not in ("ino", "uid", "family", "local", "remote", "owners"))
        out.append(f"  ino {s['ino']} {s['family']} {s['local']} -> {s['remote']} uid "
                   f"{s['uid']} [{who}]: {rest}")
    out.append("limits: only socket(2) passes the hook (io_uring's IORING_OP_SOCKET does not); "
               "a socket never changes sides after creation")
    return out
