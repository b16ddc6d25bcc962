package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The kernels the C files load: which file loads which buffer, and the
// embedded text it must hold.
var kernels = []struct {
	file, buffer, ptx string
}{
	{"agent.c", "rmacu_agent_ptx", agentPTX},
	{"atomics.c", "rmacu_add64_ptx", add64PTX},
}

// TestPTXInC: what the C files hand cuModuleLoadData is the embedded text,
// whole and NUL-terminated (no NUL inside cuts it short), with room left
// in its buffer.
func TestPTXInC(t *testing.T) {
	agent, add64, agentRoom, add64Room := ptxInC()
	for _, c := range []struct {
		name, inC, embedded string
		room                int
	}{{"agent.ptx", agent, agentPTX, agentRoom}, {"atomics.ptx", add64, add64PTX, add64Room}} {
		if strings.IndexByte(c.embedded, 0) >= 0 {
			t.Errorf("%s holds a NUL byte: the driver would read it short", c.name)
		}
		if len(c.embedded) >= c.room {
			t.Errorf("%s is %d bytes: its C buffer holds %d with the NUL; make it larger (cuda_shim.h and the .c file)", c.name, len(c.embedded), c.room)
		}
		if c.inC != c.embedded {
			t.Errorf("%s: the C side holds %d bytes, the embedded file has %d", c.name, len(c.inC), len(c.embedded))
		}
	}
}

// TestPTXEntries: every function a C file looks up with cuModuleGetFunction
// is an .entry of the PTX that file loads with cuModuleLoadData.
func TestPTXEntries(t *testing.T) {
	get := regexp.MustCompile(`moduleGetFunction\([^;]*?"(\w+)"\)`)
	for _, k := range kernels {
		src, err := os.ReadFile(k.file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), "moduleLoadData(&mod, "+k.buffer+")") {
			t.Errorf("%s does not load %s", k.file, k.buffer)
		}
		names := get.FindAllStringSubmatch(string(src), -1)
		if len(names) == 0 {
			t.Errorf("%s looks up no function", k.file)
		}
		for _, m := range names {
			if !strings.Contains(k.ptx, ".visible .entry "+m[1]+"(") {
				t.Errorf("%s looks up %s, which its PTX (%s) does not define", k.file, m[1], k.buffer)
			}
		}
	}
}

// TestPTXUnchanged pins the kernels' bytes: those of the C strings they were
// (cuda.c's add64_ptx and agent.h's agent_ptx) before they moved to .ptx
// files. A deliberate change of a kernel updates its hash here (agent.ptx:
// the kernel parks when idle, and reads where to start from the ring;
// 128-byte slots with the fused landings, inline payloads included; the
// one-read pickup by a slot's check word; the peer inbox, ISCAN; its host
// rows beside the device rows, looked at when the ring is empty; a signal
// write or add that first waits for a peer's mark, kind | 16).
func TestPTXUnchanged(t *testing.T) {
	for _, c := range []struct{ name, ptx, sum string }{
		{"agent.ptx", agentPTX, "48277b394d276e8d5d108104a8dfbedf2f3157d61364afb6e093b83d37a72122"},
		{"atomics.ptx", add64PTX, "c8cfbac9b16b0ac7bee4ea8bc36078d4a233783f6424303d088b4cfba56b86ce"},
	} {
		h := sha256.Sum256([]byte(c.ptx))
		if got := hex.EncodeToString(h[:]); got != c.sum {
			t.Errorf("%s: sha256 %s, want %s (%d bytes)", c.name, got, c.sum, len(c.ptx))
		}
	}
}

// TestAgentAcqRelPTX: the acqrel kernel differs from the shipped one in its
// two publishing fences only (before the signal word, before the done
// word), the park handshake's SC fence kept; a change to the kernel that
// moves either fence fails here instead of loading the shipped text.
func TestAgentAcqRelPTX(t *testing.T) {
	v := agentAcqRelPTX(agentPTX)
	if n := strings.Count(agentPTX, "fence.sc.sys;"); n != 3 {
		t.Fatalf("agent.ptx has %d SC fences, want 3 (park, signal, publish)", n)
	}
	if n := strings.Count(v, "fence.sc.sys;"); n != 1 {
		t.Fatalf("the acqrel kernel keeps %d SC fences, want 1 (the park handshake)", n)
	}
	if !strings.Contains(v, "PARK:\n  mov.u64 %rd34, 0;\n  st.relaxed.sys.u64 [%rd1+192], %rd34;\n  fence.sc.sys;") {
		t.Fatal("the acqrel kernel lost the park handshake's SC fence")
	}
	if strings.Replace(strings.Replace(v, "fence.acq_rel.sys;", "fence.sc.sys;", -1), "fence.sc.sys;", "", -1) !=
		strings.Replace(strings.Replace(agentPTX, "fence.acq_rel.sys;", "fence.sc.sys;", -1), "fence.sc.sys;", "", -1) {
		t.Fatal("the acqrel kernel differs from agent.ptx in more than its fences")
	}
	if strings.Count(v, "fence.acq_rel.sys;") != strings.Count(agentPTX, "fence.acq_rel.sys;")+2 {
		t.Fatal("the acqrel kernel does not have two more acquire-release fences")
	}
}

