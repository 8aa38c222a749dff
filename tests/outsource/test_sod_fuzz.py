"""The concurrent-mutation fuzzer of kbp-sod (issue 37; outsource/sod/fuzz.c), short runs:
a thread rewrites submission entries, the header's layout and state words, the queues'
control blocks and guest RAM while the daemon's own code serves a guest thread's requests
and lays the region out again every 50 ms, under AddressSanitizer and UBSan, built at -O0
and at -O2.  A finding (a sanitizer report, a queue pointer moved by a header rewrite, a
write into the RAM file outside the RAM map, an accounting out of range) fails it.
``make fuzz-sod`` runs it for minutes (FUZZ_MINUTES); KBP_SOD_FUZZ_SECONDS and
KBP_SOD_FUZZ_SEED change this short run."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from .conftest import _make

SECONDS = float(os.environ.get("KBP_SOD_FUZZ_SECONDS", "5"))
SEED = os.environ.get("KBP_SOD_FUZZ_SEED", "")
ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=66",
       "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=67"}
COUNTS = re.compile(r"mutator writes (\d+), daemon passes (\d+), requests (\d+) \(rejected "
                    r"(\d+), completed (\d+), dropped (\d+)\), relayouts (\d+), guest resets "
                    r"acked (\d+), guest submissions (\d+), datagrams (\d+): no finding")


@pytest.mark.parametrize("opt", ["O0", "O2"])
def test_concurrent_mutation_fuzzer(opt: str) -> None:
    probe = subprocess.run(["cc", "-fsanitize=address,undefined", "-x", "c", "-", "-o",
                            "/dev/null"], input="int main(void){return 0;}",
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(reason="the compiler cannot link with -fsanitize=address,undefined")
    binary = _make(f"kbp-sod-fuzz-{opt}")
    argv = [str(binary), "--seconds", str(SECONDS)] + (["--seed", SEED] if SEED else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=SECONDS * 4 + 60,
                       env={**os.environ, **ENV})
    out = p.stdout + p.stderr
    if p.returncode == 2 and "needs a network namespace" in out:
        pytest.skip(reason=out.strip())
    assert p.returncode == 0, out[-6000:]
    assert "AddressSanitizer" not in out and "runtime error" not in out, out[-6000:]
    m = COUNTS.search(p.stdout)
    assert m, out[-3000:]
    print("\n" + p.stdout.strip())
    writes, _passes, requests, rejected, completed, _dropped, relayouts = (
        int(x) for x in m.groups()[:7])
    # it reached the daemon: many mutations, requests served and refused, many restarts
    assert writes >= 10_000 and relayouts >= 10 * SECONDS / 2, m.group(0)
    assert requests >= 300 and rejected >= 50 and completed >= 250, m.group(0)
