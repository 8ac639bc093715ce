#!/usr/bin/env bash
# Ahead-of-time compile check of every paged-decode kernel variant for sm_80, sm_90 and sm_100, with
# whatever Triton is installed (3.9 here and in CI; 3.6 on the H200 machine, from device_check.sh).
# Needs no GPU. Writes the table to $OUT/aot_check.txt; exits 1 on a spill, shared memory over a
# target's limit or a compile error (fp8 e4m3 on sm_80 is reported as unsupported, not a failure).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$PWD}
# from a checkout without the package installed, link kernels/ in as kvplan.kernels (as device_check.sh does)
python3 -c "import kvplan.kernels" 2>/dev/null || { [ -e kvplan/kernels ] || ln -s ../kernels kvplan/kernels; }
unset TRITON_INTERPRET
( time timeout 300 python3 -m kvplan.kernels.aot_check "$@" ) > "$OUT/aot_check.txt" 2>&1
rc=$?
cat "$OUT/aot_check.txt"
exit $rc
