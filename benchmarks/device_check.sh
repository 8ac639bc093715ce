#!/usr/bin/env bash
# One prepared run of every GPU check (device tool: run this once; results come back as $OUT/results.tgz
# and $OUT/summary.txt, then copy them into benchmarks/results/). Steps, most valuable first; each has its
# own time limit and the archive is rewritten after each, so a run cut short still returns what it did:
#   1. the kernel's GPU correctness tests (tests/test_kernels.py compiles for the GPU when CUDA is there)
#   2. kvplan calibrate --quick on the local GPU (kernel, decode GEMMs bf16/fp16/fp8, launch floor)
#      -> profile.yaml, and its figures against the step model's lookups -> bench_calibration.md
#   3. the kernel against the read ceiling, the datasheet and SDPA -> bench_kernel.md
#   4. vLLM's PyTorch-sort sampler peak per logit (benchmarks/sampler_peak.py) -> sampler_peak.md
#   5. the GPU tests of the calibrate parts (tests/test_calibrate.py -k gpu)
#   6. the all-reduce under torchrun over every GPU, merged into profile.yaml (NCCL; with one GPU this
#      checks NCCL start-up and the merge only: an all-reduce needs 2 ranks)
#   7. the ahead-of-time compile check (sm_80/90/100) with this machine's Triton -> aot_check.txt
#   8. the launch-settings sweep (benchmarks/tune_kernel.py) -> tune.md, and the full calibrate sweep
#      -> profile_full.yaml (the longest steps; STEPS="..." runs a subset in the order given)
# The H200 image lacks pydantic (device KINDS.md): carry its wheels in .whl (device README, Notes) first.
set -uo pipefail
OUT=${OUT:-/tmp/out}
W=${W:-/tmp/device_check}
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# the package maps kernels/ to kvplan.kernels when installed; from a checkout, link it in place
[ -e kvplan/kernels ] || ln -s ../kernels kvplan/kernels
[ -e kvplan/model_specs ] || ln -s ../model_specs kvplan/model_specs
export KVPLAN_DATA_DIR="$W/data"
pack() {  # the archive and a summary of every step's last lines, after each step
  tar czf "$OUT/results.tgz" -C "$W" . 2>/dev/null
  for f in "$W"/*.txt; do echo "== $(basename "$f")"; tail -n 6 "$f"; done > "$OUT/summary.txt" 2>&1
}
step() {  # step NAME SECONDS COMMAND...: time-limited, output to $W/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "[$(date +%T)] $name"
  { time timeout "$limit" "$@"; } > "$W/$name.txt" 2>&1
  echo "rc=$?" >> "$W/$name.txt"
  pack
}
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='%H %s' 2>/dev/null; } > "$W/gpu.txt" 2>&1
pack
# STEPS picks and orders the steps (default: all); each is skipped unless named
STEPS=${STEPS:-"kernel_tests calibrate bench_calibration bench_kernel tune_kernel sampler_peak calibrate_tests allreduce aot_check calibrate_full"}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || NGPU=1
for s in $STEPS; do
  case $s in
    kernel_tests) step kernel_tests 180 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py ;;
    calibrate) step calibrate 150 python3 -m kvplan calibrate --quick --only kernel,gemm,launch --output "$W/profile.yaml" ;;
    bench_calibration) step bench_calibration 30 python3 benchmarks/bench_calibration.py "$W/profile.yaml" --out "$W/bench_calibration.md" ;;
    bench_kernel) step bench_kernel 120 python3 benchmarks/bench_kernel.py --out "$W/bench_kernel.md" ;;
    tune_kernel) step tune_kernel 330 python3 benchmarks/tune_kernel.py --out "$W/tune.md" ;;
    sampler_peak) step sampler_peak 60 python3 benchmarks/sampler_peak.py --out "$W/sampler_peak.md" ;;
    calibrate_tests) step calibrate_tests 100 python3 -m pytest -q -s -p no:cacheprovider tests/test_calibrate.py -k gpu ;;
    allreduce) step allreduce 60 python3 -m torch.distributed.run --standalone --nproc-per-node "${NGPU:-1}" \
      -m kvplan.calibrate.dist --device cuda --quick --output "$W/profile.yaml" ;;
    aot_check) (unset TRITON_INTERPRET; step aot_check 90 python3 -m kvplan.kernels.aot_check) ;;
    calibrate_full) step calibrate_full 300 python3 -m kvplan calibrate --only kernel,gemm,launch --output "$W/profile_full.yaml" ;;
    *) echo "device_check: unknown step $s" ;;
  esac
done
cat "$OUT/summary.txt"
