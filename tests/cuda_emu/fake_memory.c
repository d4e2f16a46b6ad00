/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA runtime's memory (the whole fake: fake_cudart.c): the allocation table that
 * tells device, pinned and pageable memory apart, the check of the unordered writes of one
 * launch or copy batch, and the runtime's memory calls. What it checks:
 *
 * - Device memory (cudaMalloc) is a memfd mapped twice: the address handed out is PROT_NONE, so
 *   any host-side read or write of device memory crashes at once; the copies and kernels work
 *   through a second, writable view. (With FAKE_CUDA_DEVICE_READABLE set, for the real kernels
 *   run by tests/kernel_emu, the address handed out is readable and writable too.) Fresh device
 * memory is filled with 0xcd (the first POISON_MAX bytes), pinned memory with 0xab, so nothing can
 * rely on zeroed memory.
 * - Pinned host memory (cudaHostAlloc, cudaMallocHost) has one address on both sides (UVA). It
 *   is mapped, not taken from the heap, with a PROT_NONE guard page behind it.
 * - Every copy, memset and kernel range must lie inside one live allocation (pageable host memory
 *   is allowed where the runtime allows it: the host side of a copy). An overrun, or a kernel
 *   touching memory the device cannot reach, is a bug of the code under test: the fake prints
 *   it and aborts (fake_cuda_die), so the test fails at that call with a stack.
 * - The copies of one cudaMemcpyBatchAsync, like the threads of one kernel, are unordered on a
 *   GPU: a write that overlaps another write or a read of the same batch or launch dies too.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "fake_cudart.h"
#include "fake_internal.h"

/* ---- The allocation table ------------------------------------------------------------------ */

/* Live allocations in ascending order of base (they do not overlap), so that resolving an
   address is a binary search: a manager at 256 x 32 holds tens of thousands of allocations,
   and a scan of them per resolved range (every copy, every kernel's view) made the emulated
   runtime's own bookkeeping most of a step's host time. */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *table;
static size_t n_table, cap_table;

