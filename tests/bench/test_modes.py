"""What users run today, as modes (issue 12, item 3), without root: busypoll and defer set
exactly their values and put back exactly the values found, also after an exception or Ctrl-C
half-way; a mode the kernel cannot run is skipped with the reason (kernel too old), and on a
7.2 kernel (the VM rig's 7.2-amd64 guest) stock-busy, busy and hybrid are available."""

from __future__ import annotations

import errno
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kbp import names, sysinfo
from kbp.bench import knobs, modes, runner
from kbp.bench.knobs import Changes, Knob, KnobError
from kbp.bench.modes import (
    AppEnv,
    AppPlace,
    BusyPollMode,
    DeferMode,
    Target,
    all_modes,
    availability,
)
from kbp.bench.runner import Aborted, Bench, BenchConfig
from kbp.system import journal

BUSY_READ = "/proc/sys/net/core/busy_read"
BUSY_POLL = "/proc/sys/net/core/busy_poll"
NS = "kbpb-test-s"
DEV = "rt-s-test"
GFT = f"/sys/class/net/{DEV}/gro_flush_timeout"
NDHI = f"/sys/class/net/{DEV}/napi_defer_hard_irqs"


@dataclass
class FakeKernel:
    """Files by (netns, path), read and written through the knobs' handler interface
    (kbpctl's handlers' get/set); a write may fail (``fail_writes``: knob -> how many more
    writes succeed first, then EACCES) or be clamped (``clamp``).  ``written``: the kind
    and key of every write."""

    files: dict[tuple[str | None, str], Any] = field(default_factory=dict)
    fail_writes: dict[tuple[str | None, str], int] = field(default_factory=dict)
    clamp: dict[tuple[str | None, str], str] = field(default_factory=dict)
    log: list[tuple[str | None, str, Any]] = field(default_factory=list)
    written: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def effector(self) -> dict[str, Any]:
        return {kind: _FakeKind(self, kind) for kind in (journal.KIND_FILE, journal.KIND_NAPI)}

    def get(self, key: dict[str, Any]) -> Any:
        return self.files.get((key.get("netns"), key["path"]), journal.MISSING)

    def set(self, key: dict[str, Any], value: Any) -> None:
        at = (key.get("netns"), key["path"])
        if at in self.fail_writes:
            if self.fail_writes[at] <= 0:
                raise PermissionError(errno.EACCES, "Permission denied")
            self.fail_writes[at] -= 1
        if at not in self.files:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        self.log.append((*at, value))
        self.files[at] = self.clamp.get(at, str(value))   # as text, as a file reads


@dataclass
class _FakeKind:
    kernel: FakeKernel
    kind: str

    def get(self, key: dict[str, Any]) -> Any:
        return self.kernel.get(key)

    def set(self, key: dict[str, Any], value: Any) -> None:
        self.kernel.written.append((self.kind, dict(key)))
        self.kernel.set(key, value)


def _host(busy_read: str = "7", busy_poll: str = "0") -> FakeKernel:
    """A kernel with the busy-poll sysctls global (as 6.18: not in other namespaces) and the
    RT device's IRQ-deferral attributes in its namespace, at unusual values."""
    return FakeKernel(files={(None, BUSY_READ): busy_read, (None, BUSY_POLL): busy_poll,
                             (NS, GFT): "1234", (NS, NDHI): "3"})


T = Target(NS, DEV, 1)


