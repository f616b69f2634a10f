#!/usr/bin/env bash
# Issue 40's check on a GPU machine without dask or network (the lent device): the GPU
# tests, then bench/gpu.py. Needs the wheels of dask, distributed, partd, locket, zict,
# tblib, tornado, cryptography, cffi and pycparser in .whl/ (docs/gpu.md says how).
# Writes tests.log, conv.log, gpu-conv.json, bench.log and gpu-bench.json to $OUT
# (default /tmp/dfdl-gpu).
set -u
OUT=${OUT:-/tmp/dfdl-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba-cache
nvidia-smi -L
timeout "${TEST_S:-200}" python3 -m pytest -p no:cacheprovider -n 8 --dist load -q -rfE \
    tests/gpu tests/ops/gpu tests/runtime/test_gpu_cluster.py >"$OUT/tests.log" 2>&1
echo "tests: exit $?"
tail -n 25 "$OUT/tests.log"
timeout "${CONV_S:-60}" python3 bench/gpu_conv.py --json "$OUT/gpu-conv.json" \
    >"$OUT/conv.log" 2>&1
echo "conv: exit $?"
tail -n 30 "$OUT/conv.log"
# shellcheck disable=SC2086
timeout "${BENCH_S:-270}" python3 bench/run.py --device gpu ${BENCH_ARGS:-} \
    --json "$OUT/gpu-bench.json" >"$OUT/bench.log" 2>&1
echo "bench: exit $?"
tail -n 20 "$OUT/bench.log"
