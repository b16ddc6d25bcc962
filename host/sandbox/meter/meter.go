// Package meter is the fuel-metering rewriter of Wasm modules (SPEC.md §8.6,
// "Termination"), kept apart from the sandbox because it is pure bytecode
// work: it parses and re-encodes a module and knows nothing of wazero.
//
// wazero v1.12 can only stop a running guest through
// RuntimeConfig.WithCloseOnContextDone, which costs a goroutine, a channel
// and a large per-call and per-back-edge price (BENCH.md, "Figures behind
// the code"). Instead every
// module is rewritten at load time:
//
//   - a mutable i64 global is appended and exported as FuelExport;
//   - every function body starts with a charge of the number of instructions
//     it owns outside any loop;
//   - every loop body starts (so on entry and on every back-edge) with a
//     charge of the number of instructions the loop owns directly (nested
//     loops charge their own);
//   - a charge is global.get; i64.const n; i64.sub; global.tee-like store; a
//     compare with zero and `if unreachable end`.
//
// Each executed instruction is therefore paid for before it runs, so a call
// that is handed F units of fuel executes at most F wasm instructions (bulk
// memory instructions count as one, and are bounded by the memory cap; host
// functions charge fuel themselves). The host sets the global before each
// call and reads it after a trap to tell "out of fuel" from a guest trap.
package meter

import (
	"bytes"
	"errors"
	"fmt"
)

// FuelExport is the name under which Rewrite exports the fuel global (a
// mutable i64): the host sets it before a call and reads it after a trap.
const FuelExport = "__rmaw_fuel"

var errMeter = errors.New("malformed module")

type reader struct {
	b   []byte
	off int
}

func (r *reader) eof() bool { return r.off >= len(r.b) }

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, fmt.Errorf("%w: unexpected end at offset %d", errMeter, r.off)
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) u32() (uint32, error) {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			if v > 0xffffffff {
				break
			}
			return uint32(v), nil
		}
	}
	return 0, fmt.Errorf("%w: bad LEB128 at offset %d", errMeter, r.off)
}

// sleb skips a signed LEB128 of at most maxBytes bytes.
func (r *reader) sleb(maxBytes int) error {
	for i := 0; i < maxBytes; i++ {
		c, err := r.byte()
		if err != nil {
			return err
		}
		if c&0x80 == 0 {
			return nil
		}
	}
	return fmt.Errorf("%w: bad LEB128 at offset %d", errMeter, r.off)
}

func (r *reader) skip(n int) error {
	if n < 0 || r.off+n > len(r.b) {
		return fmt.Errorf("%w: unexpected end at offset %d", errMeter, r.off)
	}
	r.off += n
	return nil
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
		} else {
			return append(b, c)
		}
	}
}

