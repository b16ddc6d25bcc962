package sandbox

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

// guestContext is the backend.Context of one rma context: one instance,
// used by one goroutine at a time (the runtime's lock), so no locking here.
type guestContext struct {
	b    *Backend
	info backend.ContextInfo
	id   int32
	in   *instance // nil after a fault until the next call revives it

	plans, completions bool
	v11                uint64    // the v1.1 plan features the instance enabled
	lastExport         time.Time // metrics (metrics.go)
	batchCap           int       // > 0: aggregated ops may be planned in batches of this many
	laneEvents         bool      // FeatureLaneEvents
}

var _ backend.Context = (*guestContext)(nil)

// live returns the context's instance, reviving it after a fault, or
// backend.ErrDisabled once the backend is disabled.
func (c *guestContext) live() (*instance, error) {
	if c.b.disabled.Load() {
		return nil, backend.ErrDisabled
	}
	if c.in == nil {
		if err := c.revive(); err != nil {
			return nil, err
		}
	}
	return c.in, nil
}

// revive creates the instance and opens the context in it.
func (c *guestContext) revive() error {
	if c.b.disabled.Load() {
		return backend.ErrDisabled
	}
	in, err := c.b.newInstance()
	if err != nil {
		return c.b.fault(fmt.Errorf("wasm backend %s: %w", c.b.name, err))
	}
	if in.fCtxOpen != nil {
		s := in.stack[:5]
		s[0], s[1], s[2], s[3], s[4] = uint64(uint32(c.id)), c.info.CommID,
			uint64(uint32(c.info.NRanks)), uint64(uint32(c.info.Rank)), uint64(uint32(c.info.Contexts))
		if err := in.call(in.fCtxOpen, guestabi.ExportCtxOpen, s, c.b.ctlFuel); err != nil {
			in.close()
			return c.b.fault(fmt.Errorf("wasm backend %s: %w", c.b.name, err))
		}
		if st := int32(s[0]); st != 0 {
			in.close()
			return &guestStatusError{c.b.name, guestabi.ExportCtxOpen, st}
		}
	}
	c.in = in
	c.plans = in.features&guestabi.FeaturePlanOp != 0
	c.completions = in.features&guestabi.FeatureCompletions != 0
	c.v11 = in.features & (guestabi.FeatureChunk | guestabi.FeatureDelay | guestabi.FeatureCompression)
	c.batchCap = int(in.batchCap)
	c.laneEvents = c.completions && in.features&guestabi.FeatureLaneEvents != 0
	return nil
}

// faulted drops the instance and records the fault.
func (c *guestContext) faulted(err error) error {
	c.in.close()
	c.in = nil
	return c.b.fault(fmt.Errorf("wasm backend %s: %w", c.b.name, err))
}

// PlansOps implements backend.Context.
func (c *guestContext) PlansOps() bool { return c.plans }

// WantsCompletions implements backend.Context.
func (c *guestContext) WantsCompletions() bool { return c.completions }

