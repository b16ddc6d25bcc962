#!/usr/bin/env bash
# Native stacks of every process whose command line matches a pattern, for
# a run that hangs: cuda-gdb attaches (it debugs host code too; the GPU
# images carry no gdb) and prints each thread's stack, libcuda's exported
# calls named. Bounded: a stuck attach is killed after HANG_DUMP_S
# seconds (45).
#
#   test/gpu/hang_dump.sh <pgrep -f pattern> [outfile]
pat=$1
out=${2:-/dev/stdout}
dbg=$(command -v cuda-gdb || command -v gdb) || { echo "hang_dump: no cuda-gdb or gdb" >>"$out"; exit 0; }
for pid in $(pgrep -f "$pat"); do
  [ "$pid" = $$ ] && continue
  {
    echo "=== pid $pid: $(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | cut -c1-200)"
    timeout -k 5 "${HANG_DUMP_S:-45}" "$dbg" -q -batch -nx -p "$pid" -ex "set pagination off" -ex "info threads" \
      -ex "thread apply all bt 16" 2>&1 | grep -v "^\[New LWP\|^warning: .*debug\|^Reading symbols"
  } >>"$out"
done
