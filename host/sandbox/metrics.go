package sandbox

// Metrics export (SPEC.md §8.11): a guest that exports rmaw_metrics returns
// Prometheus text from its own memory; the host asks each context's
// instance at most once per interval (from the completion path, which
// already holds the context) and when the context closes, adds rank and ctx
// labels, merges the contexts family by family and writes the result to a
// textfile-collector file and/or serves it on a loopback HTTP endpoint. The
// guest never touches a file or a socket.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// DefaultMetricsInterval is how often a context's metrics are refreshed.
const DefaultMetricsInterval = time.Second

// maxMetricsContexts bounds the contexts whose text is kept (the oldest
// closed ones are dropped first).
const maxMetricsContexts = 1024

type ctxMetrics struct {
	rank   int32
	text   []byte
	closed bool
}

type exporter struct {
	backend  string
	file     string
	interval time.Duration

	writeMu  sync.Mutex // one flush at a time (the writer, closing contexts)
	mu       sync.Mutex
	texts    map[int32]*ctxMetrics
	rendered []byte
	warned   bool

	dirty chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup
	srv   *http.Server
	addr  string
}

// newExporter starts the writer and, if addr is set, the HTTP endpoint.
func newExporter(backend, file, addr string, interval time.Duration) (*exporter, error) {
	if interval <= 0 {
		interval = DefaultMetricsInterval
	}
	x := &exporter{backend: backend, file: expandPid(file), interval: interval,
		texts: map[int32]*ctxMetrics{}, dirty: make(chan struct{}, 1), done: make(chan struct{})}
	if addr != "" {
		if err := loopbackOnly(addr); err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("metrics endpoint %s: %w", addr, err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/metrics", x.serve)
		x.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 8 << 10}
		x.addr = ln.Addr().String()
		x.wg.Add(1)
		go func() {
			defer x.wg.Done()
			_ = x.srv.Serve(ln)
		}()
		logx.Info(0, "wasm: backend %s serves its metrics at http://%s/metrics", backend, x.addr)
	}
	x.wg.Add(1)
	go x.writer()
	return x, nil
}

// expandPid replaces %p with the process id: ranks on one host write one
// file each into the collector's directory.
func expandPid(path string) string {
	return strings.ReplaceAll(path, "%p", strconv.Itoa(os.Getpid()))
}

func loopbackOnly(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics endpoint %q: %w (want 127.0.0.1:PORT)", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("metrics endpoint %q: only loopback addresses are served (127.0.0.1:PORT or [::1]:PORT)", addr)
	}
	return nil
}

func (x *exporter) serve(w http.ResponseWriter, _ *http.Request) {
	x.mu.Lock()
	body := x.rendered
	x.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write(body)
}

// set stores a context's text and wakes the writer.
func (x *exporter) set(ctx, rank int32, text []byte, closed bool) {
	x.mu.Lock()
	m := x.texts[ctx]
	if m == nil {
		if len(x.texts) >= maxMetricsContexts {
			x.evictLocked()
		}
		m = &ctxMetrics{rank: rank}
		x.texts[ctx] = m
	}
	m.text, m.closed = text, closed
	x.mu.Unlock()
	if closed {
		// A closing context's final counters are written before Close
		// returns: the backend lives as long as the process, which may exit
		// right after NCCL's finalize.
		x.flush()
		return
	}
	select {
	case x.dirty <- struct{}{}:
	default:
	}
}

// evictLocked drops the oldest closed context, else the oldest.
func (x *exporter) evictLocked() {
	victim, found := int32(0), false
	for id, m := range x.texts {
		if m.closed && (!found || id < victim) {
			victim, found = id, true
		}
	}
	if !found {
		for id := range x.texts {
			if !found || id < victim {
				victim, found = id, true
			}
		}
	}
	delete(x.texts, victim)
}

func (x *exporter) writer() {
	defer x.wg.Done()
	for {
		select {
		case <-x.dirty:
			x.flush()
		case <-x.done:
			x.flush()
			return
		}
	}
}