/* The number of live allocations whose base is <= p (table_lock held). */
static size_t table_upto(uintptr_t p)
{
	size_t lo = 0, hi = n_table;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (table[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static const char *kind_name(enum kind k)
{
	switch (k) {
	case DEVICE:
		return "device (cudaMalloc)";
	case PINNED:
		return "pinned (cudaHostAlloc)";
	default:
		return "pageable";
	}
}

static int table_add(const struct alloc *a)
{
	int err = 0;
	size_t at;

	pthread_mutex_lock(&table_lock);
	if (n_table == cap_table) {
		size_t cap = cap_table ? 2 * cap_table : 64;
		struct alloc *t = realloc(table, cap * sizeof(*t));

		if (!t) {
			err = -ENOMEM;
			goto out;
		}
		table = t;
		cap_table = cap;
	}
	at = table_upto(a->base);
	memmove(table + at + 1, table + at, (n_table - at) * sizeof(*table));
	table[at] = *a;
	n_table++;
out:
	pthread_mutex_unlock(&table_lock);
	return err;
}

/* Removes the allocation that starts at p into *out: 0, -ENOENT (none), -EINVAL (another
   kind: left in place). */
static int table_take(uintptr_t p, enum kind kind, struct alloc *out)
{
	int err = -ENOENT;
	size_t i;

	pthread_mutex_lock(&table_lock);
	i = table_upto(p);
	if (i > 0 && table[i - 1].base == p) {
		i--;
		if (table[i].kind != kind) {
			err = -EINVAL;
		} else {
			*out = table[i];
			memmove(table + i, table + i + 1, (n_table - i - 1) * sizeof(*table));
			n_table--;
			err = 0;
		}
	}
	pthread_mutex_unlock(&table_lock);
	return err;
}

/* The kind of memory at p, with its allocation in *out (unless PAGEABLE). */
enum kind fake_table_find(uintptr_t p, struct alloc *out)
{
	enum kind k = PAGEABLE;
	size_t i;

	pthread_mutex_lock(&table_lock);
	i = table_upto(p);
	if (i > 0 && p - table[i - 1].base < table[i - 1].span) {
		*out = table[i - 1];
		k = table[i - 1].kind;
	}
	pthread_mutex_unlock(&table_lock);
	return k;
}

/* Lists every live allocation on stderr, as a leak; how many (the exit check, fake_cudart.c). */
size_t fake_list_leaks(void)
{
	size_t n;

	pthread_mutex_lock(&table_lock);
	n = n_table;
	for (size_t i = 0; i < n_table; i++)
		fprintf(stderr, "cuda-emu: leak: %s allocation %p + %zu bytes\n",
			kind_name(table[i].kind), (void *)table[i].base, table[i].size);
	pthread_mutex_unlock(&table_lock);
	return n;
}

/* Resolves [p, p + n), n > 0; dies when the range straddles the edge of an allocation. */
struct range fake_resolve(const void *p, size_t n, const char *what)
{
	uintptr_t a = (uintptr_t)p;
	struct alloc al;
	struct range r = {fake_table_find(a, &al), (char *)(uintptr_t)p};

	if (r.kind == PAGEABLE) {
		if (fake_table_find(a + n - 1, &al) != PAGEABLE)
			fake_cuda_die("%s: %p + %zu bytes starts before its %s allocation %p", what,
				      p, n, kind_name(al.kind), (void *)al.base);
		return r;
	}
	if (a - al.base > al.size || n > al.size - (a - al.base))
		fake_cuda_die("%s: %p + %zu bytes overruns its %s allocation %p + %zu bytes", what,
			      p, n, kind_name(r.kind), (void *)al.base, al.size);
	if (r.kind == DEVICE)
		r.view = al.shadow + (a - al.base);
	return r;
}

void *fake_cuda_kernel_view(uint64_t addr, size_t n, const char *what)
{
	struct range r;

	if (n == 0)
		return NULL;
	r = fake_resolve((const void *)(uintptr_t)addr, n, what);
	if (r.kind == PAGEABLE)
		fake_cuda_die("%s: kernel access to %#llx + %zu bytes: neither cudaMalloc nor "
			      "cudaHostAlloc memory, so not device-accessible",
			      what, ULL(addr), n);
	return r.view;
}

/* ---- Unordered writes ---------------------------------------------------------------------- */

struct tagged {
	uint64_t lo, hi;
	size_t i;
};

static int cmp_lo(const void *a, const void *b)
{
	const struct tagged *x = a, *y = b;

	return (x->lo > y->lo) - (x->lo < y->lo);
}

void fake_cuda_check_footprint(const struct fake_range *w, size_t n_w, const struct fake_range *r,
			       size_t n_r, const char *what)
{
	struct tagged *s = malloc((n_w ? n_w : 1) * sizeof(*s));
	size_t m = 0;

	if (!s) {
		fake_cuda_warn("%s: no memory to check %zu writes for conflicts", what, n_w);
		return;
	}
	for (size_t i = 0; i < n_w; i++)
		if (w[i].bytes)
			s[m++] = (struct tagged){w[i].addr, w[i].addr + w[i].bytes, i};
	qsort(s, m, sizeof(*s), cmp_lo);
	for (size_t j = 1; j < m; j++) {
		const struct tagged *a = &s[j - 1], *b = &s[j];

		if (b->lo < a->hi)
			fake_cuda_die(
				"%s: writes %zu [%#llx, %#llx) and %zu [%#llx, %#llx) overlap",
				what, a->i, ULL(a->lo), ULL(a->hi), b->i, ULL(b->lo), ULL(b->hi));
	}
	/* The writes are disjoint and sorted, so only the last one starting before a read's end
	   can overlap it. */
	for (size_t i = 0; i < n_r; i++) {
		uint64_t lo = r[i].addr, hi = r[i].addr + r[i].bytes;
		size_t a = 0, b = m;

		if (!r[i].bytes)
			continue;
		while (a < b) {
			size_t mid = a + (b - a) / 2;

			if (s[mid].lo < hi)
				a = mid + 1;
			else
				b = mid;
		}
		if (a > 0 && s[a - 1].hi > lo)
			fake_cuda_die(
				"%s: read %zu [%#llx, %#llx) overlaps write %zu [%#llx, %#llx)",
				what, i, ULL(lo), ULL(hi), s[a - 1].i, ULL(s[a - 1].lo),
				ULL(s[a - 1].hi));
	}
	free(s);
}

/* ---- Memory -------------------------------------------------------------------------------- */

static size_t page_up(size_t n)
{
	return n > SIZE_MAX - (PAGE - 1) ? 0 : (n + PAGE - 1) / PAGE * PAGE;
}

/*
 * Freed mappings kept for reuse. Tests create and destroy managers by the thousand (the fault
 * walk replays its workload once per fault site) with the same arena sizes each time, and in
 * a VM a fresh mapping costs a page fault per page at its first poisoning (so does one made
 * PROT_NONE and back): that was over half of such a run. A kept pinned mapping is filled with
 * POISON_FREED, and checked for it when it is handed out again, so a host write after
 * cudaFreeHost is caught then (a read sees garbage); device memory is reachable only through
 * this fake, whose range checks already refuse freed memory. Either is poisoned afresh on
 * reuse, whole, so nothing sees old contents. Reused by exact span and kind, spans of at most
 * POISON_MAX; at most MAP_CACHE_N mappings and MAP_CACHE_BYTES in all, the oldest unmapped
 * first.
 */
#define MAP_CACHE_N 32
#define MAP_CACHE_BYTES ((size_t)256 << 20)

struct kept_map {
	enum kind kind;
	size_t span;
	char *map, *shadow; /* PINNED: span + a guard page; DEVICE: the two views of span */
};

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept_map kept[MAP_CACHE_N];
static size_t n_kept, kept_bytes;

static void unmap_kept(const struct kept_map *k)
{
	if (k->kind == PINNED) {
		munmap(k->map, k->span + PAGE);
	} else {
		munmap(k->map, k->span);
		munmap(k->shadow, k->span);
	}
}

/* Keeps a freed mapping for reuse (unmaps it when it is too large to keep). */
static void keep_map(enum kind kind, size_t span, char *map, char *shadow)
{
	struct kept_map k = {kind, span, map, shadow}, old[MAP_CACHE_N];
	size_t n_old = 0;

	if (span > POISON_MAX) {
		unmap_kept(&k);
		return;
	}
	if (kind == PINNED)
		memset(map, POISON_FREED, span);
	pthread_mutex_lock(&kept_lock);
	while (n_kept == MAP_CACHE_N || kept_bytes + span > MAP_CACHE_BYTES) {
		old[n_old++] = kept[0];
		kept_bytes -= kept[0].span;
		memmove(&kept[0], &kept[1], --n_kept * sizeof(kept[0]));
	}
	kept[n_kept++] = k;
	kept_bytes += span;
	pthread_mutex_unlock(&kept_lock);
	for (size_t i = 0; i < n_old; i++)
		unmap_kept(&old[i]);
}

/* A kept mapping of this kind and span, taken out of the cache: true. A pinned one whose
   POISON_FREED was overwritten stops the process: something wrote to it after it was freed. */
static bool reuse_map(enum kind kind, size_t span, struct kept_map *out)
{
	static const char freed[PAGE] = {[0 ... PAGE - 1] = (char)POISON_FREED};
	bool found = false;

	pthread_mutex_lock(&kept_lock);
	for (size_t i = n_kept; i-- > 0;)
		if (kept[i].kind == kind && kept[i].span == span) {
			*out = kept[i];
			kept_bytes -= span;
			memmove(&kept[i], &kept[i + 1], (--n_kept - i) * sizeof(kept[0]));
			found = true;
			break;
		}
	pthread_mutex_unlock(&kept_lock);
	for (size_t off = 0; found && kind == PINNED && off < span; off += PAGE)
		if (memcmp(out->map + off, freed, PAGE) != 0)
			fake_cuda_die("pinned memory written after cudaFreeHost: bytes %zu..%zu of "
				      "a freed %zu-byte allocation at %p",
				      off, off + PAGE - 1, span, (void *)out->map);
	return found;
}

static atomic_ulong n_mallocs;

uint64_t fake_cuda_mallocs(void)
{
	return atomic_load(&n_mallocs);
}

static cudaError_t device_alloc(void **p, size_t n);

cudaError_t cudaMalloc(void **p, size_t n)
{
	atomic_fetch_add(&n_mallocs, 1);
	return device_alloc(p, n);
}

/* cudaMalloc's work, and the stream-ordered allocations'. */
static cudaError_t device_alloc(void **p, size_t n)
{
	struct alloc a = {.size = n, .span = page_up(n), .kind = DEVICE};
	void *dev = MAP_FAILED, *shadow = MAP_FAILED;
	cudaError_t e = cudaErrorMemoryAllocation;
	struct kept_map k;
	bool reused;
	int fd = -1, prot;

	if (!p)
		return cudaErrorInvalidValue;
	*p = NULL;
	if (n == 0)
		return cudaSuccess;
	if (a.span == 0)
		goto out;
	/* FAKE_CUDA_DEVICE_READABLE: kernels that dereference device addresses themselves (the
	   real ones, through tests/kernel_emu) need the address readable and writable */
	prot = getenv("FAKE_CUDA_DEVICE_READABLE") ? PROT_READ | PROT_WRITE : PROT_NONE;
	reused = reuse_map(DEVICE, a.span, &k);
	if (reused) {
		dev = k.map;
		shadow = k.shadow;
	} else {
		fd = memfd_create("cuda-emu device memory", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)a.span) != 0)
			goto out;
		dev = mmap(NULL, a.span, prot, MAP_SHARED | MAP_NORESERVE, fd, 0);
		shadow = mmap(NULL, a.span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd,
			      0);
		if (dev == MAP_FAILED || shadow == MAP_FAILED)
			goto out;
	}
	fake_tsan_hide(true);
	memset(shadow, POISON_DEVICE, reused ? a.span : n < POISON_MAX ? n : POISON_MAX);
	fake_tsan_hide(false);
	a.base = (uintptr_t)dev;
	a.shadow = shadow;
	if (table_add(&a) != 0)
		goto out;
	*p = dev;
	dev = shadow = MAP_FAILED;
	e = cudaSuccess;
out:
	if (dev != MAP_FAILED)
		munmap(dev, a.span);
	if (shadow != MAP_FAILED)
		munmap(shadow, a.span);
	if (fd >= 0)
		close(fd);
	return e;
}

/* The device of cudaGetDeviceProperties (80 GiB, fake_cudart.c) less what is allocated on it. */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
	size_t used = 0;

	if (!free_bytes || !total)
		return cudaErrorInvalidValue;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < n_table; i++)
		if (table[i].kind == DEVICE)
			used += table[i].span;
	pthread_mutex_unlock(&table_lock);
	*total = (size_t)80 << 30;
	*free_bytes = used < *total ? *total - used : 0;
	return cudaSuccess;
}

