package plugin

import (
	"fmt"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"go.uber.org/multierr"
)

// TestConnectResult: a connect that failed because a peer speaks another
// wire protocol (ranks of two builds) is the job's set-up at fault,
// ncclInvalidUsage, however deep in connect's combined errors it sits;
// anything else is ncclSystemError.
func TestConnectResult(t *testing.T) {
	ve := &handshake.VersionError{Peer: 3, Ours: handshake.Protocol}
	wrapped := multierr.Append(fmt.Errorf("connect to rank 1 lane 0 at 127.0.0.1:1: %w", ve), fmt.Errorf("timed out"))
	for _, c := range []struct {
		err  error
		want abi.Result
	}{{ve, abi.InvalidUsage}, {wrapped, abi.InvalidUsage}, {fmt.Errorf("connection refused"), abi.SystemError}} {
		if got := connectResult(c.err); got != c.want {
			t.Errorf("connectResult(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
