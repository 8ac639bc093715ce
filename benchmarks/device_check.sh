#!/usr/bin/env bash
# One prepared run of every GPU check for issue 4 (device tool: run this once, copy $OUT back).
#   1. the kernel's GPU correctness tests (tests/test_kernels.py compiles for the GPU when CUDA is there)
#   2. kvplan calibrate --quick on the local GPU -> $OUT/profile.yaml
#   3. the kernel against the read ceiling, the datasheet and SDPA -> $OUT/bench_kernel.md
#   4. the ahead-of-time compile check (sm_80/90/100, this machine's Triton) -> $OUT/aot_check.txt
# The H200 image lacks pydantic (KINDS.md): carry its wheels in .whl (device README, Notes) first.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# the package maps kernels/ to kvplan.kernels when installed; from a checkout, link it in place
[ -e kvplan/kernels ] || ln -s ../kernels kvplan/kernels
[ -e kvplan/model_specs ] || ln -s ../model_specs kvplan/model_specs
export KVPLAN_DATA_DIR="$OUT/data"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
( time timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py ) > "$OUT/kernel_tests.txt" 2>&1
( time timeout 180 python3 -m kvplan calibrate --quick --output "$OUT/profile.yaml" ) > "$OUT/calibrate.txt" 2>&1
( time timeout 150 python3 benchmarks/bench_kernel.py --out "$OUT/bench_kernel.md" ) > "$OUT/bench.txt" 2>&1
OUT="$OUT" bash benchmarks/aot_check.sh > /dev/null
tail -n 3 "$OUT"/*.txt