/* cudaFree and cudaFreeHost: p (NULL: nothing) must start an allocation of this kind. Like
   CUDA's, it waits for the device first; the mapping is kept for reuse (keep_map). call names
   the caller, other what the wrong kind of memory is, alloc the call that allocates kind. */
static cudaError_t free_kind(void *p, enum kind kind, const char *call, const char *other,
			     const char *alloc)
{
	struct alloc a;
	int err;

	if (!p)
		return cudaSuccess;
	fake_wait_for(NULL, true);
	err = table_take((uintptr_t)p, kind, &a);
	if (err) {
		if (err == -EINVAL)
			fake_cuda_warn("%s(%p): %s", call, p, other);
		else
			fake_cuda_warn("%s(%p): not the start of a %s allocation", call, p, alloc);
		return cudaErrorInvalidValue;
	}
	keep_map(kind, a.span, (char *)a.base, a.shadow); /* PINNED: no shadow */
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	return free_kind(p, DEVICE, "cudaFree", "pinned host memory (cudaFreeHost frees it)",
			 "cudaMalloc");
}

/* Stream-ordered allocation: the memory is valid at once, for work queued anywhere after the
   call (CUDA's is valid for work ordered after it on the stream; nothing that uses it early
   can be seen here). */
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
	if (!fake_stream_ok(s, "cudaMallocAsync"))
		return cudaErrorInvalidResourceHandle;
	return device_alloc(p, n);
}

