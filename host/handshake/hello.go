// Package handshake authenticates the TCP streams between ranks and,
// optionally, seals them. It holds a listener's identity (an ed25519 key
// pair whose public half rides the rank's handle), the four-message hello
// with its dialer side (Hello) and listener side (Authenticate), and the
// AES-256-GCM seal of a stream whose keys the hello agreed (Seal).
// host/dataplane dials and accepts with it; it knows nothing of the mesh.
package handshake

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
//	dialer → listener  hello (88):     0 "RMAH" | 4 protocol u8 (Protocol) | 5 flags u8 | 6 zero [2]
//	                                   8 rank u32 | 12 nranks u32 | 16 lane u16 | 18 lanes u16
//	                                   20 zero [4] | 24 dialer nonce [32]
//	                                   56 dialer's ephemeral X25519 key [32] (zero unless encrypting)
//	listener → dialer  challenge (68): 0 "RMAC" | 4 listener nonce [32]
//	                                   36 listener's ephemeral X25519 key [32] (zero unless encrypting)
//	dialer → listener  proof (68):     0 "RMAP" | 4 ed25519 signature [64]
//	listener → dialer  ack (68):       0 "RMAK" | 4 ed25519 signature [64]
//
// A listener that speaks another protocol answers the hello with a
// refusal instead of a challenge, and closes:
//
//	listener → dialer  refusal (68):   0 "RMAV" | 4 protocol u8 | 5 zero [63]
//
// so that both sides of a job that mixes builds fail at connect with both
// versions named (VersionError), never with a protocol error mid-run.
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
	ChallengeMagic = "RMAC" // a challenge starts with it
	proofMagic     = "RMAP"
	ackMagic       = "RMAK"
	refusalMagic   = "RMAV"
	nonceSize      = 32
	ephSize        = 32                        // an X25519 public key
	HelloSize      = 24 + nonceSize + ephSize  // the dialer's first message
	ChallengeSize  = 4 + nonceSize + ephSize   // the listener's answer to a hello
	ProofSize      = 4 + ed25519.SignatureSize // the dialer's second message
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

// Protocol is the version of the wire protocol this library speaks: the
// hello, the stream headers and the messages they carry (host/wire). The
// hello carries it, and two ranks that speak different versions refuse
// each other at connect. Raise it with every change a peer of the previous
// version would misread. History:
//
//	3: the authenticated hello; acks on the acknowledged stream.
//	4: acks that ride the reverse lanes (wire.MsgAck, wire.StatusAckNow),
//	   the liveness backstop's asks; the version refusal.
const Protocol = 4

// VersionError is a peer that speaks another wire protocol (Protocol): a
// job whose ranks loaded different builds of the library.
type VersionError struct {
	Peer, Ours int
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("the peer speaks wire protocol %d and this library %d: every rank must load the same build of rccl-rma-wasm", e.Peer, e.Ours)
}

// KeySize is the length of a listener's public key (ed25519).
const KeySize = ed25519.PublicKeySize

// Identity is a listener's key pair; its dialers sign with it too. Pub
// rides the rank's handle; the private half never leaves the process.
type Identity struct {
	Pub  [KeySize]byte
	priv ed25519.PrivateKey
}

// NewIdentity makes a fresh key pair (one per listener).
func NewIdentity() (Identity, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Identity{}, fmt.Errorf("listener key: %w", err)
	}
	var id Identity
	copy(id.Pub[:], pub)
	id.priv = priv
	return id, nil
}

// Claim is who a dialer says it is and which of its streams this is.
type Claim struct {
	Rank, NRanks, Lane, Lanes int
	NoFabric                  bool // the dialer declines libfabric
	Encrypt                   bool // the stream is sealed after the hello
}

func (cl Claim) flags() uint32 {
	var f uint32
	if cl.NoFabric {
		f |= helloNoFabric
	}
	if cl.Encrypt {
		f |= helloEncrypt
	}
	return f
}

// ErrSilent marks a connection that went away before saying anything: a
// port probe or a dialer that gave up. It is closed without a log line.
var ErrSilent = errors.New("closed before its hello")

