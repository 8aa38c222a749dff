"""UDP receiver with UDP_GRO on: counts datagrams, receive calls and per-flow order.

    python3 grorecv.py recv --bind 198.18.103.1:9100 --expect N [--timeout S]

Each datagram (sent by ``grosend``) starts with (flow, seq) as two big-endian u32. With
UDP_GRO the kernel hands the socket GRO's coalesced super-packets: one recvmsg() carries
several same-sized segments, their size in a UDP_GRO control message. Prints one JSON line:
datagrams, receive calls, segments per call (coalescing), out-of-order count, unique count.

    python3 grorecv.py send --to 198.18.103.1:9100 --flows 4 --count N --burst B --rate R
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

from udpflow import _addr  # same directory: run as a script, like udpflow

SOL_UDP = 17
UDP_GRO = 104
HDR = struct.Struct("!II")
SIZE = 200


def recv(args: argparse.Namespace) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # FORCE: past net.core.rmem_max (root in the guest).  A full buffer drops whole GRO
    # packets, counted once each in RcvbufErrors however many datagrams they carry, which
    # the test could not tell from a loss in the poll path.
    s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 8 << 20)
    s.setsockopt(SOL_UDP, UDP_GRO, 1)
    s.bind(_addr(args.bind))
    s.settimeout(0.2)
    print("ready", flush=True)
    last: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    calls = datagrams = out_of_order = 0
    deadline = time.monotonic() + args.timeout
    while len(seen) < args.expect and time.monotonic() < deadline:
        try:
            data, anc, _, _ = s.recvmsg(65536, socket.CMSG_SPACE(4))
        except TimeoutError:
            continue
        calls += 1
        seg = len(data)
        for level, kind, val in anc:
            if level == SOL_UDP and kind == UDP_GRO:
                seg = struct.unpack("i", val[:4])[0]
        for off in range(0, len(data), seg):
            flow, seq = HDR.unpack_from(data, off)
            datagrams += 1
            if seq <= last.get(flow, -1):
                out_of_order += 1
            last[flow] = seq
            seen.add((flow, seq))
    print(json.dumps({"datagrams": datagrams, "calls": calls, "unique": len(seen),
                      "out_of_order": out_of_order,
                      "per_call": round(datagrams / calls, 2) if calls else 0.0}), flush=True)
    return 0


def send(args: argparse.Namespace) -> int:
    socks = []
    for _ in range(args.flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(_addr(args.to))
        socks.append(s)
    pad = b"\0" * (SIZE - HDR.size)
    start, sent = time.monotonic(), 0
    per_flow = args.count // args.flows
    for seq in range(0, per_flow, args.burst):
        for flow, s in enumerate(socks):           # a burst of each flow, back to back
            for n in range(seq, min(seq + args.burst, per_flow)):
                s.send(HDR.pack(flow, n) + pad)
                sent += 1
        delay = start + sent / args.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    print(json.dumps({"sent": sent}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--expect", type=int, required=True)
    r.add_argument("--timeout", type=float, default=120.0)
    r.set_defaults(fn=recv)
    w = sub.add_parser("send")
    w.add_argument("--to", required=True)
    w.add_argument("--flows", type=int, default=4)
    w.add_argument("--count", type=int, default=8000)
    w.add_argument("--burst", type=int, default=32)
    w.add_argument("--rate", type=float, default=4000.0)
    w.set_defaults(fn=send)
    args = ap.parse_args(argv)
    if not getattr(args, "fn", None):
        ap.print_help()
        return 2
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
