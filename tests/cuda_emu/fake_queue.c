/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA runtime's streams, events and kernel launches, and the asynchronous fake that
 * queues their work (the whole fake: fake_cudart.c).
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
 * cudaEventElapsedTime answers a fixed pseudo-random sequence (0.05 to 0.149 ms): the backend's
 * start-up calibration then picks the fused kernel for some piece sizes and DMA for others, so
 * both gather paths run, the same way on every run.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "fake_cudart.h"
#include "fake_internal.h"

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x4556544eu

/* ---- Streams and events -------------------------------------------------------------------- */

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

atomic_long fake_live_streams, fake_live_events;
static atomic_ulong next_stream_id = 1; /* 0 is the legacy stream */

/* ---- The asynchronous fake ------------------------------------------------------------------ */

bool fake_async_on; /* FAKE_CUDA_ASYNC, read once before the first call */

__attribute__((constructor)) static void async_init(void)
{
	const char *e = getenv("FAKE_CUDA_ASYNC");

	fake_async_on = e && *e && strcmp(e, "0") != 0;
}

/* How stream s (NULL: the legacy stream) orders with the others. */
struct skey fake_key_of(cudaStream_t s)
{
	if (!s)
		return (struct skey){0, S_LEGACY};
	return (struct skey){s->id, s->flags & cudaStreamNonBlocking ? S_NONBLOCKING : S_BLOCKING};
}

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
/* fake_cuda_work_seconds and fake_cuda_copy_seconds: what each thread ran */
static _Thread_local uint64_t work_ns, copy_ns;
static struct op **pend; /* queued, not yet run, in the order queued (dev_lock) */
static size_t n_pend, cap_pend;
static uint64_t *need; /* run_deps' streams (dev_lock) */
static size_t cap_need;
static unsigned long n_queued, n_run_late, most_pending;

struct op *fake_op_new(struct skey on, enum op_kind kind, const char *what, size_t args)
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

/* A checksum of [lo, hi): any change of a few bytes changes it. Built with clang, its loop is
   left out of the fuzzer's and ASan's instrumentation: it reads every watched pinned buffer
   (whose bounds watch checked against the allocation) at every queue and run, where those
   hooks took most of a fuzzing input's time and told nothing of the library. */
#if defined(__clang__)
#define UNINSTRUMENTED __attribute__((no_sanitize("coverage", "address")))
#else
#define UNINSTRUMENTED
#endif
static UNINSTRUMENTED uint64_t checksum(uintptr_t lo, uintptr_t hi)
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

	if (!n || fake_table_find(lo, &a) != PINNED || n > a.size || lo - a.base > a.size - n)
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

/* Adds the time since t0 to *ns. */
static void add_since(uint64_t *ns, const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	*ns += (uint64_t)((t1.tv_sec - t0->tv_sec) * 1000000000LL + (t1.tv_nsec - t0->tv_nsec));
}

