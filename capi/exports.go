package main

/*
#include <stdbool.h>
#include <stdint.h>
#include "rma_plugin.h"
*/
import "C"

import (
	"runtime/debug"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/cuda"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/hip"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// Conventions of every export below:
//   - handles cross as C.uintptr_t (tables.c casts void* <-> uintptr_t), so
//     Go never holds an integer id typed as a pointer and never hands a Go
//     pointer to C;
//   - a NULL out-pointer is ncclInvalidArgument with a WARN naming the call
//     and the argument; out handles are cleared first and written only on
//     success;
//   - a panic is recovered, logged at WARN and returned as ncclInternalError;
//   - per-op calls (iput, iputSignal, iget, test, rmaProgress) allocate
//     nothing on the success path (exports_test.go checks it).
//
// The helpers below hold that scaffold: recoverTo (deferred), clearOut for
// out-pointers and putID for created handles.

const subsys = abi.SubsysNet

func rc(r abi.Result) C.int { return C.int(r) }

// nullArg reports a NULL pointer argument.
func nullArg(call, arg string) C.int {
	logx.Warn(subsys, "%s: NULL %s", call, arg)
	return rc(abi.InvalidArgument)
}

// recoverTo turns a panic in the export that defers it into
// ncclInternalError in *ret. Every export defers it directly with a named
// result (defer recoverTo(&ret, "call")), not through a closure: such a
// defer is open-coded and allocates nothing, which the per-op calls need.
func recoverTo(ret *C.int, call string) {
	if r := recover(); r != nil {
		*ret = panicked(call, r)
	}
}

// recoverOn is recoverTo for calls on an rma context or a communicator: the
// panic also raises that communicator's sticky error, so queryLastError
// reports it as it reports every other failed operation (SPEC.md §3).
func recoverOn(ret *C.int, call string, h C.uintptr_t) {
	if r := recover(); r != nil {
		*ret = panicked(call, r)
		plugin.NoteFault(uint64(h), call)
	}
}

// panicked logs a recovered panic and returns ncclInternalError.
func panicked(call string, r any) C.int {
	logx.Warn(subsys, "%s: internal error (recovered panic): %v", call, r)
	logx.Trace(subsys, "%s: panic stack:\n%s", call, debug.Stack())
	return rc(abi.InternalError)
}

// clearOut checks an out-pointer and clears it, so the caller sees a value
// only on success. NULL is ncclInvalidArgument (returned with ok = false)
// with a WARN naming the call and the argument.
func clearOut[T any](p *T, call, arg string) (ret C.int, ok bool) {
	if p == nil {
		return nullArg(call, arg), false
	}
	var zero T
	*p = zero
	return rc(abi.Success), true
}

// putID finishes a call that creates something: it passes a host error
// through, writes the new id to *out, and turns a success without an id
// (a host bug) into ncclInternalError, since C would read 0 as NULL.
func putID(out *C.uintptr_t, id uint64, r abi.Result, call, what string) C.int {
	if r != abi.Success {
		return rc(r)
	}
	if id == 0 {
		return noID(call, what)
	}
	*out = C.uintptr_t(id)
	return rc(abi.Success)
}

// noID reports a host success that produced no handle (a host bug).
func noID(call, what string) C.int {
	logx.Warn(subsys, "%s: internal error: runtime returned success without a %s", call, what)
	return rc(abi.InternalError)
}

//export rmawasm_init
func rmawasm_init(ctx *C.uintptr_t, commID C.uint64_t, logFn C.uintptr_t) (ret C.int) {
	defer recoverTo(&ret, "init")
	if logFn != 0 {
		installLogger(logFn)
	}
	if r, ok := clearOut(ctx, "init", "ctx"); !ok {
		return r
	}
	cuda.Probe()
	hip.Probe() // RCCL's HIP memory arrives as NCCL_PTR_CUDA too
	id, r := plugin.Init(uint64(commID))
	return putID(ctx, id, r, "init", "context")
}

//export rmawasm_devices
func rmawasm_devices(ndev *C.int) (ret C.int) {
	defer recoverTo(&ret, "devices")
	if r, ok := clearOut(ndev, "devices", "ndev"); !ok {
		return r
	}
	n, r := plugin.Devices()
	if r != abi.Success {
		return rc(r)
	}
	*ndev = C.int(n)
	return rc(abi.Success)
}

//export rmawasm_getRmaProperties
func rmawasm_getRmaProperties(coll C.uintptr_t, props *C.ncclRmaProperties_v16_t) (ret C.int) {
	defer recoverTo(&ret, "getRmaProperties")
	if props == nil {
		return nullArg("getRmaProperties", "rmaProps")
	}
	props.flushesAllPutsOnAnySignal = false
	v, r := plugin.GetRmaProperties(uint64(coll))
	if r != abi.Success {
		return rc(r)
	}
	props.flushesAllPutsOnAnySignal = C.bool(v)
	return rc(abi.Success)
}

//export rmawasm_getProperties
func rmawasm_getProperties(dev C.int, props *C.ncclNetProperties_v12_t) (ret C.int) {
	defer recoverTo(&ret, "getProperties")
	if props == nil {
		return nullArg("getProperties", "props")
	}
	// abi.NetProperties has the layout of ncclNetProperties_v12_t
	// (test/layout_test.go checks it against rma_plugin.h).
	p := (*abi.NetProperties)(unsafe.Pointer(props))
	*p = abi.NetProperties{}
	if r := plugin.GetProperties(int32(dev), p); r != abi.Success {
		return rc(r)
	}
	props.name = cString(deviceName(int32(dev)))
	props.pciPath = nil
	if pp := plugin.DevicePCIPath(int32(dev)); pp != "" {
		props.pciPath = cString(pp)
	}
	return rc(abi.Success)
}

//export rmawasm_listen
func rmawasm_listen(ctx C.uintptr_t, dev C.int, handle unsafe.Pointer, listenComm *C.uintptr_t) (ret C.int) {
	defer recoverTo(&ret, "listen")
	if r, ok := clearOut(listenComm, "listen", "listenComm"); !ok {
		return r
	}
	if handle == nil {
		return nullArg("listen", "handle")
	}
	id, r := plugin.Listen(uint64(ctx), int32(dev), (*[abi.HandleSize]byte)(handle))
	return putID(listenComm, id, r, "listen", "listen communicator")
}

//export rmawasm_connect
func rmawasm_connect(ctx C.uintptr_t, handles *unsafe.Pointer, nranks, rank C.int, listen C.uintptr_t, collComm *C.uintptr_t) (ret C.int) {
	defer recoverTo(&ret, "connect")
	_ = ctx // may be another plugin's context (NCCL passes netContext): ignored
	if r, ok := clearOut(collComm, "connect", "collComm"); !ok {
		return r
	}
	if handles == nil {
		return nullArg("connect", "handles")
	}
	if nranks <= 0 || rank < 0 || rank >= nranks {
		logx.Warn(subsys, "connect: invalid rank %d of nranks %d", int(rank), int(nranks))
		return rc(abi.InvalidArgument)
	}
	raw := unsafe.Slice(handles, int(nranks))
	hs := make([]*[abi.HandleSize]byte, len(raw))
	for i, p := range raw {
		if p == nil {
			logx.Warn(subsys, "connect: NULL handles[%d]", i)
			return rc(abi.InvalidArgument)
		}
		hs[i] = (*[abi.HandleSize]byte)(p)
	}
	id, r := plugin.Connect(hs, int32(rank), uint64(listen))
	return putID(collComm, id, r, "connect", "collective communicator")
}

//export rmawasm_createContext
func rmawasm_createContext(coll C.uintptr_t, config *C.ncclRmaConfig_v15_t, rmaCtx *C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "createContext", coll)
	if r, ok := clearOut(rmaCtx, "createContext", "rmaCtx"); !ok {
		return r
	}
	if config == nil {
		return nullArg("createContext", "config")
	}
	cfg := abi.RmaConfig{
		NContexts:    int32(config.nContexts),
		TrafficClass: int32(config.trafficClass),
		RankStride:   int32(config.rankStride),
	}
	id, r := plugin.CreateContext(uint64(coll), cfg)
	return putID(rmaCtx, id, r, "createContext", "rma context")
}

