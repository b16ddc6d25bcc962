# rccl-rma-wasm build. All outputs go to build/.
#
#   make          build/librccl-rma-wasm.so (+ libnccl-rma-wasm.so symlink), build/rma_driver
#                 (the test harness, test/harness/), build/hello_rma (samples/hello_rma.c) and
#                 build/rmaw (cmd/rmaw: validate, inspect, new, test, bench for backend authors)
#   make demo     run the harness: 4 ranks, table v15, with a summary of what happened
#   make test     installs missing Debian tools (test/setup.sh), then gofmt, go vet,
#                 staticcheck, go test -race (abi, host, capi, cmd, guests) and the multi-process tests (test/)
#   make soak     hours of churn in SOAKTIME minutes: random shapes, killed, stopped and reset
#                 ranks, failing guests; every byte verified (not in CI)
#   make bench    benchmarks (bench.mk): ratios against raw TCP, process_vm_writev, memcpy;
#                 make bench-pingpong: the C-driven 8-byte put+signal ping-pong against raw TCP
#   make install  PREFIX=/usr/local DESTDIR=: the library and its NCCL-name link under lib/, rmaw
#                 under bin/, the sample backends under share/rccl-rma-wasm/backends/, the docs under
#                 share/doc/rccl-rma-wasm/ (docs/guide/install-and-build.md); make uninstall removes them
#   make docs     regenerate docs/guide/variables.md from host/config (a test checks it is current)
#   make clean

GO      ?= go
CC      ?= gcc
BUILD   := build
LIB     := $(BUILD)/librccl-rma-wasm.so
LIBNCCL := $(BUILD)/libnccl-rma-wasm.so
DRIVER  := $(BUILD)/rma_driver
HELLO   := $(BUILD)/hello_rma
RMAW    := $(BUILD)/rmaw
# The conformance and stress harness, split by concern (see test/harness/harness.h).
HARNESS_SRC := $(addprefix test/harness/,main.c bootstrap.c plugin.c rank.c scenarios.c pingpong.c)

GOFLAGS_LIB ?= -trimpath
# The build's version and commit, linked into host/version (the plugin's init
# line and rmaw version say them; Go's own VCS stamp is used where present,
# but GOFLAGS=-buildvcs=false and archives without .git have none).
MODULE  := github.com/rccl-rma-wasm/rccl-rma-wasm
VERSION ?= $(shell git describe --always --dirty --tags 2>/dev/null || echo devel)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS_VERSION := -X $(MODULE)/host/version.Version=$(VERSION) -X $(MODULE)/host/version.Commit=$(COMMIT)
CFLAGS_DRIVER ?= -O2 -Wall -Wextra -Werror -pthread

# ---------------------------------------------------------------------------
# Guests (.wasm backends). The guests/sandbox owner defines them in
# guests/guests.mk: append the .wasm files the library embeds or the tests
# need to GUESTS, and add their rules there. The library is rebuilt after them.
GUESTS :=
.DEFAULT_GOAL := all
-include guests/guests.mk
# The benchmark owner's rules (bench-run, bench-build).
-include bench.mk
# ---------------------------------------------------------------------------

.PHONY: all lib driver tools demo test setup build-deps bench bench-pingpong bench-device bench-scale clean gofmt-check gpu-check gpu-check-full fuzz soak soak-acks soak-acks-negative \
	install uninstall docs

# Pinned so that a new release never turns a green tree red on its own.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

all: lib driver tools

tools: $(RMAW)

# The backend authors' tool; go build is incremental.
$(RMAW): FORCE | $(BUILD)
	$(GO) build -ldflags "$(LDFLAGS_VERSION)" -o $@ ./cmd/rmaw

lib: $(LIB) $(LIBNCCL)

