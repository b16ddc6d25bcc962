package fabric

import (
	"os"
	"testing"
	"unsafe"
)

// pair opens two endpoints of prov in this process, each knowing the
// other, or skips where libfabric or the provider is missing.
func pair(b *testing.B, prov string) (a, c *Endpoint, ca uint64) {
	if os.Getenv("FI_TCP_IFACE") == "" {
		os.Setenv("FI_TCP_IFACE", "lo") // loopback only, not the first real interface
	}
	lib := os.Getenv("NCCL_RMA_WASM_FI_LIBRARY")
	if lib == "" {
		lib = "libfabric.so.1"
	}
	if err := Load(lib); err != nil {
		b.Skip(err)
	}
	var err error
	if a, err = Open(prov, ""); err != nil {
		b.Skip(err)
	}
	if c, err = Open(prov, ""); err != nil {
		a.Close()
		b.Skip(err)
	}
	name, err := c.Name()
	if err != nil {
		b.Fatal(err)
	}
	if ca, err = a.Insert(name); err != nil {
		b.Fatal(err)
	}
	if name, err = a.Name(); err != nil {
		b.Fatal(err)
	}
	if _, err = c.Insert(name); err != nil {
		b.Fatal(err)
	}
	return a, c, ca
}

// BenchmarkRawWrite1MiB is the baseline of the fabric transport: bare
// fi_writedata of 1 MiB, 16 in flight, over tcp;ofi_rxm on loopback, one
// goroutine posting and progressing both ends (no transport code above
// the shim). No NIC here: it measures libfabric's software path.
func BenchmarkRawWrite1MiB(b *testing.B) {
	const size, window = 1 << 20, 16
	a, c, ca := pair(b, "tcp;ofi_rxm")
	src, dst := Alloc(size), Alloc(size*window)
	sm, err := a.Register(src, size, 1)
	if err != nil {
		b.Fatal(err)
	}
	dm, err := c.Register(dst, size*window, 2)
	if err != nil {
		b.Fatal(err)
	}
	ctxs := Alloc(ContextSize * window)
	const recvs = 64
	rb := Alloc((ContextSize + 64) * recvs)
	comps := NewComps(64)
	// Registrations close before their endpoints, C memory is freed last.
	defer func() {
		a.Deregister(sm)
		c.Deregister(dm)
		a.Close()
		for i := 0; i < 100; i++ {
			c.Poll(comps) // the peer's departure, before c closes
		}
		c.Close()
		Free(src)
		Free(dst)
		Free(ctxs)
		Free(rb)
		comps.Free()
	}()
	raddr := uint64(0)
	if c.Info.MRMode&MRVirtAddr != 0 {
		raddr = uint64(uintptr(dst))
	}
	// Remote CQ data may consume a posted receive (FI_RX_CQ_DATA).
	for i := 0; i < recvs; i++ {
		p := unsafe.Add(rb, i*(ContextSize+64))
		if err := c.Recv(unsafe.Add(p, ContextSize), 64, nil, p); err != nil {
			b.Fatal(err)
		}
	}
	inflight, posted := 0, 0
	b.SetBytes(size)
	b.ResetTimer()
	for done := 0; done < b.N; {
		for inflight < window && posted < b.N {
			ctx := unsafe.Add(ctxs, (posted%window)*ContextSize)
			err := a.WriteData(src, size, sm.Desc, uint64(posted), ca, raddr+uint64(posted%window)*size, dm.Key, ctx)
			if err == ErrAgain {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			inflight++
			posted++
		}
		n, err := a.Poll(comps)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if Err(comps.At(i)) != 0 {
				b.Fatal(Strerror(Err(comps.At(i))))
			}
		}
		inflight -= n
		done += n
		// The target's manual progress; its entries (remote CQ data) repost
		// the receive they consumed, if any.
		m, _ := c.Poll(comps)
		for i := 0; i < m; i++ {
			if p := Ctx(comps.At(i)); p != nil && uintptr(p) >= uintptr(rb) && uintptr(p) < uintptr(rb)+(ContextSize+64)*recvs {
				c.Recv(unsafe.Add(p, ContextSize), 64, nil, p)
			}
		}
	}
}
