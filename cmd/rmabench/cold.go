package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// coldResult is one fresh process: milliseconds from plugin.Init to the first
// completed put, by phase, on a 1-rank communicator (the put goes to self),
// so no other process's start-up is on the clock.
type coldResult struct {
	Init, Connect, Context, RegMr, Put, Total float64
}

var coldPhases = []string{"init", "connect", "context", "regmr", "put"}

func (c coldResult) phases() []float64 {
	return []float64{c.Init, c.Connect, c.Context, c.RegMr, c.Put}
}

func (c coldResult) samples(config string) []Sample {
	s := []Sample{{Metric: "cold_start", Config: config, Unit: "ms", Values: []float64{c.Total}}}
	for i, p := range c.phases() {
		s = append(s, Sample{Metric: "cold_start_" + coldPhases[i], Config: config, Unit: "ms", Values: []float64{p}})
	}
	return s
}

func mergeCold(config string, rs []coldResult) []Sample {
	if len(rs) == 0 {
		return nil
	}
	var out []Sample
	tot := Sample{Metric: "cold_start", Config: config, Unit: "ms"}
	for _, r := range rs {
		tot.Values = append(tot.Values, r.Total)
	}
	out = append(out, tot)
	for i, name := range coldPhases {
		s := Sample{Metric: "cold_start_" + name, Config: config, Unit: "ms"}
		for _, r := range rs {
			s.Values = append(s.Values, r.phases()[i])
		}
		out = append(out, s)
	}
	return out
}

func runCold(o *options) {
	os.Setenv(config.Backend.Name, o.backend)
	os.Setenv(config.Dir.Name, o.guestsAbs)
	os.Setenv(config.CacheDir.Name, o.cacheDir)
	os.Setenv(config.Addr.Name, "127.0.0.1")
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	src, dst := make([]byte, 4096), make([]byte, 4096)
	fail := func(what string, r abi.Result) {
		fatalf("cold start (%s): %s: %v", o.backend, what, r)
	}

	if p := os.Getenv("RMABENCH_CPUPROFILE"); p != "" {
		if f, err := os.Create(p); err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	t0 := time.Now()
	ctx, rc := plugin.Init(1)
	if rc != abi.Success {
		fail("init", rc)
	}
	t1 := time.Now()
	var h [abi.HandleSize]byte
	l, rc := plugin.Listen(ctx, 0, &h)
	if rc != abi.Success {
		fail("listen", rc)
	}
	coll, rc := plugin.Connect([]*[abi.HandleSize]byte{&h}, 0, l)
	if rc != abi.Success {
		fail("connect", rc)
	}
	plugin.CloseListen(l)
	t2 := time.Now()
	rma, rc := plugin.CreateContext(coll, abi.RmaConfig{NContexts: 1, TrafficClass: abi.ConfigUndefInt})
	if rc != abi.Success {
		fail("createContext", rc)
	}
	t3 := time.Now()
	srcMh, rc := plugin.RegMr(coll, addrOf(src), 4096, abi.PtrHost, 0)
	if rc != abi.Success {
		fail("regMr", rc)
	}
	dstMh, rc := plugin.RegMr(coll, addrOf(dst), 4096, abi.PtrHost, 0)
	if rc != abi.Success {
		fail("regMr", rc)
	}
	t4 := time.Now()
	req, rc := plugin.Iput(rma, 0, 0, srcMh, 8, 0, dstMh, 0, 0)
	if rc != abi.Success {
		fail("iput", rc)
	}
	for {
		done, rc := plugin.Test(coll, req)
		if rc != abi.Success {
			fail("test", rc)
		}
		if done {
			break
		}
		schedYield()
	}
	t5 := time.Now()
	r := coldResult{Init: ms(t1.Sub(t0)), Connect: ms(t2.Sub(t1)), Context: ms(t3.Sub(t2)), RegMr: ms(t4.Sub(t3)), Put: ms(t5.Sub(t4)), Total: ms(t5.Sub(t0))}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	pprof.StopCPUProfile()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
