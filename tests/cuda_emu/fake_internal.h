/* SPDX-License-Identifier: MIT */
/*
 * What the files of the fake CUDA runtime share, and nothing else includes: fake_cudart.c
 * (reporting, ordering, the device, the exit check), fake_memory.c (the allocation table,
 * unordered writes, memory) and fake_queue.c (streams, events, the asynchronous fake). Each
 * function is described where it is defined. Every name declared here is hidden (FAKE_HIDDEN):
 * the library exports the runtime API and fake_cudart.h, nothing more.
 */
#ifndef KVT_FAKE_INTERNAL_H
#define KVT_FAKE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "fake_cudart.h"

#define FAKE_HIDDEN __attribute__((visibility("hidden")))

#define PAGE 4096
#define POISON_DEVICE 0xcd
#define POISON_PINNED 0xab
#define POISON_PENDING 0xef /* asynchronous: pinned memory a queued operation will write */
#define POISON_FREED 0xdd   /* pinned memory freed and kept for reuse (keep_map) */
#define POISON_MAX ((size_t)64 << 20) /* bytes poisoned per allocation; the rest reads 0 */
#define ULL(x) ((unsigned long long)(x))

/* ---- Ordering (fake_cudart.c) -------------------------------------------------------------- */

FAKE_HIDDEN void fake_queued(void);
FAKE_HIDDEN void fake_waited(void);
FAKE_HIDDEN void fake_tsan_hide(bool on);

/* ---- The allocation table (fake_memory.c) -------------------------------------------------- */

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

/* A range [p, p + n) that one call touches: its kind and its host view. */
struct range {
	enum kind kind;
	char *view;
};

FAKE_HIDDEN enum kind fake_table_find(uintptr_t p, struct alloc *out);
FAKE_HIDDEN struct range fake_resolve(const void *p, size_t n, const char *what);
FAKE_HIDDEN size_t fake_list_leaks(void);
FAKE_HIDDEN void fake_free_device_now(void *p, const char *what);

/* ---- Streams and the asynchronous fake (fake_queue.c) -------------------------------------- */

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

enum op_kind { OP_COPY, OP_SET, OP_WORK, OP_MARK, OP_FREE };

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
	bool queued_dev;   /* OP_COPY: both sides device-accessible when queued */
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

extern FAKE_HIDDEN bool fake_async_on;
extern FAKE_HIDDEN atomic_long fake_live_streams, fake_live_events;

FAKE_HIDDEN struct skey fake_key_of(cudaStream_t s);
FAKE_HIDDEN struct op *fake_op_new(struct skey on, enum op_kind kind, const char *what,
				   size_t args);
FAKE_HIDDEN void fake_submit(struct op *o);
FAKE_HIDDEN void fake_submit_blocking(struct op *o);
FAKE_HIDDEN void fake_wait_for(cudaStream_t s, bool all);
FAKE_HIDDEN bool fake_stream_ok(cudaStream_t s, const char *what);
FAKE_HIDDEN void fake_async_report(void);

#endif /* KVT_FAKE_INTERNAL_H */
