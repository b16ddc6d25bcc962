package dataplane_test

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// sigDevice is a devtest.Pipe that watches device signal words: it counts
// 8-byte word copies, and at each signal update checks that as many
// payloads have landed (every put carries putSize bytes and one update).
type sigDevice struct {
	*devtest.Pipe
	putSize    int64
	landed     atomic.Int64 // payload bytes copied to the device
	updates    atomic.Int64 // signal updates made
	early      atomic.Int32 // updates made before their payload landed
	wordCopies atomic.Int32
}

func (d *sigDevice) HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	err := d.Pipe.HtoD(ctx, dst, src, n)
	if n == 8 {
		d.wordCopies.Add(1)
		d.update()
	} else {
		d.landed.Add(int64(n))
	}
	return err
}

func (d *sigDevice) DtoH(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	if n == 8 {
		d.wordCopies.Add(1)
		time.Sleep(50 * time.Microsecond) // widen the read-modify-write
	}
	return d.Pipe.DtoH(ctx, dst, src, n)
}

func (d *sigDevice) update() {
	if n := d.updates.Add(1); n*d.putSize > d.landed.Load() {
		d.early.Add(1)
	}
}

// gdrDevice adds to words through a "mapping" (GDRCopy): an unlocked
// read, a pause and a write, which loses increments unless the callers
// serialise updates of a word.
type gdrSigDevice struct {
	*sigDevice
	decline bool // every word "cannot be mapped": copies must be used
	adds    atomic.Int32
}

func (d *gdrSigDevice) AddWord(_, addr uintptr, v uint64) (bool, error) {
	if d.decline {
		return false, nil
	}
	w := d.At(addr, 8)
	x := binary.LittleEndian.Uint64(w)
	time.Sleep(50 * time.Microsecond)
	binary.LittleEndian.PutUint64(w, x+v)
	d.adds.Add(1)
	d.update()
	return true, nil
}

func (d *gdrSigDevice) Forget(uintptr, uint64) {}

// TestDeviceSignalWords: two ranks put with signals, at once and over two
// lanes each, into one device signal word of a third rank. Through copies
// (no GDRCopy), through GDRCopy's mapping when the device offers it, and
// through copies again when it cannot map the word: no increment is lost,
// no signal is applied before its payload landed, and the mapping is used
// exactly when offered.
func TestDeviceSignalWords(t *testing.T) {
	const (
		putSize = 4 << 10
		puts    = 30 // per sender
		region  = (2*puts + 1) * putSize
	)
	for _, mode := range []string{"copies", "gdr", "gdr-declines"} {
		t.Run(mode, func(t *testing.T) {
			pd := &devtest.Pipe{Mem: meshtest.MapAnon(t, 3*region+4096), Base: 0x7e00_0000_0000}
			pd.Delay.Store(int64(20 * time.Microsecond))
			sd := &sigDevice{Pipe: pd, putSize: putSize}
			var gd *gdrSigDevice
			var dev devmem.Device = sd
			if mode != "copies" {
				gd = &gdrSigDevice{sigDevice: sd, decline: mode == "gdr-declines"}
				dev = gd
			}
			devmem.Register(dev)
			defer devmem.Register(nil)
			os := make([]*meshtest.DevOwner, 3)
			owners := make([]dataplane.Owner, 3)
			for r := range os {
				os[r] = &meshtest.DevOwner{MemOwner: meshtest.MemOwner{Done: map[uint64]abi.Result{}}, Dev: pd.Base + uintptr(r*region), Size: region,
					Host: meshtest.MapAnon(t, putSize)}
				owners[r] = os[r]
			}
			// The signal word: the last 8 bytes of rank 0's region, so
			// that no payload lands on it.
			sigOff := uint64(region - 8)
			ms := meshtest.ConnectOwners(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, StripeThreshold: 1 << 30, ChunkSize: 1 << 20,
				CloseTimeout: 2 * time.Second})
			want := uint64(0)
			for s := 1; s <= 2; s++ {
				src := os[s].Host
				meshtest.Fill(src, s)
				for i := range puts {
					v := uint64(1 + i%3)
					want += v
					ms[s].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: uint64(i + 1), Local: unsafe.Pointer(&src[0]), Size: putSize, Off: uint64(((s-1)*puts + i) * putSize), SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpAdd, SigValue: v}}, false, i%2)
				}
			}
			for s := 1; s <= 2; s++ {
				for i := range puts {
					if st := meshtest.WaitDone(t, &os[s].MemOwner, uint64(i+1)); st != abi.Success {
						t.Fatalf("rank %d put %d: %v", s, i, st)
					}
				}
			}
			// Completion means the target landed the payload; its signal
			// may follow a moment later.
			word := func() uint64 { return binary.LittleEndian.Uint64(pd.At(os[0].Dev+uintptr(sigOff), 8)) }
			deadline := time.Now().Add(30 * time.Second)
			for word() != want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(10 * time.Millisecond) // an increment too many would show now
			if got := word(); got != want {
				t.Fatalf("signal word %d after %d updates from two senders, want %d: increments lost", got, 2*puts, want)
			}
			if n := sd.early.Load(); n != 0 {
				t.Fatalf("%d signal updates were made before their payload landed", n)
			}
			for s := 1; s <= 2; s++ {
				for i := range puts {
					off := ((s-1)*puts + i) * putSize
					if string(pd.At(os[0].Dev+uintptr(off), putSize)) != string(os[s].Host) {
						t.Fatalf("payload %d of rank %d differs", i, s)
					}
				}
			}
			copies, adds := sd.wordCopies.Load(), int32(0)
			if gd != nil {
				adds = gd.adds.Load()
			}
			switch mode {
			case "gdr":
				if adds != 2*puts || copies != 0 {
					t.Fatalf("GDRCopy offered: %d updates through the mapping and %d word copies, want %d and 0", adds, copies, 2*puts)
				}
			default:
				if adds != 0 || copies != 4*puts {
					t.Fatalf("%s: %d updates through a mapping and %d word copies, want 0 and %d", mode, adds, copies, 4*puts)
				}
			}
		})
	}
}
