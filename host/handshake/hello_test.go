package handshake

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// Fuzz targets for what a stranger's bytes reach before any check of ours
// has run. `make test` runs each briefly (FUZZTIME); the seeds below and
// testdata/fuzz/ are the committed corpus.

// FuzzHello: any bytes given to the hello decoder either are refused or
// are exactly what encodeHello writes for the claim and nonce decoded, so
// the listener never acts on a field it did not check.
func FuzzHello(f *testing.F) {
	var nonce [nonceSize]byte
	for i := range nonce {
		nonce[i] = byte(i)
	}
	var b [HelloSize]byte
	var none, eph [ephSize]byte
	eph[0] = 9
	for _, cl := range []Claim{{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1}, {Rank: 7, NRanks: 8, Lane: 3, Lanes: 4, NoFabric: true}, {Rank: 0, NRanks: 1, Lane: 7, Lanes: 8}} {
		encodeHello(&b, cl, &nonce, &none)
		f.Add(b[:])
	}
	encodeHello(&b, Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1, Encrypt: true}, &nonce, &eph)
	f.Add(b[:])
	f.Add(make([]byte, HelloSize))
	f.Fuzz(func(t *testing.T, in []byte) {
		cl, n, e, err := decodeHello(in)
		if err != nil {
			return
		}
		var out [HelloSize]byte
		encodeHello(&out, cl, &n, &e)
		if !bytes.Equal(out[:], in) {
			t.Fatalf("hello %x decodes to %+v, which encodes to %x", in, cl, out)
		}
		if cl.Rank >= cl.NRanks || cl.Lane >= cl.Lanes || cl.Lanes > 8 || cl.Encrypt == (e == [ephSize]byte{}) {
			t.Fatalf("decoder accepted an impossible claim %+v", cl)
		}
	})
}

// FuzzAuthenticate feeds a listener's side of the hello whatever a stranger
// could send (a hello, then a proof; the fuzzer picks both, and may keep
// the hello well formed so that the proof reaches the signature check).
// Without the private key of a rank nothing may be admitted, and nothing
// may panic or hang.
func FuzzAuthenticate(f *testing.F) {
	// A listener of a 2-rank communicator whose ranks' keys are its own,
	// as host/dataplane's Listener answers once connect named the peers.
	id, err := NewIdentity()
	if err != nil {
		f.Fatal(err)
	}
	peerKey := func(cl Claim) (*[KeySize]byte, bool, error) {
		if cl.NRanks != 2 {
			return nil, false, fmt.Errorf("it claims rank %d of %d; this communicator has 2 ranks", cl.Rank, cl.NRanks)
		}
		return &id.Pub, false, nil
	}
	var nonce [nonceSize]byte
	var hb [HelloSize]byte
	var eph [ephSize]byte
	encodeHello(&hb, Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1}, &nonce, &eph)
	proof := append([]byte(proofMagic), make([]byte, ed25519.SignatureSize)...)
	f.Add(hb[:], proof)
	f.Add(hb[:], []byte("RMAP"))
	f.Add([]byte("RMAH"), []byte{})
	f.Add(make([]byte, HelloSize), proof)
	f.Fuzz(func(t *testing.T, hello, proof []byte) {
		a, b := net.Pipe()
		defer a.Close()
		// One goroutine sends the stranger's bytes and hangs up, the
		// other takes whatever the listener answers.
		go io.Copy(io.Discard, b)
		go func() {
			b.Write(append(append([]byte(nil), hello...), proof...))
			b.Close()
		}()
		deadline := time.Now().Add(2 * time.Second)
		a.SetDeadline(deadline)
		if cl, _, err := Authenticate(a, &id, peerKey, 0); err == nil {
			t.Fatalf("a stranger was admitted as %+v", cl)
		}
	})
}

