//go:build race

package codec

// raceOn: the race detector is on (it makes sync.Pool drop items, so the
// codecs' pooled state allocates under it).
const raceOn = true
