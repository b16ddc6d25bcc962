// Package rawio is the data path's raw socket read: a non-blocking read
// as a raw system call, for a caller that polls a socket on its own
// thread (host/dataplane/tcp's readers) and must not hand off its P or go
// through the netpoller's bookkeeping. The race build reads through
// syscall.Read instead, which the race detector understands.
package rawio
