package main

import (
	"fmt"
	"io"
)

// hostSegments are the plugin's own parts of an operation's way, from its
// call on one rank to its signal on the other (the kernels' two ends
// left out): what -host prints, for traces without kernel stamps
// (staging_bench, host_rma, any client).
var hostSegments = segments[1 : len(segments)-1]

// runHost reads two ranks' plugin traces of one run (one process each)
// and prints each host segment's median, 10th and 90th percentile over
// the operations whose every point came before the sender's next call. An
// operation of another kind (a get, a put without a signal) lacks a point
// before that call and is left out; a point the run never meets counts 0.
func runHost(files [2]string, w io.Writer) error {
	var ps [2]pluginTrace
	for _, f := range files {
		r, tr, err := readPlugin(f)
		if err != nil {
			return err
		}
		if r != 0 && r != 1 {
			return fmt.Errorf("%s: rank %d, want 0 or 1", f, r)
		}
		if ps[r] != nil {
			return fmt.Errorf("two traces of rank %d", r)
		}
		ps[r] = tr
	}
	if ps[0] == nil || ps[1] == nil {
		return fmt.Errorf("want one trace of rank 0 and one of rank 1")
	}
	seg := newSeries(len(hostSegments))
	n, calls := 0, 0
	for from := range 2 {
		s, t := ps[from], ps[1-from]
		posts := s["post"]
		for i, post := range posts {
			end := int64(1) << 62
			if i+1 < len(posts) {
				end = posts[i+1]
			}
			calls++
			if parts, ok := hostHop(post, end, s, t); ok {
				n++
				seg.add(parts)
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("no operation had every point before the next call (%d calls)", calls)
	}
	fmt.Fprintf(w, "HOPTRACE %d of %d calls reached the peer's signal with every point; µs:\n", n, calls)
	printSegments(w, seg, hostSegments, "the plugin's part, call to signal applied")
	return nil
}

// hostHop chains the points after post (steps after the first), each the
// first at or after the one before and before end, on the sender's trace
// s or the target's t; it returns the gaps, or false.
func hostHop(post, end int64, s, t pluginTrace) ([]int64, bool) {
	at := post
	d := make([]int64, 0, len(steps)-1)
	for _, step := range steps[1:] {
		tr := s
		if step.target {
			tr = t
		}
		if len(tr[step.name]) == 0 {
			d = append(d, 0)
			continue
		}
		x := tr.first(step.name, at)
		if x < 0 || x >= end {
			return nil, false
		}
		d = append(d, x-at)
		at = x
	}
	return d, true
}
