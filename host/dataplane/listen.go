package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake/admission"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/procid"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Bounds on what a stranger (a connection that has not authenticated yet)
// can hold. Variables so tests can shrink them.
var (
	// helloTimeout bounds, from accept, the wait for the messages a dialer
	// sends without waiting on anything but us: a complete, well-formed
	// hello and its proof. A dialer needs milliseconds; a stranger that
	// sends less is closed (a real dialer whose connection is dropped
	// dials again until its connect deadline). 1.5 s so that the promise
	// "closed within 2 s of accept" holds with room for scheduling.
	helloTimeout = 1500 * time.Millisecond
	// keyWaitTimeout bounds, from accept, the wait of a proven-looking
	// connection for connect to name the peers (peerKey): a hello may
	// arrive before this rank's own connect starts, which depends on the
	// caller, not on the dialer.
	keyWaitTimeout = 10 * time.Second
	// maxStrangers caps the unauthenticated connections of one listener;
	// further ones are closed at accept (a real dialer retries).
	maxStrangers = int32(1024)
	// maxStrangersPerAddr caps those of one source (admission.Source),
	// so that one host cannot fill the listener: it holds at most a
	// quarter.
	maxStrangersPerAddr = int32(256)
	// acceptBackoffMax is the longest pause after a failed accept.
	acceptBackoffMax = time.Second
)

// acceptWarn rate-limits the lines about accept failures (EMFILE,
// ENFILE, ...); those a stranger can cause go through admission.Warn.
var acceptWarn logx.Limited

// incoming is an authenticated connection from a peer rank.
type incoming struct {
	conn *net.TCPConn
	handshake.Claim
}

// Listener accepts peer connections for one future collComm. A dialer is
// admitted once it proved, by signing this listener's fresh nonce, that it
// holds the private key of the rank it claims (host/handshake); the public keys
// come from the handles connect receives.
type Listener struct {
	ln      *net.TCPListener
	info    wire.HandleInfo
	id      handshake.Identity
	conns   chan incoming
	closeMu sync.Mutex
	closed  bool
	done    chan struct{} // closed when the accept loop ends
	quit    chan struct{} // closed by Close

	peersMu    sync.Mutex
	peers      []wire.HandleInfo // every rank's handle, from connect
	encrypt    bool              // this rank requires sealed streams (from connect)
	peersKnown chan struct{}     // closed once peers is set

	// gate counts the connections accepted and not yet authenticated or
	// dropped, capped per listener and per source.
	gate admission.Gate
	fab  *ofi.EP // libfabric endpoint (ListenOptions.Provider), until a Mesh takes it
	// The provider and the NICs (domains) of further rails: Connect opens
	// endpoints on as many as the plan has lanes (host/dataplane/ofi's rails.go).
	prov  string
	rails []string
}

// ListenOptions say where a listener listens and which libfabric
// endpoint it opens.
type ListenOptions struct {
	// Addr is "ip", "ip:port" or an interface name; empty picks an address.
	Addr string
	// Provider is the libfabric provider of the endpoint (nics.Select's
	// choice), empty for none. An endpoint that cannot open is logged and
	// the listener stays TCP-only.
	Provider string
	// Domain is the endpoint's domain (one NIC, nics.List); "" takes the
	// provider's first.
	Domain string
	// Rails are the domains of further rails: a communicator with lanes > 1
	// stripes large operations over endpoints on up to lanes of Domain,
	// Rails[0], Rails[1], ... (host/dataplane/ofi's rails.go).
	Rails []string
}

