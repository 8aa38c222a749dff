#!/usr/bin/env python3
"""Generate what module/netlink/kbp.yaml describes, or check that it is up to date.

The spec of the generic netlink family "kbp" is written in the kernel's YNL format
(Documentation/netlink/genetlink-legacy.yaml). From it this script writes

* ``module/uapi/kbp.h``: the uapi header (enums, commands, attribute sets, their docs);
* ``module/kbp_spec.h``: the definitions of scope ``kernel``, the knobs' ranges and defaults;
* ``module/kbp_genl_policy.h``: the input policy of kbp_genl.c (the attributes of every
  request, with their types);
* ``src/kbp/_spec.py``: all of it for kbpctl (kmod.py's message classes, names.py's ids,
  ranges and defaults, netap.py's constants).

Usage::

    python3 tools/kbp_spec.py gen      # write the four files
    python3 tools/kbp_spec.py check    # exit 1, naming them, when one is stale (make lint)

Standard library only: it reads the spec with its own reader of the YAML the spec is written
in (block mappings and sequences, ``|`` blocks, flow lists of plain scalars, plain and quoted
scalars, decimal integers, simple anchors and aliases) and refuses anything else, so it runs
where PyYAML is not installed (kbp's venv); tests/kbpctl/test_spec.py checks that PyYAML reads
the spec the same. It knows the parts of the schema that the spec uses and refuses the rest,
rather than ignoring what it would not render.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPEC = Path("module/netlink/kbp.yaml")
UAPI_H = Path("module/uapi/kbp.h")
CONSTS_H = Path("module/kbp_spec.h")
POLICY_H = Path("module/kbp_genl_policy.h")
PY = Path("src/kbp/_spec.py")
OUTPUTS = (UAPI_H, CONSTS_H, POLICY_H, PY)


class SpecError(Exception):
    """The spec cannot be read, or says something this generator does not render."""


# -- the YAML reader ---------------------------------------------------------------------
_KEY = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*):(?:[ ]+(.*))?$")
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)$")
# plain scalars that YAML 1.1 (PyYAML) would not read as the string or integer we would
_AMBIGUOUS = re.compile(r"(?i)(y|n|yes|no|on|off|null|~|[-+]?[0-9][0-9_]*(\.[0-9_]*)?"
                        r"([eE][-+]?[0-9]+)?|0[xob][0-9a-f_]+|[-+]?\.inf|\.nan|"
                        r"[0-9]+(:[0-5]?[0-9])+)$")


@dataclass
class _Line:
    no: int      # 1-based
    indent: int
    text: str    # without the indentation


class _Reader:
    def __init__(self, text: str, where: str) -> None:
        self.where = where
        self.raw = text.split("\n")
        self.i = 0
        self.anchors: dict[str, Any] = {}

    def fail(self, no: int, msg: str) -> SpecError:
        return SpecError(f"{self.where}:{no}: {msg}")

    def peek(self) -> _Line | None:
        """The next line that is not blank nor a comment (not consumed)."""
        while self.i < len(self.raw):
            line = self.raw[self.i]
            body = line.lstrip(" ")
            if "\t" in line[:len(line) - len(body)] or body.startswith("\t"):
                raise self.fail(self.i + 1, "tab in indentation")
            if not body.strip() or body.startswith("#"):
                self.i += 1
                continue
            if self.i == 0 and (body.startswith("%YAML") or body.rstrip() == "---"):
                self.i += 1
                continue
            if body.rstrip() == "---" and not any(r.strip() and not r.lstrip().startswith("#")
                                                  for r in self.raw[:self.i]):
                self.i += 1
                continue
            return _Line(self.i + 1, len(line) - len(body), body.rstrip())
        return None

    def document(self) -> Any:
        first = self.peek()
        if first is None:
            raise self.fail(1, "empty document")
        if first.indent:
            raise self.fail(first.no, "the document must start in column 0")
        node = self.node(first.indent)
        rest = self.peek()
        if rest is not None:
            raise self.fail(rest.no, "unexpected indentation")
        return node

    def node(self, indent: int) -> Any:
        line = self.peek()
        assert line is not None and line.indent == indent
        if line.text == "-" or line.text.startswith("- "):
            return self.sequence(indent)
        return self.mapping(indent)

    def sequence(self, indent: int) -> list[Any]:
        items: list[Any] = []
        while (line := self.peek()) is not None and line.indent == indent:
            if not (line.text == "-" or line.text.startswith("- ")):
                break
            rest = line.text[1:].lstrip(" ")
            if not rest or rest.startswith("#"):
                self.i += 1
                nxt = self.peek()
                if nxt is None or nxt.indent <= indent:
                    raise self.fail(line.no, "empty sequence item")
                items.append(self.node(nxt.indent))
                continue
            col = indent + len(line.text) - len(rest)
            if _KEY.match(rest):
                # "- key: value ...": a mapping whose first key sits at column col
                self.raw[self.i] = " " * col + rest
                items.append(self.mapping(col))
            else:
                self.i += 1
                items.append(self.inline(rest, line.no))
        line = self.peek()
        if line is not None and line.indent > indent:
            raise self.fail(line.no, "unexpected indentation")
        return items

    def mapping(self, indent: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while (line := self.peek()) is not None and line.indent == indent:
            if line.text == "-" or line.text.startswith("- "):
                break
            m = _KEY.match(line.text)
            if not m:
                raise self.fail(line.no, f"expected 'key: value', got {line.text!r}")
            key, rest = m.group(1), (m.group(2) or "").strip()
            if key in out:
                raise self.fail(line.no, f"duplicate key {key!r}")
            self.i += 1
            out[key] = self.value(rest, indent, line.no)
        line = self.peek()
        if line is not None and line.indent > indent:
            raise self.fail(line.no, "unexpected indentation")
        return out

    def value(self, rest: str, indent: int, no: int) -> Any:
        anchor = None
        if rest.startswith("&"):
            anchor, _, rest = rest[1:].partition(" ")
            rest = rest.strip()
            if not re.fullmatch(r"[A-Za-z0-9_-]+", anchor):
                raise self.fail(no, f"bad anchor {anchor!r}")
        if rest.startswith("#"):
            rest = ""
        if rest.startswith("*"):
            name = rest[1:]
            if anchor or name not in self.anchors:
                raise self.fail(no, f"unknown alias {rest!r}")
            return self.anchors[name]
        if rest in ("|", "|-"):
            val: Any = self.block(indent, keep=rest == "|")
        elif rest:
            val = self.inline(rest, no)
        else:
            nxt = self.peek()
            if nxt is None or nxt.indent < indent or (
                    nxt.indent == indent and not (nxt.text == "-" or nxt.text.startswith("- "))):
                raise self.fail(no, "empty value (write null, or quote an empty string)")
            val = self.node(nxt.indent)
        if anchor:
            self.anchors[anchor] = val
        return val

    def block(self, indent: int, keep: bool) -> str:
        lines: list[str] = []
        start = self.i
        block_indent = None
        while self.i < len(self.raw):
            line = self.raw[self.i]
            if not line.strip():
                lines.append("")
                self.i += 1
                continue
            ind = len(line) - len(line.lstrip(" "))
            if block_indent is None:
                if ind <= indent:
                    break
                block_indent = ind
            if ind < block_indent:
                break
            lines.append(line[block_indent:].rstrip())
            self.i += 1
        while lines and not lines[-1]:
            lines.pop()
        if not lines:
            raise self.fail(start, "empty block scalar")
        return "\n".join(lines) + ("\n" if keep else "")

    def inline(self, text: str, no: int) -> Any:
        if text.startswith("["):
            end = text.find("]")
            if end < 0 or not _comment_or_nothing(text[end + 1:]):
                raise self.fail(no, "a flow sequence must end on its line")
            inner = text[1:end].strip()
            if not inner:
                return []
            return [self.scalar(item.strip(), no) for item in inner.split(",")]
        if text[0] in "\"'":
            q = text[0]
            m = (re.match(r'"((?:[^"\\]|\\.)*)"(.*)$', text) if q == '"'
                 else re.match(r"'((?:[^']|'')*)'(.*)$", text))
            if not m or not _comment_or_nothing(m.group(2)):
                raise self.fail(no, f"bad quoted string {text!r}")
            if q == "'":
                return m.group(1).replace("''", "'")
            return json.loads(f'"{m.group(1)}"')
        cut = re.search(r"\s#", text)
        return self.scalar(text[:cut.start()] if cut else text, no)

    def scalar(self, text: str, no: int) -> Any:
        text = text.strip()
        if not text:
            raise self.fail(no, "empty scalar")
        if text in ("true", "false"):
            return text == "true"
        if _INT.match(text):
            return int(text)
        if text[0] in "&*!|>%@`{}[],\"'#?:-" and not re.match(r"-[^ ]", text):
            raise self.fail(no, f"plain scalar {text!r} starts with a YAML indicator: quote it")
        if _AMBIGUOUS.match(text) or ": " in text or text.endswith(":"):
            raise self.fail(no, f"plain scalar {text!r} is ambiguous in YAML: quote it")
        return text


def _comment_or_nothing(tail: str) -> bool:
    tail = tail.strip()
    return not tail or tail.startswith("#")


def load_yaml(text: str, where: str = "<spec>") -> Any:
    """The spec's YAML as Python data (dicts, lists, str, int, bool)."""
    return _Reader(text, where).document()


