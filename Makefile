# The two commands of the quick start. Both install what is missing first (scripts/setup.sh).
.PHONY: setup demo test test-all bench clean vm-image

setup:
	@bash scripts/setup.sh

# Evaluate the oracle agent on the whole KAlgebra suite: a success table and where trajectories went.
demo: setup
	.venv/bin/coda eval --env coda/KAlgebra-v0 --agent oracle --out runs/oracle-kalgebra

# The test suite (what CI runs). Slow suites: make test-all.
test: setup
	.venv/bin/python -m pytest -q -m "not slow and not vm and not gpu and not wip"

test-all: setup
	.venv/bin/python -m pytest -q -m "not vm and not gpu and not wip"

bench: setup
	.venv/bin/python benchmarks/env_latency.py

# The libvirt backend's base image (as root; minutes, mostly downloads): vm_images/README.md.
vm-image:
	nice -n 19 bash vm_images/build.sh

clean:
	rm -rf .venv runs
