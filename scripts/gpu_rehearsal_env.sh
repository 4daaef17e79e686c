#!/usr/bin/env bash
# A Python 3.12 venv that stands in for the GPU machine's image (scripts/gpu_pack/image.txt: torch 2.11.0,
# transformers 5.17.0, ... at the versions seen there), for the CPU rehearsal of the carried wheel set
# (test/test_gpu_rehearsal.py). torch 2.11.0's PyPI wheel is a CUDA build: its nvidia-* dependencies come
# along (about 3-4 GB) and it runs on CPU. Idempotent: a second run with unchanged inputs returns at once.
#   bash scripts/gpu_rehearsal_env.sh [VENV]      (default .cache/gpu-rehearsal/venv; PYTHON312 picks python3.12)
# Exit status 3: no Python 3.12 on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.cache/gpu-rehearsal/venv}
stamp="$venv/.image-installed"
want=$(cat scripts/gpu_pack/image.txt scripts/gpu_rehearsal_env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python312=""
for candidate in ${PYTHON312:-} python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    python312=$candidate; break
  fi
done
[ -n "$python312" ] || { echo "need Python 3.12 (set PYTHON312)" >&2; exit 3; }  # 3: the rehearsal test skips
start=$(date +%s)
rm -rf "$venv"
"$python312" -m venv "$venv"
# PIP_CONSTRAINT= : this machine's pip config caps torch through a constraint file; the image's pins rule here.
PIP_CONSTRAINT= "$venv/bin/pip" install -q --disable-pip-version-check -r scripts/gpu_pack/image.txt \
  2> >(grep -v "is ignored: it is neither" >&2)  # this machine's local index mirrors
# What the image does not have (KINDS.md's list) goes again, so that the carried wheels stand alone: pydantic
# comes with typer here. tzdata stays (python-dateutil's; the list leaves out such small data packages).
extra=$("$venv/bin/python" - <<'PY'
import importlib.metadata as m, re
image = {l.strip() for l in open("scripts/gpu_pack/image-all.txt") if l.strip() and not l.startswith("#")}
names = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in m.distributions()}
print(" ".join(sorted(names - image - {"tzdata", "pip", "nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13"})))
PY
)
if [ -n "$extra" ]; then
  echo "not on the GPU machine's image, uninstalled: $extra"
  "$venv/bin/pip" uninstall -q -y $extra
fi
echo "$want" > "$stamp"
echo "rehearsal image ready: $venv ($(( $(date +%s) - start )) s)"
