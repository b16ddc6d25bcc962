package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

func netFileConn(f *os.File) (net.Conn, error) {
	c, err := net.FileConn(f)
	f.Close()
	return c, err
}

// Sample is one measured point: one value per repetition.
type Sample struct {
	Metric string
	Config string
	Size   uint64
	Unit   string
	Values []float64
}

type sampleSet struct {
	list []*Sample
	idx  map[string]*Sample
}

func (s *sampleSet) add(metric, config string, size uint64, unit string, v float64) {
	if s.idx == nil {
		s.idx = map[string]*Sample{}
	}
	k := fmt.Sprintf("%s|%s|%d", metric, config, size)
	p := s.idx[k]
	if p == nil {
		p = &Sample{Metric: metric, Config: config, Size: size, Unit: unit}
		s.idx[k] = p
		s.list = append(s.list, p)
	}
	p.Values = append(p.Values, v)
}

func (s *sampleSet) out() []Sample {
	o := make([]Sample, len(s.list))
	for i, p := range s.list {
		o[i] = *p
	}
	return o
}

func gbps(bytes uint64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

// drive is rank 0's schedule. Repetitions are the outer loop and the order of
// the series rotates every repetition, so slow drift of this shared machine
// spreads over all series instead of biasing one.
func (r *rankState) drive() (rankResult, error) {
	var set sampleSet
	var notes []string
	result := func() rankResult {
		return rankResult{Samples: set.out(), Notes: append(notes, r.notes...)}
	}
	if err := r.setupBaselines(); err != nil {
		return result(), fmt.Errorf("baselines: %w", err)
	}
	for i, c := range comms {
		if c.needs != "" && !exists(filepath.Join(r.opt.guests, c.needs)) {
			notes = append(notes, fmt.Sprintf("%s: %s missing; skipped", c.name, filepath.Join(r.opt.guests, c.needs)))
			continue
		}
		if (i == commFabric) != r.opt.fabricPair {
			continue // the fabric pair holds that communicator alone
		}
		t0 := time.Now()
		seen := len(fabricLines)
		if err := r.setupComm(i); err != nil {
			if i <= commIntra && !r.opt.fabricPair {
				return result(), fmt.Errorf("communicator %s: %w", c.name, err)
			}
			notes = append(notes, fmt.Sprintf("%s: setup failed: %v; skipped", c.name, err))
			continue
		}
		if i == commFabric && len(fabricLines) == seen {
			notes = append(notes, fmt.Sprintf("%s: the communicator did not use libfabric (provider %q; see the runtime's lines); skipped", c.name, r.opt.fiProvider))
			r.commClose(i)
			continue
		}
		fmt.Fprintf(os.Stderr, "rmabench: communicator %s (backend %s, INTRANODE=%s) up and verified in %v\n",
			c.name, c.backend, c.intra, time.Since(t0).Round(time.Microsecond))
	}
	if len(transportLines) > 0 {
		for _, l := range transportLines {
			notes = append(notes, "runtime says: "+l)
		}
	}

	fabOK := false
	if r.opt.fabricPair && r.comms[commFabric].ok {
		if err := r.setupFabRaw(); err != nil {
			notes = append(notes, fmt.Sprintf("raw libfabric baseline (%s) unavailable: %v; fabric series skipped", r.opt.fiProvider, err))
		} else if _, err := r.fabBW(1<<20, 16); err != nil {
			return result(), fmt.Errorf("warm-up raw-fi-write: %w", err)
		} else {
			fabOK = true
		}
	} else if r.opt.fabricPair {
		notes = append(notes, fmt.Sprintf("fabric series skipped: no plugin-fabric communicator over %q", r.opt.fiProvider))
	}

	// Warm-up: TCP windows, page tables, guest instances.
	for _, ci := range []int{commTCP, commIntra, commDefault, commPlanner, commTelemetry, commSealed, commFabric} {
		if r.comms[ci].ok {
			if _, _, _, err := r.plugBW(ci, 1<<20, 64, false); err != nil {
				return result(), fmt.Errorf("warm-up %s: %w", comms[ci].name, err)
			}
		}
	}
	if _, err := r.rawTCPBW(1<<20, 64); err != nil {
		return result(), err
	}
	if _, err := r.pvwBW(1<<20, 64); err != nil {
		notes = append(notes, fmt.Sprintf("raw process_vm_writev unavailable: %v", err))
		r.pvwPid = 0
	}

	type series struct {
		name string
		run  func(size, n uint64) (time.Duration, error)
	}
	bw := []series{
		{"raw-tcp", r.rawTCPBW},
		{comms[commTCP].name, func(s, n uint64) (time.Duration, error) { d, _, _, e := r.plugBW(commTCP, s, n, false); return d, e }},
		{comms[commIntra].name, func(s, n uint64) (time.Duration, error) { d, _, _, e := r.plugBW(commIntra, s, n, false); return d, e }},
		{"raw-pvw", r.pvwBW},
		{"memcpy", func(s, n uint64) (time.Duration, error) { return r.memcpyBW(s, n), nil }},
	}
	if r.comms[commSealed].ok {
		bw = append(bw, series{comms[commSealed].name, func(s, n uint64) (time.Duration, error) {
			d, _, _, e := r.plugBW(commSealed, s, n, false)
			return d, e
		}})
	}
	rates := []int{commTCP, commDefault, commPlanner, commTelemetry}
	r.fillCompressionData()
	for rep := 0; rep < r.opt.reps; rep++ {
		t0 := time.Now()
		for _, size := range sizes {
			if !r.opt.runs("bw") {
				break
			}
			n := r.count(size)
			for j := range bw {
				s := bw[(j+rep)%len(bw)]
				if s.name == "raw-pvw" && r.pvwPid == 0 {
					continue
				}
				d, err := s.run(size, n)
				if err != nil {
					return result(), fmt.Errorf("%s %d B: %w", s.name, size, err)
				}
				set.add("put_bw", s.name, size, "GB/s", gbps(n*size, d))
			}
		}
		// 8-byte message rates. A point is short (tens of ms) and the
		// ratio of two of them moves by +-10% with the scheduling of two
		// processes on a shared machine, so each repetition measures it
		// rateRounds times: more pairs for the median, little more time.
		for round := 0; round < r.opt.rateRounds; round++ {
			// 8-byte message rate and allocations per op, per backend.
			for _, ci := range r.rateOrder(rates, rep+round) {
				name := rateName(ci)
				d, mine, theirs, err := r.plugBW(ci, 8, r.opt.msgOps, true)
				if err != nil {
					return result(), fmt.Errorf("message rate %s: %w", name, err)
				}
				set.add("msg_rate", name, 8, "Mops/s", float64(r.opt.msgOps+1)/d.Seconds()/1e6)
				set.add("allocs_per_op", name+"/initiator", 8, "allocs/op", mine)
				set.add("allocs_per_op", name+"/target", 8, "allocs/op", theirs)
			}
			// The same with the aggregation hint on every put (NCCL's
			// OptFlagAggregateRequests): native, the per-op hook, and the
			// batched planning export (Guest ABI v1.1).
			aggs := []int{commTCP, commPlanner, commBatch}
			for _, ci := range r.rateOrder(aggs, rep+round) {
				name := rateName(ci)
				r.optFlags = abi.OptFlagAggregateRequests
				d, mine, _, err := r.plugBW(ci, 8, r.opt.msgOps, true)
				r.optFlags = 0
				if err != nil {
					return result(), fmt.Errorf("aggregated message rate %s: %w", name, err)
				}
				set.add("msg_rate_agg", name, 8, "Mops/s", float64(r.opt.msgOps+1)/d.Seconds()/1e6)
				set.add("allocs_per_op_agg", name+"/initiator", 8, "allocs/op", mine)
			}
		}
		// 8-byte ping-pong, half round trip.
		pings := []func() error{
			func() error {
				d, err := r.rawPing(r.opt.pingIters)
				set.add("half_rtt", "raw-tcp", 8, "us", float64(d)/1e3)
				return err
			},
			func() error {
				d, err := r.plugPing(commTCP, r.opt.pingIters)
				set.add("half_rtt", comms[commTCP].name, 8, "us", float64(d)/1e3)
				return err
			},
			func() error {
				d, err := r.plugPing(commIntra, r.opt.pingIters)
				set.add("half_rtt", comms[commIntra].name, 8, "us", float64(d)/1e3)
				return err
			},
		}
		if r.comms[commSealed].ok {
			pings = append(pings, func() error {
				d, err := r.plugPing(commSealed, r.opt.pingIters)
				set.add("half_rtt", comms[commSealed].name, 8, "us", float64(d)/1e3)
				return err
			})
		}
		for j := range pings {
			if !r.opt.runs("ping") {
				break
			}
			if err := pings[(j+rep)%len(pings)](); err != nil {
				return result(), fmt.Errorf("ping-pong: %w", err)
			}
		}
		if fabOK {
			if err := r.fabricSeries(&set, rep); err != nil {
				return result(), fmt.Errorf("fabric: %w", err)
			}
		}
		if r.opt.runs("compress") {
			if err := r.compression(&set, rep); err != nil {
				return result(), fmt.Errorf("compression: %w", err)
			}
		}
		fmt.Fprintf(os.Stderr, "rmabench: repetition %d/%d done in %v\n", rep+1, r.opt.reps, time.Since(t0).Round(time.Millisecond))
	}
	m := msg{Op: opQuit}
	if err := r.k.call(&m); err != nil {
		notes = append(notes, fmt.Sprintf("teardown on rank 1: %v", err))
	}
	t0 := time.Now()
	for i := range r.comms {
		r.commClose(i)
	}
	r.fab.close()
	if d := time.Since(t0); d > time.Second {
		notes = append(notes, fmt.Sprintf("closing %d communicators took %v on rank 0", len(comms), d.Round(time.Millisecond)))
	}
	return result(), nil
}

// rateOrder returns the communicators of cs that the message-rate series
// measure (none when -series leaves "rate" out), rotated by k so that none
// always runs first.
func (r *rankState) rateOrder(cs []int, k int) []int {
	var out []int
	for j := range cs {
		if ci := cs[(j+k)%len(cs)]; r.comms[ci].ok && r.opt.runs("rate") {
			out = append(out, ci)
		}
	}
	return out
}

// rateName is communicator ci's configuration in the message-rate series:
// plain TCP is "native".
func rateName(ci int) string {
	if ci == commTCP {
		return "native"
	}
	return comms[ci].name
}