// PlanOp implements backend.Context. It allocates nothing on success.
func (c *guestContext) PlanOp(op *backend.Op, plan *backend.OpPlan) error {
	in, err := c.live()
	if err != nil {
		return err
	}
	if in.fPlanOp == nil {
		return nil
	}
	// One bounds-checked view of the plan descriptor per call (the memory
	// may have moved if the reserving allocator was unavailable).
	pd := in.planView
	if pd == nil {
		var ok bool
		if pd, ok = in.mem.Read(in.area+guestabi.OffPlan, guestabi.PlanSize); !ok {
			return c.faulted(fmt.Errorf("plan descriptor at %#x is outside guest memory", in.area+guestabi.OffPlan))
		}
	}
	var codec uint64
	if c.v11&guestabi.FeatureCompression != 0 {
		codec = uint64(plan.Codec)
	}
	binary.LittleEndian.PutUint64(pd[guestabi.OffPlanLane-guestabi.OffPlan:], uint64(uint32(plan.Lane))) // lane + flags=0
	binary.LittleEndian.PutUint64(pd[guestabi.OffPlanChunk-guestabi.OffPlan:], 0)
	binary.LittleEndian.PutUint64(pd[guestabi.OffPlanDelayNs-guestabi.OffPlan:], 0)
	binary.LittleEndian.PutUint64(pd[guestabi.OffPlanCodec-guestabi.OffPlan:], codec) // codec + reserved
	s := in.planStack[:]
	s[0], s[1], s[2], s[3], s[4], s[5] = uint64(uint32(c.id)), uint64(op.Kind), uint64(op.Peer), op.Size,
		uint64(op.OptFlags), uint64(op.SignalOp)
	if err := in.call(in.fPlanOp, guestabi.ExportPlanOp, s, c.b.planFuel); err != nil {
		return c.faulted(err)
	}
	st := int32(s[0])
	switch {
	case st == 0:
		// The guest may have grown its memory during the call: read again
		// (a kept view stays valid: that memory never moves).
		var lane uint32
		if in.planView != nil {
			lane = binary.LittleEndian.Uint32(in.planView[guestabi.OffPlanLane-guestabi.OffPlan:])
		} else {
			lane, _ = in.mem.ReadUint32Le(in.area + guestabi.OffPlanLane)
		}
		if l := int32(lane); l < -1 || l >= abi.MaxLanes {
			return c.faulted(fmt.Errorf("%s: lane %d outside -1..%d", guestabi.ExportPlanOp, l, abi.MaxLanes-1))
		}
		plan.Lane, plan.Status = int32(lane), 0
		if c.v11 != 0 {
			return c.readV11(in, plan)
		}
		return nil
	case st > 0 && st <= 6: // ncclResult_t codes a plugin may return
		plan.Status = st
		return nil
	case st < 0:
		return &guestStatusError{c.b.name, guestabi.ExportPlanOp, st}
	}
	return c.faulted(fmt.Errorf("%s returned status %d (want 0, 1..6 or negative)", guestabi.ExportPlanOp, st))
}

// WantsLaneEvents implements backend.LaneEventer.
func (c *guestContext) WantsLaneEvents() bool { return c.laneEvents }

// BatchCap implements backend.BatchPlanner: 0 unless the guest enabled
// FeaturePlanBatch. A revived instance has the same module, so the same
// answer.
func (c *guestContext) BatchCap() int { return c.batchCap }

