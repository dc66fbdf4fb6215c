#!/usr/bin/env bash
# Create .venv (if missing), install palace with its test extras, run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test,cli]"
exec .venv/bin/python -m pytest -n 2 -q "$@"
