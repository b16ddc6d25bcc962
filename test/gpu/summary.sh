#!/usr/bin/env bash
# The GPU check's summary table: each series with the device agent off and
# on, NCCL's send/recv beside, from the logs of one run under <outdir>
# (agent_check.sh's; nccl_gin_check.sh's own under <outdir>/gin). A series
# the run did not measure, or whose run failed, shows '-'.
#
#   test/gpu/summary.sh <outdir>
set -uo pipefail
O=${1:?usage: summary.sh <outdir>}
# One table: each series with the agent off and on, NCCL's send/recv beside.
G=$O/gin
hr() { grep -h "HOSTRMA latency size=$2 " "$1" 2>/dev/null | head -1 | sed -n "s/.*putsignal_us=\([0-9.]*\) nccl-sendrecv_us=\([0-9.]*\).*/\1 \2/p"; }
ga() { grep -h "GINA2A bytes=$2 " "$1" 2>/dev/null | head -1 | sed -n 's/.*us_per_alltoall=\([0-9.]*\).*/\1/p'; }
# gm name bytes: the mean of a run and its repeats (name, name-2, ...).
gm() { for f in "$G/gin_alltoall-$1.log" "$G"/gin_alltoall-"$1"-[0-9].log; do ga "$f" "$2"; done | awk '{s += $1; n++} END {if (n) printf "%.1f\n", s / n}'; }
sb() { grep -h "^SIGNAL $2 " "$1" 2>/dev/null | head -1 | sed -n 's/.*device word *\([0-9.]*\) us.*/\1/p'; }
self() { grep -h "^SELF   $2 " "$1" 2>/dev/null | head -1 | sed -n "s/.*$3 *\([0-9.]*\) us.*/\1/p"; }
gw() { grep -h "$2" "$1" 2>/dev/null | head -1 | sed -n 's/.*p50 *\([0-9.]*\) µs.*/\1/p'; }
cc() { [ -f "$1" ] || { echo -; return; }; grep -q "RESULT PASS" "$1" && echo pass || echo FAIL; }
# pr kernel flags what: the probe's p50 under MPS (one probe alone).
pr() { sed -n '/^PROBE: under MPS$/,/^PROBE: under MPS, two/p' "$O/probe.log" 2>/dev/null | grep -E "^PROBE $1 f$2 +${3//+/\\+} +p50" | head -1 | sed -n 's/.*p50 *\([0-9.]*\) us.*/\1/p'; }
echo "AGENT-CHECK summary (µs; '-' not measured or failed)"
printf '%-46s %10s %10s %12s\n' series agent-off agent-on nccl-sendrecv
for b in 8 4096 65536; do
  set -- $(hr "$G/host_rma.log" $b) ; off=${1:--} nccl=${2:--}
  set -- $(hr "$G/host_rma-agent.log" $b) ; on=${1:--}
  printf '%-46s %10s %10s %12s\n' "host_rma ncclPutSignal hop ${b} B" "$off" "$on" "$nccl"
done
for b in 64 4096 262144; do
  printf '%-46s %10s %10s %12s\n' "GIN alltoall ${b} B per peer" "$(ga "$G/gin_alltoall-$b.log" $b)" "$(ga "$G/gin_alltoall-agent-$b.log" $b)" ""
done
for b in 64 4096; do
  printf '%-46s %10s %10s %12s\n' "GIN alltoall ${b} B per peer, 4 ranks" "$(ga "$G/gin_alltoall-np4-$b.log" $b)" "$(ga "$G/gin_alltoall-np4-agent-$b.log" $b)" ""
done
for b in 64 4096; do
  printf '%-46s %10s %10s %12s\n' "GIN alltoall ${b} B, agent, small puts staged" "" "$(ga "$G/gin_alltoall-agent-staged-$b.log" $b)" ""
