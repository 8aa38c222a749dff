"""The spec of the generic netlink family kbp (module/netlink/kbp.yaml) and what comes of it.

tools/kbp_spec.py generates module/uapi/kbp.h, module/kbp_spec.h, module/kbp_genl_policy.h
and src/kbp/_spec.py from the spec. Here: they are up to date (as ``make lint`` checks), they
say what the spec says (the Python tables computed again from the spec's data, not through
the generator's model), the values they replaced are unchanged, PyYAML reads the spec as the
generator's own reader does, and the kernel's YNL library reads it and speaks kbp as kmod does.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kbp import _spec, kmod, names, netap
from kbp.backends import MAX_LINGER_US

from .conftest import REPO
from .test_kmod import dev_reply, encoded, poller_reply, uapi_enums

SPEC = REPO / "module/netlink/kbp.yaml"
KSRC_TARBALL = Path("/usr/src/linux-source-6.12.tar.xz")
YNL_DIR = REPO / ".cache/ynl-6.12"     # tools/net/ynl and Documentation/netlink of 6.12


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kbp_spec_tool", REPO / "tools/kbp_spec.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


tool = _load_tool()


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return tool.load_yaml(SPEC.read_text(), str(SPEC))


# -- generated, and up to date -----------------------------------------------------------
def test_generated_files_are_up_to_date() -> None:
    assert tool.stale(REPO) == [], "run: python3 tools/kbp_spec.py gen"


def test_check_names_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rel in (tool.SPEC, *tool.OUTPUTS):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    assert tool.main(["check", "--root", str(tmp_path)]) == 0
    spec = tmp_path / tool.SPEC
    spec.write_text(spec.read_text().replace("name: quota-max\n    value: 64",
                                             "name: quota-max\n    value: 32"))
    assert tool.main(["check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "module/kbp_spec.h is stale" in err and "src/kbp/_spec.py is stale" in err
    assert "uapi/kbp.h" not in err       # the limit is not uapi
    assert tool.main(["gen", "--root", str(tmp_path)]) == 0
    assert tool.main(["check", "--root", str(tmp_path)]) == 0
    assert "#define KBP_QUOTA_MAX\t\t32" in (tmp_path / tool.CONSTS_H).read_text()


# -- the reader ----------------------------------------------------------------------------
def _yaml_python() -> str | None:
    """An interpreter with PyYAML (kbp's venv has none; Debian's python3-yaml may be there)."""
    for exe in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if exe and subprocess.run([exe, "-c", "import yaml"], capture_output=True,
                                  timeout=60).returncode == 0:
            return exe
    return None


def test_pyyaml_reads_the_spec_alike(raw: dict[str, Any]) -> None:
    exe = _yaml_python()
    if exe is None:
        pytest.skip(reason="no Python with PyYAML here")
    p = subprocess.run([exe, "-c", "import json, sys, yaml; "
                        "print(json.dumps(yaml.safe_load(open(sys.argv[1]))))", str(SPEC)],
                       capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(p.stdout) == raw


@pytest.mark.parametrize(("text", "why"), [
    ("a: yes\n", "ambiguous"),                # YAML 1.1 reads a boolean
    ("a: 010\n", "ambiguous"),                # YAML 1.1 reads octal
    ("a: 1_000\n", "ambiguous"),
    ("a: b: c\n", "ambiguous"),
    ("a:\n\tb: 1\n", "tab"),
    ("a: 1\na: 2\n", "duplicate key"),
    ("a: *x\n", "unknown alias"),
    ("a:\n  - 1\n   - 2\n", "indentation"),
    ("a: {b: 1}\n", "indicator"),
])
def test_the_reader_refuses_what_it_does_not_know(text: str, why: str) -> None:
    with pytest.raises(tool.SpecError, match=why):
        tool.load_yaml(text)


def test_the_generator_refuses_what_it_does_not_render(raw: dict[str, Any]) -> None:
    bad = json.loads(json.dumps(raw))
    bad["mcast-groups"] = {"list": [{"name": "events"}]}
    with pytest.raises(tool.SpecError, match="mcast-groups"):
        tool.parse(bad)
    bad = json.loads(json.dumps(raw))
    bad["attribute-sets"][0]["attributes"][2]["checks"] = {"max": "no-such-const"}
    with pytest.raises(tool.SpecError, match="no-such-const"):
        tool.parse(bad)
    bad = json.loads(json.dumps(raw))       # REPLIES holds one reply per command
    bad["operations"]["list"][1]["dump"]["reply"] = {"attributes": ["cpu"]}
    with pytest.raises(tool.SpecError, match="poller-get: do and dump replies differ"):
        tool.parse(bad)


def test_python_lines_fit_ruffs_width() -> None:
    """_spec.py is linted with src/: the attributes' docs wrap within PY_WIDTH, and what
    the wrapping gives back is each doc on one line."""
    spec = tool.load(REPO)
    text = tool.render_python(spec)
    assert max(len(line) for line in text.split("\n")) <= tool.PY_WIDTH
    assert re.search(r'\n +doc=\("', text), "no doc long enough to wrap: test another way"
    ns: dict[str, Any] = {}
    exec(compile(text, "_spec.py", "exec"), ns)
    assert {(s, a.name): a.doc for s, attrs in ns["ATTRIBUTE_SETS"].items() for a in attrs} \
        == {(s.name, a.name): " ".join(a.doc.split()) for s in spec.sets
            for a in spec.members(s)}


# -- what the generated files say is what the spec says ----------------------------------
def _c(name: str) -> str:
    return name.upper().replace("-", "_")


def _spec_tables(raw: dict[str, Any]) -> dict[str, Any]:
    """The spec's enums, commands, attributes and ranges, computed here from its data with
    YNL's numbering rules (attributes and commands from 1, enums from value-start)."""
    consts = {d["name"]: d["value"] for d in raw["definitions"] if d["type"] == "const"}
    enums = {}
    for d in raw["definitions"]:
        if d["type"] == "enum":
            vals, v = {}, d.get("value-start", 0)
            for e in d["entries"]:
                e = {"name": e} if isinstance(e, str) else e
                v = e.get("value", v)
                vals[e["name"]] = v
                v += 1
            enums[d["name"]] = vals
    cmds, v = {}, 1
    for op in raw["operations"]["list"]:
        v = op.get("value", v)
        cmds[op["name"]] = v
        v += 1
    sets: dict[str, list[tuple[Any, ...]]] = {}
    ranges = {}

    def limit(x: Any) -> int:
        return x if isinstance(x, int) else consts[x]

    for s in raw["attribute-sets"]:
        if "subset-of" in s:
            continue
        out, v = [], 1
        for a in s["attributes"]:
            v = a.get("value", v)
            out.append((v, a["name"], _c(s["name-prefix"] + a["name"]), a["type"],
                        a.get("nested-attributes", ""), a.get("enum", ""),
                        a.get("multi-attr", False), " ".join(a.get("doc", "").split())))
            ch = a.get("checks", {})
            if "min" in ch or "max" in ch:
                ranges[a["name"].replace("-", "_")] = (
                    limit(ch.get("min", -(1 << 31) if a["type"] == "s32" else 0)),
                    limit(ch["max"]))
            v += 1
        sets[s["name"]] = out
    for s in raw["attribute-sets"]:
        if "subset-of" in s:
            parent = {a[1]: a for a in sets[s["subset-of"]]}
            sets[s["name"]] = [parent[a["name"]] for a in s["attributes"]]
    replies = {}
    for op in raw["operations"]["list"]:
        got = [op[m]["reply"]["attributes"] for m in ("do", "dump") if "reply" in op.get(m, {})]
        if got:
            replies[op["name"]] = tuple(got[0])
    return {"consts": consts, "enums": enums, "commands": cmds, "sets": sets,
            "ranges": ranges, "replies": replies}


