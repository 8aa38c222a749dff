"""``kbpctl outsource set|clear|status``: the parser and the output.  Imports only argparse
at start-up; the work (kbp.outsource.policy) is imported when a command runs."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
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

  The redirect is a convenience; kbp_so itself decides (docs/design.md 11.13). set first
  writes its parameters in /sys/module/kbp_so/parameters/: cgroup (the cgroup's path from
  the hierarchy's root, e.g. /rt-app), netns (the cookies of the --netns namespaces; empty:
  the initial one only) and allow_uids (--allow-uid). A protocol-253 socket is served when
  its netns is allowed and its creator is in the cgroup (or below), holds CAP_NET_ADMIN or
  has an allowed uid; any other gets EPERM (status: refused_netns, refused_user). clear
  puts the parameters back as they were.

examples:
  kbpctl outsource set --cgroup /sys/fs/cgroup/rt-app             inet (IPv4) sockets
  kbpctl outsource set --cgroup /sys/fs/cgroup/rt-app --family both
  kbpctl outsource set --cgroup /sys/fs/cgroup/rt-app --netns init --netns blue
                                          also the sockets of 'ip netns' blue
  kbpctl outsource set --cgroup /sys/fs/cgroup/rt-app --allow-uid 1000 --allow-uid dns
                                          these users may ask for protocol 253 themselves
  kbpctl outsource set --cgroup /sys/fs/cgroup/rt-app --force     kbp_so not loaded yet:
                                          prints the modprobe line that gives it the policy
  echo $PID > /sys/fs/cgroup/rt-app/cgroup.procs                    move a process in
  kbpctl outsource status                                           policy, module, sockets
  kbpctl outsource status --json
  kbpctl outsource clear                                            undo it

refused, before anything changes (one line saying why):
  not root (CAP_SYS_ADMIN and CAP_BPF); a cgroup path that is missing or not cgroup v2; a
  --netns that 'ip netns list' does not show, or more than 8; an unknown user, or more
  than 16 uids; a kernel without the hook (Linux 6.1: no update_socket_protocol in its BTF) or
  whose verifier rejects the program (the kernel's error and log are quoted); kbp_so not
  loaded or not attached, or too old to enforce a policy (no parameter cgroup), unless
  --force (the cgroup's UDP sockets then fail: EPROTONOSUPPORT without the module, ENETDOWN
  until it attaches); a policy already set (run clear first: one policy at a time, and a
  pinned tracing link cannot swap its program in place).

what the guest's filters see (set prints it in full; docs/design.md 11.13):
  no packet of an outsourced socket exists in the guest, so guest netfilter, tc,
  cgroup-skb BPF (IPAddressDeny=) and the NIC counters see none; the cgroup sock_addr
  programs and the privileged-port rule do run; the host's netfilter in the VM's netns
  sees them as kbp-sod's.

undo:
  kbpctl outsource clear removes the pin (the kernel drops the program), puts kbp_so's
  parameters back where they still hold what set wrote, removes the directory and the bpffs
  mount if set made them, and the record. Sockets already outsourced stay with kbp_so until
  they are closed; new ones use the kernel's UDP again.
"""

