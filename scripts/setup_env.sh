#!/usr/bin/env bash
# Create .venv with SGLang 0.5.23 (light CPU route) and sglang-evs, from nothing.
# Idempotent: a second run with unchanged pins returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${SGLANG_EVS_VENV:-.venv}
STAMP="$VENV/.sglang-evs-installed"
want=$(cat scripts/requirements-cpu.txt scripts/constraints-cpu.txt setup.py | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

echo "setting up $VENV (SGLang 0.5.23, CPU) ..."
python3 -m venv "$VENV"
pip_install() {
  # pip's notes about this machine's local index mirrors are noise
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}
pip_install -c scripts/constraints-cpu.txt "torch==2.13.0+cpu"
pip_install --no-deps "sglang==0.5.23"
pip_install -c scripts/constraints-cpu.txt -r scripts/requirements-cpu.txt
pip_install --no-deps --no-build-isolation -e .
echo "$want" > "$STAMP"
echo "environment ready: $VENV"
