#!/usr/bin/env bash
# The device agent on and off in one run on one GPU (CUDA), for the decision
# of its default: NCCL built from source, cuda_check, host_rma and the GIN
# alltoalls with and without the agent (nccl_gin_check.sh, GIN_REFS=agent),
# staging_bench's kernel-watched series with cuMem buffers (BENCH_VMM=1)
# under MPS with the agent off and on, and cuda_check with the agent under
# compute-sanitizer (memcheck, racecheck); first, the agent's round trip by
# itself (agent_probe.sh). Needs what `make` built in build/
# and an NCCL source archive (build/nccl-src.tar.gz by default).
#
#   test/gpu/agent_check.sh [outdir] [nccl-src.tar.gz]   (GIN_CHECK=0: no NCCL part)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
O=${1:-/tmp/agent-check}
SRC=${2:-$ROOT/build/nccl-src.tar.gz}
LIB=$ROOT/build/librccl-rma-wasm.so
mkdir -p "$O"
export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
# The agent's round trip by itself beside the driver's (a few seconds),
# before any MPS daemon of the checks below runs: the probe starts its own.
# PROBE_PTX: more kernels (PTX files) to time beside the shipped one.
# shellcheck disable=SC2086
PROBE_OUT=$O/probe timeout 150 "$ROOT/test/gpu/agent_probe.sh" 2000 "$ROOT/host/devmem/cuda/agent.ptx" ${PROBE_PTX:-} >"$O/probe.log" 2>&1
grep -E "^PROBE" "$O/probe.log" | grep -v "of 2\]" | sed 's/^/AGENT-CHECK /'
# GIN_CHECK=0 skips the real-NCCL part (no NCCL build): the probe,
# staging_bench and cuda_check alone, for a short look. The ping-pongs are
# traced hop by hop (PP_TRACE, build/hoptrace; PP_TRACE=0 leaves it out).
if [ "${GIN_CHECK:-1}" != 0 ]; then
  PP_TRACE=${PP_TRACE-1} NCCL_ONLY_FUNCS=${NCCL_ONLY_FUNCS-SendRecv} CHECKS=${CHECKS-cuda_check host_rma gin pingpong} GIN_REFS=${GIN_REFS-agent many gatherwriter fused marks} \
    PER_RUN_TIMEOUT=${PER_RUN_TIMEOUT:-60} timeout ${GIN_CHECK_S:-400} "$ROOT/test/gpu/nccl_gin_check.sh" "$SRC" 0 "$O/gin"
  echo "AGENT-CHECK: nccl_gin_check done at $(($(date +%s) - t0)) s"
fi

