package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

var info = backend.ContextInfo{CommID: 42, NRanks: 4, Rank: 1, Contexts: 1}

func TestValidationErrors(t *testing.T) {
	notWasm := filepath.Join(t.TempDir(), "text.wasm")
	writeFile(t, notWasm, []byte("hello, I am not wasm"))
	cases := []struct{ path, want string }{
		{notWasm, "not a WebAssembly module"},
		{wat(t, "no_marker"), `missing export "rmaw_abi_v1"`},
		{wat(t, "abi_v2"), "declares Guest ABI v2; this host speaks rmaw_abi_v1"},
		{wat(t, "missing_init"), `missing export "rmaw_init" (i64) -> (i64)`},
		{wat(t, "bad_import"), "imports env.socket, which this host does not provide"},
		{wat(t, "wrong_sig"), `export "rmaw_init" has type (i32) -> (i32), Guest ABI v1 wants (i64) -> (i64)`},
		{wat(t, "bad_area"), "descriptor area at 0xffdc: not 8-byte aligned"},
		{wat(t, "bigmem"), "memory"},
		{wat(t, "lane_events_alone"), "enabled lane events without completions"},
		{filepath.Join(t.TempDir(), "absent.wasm"), "no such file"},
	}
	for _, c := range cases {
		_, err := Open(testOptions(t, c.path, ""))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", filepath.Base(c.path), err, c.want)
		}
	}
	if _, err := Open(Options{Name: "planner", CacheDir: "off"}); err == nil || !strings.Contains(err.Error(), "NCCL_RMA_WASM_DIR") {
		t.Errorf("module name without a directory: %v", err)
	}
}

func TestDefaultBackend(t *testing.T) {
	for _, name := range []string{"", "default"} {
		b := mustOpen(t, testOptions(t, name, ""))
		if b.Name() != "default" {
			t.Fatalf("name %q", b.Name())
		}
		if got, want := b.Devices(), (backend.Native{}).Devices(); len(got) != 1 || got[0] != want[0] {
			t.Fatalf("devices %+v, want %+v", got, want)
		}
		p, err := b.ConnectionPlan(4, 0)
		if err != nil || p != backend.DefaultConnPlan() {
			t.Fatalf("conn plan %+v %v", p, err)
		}
		c, err := b.NewContext(info)
		if err != nil {
			t.Fatal(err)
		}
		if c.PlansOps() || c.WantsCompletions() {
			t.Fatal("the embedded default must not ask for per-op calls")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWASIDenied: a guest that asks WASI for files, environment, arguments,
// clocks, randomness or sockets gets nothing useful.
func TestWASIDenied(t *testing.T) {
	t.Setenv("SECRET_TOKEN", "hunter2")
	b := mustOpen(t, testOptions(t, wat(t, "wasi_probe"), ""))
	read := func(in *instance) (errno, env, args uint32, c0, c1 uint64, rnd []byte, prestat, accept uint32) {
		m := in.mem
		errno, _ = m.ReadUint32Le(2048)
		env, _ = m.ReadUint32Le(2052)
		args, _ = m.ReadUint32Le(2056)
		c0, _ = m.ReadUint64Le(2064)
		c1, _ = m.ReadUint64Le(2072)
		r, _ := m.Read(2080, 16)
		rnd = append([]byte(nil), r...)
		prestat, _ = m.ReadUint32Le(2096)
		accept, _ = m.ReadUint32Le(2100)
		return
	}
	errno, env, args, c0, c1, rnd, prestat, accept := read(b.ctl)
	if errno == 0 {
		t.Error("path_open succeeded")
	}
	if prestat == 0 {
		t.Error("fd_prestat_get found a preopened directory")
	}
	if accept == 0 {
		t.Error("sock_accept succeeded")
	}
	if env != 0 || args != 0 {
		t.Errorf("environ count %d, args count %d; want 0, 0", env, args)
	}
	const jan2023 = uint64(1672531200) * 1e9
	if c0 >= jan2023 || c1 >= jan2023 {
		t.Errorf("realtime clock reads %d, %d: a real clock leaked (the fake one starts at 2022-01-01)", c0, c1)
	}
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _, _, _, _, rnd2, _, _ := read(c.(*guestContext).in)
	if string(rnd) != string(rnd2) {
		t.Errorf("random_get differs between instances (%x vs %x): not the deterministic source", rnd, rnd2)
	}
	t.Logf("path_open errno %d, prestat errno %d, sock_accept errno %d, clock %d -> %d", errno, prestat, accept, c0, c1)
}

func TestMemoryCap(t *testing.T) {
	path := wat(t, "grow") // grows by 128 MiB in rmaw_init
	o := testOptions(t, path, "")
	o.MemoryLimitMiB = 64
	if _, err := Open(o); err == nil || !strings.Contains(err.Error(), "status -3") {
		t.Fatalf("64 MiB cap: %v, want rmaw_init's NOMEM status", err)
	}
	o.MemoryLimitMiB = 256
	mustOpen(t, o)
}

func planOp(c backend.Context, size uint64) (backend.OpPlan, error) {
	p := backend.OpPlan{Lane: -1}
	err := c.PlanOp(&backend.Op{Kind: backend.OpPut, Peer: 1, Size: size}, &p)
	return p, err
}

// TestTraps: unreachable, out-of-bounds and stack overflow in plan_op
// return errors, the instance is replaced, and MaxFaults disables.
func TestTraps(t *testing.T) {
	path := wat(t, "traps")
	for _, tc := range []struct {
		name string
		size uint64
		want string
	}{{"unreachable", 1, "unreachable"}, {"oob", 2, "out of bounds"}} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustOpen(t, testOptions(t, path, ""))
			c, err := b.NewContext(info)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for i := 1; i <= MaxFaults; i++ {
				_, err := planOp(c, tc.size)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("fault %d: %v", i, err)
				}
				if i < MaxFaults {
					if p, err := planOp(c, 0); err != nil || p.Lane != 0 {
						t.Fatalf("after fault %d the replaced instance should serve: %+v %v", i, p, err)
					}
				}
			}
			if _, err := planOp(c, 0); !errors.Is(err, backend.ErrDisabled) {
				t.Fatalf("after %d faults: %v, want ErrDisabled", MaxFaults, err)
			}
			if _, err := b.NewContext(info); !errors.Is(err, backend.ErrDisabled) {
				t.Fatalf("NewContext on a disabled backend: %v", err)
			}
		})
	}
}

