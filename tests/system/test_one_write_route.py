"""A kernel file is written only through kbp.system.access.write.

Every other place in the product that opens a file for writing is listed in ``OURS`` with
what it writes (a file of kbp's own: a journal, a result, a unit drop-in, a textfile for
the node exporter).  A new write site fails this test until it goes through
``access.write`` or is added here with its reason: a sysfs or procfs write that bypasses
the access layer would bypass its errno handling, its namespace helper and the one-write(2)
rule that the kernel's store handlers expect."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kbp"
LAYER = SRC / "system" / "access.py"

#: (module path under src/kbp, enclosing function) -> what it writes
OURS: dict[tuple[str, str], str] = {
    ("bench/cli.py", "_finish"): "the bench's results.md",
    ("bench/schema.py", "dump"): "the bench's result JSON",
    ("bench/tester.py", "build"): "the tester's C source, compiled into the bench's cache",
    ("bench/trace.py", "KernelTrace.start"): "the bench's trace capture file",
    ("generator.py", "generate"): "the systemd generator's drop-ins",
    ("periodicd.py", "write_state"): "periodicd's state file (atomic rename)",
    ("periodicd.py", "spawn"): "periodicd's log file",
    ("periodicd.py", "Service.locked"): "the run directory's lock file",
    ("rtclass.py", "save_rule"): "an RT-class rule file (atomic rename)",
    ("system/journal.py", "StateDir.lock"): "kbp's one lock file (kbpctl and the bench)",
    ("system/journal.py", "JournalFile.__init__"): "kbpctl's write-ahead journal",
}

_WRITE_METHODS = {"write_text", "write_bytes"}
_WRITE_MODES = set("wax+")


def _mode(call: ast.Call, pos: int) -> str | None:
    arg = call.args[pos] if len(call.args) > pos else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _is_write(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr in _WRITE_METHODS:
        return True
    if isinstance(f, ast.Name) and f.id == "open":
        return bool(set(_mode(call, 1) or "r") & _WRITE_MODES)
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "os":
        if f.attr == "fdopen":
            return bool(set(_mode(call, 1) or "r") & _WRITE_MODES)
        if f.attr == "open" and len(call.args) > 1:
            flags = list(ast.walk(call.args[1]))
            # flags in a variable are taken for a write (the scan cannot tell)
            return any((isinstance(n, ast.Name) and n.id != "os") or
                       (isinstance(n, ast.Attribute) and n.attr in ("O_WRONLY", "O_RDWR"))
                       for n in flags)
    return False


class _Sites(ast.NodeVisitor):
    """Each write call with the qualified name of its innermost function (Class.method)."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[str, int]] = []

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        if _is_write(node):
            self.found.append((".".join(self.scope) or "<module>", node.lineno))
        self.generic_visit(node)


def sites_in(source: str) -> list[tuple[str, int]]:
    v = _Sites()
    v.visit(ast.parse(source))
    return v.found


def write_sites() -> list[tuple[str, str, int]]:
    """(module, qualified function, line) of every call that opens or writes a file for
    writing, outside the access layer."""
    return [(str(path.relative_to(SRC)), fn, line)
            for path in sorted(SRC.rglob("*.py")) if path != LAYER
            for fn, line in sites_in(path.read_text())]


def test_no_file_is_written_outside_the_access_layer_but_kbps_own() -> None:
    stray = sorted({f"src/kbp/{m}:{line} in {fn}()" for m, fn, line in write_sites()
                    if (m, fn) not in OURS})
    assert not stray, ("written around kbp.system.access.write (use it, or list the file "
                       "in OURS with what it is): " + ", ".join(stray))


def test_every_listed_site_still_writes() -> None:
    """The list does not outlive its sites (a stale entry would let a new write in)."""
    found = {(m, fn) for m, fn, _ in write_sites()}
    assert set(OURS) <= found, sorted(set(OURS) - found)


def test_the_scan_finds_each_kind_of_write(tmp_path: Path) -> None:
    """The scan is not blind: each form of write in a sample module is found."""
    src = '''
import os
from pathlib import Path
def a(p): Path(p).write_text("1")
def b(p):
    with open(p, "w") as f: f.write("1")
def c(p): os.open(p, os.O_WRONLY | os.O_TRUNC)
def c2(p, flags): os.open(p, flags)
def d(fd): os.fdopen(fd, "w")
def e(p): open(p, mode="a")
def reads(p):
    open(p).read(); open(p, "r"); os.open(p, os.O_RDONLY); Path(p).read_text()
'''
    hits = [fn for fn, _ in sites_in(src)]
    assert hits == ["a", "b", "c", "c2", "d", "e"], hits
