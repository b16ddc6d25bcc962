package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// bufSize is the registered source and destination size: the largest put.
const bufSize = 64 << 20

// commCfg is one plugin configuration. Every one gets its own communicator
// (init, listen, connect, createContext, regMr) created with its variables
// set, and all of them stay open side by side so that repetitions of
// different configurations can be interleaved.
type commCfg struct {
	name    string // series name
	backend string // NCCL_RMA_WASM_BACKEND
	intra   string // NCCL_RMA_WASM_INTRANODE
	config  string // NCCL_RMA_WASM_CONFIG
	needs   string // guest module file needed under -guests
	encrypt string // NCCL_RMA_WASM_ENCRYPT
	// NCCL_RMA_WASM_TRANSPORT and NCCL_RMA_WASM_FI_PROVIDER (empty: unset)
	transport, provider string
}

const (
	commTCP = iota
	commIntra
	commDefault
	commPlanner
	commTelemetry
	commS2
	commZstd
	commBatch
	commSealed
	commFabric
)

var comms = []commCfg{
	commTCP:   {name: "plugin-tcp", backend: "native", intra: "0"},
	commIntra: {name: "plugin-intranode", backend: "native", intra: "1"},
	// The message-rate comparison runs all three backends over TCP, the
	// faster path for 8-byte puts (one batched writev for many puts; the
	// intra-node path makes one process_vm_writev per put), so a per-op cost
	// of the backend shows instead of hiding behind the transport.
	commDefault: {name: "default", backend: "default", intra: "0"},
	// lanes=1 keeps the data path identical to native, so the difference is
	// the per-op hook (rmaw_plan_op) alone...
	commPlanner: {name: "planner", backend: "planner", intra: "0", config: "lanes=1, completions=0", needs: "planner.wasm"},
	// ...and here the per-op hook plus batched completion telemetry, which
	// adds two clock reads per op on the host side.
	commTelemetry: {name: "planner+telemetry", backend: "planner", intra: "0", config: "lanes=1", needs: "planner.wasm"},
	// Wire compression (Guest ABI v1.1 conn.codec) over TCP, otherwise the
	// plugin-tcp configuration: the plan11 guest only sets the codec.
	commS2:   {name: "plugin-tcp-s2", backend: "plan11", intra: "0", config: "codec=1", needs: "plan11.wasm"},
	commZstd: {name: "plugin-tcp-zstd1", backend: "plan11", intra: "0", config: "codec=2, level=1", needs: "plan11.wasm"},
	// Guest ABI v1.1 batched planning: a planner that plans every op, the
	// aggregated ones in batches (rmaw_plan_ops).
	commBatch: {name: "planner-batch", backend: "plan11", intra: "0", config: "lanes=1, plan=1, batch=1", needs: "plan11.wasm"},
	// The TCP path with every stream sealed (X25519 + AES-256-GCM), next to
	// plugin-tcp: the cost of encryption.
	commSealed: {name: "plugin-tcp-encrypted", backend: "native", intra: "0", encrypt: "1"},
	// The libfabric transport (provider from -fi-provider), next to raw
	// fi_write / fi_writedata (fabric.go).
	commFabric: {name: "plugin-fabric", backend: "native", intra: "0", transport: "fabric"},
}

// Series kinds of opBW / opPing (low byte of A; comm index in the next).
const (
	kindRawTCP = 1
	kindPVW    = 2
	kindPlugin = 3
	kindRawFab = 4
	flagAllocs = 1 << 16
)

type commState struct {
	ok                  bool
	ctx, listen         uint64
	coll, rma           uint64
	srcMh, dstMh, sigMh uint64
	sig                 []byte
	sent, recvd         uint64 // signals sent to / received from the peer
}

type rankState struct {
	rank   int
	opt    *options
	k      *ctl
	src    []byte // registered source (both ranks)
	dst    []byte // registered destination; also the raw baselines' target
	local  []byte // rank 0: memcpy destination
	flag   []byte // rank 1: process_vm_writev completion word
	comms  []*commState
	raw    net.Conn
	pvwPid int
	pvwDst uintptr
	pvwFlg uintptr
	flagN  uint64
	ring   []uint64
	notes  []string
	// plugBW reads its source from src[srcBase:srcBase+span] and writes
	// dst[:span] (the compression series pick the data this way).
	srcBase, span uint64
	// optFlags go with plugBW's puts (the final signal has none).
	optFlags uint32
	fab      *fabRaw // the raw libfabric baselines' endpoint (fabric.go)
}

