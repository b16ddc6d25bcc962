// Command rmaw is the tool for backend authors (Guest ABI v1, SPEC.md §8):
//
//	rmaw validate [-config S] <mod.wasm>     check every ABI rule; says what to fix
//	rmaw inspect  [-config S] <mod.wasm>     exports, imports, ABI version, features, memory
//	rmaw new      -lang go|c [-repo DIR] <dir>  scaffold a backend that builds and validates
//	rmaw test     [-config S] <mod.wasm>     conformance kit: drive the module through the contract
//	rmaw bench    [-config S] [-ops N] <mod.wasm>  per-op policy cost against the native backend
//	rmaw version                             the build's version and commit, as the plugin logs them at init
//
// Validation and the conformance kit load modules with host/sandbox, the
// loader the plugin uses, so the tool and the plugin cannot disagree on a
// rule. Exit status: 0 success, 1 a check failed, 2 bad usage.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/version"
)

// errFailed means "a check failed and was already reported".
var errFailed = errors.New("failed")

// usageError is a command-line mistake (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

type command struct {
	name, args, what string
	run              func(env *env, args []string) error
}

var commands = []command{
	{"validate", "[-config S] <mod.wasm>", "check every Guest ABI rule and say what to fix", runValidate},
	{"inspect", "[-config S] <mod.wasm>", "show exports, imports, ABI version, features and memory", runInspect},
	{"new", "-lang go|c [-name N] [-repo DIR] <dir>", "scaffold a backend that builds and passes validate", runNew},
	{"test", "[-config S] [-run REGEXP] <mod.wasm>", "conformance kit: drive the module through the contract", runTest},
	{"bench", "[-config S] [-ops N] <mod.wasm>", "per-op policy cost and message rate against native", runBench},
	{"version", "", "print the build's version and commit (the plugin's init line says the same)", runVersion},
}

// runVersion prints host/version's string: the plugin built from the same
// tree logs the same at init (INFO, "NET/wasm: rccl-rma-wasm ...").
func runVersion(e *env, args []string) error {
	fs := e.flags("version")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageError{"takes no arguments"}
	}
	fmt.Fprintln(e.stdout, version.String())
	return nil
}

// env is what a subcommand writes to; tests give it buffers.
type env struct {
	stdout, stderr io.Writer
	verbose        bool

	logMu sync.Mutex // the sink may be called from several goroutines
}

// sink shows the plugin's WARN lines (every line with -v) on stderr.
func (e *env) sink(level abi.LogLevel, _ uint64, _ string, _ int, msg string) {
	if level == abi.LogWarn || e.verbose {
		e.logMu.Lock()
		defer e.logMu.Unlock()
		fmt.Fprintf(e.stderr, "  log: %s\n", msg)
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: rmaw <command> [flags] [args]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %-42s %s\n", c.name, c.args, c.what)
	}
	fmt.Fprintf(w, "\nrmaw <command> -h shows a command's flags. The contract: SPEC.md §8.\n")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without os.Exit, for tests.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	e := &env{stdout: stdout, stderr: stderr}
	logx.SetSink(e.sink)
	defer logx.SetSink(nil)
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(e, args[1:])
		var ue usageError
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "rmaw %s: %s\nusage: rmaw %s %s\n", c.name, ue.msg, c.name, c.args)
			return 2
		case errors.Is(err, errFailed):
			return 1
		default:
			fmt.Fprintf(stderr, "rmaw %s: %v\n", c.name, err)
			return 1
		}
	}
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	sort.Strings(names)
	fmt.Fprintf(stderr, "rmaw: unknown command %q (commands: %s)\n", args[0], strings.Join(names, ", "))
	return 2
}

// flags returns a FlagSet for a subcommand that reports to e.stderr.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("rmaw "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.BoolVar(&e.verbose, "v", false, "show every plugin log line (guest output included)")
	return fs
}

// oneModule parses flags and returns the single module argument.
func oneModule(fs *flag.FlagSet, args []string) (string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", err
		}
		return "", usageError{err.Error()}
	}
	if fs.NArg() != 1 {
		return "", usageError{"want exactly one module (a .wasm file)"}
	}
	return fs.Arg(0), nil
}