// encodeHello writes the dialer's first message.
func encodeHello(b *[HelloSize]byte, cl Claim, nonce *[nonceSize]byte, eph *[ephSize]byte) {
	*b = [HelloSize]byte{}
	copy(b[0:4], helloMagic)
	b[4] = Protocol
	b[5] = byte(cl.flags())
	binary.LittleEndian.PutUint32(b[8:], uint32(cl.Rank))
	binary.LittleEndian.PutUint32(b[12:], uint32(cl.NRanks))
	binary.LittleEndian.PutUint16(b[16:], uint16(cl.Lane))
	binary.LittleEndian.PutUint16(b[18:], uint16(cl.Lanes))
	copy(b[24:], nonce[:])
	copy(b[24+nonceSize:], eph[:])
}

// decodeHello parses a dialer's first message and checks the claim is one a
// rank could make: it refuses anything encodeHello would not have written.
func decodeHello(b []byte) (Claim, [nonceSize]byte, [ephSize]byte, error) {
	var nonce [nonceSize]byte
	var eph [ephSize]byte
	if len(b) != HelloSize || string(b[0:4]) != helloMagic {
		return Claim{}, nonce, eph, errors.New("not an rccl-rma-wasm hello")
	}
	if b[4] != Protocol {
		return Claim{}, nonce, eph, &VersionError{Peer: int(b[4]), Ours: Protocol}
	}
	if b[5]&^(helloNoFabric|helloEncrypt)|b[6]|b[7]|b[20]|b[21]|b[22]|b[23] != 0 {
		return Claim{}, nonce, eph, errors.New("hello with unknown flags or nonzero reserved bytes")
	}
	cl := Claim{Rank: int(binary.LittleEndian.Uint32(b[8:])), NRanks: int(binary.LittleEndian.Uint32(b[12:])),
		Lane: int(binary.LittleEndian.Uint16(b[16:])), Lanes: int(binary.LittleEndian.Uint16(b[18:])), NoFabric: b[5]&helloNoFabric != 0, Encrypt: b[5]&helloEncrypt != 0}
	if cl.NRanks < 1 || cl.NRanks > maxRanks || cl.Rank >= cl.NRanks || cl.Lanes < 1 || cl.Lanes > abi.MaxLanes || cl.Lane >= cl.Lanes {
		return Claim{}, nonce, eph, fmt.Errorf("hello claims rank %d of %d, lane %d of %d", cl.Rank, cl.NRanks, cl.Lane, cl.Lanes)
	}
	copy(nonce[:], b[24:])
	copy(eph[:], b[24+nonceSize:])
	if cl.Encrypt == (eph == [ephSize]byte{}) {
		return Claim{}, nonce, eph, errors.New("hello's ephemeral key does not match its encryption flag")
	}
	return cl, nonce, eph, nil
}

// transcript is what both sides sign: domain names the signer's role.
// ephL and ephD are the ephemeral keys (zero when not encrypting).
func transcript(domain string, nonceL, nonceD *[nonceSize]byte, keyL, keyD *[KeySize]byte, ephL, ephD *[ephSize]byte, cl Claim) []byte {
	b := make([]byte, transcriptSize)
	copy(b[0:32], domain)
	o := 32
	for _, f := range [][]byte{nonceL[:], nonceD[:], keyL[:], keyD[:], ephL[:], ephD[:]} {
		o += copy(b[o:], f)
	}
	binary.LittleEndian.PutUint32(b[o:], uint32(cl.Rank))
	binary.LittleEndian.PutUint32(b[o+4:], uint32(cl.NRanks))
	binary.LittleEndian.PutUint16(b[o+8:], uint16(cl.Lane))
	binary.LittleEndian.PutUint16(b[o+10:], uint16(cl.Lanes))
	binary.LittleEndian.PutUint32(b[o+12:], cl.flags())
	return b
}

