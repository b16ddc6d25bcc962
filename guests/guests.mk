# guests/guests.mk - build the guest backends (included by the top Makefile
# with `-include guests/guests.mk`; also usable alone: make -f guests/guests.mk guests).
#
#   make guests            every backend in its own folder: guests/<name>/<name>.c (C, with the
#                          SDK guests/c/rmaw.h) and guests/passthrough-go (Go, with the SDK
#                          guests/go/rmaw), each as build/guests/<name>.wasm
#   make guests-embedded   regenerate host/sandbox/embedded/default.wasm from
#                          guests/passthrough/passthrough.c (TestEmbeddedMatchesSource checks it)
#
# The C flags are defined once, in guests/buildflags/cflags.txt: the Go tests,
# the conformance kit and `rmaw new` read the same file.

GUEST_CLANG ?= clang
GUEST_GO ?= go
GUEST_OUT ?= build/guests
GUEST_CFLAGS := $(shell cat guests/buildflags/cflags.txt)
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

$(GUEST_OUT)/passthrough-go.wasm: $(wildcard guests/passthrough-go/*.go) $(GUEST_GO_SDK)
	@mkdir -p $(GUEST_OUT)
	GOOS=wasip1 GOARCH=wasm $(GUEST_GO) build -buildmode=c-shared -trimpath -ldflags="-s -w" -o $@ ./guests/passthrough-go

guests-embedded: guests/passthrough/passthrough.c $(GUEST_SDK_C) guests/buildflags/cflags.txt
	$(GUEST_CLANG) $(GUEST_CFLAGS) -I guests/c -o host/sandbox/embedded/default.wasm guests/passthrough/passthrough.c

guests-clean:
	rm -f $(GUEST_C_WASM) $(GUEST_GO_WASM)
