#!/bin/busybox sh
# PID 1 of a kbp VM rig guest (busybox ash, in the initramfs built by vm/initramfs.py).
#
# 1. load the early modules (virtio, 9p, overlay) listed in /etc/kbp/modules;
# 2. mount the host's / read-only over virtio-9p (tag "hostroot") with a tmpfs overlay on
#    top at /newroot, mount /proc, /sys, /dev, tracefs ... inside it and bind the flavour's
#    extracted /lib/modules/<kver> from the cache over /lib/modules/<kver>;
# 3. find the two test NICs by MAC, print the start marker, run the command (kbp_exec,
#    defined by the host in /kbp/run.sh) chrooted into /newroot, print the exit marker
#    and power off.
#
# Markers (the host parses them, see vm/console.py):
#   KBP-VM-START <nonce>        the command is about to start
#   KBP-VM-EXIT <nonce> <rc>    the command finished with exit status rc
#   KBP-VM-EXIT <nonce> 125     the guest could not set up (the FATAL line says why)

/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

# KBPI_* settings and kbp_exec(); written by the host for this run (vm/run.py).
. /kbp/run.sh

say() { echo "kbp-vm-init: $*"; }
t() { cut -d' ' -f1 /proc/uptime; }

finish() {
	echo "KBP-VM-EXIT $KBPI_NONCE $1"
	sync
	poweroff -f
	# poweroff -f returned: ACPI is broken or missing; ask the kernel directly.
	echo 1 > /proc/sys/kernel/sysrq
	echo o > /proc/sysrq-trigger
	sleep 10
}

die() {
	say "FATAL: $*"
	finish 125
}

say "up at $(t) s; loading early modules"
for m in $(cat /etc/kbp/modules); do
	insmod "/lib/modules/$m" || die "insmod $m failed"
done

mount -t 9p -o "trans=virtio,version=9p2000.L,ro,msize=$KBPI_MSIZE,cache=$KBPI_9P_CACHE" \
	hostroot /mnt/lower || die "cannot mount the host root over virtio-9p (tag hostroot)"
mount -t tmpfs -o mode=755 tmpfs /mnt/rw || die "cannot mount tmpfs"
mkdir -p /mnt/rw/upper /mnt/rw/work
R=/newroot
FALLBACK=
if ! mount -t overlay overlay \
	-o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work $R; then
	say "overlayfs over 9p failed: read-only root with tmpfs on /tmp /var/tmp /root"
	mount -o bind /mnt/lower $R || die "cannot bind the host root"
	FALLBACK=1
	for d in tmp var/tmp root; do
		mount -t tmpfs -o mode=1777 tmpfs "$R/$d" || die "cannot mount tmpfs on /$d"
	done
fi

mount -t proc proc $R/proc || die "cannot mount /proc"
mount -t sysfs sysfs $R/sys || die "cannot mount /sys"
mount -t devtmpfs devtmpfs $R/dev || die "cannot mount /dev"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o ptmxmode=0666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t tmpfs -o mode=755 tmpfs $R/run || die "cannot mount /run"
mount -t tracefs tracefs $R/sys/kernel/tracing
mount -t debugfs debugfs $R/sys/kernel/debug
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
mount -t bpf bpf $R/sys/fs/bpf

# modprobe in the guest needs the guest kernel's modules at /lib/modules/$(uname -r).
if mkdir -p "$R/lib/modules/$KBPI_KVER" 2>/dev/null ||
	{ [ -n "$FALLBACK" ] && mount -t tmpfs -o mode=755 tmpfs "$R/lib/modules" 2>/dev/null &&
		mkdir -p "$R/lib/modules/$KBPI_KVER"; }; then
	mount -o bind "$R$KBPI_MODULES" "$R/lib/modules/$KBPI_KVER" \
		|| die "cannot bind $KBPI_MODULES (from the host, over 9p) to /lib/modules/$KBPI_KVER"
elif [ -n "$FALLBACK" ]; then
	say "WARNING: read-only root without /lib/modules: modprobe will not work" \
		"(insmod from $KBPI_MODULES instead)"
else
	die "cannot create /lib/modules/$KBPI_KVER"
fi

if [ -n "$KBPI_OUT" ]; then
	mount -t 9p -o "trans=virtio,version=9p2000.L,msize=$KBPI_MSIZE,cache=none" \
		kbpout "$R$KBPI_OUT" || die "cannot mount the output share at $KBPI_OUT"
fi

hostname kbp-vm
ip link set lo up
NIC0= NIC1=
for d in /sys/class/net/*; do
	case "$(cat "$d/address")" in
	"$KBPI_MAC0") NIC0=${d##*/} ;;
	"$KBPI_MAC1") NIC1=${d##*/} ;;
	esac
done
[ -n "$NIC0" ] && [ -n "$NIC1" ] \
	|| die "test NICs not found (MACs $KBPI_MAC0 $KBPI_MAC1): $(ls /sys/class/net)"

# QEMU 7.2's multi-threaded TCG can execute the INT3 of the kernel's text patching after
# the kernel has finished the patch and stopped handling it: "Oops: int3" and a panic, e.g.
# in __netif_receive_skb_core when ping(8) opens its SO_TIMESTAMP socket while the other
# vCPU receives (vm/README.md, "Oops: int3").  Keep the most often flipped key,
# netstamp_needed_key, on for the whole run with one SO_TIMESTAMP socket held open: ping's
# own then only moves a count and patches nothing.
pin_netstamp() {
	[ -x $R/usr/bin/python3 ] || { say "WARNING: no python3: netstamp_needed_key not held"; return; }
	chroot $R /usr/bin/python3 -c '
import signal, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 29, 1)  # SO_TIMESTAMP: net_enable_timestamp()
open("/run/kbp-netstamp-held", "w").close()
signal.pause()' < /dev/null > /dev/null 2>&1 &
	i=0
	while [ ! -e $R/run/kbp-netstamp-held ] && [ $i -lt 200 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	[ -e $R/run/kbp-netstamp-held ] || say "WARNING: netstamp_needed_key holder did not start"
}
pin_netstamp

echo "KBP-VM-START $KBPI_NONCE $(t)"
kbp_exec "$NIC0" "$NIC1" < /dev/null
finish $?
