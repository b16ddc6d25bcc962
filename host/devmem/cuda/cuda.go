// Package cuda registers the CUDA driver as the devmem.Device. It is cgo:
// driver.c finds libcuda.so.1 with dlopen at run time (never linked), so
// the library still loads on machines without a GPU, and host stays pure
// Go. The C files, one per concern, are listed in cuda_internal.h.
package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../devrt -Wall -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration
#include "cuda_shim.h"
// The per-operation call keeps its error buffer on the Go stack: the C
// side neither keeps the pointer nor calls back into Go.
#cgo noescape rmaw_cuda_land_signal
#cgo nocallback rmaw_cuda_land_signal
#cgo noescape rmaw_cuda_copy_mark
#cgo nocallback rmaw_cuda_copy_mark
#cgo noescape rmaw_cuda_copy_write
#cgo nocallback rmaw_cuda_copy_write
#cgo noescape rmaw_cuda_signal_after_mark
#cgo nocallback rmaw_cuda_signal_after_mark
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devrt"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Probe loads the CUDA driver once, at the first call (capi makes it at the
// plugin's init), and registers it with devmem when a GPU is there.
// NCCL_RMA_WASM_CUDA=0 skips it.
var Probe = sync.OnceFunc(func() {
	if config.CopyContext.Get() {
		C.rmaw_cuda_copy_context(1)
	}
	if !config.StreamAtomic.Get() {
		C.rmaw_cuda_stream_atomic(0)
	}
	mode := map[string]C.int{"0": 0, "1": 1, "auto": 2}[config.DeviceAgent.Get()]
	inl := C.int(0)
	if config.FusedLanding.Get() {
		inl = 1 // the kernel reads inline payloads only where they may come
	}
	switch config.DeviceAgentFence.Get() {
	case "acqrel":
		fillPTX(C.rmacu_agent_ptx[:], agentAcqRelPTX(agentPTX))
	case "lean":
		fillPTX(C.rmacu_agent_ptx[:], agentLeanPTX(agentPTX))
	}
	oneRead, stagger := C.int(0), C.int(0)
	if config.DeviceAgentOneRead.Get() {
		oneRead = 1
	}
	if config.DeviceAgentStagger.Get() {
		stagger = 1
	}
	C.rmaw_cuda_agent(mode, C.uint64_t(config.DeviceAgentMaxKiB.Get())<<10, C.uint64_t(config.DeviceAgentIdleUs.Get()), inl, oneRead, stagger)
	if !devrt.Load("CUDA", "CUDA driver", config.CUDA, open) {
		return
	}
	if !config.GDRCopy.Get() {
		devmem.Register(cudaDevice{})
		return
	}
	var buf [256]C.char
	if C.rmaw_gdr_open(&buf[0], C.size_t(len(buf))) != 0 {
		logx.Info(abi.SubsysInit, "NET/wasm: no GDRCopy (%s): device signal words are updated with copies", C.GoString(&buf[0]))
		devmem.Register(cudaDevice{})
		return
	}
	logx.Info(abi.SubsysInit, "NET/wasm: GDRCopy loaded: device signal words are updated through a CPU mapping")
	devmem.Register(gdrDevice{})
})

// open loads the driver and counts its devices.
func open() (int, error) {
	var buf [256]C.char
	n := C.rmaw_cuda_open(&buf[0], C.size_t(len(buf)))
	if n < 0 {
		return 0, errors.New(C.GoString(&buf[0]))
	}
	return int(n), nil
}

// cudaDevice reaches the CUDA driver through the C files: copies, pinned
// memory and DMA-BUF export through its ops table (devrt), Locate and
// GDRCopy directly.
type cudaDevice struct {
	devrt.Runtime[cudaOps]
}

// cudaOps names the C files' ops table (driver.c).
type cudaOps struct{}

func (cudaOps) Ops() unsafe.Pointer { return unsafe.Pointer(&C.rmaw_cuda_ops) }

func (cudaDevice) Name() string { return "CUDA" }

// CopyContexts is how many CUDA contexts of its own the plugin made for
// copies (NCCL_RMA_WASM_COPY_CONTEXT, on by default): one per application context
// whose memory was registered, 0 when the variable is off or the driver
// lacks what they need.
func (cudaDevice) CopyContexts() int { return int(C.rmaw_cuda_copy_contexts()) }

