// Package tcp is the TCP transport, every peer's control plane and
// fallback: Lanes streams per peer over the 64-byte header protocol of
// host/wire, the target-side service that lands puts, applies signals and
// serves gets, the acknowledgements, lane failover, and lanes opened when
// first used. The intra-node and libfabric transports embed its Link and
// move payloads beside its streams (SidePath, link.LaneSide, Hear).
//
// Two parts are packages of their own, beneath it:
// host/dataplane/tcp/putack decides when the acknowledgements of the puts
// an incoming stream landed leave (alone, or riding a lane's batch), and
// host/dataplane/tcp/instream is an incoming stream's reading side, whose
// turns the service goroutine and polling callers take.
package tcp

import "github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"

// Name is the TCP transport's link.Props.Name.
const Name = "tcp"

// Now is link.Now, the clock the lanes and readers pace with.
func Now() int64 { return link.Now() }
