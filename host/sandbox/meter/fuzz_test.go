package meter

import (
	"context"
	"os"
	"testing"

	"github.com/tetratelabs/wazero"
)

// FuzzMeter feeds the metering rewriter arbitrary bytes, as a hostile or
// broken backend file would. It must never panic, and a module that wazero
// accepts must still be accepted after metering.
func FuzzMeter(f *testing.F) {
	def := defaultWasm(f)
	f.Add(def)
	f.Add(def[:len(def)/2])
	f.Add([]byte("\x00asm\x01\x00\x00\x00"))
	f.Add([]byte("not wasm at all"))
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter().WithMemoryLimitPages(64))
	defer rt.Close(ctx)
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Rewrite(in)
		if err != nil {
			return
		}
		orig, errIn := rt.CompileModule(ctx, in)
		if errIn != nil {
			return // invalid input; the rewriter may pass it through, wazero rejects it later
		}
		orig.Close(ctx)
		m, errOut := rt.CompileModule(ctx, out)
		if errOut != nil {
			t.Fatalf("metering broke a valid module: %v", errOut)
		}
		m.Close(ctx)
	})
}

// defaultWasm is the sandbox's embedded default backend, a real C guest.
func defaultWasm(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile("../embedded/default.wasm")
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
