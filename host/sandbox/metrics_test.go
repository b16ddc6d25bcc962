package sandbox

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

// hostLabels matches what render adds, so its output can be checked as
// guest text.
var hostLabels = regexp.MustCompile(`rank="\d+",ctx="\d+",?`)

func TestCheckMetrics(t *testing.T) {
	good := "# HELP a_total x y\n# TYPE a_total counter\na_total{peer=\"1\",kind=\"put\"} 3\nb 1.5e-3 1700000000\nc{} +Inf\n# comment\n\n"
	if err := checkMetrics([]byte(good)); err != nil {
		t.Fatalf("good text refused: %v", err)
	}
	for _, bad := range []string{
		"1abc 3", "a-b 3", "a{peer=1} 3", `a{peer="1} 3`, `a{peer="1"} `, `a{peer="1"} x`, `a 1 2.5`,
		`a{rank="3"} 1`, `a{ctx="3"} 1`, `a{p="\q"} 1`, "# TYPE a frobnicator", "# TYPE 1a counter", "a\r 1",
		"a 1\x00", string([]byte{'a', ' ', 0xff}), `a{p="x"}1`, `a{p="x" q="y"} 1`,
	} {
		if err := checkMetrics([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRenderMerges(t *testing.T) {
	a := []byte("# HELP m_total ops\n# TYPE m_total counter\nm_total{peer=\"1\"} 3\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n")
	b := []byte("# HELP m_total ops\n# TYPE m_total counter\nm_total{peer=\"1\"} 4\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 0.1\nh_count 1\n")
	got := string(render([]labelled{{rank: 0, ctx: 1, text: a}, {rank: 0, ctx: 2, text: b}}))
	want := `# HELP m_total ops
# TYPE m_total counter
m_total{rank="0",ctx="1",peer="1"} 3
m_total{rank="0",ctx="2",peer="1"} 4
# TYPE h histogram
h_bucket{rank="0",ctx="1",le="+Inf"} 2
h_sum{rank="0",ctx="1"} 0.5
h_count{rank="0",ctx="1"} 2
h_bucket{rank="0",ctx="2",le="+Inf"} 1
h_sum{rank="0",ctx="2"} 0.1
h_count{rank="0",ctx="2"} 1
`
	if got != want {
		t.Fatalf("render:\n%s\nwant:\n%s", got, want)
	}
	if err := checkMetrics(hostLabels.ReplaceAll([]byte(got), nil)); err != nil {
		t.Fatal(err)
	}
}

// TestTelemetryExport: the telemetry guest's counters reach the file and
// the loopback endpoint with the host's labels, and match the records fed.
func TestTelemetryExport(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, cguest(t, "telemetry"), "")
	o.MetricsFile = filepath.Join(dir, "m-%p.prom")
	o.MetricsAddr = "127.0.0.1:0"
	o.MetricsInterval = time.Hour // only the close refreshes
	b := mustOpen(t, o)
	if b.MetricsAddr() == "" {
		t.Fatal("no endpoint")
	}
	var batch []backend.Completion
	for i := 0; i < 300; i++ { // more than the ring holds
		batch = append(batch, backend.Completion{Kind: backend.OpKind(1 + i%4), Peer: uint32(i % 3), Size: uint64(i), Latency: 3000, Lane: -1})
	}
	batch = append(batch, backend.Completion{Kind: backend.OpPut, Peer: 100, Size: 7, Status: 6, Latency: 5e9})
	for ctx := 0; ctx < 2; ctx++ {
		c, err := b.NewContext(backend.ContextInfo{CommID: 1, NRanks: 200, Rank: 5, Contexts: 2})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Completions(batch); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Get("http://" + b.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	b.Close()
	file, err := os.ReadFile(filepath.Join(dir, "m-"+strconv.Itoa(os.Getpid())+".prom"))
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != string(file) {
		t.Fatalf("endpoint and file differ:\n%s\n---\n%s", body, file)
	}
	text := string(file)
	if err := checkMetrics(hostLabels.ReplaceAll(file, nil)); err != nil {
		t.Fatal(err)
	}
	sum := func(re string) (s float64) {
		for _, m := range regexp.MustCompile(`(?m)^`+re+` (\S+)$`).FindAllStringSubmatch(text, -1) {
			v, _ := strconv.ParseFloat(m[1], 64)
			s += v
		}
		return s
	}
	// 301 records per context, two contexts.
	if got := sum(`rmaw_ops_total\{rank="5",ctx="\d+",peer="\w+",kind="\w+"\}`); got != 602 {
		t.Errorf("ops %v, want 602\n%s", got, text)
	}
	if got := sum(`rmaw_ops_total\{rank="5",ctx="\d+",peer="1",kind="get"\}`); got != 2*25 {
		t.Errorf("peer 1 gets %v, want 50", got) // i%3==1 && i%4==2: i = 10, 22, ... (25 of 300)
	}
	if got := sum(`rmaw_bytes_total\{rank="5",ctx="\d+",peer="\w+",kind="\w+"\}`); got != 2*(299*300/2+7) {
		t.Errorf("bytes %v", got)
	}
	if got := sum(`rmaw_op_errors_total\{rank="5",ctx="\d+",peer="other"\}`); got != 2 {
		t.Errorf("errors of peer other %v, want 2", got)
	}
	if got := sum(`rmaw_op_latency_seconds_bucket\{rank="5",ctx="\d+",peer="0",le="4\.000000000e-06"\}|rmaw_op_latency_seconds_bucket\{rank="5",ctx="\d+",peer="0",le="0\.000004000"\}`); got != 200 {
		t.Errorf("peer 0 ops within 4 us: %v, want 200\n%s", got, text)
	}
	if got := sum(`rmaw_op_latency_seconds_bucket\{rank="5",ctx="\d+",peer="other",le="1\.048576000"\}`); got != 0 {
		t.Errorf("a 5 s op counted within 1.05 s: %v", got)
	}
	if got := sum(`rmaw_op_latency_seconds_count\{rank="5",ctx="\d+",peer="other"\}`); got != 2 {
		t.Errorf("peer other count %v", got)
	}
	if strings.Count(text, "# TYPE rmaw_ops_total counter") != 1 {
		t.Errorf("a family is repeated:\n%s", text)
	}
}

func TestMetricsEndpointLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:9464", ":9464", "example.com:1", "nonsense"} {
		o := testOptions(t, cguest(t, "telemetry"), "")
		o.MetricsAddr = addr
		if b, err := open(o); err == nil {
			b.Close()
			t.Errorf("%s accepted", addr)
		} else if !strings.Contains(err.Error(), "metrics endpoint") {
			t.Errorf("%s: %v", addr, err)
		}
	}
	// A module without rmaw_metrics ignores the settings.
	o := testOptions(t, cguest(t, "planner"), "")
	o.MetricsAddr, o.MetricsFile = "127.0.0.1:0", filepath.Join(t.TempDir(), "x.prom")
	b := mustOpen(t, o)
	if b.MetricsAddr() != "" {
		t.Fatal("an endpoint for a module without rmaw_metrics")
	}
}

// TestMetricsHostile: an answer outside memory, too long or not in the text
// format is a fault; nothing reaches the file.
func TestMetricsHostile(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"oob", "i64.const 0x0001000000000010", "outside guest memory"},
		{"long", "i64.const 0x10000000", "the limit is"},
		{"text", "i64.const 0x0000100000000006", "bad metric name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := `(module
  (memory (export "memory") 1)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\f0\02\00\00\01\00\00\00")
  (data (i32.const 4096) "1bad 3\n")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_init") (param i64) (result i64) i64.const 2)
  (func (export "rmaw_area") (result i32) i32.const 1024)
  (func (export "rmaw_completions") (param i32 i32) (result i32) i32.const 0)
  (func (export "rmaw_metrics") (result i64) ` + c.body + `))`
			path := filepath.Join(t.TempDir(), "m.wat")
			writeFile(t, path, []byte(src))
			wasm := filepath.Join(t.TempDir(), "m.wasm")
			if out, err := runWat2wasm(path, wasm); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			o := testOptions(t, wasm, "")
			file := filepath.Join(t.TempDir(), "m.prom")
			o.MetricsFile, o.MetricsInterval = file, time.Nanosecond
			b := mustOpen(t, o)
			ctx, err := b.NewContext(info)
			if err != nil {
				t.Fatal(err)
			}
			err = ctx.Completions([]backend.Completion{{Kind: backend.OpPut, Size: 1}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if b.faults.Load() != 1 {
				t.Fatalf("faults %d, want 1", b.faults.Load())
			}
			ctx.Close()
			b.Close()
			if data, _ := os.ReadFile(file); len(data) != 0 {
				t.Fatalf("the file holds %q", data)
			}
		})
	}
}