# cc_loop: cuda_check again and again, over TCP and the intra-node path:
# every byte of each run, the count of passes and failures.
cc_loop() { # name n env...
  local name=$1 n=$2 p=0 f=0; shift 2
  for i in $(seq 1 "$n"); do
    if env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET timeout 40 "$ROOT/build/cuda_check" "$LIB" $((1 << 20)) 4 >"$O/cc-$name.log" 2>&1; then
      p=$((p + 1))
    else
      f=$((f + 1)); cp "$O/cc-$name.log" "$O/cc-$name-fail-$i.log"; grep -h "RESULT FAIL\|FAIL" "$O/cc-$name.log" | head -1
    fi
  done
  echo "AGENT-CHECK cuda_check repeated $name: pass $p fail $f"
}
# staging_bench: the kernel-watched signal word and small put+signals, cuMem
# buffers (the plugin copies them in its own context, where the agent runs).
# A run that hangs (rc 124) poisons MPS for the next: MPS is restarted, and
# the agent's remaining runs are skipped.
mps_start() {
  command -v nvidia-cuda-mps-control >/dev/null || return 1
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
}
mps_stop() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
mps_start && echo "AGENT-CHECK: MPS on"
# sb_run log timeout env...: one staging_bench run; on a hang, every rank's
# native stacks (hang_dump.sh) go to the log before the kill, and MPS is
# restarted. Returns the run's status (124: hung).
sb_run() {
  local log=$1 lim=$2; shift 2
  env "$@" NCCL_RMA_WASM_STALL_REPORT_MS=5000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET \
    "$ROOT/build/staging_bench" "$LIB" $((1 << 20)) 2 ${PINGS:-1000} >"$log" 2>&1 &
  local pid=$! i=0
  while kill -0 $pid 2>/dev/null && [ $i -lt $lim ]; do sleep 1; i=$((i + 1)); done
  if kill -0 $pid 2>/dev/null; then
    echo "=== hung after $lim s: native stacks" >>"$log"
    "$ROOT/test/gpu/hang_dump.sh" "$ROOT/build/staging_bench" "$log"
    pkill -9 -f "$ROOT/build/staging_bench" 2>/dev/null
    wait $pid 2>/dev/null
    mps_stop; mps_start >/dev/null
    return 124
  fi
  wait $pid
}
sb_show() { # log label
  grep -E '^SIGNAL .*word|^SELF|FAIL|no kernel waiter' "$1" | sed "s/^/AGENT-CHECK sb $2 /"
  grep -h "device agent:" "$1" | sed 's/.*NET.wasm: /AGENT-CHECK sb agent-info: /' | sort -u | head -3
  grep -hE "gathered device copies|landed or queued \(device memory\)|device signal applied" "$1" | sort -u | head -6 | sed "s/^ */AGENT-CHECK sb $2 profile: /"
}
hung=""
for pb in ${SB_BYTES-0 64 4096}; do
  for ag in 0 1; do
    # One run times both paths (TCP, then intra-node: staging_bench sets
    # NCCL_RMA_WASM_INTRANODE itself).
    log=$O/sb-$pb-$ag.log
    if [ "$ag" = 1 ] && [ -n "$hung" ]; then
      echo "AGENT-CHECK sb bytes=$pb agent=$ag skipped (hung before)"
      continue
    fi
    # With a payload, the plugin's profile too: its gather wait is one
    # device-to-host copy's round trip (the agent's, or a copy engine's).
    prof=0; [ "$pb" != 0 ] && prof=1
    # Agent marks and fused landings apart (their own runs below): the
    # agent's series without them.
    sb_run "$log" ${SB_TIMEOUT:-60} NCCL_RMA_WASM_DEVICE_AGENT=$ag NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=0 NCCL_RMA_WASM_FUSED_LANDING=0 BENCH_VMM=1 BENCH_KERNEL_WAIT=1 BENCH_SIG_NEVER_RESET=1 BENCH_PING_BYTES=$pb NCCL_RMA_WASM_PROFILE=$prof
    rc=$?
    echo "AGENT-CHECK sb bytes=$pb agent=$ag rc=$rc"
    sb_show "$log" "bytes=$pb agent=$ag"
    [ $rc = 124 ] && [ "$ag" = 1 ] && hung=1
  done
done
# The agent adding each ping's signal into the peer's word itself
# (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL), the device ping first.
if [ -z "$hung" ]; then
  sb_run "$O/sb-64-direct.log" ${SB_TIMEOUT:-60} NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1 BENCH_PING_FIRST=1 BENCH_VMM=1 BENCH_KERNEL_WAIT=1 BENCH_SIG_NEVER_RESET=1 BENCH_PING_BYTES=64
  echo "AGENT-CHECK sb direct rc=$? $(grep -q 'adds signals straight' "$O/sb-64-direct.log" && echo '(the agent added the signals)' || echo '(the path was not taken)')"
  sb_show "$O/sb-64-direct.log" "direct"
  # Fused landings (NCCL_RMA_WASM_FUSED_LANDING): the TCP ping's payload
  # and signal landed by one agent command (the 64 B payload inline).
  sb_run "$O/sb-64-fused.log" ${SB_TIMEOUT:-60} NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_FUSED_LANDING=1 BENCH_VMM=1 BENCH_KERNEL_WAIT=1 BENCH_SIG_NEVER_RESET=1 BENCH_PING_BYTES=64 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET
  echo "AGENT-CHECK sb fused rc=$?"
  sb_show "$O/sb-64-fused.log" "fused"
  # Agent marks (NCCL_RMA_WASM_INTRANODE_AGENT_MARKS, the default with the
  # agent): the intra-node ping's header leaves before its mapped copy ran.
  sb_run "$O/sb-64-marks.log" ${SB_TIMEOUT:-60} NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 BENCH_VMM=1 BENCH_KERNEL_WAIT=1 BENCH_SIG_NEVER_RESET=1 BENCH_PING_BYTES=64 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET,REG
  echo "AGENT-CHECK sb marks rc=$? $(grep -q 'ordered by device agent marks' "$O/sb-64-marks.log" && echo '(marked)' || echo '(the path was not taken)')"
  sb_show "$O/sb-64-marks.log" "marks"