func appendS64(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendName(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}

type section struct {
	id   byte
	body []byte
}

// Rewrite returns the instrumented module. It also refuses modules that
// reference a global index beyond their own (which would alias the fuel
// global once it is appended). It never panics on malformed input.
func Rewrite(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil, errors.New("not a WebAssembly module (bad magic)")
	}
	if !bytes.Equal(wasm[4:8], []byte{1, 0, 0, 0}) {
		return nil, fmt.Errorf("unsupported WebAssembly binary version % x (want 01 00 00 00)", wasm[4:8])
	}
	r := &reader{b: wasm, off: 8}
	var secs []section
	for !r.eof() {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		n, err := r.u32()
		if err != nil {
			return nil, err
		}
		start := r.off
		if err := r.skip(int(n)); err != nil {
			return nil, err
		}
		secs = append(secs, section{id, wasm[start:r.off]})
	}

	// Count globals (imported + defined) and find the sections we edit.
	var nGlobals uint32
	globalSec, exportSec, codeSec := -1, -1, -1
	for i, s := range secs {
		switch s.id {
		case 2: // import
			sr := &reader{b: s.body}
			cnt, err := sr.u32()
			if err != nil {
				return nil, err
			}
			for j := uint32(0); j < cnt; j++ {
				for k := 0; k < 2; k++ { // module, name
					l, err := sr.u32()
					if err != nil {
						return nil, err
					}
					if err := sr.skip(int(l)); err != nil {
						return nil, err
					}
				}
				kind, err := sr.byte()
				if err != nil {
					return nil, err
				}
				switch kind {
				case 0: // func
					_, err = sr.u32()
				case 1: // table: reftype, limits
					if _, err = sr.byte(); err == nil {
						err = skipLimits(sr)
					}
				case 2: // memory
					err = skipLimits(sr)
				case 3: // global
					nGlobals++
					err = sr.skip(2)
				case 4: // tag
					err = fmt.Errorf("%w: exception tags are not supported", errMeter)
				default:
					err = fmt.Errorf("%w: import kind %d", errMeter, kind)
				}
				if err != nil {
					return nil, err
				}
			}
		case 6:
			globalSec = i
			sr := &reader{b: s.body}
			cnt, err := sr.u32()
			if err != nil {
				return nil, err
			}
			nGlobals += cnt
		case 7:
			exportSec = i
		case 10:
			codeSec = i
		}
	}
	fuel := nGlobals

	// Global section: append (mut i64 (i64.const 0)).
	newGlobal := []byte{0x7e, 0x01, 0x42, 0x00, 0x0b}
	if globalSec >= 0 {
		sr := &reader{b: secs[globalSec].body}
		cnt, _ := sr.u32()
		body := appendU32(nil, cnt+1)
		body = append(body, secs[globalSec].body[sr.off:]...)
		secs[globalSec].body = append(body, newGlobal...)
	} else {
		secs = insertSection(secs, section{6, append([]byte{1}, newGlobal...)})
		exportSec, codeSec = findSec(secs, 7), findSec(secs, 10)
	}

	// Export section: append the fuel global; refuse a clash.
	exp := appendName(nil, FuelExport)
	exp = append(exp, 0x03)
	exp = appendU32(exp, fuel)
	if exportSec >= 0 {
		sr := &reader{b: secs[exportSec].body}
		cnt, err := sr.u32()
		if err != nil {
			return nil, err
		}
		entries := sr.off
		for j := uint32(0); j < cnt; j++ {
			l, err := sr.u32()
			if err != nil {
				return nil, err
			}
			name := sr.b[sr.off : sr.off+int(min(l, uint32(len(sr.b)-sr.off)))]
			if err := sr.skip(int(l)); err != nil {
				return nil, err
			}
			if string(name) == FuelExport {
				return nil, fmt.Errorf("module exports the reserved name %q", FuelExport)
			}
			kind, err := sr.byte()
			if err != nil {
				return nil, err
			}
			idx, err := sr.u32()
			if err != nil {
				return nil, err
			}
			if kind == 3 && idx >= fuel {
				return nil, fmt.Errorf("%w: export %q names global %d of %d", errMeter, name, idx, fuel)
			}
		}
		body := appendU32(nil, cnt+1)
		body = append(body, secs[exportSec].body[entries:]...)
		secs[exportSec].body = append(body, exp...)
	} else {
		secs = insertSection(secs, section{7, append([]byte{1}, exp...)})
		codeSec = findSec(secs, 10)
	}

	// Code section.
	if codeSec >= 0 {
		nb, err := meterCode(secs[codeSec].body, fuel, nGlobals)
		if err != nil {
			return nil, err
		}
		secs[codeSec].body = nb
	}

	out := make([]byte, 0, len(wasm)+len(wasm)/4+64)
	out = append(out, wasm[:8]...)
	for _, s := range secs {
		if s.id == 0 && isDebugSection(s.body) {
			continue // DWARF offsets would no longer match the code
		}
		out = append(out, s.id)
		out = appendU32(out, uint32(len(s.body)))
		out = append(out, s.body...)
	}
	return out, nil
}

func isDebugSection(body []byte) bool {
	r := &reader{b: body}
	l, err := r.u32()
	if err != nil || r.off+int(l) > len(body) {
		return false
	}
	return bytes.HasPrefix(body[r.off:r.off+int(l)], []byte(".debug"))
}

