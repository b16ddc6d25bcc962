#!/usr/bin/env bash
# Installs what `make test` needs beyond Go, gcc and make: clang and lld
# (C guests for wasm32), wabt (wat2wasm, for the sandbox's hostile test
# modules), binutils (readelf, nm: the library's exported symbols),
# Debian's HIP runtime (the "runtime present, no AMD GPU" case) and
# libfabric: its headers to build host/fabric (the library dlopens
# libfabric.so.1 at run time, never links it) and fi_info plus the runtime
# for the fabric transport's tests over tcp;ofi_rxm and shm, and iproute2
# and util-linux (ip, tc, ss -K, nsenter: the namespace and fault tests). Run
# as root on Debian it installs what is missing, once; otherwise it stops
# and prints the command to run.
#
#   test/setup.sh --build   only what building the library needs (libfabric's
#                           headers): make all and make demo call it
set -euo pipefail
if [ "${1:-}" = "--build" ]; then
  [ -f /usr/include/rdma/fi_rma.h ] && exit 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing libfabric-dev (libfabric's headers: host/fabric's inline calls)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq libfabric-dev >/dev/null
    exit 0
  fi
  echo "setup: building the library needs libfabric's headers; run:  sudo apt-get update && sudo apt-get install -y libfabric-dev" >&2
  exit 1
fi
declare -A pkg=([clang]=clang [wasm-ld]=lld [wat2wasm]=wabt [readelf]=binutils [nm]=binutils [gcc]=gcc [fi_info]=libfabric-bin [ip]=iproute2 [ss]=iproute2 [tc]=iproute2 [nsenter]=util-linux)
missing=()
for tool in "${!pkg[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${pkg[$tool]}")
done
ldconfig -p 2>/dev/null | grep -q 'libamdhip64\.so' || missing+=(libamdhip64-5)
[ -f /usr/include/rdma/fi_rma.h ] || missing+=(libfabric-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
cmd="apt-get install -y ${missing[*]}"
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  exit 0
fi
echo "setup: make test needs ${missing[*]}; run:  sudo apt-get update && sudo $cmd" >&2
exit 1