fi
# Where the agent hung: the same run without the waiting kernel, and with
# 32 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS), each once.
if [ -n "$hung" ]; then
  for v in "BENCH_KERNEL_WAIT=0" "BENCH_KERNEL_WAIT=1 CUDA_DEVICE_MAX_CONNECTIONS=32"; do
    log=$O/sb-64-1-$(echo "$v" | tr -c 'A-Za-z0-9\n' _ | cut -c1-40).log
    sb_run "$log" ${SB_TIMEOUT:-60} NCCL_RMA_WASM_DEVICE_AGENT=1 BENCH_VMM=1 BENCH_SIG_NEVER_RESET=1 BENCH_PING_BYTES=64 $v
    echo "AGENT-CHECK sb control [$v] rc=$?"
    sb_show "$log" "control [$v]"
  done
fi
# cuda_check with fused landings over TCP lanes, the agent on, under MPS:
# every byte and signal, and how many commands fused.
cc_loop tcp-fused ${CC_REPEAT:-4} NCCL_RMA_WASM_INTRANODE=0 NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_FUSED_LANDING=1
grep -h "fused landings" "$O/cc-tcp-fused.log" | sed 's/.*NET.wasm: /AGENT-CHECK cuda_check tcp-fused: /' | sort -u | head -2
mps_stop
echo "AGENT-CHECK: staging_bench done at $(($(date +%s) - t0)) s"

# cuda_check with the defaults, MPS off (so no agent).
cc_loop tcp ${CC_REPEAT:-4} NCCL_RMA_WASM_INTRANODE=0
cc_loop intranode ${CC_REPEAT:-4}
# The agent forced on without MPS (time-sliced), with its defaults (agent
# marks among them): slower, never hung, every byte.
cc_loop intranode-agent-nomps ${CC_REPEAT:-4} NCCL_RMA_WASM_DEVICE_AGENT=1
grep -h "device agent:" "$O/cc-intranode-agent-nomps.log" | sed 's/.*NET.wasm: /AGENT-CHECK cuda_check intranode-agent-nomps: /' | sort -u | head -2
echo "AGENT-CHECK: cuda_check repeats done at $(($(date +%s) - t0)) s"

# compute-sanitizer on cuda_check with the agent forced on (MPS off).
if command -v compute-sanitizer >/dev/null; then
  for tool in ${SANITIZERS-memcheck racecheck}; do
    NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET timeout ${SANITIZER_S:-100} compute-sanitizer --tool $tool --target-processes all \
      "$ROOT/build/cuda_check" "$LIB" $((1 << 20)) 1 >"$O/sanitizer-$tool.log" 2>&1
    echo "AGENT-CHECK sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/sanitizer-$tool.log" | sort | uniq -c | tr '\n' ' ')"
    # The plugin probes the driver (is this a cuMem allocation, does it
    # know this attribute): memcheck counts each refused probe as an
    # error. What is left after them is a real one.
    probes=$(grep -c "Program hit CUDA_ERROR_INVALID_VALUE .* cuMemRetainAllocationHandle\|Program hit CUDA_ERROR_INVALID_VALUE .* cuDeviceGetAttribute" "$O/sanitizer-$tool.log")
    other=$(grep -E "^========= [A-Z]" "$O/sanitizer-$tool.log" | grep -vcE "COMPUTE-SANITIZER|SUMMARY|Program hit CUDA_ERROR_INVALID_VALUE .* (cuMemRetainAllocationHandle|cuDeviceGetAttribute)")
    echo "AGENT-CHECK sanitizer $tool: $probes refused probes, $other other reports"
    grep -E "RESULT|device agent:" "$O/sanitizer-$tool.log" | sort -u | head -4
  done
fi

# One table: each series with the agent off and on, NCCL's send/recv beside.
PP_SIZES=${PP_SIZES:-8 64} "$ROOT/test/gpu/summary.sh" "$O"
echo "AGENT-CHECK: all done at $(($(date +%s) - t0)) s"