/* Memory pools: one kind, device memory of device 0 (what the backend creates); an allocation
   from one is a cudaMallocAsync one, and freeing it is cudaFreeAsync's or cudaFree's. */
#define POOL_MAGIC 0x504f4f4cu

struct CUmemPoolHandle_st {
	uint32_t magic;
};

static bool pool_ok(cudaMemPool_t p, const char *what)
{
	if (p && p->magic == POOL_MAGIC)
		return true;
	fake_cuda_warn("%s: memory pool %p is not live", what, (void *)p);
	return false;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props)
{
	if (!pool || !props || props->allocType != cudaMemAllocationTypePinned ||
	    props->location.type != cudaMemLocationTypeDevice || props->location.id != 0) {
		fake_cuda_warn("cudaMemPoolCreate: only device memory of device 0 is emulated");
		return cudaErrorInvalidValue;
	}
	*pool = calloc(1, sizeof(**pool));
	if (!*pool)
		return cudaErrorMemoryAllocation;
	(*pool)->magic = POOL_MAGIC;
	return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
	if (!pool_ok(pool, "cudaMemPoolSetAttribute"))
		return cudaErrorInvalidValue;
	if (!value || attr != cudaMemPoolAttrReleaseThreshold) {
		fake_cuda_warn("cudaMemPoolSetAttribute: attribute %d is not emulated", (int)attr);
		return cudaErrorInvalidValue;
	}
	return cudaSuccess;
}

