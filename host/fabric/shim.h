// The C side of host/fabric: libfabric is dlopen'ed (never linked), and
// the data-path calls, which are static inlines in its headers that jump
// through the provider's ops tables, are wrapped here so Go pays one cgo
// call per post or per batch of completions.
#ifndef RMAW_FABRIC_SHIM_H
#define RMAW_FABRIC_SHIM_H
#include <stdint.h>
#include <stddef.h>

typedef struct rmaw_ep rmaw_ep;

// One completion as Go reads it (mirrors fi_cq_data_entry's useful part).
typedef struct {
	void *ctx;
	uint64_t flags;
	uint64_t len;
	uint64_t data;
	int32_t err; // non-zero: an error completion (the provider's error number)
} rmaw_comp;

typedef struct {
	char prov[64];
	char fabric[64];
	char domain[64];
	uint64_t mr_mode;
	uint64_t cq_data_size;
	uint64_t inject_size;
	uint64_t max_msg_size;
	uint32_t rx_cq_data; // FI_RX_CQ_DATA: remote CQ data consumes a receive
	// The NIC behind the domain, where the provider describes it (fi_nic).
	char nic[64];        // device name ("" when unknown)
	char pci[16];        // "dddd:bb:dd.f" when it sits on PCI
	uint64_t link_speed; // bits per second, 0 when unknown
	uint32_t hmem;       // the endpoint was opened with FI_HMEM (device memory)
	uint32_t api;        // the FI_VERSION asked of fi_getinfo
} rmaw_info;

// A registration request: host memory (iface 0) or device memory (iface
// FI_HMEM_CUDA / FI_HMEM_ROCR, device its ordinal), by address range or,
// with dmabuf_fd >= 0, as a DMA-BUF (fd, offset into it).
typedef struct {
	void *base;
	uint64_t len;
	uint64_t want_key; // ignored under FI_MR_PROV_KEY
	int32_t iface;
	int32_t device;
	int32_t dmabuf_fd; // -1: none
	uint64_t dmabuf_off;
} rmaw_mr_req;

// What rmaw_mr_build chose (for tests, which cannot see libfabric's types).
typedef struct {
	uint64_t access, requested_key, flags, len, offset;
	uintptr_t base;
	int32_t iface, device, dmabuf, fd;
	uint64_t iov_count;
} rmaw_mr_view;

int rmaw_load(const char *lib, char *err, size_t errlen);
const char *rmaw_strerror(int e);
// rmaw_probe lists up to n RDM providers with FI_RMA|FI_MSG (prov: NULL
// for all); returns how many, or a negative fi error.
int rmaw_probe(const char *prov, rmaw_info *out, int n);
// rmaw_probe_any lists up to n entries of provider prov (NULL: all) with no
// capability, endpoint-type or mode hints: whether the name exists at all.
int rmaw_probe_any(const char *prov, rmaw_info *out, int n);
// rmaw_open opens fabric, domain, CQ, AV and endpoint on the first
// provider named prov (exact name), with FI_THREAD_SAFE; with hmem, only
// where the provider offers FI_HMEM there (-FI_ENODATA otherwise).
int rmaw_open(const char *prov, const char *domain, int hmem, rmaw_ep **ep, rmaw_info *info);
int rmaw_name(rmaw_ep *ep, void *buf, size_t *len);
int rmaw_insert(rmaw_ep *ep, const void *name, uint64_t *addr);
int rmaw_reg(rmaw_ep *ep, void *base, size_t len, uint64_t want_key, void **mr, uint64_t *key, void **desc);
int rmaw_dereg(void *mr);
// rmaw_reg_mr registers r on the endpoint's domain (rmaw_mr_build's
// attributes), bound and enabled under FI_MR_ENDPOINT.
int rmaw_reg_mr(rmaw_ep *ep, const rmaw_mr_req *r, void **mr, uint64_t *key, void **desc);
// rmaw_mr_describe builds the attributes r would be registered with on an
// endpoint with these properties and reports them; negative: refused.
int rmaw_mr_describe(uint32_t hmem, uint32_t api, const rmaw_mr_req *r, rmaw_mr_view *v);
// rmaw_runtime_version is fi_version() of the loaded libfabric (0 if none).
uint32_t rmaw_runtime_version(void);
int64_t rmaw_write(rmaw_ep *ep, void *buf, size_t len, void *desc, uint64_t dest, uint64_t raddr, uint64_t key, void *ctx);
int64_t rmaw_writedata(rmaw_ep *ep, void *buf, size_t len, void *desc, uint64_t data, uint64_t dest, uint64_t raddr, uint64_t key, void *ctx);
// rmaw_writemsg is fi_writemsg with remote CQ data; deliver asks for
// FI_DELIVERY_COMPLETE (the completion means the bytes are at the target).
int64_t rmaw_writemsg(rmaw_ep *ep, void *buf, size_t len, void *desc, uint64_t data, uint64_t dest, uint64_t raddr, uint64_t key, void *ctx, int deliver);
// rmaw_sendmsg sends a message with a completion (deliver: as above).
int64_t rmaw_sendmsg(rmaw_ep *ep, void *buf, size_t len, void *desc, uint64_t dest, void *ctx, int deliver);
int64_t rmaw_read(rmaw_ep *ep, void *buf, size_t len, void *desc, uint64_t src, uint64_t raddr, uint64_t key, void *ctx);
int64_t rmaw_inject(rmaw_ep *ep, const void *buf, size_t len, uint64_t dest);
int64_t rmaw_recv(rmaw_ep *ep, void *buf, size_t len, void *desc, void *ctx);
// rmaw_poll reads up to n completions; an error completion comes back
// alone, with err set.
int64_t rmaw_poll(rmaw_ep *ep, rmaw_comp *out, int n);
// rmaw_wait sleeps until the CQ may have work, rmaw_signal ends such a
// sleep; both answer -FI_ENOSYS without a wait object, and rmaw_wait may
// answer another error where the provider cannot promise a wakeup.
int rmaw_wait(rmaw_ep *ep, int timeout_ms);
int rmaw_signal(rmaw_ep *ep);
int rmaw_can_wait(rmaw_ep *ep);
void rmaw_close(rmaw_ep *ep);
#endif
