#!/usr/bin/env bash
# The real-client check, for a machine with an NVIDIA GPU, nvcc and mpirun
# (it cannot run in CI, which has no GPU). It builds NVIDIA NCCL from a
# source tarball, runs build/cuda_check (test/gpu/cuda_check.c: device
# memory through the plugin, and teardown right after posting), then
# test/gpu/host_rma.cu (NCCL's host RMA API: ncclPutSignal, ncclSignal,
# ncclWaitSignal between ncclMemAlloc windows, 8 B to 64 MiB, every byte
# verified, bandwidth beside NCCL's own send/recv), then NCCL's own device-API example "pure GIN alltoall" RUNS
# times in a row, two processes on GPU 0
# posing as two hosts (different NCCL_HOSTID) so that its GIN traffic goes
# through our plugin. Each run has a timeout; a run that times out is a hang.
#
#   make                                   # build/ holds the plugin and cuda_check
#   git -C <nccl clone> archive --format=tar.gz -o build/nccl-src.tar.gz v2.30.7-1
#   test/gpu/nccl_gin_check.sh build/nccl-src.tar.gz 20 /tmp/nccl-check
#
# Prints one line per run and a summary "GIN-CHECK runs=N passed=P hangs=H
# failed=F"; exits 0 only when every run passed. NVCC_GENCODE picks the GPU
# architecture (default sm_90, Hopper). NCCL_PREBUILT=<dir> skips the NCCL
# build and uses <dir>/lib and <dir>/include. NCCL_ONLY_FUNCS is passed to
# NCCL's build as ONLY_FUNCS ("SendRecv" builds in about a third of the
# time and is all these programs launch). For a short GPU run:
# CHECKS picks the parts (default "cuda_check host_rma gin example";
# "pingpong" adds the GPU-initiated ping-pong, gin_pingpong.cu),
# GIN_REFS the reference runs after the per-size GIN alltoalls (default
# "agent appctx synccopy selfwait lanes1 staged ipcwait ipc profile"; "" for
# none; "agent" also runs cuda_check and host_rma with the device agent;
# "many" runs the 64 B and 4 KiB alltoalls with 4 ranks, GIN_NP=4;
# "gatherwriter" the 64 B alltoall with 2 and 4 ranks, the agent on and
# NCCL_RMA_WASM_GATHER_WRITER=0, the reference for its default with the
# agent; "direct" the 64 B and 4 KiB alltoalls, and 64 B with 4 ranks,
# with the agent and NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1; "askwait"
# pairs of 64 B and 4 KiB alltoalls with NCCL_RMA_WASM_FLUSH_ASK_AT_ONCE
# off and on (MARKS_PAIRS of each), the agent on; "ackhold" such pairs
# with NCCL_RMA_WASM_ACK_HOLD_ADAPT off and on; "spin" the 64 B alltoall
# with 4 ranks and the agent, with and without spinning readers
# (NCCL_RMA_WASM_SPIN_US=0), twice, with the acks the liveness backstop
# had to ask for; "profile" the plugin's profile of the 64 B alltoall,
# without and with the agent; "fence" pairs of 64 B and 4 KiB
# alltoalls with NCCL_RMA_WASM_DEVICE_AGENT_FENCE sc and acqrel, and the
# ping-pong's marks series with acqrel; "inbox" pairs and a ping-pong
# series with NCCL_RMA_WASM_INTRANODE_INBOX off and on; "placed" pairs
# with NCCL_RMA_WASM_PLACED_COMPLETION off and on, "placedinbox" the same
# with the peer inbox; "lean" the same with
# NCCL_RMA_WASM_DEVICE_AGENT_FENCE sc and lean; "oneread" the same pairs and
# series with NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ 0 and 1; "fused" the
# 64 B and 4 KiB alltoalls over TCP lanes only, NCCL_RMA_WASM_INTRANODE=0,
# the agent on, without and with NCCL_RMA_WASM_FUSED_LANDING=1, in turn
# FUSED_PAIRS times (default 2; logs after the first end in -2, -3...), so
# that drift between runs falls on both sides); "marks" host_rma with the
# agent and NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1, and the 64 B and 4 KiB
# alltoalls with the agent, without and with marks, in turn MARKS_PAIRS
# times (default 2); "gwnp4" pairs of 4-rank alltoalls with the agent and
# NCCL_RMA_WASM_GATHER_WRITER on and off; "inboxlanes1" pairs of the
# agent with marks and with the inbox, one lane per peer; "inboxwait"
# pairs of the inbox with the proxy's wait for an entry at 25 µs and 0;
# "inboxhost" pairs (and a ping-pong series) of the inbox with device rows
# and with host rows; "hostrows" pairs of marks (the default) and the
# inbox with host rows beside its device rows; "markwait" pairs (and a
# ping-pong series) of marks with the host waiting for each mark and with
# the target's agent waiting for it (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE);
# "stagger" the same with the agent's kernel polling from one warp and from
# four, staggered (NCCL_RMA_WASM_DEVICE_AGENT_STAGGER).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TAR=${1:?usage: nccl_gin_check.sh <nccl-src.tar.gz or source tree> [runs] [outdir]}
RUNS=${2:-20}
OUT=${3:-/tmp/nccl-check}
PER_RUN_TIMEOUT=${PER_RUN_TIMEOUT:-90}
CHECKS=${CHECKS:-cuda_check host_rma gin example}
GIN_REFS=${GIN_REFS-agent many appctx synccopy selfwait lanes1 staged ipcwait ipc profile}
# The runs that do not name the device agent run without it (its default,
# auto, runs it under MPS): the agent's own runs say NCCL_RMA_WASM_DEVICE_AGENT=1.
export NCCL_RMA_WASM_DEVICE_AGENT=${NCCL_RMA_WASM_DEVICE_AGENT:-0}
want() { case " $CHECKS " in *" $1 "*) return 0 ;; esac; return 1; }
ref() { case " $GIN_REFS " in *" $1 "*) return 0 ;; esac; return 1; }
GENCODE=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}
PLUGIN=$ROOT/build/libnccl-rma-wasm.so
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
mkdir -p "$OUT"
TAR=$(cd "$(dirname "$TAR")" && pwd)/$(basename "$TAR")

