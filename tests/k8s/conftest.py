"""tests/k8s checks contrib/kubernetes. tests/kbpctl/test_private_checkout.py runs the suite in
a copy of the tree that has src, tests, vm, tools and module only: there, with no
contrib/kubernetes to check, these modules are not collected (a skip would show in its
summary, which must show none)."""

from __future__ import annotations

from pathlib import Path

K8S = Path(__file__).resolve().parents[2] / "contrib/kubernetes"
collect_ignore_glob = [] if K8S.is_dir() else ["test_*.py"]
