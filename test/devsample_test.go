package test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeCUDA builds test/gpu/fakecuda.c as libcuda.so.1 in a temporary
// directory: a stand-in driver whose "device" memory is host memory the
// plugin must still treat as device memory (copies through the driver).
func fakeCUDA(t *testing.T, root string, defs ...string) string {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"-O2", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1")}, defs...)
	cmd := exec.Command("cc", append(args, filepath.Join(root, "test/gpu/fakecuda.c"), "-lpthread")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fake libcuda.so.1: %v\n%s", err, out)
	}
	return dir
}

// fakeGDR builds test/gpu/fakecuda.c and test/gpu/fakegdr.c (a GDRCopy
// whose mapping of a fake device page is the page itself) side by side.
func fakeGDR(t *testing.T, root string) string {
	t.Helper()
	dir := fakeCUDA(t, root)
	cmd := exec.Command("cc", "-O2", "-shared", "-fPIC", "-o", filepath.Join(dir, "libgdrapi.so"),
		filepath.Join(root, "test/gpu/fakegdr.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fake libgdrapi.so: %v\n%s", err, out)
	}
	return dir
}

// fakeHIP builds test/gpu/fakehip.c as libamdhip64.so: two fake AMD
// devices whose copies fail unless the calling thread set the device that
// owns the memory and uses a stream of that device.
func fakeHIP(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("cc", "-O2", "-shared", "-fPIC", "-o", filepath.Join(dir, "libamdhip64.so"),
		filepath.Join(root, "test/gpu/fakehip.c"), "-lpthread")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fake libamdhip64.so: %v\n%s", err, out)
	}
	return dir
}

