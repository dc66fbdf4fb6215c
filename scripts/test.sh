#!/usr/bin/env bash
# Create .venv (if missing), install palace with its test extras, run the test suite.
# Then, on a full run (no arguments), the JAX parity suite: if Python >= 3.12 is available, .venv-jax
# gets jax 0.12 + palace and runs tests/jax_parity against JAX's TPU interpret mode, then tests/jax_backend
# (real JAX with palace as its Pallas engine)
# (PALACE_JAX_TESTS=0 skips it, =1 forces it with arguments; JAX_PYTHON picks the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test,cli]"
want_jax=${PALACE_JAX_TESTS:-$([ $# -eq 0 ] && echo 1 || echo 0)}
[ "$want_jax" = 1 ] || exec .venv/bin/python -m pytest -n 2 -q "$@"

.venv/bin/python -m pytest -n 2 -q "$@"

# ---- JAX parity suite (jax 0.12 needs Python >= 3.12; palace's own venv stays JAX-free)
JAX_VERSION=0.12.0.1
jax_py=""
pyenv_pys=$(ls -d "$(pyenv root 2>/dev/null || echo /none)"/versions/3.1[23]*/bin/python3 2>/dev/null || true)
for c in ${JAX_PYTHON:-} python3.13 python3.12 $pyenv_pys; do
  if command -v "$c" >/dev/null 2>&1 \
      && "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
    jax_py=$c; break
  fi
done
if [ -z "$jax_py" ]; then
  echo "JAX parity suite skipped: no Python >= 3.12 found (jax $JAX_VERSION needs it)."
  exit 0
fi
[ -x .venv-jax/bin/python ] || "$jax_py" -m venv .venv-jax
jax_ok="import jax, palace, pytest, xdist, threadpoolctl, click, rich, absl; assert jax.__version__ == '$JAX_VERSION'"
if ! .venv-jax/bin/python -c "$jax_ok" 2>/dev/null; then
  .venv-jax/bin/python -m pip install -q --upgrade pip >/dev/null
  # absl-py: JAX's own test utilities (tests/jax_backend/test_device_view.py runs a TPU-style suite)
  .venv-jax/bin/python -m pip install -q "jax==$JAX_VERSION" pytest pytest-xdist absl-py
  .venv-jax/bin/python -m pip install -q -e ".[perf,cli]"   # threadpoolctl: see docs/jax.md (BLAS threads); cli: `palace run --jax`
fi
# the JAX the recorded TPU timings ran with: benchmarks/hw models its kernel files (fetched once into .cache/)
.venv-jax/bin/python -m benchmarks.hw.chip_wheel >/dev/null
echo "JAX parity suite (tests/jax_parity, jax $JAX_VERSION, $(.venv-jax/bin/python --version)):"
.venv-jax/bin/python -m pytest -n 2 -q tests/jax_parity
echo "palace as JAX's Pallas engine (tests/jax_backend, palace.jax):"
exec .venv-jax/bin/python -m pytest -n 2 -q tests/jax_backend