// CopyContextFailed is the CUDA status of the last copy context the
// driver refused to make (0: none), whose memory stays on the
// application's context.
func (cudaDevice) CopyContextFailed() int { return int(C.rmaw_cuda_copy_context_failed()) }

// StreamAtomic says whether the contexts used so far add to device signal
// words with stream atomics (CUDA 13.1's atomic reduction, verified on a
// scratch word at a context's first use) and, where not, why.
func (cudaDevice) StreamAtomic() string {
	var buf [240]C.char
	C.rmaw_cuda_stream_atomic_note(&buf[0], C.size_t(len(buf)))
	return C.GoString(&buf[0])
}

// StartAgent starts the device agent of ctx when ctx is a copy context
// of the plugin's own and NCCL_RMA_WASM_DEVICE_AGENT allows it (agent.c):
// registration calls it once its pinned memory is allocated.
func (cudaDevice) StartAgent(ctx uintptr) {
	C.rmaw_cuda_agent_start(C.uintptr_t(ctx))
	if C.rmaw_cuda_agent_runs(C.uintptr_t(ctx)) != 0 {
		agentWatch.Do(func() { go watchAgents(config.DeviceAgentWarnMs.Get()) })
	}
}

var agentWatch sync.Once

// watchAgents WARNs once per stall when a device agent has had commands
// waiting and done none of them for warn: its kernel is not running, and
// nothing else would say so (the operations behind it just never
// complete). It looks every warn/5, at most once a second.
func watchAgents(warn time.Duration) {
	if warn <= 0 {
		return
	}
	every := min(warn/5, time.Second)
	said := false
	for range time.Tick(every) {
		var pending C.uint64_t
		ms := time.Duration(C.rmaw_cuda_agent_stalled(&pending)) * time.Millisecond
		switch {
		case ms == 0:
			said = false
		case ms >= warn && !said:
			said = true
			logx.Warn(abi.SubsysNet, "NET/wasm: device agent: %d command(s) waiting and none done for %v: its kernel is not running, "+
				"or waits for earlier work on the plugin's stream. Its block needs a free SM: a grid that holds every SM while it waits for "+
				"the plugin's signal waits for ever. NCCL_RMA_WASM_DEVICE_AGENT=0 moves the plugin's copies and signals to the copy engines",
				uint64(pending), ms)
		}
	}
}

// StopAgents ends every device agent (plugin finalize), so that no kernel
// of the plugin outlives it.
func (cudaDevice) StopAgents() { C.rmaw_cuda_agents_stop() }

// AgentRuns reports whether ctx has a device agent that takes work now:
// its small copies, device-to-device ones included, and its events need
// no driver submission.
func (cudaDevice) AgentRuns(ctx uintptr) bool { return C.rmaw_cuda_agent_runs(C.uintptr_t(ctx)) != 0 }

// AgentWanted reports whether NCCL_RMA_WASM_DEVICE_AGENT asks for device
// agents in this process: 1, or auto with MPS running.
func (cudaDevice) AgentWanted() bool { return C.rmaw_cuda_agent_wanted() != 0 }

// AgentStats says what the device agents did since they started: their
// commands, and the driver calls that ordering them with the context's
// stream cost (docs/design/device-memory.md); "" when none ran.
func (cudaDevice) AgentStats() string {
	var v [15]C.uint64_t
	C.rmaw_cuda_agent_stats(&v[0])
	if v[5] == 0 || v[0]+v[1]+v[8]+v[10] == 0 {
		return ""
	}
	s := fmt.Sprintf("%d copies and %d signal writes or adds (%d adds) by %d agent(s), %d fused landings (%d inline), %d marked copies; %d waited for the context's stream (a stream write each), %d stream waits for an agent, %d synchronizations waited for on the host, %d launches after parking",
		v[0], v[1], v[7], v[5], v[8], v[9], v[10], v[2], v[3], v[6], v[4])
	if v[12] > 0 {
		s += fmt.Sprintf("; %d peer inbox entries written by the host itself, nothing being queued", v[12])
	}
	if config.DeviceAgentOneRead.Get() {
		s += fmt.Sprintf("; slots read whole, %d of them read again the two-trip way after torn reads", v[11])
	}
	if v[13] > 0 {
		s += fmt.Sprintf("; %d signals that waited on the device for their peer's mark (%d skipped: the peer exited, or no mark within 30 s)", v[13], v[14])
	}
	return s
}

