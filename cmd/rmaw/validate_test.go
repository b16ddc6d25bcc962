package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// parts of a minimal valid module; a case replaces or deletes some.
var baseParts = map[string]string{
	"memory": `(memory (export "memory") 1)`,
	"area":   `(data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")`,
	"marker": `(func (export "rmaw_abi_v1"))`,
	"init":   `(func (export "rmaw_init") (param i64) (result i64) i64.const 0)`,
	"areafn": `(func (export "rmaw_area") (result i32) i32.const 1024)`,
}

var partOrder = []string{"imports", "memory", "area", "marker", "init", "areafn", "extra"}

func module(over map[string]string) string {
	p := map[string]string{}
	for k, v := range baseParts {
		p[k] = v
	}
	for k, v := range over {
		p[k] = v
	}
	var b strings.Builder
	b.WriteString("(module\n")
	for _, k := range partOrder {
		if p[k] != "" {
			b.WriteString("  " + p[k] + "\n")
		}
	}
	b.WriteString(")\n")
	return b.String()
}

// areaHeader builds the data segment of an area at 1024 with the given
// magic, version, size and completion capacity (little-endian).
func areaHeader(magic, version, size, ccap uint32) string {
	var b strings.Builder
	for _, v := range []uint32{magic, version, size, ccap} {
		for i := 0; i < 4; i++ {
			b.WriteString("\\")
			b.WriteString(strings.ToLower(strings.TrimPrefix(hex2(byte(v>>(8*i))), "0x")))
		}
	}
	return `(data (i32.const 1024) "` + b.String() + `")`
}

func hex2(x byte) string {
	const d = "0123456789abcdef"
	return string([]byte{d[x>>4], d[x&15]})
}

