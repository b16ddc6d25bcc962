package plugin

import (
	"sync"
	"sync/atomic"
)

// Handle kinds live in bits 56..62 so a handle is never 0, stays below 2^63
// (the GIN proxy carries handles in 63-bit fields), and a handle of one kind
// passed where another is expected is recognised as garbage.
const (
	kindCtx    = 0x11
	kindListen = 0x12
	kindColl   = 0x13
	kindRma    = 0x14
	kindMR     = 0x15
	kindReq    = 0x16

	kindShift   = 56
	payloadMask = 1<<kindShift - 1
)

func makeHandle(kind, payload uint64) uint64 { return kind<<kindShift | payload&payloadMask }

func splitHandle(h uint64) (kind, payload uint64) { return h >> kindShift, h & payloadMask }

// table maps small integer ids to objects. Lookups are lock-free and
// allocation-free (an atomic load of a copy-on-write slice); inserts and
// removals take a lock and happen only on control paths. Ids are never
// reused, so a stale handle finds nil instead of someone else's object.
type table[T any] struct {
	kind  uint64 // of the handles naming these objects
	mu    sync.Mutex
	slots atomic.Pointer[[]*T]
	next  uint64
}

func (t *table[T]) add(v *T) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	id := t.next
	var old []*T
	if p := t.slots.Load(); p != nil {
		old = *p
	}
	n := make([]*T, id+1)
	copy(n, old)
	n[id] = v
	t.slots.Store(&n)
	return id
}

func (t *table[T]) get(id uint64) *T {
	p := t.slots.Load()
	if p == nil || id >= uint64(len(*p)) {
		return nil
	}
	return (*p)[id]
}

func (t *table[T]) remove(id uint64) *T {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.slots.Load()
	if p == nil || id >= uint64(len(*p)) || (*p)[id] == nil {
		return nil
	}
	n := make([]*T, len(*p))
	copy(n, *p)
	v := n[id]
	n[id] = nil
	t.slots.Store(&n)
	return v
}

// empty reports whether the table holds no object.
func (t *table[T]) empty() bool {
	if p := t.slots.Load(); p != nil {
		for _, v := range *p {
			if v != nil {
				return false
			}
		}
	}
	return true
}

// handle names the object with this id.
func (t *table[T]) handle(id uint64) uint64 { return makeHandle(t.kind, id) }

// lookup resolves a handle of this table's kind; anything else is nil.
func (t *table[T]) lookup(h uint64) *T {
	k, id := splitHandle(h)
	if k != t.kind {
		return nil
	}
	return t.get(id)
}

// take removes the object a handle names and returns it (nil if none).
func (t *table[T]) take(h uint64) *T {
	k, id := splitHandle(h)
	if k != t.kind {
		return nil
	}
	return t.remove(id)
}
