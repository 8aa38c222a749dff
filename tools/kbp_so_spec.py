#!/usr/bin/env python3
"""Generate what outsource/guest/kbp_so_proc.yaml describes, or check that it is up to date.

The spec says what /proc/kbp_so reports (the module line's keys, the socket line's keys, in
order, with their types and docs) and the module parameters' ranges. From it this script
writes

* ``outsource/guest/kbp_so_spec.h``: the ranges (``KBP_SO_IDLE_POLL_US_MAX`` ...), the
  module line's keys and the socket counters as enums (kbp_so_proc.c fills a line by key and
  prints it in a loop; ``struct kbp_so_stats`` is an array by counter);
* ``outsource/guest/kbp_so_spec.c``: their names in the file;
* ``src/kbp/outsource/_spec.py``: the same for kbpctl (procfile.py's parser, idle.py's range).

Usage::

    python3 tools/kbp_so_spec.py gen      # write the three files
    python3 tools/kbp_so_spec.py check    # exit 1, naming them, when one is stale (make lint)

It reads the spec with kbp_spec.py's YAML reader (standard library only) and refuses what it
does not render (an unknown key, type or group), as kbp_spec.py does.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbp_spec import SpecError, c_upper, changed, cli, load_yaml, one_line, py_name, write_changed

ROOT = Path(__file__).resolve().parents[1]
SPEC = Path("outsource/guest/kbp_so_proc.yaml")
HEADER = Path("outsource/guest/kbp_so_spec.h")
SOURCE = Path("outsource/guest/kbp_so_spec.c")
PY = Path("src/kbp/outsource/_spec.py")
TYPES = ("text", "u32", "s32", "u64", "s64")
GROUPS = ("", "identity", "completions", "policy")


@dataclass(frozen=True)
class Key:
    name: str      # as in the spec: idle-poll-us
    type: str      # one of TYPES
    group: str     # one of GROUPS
    doc: str

    @property
    def proc(self) -> str:
        """As /proc/kbp_so writes it: idle_poll_us."""
        return py_name(self.name)


@dataclass(frozen=True)
class Spec:
    consts: tuple[tuple[str, int, str], ...]   # (name, value, doc)
    module: tuple[Key, ...]
    sock: tuple[Key, ...]


def _only(d: Any, allowed: set[str], what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise SpecError(f"{what}: a mapping, not {d!r}")
    extra = set(d) - allowed
    if extra:
        raise SpecError(f"{what}: unknown keys {sorted(extra)}")
    return d


def _keys(raw: Any, what: str) -> tuple[Key, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{what}: a non-empty list")
    out = []
    for item in raw:
        d = _only(item, {"name", "type", "group", "doc"}, what)
        k = Key(str(d["name"]), str(d.get("type", "")), str(d.get("group", "")),
                one_line(str(d.get("doc", ""))))
        if k.type not in TYPES:
            raise SpecError(f"{what}: {k.name}: type {k.type!r}, not one of {TYPES}")
        if k.group not in GROUPS:
            raise SpecError(f"{what}: {k.name}: group {k.group!r}, not one of {GROUPS}")
        if not k.doc:
            raise SpecError(f"{what}: {k.name} has no doc")
        out.append(k)
    names = [k.name for k in out]
    if len(set(names)) != len(names):
        raise SpecError(f"{what}: a key named twice")
    return tuple(out)


def parse(raw: Any) -> Spec:
    d = _only(raw, {"name", "definitions", "module-line", "sock-line"}, "the spec")
    consts = []
    for c in d.get("definitions") or []:
        c = _only(c, {"name", "value", "doc"}, "definitions")
        if not isinstance(c["value"], int):
            raise SpecError(f"definitions: {c['name']}: an integer value")
        consts.append((str(c["name"]), c["value"], one_line(str(c.get("doc", "")))))
    sock = _keys(d["sock-line"], "sock-line")
    counters = [k for k in sock if k.group != "identity"]
    if any(k.type == "text" or k.group for k in counters):
        raise SpecError("sock-line: after the identity keys, counters only (numbers, no group)")
    return Spec(tuple(consts), _keys(d["module-line"], "module-line"), sock)


def load(root: Path = ROOT) -> Spec:
    return parse(load_yaml((root / SPEC).read_text(), str(SPEC)))


def _comment(doc: str, indent: str = "") -> list[str]:
    lines = textwrap.wrap(doc, 76 - len(indent))
    return [f"{indent}/* {lines[0]} */"] if len(lines) == 1 else (
        [f"{indent}/*"] + [f"{indent} * {ln}" for ln in lines] + [f"{indent} */"])


def _macro(name: str, items: list[str]) -> list[str]:
    """A multi-line #define with its backslashes at one tab stop."""
    lines = [name, *[f"\t{it}" for it in items]]
    width = max(len(ln.expandtabs(8)) for ln in lines)
    target = (width // 8 + 1) * 8
    out = []
    for ln in lines[:-1]:
        n = len(ln.expandtabs(8))
        out.append(ln + "\t" * ((target - (n - n % 8)) // 8) + "\\")
    return [*out, lines[-1]]


def _enum(name: str, members: list[str], nr: str) -> list[str]:
    return [f"enum {name} {{", *[f"\t{m}," for m in members], f"\t{nr}", "};", ""]


def render_header(spec: Spec) -> str:
    out = ["/* SPDX-License-Identifier: GPL-2.0-only */",
           "/*",
           f" * Generated from {SPEC} by tools/kbp_so_spec.py gen: do not edit.",
           " * /proc/kbp_so's keys and the module parameters' ranges, as kbpctl reads them",
           " * (src/kbp/outsource/_spec.py).",
           " */",
           "#ifndef _KBP_SO_SPEC_H",
           "#define _KBP_SO_SPEC_H",
           "",
           "#include <linux/types.h>",
           ""]
    for name, value, doc in spec.consts:
        out += [*_comment(doc), f"#define KBP_SO_{c_upper(name)}\t{value}"]
    out += [""]
    out += _comment("The module line's keys after \"kbp_so\", in order (what each means: "
                    f"{SPEC.name}).")
    out += _enum("kbp_so_key", [f"KBP_SO_K_{c_upper(k.name)}" for k in spec.module],
                 "KBP_SO_NR_KEYS")
    counters = [k for k in spec.sock if k.group != "identity"]
    out += _comment("The socket line's counters after its names, in order: struct "
                    "kbp_so_stats' atomic64_t c[] (what each counts: "
                    f"{SPEC.name}).")
    out += _enum("kbp_so_stat", [f"KBP_SO_ST_{c_upper(k.name)}" for k in counters],
                 "KBP_SO_NR_STATS")
    out += ["/* Their names in the file (kbp_so_spec.c); text: a word, not a number. */",
            "struct kbp_so_key_desc {", "\tconst char *key;", "\tbool text;", "};", "",
            "extern const struct kbp_so_key_desc kbp_so_keys[KBP_SO_NR_KEYS];",
            "extern const char * const kbp_so_stat_keys[KBP_SO_NR_STATS];"]
    out += ["", "#endif /* _KBP_SO_SPEC_H */", ""]
    return "\n".join(out)


def render_c(spec: Spec) -> str:
    counters = [k for k in spec.sock if k.group != "identity"]
    out = ["// SPDX-License-Identifier: GPL-2.0-only",
           "/*",
           f" * Generated from {SPEC} by tools/kbp_so_spec.py gen: do not edit.",
           " * The names /proc/kbp_so writes its keys under (kbp_so_proc.c).",
           " */",
           '#include "kbp_so_spec.h"',
           "",
           "const struct kbp_so_key_desc kbp_so_keys[KBP_SO_NR_KEYS] = {"]
    out += [f"\t[KBP_SO_K_{c_upper(k.name)}] = {{ \"{k.proc}\", "
            f"{'true' if k.type == 'text' else 'false'} }},"
            for k in spec.module]
    out += ["};", "", "const char * const kbp_so_stat_keys[KBP_SO_NR_STATS] = {"]
    out += [f"\t[KBP_SO_ST_{c_upper(k.name)}] = \"{k.proc}\"," for k in counters]
    out += ["};", ""]
    return "\n".join(out)


def _py_key(k: Key) -> str:
    return f"    Key({k.proc!r}, {k.type!r}, {k.group!r},\n        {k.doc!r}),"


def render_python(spec: Spec) -> str:
    out = ['"""/proc/kbp_so\'s keys and kbp_so\'s parameter ranges, as the guest module writes '
           'them.', "",
           f"Generated from {SPEC} by ``tools/kbp_so_spec.py gen``: do not edit. The",
           "module prints the same keys in the same order (outsource/guest/kbp_so_spec.h).",
           '"""', "",
           "from __future__ import annotations", "",
           "from typing import Final, NamedTuple", "", "",
           "class Key(NamedTuple):",
           '    """One key=value of a /proc/kbp_so line."""', "",
           "    name: str    # as the file writes it: idle_poll_us",
           "    type: str    # text, u32, s32, u64, s64",
           "    group: str   # '', identity, completions, policy",
           "    doc: str", "", ""]
    for name, value, doc in spec.consts:
        out += [f"#: {doc}", f"{c_upper(name)}: Final = {value}"]
    out += ["", "#: the module line (after ``kbp_so``), in order",
            "MODULE_KEYS: Final[tuple[Key, ...]] = ("]
    out += [_py_key(k) for k in spec.module]
    out += [")", "#: a socket's line (after ``sock``), in order",
            "SOCK_KEYS: Final[tuple[Key, ...]] = ("]
    out += [_py_key(k) for k in spec.sock]
    out += [")", ""]
    return "\n".join(out)


def outputs(spec: Spec) -> dict[Path, str]:
    return {HEADER: render_header(spec), SOURCE: render_c(spec), PY: render_python(spec)}


def stale(root: Path = ROOT) -> list[Path]:
    return changed(outputs(load(root)), root)


def generate(root: Path = ROOT) -> list[Path]:
    return write_changed(outputs(load(root)), root)


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, doc=__doc__ or "", tool="tools/kbp_so_spec.py", spec=SPEC,
               outputs_of=lambda root: outputs(load(root)))


if __name__ == "__main__":
    sys.exit(main())
