"""``make stress``: kbp.ko's stress test (vm/guest_tests/test_stress.py) for N minutes on
each rig kernel, with SLUB debugging, one kernel after the other; then a table of what
each run did: events, frames lost beyond the driver's own drops, frames reordered, kernel
splats, and how the run ended.

    python3 -m vm.stress [--minutes 30] [--seed N] [FLAVOUR ...]

The counts come from the ``KBP-STRESS {json}`` line the test prints on the console; the
splats from the rig's own scan of the console (vm/console.py), which fails the run.
Exit 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from vm import console, paths

FLAVOURS = ("6.12-amd64", "6.1-amd64", "6.12-rt-amd64", "7.2-amd64", "7.2-rt-amd64")
MARK = "KBP-STRESS "


def stress_line(log: Path) -> dict[str, object] | None:
    """The test's counts from a console log (None: the test never got that far)."""
    if not log.exists():
        return None
    for line in reversed(log.read_text(errors="replace").splitlines()):
        i = line.find(MARK)
        if i >= 0:
            try:
                return dict(json.loads(line[i + len(MARK):]))
            except ValueError:
                return None
    return None


def splats(log: Path) -> list[str]:
    """The kernel splat lines of a console log, as the rig finds them."""
    if not log.exists():
        return []
    return [ln for ln in log.read_text(errors="replace").splitlines()
            if console.find_splat(ln)]


def run_one(flavour: str, seconds: int, seed: int, log_dir: Path) -> tuple[int, Path]:
    argv = [sys.executable, "-m", "vm", "test", flavour, "--append", "slub_debug=FZPU",
            "--timeout", str(seconds + 900), "--log-dir", str(log_dir), "--quiet",
            "--tests", "vm/guest_tests/test_stress.py",
            "--env", f"KBP_STRESS_SECONDS={seconds}"]
    if seed:
        argv += ["--env", f"KBP_STRESS_SEED={seed}"]
    rc = subprocess.call(argv, cwd=paths.REPO_ROOT)
    return rc, log_dir / f"{flavour}.log"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m vm.stress", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("flavours", nargs="*", default=list(FLAVOURS), metavar="FLAVOUR")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0, help="0: a new one per run (recorded)")
    ap.add_argument("--log-dir", type=Path, default=paths.cache_root() / "stress-logs")
    args = ap.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    for fl in args.flavours:
        rc, log = run_one(fl, int(args.minutes * 60), args.seed, args.log_dir)
        got = stress_line(log) or {}
        bad = splats(log)
        failed |= rc != 0 or bool(bad) or not got
        rows.append((fl, got, bad, rc))
    print(f"{'flavour':15} {'kernel':24} {'s':>6} {'events':>7} {'lost':>5} {'reord':>5} "
          f"{'delivered':>10} {'splats':>6}  result  seed")
    for fl, got, bad, rc in rows:
        print(f"{fl:15} {got.get('kernel', '?')!s:24} {got.get('seconds', '-')!s:>6} "
              f"{got.get('events', '-')!s:>7} {got.get('lost', '-')!s:>5} "
              f"{got.get('reordered', '-')!s:>5} {got.get('delivered', '-')!s:>10} "
              f"{len(bad):>6}  {'PASS' if rc == 0 and not bad and got else 'FAIL'}    "
              f"{got.get('seed', '-')}")
        for ln in bad[:5]:
            print(f"    splat: {ln}")
        if got.get("done"):
            print(f"    events: {json.dumps(got['done'], sort_keys=True)}")
    print(f"console logs: {args.log_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
