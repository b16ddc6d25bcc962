package handshake

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
)

// BenchmarkHelloCrypto is the CPU one side of one stream's hello spends
// on cryptography: it signs one transcript and verifies the other side's
// (plain), plus an ephemeral X25519 key and one agreement (encrypt). A
// rank pays it twice per peer and lane (the stream it dials and the one
// it accepts); SPEC.md "Limits up to 4,096 ranks" compares it with the
// measured connect CPU.
func BenchmarkHelloCrypto(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	msg := make([]byte, transcriptSize)
	sig := ed25519.Sign(priv, msg)
	peer, _ := ecdh.X25519().GenerateKey(rand.Reader)
	for _, encrypt := range []bool{false, true} {
		name := "plain"
		if encrypt {
			name = "encrypt"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				ed25519.Sign(priv, msg)
				if !ed25519.Verify(pub, msg, sig) {
					b.Fatal("verify")
				}
				if encrypt {
					k, err := ecdh.X25519().GenerateKey(rand.Reader)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := k.ECDH(peer.PublicKey()); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
