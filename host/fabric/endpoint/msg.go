package endpoint

import (
	"encoding/binary"
	"math/bits"
)

// The data plane's wire format over an endpoint: its control messages
// and the remote CQ data of its writes.

const (
	MsgSize = 32 // one control message
	// A signal travels as a MsgPutSignal message: the control message,
	// 24 bytes (the target range of an inline payload, and an owed
	// verdict), then at most InlineMax bytes of payload. Slots and
	// receive buffers hold the largest message.
	PutSigHdr = MsgSize + 24
	InlineMax = 80
	MsgMax    = PutSigHdr + InlineMax
	// The CQ data of a write carries the sender's rank in its high bits
	// (the target learns who wrote without FI_SOURCE) and the low bits of
	// the sequence number below: with 8 bytes of CQ data 16 and 48 bits;
	// with 4 (verbs, efa) as few rank bits as the communicator needs and
	// at least MinSeqBits for the number (see seqorder.Orderer.Unwrap).
	MinSeqBits = 16
	// A small put with signal whose signal fits travels as one write whose
	// 8-byte CQ data carries it (CQLayout.SigData): the rank's 16 bits,
	// then SigFlag, then an arrival acknowledgement (SigAckBits: how many
	// more of the receiver's sequence numbers landed here, in order, at
	// most SigAckMax), the word's index (offset / 8) below 2^SigWordBits,
	// a signal registration id below 2^SigIDBits and the low SigSeqBits
	// of the sequence number; the add is 1. A plain write keeps SigFlag
	// clear (47 bits of number).
	SigSeqBits  = 16
	SigIDBits   = 12
	SigWordBits = 16
	SigAckBits  = 3
	SigAckMax   = 1<<SigAckBits - 1
	SigFlag     = 1 << 47
	// NoSlot in a verdict's slot field: a rejection of a signal that came
	// in CQ data, which no slot awaits.
	NoSlot  = 1<<16 - 1
	SeqMask = 1<<48 - 1 // a word's sequence number
)

// Control messages (MsgSize bytes, little endian):
//
//	0 type u8 | 1 sigOp u8 | 2 rank u16 | 4 sigMrID u32 | 8 seq u48, slot u16
//	16 sigOff u64 | 24 sigValue u64
//
// A MsgPutSignal message continues with
//
//	32 mrID u32 | 36 size u32 (0..InlineMax) | 40 offset u64
//	48 owed verdict u64 | 56 payload
//
// size 0: the payload was written apart (or there is none). The owed
// verdict (0: none) answers a signal the receiver sent us on this rail,
// as a verdict message would (seq and slot; status 0).
//
// slot (a signal's: the sender's operation slot) comes back in the signal's
// verdict, which reuses the layout: 1 holds the status (0: applied or
// queued in order; else the ncclResult_t of the rejection) and 8 the same
// seq and slot. Sequence numbers are 48 bits, as in 8-byte CQ data.
const (
	MsgSignal  = 1 // apply a signal once every earlier sequence number landed
	MsgBye     = 2 // the sender's last message on one of its lanes
	MsgByeAck  = 3 // everything before that goodbye was applied
	MsgVerdict = 4 // the target checked a signal's word: the request may complete
	// a signal, with its put's payload inline when small: copied in,
	// then applied as a signal (one sequence number for both)
	MsgPutSignal = 5
	// MsgAck acknowledges arrival: Word (1..SeqMask) more of the
	// receiver's sequence numbers landed at the sender, in order (what a
	// write's CQ data could not carry, SigAckBits).
	MsgAck = 6
)

// Msg is a control message: its first MsgSize bytes, and a
// MsgPutSignal's next 24.
type Msg struct {
	Type uint8
	Op   uint8 // the signal's op; a verdict's status
	Rank uint16
	// SigMrID, SigOff and SigValue: the signal's registration, word and
	// operand (0 in messages that are not signals).
	SigMrID          uint32
	Word             uint64 // seq (SeqMask) and slot (the high 16 bits)
	SigOff, SigValue uint64
	// A MsgPutSignal's inline payload: registration, size (0..InlineMax:
	// the bytes that follow) and offset; and an owed verdict's word (0:
	// none).
	MrID, Size uint32
	Off, Owed  uint64
}

