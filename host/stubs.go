package host

import "github.com/rccl-rma-wasm/rccl-rma-wasm/abi"

// TEMPORARY stubs; replaced by the real runtime.

func Init(commID uint64) (uint64, abi.Result)                  { return 0, abi.InternalError }
func Devices() (int32, abi.Result)                             { return 0, abi.InternalError }
func GetProperties(dev int32, p *abi.NetProperties) abi.Result { return abi.InternalError }
func GetRmaProperties(coll uint64) (bool, abi.Result)          { return false, abi.InternalError }
func Listen(ctx uint64, dev int32, handle *[abi.HandleSize]byte) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func Connect(handles []*[abi.HandleSize]byte, rank int32, listen uint64) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func CreateContext(coll uint64, cfg abi.RmaConfig) (uint64, abi.Result) { return 0, abi.InternalError }
func RegMr(coll uint64, data uintptr, size uint64, typ int32, flags uint64) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func RegMrDmaBuf(coll uint64, data uintptr, size uint64, typ int32, offset uint64, fd int32, flags uint64) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func DeregMr(coll, mh uint64) abi.Result      { return abi.InternalError }
func DestroyContext(rmaCtx uint64) abi.Result { return abi.InternalError }
func CloseColl(coll uint64) abi.Result        { return abi.InternalError }
func CloseListen(listen uint64) abi.Result    { return abi.InternalError }
func Iput(rmaCtx uint64, context int32, srcOff, srcMh, size, dstOff, dstMh uint64, rank, optFlags uint32) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func IputSignal(rmaCtx uint64, context int32, srcOff, srcMh, size, dstOff, dstMh uint64, rank uint32,
	signalOff, signalMh, signalValue uint64, signalOp uint32, strong bool, optFlags uint32) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func Iget(rmaCtx uint64, context int32, remoteOff, remoteMh, size, localOff, localMh uint64, rank, optFlags uint32) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func Iflush(rmaCtx uint64, context int32, mh uint64, rank uint32) (uint64, abi.Result) {
	return 0, abi.InternalError
}
func Test(coll, req uint64) (bool, abi.Result)        { return false, abi.InternalError }
func Progress(rmaCtx uint64) abi.Result               { return abi.InternalError }
func QueryLastError(rmaCtx uint64) (bool, abi.Result) { return false, abi.InternalError }
func Finalize(ctx uint64) abi.Result                  { return abi.InternalError }
