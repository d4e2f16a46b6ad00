/* SPDX-License-Identifier: MIT */
/*
 * transfer: the save pool driven directly (failing copies and waits, destroy, tickets).
 */
#include "test_transfer.h"

/* ---- savepool directly ------------------------------------------------------------------ */

static void *plain_alloc(void *actx, size_t bytes)
{
	(void)actx;
	return malloc(bytes);
}

static void plain_free(void *actx, void *p, size_t bytes)
{
	(void)actx;
	(void)bytes;
	free(p);
}

static const struct kvt_savepool_alloc plain = {plain_alloc, plain_free, NULL};

/* Stage copy over the concatenated sources, failing when cctx says so. */
struct copy_ctx {
	int fail_err;	    /* returned by every call once calls >= fail_from */
	uint32_t fail_from; /* index of the first failing call */
	uint32_t calls;
};

static int test_copy(void *cctx, int buf, void *stage, const struct kvt_save_src *src,
		     uint32_t n_src, uint64_t off, uint64_t len)
{
	struct copy_ctx *c = cctx;
	uint64_t base = 0;
	uint8_t *out = stage;

	(void)buf;
	if (c && c->fail_err && c->calls++ >= c->fail_from)
		return c->fail_err;
	for (uint32_t i = 0; i < n_src && len; i++) {
		uint64_t end = base + src[i].bytes;

		if (off < end) {
			uint64_t n = end - off < len ? end - off : len;

			memcpy(out, (const uint8_t *)(uintptr_t)src[i].addr + (off - base), n);
			out += n;
			off += n;
			len -= n;
		}
		base = end;
	}
	return 0;
}

void test_savepool_create_validation(void **state)
{
	struct kvt_savepool *sp = (struct kvt_savepool *)(uintptr_t)0x99;

	(void)state;
	assert_int_equal(kvt_savepool_create(65, 4096, &plain, test_copy, NULL, NULL, &sp),
			 -EINVAL);
	assert_int_equal(kvt_savepool_create(UINT32_MAX, 4096, &plain, test_copy, NULL, NULL, &sp),
			 -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4095, &plain, test_copy, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 0, &plain, test_copy, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4096, NULL, test_copy, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4096, &plain, NULL, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4096, &plain, test_copy, NULL, NULL, NULL),
			 -EINVAL);
	assert_ptr_equal(sp, (struct kvt_savepool *)(uintptr_t)0x99);
	/* The limits are accepted; last_ticket starts at 0; the threads block every signal. */
	assert_int_equal(kvt_savepool_create(64, 4096, &plain, test_copy, NULL, NULL, &sp), 0);
	assert_int_equal(kvt_savepool_last_ticket(sp), 0);
	{
		uint32_t n;

		assert_true(t_kvt_threads_block_signals(&n));
		assert_int_equal(n, 64);
	}
	kvt_savepool_destroy(sp);
	assert_int_equal(kvt_savepool_create(0, 4096, &plain, test_copy, NULL, NULL, &sp), 0);
	kvt_savepool_destroy(sp);
	kvt_savepool_destroy(NULL);
}

static uint32_t scatter_calls;

static void counting_scatter(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
			     uint64_t c0, uint64_t c1, const void *ctx)
{
	__atomic_add_fetch(&scatter_calls, 1, __ATOMIC_RELAXED);
	kvt_scatter_xfer(items, i0, i1, stage, c0, c1, ctx);
}

