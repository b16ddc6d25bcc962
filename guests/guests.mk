# guests/guests.mk - build the guest backends (included by the top Makefile
# with `-include guests/guests.mk`; also usable alone: make -f guests/guests.mk guests).
#
#   make guests            every backend in its own folder: guests/<name>/<name>.c (C, with the
#                          SDK guests/c/rmaw.h) and guests/passthrough-go (Go, with the SDK
#                          guests/go/rmaw), each as build/guests/<name>.wasm
#   make guests-embedded   regenerate host/sandbox/embedded/default.wasm from
#                          guests/passthrough/passthrough.c (TestEmbeddedMatchesSource checks it)
#
# The guest build flags are defined once, in guests/buildflags: cflags.txt (C),
# goenv.txt and goflags.txt (Go); the Go tests, the conformance kit and the
# `rmaw new` Makefiles read the same files.

GUEST_CLANG ?= clang
GUEST_GO ?= go
GUEST_OUT ?= build/guests
GUEST_CFLAGS := $(shell cat guests/buildflags/cflags.txt)
GUEST_GOENV := $(shell cat guests/buildflags/goenv.txt)
GUEST_GOFLAGS := $(shell cat guests/buildflags/goflags.txt)
GUEST_SDK_C := guests/c/rmaw.h
GUEST_GO_SDK := $(wildcard guests/go/rmaw/*.go) $(wildcard abi/guestabi/*.go)

GUEST_C_SRCS := $(wildcard guests/*/*.c)
GUEST_C_WASM := $(patsubst %,$(GUEST_OUT)/%.wasm,$(basename $(notdir $(GUEST_C_SRCS))))
GUEST_GO_WASM := $(GUEST_OUT)/passthrough-go.wasm

.PHONY: guests guests-embedded guests-clean

guests: $(GUEST_C_WASM) $(GUEST_GO_WASM)

# guests/<name>/<name>.c -> build/guests/<name>.wasm (the stem twice needs a
# second expansion of the prerequisites).
.SECONDEXPANSION:
$(GUEST_OUT)/%.wasm: guests/$$*/$$*.c $(GUEST_SDK_C) guests/buildflags/cflags.txt
	@mkdir -p $(GUEST_OUT)
	$(GUEST_CLANG) $(GUEST_CFLAGS) -I guests/c -o $@ $<

$(GUEST_OUT)/passthrough-go.wasm: $(wildcard guests/passthrough-go/*.go) $(GUEST_GO_SDK) guests/buildflags/goenv.txt guests/buildflags/goflags.txt
	@mkdir -p $(GUEST_OUT)
	$(GUEST_GOENV) $(GUEST_GO) build $(GUEST_GOFLAGS) -o $@ ./guests/passthrough-go

guests-embedded: guests/passthrough/passthrough.c $(GUEST_SDK_C) guests/buildflags/cflags.txt
	$(GUEST_CLANG) $(GUEST_CFLAGS) -I guests/c -o host/sandbox/embedded/default.wasm guests/passthrough/passthrough.c

guests-clean:
	rm -f $(GUEST_C_WASM) $(GUEST_GO_WASM)
