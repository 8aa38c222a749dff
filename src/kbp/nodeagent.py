"""kbp-node-agent: kbpctl as a Kubernetes node agent (the DaemonSet of contrib/kubernetes).

One process per node. In order:

1. It loads the config (``--config``: kbp.toml from a ConfigMap). A file kbpctl would refuse
   stops it here (exit 2); nothing has changed.
2. It serves the exporter on ``--address``:``--port`` (``kbpctl exporter``'s metrics, plus
   ``kbp_backend_required`` from the config; the pod's readiness probe reads /metrics).
3. When the config asks for the kbp module by name (``backend = "kmod"``) and the module is
   not loaded, it waits for it up to ``--module-wait`` seconds (KMM loads it; building it for
   a kernel it has not seen takes minutes), the metrics saying so meanwhile, then stops
   (exit 69); nothing has changed.
4. It runs ``kbpctl apply --watch S --config PATH``, which re-reads the file every S seconds:
   an edited ConfigMap converges without a restart.
5. On SIGTERM (the pod deleted: the DaemonSet removed or updated, the node drained) it stops
   apply, runs ``kbpctl disable --all`` and exits 0: the node is as it was before kbp. When
   apply stops by itself (its first round failed: a device the file names is missing, a
   setting the backend refuses) it does the same and exits non-zero.

kbpctl journals every change under /run/kbp (``KBP_RUN_DIR``) before making it; with that
directory on the node (a hostPath), an agent killed without its SIGTERM (OOM, SIGKILL) leaves
what it changed restorable: the next agent's apply finds it in sync, and its disable --all,
or one run on the node, restores it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from kbp import names
from kbp.errors import EXIT_FAILED, EXIT_NOPERM, EXIT_UNAVAILABLE, EXIT_USAGE, KbpctlError

PROG = "kbp-node-agent"
DEFAULT_CONFIG = Path("/etc/kbp/kbp.toml")
DEFAULT_WATCH = 10.0
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 9717
#: SIGTERM: how long apply may take to finish its round, then how long disable may take. The
#: DaemonSet's terminationGracePeriodSeconds must exceed their sum (tests/k8s checks it).
APPLY_STOP_TIMEOUT = 30.0
DISABLE_TIMEOUT = 90.0

EPILOG = """\
Every option also comes from the environment: KBP_CONFIG, KBP_WATCH, KBP_ADDRESS, KBP_PORT,
KBP_MODULE_WAIT (the option wins). KBP_RUN_DIR is kbpctl's journal directory (/run/kbp).

exit codes: 0 stopped by SIGTERM/SIGINT and everything restored; 2 the config is invalid
(nothing changed); 69 the config asks for the kbp module and it is not loaded (nothing
changed); 77 not root; otherwise apply's exit code (it stopped by itself; restored), or 1
(disable --all failed: the journal under /run/kbp still holds what to restore).
"""


def _say(text: str) -> None:
    sys.stderr.write(f"{PROG}: {text}\n")
    sys.stderr.flush()



_PR_SET_PDEATHSIG = 1


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM when the agent (its parent) dies."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: {message} (see '{PROG} --help')\n")
        sys.exit(EXIT_USAGE)


def _env(name: str, default: object) -> str:
    """The option's default from the environment, as a string: argparse converts it with the
    option's type, so a bad value is a usage error like a bad option."""
    return os.environ.get(name, str(default))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=_env("KBP_CONFIG", DEFAULT_CONFIG),
                   metavar="PATH", help=f"the kbp.toml to apply (default {DEFAULT_CONFIG})")
    p.add_argument("--watch", type=float, default=_env("KBP_WATCH", DEFAULT_WATCH),
                   metavar="S", help=f"apply --watch S (default {DEFAULT_WATCH:g})")
    p.add_argument("--address", default=_env("KBP_ADDRESS", DEFAULT_ADDRESS), metavar="IP",
                   help="the exporter's address, IPv4 or IPv6 (default 127.0.0.1; the "
                        "DaemonSet passes the pod's IP, the node's with hostNetwork)")
    p.add_argument("--port", type=int, default=_env("KBP_PORT", DEFAULT_PORT),
                   metavar="N", help=f"the exporter's port (default {DEFAULT_PORT}; 0: any "
                                     "free port, printed)")
    p.add_argument("--module-wait", type=float, default=_env("KBP_MODULE_WAIT", 0),
                   metavar="S", help="when the config asks for the kbp module and it is not "
                                     "loaded, wait this long for it before giving up "
                                     "(default 0)")
    return p


def kbpctl_argv(*args: str) -> list[str]:
    """kbpctl of this Python (the image's /usr/bin/kbpctl is the same package)."""
    return [sys.executable, "-m", "kbp.cli", *args]


