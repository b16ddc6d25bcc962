package plugin

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents) - 1 // ReadDir's own descriptor
}

// rssKiB reads this process's resident set.
func rssKiB(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	pages, _ := strconv.Atoi(f[1])
	return pages * os.Getpagesize() / 1024
}

// settle waits (a little) for goroutines that are on their way out.
func settle(limit int) int {
	n := runtime.NumGoroutine()
	for i := 0; i < 200 && n > limit; i++ {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// TestCyclesLeakNothing runs 200 init .. connect .. put .. finalize cycles
// of a two-rank communicator in this process and compares goroutines,
// descriptors and resident memory after the first and the last.
func TestCyclesLeakNothing(t *testing.T) {
	cycles := 200
	if testing.Short() {
		cycles = 20
	}
	var g1, fd1, rss1 int
	for c := 0; c < cycles; c++ {
		t.Run("cycle", func(t *testing.T) {
			rs := setup(t, 2, 1<<16)
			for i := range rs[0].src {
				rs[0].src[i] = byte(i*7 + c)
			}
			req, res := Iput(rs[0].rma, 0, 0, rs[0].srcMh, uint64(len(rs[0].src)), 0, rs[0].dstMh, 1, 0)
			if res != abi.Success {
				t.Fatalf("iput: %v", res)
			}
			if res := wait(t, rs[0].coll, req); res != abi.Success {
				t.Fatalf("put completed with %v", res)
			}
			if !bytes.Equal(rs[1].dst[:len(rs[0].src)], rs[0].src) {
				t.Fatalf("cycle %d: the put's bytes differ at the target", c)
			}
		})
		if t.Failed() {
			return
		}
		if c == 0 {
			runtime.GC()
			g1, fd1, rss1 = settle(0), openFDs(t), rssKiB(t)
		}
	}
	runtime.GC()
	g, fd, rss := settle(g1), openFDs(t), rssKiB(t)
	t.Logf("after cycle 1: %d goroutines, %d fds, %d KiB RSS; after cycle %d: %d, %d, %d KiB", g1, fd1, rss1, cycles, g, fd, rss)
	if g > g1 {
		t.Errorf("goroutines: %d after cycle 1, %d after cycle %d", g1, g, cycles)
	}
	if fd > fd1 {
		t.Errorf("descriptors: %d after cycle 1, %d after cycle %d", fd1, fd, cycles)
	}
	if rss-rss1 > 64<<10 {
		t.Errorf("resident memory grew by %d KiB over %d cycles (bound 64 MiB)", rss-rss1, cycles-1)
	}
}
