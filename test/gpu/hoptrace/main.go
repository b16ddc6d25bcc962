// Command hoptrace sets the plugin's trace points of each GPU-initiated
// hop between the two kernels' own stamps, and says where a hop's time
// goes: test/gpu/gin_pingpong.cu run with GINPP_TRACE=<prefix> and
// NCCL_RMA_WASM_PROFILE_TRACE=<prefix> leaves <prefix>.rank0.kernel and
// <prefix>.rank1.kernel (each round's put and signal seen, on the host's
// realtime clock through a calibration) and one <prefix>.<pid> per rank
// (the plugin's points). For each round and direction it takes the
// sender's put, the first of the sender's points after it (the call, the
// marked copy, the header written), then the target's (the header looked
// at, the mark seen, the signal applied), then the target's kernel seeing
// the signal, and prints the median, 10th and 90th percentiles of each
// segment over the rounds where every point was found. A point the series
// never meets (a signal alone has no copy and no marked header; a mark the
// target's agent waits for is seen by no host) counts 0.
//
// With -host and two trace files of one run (rank 0's and rank 1's, from
// any client: staging_bench, host_rma), it prints the plugin's own parts
// alone, from each call to the peer's signal, with no kernel stamps.
//
//	hoptrace <prefix>
//	hoptrace -host <trace of rank 0> <trace of rank 1>
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// kernelFile is one rank's stamps: put and seen per round (realtime ns).
type kernelFile struct {
	offset, width int64
	put, seen     []int64
}

// pluginTrace is one rank's plugin points, by name, each sorted.
type pluginTrace map[string][]int64

func readKernel(path string) (*kernelFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	k := &kernelFile{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) == 3 && fs[0] == "offset":
			k.offset, _ = strconv.ParseInt(fs[1], 10, 64)
			k.width, _ = strconv.ParseInt(fs[2], 10, 64)
		case len(fs) == 4 && fs[0] == "round":
			p, err1 := strconv.ParseInt(fs[2], 10, 64)
			s, err2 := strconv.ParseInt(fs[3], 10, 64)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
			}
			k.put, k.seen = append(k.put, p), append(k.seen, s)
		}
	}
	return k, sc.Err()
}

// readPlugin reads one plugin trace file and returns its rank and points.
func readPlugin(path string) (int, pluginTrace, error) {
	f, err := os.Open(path)
	if err != nil {
		return -1, nil, err
	}
	defer f.Close()
	return parsePlugin(f, path)
}

func parsePlugin(r io.Reader, path string) (int, pluginTrace, error) {
	rank := -1
	tr := pluginTrace{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, "# NET/wasm trace of rank "); ok {
			rank, _ = strconv.Atoi(strings.Fields(rest)[0])
			continue
		}
		fs := strings.Fields(l)
		if len(fs) != 2 {
			continue
		}
		t, err := strconv.ParseInt(fs[1], 10, 64)
		if err != nil {
			return -1, nil, fmt.Errorf("%s: bad line %q", path, l)
		}
		tr[fs[0]] = append(tr[fs[0]], t)
	}
	for _, v := range tr {
		slices.Sort(v)
	}
	if rank < 0 {
		return -1, nil, fmt.Errorf("%s: no header naming the rank", path)
	}
	return rank, tr, sc.Err()
}

// first is the first point of name at or after t, or -1.
func (p pluginTrace) first(name string, t int64) int64 {
	v := p[name]
	i := sort.Search(len(v), func(i int) bool { return v[i] >= t })
	if i == len(v) {
		return -1
	}
	return v[i]
}

// segments are the hop's parts, in order; the plugin points between the
// kernels' stamps.
var segments = []string{
	"sender kernel's put -> plugin call entered",
	"call -> data plane's post (the call's own work)",
	"post -> marked copy's queue (routing; 0: none)",
	"queue -> marked copy handed to the agent (0: none)",
	"copy handed -> header written",
	"header written -> target's caller looks (0: unmarked)",
	"looked at -> sender's mark seen (0: the agent waits)",
	"mark seen -> signal's device write entered",
	"write entered -> signal applied (agent command queued)",
	"signal applied -> target kernel sees it",
}

// steps are the plugin's points between the kernels' stamps, in order,
// each on the sender's side (false) or the target's (true).
var steps = []struct {
	target bool
	name   string
}{{false, "post"}, {false, "plan"}, {false, "queue"}, {false, "copy"}, {false, "wire"},
	{true, "read"}, {true, "mark"}, {true, "sigcall"}, {true, "signal"}}