//export rmawasm_regMrSym
func rmawasm_regMrSym(coll, data C.uintptr_t, size C.size_t, typ C.int, flags C.uint64_t, mhandle *C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "regMrSym", coll)
	if r, ok := clearOut(mhandle, "regMrSym", "mhandle"); !ok {
		return r
	}
	id, r := plugin.RegMr(uint64(coll), uintptr(data), uint64(size), int32(typ), uint64(flags))
	return putID(mhandle, id, r, "regMrSym", "memory handle")
}

//export rmawasm_regMrSymDmaBuf
func rmawasm_regMrSymDmaBuf(coll, data C.uintptr_t, size C.size_t, typ C.int, offset C.uint64_t, fd C.int, flags C.uint64_t, mhandle *C.uintptr_t) (ret C.int) {
	defer recoverTo(&ret, "regMrSymDmaBuf")
	if r, ok := clearOut(mhandle, "regMrSymDmaBuf", "mhandle"); !ok {
		return r
	}
	id, r := plugin.RegMrDmaBuf(uint64(coll), uintptr(data), uint64(size), int32(typ), uint64(offset), int32(fd), uint64(flags))
	return putID(mhandle, id, r, "regMrSymDmaBuf", "memory handle")
}

//export rmawasm_deregMrSym
func rmawasm_deregMrSym(coll, mhandle C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "deregMrSym", coll)
	return rc(plugin.DeregMr(uint64(coll), uint64(mhandle)))
}

//export rmawasm_destroyContext
func rmawasm_destroyContext(rmaCtx C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "destroyContext", rmaCtx)
	return rc(plugin.DestroyContext(uint64(rmaCtx)))
}

//export rmawasm_closeColl
func rmawasm_closeColl(coll C.uintptr_t) (ret C.int) {
	defer recoverTo(&ret, "closeColl")
	return rc(plugin.CloseColl(uint64(coll)))
}