// Listen opens a listener and returns it with the handle to all-gather;
// the libfabric endpoint's address, when it has one, rides the handle.
func Listen(opt ListenOptions) (*Listener, *wire.Handle, error) {
	addr, prov, domain, rails := opt.Addr, opt.Provider, opt.Domain, opt.Rails
	laddr, err := nics.ListenAddr(addr)
	if err != nil {
		return nil, nil, err
	}
	id, err := handshake.NewIdentity()
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.ListenTCP("tcp", laddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", laddr, err)
	}
	l := &Listener{ln: ln, id: id, conns: make(chan incoming, 1024), done: make(chan struct{}), quit: make(chan struct{}),
		peersKnown: make(chan struct{})}
	l.info.Addr = ln.Addr().(*net.TCPAddr)
	l.gate.Name, l.gate.Max, l.gate.PerSource = l.info.Addr.String(), maxStrangers, maxStrangersPerAddr
	l.info.Key = id.Pub
	l.info.HostID = procid.HostID()
	l.info.Pid = uint32(os.Getpid())
	l.info.UID = uint32(os.Getuid())
	if prov != "" {
		fab, err := ofi.Open(prov, domain)
		if err != nil {
			logx.Warn(abi.SubsysNet|abi.SubsysInit, "NET/wasm: fabric endpoint on %s: %v; this communicator uses TCP", prov, err)
		} else {
			l.fab = fab
			l.info.FabricHash, l.info.FabricName = fab.Hash, fab.Name
			l.prov, l.rails = prov, rails
		}
	}
	var h wire.Handle
	l.info.Encode(&h)
	go l.acceptLoop()
	return l, &h, nil
}

// Addr is the address peers dial.
func (l *Listener) Addr() *net.TCPAddr { return l.info.Addr }

// acceptLoop runs until the listener is closed. Any other accept error
// (EMFILE, ENFILE, ENOBUFS, ECONNABORTED, ...) is a shortage the process
// recovers from: it pauses, 5 ms doubling to acceptBackoffMax, and goes on.
func (l *Listener) acceptLoop() {
	defer close(l.done)
	var backoff time.Duration
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), acceptBackoffMax)
			acceptWarn.Warn(abi.SubsysNet, "NET/wasm: accept on %s: %v; retrying in %v", l.info.Addr, err, backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-l.quit:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		src, ok := l.gate.Admit(c.RemoteAddr(), c.LocalAddr())
		if !ok {
			c.Close()
			continue
		}
		go l.admit(c, src)
	}
}

// setPeers gives the listener every rank's handle (connect calls it first),
// so the connections that wait for their claim to be checked can be.
// With encrypt, a dialer that does not seal its stream is refused.
func (l *Listener) setPeers(infos []wire.HandleInfo, encrypt bool) {
	l.peersMu.Lock()
	defer l.peersMu.Unlock()
	if l.peers == nil {
		l.peers, l.encrypt = infos, encrypt
		close(l.peersKnown)
	}
}

// peerKey returns the public key of the rank a claim names once connect
// named the peers (waiting at most until deadline, keyWaitTimeout after
// accept, not the hello's bound), and whether this rank
// requires sealed streams; an error if the claim names no such rank or the
// wait ended.
func (l *Listener) peerKey(c handshake.Claim, deadline time.Time) (*[wire.KeySize]byte, bool, error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-l.peersKnown:
	case <-l.quit:
		return nil, false, errors.New("the listener closed")
	case <-t.C:
		return nil, false, fmt.Errorf("connect did not start within %v of the connection", keyWaitTimeout)
	}
	l.peersMu.Lock()
	peers, encrypt := l.peers, l.encrypt
	l.peersMu.Unlock()
	if c.NRanks != len(peers) {
		return nil, false, fmt.Errorf("it claims rank %d of %d; this communicator has %d ranks", c.Rank, c.NRanks, len(peers))
	}
	return &peers[c.Rank].Key, encrypt, nil
}

