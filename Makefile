# `make demo` and `make test` each set up .venv on a fresh machine, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow clean

$(STAMP): pyproject.toml packages/inplace-doctor/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23"
	$(PY) -m pip install -q -e ./packages/inplace-doctor
	$(PY) -m pip install -q -e ".[test,parity,export,deploy]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples packages
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info packages/inplace-doctor/src/*.egg-info .pytest_cache