void test_savepool_copy_fails(void **state)
{
	(void)state;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct copy_ctx cc = {.fail_err = -EIO, .fail_from = 0};
		struct kvt_savepool *sp;
		uint8_t s[10000], d[10000];
		struct kvt_save_src src = {a64(s), sizeof(s)};
		struct kvt_xfer x = {.src = 0, .dst = a64(d), .bytes = sizeof(s), .reps = 1};
		struct kvt_save_job job = {&src, 1, &x, 1, sizeof(x), counting_scatter, NULL, 0};
		uint64_t ticket = 4242;

		fill_random(s, sizeof(s));
		memset(d, 0, sizeof(d));
		assert_int_equal(kvt_savepool_create(thread_counts[t], 4096, &plain, test_copy,
						     NULL, &cc, &sp),
				 0);
		scatter_calls = 0;
		/* First chunk's copy fails: the error comes back, nothing is scattered. */
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EIO);
		kvt_savepool_wait(sp, UINT64_MAX);
		assert_int_equal(__atomic_load_n(&scatter_calls, __ATOMIC_RELAXED), 0);
		for (size_t i = 0; i < sizeof(d); i++)
			assert_int_equal(d[i], 0);
		/* A different error code is passed through as is. */
		cc.fail_err = -ENOMEM;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -ENOMEM);
		/* The second chunk's copy fails: the error still comes back, waiting does not
		   hang on the abandoned job, and the pool keeps working. */
		cc.fail_err = -EIO;
		cc.calls = 0;
		cc.fail_from = 1;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EIO);
		kvt_savepool_wait(sp, UINT64_MAX);
		/* The pool still works afterwards. */
		cc.fail_err = 0;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), 0);
		kvt_savepool_wait(sp, ticket);
		assert_memory_equal(d, s, sizeof(s));
		assert_int_equal(kvt_savepool_last_ticket(sp), ticket);
		kvt_savepool_destroy(sp);
	}
}

/* A stage copy that notes which job's sources each buffer holds, and a wait that fails for
   the chunks of one job (`doomed`), as an asynchronous copy that did not land would. */
struct tag_ctx {
	uint64_t held[2]; /* src[0].addr of the chunk in each buffer */
	uint64_t doomed;
	int fail_err;
	uint32_t waits, failed; /* atomic */
};

static int tag_copy(void *cctx, int buf, void *stage, const struct kvt_save_src *src,
		    uint32_t n_src, uint64_t off, uint64_t len)
{
	struct tag_ctx *c = cctx;

	c->held[buf] = src[0].addr;
	return test_copy(NULL, buf, stage, src, n_src, off, len);
}

static int tag_wait(void *cctx, int buf)
{
	struct tag_ctx *c = cctx;

	__atomic_add_fetch(&c->waits, 1, __ATOMIC_RELAXED);
	if (c->held[buf] != c->doomed)
		return 0;
	__atomic_add_fetch(&c->failed, 1, __ATOMIC_RELAXED);
	return c->fail_err;
}

enum { TAG_JOBS = 4, TAG_JOB = 6000 /* two chunks of a 4 KiB staging buffer */ };

/* A chunk whose wait fails is not scattered, and the waits that cover its job fail with the
   wait's error, those before it do not; the jobs after it are scattered as usual. */
void test_savepool_wait_fails(void **state)
{
	(void)state;
	rng_state = 0x5eed5a1e0f0f0f0full;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct tag_ctx tc = {.fail_err = -ENODEV};
		struct kvt_savepool *sp;
		uint8_t *s = malloc((size_t)TAG_JOBS * TAG_JOB), *d = calloc(TAG_JOBS, TAG_JOB);
		struct kvt_save_src src[TAG_JOBS];
		struct kvt_xfer x[TAG_JOBS];
		uint64_t tk[TAG_JOBS];

		assert_non_null(s);
		assert_non_null(d);
		fill_random(s, (size_t)TAG_JOBS * TAG_JOB);
		tc.doomed = a64(s + TAG_JOB); /* job 1 */
		assert_int_equal(kvt_savepool_create(thread_counts[t], 4096, &plain, tag_copy,
						     tag_wait, &tc, &sp),
				 0);
		for (int j = 0; j < TAG_JOBS - 1; j++) {
			src[j] = (struct kvt_save_src){a64(s + (size_t)j * TAG_JOB), TAG_JOB};
			x[j] = (struct kvt_xfer){.src = 0,
						 .dst = a64(d + (size_t)j * TAG_JOB),
						 .bytes = TAG_JOB,
						 .reps = 1};
			assert_int_equal(kvt_savepool_submit_xfer(sp, &src[j], 1, &x[j], 1, &tk[j]),
					 0);
		}
		assert_int_equal(kvt_savepool_wait(sp, tk[0]), 0);
		CHECK_BYTES(d, s, TAG_JOB, "job 0, before the lost one");
		assert_int_equal(kvt_savepool_wait(sp, tk[1]), -ENODEV);
		for (size_t i = 0; i < TAG_JOB; i++)
			if (d[TAG_JOB + i])
				fail_msg("threads %u: the lost job's byte %zu was scattered",
					 thread_counts[t], i);
		assert_int_equal(kvt_savepool_wait(sp, tk[2]), -ENODEV);
		CHECK_BYTES(d + 2 * TAG_JOB, s + 2 * TAG_JOB, TAG_JOB, "job 2, after the lost one");
		assert_int_equal(kvt_savepool_wait(sp, tk[0]), 0);		    /* still */
		assert_int_equal(__atomic_load_n(&tc.failed, __ATOMIC_RELAXED), 2); /* 2 chunks */
		assert_int_equal(__atomic_load_n(&tc.waits, __ATOMIC_RELAXED), 6);
		/* a later job lands; waits that cover the lost one keep failing */
		src[3] = (struct kvt_save_src){a64(s + 3 * TAG_JOB), TAG_JOB};
		x[3] = (struct kvt_xfer){
			.src = 0, .dst = a64(d + 3 * TAG_JOB), .bytes = TAG_JOB, .reps = 1};
		assert_int_equal(kvt_savepool_submit_xfer(sp, &src[3], 1, &x[3], 1, &tk[3]), 0);
		assert_int_equal(kvt_savepool_wait(sp, UINT64_MAX), -ENODEV);
		CHECK_BYTES(d + 3 * TAG_JOB, s + 3 * TAG_JOB, TAG_JOB, "job 3");
		kvt_savepool_destroy(sp);
		free(s);
		free(d);
	}
}

