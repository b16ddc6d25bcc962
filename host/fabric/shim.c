#include "shim.h"
#include <dlfcn.h>
#include <signal.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

// The five exported libfabric functions we call, resolved at run time so
// the library loads on hosts without libfabric.
static int (*p_getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **);
static void (*p_freeinfo)(struct fi_info *);
static struct fi_info *(*p_dupinfo)(const struct fi_info *);
static int (*p_fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
static const char *(*p_strerror)(int);
static uint32_t (*p_version)(void); // optional: fi_version

// FI_VERSION 1.10: mr_mode bits, FI_CONTEXT2 and FI_HMEM are honoured, and
// any libfabric of the last years answers it. A runtime of 1.20 or later
// is asked for 1.20, the first API whose registrations take a DMA-BUF
// (FI_MR_DMABUF); the fields we read are the same in both.
#define RMAW_FI_VERSION FI_VERSION(1, 10)
#define RMAW_API_DMABUF FI_VERSION(1, 20)

static uint32_t api(void) {
	uint32_t v = p_version ? p_version() : 0;
	return v >= RMAW_API_DMABUF ? RMAW_API_DMABUF : RMAW_FI_VERSION;
}

uint32_t rmaw_runtime_version(void) { return p_version ? p_version() : 0; }

// FI_MR_DMABUF and struct fi_mr_dmabuf as libfabric 1.20 documents them
// (fi_mr(3)); the headers we build with may predate them. With the flag,
// fi_mr_attr's first member (a union with mr_iov) points to this.
#define RMAW_FI_MR_DMABUF (1ULL << 40)
struct rmaw_dmabuf {
	int fd;
	uint64_t offset;
	size_t len;
	void *base_addr;
};

// A newer libfabric reads fields appended to fi_mr_attr after the ones our
// headers know (hmem_data, ...): they must be zero, so the attributes
// live in a larger zeroed buffer.
typedef struct {
	struct fi_mr_attr a;
	char pad[256];
} mr_attr_buf;

struct rmaw_ep {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	int fd; // the CQ's wait fd, or -1: no wait object (poll with naps)
	// Our own wake-up, polled beside the CQ's fd: fi_trywait resets the
	// CQ's signal, so an fi_cq_signal that lands between the caller's last
	// look and fi_trywait was lost (a close then waited out the timeout).
	int wake;
	uint32_t hmem, api;
};

// Some providers install signal handlers when libfabric initialises them
// (shm: SIGSEGV, SIGBUS, SIGINT, SIGTERM, to remove its shared memory).
// They replace the Go runtime's, which then can no longer turn a fault
// into a panic or preempt goroutines. Every call that can initialise a
// provider is bracketed: handlers that changed are put back.
#define RMAW_NSIG 65
typedef struct { struct sigaction sa[RMAW_NSIG]; } sigsave;

static void save_sigs(sigsave *s) {
	for (int i = 1; i < RMAW_NSIG; i++) sigaction(i, NULL, &s->sa[i]);
}

static void restore_sigs(const sigsave *s) {
	for (int i = 1; i < RMAW_NSIG; i++) {
		struct sigaction cur;
		if (i == SIGKILL || i == SIGSTOP || sigaction(i, NULL, &cur) != 0) continue;
		if (cur.sa_handler != s->sa[i].sa_handler || cur.sa_flags != s->sa[i].sa_flags) sigaction(i, &s->sa[i], NULL);
	}
}

static int load(const char *lib, char *err, size_t errlen);

int rmaw_load(const char *lib, char *err, size_t errlen) {
	sigsave s;
	save_sigs(&s);
	int rc = load(lib, err, errlen);
	restore_sigs(&s);
	return rc;
}

static int load(const char *lib, char *err, size_t errlen) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
	p_getinfo = dlsym(h, "fi_getinfo");
	p_freeinfo = dlsym(h, "fi_freeinfo");
	p_dupinfo = dlsym(h, "fi_dupinfo");
	p_fabric = dlsym(h, "fi_fabric");
	p_strerror = dlsym(h, "fi_strerror");
	p_version = dlsym(h, "fi_version");
	if (!p_getinfo || !p_freeinfo || !p_dupinfo || !p_fabric || !p_strerror) {
		snprintf(err, errlen, "%s lacks fi_getinfo/fi_freeinfo/fi_dupinfo/fi_fabric/fi_strerror", lib);
		dlclose(h);
		p_getinfo = NULL;
		return -1;
	}
	return 0;
}