// MarkWaitsSkipped is how many signals after a mark the agents skipped:
// the peer's process exited, or the mark did not come within 30 s
// (devmem.MarkWaiter).
func (cudaDevice) MarkWaitsSkipped() uint64 {
	var v [15]C.uint64_t
	C.rmaw_cuda_agent_stats(&v[0])
	return uint64(v[14])
}

// SignalAfterMark queues, as one command of ctx's device agent after the
// context's earlier work, the write (add false) or atomic add of v to the
// device word sig once the host word mark (a peer's mark page, registered
// here with HostRegisterReadOnly) reached mv, or skips it once the pinned
// host word release (0: none) is not 0 (devmem.MarkWaiter). false (and no
// error): ctx runs no agent, or it cannot reach mark or release.
func (cudaDevice) SignalAfterMark(ctx, sig uintptr, v uint64, add bool, mark uintptr, mv uint64, release uintptr) (bool, error) {
	var buf [256]C.char
	a := C.int(0)
	if add {
		a = 1
	}
	switch C.rmaw_cuda_signal_after_mark(C.uintptr_t(ctx), C.uint64_t(sig), C.uint64_t(v), a, C.uint64_t(mark), C.uint64_t(mv), C.uint64_t(release), &buf[0], C.size_t(len(buf))) {
	case 0:
		return true, nil
	case 1:
		return false, nil
	}
	return false, devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
}

// HostRegisterReadOnly pins [p, p+n), memory mapped read-only here (a
// peer's mark page), for the device to read (devmem.MarkWaiter); the
// devmem.HostRegisterer's HostUnregister undoes it.
func (cudaDevice) HostRegisterReadOnly(ctx uintptr, p unsafe.Pointer, n uint64) error {
	var buf [256]C.char
	if C.rmaw_cuda_host_register_ro(C.uintptr_t(ctx), p, C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
	}
	return nil
}

// LandSignal queues, as one command of ctx's device agent after the
// context's earlier work, the copy of n bytes from pinned host memory src
// to device address dst and then the write (add false) or atomic add of v
// to the device word sig; a payload of up to 64 bytes rides in the
// command itself. false (and no error): ctx runs no agent, or the agent
// cannot take this copy.
func (cudaDevice) LandSignal(ctx, dst uintptr, src unsafe.Pointer, n uint64, sig uintptr, v uint64, add bool) (bool, error) {
	var buf [256]C.char
	a := C.int(0)
	if add {
		a = 1
	}
	switch C.rmaw_cuda_land_signal(C.uintptr_t(ctx), C.uint64_t(dst), src, C.uint64_t(n), C.uint64_t(sig), C.uint64_t(v), a, &buf[0], C.size_t(len(buf))) {
	case 0:
		return true, nil
	case 1:
		return false, nil
	}
	return false, devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
}

// CopyMark queues, as one command of ctx's device agent after the
// context's earlier work, the copy of n bytes from device address src to
// dst and then the write of the command's number to the host word mark
// (the mark page, staging.CopyMappedMark), and returns that number. false
// (and no error): ctx runs no agent, or the agent cannot take this copy
// or reach mark.
func (cudaDevice) CopyMark(ctx, dst, src uintptr, n uint64, mark uintptr) (uint64, bool, error) {
	var buf [256]C.char
	var v C.uint64_t
	switch C.rmaw_cuda_copy_mark(C.uintptr_t(ctx), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n), C.uint64_t(mark), &v, &buf[0], C.size_t(len(buf))) {
	case 0:
		return uint64(v), true, nil
	case 1:
		return 0, false, nil
	}
	return 0, false, devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
}

// InboxOpen makes ctx's peer inbox once (devmem.Inboxer).
func (cudaDevice) InboxOpen(ctx, taken, rows uintptr, size uint64) error {
	var buf [256]C.char
	if C.rmaw_cuda_inbox_open(C.uintptr_t(ctx), C.uint64_t(taken), C.uint64_t(rows), C.uint64_t(size), &buf[0], C.size_t(len(buf))) != 0 {
		return devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
	}
	return nil
}

// InboxEntries is how many entries a row of the peer inbox holds (inbox.c's
// IB_E).
const InboxEntries = 64

