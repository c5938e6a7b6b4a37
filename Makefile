# Two entry points: `make run` (install + tune the simulated deployment) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TRIALS ?= 200
STUDY  ?= dsv4-flash-sim

.PHONY: install run test lint typecheck report best clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/autotune run --trials $(TRIALS) --study $(STUDY)
	$(VENV)/bin/autotune best --study $(STUDY)
	$(VENV)/bin/autotune best --study $(STUDY) --export systemd --out deploy/$(STUDY)
	$(VENV)/bin/autotune report --study $(STUDY)

test: $(STAMP) lint
	bash scripts/test-deps.sh
	AUTOTUNE_REQUIRE_PG=1 AUTOTUNE_REQUIRE_ENGINES=1 $(PY) -m pytest -q -ra; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# ruff, mypy, and the import contracts of pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check autotune tests benchmarks
	$(VENV)/bin/mypy autotune
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
