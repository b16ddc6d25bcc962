package plugin

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// pluginCtx is what init returns: one per call (NCCL calls init once for the
// RMA proxy and once more for the GIN proxy, on every communicator).
type pluginCtx struct {
	commID  uint64
	backend *loaded
}

// loaded is a backend together with what NCCL was told about it.
type loaded struct {
	key     string
	b       backend.Backend
	devices []backend.DeviceInfo
	nics    []nics.NIC // devices[i] is nics[i] when the fabric transport is selected
}

var (
	ctxs    = table[pluginCtx]{kind: kindCtx}
	loadMu  sync.Mutex
	current atomic.Pointer[loaded]
	cache   = map[string]*loaded{}
)

// OpenGuest loads a Wasm backend by name; installed by the sandbox package
// wiring (host/sandbox registers itself through RegisterGuestLoader).
var openGuest func(name string) (backend.Backend, error)

// RegisterGuestLoader installs the Wasm backend loader. Kept as a hook so
// the runtime does not depend on wazero when built for tests of the data path.
func RegisterGuestLoader(f func(name string) (backend.Backend, error)) { openGuest = f }

// selectBackend loads (once per configuration) the backend the environment
// asks for. Compiled modules are kept for the life of the process: the
// library is never unloaded, and init runs again on every communicator.
func selectBackend() (*loaded, error) {
	name := config.Backend.Get()
	key := name + "\x00" + config.Dir.Get() + "\x00" + config.BackendConfig.Get()
	loadMu.Lock()
	defer loadMu.Unlock()
	if l := cache[key]; l != nil {
		current.Store(l)
		return l, nil
	}
	var b backend.Backend
	switch {
	case name == "native":
		b = backend.Native{}
	case openGuest == nil:
		return nil, errors.New("this build has no Wasm sandbox; only NCCL_RMA_WASM_BACKEND=native is available")
	default:
		var err error
		if b, err = openGuest(name); err != nil {
			return nil, err
		}
	}
	devs := b.Devices()
	if len(devs) == 0 {
		return nil, fmt.Errorf("backend %q reports no devices", b.Name())
	}
	l := &loaded{key: key, b: b}
	l.devices, l.nics = withNICs(devs)
	cache[key] = l
	current.Store(l)
	return l, nil
}

// Init creates an independent plugin context.
func Init(commID uint64) (uint64, abi.Result) {
	// One line per process says which build runs (host/version; rmaw version
	// prints the same), so that a WARN in a cluster's log can be tied to it.
	logVersion()
	// Before anything opens a file: without a descriptor for the runtime's
	// poller the process would abort (dataplane.EnsurePoller).
	if err := dataplane.EnsurePoller(); err != nil {
		logx.Warn(abi.SubsysInit|abi.SubsysNet, "NET/wasm: init: %v", err)
		return 0, abi.SystemError
	}
	dataplane.Prewarm(config.Addr.Get()) // overlaps with loading the backend
	raiseNoFile()                        // as NCCL does: thousands of ranks need thousands of streams
	staging.SetAtomicKernel(config.DeviceAtomic.Get())
	staging.SetAsyncCopy(uint64(config.AsyncCopyKiB.Get()) << 10)
	staging.SetSelfAsync(config.SelfAsync.Get())
	ipcMinBytes.Store(uint64(config.IntraIPCMinKiB.Get()) << 10)
	directSignal.Store(config.DirectSignal.Get())
	inboxOn.Store(config.IntraInbox.Get())
	inbox.SetCallerWait(time.Duration(config.InboxCallerWaitUs.Get()) * time.Microsecond)
	inbox.SetHostRows(config.InboxHostRows.Get())
	// All need the agent's adds where the driver has no stream atomics
	// (plain signal words would otherwise take read-modify-writes).
	staging.SetAgentAdds(directSignal.Load() || inboxOn.Load() || config.FusedLanding.Get())
	staging.SetFusedLanding(config.FusedLanding.Get())
	if config.IntraIPCAgent.Get() {
		ipcAgentMax.Store(uint64(config.DeviceAgentMaxKiB.Get()) << 10)
	}
	profile.SetOn(config.Profile.Get())
	staging.SetMarkWaitDevice(config.IntraMarkWaitDevice.Get())
	profile.SetTrace(config.ProfileTrace.Get() != "")
	// An explicit transport or provider that cannot be honoured fails here,
	// as NCCL fails an explicit NCCL_NET, rather than running at a tenth of
	// the speed over TCP unnoticed.
	if _, err := selectTransport(); err != nil {
		logx.Warn(abi.SubsysInit|abi.SubsysNet, "NET/wasm: init: %v", err)
		return 0, abi.InvalidUsage
	}
	l, err := selectBackend()
	if err != nil {
		logx.Warn(abi.SubsysInit|abi.SubsysNet, "NET/wasm: cannot load backend: %v", err)
		return 0, abi.InternalError
	}
	id := ctxs.add(&pluginCtx{commID: commID, backend: l})
	logx.Info(abi.SubsysInit|abi.SubsysNet, "NET/wasm: initialized for comm %#x with backend %s (%d device(s))", commID, l.b.Name(), len(l.devices))
	return ctxs.handle(id), abi.Success
}

