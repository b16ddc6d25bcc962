package link

import "io"

// Transport moves operations between this rank and one peer. The peer
// calls it from many threads at once; every method but Stop must be cheap,
// take no global lock and allocate nothing on the per-operation path.
type Transport interface {
	// Props reports what the transport can do. It may change while the
	// link runs (the intra-node path turns itself off on a refusal).
	Props() Props

	// Start launches what runs on its own: senders, completion readers,
	// and the service that lands the peer's puts, applies its signals and
	// answers its gets on our memory with no call from this process.
	Start()

	// Submit queues op on lane (0..Props.Lanes-1): a put, put with signal
	// or get (op.Msg), a registration notice (MsgReg) or a goodbye
	// (wire.MsgBye). It never blocks on the network and never fails for lack of
	// space. hold keeps op until the next flush or kick (aggregation). Once
	// stop ran, op is failed through peer.fail instead. op is passed by
	// value: a pointer through an interface call escapes, and posting
	// must not allocate.
	Submit(lane int, op Op, hold bool)
	// SubmitCaller is submit for an operation the caller posts itself
	// (peer.route). true: a transport would send it at once on the
	// caller's thread (tcpLink's lone signal), which the caller does with
	// WriteLone once it holds no lock.
	SubmitCaller(lane int, op Op, hold bool) bool
	// WriteLone writes lane's queue on the caller's thread after
	// SubmitCaller said so, unless the lane has work in flight by now.
	WriteLone(lane int)
	// Flush sends queued work from the caller's thread when that is cheap
	// (test() calls it); otherwise the transport's own goroutines do.
	Flush()
	// Turn is flush for rmaProgress (Mesh.Progress), once per Turn of
	// a caller's loop: a TCP stream is looked at on every call, without
	// test()'s gap, and a libfabric endpoint was just polled.
	Turn()
	// Kick wakes the senders, so held operations leave now.
	Kick()
	// Idle reports that every submitted operation completed: nothing
	// queued or being sent, no reply or arrival acknowledgement awaited.
	Idle() bool

	// Stop raises the peer's dead flag so that submit fails every later
	// op (under the queue locks, so none slips in between) and closes the
	// connections, which ends the goroutines start launched.
	Stop()
	// Awaiting counts operations still waiting for the peer's reply (get
	// data, or the acknowledgement that a put arrived).
	Awaiting() int
	// FailAll fails everything queued and awaited; called after stop.
	FailAll()

	// WholeOp reports that cutting op over the lanes gains nothing on this
	// transport, whatever the connection's stripe threshold (libfabric
	// with one rail: every lane posts on the same endpoint). op is a value
	// for the reason submit's is.
	WholeOp(op Op) bool
	// SignalApart reports that op, a put with signal that is not striped,
	// completes in two parts: its write and the signal message behind it
	// (libfabric, unless staged over TCP or sent inline).
	SignalApart(op Op) bool
	// Release frees what outlives stop (the staging rings of the lanes);
	// Close calls it once the transport's goroutines ended.
	Release()

	// WriteState writes what the transport holds, for the stall report
	// (Mesh.WriteState): indented lines under the peer's. It may take the
	// transport's locks briefly; it allocates.
	WriteState(w io.Writer)
	// AddStats adds the transport's counters to st (Mesh.Stats): the peer
	// counted as a fabric or intra-node peer, and what its lanes moved.
	AddStats(st *Stats)
}

// Stats is what a mesh reports of itself: its transports and what they
// moved.
type Stats struct {
	FabricPeers    int      // peers reached over libfabric
	IntraNodePeers int      // peers the single-copy path is enabled for
	FabricProvider string   // the libfabric provider in use ("" for none)
	FabricRails    []string // the domains (NICs) of the fabric endpoints, rail 0 first
	RailBytes      []uint64 // what our puts and gets moved through each rail so far
	// CompressedRaw and CompressedWire are the payload bytes the TCP
	// lanes compressed so far and what they took on the wire (framing
	// included).
	CompressedRaw, CompressedWire uint64
	// AcksCarried and AcksAlone count the acknowledgements of the peers'
	// puts sent so far: carried in a batch of ours (SPEC.md §4,
	// "Acknowledgements ride the reverse lanes"; a lone ack a lane wrote
	// counts here too), or written alone on the acknowledged stream.
	// AcksAtOnce counts the drains whose acks were not held for a batch
	// because holding had not paid (putack.Lanes.Adapt): they leave alone
	// on a lane at the caller's next call.
	AcksCarried, AcksAlone, AcksAtOnce uint64
	// Handed counts the batches the caller's thread handed to a lane's
	// writer goroutine to wait for their gathered device copies
	// (Config.GatherWriter), and HandedByCaller those a later call of the
	// caller wrote (the others, the writer goroutine).
	Handed, HandedByCaller uint64
	// MarksAtOnce, MarksWaited and MarksLeft count the put+signals
	// ordered by a peer's agent marks that the polling caller met: served
	// with the mark already there, served after its wait for the mark,
	// and left to the lane's service (the mark later than the wait, or
	// waiting off on that link); MarksToDevice those served before their
	// mark, our device agent waiting for it
	// (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE).
	MarksAtOnce, MarksWaited, MarksLeft, MarksToDevice uint64
	// BackstopAsks counts the liveness backstop's asks for acks that
	// waited too long (tcp_acks.go, backstop), and AcksRescued the asks
	// an ack answered: each is an ack the normal path failed to deliver
	// in time.
	BackstopAsks, AcksRescued uint64
	// FlushAsks counts the asks for acks that flushes made (a target
	// holds its acks for a batch of its own until asked), and
	// FlushAsksAtOnce the flushes that asked without waiting first
	// (tcp_acks.go, askPacer: the target kept holding them).
	FlushAsks, FlushAsksAtOnce uint64
	// StreamWakes counts the readers of shared-memory streams the wake
	// backstop woke (host/dataplane's stream_wake.go): a wake-up the
	// normal path lost, or a reader whose thread got no CPU for a tick.
	// LostWakes counts those of them whose reader had marked itself
	// asleep: lost wake-ups.
	StreamWakes, LostWakes uint64
}

// Orderer orders a signal after the peer's copies into our memory through
// a mapping (the intra-node link's interprocess events): the core's
// orderer calls it when it applies a signal that carries one, so the core
// need not know the intra-node transport's types.
type Orderer interface {
	// Order waits, or makes the signal's stream wait, for event ev of the
	// peer (0: only for one a stream waits for already); ctx and stream
	// say where the signal is applied (on ctx's stream when stream, else
	// from the host).
	Order(ev, ctx uintptr, stream bool) error
}