// TestDeviceSamplesOnFakeCUDA runs the GPU machine's own programs
// (test/gpu/cuda_check.c and test/gpu/staging_bench.c, built by make) against
// the fake driver, so that they cannot rot between GPU runs: every device
// byte and signal is verified through the plugin, two processes each.
// fakeMPS returns a directory that looks like a running MPS daemon's pipe
// directory (its control pipe exists).
func fakeMPS(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDeviceSamplesOnFakeCUDA(t *testing.T) {
	root := build(t)
	fake, fakeAMD, fakeWithGDR := fakeCUDA(t, root), fakeHIP(t, root), fakeGDR(t, root)
	fakeOld := fakeCUDA(t, root, "-DFAKECUDA_MINIMAL")
	lib := filepath.Join(root, "build/librccl-rma-wasm.so")
	for _, c := range []struct {
		name, prog string
		args, env  []string
		want       []string
	}{
		// FAKECUDA_NO_MODULES: the default signal paths never load a
		// module (a load can synchronize the context, and under MPS that
		// deadlocked against NCCL's ncclWaitSignal kernel).
		{"cuda_check", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_NO_MODULES=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "VMM window registered with regMrSymDmaBuf, verified",
				"device payloads through a shared staging ring", "small device put+signals: 48 of 8 B to 64 KiB",
				"copied asynchronously", "operations to itself with device memory are queued on the device's stream",
				"fakecuda: a device-to-device copy", "small device put+signals: 48 of 8 B to 64 KiB, plain signal",
				"stream atomic adds (cuStreamBatchMemOp_v2, data type 18 verified as 64-bit)",
				"fakecuda: a stream atomic add to a signal word",
				"device operations copy straight into its mapped device memory (IPC)",
				"!device agent: running", "!the device agent", "device agent: off: MPS is not running"}},
		// The interprocess events of the mapped put+signals stay real
		// events with the agent running (marked at their making,
		// host/devmem/cuda/ipc.c): made tickets like the bounce slots'
		// events, the target's wait would not order its signal after the
		// copy, which the late device-to-device copies here expose.
		// NCCL_RMA_WASM_DEVICE_AGENT=1: the copy context's small copies,
		// signal writes and adds go through the device agent's ring (a
		// thread in the fake, each command 50 µs late, the stream's work
		// 200 µs late), large ones and the mapped device-to-device copies
		// through the stream, the two kept in one order by the epoch and
		// done words: every byte and signal is verified, teardown rounds
		// included (pinned allocations pause the agent).
		{"cuda_check_agent", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "FAKECUDA_DTOD_US=2000", "NCCL_RMA_WASM_DEVICE_AGENT=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "device agent: running", "small device put+signals: 48 of 8 B to 64 KiB",
				"plain signal, every byte there", "fakecuda: the device agent copied a payload", "fakecuda: the device agent applied a signal",
				"device operations copy straight into its mapped device memory (IPC)"}},
		// NCCL_RMA_WASM_DEVICE_AGENT_IDLE_US=1: the kernel parks whenever
		// the ring is empty for a microsecond, so nearly every command
		// finds it parked and launches it again (host/devmem/cuda/agent.c,
		// ag_put): a command left with no kernel hangs the check.
		{"cuda_check_agent_parks", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=20", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_DEVICE_AGENT_IDLE_US=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "device agent: running", "small device put+signals: 48 of 8 B to 64 KiB",
				"plain signal, every byte there", "fakecuda: the device agent copied a payload", "fakecuda: the device agent parked",
				"launches after parking"}},
		// The first launch after parking starts 1.5 s late (its block
		// waiting for an SM): the operations behind it wait, and the
		// stall watch WARNs once (NCCL_RMA_WASM_DEVICE_AGENT_WARN_MS);
		// nothing is lost once it runs.
		{"cuda_check_agent_late", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_LATE_MS=1500", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_DEVICE_AGENT_IDLE_US=1", "NCCL_RMA_WASM_DEVICE_AGENT_WARN_MS=300"},
			[]string{"RESULT PASS", "device agent: running", "fakecuda: the device agent's kernel started 1500 ms late", "none done for", "its kernel is not running"}},
		// Every copy small enough for the agent and nothing mapped: the
		// stream never gets work between two agent commands, so it never
		// waits for the agent. The bounce slots' events, made real before
		// the agent started, become tickets at their first record
		// (host/devmem/cuda/ipc.c); recorded on the stream they cost a
		// stream wait for the agent and the record every time.
		{"cuda_check_agent_alone", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=20", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_DEVICE_AGENT_MAX_KB=1024", "NCCL_RMA_WASM_INTRANODE_IPC=0"},
			[]string{"RESULT PASS", "device agent: running", "fakecuda: the device agent copied a payload", " 0 stream waits for an agent", "!fakecuda: an interprocess event recorded"}},
		// Copies above NCCL_RMA_WASM_DEVICE_AGENT_MAX_KB (4 KiB here) go
		// to the stream between the agent's: the order must hold.
		{"cuda_check_agent_mixed", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_DEVICE_AGENT_MAX_KB=4", "NCCL_RMA_WASM_INTRANODE_IPC=0"},
			[]string{"RESULT PASS", "teardown: 2 rounds", "device agent: running", "small device put+signals: 48 of 8 B to 64 KiB",
				"plain signal, every byte there", "fakecuda: the device agent copied a payload"}},
		// Fused landings (NCCL_RMA_WASM_FUSED_LANDING=1) over TCP lanes
		// (NCCL_RMA_WASM_INTRANODE=0, as between hosts): a small
		// put+signal's payload is held in its bounce slot and landed with
		// its signal by one agent command, up to 64 B carried in the
		// command. The agent runs each command 300 µs late, stream work
		// 200 µs late: a signal seen before its payload, or one lost
		// beside the shadow's folded writes, fails the byte and count
		// checks; teardown's odd rounds take never-reset words (the
		// shadow's writes), even ones plain words (the agent's adds).
		{"cuda_check_fused_landing", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=300", "NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_FUSED_LANDING=1", "CUDA_CHECK_DIRECT=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "small device put+signals: 48 of 8 B to 64 KiB", "plain signal, every byte there",
				"fakecuda: the device agent landed a payload and its signal in one command",
				"fakecuda: the device agent landed an inline payload and its signal in one command", "fused landings ("}},
		// NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ=1: the kernel takes a slot
		// by its check word (agent.c, ag_check), which the fake
		// recomputes for every command, inline payloads' bytes included
		// where the kernel reads them, and ends the process on a mismatch.
		{"cuda_check_agent_one_read", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=20", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ=1"},
			[]string{"RESULT PASS", "small device put+signals: 48 of 8 B to 64 KiB", "plain signal, every byte there",
				"fakecuda: the device agent copied a payload", "fakecuda: the device agent read a slot whole, its check word matched"}},
		{"cuda_check_fused_landing_one_read", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_FUSED_LANDING=1", "CUDA_CHECK_DIRECT=1", "NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ=1"},
			[]string{"RESULT PASS", "fakecuda: the device agent landed an inline payload and its signal in one command",
				"fakecuda: the device agent read a slot whole, its check word matched"}},
		// The same with fused landings off: no command fuses.
		{"cuda_check_fused_landing_off", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_FUSED_LANDING=0"},
			[]string{"RESULT PASS", "fakecuda: the device agent copied a payload", "!in one command"}},
		// Unset, fused landings are on where the agent runs.
		{"cuda_check_fused_landing_default", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_DEVICE_AGENT=1"},
			[]string{"RESULT PASS", "fakecuda: the device agent landed an inline payload and its signal in one command"}},
		// Three hardware queues: the agent's kernel would share the
		// context stream's, so it is refused and every path stays.
		{"cuda_check_agent_queues", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "NCCL_RMA_WASM_DEVICE_AGENT=1", "CUDA_DEVICE_MAX_CONNECTIONS=3"},
			[]string{"RESULT PASS", "device agent: off: with CUDA_DEVICE_MAX_CONNECTIONS=3", "!the device agent copied"}},
		// The default (auto) starts it where MPS's control pipe exists;
		// without it (the plain cuda_check above) it never runs. The
		// gather writer's default (auto) follows it.
		{"cuda_check_agent_mps", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "NCCL_RMA_WASM_INTRANODE=0", "CUDA_MPS_PIPE_DIRECTORY=" + fakeMPS(t)},
			[]string{"RESULT PASS", "device agent: running", "fakecuda: the device agent copied a payload", "instead of waiting for their gathered device copies (NCCL_RMA_WASM_GATHER_WRITER)"}},
		// NCCL_RMA_WASM_INTRANODE_IPC=0: nothing is mapped, every device
		// payload is staged.
		{"cuda_check_noipc", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_INTRANODE_IPC=0"},
			[]string{"RESULT PASS", "device payloads through a shared staging ring", "!mapped device memory (IPC)"}},
		// The windows are mapped (on by default with CUDA), but no
		// operation reaches NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB: all stay
		// on the staged path.
		{"cuda_check_ipc_min", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576"},
			[]string{"RESULT PASS", "VMM window registered with regMrSymDmaBuf, verified", "device payloads through a shared staging ring",
				"!mapped device memory (IPC)", "!fakecuda: an interprocess event recorded"}},
		// NCCL_RMA_WASM_INTRANODE_IPC=1 and every size mapped
		// (NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0): the VMM window (memfd-backed in
		// the fake, so the two processes share its pages) is mapped into
		// the peer, whose put+signal copies straight into it; the
		// cuMemAlloc buffers have no shareable handle and stay staged.
		// Stream work runs 200 µs late and device-to-device copies 5 ms
		// later still: the put's copy is queued on the sender's stream,
		// and its signal must reach the target only after it ran (a
		// sender that did not wait for it fails the byte check).
		// The small put+signals between the windows record an
		// interprocess event after their copies and leave at once; the
		// target's stream waits for the event before the signal's stream
		// atomic, so a signal seen before its bytes fails.
		{"cuda_check_ipc", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_DTOD_US=5000", "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified",
				"device operations copy straight into its mapped device memory (IPC)", "small device put+signals: 48 of 8 B to 64 KiB",
				"ordered by interprocess events", "fakecuda: an interprocess event recorded", "fakecuda: a stream waits for another process's event",
				"!is not mapped here"}},
		// The defaults with stream work 200 µs late and device-to-device
		// copies 5 ms later still: put+signals below 64 KiB staged, the
		// 64 KiB ones and the 2 MiB multi-segment put mapped, on one peer,
		// each signal seen only after its payload.
		{"cuda_check_ipc_mixed", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_DTOD_US=5000", "FAKECUDA_NO_MODULES=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified",
				"device operations copy straight into its mapped device memory (IPC)", "copied asynchronously",
				"fakecuda: an interprocess event recorded", "fakecuda: a stream waits for another process's event"}},
		// Four lanes per peer: every put and signal is numbered and may
		// travel on any lane, and the target applies signals in number
		// order. The event a put+signal names is waited for when its
		// signal is applied, so a signal numbered after it, on another
		// lane, follows its bytes too.
		{"cuda_check_ipc_lanes", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_DTOD_US=5000", "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_LANES=4"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified",
				"ordered by interprocess events", "fakecuda: an interprocess event recorded", "fakecuda: a stream waits for another process's event"}},
		// With the device agent: a mapped put+signal's copy is the agent's
		// (device to device, each command 50 µs late) and the lane waits
		// for its ticket before the header leaves, instead of an
		// interprocess event the target's stream waits for (an event
		// costs driver submissions the agent's copy does not).
		// Agent marks off (NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=0; on by
		// default): the lane's wait for each ticket.
		{"cuda_check_ipc_agent", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=0"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified",
				"device operations copy straight into its mapped device memory (IPC)", "device agent: running",
				"fakecuda: the device agent copied device to device", "!fakecuda: an interprocess event recorded",
				"!are ordered by device agent marks", "!fakecuda: the device agent marked a copy"}},
		// NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1: the agent's copy (each
		// command 2 ms late) then marks our page, and the header leaves at
		// once; the target applies the signal only once the mark came, so
		// every signal still follows its bytes. No event, and no lane
		// waits for a ticket.
		{"cuda_check_ipc_agent_marks", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=2000", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "are ordered by device agent marks",
				"fakecuda: the device agent marked a copy in host memory", "marked copies", "!fakecuda: an interprocess event recorded"}},
		// NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE=1: the same, each
		// header served at once and its signal handed to the target's
		// agent, which waits for the sender's mark itself (each sender's
		// command 2 ms late, so nearly every header comes first): every
		// signal still follows its bytes.
		{"cuda_check_ipc_agent_marks_device_wait", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=2000", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1", "NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "are ordered by device agent marks",
				"fakecuda: the device agent waited for a peer's mark before a signal", "signals that waited on the device for their peer's mark (0 skipped",
				"!cannot be read by the device"}},
		// NCCL_RMA_WASM_PLACED_COMPLETION=1: the same, each put+signal
		// completing once the agent's copy executed and its header was
		// written, without the target's acknowledgement; every byte and
		// signal still verified at the target, in order.
		{"cuda_check_ipc_agent_marks_placed", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=2000", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1", "NCCL_RMA_WASM_PLACED_COMPLETION=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "are ordered by device agent marks",
				"puts placed in its mapped memory complete once their copy executed"}},
		// The same with the agent's commands at once: most marks are
		// there before their headers, and the proxy's polling thread
		// serves those headers itself instead of waking the service.
		{"cuda_check_ipc_agent_marks_quick", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "are ordered by device agent marks", "marked copies"}},
		// No size reaches the floor (NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB),
		// but with the agent running in the source's context the puts it
		// copies are mapped all the same (NCCL_RMA_WASM_INTRANODE_IPC_AGENT,
		// on by default): the target lands nothing. Turned off, they are
		// staged again.
		{"cuda_check_ipc_agent_small", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_GATHER_WRITER=0"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "device agent: running",
				"fakecuda: the device agent copied device to device", "!fakecuda: an interprocess event recorded", "!" + "instead of waiting for their gathered device copies (NCCL_RMA_WASM_GATHER_WRITER)"}},
		{"cuda_check_ipc_agent_staged", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_IPC_AGENT=0"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "device agent: running",
				"!fakecuda: the device agent copied device to device"}},
		// NCCL_RMA_WASM_GATHER_WRITER=1: the caller's thread hands a batch
		// whose device payloads it gathered to the lane's writer goroutine,
		// which waits for their copies (200 µs late) and writes it: over
		// TCP without the agent, and (its default, auto, with the agent)
		// intra-node with the agent's mapped copies (their tickets waited
		// for there too). Every byte and signal, in order.
		{"cuda_check_gather_writer", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_GATHER_WRITER=1"},
			[]string{"RESULT PASS", "small device put+signals: 48 of 8 B to 64 KiB", "instead of waiting for their gathered device copies (NCCL_RMA_WASM_GATHER_WRITER)"}},
		{"cuda_check_gather_writer_agent", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "fakecuda: the device agent copied device to device",
				"instead of waiting for their gathered device copies (NCCL_RMA_WASM_GATHER_WRITER)"}},
		// NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1: the window's small
		// put+signals, plain puts and signals alone come first
		// (CUDA_CHECK_DIRECT), and our agent adds each signal into the
		// peer's mapped word right after its copy (2 ms a command, so a
		// signal ahead of its bytes is seen); then a 128 KiB put the
		// target lands ends the path, and the signal alone after it must
		// not pass it. Every word counted exactly (no signal twice).
		{"cuda_check_direct_signal", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=2000", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1", "CUDA_CHECK_DIRECT=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "adds signals straight into its mapped signal words"}},
		// NCCL_RMA_WASM_INTRANODE_INBOX=1: the same operations, each
		// small put+signal's and signal alone's signal added by the
		// target's agent from our agent's entry in its inbox (2 ms a
		// command and an entry, so a header that comes before its entry
		// was taken is waited for); the 128 KiB put ends the path, and
		// the signal alone after it must follow the entries before it.
		{"cuda_check_inbox", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=2000", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_INBOX=1", "CUDA_CHECK_DIRECT=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "go through its peer inbox: its device agent adds them",
				"hands signals to its agent through its peer inbox", "fakecuda: the device agent added a peer's inbox entry", "!fakecuda: the device agent refused an inbox entry"}},
		// The same with placed completions: a put+signal's request
		// completes once its copy and entry executed and its header was
		// written, a signal alone's once its entry executed and its
		// header was written.
		// The peer inbox with host rows: the rows a memfd of pinned host
		// memory the agent reads; signals alone with nothing queued before
		// them written by the sender's host, those behind a queued copy
		// (window_small's 4 KiB puts, each followed at once by a signal
		// alone) by its agent, after the copy.
		{"cuda_check_inbox_host_rows", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=2000", "FAKECUDA_INBOX_US=0", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_INBOX=1", "NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS=1", "NCCL_RMA_WASM_PLACED_COMPLETION=1", "CUDA_CHECK_DIRECT=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "hands signals to its agent through its peer inbox",
				"fakecuda: the device agent reads inbox rows in host memory", "fakecuda: the device agent added a peer's inbox entry",
				"peer inbox entries written by the host itself", "!fakecuda: the device agent refused an inbox entry", "!the peer inbox's rows are device memory"}},
		{"cuda_check_inbox_placed", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=2000", "FAKECUDA_DTOD_US=5000", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_INBOX=1", "NCCL_RMA_WASM_PLACED_COMPLETION=1", "CUDA_CHECK_DIRECT=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "hands signals to its agent through its peer inbox",
				"signals alone through its peer inbox complete once their entry is in its row",
				"puts placed in its mapped memory complete once their copy executed", "!fakecuda: the device agent refused an inbox entry"}},
		// Communicators come and go (18 more, one after another, past the
		// inbox's 16 rows) while the first keeps the plugin initialized:
		// each goes through the peer inbox, sharing the row the peer
		// handed our process, every byte and signal verified in each.
		{"cuda_check_inbox_churn", "cuda_check", []string{lib, "65536", "0"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=200", "FAKECUDA_DTOD_US=500", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_INBOX=1", "CUDA_CHECK_DIRECT=1", "CUDA_CHECK_CHURN=18"},
			[]string{"RESULT PASS", "churn: 18 more communicators one after another, every byte and signal verified", "go through its peer inbox: its device agent adds them",
				"fakecuda: the device agent added a peer's inbox entry", "!do not go through its peer inbox", "!fakecuda: the device agent refused an inbox entry"}},
		{"cuda_check_direct_signal_off", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=1048576", "NCCL_RMA_WASM_DEVICE_AGENT=1", "CUDA_CHECK_DIRECT=1"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified", "!adds signals straight into its mapped signal words"}},
		// The same on the application's context.
		{"cuda_check_ipc_appctx", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_DTOD_US=5000", "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_COPY_CONTEXT=0"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified",
				"ordered by interprocess events", "fakecuda: a stream waits for another process's event"}},
		// Without stream atomics the signal is a read-modify-write from
		// the host: the target's host waits for the event instead.
		{"cuda_check_ipc_hostsig", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_DTOD_US=5000", "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_STREAM_ATOMIC=0"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified",
				"ordered by interprocess events", "fakecuda: an interprocess event recorded", "!a stream waits for another process's event"}},
		// Events off: the sender waits for its copies before the header
		// leaves.
		{"cuda_check_ipc_hostwait", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_DTOD_US=5000", "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "NCCL_RMA_WASM_INTRANODE_IPC_EVENTS=0"},
			[]string{"RESULT PASS", "8 B to 64 KiB put+signals window to window, verified",
				"device operations copy straight into its mapped device memory (IPC)", "!interprocess event"}},
		// Stream work runs 200 µs after it is queued: a signal written or
		// added outside its stream's order would be seen before its
		// payload, or lost at deregistration. Never-reset signal words
		// (odd teardown rounds) take the shadow's stream writes, others
		// the read-modify-write; no module is loaded.
		// Small payloads' copies are asynchronous too, in order with
		// their signals on the stream: the shadow's writes, and the
		// stream atomic adds to plain signal words; so are a rank's
		// device copies to itself, completed by their events.
		{"cuda_check_async", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_NO_MODULES=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "small device put+signals: 48", "copied asynchronously", "host view: device payloads there",
				"plain signal, every byte there", "fakecuda: a stream atomic add to a signal word",
				"operations to itself with device memory are queued on the device's stream", "!" + "instead of waiting for their gathered device copies (NCCL_RMA_WASM_GATHER_WRITER)"}},
		// The same over four lanes per peer, as on a 16-core host: every
		// put and signal numbered, signals applied in number order, acks
		// riding the reverse lanes.
		{"cuda_check_async_lanes", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_LANES=4"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "small device put+signals: 48", "copied asynchronously", "host view: device payloads there",
				"plain signal, every byte there", "fakecuda: a stream atomic add to a signal word"}},
		// NCCL_RMA_WASM_ASYNC_COPY_KB=0: every small payload takes
		// synchronous copies; NCCL_RMA_WASM_STREAM_ATOMIC=0: plain signal
		// words take the read-modify-write.
		{"cuda_check_sync", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "NCCL_RMA_WASM_ASYNC_COPY_KB=0", "NCCL_RMA_WASM_STREAM_ATOMIC=0"},
			[]string{"RESULT PASS", "small device put+signals: 48", "!copied asynchronously", "off (NCCL_RMA_WASM_STREAM_ATOMIC=0)", "!a stream atomic add",
				"operations to itself with device memory move by device copies", "!are queued on the device's stream"}},
		// A driver whose data type 18 is a 32-bit add: the probe refuses
		// it (and the other candidates, which the fake refuses), so plain
		// signal words keep the read-modify-write, every add still exact.
		{"cuda_check_reduce32", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_REDUCE_32=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "plain signal, every byte there", "type 18: not a 64-bit add", "!a stream atomic add to a signal word"}},
		// NCCL_RMA_WASM_DEVICE_ATOMIC=1: words that are not never-reset
		// take the atomic kernel, its module loaded on first use.
		// By default copies and signal writes of cuMem mappings (the VMM
		// window) run in the plugin's own context, and nothing else does
		// (the fake fails a copy of other memory there); with
		// NCCL_RMA_WASM_COPY_CONTEXT=0 no second context is made. A want
		// starting with "!" must be absent.
		{"cuda_check_copyctx", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_NO_MODULES=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "VMM window registered with regMrSymDmaBuf, verified",
				"second context reaches a cuMem mapping", "run in a CUDA context of the plugin's own"}},
		{"cuda_check_appctx", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_NO_MODULES=1", "NCCL_RMA_WASM_COPY_CONTEXT=0"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "VMM window registered with regMrSymDmaBuf, verified",
				"!second context", "!run in a CUDA context of the plugin's own"}},
		// A driver that refuses the second context: the memory stays on
		// the application's, and an INFO line says why.
		{"cuda_check_ctxrefused", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_NO_MODULES=1", "FAKECUDA_CTX_FAIL=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "refused a context of the plugin's own", "!second context"}},
		// (FAKECUDA_NO_REDUCE: a device without stream atomics, which
		// would otherwise take precedence over the kernel.)
		// A driver without stream atomics and the device agent running:
		// adds to plain signal words are the agent's atomic adds, not
		// read-modify-writes (with NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL).
		{"cuda_check_agent_noreduce", "cuda_check", []string{lib, "196608", "2"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "FAKECUDA_AGENT_US=50", "NCCL_RMA_WASM_DEVICE_AGENT=1", "FAKECUDA_NO_REDUCE=1", "NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1"},
			[]string{"RESULT PASS", "plain signal, every byte there", "else the device agent's atomic add where it runs", "fakecuda: the device agent applied a signal", "!a stream atomic add", "adds) by 1 agent", "!(0 adds)"}},
		{"cuda_check_atomic", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fake, "FAKECUDA_ASYNC_US=200", "NCCL_RMA_WASM_DEVICE_ATOMIC=1", "FAKECUDA_NO_REDUCE=1"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "reports no stream atomic reductions", "!a stream atomic add"}},
		// A driver without stream memory operations, events or module
		// loading: every signal falls back to the read-modify-write.
		{"cuda_check_old_driver", "cuda_check", []string{lib, "196608", "4"}, []string{"LD_LIBRARY_PATH=" + fakeOld},
			[]string{"RESULT PASS", "teardown: 4 rounds", "small device put+signals: 48", "!copied asynchronously",
				"operations to itself with device memory move by device copies", "!device-to-device copy",
				"the driver has no cuStreamBatchMemOp_v2"}},
		// Over the libfabric transport, whose provider here (tcp;ofi_rxm)
		// has no FI_HMEM: device payloads are staged over the link's TCP
		// lanes, in order with its RDMA writes.
		{"cuda_check_fabric", "cuda_check", []string{lib, "196608", "4"},
			[]string{"LD_LIBRARY_PATH=" + fake, "NCCL_RMA_WASM_TRANSPORT=fabric", "NCCL_RMA_WASM_FI_PROVIDER=tcp;ofi_rxm", "FI_TCP_IFACE=lo"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "VMM window registered with regMrSymDmaBuf, verified", "reaches 2 ranks over libfabric provider tcp;ofi_rxm"}},
		// The same program on the HIP seam: no CUDA, two AMD devices, rank 1
		// on device 1, so the plugin's copy threads must pick the device;
		// windows are not mapped by default on HIP (not yet measured there).
		{"hip_check", "cuda_check", []string{lib, "196608", "4"},
			[]string{"LD_LIBRARY_PATH=" + fakeAMD, "SAMPLE_RUNTIME=hip", "NCCL_RMA_WASM_CUDA=0"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "(HIP device 1)", "HIP runtime loaded, 2 device(s)",
				"device payloads through a shared staging ring", "!mapped device memory (IPC)"}},
		// NCCL_RMA_WASM_INTRANODE_IPC=1 on the HIP seam: each rank opens
		// the other's hipMalloc windows (memfds in the fake) with
		// hipIpcOpenMemHandle, across devices, and copies device payloads
		// straight into them; every byte and signal verified, the
		// teardown rounds included.
		{"hip_check_ipc", "cuda_check", []string{lib, "196608", "2"},
			[]string{"LD_LIBRARY_PATH=" + fakeAMD, "SAMPLE_RUNTIME=hip", "NCCL_RMA_WASM_CUDA=0", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0"},
			[]string{"RESULT PASS", "teardown: 2 rounds", "(HIP device 1)", "device operations copy straight into its mapped device memory (IPC)",
				"!is not mapped here"}},
		// The HIP seam with stream work 200 µs late and device-to-device
		// copies 5 ms later still: small payloads' copies, never-reset
		// signal words' stream writes (hipStreamWriteValue64) and the
		// mapped put+signals ordered by interprocess events
		// (hipStreamWaitEvent on the target's stream, or a host wait) must
		// keep every signal behind its bytes.
		{"hip_check_async", "cuda_check", []string{lib, "196608", "4"},
			[]string{"LD_LIBRARY_PATH=" + fakeAMD, "SAMPLE_RUNTIME=hip", "NCCL_RMA_WASM_CUDA=0", "FAKEHIP_ASYNC_US=200"},
			[]string{"RESULT PASS", "teardown: 4 rounds", "(HIP device 1)", "copied asynchronously", "fakehip: a stream write of a signal word"}},
		{"hip_check_ipc_events", "cuda_check", []string{lib, "196608", "2"},
			[]string{"LD_LIBRARY_PATH=" + fakeAMD, "SAMPLE_RUNTIME=hip", "NCCL_RMA_WASM_CUDA=0", "NCCL_RMA_WASM_INTRANODE_IPC=1", "NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB=0", "FAKEHIP_ASYNC_US=200", "FAKEHIP_DTOD_US=5000"},
			[]string{"RESULT PASS", "teardown: 2 rounds", "device operations copy straight into its mapped device memory (IPC)",
				"ordered by interprocess events", "fakehip: an interprocess event recorded", "fakehip: a stream waits for another process's event"}},
		// Its speed target means nothing on a fake device: only correctness
		// (RESULT FAIL) fails the test, and "RESULT BELOW-TARGET" (exit 1)
		// is a pass here.
		{"staging_bench", "staging_bench", []string{lib, "2097152", "2", "50"}, []string{"LD_LIBRARY_PATH=" + fake},
			[]string{"RESULT ", "RATIO  tcp", "RATIO  intranode", "device payloads through a shared staging ring", "BOUND signal_rmw",
				"no GDRCopy"}},
		// With libgdrapi.so present, device signal words (the program puts
		// them in a 2 MiB allocation, so their 64 KiB page can be mapped)
		// are updated through GDRCopy's mapping, pinned on first use and
		// unpinned at deregistration; every signal is still waited for.
		// BENCH_KERNEL_WAIT=1: device signal words watched by a waiting
		// kernel (a thread in the fake), never-reset words from the
		// shadow; a signal the kernel never sees fails the run.
		{"staging_bench_kernelwait", "staging_bench", []string{lib, "1048576", "2", "20"}, []string{"LD_LIBRARY_PATH=" + fake, "BENCH_KERNEL_WAIT=1", "BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64"},
			[]string{"RESULT ", "watched by a waiting kernel", "!no kernel waiter", "carries a 64-byte payload"}},
		// BENCH_VMM=1: the bench's buffers are cuMem mappings, copied in
		// the plugin's own context; with the device agent on, the small
		// pings' payloads and signals go through its ring.
		{"staging_bench_agent", "staging_bench", []string{lib, "1048576", "2", "20"}, []string{"LD_LIBRARY_PATH=" + fake, "BENCH_VMM=1", "BENCH_KERNEL_WAIT=1", "BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64", "NCCL_RMA_WASM_DEVICE_AGENT=1"},
			[]string{"RESULT ", "BUFFERS cuMem mappings", "watched by a waiting kernel", "fakecuda: the device agent copied a payload", "fakecuda: the device agent applied a signal", "!staggered pollers",
				"SELF   tcp       8 B device->host", "SELF   intranode 8 B device->host"}},
		// NCCL_RMA_WASM_DEVICE_AGENT_STAGGER=1 reaches the kernel (its
		// flags' bit 2), and the ping runs as before (the stand-in runs no
		// PTX: the pollers themselves run only on a GPU).
		{"staging_bench_agent_stagger", "staging_bench", []string{lib, "1048576", "2", "20"}, []string{"LD_LIBRARY_PATH=" + fake, "BENCH_VMM=1", "BENCH_KERNEL_WAIT=1", "BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_DEVICE_AGENT_STAGGER=1"},
			[]string{"RESULT ", "watched by a waiting kernel", "fakecuda: the device agent's kernel started with staggered pollers"}},
		// The device ping first (BENCH_PING_FIRST), with the agent adding
		// each ping's signal into the peer's mapped word itself.
		{"staging_bench_direct", "staging_bench", []string{lib, "1048576", "2", "20"}, []string{"LD_LIBRARY_PATH=" + fake, "BENCH_VMM=1", "BENCH_KERNEL_WAIT=1", "BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64", "BENCH_PING_FIRST=1", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1"},
			[]string{"RESULT ", "watched by a waiting kernel", "adds signals straight into its mapped signal words"}},
		// Agent marks: the intra-node ping's copy into the peer's mapped
		// window marks our page, its header leaves at once, and the
		// kernel watching the peer's word sees the payload with it.
		{"staging_bench_marks", "staging_bench", []string{lib, "1048576", "2", "20"}, []string{"LD_LIBRARY_PATH=" + fake, "BENCH_VMM=1", "BENCH_KERNEL_WAIT=1", "BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1", "FAKECUDA_AGENT_US=200"},
			[]string{"RESULT ", "watched by a waiting kernel", "are ordered by device agent marks", "fakecuda: the device agent marked a copy in host memory"}},
		// The same with the target's agent waiting for each mark itself
		// (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE): both ranks pin the
		// other's page (mapped before or after their own was made), and
		// the kernel watching the word still sees every payload with it.
		{"staging_bench_marks_device_wait", "staging_bench", []string{lib, "1048576", "2", "20"}, []string{"LD_LIBRARY_PATH=" + fake, "BENCH_VMM=1", "BENCH_KERNEL_WAIT=1", "BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1", "FAKECUDA_AGENT_US=200", "NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE=1"},
			[]string{"RESULT ", "watched by a waiting kernel", "fakecuda: the device agent waited for a peer's mark before a signal", "for the device agent to wait for", "!cannot be read by the device"}},
		// The same with buffers made without POSIX fds (GPU_VMM_FD=0):
		// they cannot be mapped into the peer, so the agent never adds a
		// signal itself, and the plugin says why.
		{"staging_bench_direct_unshared", "staging_bench", []string{lib, "1048576", "2", "20"}, []string{"LD_LIBRARY_PATH=" + fake, "BENCH_VMM=1", "GPU_VMM_FD=0", "BENCH_KERNEL_WAIT=1", "BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64", "BENCH_PING_FIRST=1", "NCCL_RMA_WASM_DEVICE_AGENT=1", "NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL=1"},
			[]string{"RESULT ", "watched by a waiting kernel", "!adds signals straight into its mapped signal words", "not added by our device agent (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL): its part of the signal registration is not mapped here"}},
		{"staging_bench_gdr", "staging_bench", []string{lib, "2097152", "2", "50"}, []string{"LD_LIBRARY_PATH=" + fakeWithGDR},
			[]string{"RESULT ", "GDRCopy loaded", "fakegdr: page", "unpinned"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if strings.HasSuffix(c.name, "_fabric") {
				needFabric(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(root, "build", c.prog), c.args...)
			cmd.Dir = root
			// No MPS unless a case says so: the device agent's default
			// (auto) runs it where MPS's control pipe exists, and this
			// machine's MPS must not decide what a case tests.
			cmd.Env = append(append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1",
				"NCCL_RMA_WASM_CACHE_DIR="+t.TempDir(), "CUDA_MPS_PIPE_DIRECTORY="+t.TempDir()), c.env...)
			out, err := cmd.CombinedOutput()
			text := string(out)
			if ctx.Err() != nil {
				t.Fatalf("%s hung:\n%s", c.name, tail(text))
			}
			below := strings.Contains(text, "RESULT BELOW-TARGET")
			if (err != nil && !below) || strings.Contains(text, "RESULT FAIL") {
				t.Fatalf("%s failed (%v):\n%s", c.name, err, tail(text))
			}
			for _, w := range c.want {
				if absent, ok := strings.CutPrefix(w, "!"); ok && strings.Contains(text, absent) {
					t.Fatalf("%s: output has %q:\n%s", c.name, absent, tail(text))
				} else if !ok && !strings.Contains(text, w) {
					t.Fatalf("%s: output lacks %q:\n%s", c.name, w, tail(text))
				}
			}
		})
	}
}

