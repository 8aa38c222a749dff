"""``kbpctl outsource``: which UDP sockets kbp_so serves, as a pinned BPF link.

``set`` checks everything first and changes nothing when it refuses: root, the cgroup (v2),
no policy already set, the kernel's hook (BTF FUNC ``update_socket_protocol``), kbp_so
loaded and attached (or ``force``), the program accepted by the verifier.  Then, under
kbpctl's lock, each change registers its undo on a :class:`kbp.sysaccess.Journal` (a
failure half-way puts everything back): mount bpffs on /sys/fs/bpf if it is not there,
make /sys/fs/bpf/kbp, create the link, pin it at /sys/fs/bpf/kbp/outsource, and write
/run/kbp/outsource.json, which says what was created.  The pin keeps the program attached
after kbpctl exits.

``clear`` undoes exactly that (unpin, remove the directory and unmount bpffs only if ``set``
made them) and waits until the kernel has dropped the program; with nothing set it says so.
A policy is replaced with ``clear`` then ``set``: a tracing link cannot swap its program.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbp import sysaccess
from kbp.errors import InvalidInput, NotRoot, OperationFailed, Unavailable
from kbp.outsource import bpfsys, btf, procfile, prog
from kbp.state import StateDir, run_dir

HOOK = "update_socket_protocol"
BPFFS = "/sys/fs/bpf"
PIN_DIR = BPFFS + "/kbp"
PIN = PIN_DIR + "/outsource"
PROG_NAME = "kbp_so_policy"
FAMILIES = {"inet": (prog.AF_INET,), "inet6": (prog.AF_INET6,),
            "both": (prog.AF_INET, prog.AF_INET6)}
FAMILY_NAMES = {prog.AF_INET: "inet", prog.AF_INET6: "inet6"}
CAP_SYS_ADMIN = 21
CAP_BPF = 39
GONE_WAIT_S = 5.0
PRELOADED = {"progs.debug", "maps.debug"}   # bpf_preload's iterators, in every new bpffs


def state_path() -> Path:
    return run_dir() / "outsource.json"


@dataclass
class Cgroup:
    path: str        # resolved
    id: int          # its cgroup id: the directory's inode number on cgroup v2
    level: int       # depth below the hierarchy's root (the root cgroup: 0)


# -- checks ------------------------------------------------------------------------------
def check_caps(status: Path = Path("/proc/self/status")) -> None:
    eff = 0
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            eff = int(line.split()[1], 16)
    need = [("CAP_SYS_ADMIN", CAP_SYS_ADMIN)]
    try:
        if int(Path("/proc/sys/kernel/cap_last_cap").read_text()) >= CAP_BPF:
            need.append(("CAP_BPF", CAP_BPF))
    except (OSError, ValueError):
        pass
    missing = [n for n, bit in need if not eff >> bit & 1]
    if missing:
        raise NotRoot(f"kbpctl outsource set/clear loads and pins a BPF program and needs root "
                      f"({' and '.join(missing)} missing): run it with sudo")


def _mountinfo_root(path: str) -> tuple[str, str] | None:
    """(mount point, root inside the hierarchy) of the cgroup2 mount holding ``path``."""
    best: tuple[str, str] | None = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if not post.startswith("cgroup2 "):
            continue
        f = pre.split()
        root, point = f[3], f[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, root)
    return best


def resolve_cgroup(path: str) -> Cgroup:
    """The cgroup v2 directory ``path`` (InvalidInput when it is not one)."""
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise InvalidInput(f"cgroup {path} does not exist: make it (mkdir under the cgroup v2 "
                           "mount, e.g. /sys/fs/cgroup/NAME) or name an existing one")
    try:
        ftype = bpfsys.fs_type(real)
    except OSError as e:
        raise InvalidInput(f"cgroup {path}: {e.strerror}") from None
    mnt = _mountinfo_root(real)
    if ftype != bpfsys.CGROUP2_SUPER_MAGIC or mnt is None:
        raise InvalidInput(f"{path} is not a cgroup v2 directory (the policy matches cgroup v2 "
                           "ids): name a directory under the cgroup2 mount (see "
                           "'mount -t cgroup2')")
    point, root = mnt
    if ".." in root.split("/"):
        raise InvalidInput(f"{path}: the cgroup2 mount's root {root} lies outside this cgroup "
                           "namespace: run kbpctl in the initial cgroup namespace")
    rel = os.path.relpath(real, point)
    parts = [p for p in root.split("/") if p] + ([] if rel == "." else rel.split("/"))
    return Cgroup(real, os.stat(real).st_ino, len(parts))


def hook_btf_id() -> int:
    try:
        return btf.func_id(HOOK)
    except btf.BtfError as e:
        raise Unavailable(f"this kernel ({platform.release()}) has no policy hook: {e}; the "
                          f"hook {HOOK}() is in Linux 6.6 and later (6.1 has none). Without "
                          "it only applications that ask for protocol 253 themselves use "
                          "kbp_so") from None


def check_module(force: bool) -> procfile.Module | None:
    try:
        mod = procfile.read()
    except (OSError, procfile.ProcFormatError) as e:
        raise Unavailable(f"cannot read /proc/kbp_so: {e}") from None
    if force:
        return mod
    if mod is None:
        raise Unavailable("kbp_so is not loaded (no /proc/kbp_so): the cgroup's UDP sockets "
                          "would fail with EPROTONOSUPPORT; load kbp_so first, or give "
                          "--force to set the policy anyway")
    if mod.state != "attached":
        raise Unavailable(f"kbp_so is {mod.state}, not attached: sockets of the cgroup will fail "
                          "with ENETDOWN until kbp_so attaches; start kbp-sod first, or give "
                          "--force to set the policy anyway")
    return mod


def load_state() -> dict[str, Any] | None:
    try:
        data = json.loads(state_path().read_text())
    except FileNotFoundError:
        return None
    except PermissionError:
        raise NotRoot(f"cannot read {state_path()}: permission denied (run as root)") from None
    except (OSError, ValueError) as e:
        raise OperationFailed(f"{state_path()} is unreadable ({e}): remove it, then run "
                              "'kbpctl outsource clear'") from None
    return data if isinstance(data, dict) else None


def _refuse_if_set() -> None:
    st = load_state()
    if st is not None:
        raise InvalidInput(f"an outsource policy is already set (cgroup {st.get('cgroup')}): "
                           "run 'kbpctl outsource clear' first")
    if os.path.lexists(PIN):
        raise InvalidInput(f"{PIN} exists without kbpctl's record (an interrupted set?): run "
                           "'kbpctl outsource clear' first")


def load_program(cg: Cgroup, families: tuple[int, ...], btf_id: int) -> int:
    """The program's fd (Unavailable, quoting the kernel, when it is refused)."""
    insns = prog.policy_insns(families, cg.id, cg.level)
    try:
        return bpfsys.prog_load(insns, PROG_NAME, btf_id)
    except bpfsys.LoadError as e:
        log = " / ".join(e.log.splitlines()[-6:]) or "no verifier log: refused before the verifier"
        raise Unavailable(f"the kernel ({platform.release()}) refused the policy program "
                          f"(fmod_ret on {HOOK}): {e.strerror} [{_errname(e.errno)}]; "
                          f"{log}") from None


