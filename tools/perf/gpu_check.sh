#!/usr/bin/env bash
# The one-GPU check as one call of a GPU machine that reaches no package index (docs/gpu.md, "The one-GPU check").
# Here, once:   python -m tools.perf.gpu_check --fetch-wheels          (requirements/gpu-check-wheels.txt -> .whl/)
# There:        bash tools/perf/gpu_check.sh                            (carry .whl and .cache/tiny-base-seed0)
# It installs the carried wheels beside the machine's own packages (they win on the path), then runs every part
# of python -m tools.perf.gpu_check within its budget, writing what comes back to $OUT (or ./gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu_check_out}"
# each refusal one line, before anything is installed or run (and in the log where there is a folder for it)
if [ -e "$out" ] && [ ! -d "$out" ]; then
  echo "gpu_check.sh: OUT=$out is a file, not a folder: set OUT to a folder (it is made where missing)" >&2; exit 2
fi
mkdir -p "$out"
refuse() { echo "gpu_check.sh: $1" | tee "$out/gpu_check.log" >&2; exit 1; }
py=$(command -v python3 || command -v python) || refuse "no python3 (or python) on PATH: install Python 3.12 with torch"
"$py" -c 'import torch' >/dev/null 2>&1 ||
  refuse "$py has no torch: install it ($py -m pip install torch), or put a python3 that has it first on PATH"
# a wheel kept from an older fetch beside the pinned one: pip would refuse both, or install the wrong one
if ls .whl/*.whl >/dev/null 2>&1; then
  stale=$("$py" -m tools.perf.gpu_check --check-wheels 2>&1) || refuse "${stale#gpu_check: }"
fi
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
"$py" -m tools.perf.gpu_check --out "$out" "$@" >>"$out/gpu_check.log" 2>&1
rc=$?
tail -n 12 "$out/gpu_check.log"
exit $rc
