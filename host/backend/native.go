package backend

import "github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"

// Native is the passthrough policy without any guest: the baseline the
// sandbox's cost is measured against (NCCL_RMA_WASM_BACKEND=native).
type Native struct{}

func (Native) Name() string { return "native" }

func (Native) Devices() []DeviceInfo { return []DeviceInfo{DefaultDevice()} }

// DefaultDevice is the one device of the native backend and the embedded
// default, and the host's answer for a guest without rmaw_devices.
func DefaultDevice() DeviceInfo {
	return DeviceInfo{Name: guestabi.DefaultDeviceName, SpeedMbps: guestabi.DefaultDeviceSpeedMbps, LatencyUs: guestabi.DefaultDeviceLatencyUs}
}

func (Native) ConnectionPlan(nranks, rank int32) (ConnPlan, error) { return DefaultConnPlan(), nil }

func (Native) NewContext(ContextInfo) (Context, error) { return nativeContext{}, nil }

func (Native) Close() error { return nil }

type nativeContext struct{}

func (nativeContext) PlansOps() bool                 { return false }
func (nativeContext) PlanOp(*Op, *OpPlan) error      { return nil }
func (nativeContext) WantsCompletions() bool         { return false }
func (nativeContext) Completions([]Completion) error { return nil }
func (nativeContext) Close() error                   { return nil }
