package endpoint

import (
	"bytes"
	"testing"
)

// TestMsgLayout: a control message and a put with signal's inline part
// land at the documented offsets and read back as written.
func TestMsgLayout(t *testing.T) {
	b := make([]byte, MsgMax)
	m := Msg{Type: MsgPutSignal, Op: 3, Rank: 0x0102, SigMrID: 0x03040506, Word: 0x0708_090a0b0c0d0e, SigOff: 0x1112131415161718, SigValue: 0x2122232425262728,
		MrID: 0x31323334, Size: InlineMax, Off: 0x4142434445464748, Owed: 0x5152535455565758}
	m.Put(b)
	want := []byte{5, 3, 0x02, 0x01, 0x06, 0x05, 0x04, 0x03,
		0x0e, 0x0d, 0x0c, 0x0b, 0x0a, 0x09, 0x08, 0x07,
		0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
		0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,
		0x34, 0x33, 0x32, 0x31, InlineMax, 0, 0, 0,
		0x48, 0x47, 0x46, 0x45, 0x44, 0x43, 0x42, 0x41,
		0x58, 0x57, 0x56, 0x55, 0x54, 0x53, 0x52, 0x51}
	if !bytes.Equal(b[:PutSigHdr], want) {
		t.Fatalf("encoded\n% x\nwant\n% x", b[:PutSigHdr], want)
	}
	if got := ParseMsg(b[:PutSigHdr]); got != m {
		t.Fatalf("ParseMsg = %+v, want %+v", got, m)
	}
	// Cut short, the inline part is not read (the receiver refuses such a
	// message); other types never have one.
	short := m
	short.MrID, short.Size, short.Off, short.Owed = 0, 0, 0, 0
	if got := ParseMsg(b[:MsgSize]); got != short {
		t.Fatalf("ParseMsg of the first %d bytes = %+v, want %+v", MsgSize, got, short)
	}
	v := Msg{Type: MsgVerdict, Op: 7, Rank: 9, Word: 1<<48 | 5, MrID: 1, Size: 2, Off: 3, Owed: 4}
	clear(b)
	v.Put(b)
	if !bytes.Equal(b[MsgSize:], make([]byte, MsgMax-MsgSize)) {
		t.Fatalf("a verdict wrote past its %d bytes: % x", MsgSize, b[MsgSize:PutSigHdr])
	}
	short = v
	short.MrID, short.Size, short.Off, short.Owed = 0, 0, 0, 0
	if got := ParseMsg(b); got != short {
		t.Fatalf("ParseMsg of a verdict = %+v, want %+v", got, short)
	}
	if PutSigHdr != 56 || MsgMax != 136 {
		t.Fatalf("PutSigHdr %d, MsgMax %d", PutSigHdr, MsgMax)
	}
}

// TestLayout: the CQ data's split between rank and number for 8-byte
// and 4-byte CQ data.
func TestLayout(t *testing.T) {
	for _, c := range []struct {
		cqData uint64
		n      int
		ok     bool
		want   CQLayout
	}{
		{8, 1, true, CQLayout{48, true}},
		{8, 1 << 16, true, CQLayout{48, true}},
		{8, 1<<16 + 1, false, CQLayout{}},
		{4, 1, true, CQLayout{32, false}},
		{4, 2, true, CQLayout{31, false}},
		{4, 1000, true, CQLayout{22, false}},
		{4, 1 << 16, true, CQLayout{16, false}},
		{4, 1<<16 + 1, false, CQLayout{}},
	} {
		got, ok := Layout(c.cqData, c.n)
		if ok != c.ok || got != c.want {
			t.Errorf("Layout(%d, %d) = %+v %v, want %+v %v", c.cqData, c.n, got, ok, c.want, c.ok)
		}
	}
}

// TestCQData: plain writes and writes carrying a signal round-trip
// through their CQ data, and a plain write never reads as a signal.
func TestCQData(t *testing.T) {
	full, _ := Layout(8, 100)
	narrow, _ := Layout(4, 100)
	for _, c := range []struct {
		l    CQLayout
		rank int
		seq  uint64
		want CQData
	}{
		{full, 99, 1<<48 - 1, CQData{Rank: 99, Seq: 1<<47 - 1, Bits: 47}},
		{full, 0, 5, CQData{Rank: 0, Seq: 5, Bits: 47}},
		{narrow, 99, 1<<40 + 3, CQData{Rank: 99, Seq: 3, Bits: 25}},
		{narrow, 3, 1<<25 - 1, CQData{Rank: 3, Seq: 1<<25 - 1, Bits: 25}},
	} {
		d := c.l.Data(c.rank, c.seq)
		if got := c.l.Parse(d); got != c.want {
			t.Errorf("%+v: Parse(Data(%d, %#x)) = %+v, want %+v", c.l, c.rank, c.seq, got, c.want)
		}
	}
	for _, c := range []struct {
		id  uint32
		off uint64
		ok  bool
	}{
		{0, 0, true}, {1<<SigIDBits - 1, (1<<SigWordBits - 1) * 8, true},
		{1 << SigIDBits, 0, false}, {0, 1 << SigWordBits * 8, false}, {0, 4, false},
	} {
		if SigFits(c.id, c.off) != c.ok {
			t.Errorf("SigFits(%d, %d) = %v", c.id, c.off, !c.ok)
		}
		if !c.ok {
			continue
		}
		for _, ack := range []uint64{0, 1, SigAckMax} {
			d := full.SigData(77, 1<<20+9, c.id, c.off, ack)
			want := CQData{Rank: 77, Seq: 9, Bits: SigSeqBits, Sig: true, SigID: c.id, SigOff: c.off, Ack: ack}
			if got := full.Parse(d); got != want {
				t.Errorf("Parse(SigData(%d, %d, ack %d)) = %+v, want %+v", c.id, c.off, ack, got, want)
			}
			if d>>48 != 77 || d&SigFlag == 0 {
				t.Errorf("SigData %#x: rank or flag misplaced", d)
			}
		}
	}
}
