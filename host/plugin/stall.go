package plugin

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/ring"
)

// The stall report (NCCL_RMA_WASM_STALL_REPORT_MS, off by default). A job
// that hangs inside a GPU kernel waiting for a signal shows nothing: the
// kernel spins, NCCL's proxy keeps calling test(), no error is raised. So
// when one request of a context has been pending for the period, the
// plugin says what it holds: how many requests are pending per peer and
// kind, the oldest one, and for every never-reset signal registration
// each word whose host shadow and device value differ (a lost or late
// signal write) or that is non-zero. One report per period at most, and
// only while something is stuck; the data path pays for it only when the
// variable is set (a stamp per request).

// stallStamp records what a request is, for the report; issue calls it
// only when r.stallOn.
type stallStamp struct {
	since atomic.Int64  // nanotime at issue
	what  atomic.Uint64 // kind<<56 | ctx<<40 | peer
	size  atomic.Uint64
}

func (q *request) stamp(kind backend.OpKind, ctx int32, peer uint32, size uint64) {
	q.st.since.Store(nanotime())
	q.st.what.Store(uint64(kind)<<56 | uint64(uint16(ctx))<<40 | uint64(peer))
	q.st.size.Store(size)
}

// The op trace: the last opTraceLen operations issued and completed in
// this process, written out with the goroutines (SIGUSR2, a stall).
const opTraceLen = 512

type opEntry struct {
	at, what, size, off, sig, handle atomic.Uint64
}

var opTrace = ring.NewLog[opEntry](opTraceLen)

// traceOp records an issued operation (done false) or a completion test()
// reported (done true; off is its status).
func traceOp(kind backend.OpKind, done bool, ctx int32, peer uint32, size, off, sig, handle uint64) {
	e := opTrace.Claim()
	d := uint64(0)
	if done {
		d = 1
	}
	e.at.Store(uint64(nanotime()))
	e.what.Store(uint64(kind)<<56 | d<<48 | uint64(uint16(ctx))<<32 | uint64(peer))
	e.size.Store(size)
	e.off.Store(off)
	e.sig.Store(sig)
	e.handle.Store(handle)
}

func writeOpTrace(w io.Writer) {
	first, n := opTrace.Window()
	fmt.Fprintf(w, "=== NET/wasm operations %d..%d (time since init, call, context, peer, size, remote offset, signal offset, request)\n", first, n)
	for i := first; i < n; i++ {
		e := opTrace.At(i)
		wh := e.what.Load()
		if wh>>48&1 == 1 {
			fmt.Fprintf(w, "  %12v done %s rank %d status %d request %#x\n", time.Duration(e.at.Load()), callName(backend.OpKind(wh>>56)), uint32(wh), e.off.Load(), e.handle.Load())
			continue
		}
		fmt.Fprintf(w, "  %12v %s ctx %d rank %d %d B off %d sig %d request %#x\n", time.Duration(e.at.Load()), callName(backend.OpKind(wh>>56)),
			uint16(wh>>32), uint32(wh), e.size.Load(), e.off.Load(), e.sig.Load(), e.handle.Load())
	}
}

// startStallReport starts the reporter of r when the variable is set.
func (r *rmaCtx) startStallReport() {
	period := config.StallReport.Get()
	if period <= 0 {
		return
	}
	r.stallOn = true
	staging.SetTrace(true)
	stackOnSignal.Do(func() {
		// SIGUSR2 dumps the goroutines at once (a hang can be looked
		// into before the period passes, or where it never triggers).
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGUSR2)
		go func() {
			for range ch {
				dumpStacks()
			}
		}()
	})
	go r.watchStalls(period)
}

var stackOnSignal sync.Once

func (r *rmaCtx) watchStalls(period time.Duration) {
	t := time.NewTicker(min(period/4+time.Millisecond, time.Second))
	defer t.Stop()
	var last, polledAt, stuckSaid int64
	var polls uint64
	for range t.C {
		if r.closed.Load() || r.c.closed.Load() {
			return
		}
		now := nanotime()
		// A caller that polled (rmaProgress, test) and stopped is blocked
		// somewhere, in the plugin or not: say so once, with the stacks.
		if n := r.polls.Load(); n != polls {
			polls, polledAt = n, now
		} else if polls != 0 && now-polledAt >= int64(period) && stuckSaid != polledAt {
			stuckSaid = polledAt
			logx.Warn(abi.SubsysNet, "NET/wasm: stall report: rank %d, rma context %#x: rmaProgress and test() were polled %d times and not once in the last %v: the polling thread is blocked; the plugin's goroutines follow on stderr",
				r.c.rank, rmas.handle(r.id), polls, time.Duration(now-polledAt).Round(time.Millisecond))
			dumpStacks()
			r.c.reportShadows()
		}
		if now-last < int64(period) {
			continue
		}
		if r.reportStalls(now, period) {
			last = now
		}
	}
}

