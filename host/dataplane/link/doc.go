// Package link is the contract between the mesh core (host/dataplane) and
// its transports (TCP, the intra-node path, libfabric): the operation a
// peer hands a transport (Op), what the communicator above answers for
// the target side (Owner and its optional extensions, Pin, PeerReg), a
// device registration's description (DeviceMemory) and what a transport
// reports of itself (Props). It holds data types and interfaces only, so
// that every transport package and the core can import it without a cycle.
package link
