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
//     compare with zero and `if unreachable end`;
//   - bulk instructions (memory.fill/copy/init, table.fill/copy/init/grow)
//     also charge their length operand, shifted (bulkShift), just before
//     they run: their cost grows with the length, not with the count;
//   - a second i32 global (DepthExport) counts the frames a call may still
//     open: each body takes one on entry and gives it back on every way out
//     (the body is wrapped in a block, and return becomes a branch to it);
//   - tables are clamped to MaxTableElements, as they are outside the
//     memory cap.
//
// Each executed instruction is therefore paid for before it runs, so a call
// that is handed F units of fuel executes at most F wasm instructions plus
// its bulk lengths over 64 bytes (host functions charge fuel themselves).
// The host sets the globals before each call and reads them after a trap to
// tell "out of fuel" and "too deep" from a guest trap.
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

// prefixed reads a u32 length and returns that many bytes (a section's
// body, a name, a function type's value types).
func (r *reader) prefixed() ([]byte, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	start := r.off
	if err := r.skip(int(n)); err != nil {
		return nil, err
	}
	return r.b[start:r.off], nil
}

// extend returns a vector's encoding (body: its count, then its entries)
// with extra more entries, encoded in add, at the end.
func extend(body []byte, extra uint32, add []byte) []byte {
	r := &reader{b: body}
	cnt, _ := r.u32()
	out := appendU32(nil, cnt+extra)
	out = append(out, body[r.off:]...)
	return append(out, add...)
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

// Limits the rewriter enforces (SPEC.md §8.6). Tables live outside the
// memory cap, so their size is bounded here; call depth is bounded because
// wazero keeps a grown call stack (up to 400 MB) for as long as the instance
// lives.
const (
	// MaxTableElements bounds every table: a larger initial size is
	// refused, a larger or missing maximum is lowered to it (table.grow past
	// it returns -1). 8 bytes per element: 512 KiB per table.
	MaxTableElements = 65536
	// MaxTables bounds the number of tables a module may declare or import.
	MaxTables = 4
	// MaxCallDepth bounds nested wasm calls within one host call; the call
	// that would go deeper traps.
	MaxCallDepth = 10000
)

// DepthExport is the name under which Rewrite exports the call-depth global
// (a mutable i32 counting the frames still allowed): the host sets it to
// MaxCallDepth before a call and finds it negative after a depth trap.
const DepthExport = "__rmaw_depth"

// Bulk instructions (0xfc sub-opcodes) whose last operand is a length, and
// how far that length is shifted right to give its extra fuel: one unit per
// 64 bytes of memory, per 8 table elements (8 bytes each).
func bulkShift(sub uint32) (int64, bool) {
	switch sub {
	case 8, 10, 11: // memory.init, memory.copy, memory.fill
		return 6, true
	case 12, 14, 15, 17: // table.init, table.copy, table.grow, table.fill
		return 3, true
	}
	return 0, false
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
		body, err := r.prefixed()
		if err != nil {
			return nil, err
		}
		secs = append(secs, section{id, body})
	}
	secs, err := boundVectors(secs)
	if err != nil {
		return nil, err
	}

	// Count globals (imported + defined) and tables, read the types and
	// find the sections we edit.
	var nGlobals, nTables uint32
	var types [][]byte // result types of each function type
	var funcs []uint32 // type index of each defined function
	typeSec, globalSec, exportSec, codeSec := -1, -1, -1, -1
	for i, s := range secs {
		switch s.id {
		case 1:
			typeSec = i
			var err error
			if types, err = readTypes(s.body); err != nil {
				return nil, err
			}
		case 2: // import
			sr := &reader{b: s.body}
			cnt, err := sr.u32()
			if err != nil {
				return nil, err
			}
			for j := uint32(0); j < cnt; j++ {
				for k := 0; k < 2; k++ { // module, name
					if _, err := sr.prefixed(); err != nil {
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
					nTables++
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
		case 3:
			sr := &reader{b: s.body}
			cnt, err := sr.u32()
			if err != nil {
				return nil, err
			}
			for j := uint32(0); j < cnt; j++ {
				ti, err := sr.u32()
				if err != nil {
					return nil, err
				}
				funcs = append(funcs, ti)
			}
		case 4:
			body, n, err := clampTables(s.body)
			if err != nil {
				return nil, err
			}
			secs[i].body = body
			nTables += n
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
	if nTables > MaxTables {
		return nil, fmt.Errorf("module has %d tables; the limit is %d", nTables, MaxTables)
	}
	// Appended globals: the fuel counter, a scratch i32 for bulk lengths
	// and the call-depth counter.
	g := globals{fuel: nGlobals, scratch: nGlobals + 1, depth: nGlobals + 2}

	// Global section: append them.
	newGlobals := []byte{0x7e, 0x01, 0x42, 0x00, 0x0b, 0x7f, 0x01, 0x41, 0x00, 0x0b, 0x7f, 0x01, 0x41}
	newGlobals = appendS64(newGlobals, MaxCallDepth)
	newGlobals = append(newGlobals, 0x0b)
	if globalSec >= 0 {
		secs[globalSec].body = extend(secs[globalSec].body, 3, newGlobals)
	} else {
		secs = insertSection(secs, section{6, append([]byte{3}, newGlobals...)})
		typeSec, exportSec, codeSec = findSec(secs, 1), findSec(secs, 7), findSec(secs, 10)
	}

	// Export section: append the fuel and depth globals; refuse a clash.
	exp := appendName(nil, FuelExport)
	exp = append(exp, 0x03)
	exp = appendU32(exp, g.fuel)
	exp = appendName(exp, DepthExport)
	exp = append(exp, 0x03)
	exp = appendU32(exp, g.depth)
	if exportSec >= 0 {
		sr := &reader{b: secs[exportSec].body}
		cnt, err := sr.u32()
		if err != nil {
			return nil, err
		}
		for j := uint32(0); j < cnt; j++ {
			name, err := sr.prefixed()
			if err != nil {
				return nil, err
			}
			if string(name) == FuelExport || string(name) == DepthExport {
				return nil, fmt.Errorf("module exports the reserved name %q", name)
			}
			kind, err := sr.byte()
			if err != nil {
				return nil, err
			}
			idx, err := sr.u32()
			if err != nil {
				return nil, err
			}
			if kind == 3 && idx >= nGlobals {
				return nil, fmt.Errorf("%w: export %q names global %d of %d", errMeter, name, idx, nGlobals)
			}
		}
		secs[exportSec].body = extend(secs[exportSec].body, 2, exp)
	} else {
		secs = insertSection(secs, section{7, append([]byte{2}, exp...)})
		typeSec, codeSec = findSec(secs, 1), findSec(secs, 10)
	}

	// Code section.
	if codeSec >= 0 {
		m := &coder{g: g, types: types, funcs: funcs, nGlobals: nGlobals}
		nb, err := m.code(secs[codeSec].body)
		if err != nil {
			return nil, err
		}
		secs[codeSec].body = nb
		if len(m.newTypes) > 0 { // block types for multi-value results
			if typeSec < 0 {
				return nil, fmt.Errorf("%w: code without a type section", errMeter)
			}
			var add []byte
			for _, res := range m.newTypes {
				add = append(add, 0x60, 0x00)
				add = appendU32(add, uint32(len(res)))
				add = append(add, res...)
			}
			secs[typeSec].body = extend(secs[typeSec].body, uint32(len(m.newTypes)), add)
		}
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

// readTypes returns the result types of each entry of a type section.
func readTypes(body []byte) ([][]byte, error) {
	r := &reader{b: body}
	cnt, err := r.u32()
	if err != nil {
		return nil, err
	}
	var types [][]byte
	for i := uint32(0); i < cnt; i++ {
		form, err := r.byte()
		if err != nil {
			return nil, err
		}
		if form != 0x60 {
			return nil, fmt.Errorf("%w: type %d has form 0x%02x (want a function type)", errMeter, i, form)
		}
		var res []byte
		for k := 0; k < 2; k++ { // parameters, results
			if res, err = r.prefixed(); err != nil {
				return nil, err
			}
		}
		types = append(types, res)
	}
	return types, nil
}

// clampTables refuses tables that start above MaxTableElements and lowers
// a larger or missing maximum to it, so table.grow past it returns -1.
func clampTables(body []byte) ([]byte, uint32, error) {
	r := &reader{b: body}
	cnt, err := r.u32()
	if err != nil {
		return nil, 0, err
	}
	out := appendU32(nil, cnt)
	for i := uint32(0); i < cnt; i++ {
		rt, err := r.byte()
		if err != nil {
			return nil, 0, err
		}
		flag, err := r.byte()
		if err != nil {
			return nil, 0, err
		}
		if flag > 1 {
			return nil, 0, fmt.Errorf("%w: table %d has limits flag %d", errMeter, i, flag)
		}
		lo, err := r.u32()
		if err != nil {
			return nil, 0, err
		}
		hi := uint32(MaxTableElements)
		if flag == 1 {
			if hi, err = r.u32(); err != nil {
				return nil, 0, err
			}
			hi = min(hi, MaxTableElements)
		}
		if lo > MaxTableElements {
			return nil, 0, fmt.Errorf("table %d starts with %d elements; the limit is %d", i, lo, MaxTableElements)
		}
		out = append(out, rt, 1)
		out = appendU32(out, lo)
		out = appendU32(out, hi)
	}
	if !r.eof() {
		return nil, 0, fmt.Errorf("%w: trailing bytes in the table section", errMeter)
	}
	return out, cnt, nil
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

type globals struct{ fuel, scratch, depth uint32 }

func appendCharge(b []byte, fuel uint32, n int64) []byte {
	b = append(b, 0x23) // global.get
	b = appendU32(b, fuel)
	b = append(b, 0x42) // i64.const
	b = appendS64(b, n)
	b = append(b, 0x7d, 0x24) // i64.sub; global.set
	b = appendU32(b, fuel)
	return appendFuelCheck(b, fuel)
}

// appendFuelCheck traps when the fuel global is negative.
func appendFuelCheck(b []byte, fuel uint32) []byte {
	b = append(b, 0x23)
	b = appendU32(b, fuel)
	b = append(b, 0x42, 0x00, 0x53) // i64.const 0; i64.lt_s
	return append(b, 0x04, 0x40, 0x00, 0x0b)
}

// appendBulkCharge charges len>>shift for the length on top of the stack and
// leaves it there (through the scratch global: no locals to declare).
func appendBulkCharge(b []byte, g globals, shift int64) []byte {
	b = append(b, 0x24)
	b = appendU32(b, g.scratch)
	b = append(b, 0x23)
	b = appendU32(b, g.fuel)
	b = append(b, 0x23)
	b = appendU32(b, g.scratch)
	b = append(b, 0xad, 0x42) // i64.extend_i32_u; i64.const
	b = appendS64(b, shift)
	b = append(b, 0x88, 0x7d, 0x24) // i64.shr_u; i64.sub; global.set
	b = appendU32(b, g.fuel)
	b = appendFuelCheck(b, g.fuel)
	b = append(b, 0x23)
	return appendU32(b, g.scratch)
}

// appendDepthEnter takes one frame from the depth global and traps when
// none is left; appendDepthLeave gives it back.
func appendDepthEnter(b []byte, depth uint32) []byte {
	b = append(b, 0x23)
	b = appendU32(b, depth)
	b = append(b, 0x41, 0x01, 0x6b, 0x24) // i32.const 1; i32.sub; global.set
	b = appendU32(b, depth)
	b = append(b, 0x23)
	b = appendU32(b, depth)
	b = append(b, 0x41, 0x00, 0x48) // i32.const 0; i32.lt_s
	return append(b, 0x04, 0x40, 0x00, 0x0b)
}

func appendDepthLeave(b []byte, depth uint32) []byte {
	b = append(b, 0x23)
	b = appendU32(b, depth)
	b = append(b, 0x41, 0x01, 0x6a, 0x24) // i32.const 1; i32.add; global.set
	return appendU32(b, depth)
}

type coder struct {
	g        globals
	types    [][]byte
	funcs    []uint32
	nGlobals uint32
	newTypes [][]byte // () -> results types appended for block types
}

// blockType returns the block type with no parameters and the results of
// function type ti.
func (m *coder) blockType(b []byte, ti uint32) ([]byte, error) {
	if int(ti) >= len(m.types) {
		return nil, fmt.Errorf("%w: type index %d out of range", errMeter, ti)
	}
	res := m.types[ti]
	switch len(res) {
	case 0:
		return append(b, 0x40), nil
	case 1:
		return append(b, res[0]), nil
	}
	for i, t := range m.newTypes {
		if bytes.Equal(t, res) {
			return appendS64(b, int64(len(m.types)+i)), nil
		}
	}
	m.newTypes = append(m.newTypes, res)
	return appendS64(b, int64(len(m.types)+len(m.newTypes)-1)), nil
}

// code rewrites a code section. Each body becomes
//
//	depth-enter; charge; block (result ...) <body, return -> br> end; depth-leave; end
//
// so that every way out of the function (falling off the end, return, a
// branch to the function's label) passes depth-leave.
func (m *coder) code(body []byte) ([]byte, error) {
	r := &reader{b: body}
	cnt, err := r.u32()
	if err != nil {
		return nil, err
	}
	if int(cnt) != len(m.funcs) {
		return nil, fmt.Errorf("%w: %d function bodies for %d functions", errMeter, cnt, len(m.funcs))
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
		var locals uint64
		for j := uint32(0); j < nl; j++ {
			n, err := fb.u32()
			if err != nil {
				return nil, err
			}
			if locals += uint64(n); locals > MaxLocals {
				return nil, fmt.Errorf("function %d declares more than %d locals (the limit)", i, MaxLocals)
			}
			if _, err := fb.byte(); err != nil {
				return nil, err
			}
		}
		codeStart := fb.off
		// Pass 1: costs per scope, in order of appearance (function first).
		costs, err = scanCosts(fb, costs[:0], m.nGlobals)
		if err != nil {
			return nil, fmt.Errorf("function %d: %w", i, err)
		}
		// Pass 2: emit with charges.
		fn = append(fn[:0], fb.b[:codeStart]...)
		fn = appendDepthEnter(fn, m.g.depth)
		fn = appendCharge(fn, m.g.fuel, costs[0])
		fn = append(fn, 0x02)
		if fn, err = m.blockType(fn, m.funcs[i]); err != nil {
			return nil, err
		}
		ci := 1
		open := 0 // blocks open inside the wrapper
		fb.off = codeStart
		for !fb.eof() {
			ins := fb.off
			op, _ := fb.byte()
			if err := skipImmediates(fb, op); err != nil {
				return nil, err
			}
			switch op {
			case 0x02, 0x03, 0x04:
				open++
			case 0x0b:
				open--
			case 0x0f: // return: branch to the wrapper, which has the same results
				fn = append(fn, 0x0c)
				fn = appendU32(fn, uint32(open))
				continue
			case 0xfc:
				sr := &reader{b: fb.b, off: ins + 1}
				sub, _ := sr.u32()
				if shift, ok := bulkShift(sub); ok {
					fn = appendBulkCharge(fn, m.g, shift)
				}
			}
			fn = append(fn, fb.b[ins:fb.off]...)
			if op == 0x03 {
				fn = appendCharge(fn, m.g.fuel, costs[ci])
				ci++
			}
			if open < 0 { // the function's end closed the wrapper
				fn = appendDepthLeave(fn, m.g.depth)
				fn = append(fn, 0x0b)
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