[ -f "$PLUGIN" ] || { echo "GIN-CHECK: $PLUGIN missing: run make first"; exit 2; }
SRC=$(mktemp -d /tmp/nccl-src.XXXXXX)
if [ -d "$TAR" ]; then # a source tree
  cp -a "$TAR/." "$SRC/" || { echo "GIN-CHECK: cannot copy $TAR"; exit 2; }
else
  tar -xzf "$TAR" -C "$SRC" || { echo "GIN-CHECK: cannot unpack $TAR"; exit 2; }
fi

t0=$(date +%s)
if [ -n "${NCCL_PREBUILT:-}" ]; then
  mkdir -p "$SRC/build" && cp -a "$NCCL_PREBUILT/." "$SRC/build/"
else
  echo "GIN-CHECK: building NCCL ($GENCODE) with $(nproc) jobs"
  if ! make -C "$SRC" -j"$(nproc)" src.build NVCC_GENCODE="$GENCODE" ${NCCL_ONLY_FUNCS:+ONLY_FUNCS="$NCCL_ONLY_FUNCS"} >"$OUT/nccl-build.log" 2>&1; then
    tail -40 "$OUT/nccl-build.log"
    echo "GIN-CHECK: NCCL build failed"
    exit 2
  fi
fi
NCCL_HOME=$SRC/build
echo "$NCCL_HOME" >"$OUT/nccl_home.txt"
echo "GIN-CHECK: NCCL ready in $(($(date +%s) - t0)) s: $(ls "$NCCL_HOME"/lib/libnccl.so.* | head -1)"

# The example picks its GPU by node-local rank; with one GPU both ranks use
# device 0 (a copy of NCCL's source is patched here, nothing is committed).
EX=$SRC/docs/examples/06_device_api/02_alltoall_gin/c
sed -i 's/CUDACHECK(cudaSetDevice(local_device));/{ int n_ = 1; cudaGetDeviceCount(\&n_); local_device %= n_; } CUDACHECK(cudaSetDevice(local_device));/' "$EX/main.cu"
if ! make -C "$EX" MPI=1 NCCL_HOME="$NCCL_HOME" CUDA_HOME="$CUDA_HOME" NVCC_GENCODE="$GENCODE" >"$OUT/example-build.log" 2>&1; then
  tail -40 "$OUT/example-build.log"
  echo "GIN-CHECK: example build failed"
  exit 2
fi

export LD_LIBRARY_PATH=$NCCL_HOME/lib:$ROOT/build:${LD_LIBRARY_PATH:-}
export NCCL_RMA_WASM_ADDR=127.0.0.1

if ! want cuda_check; then
  :
elif echo "GIN-CHECK: cuda_check (device memory, then 20 teardown rounds)"; timeout 300 "$ROOT/build/cuda_check" "$ROOT/build/librccl-rma-wasm.so" $((3 << 20)) 20 >"$OUT/cuda_check.log" 2>&1; then
  grep -E "teardown|multiseg|ring|RESULT" "$OUT/cuda_check.log"
else
  tail -20 "$OUT/cuda_check.log"
  echo "GIN-CHECK: cuda_check failed"
fi

# cuda_check again with the device agent (NCCL_RMA_WASM_DEVICE_AGENT=1,
# off by default until measured): every byte and signal through its ring.
if want cuda_check && ref agent; then
  if NCCL_RMA_WASM_DEVICE_AGENT=1 timeout ${AGENT_CC_TIMEOUT:-120} "$ROOT/build/cuda_check" "$ROOT/build/librccl-rma-wasm.so" $((3 << 20)) 20 >"$OUT/cuda_check-agent.log" 2>&1; then
    grep -E "RESULT|device agent:" "$OUT/cuda_check-agent.log" | sed 's/^/[agent] /' | sort -u
  else
    tail -20 "$OUT/cuda_check-agent.log"
    echo "GIN-CHECK: cuda_check with the device agent failed"
  fi
fi

cat >"$OUT/hostid.sh" <<'EOF'
#!/bin/bash
export NCCL_HOSTID=node-${OMPI_COMM_WORLD_RANK:-0}
exec "$@"
EOF
chmod +x "$OUT/hostid.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# CUDA MPS (when nvidia-cuda-mps-control exists and MPS is not 0) lets both
# ranks' kernels run at once; without it the GPU time-slices the two
# processes and each small operation costs milliseconds of scheduling.
MPS=${MPS:-auto}
mps_on=0
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && mps_on=1
}
stop_mps() {
  [ "$mps_on" = 1 ] || return 0
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  sleep 1
  mps_on=0
}
if [ "$MPS" != 0 ] && command -v nvidia-cuda-mps-control >/dev/null; then
  start_mps
fi
echo "GIN-CHECK: MPS $([ "$mps_on" = 1 ] && echo on || echo off)"
MPS_ENV=""
[ "$mps_on" = 1 ] && MPS_ENV="-x CUDA_MPS_PIPE_DIRECTORY"