class Agent:
    def __init__(self, args: argparse.Namespace,
                 module_loaded: Callable[[], bool] | None = None) -> None:
        self.args = args
        self.stop = threading.Event()
        self.signal: int | None = None
        if module_loaded is None:
            from kbp import kmod
            module_loaded = kmod.is_loaded
        self.module_loaded = module_loaded
        self.httpd: Any = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signal = signum
        self.stop.set()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        a = self.args
        if not a.watch >= 0.5:
            _say(f"--watch {a.watch:g} is too short: use 0.5 seconds or more")
            return EXIT_USAGE
        if os.geteuid() != 0:
            _say("not root: kbpctl changes kernel settings (the DaemonSet runs the agent as "
                 "uid 0, privileged); nothing changed")
            return EXIT_NOPERM
        from kbp import config, exporter
        try:
            cfg = config.load(a.config)
        except KbpctlError as e:
            _say(f"the config is invalid: {e.message}; nothing changed (fix the ConfigMap: "
                 "the agent restarts and applies it)")
            return EXIT_USAGE
        wanted = exporter.required_backends(cfg)
        try:
            self._serve(exporter)
            if names.BACKEND_KMOD in wanted and not self._wait_for_module(cfg):
                if self.stop.is_set():
                    return self._restore(None)
                return EXIT_UNAVAILABLE
            if self.stop.is_set():
                return self._restore(None)
            return self._apply_until_stopped()
        finally:
            if self.httpd is not None:
                self.httpd.shutdown()
                self.httpd.server_close()

    def _serve(self, exporter: Any) -> None:
        reg = exporter.registry(exporter.KbpCollector(config=self.args.config))
        self.httpd, bound = exporter.serve(exporter.Listen(self.args.address, self.args.port),
                                           reg)
        _say(f"exporter serving http://{bound}/metrics")

    def _wait_for_module(self, cfg: Any) -> bool:
        """True once the module is loaded; False after --module-wait (or a signal)."""
        if self.module_loaded():
            return True
        wait = max(self.args.module_wait, 0.0)
        devs = ", ".join(d.name + (f" (netns {d.netns})" if d.netns else "")
                         for d in cfg.devices if d.backend == names.BACKEND_KMOD)
        what = f"{cfg.path} asks for backend kmod" + (f" ({devs})" if devs else
                                                       " ([rt_class] rule)")
        if wait:
            _say(f"{what}, and the kbp module is not loaded: waiting up to {wait:g} s for it "
                 "(KMM loads it on the nodes its Module selects)")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.stop.wait(min(1.0, max(deadline - time.monotonic(), 0.0))):
                return False
            if self.module_loaded():
                _say("the kbp module is loaded")
                return True
        _say(f"{what}, but the kbp module is not loaded on this node"
             f"{f' after {wait:g} s' if wait else ''}: nothing changed. KMM loads it where "
             "its Module's selector and kernel mappings match and its build succeeded: "
             "kubectl -n kbp get module kbp -o yaml; kubectl -n kbp get events "
             "(BuildFailed); or set backend = \"auto\" to serve with the stock backend "
             "where the module is missing")
        return False

    def _apply_until_stopped(self) -> int:
        a = self.args
        argv = kbpctl_argv("apply", "--watch", f"{a.watch:g}", "--config", str(a.config))
        _say(f"running kbpctl {' '.join(argv[3:])}")
        # its own session: a terminal's Ctrl-C reaches the agent only, which stops it in
        # order; and SIGTERM if the agent dies without stopping it (SIGKILL, an OOM kill):
        # no apply --watch left converging a node nothing watches
        apply = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_term_with_parent)
        try:
            while not self.stop.wait(0.5):
                if apply.poll() is not None:
                    break
        finally:
            rc = self._stop_apply(apply)
        if self.signal is None:
            _say(f"kbpctl apply stopped by itself (exit {rc}): restoring the node")
            code = self._restore(rc)
            return code if code != 0 else (rc or EXIT_FAILED)
        return self._restore(None)

    def _stop_apply(self, apply: subprocess.Popen[bytes]) -> int:
        if apply.poll() is None:
            apply.send_signal(signal.SIGTERM)   # it finishes its round, then exits 0
            try:
                apply.wait(timeout=APPLY_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                _say(f"kbpctl apply did not stop within {APPLY_STOP_TIMEOUT:g} s: killing "
                     "it (its journal lets disable restore a half-done enable)")
                apply.kill()
                apply.wait()
        return apply.returncode

    def _restore(self, apply_rc: int | None) -> int:
        """``kbpctl disable --all``: 0 when it restored everything."""
        why = f"signal {signal.Signals(self.signal).name}" if self.signal else "apply stopped"
        _say(f"{why}: running kbpctl disable --all")
        try:
            # its own session too: a second Ctrl-C must not cut the restore short
            p = subprocess.run(kbpctl_argv("disable", "--all"), stdin=subprocess.DEVNULL,
                               timeout=DISABLE_TIMEOUT, start_new_session=True)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = -1
        if rc != 0:
            _say(f"kbpctl disable --all failed ({'timed out' if rc == -1 else f'exit {rc}'}): "
                 "the journal under /run/kbp still holds what to restore (run kbpctl "
                 "disable --all on the node, or start the agent again)")
            return EXIT_FAILED
        _say("the node is restored" + ("" if apply_rc is None else
                                      f" (kbpctl apply had exited {apply_rc})"))
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return Agent(args).run()
    except KbpctlError as e:   # the exporter's port in use, an address not of this host
        _say(f"{e.message}; nothing changed")
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
