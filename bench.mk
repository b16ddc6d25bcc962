# bench.mk - the benchmark (included by the top Makefile with `-include bench.mk`;
# also usable alone: make -f bench.mk bench-run).
#
#   make bench-run          full run (7 repetitions; about 1-2 minutes on 2 cores)
#   make bench-run BENCH_FLAGS=-quick
#   make bench-run BENCH_FLAGS="-quick -series ping,rate"   (only some series: bw, rate, ping, cold)
#
# Builds build/rmabench from cmd/rmabench and runs it: two rank processes on
# this host measure the plugin runtime (TCP and intra-node transports, native,
# embedded and per-op-hook backends) next to raw TCP, process_vm_writev and
# memcpy measured between the same two processes. Writes
# $(BENCH_OUT)/results.csv and charts (bandwidth.svg, msgrate.svg and, with
# compression series, compression.svg and codecs.svg: internal/benchplot,
# gonum plot) and prints a table
# with ratios and targets. It reports numbers; it never fails on a timing.

BENCH_GO    ?= go
BENCH_OUT   ?= build/bench
BENCH_BIN   ?= build/rmabench
BENCH_FLAGS ?=

# The planner and Go-SDK guests come from guests/guests.mk; pull it in when
# this file is used on its own.
ifndef GUEST_OUT
-include guests/guests.mk
endif

.PHONY: bench-run bench-build

bench-build:
	@mkdir -p $(dir $(BENCH_BIN))
	$(BENCH_GO) build -o $(BENCH_BIN) ./cmd/rmabench

bench-run: bench-build guests
	@mkdir -p $(BENCH_OUT)
	./$(BENCH_BIN) -out $(BENCH_OUT) -guests $(or $(GUEST_OUT),build/guests) $(BENCH_FLAGS)