func skipLimits(r *reader) error {
	flag, err := r.byte()
	if err != nil {
		return err
	}
	if _, err := r.u32(); err != nil {
		return err
	}
	if flag&1 != 0 {
		_, err = r.u32()
	}
	return err
}

// sectionOrder places known section ids in their mandated order (datacount
// 12 sits between import/.../element and code).
func sectionOrder(id byte) int {
	switch id {
	case 12:
		return 95 // before code (10 -> 100)
	case 13:
		return 55 // tag, between memory and global
	}
	return int(id) * 10
}

func insertSection(secs []section, s section) []section {
	for i, x := range secs {
		if x.id != 0 && sectionOrder(x.id) > sectionOrder(s.id) {
			secs = append(secs[:i], append([]section{s}, secs[i:]...)...)
			return secs
		}
	}
	return append(secs, s)
}

func findSec(secs []section, id byte) int {
	for i, s := range secs {
		if s.id == id {
			return i
		}
	}
	return -1
}

func appendCharge(b []byte, fuel uint32, n int64) []byte {
	b = append(b, 0x23) // global.get
	b = appendU32(b, fuel)
	b = append(b, 0x42) // i64.const
	b = appendS64(b, n)
	b = append(b, 0x7d, 0x24) // i64.sub; global.set
	b = appendU32(b, fuel)
	b = append(b, 0x23)
	b = appendU32(b, fuel)
	b = append(b, 0x42, 0x00, 0x53) // i64.const 0; i64.lt_s
	b = append(b, 0x04, 0x40, 0x00, 0x0b)
	return b
}

func meterCode(body []byte, fuel, nGlobals uint32) ([]byte, error) {
	r := &reader{b: body}
	cnt, err := r.u32()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body)+len(body)/4)
	out = appendU32(out, cnt)
	var fn []byte
	var costs []int64
	for i := uint32(0); i < cnt; i++ {
		size, err := r.u32()
		if err != nil {
			return nil, err
		}
		start := r.off
		if err := r.skip(int(size)); err != nil {
			return nil, err
		}
		fb := &reader{b: body[start:r.off]}
		// locals
		nl, err := fb.u32()
		if err != nil {
			return nil, err
		}
		for j := uint32(0); j < nl; j++ {
			if _, err := fb.u32(); err != nil {
				return nil, err
			}
			if _, err := fb.byte(); err != nil {
				return nil, err
			}
		}
		codeStart := fb.off
		// Pass 1: costs per scope, in order of appearance (function first).
		costs, err = scanCosts(fb, costs[:0], nGlobals)
		if err != nil {
			return nil, fmt.Errorf("function %d: %w", i, err)
		}
		// Pass 2: emit with charges.
		fn = append(fn[:0], fb.b[:codeStart]...)
		fn = appendCharge(fn, fuel, costs[0])
		ci := 1
		fb.off = codeStart
		for !fb.eof() {
			ins := fb.off
			op, _ := fb.byte()
			if err := skipImmediates(fb, op); err != nil {
				return nil, err
			}
			fn = append(fn, fb.b[ins:fb.off]...)
			if op == 0x03 {
				fn = appendCharge(fn, fuel, costs[ci])
				ci++
			}
		}
		out = appendU32(out, uint32(len(fn)))
		out = append(out, fn...)
	}
	return out, nil
}

// scanCosts walks one body and returns the instruction count owned by the
// function scope followed by one count per loop in order of appearance.
func scanCosts(r *reader, costs []int64, nGlobals uint32) ([]int64, error) {
	type frame struct {
		loop bool
		idx  int // index into costs of the innermost loop (or 0 = function)
	}
	costs = append(costs, 0)
	stack := []frame{{false, 0}}
	save := r.off
	for !r.eof() {
		op, _ := r.byte()
		if len(stack) == 0 {
			return nil, fmt.Errorf("%w: code after the final end", errMeter)
		}
		owner := stack[len(stack)-1].idx
		costs[owner]++
		switch op {
		case 0x02, 0x04: // block, if
			stack = append(stack, frame{false, owner})
		case 0x03: // loop
			costs = append(costs, 0)
			stack = append(stack, frame{true, len(costs) - 1})
		case 0x0b:
			stack = stack[:len(stack)-1]
		case 0x23, 0x24: // global.get/set
			save2 := r.off
			idx, err := r.u32()
			if err != nil {
				return nil, err
			}
			if idx >= nGlobals {
				return nil, fmt.Errorf("%w: global index %d out of range (%d globals)", errMeter, idx, nGlobals)
			}
			r.off = save2
		}
		if err := skipImmediates(r, op); err != nil {
			return nil, err
		}
	}
	if len(stack) != 0 {
		return nil, fmt.Errorf("%w: unterminated function body", errMeter)
	}
	r.off = save
	return costs, nil
}

