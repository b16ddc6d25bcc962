package dataplane_test

// The scale simulation: one real rank (this process) against 1,024 peers
// hosted by four helper processes (this test binary again, 256 listeners
// and meshes each), all on loopback. A peer connects only to the real rank
// and itself (Options.Peers), so the simulation costs 2 x 1,024 streams
// for the rank instead of the million a full mesh of 1,025 would need.
// The real rank's cost per peer (file descriptors, RSS, CPU, connect
// time) is what BenchmarkScale reports and SPEC.md quotes.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

const (
	scaleSlot    = 512 // per-peer slot of the rank's memory: signal word, payload
	scalePayload = scaleSlot - 8
	scaleEnv     = "RMA_SCALE_HELPER" // "first count total lanes stride": run as a helper
)

// scalePattern is the byte at offset i of what rank from sends to rank to.
func scalePattern(from, to, i int) byte { return byte(from*31 + to*7 + i*13 + 1) }

// poisonByte is what a helper writes over a put's source once the put
// completed (TestScaleHelper).
const poisonByte = 0xee

// scaleSampled reports whether traffic goes to and from rank r (of the
// peers 1..): one in stride, plus the last.
func scaleSampled(r, stride, total int) bool { return (r-1)%stride == 0 || r == total }

// scaleResult is what one run measured at the real rank.
type scaleResult struct {
	peers, lanes     int
	connect          time.Duration // Connect's wall time
	cpu              time.Duration // user+system CPU of the process during Connect
	fds              int           // descriptors the mesh added
	rssKiB           int64         // RSS the mesh added, after a GC
	helperCPU        time.Duration // the helpers' CPU during their Connects
	helperRSSPerPeer int64         // helper RSS per hosted peer (KiB), after connect
	verified         int           // sampled peers whose traffic checked out
}

