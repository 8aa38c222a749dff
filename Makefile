# kbp: the two commands of the README
#   make demo    the main job: a short benchmark of every mode against NAPI (about 6 min)
#   make test    every test: lint, host tests (real kernel, netns), VM suite on 5 kernels
# and their parts:
#   make setup       install packages, .venv, checkpatch (scripts/setup.sh)
#   make lint        ruff, mypy (src/kbp: pyproject.toml's [tool.mypy]), the files generated
#                    from module/netlink/kbp.yaml up to date
#                    (tools/kbp_spec.py check, tools/kbp_so_spec.py check), checkpatch --strict
#   make test-host   pytest on this machine's kernel (unit + netns integration)
#   make test-vm     the in-guest suite under QEMU: whole on Debian 12's 6.12 (slub_debug)
#                    but the tests marked long; smoke on 6.1 and 7.2-rt; the PREEMPT_RT
#                    hazards (marker rt) on 6.12-rt; socket outsourcing's guest test on
#                    6.12, 6.1 and (its sockets and faults) 6.12-rt; a -Werror
#                    build of kbp.ko and kbp_so.ko for 7.2 and Debian 13's 6.12
#                    (why: vm/README.md, "Which flavours run what")
#   make test-vm-all the whole in-guest suite on every flavour, and socket outsourcing's
#                    guest test on 7.2-rt too (before a release; ~2.5 h)
#   make stress      kbp.ko's stress test (vm/guest_tests/test_stress.py: resets of every
#                    port at once, channel changes, reclassification, attach/detach, rmmod,
#                    under traffic) for STRESS_MINUTES on each rig kernel with SLUB debugging,
#                    and a table of events, frames lost, splats (python3 -m vm.stress).
#                    make test runs its short form: 30 seconds, on 6.12
#   make module      build kbp.ko against the headers of KDIR (default: running kernel)
#   make deb         the Debian packages kbp-dkms, kbp-so-dkms, kbpctl and kbp-sod in out/deb/
#                    (packaging/deb.sh: installs its build dependencies, runs lintian;
#                    docs/packaging.md)
#   make fuzz-sod    kbp-sod's concurrent-mutation fuzzer (outsource/sod/fuzz.c, ASan+UBSan)
#                    for FUZZ_MINUTES at -O0, then as long at -O2; make test runs it 5 s each

PY      := .venv/bin/python
# The VM suite: the whole of it on one flavour with SLUB debugging (poisoned frees, red
# zones, sanity checks: a use after free in kbp.ko fails the run), but the tests marked long
# (each covered by another); the smoke tests on the oldest kernel line and on the newest, in
# its PREEMPT_RT build (7.2-rt: 7.2's code paths with RT's sleeping locks); the PREEMPT_RT
# hazards (marker rt) on Debian 12's RT kernel; a build of kbp.ko with -Werror for 7.2 and for
# Debian 13's kernels (Debian 12's 6.12 source built with gcc-14).  Budget: 40 minutes from a
# fresh clone on a 2-core machine; vm/README.md ("Which flavours run what") has the times.
DEBUG_FLAVOUR ?= 6.12-amd64
# F sanity checks, Z red zones, P poisoning: what finds a use after free or an overrun. Not U
# (each allocation's and free's stack trace, unwound on every kmalloc and kfree, skbs
# included, under TCG): it only tells a report whose they were. For that, rerun the failing
# test with DEBUG_APPEND=slub_debug=FZPU (make stress keeps U: vm/stress.py)
DEBUG_APPEND  ?= slub_debug=FZP
# the 6.12 run also gets a multi-queue virtio-net NIC on a tap (vm/mqnic.py: root): where
# the module's NAPI numbering meets a real multi-queue driver
DEBUG_RIG     ?= --mq-nic
STRESS_MINUTES ?= 30
STRESS_FLAVOURS ?= 6.12-amd64 6.1-amd64 6.12-rt-amd64 7.2-amd64 7.2-rt-amd64
VM_TIMEOUT ?= 2700
SMOKE_FLAVOURS ?= 6.1-amd64 7.2-rt-amd64
RT_ONLY_FLAVOURS ?= 6.12-rt-amd64
BUILD_FLAVOURS ?= 7.2-amd64 deb13-6.12-amd64
# Socket outsourcing's guest test (tests/outsource/test_guest_vm.py): one boot per flavour
# with kbp-sod on the host: the policy (kbpctl outsource), an unmodified sockperf server
# served through kbp_so by it, every socket operation and fault, the daemon killed last
# (~30-80 s each). kbp_so.ko is also built with -Werror for the build-only flavours (7.2
# among them: 7.2-rt's run is make test-vm-all's, for make test's budget; PREEMPT_RT's
# sleeping locks under kbp_so run on 6.12-rt).
OUTSOURCE_FLAVOURS ?= 6.12-amd64,6.1-amd64,6.12-rt-amd64
# 6.12-rt runs the socket operations and faults only: the policy and sockperf scenarios are
# user space and BPF over the same module paths, run on 6.12 with slub_debug (and 6.1 for
# its refusal)
OUTSOURCE_SOCKETS_ONLY ?= 7.2-rt-amd64,6.12-rt-amd64
OUTSOURCE_ALL_FLAVOURS ?= $(OUTSOURCE_FLAVOURS),7.2-rt-amd64
# where a new kbp-sod starts after the kill (its epoch frees the pages lent to the dead one)
OUTSOURCE_RESTART ?= 6.12-rt-amd64
# where the boot starts with a receive parked across a kexec reboot into the same kernel
# (tests/outsource/guest_reboot.py; the rest runs in that kernel): nothing of the host may
# reach the new kernel's RAM
OUTSOURCE_REBOOT ?= 6.12-amd64
ALL_FLAVOURS ?= 6.12-amd64 6.12-rt-amd64 6.1-amd64 7.2-amd64 7.2-rt-amd64 \
		deb13-6.12-amd64 deb13-6.12-rt-amd64

