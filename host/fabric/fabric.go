// Package fabric is the thin cgo layer over libfabric for the RDMA
// transport (host/dataplane/ofi). libfabric is dlopen'ed at run
// time, never linked: a host without it keeps working over TCP. Building
// needs its headers (libfabric-dev), because the data-path calls are
// static inlines there; shim.c wraps them so Go makes one cgo call per
// post and one per batch of completions. Everything libfabric keeps a
// pointer to (contexts, receive buffers, registered memory) lives in C
// memory, outside the Go heap.
package fabric

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// Info describes one provider offering RDM endpoints with RMA.
type Info struct {
	Provider, Fabric, Domain string
	MRMode                   uint64
	CQDataSize, InjectSize   uint64
	MaxMsgSize               uint64
	RxCQData                 bool // remote CQ data consumes a posted receive
	// The NIC behind the domain, where the provider describes it (fi_nic):
	// its name, PCI address (dddd:bb:dd.f) and link speed in bits/s.
	NIC, PCI  string
	LinkSpeed uint64
	// HMEM: the endpoint was opened with FI_HMEM, so device memory is
	// registered with its interface (RegisterMR); API is the FI_VERSION
	// asked of fi_getinfo (1.20 from a runtime that has FI_MR_DMABUF).
	HMEM bool
	API  uint32
}

// mr_mode bits (rdma/fi_domain.h) the dataplane reacts to.
const (
	MRLocal    = 1 << 2  // FI_MR_LOCAL: local buffers need a descriptor
	MRVirtAddr = 1 << 4  // FI_MR_VIRT_ADDR: remote addresses are virtual, not offsets
	MRProvKey  = 1 << 6  // FI_MR_PROV_KEY
	MREndpoint = 1 << 9  // FI_MR_ENDPOINT
	MRHMEM     = 1 << 10 // FI_MR_HMEM: device buffers need a descriptor
)

// Completion flags (rdma/fabric.h).
const (
	FlagMsg          = 1 << 1
	FlagRMA          = 1 << 2
	FlagRead         = 1 << 8
	FlagWrite        = 1 << 9
	FlagRecv         = 1 << 10
	FlagSend         = 1 << 11
	FlagRemoteRead   = 1 << 12
	FlagRemoteWrite  = 1 << 13
	FlagRemoteCQData = 1 << 17
)

// ErrAgain is FI_EAGAIN: the provider has no room; progress and retry.
var ErrAgain = errors.New("fabric: try again (FI_EAGAIN)")

const fiEAGAIN = 11

var (
	loadOnce sync.Once
	loadErr  error
)

// Load dlopens lib (a name or path, normally libfabric.so.1) once per
// process; later calls return the first result.
func Load(lib string) error {
	loadOnce.Do(func() {
		cs := C.CString(lib)
		defer C.free(unsafe.Pointer(cs))
		var buf [512]C.char
		if C.rmaw_load(cs, &buf[0], C.size_t(len(buf))) != 0 {
			loadErr = fmt.Errorf("cannot load %s: %s", lib, C.GoString(&buf[0]))
		}
	})
	return loadErr
}

func fiErr(what string, rc C.int) error {
	return fmt.Errorf("%s: %s (%d)", what, C.GoString(C.rmaw_strerror(rc)), int(rc))
}

func toInfo(ci *C.rmaw_info) Info {
	return Info{Provider: C.GoString(&ci.prov[0]), Fabric: C.GoString(&ci.fabric[0]), Domain: C.GoString(&ci.domain[0]),
		MRMode: uint64(ci.mr_mode), CQDataSize: uint64(ci.cq_data_size), InjectSize: uint64(ci.inject_size),
		MaxMsgSize: uint64(ci.max_msg_size), RxCQData: ci.rx_cq_data != 0,
		NIC: C.GoString(&ci.nic[0]), PCI: C.GoString(&ci.pci[0]), LinkSpeed: uint64(ci.link_speed),
		HMEM: ci.hmem != 0, API: uint32(ci.api)}
}

// Version packs major.minor as FI_VERSION does.
func Version(major, minor uint32) uint32 { return major<<16 | minor }

// APIDMABUF is the first API version whose registrations take a DMA-BUF.
const APIDMABUF = 1<<16 | 20

// RuntimeVersion is fi_version() of the loaded libfabric (0 if none).
func RuntimeVersion() uint32 { return uint32(C.rmaw_runtime_version()) }

// Memory interfaces (enum fi_hmem_iface).
const (
	IfaceSystem = 0
	IfaceCUDA   = 1
	IfaceROCR   = 2
)