// runScale runs the simulation with peers peers in procs helpers.
func runScale(tb testing.TB, peers, procs, lanes, stride int) scaleResult {
	tb.Helper()
	res := scaleResult{peers: peers, lanes: lanes}
	total := peers + 1
	type helper struct {
		cmd   *exec.Cmd
		in    io.WriteCloser
		lines chan string
	}
	hs := make([]*helper, procs)
	handles := make([]*wire.Handle, total)
	l, h0, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	handles[0] = h0
	per := peers / procs
	for i := range hs {
		first, count := 1+i*per, per
		if i == procs-1 {
			count = peers - i*per
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestScaleHelper$", "-test.v=false")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %d %d %d %d", scaleEnv, first, count, total, lanes, stride))
		cmd.Stderr = os.Stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		h := &helper{cmd: cmd, in: in, lines: make(chan string, 64)}
		hs[i] = h
		go func() {
			sc := bufio.NewScanner(out)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				h.lines <- sc.Text()
			}
			close(h.lines)
		}()
		defer func() {
			h.in.Close()
			done := make(chan struct{})
			go func() { h.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				h.cmd.Process.Kill()
				<-done
			}
		}()
	}
	// next reads a helper's next line with the given prefix (others are
	// test framework output), failing on EOF or after 60 s.
	next := func(h *helper, prefix string) []string {
		t := time.NewTimer(60 * time.Second)
		defer t.Stop()
		for {
			select {
			case s, ok := <-h.lines:
				if !ok {
					tb.Fatalf("helper exited while waiting for %q", prefix)
				}
				if f := strings.Fields(s); len(f) > 0 && f[0] == prefix {
					return f[1:]
				}
			case <-t.C:
				tb.Fatalf("no %q line from a helper in 60 s", prefix)
			}
		}
	}
	for i, h := range hs {
		count := per
		if i == procs-1 {
			count = peers - i*per
		}
		for range count {
			f := next(h, "H")
			r, _ := strconv.Atoi(f[0])
			b, err := hex.DecodeString(f[1])
			if err != nil || r < 1 || r >= total || len(b) != len(wire.Handle{}) {
				tb.Fatalf("bad handle line %v", f)
			}
			handles[r] = new(wire.Handle)
			copy(handles[r][:], b)
		}
	}
	var all bytes.Buffer
	for _, h := range handles {
		fmt.Fprintf(&all, "%x\n", h[:])
	}
	owner := &meshtest.MemOwner{Mem: make([]byte, total*scaleSlot), Done: map[uint64]abi.Result{}}
	runtime.GC()
	debug.FreeOSMemory()
	fd0, rss0, cpu0 := settledFDs(tb), rssKiB(tb), cpuTime()
	for _, h := range hs {
		if _, err := h.in.Write(all.Bytes()); err != nil {
			tb.Fatal(err)
		}
	}
	start := time.Now()
	m, err := dataplane.Connect(l, handles, 0, owner, dataplane.Options{Timeout: 60 * time.Second, Lanes: lanes, CloseTimeout: 10 * time.Second})
	res.connect = time.Since(start)
	res.cpu = cpuTime() - cpu0
	if err != nil {
		tb.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			m.Close()
		}
	}()
	for _, h := range hs {
		f := next(h, "C")
		us, _ := strconv.ParseInt(f[0], 10, 64)
		kib, _ := strconv.ParseInt(f[1], 10, 64)
		res.helperCPU += time.Duration(us) * time.Microsecond
		res.helperRSSPerPeer = max(res.helperRSSPerPeer, kib)
	}
	// The helpers are connected and idle; so is this rank.
	runtime.GC()
	debug.FreeOSMemory()
	res.fds, res.rssKiB = countFDs(tb)-fd0, rssKiB(tb)-rss0

	// Traffic: to every sampled peer a put (no signal), then a put with
	// an increment, then a get of what the peer wrote to itself; the peer
	// checks its slot when its signal is 1 and puts back with a signal.
	// Options' zero StripeThreshold stripes every put: a piece per put on
	// the lanes in turn (0, then 1), the signal on lane (r+1)%lanes; each
	// request is done after all its parts (Mesh.OpParts).
	src := make([]byte, total*scaleSlot)
	gets := make([]byte, total*scaleSlot)
	parts := make([]int, 3*total) // by tag: the completions each request gets
	sampled := 0
	for r := 1; r < total; r++ {
		if !scaleSampled(r, stride, peers) {
			continue
		}
		sampled++
		s := src[r*scaleSlot : (r+1)*scaleSlot]
		for i := range s {
			s[i] = scalePattern(0, r, i)
		}
		half := uint64(scalePayload / 2)
		// Over lanes that open now: the signal waits for both pieces.
		ops := [2]*dataplane.Op{{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: uint64(3 * r), Local: unsafe.Pointer(&s[8]), Size: half, Off: 8}},
			{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: uint64(3*r + 1), Local: unsafe.Pointer(&s[8+half]), Size: scalePayload - half, Off: 8 + half}}}
		for k, op := range ops {
			parts[3*r+k] = m.OpParts(r, op)
			m.Post(r, op, false, (r+k)%lanes)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for r := 1; r < total; r++ {
		if !scaleSampled(r, stride, peers) {
			continue
		}
		w := (*uint64)(unsafe.Pointer(&owner.Mem[r*scaleSlot]))
		for atomic.LoadUint64(w) != 1 {
			if time.Now().After(deadline) {
				tb.Fatalf("no signal from rank %d", r)
			}
			time.Sleep(time.Millisecond)
		}
		for i := 8; i < scaleSlot; i++ {
			if got := owner.Mem[r*scaleSlot+i]; got != scalePattern(r, 0, i) {
				if got == poisonByte && scalePattern(r, 0, i) != poisonByte {
					tb.Fatalf("byte %d from rank %d is the poison its sender wrote once the put completed: the payload was read after completion", i, r)
				}
				tb.Fatalf("byte %d from rank %d is %d, want %d", i, r, got, scalePattern(r, 0, i))
			}
		}
		// Read back what landed at the peer, signal word included.
		get := &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: uint64(3*r + 2), Local: unsafe.Pointer(&gets[r*scaleSlot]), Size: scaleSlot, Off: 0}}
		parts[3*r+2] = m.OpParts(r, get)
		m.Post(r, get, false, r%lanes)
	}
	for r := 1; r < total; r++ {
		if !scaleSampled(r, stride, peers) {
			for i := range scaleSlot {
				if owner.Mem[r*scaleSlot+i] != 0 {
					tb.Fatalf("rank %d, never sent to, wrote byte %d", r, i)
				}
			}
			continue
		}
		for k := range 3 {
			if st := meshtest.WaitRequestWithin(tb, owner, uint64(3*r+k), parts[3*r+k], 30*time.Second); st != abi.Success {
				tb.Fatalf("operation %d to rank %d: %v", k, r, st)
			}
		}
		g := gets[r*scaleSlot : (r+1)*scaleSlot]
		if binary.LittleEndian.Uint64(g) != 1 {
			tb.Fatalf("rank %d's signal word read back as %d, want 1", r, binary.LittleEndian.Uint64(g))
		}
		if !bytes.Equal(g[8:], src[r*scaleSlot+8:(r+1)*scaleSlot]) {
			tb.Fatalf("rank %d's memory read back differs from what was put", r)
		}
	}
	for _, h := range hs {
		f := next(h, "V")
		n, _ := strconv.Atoi(f[0])
		res.verified += n
		if f[1] != "ok" {
			tb.Fatalf("a helper's check failed: %s", strings.Join(f[1:], " "))
		}
	}
	if res.verified != sampled {
		tb.Fatalf("helpers verified %d peers, %d sampled", res.verified, sampled)
	}
	if len(owner.Failed) > 0 {
		tb.Fatalf("peers failed: %v", owner.Failed[0])
	}
	for _, h := range hs {
		h.in.Close() // the helpers close their meshes
	}
	closed = true
	if err := m.Close(); err != nil {
		tb.Fatal(err)
	}
	return res
}

