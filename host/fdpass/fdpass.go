// Package fdpass hands file descriptors to the other processes of a host:
// a Server answers on an abstract unix socket (SOCK_SEQPACKET), and Fetch
// asks it for the descriptors behind a key. The intra-node path uses it
// for device memory (CUDA's cuMem allocations exported as POSIX fds),
// which a peer maps to copy straight into its target's window.
//
// The descriptor itself crosses (SCM_RIGHTS), never a number to look up in
// the other process, so a registration that is gone cannot be mistaken
// for whatever reused its fd: the server looks the key up when asked, and
// answers "no" once it is gone. Only the processes the server allows (by
// the pid the kernel reports for the connection, SO_PEERCRED, and the
// same user) get an answer. Abstract sockets live in the network
// namespace, so processes in different namespaces cannot reach each
// other; they keep the path without it.
package fdpass

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// MaxFds bounds the descriptors of one answer (the kernel's SCM_MAX_FD is
// 253).
const MaxFds = 64

// MaxPayload bounds the bytes of one answer besides its descriptors.
const MaxPayload = 16 << 10

// Serve answers a request for key from process pid: the payload and the
// descriptors (which Server closes once sent), or an error the requester
// receives as "refused".
type Serve func(pid int, key uint64) (payload []byte, fds []int, err error)

// Server is a listening abstract socket.
type Server struct {
	ln    *net.UnixListener
	name  string
	allow func(pid int) bool
	serve Serve
	wg    sync.WaitGroup
}

// answer's first byte: the request was served (then payload and fds follow) or not.
const (
	answerOK      = 1
	answerRefused = 2
)

// requestSize is a request's bytes: the key.
const requestSize = 8

// ioTimeout bounds one request's exchange on either side, so that a peer
// that connects and says nothing holds nobody.
const ioTimeout = 5 * time.Second

// Listen opens the abstract socket name and serves it until Close; allow
// says which processes may ask.
func Listen(name string, allow func(pid int) bool, serve Serve) (*Server, error) {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + name, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen on abstract socket %q: %w", name, err)
	}
	s := &Server{ln: ln, name: name, allow: allow, serve: serve}
	s.wg.Add(1)
	go s.loop()
	return s, nil
}

// Name is the socket's abstract name.
func (s *Server) Name() string { return s.name }

// Close stops serving and waits for the requests in hand.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// maxAnswering bounds the requests answered at once; more wait in the
// kernel's backlog.
const maxAnswering = 16

func (s *Server) loop() {
	defer s.wg.Done()
	busy := make(chan struct{}, maxAnswering)
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of fds, say: try again, slowly
			continue
		}
		// Each request on its own: answering one may ask the asker's
		// server in turn (two ranks setting up with each other at once).
		busy <- struct{}{}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.answer(c)
			c.Close()
			<-busy
		}()
	}
}

// answer serves one connection: one request, one answer.
func (s *Server) answer(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	// The request is read first, whatever the answer: closing a socket
	// with unread data resets it, and the refusal would be lost.
	var req [requestSize + 1]byte
	n, err := c.Read(req[:])
	if err != nil || n != requestSize {
		c.Write([]byte{answerRefused})
		return
	}
	pid, uid, err := peerCred(c)
	if err != nil || uid != os.Getuid() || !s.allow(pid) {
		c.Write([]byte{answerRefused})
		return
	}
	payload, fds, err := s.serve(pid, binary.LittleEndian.Uint64(req[:]))
	defer closeAll(fds)
	if err != nil || len(fds) > MaxFds || len(payload) > MaxPayload {
		c.Write([]byte{answerRefused})
		return
	}
	msg := append([]byte{answerOK}, payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.WriteMsgUnix(msg, oob, nil)
}

func peerCred(c *net.UnixConn) (pid, uid int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, 0, err
	}
	if cerr != nil {
		return 0, 0, cerr
	}
	return int(cred.Pid), int(cred.Uid), nil
}

// ErrRefused: the server answered, and not with descriptors (the key is
// unknown or gone, or we may not ask).
var ErrRefused = errors.New("the peer refused")

// Fetch asks the server at name, which must be process pid of our user,
// for key and returns its payload and descriptors, which the caller
// closes. The kernel says who listens (SO_PEERCRED): a name is only a
// claim, and whoever made it might point us at another process's server.
func Fetch(name string, key uint64, pid int) ([]byte, []int, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: "@" + name, Net: "unixpacket"})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to abstract socket %q: %w", name, err)
	}
	defer c.Close()
	if got, uid, err := peerCred(c); err != nil || got != pid || uid != os.Getuid() {
		return nil, nil, fmt.Errorf("abstract socket %q is served by pid %d (uid %d), not pid %d (%v)", name, got, uid, pid, err)
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	var req [requestSize]byte
	binary.LittleEndian.PutUint64(req[:], key)
	if _, err := c.Write(req[:]); err != nil {
		return nil, nil, fmt.Errorf("ask %q: %w", name, err)
	}
	buf := make([]byte, 1+MaxPayload+1)
	oob := make([]byte, unix.CmsgSpace(4*(MaxFds+1)))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	var fds []int
	if err == nil && oobn > 0 {
		fds, err = rights(oob[:oobn])
	}
	switch {
	case err != nil:
		closeAll(fds)
		return nil, nil, fmt.Errorf("answer of %q: %w", name, err)
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n < 1 || n > 1+MaxPayload || len(fds) > MaxFds:
		closeAll(fds)
		return nil, nil, fmt.Errorf("answer of %q: malformed (%d bytes, %d descriptors, flags %#x)", name, n, len(fds), flags)
	case buf[0] != answerOK:
		closeAll(fds)
		return nil, nil, ErrRefused
	}
	return buf[1:n], fds, nil
}

// rights takes every descriptor out of the control messages.
func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeAll(fds)
			return nil, err
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