/* Nothing to give back: the fake's pool keeps no memory of its own. */
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep)
{
	(void)keep;
	return pool_ok(pool, "cudaMemPoolTrimTo") ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool)
{
	if (!pool_ok(pool, "cudaMemPoolDestroy"))
		return cudaErrorInvalidValue;
	pool->magic = 0;
	free(pool);
	return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t s)
{
	if (!pool_ok(pool, "cudaMallocFromPoolAsync"))
		return cudaErrorInvalidValue;
	if (!fake_stream_ok(s, "cudaMallocFromPoolAsync"))
		return cudaErrorInvalidResourceHandle;
	return device_alloc(p, n);
}

/* Frees a device allocation now, as the queued operation of cudaFreeAsync: no wait. */
void fake_free_device_now(void *p, const char *what)
{
	struct alloc a;

	if (table_take((uintptr_t)p, DEVICE, &a) != 0)
		fake_cuda_die("%s(%p): the allocation was freed before its free ran", what, p);
	keep_map(DEVICE, a.span, (char *)a.base, a.shadow);
}

/* Stream-ordered free: p must start a device allocation now; it is freed when the stream
   gets there (the asynchronous fake: when a wait needs the stream's work, after the work
   queued before it there; the synchronous one: at once), and work that touches it after
   that dies on the freed address. */
cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
	struct alloc a;
	struct op *o;

	if (!fake_stream_ok(s, "cudaFreeAsync"))
		return cudaErrorInvalidResourceHandle;
	if (!p)
		return cudaSuccess;
	if (fake_table_find((uintptr_t)p, &a) != DEVICE || a.base != (uintptr_t)p) {
		fake_cuda_warn("cudaFreeAsync(%p): not the start of a cudaMalloc allocation", p);
		return cudaErrorInvalidValue;
	}
	o = fake_op_new(fake_key_of(s), OP_FREE, "cudaFreeAsync", 0);
	o->dst = p;
	fake_submit(o);
	return cudaSuccess;
}