# rma_variant NAME WHAT PATTERN [VAR=VALUE ...]: host_rma again with the
# variables set and NCCL's INFO lines on: its hops (HOSTRMA, prefixed
# [NAME]), its profile and the INFO lines PATTERN picks, from
# $OUT/host_rma-NAME.log; a failed run is said and its processes killed.
rma_variant() {
  local name=$1 what=$2 pat=$3 v
  shift 3
  local env=()
  for v in "$@"; do env+=(-x "$v"); done
  # shellcheck disable=SC2086
  if timeout -s KILL 300 mpirun --allow-run-as-root -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_RMA_PLUGIN="$PLUGIN" \
    -x NCCL_SOCKET_IFNAME=lo -x NCCL_RMA_WASM_ADDR -x NCCL_DEBUG=INFO "${env[@]}" $MPS_ENV ${EXTRA_MPI_ENV:-} \
    "$OUT/hostid.sh" "$OUT/host_rma" >"$OUT/host_rma-$name.log" 2>&1; then
    grep -E "HOSTRMA" "$OUT/host_rma-$name.log" | sed "s/^/[$name] /"
    grep -E "NET/wasm profile|^  (caller|initiator|wire|target|request):" "$OUT/host_rma-$name.log" | sed "s/^/GIN-CHECK [host_rma $name profile] /"
    grep -hE "$pat" "$OUT/host_rma-$name.log" | sed "s/.*NET.wasm: /GIN-CHECK [host_rma $name] /" | sort -u | head -3
    return 0
  else
    tail -20 "$OUT/host_rma-$name.log"
    echo "GIN-CHECK: host_rma with $what failed"
    pkill -9 -f "^$OUT/host_rma" >/dev/null 2>&1
    if [ "$mps_on" = 1 ]; then stop_mps; start_mps; fi
    return 1
  fi
}

# NCCL's host RMA API over the plugin (nvcc does not take -Wl options, so
# mpicxx links).
arch=$(echo "$GENCODE" | sed -n 's/.*code=\(sm_[0-9]*\).*/\1/p')
if ! want host_rma; then
  :
elif nvcc -O2 -arch="${arch:-sm_90}" -I"$NCCL_HOME/include" $(mpicxx --showme:compile) -c "$ROOT/test/gpu/host_rma.cu" -o "$OUT/host_rma.o" >"$OUT/host_rma-build.log" 2>&1 &&
  mpicxx "$OUT/host_rma.o" -o "$OUT/host_rma" -L"$NCCL_HOME/lib" -lnccl -L"$CUDA_HOME/lib64" -lcudart >>"$OUT/host_rma-build.log" 2>&1; then
  if timeout -s KILL 300 mpirun --allow-run-as-root -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_RMA_PLUGIN="$PLUGIN" \
    -x NCCL_SOCKET_IFNAME=lo -x NCCL_RMA_WASM_ADDR -x NCCL_DEBUG=WARN -x NCCL_RMA_WASM_PROFILE=1 -x NCCL_RMA_WASM_DEVICE_AGENT $MPS_ENV ${EXTRA_MPI_ENV:-} \
    "$OUT/hostid.sh" "$OUT/host_rma" >"$OUT/host_rma.log" 2>&1; then
    grep -E "HOSTRMA" "$OUT/host_rma.log"
    # Where an operation's time goes, seen from the plugin, every size
    # together (NCCL_RMA_WASM_PROFILE: a clock read per stage).
    grep -E "NET/wasm profile|^  (caller|initiator|wire|target|request):" "$OUT/host_rma.log" | sed "s/^/GIN-CHECK [host_rma profile] /"
    # The same with device windows mapped between the two processes for
    # every size (by default, with CUDA, from 64 KiB up).
    if rma_variant ipc IPC "device agent:" NCCL_DEBUG_SUBSYS=NET,REG NCCL_RMA_WASM_INTRANODE_IPC=1 NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0 \
      NCCL_RMA_WASM_PROFILE=1 NCCL_RMA_WASM_DEVICE_AGENT; then
      grep -q "mapped device memory (IPC)" "$OUT/host_rma-ipc.log" && echo "GIN-CHECK [host_rma ipc] puts copied into the mapped peer window" ||
        echo "GIN-CHECK [host_rma ipc] the mapping was not used"
    fi
    # With the device agent and agent marks (the default where the agent
    # runs): the mapped puts' headers leave before their copies ran.
    ref marks && rma_variant marks "agent marks" "device agent:|device agent marks" \
      NCCL_DEBUG_SUBSYS=NET,REG NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_PROFILE=1
    # "placed": the agent with marks, each put+signal completing on the
    # target's acknowledgement (NCCL_RMA_WASM_PLACED_COMPLETION=0), then
    # once its copy executed and its header was written (=1, the default).
    if ref placed; then
      rma_variant acked "acknowledged completions" "device agent:" \
        NCCL_DEBUG_SUBSYS=NET,REG NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_PLACED_COMPLETION=0 NCCL_RMA_WASM_PROFILE=1
      rma_variant placed "placed completions" "puts placed in its mapped memory" \
        NCCL_DEBUG_SUBSYS=NET,REG NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_PLACED_COMPLETION=1 NCCL_RMA_WASM_PROFILE=1
    fi
    # The same with the device agent without agent marks (the reference
    # for the marks run).
    ref agent && rma_variant agent "the device agent" "device agent:" \
      NCCL_DEBUG_SUBSYS=NET NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=0 NCCL_RMA_WASM_PROFILE=1
  else
    tail -20 "$OUT/host_rma.log"
    echo "GIN-CHECK: host_rma failed"
    pkill -9 -f "^$OUT/host_rma" >/dev/null 2>&1
    if [ "$mps_on" = 1 ]; then stop_mps; start_mps; fi
  fi
else
  tail -20 "$OUT/host_rma-build.log"
  echo "GIN-CHECK: host_rma build failed"
fi

# Our own GIN alltoall (test/gpu/gin_alltoall.cu): GIN_ITERS kernels back
# to back per size, every byte of every iteration verified, microseconds per
# alltoall, under MPS when it is on.
GIN_ITERS=${GIN_ITERS:-200}
GIN_SIZES=${GIN_SIZES:-64 4096 262144}
if ! want gin; then
  :
