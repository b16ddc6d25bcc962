# guests/guests.mk - build the guest backends (included by the top Makefile
# with `-include guests/guests.mk`; also usable alone: make -f guests/guests.mk guests).
#
#   make guests            build/guests/{passthrough,planner,plan11,passthrough-go}.wasm and the
#                          sample backends guests/<name>/<name>.c (multirail, chaos, shaper,
#                          telemetry, ...) as build/guests/<name>.wasm
#   make guests-embedded   regenerate host/sandbox/embedded/default.wasm from
#                          guests/c/passthrough.c (TestEmbeddedMatchesSource checks it)
#
# GUEST_CFLAGS must stay byte-for-byte what host/sandbox/embedded_test.go uses
# (the test checks this line), so the committed default.wasm is reproducible.

GUEST_CLANG ?= clang
GUEST_GO ?= go
GUEST_OUT ?= build/guests
GUEST_CFLAGS = --target=wasm32 -O2 -ffreestanding -nostdlib -fno-builtin -Wall -Wextra -Werror -Wl,--no-entry -Wl,--strip-all

GUEST_C_SRCS := $(wildcard guests/c/*.c)
GUEST_C_WASM := $(patsubst guests/c/%.c,$(GUEST_OUT)/%.wasm,$(GUEST_C_SRCS))
GUEST_GO_SDK := $(wildcard guests/go/rmaw/*.go) $(wildcard abi/guestabi/*.go)

# Sample backends: one directory each, guests/<name>/<name>.c with a README.md.
GUEST_SAMPLE_SRCS := $(filter-out guests/c/% guests/go/%,$(wildcard guests/*/*.c))
GUEST_SAMPLES := $(basename $(notdir $(GUEST_SAMPLE_SRCS)))
GUEST_SAMPLE_WASM := $(patsubst %,$(GUEST_OUT)/%.wasm,$(GUEST_SAMPLES))

.PHONY: guests guests-embedded guests-clean

guests: $(GUEST_C_WASM) $(GUEST_SAMPLE_WASM) $(GUEST_OUT)/passthrough-go.wasm

define guest_sample_rule
$(GUEST_OUT)/$(1).wasm: guests/$(1)/$(1).c guests/c/rmaw.h
	@mkdir -p $(GUEST_OUT)
	$(GUEST_CLANG) $(GUEST_CFLAGS) -I guests/c -o $$@ $$<
endef
$(foreach s,$(GUEST_SAMPLES),$(eval $(call guest_sample_rule,$(s))))

$(GUEST_OUT)/%.wasm: guests/c/%.c guests/c/rmaw.h
	@mkdir -p $(GUEST_OUT)
	$(GUEST_CLANG) $(GUEST_CFLAGS) -o $@ $<

$(GUEST_OUT)/passthrough-go.wasm: $(wildcard guests/go/passthrough/*.go) $(GUEST_GO_SDK)
	@mkdir -p $(GUEST_OUT)
	GOOS=wasip1 GOARCH=wasm $(GUEST_GO) build -buildmode=c-shared -trimpath -ldflags="-s -w" -o $@ ./guests/go/passthrough

guests-embedded: guests/c/passthrough.c guests/c/rmaw.h
	$(GUEST_CLANG) $(GUEST_CFLAGS) -o host/sandbox/embedded/default.wasm guests/c/passthrough.c

guests-clean:
	rm -f $(GUEST_C_WASM) $(GUEST_SAMPLE_WASM) $(GUEST_OUT)/passthrough-go.wasm
