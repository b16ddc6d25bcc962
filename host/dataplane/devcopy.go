package dataplane

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// Device memory never meets a socket or process_vm_writev directly: its
// bytes are staged through a host buffer, stageChunk at a time, with the
// copies of host/devmem. Host memory takes none of these paths.
const stageChunk = 1 << 20

var errNoDevice = errors.New("device memory registered but no device runtime is loaded")

// sigRef is a signal word: host memory updated atomically, or a word of
// device memory updated by read-modify-write through the device runtime.
type sigRef struct {
	host *uint64
	dev  uintptr
	ctx  uintptr
}

func (s sigRef) valid() bool { return s.host != nil || s.dev != 0 }

// devSigLocks serialise read-modify-writes of device signal words: the
// services of different peers (and lanes) may update one word at once, and
// two unlocked read-modify-writes would lose an increment. Striped by
// address so that unrelated words rarely share a lock.
var devSigLocks [64]sync.Mutex

// apply adds v to the signal word. It runs after the payload is visible:
// device copies are synchronous and run on one stream per context.
func (s sigRef) apply(v uint64) error {
	if s.host != nil {
		atomic.AddUint64(s.host, v)
		return nil
	}
	d := devmem.Get()
	if d == nil {
		return errNoDevice
	}
	mu := &devSigLocks[(s.dev>>3)%uintptr(len(devSigLocks))]
	mu.Lock()
	defer mu.Unlock()
	var w uint64
	if err := d.DtoH(s.ctx, unsafe.Pointer(&w), s.dev, 8); err != nil {
		return fmt.Errorf("read device signal: %w", err)
	}
	w += v
	if err := d.HtoD(s.ctx, s.dev, unsafe.Pointer(&w), 8); err != nil {
		return fmt.Errorf("write device signal: %w", err)
	}
	return nil
}

// readToDevice reads n bytes from r into device memory at dst, through stage.
func readToDevice(r io.Reader, ctx, dst uintptr, n uint64, stage []byte) error {
	d := devmem.Get()
	if d == nil {
		return errNoDevice
	}
	for done := uint64(0); done < n; {
		c := min(n-done, uint64(len(stage)))
		if _, err := io.ReadFull(r, stage[:c]); err != nil {
			return err
		}
		if err := d.HtoD(ctx, dst+uintptr(done), unsafe.Pointer(&stage[0]), c); err != nil {
			return fmt.Errorf("copy to device: %w", err)
		}
		done += c
	}
	return nil
}

// writeFromDevice writes n bytes of device memory at src to w, through stage.
func writeFromDevice(w *net.TCPConn, ctx, src uintptr, n uint64, stage []byte) error {
	d := devmem.Get()
	if d == nil {
		return errNoDevice
	}
	for done := uint64(0); done < n; {
		c := min(n-done, uint64(len(stage)))
		if err := d.DtoH(ctx, unsafe.Pointer(&stage[0]), src+uintptr(done), c); err != nil {
			return fmt.Errorf("copy from device: %w", err)
		}
		if _, err := w.Write(stage[:c]); err != nil {
			return err
		}
		done += c
	}
	return nil
}

// devAddr is the device address a registration base stands for.
func devAddr(p unsafe.Pointer, off uint64) uintptr { return uintptr(p) + uintptr(off) }