@pytest.fixture(autouse=True)
def _own_lock(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock and journals of the test's own, not the machine's (a real benchmark may hold
    that)."""
    monkeypatch.setenv("KBP_RUN_DIR", str(tmp_path / "run"))


def _journals() -> list[Path]:
    return sorted((journal.run_dir() / "process").glob("bench-knobs-*.jsonl"))


def _dead_pid() -> int:
    import subprocess
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def test_global_knobs_journaled_and_recovered_after_sigkill(tmp_path: Any) -> None:
    """A benchmark killed (SIGKILL) with busypoll on cannot restore: its journal (kbpctl's
    format) says what it found, and the next benchmark that takes the global knobs puts that
    back first."""
    k = FakeKernel(files={(None, "/g"): "0", ("ns", "/n"): "1"})
    a = Changes(k.effector)
    a.apply([(Knob("/n", "ns"), "2")])
    assert not _journals()                                 # namespace knobs: no journal
    a.apply([(Knob("/g"), "50")])
    (j,) = _journals()
    rec = journal.read_record(j)
    assert rec is not None and [(c.kind, c.key, c.old, c.new) for c in rec.changes] == \
        [("file", {"path": "/g"}, "0", "50")]
    a.restore()
    assert not _journals()
    # a process that died with /g at 50: its pid is gone, its journal is not
    dead = journal.StateDir().begin_process(knobs.OWNER, _dead_pid())
    dead.change("file", {"path": "/g"}, "0", "50")
    dead.close()
    k.files[(None, "/g")] = "50"
    b = Changes(k.effector)
    b.apply([(Knob("/g"), "50")])
    assert b.recovered == {"/g": "0"} and b.as_json() == {"/g": "0"}   # the true original
    b.restore()
    assert k.files[(None, "/g")] == "0" and not _journals()


def test_a_dead_benchmarks_journal_that_cannot_be_replayed_stops_the_next_one() -> None:
    """A global knob of a dead benchmark that cannot be written back: the next benchmark
    refuses to change the knobs (it would journal a wrong original), names the journal, and
    keeps it; its own restore still lets go of the lock."""
    k = FakeKernel(files={(None, "/g"): "50"}, fail_writes={(None, "/g"): 0})
    dead = journal.StateDir().begin_process(knobs.OWNER, _dead_pid())
    dead.change("file", {"path": "/g"}, "0", "50")
    dead.close()
    b = Changes(k.effector)
    with pytest.raises(KnobError, match=r"killed benchmark's settings .*bench-knobs-\d+"
                                        r"\.jsonl.* could not all be put back.*restoring /g to "
                                        r"'0': .*Permission denied"):
        b.apply([(Knob("/g"), "1")])
    assert k.files[(None, "/g")] == "50" and len(_journals()) == 1
    b.restore()
    c = Changes(FakeKernel(files={(None, "/h"): "0"}).effector, state=None)
    c.apply([(Knob("/h"), "1")])                           # no lock: not blocked by b's
    c.restore()


def test_global_knobs_are_taken_in_turns() -> None:
    """Two benchmarks on one machine: the second waits until the first has put the global
    value back, so it finds (and restores) the true original."""
    import threading
    k = FakeKernel(files={(None, "/g"): "0"})
    a, b = Changes(k.effector), Changes(k.effector)
    a.apply([(Knob("/g"), "50")])
    done = threading.Event()

    def second() -> None:
        b.apply([(Knob("/g"), "50")])
        done.set()

    th = threading.Thread(target=second)
    th.start()
    assert not done.wait(0.3)                       # blocked while a holds the knob
    a.restore()
    assert done.wait(5)
    th.join()
    assert b.as_json() == {"/g": "0"}               # b found the original, not a's 50
    b.restore()
    assert k.files[(None, "/g")] == "0"
    # knobs inside a namespace are the namespace's own: no lock
    c, d = Changes(k.effector), Changes(k.effector)
    k.files[("ns", "/n")] = "1"
    c.apply([(Knob("/n", "ns"), "2")])
    d.apply([(Knob("/g", None), "3")])             # not blocked by c
    d.restore()
    c.restore()


# -- knobs --------------------------------------------------------------------------------
def test_changes_put_back_exactly_what_was_found_last_first() -> None:
    k = FakeKernel(files={(None, "/a"): "1", (None, "/b"): "x y"})
    ch = Changes(k.effector)
    ch.apply([(Knob("/a"), "5"), (Knob("/b"), "6")])
    assert k.files == {(None, "/a"): "5", (None, "/b"): "6"}
    assert ch.as_json() == {"/a": "1", "/b": "x y"}
    ch.restore()
    assert k.files == {(None, "/a"): "1", (None, "/b"): "x y"}
    assert [v for _, _, v in k.log] == ["5", "6", "x y", "1"]      # reverse order
    ch.restore()                                                   # idempotent
    assert len(k.log) == 4


def test_changes_half_done_apply_restores_what_it_changed() -> None:
    k = FakeKernel(files={(None, "/a"): "1", (None, "/b"): "2"},
                   fail_writes={(None, "/b"): 0})
    ch = Changes(k.effector)
    with pytest.raises(KnobError, match="/b"):
        ch.apply([(Knob("/a"), "5"), (Knob("/b"), "6")])
    assert k.files[(None, "/a")] == "5"
    k.fail_writes.clear()
    ch.restore()
    assert k.files == {(None, "/a"): "1", (None, "/b"): "2"}


def test_changes_a_clamped_value_is_an_error_and_still_restored() -> None:
    k = FakeKernel(files={(None, "/a"): "1"}, clamp={(None, "/a"): "3"})
    ch = Changes(k.effector)
    with pytest.raises(KnobError, match="reads '3' after writing '5'"):
        ch.apply([(Knob("/a"), "5")])
    k.clamp.clear()
    ch.restore()
    assert k.files[(None, "/a")] == "1"


def test_changes_restore_tries_every_knob_and_names_the_failed() -> None:
    k = FakeKernel(files={(None, "/a"): "1", (None, "/b"): "2"})
    ch = Changes(k.effector)
    ch.apply([(Knob("/a"), "5"), (Knob("/b"), "6")])
    k.fail_writes[(None, "/b")] = 0
    with pytest.raises(KnobError, match=r"not restored: restoring /b to '2': .*Permission "
                                       r"denied"):
        ch.restore()
    assert k.files[(None, "/a")] == "1"                 # the other one is back


def test_net_core_sysctl_where_the_app_sees_it() -> None:
    k = _host()
    assert knobs.net_core_sysctl("busy_read", NS, k.effector) == Knob(BUSY_READ)  # global
    k.files[(NS, BUSY_READ)] = "0"                                        # per-netns kernel
    assert knobs.net_core_sysctl("busy_read", NS, k.effector) == Knob(BUSY_READ, NS)


# -- busypoll -------------------------------------------------------------------------------
def test_busypoll_sets_50_and_restores_the_values_found() -> None:
    k = _host(busy_read="7", busy_poll="0")
    m = BusyPollMode(effector=k.effector)
    assert m.unavailable() is None
    m.setup(T)
    assert k.files[(None, BUSY_READ)] == "50" and k.files[(None, BUSY_POLL)] == "50"
    d = m.describe()
    assert "global (not per namespace" in d["how"] and "tuned" in d["how"]
    assert d["found"] == {BUSY_READ: "7", BUSY_POLL: "0"}
    m.teardown()
    assert k.files == _host(busy_read="7", busy_poll="0").files
    assert m.threads() == {} and m.counters() == {} and not m.spins


def test_busypoll_per_namespace_kernel_sets_the_apps_namespace_only() -> None:
    k = _host()
    k.files[(NS, BUSY_READ)] = "0"
    k.files[(NS, BUSY_POLL)] = "0"
    m = BusyPollMode(effector=k.effector)
    m.setup(T)
    assert k.files[(NS, BUSY_READ)] == k.files[(NS, BUSY_POLL)] == "50"
    assert k.files[(None, BUSY_READ)] == "7"                        # global untouched
    assert "per namespace" in m.describe()["how"]
    m.teardown()
    assert k.files[(NS, BUSY_READ)] == k.files[(NS, BUSY_POLL)] == "0"


def test_busypoll_unavailable_without_the_sysctl() -> None:
    why = BusyPollMode(effector=FakeKernel().effector).unavailable()
    assert why is not None and "CONFIG_NET_RX_BUSY_POLL" in why


# -- defer --------------------------------------------------------------------------------
def test_defer_sets_the_rt_device_and_restores_it() -> None:
    k = _host()
    m = DeferMode(effector=k.effector)
    m.setup(T)
    assert k.files[(NS, NDHI)] == modes.DEFER_HARD_IRQS == "2"
    assert k.files[(NS, GFT)] == modes.GRO_FLUSH_TIMEOUT_NS == "20000"
    assert k.files[(None, BUSY_READ)] == "7"                        # nothing else
    m.teardown()
    assert k.files == _host().files


def test_defer_unavailable_before_5_10(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: "5.4.0-150-generic")
    why = DeferMode().unavailable()
    assert why == ("napi_defer_hard_irqs needs Linux 5.10 or later; this kernel is "
                   "5.4.0-150-generic (kernel too old)")


# -- through the runner: restored after an exception, Ctrl-C, and a failed restore ------------
class _Server:
    name = names.APP_SOCKPERF

    def __init__(self) -> None:
        self.places: list[AppPlace] = []

    def place(self, where: AppPlace) -> None:
        self.places.append(where)


def _bench(monkeypatch: pytest.MonkeyPatch) -> Bench:
    b = Bench(BenchConfig(), cpus_available=lambda: [0, 1])
    b.plan()
    b.server = _Server()  # type: ignore[assignment]
    b.results = {"modes": {}}
    monkeypatch.setattr(b, "target", lambda: T)
    return b


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("make", [BusyPollMode, DeferMode])
def test_runner_restores_on_exception_and_ctrl_c(monkeypatch: pytest.MonkeyPatch,
                                                 make: Any, exc: type[BaseException]) -> None:
    k = _host()
    b = _bench(monkeypatch)
    m = make(effector=k.effector)
    with pytest.raises(exc), b._mode(m):
        assert k.files != _host().files             # the mode is on
        raise exc()
    assert k.files == _host().files
    assert b.server.places[-1] == AppPlace(1)       # type: ignore[union-attr]


def test_runner_restores_after_ctrl_c_half_way_through_setup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    k = _host()
    real_set = k.set
    calls = [0]

    def write(key: dict[str, Any], value: str) -> None:
        real_set(key, value)
        calls[0] += 1
        if calls[0] == 1:                           # after the first knob: Ctrl-C
            raise KeyboardInterrupt

    monkeypatch.setattr(k, "set", write)
    b = _bench(monkeypatch)
    with pytest.raises(KeyboardInterrupt), b._mode(DeferMode(effector=k.effector)):
        pytest.fail("the body must not run")
    assert k.files == _host().files


def test_runner_stops_when_a_mode_cannot_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    k = _host()
    b = _bench(monkeypatch)
    with pytest.raises(Aborted, match="busypoll could not put back"), \
            b._mode(BusyPollMode(effector=k.effector)):
        k.fail_writes[(None, BUSY_POLL)] = 0
    assert any(BUSY_POLL in p for p in b.results["restore_problems"])
    assert k.files[(None, BUSY_READ)] == "7"        # what could be restored, was


# -- availability ---------------------------------------------------------------------------
@pytest.fixture
def kmod_loaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from kbp.backends.kmod import KmodBackend
    monkeypatch.setattr(KmodBackend, "available", lambda self: (True, "kbp module loaded"))
    yield


def test_on_this_kernel_stock_busy_is_skipped_with_the_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: "6.18.44-fc-v782")
    why = availability([modes.STOCK_BUSY])[modes.STOCK_BUSY]
    assert why == ("threaded busy polling (napi threaded=2, kbpctl --mode busy) needs Linux "
                   "6.19 or later; this kernel is 6.18.44-fc-v782 (kernel too old)")


@pytest.mark.usefixtures("kmod_loaded")
def test_on_the_7_2_guest_the_vm_comparison_modes_are_available(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """python -m kbp.bench vm --flavour 7.2-amd64 --smoke --modes napi,defer,stock-busy,
    busy,hybrid: every mode runs there (the stock backend's own check agrees)."""
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: "7.2.13+deb14-amd64")
    wanted = ["napi", "defer", "stock-busy", "busy", "hybrid"]
    assert availability(wanted) == dict.fromkeys(wanted)
    from kbp.backends.stock import BUSY_POLL_SINCE
    assert modes.STOCK_BUSY_SINCE == BUSY_POLL_SINCE


def test_stock_busy_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    m = all_modes()[modes.STOCK_BUSY]
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: "6.19.0")
    assert m.unavailable() is None
    monkeypatch.setattr(sysinfo, "kernel_release", lambda: "6.18.99")
    assert "kernel too old" in (m.unavailable() or "")


