// Package plugin is the plugin runtime behind the C tables: plugin contexts,
// listen and collective communicators, rma contexts, memory registrations
// and requests, backend selection, and the glue to the native data path.
//
// Every function here is one vtable slot with C types already converted.
// Handles are opaque non-zero integers below 2^63 (never Go pointers, which
// cgo forbids C to keep). Every error return has logged a WARN line that
// says what was wrong. capi recovers panics around these calls.
package plugin

// PluginName is the name field of every table; NCCL logs it as
// "RMA/Plugin: Assigned plugin wasm to comm".
const PluginName = "wasm"