func mmap(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		fatalf("mmap %d bytes: %v", n, err)
	}
	for i := 0; i < n; i += 4096 {
		b[i] = byte(i >> 12)
	}
	return b
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func word(b []byte) *uint64 { return (*uint64)(unsafe.Pointer(&b[0])) }

func newRank(rank int, opt *options, k *ctl) *rankState {
	r := &rankState{rank: rank, opt: opt, k: k, ring: make([]uint64, maxWindow), span: bufSize}
	r.src, r.dst = mmap(bufSize), mmap(bufSize)
	if rank == 0 {
		r.local = mmap(bufSize)
	} else {
		r.flag = mmap(4096)
	}
	r.comms = make([]*commState, len(comms))
	for i := range r.comms {
		r.comms[i] = &commState{}
	}
	return r
}

// setEnv applies one configuration's variables; host/config reads them with
// os.Getenv in a pure-Go program, at init (backend) and connect (transport).
func (r *rankState) setEnv(c commCfg) {
	os.Setenv(config.Backend.Name, c.backend)
	os.Setenv(config.IntraNode.Name, c.intra)
	os.Setenv(config.BackendConfig.Name, c.config)
	os.Setenv(config.Encrypt.Name, c.encrypt)
	for _, v := range []struct{ name, val string }{{config.Transport.Name, c.transport}, {config.FIProvider.Name, c.provider}} {
		if v.val == "" {
			os.Unsetenv(v.name)
		} else {
			os.Setenv(v.name, v.val)
		}
	}
	if c.transport == "fabric" {
		loopbackFabric()
	}
	os.Setenv(config.Dir.Name, r.opt.guestsAbs)
	os.Setenv(config.CacheDir.Name, r.opt.cacheDir)
	if os.Getenv("RMABENCH_KEEP_ADDR") == "" {
		os.Setenv(config.Addr.Name, "127.0.0.1")
	}
}

func res(call string, r abi.Result) error {
	if r == abi.Success {
		return nil
	}
	return fmt.Errorf("%s: %v", call, r)
}

// openComm is the collective part every rank runs: init and listen (then the
// handles are exchanged by the caller), connect, createContext, regMr.
func (r *rankState) commInit(i int, h *[abi.HandleSize]byte) error {
	cs := r.comms[i]
	r.setEnv(comms[i])
	var rc abi.Result
	if cs.ctx, rc = plugin.Init(uint64(0xbe0c0000 + i)); rc != abi.Success {
		return res("init", rc)
	}
	if cs.listen, rc = plugin.Listen(cs.ctx, 0, h); rc != abi.Success {
		return res("listen", rc)
	}
	return nil
}

func (r *rankState) commConnect(i int, h0, h1 *[abi.HandleSize]byte) error {
	cs := r.comms[i]
	var rc abi.Result
	if cs.coll, rc = plugin.Connect([]*[abi.HandleSize]byte{h0, h1}, int32(r.rank), cs.listen); rc != abi.Success {
		return res("connect", rc)
	}
	plugin.CloseListen(cs.listen)
	if cs.rma, rc = plugin.CreateContext(cs.coll, abi.RmaConfig{NContexts: 1, TrafficClass: abi.ConfigUndefInt}); rc != abi.Success {
		return res("createContext", rc)
	}
	cs.sig = mmap(4096)
	for _, b := range []struct {
		buf []byte
		mh  *uint64
	}{{r.src, &cs.srcMh}, {r.dst, &cs.dstMh}, {cs.sig, &cs.sigMh}} {
		if *b.mh, rc = plugin.RegMr(cs.coll, addrOf(b.buf), uint64(len(b.buf)), abi.PtrHost, 0); rc != abi.Success {
			return res("regMr", rc)
		}
	}
	cs.ok = true
	return nil
}

func (r *rankState) commClose(i int) {
	cs := r.comms[i]
	if !cs.ok {
		return
	}
	for _, mh := range []uint64{cs.srcMh, cs.dstMh, cs.sigMh} {
		plugin.DeregMr(cs.coll, mh)
	}
	plugin.DestroyContext(cs.rma)
	plugin.CloseColl(cs.coll)
	plugin.Finalize(cs.ctx)
	cs.ok = false
}

