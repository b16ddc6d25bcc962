package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHelloSample runs samples/hello_rma.c, the example a plugin user reads
// first: it must keep working as the plugin changes.
func TestHelloSample(t *testing.T) {
	root := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "build/hello_rma"), filepath.Join(root, "build/librccl-rma-wasm.so"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil || !strings.Contains(text, "hello_rma: PASS") || !strings.Contains(text, "message intact") {
		t.Fatalf("hello_rma failed (%v):\n%s", err, text)
	}
}
