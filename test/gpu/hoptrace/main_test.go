package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: synthetic stamps and points with known gaps (µs: 2 to the call,
// 0.3 to the data plane's post, 0.2 to the copy's queue, 0.5 to the copy,
// 0.5 to the header, 3 to the target's look, 1 to the mark, 0.4 to the
// signal's write, 0.1 to the signal, 4 to the kernel's sight), with noise points of
// other operations (a barrier's signal before each put, a late duplicate
// look), come out as those gaps, and a round missing a point is skipped.
func TestRun(t *testing.T) {
	t.Run("marks seen by the host", func(t *testing.T) { testRun(t, false) })
	// The target's agent waits for the mark: no mark point, and the
	// segment reads 0.
	t.Run("marks waited for on the device", func(t *testing.T) { testRun(t, true) })
}

// TestRunSignalsAlone: a series of signals alone (GINPP_SIGNAL) has no
// copy, look or mark point: the call, the header and the signal still
// give the hop, the missing segments 0.
func TestRunSignalsAlone(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "sig-8")
	var kern, plug [2]strings.Builder
	for r := range 2 {
		fmt.Fprintf(&kern[r], "offset 0 500\n")
		fmt.Fprintf(&plug[r], "# NET/wasm trace of rank %d (pid %d): n points (realtime ns)\n", r, 20+r)
	}
	t0 := int64(5_000_000_000)
	var puts, seens [2][10]int64
	for k := range 10 {
		for _, d := range []struct{ from, to int }{{0, 1}, {1, 0}} {
			puts[d.from][k] = t0
			fmt.Fprintf(&plug[d.from], "post %d\nwire %d\n", t0+2000, t0+3000)
			fmt.Fprintf(&plug[d.to], "signal %d\n", t0+7000)
			seens[d.to][k] = t0 + 10000
			t0 += 20000
		}
	}
	for r := range 2 {
		for k := range 10 {
			fmt.Fprintf(&kern[r], "round %d %d %d\n", k, puts[r][k], seens[r][k])
		}
		os.WriteFile(fmt.Sprintf("%s.rank%d.kernel", prefix, r), []byte(kern[r].String()), 0o644)
		os.WriteFile(fmt.Sprintf("%s.%d", prefix, 20+r), []byte(plug[r].String()), 0o644)
	}
	var out strings.Builder
	if err := run(prefix, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for i, want := range []float64{2, 0, 0, 0, 1, 0, 0, 0, 4, 3} {
		if !strings.Contains(s, fmt.Sprintf("%-54s p50 %7.2f", segments[i], want)) {
			t.Errorf("segment %q: want %.2f in:\n%s", segments[i], want, s)
		}
	}
}

func testRun(t *testing.T, noMark bool) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "marks-8")
	gaps := []int64{2000, 300, 200, 500, 500, 3000, 1000, 400, 100, 4000}
	const markGap = 6
	if noMark {
		gaps[markGap] = 0
	}
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
			for i, st := range steps {
				name := st.name
				at += gaps[i]
				if name == "mark" && (noMark || k == 7) {
					continue // round 7 loses its mark: skipped
				}
				who := d.from
				if st.target {
					who = d.to
				}
				fmt.Fprintf(&plug[who], "%s %d\n", name, at)
				if name == "read" {
					fmt.Fprintf(&plug[who], "read %d\n", at+100000) // a later look
				}
			}
			at += gaps[len(steps)]
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
	want := "98 of 100 hops had every point"
	if noMark {
		want = "100 of 100 hops had every point"
	}
	if !strings.Contains(s, want) {
		t.Fatalf("output:\n%s", s)
	}
	for i, name := range segments {
		want := fmt.Sprintf("%-54s p50 %7.2f", name, float64(gaps[i])/1e3)
		if !strings.Contains(s, want) {
			t.Errorf("want %q in:\n%s", want, s)
		}
	}
	total := 12.0
	if noMark {
		total = 11.0
	}
	if !strings.Contains(s, fmt.Sprintf("%-54s p50 %7.2f", "the hop, kernel to kernel", total)) {
		t.Errorf("the whole hop is not 12 µs:\n%s", s)
	}
}

// TestRunHost: two ranks' traces without kernel stamps, each call's points
// at known gaps (µs: 0.3 to the data plane's post, 0.2 to the queue, 0.5
// to the copy, 0.5 to the header, 3 to the look, 1 to the mark, 0.4 to the
// signal's write, 0.1 to the signal), both ways, with a get between them
// (a call with no copy, header or signal of its own before the next call):
// the gaps come out exact and the get is left out.
func TestRunHost(t *testing.T) {
	dir := t.TempDir()
	gaps := []int64{300, 200, 500, 500, 3000, 1000, 400, 100}
	var plug [2]strings.Builder
	for r := range 2 {
		fmt.Fprintf(&plug[r], "# NET/wasm trace of rank %d (pid %d): n points (realtime ns)\n", r, 30+r)
	}
	at := int64(7_000_000_000)
	for k := range 20 {
		for _, from := range []int{0, 1} {
			fmt.Fprintf(&plug[from], "post %d\n", at)
			for i, st := range steps[1:] {
				at += gaps[i]
				who := from
				if st.target {
					who = 1 - from
				}
				fmt.Fprintf(&plug[who], "%s %d\n", st.name, at)
			}
			at += 10000
			if k == 5 {
				fmt.Fprintf(&plug[from], "post %d\nplan %d\n", at, at+300) // a get
				at += 10000
			}
		}
	}
	var files [2]string
	for r := range 2 {
		files[r] = filepath.Join(dir, fmt.Sprintf("t.%d", 30+r))
		if err := os.WriteFile(files[r], []byte(plug[r].String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	if err := runHost(files, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "40 of 42 calls reached the peer's signal") {
		t.Fatalf("output:\n%s", s)
	}
	for i, name := range hostSegments {
		if want := fmt.Sprintf("%-54s p50 %7.2f", name, float64(gaps[i])/1e3); !strings.Contains(s, want) {
			t.Errorf("want %q in:\n%s", want, s)
		}
	}
	if !strings.Contains(s, fmt.Sprintf("%-54s p50 %7.2f", "the plugin's part, call to signal applied", 6.0)) {
		t.Errorf("the plugin's part is not 6 µs:\n%s", s)
	}
	files[1] = files[0]
	if err := runHost(files, &out); err == nil {
		t.Error("two traces of rank 0 were taken for a pair")
	}
}
