package share

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fdpass"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The peer inbox's hand-over (host/devmem/inbox;
// NCCL_RMA_WASM_INTRANODE_INBOX). After the first mapping of a peer's
// registration, a rank asks the peer's server for a row of its inbox (key
// 5<<32 | afresh<<48 | our context's slot<<40 | its rank: answered only to
// that rank's process, once per communicator) and maps the peer's mark
// page, whose second half counts the entries the peer's agent took; the
// rows are mapped into the context of our registration, whose agent then
// writes our entries. A process's communicators with the peer share the
// row (inbox.Attach): the rows are mapped once. Host rows
// (NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS) come as a memfd (segInboxHost),
// mapped after its size and seals are checked, and pinned here.

// maxInboxBytes bounds the rows' allocation a peer may hand us.
const maxInboxBytes = 1 << 30

// openInbox asks rank r (process pid, server tok) for a row of its inbox,
// once per peer, and keeps it on the link: any failure leaves our signals
// to r on the other paths (an INFO line, once).
func (x *Exchange) openInbox(m Local, tok uint64, r, pid int) {
	if x.inbox == nil || !x.inbox() || !staging.AgentRuns(m.Ctx) {
		return
	}
	x.mu.Lock()
	if x.asked == nil {
		x.asked = map[int]bool{}
	}
	again := x.asked[r]
	x.asked[r] = true
	x.mu.Unlock()
	if again {
		return
	}
	err := x.fetchInbox(m, tok, r, pid)
	first := x.first(&x.ibSaid)
	if err != nil {
		if first {
			logx.Info(abi.SubsysReg, "NET/wasm: rank %d: signals to rank %d do not go through its peer inbox: %v", x.rank, r, err)
		}
		return
	}
	if first {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: signals to rank %d go through its peer inbox: its device agent adds them, no host on the way", x.rank, r)
	}
}

// fetchInbox maps r's mark page (unless it is already) and r's inbox row.
func (x *Exchange) fetchInbox(m Local, tok uint64, r, pid int) error {
	pm := x.ipc.PeerMarks(r)
	if pm == nil {
		if err := x.mapPeerMarks(tok, r, pid); err != nil {
			return fmt.Errorf("its mark page: %w", err)
		}
		if pm = x.ipc.PeerMarks(r); pm == nil {
			return errors.New("its mark page is not mapped here")
		}
	}
	var fds []int
	defer func() { closeFds(fds) }()
	none := devmem.Segment{Fd: -1}
	p, err := inbox.Attach(m.Ctx, pid, pm, func(slot int, fresh bool) (int, devmem.Segment, int, devmem.Segment, error) {
		key := keyInboxRow | uint64(slot)<<keyRankShift | uint64(x.rank)
		if fresh {
			key |= 1 << 48
		}
		var payload []byte
		var err error
		payload, fds, err = fdpass.Fetch(shareName(pid, tok), key, pid)
		if err != nil {
			return 0, none, 0, none, err
		}
		var kind uint32
		if len(payload) >= 24 {
			kind = binary.LittleEndian.Uint32(payload[4:])
		}
		host := kind == segInboxHost
		want, nfds := 24, 1
		if host {
			want, nfds = 32, 2 // the host rows' size and memfd too
		}
		if len(payload) != want || binary.LittleEndian.Uint32(payload) != 1 || (kind != segInbox && !host) || len(fds) != nfds {
			return 0, none, 0, none, fmt.Errorf("malformed inbox row from rank %d", r)
		}
		row, entries := int(binary.LittleEndian.Uint32(payload[8:])), int(binary.LittleEndian.Uint32(payload[12:]))
		size := binary.LittleEndian.Uint64(payload[16:])
		if size == 0 || size > maxInboxBytes {
			return 0, none, 0, none, fmt.Errorf("an inbox of %d bytes from rank %d", size, r)
		}
		hseg := none
		if host {
			hseg = devmem.Segment{Fd: fds[1], Size: binary.LittleEndian.Uint64(payload[24:])}
		}
		return row, devmem.Segment{Fd: fds[0], Size: size}, entries, hseg, nil
	})
	if err != nil {
		return err
	}
	if !x.ipc.SetPeerInbox(r, p) {
		return errors.New("its link is closed, or has a row already")
	}
	return nil
}

// serveInboxRow hands the intra-node peer pid (rank r) the row of our
// inbox for its context slot (afresh: it maps none of our rows from that
// context), once per communicator: the row, its entries, and an fd of the
// rows' allocation, which the server closes once sent.
func (x *Exchange) serveInboxRow(pid, r, slot int, fresh bool) ([]byte, []int, error) {
	if r < 0 || r >= x.nranks || x.ipc.Pid(r) != pid {
		return nil, nil, errors.New("no such peer")
	}
	x.mu.Lock()
	if x.rows == nil {
		x.rows = map[int]bool{}
	}
	again := x.rows[r]
	x.rows[r] = true
	x.mu.Unlock()
	if again {
		return nil, nil, errors.New("a row was handed out already")
	}
	row, seg, entries, err := inbox.Row(pid, slot, fresh)
	if err != nil {
		return nil, nil, err
	}
	x.ipc.SetInboxRow(r, row)
	payload := binary.LittleEndian.AppendUint32(nil, 1)
	hfd, hsize, err := inbox.HostRowsFd()
	if err != nil {
		closeFds([]int{seg.Fd})
		return nil, nil, err
	}
	kind := uint32(segInbox)
	if hfd >= 0 {
		kind = segInboxHost
	}
	payload = binary.LittleEndian.AppendUint32(payload, kind)
	payload = binary.LittleEndian.AppendUint32(payload, uint32(row))
	payload = binary.LittleEndian.AppendUint32(payload, uint32(entries))
	payload = binary.LittleEndian.AppendUint64(payload, seg.Size)
	if hfd < 0 {
		return payload, []int{seg.Fd}, nil
	}
	payload = binary.LittleEndian.AppendUint64(payload, hsize)
	return payload, []int{seg.Fd, hfd}, nil
}
