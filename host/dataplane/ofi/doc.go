// Package ofi is the libfabric transport. A communicator's Rails are its
// endpoints, one per NIC (rail 0 is the listener's); the mesh holds them
// for registrations, the caller's polls, statistics and the close. A Link
// to one peer embeds that peer's tcp.Link, which stays its control plane
// and fallback, and moves the payload as RMA writes and reads on the
// rails, a signal as CQ data or a message behind its payload, with the
// target side on the endpoints' completions (ep.go, ack.go). Device
// memory the provider cannot reach is staged over the TCP lanes (dev.go).
// host/fabric and host/fabric/endpoint keep discovery and the endpoint
// mechanics; this package gives their completions a meaning.
package ofi