done
printf '%-46s %10s %10s %12s\n' "GIN alltoall 64 B, agent, no gather writer" "" "$(ga "$G/gin_alltoall-nogw-64.log" 64)" ""
printf '%-46s %10s %10s %12s\n' "the same, 4 ranks" "" "$(ga "$G/gin_alltoall-np4-nogw-64.log" 64)" ""
printf '%-46s %10s %10s %12s\n' "GIN alltoall 64 B, agent adds signals itself" "" "$(ga "$G/gin_alltoall-direct-64.log" 64)" ""
printf '%-46s %10s %10s %12s\n' "GIN alltoall 4096 B, agent adds signals itself" "" "$(ga "$G/gin_alltoall-direct-4096.log" 4096)" ""
printf '%-46s %10s %10s %12s\n' "the same at 64 B, 4 ranks" "" "$(ga "$G/gin_alltoall-np4-direct-64.log" 64)" ""
pp() { grep -h "GINPP bytes=$2 " "$1" 2>/dev/null | head -1 | sed -n 's/.*us_one_way=\([0-9.]*\).*/\1/p'; }
for b in ${PP_SIZES:-8 64}; do
  printf '%-46s %10s %10s %12s\n' "GIN ping-pong one way ${b} B (on: plain|marks)" "$(pp "$G/gin_pingpong-off-$b.log" $b)" "$(pp "$G/gin_pingpong-agent-$b.log" $b)|$(pp "$G/gin_pingpong-marks-$b.log" $b)" ""
  [ -f "$G/gin_pingpong-acqrel-$b.log" ] && printf '%-46s %10s %10s %12s\n' "the same, marks with acqrel fences" "" "$(pp "$G/gin_pingpong-acqrel-$b.log" $b)" ""
done
printf '%-46s %10s %10s %12s\n' "GIN a2a 64 B, agent, unmarked|marked, mean" "$(gm agent-ref-64 64)" "$(gm marks-64 64)" ""
printf '%-46s %10s %10s %12s\n' "GIN a2a 4 KiB, agent, unmarked|marked, mean" "$(gm agent-ref-4096 4096)" "$(gm marks-4096 4096)" ""
printf '%-46s %10s %10s %12s\n' "GIN a2a 64 B, agent fences sc|acqrel, mean" "$(gm fencesc-64 64)" "$(gm fenceacq-64 64)" ""
printf '%-46s %10s %10s %12s\n' "GIN a2a 4 KiB, agent fences sc|acqrel, mean" "$(gm fencesc-4096 4096)" "$(gm fenceacq-4096 4096)" ""
printf '%-46s %10s %10s %12s\n' "GIN a2a 64 B, flush ask waits|at once, mean" "$(gm askwait-64 64)" "$(gm askonce-64 64)" ""
printf '%-46s %10s %10s %12s\n' "GIN a2a 4 KiB, flush ask waits|at once, mean" "$(gm askwait-4096 4096)" "$(gm askonce-4096 4096)" ""
for b in 8 4096; do
  set -- $(hr "$G/host_rma-marks.log" $b) ; mk=${1:--}
  printf '%-46s %10s %10s %12s\n' "host_rma hop ${b} B, agent, marked" "" "$mk" ""
done
# The peer inbox and placed completions (GIN_REFS="inbox placed placedinbox"),
# each pair's mean: off | on.
for b in 64 4096; do
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, agent, no inbox|inbox, mean" "$(gm noinbox-$b $b)" "$(gm inbox-$b $b)" ""
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, agent, acked|placed, mean" "$(gm acked-$b $b)" "$(gm placed-$b $b)" ""
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, inbox, acked|placed, mean" "$(gm inbox-acked-$b $b)" "$(gm inbox-placed-$b $b)" ""
done
for b in 8 4096 65536; do
  set -- $(hr "$G/host_rma-acked.log" $b) ; ak=${1:--}
  set -- $(hr "$G/host_rma-placed.log" $b) ; pl=${1:--} nccl=${2:--}
  printf '%-46s %10s %10s %12s\n' "host_rma hop ${b} B, agent, acked|placed" "$ak" "$pl" "$nccl"
done
for b in ${PP_SIZES:-8 64}; do
  [ -f "$G/gin_pingpong-inbox-$b.log" ] && printf '%-46s %10s %10s %12s\n' "GIN ping-pong one way ${b} B, inbox" "" "$(pp "$G/gin_pingpong-inbox-$b.log" $b)" ""