def test_python_tables_are_the_spec(raw: dict[str, Any]) -> None:
    want = _spec_tables(raw)
    assert want["enums"] == _spec.ENUMS
    assert want["commands"] == _spec.COMMANDS
    assert {k: [tuple(a) for a in v] for k, v in _spec.ATTRIBUTE_SETS.items()} == want["sets"]
    assert want["ranges"] == _spec.RANGES
    assert want["replies"] == _spec.REPLIES
    for d in raw["definitions"]:
        if d["type"] == "const":
            cname = _c(d["name"]) if "header" in d else _c(f"kbp-{d['name']}")
            assert getattr(_spec, cname) == d["value"], cname
    for s, attrs in want["sets"].items():
        for value, _, cname, *_ in attrs:
            assert getattr(_spec, cname) == value, (s, cname)
    assert (raw["name"], raw["version"]) == (_spec.FAMILY, _spec.VERSION)


def test_uapi_header_is_the_spec(raw: dict[str, Any]) -> None:
    header = uapi_enums()
    want = _spec_tables(raw)
    ours = {f"KBP_{_c(e)}_{_c(n)}": v for e, vals in want["enums"].items()
            for n, v in vals.items()}
    ours |= {f"KBP_CMD_{_c(n)}": v for n, v in want["commands"].items()}
    ours |= {cname: v for s in raw["attribute-sets"] if "subset-of" not in s
             for v, _, cname, *_ in want["sets"][s["name"]]}
    assert {k: v for k, v in header.items() if not k.startswith("__")} == ours
    text = (REPO / tool.UAPI_H).read_text()
    assert re.search(r"#define KBP_NETAP_A_LAST_WORK\s+(\d+)", text)[1] == \
        str(_spec.KBP_NETAP_A_LAST_OBJECTIVE)   # its old name, an alias
    assert '#define KBP_GENL_NAME\t\t"kbp"' in text and "#define KBP_GENL_VERSION\t1" in text


