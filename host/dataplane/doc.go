// Package dataplane is the native mechanism that moves bytes between the
// ranks of a communicator: authenticated connections, the wire protocol,
// the target-side service that lands puts, applies signals and serves gets
// with no call from the target process, and the completion of initiator
// requests. TCP is every peer's control plane and fallback; libfabric and
// the intra-node path take over the payload where they can (transport.go).
//
// Files by concern, the way NCCL's net_ib splits its transport:
//
// Init and listen:
//   - listen.go: Listen and ListenOptions, the accept loop and admission of
//     dialers (host/handshake/admission caps the strangers, host/handshake
//     authenticates them), the listen address and host id.
//   - poller.go: the process's network poller check (EnsurePoller).
//
// Connect:
//   - mesh.go: Options, Connect, the transport choice, Stats, Post and
//     flushing, Drain and Close.
//   - tcp_connect.go: dialing and accepting every peer's lane 0.
//   - lazy.go: a further lane, opened when first used (the lane's half is
//     tcp's lazy.go); the peer's mesh takes it from its listener.
//   - peers.go: a peer list (Options.Peers): ranks not connected.
//   - fabric.go: the listener's endpoint handed to the mesh as its rails
//     (ofi.Rails), which pairs use libfabric, and the registrations made
//     on every rail.
//
// Data path:
//   - transport.go: the transport seam (link.Transport, host/dataplane/link).
//   - peer.go: lanes, sequence numbers and striping; completions, failures.
//   - order.go: a put landed, its signal resolved and ordered
//     (host/seqorder keeps signals strong).
//   - peer_link.go: the peer as its transport sees it (link.Peer).
//   - aliases.go: the contract's names (Op, Owner, Pin, ...) kept here.
//   - testhooks.go: test-only accessors of a mesh, its peers and its
//     listener for the integration tests, which are external test
//     packages here and in the transports' directories, their fixtures in
//     host/dataplane/meshtest (test support, never imported by non-test
//     code).
//   - ipc.go: the mesh's side of the descriptor exchange
//     (host/dataplane/intranode/share): the intra-node links' pids and
//     interprocess events.
//   - The transports are packages of their own: host/dataplane/tcp (the
//     TCP link, its lanes, service, acks and failover),
//     host/dataplane/intranode (process_vm_writev/readv, the staging
//     ring, shared-memory streams, interprocess events) and
//     host/dataplane/ofi (libfabric: rails, writes, reads and signals,
//     the endpoints' completions, registrations, device staging).
//
// Teardown and watchdog:
//   - watchdog.go: peers whose streams stopped moving are failed.
//
// Leaves it builds on: host/wire (the 64-byte header protocol and the
// listen handle), host/handshake (the hello and the seal) and
// host/handshake/admission (the caps on unauthenticated connections), host/codec
// (compression), host/devmem/staging (device staging and the staging
// ring), host/fabric and host/fabric/nics (libfabric and its NICs),
// host/fabric/endpoint (a libfabric endpoint's slots, receive buffers and
// progress goroutine, its registrations; the control messages, CQ data
// and rails frame), host/seqorder (the target's orderer and the
// initiator's window of sequence numbers), host/spin (readers that spin
// before they park), host/procid (the host id, a local process's exit),
// host/ring (the growable FIFO the lanes queue their work in).
package dataplane
