package meter

import (
	"context"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
)

// module assembles a module from (id, body) pairs.
func module(secs ...section) []byte {
	b := []byte("\x00asm\x01\x00\x00\x00")
	for _, s := range secs {
		b = append(b, s.id)
		b = appendU32(b, uint32(len(s.body)))
		b = append(b, s.body...)
	}
	return b
}

// oneFunc is a type section with () -> () and a function section with one
// function of it.
var oneFunc = []section{{1, []byte{1, 0x60, 0, 0}}, {3, []byte{1, 0}}}

func withLocals(n uint32) []byte {
	body := appendU32([]byte{1}, n) // one declaration of n locals
	body = append(body, 0x7f, 0x0b) // i32; end
	code := appendU32([]byte{1}, uint32(len(body)))
	return module(append(oneFunc, section{10, append(code, body...)})...)
}

// Each of these modules is a few bytes long and names a count that a
// decoder sizing its slices from it would turn into gigabytes: Rewrite
// refuses them before wazero sees them.
func TestRewriteRefusesHugeCounts(t *testing.T) {
	huge := appendU32(nil, 0xffffffff)
	for _, c := range []struct {
		name string
		in   []byte
		want string
	}{
		{"locals", withLocals(0xffffffff), "locals"},
		{"locals over the limit", withLocals(MaxLocals + 1), "locals"},
		{"globals", module(section{6, huge}), "global count"},
		// the seed the fuzzer's hang detector stopped on
		{"globals, fuzz seed", []byte("\x00asm\x01\x00\x00\x00\x06\x06\xe4\xe4\xe4000"), "global count"},
		{"element segments", module(section{9, huge}), "element segment count"},
		{"elements", module(section{9, append([]byte{1, 0, 0x41, 0, 0x0b}, huge...)}), "element count"},
		{"element expressions", module(section{9, append([]byte{1, 5, 0x70}, huge...)}), "element count"},
		{"data segments", module(section{11, huge}), "data segment count"},
		{"data bytes", module(section{11, append([]byte{1, 1}, huge...)}), "data byte count"},
		{"data bytes, active", module(section{11, append([]byte{1, 2, 0, 0x41, 0, 0x0b}, huge...)}), "data byte count"},
		{"tags", module(section{13, huge}), "tag count"},
		{"element flags", module(section{9, []byte{1, 8}}), "flags"},
		{"data flags", module(section{11, []byte{1, 3}}), "flags"},
	} {
		_, err := Rewrite(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Rewrite = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// MaxLocals itself is allowed, and the module still compiles.
func TestRewriteAllowsMaxLocals(t *testing.T) {
	out, err := Rewrite(withLocals(MaxLocals))
	if err != nil {
		t.Fatal(err)
	}
	compile(t, out)
}

// Well-formed element and data segments of every encoding pass.
func TestRewriteAllowsSegments(t *testing.T) {
	table := section{4, []byte{1, 0x70, 0, 4}}
	memory := section{5, []byte{1, 0, 1}}
	elems := section{9, []byte{4,
		0, 0x41, 0, 0x0b, 1, 0, // active, table 0, function indexes
		1, 0, 1, 0, // passive, elemkind, function indexes
		4, 0x41, 1, 0x0b, 1, 0xd2, 0, 0x0b, // active, expressions
		5, 0x70, 2, 0xd2, 0, 0x0b, 0xd0, 0x70, 0x0b, // passive, reftype, expressions
	}}
	data := section{11, []byte{2, 0, 0x41, 0, 0x0b, 3, 'a', 'b', 'c', 1, 2, 'x', 'y'}}
	code := section{10, []byte{1, 2, 0, 0x0b}}
	in := module(oneFunc[0], oneFunc[1], table, memory, elems, section{12, []byte{2}}, code, data)
	out, err := Rewrite(in)
	if err != nil {
		t.Fatal(err)
	}
	compile(t, out)
}

// A name section whose counts overrun it is dropped (names only label
// backtraces); a well-formed one is kept.
func TestRewriteNameSection(t *testing.T) {
	names := func(sub ...byte) section {
		return section{0, append(append([]byte{4}, "name"...), sub...)}
	}
	good := names(1, 5, 1, 0, 2, 'f', 'n') // function 0 is "fn"
	bad := names(append([]byte{1, 5}, appendU32(nil, 0xffffffff)...)...)
	badLocals := names(2, 4, 1, 0, 0xff, 0x7f)
	for _, c := range []struct {
		name string
		sec  section
		keep bool
	}{{"good", good, true}, {"huge function count", bad, false}, {"huge local count", badLocals, false}} {
		in := module(oneFunc[0], oneFunc[1], section{10, []byte{1, 2, 0, 0x0b}}, c.sec)
		out, err := Rewrite(in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if kept := strings.Contains(string(out), "\x04name"); kept != c.keep {
			t.Errorf("%s: name section kept = %v, want %v", c.name, kept, c.keep)
		}
		compile(t, out)
	}
}

func compile(t *testing.T, wasm []byte) {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	m, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	m.Close(ctx)
}