// flush renders every context's text and writes the file (temp + rename,
// so a collector never reads half a file).
func (x *exporter) flush() {
	x.writeMu.Lock()
	defer x.writeMu.Unlock()
	x.mu.Lock()
	ids := make([]int32, 0, len(x.texts))
	for id := range x.texts {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	parts := make([]labelled, len(ids))
	for i, id := range ids {
		parts[i] = labelled{rank: x.texts[id].rank, ctx: id, text: x.texts[id].text}
	}
	x.mu.Unlock()
	out := render(parts)
	x.mu.Lock()
	x.rendered = out
	x.mu.Unlock()
	if x.file == "" {
		return
	}
	tmp := filepath.Join(filepath.Dir(x.file), "."+filepath.Base(x.file)+".tmp")
	err := os.WriteFile(tmp, out, 0o644)
	if err == nil {
		err = os.Rename(tmp, x.file)
	}
	if err != nil {
		x.mu.Lock()
		first := !x.warned
		x.warned = true
		x.mu.Unlock()
		if first {
			logx.Warn(0, "wasm: backend %s: writing metrics to %s: %v (later failures are not logged)", x.backend, x.file, err)
		}
	}
}

func (x *exporter) close() {
	close(x.done)
	if x.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = x.srv.Shutdown(ctx)
		cancel()
	}
	x.wg.Wait()
}

// ---------------------------------------------------------------- text

type labelled struct {
	rank, ctx int32
	text      []byte
}

type family struct {
	name, help, typ string
	samples         []string
}

