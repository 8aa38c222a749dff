"""``kbpctl outsource``: which UDP sockets kbp_so serves, as a pinned BPF link.

``set`` checks everything first and changes nothing when it refuses: root, the cgroup (v2),
no policy already set, the kernel's hook (BTF FUNC ``update_socket_protocol``), kbp_so
loaded and attached (or ``force``), the program accepted by the verifier.  Then, under
kbpctl's lock, each change registers its undo on a :class:`kbp.system.access.Journal` (a
failure half-way puts everything back): mount bpffs on /sys/fs/bpf if it is not there,
make /sys/fs/bpf/kbp, create the link, pin it at /sys/fs/bpf/kbp/outsource, and write
/run/kbp/outsource.json, which says what was created.  The pin keeps the program attached
after kbpctl exits.

``clear`` undoes exactly that (unpin, remove the directory and unmount bpffs only if ``set``
made them) and waits until the kernel has dropped the program; with nothing set it says so.
A policy is replaced with ``clear`` then ``set``: a tracing link cannot swap its program.

The BPF program only redirects; kbp_so itself decides (design.md 11.13) from three module
parameters, which ``set`` writes before it pins the program (the module allows the cgroup
before the redirect sends its sockets there): ``cgroup`` (the cgroup's path from the
hierarchy's root, as cgroup_get_from_path() takes it), ``netns`` (SO_NETNS_COOKIE values of
the allowed network namespaces; empty: the initial one only) and ``allow_uids``.  Their
previous values are recorded and put back by ``clear`` (only where a parameter still holds
what ``set`` wrote: a reloaded module's are left alone, and said so).  With ``--force`` and
kbp_so not loaded nothing is written: the parameters are given when it is loaded, and
``set`` prints that command line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import pwd
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbp.errors import InvalidInput, KbpctlError, NotRoot, OperationFailed, Unavailable
from kbp.outsource import bpfsys, btf, procfile, prog
from kbp.system import access
from kbp.system.journal import StateDir, run_dir

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

#: kbp_so's module parameters (as kbp.outsource.idle.PARAMS); the tests point it elsewhere
PARAMS = Path("/sys/module/kbp_so/parameters")
#: the policy's parameters, in the order set writes them (clear puts them back in reverse)
POLICY_PARAMS = ("cgroup", "netns", "allow_uids")
MAX_NETNS = 8            # KBP_SO_MAX_NETNS in kbp_so_main.c
MAX_UIDS = 16            # KBP_SO_MAX_UIDS
MAX_CGROUP_PATH = 255    # sizeof(kbp_so_policy_cg_path) - 1
MAX_UID = 0xFFFFFFFE     # (uid_t)-1 is no uid
NETNS_DIR = Path("/run/netns")          # ip netns's names
INIT_NETNS = "init"
KO_PLACEHOLDER = "kbp_so.ko"            # load_command()'s module file when it knows none
#: PROC_NET_INIT_INO: the initial network namespace's inode number, a constant of the kernel
INIT_NET_INO = 0xEFFFFFF9
SO_NETNS_COOKIE = 71
#: run in another network namespace: print the cookie of the namespace it runs in
_COOKIE_PY = ("import socket, struct\n"
              "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
              "print(struct.unpack('=Q', s.getsockopt(socket.SOL_SOCKET, 71, 8))[0])\n")


def state_path() -> Path:
    return run_dir() / "outsource.json"


@dataclass
class Cgroup:
    path: str        # resolved
    id: int          # its cgroup id: the directory's inode number on cgroup v2
    level: int       # depth below the hierarchy's root (the root cgroup: 0)
    rel: str         # its path from the hierarchy's root ("/rt-app"; the root: "/"), as
    #                  kbp_so's cgroup parameter takes it (cgroup_get_from_path())


@dataclass
class Netns:
    """A network namespace the module's policy allows."""

    name: str        # "init" or ip netns's NAME
    ino: int         # its inode number (a namespace made again has another)
    cookie: int | None   # SO_NETNS_COOKIE (None: the initial one, not needed)


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
    return Cgroup(real, os.stat(real).st_ino, len(parts), "/" + "/".join(parts))


