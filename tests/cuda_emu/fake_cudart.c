/* SPDX-License-Identifier: MIT */
/*
 * A fake of the CUDA runtime, so that builds without a GPU (CI, sanitizers) run the real CUDA
 * backend (transfer/cuda.c, cuda_bench.c) and the real GPU suite (tests/test_cuda.c) on the
 * CPU. Every call does its work before it returns, unless FAKE_CUDA_ASYNC asks for the
 * asynchronous mode below; the kernels are fake_kernels.c. It
 * is a shared library so that the test binary and the dlopened plugin share one allocation
 * table. What it checks, which a real GPU would not report or only as a corrupt result:
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
 * - Misuse that the runtime answers with an error (a wrong copy kind, an unknown pointer to
 *   cudaFree, a dead stream or event, an attribute the fake does not know) is also reported as a
 *   warning and counted.
 * - At exit (a destructor, which also runs when only the plugin loaded this library) it lists
 *   every device and pinned allocation, stream and event still live. Any leak or warning ends
 *   the process with status 1 (after flushing stdio), so meson sees the test fail even when
 *   the test binary itself passed.
 *
 * Ordering, synchronous (the default): the work is done by the calling thread, so there is
 * nothing to wait for, but a thread that waits (an event, a stream, the device) must see what
 * the work wrote, as on a GPU. Every queued operation ends with a release on one device-wide
 * timeline (and a recorded event keeps its own), every wait begins with the matching acquire:
 * TSan sees at least the order CUDA promises (a stream's wait also orders other streams' work:
 * coarser than CUDA, never finer). Work on device memory alone is hidden from TSan (tsan_hide).
 *
 * Ordering, asynchronous (FAKE_CUDA_ASYNC=1): what CUDA lets run after the call returns does.
 * Kernels, device-side memsets and copies that touch device memory and no pageable memory are
 * queued and run as late as CUDA allows: only when a wait needs them (an event or stream
 * synchronisation, a blocking copy, cudaDeviceSynchronize, cudaFree), on the waiting thread,
 * and then only the work that wait depends on (the stream's earlier work; for the legacy stream,
 * the earlier work of every blocking stream, and the other way round; never a non-blocking
 * stream's for another stream). So a kernel reads its inputs, and a copy its source, when it
 * runs, not when it was launched, and its results appear only then: code that reuses a buffer
 * the device still reads, or reads what the device has not yet written, without the wait CUDA
 * requires, computes wrong results here deterministically, where a GPU would do so only now
 * and then. Copies CUDA performs before returning (cudaMemcpy to or from the host, any copy
 * with a pageable side, host to host) first run the work their stream depends on, then run at
 * once. One lock orders the queue and the work. Pinned memory that queued work uses is watched
 * until it runs (struct watch): a copy's pinned source and destination, and what a launch names
 * in its reads (a gather's piece sources); a destination nothing else queued uses is poisoned
 * (0xef) when queued. The operation dies, when it runs, if any of it changed meanwhile other
 * than by queued work: the host rewrote a buffer the device had not finished with.
 *
 * No thread-local variables: the bench loads this library only through the dlopened plugin, and
 * LeakSanitizer (GCC 12) can take wrong bounds for such a library's dynamic TLS block and crash
 * scanning them at exit ("Tracer caught signal 11").
 *
 * cudaEventElapsedTime answers a fixed pseudo-random sequence (0.05 to 0.149 ms): the backend's
 * start-up calibration then picks the fused kernel for some piece sizes and DMA for others, so
 * both gather paths run, the same way on every run.
 */
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
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

#define PAGE 4096
#define POISON_DEVICE 0xcd
#define POISON_PINNED 0xab
#define POISON_PENDING 0xef /* asynchronous: pinned memory a queued operation will write */
#define POISON_FREED 0xdd   /* pinned memory freed and kept for reuse (keep_map) */
#define POISON_MAX ((size_t)64 << 20) /* bytes poisoned per allocation; the rest reads 0 */
#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x4556544eu
#define ULL(x) ((unsigned long long)(x))

/* ---- Reporting --------------------------------------------------------------------------- */

static atomic_ulong n_warnings;

void fake_cuda_die(const char *fmt, ...)
{
	void *frames[32];
	va_list ap;

	fputs("cuda-emu: error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (a bug in the code under test)\n", stderr);
	backtrace_symbols_fd(frames, backtrace(frames, 32), STDERR_FILENO);
	fflush(NULL);
	abort();
}