//export rmawasm_closeListen
func rmawasm_closeListen(listen C.uintptr_t) (ret C.int) {
	defer recoverTo(&ret, "closeListen")
	return rc(plugin.CloseListen(uint64(listen)))
}

//export rmawasm_iput
func rmawasm_iput(rmaCtx C.uintptr_t, context C.int, srcOff C.uint64_t, srcMh C.uintptr_t, size C.size_t,
	dstOff C.uint64_t, dstMh C.uintptr_t, rank, optFlags C.uint32_t, request *C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "iput", rmaCtx)
	return oneSided(plugin.Iput, "iput", rmaCtx, context, srcOff, srcMh, size, dstOff, dstMh, rank, optFlags, request)
}

//export rmawasm_iputSignal
func rmawasm_iputSignal(rmaCtx C.uintptr_t, context C.int, srcOff C.uint64_t, srcMh C.uintptr_t, size C.size_t,
	dstOff C.uint64_t, dstMh C.uintptr_t, rank C.uint32_t, signalOff C.uint64_t, signalMh C.uintptr_t,
	signalValue C.uint64_t, signalOp C.uint32_t, strong C.bool, optFlags C.uint32_t, request *C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "iputSignal", rmaCtx)
	if r, ok := clearOut(request, "iputSignal", "request"); !ok {
		return r
	}
	id, r := plugin.IputSignal(uint64(rmaCtx), int32(context), uint64(srcOff), uint64(srcMh), uint64(size),
		uint64(dstOff), uint64(dstMh), uint32(rank), uint64(signalOff), uint64(signalMh),
		uint64(signalValue), uint32(signalOp), bool(strong), uint32(optFlags))
	return putID(request, id, r, "iputSignal", "request")
}

//export rmawasm_iget
func rmawasm_iget(rmaCtx C.uintptr_t, context C.int, remoteOff C.uint64_t, remoteMh C.uintptr_t, size C.size_t,
	localOff C.uint64_t, localMh C.uintptr_t, rank, optFlags C.uint32_t, request *C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "iget", rmaCtx)
	return oneSided(plugin.Iget, "iget", rmaCtx, context, remoteOff, remoteMh, size, localOff, localMh, rank, optFlags, request)
}

// oneSided is iput and iget after their recover: the same arguments (an
// offset and a memory handle on each side) converted for op, plugin.Iput
// or plugin.Iget, and the request written back.
func oneSided(op func(h uint64, context int32, off0, mh0, size, off1, mh1 uint64, rank, optFlags uint32) (uint64, abi.Result),
	call string, rmaCtx C.uintptr_t, context C.int, off0 C.uint64_t, mh0 C.uintptr_t, size C.size_t,
	off1 C.uint64_t, mh1 C.uintptr_t, rank, optFlags C.uint32_t, request *C.uintptr_t) C.int {
	if r, ok := clearOut(request, call, "request"); !ok {
		return r
	}
	id, r := op(uint64(rmaCtx), int32(context), uint64(off0), uint64(mh0), uint64(size),
		uint64(off1), uint64(mh1), uint32(rank), uint32(optFlags))
	return putID(request, id, r, call, "request")
}

//export rmawasm_iflush
func rmawasm_iflush(rmaCtx C.uintptr_t, context C.int, mhandle C.uintptr_t, rank C.uint32_t, request *C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "iflush", rmaCtx)
	if r, ok := clearOut(request, "iflush", "request"); !ok {
		return r
	}
	// A zero id is allowed here: *request = NULL means "already complete".
	id, r := plugin.Iflush(uint64(rmaCtx), int32(context), uint64(mhandle), uint32(rank))
	if r != abi.Success {
		return rc(r)
	}
	*request = C.uintptr_t(id)
	return rc(abi.Success)
}

//export rmawasm_test
func rmawasm_test(coll, request C.uintptr_t, done *C.int) (ret C.int) {
	defer recoverOn(&ret, "test", coll)
	if r, ok := clearOut(done, "test", "done"); !ok {
		return r
	}
	d, r := plugin.Test(uint64(coll), uint64(request))
	if r != abi.Success {
		return rc(r)
	}
	if d {
		*done = 1
	}
	return rc(abi.Success)
}

//export rmawasm_rmaProgress
func rmawasm_rmaProgress(rmaCtx C.uintptr_t) (ret C.int) {
	defer recoverOn(&ret, "rmaProgress", rmaCtx)
	return rc(plugin.Progress(uint64(rmaCtx)))
}

//export rmawasm_queryLastError
func rmawasm_queryLastError(rmaCtx C.uintptr_t, hasError *C.bool) (ret C.int) {
	defer recoverTo(&ret, "queryLastError")
	if r, ok := clearOut(hasError, "queryLastError", "hasError"); !ok {
		return r
	}
	e, r := plugin.QueryLastError(uint64(rmaCtx))
	if r != abi.Success {
		return rc(r)
	}
	*hasError = C.bool(e)
	return rc(abi.Success)
}

//export rmawasm_finalize
func rmawasm_finalize(ctx C.uintptr_t) (ret C.int) {
	defer recoverTo(&ret, "finalize")
	return rc(plugin.Finalize(uint64(ctx)))
}
