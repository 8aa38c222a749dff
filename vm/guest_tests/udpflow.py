"""Numbered UDP datagrams for the in-guest tests: a paced sender and a counting sink.

    python3 udpflow.py sink --bind 198.18.100.1:9000 [--expect N] [--timeout S]
    python3 udpflow.py send --to 198.18.100.1:9000 --count N --rate PPS [--burst B]

The sink prints one JSON line when it stops (N unique datagrams seen, timeout, or SIGTERM):
{"received": ..., "unique": ..., "max_seq": ...}.  --count 0 sends until SIGTERM; the sender
prints {"sent": ..., "seconds": ...} when it stops (count reached or SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import struct
import sys
import time

HDR = struct.Struct("!Q")


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def sink(args: argparse.Namespace) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(_addr(args.bind))
    s.settimeout(0.2)
    seen: set[int] = set()
    received = 0
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    deadline = time.monotonic() + args.timeout
    while not stop and time.monotonic() < deadline:
        if args.expect and len(seen) >= args.expect:
            break
        try:
            data = s.recv(2048)
        except TimeoutError:
            continue
        received += 1
        if len(data) >= HDR.size:
            seen.add(HDR.unpack_from(data)[0])
    print(json.dumps({"received": received, "unique": len(seen),
                      "max_seq": max(seen) if seen else -1}), flush=True)
    return 0


def send(args: argparse.Namespace) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dst = _addr(args.to)
    pad = b"\0" * max(0, args.size - HDR.size)
    interval = args.burst / args.rate
    start = time.monotonic()
    seq = 0
    stop = False

    def on_term(*_: object) -> None:     # --count 0 ends here, and still says what it sent
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop and (args.count == 0 or seq < args.count):
        for _ in range(args.burst):
            if args.count and seq >= args.count:
                break
            s.sendto(HDR.pack(seq) + pad, dst)
            seq += 1
        delay = start + (seq / args.burst) * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    print(json.dumps({"sent": seq, "seconds": round(time.monotonic() - start, 3)}),
          flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("sink")
    a.add_argument("--bind", required=True)
    a.add_argument("--expect", type=int, default=0)
    a.add_argument("--timeout", type=float, default=60.0)
    a.set_defaults(fn=sink)
    b = sub.add_parser("send")
    b.add_argument("--to", required=True)
    b.add_argument("--count", type=int, default=1000)
    b.add_argument("--rate", type=float, default=1000.0, help="datagrams per second")
    b.add_argument("--burst", type=int, default=1, help="datagrams sent back to back")
    b.add_argument("--size", type=int, default=64)
    b.set_defaults(fn=send)
    args = ap.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