/* Pinned memory is mapped, not malloc'ed: the backend hands it to jemalloc as extents, which a
   heap block (jemalloc's own, when it is the process's malloc) must not be. A PROT_NONE guard
   page behind it catches host-side overruns past the last page. */
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
	struct alloc a = {.size = n, .span = page_up(n ? n : 1), .kind = PINNED};
	struct kept_map k;
	bool reused;
	char *m;

	(void)flags; /* under UVA every pinned allocation is mapped and portable */
	if (!p)
		return cudaErrorInvalidValue;
	*p = NULL;
	if (a.span == 0 || a.span > SIZE_MAX - PAGE)
		return cudaErrorMemoryAllocation;
	reused = reuse_map(PINNED, a.span, &k);
	if (reused) {
		m = k.map;
	} else {
		m = mmap(NULL, a.span + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		if (m == MAP_FAILED)
			return cudaErrorMemoryAllocation;
		if (mprotect(m + a.span, PAGE, PROT_NONE) != 0)
			goto fail;
	}
	memset(m, POISON_PINNED, reused ? a.span : n < POISON_MAX ? n : POISON_MAX);
	a.base = (uintptr_t)m;
	if (table_add(&a) != 0)
		goto fail;
	*p = m;
	return cudaSuccess;
fail:
	munmap(m, a.span + PAGE);
	return cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
	return cudaHostAlloc(p, n, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p)
{
	return free_kind(p, PINNED, "cudaFreeHost", "device memory (cudaFree frees it)",
			 "cudaHostAlloc");
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags)
{
	struct alloc a;

	if (!d || flags != 0)
		return cudaErrorInvalidValue;
	if (fake_table_find((uintptr_t)h, &a) != PINNED) {
		fake_cuda_warn("cudaHostGetDevicePointer(%p): not pinned host memory", h);
		return cudaErrorInvalidValue;
	}
	*d = h;
	return cudaSuccess;
}

/* Whether the memory on each side fits what kind says (Default infers it, as under UVA). */
static bool kind_ok(enum cudaMemcpyKind kind, struct range dst, struct range src, const char *what)
{
	const char *bad = NULL;

	switch (kind) {
	case cudaMemcpyHostToHost:
		if (dst.kind == DEVICE || src.kind == DEVICE)
			bad = "device memory on a host side";
		break;
	case cudaMemcpyHostToDevice:
		if (dst.kind == PAGEABLE)
			bad = "a pageable destination";
		else if (src.kind == DEVICE)
			bad = "a device source";
		break;
	case cudaMemcpyDeviceToHost:
		if (src.kind == PAGEABLE)
			bad = "a pageable source";
		else if (dst.kind == DEVICE)
			bad = "a device destination";
		break;
	case cudaMemcpyDeviceToDevice:
		if (dst.kind == PAGEABLE || src.kind == PAGEABLE)
			bad = "pageable memory on a device side";
		break;
	case cudaMemcpyDefault:
		break;
	default:
		bad = "an unknown kind";
		break;
	}
	if (bad)
		fake_cuda_warn("%s: copy kind %d with %s", what, (int)kind, bad);
	return !bad;
}

/* One copy of n bytes on stream s: CUDA's checks first, then the fake's; then done now or, in
   the asynchronous fake, queued where CUDA lets it run after the call returns. blocking: a
   call that CUDA completes before it returns when a host side is involved (cudaMemcpy). */
static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			cudaStream_t s, bool blocking, const char *what)
{
	struct range d, r;
	struct op *o;

	if (!fake_stream_ok(s, what))
		return cudaErrorInvalidResourceHandle;
	if (n == 0)
		return cudaSuccess;
	if (!dst || !src) {
		fake_cuda_warn("%s: NULL pointer (dst %p, src %p)", what, dst, src);
		return cudaErrorInvalidValue;
	}
	d = fake_resolve(dst, n, what);
	r = fake_resolve(src, n, what);
	if (!kind_ok(kind, d, r, what))
		return cudaErrorInvalidValue;
	if ((uintptr_t)d.view - (uintptr_t)r.view < n || (uintptr_t)r.view - (uintptr_t)d.view < n)
		fake_cuda_die("%s: source %p and destination %p of %zu bytes overlap", what, src,
			      dst, n);
	o = fake_op_new(fake_key_of(s), OP_COPY, what, 0);
	o->dst = dst;
	o->src = src;
	o->n = n;
	/* Asynchronous with respect to the host only between device memory and device or pinned
	   memory (CUDA's "API synchronization behavior"): a pageable side is staged or waited
	   for, host to host is synchronous, and cudaMemcpy waits unless both sides are device. */
	if ((d.kind == DEVICE || r.kind == DEVICE) && d.kind != PAGEABLE && r.kind != PAGEABLE &&
	    !(blocking && (d.kind != DEVICE || r.kind != DEVICE))) {
		o->queued_dev = true;
		fake_submit(o);
	} else
		fake_submit_blocking(o);
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	if (!fake_async_on)
		fake_waited(); /* the legacy stream waits for the work queued before */
	return copy(dst, src, n, kind, NULL, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			    cudaStream_t s)
{
	return copy(dst, src, n, kind, s, false, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes,
				 size_t count, struct cudaMemcpyAttributes *attrs,
				 size_t *attrs_idxs, size_t num_attrs, cudaStream_t s)
{
	const char *what = "cudaMemcpyBatchAsync";
	struct fake_range *fr;
	cudaError_t e = cudaSuccess;

	if (!s) {
		fake_cuda_warn("%s on the legacy stream, which CUDA refuses", what);
		return cudaErrorInvalidValue;
	}
	if (!fake_stream_ok(s, what))
		return cudaErrorInvalidResourceHandle;
	if (!count || !dsts || !srcs || !sizes || !attrs || !attrs_idxs || !num_attrs ||
	    num_attrs > count || attrs_idxs[0] != 0)
		return cudaErrorInvalidValue;
	for (size_t i = 0; i < num_attrs; i++)
		if ((i && attrs_idxs[i] <= attrs_idxs[i - 1]) || attrs_idxs[i] >= count ||
		    attrs[i].srcAccessOrder == cudaMemcpySrcAccessOrderInvalid ||
		    attrs[i].srcAccessOrder > cudaMemcpySrcAccessOrderAny)
			return cudaErrorInvalidValue;
	if (count > SIZE_MAX / (2 * sizeof(*fr)))
		return cudaErrorInvalidValue;
	fr = malloc(2 * count * sizeof(*fr));
	if (!fr)
		return cudaErrorMemoryAllocation;
	for (size_t i = 0; i < count; i++) {
		if (sizes[i] && (!dsts[i] || !srcs[i])) {
			fake_cuda_warn("%s: copy %zu has a NULL pointer", what, i);
			e = cudaErrorInvalidValue;
			goto out;
		}
		if (sizes[i]) {
			fake_resolve(dsts[i], sizes[i], what);
			fake_resolve(srcs[i], sizes[i], what);
		}
		fr[i] = (struct fake_range){(uintptr_t)dsts[i], sizes[i]};
		fr[count + i] = (struct fake_range){(uintptr_t)srcs[i], sizes[i]};
	}
	fake_cuda_check_footprint(fr, count, fr + count, count, what);
	for (size_t i = 0; i < count && e == cudaSuccess; i++)
		e = copy(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, s, false, what);
out:
	free(fr);
	return e;
}

/* A memset on stream s, queued in the asynchronous fake unless the memory is pinned (then
   CUDA finishes it before returning). */
static cudaError_t set(void *p, int value, size_t n, cudaStream_t s, const char *what)
{
	struct range r;
	struct op *o;

	if (!fake_stream_ok(s, what))
		return cudaErrorInvalidResourceHandle;
	if (n == 0)
		return cudaSuccess;
	r = fake_resolve(p, n, what);
	if (r.kind == PAGEABLE) {
		fake_cuda_warn("%s(%p): not device-accessible memory", what, p);
		return cudaErrorInvalidValue;
	}
	o = fake_op_new(fake_key_of(s), OP_SET, what, 0);
	o->dst = p;
	o->n = n;
	o->value = value;
	if (r.kind == DEVICE)
		fake_submit(o);
	else
		fake_submit_blocking(o);
	return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
	if (!fake_async_on)
		fake_waited();
	return set(p, value, n, NULL, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
	return set(p, value, n, s, "cudaMemsetAsync");
}