// admit authenticates a dialer before its connection reaches connect. Every
// way out but success closes the connection; the rejections a stranger can
// provoke log through the rate-limited admission.Warn.
func (l *Listener) admit(c *net.TCPConn, src netip.Addr) {
	defer l.gate.Leave(src)
	// The hello and the proof get helloTimeout (Authenticate sets it);
	// only then may the connection wait for connect, up to its own bound,
	// which also covers the ack.
	keyDeadline := time.Now().Add(keyWaitTimeout)
	cl, keys, err := handshake.Authenticate(c, &l.id, func(cl handshake.Claim) (*[wire.KeySize]byte, bool, error) {
		c.SetDeadline(keyDeadline)
		return l.peerKey(cl, keyDeadline)
	}, helloTimeout)
	if err != nil {
		if !errors.Is(err, handshake.ErrSilent) {
			admission.Warn.Warn(abi.SubsysNet, "NET/wasm: rejected connection from %s to %s: %v", c.RemoteAddr(), l.info.Addr, err)
		}
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	if keys != nil {
		sealed, err := handshake.Seal(c, *keys)
		if err != nil {
			logx.Warn(abi.SubsysNet, "NET/wasm: connection of rank %d lane %d: %v", cl.Rank, cl.Lane, err)
			c.Close()
			return
		}
		c = sealed
	}
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.closed {
		c.Close()
		return
	}
	select {
	case l.conns <- incoming{conn: c, Claim: cl}:
	default:
		admission.Warn.Warn(abi.SubsysNet, "NET/wasm: too many pending connections on %s, dropping one from %s", l.info.Addr, c.RemoteAddr())
		c.Close()
	}
}

// Close stops accepting and closes connections no collComm took.
func (l *Listener) Close() error {
	l.closeMu.Lock()
	if l.closed {
		l.closeMu.Unlock()
		return nil
	}
	l.closed = true
	close(l.quit)
	fab := l.fab
	l.fab = nil
	l.closeMu.Unlock()
	if fab != nil {
		fab.Discard()
	}
	err := l.ln.Close()
	for {
		select {
		case in := <-l.conns:
			in.conn.Close()
		default:
			return err
		}
	}
}

// dial opens an authenticated connection to a peer's listener, retrying
// until deadline.
func dial(peer wire.HandleInfo, id *handshake.Identity, cl handshake.Claim, deadline time.Time) (*net.TCPConn, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	return dialCtx(ctx, &peer, id, cl)
}

// dialCtx is dial until ctx ends: its deadline bounds each hello, and
// ending it closes a connection in its hello (a lazy lane's dial is cut
// short so when its peer dies).
func dialCtx(ctx context.Context, peer *wire.HandleInfo, id *handshake.Identity, cl handshake.Claim) (*net.TCPConn, error) {
	deadline, _ := ctx.Deadline()
	var lastErr error
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", peer.Addr.String())
		if err == nil {
			tc := c.(*net.TCPConn)
			unwatch := context.AfterFunc(ctx, func() { tc.Close() })
			keys, herr := handshake.Hello(tc, &peer.Key, id, cl, deadline)
			if unwatch() && herr == nil {
				return sealIf(tc, keys)
			}
			tc.Close()
			err = herr
			var ve *handshake.VersionError
			if errors.As(herr, &ve) {
				return nil, herr // another build: no retry makes it speak ours
			}
		}
		lastErr = err
		if ctx.Err() != nil {
			if lastErr == nil || errors.Is(lastErr, net.ErrClosed) {
				lastErr = ctx.Err()
			}
			return nil, lastErr
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// sealIf returns tc when the hello agreed no keys, else the sealed stream
// (NCCL_RMA_WASM_ENCRYPT); tc is closed when sealing fails.
func sealIf(tc *net.TCPConn, keys *handshake.Keys) (*net.TCPConn, error) {
	if keys == nil {
		return tc, nil
	}
	sealed, err := handshake.Seal(tc, *keys)
	if err != nil {
		tc.Close()
		return nil, err
	}
	return sealed, nil
}

// Prewarm resolves the listen address and the host id in the background, so
// that the first listen of a process does not pay for them after init.
func Prewarm(addr string) {
	go func() {
		nics.ListenAddr(addr)
		procid.HostID()
	}()
}

// fabric is the listener's endpoint, if any.
func (l *Listener) fabric() *ofi.EP {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	return l.fab
}

// takeFabric hands the endpoint to the mesh that connected.
func (l *Listener) takeFabric() *ofi.EP {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	f := l.fab
	l.fab = nil
	return f
}

// dropFabric closes the endpoint before connecting over TCP only.
func (l *Listener) dropFabric() {
	if f := l.takeFabric(); f != nil {
		f.Discard()
	}
}

// FabricDeviceMemory says how device memory moves over the listener's
// fabric endpoint: "FI_HMEM" (registered with the provider; "FI_HMEM,
// dmabuf" where the library takes DMA-BUFs) or "staged"; "" without one.
func (l *Listener) FabricDeviceMemory() string {
	f := l.fabric()
	switch {
	case f == nil:
		return ""
	case !f.Info.HMEM:
		return "staged"
	case f.Info.API >= fabric.APIDMABUF:
		return "FI_HMEM, dmabuf"
	}
	return "FI_HMEM"
}

// FabricDomain names the libfabric domain (NIC) of the listener's
// endpoint, "" when it has none.
func (l *Listener) FabricDomain() string {
	if f := l.fabric(); f != nil {
		return f.Info.Domain
	}
	return ""
}
