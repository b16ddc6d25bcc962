package dataplane

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/multierr"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// connectStreams opens the TCP streams of the mesh: lane 0 dialled to
// every rank's listener (outs[rank][0], ours included) and the one every
// rank dialled to us (ins[rank][0]), all with TCP_NODELAY; the other
// lanes' slots stay nil until they open (lazy.go). It
// returns when all are up or when the deadline passes. Every stream is
// authenticated both ways (host/handshake): a connection that cannot prove the
// rank it claims never gets here, so it cannot disturb the connect; two
// proven connections for one rank and lane are an error.
// noFab is sent in every hello; peerNoFab reports what each rank sent.
// With encrypt every stream is sealed (host/handshake), ours and the ones we take.
// want names the ranks to connect (peerSet); the others' slots stay nil.
func connectStreams(l *Listener, infos []wire.HandleInfo, want []bool, rank, lanes int, noFab, encrypt bool, deadline time.Time, timeout time.Duration) (outs, ins [][]*net.TCPConn, peerNoFab []bool, err error) {
	n := len(infos)
	// Connections that proved a claim wait for these keys to be checked.
	l.setPeers(infos, encrypt)
	outs = make([][]*net.TCPConn, n)
	errs := make([]error, n*lanes)
	// A peer of another build (wire protocol) never connects either: stop
	// waiting at once, the dial's error says why.
	verFail := make(chan struct{}, 1)
	stopped := false
	var wg sync.WaitGroup
	for i := range infos {
		if !want[i] {
			continue
		}
		// Lane 0 only: the others open when first used (lazy.go).
		outs[i] = make([]*net.TCPConn, lanes)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			outs[i][0], errs[i*lanes] = dial(infos[i], &l.id, handshake.Claim{Rank: rank, NRanks: n, Lane: 0, Lanes: lanes, NoFabric: noFab, Encrypt: encrypt}, deadline)
			var ve *handshake.VersionError
			if errors.As(errs[i*lanes], &ve) {
				select {
				case verFail <- struct{}{}:
				default:
				}
			}
		}(i)
	}
	// Every rank opens lane 0 now; a further lane that a fast peer
	// already uses is taken too (later ones reach Mesh.lateLanes).
	ins = make([][]*net.TCPConn, n)
	peerNoFab = make([]bool, n)
	need, got := 0, 0
	for _, w := range want {
		if w {
			need++
		}
	}
	var acceptErr error
	timer := time.NewTimer(time.Until(deadline))
	for got < need && acceptErr == nil && !stopped {
		select {
		case <-verFail:
			stopped = true
		case in := <-l.conns:
			switch {
			case in.NRanks != n || in.Rank < 0 || in.Rank >= n:
				acceptErr = fmt.Errorf("peer announced rank %d of %d, expected a rank of %d", in.Rank, in.NRanks, n)
				in.conn.Close()
			case !want[in.Rank]:
				acceptErr = fmt.Errorf("rank %d connected, which is not among this rank's peers", in.Rank)
				in.conn.Close()
			case in.Lanes < 1 || in.Lanes > abi.MaxLanes || in.Lane >= in.Lanes || (ins[in.Rank] != nil && len(ins[in.Rank]) != in.Lanes):
				acceptErr = fmt.Errorf("rank %d announced lane %d of %d", in.Rank, in.Lane, in.Lanes)
				in.conn.Close()
			default:
				if ins[in.Rank] == nil {
					ins[in.Rank] = make([]*net.TCPConn, in.Lanes)
				}
				if ins[in.Rank][in.Lane] != nil {
					acceptErr = fmt.Errorf("two connections claim rank %d lane %d", in.Rank, in.Lane)
					in.conn.Close()
					break
				}
				ins[in.Rank][in.Lane] = in.conn
				peerNoFab[in.Rank] = peerNoFab[in.Rank] || in.NoFabric
				if in.Lane == 0 {
					got++
				}
			}
		case <-timer.C:
			missing := []int{}
			for r := range ins {
				if want[r] && (ins[r] == nil || ins[r][0] == nil) {
					missing = append(missing, r)
				}
			}
			acceptErr = fmt.Errorf("timed out after %v with %d of %d streams connected to us (no connection at all from ranks %v)", timeout, got, need, missing)
		}
	}
	timer.Stop()
	wg.Wait()
	for i, e := range errs {
		if e != nil {
			err = multierr.Append(err, fmt.Errorf("connect to rank %d lane %d at %s: %w", i/lanes, i%lanes, infos[i/lanes].Addr, e))
		}
	}
	err = multierr.Append(err, acceptErr)
	if err != nil {
		for i := range outs {
			for _, c := range append(outs[i], ins[i]...) {
				if c != nil {
					c.Close()
				}
			}
		}
		return nil, nil, nil, err
	}
	for i := 0; i < n; i++ {
		for _, c := range append(outs[i], ins[i]...) {
			if c != nil {
				c.SetNoDelay(true)
			}
		}
	}
	return outs, ins, peerNoFab, nil
}