// TestRecursion: unbounded recursion is stopped by the call-depth limit
// (meter.MaxCallDepth) before wazero's 400 MB stack ceiling or the fuel
// budget: a trap, so a fault that replaces the instance.
func TestRecursion(t *testing.T) {
	b := mustOpen(t, testOptions(t, wat(t, "traps"), ""))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := planOp(c, 3); err == nil || !strings.Contains(err.Error(), "call depth limit") {
		t.Fatalf("recursion: %v, want the call depth trap", err)
	} else {
		t.Logf("recursion stopped after %v: %v", time.Since(start), err)
	}
	if p, err := planOp(c, 0); err != nil || p.Lane != 0 {
		t.Fatalf("after runaway recursion the replaced instance should serve: %+v %v", p, err)
	}
}

// TestHangPlanOp: an infinite loop in plan_op is stopped within a bounded
// time (its fuel budget) and disables the backend.
func TestHangPlanOp(t *testing.T) {
	b := mustOpen(t, testOptions(t, wat(t, "traps"), ""))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, err = planOp(c, 4)
	el := time.Since(start)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	// ErrTimeout proves the budget stopped the loop; how long that took is
	// for the benchmarks, not for an assertion on a shared machine.
	t.Logf("plan_op loop stopped after %v (budget %d instructions): %v", el, b.planFuel, err)
	if !b.Disabled() {
		t.Fatal("a guest that does not return must disable the backend")
	}
}

// TestHangInit: infinite loops in rmaw_init (WAT and C) make Open fail in
// bounded time.
func TestHangInit(t *testing.T) {
	for _, o := range []Options{testOptions(t, wat(t, "loop_init"), ""), testOptions(t, cguest(t, "planner"), "hang=1")} {
		start := time.Now()
		_, err := Open(o)
		el := time.Since(start)
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("%s: got %v, want ErrTimeout", o.Name, err)
		}
		// ErrTimeout is the proof: only the deadline ends the loop.
		t.Logf("init loop stopped after %v (timeout %v): %v", el, o.CallTimeout, err)
	}
}

func TestNonsenseAnswers(t *testing.T) {
	b := mustOpen(t, testOptions(t, wat(t, "traps"), ""))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := planOp(c, 5); err == nil || !strings.Contains(err.Error(), "status 99") {
		t.Fatalf("status 99: %v", err)
	}
	if _, err := planOp(c, 6); err == nil || !strings.Contains(err.Error(), "lane 1000") {
		t.Fatalf("lane 1000: %v", err)
	}
}