// Hello is the dialer's side: claim cl on c, prove it with id, and check
// that the listener holds peerKey. With cl.Encrypt it returns the stream's
// keys for Seal (nil otherwise).
func Hello(c *net.TCPConn, peerKey *[KeySize]byte, id *Identity, cl Claim, deadline time.Time) (*Keys, error) {
	var nonceD [nonceSize]byte
	if _, err := rand.Read(nonceD[:]); err != nil {
		return nil, fmt.Errorf("hello nonce: %w", err)
	}
	var ephD [ephSize]byte
	var eph *ecdh.PrivateKey
	if cl.Encrypt {
		var err error
		if eph, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
			return nil, fmt.Errorf("ephemeral key: %w", err)
		}
		copy(ephD[:], eph.PublicKey().Bytes())
	}
	var hb [HelloSize]byte
	encodeHello(&hb, cl, &nonceD, &ephD)
	c.SetDeadline(deadline)
	if _, err := c.Write(hb[:]); err != nil {
		return nil, err
	}
	var ch [ChallengeSize]byte
	if _, err := io.ReadFull(c, ch[:]); err != nil {
		return nil, fmt.Errorf("peer %s refused the connection (closed before its challenge: a rank of an older build of this library refuses a hello of protocol %d that way): %w", c.RemoteAddr(), Protocol, err)
	}
	if string(ch[0:4]) == refusalMagic {
		return nil, &VersionError{Peer: int(ch[4]), Ours: Protocol}
	}
	if string(ch[0:4]) != ChallengeMagic {
		return nil, errors.New("peer did not answer with a challenge")
	}
	var nonceL [nonceSize]byte
	var ephL [ephSize]byte
	copy(nonceL[:], ch[4:])
	copy(ephL[:], ch[4+nonceSize:])
	tr := transcript(domainDialer, &nonceL, &nonceD, peerKey, &id.Pub, &ephL, &ephD, cl)
	var pb [ProofSize]byte
	copy(pb[0:4], proofMagic)
	copy(pb[4:], ed25519.Sign(id.priv, tr))
	if _, err := c.Write(pb[:]); err != nil {
		return nil, err
	}
	var ack [ackSize]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return nil, fmt.Errorf("peer %s did not accept our proof (a connect that did not start in time, a key mismatch, or NCCL_RMA_WASM_ENCRYPT set differently): %w", c.RemoteAddr(), err)
	}
	if string(ack[0:4]) != ackMagic || !ed25519.Verify(peerKey[:], transcript(domainListener, &nonceL, &nonceD, peerKey, &id.Pub, &ephL, &ephD, cl), ack[4:]) {
		return nil, fmt.Errorf("the listener at %s did not prove it holds the key in the handle we dialled", c.RemoteAddr())
	}
	c.SetDeadline(time.Time{})
	if !cl.Encrypt {
		return nil, nil
	}
	keys, err := agree(eph, &ephL, tr, true)
	if err != nil {
		return nil, err
	}
	return &keys, nil
}

// agree derives a stream's keys from our ephemeral key and the peer's.
func agree(eph *ecdh.PrivateKey, peer *[ephSize]byte, tr []byte, dialer bool) (Keys, error) {
	pub, err := ecdh.X25519().NewPublicKey(peer[:])
	if err != nil {
		return Keys{}, fmt.Errorf("peer's ephemeral key: %w", err)
	}
	secret, err := eph.ECDH(pub)
	if err != nil {
		return Keys{}, fmt.Errorf("key agreement: %w", err)
	}
	h := sha256.Sum256(tr)
	return deriveSealKeys(secret, h[:], dialer)
}

// PeerKey tells Authenticate, once a dialer's hello is read, the public key
// of the rank its claim names and whether this rank requires sealed
// streams; an error refuses the claim (no such rank, or no peers known in
// time).
type PeerKey func(Claim) (key *[KeySize]byte, encrypt bool, err error)

// checkHelloPrefix refuses the first len(b) bytes of a hello as soon as
// they cannot begin one decodeHello would accept: the magic, the version,
// the flags and the reserved bytes are checked byte by byte as they arrive,
// so a stranger speaking anything else is dropped at once, not at the hello
// deadline. The claim's fields wait for decodeHello.
func checkHelloPrefix(b []byte) error {
	for i := 0; i < len(b) && i < len(helloMagic); i++ {
		if b[i] != helloMagic[i] {
			return errors.New("not an rccl-rma-wasm hello")
		}
	}
	if len(b) > 4 && b[4] != Protocol {
		return &VersionError{Peer: int(b[4]), Ours: Protocol}
	}
	if len(b) > 5 && b[5]&^(helloNoFabric|helloEncrypt) != 0 {
		return errors.New("hello with unknown flags or nonzero reserved bytes")
	}
	for _, i := range [...]int{6, 7, 20, 21, 22, 23} {
		if i < len(b) && b[i] != 0 {
			return errors.New("hello with unknown flags or nonzero reserved bytes")
		}
	}
	return nil
}

// readChecked fills b from c, giving check each prefix as it arrives, so
// bytes that cannot start the message end the read at once; ErrSilent when
// c closed before its first byte.
func readChecked(c net.Conn, b []byte, what string, check func([]byte) error) error {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if cerr := check(b[:n]); cerr != nil {
			return cerr
		}
		if n == len(b) {
			break
		}
		if err != nil {
			if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
				return ErrSilent
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("no %s (%d of %d bytes): %w", what, n, len(b), err)
		}
	}
	return nil
}

