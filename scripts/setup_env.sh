#!/usr/bin/env bash
# Create .venv with SGLang 0.5.23 (light CPU route) and sglang-evs, from nothing.
# Idempotent: a second run with unchanged pins returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${SGLANG_EVS_VENV:-.venv}
STAMP="$VENV/.sglang-evs-installed"
want=$(cat scripts/requirements-cpu.txt scripts/requirements-torchcodec.txt scripts/requirements-lmms-eval.txt \
  scripts/constraints-cpu.txt pyproject.toml setup.py \
  scripts/cpu_route/setup.py | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

echo "setting up $VENV (SGLang 0.5.23, CPU route) ..."
echo "note: SGLang's GPU-only dependencies (CUDA kernels, flashinfer, ...) are left out on purpose;" \
     "pip's resolver complaints about exactly those are hidden, anything else pip says is shown"
python3 -m venv "$VENV"
known_noise=(
  -e "is ignored: it is neither"                          # this machine's local index mirrors
  -e "^ERROR: pip's dependency resolver does not currently take into account"
  -e "^sglang 0\.5\.23 requires .*(which is not installed|but you have torch 2\.13\.0\+cpu)"
)
pip_install() {
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2> >(grep -v -E "${known_noise[@]}" >&2)
}
apt_get() { if [ "$(id -u)" -eq 0 ]; then apt-get "$@"; else sudo apt-get "$@"; fi; }
echo "[1/7] libibverbs.so.1 (Mooncake's transfer engine loads it even over TCP: prefill/decode disaggregation)"
ldconfig_cmd=$(command -v ldconfig || echo /sbin/ldconfig)
if "$ldconfig_cmd" -p 2>/dev/null | grep 'libibverbs\.so\.1 ' >/dev/null; then
  echo "      found"
else
  echo "      missing: installing Debian's libibverbs1 with apt-get"
  if ! { apt_get install -y -q libibverbs1 || { apt_get update -q && apt_get install -y -q libibverbs1; }; } >/dev/null; then
    echo "      WARNING: could not install libibverbs1; everything but prefill/decode disaggregation works" \
         "('import mooncake.engine' fails): install it (apt-get install libibverbs1) and rerun" >&2
  fi
fi
echo "[2/7] torch 2.13 (CPU build)"
pip_install -c scripts/constraints-cpu.txt "torch==2.13.0+cpu"
echo "[3/7] sglang 0.5.23 (without its GPU-only dependencies)"
pip_install --no-deps "sglang==0.5.23"
echo "[4/7] what SGLang needs at import on the CPU route (scripts/requirements-cpu.txt)"
pip_install -c scripts/constraints-cpu.txt -r scripts/requirements-cpu.txt
echo "[5/7] sglang-evs (editable)"
pip_install --no-deps --no-build-isolation -e .
echo "[6/7] sglang-evs-cpu-route: starts the CPU runtime in every Python process (a GPU install has none of it)"
pip_install --no-deps --no-build-isolation ./scripts/cpu_route
echo "[7/7] torchcodec, SGLang's x86 video decoder, apart in $VENV/torchcodec, and FFmpeg's libraries (Debian's)"
ffmpeg_libs=(libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavdevice59 libavfilter8)
if ! "$ldconfig_cmd" -p 2>/dev/null | grep 'libavcodec\.so\.59 ' >/dev/null; then
  if ! { apt_get install -y -q --no-install-recommends "${ffmpeg_libs[@]}" \
         || { apt_get update -q && apt_get install -y -q --no-install-recommends "${ffmpeg_libs[@]}"; }; } >/dev/null; then
    echo "      WARNING: could not install FFmpeg's libraries; the decoders' comparison skips, naming why" >&2
  fi
fi
pip_install --no-deps --upgrade --target "$VENV/torchcodec" -r scripts/requirements-torchcodec.txt
echo "      lmms-eval, for the accuracy recipe's test, apart in $VENV/lmms_eval_pkgs"
pip_install --no-deps --upgrade --target "$VENV/lmms_eval_pkgs" -r scripts/requirements-lmms-eval.txt
echo "$want" > "$STAMP"
echo "environment ready: $VENV"
