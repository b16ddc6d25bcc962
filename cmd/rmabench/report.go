package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

type report struct {
	o       *options
	samples []Sample
	notes   []string
	ratios  []ratio
	elapsed time.Duration
	charts  []string // files plots() wrote
}

type ratio struct {
	metric, num, den string
	size             uint64
	value            float64
	reps             int
}

func newReport(o *options, s []Sample, notes []string) *report {
	r := &report{o: o, samples: s, notes: notes}
	for _, size := range sizes {
		r.addRatio("put_bw", "plugin-tcp", "raw-tcp", size)
		r.addRatio("put_bw", "plugin-intranode", "raw-pvw", size)
		r.addRatio("put_bw", "plugin-tcp-encrypted", "plugin-tcp", size)
		r.addRatio("put_bw", "plugin-fabric", "raw-fi-write", size)
	}
	r.addRatio("half_rtt", "plugin-fabric", "raw-fi-writedata", 8)
	r.addRatio("half_rtt", "plugin-tcp", "raw-tcp", 8)
	r.addRatio("half_rtt", "plugin-intranode", "raw-tcp", 8)
	r.addRatio("half_rtt", "plugin-tcp-encrypted", "plugin-tcp", 8)
	r.addRatio("msg_rate", "default", "native", 8)
	r.addRatio("msg_rate", "planner", "native", 8)
	r.addRatio("msg_rate", "planner+telemetry", "native", 8)
	r.addRatio("msg_rate_agg", "planner", "native", 8)
	r.addRatio("msg_rate_agg", "planner-batch", "native", 8)
	for _, size := range compSizes {
		for _, d := range compData {
			for _, s := range []string{"plugin-tcp", "plugin-tcp-s2", "plugin-tcp-zstd1"} {
				r.addRatio("comp_bw", s+"/"+d.name, "raw-tcp", size)
				if s != "plugin-tcp" {
					r.addRatio("comp_bw", s+"/"+d.name, "plugin-tcp/"+d.name, size)
				}
			}
		}
	}
	return r
}

func (r *report) find(metric, config string, size uint64) *Sample {
	for i := range r.samples {
		s := &r.samples[i]
		if s.Metric == metric && s.Config == config && s.Size == size {
			return s
		}
	}
	return nil
}

func (r *report) med(metric, config string, size uint64) (float64, bool) {
	s := r.find(metric, config, size)
	if s == nil || len(s.Values) == 0 {
		return 0, false
	}
	return median(s.Values), true
}

// addRatio pairs repetition i of num with repetition i of den (they ran
// back to back) and keeps the median of the per-repetition ratios.
func (r *report) addRatio(metric, num, den string, size uint64) {
	a, b := r.find(metric, num, size), r.find(metric, den, size)
	if a == nil || b == nil {
		return
	}
	n := min(len(a.Values), len(b.Values))
	var v []float64
	for i := 0; i < n; i++ {
		if b.Values[i] > 0 {
			v = append(v, a.Values[i]/b.Values[i])
		}
	}
	if len(v) == 0 {
		return
	}
	r.ratios = append(r.ratios, ratio{metric, num, den, size, median(v), len(v)})
}

func (r *report) ratio(metric, num, den string, size uint64) (float64, bool) {
	for _, x := range r.ratios {
		if x.metric == metric && x.num == num && x.den == den && x.size == size {
			return x.value, true
		}
	}
	return 0, false
}

// rated formats config c's median of metric at 8 bytes (prec decimals) and
// its ratio to config base's (1 for base itself).
func (r *report) rated(metric, c, base string, prec int) (string, string) {
	v, ok := r.med(metric, c, 8)
	x, xok := r.ratio(metric, c, base, 8)
	if c == base {
		x, xok = 1, ok
	}
	return f(v, ok, prec), f(x, xok, 2)
}

