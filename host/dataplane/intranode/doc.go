// Package intranode is the intra-node transport, for a peer in another
// process of this host: it embeds the TCP link (host/dataplane/tcp) and
// moves large host payloads with process_vm_writev/readv, device payloads
// through a shared staging ring or straight into the peer's mapped device
// memory (ordered by interprocess events), and a lane's requests through
// a shared-memory stream in place of its socket. The TCP streams still
// carry everything else, in order.
package intranode

// Name is the intra-node transport's link.Props.Name while it is enabled.
const Name = "intranode"
