#!/usr/bin/env bash
# Everything that needs CUDA in one command (see benchmarks/gpu_check.py); one line where there is no GPU.
# PYTHON: the interpreter with yolotrain installed (default: the project's .venv, else python).
set -euo pipefail
cd "$(dirname "$0")/.."
default_python=python
[ -x .venv/bin/python ] && default_python=.venv/bin/python
exec "${PYTHON:-$default_python}" benchmarks/gpu_check.py "$@"
