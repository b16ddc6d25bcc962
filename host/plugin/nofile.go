package plugin

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Descriptors. A rank holds two TCP streams per peer and lane in use (the
// one it dials and the one it accepts; connect opens lane 0, the others
// open when first used) plus its listeners, so 4,096 ranks need over 8,192 descriptors
// where many systems' soft RLIMIT_NOFILE is 1,024. NCCL raises the soft
// limit to the hard one at init; so does init here. Go's syscall package
// does it too when the library loads (Cur = Max-1, in a c-shared library
// as in a program), but the host may lower it again afterwards.

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard limit.
func raiseNoFile() {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur >= lim.Max {
		return
	}
	old := lim.Cur
	lim.Cur = lim.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		logx.Info(abi.SubsysInit, "NET/wasm: cannot raise RLIMIT_NOFILE from %d to %d: %v", old, lim.Max, err)
	}
}

// fdNeed is the most a communicator adds, once every lane of every rank
// opened: two streams per rank and lane (the rank itself included), each
// one descriptor, or three when sealed (the stream and the loopback pair
// its sealer relays through).
func fdNeed(nranks, lanes int, encrypt bool) uint64 {
	per := uint64(2)
	if encrypt {
		per = 6
	}
	return per * uint64(nranks) * uint64(lanes)
}

// checkNoFile raises the soft limit again and warns when the descriptors
// open now plus what nranks ranks over lanes lanes need exceed even the
// hard limit: the connect, or a lane opened later, may then fail with
// ncclSystemError (a failed lane moves its work to another).
func checkNoFile(nranks, lanes int, encrypt bool) {
	raiseNoFile()
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return
	}
	open := 0
	if es, err := os.ReadDir("/proc/self/fd"); err == nil {
		open = len(es)
	}
	if need := fdNeed(nranks, lanes, encrypt) + uint64(open); need > lim.Cur {
		logx.Warn(abi.SubsysInit|abi.SubsysNet, "NET/wasm: %d ranks x %d lanes x %d descriptors + %d open = %d descriptors needed once every lane is used, RLIMIT_NOFILE allows %d (hard limit %d); raise the hard limit (ulimit -Hn) or connect may fail with ncclSystemError",
			nranks, lanes, fdNeed(1, 1, encrypt), open, need, lim.Cur, lim.Max)
	}
}
