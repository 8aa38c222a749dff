"""kbp: kernel busy poll -- control plane, stock-kernel backend and benchmark."""

__version__ = "0.1.0"

from kbp import _pyroute2

_pyroute2.install()     # pyroute2's submodules without its import-everything __init__
