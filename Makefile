# kbp: the two commands of the README
#   make demo    the main job: a short benchmark of every mode against NAPI (<= 5 min)
#   make test    every test: lint, host tests (real kernel, netns), VM suite on 3 kernels
# and their parts:
#   make setup       install packages, .venv, checkpatch (scripts/setup.sh)
#   make lint        ruff + checkpatch --strict
#   make test-host   pytest on this machine's kernel (unit + netns integration)
#   make test-vm     the in-guest suite under QEMU: whole on Debian 12's 6.12 (slub_debug),
#                    6.12-rt and 6.1, the smoke tests on 7.2, 7.2-rt and Debian 13's 6.12
#                    (why: vm/README.md, "Which flavours run what")
#   make module      build kbp.ko against the headers of KDIR (default: running kernel)

PY      := .venv/bin/python
# The VM suite: one flavour with SLUB debugging (poisoned frees, red zones, sanity checks:
# a use after free in kbp.ko fails the run), the others as users boot them.  Debian 12's
# kernels run every test; 7.2 (not yet green on the whole suite: vm/README.md) and Debian
# 13's 6.12 run the smoke tests, which keeps `make test` near 45 minutes.
DEBUG_FLAVOUR ?= 6.12-amd64
DEBUG_APPEND  ?= slub_debug=FZPU
FLAVOURS ?= 6.12-rt-amd64 6.1-amd64
SMOKE_FLAVOURS ?= 7.2-amd64 7.2-rt-amd64 deb13-6.12-amd64

.PHONY: all setup lint test test-host test-vm demo module clean

all: test

setup:
	scripts/setup.sh

lint: setup
	$(PY) -m ruff check src tests vm
	$(MAKE) -C module checkpatch KSRC=$(CURDIR)/.cache/checkpatch

test-host: setup
	$(PY) -m pytest -q -ra tests vm/tests

test-vm: setup
	@rc=0; \
	$(PY) -m vm test $(DEBUG_FLAVOUR) --append "$(DEBUG_APPEND)" || rc=1; \
	$(PY) -m vm test $(FLAVOURS) || rc=1; \
	$(PY) -m vm test $(SMOKE_FLAVOURS) -- -m smoke || rc=1; \
	exit $$rc

test: lint test-host test-vm

demo: setup
	$(PY) -m kbp.cli bench --demo

module:
	$(MAKE) -C module

clean:
	$(MAKE) -C module clean KDIR=$${KDIR:-/usr/src/linux-headers-6.12.117+deb12-amd64} || true
	rm -rf .cache/vm/kernels/*/build
