package dataplane

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// The hello: how a dialer proves it is the rank it claims, and the
// listener that it holds the key in the handle the dialer dialled. Every
// listener has an ed25519 key pair; the public half rides its handle, the
// private half never leaves the process. Four messages, little endian:
//
//	dialer → listener  hello (56):     0 "RMAH" | 4 version u8 (2) | 5 flags u8 | 6 zero [2]
//	                                   8 rank u32 | 12 nranks u32 | 16 lane u16 | 18 lanes u16
//	                                   20 zero [4] | 24 dialer nonce [32]
//	listener → dialer  challenge (36): 0 "RMAC" | 4 listener nonce [32]
//	dialer → listener  proof (68):     0 "RMAP" | 4 ed25519 signature [64]
//	listener → dialer  ack (68):       0 "RMAK" | 4 ed25519 signature [64]
//
// Both signatures cover the transcript (transcriptSize bytes): a 32-byte
// domain string naming the signer's role, the listener's nonce, the
// dialer's nonce, the listener's and the dialer's public keys, and the
// claim (rank u32, nranks u32, lane u16, lanes u16, flags u32). Flags:
// helloNoFabric, the dialer's connection plan declines libfabric (SPEC.md
// §8.10), signed like the rest so no one on the path can flip it. The
// listener checks
// the proof with the claimed rank's key from the handles connect received,
// so a replayed proof (signed over another nonce) and a proof made with any
// other key both fail; the dialer checks the ack with the key of the rank
// it dialled. The listener signs only for a dialer that proved itself.
const (
	helloMagic     = "RMAH"
	challengeMagic = "RMAC"
	proofMagic     = "RMAP"
	ackMagic       = "RMAK"
	helloVersion   = 2
	nonceSize      = 32
	helloSize      = 24 + nonceSize
	challengeSize  = 4 + nonceSize
	proofSize      = 4 + ed25519.SignatureSize
	ackSize        = 4 + ed25519.SignatureSize
	transcriptSize = 32 + 2*nonceSize + 2*KeySize + 16
	// helloNoFabric in the hello's flags: the dialer's plan declines
	// libfabric, so the pair uses TCP or the intra-node path.
	helloNoFabric = 1

	domainDialer   = "rccl-rma-wasm hello v2 dialer"
	domainListener = "rccl-rma-wasm hello v2 listener"
	// maxRanks bounds the nranks a hello may claim (NCCL's int).
	maxRanks = 1 << 24
)

// identity is a listener's key pair; its dialers sign with it too.
type identity struct {
	pub  [KeySize]byte
	priv ed25519.PrivateKey
}

func newIdentity() (identity, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return identity{}, fmt.Errorf("listener key: %w", err)
	}
	var id identity
	copy(id.pub[:], pub)
	id.priv = priv
	return id, nil
}

// claim is who a dialer says it is and which of its streams this is.
type claim struct {
	rank, nranks, lane, lanes int
	noFab                     bool // the dialer declines libfabric
}

func (cl claim) flags() uint32 {
	if cl.noFab {
		return helloNoFabric
	}
	return 0
}

// errSilent marks a connection that went away before saying anything: a
// port probe or a dialer that gave up. It is closed without a log line.
var errSilent = errors.New("closed before its hello")

// encodeHello writes the dialer's first message.
func encodeHello(b *[helloSize]byte, cl claim, nonce *[nonceSize]byte) {
	*b = [helloSize]byte{}
	copy(b[0:4], helloMagic)
	b[4] = helloVersion
	b[5] = byte(cl.flags())
	binary.LittleEndian.PutUint32(b[8:], uint32(cl.rank))
	binary.LittleEndian.PutUint32(b[12:], uint32(cl.nranks))
	binary.LittleEndian.PutUint16(b[16:], uint16(cl.lane))
	binary.LittleEndian.PutUint16(b[18:], uint16(cl.lanes))
	copy(b[24:], nonce[:])
}

// decodeHello parses a dialer's first message and checks the claim is one a
// rank could make: it refuses anything encodeHello would not have written.
func decodeHello(b []byte) (claim, [nonceSize]byte, error) {
	var nonce [nonceSize]byte
	if len(b) != helloSize || string(b[0:4]) != helloMagic {
		return claim{}, nonce, errors.New("not an rccl-rma-wasm hello")
	}
	if b[4] != helloVersion {
		return claim{}, nonce, fmt.Errorf("hello version %d, this library speaks %d", b[4], helloVersion)
	}
	if b[5]&^helloNoFabric|b[6]|b[7]|b[20]|b[21]|b[22]|b[23] != 0 {
		return claim{}, nonce, errors.New("hello with unknown flags or nonzero reserved bytes")
	}
	cl := claim{rank: int(binary.LittleEndian.Uint32(b[8:])), nranks: int(binary.LittleEndian.Uint32(b[12:])),
		lane: int(binary.LittleEndian.Uint16(b[16:])), lanes: int(binary.LittleEndian.Uint16(b[18:])), noFab: b[5]&helloNoFabric != 0}
	if cl.nranks < 1 || cl.nranks > maxRanks || cl.rank >= cl.nranks || cl.lanes < 1 || cl.lanes > abi.MaxLanes || cl.lane >= cl.lanes {
		return claim{}, nonce, fmt.Errorf("hello claims rank %d of %d, lane %d of %d", cl.rank, cl.nranks, cl.lane, cl.lanes)
	}
	copy(nonce[:], b[24:])
	return cl, nonce, nil
}