def test_the_runner_skips_through_availability() -> None:
    src = inspect.getsource(runner.Bench.run)
    assert "availability(cfg.modes" in src and "].unavailable()" not in src


def test_stock_busy_spins_like_busy() -> None:
    ms = all_modes()
    home, env = AppPlace(1), AppEnv(spin_app="fifo", elsewhere_cpu=0, rt_prio=50)
    for name in ("stock-busy", "busy"):
        assert ms[name].spins and ms[name].app_place(home, env) == AppPlace(1, 51)
    for name in ("busypoll", "defer", "stock-hybrid"):
        assert not ms[name].spins and ms[name].app_place(home, env) == home
    assert not ms["stock-busy"].needs_fresh_device(T)     # only the module's modes do


def test_one_vocabulary_in_help_and_summary() -> None:
    from kbp.bench.cli import description
    assert list(modes.named(lambda i: not i.heavy)) == list(modes.standard_modes()) == list(
        all_modes())
    text = description()
    for name in modes.catalog():
        assert f"\n{name:<13}  " in text, name


def test_stock_busy_enables_without_a_priority(enabled_requests: list[Any]) -> None:
    """kbpctl refuses --rt-prio with the stock backend's --mode busy: the benchmark leaves
    the priority to the backend there, and passes it everywhere else."""
    import kbp.backends as b
    reqs = enabled_requests
    ms = all_modes()
    for name in ("stock-busy", "stock-hybrid"):
        ms[name].setup(T)
        ms[name].teardown()
    busy, hybrid = reqs
    default = b.EnableRequest(["x"]).rt_prio
    assert (busy.mode, busy.rt_prio) == ("busy", default)        # the backend's default
    assert (hybrid.mode, hybrid.rt_prio) == ("hybrid", T.rt_prio)