// MRRequest asks for a registration: host memory (Iface 0) or device
// memory (IfaceCUDA, IfaceROCR; Device its ordinal), by address range or,
// with DMABUFFd >= 0, as a DMA-BUF (fd, offset) where the library can.
type MRRequest struct {
	Base      unsafe.Pointer
	Len       uint64
	WantKey   uint64 // where the provider lets us choose (no FI_MR_PROV_KEY)
	Iface     int
	Device    int
	DMABUFFd  int
	DMABUFOff uint64
}

func (r *MRRequest) c() C.rmaw_mr_req {
	return C.rmaw_mr_req{base: r.Base, len: C.uint64_t(r.Len), want_key: C.uint64_t(r.WantKey), iface: C.int32_t(r.Iface),
		device: C.int32_t(r.Device), dmabuf_fd: C.int32_t(r.DMABUFFd), dmabuf_off: C.uint64_t(r.DMABUFOff)}
}

// MRView is what a registration request becomes: the fi_mr_attr fields
// and flags the shim passes to fi_mr_regattr.
type MRView struct {
	Access, RequestedKey, Flags uint64
	Iface, Device               int // Device -1 where the interface has none
	DMABUF                      bool
	Fd                          int // the DMA-BUF's, -1 otherwise
	Base                        uintptr
	Len, Offset, IOVCount       uint64
}

// FlagDMABUF is FI_MR_DMABUF.
const FlagDMABUF = 1 << 40

// DescribeMR builds the attributes r would be registered with on an
// endpoint opened with (hmem) or without FI_HMEM at API version api,
// without registering: the registration's logic, testable with no NIC.
func DescribeMR(hmem bool, api uint32, r MRRequest) (MRView, error) {
	cr := r.c()
	var v C.rmaw_mr_view
	h := C.uint32_t(0)
	if hmem {
		h = 1
	}
	if rc := C.rmaw_mr_describe(h, C.uint32_t(api), &cr, &v); rc != 0 {
		return MRView{}, fiErr("fi_mr_attr", rc)
	}
	return MRView{Access: uint64(v.access), RequestedKey: uint64(v.requested_key), Flags: uint64(v.flags),
		Iface: int(v.iface), Device: int(v.device), DMABUF: v.dmabuf != 0, Fd: int(v.fd),
		Base: uintptr(v.base), Len: uint64(v.len), Offset: uint64(v.offset), IOVCount: uint64(v.iov_count)}, nil
}

// Probe lists the providers (all, or the one named) that offer an RDM
// endpoint with RMA and messages.
func Probe(prov string) ([]Info, error) { return probe(prov, false, 32) }

// ProbeAny lists the entries of provider prov (all providers when empty)
// with no capability or endpoint-type hints, to tell a name libfabric does
// not know from a provider without RDM endpoints and RMA (Probe). An empty
// list with a nil error means libfabric knows no such provider.
func ProbeAny(prov string) ([]Info, error) { return probe(prov, true, 64) }

// probe runs fi_getinfo with Probe's hints, or none (anyCaps), keeping at
// most max entries.
func probe(prov string, anyCaps bool, max int) ([]Info, error) {
	var cp *C.char
	if prov != "" {
		cp = C.CString(prov)
		defer C.free(unsafe.Pointer(cp))
	}
	out := make([]C.rmaw_info, max)
	var n C.int
	if anyCaps {
		n = C.rmaw_probe_any(cp, &out[0], C.int(len(out)))
	} else {
		n = C.rmaw_probe(cp, &out[0], C.int(len(out)))
	}
	if n < 0 {
		return nil, fiErr("fi_getinfo", n)
	}
	infos := make([]Info, n)
	for i := range infos {
		infos[i] = toInfo(&out[i])
	}
	return infos, nil
}

// Endpoint is one RDM endpoint with its fabric, domain, completion queue
// and address vector.
type Endpoint struct {
	ep   *C.rmaw_ep
	Info Info
}

// Open opens an endpoint on provider prov (exact name, e.g. "tcp;ofi_rxm")
// and domain (empty: the provider's first).
func Open(prov, domain string) (*Endpoint, error) { return OpenHMEM(prov, domain, false) }

// OpenHMEM is Open with FI_HMEM when hmem: device memory can then be
// registered (RegisterMR); a provider without it there fails.
func OpenHMEM(prov, domain string, hmem bool) (*Endpoint, error) {
	cp := C.CString(prov)
	defer C.free(unsafe.Pointer(cp))
	cd := C.CString(domain)
	defer C.free(unsafe.Pointer(cd))
	var ep *C.rmaw_ep
	var ci C.rmaw_info
	if rc := C.rmaw_open(cp, cd, cbool(hmem), &ep, &ci); rc != 0 {
		return nil, fiErr("open "+prov, rc)
	}
	return &Endpoint{ep: ep, Info: toInfo(&ci)}, nil
}