elif nvcc -O2 -std=c++17 -arch="${arch:-sm_90}" -I"$NCCL_HOME/include" $(mpicxx --showme:compile) -c "$ROOT/test/gpu/gin_alltoall.cu" -o "$OUT/gin_alltoall.o" >"$OUT/gin_alltoall-build.log" 2>&1 &&
  mpicxx "$OUT/gin_alltoall.o" -o "$OUT/gin_alltoall" -L"$NCCL_HOME/lib" -lnccl -L"$CUDA_HOME/lib64" -lcudart >>"$OUT/gin_alltoall-build.log" 2>&1; then
  # gin_run NAME BYTES ITERS [VAR=VALUE ...]: one two-rank run; a run still
  # alive 15 s before its timeout gets SIGUSR2 (with the stall report on,
  # the plugin writes its goroutines, last operations, signal updates and
  # lane state to the log) and has every thread's stack recorded
  # (hang_dump.sh) in $OUT/stacks-NAME.txt before it is killed; the
  # program's own watchdog (GINA2A_WATCH_S) says where its kernels are.
  gin_run() {
    local name=$1 b=$2 iters=$3
    shift 3
    local log=$OUT/gin_alltoall-$name.log envs="" kv
    for kv in "$@"; do envs="$envs -x $kv"; done
    case " $* " in *" NCCL_RMA_WASM_DEVICE_AGENT="*) ;; *) envs="$envs -x NCCL_RMA_WASM_DEVICE_AGENT" ;; esac
    (
      sleep $((PER_RUN_TIMEOUT - 15))
      pkill -USR2 -f "^$OUT/gin_alltoall " 2>/dev/null
      HANG_DUMP_S=10 "$ROOT/test/gpu/hang_dump.sh" "^$OUT/gin_alltoall " "$OUT/stacks-$name.txt"
    ) &
    local wd=$!
    timeout -s KILL "$PER_RUN_TIMEOUT" mpirun --allow-run-as-root -np "${GIN_NP:-2}" --bind-to none -x LD_LIBRARY_PATH \
      -x NCCL_RMA_PLUGIN="$PLUGIN" -x NCCL_SOCKET_IFNAME=lo -x NCCL_RMA_WASM_ADDR -x NCCL_DEBUG=WARN $MPS_ENV \
      -x NCCL_RMA_WASM_STALL_REPORT_MS=$(((PER_RUN_TIMEOUT - 20) * 1000)) -x GINA2A_WATCH_S=$((PER_RUN_TIMEOUT / 3)) $envs ${EXTRA_MPI_ENV:-} "$OUT/hostid.sh" "$OUT/gin_alltoall" "$b" "$iters" >"$log" 2>&1
    local rc=$?
    kill "$wd" 2>/dev/null
    wait "$wd" 2>/dev/null
    if [ $rc -eq 0 ] && grep -q "GINA2A PASS" "$log"; then
      grep "GINA2A bytes\|GINA2A PHASES\|GINA2A STEADY" "$log" | sed "s/^/GIN-CHECK [$name] /"
      return 0
    fi
    [ $rc -eq 137 ] && echo "GIN-CHECK gin_alltoall [$name] bytes=$b HANG (killed after ${PER_RUN_TIMEOUT}s)" ||
      echo "GIN-CHECK gin_alltoall [$name] bytes=$b FAIL rc=$rc"
    grep -E "WARN|FAIL|error" "$log" | head -20
    # The pattern names the binary's path: a bare "gin_alltoall" would
    # also match the shell that runs this script.
    pkill -9 -f "^$OUT/gin_alltoall " >/dev/null 2>&1
    # A client that faults poisons the MPS server: restart it.
    if [ "$mps_on" = 1 ]; then stop_mps; start_mps; fi
    return 1
  }
  # refrun REF NAME BYTES ITERS [VAR=VALUE ...]: gin_run when GIN_REFS names REF.
  refrun() {
    ref "$1" || return 0
    shift
    gin_run "$@"
  }
  gin_bad=0
  for b in $GIN_SIZES; do
    gin_run "$b" "$b" "$GIN_ITERS" || gin_bad=1
  done
  # The device agent (off by default): the copy
  # context's small copies and signals through a resident block instead
  # of driver submissions. Its INFO line says whether it ran.
  for b in 64 4096 262144; do
    if ref agent && gin_run agent-$b $b "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET; then
      grep -h "device agent:" "$OUT/gin_alltoall-agent-$b.log" | sed 's/.*NET.wasm: /GIN-CHECK [agent-'$b'] /' | sort -u
    elif ref agent; then gin_bad=1; fi
  done
  # The shipped default (auto) runs the agent where MPS runs, and only there.
  if ref agent; then
    if gin_run default-64 64 "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=auto NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET; then
      ran=0; grep -q "device agent: running" "$OUT/gin_alltoall-default-64.log" && ran=1
      if [ "$ran" = "$mps_on" ]; then echo "GIN-CHECK [default-64] the default (auto) $([ $ran = 1 ] && echo runs || echo does not run) the device agent (MPS $([ "$mps_on" = 1 ] && echo on || echo off))"
      else echo "GIN-CHECK [default-64] FAIL: the default (auto) ran the device agent: $ran, MPS on: $mps_on"; gin_bad=1; fi
    else gin_bad=1; fi
  fi
  # The device agent adding each signal into the peer's mapped word
  # itself (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL, off until measured).
  if ref direct; then
    for b in 64 4096; do
      if gin_run direct-$b $b "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET; then
        grep -q "adds signals straight into its mapped signal words" "$OUT/gin_alltoall-direct-$b.log" &&
          echo "GIN-CHECK [direct-$b] the agent added signals into the peers' words" ||
          echo "GIN-CHECK [direct-$b] the agent added no signal itself (the path was not taken)"
      else gin_bad=1; fi
    done
    GIN_NP=4 gin_run np4-direct-64 64 "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1 || gin_bad=1
  fi
  # abrun PAIRS A "A's VAR=VALUE..." B "B's VAR=VALUE..." PATTERN: the 64 B
  # and 4 KiB alltoalls with A's settings and B's in turn, PAIRS times (logs
  # after the first end in -2, -3...), so that drift between runs falls on
  # both sides; the first B run's INFO lines matching PATTERN are shown.
  abrun() {
    local pairs=$1 a=$2 ea=$3 bn=$4 eb=$5 pat=$6 b i sfx
    for b in 64 4096; do
      for i in $(seq 1 "$pairs"); do
        sfx=; [ "$i" -gt 1 ] && sfx=-$i
        # shellcheck disable=SC2086
        gin_run "$a-$b$sfx" $b "$GIN_ITERS" $ea || gin_bad=1
        # shellcheck disable=SC2086
        if gin_run "$bn-$b$sfx" $b "$GIN_ITERS" $eb NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET,REG; then
          [ -z "$sfx" ] && grep -hE "$pat" "$OUT/gin_alltoall-$bn-$b.log" | sed "s/.*NET.wasm: /GIN-CHECK [$bn-$b] /" | sort -u | head -3
        else gin_bad=1; fi
      done
    done
  }
  # Fused landings (NCCL_RMA_WASM_FUSED_LANDING, on by default): the
  # peers reach each other over TCP lanes only (NCCL_RMA_WASM_INTRANODE=0,
  # as between hosts), the agent on, fused and not.
  ref fused && abrun "${FUSED_PAIRS:-2}" tcp-agent "NCCL_RMA_WASM_INTRANODE=0 NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_FUSED_LANDING=0" \
    fused "NCCL_RMA_WASM_INTRANODE=0 NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_FUSED_LANDING=1" "device agent:.*fused landings"
  # Agent marks (NCCL_RMA_WASM_INTRANODE_AGENT_MARKS, on by default with
  # the agent): the agent's runs without and with them.
  ref marks && abrun "${MARKS_PAIRS:-2}" agent-ref "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=0" \
    marks "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1" "device agent:.*marked|device agent marks"
  # The flush's ask for held acks (NCCL_RMA_WASM_FLUSH_ASK_AT_ONCE): always
  # waiting 10 µs first beside the default (asking at once once the target
  # keeps holding its acks). Both with the device agent, as the default
  # runs it under MPS (this script's runs leave it off unless they say).
  ref askwait && abrun "${MARKS_PAIRS:-2}" askwait "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_FLUSH_ASK_AT_ONCE=0" \
    askonce "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_FLUSH_ASK_AT_ONCE=1" "flushes asked"
  # The target's hold of its acks for a batch of its own
  # (NCCL_RMA_WASM_ACK_HOLD_ADAPT): always, and only while it pays (the
  # default), with the device agent.
  ref ackhold && abrun "${MARKS_PAIRS:-2}" ackhold "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_ACK_HOLD_ADAPT=0" \
    ackadapt "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_ACK_HOLD_ADAPT=1" "acknowledged its peers"
  # Spinning readers with four ranks on one host (NCCL_RMA_WASM_SPIN_US):
  # the default (one per four cores of the host, shared among its
  # processes) against each process spinning its own budget (the variable
  # set: 50 µs) and against none, the agent on, in turn; with the count of
  # acks the liveness backstop had to ask for (a reader that got no CPU).
  if ref spin; then
    for i in $(seq 1 "${SPIN_ROUNDS:-2}"); do
      for v in spin ownspin nospin; do
        sp=; [ $v = nospin ] && sp=NCCL_RMA_WASM_SPIN_US=0
        [ $v = ownspin ] && sp=NCCL_RMA_WASM_SPIN_US=50
        # shellcheck disable=SC2086
        GIN_NP=4 gin_run np4-$v-64-$i 64 "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 $sp NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET || gin_bad=1
        echo "GIN-CHECK [np4-$v-64-$i] acks the backstop asked for: $(grep -c 'backstop asked' "$OUT/gin_alltoall-np4-$v-64-$i.log")"
      done
    done
  fi
  # The agent's fences (NCCL_RMA_WASM_DEVICE_AGENT_FENCE): SC (the default)
  # and acquire-release.
  ref fence && abrun "${MARKS_PAIRS:-2}" fencesc "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_FENCE=sc" \
    fenceacq "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_FENCE=acqrel" "device agent: running"
  # "lean": SC fences, the one before a signal word only after a copy.
  ref lean && abrun "${MARKS_PAIRS:-2}" fencesc "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_FENCE=sc" \
    fencelean "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_FENCE=lean" "device agent: running"
  # The agent's one-read pickup (NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ, off
  # until measured): a slot read whole in one round trip, or its number
  # and then its fields.
  ref oneread && abrun "${MARKS_PAIRS:-2}" tworead "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ=0" \
    oneread "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ=1" "slots read whole"
  # The peer inbox (NCCL_RMA_WASM_INTRANODE_INBOX, off until measured):
  # the target's agent adds each small put+signal's signal from the
  # sender's agent's entry, or its host applies it after the mark.
  ref inbox && abrun "${MARKS_PAIRS:-2}" noinbox "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=0" \
    inbox "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1" "peer inbox"
  # Placed completions (NCCL_RMA_WASM_PLACED_COMPLETION, on by default):
  # a put+signal the agent copied into the peer's mapped window completes
  # once its copy executed and its header was written, not on the target's
  # acknowledgement; with marks (the default), then with the peer inbox
  # ("placedinbox").
  ref placed && abrun "${MARKS_PAIRS:-2}" acked "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_PLACED_COMPLETION=0" \
    placed "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_PLACED_COMPLETION=1" "puts placed in its mapped memory"
  ref placedinbox && abrun "${MARKS_PAIRS:-2}" inbox-acked "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1 NCCL_RMA_WASM_PLACED_COMPLETION=0" \
    inbox-placed "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1 NCCL_RMA_WASM_PLACED_COMPLETION=1" "puts placed in its mapped memory"
  # The gather writer's reference: with the agent its default (auto) hands
  # gathered batches over; here the proxy thread waits for them
  # (NCCL_RMA_WASM_GATHER_WRITER=0), 2 and 4 ranks.
  if ref gatherwriter; then
    gin_run nogw-64 64 "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_GATHER_WRITER=0 || gin_bad=1
    GIN_NP=4 gin_run np4-nogw-64 64 "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_GATHER_WRITER=0 || gin_bad=1
  fi
  # "inboxwait": the inbox with NCCL's proxy thread waiting up to 25 µs for
  # each entry (NCCL_RMA_WASM_INTRANODE_INBOX_CALLER_WAIT_US=25, as before
  # it was a setting) and only looking (0, the default).
  ref inboxwait && abrun "${MARKS_PAIRS:-2}" inbox-wait25 "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1 NCCL_RMA_WASM_INTRANODE_INBOX_CALLER_WAIT_US=25" \
    inbox-wait0 "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1 NCCL_RMA_WASM_INTRANODE_INBOX_CALLER_WAIT_US=0" "peer inbox"
  # "inboxhost": the inbox with its rows in device memory (the default) and
  # in host memory (NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS=1), where NCCL's
  # proxy thread writes a signal alone's entry itself when nothing is
  # queued before it.
  ref inboxhost && abrun "${MARKS_PAIRS:-2}" inbox-devrows "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1" \
    inbox-hostrows "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1 NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS=1" "written by the host itself"
  # "hostrows": marks (the default) against the inbox with host rows
  # beside its device rows, the candidate to replace it.
  ref hostrows && abrun "${MARKS_PAIRS:-2}" hr-marks "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=0" \
    hr-inbox "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_INBOX=1 NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS=1" "written by the host itself"
  # "markwait": marks (the default) with the host waiting for each mark
  # and with the target's device agent waiting for it.
  ref markwait && abrun "${MARKS_PAIRS:-2}" mw-host "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE=0" \
    mw-device "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE=1" "for the device agent to wait for|waited on the device|cannot be read by the device"
  # "stagger": the agent's kernel polling its ring from thread 0 alone and
  # from lane 0 of four warps, staggered.
  ref stagger && abrun "${MARKS_PAIRS:-2}" st-one "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_STAGGER=0" \
    st-four "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_DEVICE_AGENT_STAGGER=1" "device agent:"
  # "inboxlanes1": the inbox against marks with one lane per peer
  # (NCCL_RMA_WASM_LANES=1), as the inbox puts every operation to a peer
  # on lane 0: whether the lanes explain its slower alltoall.
  ref inboxlanes1 && abrun "${MARKS_PAIRS:-2}" l1-marks "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_LANES=1" \
    l1-inbox "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_LANES=1 NCCL_RMA_WASM_INTRANODE_INBOX=1" "peer inbox"
  # "gwnp4": 4 ranks with the agent, the gather writer on (its default with
  # the agent) and off, in turn GW_PAIRS times (default 2).
  ref gwnp4 && GIN_NP=4 abrun "${GW_PAIRS:-2}" np4-gw "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_GATHER_WRITER=1" \
    np4-nogw "NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_GATHER_WRITER=0" "gather writer"
  # The agent's small intra-node puts staged instead of mapped
  # (NCCL_RMA_WASM_INTRANODE_IPC_AGENT=0): the reference for their mapping.
  if ref agent; then
    for b in 64 4096; do
      gin_run agent-staged-$b $b "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_IPC_AGENT=0 || gin_bad=1
    done
  fi
  # Many peers: 4 ranks on the GPU, each a "host" (GIN_NP), beside the
  # 2-rank figures above.
  for b in 64 4096; do
    if ref many; then GIN_NP=4 gin_run np4-$b $b "$GIN_ITERS" || gin_bad=1; fi
    if ref many && ref agent; then
      if GIN_NP=4 gin_run np4-agent-$b $b "$GIN_ITERS" NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET; then
        grep -h "device agent:" "$OUT/gin_alltoall-np4-agent-$b.log" | sed 's/.*NET.wasm: /GIN-CHECK [np4-agent-'$b'] /' | sort -u | head -2
      else gin_bad=1; fi
    fi
  done
  # The reference for the copy context's cost (on by default): the
  # application's own context with a hardware queue per stream, which
  # cannot hold our copies behind its kernels either (SPEC.md §4, "Copies
  # queued behind the application's kernels").
  refrun appctx appctx-conn32-64 64 "$GIN_ITERS" NCCL_RMA_WASM_COPY_CONTEXT=0 CUDA_DEVICE_MAX_CONNECTIONS=32 || gin_bad=1
  # The reference for asynchronous small copies (on by default): the same
  # alltoalls with every small payload copied synchronously.
  refrun synccopy synccopy-64 64 "$GIN_ITERS" NCCL_RMA_WASM_ASYNC_COPY_KB=0 || gin_bad=1
  refrun synccopy synccopy-4096 4096 "$GIN_ITERS" NCCL_RMA_WASM_ASYNC_COPY_KB=0 || gin_bad=1
  # The reference for a rank's own copies queued (on by default): each
  # round's put to its own rank waited for by NCCL's proxy thread.
  refrun selfwait selfwait-64 64 "$GIN_ITERS" NCCL_RMA_WASM_SELF_ASYNC=0 || gin_bad=1
  # The reference for several lanes (one per 4 cores by default, so four
  # on a 16-core host): the same alltoalls over one lane per peer.
  refrun lanes1 lanes1-64 64 "$GIN_ITERS" NCCL_RMA_WASM_LANES=1 || gin_bad=1
  # Device windows mapped between the two processes for every size (by
  # default with CUDA only from 64 KiB, NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB):
  # each put copies straight into the peer's window. The INFO line says
  # whether the mapping was used. ipcwait-64: the same with the sender
  # waiting for its copies (no interprocess events), to see what the
  # events save. staged-*: the reference without the mapping.
  refrun staged staged-64 64 "$GIN_ITERS" NCCL_RMA_WASM_INTRANODE_IPC=0 || gin_bad=1
  refrun staged staged-262144 262144 "$GIN_ITERS" NCCL_RMA_WASM_INTRANODE_IPC=0 || gin_bad=1
  refrun ipcwait ipcwait-64 64 "$GIN_ITERS" NCCL_RMA_WASM_INTRANODE_IPC=1 NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0 NCCL_RMA_WASM_INTRANODE_IPC_EVENTS=0 || gin_bad=1
  ref ipc || GIN_IPC_SIZES=""
  for b in ${GIN_IPC_SIZES-64 4096 262144}; do
    gin_run ipc-$b $b "$GIN_ITERS" NCCL_RMA_WASM_INTRANODE_IPC=1 NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET,REG || gin_bad=1
    grep -q "ordered by interprocess events" "$OUT/gin_alltoall-ipc-$b.log" && echo "GIN-CHECK [ipc-$b] signals ordered by interprocess events" ||
      echo "GIN-CHECK [ipc-$b] signals wait for their copies on the host"
    grep -q "mapped device memory (IPC)" "$OUT/gin_alltoall-ipc-$b.log" && echo "GIN-CHECK [ipc-$b] puts copied into the mapped peer window" ||
      { echo "GIN-CHECK [ipc-$b] the mapping was not used:"; grep -E "not mapped|not shared|IPC" "$OUT/gin_alltoall-ipc-$b.log" | head -5; }
  done
  # Where the time of a 64-byte alltoall goes, seen from the plugin.
  if ! ref profile; then
    :
  elif gin_run profile-64 64 "$GIN_ITERS" NCCL_RMA_WASM_PROFILE=1; then
    grep -E "NET/wasm profile|^  (caller|initiator|wire|target|request):" "$OUT/gin_alltoall-profile-64.log" | sed "s/^/GIN-CHECK [profile-64] /"
    # The same with the device agent (the default under MPS).
    if gin_run profile-agent-64 64 "$GIN_ITERS" NCCL_RMA_WASM_PROFILE=1 NCCL_RMA_WASM_DEVICE_AGENT=1; then
      grep -E "NET/wasm profile|^  (caller|initiator|wire|target|request):" "$OUT/gin_alltoall-profile-agent-64.log" | sed "s/^/GIN-CHECK [profile-agent-64] /"
    else gin_bad=1; fi
  else
    gin_bad=1
  fi
  # After a failure: one kernel alone, the TCP path without the
  # intra-node one, and each kernel waited for before the next is
  # launched (nothing queued behind a spinning kernel).
  if [ "$gin_bad" = 1 ]; then
    gin_run one-64 64 1
    gin_run tcp-64 64 "$GIN_ITERS" NCCL_RMA_WASM_INTRANODE=0
    gin_run synceach-64 64 "$GIN_ITERS" GINA2A_SYNC_EACH=1
    gin_run appctx-64 64 "$GIN_ITERS" NCCL_RMA_WASM_COPY_CONTEXT=0
  fi
