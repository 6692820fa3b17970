#!/usr/bin/env bash
# hwlat on an NVIDIA GPU, end to end, in under 8 minutes: GPU tests, a short profile (fp16 and
# fp32), evaluation of 11 CNNs and transformers at batch 1 and 16, a bench; one summary.
#
# Installs nothing from the network. Python packages the machine lacks (lightgbm) come from
# wheels in .whl/, fetched beforehand on a networked machine:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl lightgbm==4.7.0
# and are installed into /tmp/site. Run from the repository root:
#   bash scripts/gpu_check.sh [OUT_DIR]
# OUT_DIR gets gpu_check.json, gpu_profile.jsonl.gz (`hwlat db import` it), nvidia-smi.txt and
# pytest-gpu.txt; the database itself stays in /tmp. Exit code 0 when every step gave results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-/tmp/hwlat-gpu-check}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
started=$(date +%s)

# 1. packages: only what is missing, only from .whl/
missing=$($PY - <<'EOF'
import importlib.util
names = {"lightgbm": "lightgbm", "click": "click", "rich": "rich", "pynvml": "nvidia-ml-py",
         "numpy": "numpy", "sklearn": "scikit-learn", "torchvision": "torchvision",
         "transformers": "transformers"}
print(" ".join(pkg for mod, pkg in names.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "missing here: $missing; installing from .whl/" >&2
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "error: no wheels in .whl/ to install $missing from" >&2; exit 1
  fi
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || { echo "error: wheel install failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# lightgbm's wheel links libgomp without bundling it; borrow one (torch ships its own) if needed
if ! $PY -c "import lightgbm" 2>/dev/null; then
  gomp=$(find / -xdev -name 'libgomp*.so*' 2>/dev/null | head -1)
  if [ -n "$gomp" ]; then
    mkdir -p /tmp/site/lib && ln -sf "$gomp" /tmp/site/lib/libgomp.so.1
    export LD_LIBRARY_PATH=/tmp/site/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  $PY -c "import lightgbm" || { echo "error: lightgbm does not import" >&2; exit 1; }
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# 2. what we run on
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv \
  2>&1 | tee "$OUT_DIR/nvidia-smi.txt"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  torch.cuda.get_device_name(0), 'tf32 matmul', torch.backends.cuda.matmul.allow_tf32)" \
  || { echo "error: torch sees no GPU" >&2; exit 1; }

# 3. the GPU-marked tests (they skip without a GPU elsewhere)
timeout 60 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 \
  | tee "$OUT_DIR/pytest-gpu.txt" | tail -5
tests_rc=${PIPESTATUS[0]}

# 4. profile, evaluate, bench, summary (limits inside; 470 s in all)
left=$(( 470 - ($(date +%s) - started) ))
$PY scripts/gpu_check.py --db /tmp/hwlat-gpu-check.db --out "$OUT_DIR" --budget 4m --total "$left"
check_rc=$?
echo "gpu tests exit $tests_rc, check exit $check_rc, $(( $(date +%s) - started )) s in all"
[ "$tests_rc" -eq 0 ] && [ "$check_rc" -eq 0 ]
