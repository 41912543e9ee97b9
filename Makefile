# `make demo` and `make test` each set up .venv on a fresh machine, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# LiteRT's converter needs packages the parity oracle and MLflow cannot share an environment with
# (huggingface-hub>=1, typing-extensions<4.13), so the LiteRT tests run in an environment of their own.
LITERT_VENV ?= .venv-litert
LITERT_PY := $(LITERT_VENV)/bin/python
LITERT_STAMP := $(LITERT_VENV)/.installed
# TF.js: its converter (tensorflowjs 4.22 pins TensorFlow 2.19, numpy<2.2, protobuf<6) in an environment of its own,
# run by `yolotrain export --format tfjs` as a program; the runtime's TF.js packages for Node, from the lock file.
TFJS_VENV ?= .venv-tfjs
TFJS_STAMP := $(TFJS_VENV)/.installed
TFJS_NODE ?= .node-tfjs
TFJS_NODE_STAMP := $(TFJS_NODE)/.installed

.PHONY: demo test test-slow gpu-check docs clean

MAIN_PACKAGES := -e ".[test,parity,export,deploy,track,docs]"
LITERT_PACKAGES := -e ".[tflite,export]" "pytest>=8"

# $(call make_venv,FOLDER,PACKAGES): a virtual environment with the doctor's distribution, then PACKAGES.
define make_venv
	test -x $(1)/bin/python || python3 -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade "pip>=23"
	$(1)/bin/python -m pip install -q -e ./packages/inplace-doctor
	$(1)/bin/python -m pip install -q $(2)
	touch $(1)/.installed
endef

$(STAMP): pyproject.toml packages/inplace-doctor/pyproject.toml
	$(call make_venv,$(VENV),$(MAIN_PACKAGES))

$(LITERT_STAMP): pyproject.toml packages/inplace-doctor/pyproject.toml
	$(call make_venv,$(LITERT_VENV),$(LITERT_PACKAGES))

# ydf 0.12: the newest built against protobuf 5 (tensorflowjs imports TensorFlow Decision Forests, which imports ydf).
$(TFJS_STAMP):
	test -x $(TFJS_VENV)/bin/python || python3 -m venv $(TFJS_VENV)
	$(TFJS_VENV)/bin/python -m pip install -q tensorflowjs==4.22.0 ydf==0.12.0
	touch $@

# Without npm the TF.js runtime tests skip (saying why) rather than the whole suite stopping here.
$(TFJS_NODE_STAMP): tools/tfjs-node/package.json tools/tfjs-node/package-lock.json
	@if ! command -v npm >/dev/null; then echo "no npm: the TF.js runtime tests will be skipped" >&2; exit 0; fi; \
	mkdir -p $(TFJS_NODE) && cp tools/tfjs-node/package.json tools/tfjs-node/package-lock.json $(TFJS_NODE)/ && \
	(cd $(TFJS_NODE) && npm ci --no-audit --no-fund --ignore-scripts) && touch $@

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP) $(LITERT_STAMP) $(TFJS_STAMP) $(TFJS_NODE_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples packages
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -m "not slow and not litert and not paddle"
	$(PY) -m pytest -q -m "paddle and not slow" tests/test_paddle_export.py tests/test_anchor_free_export.py
	$(LITERT_PY) -m pytest -q -m "litert and not slow" tests/test_deploy.py tests/test_anchor_free_export.py

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The documentation site, into site/ (make test builds it strictly into a temporary folder instead).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict --site-dir site

# Everything that needs CUDA (CUDA-only tests, DDP with nccl, the step at batch 64, 640 px): one line without a GPU.
gpu-check: $(STAMP)
	PYTHON=$(PY) bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) $(LITERT_VENV) $(TFJS_VENV) $(TFJS_NODE) build site *.egg-info src/*.egg-info packages/inplace-doctor/src/*.egg-info .pytest_cache