# -- the model ---------------------------------------------------------------------------
def c_upper(name: str) -> str:
    return name.upper().replace("-", "_").replace(" ", "")


def c_lower(name: str) -> str:
    return name.lower().replace("-", "_")


def py_name(name: str) -> str:
    """A spec name as kbpctl spells it (knobs: linger-us -> linger_us)."""
    return name.replace("-", "_")


@dataclass(frozen=True)
class Entry:
    name: str
    value: int
    c_name: str
    doc: str = ""


@dataclass(frozen=True)
class Enum:
    name: str
    c_name: str        # enum kbp_mode
    entries: tuple[Entry, ...]
    doc: str = ""


@dataclass(frozen=True)
class Const:
    name: str
    value: int
    c_name: str
    scope: str          # uapi, kernel (or user)
    header: str = ""    # defined by that header already: not rendered in C
    doc: str = ""


@dataclass(frozen=True)
class Attr:
    name: str
    value: int
    c_name: str
    type: str
    doc: str = ""
    enum: str = ""
    nested: str = ""
    multi: bool = False
    checks: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AttrSet:
    name: str
    prefix: str          # C: KBP_A_
    c_name: str          # enum kbp_attr ("" for a subset)
    attrs: tuple[Attr, ...]
    subset_of: str = ""
    doc: str = ""

    def by_name(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)