VM_72 = ["--flavour", "7.2-amd64", "--smoke", "--modes", "napi,defer,stock-busy,busy,hybrid"]


def test_the_7_2_vm_comparison_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                       ) -> None:
    """``python -m kbp.bench vm --flavour 7.2-amd64 --smoke --modes napi,defer,stock-busy,
    busy,hybrid`` boots 7.2-amd64 with kbp.ko loaded and runs those five modes there (not
    run here: the command is captured; the guest's planning is checked on a 2-CPU layout)."""
    import argparse
    import subprocess

    from kbp.bench import cli
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], *a: Any, **k: Any) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    assert cli.run_vm([*VM_72, "--out", str(tmp_path)]) == 0
    cmd = seen[0]
    assert cmd[cmd.index("run") + 1] == "7.2-amd64" and "--build" in cmd
    inner = cmd[-1]
    assert inner.startswith('insmod "$KBP_KO" && modprobe veth && ')
    assert "--emulated --smoke --modes napi,defer,stock-busy,busy,hybrid" in inner
    # what the guest's python -m kbp.bench makes of it
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    cfg = cli.config_from_args(ap.parse_args(["--emulated", *VM_72[2:], "--out",
                                              str(tmp_path)]))
    assert cfg.modes == ["napi", "defer", "stock-busy", "busy", "hybrid"] and cfg.emulated
    Bench(cfg, cpus_available=lambda: [0, 1]).plan()