func TestPlannerPolicy(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile(cguest(t, "planner"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "planner.wasm"), src)
	writeFile(t, filepath.Join(dir, "planner.conf"), []byte("lanes=2, stripe=1k, fail_every=5\n"))
	b := mustOpen(t, Options{Name: "planner", Dir: dir, CacheDir: "off"})
	if b.Name() != "planner" {
		t.Fatal(b.Name())
	}
	cp, err := b.ConnectionPlan(4, 0)
	if err != nil || cp.Lanes != 2 || cp.StripeThreshold != 1024 {
		t.Fatalf("conn plan from planner.conf: %+v %v", cp, err)
	}
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	var lanes []int32
	for i := 1; i <= 5; i++ {
		p, err := planOp(c, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if i == 5 {
			if p.Status != int32(abi.InvalidArgument) {
				t.Fatalf("op 5 status %d, want fault injection", p.Status)
			}
		} else {
			lanes = append(lanes, p.Lane)
		}
	}
	if want := []int32{0, 1, 0, 1}; len(lanes) != 4 || lanes[0] != want[0] || lanes[1] != want[1] || lanes[3] != want[3] {
		t.Fatalf("striped lanes %v, want %v", lanes, want)
	}
	batch := make([]backend.Completion, 150) // > the guest's ring of 64: split in 3 calls
	for i := range batch {
		batch[i] = backend.Completion{Kind: backend.OpPut, Size: 10, Latency: 1000}
	}
	if err := c.Completions(batch); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	logx.SetSink(func(_ abi.LogLevel, _ uint64, _ string, _ int, msg string) {
		mu.Lock()
		lines = append(lines, msg)
		mu.Unlock()
	})
	defer logx.SetSink(nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(lines, "\n")
	for _, want := range []string{"wasm guest planner: planner: ops planned 5", "wasm guest planner: planner: completions 150", "completed bytes 1500"} {
		if !strings.Contains(all, want) {
			t.Errorf("log lacks %q:\n%s", want, all)
		}
	}
}

// TestPlanOpAllocs: the per-op path allocates nothing.
func TestPlanOpAllocs(t *testing.T) {
	b := mustOpen(t, testOptions(t, cguest(t, "planner"), ""))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	op := &backend.Op{Kind: backend.OpPut, Peer: 1, Size: 8}
	plan := &backend.OpPlan{}
	n := testing.AllocsPerRun(1000, func() {
		plan.Lane = -1
		if err := c.PlanOp(op, plan); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("PlanOp allocates %v times per call", n)
	}
	batch := make([]backend.Completion, 32)
	if n := testing.AllocsPerRun(100, func() { _ = c.Completions(batch) }); n != 0 {
		t.Fatalf("Completions allocates %v times per call", n)
	}
}

// TestConcurrentContexts: Backend methods may run concurrently; each
// Context is used by one goroutine (run with -race).
func TestConcurrentContexts(t *testing.T) {
	b := mustOpen(t, testOptions(t, cguest(t, "planner"), "lanes=8"))
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := b.NewContext(info)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for i := 0; i < 200; i++ {
				if _, err := planOp(c, uint64(i)); err != nil {
					t.Error(err)
					return
				}
				if _, err := b.ConnectionPlan(8, 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestCompilationCacheDir(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, cguest(t, "planner"), "")
	o.CacheDir = dir
	mustOpen(t, o)
	var files int
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			files++
			if strings.HasSuffix(p, ".tmp") {
				t.Errorf("temp file left behind: %s", p)
			}
		}
		return nil
	})
	if files == 0 {
		t.Fatal("nothing written to the compilation cache")
	}
}

// TestGoGuest builds the Go-SDK passthrough (GOOS=wasip1) and loads it:
// WASI is present but denies everything, _initialize runs first.
func TestGoGuest(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go wasip1 module")
	}
	out := filepath.Join(t.TempDir(), "passthrough-go.wasm")
	if err := buildflags.CompileGo(repoRoot(t), "./guests/passthrough-go", out); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	logx.SetSink(func(_ abi.LogLevel, _ uint64, _ string, _ int, msg string) {
		mu.Lock()
		lines = append(lines, msg)
		mu.Unlock()
	})
	defer logx.SetSink(nil)
	o := testOptions(t, out, "")
	o.CallTimeout = DefaultCallTimeout // Go's _initialize fits the default budget
	start := time.Now()
	b := mustOpen(t, o)
	t.Logf("Go guest compiled+instantiated+initialised in %v", time.Since(start))
	if d := b.Devices(); len(d) != 1 || d[0].Name != "wasm-tcp" {
		t.Fatalf("devices %+v", d)
	}
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	if c.PlansOps() {
		t.Fatal("passthrough-go must not plan ops")
	}
	c.Close()
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(lines, "\n"), "wasm guest passthrough-go: passthrough-go: ready") {
		t.Fatalf("log: %q", lines)
	}
}
