package handshake

import (
	"crypto/ed25519"
	"io"
	"net"
)

// ForgeHello runs the dialer's side of the hello by hand, for tests of a
// listener built on Authenticate (host/dataplane's) that must see every
// kind of wrong proof: the hello claims said, the proof signs signed for
// the listener key key, and tamper (when not nil) alters the proof before
// it leaves. It returns the listener's answer to the proof (empty when the
// hello or the proof was refused) and whether that answer is an ack. The
// data path never calls it.
func ForgeHello(c net.Conn, key *[KeySize]byte, id *Identity, said, signed Claim, tamper func(proof []byte)) (answer []byte, acked bool) {
	var nonceD [nonceSize]byte
	nonceD[0] = 42
	var hb [HelloSize]byte
	var eph [ephSize]byte
	encodeHello(&hb, said, &nonceD, &eph)
	c.Write(hb[:])
	var ch [ChallengeSize]byte
	if _, err := io.ReadFull(c, ch[:]); err != nil {
		return nil, false // refused at the hello
	}
	var nonceL [nonceSize]byte
	copy(nonceL[:], ch[4:])
	pb := make([]byte, ProofSize)
	copy(pb, proofMagic)
	copy(pb[4:], ed25519.Sign(id.priv, transcript(domainDialer, &nonceL, &nonceD, key, &id.Pub, &eph, &eph, signed)))
	if tamper != nil {
		tamper(pb)
	}
	c.Write(pb)
	// An ack, or whatever came before the listener closed.
	answer = make([]byte, ackSize)
	n, _ := io.ReadFull(c, answer)
	return answer[:n], n == ackSize && string(answer[:4]) == ackMagic
}