def test_kernel_constants_header_is_the_spec(raw: dict[str, Any]) -> None:
    text = (REPO / tool.CONSTS_H).read_text()
    got = {k: int(v.strip("()")) for k, v in re.findall(r"#define (KBP_\w+)\s+(\S+)", text)
           if k != "_KBP_SPEC_H"}
    want = {_c(f"kbp-{d['name']}"): d["value"] for d in raw["definitions"]
            if d["type"] == "const" and d.get("scope") == "kernel"}
    assert got == want


# -- the values that were typed by hand before are unchanged -----------------------------
def test_policy_is_kbp_genl_cs_as_it_was() -> None:
    text = (REPO / tool.POLICY_H).read_text()
    tables = dict(re.findall(r"nla_policy (\w+)\[[^]]*\] = \{\n(.*?)\n\};", text, re.S))
    got = {name: dict(re.findall(r"\[(\w+)\]\s*= \{ (.*?),? \},", body))
           for name, body in tables.items()}
    u32 = ".type = NLA_U32"
    assert got == {
        "kbp_map_policy": {"KBP_MAP_A_NAPI_INDEX": u32, "KBP_MAP_A_CPU": u32},
        "kbp_policy": {
            **{f"KBP_A_{k}": u32 for k in (
                "CPU", "MODE", "LINGER_US", "QUOTA", "RT_PRIO", "FREQ_CTL", "INTERVAL_US",
                "NETAP", "ROUND_MS", "MIN_INTERVAL_US", "MAX_INTERVAL_US", "MIN_CHANGE",
                "MAX_ROUND", "OBJECTIVE", "IFINDEX", "NETNS_FD", "CLASS")},
            "KBP_A_IFNAME": ".type = NLA_STRING, .len = IFNAMSIZ - 1",
            "KBP_A_QUEUE_MAP": ".type = NLA_NESTED",
            "KBP_A_NICE": ".type = NLA_S32"}}
    assert '#include "kbp_genl_policy.h"' in (REPO / "module/kbp_genl.c").read_text()


