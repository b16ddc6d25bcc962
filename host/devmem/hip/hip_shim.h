#ifndef RMAW_HIP_SHIM_H
#define RMAW_HIP_SHIM_H
#include <stddef.h>
#include <stdint.h>

#include "devrt.h"

int rmaw_hip_open(const char* lib, char* err, size_t errlen);
/* The HIP runtime's ops table (copies, pinned memory, DMA-BUF export). */
extern const rmaw_devrt_ops rmaw_hip_ops;
#endif