else
  tail -20 "$OUT/gin_alltoall-build.log"
  echo "GIN-CHECK: gin_alltoall build failed"
fi

# GPU-initiated ping-pong (test/gpu/gin_pingpong.cu): the one-way time of
# a small put+signal from one rank's kernel to the other's waiting kernel,
# every byte and the order of bytes and signal checked; the agent off, on,
# and on with agent marks. PP_SIZES (default "8 64"), PP_ROUNDS (2000);
# PP_TRACE=1 traces each hop (GINPP_TRACE, NCCL_RMA_WASM_PROFILE_TRACE) and
# prints where its time goes (build/hoptrace, or HOPTRACE); PP_SIGNAL=1 adds
# a series of signals alone (a GIN barrier's hop).
if ! want pingpong; then
  :
elif nvcc -O2 -std=c++17 -arch="${arch:-sm_90}" -I"$NCCL_HOME/include" $(mpicxx --showme:compile) -c "$ROOT/test/gpu/gin_pingpong.cu" -o "$OUT/gin_pingpong.o" >"$OUT/gin_pingpong-build.log" 2>&1 &&
  mpicxx "$OUT/gin_pingpong.o" -o "$OUT/gin_pingpong" -L"$NCCL_HOME/lib" -lnccl -L"$CUDA_HOME/lib64" -lcudart >>"$OUT/gin_pingpong-build.log" 2>&1; then
  for b in ${PP_SIZES:-8 64}; do
    pp="off NCCL_RMA_WASM_DEVICE_AGENT=0|agent NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=0|marks NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1"
    # "fence": the marks series again with the agent's acquire-release fences.
    ref fence && pp="$pp|acqrel NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_DEVICE_AGENT_FENCE=acqrel"
    ref lean && pp="$pp|lean NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_DEVICE_AGENT_FENCE=lean"
    # "inbox": the marks series again with the peer inbox.
    ref inbox && pp="$pp|inbox NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_INTRANODE_INBOX=1"
    # "inboxhost": the inbox series again with host rows.
    ref inboxhost && pp="$pp|inboxhost NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_INTRANODE_INBOX=1 NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS=1"
    # "markwait": the marks series again with the target's agent waiting
    # for each mark.
    ref markwait && pp="$pp|markwait NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE=1"
    # PP_SIGNAL=1: the default's series with signals alone (GINPP_SIGNAL),
    # a GIN barrier's hop.
    [ "${PP_SIGNAL:-0}" = 1 ] && pp="$pp|signal NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 GINPP_SIGNAL=1"
    # "stagger": the marks series again with the staggered pollers.
    ref stagger && pp="$pp|stagger NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_DEVICE_AGENT_STAGGER=1"
    # "oneread": the marks series again with the agent's one-read pickup.
    ref oneread && pp="$pp|oneread NCCL_RMA_WASM_DEVICE_AGENT=1 NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1 NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ=1"
    IFS='|' read -r -a ppv <<<"$pp"
    for v in "${ppv[@]}"; do
      # PP_PROFILE=1: the plugin's per-stage profile in each run's log.
      [ "${PP_PROFILE:-0}" = 1 ] && v="$v NCCL_RMA_WASM_PROFILE=1"
      set -- $v
      name=$1; shift
      envs=""
      for kv in "$@"; do envs="$envs -x $kv"; done
      # PP_TRACE=1: the kernels' stamps and the plugin's trace points of
      # each hop (test/gpu/hoptrace says where a hop's time goes).
      if [ "${PP_TRACE:-0}" = 1 ]; then
        mkdir -p "$OUT/trace"
        envs="$envs -x GINPP_TRACE=$OUT/trace/$name-$b -x NCCL_RMA_WASM_PROFILE_TRACE=$OUT/trace/$name-$b"
      fi
      log=$OUT/gin_pingpong-$name-$b.log
      timeout -s KILL "${PER_RUN_TIMEOUT}" mpirun --allow-run-as-root -np 2 --bind-to none -x LD_LIBRARY_PATH \
        -x NCCL_RMA_PLUGIN="$PLUGIN" -x NCCL_SOCKET_IFNAME=lo -x NCCL_RMA_WASM_ADDR -x NCCL_DEBUG=WARN $MPS_ENV $envs ${EXTRA_MPI_ENV:-} \
        "$OUT/hostid.sh" "$OUT/gin_pingpong" "$b" "${PP_ROUNDS:-2000}" >"$log" 2>&1
      rc=$?
      if [ $rc -eq 0 ] && grep -q "GINPP PASS" "$log"; then
        grep "GINPP bytes" "$log" | sed "s/^/GIN-CHECK [pingpong $name] /"
        if [ "${PP_TRACE:-0}" = 1 ]; then
          ht=${HOPTRACE:-$ROOT/build/hoptrace}
          if [ -x "$ht" ]; then
            "$ht" "$OUT/trace/$name-$b" 2>&1 | sed "s/^/GIN-CHECK [pingpong $name $b] /"
          else
            echo "GIN-CHECK [pingpong $name] no $ht to read the trace (make driver builds it)"
          fi
        fi
      else
        echo "GIN-CHECK gin_pingpong [$name] bytes=$b $([ $rc -eq 137 ] && echo "HANG (killed after ${PER_RUN_TIMEOUT}s)" || echo "FAIL rc=$rc")"
        grep -E "WARN|FAIL|error" "$log" | head -10
        pkill -9 -f "^$OUT/gin_pingpong " >/dev/null 2>&1
        if [ "$mps_on" = 1 ]; then stop_mps; start_mps; fi
      fi
    done
  done
