package link

// Props describes a transport to one peer.
type Props struct {
	Name string
	// DeviceMemory: operations on NCCL_PTR_CUDA registrations work;
	// DeviceDirect: their payloads move without host staging (GPUDirect).
	DeviceMemory, DeviceDirect bool
	// InlineMax is the largest operation the caller's thread sends itself
	// from flush; larger ones go to the transport's goroutines.
	InlineMax uint64
	// Lanes is how many independent ordered channels submit accepts.
	Lanes int
	// LateVisible: a put this transport landed may become visible only
	// after a flush NCCL's device barrier makes, so a signal that arrived
	// behind it does not prove it visible: a NIC writing device memory
	// (FI_HMEM, dma-buf), or a landing copy still in flight when the
	// service moves on (an asynchronous device copy sets it). TCP and the
	// intra-node path land each put whole (a memcpy, process_vm_writev or
	// a synchronous device copy) before they read anything behind it.
	LateVisible bool
}