// dumpStacks writes every goroutine's stack to stderr: a thread of the
// caller blocked inside the plugin (a CUDA call, a lock) shows there as
// a goroutine in a cgo call or waiting.
func dumpStacks() {
	buf := make([]byte, 4<<20)
	n := runtime.Stack(buf, true)
	fmt.Fprintf(os.Stderr, "=== NET/wasm stall report: goroutines of pid %d\n%s=== end of goroutines\n", os.Getpid(), buf[:n])
	writeOpTrace(os.Stderr)
	staging.WriteTrace(os.Stderr)
	staging.WriteQueues(os.Stderr)
	if p := colls.slots.Load(); p != nil {
		for _, c := range *p {
			if c != nil && c.mesh != nil {
				c.mesh.WriteState(os.Stderr)
			}
		}
	}
}

type stallKey struct {
	peer uint32
	kind backend.OpKind
}

// reportStalls logs the report when a request is older than period and
// says whether it did.
func (r *rmaCtx) reportStalls(now int64, period time.Duration) bool {
	r.reqs.mu.Lock()
	n := r.reqs.nslabs
	r.reqs.mu.Unlock()
	counts := map[stallKey]int{}
	pending := 0
	var oldest *request
	var oldestAge int64
	for s := 0; s < n; s++ {
		sl := r.reqs.slabs[s].Load()
		if sl == nil {
			continue
		}
		for i := range sl {
			q := &sl[i]
			if q.state.Load() != reqPending {
				continue
			}
			pending++
			w := q.st.what.Load()
			counts[stallKey{uint32(w), backend.OpKind(w >> 56)}]++
			if age := now - q.st.since.Load(); age > oldestAge {
				oldest, oldestAge = q, age
			}
		}
	}
	if oldest == nil || oldestAge < int64(period) {
		return false
	}
	w := oldest.st.what.Load()
	logx.Warn(abi.SubsysNet, "NET/wasm: stall report (NCCL_RMA_WASM_STALL_REPORT_MS): rank %d, rma context %#x: %d request(s) pending; the oldest, %v old: %s to rank %d, context %d, %d bytes, %d part(s) outstanding",
		r.c.rank, rmas.handle(r.id), pending, time.Duration(oldestAge).Round(time.Millisecond), callName(backend.OpKind(w>>56)),
		uint32(w), uint16(w>>40), oldest.st.size.Load(), oldest.parts.Load())
	keys := make([]stallKey, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].peer < keys[j].peer || keys[i].peer == keys[j].peer && keys[i].kind < keys[j].kind
	})
	var b strings.Builder
	for i, k := range keys {
		if i == 16 {
			fmt.Fprintf(&b, " ... (%d more)", len(keys)-i)
			break
		}
		fmt.Fprintf(&b, " rank %d %s x%d;", k.peer, callName(k.kind), counts[k])
	}
	logx.Warn(abi.SubsysNet, "NET/wasm: stall report: pending by peer:%s", b.String())
	r.c.reportShadows()
	return true
}

// reportShadows logs, for every never-reset signal registration, the words
// that are non-zero on either side, with both values.
func (c *coll) reportShadows() {
	for _, m := range *c.regs.byID.Load() {
		if m == nil || m.shadow == nil {
			continue
		}
		// A pin keeps deregMrSym from freeing the memory under the read.
		m.pins.Add(1)
		if m.dropped.Load() {
			m.pins.Add(-1)
			continue
		}
		var b strings.Builder
		words := 0
		err := m.shadow.Compare(m.devCtx, func(i int, host, dev uint64) {
			if words++; words <= 32 {
				mark := ""
				if host != dev {
					mark = " DIFFERS"
				}
				fmt.Fprintf(&b, " [%d] host %d device %d%s;", i, host, dev, mark)
			}
		})
		if err != nil {
			fmt.Fprintf(&b, " (reading the device words failed: %v)", err)
		}
		logx.Warn(abi.SubsysNet, "NET/wasm: stall report: signal registration %d (%d bytes, never-reset): %d non-zero word(s) (%d folded adds):%s",
			m.id, m.size, words, m.shadow.Folds(), b.String())
		m.pins.Add(-1)
	}
}