// waitWord waits until *w >= want, spinning briefly and then yielding the CPU
// between checks (NCCL's proxy thread does the same with sched_yield). poll,
// when not nil, runs on every check.
func (r *rankState) waitWord(w *uint64, want uint64, deadline time.Duration, poll func() error) error {
	start := time.Now()
	for i := 0; atomic.LoadUint64(w) < want; i++ {
		if poll != nil {
			if err := poll(); err != nil {
				return err
			}
		}
		if i >= r.opt.spin {
			schedYield()
		}
		if i&1023 == 1023 && time.Since(start) > deadline {
			return fmt.Errorf("timed out after %v waiting for the signal word to reach %d (it is %d)", deadline, want, atomic.LoadUint64(w))
		}
	}
	return nil
}

const waitLimit = 60 * time.Second

// ---------------------------------------------------------------- rank 1

func (r *rankState) serve() error {
	var m msg
	for {
		if err := r.k.recv(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := r.handle(&m); err != nil {
			fmt.Fprintf(os.Stderr, "rmabench rank 1: op %d: %v\n", m.Op, err)
			r.k.send(&msg{Op: opErr, A: uint64(m.Op)})
		}
		if m.Op == opQuit {
			return nil
		}
	}
}

func (r *rankState) handle(m *msg) error {
	switch m.Op {
	case opComm:
		i := int(m.A)
		var h0, h1 [abi.HandleSize]byte
		h0 = m.H
		if err := r.commInit(i, &h1); err != nil {
			return err
		}
		if err := r.k.send(&msg{Op: opOK, H: h1}); err != nil {
			return err
		}
		if err := r.commConnect(i, &h0, &h1); err != nil {
			return err
		}
		return r.k.ok(0, 0, 0)
	case opCommClose:
		r.commClose(int(m.A))
		return r.k.ok(0, 0, 0)
	case opRawTCP:
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		if err := r.k.ok(0, uint64(ln.Addr().(*net.TCPAddr).Port), 0); err != nil {
			return err
		}
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return err
		}
		c.(*net.TCPConn).SetNoDelay(true)
		r.raw = c
		return r.k.ok(0, 0, 0)
	case opPVW:
		return r.k.ok(uint64(os.Getpid()), uint64(addrOf(r.dst)), uint64(addrOf(r.flag)))
	case opVerify:
		cs := r.comms[m.A]
		if err := r.waitWord(word(cs.sig), m.C, waitLimit, nil); err != nil {
			return err
		}
		for j := uint64(0); j < m.B; j++ {
			if r.dst[j] != byte(m.D) {
				return fmt.Errorf("verify %s: byte %d is %d, want %d", comms[m.A].name, j, r.dst[j], byte(m.D))
			}
		}
		return r.k.ok(0, 0, 0)
	case opFabric:
		return r.serveFabric(m)
	case opBW:
		return r.serveBW(m)
	case opPing:
		return r.servePing(m)
	case opQuit:
		for i := range r.comms {
			r.commClose(i)
		}
		r.fab.close()
		return r.k.ok(0, 0, 0)
	}
	return fmt.Errorf("unknown op %d", m.Op)
}

func (r *rankState) serveBW(m *msg) error {
	kind, ci, size, count := m.A&0xff, (m.A>>8)&0xff, m.B, m.C
	var ms0, ms1 runtime.MemStats
	if m.A&flagAllocs != 0 {
		runtime.ReadMemStats(&ms0)
	}
	if err := r.k.ok(0, 0, 0); err != nil {
		return err
	}
	switch kind {
	case kindRawTCP:
		for i := uint64(0); i < count; i++ {
			off := (i * size) % bufSize
			if _, err := io.ReadFull(r.raw, r.dst[off:off+size]); err != nil {
				return err
			}
		}
	case kindPVW:
		if err := r.waitWord(word(r.flag), m.D, waitLimit, nil); err != nil {
			return err
		}
	case kindPlugin:
		if err := r.waitWord(word(r.comms[ci].sig), m.D, waitLimit, nil); err != nil {
			return err
		}
	case kindRawFab:
		if err := r.serveFabBW(m.D); err != nil {
			return err
		}
	}
	var mallocs uint64
	if m.A&flagAllocs != 0 {
		runtime.ReadMemStats(&ms1)
		mallocs = ms1.Mallocs - ms0.Mallocs
	}
	return r.k.ok(mallocs, 0, 0)
}

