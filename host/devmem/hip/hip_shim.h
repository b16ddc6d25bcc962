#ifndef RMAW_HIP_SHIM_H
#define RMAW_HIP_SHIM_H
#include <stddef.h>
#include <stdint.h>
int rmaw_hip_open(const char* lib, char* err, size_t errlen);
int rmaw_hip_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen);
int rmaw_hip_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen);
int rmaw_hip_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen);
void rmaw_hip_host_free(void* p);
int rmaw_hip_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen);
void rmaw_hip_host_unregister(uintptr_t ctx, void* p);
int rmaw_hip_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen);
#endif