// PlanOps implements backend.BatchPlanner: one rmaw_plan_ops call for
// len(ops) records (at most BatchCap), written over the completion ring,
// on a budget of one plan_op per op. It allocates nothing on success.
func (c *guestContext) PlanOps(ops []backend.Op, plans []backend.OpPlan) error {
	in, err := c.live()
	if err != nil {
		return err
	}
	n := len(ops)
	if n == 0 {
		return nil
	}
	if n > int(in.batchCap) || in.fPlanOps == nil {
		return fmt.Errorf("wasm backend %s: a batch of %d plans, the guest takes %d", c.b.name, n, in.batchCap)
	}
	recs, ok := in.mem.Read(in.area+guestabi.OffCompletions, uint32(n)*guestabi.BatchRecordSize)
	if !ok {
		return c.faulted(fmt.Errorf("%d plan records are outside guest memory", n))
	}
	for i := range ops {
		r, op, p := recs[i*guestabi.BatchRecordSize:(i+1)*guestabi.BatchRecordSize], &ops[i], &plans[i]
		var codec uint64
		if c.v11&guestabi.FeatureCompression != 0 {
			codec = uint64(p.Codec)
		}
		binary.LittleEndian.PutUint32(r[guestabi.BatOffKind:], uint32(op.Kind))
		binary.LittleEndian.PutUint32(r[guestabi.BatOffPeer:], op.Peer)
		binary.LittleEndian.PutUint64(r[guestabi.BatOffSize:], op.Size)
		binary.LittleEndian.PutUint32(r[guestabi.BatOffOptFlags:], op.OptFlags)
		binary.LittleEndian.PutUint32(r[guestabi.BatOffSignalOp:], op.SignalOp)
		pd := r[guestabi.BatOffPlan:]
		binary.LittleEndian.PutUint64(pd[guestabi.OffPlanLane-guestabi.OffPlan:], uint64(uint32(p.Lane)))
		binary.LittleEndian.PutUint64(pd[guestabi.OffPlanChunk-guestabi.OffPlan:], 0)
		binary.LittleEndian.PutUint64(pd[guestabi.OffPlanDelayNs-guestabi.OffPlan:], 0)
		binary.LittleEndian.PutUint64(pd[guestabi.OffPlanCodec-guestabi.OffPlan:], codec)
		binary.LittleEndian.PutUint64(r[guestabi.BatOffStatus:], 0) // status + reserved
	}
	s := in.stack[:2]
	s[0], s[1] = uint64(uint32(c.id)), uint64(n)
	if err := in.call(in.fPlanOps, guestabi.ExportPlanOps, s, c.b.planFuel*int64(n)); err != nil {
		return c.faulted(err)
	}
	if st := int32(s[0]); st != 0 {
		if st < 0 {
			return &guestStatusError{c.b.name, guestabi.ExportPlanOps, st}
		}
		return c.faulted(fmt.Errorf("%s returned status %d (want 0 or negative)", guestabi.ExportPlanOps, st))
	}
	if recs, ok = in.mem.Read(in.area+guestabi.OffCompletions, uint32(n)*guestabi.BatchRecordSize); !ok {
		return c.faulted(fmt.Errorf("%d plan records are outside guest memory", n))
	}
	for i := range plans {
		r, p := recs[i*guestabi.BatchRecordSize:(i+1)*guestabi.BatchRecordSize], &plans[i]
		st := int32(binary.LittleEndian.Uint32(r[guestabi.BatOffStatus:]))
		if st < 0 || st > 6 {
			return c.faulted(fmt.Errorf("%s: record %d has status %d (want 0 or 1..6)", guestabi.ExportPlanOps, i, st))
		}
		lane := int32(binary.LittleEndian.Uint32(r[guestabi.BatOffPlan+guestabi.OffPlanLane-guestabi.OffPlan:]))
		if lane < -1 || lane >= abi.MaxLanes {
			return c.faulted(fmt.Errorf("%s: record %d: lane %d outside -1..%d", guestabi.ExportPlanOps, i, lane, abi.MaxLanes-1))
		}
		p.Lane, p.Status = lane, st
		if c.v11 != 0 {
			if err := c.readPlanFields(r[guestabi.BatOffPlan:guestabi.BatOffPlan+guestabi.PlanSize], p, guestabi.ExportPlanOps); err != nil {
				return err
			}
		}
	}
	return nil
}

// readV11 reads the plan fields of the v1.1 features the instance enabled
// and checks them (SPEC.md §8.5).
func (c *guestContext) readV11(in *instance, plan *backend.OpPlan) error {
	pd := in.planView
	if pd == nil {
		var ok bool
		if pd, ok = in.mem.Read(in.area+guestabi.OffPlan, guestabi.PlanSize); !ok {
			return c.faulted(fmt.Errorf("plan descriptor at %#x is outside guest memory", in.area+guestabi.OffPlan))
		}
	}
	return c.readPlanFields(pd, plan, guestabi.ExportPlanOp)
}

// readPlanFields reads the v1.1 fields of one plan descriptor (pd, PlanSize
// bytes) that the instance enabled, for export.
func (c *guestContext) readPlanFields(pd []byte, plan *backend.OpPlan, export string) error {
	if c.v11&guestabi.FeatureChunk != 0 {
		chunk := binary.LittleEndian.Uint64(pd[guestabi.OffPlanChunk-guestabi.OffPlan:])
		if chunk > guestabi.MaxChunk {
			return c.faulted(fmt.Errorf("%s: chunk size %d above 2^40", export, chunk))
		}
		plan.ChunkSize = chunk
	}
	if c.v11&guestabi.FeatureDelay != 0 {
		d := binary.LittleEndian.Uint64(pd[guestabi.OffPlanDelayNs-guestabi.OffPlan:])
		if d > guestabi.MaxDelayNs {
			return c.faulted(fmt.Errorf("%s: delay %d ns above the cap of %d ns", export, d, guestabi.MaxDelayNs))
		}
		plan.DelayNs = d
	}
	if c.v11&guestabi.FeatureCompression != 0 {
		w := binary.LittleEndian.Uint32(pd[guestabi.OffPlanCodec-guestabi.OffPlan:])
		if !guestabi.ValidCodec(w) {
			return c.faulted(fmt.Errorf("%s: unknown codec word %#x", export, w))
		}
		plan.Codec = backend.Codec(w)
	}
	return nil
}