FUZZ_MINUTES ?= 5

.PHONY: all setup lint test test-host test-vm test-vm-all stress demo module deb fuzz-sod clean

all: test

setup:
	scripts/setup.sh

lint: setup
	$(PY) -m ruff check src tests vm tools
	$(PY) -m mypy
	$(PY) tools/kbp_spec.py check
	$(PY) tools/kbp_so_spec.py check
	$(MAKE) -C module checkpatch KSRC=$(CURDIR)/.cache/checkpatch
	$(MAKE) -C outsource/guest checkpatch KSRC=$(CURDIR)/.cache/checkpatch

test-host: setup
	$(PY) -m pytest -q -ra --durations=15 tests vm/tests

# deb: the in-guest package test installs out/deb's packages (skips without them)
test-vm: setup deb
	@rc=0; \
	$(PY) -m vm test $(DEBUG_FLAVOUR) --append "$(DEBUG_APPEND)" --timeout $(VM_TIMEOUT) \
		$(DEBUG_RIG) -- -m "not long" || rc=1; \
	$(PY) -m vm test $(SMOKE_FLAVOURS) -- -m smoke || rc=1; \
	$(PY) -m vm test $(RT_ONLY_FLAVOURS) -- -m rt || rc=1; \
	KBP_SO_VM=1 KBP_SO_VM_FLAVOUR=$(OUTSOURCE_FLAVOURS) \
		KBP_SO_VM_SOCKETS_ONLY=$(OUTSOURCE_SOCKETS_ONLY) KBP_SO_VM_RESTART=$(OUTSOURCE_RESTART) \
		KBP_SO_VM_REBOOT=$(OUTSOURCE_REBOOT) \
		KBP_SO_VM_APPEND="$(DEBUG_FLAVOUR)=$(DEBUG_APPEND);6.12-rt-amd64=$(DEBUG_APPEND)" \
		$(PY) -m pytest -q -ra --durations=5 tests/outsource/test_guest_vm.py || rc=1; \
	for f in $(BUILD_FLAVOURS); do $(PY) -m vm build $$f || rc=1; done; \
	for f in $(BUILD_FLAVOURS); do \
		$(PY) -m vm build $$f --module-dir outsource/guest || rc=1; done; \
	exit $$rc

test-vm-all: setup
	@rc=0; \
	$(PY) -m vm test $(ALL_FLAVOURS) --timeout $(VM_TIMEOUT) || rc=1; \
	KBP_SO_VM=1 KBP_SO_VM_FLAVOUR=$(OUTSOURCE_ALL_FLAVOURS) \
		KBP_SO_VM_SOCKETS_ONLY=$(OUTSOURCE_SOCKETS_ONLY) KBP_SO_VM_RESTART=$(OUTSOURCE_RESTART) \
		KBP_SO_VM_REBOOT=$(OUTSOURCE_REBOOT) \
		$(PY) -m pytest -q -ra --durations=5 tests/outsource/test_guest_vm.py || rc=1; \
	exit $$rc

stress: setup
	$(PY) -m vm.stress --minutes $(STRESS_MINUTES) $(STRESS_FLAVOURS)

test: lint test-host test-vm

demo: setup
	$(PY) -m kbp.cli bench --demo

module:
	$(MAKE) -C module

deb:
	packaging/deb.sh

fuzz-sod:
	$(MAKE) -C outsource/sod fuzz-run FUZZ_SECONDS=$$(( $(FUZZ_MINUTES) * 60 ))

clean:
	$(MAKE) -C module clean KDIR=$${KDIR:-/usr/src/linux-headers-6.12.117+deb12-amd64} || true
	rm -rf .cache/vm/kernels/*/build