void fake_cuda_warn(const char *fmt, ...)
{
	va_list ap;

	fputs("cuda-emu: warning: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	atomic_fetch_add(&n_warnings, 1);
}

/* ---- Ordering ------------------------------------------------------------------------------ */

static atomic_ulong timeline;

/* After an operation's work: what it wrote is visible to the next wait. */
static void queued(void)
{
	atomic_fetch_add_explicit(&timeline, 1, memory_order_release);
}

/* Before a wait returns: everything queued so far, on any thread, is visible. */
static void waited(void)
{
	(void)atomic_load_explicit(&timeline, memory_order_acquire);
}

/* ThreadSanitizer's dynamic annotations: weak, so NULL unless its runtime is loaded. */
void AnnotateIgnoreReadsBegin(const char *file, int line) __attribute__((weak));
void AnnotateIgnoreReadsEnd(const char *file, int line) __attribute__((weak));
void AnnotateIgnoreWritesBegin(const char *file, int line) __attribute__((weak));
void AnnotateIgnoreWritesEnd(const char *file, int line) __attribute__((weak));

/* Hides (on) or shows again the accesses of the calling thread from ThreadSanitizer, around
   work on device memory alone. Device memory is not host memory: nothing but this fake and the
   CPU kernels touch it, on the thread that queues the work, and its order is CUDA's (streams,
   events: the timeline above), not the host threads'. Checking its bulk writes (test_cuda's
   stalls alone are 64 GiB of cudaMemsetAsync) took TSan minutes, on memory no thread shares. */
static void tsan_hide(bool on)
{
	if (!AnnotateIgnoreReadsBegin || !AnnotateIgnoreWritesBegin || !AnnotateIgnoreReadsEnd ||
	    !AnnotateIgnoreWritesEnd)
		return;
	if (on) {
		AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
		AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
	} else {
		AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
		AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
	}
}

/* ---- The allocation table ------------------------------------------------------------------ */

enum kind {
	PAGEABLE, /* not the fake's: host memory the device cannot reach */
	DEVICE,
	PINNED,
};

struct alloc {
	uintptr_t base;
	size_t size, span; /* asked for; mapped (a whole number of pages, so never 0) */
	char *shadow;	   /* DEVICE: the writable view */
	enum kind kind;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *table;
static size_t n_table, cap_table;

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
	table[n_table++] = *a;
out:
	pthread_mutex_unlock(&table_lock);
	return err;
}

/* Removes the allocation that starts at p into *out: 0, -ENOENT (none), -EINVAL (another
   kind: left in place). */
static int table_take(uintptr_t p, enum kind kind, struct alloc *out)
{
	int err = -ENOENT;

	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < n_table; i++) {
		if (table[i].base != p)
			continue;
		if (table[i].kind != kind) {
			err = -EINVAL;
			break;
		}
		*out = table[i];
		table[i] = table[--n_table];
		err = 0;
		break;
	}
	pthread_mutex_unlock(&table_lock);
	return err;
}

/* The kind of memory at p, with its allocation in *out (unless PAGEABLE). */
static enum kind table_find(uintptr_t p, struct alloc *out)
{
	enum kind k = PAGEABLE;

	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < n_table; i++)
		if (p >= table[i].base && p - table[i].base < table[i].span) {
			*out = table[i];
			k = table[i].kind;
			break;
		}
	pthread_mutex_unlock(&table_lock);
	return k;
}

/* A range [p, p + n) that one call touches: its kind and its host view. */
struct range {
	enum kind kind;
	char *view;
};

/* Resolves [p, p + n), n > 0; dies when the range straddles the edge of an allocation. */
static struct range resolve(const void *p, size_t n, const char *what)
{
	uintptr_t a = (uintptr_t)p;
	struct alloc al;
	struct range r = {table_find(a, &al), (char *)(uintptr_t)p};