// TestHopTraceOnFakeCUDA: with NCCL_RMA_WASM_PROFILE_TRACE, the two
// processes of each of staging_bench's rounds (the kernel-watched
// intra-node ping with agent marks among them) write their trace at close, and between them every point of a
// marked put+signal's way is there: the call, the data plane's post, the
// marked copy's queue, the copy handed over, the header written, the
// header looked at by the target, the mark seen, the signal's device write
// entered and the signal applied, each in time order within its file.
func TestHopTraceOnFakeCUDA(t *testing.T) {
	root := build(t)
	fake := fakeCUDA(t, root)
	lib := filepath.Join(root, "build/librccl-rma-wasm.so")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "build/staging_bench"), lib, "1048576", "2", "20")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir(),
		"CUDA_MPS_PIPE_DIRECTORY="+t.TempDir(), "LD_LIBRARY_PATH="+fake, "BENCH_VMM=1", "BENCH_KERNEL_WAIT=1",
		"BENCH_SIG_NEVER_RESET=1", "BENCH_PING_BYTES=64", "NCCL_RMA_WASM_DEVICE_AGENT=1",
		"NCCL_RMA_WASM_INTRANODE_AGENT_MARKS=1", "NCCL_RMA_WASM_PROFILE_TRACE="+filepath.Join(dir, "trace"))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "RESULT FAIL") {
		if !strings.Contains(string(out), "RESULT BELOW-TARGET") {
			t.Fatalf("staging_bench failed (%v):\n%s", err, tail(string(out)))
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "trace.*"))
	if len(files) < 2 {
		t.Fatalf("trace files %v: want one per process (two per round of the bench)", files)
	}
	counts := map[string]int{}
	var marked []string // the files of the round with marked copies
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "\ncopy ") {
			marked = append(marked, f)
		}
		var last int64
		for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n")[1:] {
			var name string
			var ts int64
			if _, err := fmt.Sscan(l, &name, &ts); err != nil {
				t.Fatalf("%s line %d %q: %v", f, i+2, l, err)
			}
			if ts < last-int64(time.Millisecond) {
				// Points are numbered as they are met; two threads may
				// stamp them a little out of order, never by much.
				t.Fatalf("%s line %d: %d is a millisecond before the point before it", f, i+2, ts)
			}
			last = max(last, ts)
			counts[name]++
		}
	}
	for _, p := range []string{"post", "plan", "queue", "copy", "wire", "read", "mark", "sigcall", "signal"} {
		if counts[p] == 0 {
			t.Errorf("no %q point in the traces (%v)", p, counts)
		}
	}
	// hoptrace -host sets that round's points in order, call to signal.
	if len(marked) != 2 {
		t.Fatalf("%d trace files with marked copies, want the two of one round", len(marked))
	}
	ht, err := exec.Command(filepath.Join(root, "build/hoptrace"), "-host", marked[0], marked[1]).CombinedOutput()
	if err != nil || !strings.Contains(string(ht), "calls reached the peer's signal with every point") {
		t.Fatalf("hoptrace -host (%v):\n%s", err, ht)
	}
}

