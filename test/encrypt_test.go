package test

import (
	"regexp"
	"testing"
)

// TestEncryptedRanks runs the harness across processes with every TCP
// stream sealed (NCCL_RMA_WASM_ENCRYPT=1), intra-node path off so all
// payloads cross the sealed streams: every byte is verified by the ranks,
// and a rank killed mid-run is reported, as in clear.
func TestEncryptedRanks(t *testing.T) {
	env := []string{"NCCL_RMA_WASM_ENCRYPT=1", "NCCL_RMA_WASM_INTRANODE=0"}
	runDriver(t, append(env, "NCCL_RMA_WASM_LANES=2"), "--ranks", "3", "--size", "4194304", "--iters", "2")
	runDriver(t, env, "--ranks", "3", "--scenario", "kill", "--kill-rank", "2", "--iters", "2", "--timeout", "60")
}

// TestEncryptDeclinesFabric: asked for libfabric and for encryption, the
// ranks use TCP (a provider's RMA writes would bypass the seal).
func TestEncryptDeclinesFabric(t *testing.T) {
	needFabric(t)
	out := runDriver(t, append(fabricEnv("tcp;ofi_rxm"), "NCCL_RMA_WASM_ENCRYPT=1"), "--verbose", "--ranks", "2", "--iters", "2")
	for _, m := range regexp.MustCompile(`rank \d+ reaches (\d+) ranks over libfabric`).FindAllStringSubmatch(out, -1) {
		if m[1] != "0" {
			t.Fatalf("an encrypting rank used libfabric: %q\n%s", m[0], tail(out))
		}
	}
	checkNoFabric := regexp.MustCompile(`rank \d+ connected to 2 ranks`)
	if !checkNoFabric.MatchString(out) {
		t.Fatalf("no connect line:\n%s", tail(out))
	}
}