@dataclass(frozen=True)
class Op:
    name: str
    value: int
    c_name: str
    doc: str
    flags: tuple[str, ...] = ()
    request: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # do/dump ->
    reply: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    attr_set: str = ""

    @property
    def reserved(self) -> bool:
        return not self.request and not self.reply and not self.attr_set


@dataclass(frozen=True)
class Spec:
    name: str
    version: int
    doc: str
    fam_define: str
    ver_define: str
    enums: tuple[Enum, ...]
    consts: tuple[Const, ...]
    sets: tuple[AttrSet, ...]
    ops: tuple[Op, ...]
    op_enum: str
    op_prefix: str
    op_cnt: str
    op_max: str
    policy_set: str

    def set(self, name: str) -> AttrSet:
        for s in self.sets:
            if s.name == name:
                return s
        raise KeyError(name)

    def enum(self, name: str) -> Enum:
        for e in self.enums:
            if e.name == name:
                return e
        raise KeyError(name)

    def const(self, name: str) -> Const:
        for c in self.consts:
            if c.name == name:
                return c
        raise KeyError(name)

    def members(self, s: AttrSet) -> tuple[Attr, ...]:
        """The attributes of a set; a subset's are its parent's."""
        if not s.subset_of:
            return s.attrs
        parent = self.set(s.subset_of)
        return tuple(parent.by_name(a.name) for a in s.attrs)

    def limit(self, value: Any) -> tuple[int, str]:
        """A check's limit: (its value, its C spelling)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return value, str(value)
        m = re.fullmatch(r"([0-9A-Za-z_-]+)( - 1)?", str(value))
        if not m:
            raise SpecError(f"bad limit {value!r}")
        name, minus = m.group(1), 1 if m.group(2) else 0
        try:
            c = self.const(name)
        except KeyError:
            t = re.fullmatch(r"([us])(8|16|32|64)-(min|max)", name)
            if not t:
                raise SpecError(f"limit {value!r} names no definition") from None
            bits, signed = int(t.group(2)), t.group(1) == "s"
            lo = -(1 << (bits - 1)) if signed else 0
            hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
            n, spelling = (lo if t.group(3) == "min" else hi), c_upper(name)
        else:
            n, spelling = c.value, c.c_name
        return n - minus, spelling + (" - 1" if minus else "")


TOP_KEYS = {"name", "doc", "protocol", "version", "c-family-name", "c-version-name",
            "kernel-policy", "max-by-define", "definitions", "attribute-sets", "operations",
            "uapi-header"}
DEF_KEYS = {"type", "name", "doc", "value", "value-start", "entries", "scope", "header",
            "enum-name", "name-prefix"}
SET_KEYS = {"name", "name-prefix", "enum-name", "doc", "attributes", "subset-of"}
ATTR_KEYS = {"name", "type", "doc", "value", "enum", "nested-attributes", "multi-attr",
             "checks"}
CHECK_KEYS = {"min", "max", "max-len", "unterminated-ok"}
OPS_KEYS = {"name-prefix", "enum-name", "list"}
OP_KEYS = {"name", "doc", "value", "attribute-set", "flags", "do", "dump"}
#: the attribute types this generator renders, with their netlink policy type
POLICY_TYPES = {"u8": "NLA_U8", "u16": "NLA_U16", "u32": "NLA_U32", "u64": "NLA_U64",
                "s8": "NLA_S8", "s16": "NLA_S16", "s32": "NLA_S32", "s64": "NLA_S64",
                "flag": "NLA_FLAG", "string": "NLA_NUL_STRING", "binary": "NLA_BINARY",
                "nest": "NLA_NESTED", "pad": "", "unused": ""}


def _keys(d: Any, allowed: set[str], what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise SpecError(f"{what}: a mapping expected")
    extra = set(d) - allowed
    if extra:
        raise SpecError(f"{what}: {', '.join(sorted(extra))}: not in the schema, or not "
                        "rendered by tools/kbp_spec.py")
    return d


def _names(v: Any, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise SpecError(f"{what}: a list of names expected")
    return tuple(v)


def _doc(d: Mapping[str, Any]) -> str:
    doc = d.get("doc", "")
    if not isinstance(doc, str):
        raise SpecError(f"{d.get('name')}: doc must be a string")
    return doc.strip()


def parse(raw: Any) -> Spec:
    """The spec's data as the model, validated."""
    top = _keys(raw, TOP_KEYS, "the spec")
    for k in ("name", "doc", "attribute-sets", "operations"):
        if k not in top:
            raise SpecError(f"the spec: {k} missing")
    if top.get("protocol") != "genetlink-legacy":
        raise SpecError("protocol: genetlink-legacy expected (version, kernel-policy)")
    if top.get("kernel-policy") != "global" or top.get("max-by-define") is not True:
        raise SpecError("kernel-policy: global and max-by-define: true expected")
    fam = str(top["name"])
    enums: list[Enum] = []
    consts: list[Const] = []
    for i, d in enumerate(top.get("definitions", [])):
        d = _keys(d, DEF_KEYS, f"definitions[{i}]")
        name = d["name"]
        if d["type"] == "enum":
            prefix = c_upper(d.get("name-prefix", f"{fam}-{name}-"))
            val = d.get("value-start", 0)
            entries = []
            for e in d["entries"]:
                e = {"name": e} if isinstance(e, str) else _keys(e, {"name", "value", "doc"},
                                                                 f"enum {name}")
                val = e.get("value", val)
                entries.append(Entry(e["name"], val, prefix + c_upper(e["name"]), _doc(e)))
                val += 1
            enums.append(Enum(name, c_lower(d.get("enum-name", f"{fam}-{name}")),
                              tuple(entries), _doc(d)))
        elif d["type"] == "const":
            if not isinstance(d["value"], int) or isinstance(d["value"], bool):
                raise SpecError(f"const {name}: only integer constants are rendered")
            header = d.get("header", "")
            consts.append(Const(name, d["value"],
                                c_upper(name) if header else c_upper(f"{fam}-{name}"),
                                d.get("scope", "uapi"), header, _doc(d)))
        else:
            raise SpecError(f"definition {name}: type {d['type']} is not rendered")
    sets: list[AttrSet] = []
    for d in top["attribute-sets"]:
        d = _keys(d, SET_KEYS, f"attribute set {d.get('name')}")
        sub = d.get("subset-of", "")
        prefix = c_upper(d.get("name-prefix", f"{fam}-{d['name']}-a-"))
        attrs = []
        val = 1
        for a in d["attributes"]:
            a = _keys(a, ATTR_KEYS, f"attribute {d['name']}.{a.get('name')}")
            if sub:
                if set(a) != {"name"}:
                    raise SpecError(f"subset {d['name']}: only attribute names")
                attrs.append(Attr(a["name"], 0, "", ""))
                continue
            val = a.get("value", val)
            if a["type"] not in POLICY_TYPES:
                raise SpecError(f"attribute {a['name']}: type {a['type']} is not rendered")
            checks = _keys(a.get("checks", {}), CHECK_KEYS, f"checks of {a['name']}")
            attrs.append(Attr(a["name"], val, prefix + c_upper(a["name"]), a["type"], _doc(a),
                              a.get("enum", ""), a.get("nested-attributes", ""),
                              bool(a.get("multi-attr", False)), checks))
            val += 1
        sets.append(AttrSet(d["name"], "" if sub else prefix,
                            "" if sub else c_lower(d.get("enum-name", f"{fam}-{d['name']}")),
                            tuple(attrs), sub, _doc(d)))
    opsd = _keys(top["operations"], OPS_KEYS, "operations")
    op_prefix = c_upper(opsd.get("name-prefix", f"{fam}-cmd-"))
    ops: list[Op] = []
    val = 1
    for o in opsd["list"]:
        o = _keys(o, OP_KEYS, f"operation {o.get('name')}")
        val = o.get("value", val)
        req: dict[str, tuple[str, ...]] = {}
        rep: dict[str, tuple[str, ...]] = {}
        for mode in ("do", "dump"):
            if mode in o:
                m = _keys(o[mode], {"request", "reply"}, f"{o['name']} {mode}")
                for part, out in (("request", req), ("reply", rep)):
                    if part in m:
                        p = _keys(m[part], {"attributes"}, f"{o['name']} {mode} {part}")
                        out[mode] = _names(p.get("attributes", []), f"{o['name']} {part}")
                if not m:
                    req[mode] = ()
        ops.append(Op(o["name"], val, op_prefix + c_upper(o["name"]), _doc(o),
                      tuple(o.get("flags", [])), req, rep, o.get("attribute-set", "")))
        val += 1
    spec = Spec(fam, int(top.get("version", 1)), str(top["doc"]).strip(),
                c_upper(top.get("c-family-name", f"{fam}-family-name")),
                c_upper(top.get("c-version-name", f"{fam}-family-version")),
                tuple(enums), tuple(consts), tuple(sets), tuple(ops),
                c_lower(opsd.get("enum-name", f"{fam}-cmd")), op_prefix,
                f"__{op_prefix}MAX", f"{op_prefix}MAX", "")
    _validate(spec)
    pol = {o.attr_set for o in spec.ops if not o.reserved}
    if len(pol) != 1:
        raise SpecError("kernel-policy global: every operation must use one attribute set")
    return dataclasses.replace(spec, policy_set=pol.pop())


