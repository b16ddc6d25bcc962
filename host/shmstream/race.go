//go:build race

package shmstream

import (
	"runtime"
	"unsafe"
)

// The race detector cannot see that the writer's and the reader's
// mappings of a ring are one memory (two processes, or two mappings in one
// process in the tests): a write published through the ring happens before
// its read as a socket's bytes do, and these say so as syscall.Write and
// syscall.Read do (one key for every ring, like the syscall package's).
var raceKey byte

func raceRelease() { runtime.RaceReleaseMerge(unsafe.Pointer(&raceKey)) }
func raceAcquire() { runtime.RaceAcquire(unsafe.Pointer(&raceKey)) }