# -- the module's policy: its parameters ----------------------------------------------------
def netns_cookie(name: str | None = None) -> int:
    """SO_NETNS_COOKIE of network namespace ``name`` (ip netns's; None: this process's).
    Another namespace's is read by a tiny Python run there (``ip netns exec``)."""
    if name is None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            try:
                raw = s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
            except OSError as e:
                raise Unavailable(f"this kernel ({platform.release()}) has no SO_NETNS_COOKIE "
                                  f"({e.strerror}): --netns needs Linux 5.14 or later"
                                  ) from None
        return int(struct.unpack("=Q", raw)[0])
    try:
        p = access.cmd([sys.executable, "-S", "-c", _COOKIE_PY], ns=name, check=False)
    except OSError as e:
        raise Unavailable(f"--netns {name}: cannot run 'ip netns exec' ({e.strerror}): "
                          "install iproute2") from None
    if p.returncode != 0 or not p.stdout.strip().isdigit():
        why = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise InvalidInput(f"--netns {name}: cannot read its cookie (ip netns exec {name}: "
                           f"{why})")
    return int(p.stdout.strip())


def _own_netns_ino() -> int:
    return os.stat("/proc/self/ns/net").st_ino


def resolve_netns(names: list[str]) -> list[Netns]:
    """The namespaces named (``init`` or ip netns's names), each once, InvalidInput for one
    that does not exist.  The initial one's cookie is read only when another is named too
    (alone, the module's empty ``netns`` says it)."""
    out: list[Netns] = []
    own = _own_netns_ino()
    for name in dict.fromkeys(names):
        if name == INIT_NETNS:
            ino = INIT_NET_INO
        else:
            if not name or "/" in name or name in (".", ".."):
                raise InvalidInput(f"--netns {name!r}: a name from 'ip netns list', or 'init'")
            try:
                ino = os.stat(NETNS_DIR / name).st_ino
            except FileNotFoundError:
                raise InvalidInput(f"--netns {name}: no such network namespace (no "
                                   f"{NETNS_DIR / name}; 'ip netns list' names them, 'init' "
                                   "is the initial one)") from None
            except OSError as e:
                raise InvalidInput(f"--netns {name}: {NETNS_DIR / name}: {e.strerror}"
                                   ) from None
        if any(n.ino == ino for n in out):
            continue            # two names of one namespace
        out.append(Netns(name, ino, None))
    if len(out) > MAX_NETNS:
        raise InvalidInput(f"--netns: {len(out)} network namespaces; kbp_so takes at most "
                           f"{MAX_NETNS}")
    if all(n.ino == INIT_NET_INO for n in out):
        return out              # the initial one only: the module's empty list says it
    for n in out:
        if n.ino == own:
            n.cookie = netns_cookie(None)
        elif n.ino == INIT_NET_INO and n.name == INIT_NETNS:
            raise InvalidInput("--netns init with other namespaces needs the initial "
                               "namespace's cookie, and kbpctl does not run there: run it "
                               "in the initial network namespace")
        else:
            n.cookie = netns_cookie(n.name)
    return out


def resolve_uids(uids: list[str]) -> list[int]:
    """User names or numbers, as uids (of the initial user namespace), each once."""
    out: list[int] = []
    for u in uids:
        if u.isdigit():
            uid = int(u)
            if uid > MAX_UID:
                raise InvalidInput(f"--allow-uid {u}: a uid is 0..{MAX_UID}")
        else:
            try:
                uid = pwd.getpwnam(u).pw_uid
            except KeyError:
                raise InvalidInput(f"--allow-uid {u}: no such user (give a user name or a "
                                   "number)") from None
        if uid not in out:
            out.append(uid)
    if len(out) > MAX_UIDS:
        raise InvalidInput(f"--allow-uid: {len(out)} uids; kbp_so takes at most {MAX_UIDS}")
    return out


def module_values(cg: Cgroup, netns: list[Netns], uids: list[int]) -> dict[str, str]:
    """What set writes to each of :data:`POLICY_PARAMS`."""
    cookies = [] if all(n.cookie is None for n in netns) else [n.cookie for n in netns]
    return {"cgroup": cg.rel, "netns": ",".join(str(c) for c in cookies),
            "allow_uids": ",".join(str(u) for u in uids)}


