"""``test``: fetch + build + run the in-guest pytest suite on each flavour in turn."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vm import build, fetch, paths, run
from vm.util import RigError, Stopwatch, note


@dataclass
class FlavourResult:
    flavour: str
    kver: str = "-"
    fetch_s: float | None = None
    build_s: float | None = None
    boot_s: float | None = None
    run_s: float | None = None
    total_s: float = 0.0
    result: str = "ERROR"
    detail: str = ""
    rerun: str = ""     # why it was booted twice (only QEMU's stale int3 earns that)

    @property
    def ok(self) -> bool:
        return self.result == "PASS"


def _fmt(sec: float | None) -> str:
    return "-" if sec is None else f"{sec:.1f}s"


def summary_lines(results: list[FlavourResult]) -> list[str]:
    head = f"{'flavour':14} {'kernel':26} {'fetch':>6} {'build':>6} {'boot':>6} " \
           f"{'run':>7} {'total':>7}  result"
    lines = [head]
    for r in results:
        line = (f"{r.flavour:14} {r.kver:26} {_fmt(r.fetch_s):>6} {_fmt(r.build_s):>6} "
                f"{_fmt(r.boot_s):>6} {_fmt(r.run_s):>7} {_fmt(r.total_s):>7}  {r.result}")
        if r.detail and not r.ok:
            line += f" ({r.detail.splitlines()[0]})"
        if r.rerun:
            line += f" [{r.rerun}]"
        lines.append(line)
    return lines


def test_one(flavour: str, *, template: run.RunSpec, module_dir: Path, tests: str,
             pytest_args: list[str], log: Path) -> FlavourResult:
    res = FlavourResult(flavour)
    total = Stopwatch()
    try:
        clock = Stopwatch()
        tree = fetch.fetch(flavour)
        res.kver, res.fetch_s = tree.kver, clock()
        clock = Stopwatch()
        built = build.build(flavour, module_dir)
        test_modules = build.build_test_modules(flavour)
        res.build_s = clock()
        spec = dataclasses.replace(
            template, flavour=flavour, cwd=paths.REPO_ROOT, ko=built.main,
            ko_dir=built.build_dir, test_modules=test_modules, log=log,
            argv=[template.python, "-m", "pytest", "-q", "--durations=0",
                  "--durations-min=3", tests, *pytest_args])
        out = run.run(spec)
        run.report(out)
        if out.stale_int3_only and not out.interrupted:
            # QEMU's race, proven by the oops itself: boot once more, and say so in the
            # result line whatever the second boot does (vm/README.md, "Oops: int3")
            first = out.reason.splitlines()[0]
            kept = log.with_name(log.stem + ".stale-int3.log")
            if log.exists():
                shutil.copyfile(log, kept)      # the second boot rewrites the console log
            note(f"{flavour}: failed only on QEMU TCG's stale int3 ({first}; console kept in "
                 f"{kept}): booting it once more")
            out = run.run(spec)
            run.report(out)
            res.rerun = f"rerun after QEMU TCG's stale int3 in the first boot ({first})"
        if out.interrupted:
            raise KeyboardInterrupt  # stop here: do not go on to the next flavour
        res.boot_s, res.run_s = out.boot_s, out.total_s
        res.result = "PASS" if out.ok else "FAIL"
        res.detail = out.reason
    except RigError as exc:
        res.result, res.detail = "ERROR", str(exc)
        note(f"{flavour}: error: {exc}")
    res.total_s = total()
    return res


def warm_bytecode(python: str, tests: str) -> None:
    """Compile on the host what every guest imports: the guest sees the host's tree
    read-only under a tmpfs overlay, so each boot otherwise compiles the kbp package and
    rewrites the test modules' asserts again, under TCG (seconds per flavour), and every
    guest Python process that imports a module the tests have not yet imported pays it too.
    ``compileall`` writes whatever PYTHONDONTWRITEBYTECODE says; pytest's own rewritten
    modules are written by a host-side collection (the suite skips itself there)."""
    root = paths.REPO_ROOT
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for argv in ([python, "-m", "compileall", "-q", str(root / "src"), str(root / "vm")],
                 [python, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                  tests]):
        r = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                           timeout=300, check=False)
        if r.returncode != 0:     # a cold cache only costs time: say so and go on
            note(f"warming the bytecode caches: {' '.join(argv[1:4])} exited "
                 f"{r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")


def test_all(flavours: list[str], *, template: run.RunSpec, module_dir: Path | None,
             tests: str, pytest_args: list[str], log_dir: Path) -> int:
    module_dir = module_dir or build.default_module_dir()
    warm_bytecode(template.python, tests)
    results = []
    for flavour in flavours:
        note(f"=== {flavour}: fetch, build {module_dir} and the vm/testdata modules, "
             f"run {tests}")
        results.append(test_one(flavour, template=template, module_dir=module_dir,
                                tests=tests, pytest_args=pytest_args,
                                log=log_dir / f"{flavour}.log"))
    print()
    for line in summary_lines(results):
        print(line)
    print(f"console logs: {log_dir}")
    failed = [r.flavour for r in results if not r.ok]
    if failed:
        print(f"FAILED: {' '.join(failed)}")
        return 1
    print(f"all {len(results)} flavours passed")
    return 0