/* A scatter that sleeps before it copies, then counts itself done. The job's ctx is a struct
   slow_ctx. Jobs are 128 KiB, as two 64 KiB items, and the staging buffers as large, so the
   pool hands them to its threads (small chunks may be scattered by the caller itself). */
struct slow_ctx {
	int *done;
	unsigned sleep_ms;
};

enum { SLOW_JOB = 128 << 10 };

static void slow_scatter(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
			 uint64_t c0, uint64_t c1, const void *ctx)
{
	struct slow_ctx sc;

	memcpy(&sc, ctx, sizeof(sc));
	usleep(sc.sleep_ms * 1000u);
	kvt_scatter_xfer(items, i0, i1, stage, c0, c1, NULL);
	__atomic_add_fetch(sc.done, 1, __ATOMIC_RELEASE);
}

struct slow_job {
	uint8_t *dst;
	struct kvt_xfer x[2];
	struct slow_ctx ctx;
	struct kvt_save_job job;
	int done;
};

/* src: SLOW_JOB bytes. dst gets them in two halves, swapped. */
static void slow_job_init(struct slow_job *j, const struct kvt_save_src *src, unsigned sleep_ms)
{
	const uint32_t half = SLOW_JOB / 2;

	j->dst = calloc(1, SLOW_JOB);
	assert_non_null(j->dst);
	j->x[0] = (struct kvt_xfer){.src = 0, .dst = a64(j->dst + half), .bytes = half, .reps = 1};
	j->x[1] = (struct kvt_xfer){.src = half, .dst = a64(j->dst), .bytes = half, .reps = 1};
	j->done = 0;
	j->ctx = (struct slow_ctx){&j->done, sleep_ms};
	j->job = (struct kvt_save_job){src,	     1,	      j->x,	     2, sizeof(j->x[0]),
				       slow_scatter, &j->ctx, sizeof(j->ctx)};
}

/* The job's destination holds its source, all of it. */
static void slow_job_check(struct slow_job *j, const uint8_t *src, const char *file, int line)
{
	const uint32_t half = SLOW_JOB / 2;

	_assert_true(__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) >= 1, "scatter ran", file, line);
	check_bytes(j->dst + half, src, half, "slow job, first half", file, line);
	check_bytes(j->dst, src + half, half, "slow job, second half", file, line);
}
#define SLOW_JOB_CHECK(j, src) slow_job_check((j), (src), __FILE__, __LINE__)