def norm_param(name: str, value: str) -> str:
    """A parameter's value as written: a read's newline gone, ``netns``'s "init" empty."""
    v = value.strip()
    return "" if name == "netns" and v == INIT_NETNS else v


def read_params() -> dict[str, str] | None:
    """The module's policy parameters as it shows them (stripped); None when kbp_so is not
    loaded or predates them (no ``cgroup`` parameter)."""
    if not (PARAMS / "cgroup").exists():
        return None
    try:
        return {n: (PARAMS / n).read_text().strip() for n in POLICY_PARAMS}
    except FileNotFoundError:
        return None                     # unloaded meanwhile
    except OSError as e:
        raise OperationFailed(f"cannot read kbp_so's parameters in {PARAMS}: {e.strerror}"
                              ) from None


def write_param(name: str, value: str) -> None:
    """One write of ``value`` (with a newline: a write of nothing never reaches the module,
    and it strips the newline), the kernel's errno as OSError."""
    path = PARAMS / name
    try:
        access.write(path, value + "\n")
    except OSError as e:
        raise OSError(e.errno, f"kbp_so refused {name}={value!r}: {e.strerror}", str(path)
                      ) from None


def _load_value(v: str) -> str:
    return f'"{v}"' if re.search(r"\s", v) else v    # the kernel's parser takes "quotes"


def load_command(values: dict[str, str]) -> str:
    """The command that loads kbp_so with ``values`` (empty ones left out: the default):
    modprobe when it knows the module, else insmod of $KBP_SO_KO (the rig's) or of
    :data:`KO_PLACEHOLDER`, which the operator replaces with the path of the build."""
    args = [f"{n}={_load_value(values[n])}" for n in POLICY_PARAMS if values.get(n)]
    ko = os.environ.get("KBP_SO_KO")
    if shutil.which("modinfo"):
        try:
            p = access.cmd(["modinfo", "-n", "kbp_so"], check=False, timeout=10)
            if p.returncode == 0 and p.stdout.strip():
                return shlex.join(["modprobe", "kbp_so", *args])
        except (OSError, subprocess.TimeoutExpired):
            pass
    return shlex.join(["insmod", ko if ko and os.path.isfile(ko) else KO_PLACEHOLDER, *args])


def netns_text(value: str, names: dict[int, str] | None = None) -> str:
    """The module's ``netns`` for a reader: "the initial netns only" or its cookies (with
    the names set recorded for them)."""
    v = norm_param("netns", value)
    if not v:
        return "the initial netns only"
    names = names or {}
    return "netns " + ", ".join(f"{c} ({names[int(c)]})" if c.isdigit() and int(c) in names
                                else c for c in v.split(","))


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
def check_params(mod: procfile.Module | None, force: bool) -> bool:
    """Whether set can write the module's policy parameters (False: kbp_so is not loaded,
    with ``force``); Unavailable for a loaded kbp_so without them, unless ``force``."""
    if mod is None:
        return False
    if (PARAMS / "cgroup").exists():
        return True
    if not force:
        raise Unavailable(f"this kbp_so does not enforce a policy itself (no {PARAMS}/cgroup: "
                          "an older kbp_so without the guest-user policy, which serves "
                          "protocol 253 to any guest user): load the current kbp_so, or give "
                          "--force to set the BPF redirect alone")
    return False


def set_policy(cgroup: str, family: str, force: bool, netns: list[str] | None = None,
               allow_uids: list[str] | None = None) -> dict[str, Any]:
    check_caps()
    cg = resolve_cgroup(cgroup)
    if len(os.fsencode(cg.rel)) > MAX_CGROUP_PATH:
        raise InvalidInput(f"cgroup {cg.path}: its path {cg.rel} is longer than kbp_so takes "
                           f"({MAX_CGROUP_PATH} characters)")
    families = FAMILIES[family]
    _refuse_if_set()
    nets = resolve_netns(netns or [INIT_NETNS])
    uids = resolve_uids(allow_uids or [])
    btf_id = hook_btf_id()
    mod = check_module(force)
    writable = check_params(mod, force)
    sd = StateDir()
    with sd.lock():
        _refuse_if_set()
        prog_fd = load_program(cg, families, btf_id)
        try:
            return _install(cg, families, btf_id, prog_fd, force, mod, nets, uids, writable)
        finally:
            os.close(prog_fd)


