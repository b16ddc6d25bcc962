package dataplane

import "os"

// nsIdentity names the network and pid namespaces of this process
// ("net:[4026531840]pid:[4026531836]"). Two ranks of one machine in
// different network namespaces have different abstract sockets and
// loopbacks, and in different pid namespaces process_vm_writev cannot name
// the peer's pid, so they must not take the intra-node path; the host id
// hashes this in (the handle's format is unchanged). "" where /proc is
// not mounted: then namespaces cannot be told apart.
func nsIdentity() string {
	var id string
	for _, ns := range []string{"net", "pid"} {
		if l, err := os.Readlink("/proc/self/ns/" + ns); err == nil {
			id += l
		}
	}
	return id
}