func (r *rankState) servePing(m *msg) error {
	kind, ci, iters, base := m.A&0xff, (m.A>>8)&0xff, m.B, m.C
	if err := r.k.ok(0, 0, 0); err != nil {
		return err
	}
	switch kind {
	case kindRawTCP:
		var b [8]byte
		for i := uint64(0); i < iters; i++ {
			if _, err := io.ReadFull(r.raw, b[:]); err != nil {
				return err
			}
			if _, err := r.raw.Write(b[:]); err != nil {
				return err
			}
		}
	case kindPlugin:
		cs := r.comms[ci]
		w := pingWindow{cs: cs}
		for i := uint64(0); i < iters; i++ {
			if err := r.waitWord(word(cs.sig), base+i+1, waitLimit, w.poll); err != nil {
				return err
			}
			if err := w.room(); err != nil {
				return err
			}
			h, rc := plugin.IputSignal(cs.rma, 0, 0, cs.srcMh, 8, 8, cs.dstMh, 0, 0, cs.sigMh, 1, abi.SignalOpAdd, true, 0)
			if rc != abi.Success {
				return res("iputSignal", rc)
			}
			w.add(h)
		}
		if err := w.drain(); err != nil {
			return err
		}
	case kindRawFab:
		if err := r.serveFabPing(iters); err != nil {
			return err
		}
	}
	return r.k.ok(0, 0, 0)
}

// ---------------------------------------------------------------- rank 0

// setupComm runs the collective setup of configuration i on both ranks.
func (r *rankState) setupComm(i int) error {
	var h0 [abi.HandleSize]byte
	if err := r.commInit(i, &h0); err != nil {
		return err
	}
	m := msg{Op: opComm, A: uint64(i), H: h0}
	if err := r.k.call(&m); err != nil {
		return err
	}
	h1 := m.H
	err := r.commConnect(i, &h0, &h1)
	if e := r.k.recv(&m); e != nil {
		return e
	}
	if err != nil {
		return err
	}
	if m.Op != opOK {
		return errors.New("rank 1 failed to set the communicator up")
	}
	return r.verify(i)
}

// verify puts a pattern with a signal and has rank 1 check the bytes.
func (r *rankState) verify(i int) error {
	cs := r.comms[i]
	const n = 4096
	pat := byte(0x40 + i)
	for j := 0; j < n; j++ {
		r.src[j] = pat
	}
	h, rc := plugin.IputSignal(cs.rma, 0, 0, cs.srcMh, n, 0, cs.dstMh, 1, 0, cs.sigMh, 1, abi.SignalOpAdd, true, 0)
	if rc != abi.Success {
		return res("iputSignal", rc)
	}
	cs.sent++
	if err := r.testAll(cs, []uint64{h}); err != nil {
		return err
	}
	m := msg{Op: opVerify, A: uint64(i), B: n, C: cs.sent, D: uint64(pat)}
	return r.k.call(&m)
}

func (r *rankState) testAll(cs *commState, hs []uint64) error {
	for _, h := range hs {
		for {
			done, rc := plugin.Test(cs.coll, h)
			if rc != abi.Success {
				return res("test", rc)
			}
			if done {
				break
			}
			schedYield()
		}
	}
	return nil
}

const maxWindow = 128

// window is how many puts of size bytes stay in flight.
func window(size uint64) int {
	return int(min(max(bufSize/size, 2), maxWindow))
}

// count is how many operations one repetition of size bytes posts.
func (r *rankState) count(size uint64) uint64 {
	return min(max(r.opt.repBytes/size, r.opt.minOps), r.opt.maxOps)
}

