/* shim.h - C helpers of capi defined in tables.c and used from Go. */
#ifndef RCCL_RMA_WASM_SHIM_H
#define RCCL_RMA_WASM_SHIM_H
#include <stdint.h>
#include "rma_plugin.h"

/* Install the host library's logger (a ncclDebugLogger_t as an integer). */
void rmawasm_set_logger(uintptr_t fn);
/* 1 when a logger is installed. */
int rmawasm_has_logger(void);
/* Call the installed logger with "%s" and a preformatted message. */
void rmawasm_log(int level, unsigned long flags, const char* file, int line, const char* msg);
/* Path of the shared object that contains address fn (dladdr), or NULL. */
const char* rmawasm_object_path(uintptr_t fn);
#endif
