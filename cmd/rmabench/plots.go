package main

// Charts of a run, drawn by internal/benchplot (gonum.org/v1/plot):
// bandwidth.svg (put bandwidth against size, plugin next to its raw
// baselines), msgrate.svg (message-rate ratios against native) and, when
// the run has compression series, compression.svg (metric comp_bw) and
// codecs.svg (the codecs' own speed: codec_enc, codec_dec).

import (
	"path/filepath"
	"sort"
	"strings"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/internal/benchplot"
)

// bandwidthSeries are drawn in this order; raw baselines are dashed.
var bandwidthSeries = []string{"plugin-tcp", "raw-tcp", "plugin-intranode", "raw-pvw", "memcpy"}

func isBaseline(config string) bool {
	return strings.HasPrefix(config, "raw") || config == "memcpy"
}

// lineSeries is one series per config of metric over the sizes it was
// measured at (medians).
func (r *report) lineSeries(metric string, configs []string) []benchplot.Series {
	var out []benchplot.Series
	for _, c := range configs {
		s := benchplot.Series{Name: c, Dashed: isBaseline(c)}
		for _, x := range r.samples {
			if x.Metric == metric && x.Config == c && len(x.Values) > 0 {
				s.X = append(s.X, float64(x.Size))
				s.Y = append(s.Y, median(x.Values))
			}
		}
		order := make([]int, len(s.X))
		for i := range order {
			order[i] = i
		}
		sort.Slice(order, func(a, b int) bool { return s.X[order[a]] < s.X[order[b]] })
		xs, ys := make([]float64, len(order)), make([]float64, len(order))
		for i, j := range order {
			xs[i], ys[i] = s.X[j], s.Y[j]
		}
		s.X, s.Y = xs, ys
		if len(s.X) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// configsOf lists the configs measured for metric, baselines last.
func (r *report) configsOf(metric string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range r.samples {
		if x.Metric == metric && !seen[x.Config] {
			seen[x.Config] = true
			out = append(out, x.Config)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return !isBaseline(out[i]) && isBaseline(out[j]) })
	return out
}

func sizeTicks(series []benchplot.Series) []benchplot.Tick {
	seen := map[float64]bool{}
	var ticks []benchplot.Tick
	for _, s := range series {
		for _, x := range s.X {
			if !seen[x] {
				seen[x] = true
				ticks = append(ticks, benchplot.Tick{Value: x, Label: sizeName(uint64(x))})
			}
		}
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i].Value < ticks[j].Value })
	return ticks
}

// plots writes the charts and returns the files written. A chart without
// data is skipped, not an error.
func (r *report) plots() ([]string, error) {
	var written []string
	line := func(file, title, ylabel, metric string, configs []string, extra ...benchplot.Series) error {
		series := append(r.lineSeries(metric, configs), extra...)
		if len(series) == 0 {
			return nil
		}
		path := filepath.Join(r.o.out, file)
		c := benchplot.Chart{Title: title, XLabel: "message size (log scale)", YLabel: ylabel,
			LogX: true, LogY: true, XTicks: sizeTicks(series), Series: series}
		if err := c.Save(path); err != nil {
			return err
		}
		written = append(written, path)
		return nil
	}
	if err := line("bandwidth.svg", "Put bandwidth, rank 0 -> rank 1, same host (medians)", "GB/s (log scale)",
		"put_bw", bandwidthSeries); err != nil {
		return written, err
	}
	if err := line("compression.svg", "Put bandwidth with compression on TCP (medians)", "GB/s (log scale)",
		"comp_bw", r.configsOf("comp_bw")); err != nil {
		return written, err
	}
	// The codecs' own speed (one core, in memory), the chart beside it: one
	// colour per codec and data, encode solid, decode dashed.
	var codec []benchplot.Series
	colors := map[string]int{}
	for _, m := range []struct{ metric, verb string }{{"codec_enc", "encode "}, {"codec_dec", "decode "}} {
		for _, s := range r.lineSeries(m.metric, r.configsOf(m.metric)) {
			if colors[s.Name] == 0 {
				colors[s.Name] = len(colors) + 1
			}
			s.Color, s.Dashed = colors[s.Name], m.verb == "decode "
			s.Name = m.verb + s.Name
			codec = append(codec, s)
		}
	}
	if err := line("codecs.svg", "Codec speed, one core, in memory (medians)", "GB/s of raw data (log scale)", "", nil, codec...); err != nil {
		return written, err
	}
	// Message-rate ratios against native, one bar per backend.
	var groups []string
	var vals []float64
	for _, x := range r.ratios {
		if strings.HasPrefix(x.metric, "msg_rate") && x.den == "native" {
			groups = append(groups, strings.TrimPrefix(x.metric, "msg_rate")+x.num)
			vals = append(vals, x.value)
		}
	}
	if len(groups) > 0 {
		path := filepath.Join(r.o.out, "msgrate.svg")
		b := benchplot.Bars{Title: "8-byte put message rate against native (median of per-repetition ratios)",
			YLabel: "x native", Groups: groups, Reference: 1,
			Series: []benchplot.BarSeries{{Name: "ratio", Values: vals}}}
		if err := b.Save(path); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}