// Completions implements backend.Context: records are written into the
// guest's ring in place, up to its capacity per call.
func (c *guestContext) Completions(batch []backend.Completion) error {
	in, err := c.live()
	if err != nil {
		return err
	}
	if in.fCompletions == nil || !c.completions {
		return nil
	}
	for len(batch) > 0 {
		n := min(len(batch), int(in.compCap))
		// One bounds-checked view of the ring, then plain stores: six
		// interface calls per record cost more than the guest's own work.
		ring, ok := in.mem.Read(in.area+guestabi.OffCompletions, uint32(n)*guestabi.CompletionSize)
		if !ok {
			return c.faulted(fmt.Errorf("completion ring of %d records is outside guest memory", n))
		}
		for i := range batch[:n] {
			r, x := ring[uint32(i)*guestabi.CompletionSize:], &batch[i]
			binary.LittleEndian.PutUint32(r[guestabi.CompOffKind:], uint32(x.Kind))
			binary.LittleEndian.PutUint32(r[guestabi.CompOffPeer:], x.Peer)
			binary.LittleEndian.PutUint64(r[guestabi.CompOffSize:], x.Size)
			binary.LittleEndian.PutUint32(r[guestabi.CompOffStatus:], uint32(x.Status))
			binary.LittleEndian.PutUint32(r[guestabi.CompOffLane:], uint32(x.Lane))
			binary.LittleEndian.PutUint64(r[guestabi.CompOffLatency:], x.Latency)
		}
		s := in.stack[:2]
		s[0], s[1] = uint64(uint32(c.id)), uint64(n)
		if err := in.call(in.fCompletions, guestabi.ExportCompletions, s, c.b.ctlFuel); err != nil {
			return c.faulted(err)
		}
		if st := int32(s[0]); st != 0 {
			if st < 0 {
				return &guestStatusError{c.b.name, guestabi.ExportCompletions, st}
			}
			return c.faulted(fmt.Errorf("%s returned status %d (want 0 or negative)", guestabi.ExportCompletions, st))
		}
		batch = batch[n:]
	}
	if c.b.exp != nil && in.fMetrics != nil {
		if now := time.Now(); now.Sub(c.lastExport) >= c.b.exp.interval {
			c.lastExport = now
			return c.exportMetrics(false)
		}
	}
	return nil
}

// exportMetrics hands the instance's metrics text to the exporter. A bad
// answer is a nonsense answer: a fault.
func (c *guestContext) exportMetrics(closing bool) error {
	text, err := c.in.metrics()
	if err != nil {
		if closing {
			return c.b.fault(fmt.Errorf("wasm backend %s: %w", c.b.name, err))
		}
		return c.faulted(err)
	}
	c.b.exp.set(c.id, c.info.Rank, text, closing)
	return nil
}

// Close implements backend.Context.
func (c *guestContext) Close() error {
	in := c.in
	if in == nil {
		return nil
	}
	var err error
	if c.b.exp != nil && in.fMetrics != nil {
		err = c.exportMetrics(true) // the final counters, before the guest sees the close
	}
	c.in = nil
	if in.fCtxClose != nil && err == nil {
		in.stack[0] = uint64(uint32(c.id))
		if err = in.call(in.fCtxClose, guestabi.ExportCtxClose, in.stack[:1], c.b.ctlFuel); err == nil {
			if st := int32(in.stack[0]); st != 0 {
				err = &guestStatusError{c.b.name, guestabi.ExportCtxClose, st}
			}
		}
	}
	in.finalize()
	in.close()
	return err
}