func (r *report) write() error {
	var b strings.Builder
	b.WriteString("metric,config,size,median,unit,reps\n")
	for _, s := range r.samples {
		fmt.Fprintf(&b, "%s,%s,%d,%.6g,%s,%d\n", s.Metric, s.Config, s.Size, median(s.Values), s.Unit, len(s.Values))
	}
	for _, x := range r.ratios {
		fmt.Fprintf(&b, "ratio_%s,%s/%s,%d,%.4f,x,%d\n", x.metric, x.num, x.den, x.size, x.value, x.reps)
	}
	err := os.WriteFile(filepath.Join(r.o.out, "results.csv"), []byte(b.String()), 0o644)
	if err != nil {
		return err
	}
	r.charts, err = r.plots()
	return err
}

func sizeName(s uint64) string {
	switch {
	case s >= 1<<20:
		return fmt.Sprintf("%d MiB", s>>20)
	case s >= 1<<10:
		return fmt.Sprintf("%d KiB", s>>10)
	}
	return fmt.Sprintf("%d B", s)
}

func cpuModel() string {
	out, err := exec.Command("lscpu").Output()
	if err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(l, "Model name:"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}

func f(v float64, ok bool, prec int) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func (r *report) print(out io.Writer) {
	w := bufio.NewWriter(out)
	defer w.Flush()
	host, _ := os.Hostname()
	fmt.Fprintf(w, "\nrmabench  %s  %s, %d CPUs, %s  reps=%d%s  (%v)\n", time.Now().Format("2006-01-02 15:04"), cpuModel(), runtime.NumCPU(), host, r.o.reps,
		map[bool]string{true: " -quick", false: ""}[r.o.quick], r.elapsed.Round(time.Second))
	fmt.Fprintf(w, "medians over repetitions; ratios are medians of per-repetition ratios (the two series ran back to back)\n\n")

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "put GB/s\tsize\tplugin-tcp\traw-tcp\tratio\tplugin-intranode\traw-pvw\tratio\tmemcpy\t\n")
	for _, s := range sizes {
		a, aok := r.med("put_bw", "plugin-tcp", s)
		b, bok := r.med("put_bw", "raw-tcp", s)
		c, cok := r.med("put_bw", "plugin-intranode", s)
		d, dok := r.med("put_bw", "raw-pvw", s)
		e, eok := r.med("put_bw", "memcpy", s)
		r1, r1ok := r.ratio("put_bw", "plugin-tcp", "raw-tcp", s)
		r2, r2ok := r.ratio("put_bw", "plugin-intranode", "raw-pvw", s)
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", sizeName(s), f(a, aok, 3), f(b, bok, 3), f(r1, r1ok, 2),
			f(c, cok, 3), f(d, dok, 3), f(r2, r2ok, 2), f(e, eok, 2))
	}
	tw.Flush()

	if _, ok := r.med("put_bw", "plugin-tcp-encrypted", sizes[len(sizes)-1]); ok {
		fmt.Fprintf(w, "\nencrypted TCP (NCCL_RMA_WASM_ENCRYPT=1) against plugin-tcp\n")
		r.pairTable(w, sizes, "plugin-tcp-encrypted", "plugin-tcp", "plugin-tcp")
	}
	if _, ok := r.med("put_bw", "raw-fi-write", fabSizes[0]); ok {
		fmt.Fprintf(w, "\nlibfabric transport (provider %s) against bare libfabric between the same processes\n", r.o.fiProvider)
		r.pairTable(w, fabSizes, "plugin-fabric", "raw-fi-write", "raw-fi-writedata")
	}

	fmt.Fprintf(w, "\n8-byte ping-pong, half round trip (us)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, c := range []string{"raw-tcp", "plugin-tcp", "plugin-intranode"} {
		v, x := r.rated("half_rtt", c, "raw-tcp", 1)
		fmt.Fprintf(tw, "\t%s\t%s\t%sx\t\n", c, v, x)
	}
	tw.Flush()

	fmt.Fprintf(w, "\n8-byte put message rate (Mops/s) and allocations per op (initiator / target process)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, c := range []string{"native", "default", "planner", "planner+telemetry"} {
		v, x := r.rated("msg_rate", c, "native", 3)
		ai, aiok := r.med("allocs_per_op", c+"/initiator", 8)
		at, atok := r.med("allocs_per_op", c+"/target", 8)
		fmt.Fprintf(tw, "\t%s\t%s\t%sx\t%s\t%s\t\n", c, v, x, f(ai, aiok, 4), f(at, atok, 4))
	}
	tw.Flush()

	fmt.Fprintf(w, "\nthe same with the aggregation hint on every put (Mops/s, allocations per op on the initiator)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, c := range []string{"native", "planner", "planner-batch"} {
		v, x := r.rated("msg_rate_agg", c, "native", 3)
		ai, aiok := r.med("allocs_per_op_agg", c+"/initiator", 8)
		fmt.Fprintf(tw, "\t%s\t%s\t%sx\t%s\t\n", c, v, x, f(ai, aiok, 4))
	}
	tw.Flush()

	r.printCompression(w)

	fmt.Fprintf(w, "\ncold start, host.Init -> first completed put, fresh process, 1-rank communicator (ms)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\tbackend\ttotal\tinit\tconnect\tcontext\tregmr\tput\truns\t\n")
	for _, c := range []string{"native", "default", "default-cold-cache", "go-sdk", "go-sdk-cold-cache"} {
		s := r.find("cold_start", c, 0)
		if s == nil {
			continue
		}
		line := fmt.Sprintf("\t%s\t%.2f", c, median(s.Values))
		for _, p := range coldPhases {
			v, ok := r.med("cold_start_"+p, c, 0)
			line += "\t" + f(v, ok, 2)
		}
		fmt.Fprintf(tw, "%s\t%d\t\n", line, len(s.Values))
	}
	tw.Flush()

	fmt.Fprintf(w, "\ntargets\n")
	for _, t := range r.targets() {
		fmt.Fprintf(w, "  %-9s %s\n", t.verdict, t.text)
	}
	if len(r.notes) > 0 {
		fmt.Fprintf(w, "\nnotes\n")
		for _, n := range r.notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	fmt.Fprintf(w, "\nwrote %s\n", strings.Join(append([]string{filepath.Join(r.o.out, "results.csv")}, r.charts...), ", "))
}