// Name is the endpoint's address, for peers to insert.
func (e *Endpoint) Name() ([]byte, error) {
	buf := (*C.char)(C.malloc(256))
	defer C.free(unsafe.Pointer(buf))
	n := C.size_t(256)
	if rc := C.rmaw_name(e.ep, unsafe.Pointer(buf), &n); rc != 0 {
		return nil, fiErr("fi_getname", rc)
	}
	return C.GoBytes(unsafe.Pointer(buf), C.int(n)), nil
}

// Insert adds a peer's name to the address vector.
func (e *Endpoint) Insert(name []byte) (uint64, error) {
	buf := C.CBytes(name)
	defer C.free(buf)
	var a C.uint64_t
	if rc := C.rmaw_insert(e.ep, buf, &a); rc != 0 {
		return 0, fiErr("fi_av_insert", rc)
	}
	return uint64(a), nil
}

// MR is a registration: its handle, remote key and local descriptor;
// Dev marks device memory registered with its interface (FI_HMEM).
type MR struct {
	mr   unsafe.Pointer
	Key  uint64
	Desc unsafe.Pointer
	Dev  bool
}

// Register registers [base, base+size) for local use and remote
// reads and writes. want is the key asked for where the provider lets
// us choose (no FI_MR_PROV_KEY); it must be unique in the domain.
func (e *Endpoint) Register(base unsafe.Pointer, size uint64, want uint64) (MR, error) {
	var m MR
	var key C.uint64_t
	if rc := C.rmaw_reg(e.ep, base, C.size_t(size), C.uint64_t(want), &m.mr, &key, &m.Desc); rc != 0 {
		return MR{}, fiErr("fi_mr_regattr", rc)
	}
	m.Key = uint64(key)
	return m, nil
}

// RegisterMR registers r (host or device memory) for local use and
// remote reads and writes, bound to the endpoint where the provider needs
// that. Device memory needs an endpoint opened with FI_HMEM (Info.HMEM).
// A DMA-BUF fd is only read during the call.
func (e *Endpoint) RegisterMR(r MRRequest) (MR, error) {
	cr := r.c()
	var m MR
	var key C.uint64_t
	if rc := C.rmaw_reg_mr(e.ep, &cr, &m.mr, &key, &m.Desc); rc != 0 {
		return MR{}, fiErr("fi_mr_regattr", rc)
	}
	m.Key, m.Dev = uint64(key), r.Iface != IfaceSystem
	return m, nil
}

// Deregister closes a registration.
func (e *Endpoint) Deregister(m MR) {
	if m.mr != nil {
		C.rmaw_dereg(m.mr)
	}
}

func post(rc C.int64_t, what string) error {
	switch {
	case rc == 0:
		return nil
	case rc == -fiEAGAIN:
		return ErrAgain
	}
	return fiErr(what, C.int(rc))
}

// Write posts a plain RMA write (fi_write): make bench's baseline.
func (e *Endpoint) Write(buf unsafe.Pointer, n uint64, desc unsafe.Pointer, dest, raddr, key uint64, ctx unsafe.Pointer) error {
	return post(C.rmaw_write(e.ep, buf, C.size_t(n), desc, C.uint64_t(dest), C.uint64_t(raddr), C.uint64_t(key), ctx), "fi_write")
}

// WriteData posts an RMA write carrying 8 bytes of remote CQ data.
func (e *Endpoint) WriteData(buf unsafe.Pointer, n uint64, desc unsafe.Pointer, data, dest, raddr, key uint64, ctx unsafe.Pointer) error {
	return post(C.rmaw_writedata(e.ep, buf, C.size_t(n), desc, C.uint64_t(data), C.uint64_t(dest), C.uint64_t(raddr), C.uint64_t(key), ctx), "fi_writedata")
}

// WriteMsg is WriteData as fi_writemsg; deliver asks for
// FI_DELIVERY_COMPLETE: the completion then means the bytes arrived.
func (e *Endpoint) WriteMsg(buf unsafe.Pointer, n uint64, desc unsafe.Pointer, data, dest, raddr, key uint64, ctx unsafe.Pointer, deliver bool) error {
	return post(C.rmaw_writemsg(e.ep, buf, C.size_t(n), desc, C.uint64_t(data), C.uint64_t(dest), C.uint64_t(raddr), C.uint64_t(key), ctx, cbool(deliver)), "fi_writemsg")
}

