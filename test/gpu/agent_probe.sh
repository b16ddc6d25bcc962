#!/bin/bash
# agent_probe.sh [ITERS] [PTX...]: builds test/gpu/agent_probe.cu and times
# the device agent's round trip (no op, 64 B copies both ways, an add)
# beside the driver's copy and stream write, without MPS, under MPS, and
# under MPS with two probes at once (as two ranks' agents). PTX files
# default to the shipped kernel (host/devmem/cuda/agent.ptx); more are
# variants to compare in the same run. Needs nvcc and a GPU.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
ITERS=${1:-2000}
shift || true
PTX=("$@")
[ ${#PTX[@]} -gt 0 ] || PTX=("$ROOT/host/devmem/cuda/agent.ptx")
OUT=${PROBE_OUT:-/tmp/agent_probe}
mkdir -p "$OUT"
if ! "$CUDA_HOME/bin/nvcc" -O2 -o "$OUT/agent_probe" "$ROOT/test/gpu/agent_probe.cu" -lcuda >"$OUT/build.log" 2>&1; then
  cat "$OUT/build.log"
  echo "PROBE FAIL: build"
  exit 1
fi
echo "PROBE: without MPS"
timeout 120 "$OUT/agent_probe" "$ITERS" "${PTX[@]}"
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$OUT/mps-pipe CUDA_MPS_LOG_DIRECTORY=$OUT/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    echo "PROBE: under MPS"
    timeout 120 "$OUT/agent_probe" "$ITERS" "${PTX[@]}"
    echo "PROBE: under MPS, two probes at once"
    timeout 120 "$OUT/agent_probe" "$ITERS" "${PTX[@]}" | sed 's/^PROBE /PROBE [1 of 2] /' &
    timeout 120 "$OUT/agent_probe" "$ITERS" "${PTX[@]}" | sed 's/^PROBE /PROBE [2 of 2] /'
    wait
    echo quit | nvidia-cuda-mps-control
    sleep 1
  fi
fi