// pairTable prints put bandwidth of num beside den at each size with their
// ratio, then num's 8-byte half round trip beside pingDen's.
func (r *report) pairTable(w io.Writer, at []uint64, num, den, pingDen string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "put GB/s\tsize\t%s\t%s\tratio\t\n", num, den)
	for _, s := range at {
		a, aok := r.med("put_bw", num, s)
		b, bok := r.med("put_bw", den, s)
		x, xok := r.ratio("put_bw", num, den, s)
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t\n", sizeName(s), f(a, aok, 3), f(b, bok, 3), f(x, xok, 2))
	}
	a, aok := r.med("half_rtt", num, 8)
	b, bok := r.med("half_rtt", pingDen, 8)
	x, xok := r.ratio("half_rtt", num, pingDen, 8)
	fmt.Fprintf(tw, "half rtt us\t8 B\t%s\t%s\t%s\t\n", f(a, aok, 1), f(b, bok, 1), f(x, xok, 2))
	tw.Flush()
}

type target struct{ verdict, text string }

func verdict(measured, ok bool) string {
	switch {
	case !measured:
		return "NOT RUN"
	case ok:
		return "MET"
	}
	return "NOT MET"
}

func (r *report) worstRatio(num, den string) (float64, string, bool) {
	worst, at, any := math.Inf(1), "", false
	for _, s := range sizes {
		if s < 1<<20 {
			continue
		}
		if v, ok := r.ratio("put_bw", num, den, s); ok {
			any = true
			if v < worst {
				worst, at = v, sizeName(s)
			}
		}
	}
	return worst, at, any
}