// SendMsg sends a message whose completion is reported (deliver: as above).
func (e *Endpoint) SendMsg(buf unsafe.Pointer, n uint64, desc unsafe.Pointer, dest uint64, ctx unsafe.Pointer, deliver bool) error {
	return post(C.rmaw_sendmsg(e.ep, buf, C.size_t(n), desc, C.uint64_t(dest), ctx, cbool(deliver)), "fi_sendmsg")
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Read posts an RMA read.
func (e *Endpoint) Read(buf unsafe.Pointer, n uint64, desc unsafe.Pointer, src, raddr, key uint64, ctx unsafe.Pointer) error {
	return post(C.rmaw_read(e.ep, buf, C.size_t(n), desc, C.uint64_t(src), C.uint64_t(raddr), C.uint64_t(key), ctx), "fi_read")
}

// Inject sends a small message; buf is reusable on return.
func (e *Endpoint) Inject(buf unsafe.Pointer, n uint64, dest uint64) error {
	return post(C.rmaw_inject(e.ep, buf, C.size_t(n), C.uint64_t(dest)), "fi_inject")
}

// Recv posts a receive buffer for messages from any peer.
func (e *Endpoint) Recv(buf unsafe.Pointer, n uint64, desc, ctx unsafe.Pointer) error {
	return post(C.rmaw_recv(e.ep, buf, C.size_t(n), desc, ctx), "fi_recv")
}

// Completion is one reaped completion; Err non-zero marks an error.
type Completion = C.rmaw_comp

// Ctx, Flags, Len, Data and Err read a Completion.
func Ctx(c *Completion) unsafe.Pointer { return c.ctx }
func Flags(c *Completion) uint64       { return uint64(c.flags) }
func Len(c *Completion) uint64         { return uint64(c.len) }
func Data(c *Completion) uint64        { return uint64(c.data) }
func Err(c *Completion) int            { return int(c.err) }

// Comps is a batch of room for completions in C memory. Never Go memory:
// C writes it, and for a Go pointer cgo would check every entry (each
// holds a pointer) on every poll, which cost more than the poll.
type Comps struct {
	p *C.rmaw_comp
	n int
}

// NewComps allocates room for n (at most 64) completions; Free releases it.
func NewComps(n int) *Comps {
	n = min(max(n, 1), 64)
	return &Comps{p: (*C.rmaw_comp)(C.calloc(C.size_t(n), C.sizeof_rmaw_comp)), n: n}
}

// Free releases the room; c is unusable after.
func (c *Comps) Free() {
	C.free(unsafe.Pointer(c.p))
	c.p, c.n = nil, 0
}

// At is completion i of the last Poll.
func (c *Comps) At(i int) *Completion {
	return (*Completion)(unsafe.Add(unsafe.Pointer(c.p), uintptr(i)*C.sizeof_rmaw_comp))
}

// Poll reads up to c's room of completions into c; 0 means none.
func (e *Endpoint) Poll(c *Comps) (int, error) { return e.poll(c.p, c.n) }

// Progress lets the provider progress without reaping a completion.
func (e *Endpoint) Progress(c *Comps) { e.poll(c.p, 0) }

func (e *Endpoint) poll(p *C.rmaw_comp, n int) (int, error) {
	rc := C.rmaw_poll(e.ep, p, C.int(n))
	if rc == -fiEAGAIN {
		return 0, nil
	}
	if rc < 0 {
		return 0, fiErr("fi_cq_read", C.int(rc))
	}
	return int(rc), nil
}

// Wait sleeps up to timeout for the completion queue to have work: after
// fi_trywait, in poll() on the CQ's wait fd. An error means the endpoint
// cannot wait this way (no wait object, or the provider refuses): poll.
func (e *Endpoint) Wait(timeoutMs int) error {
	if rc := C.rmaw_wait(e.ep, C.int(timeoutMs)); rc != 0 {
		return fiErr("fi_trywait", rc)
	}
	return nil
}

// CanWait reports whether the CQ has a wait fd.
func (e *Endpoint) CanWait() bool { return C.rmaw_can_wait(e.ep) != 0 }

// Signal ends a Wait in progress (fi_cq_signal).
func (e *Endpoint) Signal() { C.rmaw_signal(e.ep) }

// Strerror is fi_strerror.
func Strerror(e int) string { return C.GoString(C.rmaw_strerror(C.int(e))) }

// Close closes the endpoint and everything under it; registrations must
// be closed first.
func (e *Endpoint) Close() {
	C.rmaw_close(e.ep)
	e.ep = nil
}

// Alloc returns n zeroed bytes of C memory (contexts, receive buffers).
func Alloc(n uint64) unsafe.Pointer { return C.calloc(1, C.size_t(n)) }

// Free releases Alloc's memory.
func Free(p unsafe.Pointer) { C.free(p) }

// ContextSize is the room a context needs (struct fi_context2).
const ContextSize = 64