def _errname(err: int | None) -> str:
    import errno
    return errno.errorcode.get(err or 0, str(err))


# -- set / clear -------------------------------------------------------------------------
def set_policy(cgroup: str, family: str, force: bool) -> dict[str, Any]:
    check_caps()
    cg = resolve_cgroup(cgroup)
    families = FAMILIES[family]
    _refuse_if_set()
    btf_id = hook_btf_id()
    mod = check_module(force)
    sd = StateDir()
    with sd.lock():
        _refuse_if_set()
        prog_fd = load_program(cg, families, btf_id)
        try:
            return _install(cg, families, btf_id, prog_fd, force, mod)
        finally:
            os.close(prog_fd)


def _install(cg: Cgroup, families: tuple[int, ...], btf_id: int, prog_fd: int, force: bool,
             mod: procfile.Module | None) -> dict[str, Any]:
    undo = sysaccess.Journal()
    try:
        mounted = False
        if not _is_bpffs(BPFFS):
            bpfsys.mount_bpffs(BPFFS)
            mounted = True
            undo.defer(bpfsys.umount, BPFFS)
        made_dir = False
        if not os.path.isdir(PIN_DIR):
            os.mkdir(PIN_DIR, 0o700)
            made_dir = True
            undo.defer(os.rmdir, PIN_DIR)
        link_fd = bpfsys.link_create(prog_fd)
        try:
            bpfsys.obj_pin(link_fd, PIN)
            undo.defer(os.unlink, PIN)
            link_id, prog_id = bpfsys.link_ids(link_fd)
        finally:
            os.close(link_fd)
        state = {"cgroup": cg.path, "cgroup_id": cg.id, "level": cg.level,
                 "match": "subtree", "families": [FAMILY_NAMES[f] for f in families],
                 "hook": HOOK, "btf_id": btf_id, "prog_id": prog_id, "link_id": link_id,
                 "pin": PIN, "made_pin_dir": made_dir, "mounted_bpffs": mounted,
                 "forced": force, "module_state": mod.state if mod else None,
                 "kernel": platform.release(), "time": time.time()}
        sysaccess.save_journal(state_path(), state)
    except BaseException as e:          # also Ctrl-C: nothing stays half made
        try:
            undo.restore()
        except sysaccess.RestoreError as r:
            raise OperationFailed(f"setting the policy failed ({e!r}) and so did putting "
                                  f"things back: {r}") from None
        if not isinstance(e, OSError):
            raise
        raise OperationFailed(f"setting the policy failed, nothing left changed: "
                              f"{e.strerror or e} [{_errname(e.errno)}]"
                              f"{' at ' + str(e.filename) if e.filename else ''}") from None
    return state


