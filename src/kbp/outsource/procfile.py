"""/proc/kbp_so, the guest module's state, parsed.

One ``kbp_so key=value ...`` line (the module), then one ``sock key=value ...`` line per
outsourced socket.  Keys kbpctl does not know are kept (``extra``), the names of the
counters are used unchanged in kbpctl's output and JSON::

  kbp_so state=attached epoch=1 queues=2 sockets=2 pinned_pages=0 orphan_pages=0 ...
  sock ino=12345 uid=0 family=inet local=127.0.0.1:5000 remote=- requests=10 ...

Newer modules add, to the module line, how completions are found (``poll_us``, ``idle``,
``idle_poll_us``, ``irqs``, ``completions_irq|polled|syscall|idle|tick``, ``idle_poll_ns``,
``idle_halts``, ``idle_races``) and what its policy refused (``refused_netns``,
``refused_user``: sockets refused EPERM because of their network namespace, or their
creator; ``closes_pending``: closes the watchdog still owes the host); a key the module does
not write is left out, not zeroed.  :func:`summary` is what ``kbpctl status`` shows of it.

The file is root's (mode 0400) and lists the sockets of the reader's network namespace only;
the module line is the whole guest's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kbp.outsource import _spec

PROC_PATH = Path("/proc/kbp_so")
STATES = ("attached", "detached", "host-dead")
# The keys, from the module's spec (outsource/guest/kbp_so_proc.yaml, _spec.py): nothing here
# re-types them. A key the spec adds is parsed, shown and exported under its own name.
#: how completions are found: by whom (the ``completions_*`` sources, in the order
#: :data:`SHARES` groups them)
COMPLETION_SOURCES = tuple(k.name for k in _spec.MODULE_KEYS if k.group == "completions")
#: the policy in the module (design.md 11.13): sockets refused, and closes still owed
POLICY_COUNTERS = tuple(k.name for k in _spec.MODULE_KEYS if k.group == "policy")
MODULE_COUNTERS = tuple(k.name for k in _spec.MODULE_KEYS if k.type != "text")
#: words of the module line beside ``state`` (``idle``: ``on``, ``off`` or
#: ``unavailable:<reason>``)
MODULE_TEXT = tuple(k.name for k in _spec.MODULE_KEYS
                    if k.type == "text" and k.group != "identity")
SOCK_COUNTERS = tuple(k.name for k in _spec.SOCK_KEYS if k.group != "identity")
SOCK_TEXT = tuple(k.name for k in _spec.SOCK_KEYS if k.type == "text")
#: every key's doc, by name (the module line's, then the socket line's)
DOCS = {k.name: k.doc for k in (*_spec.MODULE_KEYS, *_spec.SOCK_KEYS)}
#: :func:`summary`'s ``share`` of the completions: who found them (syscall = the calling
#: process polling in its own system call + another outsourced system call's sweep)
SHARES = {"idle": ("completions_idle",),
          "syscall": ("completions_polled", "completions_syscall"),
          "irq": ("completions_irq",),
          "tick": ("completions_tick",)}
SOCK_COUNTERS = ("requests", "completions", "bytes_out", "bytes_in", "copies", "fallbacks",
                 "errors")
SOCK_TEXT = ("family", "local", "remote")


class ProcFormatError(ValueError):
    """A line that is not ``WORD key=value ...`` (the message quotes it)."""


@dataclass
class Sock:
    ino: int
    uid: int
    family: str
    local: str
    remote: str
    counters: dict[str, int] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"ino": self.ino, "uid": self.uid, "family": self.family, "local": self.local,
                "remote": self.remote, **self.counters, **self.extra}


@dataclass
class Module:
    state: str
    counters: dict[str, int] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)
    socks: list[Sock] = field(default_factory=list)
    text: dict[str, str] = field(default_factory=dict)  # MODULE_TEXT keys the module wrote

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, **self.counters, **self.text, **self.extra,
                "socks": [s.to_json() for s in self.socks]}


def _pairs(line: str, lineno: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for word in line.split()[1:]:
        key, eq, value = word.partition("=")
        if not eq or not key:
            raise ProcFormatError(f"/proc/kbp_so line {lineno}: {word!r} is not key=value: "
                                  f"{line!r}")
        out[key] = value
    return out


def _int(pairs: dict[str, str], key: str, lineno: int) -> int:
    try:
        return int(pairs.pop(key))
    except KeyError:
        raise ProcFormatError(f"/proc/kbp_so line {lineno}: no {key}=") from None
    except ValueError:
        raise ProcFormatError(f"/proc/kbp_so line {lineno}: {key} is not a number") from None


def _counters(pairs: dict[str, str], names: tuple[str, ...], lineno: int) -> dict[str, int]:
    return {k: _int(pairs, k, lineno) for k in names if k in pairs}


def parse(text: str) -> Module:
    """The module and its sockets; ProcFormatError for a line that does not parse."""
    mod: Module | None = None
    socks: list[Sock] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        kind = line.split(None, 1)[0]
        pairs = _pairs(line, lineno)
        if kind == "kbp_so":
            state = pairs.pop("state", "")
            if not state:
                raise ProcFormatError(f"/proc/kbp_so line {lineno}: no state=")
            counters = _counters(pairs, MODULE_COUNTERS, lineno)
            text_m = {k: pairs.pop(k) for k in MODULE_TEXT if k in pairs}
            mod = Module(state, counters, pairs, text=text_m)
        elif kind == "sock":
            ino, uid = _int(pairs, "ino", lineno), _int(pairs, "uid", lineno)
            text_f = {k: pairs.pop(k, "-") for k in SOCK_TEXT}
            counters = _counters(pairs, SOCK_COUNTERS, lineno)
            socks.append(Sock(ino, uid, text_f["family"], text_f["local"], text_f["remote"],
                              counters, pairs))
        # other line kinds: a newer module's, ignored
    if mod is None:
        raise ProcFormatError("/proc/kbp_so has no 'kbp_so state=...' line")
    mod.socks = socks
    return mod


def read(path: Path | None = None) -> Module | None:
    """The module's state, None when it is not loaded (no /proc/kbp_so)."""
    try:
        text = (path or PROC_PATH).read_text()
    except FileNotFoundError:
        return None
    return parse(text)


