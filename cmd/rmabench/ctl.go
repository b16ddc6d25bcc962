package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// The bootstrap between the two rank processes: a socketpair the launcher
// hands to both children as fd 3. Every message has the same fixed size, so
// reading and writing one allocates nothing.

const handleSize = 128

type msg struct {
	Op         uint32
	A, B, C, D uint64
	H          [handleSize]byte
}

const msgSize = 4 + 4*8 + handleSize

// Control operations, rank 0 -> rank 1 (rank 1 answers with opOK or opErr).
const (
	opOK uint32 = iota + 1
	opErr
	opComm      // A = comm config index: collective setup
	opCommClose // A = comm config index: collective teardown
	opRawTCP    // set up the raw TCP baseline stream; answer B = port
	opPVW       // answer A = pid, B = raw buffer address, C = flag word address
	opBW        // A = series, B = size, C = count, D = expected signal/flag value
	opPing      // A = series, B = iterations, C = signal base
	opVerify    // A = comm index, B = size, C = expected signal, D = pattern byte
	opQuit
	opFabric // A = key, B = base of rank 0's destination, C = name length, H = its endpoint name; answer: rank 1's
)

type ctl struct {
	c   net.Conn
	buf [msgSize]byte
}

func (k *ctl) send(m *msg) error {
	b := k.buf[:]
	binary.LittleEndian.PutUint32(b[0:], m.Op)
	binary.LittleEndian.PutUint64(b[4:], m.A)
	binary.LittleEndian.PutUint64(b[12:], m.B)
	binary.LittleEndian.PutUint64(b[20:], m.C)
	binary.LittleEndian.PutUint64(b[28:], m.D)
	copy(b[36:], m.H[:])
	_, err := k.c.Write(b)
	return err
}

func (k *ctl) recv(m *msg) error {
	var b [msgSize]byte
	if _, err := io.ReadFull(k.c, b[:]); err != nil {
		return err
	}
	m.Op = binary.LittleEndian.Uint32(b[0:])
	m.A = binary.LittleEndian.Uint64(b[4:])
	m.B = binary.LittleEndian.Uint64(b[12:])
	m.C = binary.LittleEndian.Uint64(b[20:])
	m.D = binary.LittleEndian.Uint64(b[28:])
	copy(m.H[:], b[36:])
	return nil
}

// call sends m and waits for the answer (opOK), which it returns in m.
func (k *ctl) call(m *msg) error {
	op := m.Op
	if err := k.send(m); err != nil {
		return fmt.Errorf("bootstrap send (op %d): %w", op, err)
	}
	if err := k.recv(m); err != nil {
		return fmt.Errorf("bootstrap receive (op %d): %w", op, err)
	}
	if m.Op != opOK {
		return fmt.Errorf("rank 1 failed op %d (code %d)", op, m.A)
	}
	return nil
}

func (k *ctl) ok(a, b, c uint64) error { return k.send(&msg{Op: opOK, A: a, B: b, C: c}) }