// checkProofPrefix refuses a proof whose magic is wrong as soon as the
// wrong byte arrives.
func checkProofPrefix(b []byte) error {
	for i := 0; i < len(b) && i < len(proofMagic); i++ {
		if b[i] != proofMagic[i] {
			return errors.New("sent no proof")
		}
	}
	return nil
}

// Authenticate is the listener's side of the hello, up to the ack: it
// returns the claim once the dialer proved it with the key peerKey names
// for the claimed rank, and the stream's keys when the dialer seals it.
// Every refusal is an error; ErrSilent when c closed before its hello.
// With helloTimeout > 0, the dialer's hello and proof (which it sends
// without waiting on anything but us) must both arrive within helloTimeout
// of the call; the wait in peerKey and the ack are bounded by whatever
// deadline peerKey sets on c. With 0 the caller's deadlines on c apply
// throughout. Both messages are checked byte by byte as they arrive.
func Authenticate(c net.Conn, id *Identity, peerKey PeerKey, helloTimeout time.Duration) (Claim, *Keys, error) {
	if helloTimeout > 0 {
		c.SetDeadline(time.Now().Add(helloTimeout))
	}
	var hb [HelloSize]byte
	if err := readChecked(c, hb[:], "hello", checkHelloPrefix); err != nil {
		var ve *VersionError
		if errors.As(err, &ve) {
			// A rank of another build: tell it which protocol we speak,
			// so that its connect fails naming both.
			var rb [ChallengeSize]byte
			copy(rb[0:4], refusalMagic)
			rb[4] = Protocol
			c.Write(rb[:])
		}
		return Claim{}, nil, err
	}
	cl, nonceD, ephD, err := decodeHello(hb[:])
	if err != nil {
		return Claim{}, nil, err
	}
	var ch [ChallengeSize]byte
	copy(ch[0:4], ChallengeMagic)
	if _, err := rand.Read(ch[4 : 4+nonceSize]); err != nil {
		return Claim{}, nil, fmt.Errorf("challenge nonce: %w", err)
	}
	var eph *ecdh.PrivateKey
	var ephL [ephSize]byte
	if cl.Encrypt {
		if eph, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
			return Claim{}, nil, fmt.Errorf("ephemeral key: %w", err)
		}
		copy(ephL[:], eph.PublicKey().Bytes())
		copy(ch[4+nonceSize:], ephL[:])
	}
	var nonceL [nonceSize]byte
	copy(nonceL[:], ch[4:])
	if _, err := c.Write(ch[:]); err != nil {
		return Claim{}, nil, fmt.Errorf("send challenge: %w", err)
	}
	var pb [ProofSize]byte
	if err := readChecked(c, pb[:], "proof", checkProofPrefix); err != nil {
		return Claim{}, nil, fmt.Errorf("claims rank %d lane %d: %w", cl.Rank, cl.Lane, err)
	}
	key, encrypt, err := peerKey(cl)
	if err != nil {
		return Claim{}, nil, fmt.Errorf("claims rank %d lane %d: %w", cl.Rank, cl.Lane, err)
	}
	tr := transcript(domainDialer, &nonceL, &nonceD, &id.Pub, key, &ephL, &ephD, cl)
	if !ed25519.Verify(key[:], tr, pb[4:]) {
		return Claim{}, nil, fmt.Errorf("claims rank %d of %d lane %d but its signature does not verify with that rank's key", cl.Rank, cl.NRanks, cl.Lane)
	}
	if encrypt && !cl.Encrypt {
		return Claim{}, nil, fmt.Errorf("rank %d lane %d does not encrypt its stream and this rank requires it (NCCL_RMA_WASM_ENCRYPT must be set alike on every rank)", cl.Rank, cl.Lane)
	}
	var keys *Keys
	if cl.Encrypt {
		k, err := agree(eph, &ephD, tr, false)
		if err != nil {
			return Claim{}, nil, fmt.Errorf("rank %d lane %d: %w", cl.Rank, cl.Lane, err)
		}
		keys = &k
	}
	var ack [ackSize]byte
	copy(ack[0:4], ackMagic)
	copy(ack[4:], ed25519.Sign(id.priv, transcript(domainListener, &nonceL, &nonceD, &id.Pub, key, &ephL, &ephD, cl)))
	if _, err := c.Write(ack[:]); err != nil {
		return Claim{}, nil, fmt.Errorf("send acknowledgement: %w", err)
	}
	return cl, keys, nil
}
