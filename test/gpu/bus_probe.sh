#!/bin/bash
# bus_probe.sh [ITERS]: builds test/gpu/bus_probe.cu and times a host
# store seen and echoed by a polling kernel (the bus under the device
# agent's round trip), without MPS and under MPS. Needs nvcc and a GPU.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
ITERS=${1:-2000}
OUT=${PROBE_OUT:-/tmp/bus_probe}
mkdir -p "$OUT"
if ! "$CUDA_HOME/bin/nvcc" -O2 -arch=native -o "$OUT/bus_probe" "$ROOT/test/gpu/bus_probe.cu" -lcuda >"$OUT/build.log" 2>&1; then
  cat "$OUT/build.log"
  echo "BUS FAIL: build"
  exit 1
fi
echo "BUS: without MPS"
timeout 120 "$OUT/bus_probe" "$ITERS"
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$OUT/mps-pipe CUDA_MPS_LOG_DIRECTORY=$OUT/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    echo "BUS: under MPS"
    timeout 120 "$OUT/bus_probe" "$ITERS"
    echo quit | nvidia-cuda-mps-control
    sleep 1
  fi
fi