func skipMemarg(r *reader) error {
	if _, err := r.u32(); err != nil {
		return err
	}
	_, err := r.u32()
	return err
}

func skipBlockType(r *reader) error {
	if r.off >= len(r.b) {
		return fmt.Errorf("%w: unexpected end", errMeter)
	}
	c := r.b[r.off]
	if c == 0x40 || (c >= 0x6f && c <= 0x7f) {
		r.off++
		return nil
	}
	return r.sleb(5)
}

func skipImmediates(r *reader, op byte) error {
	switch {
	case op == 0x02 || op == 0x03 || op == 0x04:
		return skipBlockType(r)
	case op == 0x0c || op == 0x0d, op == 0x10, op >= 0x20 && op <= 0x26, op == 0xd2:
		_, err := r.u32()
		return err
	case op == 0x0e: // br_table
		n, err := r.u32()
		if err != nil {
			return err
		}
		for i := uint32(0); i <= n; i++ {
			if _, err := r.u32(); err != nil {
				return err
			}
		}
		return nil
	case op == 0x11: // call_indirect type, table
		if _, err := r.u32(); err != nil {
			return err
		}
		_, err := r.u32()
		return err
	case op == 0x1c: // select t*
		n, err := r.u32()
		if err != nil {
			return err
		}
		return r.skip(int(n))
	case op >= 0x28 && op <= 0x3e:
		return skipMemarg(r)
	case op == 0x3f || op == 0x40:
		_, err := r.u32() // memory index (0x00)
		return err
	case op == 0x41:
		return r.sleb(5)
	case op == 0x42:
		return r.sleb(10)
	case op == 0x43:
		return r.skip(4)
	case op == 0x44:
		return r.skip(8)
	case op == 0xd0:
		return r.skip(1)
	case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0b || op == 0x0f || op == 0x1a || op == 0x1b,
		op >= 0x45 && op <= 0xc4, op == 0xd1:
		return nil
	case op == 0xfc:
		sub, err := r.u32()
		if err != nil {
			return err
		}
		switch {
		case sub <= 7:
			return nil
		case sub == 8: // memory.init data mem
			if _, err := r.u32(); err != nil {
				return err
			}
			return r.skip(1)
		case sub == 9, sub == 13, sub >= 15 && sub <= 17:
			_, err := r.u32()
			return err
		case sub == 10:
			return r.skip(2)
		case sub == 11:
			return r.skip(1)
		case sub == 12, sub == 14:
			if _, err := r.u32(); err != nil {
				return err
			}
			_, err := r.u32()
			return err
		}
		return fmt.Errorf("%w: unknown opcode 0xfc %d", errMeter, sub)
	case op == 0xfd:
		sub, err := r.u32()
		if err != nil {
			return err
		}
		switch {
		case sub <= 11, sub == 92 || sub == 93:
			return skipMemarg(r)
		case sub == 12 || sub == 13:
			return r.skip(16)
		case sub >= 21 && sub <= 34:
			return r.skip(1)
		case sub >= 84 && sub <= 91:
			if err := skipMemarg(r); err != nil {
				return err
			}
			return r.skip(1)
		case sub <= 0x113:
			return nil
		}
		return fmt.Errorf("%w: unknown opcode 0xfd %d", errMeter, sub)
	}
	return fmt.Errorf("%w: unsupported opcode 0x%02x at offset %d (threads, exceptions and tail calls are not part of Guest ABI v1)", errMeter, op, r.off-1)
}
