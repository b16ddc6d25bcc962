package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"text/tabwriter"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
)

// The compression series (Guest ABI v1.1 codecs on the TCP transport): put
// bandwidth of the plugin with S2 and with zstd level 1, on compressible and
// on random data, next to the uncompressed plugin path and raw TCP in the
// same repetition, and the codec's own encode and decode speed on the same
// bytes (codec.Measure runs the lanes' code).

// compSizes are the put sizes of the compression series.
var compSizes = []uint64{64 << 10, 1 << 20, 8 << 20}

// The source halves: compressible data at 0, random data at compSpan.
const compSpan = bufSize / 2

var compData = []struct {
	name string
	base uint64
}{{"compressible", 0}, {"random", compSpan}}

var compCodecs = []struct {
	name string
	ci   int
	word uint32
}{{"s2", commS2, guestabi.Codec(guestabi.CodecS2, 0)}, {"zstd1", commZstd, guestabi.Codec(guestabi.CodecZstd, 1)}}

// fillCompressionData writes the two halves of rank 0's source: log-like
// text (words from a small vocabulary, numbers, newlines; ~3-5x with the
// codecs here) and random bytes. Rank 1's buffers are never compressed.
func (r *rankState) fillCompressionData() {
	if r.rank != 0 {
		return
	}
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"rank", "put", "signal", "ok", "lane", "peer", "bytes", "latency", "queue", "context", "flush", "wait"}
	b := r.src[:compSpan]
	for i := 0; i < len(b); {
		w := words[rng.IntN(len(words))]
		switch rng.IntN(4) {
		case 0:
			w = fmt.Sprintf("%d", rng.IntN(100000))
		case 1:
			w += "="
		}
		i += copy(b[i:], w)
		if i < len(b) {
			if rng.IntN(10) == 0 {
				b[i] = '\n'
			} else {
				b[i] = ' '
			}
			i++
		}
	}
	rc := rand.NewChaCha8([32]byte{7})
	_, _ = rc.Read(r.src[compSpan:])
}

// compCount is how many puts of size one point moves (64 MiB, 32 quick).
func (r *rankState) compCount(size uint64) uint64 {
	total := uint64(64 << 20)
	if r.opt.quick {
		total = 32 << 20
	}
	return max(total/size, 4)
}

// compression runs one repetition of every compression point.
func (r *rankState) compression(set *sampleSet, rep int) error {
	ok := r.comms[commTCP].ok
	for _, c := range compCodecs {
		ok = ok && r.comms[c.ci].ok
	}
	if !ok {
		return nil // the notes say which communicator is missing
	}
	defer func() { r.srcBase, r.span = 0, bufSize }()
	for _, size := range compSizes {
		n := r.compCount(size)
		d, err := r.rawTCPBW(size, n)
		if err != nil {
			return err
		}
		set.add("comp_bw", "raw-tcp", size, "GB/s", gbps(n*size, d))
		for _, data := range compData {
			r.srcBase, r.span = data.base, compSpan
			series := []struct {
				name string
				ci   int
			}{{"plugin-tcp", commTCP}, {"plugin-tcp-s2", commS2}, {"plugin-tcp-zstd1", commZstd}}
			for j := range series {
				s := series[(j+rep)%len(series)]
				d, _, _, err := r.plugBW(s.ci, size, n, false)
				if err != nil {
					return fmt.Errorf("%s %s %d B: %w", s.name, data.name, size, err)
				}
				set.add("comp_bw", s.name+"/"+data.name, size, "GB/s", gbps(n*size, d))
			}
			// The codec alone, on the bytes the puts just sent.
			src := r.src[data.base : data.base+size]
			for _, c := range compCodecs {
				rounds := int(max(uint64(16<<20)/uint64(len(src)), 1))
				enc, dec, wire, err := codec.Measure(c.word, src, rounds)
				if err != nil {
					return fmt.Errorf("%s on %s data: %w", c.name, data.name, err)
				}
				raw := uint64(len(src)) * uint64(rounds)
				set.add("codec_enc", c.name+"/"+data.name, size, "GB/s", gbps(raw, enc))
				set.add("codec_dec", c.name+"/"+data.name, size, "GB/s", gbps(raw, dec))
				set.add("codec_ratio", c.name+"/"+data.name, size, "x", float64(len(src))/float64(wire))
			}
		}
	}
	return nil
}

// printCompression adds the compression table: put GB/s of each path and
// its ratio to the uncompressed plugin path, then the codec's own speed
// and ratio on the same bytes.
func (r *report) printCompression(w io.Writer) {
	if r.find("comp_bw", "raw-tcp", compSizes[0]) == nil {
		return
	}
	fmt.Fprintf(w, "\nput GB/s with wire compression (TCP, 1 lane): raw TCP, the plugin uncompressed, with S2 and with zstd level 1\n")
	fmt.Fprintf(w, "(xN = ratio to the uncompressed plugin path in the same repetition); codec GB/s of raw bytes, one core, same data\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\tsize\tdata\traw-tcp\tplugin\ts2\t\tzstd1\t\ts2 enc\ts2 dec\ts2 ratio\tzstd1 enc\tzstd1 dec\tzstd1 ratio\t\n")
	for _, size := range compSizes {
		raw, rawOK := r.med("comp_bw", "raw-tcp", size)
		for _, d := range compData {
			p, pok := r.med("comp_bw", "plugin-tcp/"+d.name, size)
			line := fmt.Sprintf("\t%s\t%s\t%s\t%s", sizeName(size), d.name, f(raw, rawOK, 3), f(p, pok, 3))
			for _, c := range []string{"s2", "zstd1"} {
				v, ok := r.med("comp_bw", "plugin-tcp-"+c+"/"+d.name, size)
				x, xok := r.ratio("comp_bw", "plugin-tcp-"+c+"/"+d.name, "plugin-tcp/"+d.name, size)
				line += fmt.Sprintf("\t%s\tx%s", f(v, ok, 3), f(x, xok, 2))
			}
			for _, c := range []string{"s2", "zstd1"} {
				e, eok := r.med("codec_enc", c+"/"+d.name, size)
				dd, dok := r.med("codec_dec", c+"/"+d.name, size)
				q, qok := r.med("codec_ratio", c+"/"+d.name, size)
				line += fmt.Sprintf("\t%s\t%s\t%s", f(e, eok, 2), f(dd, dok, 2), f(q, qok, 2))
			}
			fmt.Fprintf(tw, "%s\t\n", line)
		}
	}
	tw.Flush()
}
