package shmstream_test

import (
	"fmt"
	"os"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
)

type live struct{}

func (live) Gone() bool { return false }

type bell struct{}

func (bell) Ring() { fmt.Println("bell: the reader was asleep") }

// A writer makes the ring and offers its memfd number and size; the reader
// (here the same process, usually its peer on the host) maps it. Bytes
// written are read in order, and a reader that said it sleeps is rung.
func Example() {
	w, err := shmstream.New(shmstream.MinSize)
	if err != nil {
		panic(err)
	}
	defer w.Close()
	fd, size := w.Offer()
	r, err := shmstream.Attach(os.Getpid(), fd, size)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	r.SetAttached()

	w.Write([][]byte{[]byte("header|"), []byte("payload")}, bell{}, live{})
	buf := make([]byte, 64)
	n, _ := r.Read(buf)
	fmt.Printf("read %q\n", buf[:n])

	if r.Sleep() { // nothing left: the reader may sleep
		w.Write([][]byte{[]byte("more")}, bell{}, live{})
	}
	r.Awake()
	n, _ = r.Read(buf)
	fmt.Printf("read %q\n", buf[:n])
	// Output:
	// read "header|payload"
	// bell: the reader was asleep
	// read "more"
}