// plugBW posts count puts of size bytes (window in flight, completion by
// test) and a final signal; the clock stops when rank 1 has seen the signal.
func (r *rankState) plugBW(ci int, size, count uint64, allocs bool) (time.Duration, float64, float64, error) {
	cs := r.comms[ci]
	w := uint64(window(size))
	a := uint64(kindPlugin | ci<<8)
	if allocs {
		a |= flagAllocs
	}
	m := msg{Op: opBW, A: a, B: size, C: count, D: cs.sent + 1}
	if err := r.k.call(&m); err != nil {
		return 0, 0, 0, err
	}
	var ms0, ms1 runtime.MemStats
	if allocs {
		runtime.ReadMemStats(&ms0)
	}
	ring := r.ring
	t0 := time.Now()
	total := count + 1
	var posted, done uint64
	for done < total {
		for posted < total && posted-done < w {
			var h uint64
			var rc abi.Result
			if posted < count {
				off := (posted * size) % r.span
				h, rc = plugin.Iput(cs.rma, 0, r.srcBase+off, cs.srcMh, size, off, cs.dstMh, 1, r.optFlags)
			} else {
				h, rc = plugin.IputSignal(cs.rma, 0, 0, 0, 0, 0, 0, 1, 0, cs.sigMh, 1, abi.SignalOpAdd, true, 0)
			}
			if rc != abi.Success {
				return 0, 0, 0, res("iput", rc)
			}
			ring[posted%w] = h
			posted++
		}
		ok, rc := plugin.Test(cs.coll, ring[done%w])
		if rc != abi.Success {
			return 0, 0, 0, res("test", rc)
		}
		if ok {
			done++
		} else {
			schedYield()
		}
	}
	cs.sent++
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return 0, 0, 0, fmt.Errorf("rank 1 did not see the signal: %v (op %d)", err, m.Op)
	}
	el := time.Since(t0)
	var mine float64
	if allocs {
		runtime.ReadMemStats(&ms1)
		mine = float64(ms1.Mallocs-ms0.Mallocs) / float64(total)
	}
	return el, mine, float64(m.A) / float64(total), nil
}

func (r *rankState) rawTCPBW(size, count uint64) (time.Duration, error) {
	m := msg{Op: opBW, A: kindRawTCP, B: size, C: count}
	if err := r.k.call(&m); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for i := uint64(0); i < count; i++ {
		off := (i * size) % bufSize
		if _, err := r.raw.Write(r.src[off : off+size]); err != nil {
			return 0, err
		}
	}
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return 0, fmt.Errorf("raw tcp: rank 1: %v (op %d)", err, m.Op)
	}
	return time.Since(t0), nil
}

func (r *rankState) pvwBW(size, count uint64) (time.Duration, error) {
	r.flagN++
	m := msg{Op: opBW, A: kindPVW, B: size, C: count, D: r.flagN}
	if err := r.k.call(&m); err != nil {
		return 0, err
	}
	var flagWord [1]uint64
	flagWord[0] = r.flagN
	local := make([]unix.Iovec, 1)
	remote := make([]unix.RemoteIovec, 1)
	t0 := time.Now()
	for i := uint64(0); i < count; i++ {
		off := (i * size) % bufSize
		for done := uint64(0); done < size; {
			local[0].Base = &r.src[off+done]
			local[0].SetLen(int(size - done))
			remote[0] = unix.RemoteIovec{Base: r.pvwDst + uintptr(off+done), Len: int(size - done)}
			n, err := unix.ProcessVMWritev(r.pvwPid, local, remote, 0)
			if err != nil {
				return 0, fmt.Errorf("process_vm_writev: %w", err)
			}
			done += uint64(n)
		}
	}
	local[0].Base = (*byte)(unsafe.Pointer(&flagWord[0]))
	local[0].SetLen(8)
	remote[0] = unix.RemoteIovec{Base: r.pvwFlg, Len: 8}
	if _, err := unix.ProcessVMWritev(r.pvwPid, local, remote, 0); err != nil {
		return 0, fmt.Errorf("process_vm_writev (flag): %w", err)
	}
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return 0, fmt.Errorf("pvw: rank 1: %v (op %d)", err, m.Op)
	}
	return time.Since(t0), nil
}

func (r *rankState) memcpyBW(size, count uint64) time.Duration {
	t0 := time.Now()
	for i := uint64(0); i < count; i++ {
		off := (i * size) % bufSize
		copy(r.local[off:off+size], r.src[off:off+size])
	}
	return time.Since(t0)
}

// plugPing: rank 0 iputSignal (8 bytes) -> rank 1 sees its signal word move
// and answers the same way; returns the half round trip.
func (r *rankState) plugPing(ci int, iters uint64) (time.Duration, error) {
	cs := r.comms[ci]
	m := msg{Op: opPing, A: uint64(kindPlugin | ci<<8), B: iters, C: cs.sent}
	if err := r.k.call(&m); err != nil {
		return 0, err
	}
	w := pingWindow{cs: cs}
	t0 := time.Now()
	for i := uint64(0); i < iters; i++ {
		if err := w.room(); err != nil {
			return 0, err
		}
		h, rc := plugin.IputSignal(cs.rma, 0, 0, cs.srcMh, 8, 0, cs.dstMh, 1, 0, cs.sigMh, 1, abi.SignalOpAdd, true, 0)
		if rc != abi.Success {
			return 0, res("iputSignal", rc)
		}
		w.add(h)
		if err := r.waitWord(word(cs.sig), cs.recvd+i+1, waitLimit, w.poll); err != nil {
			return 0, err
		}
	}
	el := time.Since(t0)
	if err := w.drain(); err != nil {
		return 0, err
	}
	cs.sent += iters
	cs.recvd += iters
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return 0, fmt.Errorf("ping-pong: rank 1: %v (op %d)", err, m.Op)
	}
	return el / time.Duration(2*iters), nil
}

