#!/usr/bin/env bash
# One prepared run of every GPU check for issue 4 (device tool: run this once, copy $OUT back).
#   1. the kernel's GPU correctness tests (tests/test_kernels.py compiles for the GPU when CUDA is there)
#   2. kvplan calibrate --quick on the local GPU (kernel, decode GEMMs bf16/fp16/fp8, launch floor)
#      -> $OUT/profile.yaml, then the GPU tests of those parts (tests/test_calibrate.py -k gpu)
#   3. the all-reduce under torchrun over every GPU, merged into $OUT/profile.yaml (NCCL; with one
#      GPU this checks NCCL start-up and the merge only: an all-reduce needs 2 ranks)
#   4. the profile's GEMM/all-reduce/launch figures and the step model's lookups -> $OUT/bench_calibration.md
#   5. the kernel against the read ceiling, the datasheet and SDPA -> $OUT/bench_kernel.md
#   6. the ahead-of-time compile check (sm_80/90/100, this machine's Triton) -> $OUT/aot_check.txt
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
( time timeout 180 python3 -m kvplan calibrate --quick --only kernel,gemm,launch --output "$OUT/profile.yaml" ) > "$OUT/calibrate.txt" 2>&1
( time timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/test_calibrate.py -k gpu ) > "$OUT/calibrate_tests.txt" 2>&1
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || NGPU=1
( time timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node "${NGPU:-1}" \
    -m kvplan.calibrate_dist --device cuda --quick --output "$OUT/profile.yaml" ) > "$OUT/allreduce.txt" 2>&1
python3 benchmarks/bench_calibration.py "$OUT/profile.yaml" --out "$OUT/bench_calibration.md" > "$OUT/bench_calibration.txt" 2>&1
( time timeout 150 python3 benchmarks/bench_kernel.py --out "$OUT/bench_kernel.md" ) > "$OUT/bench.txt" 2>&1
OUT="$OUT" bash benchmarks/aot_check.sh > /dev/null
tail -n 3 "$OUT"/*.txt
