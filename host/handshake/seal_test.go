package handshake

import (
	"bytes"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestSealStreamBytes drives a sealed pair directly: random writes both
// ways arrive byte-exact, and closing one side ends the other in order.
func TestSealStreamBytes(t *testing.T) {
	a, b, err := loopbackPair()
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte{7}, 32)
	ka, _ := deriveSealKeys(secret, []byte("t"), true)
	kb, _ := deriveSealKeys(secret, []byte("t"), false)
	sa, err := Seal(a, ka)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := Seal(b, kb)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	msg := make([]byte, 1<<20+17)
	for i := range msg {
		msg[i] = byte(rng.Uint32())
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for off := 0; off < len(msg); {
			n := min(1+rng.IntN(200<<10), len(msg)-off)
			sa.Write(msg[off : off+n])
			off += n
		}
		sa.Close()
	}()
	back, err := io.ReadAll(sb)
	wg.Wait()
	if err != nil || !bytes.Equal(back, msg) {
		t.Fatalf("sealed stream: %d of %d bytes, equal %v, err %v", len(back), len(msg), bytes.Equal(back, msg), err)
	}
	sb.Close()
}
