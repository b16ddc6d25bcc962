#!/usr/bin/env bash
# The acknowledgement soak: the ack and lane-failover tests of the TCP
# transport (host/dataplane/tcp) and the shared-memory stream tests of the
# intra-node one (host/dataplane/intranode), looped under -race while two
# CPU hogs run, for a given time. Prints the runs, the failures and the
# first failure's log.
#
#   test/soak/acks.sh [duration, e.g. 30m] [negative]
#
# "negative" is the control: the re-arm of owed acks removed through the
# test hook (RMAW_NEGATIVE_CONTROL=rearm), only TestStrandedAck looped; it
# must fail (the soak can see the bug it exists for). Exits 0 when the
# soak had no failure, or the control had one.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DUR=${1:-10m}
MODE=${2:-}
secs() { case "$1" in *h) echo $((${1%h} * 3600)) ;; *m) echo $((${1%m} * 60)) ;; *s) echo "${1%s}" ;; *) echo "$1" ;; esac; }
end=$(($(date +%s) + $(secs "$DUR")))
# Each package's tests, as "package directory|-test.run pattern"; a run
# runs every package's in turn.
SUITES=(
  'host/dataplane/tcp|^(TestPiggybackedAcks|TestStrandedAck|TestAckBackstop|TestAskAcks|TestAskAcksAtOnce|TestAckHoldAdapts|TestLaneFailoverMidStream|TestResentPutsDeduplicated|TestAckLaneFailover|TestLateAckOfMovedLane|TestLazyLaneDialFails)$'
  'host/dataplane/intranode|^(TestStreamWakeBackstop|TestStreamRings|TestPlacedCompletion|TestPlacedFailover)$'
)
if [ "$MODE" = negative ]; then
  SUITES=('host/dataplane/tcp|^TestStrandedAck$')
  export RMAW_NEGATIVE_CONTROL=rearm
fi
work=$(mktemp -d /tmp/soak-acks.XXXXXX)
for s in "${SUITES[@]}"; do
  pkg=${s%%|*}
  (cd "$ROOT" && go test -race -c -o "$work/$(basename "$pkg").test" "./$pkg") || exit 2
done
# runsuites runs every suite's tests once, its output in log; fails with
# the first suite that fails.
runsuites() {
  local log=$1 s pkg
  for s in "${SUITES[@]}"; do
    pkg=${s%%|*}
    (cd "$ROOT/$pkg" && timeout 600 "$work/$(basename "$pkg").test" -test.count=1 -test.run "${s#*|}" -test.timeout 590s >>"$log" 2>&1) || return 1
  done
}
hogs=()
for _ in 1 2; do
  sh -c 'while :; do :; done' &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
runs=0 fails=0 first=""
while [ "$(date +%s)" -lt "$end" ]; do
  runs=$((runs + 1))
  log=$work/run-$runs.log
  if ! runsuites "$log"; then
    fails=$((fails + 1))
    [ -z "$first" ] && first=$log
    [ "$MODE" = negative ] && break
  else
    rm -f "$log"
  fi
  echo "SOAK-ACKS run $runs: failures $fails ($(($(date +%s) - end + $(secs "$DUR"))) s)"
done
echo "SOAK-ACKS mode=${MODE:-soak} duration=$DUR runs=$runs failures=$fails load=$(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$first" ]; then
  echo "SOAK-ACKS first failure ($first):"
  grep -E "^(---|    ---|FAIL|panic)|never completed|\.go:[0-9]+:" "$first" | head -40
fi
if [ "$MODE" = negative ]; then
  [ "$fails" -gt 0 ] && { echo "SOAK-ACKS negative control failed, as it must"; exit 0; }
  echo "SOAK-ACKS negative control passed: the soak cannot see the bug"; exit 1
fi
[ "$fails" -eq 0 ]
