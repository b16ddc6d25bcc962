// Package wire is the TCP lanes' protocol and the listen handle: the
// 64-byte message header (Header, encoded into and decoded from a caller's
// buffer, so the per-op path allocates nothing), the message types and
// status bits, and the 128-byte handle NCCL all-gathers between ranks
// (HandleInfo.Encode, DecodeHandle). It knows nothing of connections;
// host/dataplane speaks it.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
)

// Message types on a connection. Requests flow from the initiator's outgoing
// connection to the target's service; replies come back on the same socket.
// MsgPut, MsgPutSignal, MsgGet and MsgReg are what dataplane's Op.Msg
// carries; the others only the lanes send. They are wire numbers, not
// backend.OpKind (there 4 is a flush, which never reaches the wire).
const (
	MsgPut       = 1 // header + size payload bytes
	MsgPutSignal = 2 // as MsgPut, then the 64-bit signal update
	MsgGet       = 3 // header only; the target answers MsgGetResp
	MsgReg       = 4 // a registration's id and size, for initiator-side bounds checks
	MsgBye       = 5 // orderly close: the last message on this lane
	// MsgRing offers the target a staging ring for device payloads
	// (dataplane's ring.go): Off the sender's memfd, Size its bytes,
	// Context the slots, SigValue the chunk. The target maps it or answers
	// MsgRingNo (0x85).
	MsgRing = 6
	// MsgAck is a MsgPutAck riding a request stream (SPEC.md §4,
	// "Acknowledgements"): the first seq puts the receiver's outgoing lane
	// mrID carried have landed. Only one-lane links send it; all ranks run
	// this library, so no peer that does not know it sees it.
	MsgAck = 7
	// MsgStream offers the target a shared-memory stream for the rest of
	// this request stream (dataplane's stream.go): Off the sender's memfd,
	// Size the ring's data bytes. The target maps it and reads every later
	// byte from it, or answers MsgStreamNo (0x86).
	MsgStream  = 8
	MsgNack    = 0x81 // a rejected request: its tag, the result in status
	MsgGetResp = 0x82 // a get's reply: header, then size bytes
	MsgByeAck  = 0x83 // the target applied everything the lane carried before its goodbye
	// MsgPutAck: cumulative, in stream order: the first seq put messages
	// (MsgPut and MsgPutSignal headers, rejected ones included) this stream
	// carried have landed in the target's memory. The target sends at most
	// one per read from the socket, so acks cost little per small put.
	MsgPutAck   = 0x84
	MsgRingNo   = 0x85 // the target refused a MsgRing
	MsgStreamNo = 0x86 // the target refused a MsgStream
)

// Status bits of a request. StatusResent marks an operation sent again
// after the lane that carried it failed (dataplane's tcp_failover.go);
// the bits of StatusFromMask name that lane. StatusRing marks a put whose
// payload is in the intra-node staging ring, not on the stream. The low
// byte keeps its meaning (a put's codec).
const (
	StatusRing     = 0x8000
	StatusResent   = 0x4000
	StatusFromMask = 0x0700
)

// StatusAckNow on a MsgAck (its seq may then be 0: nothing acknowledged)
// asks the receiver to acknowledge the puts of this stream at once: the
// sender waits for them (an iflush). Without it a target that expects to
// write soon holds its acks for its next batch, which in a GIN round
// comes only after the sender's wait ended.
const StatusAckNow = 1

// StatusEvent on a put+signal without payload (its bytes were copied into
// the target's memory through a mapping) says that the target must order
// the signal after the sender's interprocess event whose index is the
// low byte of the status (dataplane's ipc_events.go).
const StatusEvent = 0x2000

// StatusMark on a put+signal without payload (its bytes were copied into
// the target's memory through a mapping, by the sender's device agent)
// says that the target must apply the signal only once word (the low byte
// of the status) of the sender's mark page, mapped at the target, reached
// the header's off, which carries that number in place of an offset
// (staging's marks.go).
const StatusMark = 0x1000

// StatusInbox on a put+signal without payload (its bytes, if any, were
// copied into the target's memory through a mapping, by the sender's
// device agent, which then wrote an entry into the target's peer inbox,
// its signal op carrying SigApplied) says that the entry is row (the low
// byte of the status) position off - 1 of the target's inbox: the target's
// agent adds the signal; its host numbers and acknowledges the operation
// once the agent took the entry (host/devmem/inbox).
const StatusInbox = 0x0800

// SigApplied, or'ed into a put+signal's signal op, says that the sender's
// device agent already added the signal into the target's word through a
// mapping (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL): the target numbers and
// acknowledges the operation and applies nothing.
const SigApplied = 0x80

// HeaderSize is the fixed size of every message header.
const HeaderSize = 64

// Header is a message header; its layout (little endian):
//
//	0 type u8 | 1 sigOp u8 | 2 status u16 | 4 mrID u32 | 8 tag u64 | 16 off u64
//	24 size u64 | 32 sigMrID u32 | 36 context u32 | 40 sigOff u64 | 48 sigValue u64
//	56 seq u64 (requests: 0 ordered by the stream, else the peer's sequence
//	   number; MsgPutAck: how many puts of this stream landed)
type Header struct {
	Typ      uint8
	SigOp    uint8
	Status   uint16
	MrID     uint32
	Tag      uint64
	Off      uint64
	Size     uint64
	SigMrID  uint32
	Context  uint32
	SigOff   uint64
	SigValue uint64
	Seq      uint64
}

