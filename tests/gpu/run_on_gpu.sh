#!/usr/bin/env bash
# Everything a GPU machine checks, in one run: the CUDA calls one by one, tests/gpu, the GPU bench.
# Reports land in $OUT (smoke.txt, tests.txt, bench.txt, bench.json). Wheels the machine lacks
# (msgspec) travel in .whl/ (docs/gpu.md).
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 --version; } > "$OUT/smoke.txt" 2>&1
timeout 60 python3 tests/gpu/smoke_cuda.py >> "$OUT/smoke.txt" 2>&1
cat "$OUT/smoke.txt"
timeout "${GPU_TEST_TIMEOUT:-200}" python3 -m pytest tests/gpu -v -s -p no:cacheprovider --timeout 120 -o addopts="" \
    2>&1 | tee "$OUT/tests.txt" | grep -E "PASS|FAIL|ERROR|SKIP|Error|error|passed|failed|layer set" | head -80
timeout "${GPU_BENCH_TIMEOUT:-150}" python3 -m bench.gpu.bench_gpu_transfer --reps 10 --staging 32 64 --json "$OUT/bench.json" \
    2>&1 | tee "$OUT/bench.txt" | tail -45