else
  tail -20 "$OUT/gin_pingpong-build.log"
  echo "GIN-CHECK: gin_pingpong build failed"
fi

pass=0 hang=0 fail=0
want example || RUNS=0
for i in $(seq 1 "$RUNS"); do
  log=$OUT/run-$i.log
  s=$(date +%s%N)
  timeout -s KILL "$PER_RUN_TIMEOUT" mpirun --allow-run-as-root -np 2 --bind-to none \
    -x LD_LIBRARY_PATH -x NCCL_RMA_PLUGIN="$PLUGIN" -x NCCL_SOCKET_IFNAME=lo \
    -x NCCL_RMA_WASM_ADDR -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET -x NCCL_RMA_WASM_DEVICE_AGENT $MPS_ENV \
    ${EXTRA_MPI_ENV:-} "$OUT/hostid.sh" "$EX/alltoall_gin" >"$log" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - s) / 1000000))
  gin=$(grep -c "GIN/Plugin: Assigned plugin wasm" "$log")
  warns=$(grep -c "NCCL WARN" "$log")
  if [ $rc -eq 137 ] || [ $rc -eq 124 ]; then
    hang=$((hang + 1)); what=HANG
    pkill -9 -f "^$EX/alltoall_gin" >/dev/null 2>&1
  elif [ $rc -eq 0 ] && grep -q "Pure GIN AlltoAll result: PASSED" "$log" && [ "$gin" -ge 1 ]; then
    pass=$((pass + 1)); what=PASS
  else
    fail=$((fail + 1)); what=FAIL
  fi
  printf 'GIN-CHECK run %2d: %s rc=%d %d ms, GIN assigned to plugin wasm %d times, %d WARN lines\n' "$i" "$what" "$rc" "$ms" "$gin" "$warns"
  [ "$what" = PASS ] || grep -E "WARN|PASSED|FAILED|completed" "$log" | head -20
done
stop_mps
if [ "$RUNS" = 0 ]; then
  echo "GIN-CHECK NCCL's GIN example: not run (CHECKS or runs=0); the checks above report their own results"
  exit 0
fi
echo "GIN-CHECK runs=$RUNS passed=$pass hangs=$hang failed=$fail"
[ $pass -eq "$RUNS" ]