// TestDialerChecksListener: a listener at the dialled address that does
// not hold the key in the handle cannot complete the hello.
func TestDialerChecksListener(t *testing.T) {
	fake, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	real, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	evil, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	me, _ := NewIdentity()
	go func() {
		c, err := fake.AcceptTCP()
		if err != nil {
			return
		}
		defer c.Close()
		var hb [HelloSize]byte
		io.ReadFull(c, hb[:])
		cl, nonceD, ephD, _ := decodeHello(hb[:])
		var nonceL [nonceSize]byte
		var ephL [ephSize]byte
		c.Write(append(append([]byte(ChallengeMagic), nonceL[:]...), ephL[:]...))
		var pb [ProofSize]byte
		io.ReadFull(c, pb[:])
		// It answers with a well-formed ack, signed with its own key.
		c.Write(append([]byte(ackMagic), ed25519.Sign(evil.priv, transcript(domainListener, &nonceL, &nonceD, &real.Pub, &me.Pub, &ephL, &ephD, cl))...))
		io.ReadAll(c)
	}()
	c, err := net.DialTCP("tcp", nil, fake.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = Hello(c, &real.Pub, &me, Claim{Rank: 0, NRanks: 2, Lane: 0, Lanes: 1}, time.Now().Add(5*time.Second))
	if err == nil || !strings.Contains(err.Error(), "did not prove it holds the key") {
		t.Fatalf("a listener without the handle's key: %v", err)
	}
}

// TestVersionsMeetAtHello: ranks of two builds meet at the hello. A
// dialer of an older build (its hello carries protocol 3) is refused by
// our listener, which answers with a refusal naming our protocol; our
// dialer meeting such a refusal (a listener of another build) fails with
// both versions named, instead of either side reading the other's
// messages mid-run.
func TestVersionsMeetAtHello(t *testing.T) {
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	for _, older := range []byte{3, Protocol + 1} {
		t.Run(fmt.Sprintf("their=%d", older), func(t *testing.T) {
			// Their dialer, our listener.
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			done := make(chan error, 1)
			go func() {
				_, _, err := Authenticate(b, &id, func(Claim) (*[KeySize]byte, bool, error) { return &id.Pub, false, nil }, 5*time.Second)
				done <- err
			}()
			var hb [HelloSize]byte
			var nonce [nonceSize]byte
			var eph [ephSize]byte
			encodeHello(&hb, Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1}, &nonce, &eph)
			hb[4] = older
			if _, err := a.Write(hb[:]); err != nil {
				t.Fatal(err)
			}
			var rb [ChallengeSize]byte
			if _, err := io.ReadFull(a, rb[:]); err != nil {
				t.Fatalf("no refusal: %v", err)
			}
			if string(rb[0:4]) != refusalMagic || rb[4] != Protocol {
				t.Fatalf("answer % x, want the refusal naming protocol %d", rb[:8], Protocol)
			}
			var ve *VersionError
			if err := <-done; !errors.As(err, &ve) || ve.Peer != int(older) || ve.Ours != Protocol {
				t.Fatalf("listener: %v, want a VersionError %d/%d", err, older, Protocol)
			}
			if msg := ve.Error(); !strings.Contains(msg, fmt.Sprintf("wire protocol %d", older)) || !strings.Contains(msg, fmt.Sprintf("this library %d", Protocol)) {
				t.Fatalf("message %q does not name both versions", msg)
			}

			// Our dialer, their listener (one that refuses us as ours does).
			ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				var hb [HelloSize]byte
				io.ReadFull(c, hb[:])
				var rb [ChallengeSize]byte
				copy(rb[:], refusalMagic)
				rb[4] = older
				c.Write(rb[:])
			}()
			c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = Hello(c, &id.Pub, &id, Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1}, time.Now().Add(5*time.Second))
			if !errors.As(err, &ve) || ve.Peer != int(older) || ve.Ours != Protocol {
				t.Fatalf("dialer: %v, want a VersionError %d/%d", err, older, Protocol)
			}
		})
	}
}