func countFDs(tb testing.TB) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(es)
}

// settledFDs is countFDs once sockets that earlier tests closed have gone
// (the count holds still for 50 ms, waiting at most 3 s): a descriptor
// still closing when the baseline is taken would come off the mesh's count.
func settledFDs(tb testing.TB) int {
	n := countFDs(tb)
	for range 60 {
		time.Sleep(50 * time.Millisecond)
		m := countFDs(tb)
		if m == n {
			break
		}
		n = m
	}
	return n
}

// rssKiB is the process's resident set (VmRSS).
func rssKiB(tb testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	tb.Fatal("no VmRSS")
	return 0
}

// cpuTime is the process's user plus system CPU (getrusage).
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestScale1024 connects one rank to 1,024 peers in four processes, with
// four lanes, and checks every byte and signal exchanged with a sample of
// them (one in 64 and the last) over lanes that open for it, and that
// after connect the rank holds exactly 2 descriptors per peer: lane 0
// dialled and accepted (the other lanes open when first used).
func TestScale1024(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 1,024 peers in four processes")
	}
	res := runScale(t, 1024, 4, 4, 64)
	if want := 2 * 1025; res.fds != want {
		t.Errorf("the mesh holds %d descriptors, want %d (2 per peer, itself included)", res.fds, want)
	}
	t.Logf("1,024 peers: connect %v, CPU %v, %d fds, %d KiB RSS (%.1f KiB a peer), %d peers verified",
		res.connect, res.cpu, res.fds, res.rssKiB, float64(res.rssKiB)/1024, res.verified)
}

// BenchmarkScale is the measurement SPEC.md quotes: per peer of one rank
// connected to 256 and 1,024, with one lane and four (make bench-scale).
func BenchmarkScale(b *testing.B) {
	for _, c := range []struct{ peers, lanes int }{{256, 1}, {1024, 1}, {1024, 4}} {
		b.Run(fmt.Sprintf("peers=%d/lanes=%d", c.peers, c.lanes), func(b *testing.B) {
			peers := c.peers
			var r scaleResult
			for range b.N {
				r = runScale(b, peers, 4, c.lanes, 64)
			}
			n := float64(peers)
			b.ReportMetric(r.connect.Seconds(), "connect-s")
			b.ReportMetric(float64(r.cpu.Microseconds())/n, "cpu-µs/peer")
			b.ReportMetric(float64(r.helperCPU.Microseconds())/n, "peer-cpu-µs/peer")
			b.ReportMetric(float64(r.fds)/n, "fds/peer")
			b.ReportMetric(float64(r.rssKiB)/n, "rss-KiB/peer")
			b.ReportMetric(float64(r.helperRSSPerPeer), "helper-rss-KiB/hosted-peer")
		})
	}
}

