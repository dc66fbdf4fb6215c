#!/usr/bin/env bash
# JAX's Pallas TPU tutorials on palace.jax: PALACE_JAX_DOCS=<JAX checkout with docs/pallas> (nothing is
# fetched). Prints cells run / outputs matched per tutorial, then runs tests/jax_backend/test_tutorials.py.
#   PALACE_JAX_DOCS=~/src/jax bash scripts/jax_tutorials.sh [tutorial ...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PALACE_JAX_DOCS:-}" ]; then
  echo "scripts/jax_tutorials.sh: set PALACE_JAX_DOCS to a JAX checkout (the folder with docs/pallas)," \
       "e.g. git clone https://github.com/jax-ml/jax ~/src/jax" >&2
  exit 2
fi
py=${PALACE_JAX_PYTHON:-.venv-jax/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
"$py" -m palace._src.tools.tutorials --json palace-out/tutorials.json --scripts palace-out/tutorials "$@"
if [ $# -eq 0 ]; then
  "$py" -m pytest -q tests/jax_backend/test_tutorials.py
fi
