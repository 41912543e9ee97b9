# `make demo` and `make test` each set up .venv on a fresh machine, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# LiteRT's converter needs packages the parity oracle and MLflow cannot share an environment with
# (huggingface-hub>=1, typing-extensions<4.13), so the LiteRT tests run in an environment of their own.
LITERT_VENV ?= .venv-litert
LITERT_PY := $(LITERT_VENV)/bin/python
LITERT_STAMP := $(LITERT_VENV)/.installed

.PHONY: demo test test-slow clean

$(STAMP): pyproject.toml packages/inplace-doctor/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23"
	$(PY) -m pip install -q -e ./packages/inplace-doctor
	$(PY) -m pip install -q -e ".[test,parity,export,deploy]"
	touch $(STAMP)

$(LITERT_STAMP): pyproject.toml packages/inplace-doctor/pyproject.toml
	test -x $(LITERT_PY) || python3 -m venv $(LITERT_VENV)
	$(LITERT_PY) -m pip install -q --upgrade "pip>=23"
	$(LITERT_PY) -m pip install -q -e ./packages/inplace-doctor
	$(LITERT_PY) -m pip install -q -e ".[tflite,export]" "pytest>=8"
	touch $(LITERT_STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP) $(LITERT_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples packages
	$(PY) -m pytest -q -m "not slow and not litert"
	$(LITERT_PY) -m pytest -q -m "litert and not slow" tests/test_deploy.py

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) $(LITERT_VENV) build *.egg-info src/*.egg-info packages/inplace-doctor/src/*.egg-info .pytest_cache
