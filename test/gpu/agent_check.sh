#!/usr/bin/env bash
# The device agent on and off in one run on one GPU (CUDA), for the decision
# of its default: NCCL built from source, cuda_check, host_rma and the GIN
# alltoalls with and without the agent (nccl_gin_check.sh, GIN_REFS=agent),
# staging_bench's kernel-watched series with cuMem buffers (BENCH_VMM=1)
# under MPS with the agent off and on, and cuda_check with the agent under
# compute-sanitizer (memcheck, racecheck). Needs what `make` built in build/
# and an NCCL source archive (build/nccl-src.tar.gz by default).
#
#   test/gpu/agent_check.sh [outdir] [nccl-src.tar.gz]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
O=${1:-/tmp/agent-check}
SRC=${2:-$ROOT/build/nccl-src.tar.gz}
LIB=$ROOT/build/librccl-rma-wasm.so
mkdir -p "$O"
export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
NCCL_ONLY_FUNCS=${NCCL_ONLY_FUNCS-SendRecv} CHECKS=${CHECKS-cuda_check host_rma gin} GIN_REFS=${GIN_REFS-agent} \
  PER_RUN_TIMEOUT=${PER_RUN_TIMEOUT:-60} timeout ${GIN_CHECK_S:-400} "$ROOT/test/gpu/nccl_gin_check.sh" "$SRC" 0 "$O/gin"
echo "AGENT-CHECK: nccl_gin_check done at $(($(date +%s) - t0)) s"

# staging_bench: the kernel-watched signal word and small put+signals, cuMem
# buffers (the plugin copies them in its own context, where the agent runs).
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "AGENT-CHECK: MPS on"
fi
for pb in ${SB_BYTES-0 8 64 4096}; do
  for ag in 0 1; do
    for path in intra tcp; do
      ip=1; [ $path = tcp ] && ip=0
      log=$O/sb-$pb-$ag-$path.log
      NCCL_RMA_WASM_INTRANODE=$ip NCCL_RMA_WASM_DEVICE_AGENT=$ag BENCH_VMM=1 BENCH_KERNEL_WAIT=1 BENCH_SIG_NEVER_RESET=1 BENCH_PING_BYTES=$pb \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET timeout 90 "$ROOT/build/staging_bench" "$LIB" $((1 << 20)) 2 ${PINGS:-1000} >"$log" 2>&1
      echo "AGENT-CHECK sb bytes=$pb agent=$ag path=$path rc=$?"
      grep -E '^SIGNAL|FAIL|no kernel waiter' "$log" | sed "s/^/AGENT-CHECK sb bytes=$pb agent=$ag /"
      grep -h "device agent:" "$log" | sed 's/.*NET.wasm: /AGENT-CHECK sb agent-info: /' | sort -u | head -3
    done
  done
done
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1
echo "AGENT-CHECK: staging_bench done at $(($(date +%s) - t0)) s"

# compute-sanitizer on cuda_check with the agent forced on (MPS off).
if command -v compute-sanitizer >/dev/null; then
  for tool in ${SANITIZERS-memcheck racecheck}; do
    NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET timeout ${SANITIZER_S:-120} compute-sanitizer --tool $tool --target-processes all \
      "$ROOT/build/cuda_check" "$LIB" $((1 << 20)) 2 >"$O/sanitizer-$tool.log" 2>&1
    echo "AGENT-CHECK sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/sanitizer-$tool.log" | sort | uniq -c | tr '\n' ' ')"
    grep -E "RESULT|device agent:" "$O/sanitizer-$tool.log" | sort -u | head -4
  done
fi
echo "AGENT-CHECK: all done at $(($(date +%s) - t0)) s"
