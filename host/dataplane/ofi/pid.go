package ofi

import (
	"errors"
	"fmt"
	"strings"
)

// Posting to a dead shm peer. libfabric 1.17's shm provider takes a
// spinlock inside the peer's shared region on every write and send (1.19
// made its command queues lock-free). A peer killed while holding that
// lock, which it does whenever its own progress runs, leaves it held for
// good, and the next post to it spins inside fi_writemsg forever: the
// caller's iput never returns (the soak's kill-put faults hung one run in
// six). So before each post to an shm peer we ask a pidfd of its process
// whether it exited (host/procid: one poll(2) with a zero timeout, about half a
// microsecond, shm only): a dead peer is failed instead of posted to. What
// is left is the sub-microsecond window between that check and the lock.

// errPeerExited fails a post to a peer whose process is gone.
var errPeerExited = errors.New("its process exited (the shm provider cannot reach a dead process)")

// watchPid arms the check for a peer on the same host reached through
// shm; a kernel without pidfds (before 5.3) leaves it unarmed.
func (f *Link) watchPid(pid int) {
	if strings.HasPrefix(f.e.Info.Provider, "shm") {
		f.pid.Open(pid)
	}
}

// peerGone fails the peer when its process exited; posts call it first.
func (f *Link) peerGone() error {
	if !f.pid.Exited() {
		return nil
	}
	return fmt.Errorf("rank %d: %w", f.Peer().Rank(), errPeerExited)
}

// Stop also closes the pidfd (posts after Stop fail on the dead flag
// before they would check it).
func (f *Link) Stop() {
	f.Link.Stop()
	f.pid.Close()
}
