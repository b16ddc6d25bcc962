package dataplane

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
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
//	dialer → listener  hello (88):     0 "RMAH" | 4 version u8 (3) | 5 flags u8 | 6 zero [2]
//	                                   8 rank u32 | 12 nranks u32 | 16 lane u16 | 18 lanes u16
//	                                   20 zero [4] | 24 dialer nonce [32]
//	                                   56 dialer's ephemeral X25519 key [32] (zero unless encrypting)
//	listener → dialer  challenge (68): 0 "RMAC" | 4 listener nonce [32]
//	                                   36 listener's ephemeral X25519 key [32] (zero unless encrypting)
//	dialer → listener  proof (68):     0 "RMAP" | 4 ed25519 signature [64]
//	listener → dialer  ack (68):       0 "RMAK" | 4 ed25519 signature [64]
//
// Both signatures cover the transcript (transcriptSize bytes): a 32-byte
// domain string naming the signer's role, the listener's nonce, the
// dialer's nonce, the listener's and the dialer's public keys, both
// ephemeral keys, and the claim (rank u32, nranks u32, lane u16, lanes u16,
// flags u32). Flags: helloNoFabric, the dialer's connection plan declines
// libfabric (SPEC.md §8.10); helloEncrypt, the stream is sealed after the
// hello (seal.go). Both are signed like the rest, so no one on the path can
// flip them or swap an ephemeral key. The listener checks
// the proof with the claimed rank's key from the handles connect received,
// so a replayed proof (signed over another nonce) and a proof made with any
// other key both fail; the dialer checks the ack with the key of the rank
// it dialled. The listener signs only for a dialer that proved itself.
const (
	helloMagic     = "RMAH"
	challengeMagic = "RMAC"
	proofMagic     = "RMAP"
	ackMagic       = "RMAK"
	helloVersion   = 3
	nonceSize      = 32
	ephSize        = 32 // an X25519 public key
	helloSize      = 24 + nonceSize + ephSize
	challengeSize  = 4 + nonceSize + ephSize
	proofSize      = 4 + ed25519.SignatureSize
	ackSize        = 4 + ed25519.SignatureSize
	transcriptSize = 32 + 2*nonceSize + 2*KeySize + 2*ephSize + 16
	// helloNoFabric in the hello's flags: the dialer's plan declines
	// libfabric, so the pair uses TCP or the intra-node path.
	helloNoFabric = 1
	// helloEncrypt: the dialer seals the stream (NCCL_RMA_WASM_ENCRYPT).
	helloEncrypt = 2

	domainDialer   = "rccl-rma-wasm hello v3 dialer"
	domainListener = "rccl-rma-wasm hello v3 listener"
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
	encrypt                   bool // the stream is sealed after the hello
}

func (cl claim) flags() uint32 {
	var f uint32
	if cl.noFab {
		f |= helloNoFabric
	}
	if cl.encrypt {
		f |= helloEncrypt
	}
	return f
}

// errSilent marks a connection that went away before saying anything: a
// port probe or a dialer that gave up. It is closed without a log line.
var errSilent = errors.New("closed before its hello")

// encodeHello writes the dialer's first message.
func encodeHello(b *[helloSize]byte, cl claim, nonce *[nonceSize]byte, eph *[ephSize]byte) {
	*b = [helloSize]byte{}
	copy(b[0:4], helloMagic)
	b[4] = helloVersion
	b[5] = byte(cl.flags())
	binary.LittleEndian.PutUint32(b[8:], uint32(cl.rank))
	binary.LittleEndian.PutUint32(b[12:], uint32(cl.nranks))
	binary.LittleEndian.PutUint16(b[16:], uint16(cl.lane))
	binary.LittleEndian.PutUint16(b[18:], uint16(cl.lanes))
	copy(b[24:], nonce[:])
	copy(b[24+nonceSize:], eph[:])
}

