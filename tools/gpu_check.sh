#!/usr/bin/env bash
# The one-GPU check as one call of a GPU machine that reaches no package index (docs/gpu.md, "The one-GPU check").
# Here, once:   python -m tools.gpu_check --fetch-wheels          (requirements/gpu-check-wheels.txt -> .whl/)
# There:        bash tools/gpu_check.sh                            (carry .whl and .cache/tiny-base-seed0)
# It installs the carried wheels beside the machine's own packages (they win on the path), then runs every part
# of python -m tools.gpu_check within its budget, writing what comes back to $OUT (or ./gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_check_out}"
mkdir -p "$out"
py=$(command -v python3 || command -v python)
# the wheels are the GPU machine's Python's (3.12); a rehearsal on another Python runs on its own packages
if ls .whl/*.whl >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
    .whl/*.whl || { echo "gpu_check.sh: the carried wheels did not install" | tee "$out/gpu_check.log"; exit 1; }
  export PYTHONPATH="/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  "$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$out/gpu_check.log" 2>&1
"$py" -m tools.gpu_check --out "$out" "$@" >>"$out/gpu_check.log" 2>&1
rc=$?
tail -n 12 "$out/gpu_check.log"
exit $rc