# go build is incremental on its own; always ask it.
$(LIB): FORCE $(GUESTS) | $(BUILD) build-deps
	$(GO) build -buildmode=c-shared $(GOFLAGS_LIB) -ldflags "$(LDFLAGS_VERSION)" -o $@.tmp ./capi
	@rm -f $@.h $(BUILD)/librccl-rma-wasm.h   # cgo's generated header; capi/rma_plugin.h is ours
	@mv -f $@.tmp $@   # rename: running processes keep the old mapping

# NCCL resolves NCCL_RMA_PLUGIN=wasm to libnccl-rma-wasm.so (RCCL: librccl-rma-wasm.so).
$(LIBNCCL): $(LIB)
	ln -sf librccl-rma-wasm.so $@

driver: $(DRIVER) $(HELLO) $(BUILD)/cuda_check $(BUILD)/staging_bench $(BUILD)/hoptrace

$(DRIVER): $(HARNESS_SRC) test/harness/harness.h capi/rma_plugin.h | $(BUILD)
	$(CC) $(CFLAGS_DRIVER) -Icapi -o $@ $(HARNESS_SRC) -ldl

# The short example a plugin user reads first.
$(HELLO): samples/hello_rma.c capi/rma_plugin.h | $(BUILD)
	$(CC) $(CFLAGS_DRIVER) -Icapi -o $@ samples/hello_rma.c -ldl

# The GPU test programs (test/gpu/) share one rank set-up (gpu_rank.c).
GPU_RANK := test/gpu/gpu_rank.c test/gpu/gpu_rank.h

# Device-memory check for a machine with an NVIDIA GPU (dlopens libcuda.so.1).
$(BUILD)/cuda_check: test/gpu/cuda_check.c $(GPU_RANK) capi/rma_plugin.h | $(BUILD)
	$(CC) $(CFLAGS_DRIVER) -Icapi -o $@ test/gpu/cuda_check.c test/gpu/gpu_rank.c -ldl

# Staging throughput against pinned-copy and wire bounds (test/gpu/staging_bench.sh).
$(BUILD)/staging_bench: test/gpu/staging_bench.c $(GPU_RANK) capi/rma_plugin.h | $(BUILD)
	$(CC) $(CFLAGS_DRIVER) -Icapi -o $@ test/gpu/staging_bench.c test/gpu/gpu_rank.c -ldl

# Reads a GPU ping-pong's trace (test/gpu/nccl_gin_check.sh, PP_TRACE=1).
$(BUILD)/hoptrace: FORCE | $(BUILD)
	$(GO) build -o $@ ./test/gpu/hoptrace

$(BUILD):
	mkdir -p $@

demo: all
	./$(DRIVER) --lib $(LIB) --ranks 4 --version 15 --summary

gofmt-check:
	@out="$$(gofmt -l $$(find . -name '*.go' -not -path './build/*' -not -path './.git/*'))"; \
	if [ -n "$$out" ]; then echo "gofmt needs to run on:"; echo "$$out"; exit 1; fi

# clang, lld, wabt, libfabric: installed once when run as root on Debian, else the
# exact command is printed and make stops.
setup:
	@test/setup.sh

# Building needs libfabric's headers (host/fabric's inline calls; the library
# itself is dlopened at run time): installed once as root on Debian.
build-deps:
	@test/setup.sh --build

# Each fuzz target runs briefly in make test: a count of inputs, not a
# duration, because Go 1.26's fuzz coordinator can report a spurious
# "context deadline exceeded" when a duration ends under load
# (golang/go#75804). Longer: make fuzz FUZZTIME=10m (or 5000000x).
FUZZTIME ?= 30000x
FUZZ_TARGETS := host/wire:FuzzHeader host/wire:FuzzDecodeHandle host/ring:FuzzRing host/seqorder:FuzzOrderer host/codec:FuzzDecodeBlock \
	host/handshake:FuzzHello host/handshake:FuzzAuthenticate \
	host/sandbox/meter:FuzzMeter

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run XXX -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$pkg || exit 1; \
	done