/* Does o's work (dev_lock held, or the synchronous fake). */
static void op_run(struct op *o)
{
	struct range d, r;
	struct timespec t0;
	bool engine;

	watch_check(o);
	switch (o->kind) {
	case OP_COPY:
		d = fake_resolve(o->dst, o->n, o->what);
		r = fake_resolve(o->src, o->n, o->what);
		if (o->queued_dev && (d.kind == PAGEABLE || r.kind == PAGEABLE))
			fake_cuda_die("%s: %p <- %p, %zu bytes: memory freed before it ran",
				      o->what, o->dst, o->src, o->n);
		if (d.kind == DEVICE && r.kind == DEVICE)
			fake_tsan_hide(true);
		engine = (d.kind == DEVICE && r.kind == PINNED) ||
			 (d.kind == PINNED && r.kind == DEVICE);
		if (engine)
			clock_gettime(CLOCK_MONOTONIC, &t0);
		memcpy(d.view, r.view, o->n);
		if (engine)
			add_since(&copy_ns, &t0);
		if (d.kind == DEVICE && r.kind == DEVICE)
			fake_tsan_hide(false);
		break;
	case OP_SET:
		d = fake_resolve(o->dst, o->n, o->what);
		if (d.kind == PAGEABLE) /* device-accessible when queued: freed since */
			fake_cuda_die("%s: %p + %zu bytes were freed before it ran", o->what,
				      o->dst, o->n);
		if (d.kind == DEVICE)
			fake_tsan_hide(true);
		memset(d.view, o->value, o->n);
		if (d.kind == DEVICE)
			fake_tsan_hide(false);
		break;
	case OP_WORK:
		clock_gettime(CLOCK_MONOTONIC, &t0);
		o->fn(o->args);
		add_since(&work_ns, &t0);
		break;
	case OP_MARK:
		break;
	case OP_FREE:
		fake_free_device_now(o->dst, o->what);
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
	run_deps(fake_key_of(s), n_pend, false);
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
void fake_submit(struct op *o)
{
	if (!fake_async_on) {
		op_run(o);
		op_free(o);
		fake_queued();
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
void fake_submit_blocking(struct op *o)
{
	if (!fake_async_on) {
		fake_submit(o);
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

/* Waits of any kind (stream, event, device) made by each thread (fake_cuda_thread_waits). */
static _Thread_local uint64_t n_thread_waits;

uint64_t fake_cuda_thread_waits(void)
{
	return n_thread_waits;
}

/* A wait for stream s (NULL: the legacy stream) or, with all, for the whole device. */
void fake_wait_for(cudaStream_t s, bool all)
{
	n_thread_waits++;
	if (all)
		atomic_fetch_add(&n_device_waits, 1);
	if (!fake_async_on)
		fake_waited();
	else if (all)
		async_wait_all();
	else
		async_wait_stream(s);
}

/* NULL (the legacy stream) or a live stream. A destroyed handle is freed memory: ASan reports
   its use here, plain builds most likely see the cleared magic. */
bool fake_stream_ok(cudaStream_t s, const char *what)
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

	if (!fake_stream_ok(stream, kernel))
		return cudaErrorInvalidResourceHandle;
	o = fake_op_new(fake_key_of(stream), OP_WORK, kernel, size);
	o->fn = fn;
	memcpy(o->args, args, size);
	if (!fake_async_on) {
		fake_submit(o);
		return cudaSuccess;
	}
	pthread_mutex_lock(&dev_lock);
	for (size_t i = 0; i < n_reads; i++)
		watch(o, (const void *)(uintptr_t)reads[i].addr, reads[i].bytes, false);
	op_queue(o);
	pthread_mutex_unlock(&dev_lock);
	return cudaSuccess;
}

bool fake_cuda_async(void)
{
	return fake_async_on; /* set by a constructor */
}

double fake_cuda_work_seconds(void)
{
	return 1e-9 * (double)work_ns;
}

double fake_cuda_copy_seconds(void)
{
	return 1e-9 * (double)copy_ns;
}

const void *fake_cuda_peek(uint64_t addr, size_t n)
{
	uintptr_t lo = (uintptr_t)addr, hi = lo + n;
	const void *v;
	struct alloc a;

	if (!n)
		return NULL;
	v = fake_cuda_kernel_view(addr, n, "fake_cuda_peek");
	if (!fake_async_on)
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
		    fake_table_find((uintptr_t)o->src, &a) == PINNED)
			v = (const char *)o->src + (lo - d);
		break;
	}
	pthread_mutex_unlock(&dev_lock);
	return v;
}

int fake_cuda_launch_begin(void *stream, const char *kernel)
{
	if (!fake_stream_ok(stream, kernel))
		return cudaErrorInvalidResourceHandle;
	if (fake_async_on)
		async_wait_stream(stream);
	return cudaSuccess;
}

void fake_cuda_launch_end(void *stream)
{
	(void)stream;
	fake_queued();
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
	atomic_fetch_add(&fake_live_streams, 1);
	*s = st;
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (!s || !fake_stream_ok(s, "cudaStreamDestroy"))
		return cudaErrorInvalidResourceHandle;
	s->magic = 0;
	free(s);
	atomic_fetch_sub(&fake_live_streams, 1);
	return cudaSuccess;
}

/* A stream's id, unique for the process's life (the legacy stream's is 0): a stream made after
   another was destroyed may get its handle, never its id. */
cudaError_t cudaStreamGetId(cudaStream_t s, unsigned long long *id)
{
	if (!id)
		return cudaErrorInvalidValue;
	if (!fake_stream_ok(s, "cudaStreamGetId"))
		return cudaErrorInvalidResourceHandle;
	*id = s ? s->id : 0;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	if (!fake_stream_ok(s, "cudaStreamSynchronize"))
		return cudaErrorInvalidResourceHandle;
	fake_wait_for(s, false);
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
	atomic_fetch_add(&fake_live_events, 1);
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
	atomic_fetch_sub(&fake_live_events, 1);
	return cudaSuccess;
}

/* The event completes with the work queued on s so far, by any thread. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	struct op *o;

	if (!event_ok(e, "cudaEventRecord") || !fake_stream_ok(s, "cudaEventRecord"))
		return cudaErrorInvalidResourceHandle;
	if (!fake_async_on) {
		fake_waited();
		atomic_store_explicit(&e->recorded, 1, memory_order_release);
		return cudaSuccess;
	}
	atomic_store_explicit(&e->recorded, 1, memory_order_relaxed); /* dev_lock orders the rest */
	/* a mark queued behind the stream's work: the event completes when the mark runs */
	o = fake_op_new(fake_key_of(s), OP_MARK, "cudaEventRecord", 0);
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
/* Runs what event e waits for (asynchronous), and makes it visible to the caller. */
static void event_run(cudaEvent_t e)
{
	(void)atomic_load_explicit(&e->recorded, memory_order_acquire);
	if (fake_async_on) {
		pthread_mutex_lock(&dev_lock);
		for (size_t j = 0; e->mark && !e->mark->done && j < n_pend; j++)
			if (pend[j] == e->mark)
				run_deps(e->mark->on, j, true);
		pthread_mutex_unlock(&dev_lock);
	} else {
		fake_waited();
	}
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	if (!event_ok(e, "cudaEventSynchronize"))
		return cudaErrorInvalidResourceHandle;
	n_thread_waits++;
	event_run(e);
	return cudaSuccess;
}

/* Asynchronous: the event's latest mark is done, or queued work depends on nothing else. The
   fake answers "not ready" until a wait runs the mark (work runs only when waited for). */
cudaError_t cudaEventQuery(cudaEvent_t e)
{
	bool done = true;

	if (!event_ok(e, "cudaEventQuery"))
		return cudaErrorInvalidResourceHandle;
	(void)atomic_load_explicit(&e->recorded, memory_order_acquire);
	if (fake_async_on) {
		pthread_mutex_lock(&dev_lock);
		done = !e->mark || e->mark->done;
		pthread_mutex_unlock(&dev_lock);
	}
	return done ? cudaSuccess : cudaErrorNotReady;
}

/* Later work on s waits for e. The fake runs what e waits for now (no host wait is counted):
   earlier than a GPU would, which keeps the order and hides no missing wait of the host. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
	if (!event_ok(e, "cudaStreamWaitEvent") || !fake_stream_ok(s, "cudaStreamWaitEvent"))
		return cudaErrorInvalidResourceHandle;
	if (flags)
		fake_cuda_warn("cudaStreamWaitEvent: flags %#x (the fake knows none)", flags);
	event_run(e);
	return cudaSuccess;
}

/* Whether e has completed (asynchronous: its latest mark ran; dev_lock taken here). */
static bool event_done(cudaEvent_t e)
{
	bool done;

	if (!fake_async_on)
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

/* The asynchronous fake's counts at exit, if it is on (the exit check, fake_cudart.c). */
void fake_async_report(void)
{
	if (!fake_async_on)
		return;
	pthread_mutex_lock(&dev_lock);
	fprintf(stderr,
		"cuda-emu: asynchronous: %lu operations queued, %lu run by a later wait, "
		"at most %lu pending, %zu never needed\n",
		n_queued, n_run_late, most_pending, n_pend);
	pthread_mutex_unlock(&dev_lock);
}
