package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlots(t *testing.T) {
	dir := t.TempDir()
	var s []Sample
	for _, size := range []uint64{8, 4 << 10, 1 << 20} {
		for i, c := range bandwidthSeries {
			s = append(s, Sample{Metric: "put_bw", Config: c, Size: size, Unit: "GB/s", Values: []float64{float64(size) / 1e6 * float64(i+1)}})
		}
		for _, c := range []string{"plugin-tcp-s2/compressible", "plugin-tcp/random", "raw-tcp"} {
			s = append(s, Sample{Metric: "comp_bw", Config: c, Size: size, Unit: "GB/s", Values: []float64{1, 2, 3}})
		}
		s = append(s, Sample{Metric: "codec_enc", Config: "s2/compressible", Size: size, Unit: "GB/s", Values: []float64{0.5}},
			Sample{Metric: "codec_dec", Config: "s2/compressible", Size: size, Unit: "GB/s", Values: []float64{1.5}})
	}
	s = append(s, Sample{Metric: "msg_rate", Config: "native", Size: 8, Values: []float64{1.6}},
		Sample{Metric: "msg_rate", Config: "planner", Size: 8, Values: []float64{1.4}})
	r := newReport(&options{out: dir, reps: 1}, s, nil)
	files, err := r.plots()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 {
		t.Fatalf("wrote %v, want bandwidth, compression, codec and message-rate charts", files)
	}
	for file, want := range map[string][]string{
		"bandwidth.svg":   append([]string{"1 MiB", "4 KiB"}, bandwidthSeries...),
		"compression.svg": {"plugin-tcp-s2/compressible", "plugin-tcp/random", "raw-tcp"},
		"codecs.svg":      {"encode s2/compressible", "decode s2/compressible"},
		"msgrate.svg":     {"planner", "x native"},
	} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s lacks %q", file, w)
			}
		}
	}
	// Without compression or rate series only the bandwidth chart is drawn.
	r = newReport(&options{out: t.TempDir(), reps: 1}, s[:len(bandwidthSeries)], nil)
	if files, err := r.plots(); err != nil || len(files) != 1 {
		t.Fatalf("%v, %v", files, err)
	}
}