def test_vocabulary_ranges_and_defaults_are_the_old_ones() -> None:
    assert names.MODES == (names.MODE_BUSY, names.MODE_HYBRID, names.MODE_PERIODIC)
    assert names.MODE_IDS == {"busy": 1, "hybrid": 2, "periodic": 3}
    assert names.CLASSES == (names.CLASS_RT, names.CLASS_NON_RT)
    assert names.CLASS_IDS == {"rt": 0, "non-rt": 1}
    assert names.OBJECTIVES == (names.OBJECTIVE_BYTES, names.OBJECTIVE_BYTES_PER_CPU)
    assert names.OBJECTIVE_IDS == {"bytes": 0, "bytes-per-cpu": 1}
    # appended for pollers (stopping, stuck); the devices' values unchanged
    assert kmod.STATE_NAMES == {1: "active", 2: "standby", 3: "stopping", 4: "stuck"}
    assert names.PERIODIC_RANGES == {
        "interval_us": (10, 100_000), "round_ms": (10, 60_000),
        "min_interval_us": (10, 100_000), "max_interval_us": (10, 100_000),
        "min_change": (1, 1000), "max_round": (20, 1_000_000)}
    assert names.PERIODIC_DEFAULTS == {"round_ms": 1000, "min_interval_us": 100,
                                       "max_interval_us": 4000, "min_change": 20,
                                       "max_round": 300, "objective": "bytes"}
    assert (names.DEFAULT_QUOTA, names.NONRT_DEFAULT_QUOTA, names.NICE_RANGE) == \
        (64, 8, (-20, 19))
    assert MAX_LINGER_US == 1_000_000
    assert (netap.MIN_INTERVAL_US, netap.MAX_INTERVAL_US, netap.MIN_CHANGE_PCT_DEF,
            netap.MAX_ROUND_DEF) == (100, 4000, 20, 300)
    assert (netap.INTERVAL_US_LO, netap.INTERVAL_US_HI, netap.MIN_CHANGE_PCT_LO,
            netap.MIN_CHANGE_PCT_HI, netap.MAX_ROUND_LO, netap.MAX_ROUND_HI) == \
        (10, 100_000, 1, 1000, 20, 1_000_000)


# -- the poller counters: the spec's ----------------------------------------------------
def test_poller_counters_and_their_help_are_the_specs(raw: dict[str, Any]) -> None:
    """Every attribute of poller-get's reply whose doc the spec marks "counter" is a module
    poller counter, named and ordered as the reply has it, with its doc (the mark off) as
    its help text; a u64 there is always marked (a new counter cannot go unlisted)."""
    attrs = {a["name"]: a for a in raw["attribute-sets"][0]["attributes"]}
    reply = next(op for op in raw["operations"]["list"]
                 if op["name"] == "poller-get")["do"]["reply"]["attributes"]
    want = {}
    for name in reply:
        doc = " ".join(attrs[name].get("doc", "").split())
        if attrs[name]["type"] == "u64":
            assert doc.startswith("counter"), (name, "a u64 of the reply not marked counter")
        if doc.startswith("counter: "):
            want[name.replace("-", "_")] = doc.removeprefix("counter: ")
        elif doc.startswith("counter, "):
            want[name.replace("-", "_")] = doc.removeprefix("counter, ")
    assert want == names.MODULE_POLLER_COUNTER_HELP
    assert list(want) == list(names.MODULE_POLLER_COUNTER_HELP)
    assert all(want.values())
    # the periodic ones (status's "periodic", kbp_poller_periodic_*) are not poller counters
    assert names.PERIODIC_COUNTERS == ("handbacks",)
    poller = {k: v for k, v in want.items() if k not in names.PERIODIC_COUNTERS}
    assert poller == names.POLLER_COUNTER_HELP
    assert tuple(poller) == names.POLLER_COUNTERS
    assert set(names.POLLER_MAXIMA) <= set(names.POLLER_COUNTERS)
    assert names.POLLER_MAXIMA == ("wake_delay_max_ns",)    # the spec's "counter, maximum:"