/* destroy lands every job: the one being scattered and the one still queued behind it. */
void test_savepool_destroy_waits(void **state)
{
	(void)state;
	rng_state = 0x7777888899990000ull;
	for (uint32_t threads = 1; threads <= 2; threads++) {
		struct kvt_savepool *sp;
		uint8_t *s = calloc(1, SLOW_JOB);
		struct kvt_save_src src = {a64(s), SLOW_JOB};
		struct slow_job j1, j2;
		uint64_t t1, t2;

		assert_non_null(s);
		fill_random(s, SLOW_JOB);
		slow_job_init(&j1, &src, 150);
		slow_job_init(&j2, &src, 150);
		assert_int_equal(
			kvt_savepool_create(threads, SLOW_JOB, &plain, test_copy, NULL, NULL, &sp),
			0);
		assert_int_equal(kvt_savepool_submit(sp, &j1.job, &t1), 0);
		assert_int_equal(kvt_savepool_submit(sp, &j2.job, &t2), 0);
		assert_int_equal(t1, 1);
		assert_int_equal(t2, 2);
		/* The contexts were copied at submit: changing ours must not matter. */
		j1.ctx.sleep_ms = j2.ctx.sleep_ms = 100000;
		kvt_savepool_destroy(sp);
		SLOW_JOB_CHECK(&j1, s);
		SLOW_JOB_CHECK(&j2, s);
		free(j1.dst);
		free(j2.dst);
		free(s);
	}
}

/* wait(t) covers job t and every earlier one, including one still being scattered when the
   wait starts; a submit that needs a busy staging buffer waits for the job in it. Job 2 is
   much slower than jobs 1 and 3, so a wait that returned early would find it incomplete. */
void test_savepool_wait_ticket(void **state)
{
	struct kvt_savepool *sp;
	uint8_t *s = calloc(1, SLOW_JOB);
	struct kvt_save_src src = {a64(s), SLOW_JOB};
	struct slow_job j1, j2, j3;
	uint64_t t1, t2, t3;

	(void)state;
	assert_non_null(s);
	rng_state = 0x1357924680acebdfull;
	fill_random(s, SLOW_JOB);
	slow_job_init(&j1, &src, 20);
	slow_job_init(&j2, &src, 400);
	slow_job_init(&j3, &src, 200);
	assert_int_equal(kvt_savepool_create(2, SLOW_JOB, &plain, test_copy, NULL, NULL, &sp), 0);
	assert_int_equal(kvt_savepool_submit(sp, &j1.job, &t1), 0);
	assert_int_equal(kvt_savepool_submit(sp, &j2.job, &t2), 0);
	/* Third job reuses job 1's buffer: its submit returns once job 1 is scattered. */
	assert_int_equal(kvt_savepool_submit(sp, &j3.job, &t3), 0);
	assert_int_equal(t2, t1 + 1);
	assert_int_equal(t3, t2 + 1);
	assert_int_equal(kvt_savepool_last_ticket(sp), t3);
	SLOW_JOB_CHECK(&j1, s);
	kvt_savepool_wait(sp, t2);
	SLOW_JOB_CHECK(&j2, s);
	kvt_savepool_wait(sp, UINT64_MAX);
	SLOW_JOB_CHECK(&j3, s);
	kvt_savepool_destroy(sp);
	free(j1.dst);
	free(j2.dst);
	free(j3.dst);
	free(s);
}

void test_savepool_zero_and_invalid_jobs(void **state)
{
	(void)state;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct kvt_savepool *sp;
		uint8_t s[16];
		struct kvt_save_src src = {a64(s), 0};
		struct kvt_xfer x = {.src = 0, .dst = a64(s), .bytes = 0, .reps = 1};
		struct kvt_save_job job = {&src, 1, &x, 1, sizeof(x), kvt_scatter_xfer, NULL, 0};
		uint8_t big_ctx[KVT_SAVE_CTX_MAX + 1] = {0};
		uint64_t ticket = 0, before;

		assert_int_equal(kvt_savepool_create(thread_counts[t], 4096, &plain, test_copy,
						     NULL, NULL, &sp),
				 0);
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), 0);
		assert_int_equal(ticket, 1);
		job.n_src = 0;
		job.n_items = 0;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), 0);
		assert_int_equal(ticket, 2);
		kvt_savepool_wait(sp, ticket);
		/* Invalid jobs: -EINVAL and no ticket taken. */
		before = kvt_savepool_last_ticket(sp);
		job.ctx = big_ctx;
		job.ctx_size = sizeof(big_ctx);
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EINVAL);
		job.ctx_size = 0;
		job.scatter = NULL;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EINVAL);
		job.scatter = kvt_scatter_xfer;
		job.items = NULL;
		job.n_items = 1;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EINVAL);
		assert_int_equal(kvt_savepool_last_ticket(sp), before);
		kvt_savepool_destroy(sp);
	}
}
