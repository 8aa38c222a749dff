#!/bin/sh
# kbp's Debian packages (make deb): kbp-dkms, kbp-so-dkms, kbpctl and kbp-sod into out/deb/.
#   packaging/deb.sh            check the version, install missing build dependencies
#                               (apt-get build-dep: root), build, run lintian
#   packaging/deb.sh version    check that every version source agrees; print the version
# KBP_DEB_OUT=DIR puts the packages elsewhere; KBP_DEB_LINTIAN=0 skips lintian.
#
# One version: pyproject.toml's. module/dkms.conf (PACKAGE_VERSION), module/kbp_main.c
# (MODULE_VERSION), src/kbp/__init__.py (__version__), packaging/debian/changelog (the
# upstream part of the newest entry) and the README's manual DKMS commands must carry it;
# the build stops, naming the ones that differ, when they do not.
#
# The build runs in a copy of the tree (git's tracked and untracked-but-not-ignored files,
# or every file outside .git/.venv/.cache/out when this is no git checkout), with
# packaging/debian as debian/: nothing is written to the tree but out/deb/.
set -eu
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${KBP_DEB_OUT:-$REPO/out/deb}
# Debian's tools, not a pyenv or venv python that may come first in PATH
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV PYTHONDONTWRITEBYTECODE

die() { echo "deb: $*" >&2; exit 1; }

field() {  # field FILE SED-EXPR: the first match of a sed -n 's/.../\1/p'
	sed -n "$2" "$1" | head -n1
}

version() {
	v=$(field pyproject.toml 's/^version = "\([^"]*\)"$/\1/p')
	[ -n "$v" ] || die "no version in pyproject.toml"
	dch=$(dpkg-parsechangelog -l packaging/debian/changelog -S Version)
	bad=
	check() {  # check WHAT FOUND
		[ "$2" = "$v" ] || bad="$bad
  $1: ${2:-nothing found} (pyproject.toml: $v)"
	}
	check module/dkms.conf "$(field module/dkms.conf 's/^PACKAGE_VERSION="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p')"
	check module/kbp_main.c "$(field module/kbp_main.c 's/^MODULE_VERSION("\([^"]*\)");$/\1/p')"
	check outsource/guest/dkms.conf "$(field outsource/guest/dkms.conf 's/^PACKAGE_VERSION="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p')"
	check outsource/guest/kbp_so_main.c "$(field outsource/guest/kbp_so_main.c 's/^MODULE_VERSION("\([^"]*\)");$/\1/p')"
	check src/kbp/__init__.py "$(field src/kbp/__init__.py 's/^__version__ = "\([^"]*\)"$/\1/p')"
	check packaging/debian/changelog "${dch%-*}"
	readme=$(grep -o 'dkms install kbp/[^ ]*' README.md | head -n1)
	check "README.md (dkms install kbp/...)" "${readme#dkms install kbp/}"
	readme=$(grep -o 'module /usr/src/kbp-[^ ]*' README.md | head -n1)
	check "README.md (cp -r module /usr/src/kbp-...)" "${readme#module /usr/src/kbp-}"
	[ -z "$bad" ] || die "the version sources disagree:$bad"
	echo "$v"
}

sources() {  # the tree's files, NUL-separated
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git ls-files -z --cached --others --exclude-standard
	else
		find . \( -name .git -o -name .venv -o -name .cache -o -name out \) -prune -o \
			-type f -printf '%P\0'
	fi
}

build() {
	v=$(version)
	dv=$(dpkg-parsechangelog -l packaging/debian/changelog -S Version)
	work="$OUT/build"
	tree="$work/kbp-$v"
	rm -rf "$work"
	mkdir -p "$tree"
	# (a file git lists that the work tree lacks, deleted but not committed, is left out)
	sources | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$tree" \
		|| die "cannot copy the tree to $tree"
	mv "$tree/packaging/debian" "$tree/debian"
	cd "$tree"
	if ! dpkg-checkbuilddeps >/dev/null 2>&1; then
		[ "$(id -u)" = 0 ] || die "missing build dependencies ($(dpkg-checkbuilddeps 2>&1 \
			| sed 's/.*Unmet build dependencies: //')): run as root to install them"
		echo "deb: installing the build dependencies"
		export DEBIAN_FRONTEND=noninteractive
		apt-get build-dep -y -qq . >/dev/null 2>&1 || {
			apt-get update -qq && apt-get build-dep -y -qq . >/dev/null; } \
			|| die "apt-get build-dep failed"
	fi
	echo "deb: building kbp $dv in $tree"
	log="$work/build.log"
	if ! dpkg-buildpackage -b -us -uc >"$log" 2>&1; then
		tail -n 40 "$log" >&2
		die "dpkg-buildpackage failed (whole log: $log)"
	fi
	changes="kbp_${dv}_$(dpkg --print-architecture).changes"
	rm -f "$OUT"/kbp-dkms_*.deb "$OUT"/kbp-so-dkms_*.deb "$OUT"/kbpctl_*.deb "$OUT"/kbp-sod_*.deb "$OUT"/kbp-sod-dbgsym_*.deb "$OUT"/kbp_*.changes "$OUT"/kbp_*.buildinfo
	mv "$work"/*.deb "$work"/*.buildinfo "$work/$changes" "$OUT/"
	cd "$REPO"
	rm -rf "$work"
	echo "deb: built into $OUT:"
	(cd "$OUT" && ls -1 ./*.deb | sed 's,^\./,  ,')
	if [ "${KBP_DEB_LINTIAN:-1}" != 0 ]; then
		lint "$OUT/$changes"
	fi
}

lint() {
	if ! command -v lintian >/dev/null; then
		if [ "$(id -u)" = 0 ]; then
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				lintian >/dev/null || die "cannot install lintian"
		else
			echo "deb: lintian is not installed: not run" >&2
			return 0
		fi
	fi
	echo "deb: lintian (overrides: packaging/debian/*.lintian-overrides, docs/packaging.md)"
	# errors fail the build; warnings, info and the experimental tags are printed
	rc=0
	tags=$(lintian --display-info --display-experimental --pedantic "$1" 2>&1) || rc=$?
	printf '%s\n' "$tags" | grep -v -e '^running with root privileges' -e '^$' || true
	[ "$rc" = 0 ] || die "lintian found errors (exit $rc)"
	echo "deb: lintian: no errors"
}

case "${1:-build}" in
version) version ;;
build) build ;;
*) die "usage: $0 [build|version]" ;;
esac
