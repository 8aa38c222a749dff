#!/bin/sh
# Install the host packages the kbp VM rig needs (Debian 12). Idempotent and quiet:
# apt is not touched at all when everything is already installed.  Needs root.
#
#   VM + initramfs : qemu-system-x86 busybox-static kmod (depmod/insmod/modprobe)
#   module build   : gcc-12 make libc6-dev dwarves (pahole: BTF for modules) libelf1
#   fetch          : apt + dpkg-deb (always there), xz-utils (dpkg-deb's xz)
#   newer releases : debootstrap (build chroots for Debian 13 and forky kernels)
#   guest tools    : python3 python3-venv iproute2 iputils-ping ethtool sockperf iperf3
#                    procps bpftrace  (the guest runs the host's binaries over 9p)
set -eu

PACKAGES="qemu-system-x86 busybox-static kmod xz-utils debootstrap
gcc-12 make libc6-dev dwarves libelf1
python3 python3-venv iproute2 iputils-ping ethtool sockperf iperf3 procps bpftrace"

missing=
for p in $PACKAGES; do
	if ! dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed; then
		missing="$missing $p"
	fi
done
if [ -z "$missing" ]; then
	echo "kbp-vm setup: all host packages present"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "kbp-vm setup: missing:$missing; run this as root (sudo sh vm/setup.sh)" >&2
	exit 1
fi
echo "kbp-vm setup: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "kbp-vm setup: done"