// TestScaleHelper is a helper process of runScale (it does nothing unless
// RMA_SCALE_HELPER is set): it hosts count peers from rank first, prints
// their handles, reads every handle, connects them all to rank 0, checks
// the traffic of the sampled ones and closes when its stdin closes.
func TestScaleHelper(t *testing.T) {
	spec := os.Getenv(scaleEnv)
	if spec == "" {
		t.Skip("runs as runScale's helper process only")
	}
	var first, count, total, lanes, stride int
	if _, err := fmt.Sscan(spec, &first, &count, &total, &lanes, &stride); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewWriter(os.Stdout)
	ls := make([]*dataplane.Listener, count)
	for i := range ls {
		l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls[i] = l
		fmt.Fprintf(out, "H %d %x\n", first+i, h[:])
	}
	out.Flush()
	in := bufio.NewScanner(os.Stdin)
	handles := make([]*wire.Handle, total)
	for i := range handles {
		if !in.Scan() {
			t.Fatal("stdin closed before every handle arrived")
		}
		b, err := hex.DecodeString(in.Text())
		if err != nil || len(b) != len(wire.Handle{}) {
			t.Fatalf("handle %d: %v", i, err)
		}
		handles[i] = new(wire.Handle)
		copy(handles[i][:], b)
	}
	owners := make([]*meshtest.MemOwner, count)
	ms := make([]*dataplane.Mesh, count)
	cpu0 := cpuTime()
	var wg sync.WaitGroup
	for i := range ms {
		owners[i] = &meshtest.MemOwner{Mem: make([]byte, scaleSlot), Done: map[uint64]abi.Result{}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := dataplane.Connect(ls[i], handles, first+i, owners[i], dataplane.Options{Timeout: 60 * time.Second, Lanes: lanes, CloseTimeout: 10 * time.Second, Peers: []int{0}})
			if err != nil {
				t.Error(err)
			}
			ms[i] = m
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	runtime.GC()
	fmt.Fprintf(out, "C %d %d\n", (cpuTime() - cpu0).Microseconds(), rssKiB(t)/int64(count))
	out.Flush()
	verified, verdict := 0, "ok"
	src := make([]byte, scaleSlot)
	for i, m := range ms {
		r := first + i
		if !scaleSampled(r, stride, total-1) {
			continue
		}
		o := owners[i]
		w := (*uint64)(unsafe.Pointer(&o.Mem[0]))
		deadline := time.Now().Add(60 * time.Second)
		for atomic.LoadUint64(w) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d: no signal from rank 0", r)
			}
			time.Sleep(time.Millisecond)
		}
		for j := 8; j < scaleSlot && verdict == "ok"; j++ {
			if o.Mem[j] != scalePattern(0, r, j) {
				verdict = fmt.Sprintf("rank %d byte %d is %d, want %d", r, j, o.Mem[j], scalePattern(0, r, j))
			}
		}
		for j := range src {
			src[j] = scalePattern(r, 0, j)
		}
		tag := uint64(r)
		op := &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, SigOff: uint64(r * scaleSlot), Tag: tag, Local: unsafe.Pointer(&src[8]), Size: scalePayload, Off: uint64(r*scaleSlot + 8)}}
		// Striped (Options' zero StripeThreshold): a piece on lane 0 and
		// the signal on lane r%lanes, each completing on its own lane's
		// ack. The request is done when both are: the signal's part may
		// complete while the piece still waits in lane 0's queue
		// (TestSignalPartBeforeItsPiece).
		parts := m.OpParts(0, op)
		m.Post(0, op, false, r%lanes)
		if st := meshtest.WaitRequestWithin(t, o, tag, parts, 30*time.Second); st != abi.Success {
			verdict = fmt.Sprintf("rank %d's put to rank 0: %v", r, st)
			// Said at once, with the mesh's lanes: rank 0 checks the
			// bytes before it reads the verdicts, and a failed put that
			// is written later would land as the poison below.
			fmt.Fprintf(os.Stderr, "scale helper: rank %d's put to rank 0 completed with %v; its source is poisoned now\n", r, st)
			m.WriteState(os.Stderr)
		}
		// Completion means arrival: the source may be reused at once. It
		// is poisoned here, so a payload read after its put completed
		// lands as poisonByte at rank 0, which says so by name. (It once
		// landed so, and once as the next rank's pattern, while this
		// waited for the first completion of the tag, the signal's part.)
		for j := range src {
			src[j] = poisonByte
		}
		verified++
	}
	for i, o := range owners {
		if !scaleSampled(first+i, stride, total-1) && !bytes.Equal(o.Mem, make([]byte, scaleSlot)) {
			verdict = fmt.Sprintf("rank %d, never sent to, received bytes", first+i)
		}
	}
	fmt.Fprintf(out, "V %d %s\n", verified, verdict)
	out.Flush()
	io.Copy(io.Discard, os.Stdin) // until runScale closes it
	for _, m := range ms {
		m.Close()
	}
}