	if (r.kind == PAGEABLE) {
		if (table_find(a + n - 1, &al) != PAGEABLE)
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
	r = resolve((const void *)(uintptr_t)addr, n, what);
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

/* ---- Streams and events -------------------------------------------------------------------- */

struct op;

struct CUstream_st {
	uint32_t magic;
	unsigned int flags;
	uint64_t id; /* never reused: queued work names its stream by id */
};

struct CUevent_st {
	uint32_t magic;
	unsigned int flags;
	atomic_uint recorded; /* release by cudaEventRecord, acquire by the waits */
	struct op *mark;      /* asynchronous: the latest record, NULL before the first */
};

static atomic_long live_streams, live_events;
static atomic_ulong next_stream_id = 1; /* 0 is the legacy stream */

/* ---- The asynchronous fake ------------------------------------------------------------------ */

static bool async_on; /* FAKE_CUDA_ASYNC, read once before the first call */

__attribute__((constructor)) static void async_init(void)
{
	const char *e = getenv("FAKE_CUDA_ASYNC");

	async_on = e && *e && strcmp(e, "0") != 0;
}

/* How a stream orders with the others (CUDA's legacy default stream semantics). */
enum scls {
	S_LEGACY,      /* waits for the earlier work of every blocking stream, and they for it */
	S_BLOCKING,    /* created without cudaStreamNonBlocking */
	S_NONBLOCKING, /* ordered with nothing but itself */
};

struct skey {
	uint64_t id;
	enum scls cls;
};

static struct skey key_of(cudaStream_t s)
{
	if (!s)
		return (struct skey){0, S_LEGACY};
	return (struct skey){s->id, s->flags & cudaStreamNonBlocking ? S_NONBLOCKING : S_BLOCKING};
}

enum op_kind { OP_COPY, OP_SET, OP_WORK, OP_MARK };

/* Pinned memory that a queued operation reads or writes, with a checksum of it: until the
   operation has run, only queued operations may change it (the host waits first). */
struct watch {
	uintptr_t lo, hi;
	uint64_t sum;
	bool write;
};

/* One queued operation. Pointers are the caller's (device addresses): they are resolved to
   views when the operation runs, so memory freed meanwhile is caught then. */
struct op {
	struct skey on;
	enum op_kind kind;
	bool done, take;   /* take: scratch of run_deps */
	unsigned int refs; /* events whose latest record this is */
	const char *what;
	void *dst;
	const void *src;
	size_t n;
	int value;
	fake_cuda_work fn;
	struct watch *w; /* asynchronous: its pinned ranges */
	size_t n_w;
	max_align_t args[]; /* OP_WORK: the launch's copy of its arguments */
};

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct op **pend; /* queued, not yet run, in the order queued (dev_lock) */
static size_t n_pend, cap_pend;
static uint64_t *need; /* run_deps' streams (dev_lock) */
static size_t cap_need;
static unsigned long n_queued, n_run_late, most_pending;

static struct op *op_new(struct skey on, enum op_kind kind, const char *what, size_t args)
{
	struct op *o = calloc(1, sizeof(*o) + args);

	if (!o)
		fake_cuda_die("%s: no memory to queue an operation", what);
	o->on = on;
	o->kind = kind;
	o->what = what;
	return o;
}

static void op_free(struct op *o)
{
	if (o) {
		free(o->w);
		free(o);
	}
}

/* A checksum of [lo, hi): any change of a few bytes changes it. */
static uint64_t checksum(uintptr_t lo, uintptr_t hi)
{
	const unsigned char *p = (const unsigned char *)lo;
	size_t n = hi - lo, i = 0;
	uint64_t h = 0x9e3779b97f4a7c15ull ^ n, x;

	for (; i + 8 <= n; i += 8) {
		memcpy(&x, p + i, sizeof(x));
		h = (h ^ x) * 0xff51afd7ed558ccdull;
		h ^= h >> 29;
	}
	for (; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* Whether a queued operation other than `but` reads or writes pinned memory in [lo, hi)
   (dev_lock held). */
static bool watched(uintptr_t lo, uintptr_t hi, const struct op *but)
{
	for (size_t j = 0; j < n_pend; j++)
		for (size_t i = 0; pend[j] != but && i < pend[j]->n_w; i++)
			if (pend[j]->w[i].lo < hi && lo < pend[j]->w[i].hi)
				return true;
	return false;
}

/* Watches [p, p + n) for o, about to be queued, if it is pinned memory (dev_lock held). A
   destination that no queued operation uses yet is poisoned first: what the host reads there
   before waiting for o is garbage, as it may be on a GPU, instead of the old contents. */
static void watch(struct op *o, const void *p, size_t n, bool write)
{
	uintptr_t lo = (uintptr_t)p;
	struct watch *w;
	struct alloc a;

	if (!n || table_find(lo, &a) != PINNED || n > a.size || lo - a.base > a.size - n)
		return; /* an overrun: o itself reports it when it runs */
	w = realloc(o->w, (o->n_w + 1) * sizeof(*w));
	if (!w)
		fake_cuda_die("%s: no memory to queue an operation", o->what);
	o->w = w;
	w = &o->w[o->n_w++];
	*w = (struct watch){lo, lo + n, 0, write};
	if (write && !watched(w->lo, w->hi, NULL))
		memset((void *)lo, POISON_PENDING, n);
	w->sum = checksum(w->lo, w->hi);
}

/* Before o runs: dies when the host changed pinned memory o reads or writes since o was
   queued (dev_lock held). */
static void watch_check(const struct op *o)
{
	for (size_t i = 0; i < o->n_w; i++)
		if (checksum(o->w[i].lo, o->w[i].hi) != o->w[i].sum)
			fake_cuda_die("%s: pinned memory [%p, %p) that it %s changed after it was "
				      "queued and before it ran, with no wait for it: the host "
				      "reused a buffer the device had not finished with",
				      o->what, (void *)o->w[i].lo, (void *)o->w[i].hi,
				      o->w[i].write ? "writes" : "reads");
}

/* After o ran: the queued operations watching what it wrote take their checksums again (dev_lock
   held); device work may change what later work uses. */
static void watch_update(const struct op *o)
{
	for (size_t i = 0; i < o->n_w; i++) {
		if (!o->w[i].write)
			continue;
		for (size_t j = 0; j < n_pend; j++) {
			struct op *q = pend[j];

			for (size_t k = 0; q != o && !q->done && k < q->n_w; k++)
				if (q->w[k].lo < o->w[i].hi && o->w[i].lo < q->w[k].hi)
					q->w[k].sum = checksum(q->w[k].lo, q->w[k].hi);
		}
	}
}

/* Queues o (dev_lock held). */
static void op_queue(struct op *o)
{
	if (n_pend == cap_pend) {
		size_t cap = cap_pend ? 2 * cap_pend : 256;
		struct op **p = realloc(pend, cap * sizeof(*p));

		if (!p)
			fake_cuda_die("%s: no memory to queue an operation", o->what);
		pend = p;
		cap_pend = cap;
	}
	pend[n_pend++] = o;
	n_queued++;
	if (n_pend > most_pending)
		most_pending = n_pend;
}

/* Does o's work (dev_lock held, or the synchronous fake). */
static void op_run(struct op *o)
{
	struct range d, r;

	watch_check(o);
	switch (o->kind) {
	case OP_COPY:
		d = resolve(o->dst, o->n, o->what);
		r = resolve(o->src, o->n, o->what);
		if (d.kind == DEVICE && r.kind == DEVICE)
			tsan_hide(true);
		memcpy(d.view, r.view, o->n);
		if (d.kind == DEVICE && r.kind == DEVICE)
			tsan_hide(false);
		break;
	case OP_SET:
		d = resolve(o->dst, o->n, o->what);
		if (d.kind == DEVICE)
			tsan_hide(true);
		memset(d.view, o->value, o->n);
		if (d.kind == DEVICE)
			tsan_hide(false);
		break;
	case OP_WORK:
		o->fn(o->args);
		break;
	case OP_MARK:
		break;
	}
	o->done = true;
	watch_update(o);
}

/* Frees o once it has run and no event names it (dev_lock held). */
static void op_put(struct op *o)
{
	if (o && o->done && o->refs == 0)
		op_free(o);
}

/* Whether stream id is in need[0, n). */
static bool needed(size_t n, uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (need[i] == id)
			return true;
	return false;
}

/* Runs, in the order queued, the queued work that an operation on stream `on` queued at
   position `at` of pend depends on (dev_lock held); the operation at `at` too when self.
   Walking back from `at`, an operation is needed when its stream is one of the needed ones or
   the legacy/blocking rule ties it to one; each needed operation adds its own stream and
   rule. Then drops what ran from pend. */
static void run_deps(struct skey on, size_t at, bool self)
{
	bool legacy = on.cls == S_BLOCKING, blocking = on.cls == S_LEGACY;
	size_t n_need = 0, w = 0;

	if (cap_need < 1 + n_pend) {
		uint64_t *p = realloc(need, (1 + n_pend) * sizeof(*p));

		if (!p)
			fake_cuda_die("no memory to order %zu queued operations", n_pend);
		need = p;
		cap_need = 1 + n_pend;
	}
	need[n_need++] = on.id;
	if (self)
		pend[at]->take = true;
	for (size_t j = at; j-- > 0;) {
		struct op *o = pend[j];

		o->take = needed(n_need, o->on.id) || (o->on.cls == S_LEGACY && legacy) ||
			  (o->on.cls == S_BLOCKING && blocking);
		if (!o->take)
			continue;
		if (!needed(n_need, o->on.id))
			need[n_need++] = o->on.id;
		legacy |= o->on.cls == S_BLOCKING;
		blocking |= o->on.cls == S_LEGACY;
	}
	for (size_t j = 0; j < at + self; j++) /* all of pend stays valid while they run */
		if (pend[j]->take) {
			op_run(pend[j]);
			n_run_late++;
		}
	for (size_t j = 0; j < n_pend; j++) {
		struct op *o = pend[j];

		if (j < at + self && o->take) {
			o->take = false;
			op_put(o);
		} else {
			pend[w++] = o;
		}
	}
	n_pend = w;
}

/* Waits, as the next operation on stream s would, for what it depends on (asynchronous). */
static void async_wait_stream(cudaStream_t s)
{
	pthread_mutex_lock(&dev_lock);
	run_deps(key_of(s), n_pend, false);
	pthread_mutex_unlock(&dev_lock);
}

/* Runs everything queued (asynchronous). */
static void async_wait_all(void)
{
	pthread_mutex_lock(&dev_lock);
	for (size_t j = 0; j < n_pend; j++) {
		op_run(pend[j]);
		n_run_late++;
	}
	for (size_t j = 0; j < n_pend; j++)
		op_put(pend[j]);
	n_pend = 0;
	pthread_mutex_unlock(&dev_lock);
}

/* Queues o, or in the synchronous fake runs it now. */
static void submit(struct op *o)
{
	if (!async_on) {
		op_run(o);
		op_free(o);
		queued();
		return;
	}
	pthread_mutex_lock(&dev_lock);
	if (o->kind == OP_COPY) {
		watch(o, o->src, o->n, false);
		watch(o, o->dst, o->n, true);
	}
	op_queue(o);
	pthread_mutex_unlock(&dev_lock);
}

/* Runs o now, after the work its stream's next operation depends on: a call CUDA completes
   before it returns. */
static void submit_blocking(struct op *o)
{
	if (!async_on) {
		submit(o);
		return;
	}
	pthread_mutex_lock(&dev_lock);
	run_deps(o->on, n_pend, false);
	op_run(o);
	op_free(o);
	pthread_mutex_unlock(&dev_lock);
}

/* Waits for the whole device so far (fake_cuda_device_waits). */
static atomic_ulong n_device_waits;

uint64_t fake_cuda_device_waits(void)
{
	return atomic_load(&n_device_waits);
}

/* A wait for stream s (NULL: the legacy stream) or, with all, for the whole device. */
static void wait_for(cudaStream_t s, bool all)
{
	if (all)
		atomic_fetch_add(&n_device_waits, 1);
	if (!async_on)
		waited();
	else if (all)
		async_wait_all();
	else
		async_wait_stream(s);
}

/* NULL (the legacy stream) or a live stream. A destroyed handle is freed memory: ASan reports
   its use here, plain builds most likely see the cleared magic. */
static bool stream_ok(cudaStream_t s, const char *what)
{
	if (!s || s->magic == STREAM_MAGIC)
		return true;
	fake_cuda_warn("%s: stream %p is not live", what, (void *)s);
	return false;
}

static bool event_ok(cudaEvent_t e, const char *what)
{
	if (e && e->magic == EVENT_MAGIC)
		return true;
	fake_cuda_warn("%s: event %p is not live", what, (void *)e);
	return false;
}

int fake_cuda_launch(void *stream, const char *kernel, fake_cuda_work fn, const void *args,
		     size_t size, const struct fake_range *reads, size_t n_reads)
{
	struct op *o;

	if (!stream_ok(stream, kernel))
		return cudaErrorInvalidResourceHandle;
	o = op_new(key_of(stream), OP_WORK, kernel, size);
	o->fn = fn;
	memcpy(o->args, args, size);
	if (!async_on) {
		submit(o);
		return cudaSuccess;
	}
	pthread_mutex_lock(&dev_lock);
	for (size_t i = 0; i < n_reads; i++)
		watch(o, (const void *)(uintptr_t)reads[i].addr, reads[i].bytes, false);
	op_queue(o);
	pthread_mutex_unlock(&dev_lock);
	return cudaSuccess;
}

const void *fake_cuda_peek(uint64_t addr, size_t n)
{
	uintptr_t lo = (uintptr_t)addr, hi = lo + n;
	const void *v;
	struct alloc a;

	if (!n)
		return NULL;
	v = fake_cuda_kernel_view(addr, n, "fake_cuda_peek");
	if (!async_on)
		return v;
	pthread_mutex_lock(&dev_lock);
	for (size_t j = n_pend; j-- > 0;) {
		const struct op *o = pend[j];
		uintptr_t d = (uintptr_t)o->dst;

		if (o->kind == OP_WORK) { /* what it writes is not known */
			v = NULL;
			break;
		}
		if ((o->kind != OP_COPY && o->kind != OP_SET) || d >= hi || lo >= d + o->n)
			continue;
		v = NULL;
		if (o->kind == OP_COPY && d <= lo && hi <= d + o->n &&
		    table_find((uintptr_t)o->src, &a) == PINNED)
			v = (const char *)o->src + (lo - d);
		break;
	}
	pthread_mutex_unlock(&dev_lock);
	return v;
}

int fake_cuda_launch_begin(void *stream, const char *kernel)
{
	if (!stream_ok(stream, kernel))
		return cudaErrorInvalidResourceHandle;
	if (async_on)
		async_wait_stream(stream);
	return cudaSuccess;
}

void fake_cuda_launch_end(void *stream)
{
	(void)stream;
	queued();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
	struct CUstream_st *st;

	if (!s || flags & ~(unsigned int)cudaStreamNonBlocking)
		return cudaErrorInvalidValue;
	st = malloc(sizeof(*st));
	if (!st)
		return cudaErrorMemoryAllocation;
	*st = (struct CUstream_st){STREAM_MAGIC, flags, atomic_fetch_add(&next_stream_id, 1)};
	atomic_fetch_add(&live_streams, 1);
	*s = st;
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (!s || !stream_ok(s, "cudaStreamDestroy"))
		return cudaErrorInvalidResourceHandle;
	s->magic = 0;
	free(s);
	atomic_fetch_sub(&live_streams, 1);
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	if (!stream_ok(s, "cudaStreamSynchronize"))
		return cudaErrorInvalidResourceHandle;
	wait_for(s, false);
	return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
	struct CUevent_st *ev;

	if (!e || flags & ~(unsigned int)(cudaEventBlockingSync | cudaEventDisableTiming))
		return cudaErrorInvalidValue;
	ev = malloc(sizeof(*ev));
	if (!ev)
		return cudaErrorMemoryAllocation;
	ev->magic = EVENT_MAGIC;
	ev->flags = flags;
	ev->mark = NULL;
	atomic_init(&ev->recorded, 0);
	atomic_fetch_add(&live_events, 1);
	*e = ev;
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	if (!event_ok(e, "cudaEventDestroy"))
		return cudaErrorInvalidResourceHandle;
	if (e->mark) { /* its work goes on, as CUDA's does */
		pthread_mutex_lock(&dev_lock);
		e->mark->refs--;
		op_put(e->mark);
		pthread_mutex_unlock(&dev_lock);
	}
	e->magic = 0;
	free(e);
	atomic_fetch_sub(&live_events, 1);
	return cudaSuccess;
}

/* The event completes with the work queued on s so far, by any thread. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	struct op *o;

	if (!event_ok(e, "cudaEventRecord") || !stream_ok(s, "cudaEventRecord"))
		return cudaErrorInvalidResourceHandle;
	if (!async_on) {
		waited();
		atomic_store_explicit(&e->recorded, 1, memory_order_release);
		return cudaSuccess;
	}
	atomic_store_explicit(&e->recorded, 1, memory_order_relaxed); /* dev_lock orders the rest */
	/* a mark queued behind the stream's work: the event completes when the mark runs */
	o = op_new(key_of(s), OP_MARK, "cudaEventRecord", 0);
	o->refs = 1;
	pthread_mutex_lock(&dev_lock);
	op_queue(o);
	if (e->mark) {
		e->mark->refs--;
		op_put(e->mark);
	}
	e->mark = o;
	pthread_mutex_unlock(&dev_lock);
	return cudaSuccess;
}

/* A never recorded event counts as complete, as in CUDA. */
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	if (!event_ok(e, "cudaEventSynchronize"))
		return cudaErrorInvalidResourceHandle;
	(void)atomic_load_explicit(&e->recorded, memory_order_acquire);
	if (async_on) {
		pthread_mutex_lock(&dev_lock);
		for (size_t j = 0; e->mark && !e->mark->done && j < n_pend; j++)
			if (pend[j] == e->mark)
				run_deps(e->mark->on, j, true);
		pthread_mutex_unlock(&dev_lock);
	}
	return cudaSuccess;
}

/* Whether e has completed (asynchronous: its latest mark ran; dev_lock taken here). */
static bool event_done(cudaEvent_t e)
{
	bool done;

	if (!async_on)
		return true;
	pthread_mutex_lock(&dev_lock);
	done = e->mark && e->mark->done;
	pthread_mutex_unlock(&dev_lock);
	return done;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	static atomic_uint lcg = 1;
	unsigned int x, next;

	if (!ms)
		return cudaErrorInvalidValue;
	if (!event_ok(start, "cudaEventElapsedTime") || !event_ok(end, "cudaEventElapsedTime"))
		return cudaErrorInvalidResourceHandle;
	if ((start->flags | end->flags) & cudaEventDisableTiming ||
	    !atomic_load(&start->recorded) || !atomic_load(&end->recorded)) {
		fake_cuda_warn("cudaEventElapsedTime: an event without timing or never recorded");
		return cudaErrorInvalidResourceHandle;
	}
	if (!event_done(start) || !event_done(end)) {
		fake_cuda_warn(
			"cudaEventElapsedTime: an event not yet completed (cudaErrorNotReady "
			"on a GPU)");
		return cudaErrorNotReady;
	}
	x = atomic_load(&lcg);
	do
		next = x * 1103515245u + 12345u;
	while (!atomic_compare_exchange_weak(&lcg, &x, next));
	*ms = 0.05f + (float)((next >> 16) % 100) / 1000.0f;
	return cudaSuccess;
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

cudaError_t cudaMalloc(void **p, size_t n)
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
	tsan_hide(true);
	memset(shadow, POISON_DEVICE, reused ? a.span : n < POISON_MAX ? n : POISON_MAX);
	tsan_hide(false);
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

/* Frees device memory; like CUDA's, it waits for the device first. */
cudaError_t cudaFree(void *p)
{
	struct alloc a;
	int err;

	if (!p)
		return cudaSuccess;
	wait_for(NULL, true);
	err = table_take((uintptr_t)p, DEVICE, &a);
	if (err) {
		fake_cuda_warn("cudaFree(%p): %s", p,
			       err == -EINVAL ? "pinned host memory (cudaFreeHost frees it)"
					      : "not the start of a cudaMalloc allocation");
		return cudaErrorInvalidValue;
	}
	keep_map(DEVICE, a.span, (char *)a.base, a.shadow);
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
	struct alloc a;
	int err;

	if (!p)
		return cudaSuccess;
	wait_for(NULL, true);
	err = table_take((uintptr_t)p, PINNED, &a);
	if (err) {
		fake_cuda_warn("cudaFreeHost(%p): %s", p,
			       err == -EINVAL ? "device memory (cudaFree frees it)"
					      : "not the start of a cudaHostAlloc allocation");
		return cudaErrorInvalidValue;
	}
	keep_map(PINNED, a.span, p, NULL);
	return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags)
{
	struct alloc a;

	if (!d || flags != 0)
		return cudaErrorInvalidValue;
	if (table_find((uintptr_t)h, &a) != PINNED) {
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

	if (!stream_ok(s, what))
		return cudaErrorInvalidResourceHandle;
	if (n == 0)
		return cudaSuccess;
	if (!dst || !src) {
		fake_cuda_warn("%s: NULL pointer (dst %p, src %p)", what, dst, src);
		return cudaErrorInvalidValue;
	}
	d = resolve(dst, n, what);
	r = resolve(src, n, what);
	if (!kind_ok(kind, d, r, what))
		return cudaErrorInvalidValue;
	if ((uintptr_t)d.view - (uintptr_t)r.view < n || (uintptr_t)r.view - (uintptr_t)d.view < n)
		fake_cuda_die("%s: source %p and destination %p of %zu bytes overlap", what, src,
			      dst, n);
	o = op_new(key_of(s), OP_COPY, what, 0);
	o->dst = dst;
	o->src = src;
	o->n = n;
	/* Asynchronous with respect to the host only between device memory and device or pinned
	   memory (CUDA's "API synchronization behavior"): a pageable side is staged or waited
	   for, host to host is synchronous, and cudaMemcpy waits unless both sides are device. */
	if ((d.kind == DEVICE || r.kind == DEVICE) && d.kind != PAGEABLE && r.kind != PAGEABLE &&
	    !(blocking && (d.kind != DEVICE || r.kind != DEVICE)))
		submit(o);
	else
		submit_blocking(o);
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	if (!async_on)
		waited(); /* the legacy stream waits for the work queued before */
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
	if (!stream_ok(s, what))
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
			resolve(dsts[i], sizes[i], what);
			resolve(srcs[i], sizes[i], what);
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

	if (!stream_ok(s, what))
		return cudaErrorInvalidResourceHandle;
	if (n == 0)
		return cudaSuccess;
	r = resolve(p, n, what);
	if (r.kind == PAGEABLE) {
		fake_cuda_warn("%s(%p): not device-accessible memory", what, p);
		return cudaErrorInvalidValue;
	}
	o = op_new(key_of(s), OP_SET, what, 0);
	o->dst = p;
	o->n = n;
	o->value = value;
	if (r.kind == DEVICE)
		submit(o);
	else
		submit_blocking(o);
	return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
	if (!async_on)
		waited();
	return set(p, value, n, NULL, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
	return set(p, value, n, s, "cudaMemsetAsync");
}

/* ---- The device ---------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n)
{
	if (!n)
		return cudaErrorInvalidValue;
	*n = 1;
	return cudaSuccess;
}

/* One device, so the current device is always 0. */
cudaError_t cudaGetDevice(int *d)
{
	if (!d)
		return cudaErrorInvalidValue;
	*d = 0;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
	return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaDeviceSynchronize(void)
{
	wait_for(NULL, true);
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d)
{
	if (!v)
		return cudaErrorInvalidValue;
	if (d != 0)
		return cudaErrorInvalidDevice;
	switch (attr) {
	case cudaDevAttrUnifiedAddressing:
	case cudaDevAttrCanMapHostMemory:
		*v = 1;
		return cudaSuccess;
	case cudaDevAttrMultiProcessorCount:
		*v = 132;
		return cudaSuccess;
	default:
		fake_cuda_warn("cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
		return cudaErrorInvalidValue;
	}
}

/* A bus with no sysfs entry, in CUDA's upper-case hex: the backend then finds no NUMA node. */
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d)
{
	if (!bus || len <= 0)
		return cudaErrorInvalidValue;
	if (d != 0)
		return cudaErrorInvalidDevice;
	snprintf(bus, (size_t)len, "0000:FE:1F.7");
	return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int d)
{
	if (!prop)
		return cudaErrorInvalidValue;
	if (d != 0)
		return cudaErrorInvalidDevice;
	memset(prop, 0, sizeof(*prop));
	snprintf(prop->name, sizeof(prop->name), "CPU emulation (tests/cuda_emu)");
	prop->totalGlobalMem = (size_t)80 << 30;
	prop->major = 9;
	prop->multiProcessorCount = 132;
	prop->canMapHostMemory = 1;
	prop->unifiedAddressing = 1;
	return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
	if (!v)
		return cudaErrorInvalidValue;
	*v = CUDART_VERSION;
	return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
	if (!v)
		return cudaErrorInvalidValue;
	*v = CUDART_VERSION;
	return cudaSuccess;
}

/* The codes the fake returns, and those the backend's fault injection uses (cudaErrorUnknown,
   cudaErrorLaunchFailure). */
const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "cudaSuccess";
	case cudaErrorInvalidValue:
		return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation:
		return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidDevice:
		return "cudaErrorInvalidDevice";
	case cudaErrorInvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle";
	case cudaErrorUnknown:
		return "cudaErrorUnknown";
	case cudaErrorLaunchFailure:
		return "cudaErrorLaunchFailure";
	case cudaErrorNotReady:
		return "cudaErrorNotReady";
	default:
		return "unrecognized error code";
	}
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "no error";
	case cudaErrorInvalidValue:
		return "invalid argument";
	case cudaErrorMemoryAllocation:
		return "out of memory";
	case cudaErrorInvalidDevice:
		return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle";
	case cudaErrorUnknown:
		return "unknown error";
	case cudaErrorLaunchFailure:
		return "unspecified launch failure";
	case cudaErrorNotReady:
		return "device not ready";
	default:
		return "unrecognized error code";
	}
}

/* ---- The exit check ------------------------------------------------------------------------ */

__attribute__((destructor)) static void exit_check(void)
{
	unsigned long warnings = atomic_load(&n_warnings);
	long streams = atomic_load(&live_streams), events = atomic_load(&live_events);
	size_t n;

	pthread_mutex_lock(&table_lock);
	n = n_table;
	for (size_t i = 0; i < n_table; i++)
		fprintf(stderr, "cuda-emu: leak: %s allocation %p + %zu bytes\n",
			kind_name(table[i].kind), (void *)table[i].base, table[i].size);
	pthread_mutex_unlock(&table_lock);
	fprintf(stderr,
		"cuda-emu: at exit: %zu allocations, %ld streams, %ld events live; %lu warnings\n",
		n, streams, events, warnings);
	if (async_on) {
		pthread_mutex_lock(&dev_lock);
		fprintf(stderr,
			"cuda-emu: asynchronous: %lu operations queued, %lu run by a later wait, "
			"at most %lu pending, %zu never needed\n",
			n_queued, n_run_late, most_pending, n_pend);
		pthread_mutex_unlock(&dev_lock);
	}
	if (n == 0 && streams == 0 && events == 0 && warnings == 0)
		return;
	fputs("cuda-emu: failing the process (exit status 1) for the leaks or warnings above\n",
	      stderr);
	fflush(NULL);
	_exit(1);
}
