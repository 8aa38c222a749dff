#!/bin/sh
# Install what kbp's build, tests and demo need on a Debian 12 host, idempotently:
# Debian packages, a Python venv (.venv) with kbp and its dependencies, and
# checkpatch.pl from Debian's kernel source package.
#   scripts/setup.sh            everything (root, for apt)
#   KBP_SETUP_SKIP_APT=1 ...     only checkpatch and the venv
set -eu
cd "$(dirname "$0")/.."

# The VM rig's packages (QEMU, module build, guest tools: see vm/setup.sh) plus
#   linux-source-6.12  for checkpatch.pl;  util-linux  for setpriv and taskset;
#   dkms  to test the DKMS build (tests/module) and the kbp-dkms package (VM);
#   dpkg-dev lintian  make deb and its tests (tests/deb), with the build dependencies of
#     packaging/debian/control (apt-get build-dep, below);
#   python3-prometheus-client  with python3-pyroute2 and python3-rich (build dependencies):
#     the kbpctl package's Depends, which the VM package test installs it against (the
#     guest runs this machine's userland and has no apt mirror);
#   libseccomp-dev  kbp-sod's seccomp filter (outsource/sod; also a build dependency);
#   golang-go dnsmasq-base  what socket outsourcing's guest test runs unmodified in the guest
#     (tests/outsource: an edge-triggered Go server built with Debian's Go, Debian's DNS
#     forwarder; dnsmasq-base is the binary alone, no service)
APT_PACKAGES="linux-source-6.12 util-linux dkms dpkg-dev lintian python3-prometheus-client libseccomp-dev golang-go dnsmasq-base"
# go: fetches the operators' Go modules whose CRDs tests/k8s checks contrib/kubernetes
# against (below). The machine's own Go when it has one; else Debian's golang-go (1.19:
# enough for go mod download)
GO=$(command -v go || true)
[ -n "$GO" ] || [ ! -x /usr/local/go/bin/go ] || GO=/usr/local/go/bin/go
[ -n "$GO" ] || APT_PACKAGES="$APT_PACKAGES golang-go"

missing() {
	for p in $APT_PACKAGES; do
		dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || echo "$p"
	done
}

if [ "${KBP_SETUP_SKIP_APT:-0}" != 1 ]; then
	sh vm/setup.sh
	need=$(missing)
	if [ -n "$need" ]; then
		[ "$(id -u)" = 0 ] || { echo "setup: need root to apt-get install:" $need >&2; exit 1; }
		echo "setup: installing" $need
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		# shellcheck disable=SC2086
		apt-get install -y -qq --no-install-recommends $need >/dev/null
	fi
	if ! dpkg-checkbuilddeps packaging/debian/control >/dev/null 2>&1; then
		[ "$(id -u)" = 0 ] || { echo "setup: need root to install make deb's build" \
			"dependencies (apt-get build-dep ./packaging)" >&2; exit 1; }
		echo "setup: installing the build dependencies of packaging/debian/control"
		export DEBIAN_FRONTEND=noninteractive
		apt-get build-dep -y -qq ./packaging >/dev/null
	fi
fi

# tuned's profile loader and profiles for tests/deb/test_tuned.py: Debian's tuned package
# unpacked, not installed (it would pull in dbus and polkitd; its daemon cannot run here)
TUNED=.cache/tuned
if [ ! -f "$TUNED/root/usr/lib/python3/dist-packages/tuned/profiles/loader.py" ] &&
   [ "${KBP_SETUP_SKIP_APT:-0}" != 1 ]; then
	echo "setup: unpacking Debian's tuned into $TUNED"
	rm -rf "$TUNED" && mkdir -p "$TUNED"
	(cd "$TUNED" && apt-get download -q tuned >/dev/null 2>&1 &&
		dpkg-deb -x tuned_*.deb root && rm -f tuned_*.deb) ||
		echo "setup: could not fetch tuned: tests/deb/test_tuned.py will skip" >&2
fi

# The CRDs of KMM, the Prometheus Operator and the Node Tuning Operator, for tests/k8s: the
# operators' Go modules that tests/k8s/crds/go.mod pins (content hashes in its go.sum) in the
# module cache .cache/go/mod. Nothing is built; the tests read the cache offline.
[ -n "$GO" ] || [ ! -x /usr/bin/go ] || GO=/usr/bin/go
if [ -n "$GO" ]; then
	mods=$(sed -n 's/^[[:space:]]*\(github\.com\/[^[:space:]]*\) v.*/\1/p' tests/k8s/crds/go.mod)
	# shellcheck disable=SC2086
	(cd tests/k8s/crds && GOPATH="$PWD/../../../.cache/go" GOMODCACHE="$PWD/../../../.cache/go/mod" \
		GOFLAGS="-mod=readonly -modcacherw" GOTOOLCHAIN=local GOWORK=off \
		"$GO" mod download $mods) ||
		echo "setup: could not fetch the operators' CRDs (tests/k8s/crds/go.mod):" \
			"tests/k8s will skip those checks" >&2
else
	echo "setup: no go: tests/k8s will skip the checks against the operators' CRDs" >&2
fi

# ntpsec's ntpd for socket outsourcing's guest test (tests/outsource/guest_servers.py: an NTP
# server in its packaged default configuration): the package unpacked, not installed (its
# service would start on this machine); it runs in the guest from here
NTPSEC=.cache/udp-servers/ntpsec
if [ ! -x "$NTPSEC/usr/sbin/ntpd" ] && [ "${KBP_SETUP_SKIP_APT:-0}" != 1 ]; then
	echo "setup: unpacking Debian's ntpsec into $NTPSEC"
	rm -rf "$NTPSEC" && mkdir -p "$NTPSEC"
	(cd "$NTPSEC" && apt-get download -q ntpsec >/dev/null 2>&1 &&
		dpkg-deb -x ntpsec_*.deb . && rm -f ntpsec_*.deb) ||
		echo "setup: could not fetch ntpsec: the NTP server scenario will fail" >&2
fi

# checkpatch.pl and its data files, from Debian's kernel source tarball
CP=.cache/checkpatch
if [ ! -x "$CP/scripts/checkpatch.pl" ]; then
	echo "setup: extracting checkpatch.pl from linux-source-6.12"
	mkdir -p "$CP"
	tar -xJf /usr/src/linux-source-6.12.tar.xz -C "$CP" --strip-components=1 \
		linux-source-6.12/scripts/checkpatch.pl \
		linux-source-6.12/scripts/spelling.txt \
		linux-source-6.12/scripts/const_structs.checkpatch
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
	echo "setup: creating .venv"
	"$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import kbp, pyroute2, rich, matplotlib, pytest, ruff, mypy, yaml, \
		jsonschema, kubernetes_validate, promql_parser" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.kbp-installed ]; then
	echo "setup: installing kbp into .venv"
	.venv/bin/pip install -q --upgrade pip >/dev/null
	.venv/bin/pip install -q -e '.[dev]'
	touch .venv/.kbp-installed
fi
echo "setup: ok"