def _install(cg: Cgroup, families: tuple[int, ...], btf_id: int, prog_fd: int, force: bool,
             mod: procfile.Module | None, nets: list[Netns] | None = None,
             uids: list[int] | None = None, writable: bool = False) -> dict[str, Any]:
    nets = nets if nets is not None else [Netns(INIT_NETNS, INIT_NET_INO, None)]
    values = module_values(cg, nets, uids or [])
    undo = access.Journal()
    try:
        # the module first: it allows the cgroup before the redirect sends its sockets
        previous = read_params() if writable else None
        if writable and previous is None:
            raise OSError(errno.ENOENT, "kbp_so was unloaded meanwhile", str(PARAMS))
        if previous is not None:
            for name in POLICY_PARAMS:
                write_param(name, values[name])
                undo.defer(write_param, name, norm_param(name, previous[name]))
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
        module = {"written": previous is not None, "want": values, "previous": previous,
                  "netns": [{"name": n.name, "ino": n.ino, "cookie": n.cookie} for n in nets],
                  "allow_uids": uids or [],
                  "load": None if mod is not None else load_command(values),
                  "params_dir": str(PARAMS)}
        state = {"cgroup": cg.path, "cgroup_id": cg.id, "level": cg.level,
                 "cgroup_rel": cg.rel,
                 "match": "subtree", "families": [FAMILY_NAMES[f] for f in families],
                 "hook": HOOK, "btf_id": btf_id, "prog_id": prog_id, "link_id": link_id,
                 "pin": PIN, "made_pin_dir": made_dir, "mounted_bpffs": mounted,
                 "forced": force, "module_state": mod.state if mod else None,
                 "module_params": module,
                 "kernel": platform.release(), "time": time.time()}
        access.save_json(state_path(), state)
    except BaseException as e:          # also Ctrl-C: nothing stays half made
        try:
            undo.restore()
        except access.RestoreError as r:
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
        # the redirect is gone: now the module's policy can go back to what it was
        out += _restore_params(st.get("module_params"))
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


def _restore_params(mp: Any) -> list[str]:
    """Put back the module parameters set wrote, last first, where they still hold what it
    wrote; the lines say what was done ("error: ..." for a write the kernel refused)."""
    if not isinstance(mp, dict):
        return []                       # a record of an older kbpctl: it wrote none
    if not mp.get("written"):
        return ["kbp_so's policy parameters: set wrote none (kbp_so was not loaded); they "
                "stay as kbp_so was loaded"]
    want, prev = mp.get("want") or {}, mp.get("previous") or {}
    try:
        cur = read_params()
    except OperationFailed as e:
        return [f"error: {e}; nothing put back"]
    if cur is None:
        return ["kbp_so is not loaded now: its policy parameters went with it (nothing to "
                "put back)"]
    out: list[str] = []
    for name in reversed(POLICY_PARAMS):
        if name not in want or name not in prev:
            continue
        back = norm_param(name, str(prev[name]))
        now = norm_param(name, cur[name])
        if now != norm_param(name, str(want[name])):
            out.append(f"left kbp_so's {name}={cur[name]!r}: it is no longer what set wrote "
                       f"({want[name]!r}; kbp_so reloaded, or changed by hand)")
            continue
        try:
            write_param(name, back)
            out.append(f"kbp_so's {name}: put back {prev[name]!r}")
            continue
        except OSError as e:
            err: OSError = e
        if name == "cgroup" and err.errno == errno.ENOENT:
            try:        # the cgroup it had is gone: none, rather than the policy's
                write_param(name, "")
                out.append(f"kbp_so's cgroup: {prev[name]!r} no longer exists; set to none")
                continue
            except OSError as e:
                err = e
        why = os.strerror(err.errno) if err.errno else str(err)
        out.append(f"error: could not put back kbp_so's {name}={back!r} ({why}); "
                   f"by hand: echo {shlex.quote(back)} > {PARAMS / name}")
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


def _parse_list(value: str) -> list[int]:
    return [int(x) for x in value.split(",") if x]