// Put writes m to b: MsgSize bytes, PutSigHdr for a MsgPutSignal.
func (m *Msg) Put(b []byte) {
	le := binary.LittleEndian
	b[0], b[1] = m.Type, m.Op
	le.PutUint16(b[2:], m.Rank)
	le.PutUint32(b[4:], m.SigMrID)
	le.PutUint64(b[8:], m.Word)
	le.PutUint64(b[16:], m.SigOff)
	le.PutUint64(b[24:], m.SigValue)
	if m.Type == MsgPutSignal {
		le.PutUint32(b[32:], m.MrID)
		le.PutUint32(b[36:], m.Size)
		le.PutUint64(b[40:], m.Off)
		le.PutUint64(b[48:], m.Owed)
	}
}

// ParseMsg reads the message b (at least MsgSize bytes); a MsgPutSignal's
// inline part where b holds it.
func ParseMsg(b []byte) Msg {
	le := binary.LittleEndian
	_ = b[MsgSize-1]
	m := Msg{Type: b[0], Op: b[1], Rank: le.Uint16(b[2:]), SigMrID: le.Uint32(b[4:]), Word: le.Uint64(b[8:]), SigOff: le.Uint64(b[16:]), SigValue: le.Uint64(b[24:])}
	if m.Type == MsgPutSignal && len(b) >= PutSigHdr {
		m.MrID, m.Size, m.Off, m.Owed = le.Uint32(b[32:]), le.Uint32(b[36:]), le.Uint64(b[40:]), le.Uint64(b[48:])
	}
	return m
}

// CQLayout is how a write's CQ data splits between the sender's rank and
// its sequence number.
type CQLayout struct {
	SeqBits uint // low bits holding the sequence number
	// SigCQ: 8-byte CQ data at full width, so a small put with signal may
	// carry its signal there (SigFlag); plain writes then use one bit
	// less of number.
	SigCQ bool
}

// Layout is the split for n ranks with cqData bytes of CQ data; false
// when n ranks do not fit. Every rank computes the same.
func Layout(cqData uint64, n int) (CQLayout, bool) {
	total, rankBits := uint(64), uint(16)
	if cqData < 8 {
		total, rankBits = 32, uint(bits.Len(uint(n-1)))
	}
	if uint(bits.Len(uint(n-1))) > rankBits || total-rankBits < MinSeqBits {
		return CQLayout{}, false
	}
	return CQLayout{SeqBits: total - rankBits, SigCQ: total-rankBits == 48}, true
}

// Data is the CQ data of a plain write: rank and seq's low bits.
func (c CQLayout) Data(rank int, seq uint64) uint64 {
	d := uint64(rank)<<c.SeqBits | seq&(1<<c.SeqBits-1)
	if c.SigCQ {
		d &^= SigFlag // 47 bits of number
	}
	return d
}

// SigFits reports whether signal word off of registration id is one the
// CQ data can carry (SigData).
func SigFits(id uint32, off uint64) bool {
	return id < 1<<SigIDBits && off%8 == 0 && off/8 < 1<<SigWordBits
}

// SigData is the CQ data of a write that carries a signal adding 1 to
// word off of registration id (SigFits; the layout's SigCQ) and an
// acknowledgement of ack (at most SigAckMax) of the receiver's numbers.
func (c CQLayout) SigData(rank int, seq uint64, id uint32, off, ack uint64) uint64 {
	return uint64(rank)<<c.SeqBits | SigFlag | (ack&SigAckMax)<<sigAckShift | off/8<<(SigSeqBits+SigIDBits) | uint64(id)<<SigSeqBits | seq&(1<<SigSeqBits-1)
}

const sigAckShift = SigSeqBits + SigIDBits + SigWordBits

// CQData is a write's CQ data read back.
type CQData struct {
	Rank int
	Seq  uint64 // the sequence number's low Bits bits
	Bits uint
	// Sig: the write carries a signal adding 1 to word SigOff of
	// registration SigID.
	Sig    bool
	SigID  uint32
	SigOff uint64
	// Ack (with Sig): how many more of the receiver's numbers landed at
	// the sender (SigData's ack).
	Ack uint64
}

// Parse reads the CQ data d of a write.
func (c CQLayout) Parse(d uint64) CQData {
	r := CQData{Rank: int(d >> c.SeqBits), Seq: d & (1<<c.SeqBits - 1), Bits: c.SeqBits}
	switch {
	case !c.SigCQ:
	case r.Seq&SigFlag == 0:
		r.Bits--
	default:
		w := r.Seq
		r.Seq, r.Bits, r.Sig = w&(1<<SigSeqBits-1), SigSeqBits, true
		r.SigID = uint32(w>>SigSeqBits) & (1<<SigIDBits - 1)
		r.SigOff = (w >> (SigSeqBits + SigIDBits) & (1<<SigWordBits - 1)) * 8
		r.Ack = w >> sigAckShift & SigAckMax
	}
	return r
}
