"""The node agent's DaemonSet and config (contrib/kubernetes/node-agent/) agree with the agent
(src/kbp/nodeagent.py), kbpctl and the KMM Module: its arguments are ones the agent takes,
its kbp.toml is one kbpctl accepts, its journal is kbpctl's, the grace period covers the
agent's own timeouts, and the privileges are the ones the README explains."""

from __future__ import annotations

from typing import Any

from kbp import config, names, nodeagent
from kbp.exporter import required_backends
from kbp.system import journal

from .schemas import K8S, load_docs

DS = load_docs(K8S / "node-agent/daemonset.yaml")[0].obj
POD = DS["spec"]["template"]["spec"]
(AGENT,) = POD["containers"]
MODULE = load_docs(K8S / "kmm/module-kbp.yaml")[0].obj
KUSTOMIZATION = load_docs(K8S / "kustomization.yaml")[0].obj
TOML = K8S / "node-agent/kbp.toml"


def args() -> Any:
    """The container's arguments as the agent parses them ($(POD_IP) as Kubernetes fills it)."""
    argv = [a.replace("$(POD_IP)", "10.0.0.7") for a in AGENT["args"]]
    return nodeagent.build_parser().parse_args(argv)


def mounts() -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in AGENT["volumeMounts"]}


def volumes() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in POD["volumes"]}


def test_the_agent_takes_its_arguments() -> None:
    a = args()
    assert a.address == "10.0.0.7" and a.port == 9717 and a.watch >= 0.5
    assert a.module_wait > 0
    (env,) = [e for e in AGENT["env"] if e["name"] == "POD_IP"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_the_config_is_the_configmap_and_kbpctl_accepts_it() -> None:
    a = args()
    m = mounts()[str(a.config.parent)]
    assert "subPath" not in m and m.get("readOnly")   # the directory: edits reach the pod
    cm = volumes()[m["name"]]["configMap"]["name"]
    gen = {g["name"]: g for g in KUSTOMIZATION["configMapGenerator"]}
    assert gen[cm]["files"] == [f"node-agent/{a.config.name}"]
    assert gen[cm]["options"]["disableNameSuffixHash"] is True   # no rollout on an edit
    cfg = config.parse(TOML.read_text(), TOML)
    assert cfg.devices and required_backends(cfg) == {names.BACKEND_KMOD}
    for d in cfg.devices:
        d.request()   # every device's settings make an enable request


def test_the_nodes_are_the_modules() -> None:
    """backend = "kmod": the agent runs where KMM loads kbp.ko."""
    assert POD["nodeSelector"] == MODULE["spec"]["selector"]


def test_the_journal_is_on_the_node() -> None:
    m = mounts()[str(journal.DEFAULT_RUN_DIR)]
    assert not m.get("readOnly")
    assert volumes()[m["name"]]["hostPath"]["path"] == str(journal.DEFAULT_RUN_DIR)
    assert not any(e["name"] == journal.ENV_RUN_DIR for e in AGENT.get("env", []))


def test_termination_leaves_time_to_restore() -> None:
    assert POD["terminationGracePeriodSeconds"] > (nodeagent.APPLY_STOP_TIMEOUT
                                                   + nodeagent.DISABLE_TIMEOUT)


def test_the_privileges_the_readme_explains() -> None:
    assert POD["hostNetwork"] is True and POD["hostPID"] is True
    assert POD["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert POD["automountServiceAccountToken"] is False
    sc = AGENT["securityContext"]
    assert sc == {"privileged": True, "readOnlyRootFilesystem": True}
    netns = mounts()["/run/netns"]
    assert netns["readOnly"] and netns["mountPropagation"] == "HostToContainer"
    readme = (K8S / "README.md").read_text()
    for word in ("CAP_NET_ADMIN", "CAP_SYS_NICE", "CAP_SYS_ADMIN", "hostNetwork", "hostPID",
                 "privileged", "/proc/irq", "/run/kbp"):
        assert word in readme, word
