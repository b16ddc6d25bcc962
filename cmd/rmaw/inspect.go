package main

// inspect: what a module declares (read by wazero without running it) and,
// when it loads, what it negotiates with the host.

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/conformance"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox/meter"
)

func runInspect(e *env, args []string) error {
	fs, lf := e.loadCommand("inspect")
	path, err := oneModule(fs, args)
	if err != nil {
		return err
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := inspectStatic(e, path, wasm); err != nil {
		return err
	}
	b, err := lf.open(path)
	if err != nil {
		fmt.Fprintf(e.stdout, "load: FAILS: %v\n  fix: %s\n", err, conformance.Hint(err))
		return errFailed
	}
	defer b.Close()
	inf := b.Info()
	fmt.Fprintf(e.stdout, "negotiated (control instance):\n")
	fmt.Fprintf(e.stdout, "  host offers   %s (%#x)\n", conformance.FeatureNames(inf.HostFeatures), inf.HostFeatures)
	fmt.Fprintf(e.stdout, "  guest enables %s (%#x)\n", conformance.FeatureNames(inf.Features), inf.Features)
	fmt.Fprintf(e.stdout, "  area          %#x, %d completion records\n", inf.Area, inf.CompCap)
	fmt.Fprintf(e.stdout, "  memory        %d bytes after init (cap %d MiB)\n", inf.MemoryBytes, lf.memMiB)
	for i, d := range b.Devices() {
		fmt.Fprintf(e.stdout, "  device %d      %q %d Mbps %g us\n", i, d.Name, d.SpeedMbps, d.LatencyUs)
	}
	if p, err := b.ConnectionPlan(2, 0); err == nil {
		fmt.Fprintf(e.stdout, "  conn plan     lanes %d, transport %d, stripe >= %d B, chunk %d B, codec %d level %d (2 ranks, rank 0)\n",
			p.Lanes, p.Transport, p.StripeThreshold, p.ChunkSize, p.Codec.ID(), p.Codec.Level())
	} else {
		fmt.Fprintf(e.stdout, "  conn plan     FAILS: %v\n", err)
	}
	return nil
}

// abiExports lists the Guest ABI exports and whether each is required.
var abiExports = []struct {
	name     string
	required bool
}{
	{guestabi.Marker, true}, {guestabi.ExportInit, true}, {guestabi.ExportArea, true},
	{guestabi.ExportInitialize, false}, {guestabi.ExportDevices, false}, {guestabi.ExportConnPlan, false},
	{guestabi.ExportCtxOpen, false}, {guestabi.ExportCtxClose, false}, {guestabi.ExportPlanOp, false},
	{guestabi.ExportCompletions, false}, {guestabi.ExportFinalize, false}, {guestabi.ExportMetrics, false},
	{guestabi.ExportPlanOps, false},
}

func sigString(d api.FunctionDefinition) string {
	f := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ", ") + ")"
	}
	return f(d.ParamTypes()) + " -> " + f(d.ResultTypes())
}

func inspectStatic(e *env, path string, wasm []byte) error {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCoreFeatures(api.CoreFeaturesV2))
	defer rt.Close(ctx)
	// The rewriter first: it bounds what compiling may allocate, and the
	// plugin refuses what it refuses.
	if _, err := meter.Rewrite(wasm); err != nil {
		fmt.Fprintf(e.stdout, "%s: the plugin would refuse it: %v\n", path, err)
		return errFailed
	}
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		fmt.Fprintf(e.stdout, "%s: not a valid WebAssembly module: %v\n", path, err)
		return errFailed
	}
	w := e.stdout
	fmt.Fprintf(w, "module %s: %d bytes, sha256 %x\n", path, len(wasm), sha256.Sum256(wasm))
	exps := cm.ExportedFunctions()
	var markers []string
	for n := range exps {
		if strings.HasPrefix(n, guestabi.MarkerPrefix) {
			markers = append(markers, strings.TrimPrefix(n, guestabi.MarkerPrefix[:len(guestabi.MarkerPrefix)-1]))
		}
	}
	sort.Strings(markers)
	if len(markers) == 0 {
		fmt.Fprintf(w, "abi: none declared (no %s* export)\n", guestabi.MarkerPrefix)
	} else {
		fmt.Fprintf(w, "abi: %s (this host speaks v%d.%d)\n", strings.Join(markers, ", "), guestabi.Version, guestabi.Minor)
	}
	fmt.Fprintf(w, "exports:\n")
	known := map[string]bool{}
	for _, x := range abiExports {
		known[x.name] = true
		d, ok := exps[x.name]
		req := "optional"
		if x.required {
			req = "required"
		}
		if !ok {
			fmt.Fprintf(w, "  %-18s -                         (%s, absent)\n", x.name, req)
			continue
		}
		fmt.Fprintf(w, "  %-18s %-25s (%s)\n", x.name, sigString(d), req)
	}
	var other []string
	for n := range exps {
		if !known[n] {
			other = append(other, n)
		}
	}
	sort.Strings(other)
	for _, n := range other {
		fmt.Fprintf(w, "  %-18s %-25s (not part of the ABI; never called)\n", n, sigString(exps[n]))
	}
	fmt.Fprintf(w, "imports:\n")
	imps := cm.ImportedFunctions()
	if len(imps) == 0 {
		fmt.Fprintf(w, "  none\n")
	}
	for _, d := range imps {
		mod, n, _ := d.Import()
		fmt.Fprintf(w, "  %-40s %s\n", mod+"."+n, sigString(d))
	}
	for _, m := range cm.ImportedMemories() {
		mod, n, _ := m.Import()
		fmt.Fprintf(w, "  %-40s memory (refused: a guest exports its own)\n", mod+"."+n)
	}
	fmt.Fprintf(w, "memory:\n")
	mems := cm.ExportedMemories()
	if len(mems) == 0 {
		fmt.Fprintf(w, "  none exported\n")
	}
	for n, m := range mems {
		max := "none (the host caps it)"
		if v, ok := m.Max(); ok {
			max = fmt.Sprintf("%d pages (%d KiB)", v, uint64(v)*64)
		}
		fmt.Fprintf(w, "  %q: min %d pages (%d KiB), max %s\n", n, m.Min(), uint64(m.Min())*64, max)
	}
	return nil
}
