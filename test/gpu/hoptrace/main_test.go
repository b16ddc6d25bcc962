package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: synthetic stamps and points with known gaps (µs: 2 to the call,
// 1 to the copy, 0.5 to the header, 3 to the target's look, 1 to the
// mark, 0.5 to the signal, 4 to the kernel's sight), with noise points of
// other operations (a barrier's signal before each put, a late duplicate
// look), come out as those gaps, and a round missing a point is skipped.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "marks-8")
	gaps := []int64{2000, 1000, 500, 3000, 1000, 500, 4000}
	var kern [2]strings.Builder
	var plug [2]strings.Builder
	for r := range 2 {
		fmt.Fprintf(&kern[r], "# gin_pingpong rank %d\noffset 100 800\n", r)
		fmt.Fprintf(&plug[r], "# NET/wasm trace of rank %d (pid %d): n points (realtime ns)\n", r, 10+r)
	}
	const rounds = 50
	t0 := int64(1_000_000_000)
	var puts, seens [2][rounds]int64
	for k := range rounds {
		for _, d := range []struct{ from, to int }{{0, 1}, {1, 0}} {
			at := t0
			puts[d.from][k] = at
			// A signal alone of the barrier, a little before the put.
			fmt.Fprintf(&plug[d.from], "wire %d\n", at-5000)
			names := []string{"post", "copy", "wire", "read", "mark", "signal"}
			for i, name := range names {
				at += gaps[i]
				if k == 7 && name == "mark" {
					continue // round 7 loses its mark: skipped
				}
				who := d.from
				if i >= 3 {
					who = d.to
				}
				fmt.Fprintf(&plug[who], "%s %d\n", name, at)
				if name == "read" {
					fmt.Fprintf(&plug[who], "read %d\n", at+100000) // a later look
				}
			}
			at += gaps[6]
			seens[d.to][k] = at
			t0 = at + 1000
		}
	}
	for r := range 2 {
		for k := range rounds {
			fmt.Fprintf(&kern[r], "round %d %d %d\n", k, puts[r][k], seens[r][k])
		}
		if err := os.WriteFile(fmt.Sprintf("%s.rank%d.kernel", prefix, r), []byte(kern[r].String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fmt.Sprintf("%s.%d", prefix, 10+r), []byte(plug[r].String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	if err := run(prefix, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "98 of 100 hops had every point") {
		t.Fatalf("output:\n%s", s)
	}
	for i, name := range segments {
		want := fmt.Sprintf("%-52s p50 %7.2f", name, float64(gaps[i])/1e3)
		if !strings.Contains(s, want) {
			t.Errorf("want %q in:\n%s", want, s)
		}
	}
	if !strings.Contains(s, fmt.Sprintf("%-52s p50 %7.2f", "the hop, kernel to kernel", 12.0)) {
		t.Errorf("the whole hop is not 12 µs:\n%s", s)
	}
}