// transcript is what both sides sign: domain names the signer's role.
func transcript(domain string, nonceL, nonceD *[nonceSize]byte, keyL, keyD *[KeySize]byte, cl claim) []byte {
	b := make([]byte, transcriptSize)
	copy(b[0:32], domain)
	o := 32
	for _, f := range [][]byte{nonceL[:], nonceD[:], keyL[:], keyD[:]} {
		o += copy(b[o:], f)
	}
	binary.LittleEndian.PutUint32(b[o:], uint32(cl.rank))
	binary.LittleEndian.PutUint32(b[o+4:], uint32(cl.nranks))
	binary.LittleEndian.PutUint16(b[o+8:], uint16(cl.lane))
	binary.LittleEndian.PutUint16(b[o+10:], uint16(cl.lanes))
	binary.LittleEndian.PutUint32(b[o+12:], cl.flags())
	return b
}

// hello is the dialer's side: claim cl on c, prove it with id, and check
// that the listener holds peerKey.
func hello(c *net.TCPConn, peerKey *[KeySize]byte, id *identity, cl claim, deadline time.Time) error {
	var nonceD [nonceSize]byte
	if _, err := rand.Read(nonceD[:]); err != nil {
		return fmt.Errorf("hello nonce: %w", err)
	}
	var hb [helloSize]byte
	encodeHello(&hb, cl, &nonceD)
	c.SetDeadline(deadline)
	if _, err := c.Write(hb[:]); err != nil {
		return err
	}
	var ch [challengeSize]byte
	if _, err := io.ReadFull(c, ch[:]); err != nil {
		return fmt.Errorf("peer %s refused the connection: %w", c.RemoteAddr(), err)
	}
	if string(ch[0:4]) != challengeMagic {
		return errors.New("peer did not answer with a challenge")
	}
	var nonceL [nonceSize]byte
	copy(nonceL[:], ch[4:])
	var pb [proofSize]byte
	copy(pb[0:4], proofMagic)
	copy(pb[4:], ed25519.Sign(id.priv, transcript(domainDialer, &nonceL, &nonceD, peerKey, &id.pub, cl)))
	if _, err := c.Write(pb[:]); err != nil {
		return err
	}
	var ack [ackSize]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return fmt.Errorf("peer %s did not accept our proof (a connect that did not start in time, or a key mismatch): %w", c.RemoteAddr(), err)
	}
	if string(ack[0:4]) != ackMagic || !ed25519.Verify(peerKey[:], transcript(domainListener, &nonceL, &nonceD, peerKey, &id.pub, cl), ack[4:]) {
		return fmt.Errorf("the listener at %s did not prove it holds the key in the handle we dialled", c.RemoteAddr())
	}
	c.SetDeadline(time.Time{})
	return nil
}

// authenticate is the listener's side of the hello, up to the ack: it
// returns the claim once the dialer proved it with the claimed rank's key.
func (l *Listener) authenticate(c net.Conn, deadline time.Time) (claim, error) {
	var hb [helloSize]byte
	if n, err := io.ReadFull(c, hb[:]); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return claim{}, errSilent
		}
		return claim{}, fmt.Errorf("no hello: %w", err)
	}
	cl, nonceD, err := decodeHello(hb[:])
	if err != nil {
		return claim{}, err
	}
	var ch [challengeSize]byte
	copy(ch[0:4], challengeMagic)
	if _, err := rand.Read(ch[4:]); err != nil {
		return claim{}, fmt.Errorf("challenge nonce: %w", err)
	}
	var nonceL [nonceSize]byte
	copy(nonceL[:], ch[4:])
	if _, err := c.Write(ch[:]); err != nil {
		return claim{}, fmt.Errorf("send challenge: %w", err)
	}
	var pb [proofSize]byte
	if _, err := io.ReadFull(c, pb[:]); err != nil {
		return claim{}, fmt.Errorf("claims rank %d lane %d but sent no proof: %w", cl.rank, cl.lane, err)
	}
	if string(pb[0:4]) != proofMagic {
		return claim{}, fmt.Errorf("claims rank %d lane %d but sent no proof", cl.rank, cl.lane)
	}
	key, err := l.peerKey(cl, deadline)
	if err != nil {
		return claim{}, fmt.Errorf("claims rank %d lane %d: %w", cl.rank, cl.lane, err)
	}
	if !ed25519.Verify(key[:], transcript(domainDialer, &nonceL, &nonceD, &l.id.pub, key, cl), pb[4:]) {
		return claim{}, fmt.Errorf("claims rank %d of %d lane %d but its signature does not verify with that rank's key", cl.rank, cl.nranks, cl.lane)
	}
	var ack [ackSize]byte
	copy(ack[0:4], ackMagic)
	copy(ack[4:], ed25519.Sign(l.id.priv, transcript(domainListener, &nonceL, &nonceD, &l.id.pub, key, cl)))
	if _, err := c.Write(ack[:]); err != nil {
		return claim{}, fmt.Errorf("send acknowledgement: %w", err)
	}
	return cl, nil
}