// TestRingOverlapOnFakeCUDA runs build/staging_bench (two processes; in
// its intra-node round rank 0 puts device memory into rank 1's, one way)
// on the fake driver with slow copies of registered host memory, which only
// the intra-node staging ring uses, counted in a file both processes map:
// the ring carries the payloads, and the sender's copy into a slot starts
// while the target copies another out (puts go one way, so any overlap of
// the two directions is the two ends of one ring). Stages run one after
// the other would never overlap. With the ring off, no copy touches
// registered memory.
func TestRingOverlapOnFakeCUDA(t *testing.T) {
	root := build(t)
	fake := fakeCUDA(t, root)
	lib := filepath.Join(root, "build/librccl-rma-wasm.so")
	for _, ring := range []string{"1", "0"} {
		stage := filepath.Join(t.TempDir(), "stage")
		if err := os.WriteFile(stage, make([]byte, 64), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, filepath.Join(root, "build/staging_bench"), lib, "262144", "2", "10")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir(),
			"LD_LIBRARY_PATH="+fake, "NCCL_RMA_WASM_STAGE_CHUNK_KB=4", "NCCL_RMA_WASM_LANES=1",
			"NCCL_RMA_WASM_INTRANODE_RING="+ring, "FAKECUDA_STAGE_FILE="+stage, "FAKECUDA_STAGE_US=200")
		out, err := cmd.CombinedOutput()
		cancel()
		// Its speed target means nothing here: "RESULT BELOW-TARGET" passes.
		if text := string(out); !strings.Contains(text, "RESULT ") || strings.Contains(text, "RESULT FAIL") {
			t.Fatalf("ring=%s: staging_bench failed (%v):\n%s", ring, err, tail(text))
		}
		b, err := os.ReadFile(stage)
		if err != nil {
			t.Fatal(err)
		}
		le := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
		copies, overlaps := le(2), le(3)
		t.Logf("ring=%s: %d copies of the ring's slots, %d started while the other direction copied", ring, copies, overlaps)
		switch {
		case ring == "0" && copies != 0:
			t.Fatalf("ring off, yet %d copies of registered memory", copies)
		case ring == "1" && copies < 4*2*64:
			t.Fatalf("ring on: %d copies of its slots, want at least %d (4 puts of 64 chunks, both ends)", copies, 4*2*64)
		case ring == "1" && overlaps == 0:
			t.Fatal("ring on: no copy of one direction ran while one of the other did: its stages ran one after the other")
		}
	}
}
