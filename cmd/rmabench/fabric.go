package main

// The libfabric series (-series fabric): the plugin over its fabric
// transport (plugin-fabric: NCCL_RMA_WASM_TRANSPORT=fabric, provider
// -fi-provider) next to bare libfabric between the same two processes, in
// the same run: fi_write for put bandwidth (raw-fi-write) and an 8-byte
// fi_writedata ping-pong (raw-fi-writedata), each side polling its own
// completion queue. On a machine without an RDMA NIC the provider is
// tcp;ofi_rxm (or shm), kept on the loopback interface (FI_TCP_IFACE=lo),
// so the figures say how much the transport adds to libfabric's software
// path, not what a NIC does.

import (
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
)

const (
	fabSlots    = 256 // write contexts: the most writes in flight
	fabRecvs    = 64  // receives posted for remote CQ data (FI_RX_CQ_DATA)
	fabRecvSlot = fabric.ContextSize + 64
)

// fabSizes are the bandwidth points of the fabric series (small puts are
// the message-rate series' business; these are about bytes).
var fabSizes = []uint64{32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}

// fabRaw is one rank's bare libfabric endpoint for the baselines.
type fabRaw struct {
	ep           *fabric.Endpoint
	peer         uint64 // fi_addr of the other rank
	srcMR, dstMR fabric.MR
	rkey, rbase  uint64 // the other rank's destination registration
	ctxs, rb     unsafe.Pointer
	free         []uint32
	comps        *fabric.Comps
	remote       uint64 // remote CQ data entries seen
	lastData     uint64
	spin         int
}

// fabricLib is the library the baseline loads: the plugin's variable.
func fabricLib() string {
	if v := os.Getenv("NCCL_RMA_WASM_FI_LIBRARY"); v != "" {
		return v
	}
	return "libfabric.so.1"
}

// loopbackFabric keeps the tcp provider on the loopback interface (its
// first domain is otherwise the machine's first real interface): benchmark
// traffic stays on this machine's loopback. Set before libfabric loads.
func loopbackFabric() {
	if os.Getenv("RMABENCH_KEEP_ADDR") == "" && os.Getenv("FI_TCP_IFACE") == "" {
		os.Setenv("FI_TCP_IFACE", "lo")
	}
}

// openFabRaw opens an endpoint of prov and registers src (local) and dst
// (the other rank writes there).
func openFabRaw(prov string, src, dst []byte, spin int) (*fabRaw, error) {
	loopbackFabric()
	if err := fabric.Load(fabricLib()); err != nil {
		return nil, err
	}
	ep, err := fabric.Open(prov, "")
	if err != nil {
		return nil, err
	}
	f := &fabRaw{ep: ep, comps: fabric.NewComps(64), free: make([]uint32, 0, fabSlots), spin: spin}
	if f.srcMR, err = ep.Register(unsafe.Pointer(&src[0]), uint64(len(src)), 1); err != nil {
		f.close()
		return nil, fmt.Errorf("register source: %w", err)
	}
	if f.dstMR, err = ep.Register(unsafe.Pointer(&dst[0]), uint64(len(dst)), 2); err != nil {
		f.close()
		return nil, fmt.Errorf("register destination: %w", err)
	}
	f.ctxs = fabric.Alloc(fabSlots * fabric.ContextSize)
	for i := fabSlots - 1; i >= 0; i-- {
		f.free = append(f.free, uint32(i))
	}
	f.rb = fabric.Alloc(fabRecvs * fabRecvSlot)
	for i := 0; i < fabRecvs; i++ {
		p := unsafe.Add(f.rb, i*fabRecvSlot)
		if err := ep.Recv(unsafe.Add(p, fabric.ContextSize), 64, nil, p); err != nil {
			f.close()
			return nil, fmt.Errorf("post receive: %w", err)
		}
	}
	return f, nil
}

// base is what the other rank adds offsets to: the address where the
// provider wants virtual addresses, else 0.
func (f *fabRaw) base(dst []byte) uint64 {
	if f.ep.Info.MRMode&fabric.MRVirtAddr != 0 {
		return uint64(addrOf(dst))
	}
	return 0
}

func (f *fabRaw) connect(name []byte, rkey, rbase uint64) error {
	a, err := f.ep.Insert(name)
	if err != nil {
		return err
	}
	f.peer, f.rkey, f.rbase = a, rkey, rbase
	return nil
}

