"""kbp: kernel busy poll -- control plane, stock-kernel backend and benchmark."""

__version__ = "0.1.0"