done
for b in 64 4096; do
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, inbox, proxy waits 25 µs|0, mean" "$(gm inbox-wait25-$b $b)" "$(gm inbox-wait0-$b $b)" ""
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, one lane, marks|inbox, mean" "$(gm l1-marks-$b $b)" "$(gm l1-inbox-$b $b)" ""
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, 4 ranks, gather writer on|off, mean" "$(gm np4-gw-$b $b)" "$(gm np4-nogw-$b $b)" ""
done
for b in 64 4096; do
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, marks waited by host|device, mean" "$(gm mw-host-$b $b)" "$(gm mw-device-$b $b)" ""
done
for b in 64 4096; do
  printf '%-46s %10s %10s %12s\n' "GIN a2a $b B, agent polls from 1|4 warps, mean" "$(gm st-one-$b $b)" "$(gm st-four-$b $b)" ""
done
for b in ${PP_SIZES:-8 64}; do
  [ -f "$G/gin_pingpong-signal-$b.log" ] && printf '%-46s %10s %10s %12s\n' "GIN ping-pong one way ${b} B, signals alone" "" "$(pp "$G/gin_pingpong-signal-$b.log" $b)" ""
  [ -f "$G/gin_pingpong-stagger-$b.log" ] && printf '%-46s %10s %10s %12s\n' "GIN ping-pong one way ${b} B, staggered pollers" "" "$(pp "$G/gin_pingpong-stagger-$b.log" $b)" ""
  [ -f "$G/gin_pingpong-markwait-$b.log" ] && printf '%-46s %10s %10s %12s\n' "GIN ping-pong one way ${b} B, marks waited on device" "" "$(pp "$G/gin_pingpong-markwait-$b.log" $b)" ""
done
printf '%-46s %10s %10s %12s\n' "GIN a2a 64 B, TCP lanes, unfused|fused, mean" "$(gm tcp-agent-64 64)" "$(gm fused-64 64)" ""
printf '%-46s %10s %10s %12s\n' "GIN a2a 4 KiB, TCP lanes, unfused|fused, mean" "$(gm tcp-agent-4096 4096)" "$(gm fused-4096 4096)" ""
for pb in ${SB_BYTES-0 64 4096}; do
  for w in intranode tcp; do
    printf '%-46s %10s %10s %12s\n' "kernel-watched word, ${pb} B payload, $w" "$(sb "$O/sb-$pb-0.log" $w)" "$(sb "$O/sb-$pb-1.log" $w)" ""
  done
done
printf '%-46s %10s %10s %12s\n' "the same, 64 B, intranode, agent adds signal" "" "$(sb "$O/sb-64-direct.log" intranode)" ""
printf '%-46s %10s %10s %12s\n' "the same, 64 B, tcp, fused landing" "" "$(sb "$O/sb-64-fused.log" tcp)" ""
printf '%-46s %10s %10s %12s\n' "the same, 64 B, intranode, agent marks" "" "$(sb "$O/sb-64-marks.log" intranode)" ""
printf '%-46s %10s %10s %12s\n' "gather wait (one d2h round trip), 64 B, p50" "$(gw "$O/sb-64-0.log" "gathered device copies")" "$(gw "$O/sb-64-1.log" "gathered device copies")" ""
printf '%-46s %10s %10s %12s\n' "target landing (device), 64 B, p50" "$(gw "$O/sb-64-0.log" "landed or queued")" "$(gw "$O/sb-64-1.log" "landed or queued")" ""
for w in intranode tcp; do
  for dir in "device->host" "host->device"; do
    printf '%-46s %10s %10s %12s\n' "8 B put to itself, $dir, $w" "$(self "$O/sb-0-0.log" $w "$dir")" "$(self "$O/sb-0-1.log" $w "$dir")" ""
  done
done
for what in nop "copy h2d" "copy+add"; do
  printf '%-46s %10s %10s %12s\n' "agent round trip, $what (plain|inline kernel)" "$(pr agent.ptx 0 "$what")" "$(pr agent.ptx 1 "$what")" ""
done
printf '%-46s %10s %10s %12s\n' "cuda_check (every byte)" "$(cc "$G/cuda_check.log")" "$(cc "$G/cuda_check-agent.log")" ""
printf '%-46s %10s %10s %12s\n' "cuda_check intra-node, MPS off (every byte)" "$(cc "$O/cc-intranode.log")" "$(cc "$O/cc-intranode-agent-nomps.log")" ""