// Encode writes h into b[:HeaderSize].
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = h.Typ
	b[1] = h.SigOp
	binary.LittleEndian.PutUint16(b[2:], h.Status)
	binary.LittleEndian.PutUint32(b[4:], h.MrID)
	binary.LittleEndian.PutUint64(b[8:], h.Tag)
	binary.LittleEndian.PutUint64(b[16:], h.Off)
	binary.LittleEndian.PutUint64(b[24:], h.Size)
	binary.LittleEndian.PutUint32(b[32:], h.SigMrID)
	binary.LittleEndian.PutUint32(b[36:], h.Context)
	binary.LittleEndian.PutUint64(b[40:], h.SigOff)
	binary.LittleEndian.PutUint64(b[48:], h.SigValue)
	binary.LittleEndian.PutUint64(b[56:], h.Seq)
}

// Decode reads h from b[:HeaderSize].
func (h *Header) Decode(b []byte) {
	_ = b[HeaderSize-1]
	h.Typ = b[0]
	h.SigOp = b[1]
	h.Status = binary.LittleEndian.Uint16(b[2:])
	h.MrID = binary.LittleEndian.Uint32(b[4:])
	h.Tag = binary.LittleEndian.Uint64(b[8:])
	h.Off = binary.LittleEndian.Uint64(b[16:])
	h.Size = binary.LittleEndian.Uint64(b[24:])
	h.SigMrID = binary.LittleEndian.Uint32(b[32:])
	h.Context = binary.LittleEndian.Uint32(b[36:])
	h.SigOff = binary.LittleEndian.Uint64(b[40:])
	h.SigValue = binary.LittleEndian.Uint64(b[48:])
	h.Seq = binary.LittleEndian.Uint64(b[56:])
}

// Handle is the 128-byte listen handle NCCL all-gathers between ranks
// (version 2):
//
//	0 magic "RMAW" | 4 version u8 | 5 ip length u8 | 6 port u16 | 8 ip [16]
//	24 ed25519 public key [32] | 56 host id [8] | 64 pid u32 | 68 uid u32
//	72 fabric provider hash u32 (0: none) | 76 name length u8 | 77 name [51]
//
// The public key is the listener's identity: a dialer claiming this rank
// proves it holds the private half (host/handshake), which never leaves the
// process, so reading every handle does not let anyone claim a rank.
// Version 1 carried a 16-byte token in clear instead and a 16-byte host
// id. 51 bytes of endpoint name fit every provider address seen: tcp,
// sockets, udp (sockaddr_in 16, sockaddr_in6 28), shm ("fi_shm://pid:n:m",
// ~20), efa (32), verbs;ofi_rxm (sockaddr_ib 48).
type Handle [abi.HandleSize]byte

const (
	handleMagic   = "RMAW"
	handleVersion = 2
	// FabNameMax is the room for an endpoint name in the listen handle.
	FabNameMax = abi.HandleSize - 77
)

// KeySize is the length of a listener's public key (ed25519).
const KeySize = handshake.KeySize

// HandleInfo is the decoded content of a Handle.
type HandleInfo struct {
	Addr   *net.TCPAddr  // the listener's TCP address
	Key    [KeySize]byte // the listener's ed25519 public key
	HostID [8]byte       // host/procid's: ranks on one host share it
	Pid    uint32        // the listener's process
	UID    uint32        // and its user
	// FabricHash identifies the libfabric provider of the listener's
	// endpoint and FabricName is its address (empty: TCP only).
	FabricHash uint32
	FabricName []byte
}

// Encode writes the info into a handle.
func (hi *HandleInfo) Encode(h *Handle) {
	*h = Handle{}
	copy(h[0:4], handleMagic)
	h[4] = handleVersion
	ip := hi.Addr.IP.To4()
	if ip == nil {
		ip = hi.Addr.IP.To16()
	}
	h[5] = byte(len(ip))
	binary.LittleEndian.PutUint16(h[6:], uint16(hi.Addr.Port))
	copy(h[8:24], ip)
	copy(h[24:56], hi.Key[:])
	copy(h[56:64], hi.HostID[:])
	binary.LittleEndian.PutUint32(h[64:], hi.Pid)
	binary.LittleEndian.PutUint32(h[68:], hi.UID)
	if len(hi.FabricName) > 0 && len(hi.FabricName) <= FabNameMax {
		binary.LittleEndian.PutUint32(h[72:], hi.FabricHash)
		h[76] = byte(len(hi.FabricName))
		copy(h[77:], hi.FabricName)
	}
}

// ErrBadHandle reports a handle this library did not write.
var ErrBadHandle = errors.New("not an rccl-rma-wasm listen handle")

// DecodeHandle parses a handle written by Encode.
func DecodeHandle(h *Handle) (HandleInfo, error) {
	var hi HandleInfo
	if string(h[0:4]) != handleMagic {
		return hi, ErrBadHandle
	}
	if h[4] != handleVersion {
		return hi, fmt.Errorf("listen handle version %d, this library speaks %d", h[4], handleVersion)
	}
	n := int(h[5])
	if n != 4 && n != 16 {
		return hi, fmt.Errorf("%w: address length %d", ErrBadHandle, n)
	}
	ip := make(net.IP, n)
	copy(ip, h[8:8+n])
	hi.Addr = &net.TCPAddr{IP: ip, Port: int(binary.LittleEndian.Uint16(h[6:]))}
	copy(hi.Key[:], h[24:56])
	copy(hi.HostID[:], h[56:64])
	hi.Pid = binary.LittleEndian.Uint32(h[64:])
	hi.UID = binary.LittleEndian.Uint32(h[68:])
	if n := int(h[76]); n > 0 && n <= FabNameMax {
		hi.FabricHash = binary.LittleEndian.Uint32(h[72:])
		hi.FabricName = append([]byte(nil), h[77:77+n]...)
	}
	return hi, nil
}