def _validate(spec: Spec) -> None:
    names: dict[str, str] = {}

    def claim(c_name: str, what: str) -> None:
        if c_name in names:
            raise SpecError(f"{what}: C name {c_name} is also {names[c_name]}'s")
        names[c_name] = what

    for e in spec.enums:
        for x in e.entries:
            claim(x.c_name, f"enum {e.name}")
    for c in spec.consts:
        if c.scope not in ("uapi", "kernel", "user"):
            raise SpecError(f"const {c.name}: scope {c.scope}")
        claim(c.c_name, f"const {c.name}")
    for o in spec.ops:
        claim(o.c_name, f"operation {o.name}")
        if len(set(o.reply.values())) > 1:
            raise SpecError(f"operation {o.name}: do and dump replies differ: not rendered "
                            "(kbpctl reads one reply per command)")
        if not o.reserved:
            s = spec.set(o.attr_set)
            for lst in (*o.request.values(), *o.reply.values()):
                for a in lst:
                    s.by_name(a)
    for s in spec.sets:
        if s.subset_of:
            spec.members(s)
            continue
        values = [a.value for a in s.attrs]
        if values != sorted(set(values)):
            raise SpecError(f"attribute set {s.name}: values must increase")
        for a in s.attrs:
            claim(a.c_name, f"attribute {s.name}.{a.name}")
            if a.enum:
                spec.enum(a.enum)
            if (a.type == "nest") != bool(a.nested):
                raise SpecError(f"attribute {a.name}: nested-attributes goes with type nest")
            if a.nested:
                spec.set(a.nested)
            for k in ("min", "max"):
                if k in a.checks:
                    spec.limit(a.checks[k])
            if "max-len" in a.checks:
                spec.limit(a.checks["max-len"])


