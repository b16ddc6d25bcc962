// Package codectest holds the data and guarded registrations of the
// codec's tests (host/codec, host/dataplane). Only tests import it.
package codectest

import "math/rand/v2"

// CompressibleData is text-like: a small alphabet in runs.
func CompressibleData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := 0; i < n; {
		c, k := byte('a'+r.IntN(6)), 1+r.IntN(40)
		for j := 0; j < k && i < n; j++ {
			b[i] = c
			i++
		}
	}
	return b
}

// Guarded returns a registration of n bytes with 4 KiB of guard bytes on
// each side, and a check that the guards are untouched.
func Guarded(n int) (whole, mem []byte, intact func() bool) {
	whole = make([]byte, n+8192)
	for i := range whole {
		whole[i] = 0xa5
	}
	mem = whole[4096 : 4096+n : 4096+n]
	clear(mem)
	return whole, mem, func() bool {
		for _, b := range whole[:4096] {
			if b != 0xa5 {
				return false
			}
		}
		for _, b := range whole[4096+n:] {
			if b != 0xa5 {
				return false
			}
		}
		return true
	}
}