def summary(mod: Module) -> dict[str, object]:
    """What ``kbpctl status`` shows of the module (its ``outsource`` object): ``state``, the
    MODULE_TEXT keys and every module counter under the module's names (those it wrote), keys
    kbpctl does not know as text, then derived:

    * ``completions``: the sum of the ``completions_*`` present (None: none present, an
      older module);
    * ``irqs_per_completion``: irqs / completions (None: 0 completions, or either unknown);
    * ``share``: for each of :data:`SHARES`, the fraction of ``completions`` its sources
      found (None: 0 completions, or none of its sources present).
    """
    c = mod.counters
    found = [c[k] for k in COMPLETION_SOURCES if k in c]
    total = sum(found) if found else None
    per_irq = c["irqs"] / total if total and "irqs" in c else None
    share: dict[str, float | None] = {}
    for name, keys in SHARES.items():
        have = [c[k] for k in keys if k in c]
        share[name] = sum(have) / total if total and have else None
    return {"state": mod.state, **mod.text, **c, **mod.extra, "completions": total,
            "irqs_per_completion": per_irq, "share": share}


def socket_owners(inos: set[int], proc: Path = Path("/proc")) -> dict[int, list[tuple[int, str]]]:
    """For each socket inode in ``inos``: the (pid, comm) of the processes holding it (their
    /proc/PID/fd links read ``socket:[INO]``)."""
    out: dict[int, list[tuple[int, str]]] = {}
    if not inos:
        return out
    want = {f"socket:[{i}]": i for i in inos}
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue
        found: set[int] = set()
        for fd in fds:
            try:
                ino = want.get(str(fd.readlink()))
            except OSError:
                continue
            if ino is not None:
                found.add(ino)
        if found:
            try:
                comm = (pid_dir / "comm").read_text().strip()
            except OSError:
                comm = "?"
            for ino in found:
                out.setdefault(ino, []).append((int(pid_dir.name), comm))
    return out