#: what set prints, and docs/design.md 11.13 says in the same words (a test compares them)
FILTERS_SEE = (
    "What the guest's filters see of an outsourced socket: no packet of it ever exists in"
    " the guest (no skb), so the guest's netfilter (iptables, nftables, conntrack), tc, "
    "cgroup-skb BPF (systemd's IPAddressDeny=/IPAddressAllow=), packet sockets (tcpdump) "
    "and the guest's NIC counters see none of its traffic, and ss and /proc/net/udp do "
    "not list it (/proc/kbp_so does). What does run in the guest: the cgroup sock_create "
    "and sockopt programs and the LSMs' socket hooks, which the kernel calls for any "
    "socket; and, called by kbp_so itself, the cgroup sock_addr BPF programs (bind, "
    "connect, sendmsg, recvmsg, getsockname, getpeername), the privileged-port rule (a "
    "port below ip_unprivileged_port_start needs CAP_NET_BIND_SERVICE) and SO_REUSEPORT's"
    " same-user rule. On the host the traffic is kbp-sod's: the host's netfilter in the "
    "VM's network namespace (kbp-sod's netns=) sees it as kbp-sod's sockets, with "
    "kbp-sod's uid and cgroup; filter there.")


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
    s.add_argument("--netns", action="append", metavar="NAME|init",
                   help="a network namespace whose sockets kbp_so may serve: a name from "
                        "'ip netns list', or init (the initial one); repeat for more (8 at "
                        "most; the initial one is allowed then only if init is named too). "
                        "Default: the initial one only")
    s.add_argument("--allow-uid", action="append", metavar="UID",
                   help="a user (number or name) who may ask for protocol 253 "
                        "themselves, outside the cgroup and without CAP_NET_ADMIN; repeat "
                        "for more (16 at most). Default: none")
    s.add_argument("--force", action="store_true",
                   help="set it even when kbp_so is not loaded (its policy is then given "
                        "when it is loaded: set prints the command), not attached, or too "
                        "old to enforce a policy")
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
    st = policy.set_policy(args.cgroup, args.family, args.force, args.netns, args.allow_uid)
    fams = "+".join(st["families"])
    _out(f"outsource policy set: new {fams} UDP sockets of {st['cgroup']} and its descendants "
         f"go to kbp_so (program {st['prog_id']}, link {st['link_id']} pinned at {st['pin']}"
         f"{', bpffs mounted by kbpctl' if st['mounted_bpffs'] else ''})")
    mp = st["module_params"]
    if mp["written"]:
        _out(module_policy_line(mp["want"], mp["netns"]))
        prev = mp["previous"]
        _out(f"  written to {mp['params_dir']}/; they were: "
             + " ".join(f"{n}={prev[n]!r}" for n in policy.POLICY_PARAMS)
             + " (clear puts them back)")
    if st["module_state"] is None:
        _out(module_policy_line(mp["want"], mp["netns"]).replace(
            "kbp_so's own policy:", "kbp_so's policy, to give it when it is loaded:"))
        sys.stderr.write(
            "kbpctl: warning (--force): kbp_so is not loaded: the cgroup's UDP sockets fail "
            "with EPROTONOSUPPORT until it is, and its policy was NOT written (nothing to "
            "write to); give it when loading kbp_so:\n"
            f"  {mp['load']}\n")
        if mp["load"].startswith(f"insmod {policy.KO_PLACEHOLDER} "):
            sys.stderr.write("  (with the path of your kbp_so.ko: modprobe does not know it)\n")
        if mp["want"]["netns"]:
            sys.stderr.write("  (the netns cookies hold while those namespaces exist: "
                             "after a reboot, load kbp_so, then clear and set again)\n")
    else:
        if st["module_state"] != "attached":
            sys.stderr.write(f"kbpctl: warning (--force): kbp_so is {st['module_state']}: "
                             "the cgroup's UDP sockets fail with ENETDOWN until it "
                             "attaches\n")
        if not mp["written"]:
            sys.stderr.write("kbpctl: warning (--force): this kbp_so has no policy "
                             "parameters (an older kbp_so without the guest-user policy): "
                             "nothing written, it serves "
                             "protocol 253 to any guest user\n")
    _out(textwrap.fill(FILTERS_SEE, 100, break_on_hyphens=False))
    return EXIT_OK


def module_policy_line(want: dict[str, str], netns: list[dict[str, Any]]) -> str:
    """kbp_so's policy as set wrote it (or would have), in words."""
    return "kbp_so's own policy: " + policy_words(want["cgroup"], want["netns"],
                                                  want["allow_uids"], _netns_names(netns))


def _netns_names(netns: Any) -> dict[int, str]:
    return {int(n["cookie"]): str(n["name"]) for n in netns or []
            if isinstance(n, dict) and n.get("cookie") is not None}


def policy_words(cgroup: str, netns: str, uids: str, names: dict[int, str]) -> str:
    """The module's three parameters (as written or read) in one sentence."""
    from kbp.outsource.policy import netns_text
    who = [f"in cgroup {cgroup} (or below)" if cgroup else None, "holding CAP_NET_ADMIN",
           f"uid {uids.replace(',', ', ')}" if uids else None]
    return (f"sockets in {netns_text(netns, names)}, made by a task "
            + " or ".join(w for w in who if w)
            + "; any other protocol-253 socket gets EPERM")


def cmd_clear(args: argparse.Namespace) -> int:
    from kbp.errors import EXIT_FAILED
    from kbp.outsource import policy
    failed = False
    for line in policy.clear_policy():
        if line.startswith("error: "):
            failed = True
            sys.stderr.write(f"kbpctl: {line}\n")
        else:
            _out(line)
    return EXIT_FAILED if failed else EXIT_OK


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
        mp = p.get("module_params")
        if isinstance(mp, dict) and mp.get("written"):
            out.append("  kbp_so's parameters written by set (clear puts back "
                       + " ".join(f"{k}={v!r}" for k, v in (mp.get("previous") or {}).items())
                       + ")")
        elif isinstance(mp, dict):
            out.append("  kbp_so's parameters not written by set (kbp_so was not loaded "
                       f"then); its load line: {mp.get('load')}")
    m = st["module"]
    if m is None:
        out.append("kbp_so: not loaded (no /proc/kbp_so)")
    else:
        out.append("kbp_so: " + " ".join(f"{k}={v}" for k, v in m.items()))
    mparams = st.get("module_params")
    if mparams is not None:
        recorded = (p or {}).get("module_params")
        names = _netns_names(recorded.get("netns") if isinstance(recorded, dict) else None)
        netns = mparams["netns"]
        netns_s = ",".join(str(c) for c in netns) if isinstance(netns, list) else str(netns)
        uids = mparams["allow_uids"]
        uids_s = ",".join(str(u) for u in uids) if isinstance(uids, list) else str(uids)
        refused = ""
        if m is not None and "refused_netns" in m:
            refused = (f"; refused so far: {m['refused_netns']} (netns), "
                       f"{m.get('refused_user', '-')} (user)")
        out.append("kbp_so's policy: " + policy_words(mparams["cgroup"], netns_s, uids_s, names)
                   + refused)
    for w in st.get("warnings") or []:
        out.append(f"warning: {w}")
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
               "a socket never changes sides after creation; sockets of other network "
               "namespaces are not listed (/proc/kbp_so shows the reader's)")
    return out