func (r *rankState) rawPing(iters uint64) (time.Duration, error) {
	m := msg{Op: opPing, A: kindRawTCP, B: iters}
	if err := r.k.call(&m); err != nil {
		return 0, err
	}
	var b [8]byte
	t0 := time.Now()
	for i := uint64(0); i < iters; i++ {
		if _, err := r.raw.Write(b[:]); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(r.raw, b[:]); err != nil {
			return 0, err
		}
	}
	el := time.Since(t0)
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return 0, fmt.Errorf("raw ping-pong: rank 1: %v (op %d)", err, m.Op)
	}
	return el / time.Duration(2*iters), nil
}

func (r *rankState) setupBaselines() error {
	m := msg{Op: opRawTCP}
	if err := r.k.send(&m); err != nil {
		return err
	}
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return fmt.Errorf("raw tcp listen on rank 1: %v", err)
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(m.B)))
	if err != nil {
		return err
	}
	c.(*net.TCPConn).SetNoDelay(true)
	r.raw = c
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return fmt.Errorf("raw tcp accept on rank 1: %v", err)
	}
	m = msg{Op: opPVW}
	if err := r.k.call(&m); err != nil {
		return err
	}
	r.pvwPid, r.pvwDst, r.pvwFlg = int(m.A), uintptr(m.B), uintptr(m.C)
	return nil
}

// schedYield is what a waiting loop does between checks. NCCL's proxy thread
// calls sched_yield when it has nothing to progress; and a C thread that
// returns from a plugin call holds no Go P, which runtime.Gosched imitates
// here, so the runtime's own goroutines (the peer writer and service) can run
// at once. Both together were the fastest on 2 cores (BENCH.md, "Figures
// behind the code"; -yield).
func schedYield() {
	switch yieldMode {
	case "os":
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	case "go":
		runtime.Gosched()
	case "both":
		runtime.Gosched()
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

var yieldMode = "both"

// testOnce polls the one outstanding request of a ping-pong side, if any,
// and forgets it once done.
// pingWindow is the requests one side of a ping-pong has in flight. Like
// the raw fi_writedata baseline, which reaps its completions while it
// waits and stalls only when out of contexts, a side answers without
// waiting for its previous put's completion (which, meaning arrival, is a
// round trip of its own); every request is still tested to completion,
// and a failed one fails the run.
type pingWindow struct {
	cs      *commState
	h       [pingDepth]uint64
	head, n int
}

const pingDepth = 16

// poll is one turn of a wait, as NCCL's proxy threads wait: test() the
// oldest requests in flight, then rmaProgress, which reaps the libfabric
// completion queue on this thread (the raw baseline polls its CQ too).
func (w *pingWindow) poll() error {
	for w.n > 0 {
		h := w.h[w.head]
		if err := testOnce(w.cs.coll, &h); err != nil {
			return err
		}
		if h != 0 {
			break
		}
		w.head, w.n = (w.head+1)%pingDepth, w.n-1
	}
	if rc := plugin.Progress(w.cs.rma); rc != abi.Success {
		return res("rmaProgress", rc)
	}
	return nil
}

// room waits until another request fits.
func (w *pingWindow) room() error {
	for w.n == pingDepth {
		if err := w.poll(); err != nil {
			return err
		}
	}
	return nil
}

func (w *pingWindow) add(h uint64) {
	w.h[(w.head+w.n)%pingDepth] = h
	w.n++
}

// drain waits for every request in flight.
func (w *pingWindow) drain() error {
	for w.n > 0 {
		if err := w.poll(); err != nil {
			return err
		}
	}
	return nil
}

func testOnce(coll uint64, pending *uint64) error {
	if *pending == 0 {
		return nil
	}
	done, rc := plugin.Test(coll, *pending)
	if rc != abi.Success {
		return res("test", rc)
	}
	if done {
		*pending = 0
	}
	return nil
}