const char *rmaw_strerror(int e) { return p_strerror ? p_strerror(e < 0 ? -e : e) : "libfabric not loaded"; }

// hints: an RDM endpoint with RMA and messages; every mode and mr_mode we
// can honour is offered, so providers that need them still match.
// With hmem, FI_HMEM is asked for too (and FI_MR_HMEM offered): device
// memory registered with its interface and device.
static struct fi_info *hints(const char *prov, int hmem) {
	struct fi_info *h = p_dupinfo(NULL);
	if (!h) return NULL;
	h->caps = FI_MSG | FI_RMA | (hmem ? FI_HMEM : 0);
	h->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | (hmem ? FI_MR_HMEM : 0);
	h->domain_attr->threading = FI_THREAD_SAFE;
	h->tx_attr->msg_order = FI_ORDER_SAS;
	if (prov) h->fabric_attr->prov_name = strdup(prov);
	return h;
}

static void fill(rmaw_info *o, const struct fi_info *i) {
	memset(o, 0, sizeof *o);
	snprintf(o->prov, sizeof o->prov, "%s", i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "");
	snprintf(o->fabric, sizeof o->fabric, "%s", i->fabric_attr->name ? i->fabric_attr->name : "");
	snprintf(o->domain, sizeof o->domain, "%s", i->domain_attr->name ? i->domain_attr->name : "");
	o->mr_mode = i->domain_attr->mr_mode;
	o->cq_data_size = i->domain_attr->cq_data_size;
	o->inject_size = i->tx_attr->inject_size;
	o->max_msg_size = i->ep_attr->max_msg_size;
	o->rx_cq_data = (i->mode & FI_RX_CQ_DATA) != 0;
	const struct fid_nic *nic = i->nic;
	if (nic) {
		if (nic->device_attr && nic->device_attr->name)
			snprintf(o->nic, sizeof o->nic, "%s", nic->device_attr->name);
		if (nic->bus_attr && nic->bus_attr->bus_type == FI_BUS_PCI) {
			const struct fi_pci_attr *a = &nic->bus_attr->attr.pci;
			snprintf(o->pci, sizeof o->pci, "%04x:%02x:%02x.%x", a->domain_id, a->bus_id, a->device_id, a->function_id);
		}
		if (nic->link_attr) o->link_speed = nic->link_attr->speed;
	}
	o->hmem = (i->caps & FI_HMEM) != 0;
}

int rmaw_probe(const char *prov, rmaw_info *out, int n) {
	if (!p_getinfo) return -FI_ENOSYS;
	struct fi_info *h = hints(prov, 0), *list = NULL;
	if (!h) return -FI_ENOMEM;
	sigsave s;
	save_sigs(&s);
	int rc = p_getinfo(api(), NULL, NULL, 0, h, &list);
	restore_sigs(&s);
	p_freeinfo(h);
	if (rc) return rc;
	int k = 0;
	for (struct fi_info *i = list; i && k < n; i = i->next) fill(&out[k++], i);
	p_freeinfo(list);
	return k;
}

int rmaw_probe_any(const char *prov, rmaw_info *out, int n) {
	if (!p_getinfo) return -FI_ENOSYS;
	struct fi_info *h = p_dupinfo(NULL), *list = NULL;
	if (!h) return -FI_ENOMEM;
	if (prov) h->fabric_attr->prov_name = strdup(prov);
	sigsave s;
	save_sigs(&s);
	int rc = p_getinfo(api(), NULL, NULL, 0, h, &list);
	restore_sigs(&s);
	p_freeinfo(h);
	if (rc == -FI_ENODATA) return 0;
	if (rc) return rc;
	int k = 0;
	for (struct fi_info *i = list; i && k < n; i = i->next) fill(&out[k++], i);
	p_freeinfo(list);
	return k;
}

void rmaw_close(rmaw_ep *e) {
	if (!e) return;
	if (e->ep) fi_close(&e->ep->fid);
	if (e->av) fi_close(&e->av->fid);
	if (e->cq) fi_close(&e->cq->fid);
	if (e->domain) fi_close(&e->domain->fid);
	if (e->fabric) fi_close(&e->fabric->fid);
	if (e->info) p_freeinfo(e->info);
	if (e->wake >= 0) close(e->wake);
	free(e);
}

