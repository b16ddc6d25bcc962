package benchplot

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestChartSVG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.svg")
	c := Chart{Title: "Put bandwidth", XLabel: "message size", YLabel: "GB/s", LogX: true, LogY: true,
		XTicks: []Tick{{Value: 8, Label: "8 B"}, {Value: 1 << 20, Label: "1 MiB"}},
		Series: []Series{
			{Name: "plugin-tcp", X: []float64{8, 1 << 20}, Y: []float64{0.01, 2}},
			{Name: "raw-tcp", X: []float64{8, 1 << 20}, Y: []float64{0.02, 3}, Dashed: true},
			{Name: "skipped", X: []float64{8}, Y: []float64{0}}, // nothing drawable on a log axis
		}}
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "Put bandwidth", "plugin-tcp", "raw-tcp", "1 MiB", "GB/s"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	if bytes.Contains(b, []byte("skipped")) {
		t.Error("a series without drawable points is in the legend")
	}
}

func TestBarsPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.png")
	b := Bars{Title: "ratio", YLabel: "x", Groups: []string{"compressible", "random"}, Reference: 1,
		Series: []BarSeries{{Name: "s2", Values: []float64{3, 0.9}}, {Name: "zstd", Values: []float64{math.NaN()}}}}
	if err := b.Save(path); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !bytes.HasPrefix(data, []byte("\x89PNG")) {
		t.Fatalf("not a PNG: % x", data[:min(8, len(data))])
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	if err := (Chart{Title: "empty", LogY: true, Series: []Series{{Name: "z", X: []float64{1}, Y: []float64{-1}}}}).Save(filepath.Join(dir, "e.svg")); err == nil || !strings.Contains(err.Error(), "no points") {
		t.Fatalf("an empty chart: %v", err)
	}
	c := Chart{Series: []Series{{Name: "a", X: []float64{1}, Y: []float64{1}}}}
	if err := c.Save(filepath.Join(dir, "x.txt")); err == nil {
		t.Fatal("an unknown format was written")
	}
	if err := (Bars{Title: "none"}).Save(filepath.Join(dir, "b.svg")); err == nil {
		t.Fatal("an empty bar chart was written")
	}
}
