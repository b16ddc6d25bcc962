package meter

import "fmt"

// MaxLocals bounds the locals one function may declare (the figure the
// web's engines use, so every module that runs in a browser fits). wazero
// reserves room for every declared local before it validates the body: a
// 20-byte module declaring 2^32-1 locals made it allocate 4 GiB and spin
// through them, and the host process died of it.
const MaxLocals = 50000

// boundVectors checks every count a decoder would allocate for before
// reading what it counts: a vector cannot hold more entries than there are
// bytes left to hold them, and a byte string cannot be longer than what
// remains. wazero sizes its slices from these counts as read, so a module
// of a few bytes could otherwise ask the host for hundreds of gigabytes
// and kill the process (a fatal out-of-memory is not a recoverable panic).
// The sections the rewriter walks entry by entry (types, imports,
// functions, tables, exports, code) are bounded by that walk. A malformed
// "name" custom section is dropped rather than refused: names only label
// backtraces.
func boundVectors(secs []section) ([]section, error) {
	for i := 0; i < len(secs); i++ {
		s := secs[i]
		var err error
		switch s.id {
		case 0:
			if customName(s.body) == "name" && checkNames(s.body) != nil {
				secs = append(secs[:i], secs[i+1:]...)
				i--
			}
		case 6: // global
			err = checkCount(s.body, "global")
		case 9:
			err = checkElements(s.body)
		case 11:
			err = checkData(s.body)
		case 13: // tag
			err = checkCount(s.body, "tag")
		}
		if err != nil {
			return nil, err
		}
	}
	return secs, nil
}

// vector reads a count and refuses one larger than the bytes left.
func (r *reader) vector(what string) (uint32, error) {
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	if left := len(r.b) - r.off; int64(n) > int64(left) {
		return 0, fmt.Errorf("%w: %s count %d exceeds the %d bytes left", errMeter, what, n, left)
	}
	return n, nil
}

func checkCount(body []byte, what string) error {
	_, err := (&reader{b: body}).vector(what)
	return err
}

// skipConstExpr skips a constant expression up to its end opcode.
func skipConstExpr(r *reader) error {
	for {
		op, err := r.byte()
		if err != nil {
			return err
		}
		if op == 0x0b {
			return nil
		}
		if err := skipImmediates(r, op); err != nil {
			return err
		}
	}
}

// eachSegment walks a vector of segments that each start with their
// flags (the element and data sections), calling seg for the rest of each.
func eachSegment(body []byte, what string, seg func(r *reader, i, flags uint32) error) error {
	r := &reader{b: body}
	cnt, err := r.vector(what)
	if err != nil {
		return err
	}
	for i := uint32(0); i < cnt; i++ {
		flags, err := r.u32()
		if err != nil {
			return err
		}
		if err := seg(r, i, flags); err != nil {
			return err
		}
	}
	return nil
}

// checkElements walks the element section in its eight encodings.
func checkElements(body []byte) error {
	return eachSegment(body, "element segment", func(r *reader, i, flags uint32) error {
		if flags > 7 {
			return fmt.Errorf("%w: element segment %d has flags %d", errMeter, i, flags)
		}
		if flags == 2 || flags == 6 { // explicit table index
			if _, err := r.u32(); err != nil {
				return err
			}
		}
		if flags&1 == 0 { // active: an offset expression
			if err := skipConstExpr(r); err != nil {
				return err
			}
		}
		if flags&3 != 0 { // an element kind (0x00) or a reference type
			k, err := r.byte()
			if err != nil {
				return err
			}
			if k != 0x00 && k != 0x70 && k != 0x6f {
				return fmt.Errorf("%w: element segment %d has type 0x%02x", errMeter, i, k)
			}
		}
		n, err := r.vector("element")
		if err != nil {
			return err
		}
		for j := uint32(0); j < n; j++ {
			if flags&4 == 0 {
				_, err = r.u32() // function index
			} else {
				err = skipConstExpr(r)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// checkData walks the data section in its three encodings.
func checkData(body []byte) error {
	return eachSegment(body, "data segment", func(r *reader, i, flags uint32) error {
		var err error
		switch flags {
		case 0:
			err = skipConstExpr(r)
		case 1:
		case 2:
			if _, err = r.u32(); err == nil {
				err = skipConstExpr(r)
			}
		default:
			err = fmt.Errorf("%w: data segment %d has flags %d", errMeter, i, flags)
		}
		if err != nil {
			return err
		}
		n, err := r.vector("data byte")
		if err != nil {
			return err
		}
		return r.skip(int(n))
	})
}

// customName returns a custom section's name, or "" when unreadable.
func customName(body []byte) string {
	r := &reader{b: body}
	n, err := r.vector("name byte")
	if err != nil {
		return ""
	}
	return string(body[r.off : r.off+int(n)])
}

// checkNames accepts a name section only when every subsection parses
// exactly within its own size, so a decoder reading it in sequence never
// meets a count larger than its bytes.
func checkNames(body []byte) error {
	r := &reader{b: body}
	n, err := r.vector("name byte")
	if err != nil {
		return err
	}
	r.off += int(n)
	for !r.eof() {
		id, err := r.byte()
		if err != nil {
			return err
		}
		size, err := r.vector("subsection byte")
		if err != nil {
			return err
		}
		sub := &reader{b: r.b[r.off : r.off+int(size)]}
		r.off += int(size)
		switch id {
		case 0: // module name
			err = skipName(sub)
		case 1: // function names
			err = skipNameMap(sub)
		case 2: // local names
			var fns uint32
			if fns, err = sub.vector("function"); err == nil {
				for j := uint32(0); j < fns && err == nil; j++ {
					if _, err = sub.u32(); err == nil {
						err = skipNameMap(sub)
					}
				}
			}
		default:
			continue // skipped by size
		}
		if err != nil {
			return err
		}
		if !sub.eof() {
			return fmt.Errorf("%w: name subsection %d has trailing bytes", errMeter, id)
		}
	}
	return nil
}

func skipName(r *reader) error {
	n, err := r.vector("name byte")
	if err != nil {
		return err
	}
	return r.skip(int(n))
}

func skipNameMap(r *reader) error {
	n, err := r.vector("name")
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		if _, err := r.u32(); err != nil {
			return err
		}
		if err := skipName(r); err != nil {
			return err
		}
	}
	return nil
}
