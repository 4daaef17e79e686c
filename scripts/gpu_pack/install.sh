#!/usr/bin/env bash
# Install wheels over an existing Python without touching its site-packages: a fresh venv (VENV) whose
# site-packages comes first and whose `00-base-site.pth` then adds BASE_PYTHON's site-packages (its .pth
# files processed too), offline: --no-index --no-deps. `python3 -m venv --system-site-packages` would not do on
# the GPU machine: its python3 is itself a venv (/opt/torch/.venv), whose packages (torch, ...) are not the
# base interpreter's "system" ones. Used by scripts/gpu_run.sh and the CPU rehearsal (test/test_gpu_rehearsal.py).
#   bash scripts/gpu_pack/install.sh BASE_PYTHON VENV WHEEL_OR_DIR...
set -euo pipefail
base=$1 venv=$2
shift 2
wheels=()
for arg in "$@"; do
  if [ -d "$arg" ]; then wheels+=("$arg"/*.whl); else wheels+=("$arg"); fi
done
[ ${#wheels[@]} -gt 0 ] && [ -f "${wheels[0]}" ] || { echo "install.sh: no wheels in: $*" >&2; exit 1; }
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
base_site=$("$base" -c "$purelib")
rm -rf "$venv"
"$base" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c "$purelib")
echo "import site; site.addsitedir('$base_site')" > "$site/00-base-site.pth"
# pip comes from the base's site-packages; it installs into the venv (sys.prefix). --ignore-installed: nothing
# of the base is ever uninstalled, a carried wheel shadows the base's copy.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --ignore-installed \
  --no-compile "${wheels[@]}"
echo "installed ${#wheels[@]} wheels into $venv (over $base_site)"