// Finalize releases a plugin context. Communicators it created are closed
// by closeColl; whatever is left is tolerated.
func Finalize(ctx uint64) abi.Result {
	if ctxs.take(ctx) == nil {
		logx.Warn(abi.SubsysInit, "NET/wasm: finalize: unknown context %#x", ctx)
		return abi.InvalidArgument
	}
	// Pinned staging memory belongs to a device context the application
	// may destroy after the last finalize; idle stagers, the signal page
	// and the bounce slots go then. Not before: another plugin context's
	// communicators still use them, and remaking them would allocate
	// pinned memory on the data path, where a kernel may be waiting.
	if ctxs.empty() {
		staging.Release() // stops the agents: their inboxes go with them
		inbox.Forget()
	}
	return abi.Success
}

func lookupCtx(ctx uint64) *pluginCtx { return ctxs.lookup(ctx) }

func devicesNow() []backend.DeviceInfo {
	if l := current.Load(); l != nil {
		return l.devices
	}
	return nil
}

// Devices reports how many devices the selected backend exposes.
func Devices() (int32, abi.Result) {
	d := devicesNow()
	if len(d) == 0 {
		logx.Warn(abi.SubsysInit, "NET/wasm: devices called before init")
		return 0, abi.InvalidUsage
	}
	return int32(len(d)), abi.Success
}

// DeviceName is the name of device dev, for capi to keep as a C string.
func DeviceName(dev int32) string {
	d := devicesNow()
	if dev < 0 || int(dev) >= len(d) {
		return ""
	}
	return d[dev].Name
}

// Limits the data path can honour; backends cannot advertise beyond them.
const (
	maxSpeedMbps = 400000
	minLatencyUs = 1
	maxRecvs     = 8
)

// GetProperties fills every field of p (NCCL passes uninitialised memory).
// capi sets p.Name to a C string of DeviceName(dev) afterwards.
func GetProperties(dev int32, p *abi.NetProperties) abi.Result {
	d := devicesNow()
	if dev < 0 || int(dev) >= len(d) {
		logx.Warn(abi.SubsysInit|abi.SubsysNet, "NET/wasm: getProperties: device %d out of range [0, %d)", dev, len(d))
		return abi.InvalidArgument
	}
	info := d[dev]
	*p = abi.NetProperties{
		GUID:                uint64(dev),
		PtrSupport:          ptrSupport(),
		Speed:               min(max(info.SpeedMbps, 1), maxSpeedMbps),
		Port:                1,
		Latency:             max(info.LatencyUs, minLatencyUs),
		MaxComms:            65536,
		MaxRecvs:            maxRecvs,
		NetDeviceType:       abi.NetDeviceGinProxy,
		NetDeviceVersion:    0,
		VPropsNdevs:         1,
		MaxP2pBytes:         abi.MaxNetSizeBytes,
		MaxCollBytes:        abi.MaxNetSizeBytes,
		MaxMultiRequestSize: 1,
		RailID:              -1,
		PlaneID:             -1,
	}
	p.VPropsDevs[0] = dev
	return abi.Success
}

// ptrSupport advertises device memory when a device runtime is loaded, and
// DMA-BUF registration of it (RegMrDmaBuf registers the address range, or
// hands the DMA-BUF to a libfabric provider with FI_HMEM): both work on
// every transport, staged through host memory where the NIC cannot reach
// device memory.
func ptrSupport() int32 {
	if devmem.Get() != nil {
		return abi.PtrHost | abi.PtrCuda | abi.PtrDmaBuf
	}
	return abi.PtrHost
}
