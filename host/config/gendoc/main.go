// Command gendoc writes docs/guide/variables.md from host/config's
// declarations (make docs; go generate ./host/config).
//
//	go run ./host/config/gendoc -o docs/guide/variables.md
//
// Without -o it writes the page to stdout.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

func main() {
	out := flag.String("o", "", "file to write (default: stdout)")
	flag.Parse()
	page := config.VariablesPage()
	if *out == "" {
		os.Stdout.Write(page)
		return
	}
	if err := os.WriteFile(*out, page, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}
