#!/usr/bin/env bash
# Create .venv (if missing), install palace, run the guided demo of the whole system.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[cli]"
exec .venv/bin/palace demo "$@"
