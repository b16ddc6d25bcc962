package handshake

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Optional encryption of a TCP stream (NCCL_RMA_WASM_ENCRYPT). The hello
// exchanges ephemeral X25519 keys under its signatures; both sides derive
// one AES-256-GCM key per direction from the shared secret (HKDF-SHA256,
// salted with the hash of the signed transcript). On the wire a stream is
// then a sequence of records:
//
//	0 length u32 (of what follows: ciphertext and 16-byte tag) | ciphertext | tag
//
// sealed with the 4-byte length as additional data and a 12-byte nonce
// holding the record's number in its last 8 bytes (each direction has its
// own key, so numbers never repeat under one key). A record that fails to
// open, or a length beyond sealRecordMax, ends the stream with a reset.
//
// The data path is left as it is: the stream it is given is one end of a
// loopback TCP pair whose other end a relay owns, two goroutines that seal
// what the data path writes onto the real socket and open what arrives.
// That costs a loopback hop each way, the price of keeping the plaintext
// path (writev from registered memory, reads into it) untouched.

const (
	sealRecordMax = 64 << 10 // plaintext bytes per record
	sealTag       = 16
)

// Keys are one sealed stream's two directions, agreed by the hello.
type Keys struct {
	send, recv cipher.AEAD
}

// deriveSealKeys turns the X25519 secret into the keys of the dialer (or
// of the listener, dialer false): the dialer sends with what the listener
// receives with.
func deriveSealKeys(secret, transcriptHash []byte, dialer bool) (Keys, error) {
	mk := func(info string) (cipher.AEAD, error) {
		k, err := hkdf.Key(sha256.New, secret, transcriptHash, info, 32)
		if err != nil {
			return nil, err
		}
		b, err := aes.NewCipher(k)
		if err != nil {
			return nil, err
		}
		return cipher.NewGCM(b)
	}
	d2l, err := mk("rccl-rma-wasm seal dialer to listener")
	if err != nil {
		return Keys{}, fmt.Errorf("stream keys: %w", err)
	}
	l2d, err := mk("rccl-rma-wasm seal listener to dialer")
	if err != nil {
		return Keys{}, fmt.Errorf("stream keys: %w", err)
	}
	if dialer {
		return Keys{send: d2l, recv: l2d}, nil
	}
	return Keys{send: l2d, recv: d2l}, nil
}

// sealWarn reports records that fail to open (tampering on the path).
var sealWarn logx.Limited

// ResetWarnings gives the rate limit of those WARN lines a full budget, so
// a test (of this package or of one that seals streams) sees its own.
func ResetWarnings() { sealWarn.Reset() }

// Seal returns the connection the data path uses in place of c: what it
// writes leaves c sealed with keys.send, and what arrives on c is opened
// with keys.recv. Closing the returned connection closes c.
func Seal(c *net.TCPConn, keys Keys) (*net.TCPConn, error) {
	inner, outer, err := loopbackPair()
	if err != nil {
		return nil, fmt.Errorf("encrypted stream: %w", err)
	}
	c.SetNoDelay(true)
	outer.SetNoDelay(true)
	go sealUp(outer, c, keys.send)
	go sealDown(c, outer, keys.recv)
	return inner, nil
}

// sealUp seals what the data path writes (read from its loopback end) onto
// the wire. The data path closing its end closes the real stream.
func sealUp(from, to *net.TCPConn, aead cipher.AEAD) {
	plain := make([]byte, sealRecordMax)
	rec := make([]byte, 4+sealRecordMax+sealTag)
	var nonce [12]byte
	var seq uint64
	for {
		n, err := from.Read(plain)
		if n > 0 {
			binary.LittleEndian.PutUint32(rec[0:4], uint32(n+sealTag))
			binary.BigEndian.PutUint64(nonce[4:], seq)
			seq++
			out := aead.Seal(rec[4:4], nonce[:], plain[:n], rec[0:4])
			if _, werr := to.Write(rec[:4+len(out)]); werr != nil {
				// The peer is gone: the data path sees a reset.
				reset(from)
				to.Close()
				return
			}
		}
		if err != nil {
			to.Close()
			from.Close()
			return
		}
	}
}

// sealDown opens the records arriving on the wire and hands the plaintext
// to the data path. An orderly end of the wire ends the data path's stream
// the same way; a broken or tampered one resets it.
func sealDown(from, to *net.TCPConn, aead cipher.AEAD) {
	br := bufio.NewReaderSize(from, 4+sealRecordMax+sealTag)
	rec := make([]byte, sealRecordMax+sealTag)
	plain := make([]byte, 0, sealRecordMax)
	var hdr [4]byte
	var nonce [12]byte
	var seq uint64
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				to.CloseWrite()
			} else {
				reset(to)
			}
			return
		}
		n := binary.LittleEndian.Uint32(hdr[:])
		if n < sealTag || n > sealRecordMax+sealTag {
			sealWarn.Warn(abi.SubsysNet, "NET/wasm: encrypted stream from %s: record of %d bytes; dropping the stream", from.RemoteAddr(), n)
			reset(to)
			from.Close()
			return
		}
		if _, err := io.ReadFull(br, rec[:n]); err != nil {
			reset(to)
			return
		}
		binary.BigEndian.PutUint64(nonce[4:], seq)
		seq++
		out, err := aead.Open(plain[:0], nonce[:], rec[:n], hdr[:])
		if err != nil {
			sealWarn.Warn(abi.SubsysNet, "NET/wasm: encrypted stream from %s: record %d does not authenticate (altered on the way?); dropping the stream", from.RemoteAddr(), seq-1)
			reset(to)
			from.Close()
			return
		}
		if _, err := to.Write(out); err != nil {
			from.Close()
			return
		}
	}
}

// reset closes c so that its peer sees a connection reset, not an orderly
// end: the data path then reports the peer as lost.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// loopbackPair connects two TCP sockets over loopback. The accepted end is
// checked against the dialled one, so no other local process can slip in.
func loopbackPair() (*net.TCPConn, *net.TCPConn, error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	a, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		return nil, nil, err
	}
	ln.SetDeadline(time.Now().Add(5 * time.Second))
	for {
		b, err := ln.AcceptTCP()
		if err != nil {
			a.Close()
			return nil, nil, err
		}
		if b.RemoteAddr().String() == a.LocalAddr().String() {
			return a, b, nil
		}
		b.Close()
	}
}