// TestValidateRules: one hostile module per rule; validate must fail with
// the rule named and a fix that says what to change.
func TestValidateRules(t *testing.T) {
	const magic, minSize = 0x57414d52, 0x2d0
	cases := []struct {
		name     string
		over     map[string]string
		want     string // in the FAIL line
		fix      string // in the fix line
		memoryMB string
	}{
		{"no-marker", map[string]string{"marker": ""}, `missing export "rmaw_abi_v1"`, "RMAW_ABI_V1()", ""},
		{"abi-v2-only", map[string]string{"marker": `(func (export "rmaw_abi_v2"))`}, "declares Guest ABI v2", "export rmaw_abi_v1 as well", ""},
		{"no-init", map[string]string{"init": ""}, `missing export "rmaw_init"`, "int64_t rmaw_init(int64_t host_features)", ""},
		{"no-area", map[string]string{"areafn": ""}, `missing export "rmaw_area"`, "RMAW_DEFINE_AREA", ""},
		{"init-signature", map[string]string{"init": `(func (export "rmaw_init") (param i32) (result i32) i32.const 0)`}, `export "rmaw_init" has type (i32) -> (i32)`, "SPEC.md §8.2", ""},
		{"optional-signature", map[string]string{"extra": `(func (export "rmaw_plan_op") (param i32) (result i32) i32.const 0)`}, `export "rmaw_plan_op" has type`, "SPEC.md §8.2", ""},
		{"import-module", map[string]string{"imports": `(import "env" "puts" (func (param i32) (result i32)))`}, "imports env.puts", "only rmaw.log, rmaw.get_config and wasi_snapshot_preview1", ""},
		{"import-name", map[string]string{"imports": `(import "rmaw" "sleep" (func (param i32)))`}, "imports rmaw.sleep", "only rmaw.log", ""},
		{"import-signature", map[string]string{"imports": `(import "rmaw" "log" (func (param i32) (result i32)))`}, "import rmaw.log has type", "signature the host provides", ""},
		{"wasi-unknown", map[string]string{"imports": `(import "wasi_snapshot_preview1" "thread_spawn" (func (param i32) (result i32)))`}, "wasi_snapshot_preview1.thread_spawn", "only rmaw.log", ""},
		{"no-memory", map[string]string{"memory": `(memory 1)`}, `missing export "memory"`, "--import-memory", ""},
		{"imported-memory", map[string]string{"memory": "", "imports": `(import "env" "memory" (memory 1))`, "extra": `(export "memory" (memory 0))`}, "imports memory env.memory", "--import-memory", ""},
		{"memory-over-cap", map[string]string{"memory": `(memory (export "memory") 200)`}, "memory", "initial memory", "8"},
		{"area-unaligned", map[string]string{"areafn": `(func (export "rmaw_area") (result i32) i32.const 1028)`}, "not 8-byte aligned", "align the area", ""},
		{"area-outside", map[string]string{"areafn": `(func (export "rmaw_area") (result i32) i32.const 65000)`}, "outside linear memory", "inside linear memory", ""},
		{"area-magic", map[string]string{"area": areaHeader(0x12345678, 1, minSize, 0)}, "magic 0x12345678", `magic 0x57414d52`, ""},
		{"area-version", map[string]string{"area": areaHeader(magic, 2, minSize, 0)}, "version 2, want 1", "version to 1", ""},
		{"area-comp-cap", map[string]string{"area": areaHeader(magic, 1, 0x2d0+4097*32, 4097)}, "completion capacity 4097 exceeds 4096", "at most 4096", ""},
		{"area-size", map[string]string{"area": areaHeader(magic, 1, 0x100, 0)}, "smaller than the layout needs", "area_size covers the layout", ""},
		{"completions-no-ring", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) i64.const 2)`, "extra": `(func (export "rmaw_completions") (param i32 i32) (result i32) i32.const 0)`}, "completions enabled but the area holds no completion records", "RMAW_DEFINE_AREA(64)", ""},
		{"feature-not-offered", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) i64.const 1024)`}, "features 0x400 the host did not offer", "features & host_features", ""},
		{"plan-op-missing", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) i64.const 1)`}, "enabled plan_op but the module does not export", "export rmaw_plan_op", ""},
		{"completions-missing", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) i64.const 2)`}, "enabled completions but", "export rmaw_completions", ""},
		{"init-status", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) i64.const -1)`}, "rmaw_init failed with status -1", "configuration string", ""},
		{"init-loops", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) (loop br 0) i64.const 0)`}, "exceeded its time budget", "rmaw_init does not return", ""},
		{"init-traps", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) unreachable)`}, "rmaw_init trapped", "trapped", ""},
		{"reserved-export", map[string]string{"extra": `(global (export "__rmaw_fuel") (mut i64) (i64.const 0))`}, `reserved name "__rmaw_fuel"`, "belong to the host's metering", ""},
		{"too-many-tables", map[string]string{"extra": `(table 1 funcref) (table 1 funcref) (table 1 funcref) (table 1 funcref) (table 1 funcref)`}, "5 tables; the limit is 4", "at most 4 tables", ""},
		{"threads", map[string]string{"memory": `(memory (export "memory") 1 1 shared)`, "extra": `(func (export "x") (result i32) i32.const 0 i32.atomic.load)`}, "threads", "without threads", ""},
		{"chunk-without-plan-op", map[string]string{"init": `(func (export "rmaw_init") (param i64) (result i64) i64.const 4)`}, "without plan_op", "enable RMAW_FEATURE_PLAN_OP too", ""},
		{"devices-none", map[string]string{"extra": `(func (export "rmaw_devices") (param i32) (result i32) i32.const 0)`}, "rmaw_devices returned 0 devices", "1..max devices", ""},
		{"devices-empty-name", map[string]string{"extra": `(func (export "rmaw_devices") (param i32) (result i32) i32.const 1)`}, "empty name", "non-empty name", ""},
		{"ctx-open-refuses", map[string]string{"extra": `(func (export "rmaw_ctx_open") (param i32 i64 i32 i32 i32) (result i32) i32.const -2)`}, "rmaw_ctx_open returned status -2", "return 0 for a context", ""},
		{"conn-plan-lanes", map[string]string{"extra": `(func (export "rmaw_conn_plan") (param i32 i32) (result i32) i32.const 1072 i32.const 99 i32.store i32.const 0)`}, "lanes 99 outside 1..8", "lanes 1..8", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := watModule(t, c.name, module(c.over))
			args := []string{"validate"}
			if c.memoryMB != "" {
				args = append(args, "-memory-mb", c.memoryMB)
			}
			rc, out, _ := rmaw(t, append(args, path)...)
			if rc != 1 {
				t.Fatalf("exit status %d, want 1:\n%s", rc, out)
			}
			var failLine, fixLine string
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "FAIL ") {
					failLine = l
				}
				if strings.HasPrefix(strings.TrimSpace(l), "fix: ") {
					fixLine = l
				}
			}
			if !strings.Contains(failLine, c.want) {
				t.Errorf("FAIL line %q does not say %q\n%s", failLine, c.want, out)
			}
			if !strings.Contains(fixLine, c.fix) {
				t.Errorf("fix line %q does not say %q", fixLine, c.fix)
			}
			if !strings.Contains(out, "INVALID") {
				t.Errorf("no INVALID verdict:\n%s", out)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, name := range []string{"passthrough", "planner"} {
		t.Run(name, func(t *testing.T) {
			rc, out, errs := rmaw(t, "validate", cModule(t, name))
			if rc != 0 || !strings.Contains(out, "valid (Guest ABI v1)") {
				t.Fatalf("rc %d:\n%s\n%s", rc, out, errs)
			}
		})
	}
	t.Run("minimal", func(t *testing.T) {
		rc, out, _ := rmaw(t, "validate", watModule(t, "minimal", module(nil)))
		if rc != 0 {
			t.Fatalf("the minimal module is rejected (rc %d):\n%s", rc, out)
		}
	})
	t.Run("config-file", func(t *testing.T) {
		// planner refuses lanes=9 in rmaw_init: the .conf beside the module is read.
		dir := t.TempDir()
		p := filepath.Join(dir, "planner.wasm")
		b, _ := os.ReadFile(cModule(t, "planner"))
		os.WriteFile(p, b, 0o644)
		os.WriteFile(filepath.Join(dir, "planner.conf"), []byte("lanes=9"), 0o644)
		if rc, out, _ := rmaw(t, "validate", p); rc != 1 || !strings.Contains(out, "status -1") {
			t.Fatalf("rc %d, want a failure from the .conf:\n%s", rc, out)
		}
		if rc, out, _ := rmaw(t, "validate", "-config", "lanes=2", p); rc != 0 {
			t.Fatalf("-config does not override the .conf (rc %d):\n%s", rc, out)
		}
	})
}

func TestValidateNotWasm(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.wasm")
	os.WriteFile(p, []byte("#!/bin/sh\necho hi\n"), 0o644)
	rc, out, _ := rmaw(t, "validate", p)
	if rc != 1 || !strings.Contains(out, "not a .wasm file") {
		t.Fatalf("rc %d:\n%s", rc, out)
	}
	if rc, _, _ := rmaw(t, "validate", filepath.Join(t.TempDir(), "missing.wasm")); rc != 1 {
		t.Fatalf("a missing file: rc %d", rc)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}, {"validate"}, {"validate", "a", "b"}, {"new", "-lang", "rust", "x"}, {"test", "-run", "(", "x.wasm"}, {"bench", "-ops", "0", "x.wasm"}} {
		if rc, _, errs := rmaw(t, args...); rc != 2 {
			t.Errorf("%q: exit status %d, want 2 (usage)\n%s", args, rc, errs)
		}
	}
	if rc, _, errs := rmaw(t, "help"); rc != 0 || !strings.Contains(errs, "validate") {
		t.Errorf("help: rc %d\n%s", rc, errs)
	}
}