// decodeHello parses a dialer's first message and checks the claim is one a
// rank could make: it refuses anything encodeHello would not have written.
func decodeHello(b []byte) (claim, [nonceSize]byte, [ephSize]byte, error) {
	var nonce [nonceSize]byte
	var eph [ephSize]byte
	if len(b) != helloSize || string(b[0:4]) != helloMagic {
		return claim{}, nonce, eph, errors.New("not an rccl-rma-wasm hello")
	}
	if b[4] != helloVersion {
		return claim{}, nonce, eph, fmt.Errorf("hello version %d, this library speaks %d", b[4], helloVersion)
	}
	if b[5]&^(helloNoFabric|helloEncrypt)|b[6]|b[7]|b[20]|b[21]|b[22]|b[23] != 0 {
		return claim{}, nonce, eph, errors.New("hello with unknown flags or nonzero reserved bytes")
	}
	cl := claim{rank: int(binary.LittleEndian.Uint32(b[8:])), nranks: int(binary.LittleEndian.Uint32(b[12:])),
		lane: int(binary.LittleEndian.Uint16(b[16:])), lanes: int(binary.LittleEndian.Uint16(b[18:])), noFab: b[5]&helloNoFabric != 0, encrypt: b[5]&helloEncrypt != 0}
	if cl.nranks < 1 || cl.nranks > maxRanks || cl.rank >= cl.nranks || cl.lanes < 1 || cl.lanes > abi.MaxLanes || cl.lane >= cl.lanes {
		return claim{}, nonce, eph, fmt.Errorf("hello claims rank %d of %d, lane %d of %d", cl.rank, cl.nranks, cl.lane, cl.lanes)
	}
	copy(nonce[:], b[24:])
	copy(eph[:], b[24+nonceSize:])
	if cl.encrypt == (eph == [ephSize]byte{}) {
		return claim{}, nonce, eph, errors.New("hello's ephemeral key does not match its encryption flag")
	}
	return cl, nonce, eph, nil
}

// transcript is what both sides sign: domain names the signer's role.
// ephL and ephD are the ephemeral keys (zero when not encrypting).
func transcript(domain string, nonceL, nonceD *[nonceSize]byte, keyL, keyD *[KeySize]byte, ephL, ephD *[ephSize]byte, cl claim) []byte {
	b := make([]byte, transcriptSize)
	copy(b[0:32], domain)
	o := 32
	for _, f := range [][]byte{nonceL[:], nonceD[:], keyL[:], keyD[:], ephL[:], ephD[:]} {
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
// that the listener holds peerKey. With cl.encrypt it returns the stream's
// keys (nil otherwise).
func hello(c *net.TCPConn, peerKey *[KeySize]byte, id *identity, cl claim, deadline time.Time) (*sealKeys, error) {
	var nonceD [nonceSize]byte
	if _, err := rand.Read(nonceD[:]); err != nil {
		return nil, fmt.Errorf("hello nonce: %w", err)
	}
	var ephD [ephSize]byte
	var eph *ecdh.PrivateKey
	if cl.encrypt {
		var err error
		if eph, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
			return nil, fmt.Errorf("ephemeral key: %w", err)
		}
		copy(ephD[:], eph.PublicKey().Bytes())
	}
	var hb [helloSize]byte
	encodeHello(&hb, cl, &nonceD, &ephD)
	c.SetDeadline(deadline)
	if _, err := c.Write(hb[:]); err != nil {
		return nil, err
	}
	var ch [challengeSize]byte
	if _, err := io.ReadFull(c, ch[:]); err != nil {
		return nil, fmt.Errorf("peer %s refused the connection: %w", c.RemoteAddr(), err)
	}
	if string(ch[0:4]) != challengeMagic {
		return nil, errors.New("peer did not answer with a challenge")
	}
	var nonceL [nonceSize]byte
	var ephL [ephSize]byte
	copy(nonceL[:], ch[4:])
	copy(ephL[:], ch[4+nonceSize:])
	tr := transcript(domainDialer, &nonceL, &nonceD, peerKey, &id.pub, &ephL, &ephD, cl)
	var pb [proofSize]byte
	copy(pb[0:4], proofMagic)
	copy(pb[4:], ed25519.Sign(id.priv, tr))
	if _, err := c.Write(pb[:]); err != nil {
		return nil, err
	}
	var ack [ackSize]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return nil, fmt.Errorf("peer %s did not accept our proof (a connect that did not start in time, a key mismatch, or NCCL_RMA_WASM_ENCRYPT set differently): %w", c.RemoteAddr(), err)
	}
	if string(ack[0:4]) != ackMagic || !ed25519.Verify(peerKey[:], transcript(domainListener, &nonceL, &nonceD, peerKey, &id.pub, &ephL, &ephD, cl), ack[4:]) {
		return nil, fmt.Errorf("the listener at %s did not prove it holds the key in the handle we dialled", c.RemoteAddr())
	}
	c.SetDeadline(time.Time{})
	if !cl.encrypt {
		return nil, nil
	}
	keys, err := agree(eph, &ephL, tr, true)
	if err != nil {
		return nil, err
	}
	return &keys, nil
}