// hop finds one hop's points: put on the sender's kernel, seen on the
// target's; tol is how far before the put a plugin point may lie (the
// calibration's error). It returns the segments, or false.
func hop(put, seen, tol int64, s, t pluginTrace) ([]int64, bool) {
	pts := make([]int64, 0, len(steps)+2)
	pts = append(pts, put)
	at := put - tol
	for _, step := range steps {
		tr := s
		if step.target {
			tr = t
		}
		if len(tr[step.name]) == 0 {
			// A point this series never meets counts 0: no marked copy
			// and no look at a marked header for a signal alone
			// (GINPP_SIGNAL), no mark seen by the host where the target's
			// agent waits for it (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE),
			// none of the finer points in a plugin without them.
			pts = append(pts, at)
			continue
		}
		x := tr.first(step.name, at)
		if x < 0 || x > seen+tol {
			return nil, false
		}
		pts = append(pts, x)
		at = x
	}
	pts = append(pts, seen)
	d := make([]int64, len(pts)-1)
	for i := range d {
		d[i] = pts[i+1] - pts[i]
	}
	return d, true
}

func pct(v []int64, q float64) float64 {
	return float64(v[int(q*float64(len(v)-1))]) / 1e3
}

func main() {
	var err error
	switch {
	case len(os.Args) == 2:
		err = run(os.Args[1], os.Stdout)
	case len(os.Args) == 4 && os.Args[1] == "-host":
		err = runHost([2]string{os.Args[2], os.Args[3]}, os.Stdout)
	default:
		fmt.Fprintln(os.Stderr, "usage: hoptrace <prefix> | hoptrace -host <trace> <trace>")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hoptrace:", err)
		os.Exit(1)
	}
}

func run(prefix string, w io.Writer) error {
	var ks [2]*kernelFile
	for r := range ks {
		k, err := readKernel(fmt.Sprintf("%s.rank%d.kernel", prefix, r))
		if err != nil {
			return err
		}
		ks[r] = k
	}
	var ps [2]pluginTrace
	files, _ := filepath.Glob(prefix + ".*")
	for _, f := range files {
		if strings.HasSuffix(f, ".kernel") {
			continue
		}
		r, tr, err := readPlugin(f)
		if err != nil {
			return err
		}
		if r == 0 || r == 1 {
			ps[r] = tr
		}
	}
	if ps[0] == nil || ps[1] == nil {
		return fmt.Errorf("%s.<pid>: want one plugin trace per rank", prefix)
	}
	tol := max(ks[0].width, ks[1].width, 1000)
	fmt.Fprintf(w, "HOPTRACE %s: clock offsets %d, %d ns (exchange widths %d, %d ns)\n", filepath.Base(prefix),
		ks[0].offset, ks[1].offset, ks[0].width, ks[1].width)
	seg := newSeries(len(segments))
	n, rounds := 0, min(len(ks[0].put), len(ks[1].put))
	for k := range rounds {
		// 0 -> 1: rank 0's put, rank 1's wait; 1 -> 0: rank 1's reply.
		for _, d := range []struct{ from, to int }{{0, 1}, {1, 0}} {
			put, seen := ks[d.from].put[k], ks[d.to].seen[k]
			if parts, ok := hop(put, seen, tol, ps[d.from], ps[d.to]); ok {
				n++
				seg.add(parts)
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("no hop had every point (%d rounds)", rounds)
	}
	fmt.Fprintf(w, "HOPTRACE %d of %d hops had every point; µs:\n", n, 2*rounds)
	printSegments(w, seg, segments, "the hop, kernel to kernel")
	return nil
}

// series holds each segment's samples, and last their sums.
type series [][]int64

func newSeries(segments int) series { return make(series, segments+1) }

// add records one hop's segments and their sum.
func (s series) add(parts []int64) {
	var sum int64
	for i, x := range parts {
		s[i] = append(s[i], x)
		sum += x
	}
	s[len(s)-1] = append(s[len(s)-1], sum)
}

// printSegments prints each segment's median, 10th and 90th percentile,
// named by names, and the last one's, the sum, named total.
func printSegments(w io.Writer, seg series, names []string, total string) {
	for i, v := range seg {
		slices.Sort(v)
		name := total
		if i < len(names) {
			name = names[i]
		}
		fmt.Fprintf(w, "HOPTRACE   %-54s p50 %7.2f  p10 %7.2f  p90 %7.2f\n", name, pct(v, 0.5), pct(v, 0.1), pct(v, 0.9))
	}
}