def test_device_counters_and_their_help_are_the_specs(raw: dict[str, Any]) -> None:
    """The device and NAPI counters (kbpctl status, kbp_device_* and kbp_napi_*) are the
    u64 counters of dev-get's reply, each also in the spec's NAPI record, with the spec's
    doc as help and what the stock backend reads instead, if anything."""
    attrs = {a["name"]: a for a in raw["attribute-sets"][0]["attributes"]}
    napi = {a["name"]: a for s in raw["attribute-sets"] if s["name"] == "napi"
            for a in s["attributes"]}
    reply = next(op for op in raw["operations"]["list"]
                 if op["name"] == "dev-get")["do"]["reply"]["attributes"]
    counters = [a for a in reply if attrs[a].get("doc", "").startswith("counter")]
    assert counters == [a for a in reply if attrs[a]["type"] == "u64"]
    assert tuple(counters) == names.DEVICE_COUNTERS == ("packets", "polls")
    for c in counters:
        assert napi[c]["type"] == "u64" and napi[c]["doc"].startswith("counter"), c
        help_ = names.DEVICE_COUNTER_HELP[c]
        assert help_.startswith(attrs[c]["doc"].removeprefix("counter: ")), (c, help_)
    assert names.DEVICE_COUNTER_HELP["packets"].endswith("(kmod; stock: the device's "
                                                         "rx_packets)")
    assert names.DEVICE_COUNTER_HELP["polls"] == "NAPI polls (kmod only)"


def test_poller_counters_are_the_old_ones() -> None:
    """The exporter's metric names and order, and kbpctl status's counters, unchanged."""
    assert names.POLLER_COUNTERS == (
        "passes", "empty_passes", "packets", "wakeups", "sleeps", "sleep_ns", "poll_ns",
        "freq_changes", "yields", "respawns", "repairs", "gave_way", "wake_delay_ns",
        "wake_delay_max_ns", "takeovers")
    assert names.POLLER_COUNTER_HELP["poll_ns"] == \
        "time spent inside NAPI poll (protocol processing included)"     # docs/kbpctl.md
    assert names.POLLER_COUNTER_HELP["gave_way"] == \
        "non-rt: polls after which it gave the CPU to a woken task at once"


_NEW_COUNTER = """
import dataclasses, json
from kbp import kmod, names
m = kmod._msg(kmod.KBP_CMD_POLLER_GET, [["KBP_A_CPU", 1], ["KBP_A_FROBS", 7]])
m.encode()
reply = kmod.kbpmsg(bytes(m.data))
reply.decode()
p = kmod._poller_from(reply)
print(json.dumps({"counters": names.POLLER_COUNTERS, "help": names.POLLER_COUNTER_HELP,
                  "fields": [f.name for f in dataclasses.fields(kmod.Poller)],
                  "read": p.counters()}))
"""


def test_a_counter_added_to_the_spec_needs_no_second_edit(tmp_path: Path) -> None:
    """A counter added to the kbp set and to poller-get's reply, and the generator run: it is
    a poller counter with its help text (kbpctl status, the exporter), a field of
    kmod.Poller after the others, and _poller_from reads it."""
    shutil.copytree(REPO / "src/kbp", tmp_path / "src/kbp",
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec = tmp_path / tool.SPEC
    spec.parent.mkdir(parents=True)
    text = SPEC.read_text()
    for old, new in (("\n  - name: queue-map\n",
                      '\n      - name: frobs\n        type: u64\n'
                      '        doc: "counter, hybrid: frobs made"\n  - name: queue-map\n'),
                     ("\n            - takeovers\n",       # poller-get's reply
                      "\n            - takeovers\n            - frobs\n")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    spec.write_text(text)
    assert tool.PY in tool.generate(tmp_path)
    p = subprocess.run([sys.executable, "-c", _NEW_COUNTER], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path / "src")})
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["counters"] == [*names.POLLER_COUNTERS, "frobs"]
    assert got["help"] == {**names.POLLER_COUNTER_HELP, "frobs": "hybrid: frobs made"}
    at = got["fields"].index("takeovers") + 1
    assert got["fields"][:at] + got["fields"][at + 1:] == \
        [f.name for f in dataclasses.fields(kmod.Poller)]
    assert got["fields"][at] == "frobs"
    assert got["read"] == {**dict.fromkeys(names.POLLER_COUNTERS), "frobs": 7}


@pytest.mark.parametrize(("doc", "help_"), [
    ("counter: passes that found no work", "passes that found no work"),
    ("counter, non-rt: polls after which", "non-rt: polls after which"),
    ("number of NAPIs", None),
    ("the longest of them", None),
    ("counters: no", None),
])
def test_counter_help(doc: str, help_: str | None) -> None:
    assert names.counter_help(doc) == help_