// render merges the contexts' texts: one group per metric family (the text
// format wants a family's lines together), each sample with rank and ctx
// labels in front of the guest's own.
func render(parts []labelled) []byte {
	var order []string
	fams := map[string]*family{}
	get := func(name string) *family {
		f := fams[name]
		if f == nil {
			f = &family{name: name}
			fams[name] = f
			order = append(order, name)
		}
		return f
	}
	for _, p := range parts {
		cur := ""
		extra := fmt.Sprintf(`rank="%d",ctx="%d"`, p.rank, p.ctx)
		for _, line := range strings.Split(string(p.text), "\n") {
			switch {
			case line == "":
			case strings.HasPrefix(line, "# HELP "), strings.HasPrefix(line, "# TYPE "):
				fields := strings.SplitN(line[7:], " ", 2)
				cur = fields[0]
				f, rest := get(cur), ""
				if len(fields) == 2 {
					rest = fields[1]
				}
				if line[2] == 'H' && f.help == "" {
					f.help = rest
				} else if line[2] == 'T' && f.typ == "" {
					f.typ = rest
				}
			case line[0] == '#':
			default:
				name := line[:strings.IndexAny(line, "{ ")]
				fam := name
				if cur != "" && strings.HasPrefix(name, cur) {
					switch name[len(cur):] {
					case "", "_bucket", "_sum", "_count", "_total", "_created":
						fam = cur
					}
				}
				rest := line[len(name):]
				if rest[0] == '{' {
					if rest[1] == '}' {
						rest = "{" + extra + rest[1:]
					} else {
						rest = "{" + extra + "," + rest[1:]
					}
				} else {
					rest = "{" + extra + "}" + rest
				}
				f := get(fam)
				f.samples = append(f.samples, name+rest)
			}
		}
	}
	var b bytes.Buffer
	for _, n := range order {
		f := fams[n]
		if f.help != "" {
			fmt.Fprintf(&b, "# HELP %s %s\n", f.name, f.help)
		}
		if f.typ != "" {
			fmt.Fprintf(&b, "# TYPE %s %s\n", f.name, f.typ)
		}
		for _, s := range f.samples {
			b.WriteString(s)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// checkMetrics accepts the subset of the Prometheus text format a guest may
// return: HELP/TYPE/comment lines and samples `name{labels} value [ts]`
// with well-formed names, labels and numbers. One bad line rejects the
// whole answer: a collector would reject the whole file.
func checkMetrics(text []byte) error {
	if !utf8.Valid(text) {
		return errors.New("not UTF-8")
	}
	for i, line := range strings.Split(string(text), "\n") {
		if err := checkLine(line); err != nil {
			return fmt.Errorf("line %d %q: %w", i+1, truncate(line, 80), err)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

var errLine = errors.New("not a Prometheus text-format line")

func checkLine(line string) error {
	if line == "" {
		return nil
	}
	if strings.ContainsAny(line, "\r\x00") {
		return errLine
	}
	if strings.HasPrefix(line, "# TYPE ") {
		f := strings.Fields(line[7:])
		if len(f) != 2 || !validName(f[0]) {
			return errLine
		}
		switch f[1] {
		case "counter", "gauge", "histogram", "summary", "untyped":
			return nil
		}
		return fmt.Errorf("unknown metric type %q", f[1])
	}
	if strings.HasPrefix(line, "# HELP ") {
		f := strings.SplitN(line[7:], " ", 2)
		if !validName(f[0]) {
			return errLine
		}
		return nil
	}
	if line[0] == '#' {
		return nil
	}
	end := strings.IndexAny(line, "{ ")
	if end <= 0 || !validName(line[:end]) {
		return fmt.Errorf("bad metric name")
	}
	rest := line[end:]
	if rest[0] == '{' {
		n, err := checkLabels(rest)
		if err != nil {
			return err
		}
		rest = rest[n:]
	}
	f := strings.Fields(rest)
	if len(rest) == 0 || rest[0] != ' ' || len(f) < 1 || len(f) > 2 {
		return errors.New("want `name{labels} value [timestamp]`")
	}
	if _, err := strconv.ParseFloat(f[0], 64); err != nil {
		return fmt.Errorf("bad value %q", f[0])
	}
	if len(f) == 2 {
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			return fmt.Errorf("bad timestamp %q", f[1])
		}
	}
	return nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkLabels parses `{a="x",b="y"}` at the start of s and returns its
// length. The labels the host adds (rank, ctx) may not appear.
func checkLabels(s string) (int, error) {
	i := 1
	for {
		if i < len(s) && s[i] == '}' {
			return i + 1, nil
		}
		j := i
		for j < len(s) && s[j] != '=' {
			j++
		}
		name := s[i:j]
		if !validName(name) || strings.Contains(name, ":") {
			return 0, fmt.Errorf("bad label name %q", name)
		}
		if name == "rank" || name == "ctx" {
			return 0, fmt.Errorf("label %q is the host's", name)
		}
		if j+1 >= len(s) || s[j+1] != '"' {
			return 0, errors.New("label value must be quoted")
		}
		k := j + 2
		for ; k < len(s) && s[k] != '"'; k++ {
			if s[k] == '\\' {
				if k+1 >= len(s) || !strings.ContainsRune(`\"n`, rune(s[k+1])) {
					return 0, errors.New("bad escape in a label value")
				}
				k++
			}
		}
		if k >= len(s) {
			return 0, errors.New("unterminated label value")
		}
		i = k + 1
		if i < len(s) && s[i] == ',' {
			i++
		} else if i >= len(s) || s[i] != '}' {
			return 0, errors.New("want , or } after a label")
		}
	}
}

// metrics calls rmaw_metrics and returns a copy of its checked text.
func (in *instance) metrics() ([]byte, error) {
	if err := in.call(in.fMetrics, guestabi.ExportMetrics, in.stack[:1], in.b.ctlFuel); err != nil {
		return nil, err
	}
	res := in.stack[0]
	ptr, n := uint32(res>>32), uint32(res)
	if n > guestabi.MaxMetricsLen {
		return nil, fmt.Errorf("%s returned %d bytes, the limit is %d", guestabi.ExportMetrics, n, guestabi.MaxMetricsLen)
	}
	buf, ok := in.mem.Read(ptr, n)
	if !ok {
		return nil, fmt.Errorf("%s returned %d bytes at %#x, outside guest memory", guestabi.ExportMetrics, n, ptr)
	}
	if err := checkMetrics(buf); err != nil {
		return nil, fmt.Errorf("%s: %w", guestabi.ExportMetrics, err)
	}
	return bytes.Clone(buf), nil
}