def test_threaded_mode_finds_its_kthreads_as_kbpctl_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # one finder of NAPI kthreads (sysinfo's, exact device name), not a 15-character prefix
    seen: list[str] = []

    def find(dev: str, host: object = None) -> list[sysinfo.TaskStat]:
        seen.append(dev)
        return [sysinfo.TaskStat(pid=7, comm="napi/rt-s-x-3", state="S", ppid=2,
                                 flags=sysinfo.PF_KTHREAD, starttime=0, last_cpu=0,
                                 rt_priority=0, policy=0)]

    monkeypatch.setattr(sysinfo, "find_napi_threads", find)
    m = modes.ThreadedMode()
    assert m.threads() == {}
    m.target = modes.Target("ns", "rt-s-x", 1)
    assert m.threads() == {7: "napi/rt-s-x-3"} and seen == ["rt-s-x"]


def test_a_napi_knob_of_the_initial_namespace_is_recovered_as_a_napi_knob() -> None:
    """A NAPI attribute of a device in the initial namespace (an operator's own device) is
    journaled with its NAPI id and attribute, and the next benchmark writes it back through
    napi-set, not as a file named after it."""

    from kbp.bench.modes import napi_knob

    nk = napi_knob(8193, "gro-flush-timeout", None)
    k = FakeKernel(files={(None, nk.path): "0", (None, "/g"): "0"})
    a = Changes(k.effector)
    a.apply([(nk, "20000")])
    (j,) = _journals()
    rec = journal.read_record(j)
    assert rec is not None and [(c.kind, c.key, c.old) for c in rec.changes] == \
        [("napi", {"path": nk.path, "napi_id": 8193, "knob": "gro_flush_timeout"}, "0")]
    # as if that benchmark had been killed with the knob changed: its journal stays
    dead = journal.StateDir().process_path(knobs.OWNER, _dead_pid())
    dead.write_text(j.read_text())
    a.restore()                                      # (this one lets go of the lock)
    k.files[(None, nk.path)] = "20000"
    k.written.clear()
    b = Changes(k.effector)
    b.apply([(Knob("/g"), "1")])                     # takes the lock: recovers first
    assert k.written[0] == ("napi", nk.key()) and nk.napi == (8193, "gro_flush_timeout")
    assert b.recovered == {nk.path: "0"}
    assert k.files[(None, nk.path)] == "0"
    b.restore()


def test_counters_moved_over_a_run() -> None:
    """A run's poller record: each counter's movement; one the first read lacked counts from
    0, one the second read lacks (None) is left out."""
    assert modes.counters_moved({"packets": 10, "polls": None, "gone": 4},
                                {"packets": 25, "polls": 7, "gone": None}) == \
        {"packets": 15, "polls": 7}