# Churn: random shapes and faults through the harness for SOAKTIME (not in CI;
# test/soak/main.go says what it does). make soak SOAKTIME=30m
SOAKTIME ?= 3m
soak: all guests
	$(GO) run ./test/soak -duration $(SOAKTIME) -root .

# The acknowledgement soak (not in CI): the ack and lane-failover tests
# looped under -race with two CPU hogs for SOAKTIME; soak-acks-negative is
# its control (the re-arm of owed acks switched off: it must fail).
soak-acks:
	test/soak/acks.sh $(SOAKTIME)
soak-acks-negative:
	test/soak/acks.sh $(SOAKTIME) negative

test: setup all gofmt-check
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) test -race -count=1 ./abi/... ./host/... ./capi/... ./cmd/... ./guests/... ./internal/...
	$(GO) test ./test/... -count=1 -timeout 30m
	@$(MAKE) --no-print-directory fuzz

# Go micro-benchmarks of the runtime, then the two-process benchmark from
# bench.mk when it is present (the bench owner may replace this target).
bench: all
	$(GO) test -run XXX -bench . ./host/...
	@if [ -f bench.mk ]; then $(MAKE) --no-print-directory bench-run; fi
	@$(MAKE) --no-print-directory bench-pingpong
	@$(MAKE) --no-print-directory bench-device

# The 8-byte put+signal ping-pong driven as NCCL's proxy thread drives the
# plugin (C thread: rmaProgress, test(), sched_yield), TCP forced, beside raw
# TCP between the same two processes (blocking read, and polling as the
# plugin's waiter does); medians over alternating blocks, PINGPONG_RUNS runs.
# It reports numbers; it never fails on a timing.
PINGPONG_RUNS ?= 3
bench-pingpong: driver lib
	@for i in $$(seq $(PINGPONG_RUNS)); do \
	  NCCL_RMA_WASM_ADDR=127.0.0.1 $(DRIVER) --scenario pingpong --blocks 9 --iters 2000 | grep -E '^(PINGPONG|RESULT)' || exit 1; \
	done; echo "bench-pingpong: load $$(cat /proc/loadavg)"

# The device-memory series (issue: staging against the pinned-copy and wire
# bounds, signal latency in device memory) needs an NVIDIA GPU; elsewhere it
# says so and skips. On a GPU machine without Go: test/gpu/staging_bench.sh.
# With NCCL_SRC (an NVIDIA NCCL >= 2.30 source archive or tree) it also runs
# the small-operation series through NCCL itself, under CUDA MPS where
# available: host_rma's 8 B / 4 KiB / 64 KiB put+signal exchanges beside
# NCCL's send/recv, and the GIN alltoall GIN_ITERS kernels back to back at
# 64 B, 4 KiB and 256 KiB per peer (us per alltoall).
bench-device: driver lib
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  test/gpu/staging_bench.sh; \
	  if [ -n "$(NCCL_SRC)" ]; then GIN_ITERS=200 test/gpu/nccl_gin_check.sh $(NCCL_SRC) 0; \
	  else echo "bench: NCCL small-operation series skipped: set NCCL_SRC to an NVIDIA NCCL source archive or tree"; fi; \
	else \
	  echo "bench: device-memory series skipped: no NVIDIA GPU on this machine (nvidia-smi -L failed);"; \
	  echo "       run 'make bench' or test/gpu/staging_bench.sh on a GPU machine for them"; \
	fi

# One rank against 256 and 1,024 peers in four helper processes on
# loopback (host/dataplane/scale_test.go): connect time, CPU, descriptors
# and RSS per peer, the figures of SPEC.md "Limits up to 4,096 ranks".
bench-scale:
	$(GO) test -count=1 -run XXX -bench '^BenchmarkScale$$' -benchtime 1x ./host/dataplane