static int open_ep(const char *prov, const char *domain, int hmem, rmaw_ep **out, rmaw_info *info);

int rmaw_open(const char *prov, const char *domain, int hmem, rmaw_ep **out, rmaw_info *info) {
	sigsave s;
	save_sigs(&s);
	int rc = open_ep(prov, domain, hmem, out, info);
	restore_sigs(&s);
	return rc;
}

// lookup finds the provider's entry for domain (any when empty), with
// FI_HMEM when hmem; *pick is a copy to free.
static int lookup(const char *prov, const char *domain, int hmem, struct fi_info **pick) {
	struct fi_info *h = hints(prov, hmem), *list = NULL;
	if (!h) return -FI_ENOMEM;
	if (domain && *domain) h->domain_attr->name = strdup(domain);
	int rc = p_getinfo(api(), NULL, NULL, 0, h, &list);
	p_freeinfo(h);
	if (rc) return rc;
	// The domain hint is not honoured by every provider (rxm over tcp
	// returns every interface): take the entry that names it.
	struct fi_info *p = list;
	if (domain && *domain) {
		for (p = list; p; p = p->next)
			if (p->domain_attr->name && !strcmp(p->domain_attr->name, domain)) break;
	}
	if (hmem && p && !(p->caps & FI_HMEM)) p = NULL;
	*pick = p ? p_dupinfo(p) : NULL;
	p_freeinfo(list);
	if (!p) return -FI_ENODATA;
	return *pick ? 0 : -FI_ENOMEM;
}

static int open_ep(const char *prov, const char *domain, int hmem, rmaw_ep **out, rmaw_info *info) {
	if (!p_getinfo) return -FI_ENOSYS;
	struct fi_info *pick = NULL;
	int rc = lookup(prov, domain, hmem, &pick);
	if (rc) return rc;
	rmaw_ep *e = calloc(1, sizeof *e);
	if (!e) { p_freeinfo(pick); return -FI_ENOMEM; }
	e->info = pick;
	e->hmem = (pick->caps & FI_HMEM) != 0;
	e->api = api();
	fill(info, e->info);
	info->api = e->api;
	e->fd = -1;
	e->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_DATA, .size = 4096, .wait_obj = FI_WAIT_FD};
	struct fi_av_attr ava = {.type = FI_AV_TABLE};
	if ((rc = p_fabric(e->info->fabric_attr, &e->fabric, NULL)) ||
	    (rc = fi_domain(e->fabric, e->info, &e->domain, NULL))) {
		rmaw_close(e);
		return rc;
	}
	// A CQ with a wait fd lets an idle progress goroutine sleep in poll();
	// providers without one get a CQ without a wait object.
	if (fi_cq_open(e->domain, &cqa, &e->cq, NULL) == 0) {
		if (fi_control(&e->cq->fid, FI_GETWAIT, &e->fd) != 0) e->fd = -1;
	} else {
		e->cq = NULL;
		cqa.wait_obj = FI_WAIT_NONE;
		if ((rc = fi_cq_open(e->domain, &cqa, &e->cq, NULL))) {
			rmaw_close(e);
			return rc;
		}
	}
	if (
	    (rc = fi_av_open(e->domain, &ava, &e->av, NULL)) ||
	    (rc = fi_endpoint(e->domain, e->info, &e->ep, NULL)) ||
	    (rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV)) ||
	    (rc = fi_ep_bind(e->ep, &e->av->fid, 0)) ||
	    (rc = fi_enable(e->ep))) {
		rmaw_close(e);
		return rc;
	}
	*out = e;
	return 0;
}

int rmaw_wait(rmaw_ep *e, int timeout_ms) {
	if (e->fd < 0 || e->wake < 0) return -FI_ENOSYS;
	struct fid *f = &e->cq->fid;
	int rc = fi_trywait(e->fabric, &f, 1);
	if (rc == -FI_EAGAIN) return 0; // something to reap: poll again
	if (rc != 0) return rc;
	struct pollfd p[2] = {{.fd = e->fd, .events = POLLIN}, {.fd = e->wake, .events = POLLIN}};
	poll(p, 2, timeout_ms);
	uint64_t v;
	if (read(e->wake, &v, sizeof v) < 0) { /* nothing pending: fine */ }
	return 0;
}

int rmaw_can_wait(rmaw_ep *e) { return e->fd >= 0 && e->wake >= 0; }