def test_defaults_lie_in_their_ranges() -> None:
    r = _spec.RANGES
    for knob, default in names.PERIODIC_DEFAULTS.items():
        if knob in r:
            assert r[knob][0] <= int(default) <= r[knob][1], knob
    assert r["interval_us"][0] <= _spec.KBP_INTERVAL_US_DEF <= r["interval_us"][1]
    assert r["quota"][0] <= _spec.KBP_NONRT_QUOTA_DEF <= r["quota"][1]
    assert _spec.KBP_NETAP_MIN_INTERVAL_US >= _spec.KBP_LINGER_US_FREE


# -- the kernel's ynl --------------------------------------------------------------------
def _ynl_dir() -> Path:
    """The 6.12 source's tools/net/ynl and Documentation/netlink, from Debian's
    linux-source-6.12 (scripts/setup.sh installs it for checkpatch), extracted once."""
    if (YNL_DIR / "tools/net/ynl/lib/ynl.py").exists():
        return YNL_DIR
    if not KSRC_TARBALL.exists():
        pytest.skip(reason=f"{KSRC_TARBALL} is not installed")
    tmp = YNL_DIR.with_name(YNL_DIR.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    subprocess.run(["tar", "-xJf", str(KSRC_TARBALL), "-C", str(tmp), "--strip-components=1",
                    "linux-source-6.12/tools/net/ynl/lib", "linux-source-6.12/tools/net/ynl/cli.py",
                    "linux-source-6.12/Documentation/netlink"],
                   check=True, timeout=300)
    tmp.rename(YNL_DIR)
    return YNL_DIR


def test_the_kernels_ynl_speaks_kbp_as_kmod_does() -> None:
    exe = _yaml_python()
    if exe is None:
        pytest.skip(reason="no Python with PyYAML here (the kernel's ynl needs it)")
    ynl_dir = _ynl_dir()
    attach = kmod.build_attach("eth1", netns_fd=5, cpu=2, queue_map={1: 3, 0: 2},
                               mode="hybrid", linger_us=50, quota=32, rt_prio=60, freq_ctl=True,
                               cls="non-rt", nice=-3, round_ms=200, objective="bytes-per-cpu")
    cases = [
        {"encode": "dev-attach", "attrs": {
            "ifname": "eth1", "netns-fd": 5, "cpu": 2,
            "queue-map": {"map-entry": [{"napi-index": 0, "cpu": 2},
                                        {"napi-index": 1, "cpu": 3}]},
            "class": "non-rt", "nice": -3, "mode": "hybrid", "linger-us": 50, "quota": 32,
            "rt-prio": 60, "freq-ctl": 1, "round-ms": 200, "objective": "bytes-per-cpu"}},
        {"decode": poller_reply()[20:].hex()},
        {"decode": dev_reply()[20:].hex()},
    ]
    p = subprocess.run([exe, str(Path(__file__).with_name("ynl_kbp.py")), str(ynl_dir),
                        str(SPEC), "offline"], input=json.dumps(cases), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ops"] == ["poller-get", "poller-set", "dev-attach", "dev-detach", "dev-get"]
    req, poller, dev = out["results"]
    # the same attributes in kmod's order: the same bytes
    assert req == encoded(attach)[20:].hex()
    assert {k: v for k, v in poller.items() if k != "pad"} == {
        "cpu": 1, "class": "non-rt", "nice": -5, "pid": 4242, "mode": "hybrid",
        "linger-us": 20, "quota": 64, "rt-prio": 50, "freq-ctl": 1, "napis": 2, "passes": 10,
        "empty-passes": 4, "packets": 1 << 40, "wakeups": 3, "sleeps": 3, "sleep-ns": 5000,
        "poll-ns": 7000, "freq-changes": 6, "yields": 9, "respawns": 0, "repairs": 1,
        "gave-way": 12, "wake-delay-ns": 3_000_000, "wake-delay-max-ns": 90_000,
        "takeovers": 2}
    assert (dev["ifname"], dev["state"], dev["mode"], dev["napis"]) == \
        ("eth1", "active", "busy", 2)
    assert [(n["index"], n["id"], n["packets"]) for n in dev["napi"]] == \
        [(0, 8193, 100), (1, 8194, 101)]
