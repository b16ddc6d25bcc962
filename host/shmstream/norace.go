//go:build !race

package shmstream

func raceRelease() {}
func raceAcquire() {}
