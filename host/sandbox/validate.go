package sandbox

// Validation: a module must export what Guest ABI v1 requires with the
// right signatures and import nothing but the rmaw host module and WASI,
// before any of its code runs.

import (
	"fmt"
	"strings"

	"github.com/tetratelabs/wazero/api"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
)

type sig struct {
	params, results []api.ValueType
	required        bool
}

var (
	tI32 = api.ValueTypeI32
	tI64 = api.ValueTypeI64
)

var exportSigs = map[string]sig{
	guestabi.Marker:            {nil, nil, true},
	guestabi.ExportInit:        {[]api.ValueType{tI64}, []api.ValueType{tI64}, true},
	guestabi.ExportArea:        {nil, []api.ValueType{tI32}, true},
	guestabi.ExportInitialize:  {nil, nil, false},
	guestabi.ExportDevices:     {[]api.ValueType{tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportConnPlan:    {[]api.ValueType{tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportCtxOpen:     {[]api.ValueType{tI32, tI64, tI32, tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportCtxClose:    {[]api.ValueType{tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportPlanOp:      {[]api.ValueType{tI32, tI32, tI32, tI64, tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportCompletions: {[]api.ValueType{tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportFinalize:    {nil, []api.ValueType{tI32}, false},
	guestabi.ExportMetrics:     {nil, []api.ValueType{tI64}, false},
	guestabi.ExportPlanOps:     {[]api.ValueType{tI32, tI32}, []api.ValueType{tI32}, false},
}

var importSigs = map[string]sig{
	guestabi.ImportLog:       {[]api.ValueType{tI32, tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ImportGetConfig: {[]api.ValueType{tI32, tI32}, []api.ValueType{tI32}, false},
}

func typeString(ps, rs []api.ValueType) string {
	f := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ", ") + ")"
	}
	return f(ps) + " -> " + f(rs)
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (b *Backend) validate(rt *sharedRuntime) error {
	exps := b.cm.ExportedFunctions()
	if _, ok := exps[guestabi.Marker]; !ok {
		var other []string
		for n := range exps {
			if strings.HasPrefix(n, guestabi.MarkerPrefix) {
				other = append(other, n)
			}
		}
		if len(other) > 0 {
			return fmt.Errorf("module declares Guest ABI %s; this host speaks %s only",
				strings.TrimPrefix(strings.Join(other, ", "), guestabi.MarkerPrefix[:len(guestabi.MarkerPrefix)-1]), guestabi.Marker)
		}
		return fmt.Errorf("missing export %q: not an rccl-rma-wasm guest (Guest ABI v1)", guestabi.Marker)
	}
	b.exports = map[string]bool{}
	for name, s := range exportSigs {
		d, ok := exps[name]
		if !ok {
			if s.required {
				return fmt.Errorf("missing export %q %s", name, typeString(s.params, s.results))
			}
			continue
		}
		if !sameTypes(d.ParamTypes(), s.params) || !sameTypes(d.ResultTypes(), s.results) {
			return fmt.Errorf("export %q has type %s, Guest ABI v1 wants %s", name,
				typeString(d.ParamTypes(), d.ResultTypes()), typeString(s.params, s.results))
		}
		b.exports[name] = true
	}
	if _, ok := b.cm.ExportedMemories()[guestabi.ExportMemory]; !ok {
		return fmt.Errorf("missing export %q (the guest's linear memory)", guestabi.ExportMemory)
	}
	if ms := b.cm.ImportedMemories(); len(ms) > 0 {
		mod, n, _ := ms[0].Import()
		return fmt.Errorf("module imports memory %s.%s; a guest must define and export its own", mod, n)
	}
	for _, d := range b.cm.ImportedFunctions() {
		mod, n, _ := d.Import()
		switch mod {
		case guestabi.ImportModule:
			s, ok := importSigs[n]
			if !ok {
				return fmt.Errorf("module imports %s.%s, which this host does not provide (it provides %s.%s and %s.%s)",
					mod, n, mod, guestabi.ImportLog, mod, guestabi.ImportGetConfig)
			}
			if !sameTypes(d.ParamTypes(), s.params) || !sameTypes(d.ResultTypes(), s.results) {
				return fmt.Errorf("import %s.%s has type %s, the host provides %s", mod, n,
					typeString(d.ParamTypes(), d.ResultTypes()), typeString(s.params, s.results))
			}
		case guestabi.WASIModule:
			fns, err := rt.wasi()
			if err != nil {
				return err
			}
			w, ok := fns[n]
			if !ok {
				return fmt.Errorf("module imports %s.%s, which this host does not provide", mod, n)
			}
			if !sameTypes(d.ParamTypes(), w.ParamTypes()) || !sameTypes(d.ResultTypes(), w.ResultTypes()) {
				return fmt.Errorf("import %s.%s has type %s, the host provides %s", mod, n,
					typeString(d.ParamTypes(), d.ResultTypes()), typeString(w.ParamTypes(), w.ResultTypes()))
			}
		default:
			return fmt.Errorf("module imports %s.%s, which this host does not provide (allowed modules: %q, %q)",
				mod, n, guestabi.ImportModule, guestabi.WASIModule)
		}
	}
	return nil
}