# The real-NCCL check, on a machine with an NVIDIA GPU, nvcc and MPI (not CI):
#   make gpu-check NCCL_SRC=path/to/nccl-v2.30.7.tar.gz (or a source tree)
# NCCL built with ONLY_FUNCS=SendRecv, then cuda_check, host_rma and the GIN
# alltoalls with the device agent off and on, staging_bench's kernel-watched
# series, compute-sanitizer, and one summary table (test/gpu/agent_check.sh;
# about 4 minutes on an H100 with 16 cores). Go is not needed there: what `make` built
# into build/ is used as it is. gpu-check-full is the longer check with
# every reference run and NCCL's own GIN example GIN_RUNS times.
NCCL_SRC ?= $(wildcard $(BUILD)/nccl-src.tar.gz)
GIN_RUNS ?= 20
gpu-check:
	@test -n "$(NCCL_SRC)" || { echo "set NCCL_SRC to an NVIDIA NCCL (>= 2.30) source archive or tree"; exit 2; }
	@test -f $(BUILD)/librccl-rma-wasm.so -a -x $(BUILD)/cuda_check -a -x $(BUILD)/staging_bench || $(MAKE) all
	test/gpu/agent_check.sh $(BUILD)/gpu-check $(NCCL_SRC)

gpu-check-full: all
	@test -n "$(NCCL_SRC)" || { echo "set NCCL_SRC to an NVIDIA NCCL (>= 2.30) source archive or tree"; exit 2; }
	test/gpu/nccl_gin_check.sh $(NCCL_SRC) $(GIN_RUNS)

# ---------------------------------------------------------------------------
# Installation. make install PREFIX=/usr/local DESTDIR=/tmp/stage; make
# uninstall with the same two removes exactly the files install wrote (and
# the directories of our own that are left empty). test/install_test.go
# checks both.
PREFIX  ?= /usr/local
DESTDIR ?=
LIBDIR     := $(DESTDIR)$(PREFIX)/lib
BINDIR     := $(DESTDIR)$(PREFIX)/bin
BACKENDDIR := $(DESTDIR)$(PREFIX)/share/rccl-rma-wasm/backends
DOCDIR     := $(DESTDIR)$(PREFIX)/share/doc/rccl-rma-wasm
# The docs: the top-level pages and docs/ as it is laid out.
DOC_TOP   := README.md SPEC.md RATIONALE.md CHANGELOG.md
DOC_PAGES := $(shell find docs -name '*.md' 2>/dev/null | sort)
INSTALL_BACKENDS := $(GUEST_C_WASM) $(GUEST_GO_WASM)

install: lib tools guests
	install -d $(LIBDIR) $(BINDIR) $(BACKENDDIR) $(DOCDIR)
	install -m 0755 $(LIB) $(LIBDIR)/librccl-rma-wasm.so
	ln -sf librccl-rma-wasm.so $(LIBDIR)/libnccl-rma-wasm.so
	install -m 0755 $(RMAW) $(BINDIR)/rmaw
	install -m 0644 $(INSTALL_BACKENDS) $(BACKENDDIR)/
	install -m 0644 $(DOC_TOP) $(DOCDIR)/
	@for f in $(DOC_PAGES); do install -D -m 0644 $$f $(DOCDIR)/$$f || exit 1; done

uninstall:
	rm -f $(LIBDIR)/librccl-rma-wasm.so $(LIBDIR)/libnccl-rma-wasm.so $(BINDIR)/rmaw
	rm -f $(addprefix $(BACKENDDIR)/,$(notdir $(INSTALL_BACKENDS)))
	rm -f $(addprefix $(DOCDIR)/,$(DOC_TOP) $(DOC_PAGES))
	@for d in $$(cd $(DOCDIR) 2>/dev/null && find docs -depth -type d); do rmdir $(DOCDIR)/$$d 2>/dev/null || true; done
	-@rmdir $(DOCDIR) $(BACKENDDIR) $(DESTDIR)$(PREFIX)/share/rccl-rma-wasm 2>/dev/null || true

# docs/guide/variables.md is generated from host/config's declarations.
docs:
	$(GO) run ./host/config/gendoc -o docs/guide/variables.md

clean:
	rm -rf $(BUILD)

FORCE:
