# The two commands of the quick start. Both install what is missing first (scripts/setup.sh).
.PHONY: setup chimerax-engine demo test test-fast test-slow test-all lint bench clean vm-image vm-setup vm-test vm-bench vm-ci

setup:
	@bash scripts/setup.sh

# Evaluate the oracle agent on the whole KAlgebra suite: a success table and where trajectories went.
demo: setup
	.venv/bin/coda eval --env coda/KAlgebra-v0 --agent oracle --out runs/oracle-kalgebra

# ChimeraX 1.7.1's library without a GUI (.chimerax-engine/, ~700 MB, ~50 s cold, instant when done): the
# ChimeraX engine tests run on it; coda/ChimeraX-v0 itself needs the real GUI (.deb).
chimerax-engine:
	@bash scripts/chimerax-engine.sh

# The test suite (what CI runs). Slow suites: make test-all.
test: setup chimerax-engine
	.venv/bin/python -m pytest -q -rs -m "not slow and not vm and not gpu and not wip"

# ruff's lint and its formatter's check (configured in pyproject.toml); CI runs it.
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# The fast tier: fakes only, no X server (well under a minute).
test-fast: setup
	.venv/bin/python -m pytest -q -m fast

# The slow suites alone (every TeXstudio oracle through the GUI, the 10x fault sweep): CI runs them too.
test-slow: setup chimerax-engine
	.venv/bin/python -m pytest -q -m "slow and not vm and not gpu and not wip"

test-all: setup chimerax-engine
	.venv/bin/python -m pytest -q -m "not vm and not gpu and not wip"

bench: setup
	.venv/bin/python benchmarks/env_latency.py

# The libvirt backend's base image (as root; minutes, mostly downloads): vm_images/README.md.
vm-image:
	nice -n 19 bash vm_images/build.sh

# Real VMs (as root): scripts/vm-setup.sh installs libvirtd + QEMU and starts the daemons; the tests and the
# benchmark boot VM_IMAGE (with the domain.xml beside it) under qemu:///system, software emulation.
VM_IMAGE ?= vm_images/build/coda-debian12.qcow2
vm-setup:
	@bash scripts/vm-setup.sh

vm-test: setup vm-setup
	CODA_VM_IMAGE=$(VM_IMAGE) CODA_VM_REQUIRED=1 nice -n 10 .venv/bin/python -m pytest -q -m vm tests/test_libvirt.py

vm-bench: setup vm-setup
	nice -n 10 .venv/bin/python benchmarks/libvirt_latency.py --image $(VM_IMAGE) --app kalgebra
	nice -n 10 .venv/bin/python benchmarks/libvirt_latency.py --image $(VM_IMAGE) --env calc_power --resets 5 --steps 10

# What CI runs after `make test`: the image (built when missing, 2-6 min here), then the `vm` suite.
vm-ci:
	[ -f $(VM_IMAGE) ] || $(MAKE) vm-image
	$(MAKE) vm-test

clean:
	rm -rf .venv runs
