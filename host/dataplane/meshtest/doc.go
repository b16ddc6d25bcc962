// Package meshtest is the multi-rank test support of host/dataplane: the
// owners (targets of registrations that record completions), the meshes
// of two or n ranks it connects over loopback, over the intra-node path
// with a stand-in device, or over a libfabric provider, and the waits on
// completions, signal words and conditions that the integration tests of
// host/dataplane and of its transports (host/dataplane/tcp, intranode,
// ofi) share.
//
// It is test support only: import it from _test.go files (external test
// packages: package dataplane_test, tcp_test, intranode_test, ofi_test),
// never from non-test code. It imports host/dataplane, which imports the
// transports, so a transport's own package cannot use it; its external
// test package can. Its helpers take a testing.TB and end the test on a
// failure; what they connect is closed when the test ends.
package meshtest