// poll reaps one batch: write contexts go back to the free list, consumed
// receives are posted again, remote CQ data is counted.
func (f *fabRaw) poll() (int, error) {
	n, err := f.ep.Poll(f.comps)
	if err != nil {
		return 0, err
	}
	rb, ctxs := uintptr(f.rb), uintptr(f.ctxs)
	for i := 0; i < n; i++ {
		c := f.comps.At(i)
		if e := fabric.Err(c); e != 0 {
			return n, fmt.Errorf("completion error: %s", fabric.Strerror(e))
		}
		if fabric.Flags(c)&fabric.FlagRemoteCQData != 0 {
			f.remote++
			f.lastData = fabric.Data(c)
		}
		p := uintptr(fabric.Ctx(c))
		switch {
		case p >= rb && p < rb+fabRecvs*fabRecvSlot:
			q := fabric.Ctx(c)
			if err := f.ep.Recv(unsafe.Add(q, fabric.ContextSize), 64, nil, q); err != nil {
				return n, fmt.Errorf("repost receive: %w", err)
			}
		case p >= ctxs && p < ctxs+fabSlots*fabric.ContextSize:
			f.free = append(f.free, uint32((p-ctxs)/fabric.ContextSize))
		}
	}
	return n, nil
}

// until polls until done() holds, yielding between empty polls the way the
// other series' waits do; bounded by waitLimit.
func (f *fabRaw) until(done func() bool) error {
	start := time.Now()
	for i := 0; !done(); i++ {
		n, err := f.poll()
		if err != nil {
			return err
		}
		if n == 0 && i >= f.spin {
			schedYield()
		}
		if i&1023 == 1023 && time.Since(start) > waitLimit {
			return fmt.Errorf("libfabric baseline: nothing completed in %v", waitLimit)
		}
	}
	return nil
}

func (f *fabRaw) inflight() int { return fabSlots - len(f.free) }

// write posts one write of n bytes from src+off to the other rank's
// destination at off; with data it is an fi_writedata carrying imm.
func (f *fabRaw) write(data bool, src []byte, off, n, imm uint64) error {
	if err := f.until(func() bool { return len(f.free) > 0 }); err != nil {
		return err
	}
	i := f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	ctx := unsafe.Add(f.ctxs, int(i)*fabric.ContextSize)
	buf := unsafe.Pointer(&src[off])
	for {
		var err error
		if data {
			err = f.ep.WriteData(buf, n, f.srcMR.Desc, imm, f.peer, f.rbase+off, f.rkey, ctx)
		} else {
			err = f.ep.Write(buf, n, f.srcMR.Desc, f.peer, f.rbase+off, f.rkey, ctx)
		}
		if err != fabric.ErrAgain {
			return err
		}
		if _, err := f.poll(); err != nil {
			return err
		}
	}
}

func (f *fabRaw) drain() error { return f.until(func() bool { return f.inflight() == 0 }) }

func (f *fabRaw) close() {
	if f == nil || f.ep == nil {
		return
	}
	// Reap what is left (the other rank's departure among it) first:
	// libfabric 1.17's rxm crashed closing with such events unread.
	for i := 0; i < 100; i++ {
		f.ep.Poll(f.comps)
	}
	f.ep.Deregister(f.srcMR)
	f.ep.Deregister(f.dstMR)
	f.ep.Close()
	f.ep = nil
	fabric.Free(f.ctxs)
	fabric.Free(f.rb)
	f.comps.Free()
}

// setupFabRaw (rank 0) opens both ranks' baseline endpoints and joins them.
func (r *rankState) setupFabRaw() error {
	f, err := openFabRaw(r.opt.fiProvider, r.src, r.dst, r.opt.spin)
	if err != nil {
		return err
	}
	name, err := f.ep.Name()
	if err != nil || len(name) > handleSize {
		f.close()
		return fmt.Errorf("endpoint name (%d bytes): %v", len(name), err)
	}
	m := msg{Op: opFabric, A: f.dstMR.Key, B: f.base(r.dst), C: uint64(len(name))}
	copy(m.H[:], name)
	if err := r.k.call(&m); err != nil {
		f.close()
		return err
	}
	if err := f.connect(m.H[:m.C], m.A, m.B); err != nil {
		f.close()
		return err
	}
	r.fab = f
	return nil
}

// serveFabric (rank 1) is the other half of setupFabRaw.
func (r *rankState) serveFabric(m *msg) error {
	f, err := openFabRaw(r.opt.fiProvider, r.src, r.dst, r.opt.spin)
	if err != nil {
		return err
	}
	if err := f.connect(m.H[:m.C], m.A, m.B); err != nil {
		f.close()
		return err
	}
	name, err := f.ep.Name()
	if err != nil || len(name) > handleSize {
		f.close()
		return fmt.Errorf("endpoint name (%d bytes): %v", len(name), err)
	}
	r.fab = f
	a := msg{Op: opOK, A: f.dstMR.Key, B: f.base(r.dst), C: uint64(len(name))}
	copy(a.H[:], name)
	return r.k.send(&a)
}

