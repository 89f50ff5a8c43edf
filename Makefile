# umprov: the two commands of the quick start are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
UMPROV := $(BIN)/umprov
LAB ?= demo
HOSTS ?= 2
PYTEST_ARGS ?=
# Test files side by side (pytest-xdist), a file per worker: a lab module's hosts are its module
# fixtures. Two workers on a 2-core machine: the lab tier mostly waits (sshd, apt, image
# streams), so a second file fills the gaps; 6 (2026-12-01) pushed the load past 20 and set-ups
# past pytest's timeout. The Docker-converged host snapshot (tests/lab/conftest.py) took the
# longest set-ups down. WORKERS=0 runs them in one process.
WORKERS ?= 2
SIDE_BY_SIDE := -n $(WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: help venv sysdeps demo demo-slurm test test-unit test-lab test-gpu lint lab-up lab-down bench clean dist collection collection-sanity

help:
	@echo "make demo       bring up the local lab and run umprov against it"
	@echo "make demo-slurm a Slurm lab and a rolling change over it, batch by batch"
	@echo "make test       the whole suite: lint, unit and lab tests (needs root or a Docker engine)"
	@echo "make test-unit  fast tests only (no Docker, no network, none marked slow)"
	@echo "make test-lab   integration tests against the local lab"
	@echo "make test-gpu   GPU tests (needs an NVIDIA GPU; skipped without one)"
	@echo "make lint       ruff, yamllint, ansible-lint"
	@echo "make bench      benchmarks (bench/README.md)"
	@echo "make dist       umprov's and umprov-lab's wheels and sdists, and the umprov.gpu collection, in dist/"
	@echo "make collection the umprov.gpu Ansible collection (dist/umprov-gpu-VERSION.tar.gz)"
	@echo "make lab-up / lab-down"

# umprov and its lab, a distribution of its own (lab/) that adds `umprov lab` as a plugin.
$(BIN)/umprov: pyproject.toml lab/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./lab
	@# The verifier's CPU self-tests (gloo) want torch: a CPU wheel, found as `umprov lab image`
	@# finds one (UMPROV_LAB_TORCH_WHEEL, /opt/wheels, .lab/wheels, PyTorch's CPU index where it
	@# answers: lab/umprov_lab/torch_wheel.py). A plain `pip install torch` would download a
	@# multi-GB CUDA build.
	@if w=$$($(BIN)/python -m umprov_lab.torch_wheel); then $(BIN)/pip install -q "$$w"; \
	  else echo "no CPU torch wheel: the gloo self-tests will be skipped"; fi
	@touch $@

venv: $(BIN)/umprov

# What users install (README, "Install"): wheels and sdists that carry the playbooks, roles and
# image files (setup.py), and the collection built from the same roles and playbooks. Built in a
# venv of their own holding only what building needs (scripts/build-requirements.txt, about
# 60 MB), not the development venv (ruff, ansible-lint, a CPU torch: about 1 GB).
BUILD_DIR ?= build
BUILD_VENV ?= $(BUILD_DIR)/venv
DIST ?= dist
$(BUILD_VENV)/bin/pyproject-build: scripts/build-requirements.txt
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "make dist needs Python's venv module: apt-get install python3-venv" >&2; exit 5; }
	@test -x $(BUILD_VENV)/bin/python || $(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install -q -r scripts/build-requirements.txt
	@touch $@

dist: collection
	$(BUILD_VENV)/bin/python -m build -q --no-isolation --outdir $(DIST) .
	$(BUILD_VENV)/bin/python -m build -q --no-isolation --outdir $(DIST) lab

collection: $(BUILD_VENV)/bin/pyproject-build
	$(BUILD_VENV)/bin/python collection/build.py --output-path $(DIST) \
	  --build-dir $(BUILD_DIR)/collection

# ansible-test sanity on the collection as built: every test, each in its own virtual environment.
collection-sanity: venv
	$(BIN)/python collection/sanity.py

sysdeps:
	@./scripts/system-deps.sh

# The main job on the local lab: simulated hosts, provisioned, the container deployed and
# verified. The lab has no GPU, so verify reports that honestly (exit 13) without failing the demo.
demo: sysdeps venv
	$(UMPROV) lab up --name $(LAB) --hosts $(HOSTS)
	$(UMPROV) inventory check lab/$(LAB)
	$(UMPROV) provision lab/$(LAB)
	$(UMPROV) lab image
	$(UMPROV) deploy lab/$(LAB) --push --authorized-key .lab/$(LAB)/id_ed25519.pub
	$(UMPROV) status lab/$(LAB)
	@$(UMPROV) verify lab/$(LAB) --json > .lab/$(LAB)/verify.json; rc=$$?; \
	  echo "verify exit code $$rc (13: no GPU in the lab, reported as a failure, never a pass); report: .lab/$(LAB)/verify.json"; \
	  [ $$rc -eq 0 ] || [ $$rc -eq 13 ]
	@echo "demo done: lab '$(LAB)', inventory/lab/$(LAB).yml. umprov is in $(VENV)/bin: 'source $(VENV)/bin/activate' puts it on PATH."
	@echo "  log in:  $(UMPROV) status lab/$(LAB) --connect lab-$(LAB)-1   (the ssh command and the Jupyter URL, from any folder)"
	@echo "  remove:  make lab-down LAB=$(LAB)"

# A rolling change on a Slurm lab (docs/slurm.md): 4 hosts and a slurmctld; the container toolkit
# rolled over them in batches 1 + 2 + 1 (the lab's stand-in driver has no driver that answers, so
# the toolkit is the change). Host 3 expects a GPU it lacks (an inventory overlay, under its
# group so that the hosts keep their order): it is left
# drained with that reason, and the 50% failure budget lets the rollout go on (exit code 10).
SLURM_LAB ?= demo-slurm
demo-slurm: sysdeps venv
	$(UMPROV) lab up --slurm --name $(SLURM_LAB) --hosts 4
	@printf 'all:\n  children:\n    slurm_compute:\n      hosts:\n        lab-%s-3:\n%s\n' \
	  $(SLURM_LAB) '          umprov_expected_gpus: 1' > .lab/$(SLURM_LAB)/sick.yml
	$(UMPROV) provision -i lab/$(SLURM_LAB) -i .lab/$(SLURM_LAB)/sick.yml --rolling \
	  --only toolkit --batch 2 --max-fail-percent 50; rc=$$?; \
	  echo "rolling exit code $$rc (10: host 3 failed its gate and stays drained)"
	docker exec umprov-lab-$(SLURM_LAB)-slurmctld sinfo -N -o '%N %T %E'
	@echo "demo-slurm done: 'make lab-down LAB=$(SLURM_LAB)' removes it"

# Two phases over the paths in $(1) ($(2): more of the marker expression, e.g. " and not slow"):
# the `serial` tests (signals, elapsed-time bounds) alone first, then all others side by side.
# The second phase's output ends the run, its last line pytest's summary; it also repeats the
# first phase's (tests/conftest.py). Exit code 5 (no test selected) counts as a pass in a phase;
# the recipe fails if either phase fails, and stops after the first when it was interrupted
# (Ctrl-C: 2) or could not run (3, 4).
define two_phases
	@set -o pipefail; log=$$(mktemp); trap "rm -f $$log" EXIT; \
	$(BIN)/pytest -m "serial$(2)" $$([ -t 1 ] && echo --color=yes) $(1) $(PYTEST_ARGS) | tee $$log; \
	s=$$?; case $$s in 2|3|4) exit $$s;; 5) s=0;; esac; \
	UMPROV_TEST_SERIAL_RESULT="$$(tail -n1 $$log | sed 's/\x1b\[[0-9;]*m//g')" \
	$(BIN)/pytest -m "not serial$(2)" $(SIDE_BY_SIDE) $(1) $(PYTEST_ARGS); \
	p=$$?; [ $$p -eq 5 ] && p=0; \
	[ $$s -eq 0 ] && [ $$p -eq 0 ]
endef

test: sysdeps venv
	$(BIN)/ruff check .
	$(call two_phases,tests)

test-unit: venv
	$(call two_phases,tests/unit, and not slow)

test-lab: sysdeps venv
	$(call two_phases,tests/lab)

test-gpu: venv
	$(BIN)/pytest -m gpu tests/gpu $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/yamllint .
	$(BIN)/ansible-lint

lab-up: sysdeps venv
	$(UMPROV) lab up --name $(LAB) --hosts $(HOSTS)

lab-down: venv
	$(UMPROV) lab down --name $(LAB)

bench: venv
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) $(BUILD_DIR) .pytest_cache .ruff_cache *.egg-info