// TestAgentCheckWordConstants: the one-read kernel's check (agent.ptx,
// POLLW: each of the first warp's lanes mixes its two words, the warp
// XORs the lanes' terms) and the host's (agent.c, ag_check) use the same
// constants: the mixer's two multipliers and shifts, and the step between
// words (the golden ratio, twice it per lane), as signed decimals in the
// PTX and as hex in C. A slot whose check word never matches would only
// be slow on a GPU (three reads, then the two-trip path), which no test
// here would see.
func TestAgentCheckWordConstants(t *testing.T) {
	src, err := os.ReadFile("agent.c")
	if err != nil {
		t.Fatal(err)
	}
	for _, hex := range []string{"0xbf58476d1ce4e5b9ull", "0x94d049bb133111ebull", "0x9e3779b97f4a7c15ull", "x >> 30", "x >> 27", "x >> 31"} {
		if !strings.Contains(string(src), hex) {
			t.Errorf("agent.c lacks %s", hex)
		}
	}
	for _, c := range []struct {
		re string
		n  int
	}{
		{`mul\.lo\.u64 (%rd8[34]), (%rd8[34]), -4658895280553007687;`, 2},
		{`mul\.lo\.u64 (%rd8[34]), (%rd8[34]), -7723592293110705685;`, 2},
		{`shr\.u64 %rd85, %rd8[34], 30;`, 2},
		{`shr\.u64 %rd85, %rd8[34], 27;`, 2},
		{`shr\.u64 %rd85, %rd8[34], 31;`, 2},
		{`add\.u64 %rd84, %rd92, -7046029254386353131;`, 1},    // word 2l+1: + K
		{`mul\.lo\.u64 %rd92, %rd40, 4354685564936845354;`, 1}, // word 2l: lane * 2K
	} {
		if n := len(regexp.MustCompile(c.re).FindAllString(agentPTX, -1)); n != c.n {
			t.Errorf("agent.ptx matches %q %d times, want %d", c.re, n, c.n)
		}
	}
}

// TestAgentLeanPTX: the lean kernel differs from the shipped one in thread
// 0's fence before the signal word alone, now taken by fused commands
// (kind 7 and up) only; the publishing fence before done and the park
// handshake's stay unconditional.
func TestAgentLeanPTX(t *testing.T) {
	v := agentLeanPTX(agentPTX)
	if v == agentPTX {
		t.Fatal("the lean kernel is the shipped one: the text it replaces moved")
	}
	if !strings.Contains(v, "  @!%p1 bra NEXT;\n  setp.ge.u64 %p39, %rd7, 7;\n  @%p39 fence.sc.sys;\n") {
		t.Fatal("the lean kernel does not predicate the signal's fence on a fused command")
	}
	if n := strings.Count(v, "\n  fence.sc.sys;"); n != 2 {
		t.Fatalf("the lean kernel keeps %d unconditional SC fences, want 2 (park, publish)", n)
	}
	if strings.Contains(agentPTX, "%p39") {
		t.Fatal("agent.ptx uses predicate 39, which the lean kernel takes")
	}
	if strings.Replace(v, "  setp.ge.u64 %p39, %rd7, 7;\n  @%p39 fence.sc.sys;", "  fence.sc.sys;", 1) != agentPTX {
		t.Fatal("the lean kernel differs from agent.ptx in more than the signal's fence")
	}
}

// TestPTXAssembles hands every kernel the plugin may load (agent.ptx, its
// acqrel and lean variants, atomics.ptx) to ptxas for the oldest and the
// newest architecture the plugin runs on, where a ptxas is at hand
// (PTXAS, or on the PATH, or CUDA's default install): a kernel the driver
// could not load would leave the plugin without its agent, found only on
// a GPU.
func TestPTXAssembles(t *testing.T) {
	ptxas := os.Getenv("PTXAS")
	if ptxas == "" {
		if p, err := exec.LookPath("ptxas"); err == nil {
			ptxas = p
		} else if _, err := os.Stat("/usr/local/cuda/bin/ptxas"); err == nil {
			ptxas = "/usr/local/cuda/bin/ptxas"
		}
	}
	if ptxas == "" {
		t.Skip("no ptxas here (set PTXAS to one): the kernels are assembled on a GPU machine")
	}
	dir := t.TempDir()
	for _, k := range []struct{ name, ptx string }{
		{"agent", agentPTX}, {"agent-acqrel", agentAcqRelPTX(agentPTX)}, {"agent-lean", agentLeanPTX(agentPTX)}, {"atomics", add64PTX},
	} {
		src := filepath.Join(dir, k.name+".ptx")
		if err := os.WriteFile(src, []byte(k.ptx), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, arch := range []string{"sm_70", "sm_90"} {
			out, err := exec.Command(ptxas, "-arch="+arch, src, "-o", filepath.Join(dir, k.name+"-"+arch+".cubin")).CombinedOutput()
			if err != nil {
				t.Errorf("ptxas -arch=%s %s: %v\n%s", arch, k.name, err, out)
			}
		}
	}
}