// fabBW (rank 0): count fi_writes of size bytes, up to window(size) in
// flight, then an 8-byte fi_writedata that rank 1 waits for; the clock
// stops when rank 1 has seen it.
func (r *rankState) fabBW(size, count uint64) (time.Duration, error) {
	f := r.fab
	r.flagN++
	m := msg{Op: opBW, A: kindRawFab, B: size, C: count, D: r.flagN}
	if err := r.k.call(&m); err != nil {
		return 0, err
	}
	w := min(window(size), fabSlots)
	t0 := time.Now()
	for i := uint64(0); i < count; i++ {
		if err := f.until(func() bool { return f.inflight() < w }); err != nil {
			return 0, err
		}
		if err := f.write(false, r.src, (i*size)%bufSize, size, 0); err != nil {
			return 0, fmt.Errorf("fi_write: %w", err)
		}
	}
	if err := f.drain(); err != nil {
		return 0, err
	}
	if err := f.write(true, r.src, 0, 8, r.flagN); err != nil {
		return 0, fmt.Errorf("fi_writedata: %w", err)
	}
	if err := f.drain(); err != nil {
		return 0, err
	}
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return 0, fmt.Errorf("libfabric: rank 1: %v (op %d)", err, m.Op)
	}
	return time.Since(t0), nil
}

// fabPing (rank 0): 8-byte fi_writedata ping-pong; each side waits for
// the other's remote CQ data. Returns the half round trip.
func (r *rankState) fabPing(iters uint64) (time.Duration, error) {
	f := r.fab
	m := msg{Op: opPing, A: kindRawFab, B: iters}
	if err := r.k.call(&m); err != nil {
		return 0, err
	}
	base := f.remote
	t0 := time.Now()
	for i := uint64(0); i < iters; i++ {
		if err := f.write(true, r.src, 8, 8, i); err != nil {
			return 0, fmt.Errorf("fi_writedata: %w", err)
		}
		want := base + i + 1
		if err := f.until(func() bool { return f.remote >= want }); err != nil {
			return 0, err
		}
	}
	el := time.Since(t0)
	if err := f.drain(); err != nil {
		return 0, err
	}
	if err := r.k.recv(&m); err != nil || m.Op != opOK {
		return 0, fmt.Errorf("libfabric ping-pong: rank 1: %v (op %d)", err, m.Op)
	}
	return el / time.Duration(2*iters), nil
}

// serveFabBW and serveFabPing are rank 1's halves.
func (r *rankState) serveFabBW(marker uint64) error {
	f := r.fab
	return f.until(func() bool { return f.lastData == marker })
}

func (r *rankState) serveFabPing(iters uint64) error {
	f := r.fab
	base := f.remote
	for i := uint64(0); i < iters; i++ {
		want := base + i + 1
		if err := f.until(func() bool { return f.remote >= want }); err != nil {
			return err
		}
		if err := f.write(true, r.src, 8, 8, i); err != nil {
			return fmt.Errorf("fi_writedata: %w", err)
		}
	}
	return f.drain()
}

// fabricSeries is one repetition of the fabric series: put bandwidth of
// plugin-fabric and raw fi_write at fabSizes, then the 8-byte ping-pong of
// both, each pair back to back, the order rotating per repetition.
func (r *rankState) fabricSeries(set *sampleSet, rep int) error {
	for _, size := range fabSizes {
		n := max(r.count(size)/4, r.opt.minOps)
		for j := 0; j < 2; j++ {
			var d time.Duration
			var err error
			name := "raw-fi-write"
			if (j+rep)%2 == 0 {
				d, err = r.fabBW(size, n)
			} else {
				name = comms[commFabric].name
				d, _, _, err = r.plugBW(commFabric, size, n, false)
			}
			if err != nil {
				return fmt.Errorf("%s %d B: %w", name, size, err)
			}
			set.add("put_bw", name, size, "GB/s", gbps(n*size, d))
		}
	}
	for j := 0; j < 2; j++ {
		var d time.Duration
		var err error
		name := "raw-fi-writedata"
		if (j+rep)%2 == 0 {
			d, err = r.fabPing(r.opt.pingIters)
		} else {
			name = comms[commFabric].name
			d, err = r.plugPing(commFabric, r.opt.pingIters)
		}
		if err != nil {
			return fmt.Errorf("%s ping-pong: %w", name, err)
		}
		set.add("half_rtt", name, 8, "us", float64(d)/1e3)
	}
	return nil
}
