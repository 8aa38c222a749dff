"""Import pyroute2's submodules without its package ``__init__``.

``from pyroute2.netlink.generic import GenericNetlinkSocket`` runs ``pyroute2/__init__.py``
first, as every import of a submodule runs its parents', and that one imports the whole
library (NDB, IPDB, conntrack, nftables, wireguard, plan9, ...): ~60 % of kbpctl's start-up
on the host, seconds per kbpctl call in the TCG test VMs. kbp uses the generic netlink
socket and IPRoute only. So before anything of kbp imports pyroute2, ``pyroute2`` is put in
``sys.modules`` as the bare package (its ``__path__`` set, ``__init__`` not run): submodules
import as usual, and the first lookup of a name the full package defines
(``from pyroute2 import IPRoute``, ``pyroute2.__version__``) runs ``__init__`` then, so code
that wants the whole library gets it unchanged. Nothing happens if pyroute2 was imported
already or is missing.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

#: dunder names the full package defines (others, e.g. ``__wrapped__``, are probes)
_PUBLIC_DUNDERS = frozenset({"__version__", "__all__"})


def install() -> None:
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    mod = importlib.util.module_from_spec(spec)
    state = {"done": False}

    def __getattr__(name: str) -> Any:
        # a submodule (``from pyroute2 import config`` inside pyroute2): let the import
        # system load it; anything else: the full package, once
        if (state["done"] or (name.startswith("__") and name not in _PUBLIC_DUNDERS)
                or importlib.util.find_spec(f"pyroute2.{name}") is not None):
            raise AttributeError(f"module 'pyroute2' has no attribute {name!r}")
        state["done"] = True
        assert spec.loader is not None
        spec.loader.exec_module(mod)
        if name not in mod.__dict__:
            raise AttributeError(f"module 'pyroute2' has no attribute {name!r}")
        return mod.__dict__[name]

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules["pyroute2"] = mod