def module_policy(params: dict[str, str]) -> dict[str, Any]:
    """The module's parameters for ``status --json``: ``netns`` [] is the initial one only."""
    out: dict[str, Any] = {"cgroup": params["cgroup"]}
    for name in ("netns", "allow_uids"):
        try:
            out[name] = _parse_list(norm_param(name, params[name]))
        except ValueError:
            out[name] = params[name]    # not a list of numbers: as the module wrote it
    return out


def policy_warnings(st: dict[str, Any] | None, params: dict[str, str] | None) -> list[str]:
    """What disagrees between the BPF policy set made and the module's own policy."""
    out: list[str] = []
    if st is None:
        return out
    mp = st.get("module_params") if isinstance(st.get("module_params"), dict) else None
    want: dict[str, Any] = dict(mp.get("want") or {}) if mp else {}
    if "cgroup" not in want:            # a record of an older kbpctl: the cgroup's path
        with contextlib.suppress(KbpctlError, OSError):
            want["cgroup"] = st.get("cgroup_rel") or resolve_cgroup(str(st["cgroup"])).rel
    if params is not None and "cgroup" in want:
        have = norm_param("cgroup", params["cgroup"])
        if have != want["cgroup"]:
            out.append(f"the BPF policy sends the UDP sockets of {st.get('cgroup')} to kbp_so "
                       f"but kbp_so's cgroup parameter is {have or 'empty'!r}, not "
                       f"{want['cgroup']!r} (kbp_so reloaded since set?): their socket() "
                       f"fails with EPERM. Fix: echo {shlex.quote(want['cgroup'])} > "
                       f"{PARAMS / 'cgroup'} (or clear, then set again)")
        for name in ("netns", "allow_uids"):
            if name in want and norm_param(name, params[name]) != norm_param(name, want[name]):
                out.append(f"kbp_so's {name} parameter is {params[name]!r}, not "
                           f"{want[name] or ('init' if name == 'netns' else '')!r} as set "
                           f"wrote it (kbp_so reloaded since set?): echo "
                           f"{shlex.quote(want[name])} > {PARAMS / name}")
    for n in (mp or {}).get("netns") or []:
        if not isinstance(n, dict) or n.get("name") == INIT_NETNS or n.get("cookie") is None:
            continue
        try:
            ino = os.stat(NETNS_DIR / str(n["name"])).st_ino
        except OSError:
            ino = None
        if ino != n.get("ino"):
            what = "is gone" if ino is None else "was made again (a new cookie)"
            out.append(f"network namespace {n['name']} {what}: kbp_so's netns still names "
                       f"cookie {n['cookie']}, so its sockets are refused; clear, then set "
                       "again")
    return out


def status() -> dict[str, Any]:
    """Schema kbpctl-outsource/1: ``policy`` (None when unset), ``module`` (None when kbp_so
    is not loaded), ``sockets`` (with their owners); added later: ``module_params`` (the
    module's policy parameters; None when not loaded or too old) and ``warnings``."""
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
        if isinstance(st.get("module_params"), dict):
            policy["module_params"] = st["module_params"]
    elif os.path.lexists(PIN):
        policy = {"cgroup": None, "link": "pinned without kbpctl's record: run clear"}
    warnings: list[str] = []
    readable = True
    try:
        mod = procfile.read()
    except PermissionError:
        mod, readable = None, False
        warnings.append(f"{procfile.PROC_PATH} is root's (mode 0400): run as root for "
                        "kbp_so's state, counters and sockets")
    except (OSError, procfile.ProcFormatError) as e:
        raise OperationFailed(f"cannot read /proc/kbp_so: {e}") from None
    try:
        params = read_params()
    except OperationFailed as e:
        params = None
        warnings.append(str(e))
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
    elif not readable:
        module = {"state": "unknown"}
    if mod is not None and params is None:
        warnings.append(f"kbp_so has no policy parameters (no {PARAMS}/cgroup: an older "
                        "kbp_so without the guest-user policy): it serves protocol 253 to "
                        "any guest user; load the current kbp_so")
    warnings += policy_warnings(st if policy and policy.get("cgroup") else None, params)
    return {"schema": "kbpctl-outsource/1", "policy": policy, "module": module,
            "sockets": socks,
            "module_params": None if params is None else module_policy(params),
            "warnings": warnings}