def _is_bpffs(path: str) -> bool:
    try:
        return bpfsys.fs_type(path) == bpfsys.BPF_FS_MAGIC
    except OSError:
        return False


def clear_policy() -> list[str]:
    """Undo ``set``; the lines say what was done (a single "nothing" line when unset)."""
    check_caps()
    with StateDir().lock():
        st = load_state()
        if st is None and not os.path.lexists(PIN):
            return ["no outsource policy is set: nothing to clear"]
        st = st or {}
        out: list[str] = []
        pin = str(st.get("pin", PIN))
        try:
            os.unlink(pin)
            out.append(f"unpinned {pin}")
        except FileNotFoundError:
            out.append(f"{pin} was already gone")
        except OSError as e:
            raise OperationFailed(f"cannot remove {pin}: {e.strerror}; nothing else changed"
                                  ) from None
        gone = _wait_gone(st.get("prog_id"))
        if not gone:
            out.append(f"note: program {st.get('prog_id')} still exists (another holder of "
                       "its link?)")
        if st.get("made_pin_dir"):
            try:
                os.rmdir(PIN_DIR)
                out.append(f"removed {PIN_DIR}")
            except FileNotFoundError:
                pass
            except OSError as e:
                out.append(f"left {PIN_DIR}: {e.strerror}")
        if st.get("mounted_bpffs") and _is_bpffs(BPFFS):
            if set(os.listdir(BPFFS)) - PRELOADED:
                out.append(f"left bpffs mounted on {BPFFS}: others pinned objects there since")
            else:
                try:
                    bpfsys.umount(BPFFS)
                    out.append(f"unmounted the bpffs kbpctl had mounted on {BPFFS}")
                except OSError as e:
                    out.append(f"left the bpffs kbpctl had mounted on {BPFFS}: {e.strerror}")
        with contextlib.suppress(FileNotFoundError):
            state_path().unlink()
        cg = st.get("cgroup", "?")
        out.append(f"outsource policy cleared: new UDP sockets of {cg} use the kernel's "
                   "stack again (sockets already outsourced stay with kbp_so until closed)")
        return out


def _wait_gone(prog_id: Any) -> bool:
    """Wait until the kernel has freed program ``prog_id`` (a link is released, and its
    program detached, in a work item after the last reference goes)."""
    if not isinstance(prog_id, int) or prog_id <= 0:
        return True
    end = time.monotonic() + GONE_WAIT_S
    while True:
        try:
            fd = bpfsys.prog_get_fd_by_id(prog_id)
        except OSError:
            return True
        os.close(fd)
        if time.monotonic() > end:
            return False
        time.sleep(0.02)


# -- status ------------------------------------------------------------------------------
def _link_state(st: dict[str, Any]) -> str:
    """"attached", "gone" or "unknown (...)": whether the policy's link still exists."""
    try:
        fd = bpfsys.obj_get(str(st.get("pin", PIN)))
    except OSError as e:
        if e.errno == 2:
            return "gone"
        return f"unknown ({e.strerror})"
    try:
        link_id, prog_id = bpfsys.link_ids(fd)
    except OSError as e:
        return f"unknown ({e.strerror})"
    finally:
        os.close(fd)
    if link_id != st.get("link_id") or prog_id != st.get("prog_id"):
        return f"replaced (the pin now holds link {link_id}, program {prog_id})"
    return "attached"


def status() -> dict[str, Any]:
    """Schema kbpctl-outsource/1: ``policy`` (None when unset), ``module`` (None when kbp_so
    is not loaded), ``sockets`` (with their owners)."""
    st = load_state()
    policy: dict[str, Any] | None = None
    if st is not None:
        policy = {k: st.get(k) for k in ("cgroup", "cgroup_id", "match", "families", "prog_id",
                                          "link_id", "pin", "forced", "time")}
        policy["link"] = _link_state(st)
        try:
            same = os.stat(str(st.get("cgroup"))).st_ino == st.get("cgroup_id")
            policy["cgroup_state"] = "present" if same else "recreated (the policy's id is stale)"
        except OSError:
            policy["cgroup_state"] = "gone"
    elif os.path.lexists(PIN):
        policy = {"cgroup": None, "link": "pinned without kbpctl's record: run clear"}
    try:
        mod = procfile.read()
    except (OSError, procfile.ProcFormatError) as e:
        raise OperationFailed(f"cannot read /proc/kbp_so: {e}") from None
    socks: list[dict[str, Any]] = []
    if mod is not None:
        owners = procfile.socket_owners({s.ino for s in mod.socks})
        for s in mod.socks:
            d = s.to_json()
            d["owners"] = [{"pid": p, "comm": c} for p, c in owners.get(s.ino, [])]
            socks.append(d)
    module = None
    if mod is not None:
        module = {"state": mod.state, **mod.counters, **mod.text, **mod.extra}
    return {"schema": "kbpctl-outsource/1", "policy": policy, "module": module,
            "sockets": socks}