# -- rendering: C ------------------------------------------------------------------------
GENERATED = ("/* Do not edit directly, auto-generated from: */",
             f"/*\t{SPEC} */",
             "/* by tools/kbp_spec.py gen */")


def _col(text: str, start: int = 0) -> int:
    """The column after text (tabs at 8) that starts at column start."""
    col = start
    for ch in text:
        col = (col // 8 + 1) * 8 if ch == "\t" else col + 1
    return col


def _block_comment(doc: str, indent: str = "") -> list[str]:
    """A kernel-style comment of doc above what it describes (its lines kept)."""
    lines = doc.strip("\n").split("\n")
    if len(lines) == 1 and _col(f"{indent}/* {lines[0]} */") <= 80:
        return [f"{indent}/* {lines[0]} */"]
    return [f"{indent}/*", *(f"{indent} * {ln}".rstrip() for ln in lines), f"{indent} */"]


def _trailing(code: str, text: str, indent: str = "\t", col: int = 32) -> list[str]:
    """code, then text in a comment beside it: at column col (or the next tab stop past the
    code), wrapped at 80 columns with the continuation lines under it."""
    line = indent + code
    if not text:
        return [line]
    while True:
        line += "\t"
        if _col(line) >= col:
            break
    at = _col(line)
    pad = "\t" * (at // 8) + " " * (at % 8)
    words = " ".join(text.split())
    if at + len(words) + 6 <= 80:
        return [f"{line}/* {words} */"]
    width = 80 - at - 3
    parts = textwrap.wrap(words, width, break_long_words=False, break_on_hyphens=False)
    if len(parts) == 1:     # too long for one line with its "*/": two lines, not a lone "*/"
        w = words.split(" ")
        cut = min(range(1, len(w)), key=lambda i: abs(len(" ".join(w[:i])) - len(words) / 2))
        parts = [" ".join(w[:cut]), " ".join(w[cut:])]
    out = [f"{line}/* {parts[0]}"]
    out += [f"{pad} * {p}" for p in parts[1:]]
    out.append(f"{pad} */")
    return out


def _define(name: str, value: str) -> str:
    line = f"#define {name}"
    tabs = "\t"
    while _col(line + tabs) < 32:
        tabs += "\t"
    return f"{line}{tabs}{value}"


def _c_value(v: int) -> str:
    return f"({v})" if v < 0 else str(v)


def _directions(spec: Spec) -> dict[str, str]:
    """Per attribute of the policy set: input, output or both, from the operations."""
    into: set[str] = set()
    out: set[str] = set()
    for o in spec.ops:
        for lst in o.request.values():
            into.update(lst)
        for lst in o.reply.values():
            out.update(lst)
    return {a: ("both" if a in into and a in out else "input" if a in into else "output")
            for a in into | out}


def _attr_text(spec: Spec, s: AttrSet, a: Attr, direction: str) -> str:
    if a.type in ("unused", "pad"):
        return ""
    if a.type == "nest":
        inner = spec.set(a.nested)
        what = (", ".join(m.c_name for m in spec.members(inner)) if inner.subset_of
                else f"enum {inner.c_name}")
        text = f"nest of {what}"
    else:
        text = a.type
    if a.enum:
        text += f", enum {spec.enum(a.enum).c_name}"
    if a.doc:
        text += f", {a.doc}"
    if direction in ("input", "output"):
        text += f" ({direction})"
    return text


def render_uapi(spec: Spec) -> str:
    o: list[str] = ["/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */",
                    *GENERATED]
    o += _block_comment(spec.doc if "\n" in spec.doc else spec.doc + "\n")
    guard = f"_UAPI_LINUX_{c_upper(spec.name)}_H"
    o += [f"#ifndef {guard}", f"#define {guard}", "",
          _define(spec.fam_define, f'"{spec.name}"'),
          _define(spec.ver_define, str(spec.version)), ""]
    for e in spec.enums:
        if e.doc:
            o += _block_comment(e.doc)
        o.append(f"enum {e.c_name} {{")
        for x in e.entries:
            o += _trailing(f"{x.c_name} = {x.value},", x.doc)
        o += ["};", ""]
    o.append(f"enum {spec.op_enum} {{")
    val = 0
    for op in spec.ops:
        code = op.c_name + ("," if op.value == val else f" = {op.value},")
        val = op.value + 1
        o += _trailing(code, "" if op.reserved else op.doc)
    o += [f"\t{spec.op_cnt},", "};", "", _define(spec.op_max, f"({spec.op_cnt} - 1)"), ""]
    dirs = _directions(spec)
    for s in spec.sets:
        if s.subset_of:
            continue
        if s.doc:
            o += _block_comment(s.doc)
        o.append(f"enum {s.c_name} {{")
        val = 0
        for a in s.attrs:
            code = a.c_name + ("," if a.value == val else f" = {a.value},")
            val = a.value + 1
            direction = dirs.get(a.name, "") if s.name == spec.policy_set else ""
            o += _trailing(code, _attr_text(spec, s, a, direction))
        cnt = f"__{s.prefix}MAX"
        o += [f"\t{cnt},", "};", "", _define(f"{s.prefix}MAX", f"({cnt} - 1)"), ""]
    for c in spec.consts:
        if c.scope == "uapi" and not c.header:
            if c.doc:
                o += _block_comment(c.doc)
            o += [_define(c.c_name, _c_value(c.value)), ""]
    o.append(f"#endif /* {guard} */")
    return "\n".join(o) + "\n"


def render_consts(spec: Spec) -> str:
    guard = f"_{c_upper(spec.name)}_SPEC_H"
    o = ["/* SPDX-License-Identifier: GPL-2.0 */", *GENERATED]
    o += _block_comment(
        f"The definitions of scope kernel of the family \"{spec.name}\": the ranges and\n"
        "defaults of its knobs.  Plain integers, nothing included: kbp_netap.h, which\n"
        "builds in user space too, includes it.  The attributes' checks in the spec\n"
        "name them; kbp_check_knobs() (kbp_main.c) and kbp_netap_check_params()\n"
        "enforce them.")
    o += [f"#ifndef {guard}", f"#define {guard}", ""]
    for c in spec.consts:
        if c.scope != "kernel" or c.header:
            continue
        if c.doc:
            o += _block_comment(c.doc)
        o.append(_define(c.c_name, _c_value(c.value)))
    o += ["", f"#endif /* {guard} */"]
    return "\n".join(o) + "\n"


def _policy_sets(spec: Spec) -> list[tuple[AttrSet, list[Attr]]]:
    """(set, its attributes in the policy): the global set's, from every request, then the
    sets nested in them (their attributes all)."""
    main = spec.set(spec.policy_set)
    wanted: set[str] = set()
    for o in spec.ops:
        for lst in o.request.values():
            wanted.update(lst)
    out = [(main, [a for a in main.attrs if a.name in wanted])]
    todo = [a.nested for a in out[0][1] if a.nested]
    seen = {main.name}
    while todo:
        s = spec.set(todo.pop(0))
        if s.name in seen:
            continue
        seen.add(s.name)
        members = list(spec.members(s))
        if not s.subset_of:
            out.append((s, [a for a in members if a.type not in ("unused", "pad")]))
        todo += [a.nested for a in members if a.nested]
    return out


def _policy_entry(spec: Spec, a: Attr) -> str:
    pol = POLICY_TYPES[a.type]
    if a.type == "string" and a.checks.get("unterminated-ok"):
        pol = "NLA_STRING"
    text = f"{{ .type = {pol}, "
    if "max-len" in a.checks:
        text += f".len = {spec.limit(a.checks['max-len'])[1]}, "
    return text + "}"


def render_policy(spec: Spec) -> str:
    guard = f"_{c_upper(spec.name)}_GENL_POLICY_H"
    o = ["/* SPDX-License-Identifier: GPL-2.0 */", *GENERATED]
    o += _block_comment(
        f"The input policy of the family \"{spec.name}\" (kernel-policy: global): the\n"
        "attributes of every request with their types, and the policy of each set\n"
        "nested in them, for kbp_genl.c alone.  The knobs' ranges (the spec's checks)\n"
        "are not in it: kbp_check_knobs() (kbp_main.c) enforces them after the\n"
        "CAP_SYS_NICE check, with a message naming the knob and its range and one\n"
        "kernel log line, which a policy refusal would pre-empt.")
    o += [f"#ifndef {guard}", f"#define {guard}", "", "#include <net/netlink.h>", "",
          '#include "uapi/kbp.h"', ""]
    for s, attrs in reversed(_policy_sets(spec)):
        name = s.c_name.removesuffix("_attr") + "_policy"
        o.append(f"static const struct nla_policy {name}[{s.prefix}MAX + 1] = {{")
        for a in attrs:
            key = f"\t[{a.c_name}]"
            tabs = "\t"
            while _col(key + tabs) < 32:
                tabs += "\t"
            o.append(f"{key}{tabs}= {_policy_entry(spec, a)},")
        o += ["};", ""]
    o.append(f"#endif /* {guard} */")
    return "\n".join(o) + "\n"


# -- rendering: Python -------------------------------------------------------------------
def ranges(spec: Spec) -> dict[str, tuple[int, int]]:
    """The knobs' accepted ranges, from the checks of the policy set's attributes."""
    out = {}
    for a in spec.set(spec.policy_set).attrs:
        if "min" not in a.checks and "max" not in a.checks:
            continue
        signed = a.type.startswith("s")
        bits = int(a.type[1:])
        lo = spec.limit(a.checks["min"])[0] if "min" in a.checks else (
            -(1 << (bits - 1)) if signed else 0)
        hi = spec.limit(a.checks["max"])[0] if "max" in a.checks else (
            (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1)
        out[py_name(a.name)] = (lo, hi)
    return out


def _py_doc(text: str, indent: str = "") -> list[str]:
    return [f"{indent}# {ln}".rstrip() for ln in text.strip().split("\n")]


def _q(v: Any) -> str:
    """A Python literal in the repository's style (double quotes)."""
    return json.dumps(v) if isinstance(v, str) else repr(v)


def one_line(doc: str) -> str:
    """A doc on one line, its whitespace collapsed (as the C header's comments have it)."""
    return " ".join(doc.split())


PY_WIDTH = 100    # ruff's line-length (pyproject.toml): _spec.py is linted as src/ is


def _py_wrapped(indent: str, items: Sequence[str], sep: str = " ") -> list[str]:
    """items joined by sep on lines of at most PY_WIDTH columns, each at indent."""
    out: list[str] = []
    line = ""
    for it in items:
        if line and len(indent + line + sep + it) > PY_WIDTH:
            out.append(indent + line)
            line = it
        else:
            line = f"{line}{sep}{it}" if line else it
    return [*out, indent + line] if line else out


def _py_call(indent: str, func: str, args: Sequence[str], doc: str) -> list[str]:
    """``func(args, doc="...")`` within PY_WIDTH columns: a doc that does not fit goes on
    the next line, a long one as adjacent string literals there."""
    head = f"{indent}{func}({', '.join(args)}"
    if not doc:
        return [f"{head}),"]
    text = one_line(doc)
    if len(f"{head}, doc={_q(text)}),") <= PY_WIDTH:
        return [f"{head}, doc={_q(text)}),"]
    cont = " " * (len(indent) + len(func) + 1)
    if len(f"{cont}doc={_q(text)}),") <= PY_WIDTH:
        return [f"{head},", f"{cont}doc={_q(text)}),"]
    pad = f"{cont}doc=("
    parts = textwrap.wrap(text, PY_WIDTH - len(pad) - 8, break_long_words=False,
                          break_on_hyphens=False)
    lits = [_q(x + " ") for x in parts[:-1]] + [_q(parts[-1])]
    return [f"{head},", f"{pad}{lits[0]}", *(" " * len(pad) + x for x in lits[1:-1]),
            " " * len(pad) + f"{lits[-1]})),"]


def replies(spec: Spec) -> dict[str, tuple[str, ...]]:
    """The attributes of each command's reply (its do reply; a dump reply is the same,
    _validate says), for the commands that have one."""
    return {o.name: o.reply.get("do", o.reply.get("dump", ())) for o in spec.ops if o.reply}


def render_python(spec: Spec) -> str:
    o = ['"""The generic netlink family "kbp" as module/netlink/kbp.yaml describes it, for '
         "kbpctl.",
         "",
         "Generated from module/netlink/kbp.yaml by ``tools/kbp_spec.py gen``: do not edit. "
         "The",
         "constants carry their C names (module/uapi/kbp.h, module/kbp_spec.h); the tables "
         "below",
         "give kmod.py its message classes, names.py its ids, ranges, defaults and poller",
         "counters (the attributes' docs, REPLIES), netap.py its constants.",
         '"""',
         "",
         "from __future__ import annotations",
         "",
         "from typing import Final, NamedTuple",
         "",
         "",
         "class Attr(NamedTuple):",
         '    """One attribute of an attribute set."""',
         "",
         "    value: int",
         "    name: str              # the spec's name: linger-us",
         "    c_name: str            # its uapi name: KBP_A_LINGER_US",
         "    type: str              # the spec's type: unused, pad, u32, u64, s32, string, nest",
         "    nested: str = \"\"       # nest: the attribute set inside",
         "    enum: str = \"\"         # the enum of its values (ENUMS)",
         "    multi: bool = False    # it may come more than once",
         "    doc: str = \"\"          # the spec's doc, on one line (counters: \"counter: ...\")",
         "",
         "",
         f"FAMILY: Final = {_q(spec.name)}",
         f"VERSION: Final = {spec.version}",
         "",
         "# -- module/uapi/kbp.h",
         f"{spec.fam_define}: Final = {_q(spec.name)}",
         f"{spec.ver_define}: Final = {spec.version}"]
    for e in spec.enums:
        o.append(f"# enum {e.c_name}")
        o += [f"{x.c_name}: Final = {x.value}" for x in e.entries]
    o.append(f"# enum {spec.op_enum}")
    o += [f"{op.c_name}: Final = {op.value}" for op in spec.ops]
    for s in spec.sets:
        if not s.subset_of:
            o.append(f"# enum {s.c_name}")
            o += [f"{a.c_name}: Final = {a.value}" for a in s.attrs]
    for c in spec.consts:
        if c.scope == "uapi" and not c.header:
            o += _py_doc(c.doc)
            o.append(f"{c.c_name}: Final = {c.value}")
    o += ["", "# -- module/kbp_spec.h (scope kernel) and the kernel's own constants"]
    for c in spec.consts:
        if c.scope != "uapi" or c.header:
            o += _py_doc(c.doc) if c.doc else []
            o.append(f"{c.c_name}: Final = {c.value}")
    o += ["", "#: enums by name: entry -> value",
          "ENUMS: Final[dict[str, dict[str, int]]] = {"]
    for e in spec.enums:
        items = ", ".join(f"{_q(x.name)}: {x.value}" for x in e.entries)
        o.append(f"    {_q(e.name)}: {{{items}}},")
    o += ["}", "#: commands: name -> value", "COMMANDS: Final[dict[str, int]] = {"]
    o += [f"    {_q(op.name)}: {op.value}," for op in spec.ops]
    o += ["}", "#: attribute sets by name (a subset: the attributes of its set that it holds)",
          "ATTRIBUTE_SETS: Final[dict[str, tuple[Attr, ...]]] = {"]
    for s in spec.sets:
        o.append(f"    {_q(s.name)}: (")
        for a in spec.members(s):
            args = [str(a.value), _q(a.name), _q(a.c_name), _q(a.type)]
            if a.nested or a.enum or a.multi:
                args.append(_q(a.nested))
            if a.enum or a.multi:
                args.append(_q(a.enum))
            if a.multi:
                args.append("True")
            o += _py_call("        ", "Attr", args, a.doc)
        o.append("    ),")
    o += ["}", "#: the attributes of each command's reply, in their order (a do and a dump "
          "reply alike)", "REPLIES: Final[dict[str, tuple[str, ...]]] = {"]
    for op, attrs in replies(spec).items():
        o.append(f"    {_q(op)}: (")
        o += _py_wrapped("        ", [f"{_q(a)}," for a in attrs])
        o.append("    ),")
    o += ["}", "#: the knobs' accepted ranges (their attributes' checks): knob -> (min, max)",
          "RANGES: Final[dict[str, tuple[int, int]]] = {"]
    o += [f"    {_q(k)}: ({lo}, {hi})," for k, (lo, hi) in ranges(spec).items()]
    o.append("}")
    return "\n".join(o) + "\n"


# -- the command -------------------------------------------------------------------------
def load(root: Path = ROOT) -> Spec:
    path = root / SPEC
    return parse(load_yaml(path.read_text(), str(SPEC)))


def outputs(spec: Spec) -> dict[Path, str]:
    return {UAPI_H: render_uapi(spec), CONSTS_H: render_consts(spec),
            POLICY_H: render_policy(spec), PY: render_python(spec)}


def changed(files: Mapping[Path, str], root: Path) -> list[Path]:
    """The files (relative to ``root``) whose text is not what ``files`` says (or missing)."""
    return [rel for rel, text in files.items()
            if not (root / rel).exists() or (root / rel).read_text() != text]


def write_changed(files: Mapping[Path, str], root: Path) -> list[Path]:
    """Write the files that changed; returns them."""
    out = changed(files, root)
    for rel in out:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(files[rel])
    return out


def cli(argv: Sequence[str] | None, *, doc: str, tool: str, spec: Path,
        outputs_of: Callable[[Path], Mapping[Path, str]]) -> int:
    """``gen`` or ``check`` for a spec whose generated files ``outputs_of(root)`` gives
    (0 done/up to date, 1 stale, 2 the spec cannot be read); shared by the generators."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("action", choices=("gen", "check"))
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    name = Path(tool).stem
    try:
        files = outputs_of(args.root)
        if args.action == "gen":
            for rel in write_changed(files, args.root):
                print(f"{name}: wrote {rel}")
            return 0
        bad = changed(files, args.root)
    except (SpecError, OSError, KeyError) as e:
        print(f"{name}: {spec}: {e}", file=sys.stderr)
        return 2
    for rel in bad:
        print(f"{name}: {rel} is stale: run python3 {tool} gen (from {spec})", file=sys.stderr)
    return 1 if bad else 0


def stale(root: Path = ROOT) -> list[Path]:
    """The generated files that differ from what the spec gives (or are missing)."""
    return changed(outputs(load(root)), root)


def generate(root: Path = ROOT) -> list[Path]:
    """Write the generated files that changed; returns them."""
    return write_changed(outputs(load(root)), root)


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, doc=__doc__ or "", tool="tools/kbp_spec.py", spec=SPEC,
               outputs_of=lambda root: outputs(load(root)))


if __name__ == "__main__":
    sys.exit(main())
