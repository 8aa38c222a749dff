#!/bin/sh
# kbpctl bench --anatomy over the rig's two virtio NICs, in the guest (docs/results.md,
# "The split's tail anatomy in the rig"):
#
#   python3 -m vm run 7.2-amd64 --build --out /root/ana-rig -- sh vm/bench-anatomy.sh \
#       /root/ana-rig/7.2 [bench options...]
#
# QEMU 7.2's TCG can run a stale int3 of the kernel's text patching (vm/README.md, "Oops:
# int3"), and every bpftrace start and stop patches each tracepoint's static key and static
# call.  Two probes held on every tracepoint of these subsystems for the whole boot
# (ftrace's enable with tracing_on 0, and a bpftrace probe whose predicate never holds) keep
# the keys on and the calls at the iterator, so the bench's own bpftrace patches nothing.
set -eu
out=${1:?usage: bench-anatomy.sh OUT_DIR [bench options...]}
shift
modprobe veth
grep -q '^kbp ' /proc/modules || insmod "$KBP_KO"
T=/sys/kernel/tracing
mountpoint -q $T || mount -t tracefs nodev $T
echo 0 > $T/tracing_on
for e in net napi sock sched irq; do echo 1 > "$T/events/$e/enable"; done
bpftrace -e 'tracepoint:net:*,tracepoint:napi:*,tracepoint:sock:*,tracepoint:sched:*,tracepoint:irq:* /pid == 0 && cpu > 4096/ { @x = 1; }' >/dev/null 2>&1 &
holder=$!
sleep 30                                   # bpftrace attaches slowly under TCG
rc=0
"${KBP_PYTHON:-python3}" -m kbp.bench --scenario shared-cpu --modes napi,hybrid-part \
    --reps 3 --duration 5 --parts rtt --loads off,on --rate 300 --anatomy \
    --nic-pair "$KBP_NIC1,$KBP_NIC0" --out "$out" "$@" || rc=$?
kill "$holder" 2>/dev/null || true
for e in net napi sock sched irq; do echo 0 > "$T/events/$e/enable"; done
exit $rc