// rmaw_signal ends a wait in progress, or the next one: the eventfd stays
// readable until rmaw_wait reads it.
int rmaw_signal(rmaw_ep *e) {
	if (e->fd < 0 || e->wake < 0) return -FI_ENOSYS;
	uint64_t one = 1;
	return write(e->wake, &one, sizeof one) == sizeof one ? 0 : -FI_EIO;
}

int rmaw_name(rmaw_ep *e, void *buf, size_t *len) { return fi_getname(&e->ep->fid, buf, len); }

int rmaw_insert(rmaw_ep *e, const void *name, uint64_t *addr) {
	fi_addr_t a = FI_ADDR_UNSPEC;
	int rc = fi_av_insert(e->av, name, 1, &a, 0, NULL);
	if (rc != 1) return rc < 0 ? rc : -FI_EINVAL;
	*addr = a;
	return 0;
}

// build fills the attributes of request r for an endpoint opened with
// (hmem) or without FI_HMEM at API version api: device memory needs
// FI_HMEM; a DMA-BUF is passed as one (FI_MR_DMABUF) from API 1.20 on,
// else its address range is registered with the device's interface.
static int build(uint32_t hmem, uint32_t api, const rmaw_mr_req *r, mr_attr_buf *b, struct iovec *iov, struct rmaw_dmabuf *db, uint64_t *flags) {
	memset(b, 0, sizeof *b);
	*flags = 0;
	b->a.access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
	b->a.requested_key = r->want_key; // ignored under FI_MR_PROV_KEY
	b->a.iov_count = 1;
	b->a.iface = FI_HMEM_SYSTEM;
	if (r->iface != FI_HMEM_SYSTEM) {
		if (!hmem) return -FI_EOPNOTSUPP;
		if (r->iface != FI_HMEM_CUDA && r->iface != FI_HMEM_ROCR) return -FI_EINVAL;
		b->a.iface = (enum fi_hmem_iface)r->iface;
		if (r->iface == FI_HMEM_CUDA) b->a.device.cuda = r->device; // ROCR: the address says
		if (r->dmabuf_fd >= 0 && api >= RMAW_API_DMABUF) {
			db->fd = r->dmabuf_fd;
			db->offset = r->dmabuf_off;
			db->len = r->len;
			db->base_addr = r->base;
			b->a.mr_iov = (const struct iovec *)(const void *)db;
			*flags = RMAW_FI_MR_DMABUF;
			return 0;
		}
	}
	iov->iov_base = r->base;
	iov->iov_len = r->len;
	b->a.mr_iov = iov;
	return 0;
}

int rmaw_mr_describe(uint32_t hmem, uint32_t api, const rmaw_mr_req *r, rmaw_mr_view *v) {
	mr_attr_buf b;
	struct iovec iov;
	struct rmaw_dmabuf db;
	uint64_t flags;
	int rc = build(hmem, api, r, &b, &iov, &db, &flags);
	if (rc) return rc;
	memset(v, 0, sizeof *v);
	v->access = b.a.access;
	v->requested_key = b.a.requested_key;
	v->flags = flags;
	v->iface = b.a.iface;
	v->device = b.a.iface == FI_HMEM_CUDA ? b.a.device.cuda : -1;
	v->iov_count = b.a.iov_count;
	if (flags & RMAW_FI_MR_DMABUF) {
		const struct rmaw_dmabuf *d = (const struct rmaw_dmabuf *)(const void *)b.a.mr_iov;
		v->dmabuf = 1;
		v->fd = d->fd;
		v->offset = d->offset;
		v->len = d->len;
		v->base = (uintptr_t)d->base_addr;
	} else {
		v->fd = -1;
		v->len = b.a.mr_iov->iov_len;
		v->base = (uintptr_t)b.a.mr_iov->iov_base;
	}
	return 0;
}

int rmaw_reg(rmaw_ep *e, void *base, size_t len, uint64_t want_key, void **mr, uint64_t *key, void **desc) {
	rmaw_mr_req r = {.base = base, .len = len, .want_key = want_key, .iface = FI_HMEM_SYSTEM, .dmabuf_fd = -1};
	return rmaw_reg_mr(e, &r, mr, key, desc);
}