func (r *report) targets() []target {
	var ts []target
	v, at, ok := r.worstRatio("plugin-tcp", "raw-tcp")
	ts = append(ts, target{verdict(ok, v >= 0.95), fmt.Sprintf("TCP put >= 0.95x raw TCP at >= 1 MiB: worst %.2fx (at %s)", v, at)})
	v, at, ok = r.worstRatio("plugin-intranode", "raw-pvw")
	ts = append(ts, target{verdict(ok, v >= 0.95), fmt.Sprintf("intra-node put >= 0.95x raw process_vm_writev at >= 1 MiB: worst %.2fx (at %s)", v, at)})
	v, ok = r.ratio("half_rtt", "plugin-tcp", "raw-tcp", 8)
	ts = append(ts, target{verdict(ok, v <= 1.3), fmt.Sprintf("8-byte put+signal ping-pong <= 1.3x raw TCP: %.2fx", v)})
	if v, at, ok := r.worstRatio("plugin-fabric", "raw-fi-write"); ok {
		ts = append(ts, target{verdict(ok, v >= 0.9), fmt.Sprintf("libfabric (%s) put >= 0.9x raw fi_write at >= 1 MiB: worst %.2fx (at %s)", r.o.fiProvider, v, at)})
	}
	if v, ok := r.ratio("half_rtt", "plugin-fabric", "raw-fi-writedata", 8); ok {
		ts = append(ts, target{verdict(ok, v <= 1.3), fmt.Sprintf("libfabric (%s) 8-byte put+signal ping-pong <= 1.3x raw fi_writedata: %.2fx", r.o.fiProvider, v)})
	}
	v, ok = r.ratio("msg_rate", "default", "native", 8)
	ts = append(ts, target{verdict(ok, v >= 0.95), fmt.Sprintf("embedded default backend >= 0.95x native message rate: %.2fx", v)})
	v, ok = r.ratio("msg_rate", "planner", "native", 8)
	ts = append(ts, target{verdict(ok, v >= 0.90), fmt.Sprintf("per-op hook (planner) >= 0.90x native message rate: %.2fx", v)})
	if v, ok := r.ratio("msg_rate", "planner+telemetry", "native", 8); ok {
		ts = append(ts, target{"INFO", fmt.Sprintf("per-op hook with completion telemetry: %.2fx native (no target)", v)})
	}
	if v, ok := r.ratio("msg_rate_agg", "planner-batch", "native", 8); ok {
		ts = append(ts, target{verdict(ok, v >= 0.90), fmt.Sprintf("batched planning (planner-batch, aggregated puts) >= 0.90x native message rate: %.2fx", v)})
	}
	if v, ok := r.ratio("msg_rate_agg", "planner", "native", 8); ok {
		ts = append(ts, target{"INFO", fmt.Sprintf("per-op hook on aggregated puts: %.2fx native (no target)", v)})
	}
	worst, any := 0.0, false
	for _, c := range []string{"native", "default", "planner", "planner+telemetry"} {
		if a, ok := r.med("allocs_per_op", c+"/initiator", 8); ok {
			any, worst = true, max(worst, a)
		}
		if a, ok := r.med("allocs_per_op_agg", c+"/initiator", 8); ok {
			any, worst = true, max(worst, a)
		}
	}
	if a, ok := r.med("allocs_per_op_agg", "planner-batch/initiator", 8); ok {
		any, worst = true, max(worst, a)
	}
	ts = append(ts, target{verdict(any, worst < 0.01), fmt.Sprintf("0 allocations per op on the put path (initiator process, all backends): worst %.4f", worst)})
	v, ok = r.med("cold_start", "default", 0)
	ts = append(ts, target{verdict(ok, v <= 10), fmt.Sprintf("cold start, embedded default, warm cache <= 10 ms: %.2f ms", v)})
	v, ok = r.med("cold_start", "go-sdk", 0)
	ts = append(ts, target{verdict(ok, v <= 50), fmt.Sprintf("cold start, Go-SDK guest, warm cache <= 50 ms: %.2f ms", v)})
	return ts
}
