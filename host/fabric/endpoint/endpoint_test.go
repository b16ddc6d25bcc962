package endpoint

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
)

// recorder is a Handler that keeps the messages received and frees the
// slots of completed sends.
type recorder struct {
	e     *Endpoint
	mu    sync.Mutex
	msgs  [][]byte
	sent  int
	polls int
}

func (r *recorder) BeforePoll() { r.polls++ }
func (r *recorder) AfterPoll()  {}
func (r *recorder) Busy() bool  { return false }

func (r *recorder) Completion(c *fabric.Completion) {
	idx, recv, ok := r.e.SlotOf(fabric.Ctx(c))
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !ok || fabric.Err(c) != 0:
		return
	case recv:
		m := unsafe.Slice((*byte)(unsafe.Add(r.e.RecvArea(idx), fabric.ContextSize)), fabric.Len(c))
		r.msgs = append(r.msgs, bytes.Clone(m))
		r.e.Repost(idx)
	default:
		r.sent++
		r.e.Put(idx)
	}
}

func (r *recorder) got() ([][]byte, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.msgs, r.sent
}

func open2(t *testing.T) ([2]*Endpoint, [2]*recorder) {
	t.Helper()
	if os.Getenv("FI_TCP_IFACE") == "" {
		t.Setenv("FI_TCP_IFACE", "lo") // loopback only
	}
	lib := os.Getenv("NCCL_RMA_WASM_FI_LIBRARY")
	if lib == "" {
		lib = "libfabric.so.1"
	}
	if err := fabric.Load(lib); err != nil {
		t.Skip(err)
	}
	var es [2]*Endpoint
	var rs [2]*recorder
	for i := range es {
		rs[i] = &recorder{}
		e, err := Open(Config{Provider: "tcp;ofi_rxm", MsgMax: 64, NameMax: 51, CQData: 4}, rs[i])
		if err != nil {
			t.Skip(err)
		}
		rs[i].e, es[i] = e, e
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(); e.Release() })
	}
	return es, rs
}

// TestSlotsAndMessages: messages built in slots' areas reach the peer's
// receive buffers byte for byte, many times more than there are receive
// buffers (each is reposted), and every send's slot comes back.
func TestSlotsAndMessages(t *testing.T) {
	es, rs := open2(t)
	dest, err := es[0].FI.Insert(es[1].Name)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3 * Recvs
	for i := 0; i < n; i++ {
		idx, ok := es[0].Take()
		for !ok {
			es[0].Poll()
			idx, ok = es[0].Take()
		}
		b := es[0].SlotMsg(idx, 64)
		for j := range b {
			b[j] = byte(i + j)
		}
		for {
			err := es[0].FI.SendMsg(unsafe.Pointer(&b[0]), 64, es[0].MemDesc(), dest, es[0].SlotArea(idx), true)
			if err == nil {
				break
			}
			if err != fabric.ErrAgain {
				t.Fatal(err)
			}
			es[0].Nudge()
			es[0].Poll()
		}
		es[0].Nudge()
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		msgs, _ := rs[1].got()
		_, sent := rs[0].got()
		if len(msgs) == n && sent == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages arrived, %d sends completed", len(msgs), n, sent)
		}
		time.Sleep(time.Millisecond)
	}
	msgs, _ := rs[1].got()
	seen := make(map[byte]bool)
	for _, m := range msgs {
		if len(m) != 64 {
			t.Fatalf("a message of %d bytes, want 64", len(m))
		}
		for j := range m {
			if m[j] != m[0]+byte(j) {
				t.Fatalf("message %x is not the pattern sent", m)
			}
		}
		seen[m[0]] = true
	}
	if len(seen) != 256 {
		t.Fatalf("%d distinct messages among %d, want 256", len(seen), n)
	}
	// Every slot is free again.
	for i := 0; i < Slots; i++ {
		if _, ok := es[0].Take(); !ok {
			t.Fatalf("only %d of %d slots came back", i, Slots)
		}
	}
}

// TestSlotOf: contexts outside the slot memory, or inside it but not at
// an area's start, name no slot.
func TestSlotOf(t *testing.T) {
	mem := make([]byte, 128*(Slots+Recvs+1))
	e := &Endpoint{mem: unsafe.Pointer(&mem[0]), slotSize: 128}
	for _, c := range []struct {
		off      uintptr
		idx      uint32
		recv, ok bool
	}{
		{0, 0, false, true},
		{128 * 7, 7, false, true},
		{128 * Slots, 0, true, true},
		{128 * (Slots + Recvs - 1), Recvs - 1, true, true},
		{128 * (Slots + Recvs), 0, false, false},
		{64, 0, false, false},
	} {
		idx, recv, ok := e.SlotOf(unsafe.Add(e.mem, c.off))
		if idx != c.idx || recv != c.recv || ok != c.ok {
			t.Errorf("offset %d: slot %d recv %v ok %v, want %d %v %v", c.off, idx, recv, ok, c.idx, c.recv, c.ok)
		}
	}
	var other [128]byte
	if _, _, ok := e.SlotOf(unsafe.Pointer(&other)); ok {
		t.Error("a context outside the slot memory named a slot")
	}
}

// TestProviderHash: never 0 (the handle's "no fabric"), and providers
// differ.
func TestProviderHash(t *testing.T) {
	seen := map[uint32]string{}
	for _, p := range []string{"", "tcp", "tcp;ofi_rxm", "shm", "efa", "verbs;ofi_rxm"} {
		h := ProviderHash(p)
		if h == 0 {
			t.Fatalf("%q hashes to 0", p)
		}
		if q, dup := seen[h]; dup {
			t.Fatalf("%q and %q hash alike", p, q)
		}
		seen[h] = p
	}
}