// InboxRow hands out ctx's next inbox row, or row again (devmem.Inboxer).
func (cudaDevice) InboxRow(ctx uintptr, row int) (int, devmem.Segment, int, error) {
	var buf [256]C.char
	r, fd := C.int(row), C.int(-1)
	if row < 0 {
		r = -1
	}
	var size C.uint64_t
	if C.rmaw_cuda_inbox_row(C.uintptr_t(ctx), &r, &fd, &size, &buf[0], C.size_t(len(buf))) != 0 {
		return 0, devmem.Segment{Fd: -1}, 0, devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
	}
	return int(r), devmem.Segment{Fd: int(fd), Size: uint64(size)}, InboxEntries, nil
}

// InboxReset empties row for a new sender (devmem.Inboxer).
func (cudaDevice) InboxReset(ctx uintptr, row int) error {
	var buf [256]C.char
	if C.rmaw_cuda_inbox_reset(C.uintptr_t(ctx), C.int(row), &buf[0], C.size_t(len(buf))) != 0 {
		return devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
	}
	return nil
}

// InboxTable sets entry idx of ctx's inbox table (devmem.Inboxer).
func (cudaDevice) InboxTable(ctx uintptr, idx int, base uintptr, n uint64) error {
	var buf [256]C.char
	if C.rmaw_cuda_inbox_table(C.uintptr_t(ctx), C.int(idx), C.uint64_t(base), C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
	}
	return nil
}

// InboxTaken is row's count of entries taken, with bit 62 set once one was
// refused (inboxCheck's; the plugin reads the counts in the mark page).
func (cudaDevice) InboxTaken(ctx uintptr, row int) uint64 {
	return uint64(C.rmaw_cuda_inbox_taken(C.uintptr_t(ctx), C.int(row)))
}

// InboxKick launches ctx's agent if it parked (devmem.Inboxer).
func (cudaDevice) InboxKick(ctx uintptr) error {
	var buf [256]C.char
	if C.rmaw_cuda_inbox_kick(C.uintptr_t(ctx), &buf[0], C.size_t(len(buf))) != 0 {
		return devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
	}
	return nil
}

// WriteIdle stores v to the host word w now when everything queued in ctx
// ran (devmem.IdleWriter).
func (cudaDevice) WriteIdle(ctx, w uintptr, v uint64) bool {
	return C.rmaw_cuda_write_idle(C.uintptr_t(ctx), C.uint64_t(w), C.uint64_t(v)) == 0
}

// CopyWrite queues a copy and then the write of v to the device word w on
// ctx's agent (devmem.Inboxer).
func (cudaDevice) CopyWrite(ctx, dst, src uintptr, n uint64, w uintptr, v uint64) (bool, error) {
	var buf [256]C.char
	switch C.rmaw_cuda_copy_write(C.uintptr_t(ctx), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n), C.uint64_t(w), C.uint64_t(v), &buf[0], C.size_t(len(buf))) {
	case 0:
		return true, nil
	case 1:
		return false, nil
	}
	return false, devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf))
}

// Agent says what the last start or stop of a device agent found.
func (cudaDevice) Agent() string {
	var buf [240]C.char
	C.rmaw_cuda_agent_note(&buf[0], C.size_t(len(buf)))
	return C.GoString(&buf[0])
}

// Locate says which CUDA device holds ptr, for direct registration with a
// NIC (libfabric FI_HMEM_CUDA).
func (cudaDevice) Locate(_, ptr uintptr) (int, int, error) {
	o := int(C.rmaw_cuda_ordinal(C.uint64_t(ptr)))
	if o < 0 {
		return 0, 0, errors.New("no CUDA device ordinal for this address")
	}
	return devmem.IfaceCUDA, o, nil
}

// PeerAtomics reports whether device a's atomics reach device b's memory
// natively (NVLink; over PCIe mostly not); true for one device.
func (cudaDevice) PeerAtomics(a, b int) bool { return C.rmaw_cuda_p2p_atomics(C.int(a), C.int(b)) != 0 }

// gdrDevice is the CUDA device with GDRCopy for signal words.
type gdrDevice struct{ cudaDevice }

func (gdrDevice) AddWord(ctx, addr uintptr, v uint64) (bool, error) {
	return C.rmaw_gdr_add(C.uintptr_t(ctx), C.uint64_t(addr), C.uint64_t(v)) == 1, nil
}

func (gdrDevice) Forget(addr uintptr, size uint64) {
	C.rmaw_gdr_forget(C.uint64_t(addr), C.uint64_t(size))
}
