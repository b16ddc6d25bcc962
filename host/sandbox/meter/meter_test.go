package meter

import (
	"context"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

func TestRewriteRejectsNonModules(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"not wasm at all", "bad magic"},
		{"\x00asm\x02\x00\x00\x00", "unsupported WebAssembly binary version"},
		{"\x00asm", "bad magic"},
	} {
		if _, err := Rewrite([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Rewrite(%q) = %v, want an error containing %q", c.in, err, c.want)
		}
	}
}

// The rewritten default guest still compiles.
func TestRewriteDefaultGuestCompiles(t *testing.T) {
	out, err := Rewrite(defaultWasm(t))
	if err != nil {
		t.Fatal(err)
	}
	compile(t, out)
}

// Even an empty module gets the fuel global, exported as a mutable i64 that
// the host can set.
func TestRewriteExportsFuel(t *testing.T) {
	out, err := Rewrite([]byte("\x00asm\x01\x00\x00\x00"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	mod, err := rt.Instantiate(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := mod.ExportedGlobal(FuelExport).(api.MutableGlobal)
	if !ok || g.Type() != api.ValueTypeI64 {
		t.Fatalf("%s is %v, want a mutable i64", FuelExport, mod.ExportedGlobal(FuelExport))
	}
	g.Set(42)
	if g.Get() != 42 {
		t.Fatalf("%s = %d after Set(42)", FuelExport, g.Get())
	}
}