int rmaw_reg_mr(rmaw_ep *e, const rmaw_mr_req *r, void **mr, uint64_t *key, void **desc) {
	mr_attr_buf b;
	struct iovec iov;
	struct rmaw_dmabuf db;
	uint64_t flags;
	int rc = build(e->hmem, e->api, r, &b, &iov, &db, &flags);
	if (rc) return rc;
	struct fid_mr *m = NULL;
	rc = fi_mr_regattr(e->domain, &b.a, flags, &m);
	if (rc && (flags & RMAW_FI_MR_DMABUF)) {
		// A provider of a DMA-BUF-aware libfabric that cannot import
		// one: register the address range with the device's interface.
		rmaw_mr_req byaddr = *r;
		byaddr.dmabuf_fd = -1;
		if ((rc = build(e->hmem, e->api, &byaddr, &b, &iov, &db, &flags)) == 0) rc = fi_mr_regattr(e->domain, &b.a, flags, &m);
	}
	if (rc) return rc;
	if (e->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		if ((rc = fi_mr_bind(m, &e->ep->fid, 0)) || (rc = fi_mr_enable(m))) {
			fi_close(&m->fid);
			return rc;
		}
	}
	*mr = m;
	*key = fi_mr_key(m);
	*desc = fi_mr_desc(m);
	return 0;
}

int rmaw_dereg(void *mr) { return fi_close(&((struct fid_mr *)mr)->fid); }

int64_t rmaw_write(rmaw_ep *e, void *buf, size_t len, void *desc, uint64_t dest, uint64_t raddr, uint64_t key, void *ctx) {
	return fi_write(e->ep, buf, len, desc, dest, raddr, key, ctx);
}

int64_t rmaw_writedata(rmaw_ep *e, void *buf, size_t len, void *desc, uint64_t data, uint64_t dest, uint64_t raddr, uint64_t key, void *ctx) {
	return fi_writedata(e->ep, buf, len, desc, data, dest, raddr, key, ctx);
}

int64_t rmaw_writemsg(rmaw_ep *e, void *buf, size_t len, void *desc, uint64_t data, uint64_t dest, uint64_t raddr, uint64_t key, void *ctx, int deliver) {
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct fi_rma_iov rma = {.addr = raddr, .len = len, .key = key};
	struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = dest,
	                         .rma_iov = &rma, .rma_iov_count = 1, .context = ctx, .data = data};
	return fi_writemsg(e->ep, &msg, FI_REMOTE_CQ_DATA | FI_COMPLETION | (deliver ? FI_DELIVERY_COMPLETE : 0));
}

int64_t rmaw_sendmsg(rmaw_ep *e, void *buf, size_t len, void *desc, uint64_t dest, void *ctx, int deliver) {
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct fi_msg msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = dest, .context = ctx};
	return fi_sendmsg(e->ep, &msg, FI_COMPLETION | (deliver ? FI_DELIVERY_COMPLETE : 0));
}

int64_t rmaw_read(rmaw_ep *e, void *buf, size_t len, void *desc, uint64_t src, uint64_t raddr, uint64_t key, void *ctx) {
	return fi_read(e->ep, buf, len, desc, src, raddr, key, ctx);
}

int64_t rmaw_inject(rmaw_ep *e, const void *buf, size_t len, uint64_t dest) { return fi_inject(e->ep, buf, len, dest); }

int64_t rmaw_recv(rmaw_ep *e, void *buf, size_t len, void *desc, void *ctx) {
	return fi_recv(e->ep, buf, len, desc, FI_ADDR_UNSPEC, ctx);
}

int64_t rmaw_poll(rmaw_ep *e, rmaw_comp *out, int n) {
	struct fi_cq_data_entry ent[64];
	if (n > 64) n = 64;
	ssize_t rc = fi_cq_read(e->cq, ent, n);
	if (rc == -FI_EAVAIL) {
		struct fi_cq_err_entry err = {0};
		if (fi_cq_readerr(e->cq, &err, 0) < 0) return -FI_EAVAIL;
		out[0].ctx = err.op_context;
		out[0].flags = err.flags;
		out[0].len = 0;
		out[0].data = 0;
		out[0].err = err.err ? err.err : FI_EIO;
		return 1;
	}
	if (rc <= 0) return rc;
	for (ssize_t i = 0; i < rc; i++) {
		out[i].ctx = ent[i].op_context;
		out[i].flags = ent[i].flags;
		out[i].len = ent[i].len;
		out[i].data = ent[i].data;
		out[i].err = 0;
	}
	return rc;
}