// agree derives a stream's keys from our ephemeral key and the peer's.
func agree(eph *ecdh.PrivateKey, peer *[ephSize]byte, tr []byte, dialer bool) (sealKeys, error) {
	pub, err := ecdh.X25519().NewPublicKey(peer[:])
	if err != nil {
		return sealKeys{}, fmt.Errorf("peer's ephemeral key: %w", err)
	}
	secret, err := eph.ECDH(pub)
	if err != nil {
		return sealKeys{}, fmt.Errorf("key agreement: %w", err)
	}
	h := sha256.Sum256(tr)
	return deriveSealKeys(secret, h[:], dialer)
}

// authenticate is the listener's side of the hello, up to the ack: it
// returns the claim once the dialer proved it with the claimed rank's key,
// and the stream's keys when the dialer seals it.
func (l *Listener) authenticate(c net.Conn, deadline time.Time) (claim, *sealKeys, error) {
	var hb [helloSize]byte
	if n, err := io.ReadFull(c, hb[:]); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return claim{}, nil, errSilent
		}
		return claim{}, nil, fmt.Errorf("no hello: %w", err)
	}
	cl, nonceD, ephD, err := decodeHello(hb[:])
	if err != nil {
		return claim{}, nil, err
	}
	var ch [challengeSize]byte
	copy(ch[0:4], challengeMagic)
	if _, err := rand.Read(ch[4 : 4+nonceSize]); err != nil {
		return claim{}, nil, fmt.Errorf("challenge nonce: %w", err)
	}
	var eph *ecdh.PrivateKey
	var ephL [ephSize]byte
	if cl.encrypt {
		if eph, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
			return claim{}, nil, fmt.Errorf("ephemeral key: %w", err)
		}
		copy(ephL[:], eph.PublicKey().Bytes())
		copy(ch[4+nonceSize:], ephL[:])
	}
	var nonceL [nonceSize]byte
	copy(nonceL[:], ch[4:])
	if _, err := c.Write(ch[:]); err != nil {
		return claim{}, nil, fmt.Errorf("send challenge: %w", err)
	}
	var pb [proofSize]byte
	if _, err := io.ReadFull(c, pb[:]); err != nil {
		return claim{}, nil, fmt.Errorf("claims rank %d lane %d but sent no proof: %w", cl.rank, cl.lane, err)
	}
	if string(pb[0:4]) != proofMagic {
		return claim{}, nil, fmt.Errorf("claims rank %d lane %d but sent no proof", cl.rank, cl.lane)
	}
	key, encrypt, err := l.peerKey(cl, deadline)
	if err != nil {
		return claim{}, nil, fmt.Errorf("claims rank %d lane %d: %w", cl.rank, cl.lane, err)
	}
	tr := transcript(domainDialer, &nonceL, &nonceD, &l.id.pub, key, &ephL, &ephD, cl)
	if !ed25519.Verify(key[:], tr, pb[4:]) {
		return claim{}, nil, fmt.Errorf("claims rank %d of %d lane %d but its signature does not verify with that rank's key", cl.rank, cl.nranks, cl.lane)
	}
	if encrypt && !cl.encrypt {
		return claim{}, nil, fmt.Errorf("rank %d lane %d does not encrypt its stream and this rank requires it (NCCL_RMA_WASM_ENCRYPT must be set alike on every rank)", cl.rank, cl.lane)
	}
	var keys *sealKeys
	if cl.encrypt {
		k, err := agree(eph, &ephD, tr, false)
		if err != nil {
			return claim{}, nil, fmt.Errorf("rank %d lane %d: %w", cl.rank, cl.lane, err)
		}
		keys = &k
	}
	var ack [ackSize]byte
	copy(ack[0:4], ackMagic)
	copy(ack[4:], ed25519.Sign(l.id.priv, transcript(domainListener, &nonceL, &nonceD, &l.id.pub, key, &ephL, &ephD, cl)))
	if _, err := c.Write(ack[:]); err != nil {
		return claim{}, nil, fmt.Errorf("send acknowledgement: %w", err)
	}
	return cl, keys, nil
}
