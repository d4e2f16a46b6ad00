/* SPDX-License-Identifier: MIT */
/*
 * model: the payload-free backend that times every transfer with a bandwidth + per-call model
 * (transfer/model.c). Every expected time here is computed by hand from the model's definition
 * with integer arithmetic (bandwidths are whole GB/s, i.e. whole bytes per ns, so a time is
 * fixed + bytes / gbps rounded to the nearest ns, halves up), never by calling the library's
 * formula: the copy lists the manager builds (prefill gather and save, decode append, recall
 * loads, resume gather) must cost exactly what their geometry says. The scale case runs a
 * Llama-3-8B replay-sized workload with no payload memory at all.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "base.h"
#include "manager.h"

/* ---- helpers ---------------------------------------------------------------------------- */

#define CHECK_U64(got, want, what)                                                         \
	do {                                                                               \
		uint64_t g_ = (got), w_ = (want);                                          \
		if (g_ != w_)                                                              \
			fail_at(__FILE__, __LINE__, "%s: got %llu, expected %llu", (what), \
				(unsigned long long)g_, (unsigned long long)w_);           \
	} while (0)

/* The model's rule in integers: fixed + bytes / gbps ns for a whole gbps (bytes per ns),
   rounded to the nearest ns, halves up. */
static uint64_t want_ns(uint64_t fixed, uint64_t bytes, uint64_t gbps)
{
	return fixed + (2 * bytes + gbps) / (2 * gbps);
}

/* Figures of the manager-level tests: every bandwidth a whole number, and the fused gather's
   rate h2d * eff = 8 * 0.75 = 6 exactly representable. */
#define T_H2D 8
#define T_D2H 3
#define T_D2D 7
#define T_EFF 0.75
#define T_FUSED_RATE 6
#define T_CALL 2000
#define T_LAUNCH 5000

/* t_small_config (2 layers, 2 kv heads, d=16 f16 so 32-byte rows, 8-token blocks, sink 8,
   recent 16, top-K 16, obs 4) on the model backend with the figures above. */
static struct kvt_config model_config(uint32_t fused)
{
	struct kvt_config c = t_small_config();

	c.backend = KVT_BACKEND_MODEL;
	c.model_h2d_gbps = T_H2D;
	c.model_d2h_gbps = T_D2H;
	c.model_d2d_gbps = T_D2D;
	c.model_fused_eff = T_EFF;
	c.model_call_ns = T_CALL;
	c.model_launch_ns = T_LAUNCH;
	c.model_fused = fused;
	return c;
}

#define ROW 32u	     /* bytes of one row in model_config */
#define HEADS 2u     /* kv heads */
#define BLOCK 512u   /* bytes of one block: 2 * 8 tokens * 32 */
#define SLOTS_SR 24u /* sink + recent */

/* Never dereferenced by a payload-free backend: prefill and decode only pass the addresses on. */
static uint8_t dummy[64];
#define K_PTR ((const void *)dummy)
#define V_PTR ((const void *)(dummy + 16))
#define Q_PTR ((const void *)(dummy + 32))

static void prefill_all(struct kvt_manager *m, uint64_t seq, uint32_t L, uint32_t layers)
{
	CHECK_RC(kvt_seq_create(m, seq, L), 0);
	for (uint32_t l = 0; l < layers; l++)
		CHECK_RC(kvt_prefill_layer(m, seq, l, K_PTR, V_PTR, Q_PTR, NULL), 0);
}

/* ---- creation and configuration --------------------------------------------------------- */

static void test_find_and_create(void **state)
{
	struct kvt_config c = model_config(1), got;
	enum kvt_backend res = KVT_BACKEND_AUTO;
	struct kvt_manager *m;
	struct kvt_stats st;
	int err = 0;

	(void)state;
	assert_ptr_equal(kvt_backend_find(KVT_BACKEND_MODEL, &res, &err), &kvt_backend_model_ops);
	assert_int_equal(res, KVT_BACKEND_MODEL);
	assert_string_equal(kvt_backend_model_ops.name, "model");
	assert_int_equal(kvt_backend_model_ops.version, KVT_BACKEND_OPS_VERSION);
	/* AUTO never picks the model. */
	assert_ptr_equal(kvt_backend_find(KVT_BACKEND_AUTO, &res, &err), &kvt_backend_host_ops);
	assert_int_equal(res, KVT_BACKEND_HOST);

	m = t_mk(&c);
	assert_ptr_equal(m->ops, &kvt_backend_model_ops);
	assert_true(m->be->flags & KVT_BE_NO_PAYLOAD);
	assert_false(m->payload);
	assert_false(m->cpu_device);
	CHECK_RC(kvt_manager_config(m, &got), 0);
	assert_int_equal(got.backend, KVT_BACKEND_MODEL);
	assert_true(got.model_h2d_gbps == T_H2D && got.model_d2h_gbps == T_D2H &&
		    got.model_d2d_gbps == T_D2D && got.model_fused_eff == T_EFF);
	assert_int_equal(got.model_call_ns, T_CALL);
	assert_int_equal(got.model_launch_ns, T_LAUNCH);
	assert_int_equal(got.model_fused, 1);
	st = t_stats_of(m);
	CHECK_U64(st.model_ns_h2d + st.model_ns_d2h + st.model_ns_d2d, 0, "fresh manager time");
	CHECK_U64(st.model_calls_h2d + st.model_calls_d2h + st.model_calls_d2d, 0,
		  "fresh manager calls");
	kvt_manager_destroy(m);

	/* The defaults are the H100 PCIe Gen5 preset. */
	struct kvt_config d = KVT_CONFIG_INIT;

	assert_true(d.model_h2d_gbps == 53.0 && d.model_d2h_gbps == 53.0 &&
		    d.model_d2d_gbps == 1500.0 && d.model_fused_eff == 0.8);
	assert_int_equal(d.model_call_ns, 2000);
	assert_int_equal(d.model_launch_ns, 5000);
	assert_int_equal(d.model_fused, 1);

	/* An older caller's struct ending before the model fields gets those defaults. */
	struct kvt_config old = model_config(0);

	old.size = (uint32_t)offsetof(struct kvt_config, model_h2d_gbps);
	old.model_h2d_gbps = -1; /* past .size: must not be read */
	m = t_mk(&old);
	CHECK_RC(kvt_manager_config(m, &got), 0);
	assert_true(got.model_h2d_gbps == 53.0 && got.model_fused_eff == 0.8);
	assert_int_equal(got.model_fused, 1);
	kvt_manager_destroy(m);
}

#define EXPECT_CREATE(cfg, want, what)                                                             \
	do {                                                                                       \
		struct kvt_manager *m_ = (struct kvt_manager *)(uintptr_t)0x5e;                    \
		int rc_ = kvt_manager_create((cfg), &m_);                                          \
		if (rc_ != (want))                                                                 \
			fail_at(__FILE__, __LINE__, "create with %s: %d (%s), expected %d", what,  \
				rc_, kvt_strerror(rc_), (int)(want));                              \
		if (rc_ == 0)                                                                      \
			kvt_manager_destroy(m_);                                                   \
		else if (m_ != (struct kvt_manager *)(uintptr_t)0x5e)                              \
			fail_at(__FILE__, __LINE__, "create with %s wrote *out on failure", what); \
	} while (0)

static void test_invalid_fields(void **state)
{
	const double bad_gbps[] = {0.0, -0.0, -1.0, NAN, INFINITY, -INFINITY};
	const double bad_eff[] = {0.0, -0.5, 1.0000001, 2.0, NAN, INFINITY};
	char what[96];

	(void)state;
	for (size_t i = 0; i < sizeof(bad_gbps) / sizeof(bad_gbps[0]); i++) {
		for (int which = 0; which < 3; which++) {
			struct kvt_config c = model_config(1);
			double *f = which == 0	 ? &c.model_h2d_gbps
				    : which == 1 ? &c.model_d2h_gbps
						 : &c.model_d2d_gbps;

			*f = bad_gbps[i];
			snprintf(what, sizeof(what), "bandwidth %d = %g", which, bad_gbps[i]);
			EXPECT_CREATE(&c, -EINVAL, what);
			/* Ignored by the other backends. */
			c.backend = KVT_BACKEND_HOST;
			EXPECT_CREATE(&c, 0, what);
		}
	}
	for (size_t i = 0; i < sizeof(bad_eff) / sizeof(bad_eff[0]); i++) {
		struct kvt_config c = model_config(1);

		c.model_fused_eff = bad_eff[i];
		snprintf(what, sizeof(what), "model_fused_eff = %g", bad_eff[i]);
		EXPECT_CREATE(&c, -EINVAL, what);
		/* Checked whether or not the gather is fused. */
		c.model_fused = 0;
		EXPECT_CREATE(&c, -EINVAL, what);
	}
	{
		struct kvt_config c = model_config(2);

		EXPECT_CREATE(&c, -EINVAL, "model_fused = 2");
		c.model_fused = UINT32_MAX;
		EXPECT_CREATE(&c, -EINVAL, "model_fused = UINT32_MAX");
	}
	/* The edges are accepted: eff 1, tiny and huge bandwidths, zero per-call costs. */
	{
		struct kvt_config c = model_config(1);

		c.model_fused_eff = 1.0;
		c.model_h2d_gbps = 1e-300;
		c.model_d2h_gbps = 1e300;
		c.model_call_ns = 0;
		c.model_launch_ns = UINT32_MAX;
		EXPECT_CREATE(&c, 0, "edge figures");
	}

	/* The backend checks its figures itself too (kvt_manager_create_with bypasses the
	   config's backend field); *out stays untouched. */
	{
		struct kvt_config c = model_config(1);
		struct kvt_manager *m = NULL;

		c.backend = KVT_BACKEND_HOST;
		c.model_d2d_gbps = NAN;
		CHECK_RC(kvt_manager_create_with(&c, &kvt_backend_model_ops, &m), -EINVAL);
		assert_null(m);
	}
	{
		struct kvt_model_params ok = {8, 3, 7, 0.75, 2000, 5000, 1};
		struct kvt_backend_params bp = {2, 4096, ok};
		struct kvt_be *sentinel = (struct kvt_be *)(uintptr_t)0x77, *b = sentinel;
		struct kvt_backend_params bad[] = {bp, bp, bp, bp, bp};

		bad[0].model.h2d_gbps = 0;
		bad[1].model.d2h_gbps = INFINITY;
		bad[2].model.fused_eff = 0;
		bad[3].model.fused = 3;
		bad[4].staging_bytes = 0;
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			CHECK_RC(kvt_backend_model_ops.create(&bad[i], &b), -EINVAL);
			assert_ptr_equal(b, sentinel);
		}
		CHECK_RC(kvt_backend_model_ops.create(&bp, &b), 0);
		kvt_backend_model_ops.destroy(b);
	}
}

/* ---- the vtable directly ---------------------------------------------------------------- */

static struct kvt_be *be_create(uint64_t staging, uint32_t fused)
{
	/* h2d 10, d2h 4, d2d 100 GB/s, call 1000 ns, launch 3000 ns, eff 0.5 */
	struct kvt_backend_params bp = {0, staging, {10, 4, 100, 0.5, 1000, 3000, fused}};
	struct kvt_be *b = NULL;

	CHECK_RC(kvt_backend_model_ops.create(&bp, &b), 0);
	assert_non_null(b);
	return b;
}

static void check_cost(const struct kvt_be *b, enum kvt_dir d, uint64_t ns, uint64_t bytes,
		       uint64_t calls, const char *file, int line)
{
	if (b->cost[d].ns != ns || b->cost[d].bytes != bytes || b->cost[d].calls != calls)
		fail_at(file, line,
			"direction %d: ns %llu bytes %llu calls %llu, expected %llu %llu %llu",
			(int)d, (unsigned long long)b->cost[d].ns,
			(unsigned long long)b->cost[d].bytes, (unsigned long long)b->cost[d].calls,
			(unsigned long long)ns, (unsigned long long)bytes,
			(unsigned long long)calls);
}
#define CHECK_COST(b, d, ns, bytes, calls) \
	check_cost((b), (d), (ns), (bytes), (calls), __FILE__, __LINE__)

static void test_backend_arenas(void **state)
{
	const struct kvt_backend_ops *o = &kvt_backend_model_ops;
	/* (device, host): up to a replay-sized host tier, and halves of the address space */
	const uint64_t sizes[][2] = {
		{4096, 4096},
		{80ull << 30, 1ull << 46},
		{1ull << 50, 1ull << 40},
		{1ull << 62, 1ull << 62},
	};
	uint64_t dev, host, keep;

	(void)state;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		struct kvt_be *b = be_create(4096, 1);

		assert_true(b->flags & KVT_BE_NO_PAYLOAD);
		assert_false(b->flags & KVT_BE_DEVICE_CPU_READABLE);
		CHECK_RC(o->arena_alloc(b, KVT_TIER_DEVICE, sizes[i][0], &dev), 0);
		CHECK_RC(o->arena_alloc(b, KVT_TIER_HOST, sizes[i][1], &host), 0);
		assert_true(dev != 0 && host != 0);
		assert_int_equal(dev % 4096, 0);
		assert_int_equal(host % 4096, 0);
		assert_true(dev + sizes[i][0] > dev && host + sizes[i][1] > host);
		assert_true(dev + sizes[i][0] <= host || host + sizes[i][1] <= dev);
		/* One arena per tier at a time. */
		keep = 7;
		CHECK_RC(o->arena_alloc(b, KVT_TIER_HOST, 4096, &keep), -EBUSY);
		assert_int_equal(keep, 7);
		o->arena_free(b, KVT_TIER_HOST, host, sizes[i][1]);
		CHECK_RC(o->arena_alloc(b, KVT_TIER_HOST, 4096, &host), 0);
		assert_true(dev + sizes[i][0] <= host || host + 4096 <= dev);
		o->arena_free(b, KVT_TIER_HOST, host, 4096);
		o->arena_free(b, KVT_TIER_DEVICE, dev, sizes[i][0]);
		o->destroy(b);
	}
	{
		struct kvt_be *b = be_create(4096, 1);

		keep = 5;
		CHECK_RC(o->arena_alloc(b, KVT_TIER_DEVICE, 0, &keep), -EINVAL);
		CHECK_RC(o->arena_alloc(b, (enum kvt_tier)2, 4096, &keep), -EINVAL);
		assert_int_equal(keep, 5);
		/* No room after a huge first arena: -ENOMEM, recorded. */
		CHECK_RC(o->arena_alloc(b, KVT_TIER_DEVICE, UINT64_MAX - (1ull << 33), &dev), 0);
		b->err[0] = '\0';
		CHECK_RC(o->arena_alloc(b, KVT_TIER_HOST, 1ull << 33, &keep), -ENOMEM);
		assert_true(strlen(b->err) > 0);
		assert_int_equal(keep, 5);
		o->destroy(b);
	}
}

static void test_backend_times(void **state)
{
	const struct kvt_backend_ops *o = &kvt_backend_model_ops;
	struct kvt_be *b = be_create(4096, 1);
	uint64_t dev, host, t1, t2, t3;

	(void)state;
	CHECK_RC(o->arena_alloc(b, KVT_TIER_DEVICE, 1 << 20, &dev), 0);
	CHECK_RC(o->arena_alloc(b, KVT_TIER_HOST, 1 << 20, &host), 0);

	/* 1000 x 3 + 24 = 3024 bytes in 4 pieces; entries moving nothing are free. */
	struct kvt_xfer x[4] = {
		{.src = host,
		 .dst = dev,
		 .bytes = 1000,
		 .reps = 3,
		 .src_stride = 1000,
		 .dst_stride = 2000},
		{.src = host + 8192, .dst = dev + 8192, .bytes = 24, .reps = 1},
		{.src = 1, .dst = 2, .bytes = 0, .reps = 9},
		{.src = 3, .dst = 4, .bytes = 9, .reps = 0},
	};

	/* copy_d2d: launch 3000 + 3024 / 100 = 3030.24 -> 3030; one launch. */
	CHECK_RC(o->copy_d2d(b, x, 4, NULL), 0);
	CHECK_COST(b, KVT_DIR_D2D, 3030, 3024, 1);
	/* fused gather: 3000 + 3024 / (10 * 0.5) = 3604.8 -> 3605; one launch. */
	CHECK_RC(o->gather_h2d(b, x, 4, NULL), 0);
	CHECK_COST(b, KVT_DIR_H2D, 3605, 3024, 1);
	/* empty lists cost nothing */
	CHECK_RC(o->copy_d2d(b, NULL, 0, NULL), 0);
	CHECK_RC(o->gather_h2d(b, x + 2, 2, NULL), 0);
	CHECK_COST(b, KVT_DIR_D2D, 3030, 3024, 1);
	CHECK_COST(b, KVT_DIR_H2D, 3605, 3024, 1);

	/* save: sources of 6000 and 6000 bytes through 4096-byte staging chunks [0, 4096),
	   [4096, 8192), [8192, 12288): the first source crosses chunks 0 and 1, the second 1
	   and 2: 4 calls. 4 * 1000 + 12000 / 4 = 7000. */
	struct kvt_save_src src[2] = {{0x1000, 6000}, {0x900000, 6000}};
	struct kvt_xfer sx[2] = {
		{.src = 0,
		 .dst = host,
		 .bytes = 6000,
		 .reps = 2,
		 .src_stride = 5999,
		 .dst_stride = 8000},
		{.src = 11999, .dst = host + 20000, .bytes = 1, .reps = 1},
	};

	CHECK_RC(o->save(b, src, 2, sx, 2, NULL, &t1), 0);
	CHECK_COST(b, KVT_DIR_D2H, 7000, 12000, 4);
	/* One source exactly filling one chunk: 1 call, 1000 + 4096 / 4 = 2024. */
	src[0].bytes = 4096;
	CHECK_RC(o->save(b, src, 1, NULL, 0, NULL, &t2), 0);
	CHECK_COST(b, KVT_DIR_D2H, 9024, 16096, 5);
	/* A save of nothing completes, costs nothing, still gets a ticket. */
	CHECK_RC(o->save(b, NULL, 0, NULL, 0, NULL, &t3), 0);
	CHECK_COST(b, KVT_DIR_D2H, 9024, 16096, 5);
	assert_true(t1 < t2 && t2 < t3);

	/* append of 3 sequences, 2 heads of 64-byte rows: 768 bytes. Ring writes: 3000 + 768 /
	   100 = 3007.68 -> 3008. Save: k and v (384 bytes each) share chunk 0: 2 calls, 2000 +
	   768 / 4 = 2192. */
	struct kvt_append ap[3] = {{dev, host}, {dev + 4096, host + 4096}, {dev + 8192, host}};
	struct kvt_append_geom g = {2, 64, 1024, 512};
	uint64_t t4;

	CHECK_RC(o->append(b, 0x1000, 0x2000, 3, ap, &g, NULL, &t4), 0);
	assert_true(t4 > t3);
	CHECK_COST(b, KVT_DIR_D2D, 3030 + 3008, 3024 + 768, 2);
	CHECK_COST(b, KVT_DIR_D2H, 9024 + 2192, 16096 + 768, 7);
	CHECK_RC(o->save_wait(b, t4), 0);
	CHECK_RC(o->sync(b, NULL), 0);
	o->destroy(b);

	/* Not fused: a DMA call per piece, at the full link: 4 * 1000 + 3024 / 10 = 4302.4 ->
	   4302. Rounding halves up: 0 + 5 / 10 = 0.5 -> 1, 4 / 10 -> 0. */
	b = be_create(4096, 0);
	CHECK_RC(o->arena_alloc(b, KVT_TIER_DEVICE, 1 << 20, &dev), 0);
	CHECK_RC(o->arena_alloc(b, KVT_TIER_HOST, 1 << 20, &host), 0);
	x[0].src = host, x[0].dst = dev;
	x[1].src = host + 8192, x[1].dst = dev + 8192;
	CHECK_RC(o->gather_h2d(b, x, 4, NULL), 0);
	CHECK_COST(b, KVT_DIR_H2D, 4302, 3024, 4);
	o->destroy(b);
	{
		struct kvt_backend_params bp = {0, 4096, {10, 4, 10, 0.5, 0, 0, 1}};
		struct kvt_xfer one = {.src = 0, .dst = 0, .bytes = 5, .reps = 1};

		CHECK_RC(o->create(&bp, &b), 0);
		CHECK_RC(o->arena_alloc(b, KVT_TIER_DEVICE, 1 << 20, &dev), 0);
		one.dst = dev;
		CHECK_RC(o->copy_d2d(b, &one, 1, NULL), 0);
		CHECK_COST(b, KVT_DIR_D2D, 1, 5, 1);
		one.bytes = 4;
		CHECK_RC(o->copy_d2d(b, &one, 1, NULL), 0);
		CHECK_COST(b, KVT_DIR_D2D, 1, 9, 2);
		o->destroy(b);
	}
}

static void test_backend_checks(void **state)
{
	const struct kvt_backend_ops *o = &kvt_backend_model_ops;
	struct kvt_be *b = be_create(4096, 1);
	const uint64_t A = 1 << 20;
	uint64_t dev, host, t = 0;
	struct kvt_xfer x;

	(void)state;
	/* Before the arenas exist nothing can land anywhere. */
	x = (struct kvt_xfer){.src = 0, .dst = 4096, .bytes = 8, .reps = 1};
	CHECK_RC(o->copy_d2d(b, &x, 1, NULL), -EINVAL);
	CHECK_RC(o->arena_alloc(b, KVT_TIER_DEVICE, A, &dev), 0);
	CHECK_RC(o->arena_alloc(b, KVT_TIER_HOST, A, &host), 0);

	/* copy_d2d: destinations in the device arena, sources unchecked (caller tensors). */
	const struct kvt_xfer bad_d2d[] = {
		{.src = 0, .dst = dev + A - 8, .bytes = 9, .reps = 1},
		{.src = 0, .dst = dev - 1, .bytes = 1, .reps = 1},
		{.src = 0, .dst = host, .bytes = 1, .reps = 1},
		{.src = 0, .dst = dev, .bytes = 8, .reps = 3, .dst_stride = A / 2},
		{.src = 0, .dst = dev, .bytes = 8, .reps = UINT32_MAX, .dst_stride = 1ull << 40},
		{.src = 0, .dst = dev + 8, .bytes = 8, .reps = 2, .dst_stride = UINT64_MAX},
	};
	for (size_t i = 0; i < sizeof(bad_d2d) / sizeof(bad_d2d[0]); i++) {
		struct kvt_xfer two[2] = {{.src = 0, .dst = dev, .bytes = 8, .reps = 1},
					  bad_d2d[i]};

		b->err[0] = '\0';
		CHECK_RC(o->copy_d2d(b, two, 2, NULL), -EINVAL);
		assert_true(strlen(b->err) > 0);
	}
	/* gather: sources in the host arena, destinations in the device arena. */
	x = (struct kvt_xfer){.src = dev, .dst = dev, .bytes = 8, .reps = 1};
	CHECK_RC(o->gather_h2d(b, &x, 1, NULL), -EINVAL);
	x = (struct kvt_xfer){.src = host, .dst = host, .bytes = 8, .reps = 1};
	CHECK_RC(o->gather_h2d(b, &x, 1, NULL), -EINVAL);
	x = (struct kvt_xfer){.src = host + A - 4, .dst = dev, .bytes = 8, .reps = 1};
	CHECK_RC(o->gather_h2d(b, &x, 1, NULL), -EINVAL);
	CHECK_RC(o->gather_h2d(b, NULL, 1, NULL), -EINVAL);
	/* save: piece sources inside the concatenated sources, destinations in the host arena. */
	struct kvt_save_src src[2] = {{0, 100}, {0, 28}};

	x = (struct kvt_xfer){.src = 120, .dst = host, .bytes = 9, .reps = 1};
	CHECK_RC(o->save(b, src, 2, &x, 1, NULL, &t), -EINVAL);
	x = (struct kvt_xfer){.src = 0, .dst = dev, .bytes = 8, .reps = 1};
	CHECK_RC(o->save(b, src, 2, &x, 1, NULL, &t), -EINVAL);
	CHECK_RC(o->save(b, NULL, 2, NULL, 0, NULL, &t), -EINVAL);
	CHECK_RC(o->save(b, src, 2, NULL, 1, NULL, &t), -EINVAL);
	/* append: each sequence's rows (heads at head_stride, V at v_offset) inside both. */
	struct kvt_append_geom g = {4, 64, 1024, 512};
	struct kvt_append ap[2] = {{dev, host}, {dev + A - 3 * 1024 - 512 - 64, host}};

	CHECK_RC(o->append(b, 0, 0, 2, ap, &g, NULL, &t), 0); /* exactly fits */
	assert_int_equal(t, 1);
	ap[1].dev += 1;
	CHECK_RC(o->append(b, 0, 0, 2, ap, &g, NULL, &t), -EINVAL);
	ap[1] = (struct kvt_append){dev, host - 64};
	CHECK_RC(o->append(b, 0, 0, 2, ap, &g, NULL, &t), -EINVAL);
	ap[1] = (struct kvt_append){host, dev};
	CHECK_RC(o->append(b, 0, 0, 2, ap, &g, NULL, &t), -EINVAL);
	CHECK_RC(o->append(b, 0, 0, 2, NULL, &g, NULL, &t), -EINVAL);
	CHECK_RC(o->append(b, 0, 0, 2, ap, NULL, NULL, &t), -EINVAL);
	g.head_stride = UINT64_MAX / 2;
	CHECK_RC(o->append(b, 0, 0, 2, ap, &g, NULL, &t), -EINVAL);
	assert_int_equal(t, 1); /* failed calls take no ticket */

	/* Failed calls cost nothing: only the one good append was charged (4 heads x 64 x 2 x
	   2 sequences = 1024 bytes: 3000 + 10.24 -> 3010; 2 calls + 1024 / 4 = 2256). */
	CHECK_COST(b, KVT_DIR_D2D, 3010, 1024, 1);
	CHECK_COST(b, KVT_DIR_D2H, 2256, 1024, 2);
	CHECK_COST(b, KVT_DIR_H2D, 0, 0, 0);

	/* No payload to read back, nothing written. */
	uint8_t dst[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	b->err[0] = '\0';
	CHECK_RC(o->read_d2h(b, dst, dev, sizeof(dst), NULL), -ENOTSUP);
	assert_true(strlen(b->err) > 0);
	assert_int_equal(dst[0], 1);
	CHECK_COST(b, KVT_DIR_D2H, 2256, 1024, 2);
	o->destroy(b);
}

/* ---- the manager's transfers, timed ----------------------------------------------------- */

/* One prefilled layer of L = 100 tokens: top-K 16 (candidates [8, 84)), so 24 + 16 = 40
   resident tokens per head: 2 heads x 40 x 2 (K, V) x 32 bytes = 5120 bytes gathered into
   frames; the whole layer, 2 x 2 x 100 x 32 = 12800 bytes, saved from two sources (k, v)
   of 6400 bytes. */
#define P_L 100u
#define P_RESIDENT_BYTES (HEADS * 40u * 2u * ROW)
#define P_LAYER_BYTES (2u * HEADS * P_L * ROW)

static void test_prefill_times(void **state)
{
	struct kvt_config c = model_config(1);
	struct kvt_manager *m;
	struct kvt_stats st;

	(void)state;
	m = t_mk(&c);
	CHECK_RC(kvt_seq_create(m, 7, P_L), 0);
	CHECK_RC(kvt_prefill_layer(m, 7, 0, K_PTR, V_PTR, Q_PTR, NULL), 0);
	st = t_stats_of(m);
	CHECK_U64(st.bytes_d2d, P_RESIDENT_BYTES, "bytes into frames");
	CHECK_U64(st.bytes_d2h, P_LAYER_BYTES, "bytes saved");
	/* d2d: launch + 5120 / 7 = 5000 + 731.43 -> 5731 */
	CHECK_U64(st.model_ns_d2d, want_ns(T_LAUNCH, P_RESIDENT_BYTES, T_D2D), "prefill d2d ns");
	CHECK_U64(st.model_ns_d2d, 5731, "prefill d2d ns, by hand");
	CHECK_U64(st.model_calls_d2d, 1, "prefill d2d calls");
	/* d2h: one call per source (staging 64 KiB holds both) + 12800 / 3 = 4000 + 4266.67 */
	CHECK_U64(st.model_ns_d2h, want_ns(2 * T_CALL, P_LAYER_BYTES, T_D2H), "prefill d2h ns");
	CHECK_U64(st.model_ns_d2h, 8267, "prefill d2h ns, by hand");
	CHECK_U64(st.model_calls_d2h, 2, "prefill d2h calls");
	CHECK_U64(st.model_ns_h2d + st.model_calls_h2d, 0, "prefill h2d");
	/* The second layer costs the same again: each call is rounded on its own. */
	CHECK_RC(kvt_prefill_layer(m, 7, 1, K_PTR, V_PTR, Q_PTR, NULL), 0);
	st = t_stats_of(m);
	CHECK_U64(st.model_ns_d2d, 2 * 5731, "two layers d2d");
	CHECK_U64(st.model_ns_d2h, 2 * 8267, "two layers d2h");
	kvt_manager_destroy(m);

	/* Staging of 4096 bytes cuts the 12800 concatenated bytes into 4 chunks: k [0, 6400)
	   crosses chunks 0-1, v [6400, 12800) chunks 1-3: 5 calls. */
	c.staging_bytes = 4096;
	m = t_mk(&c);
	CHECK_RC(kvt_seq_create(m, 7, P_L), 0);
	CHECK_RC(kvt_prefill_layer(m, 7, 0, K_PTR, V_PTR, Q_PTR, NULL), 0);
	st = t_stats_of(m);
	CHECK_U64(st.model_calls_d2h, 5, "chunked prefill d2h calls");
	CHECK_U64(st.model_ns_d2h, want_ns(5 * T_CALL, P_LAYER_BYTES, T_D2H),
		  "chunked prefill d2h ns");
	kvt_manager_destroy(m);

	/* A short prompt (Case 1, every token resident, no top-K): L = 20 -> 20 rows a head. */
	c = model_config(1);
	m = t_mk(&c);
	CHECK_RC(kvt_seq_create(m, 1, 20), 0);
	CHECK_RC(kvt_prefill_layer(m, 1, 0, K_PTR, V_PTR, NULL, NULL), 0);
	st = t_stats_of(m);
	CHECK_U64(st.model_ns_d2d, want_ns(T_LAUNCH, HEADS * 20 * 2 * ROW, T_D2D), "case 1 d2d");
	CHECK_U64(st.model_ns_d2h, want_ns(2 * T_CALL, HEADS * 20 * 2 * ROW, T_D2H), "case 1 d2h");
	kvt_manager_destroy(m);
}

static void test_decode_times(void **state)
{
	struct kvt_config c = model_config(1);
	uint64_t seqs[40];
	struct kvt_manager *m;
	struct kvt_stats a, b;

	(void)state;
	for (int staged = 0; staged < 2; staged++) {
		c.staging_bytes = staged ? 4096 : 64u << 10;
		m = t_mk(&c);
		for (uint32_t i = 0; i < 40; i++) {
			seqs[i] = 1000 + i * 7;
			prefill_all(m, seqs[i], P_L + i, 2);
		}
		for (uint32_t step = 0; step < 3; step++) {
			a = t_stats_of(m);
			CHECK_RC(kvt_decode_append(m, 1, seqs, 40, K_PTR, V_PTR, NULL), 0);
			b = t_stats_of(m);
			/* 40 sequences x 2 heads x 2 x 32 bytes = 5120 bytes; k and v are 2560
			   bytes each. Ring writes: launch + 5120 / 7. */
			CHECK_U64(b.bytes_d2d - a.bytes_d2d, 5120, "decode bytes");
			CHECK_U64(b.model_ns_d2d - a.model_ns_d2d, want_ns(T_LAUNCH, 5120, T_D2D),
				  "decode d2d ns");
			CHECK_U64(b.model_calls_d2d - a.model_calls_d2d, 1, "decode d2d calls");
			/* Save: k [0, 2560) and v [2560, 5120): 2 calls in one 64 KiB chunk; with
			   4096-byte staging v crosses into chunk 1: 3 calls. */
			uint64_t calls = staged ? 3 : 2;

			CHECK_U64(b.model_calls_d2h - a.model_calls_d2h, calls, "decode d2h calls");
			CHECK_U64(b.model_ns_d2h - a.model_ns_d2h,
				  want_ns(calls * T_CALL, 5120, T_D2H), "decode d2h ns");
			CHECK_U64(b.model_ns_h2d, 0, "decode h2d");
		}
		/* A batch of one: launch + 128 / 7 and 2 calls + 128 / 3. */
		a = t_stats_of(m);
		CHECK_RC(kvt_decode_append(m, 0, seqs + 5, 1, K_PTR, V_PTR, NULL), 0);
		b = t_stats_of(m);
		CHECK_U64(b.model_ns_d2d - a.model_ns_d2d, T_LAUNCH + 18, "single d2d");
		CHECK_U64(b.model_ns_d2h - a.model_ns_d2h, 2 * T_CALL + 43, "single d2h");
		/* A refused batch costs nothing. */
		uint64_t dup[2] = {seqs[0], seqs[0]};

		CHECK_RC(kvt_decode_append(m, 0, dup, 2, K_PTR, V_PTR, NULL), -EINVAL);
		a = t_stats_of(m);
		CHECK_U64(a.model_ns_d2d, b.model_ns_d2d, "refused decode d2d");
		CHECK_U64(a.model_ns_d2h, b.model_ns_d2h, "refused decode d2h");
		kvt_manager_destroy(m);
	}
}

/* Host blocks of seq (L = 100, blocks of 8) that are not fully resident: sink covers block 0,
   the model's top-K (the 16 candidates nearest the ring, 68..83) blocks 9 and half of 8, the
   ring 84..99 blocks 10 (with top-K), 11 and 12. So blocks 1..8 need a frame. */
static void test_recall_times(void **state)
{
	(void)state;
	for (uint32_t fused = 0; fused < 2; fused++) {
		struct kvt_config c = model_config(fused);
		struct kvt_manager *m;
		struct kvt_stats a, b;
		uint64_t seq = 3;
		const uint32_t N = UINT32_MAX;

		c.recall_cache_bytes = 64 * BLOCK;
		m = t_mk(&c);
		prefill_all(m, seq, P_L, 2);

		/* [1][2 heads][r = 4]: head 0 loads 1, 2, 3 (0 is sink: skipped), head 1 loads
		   4, 5 (9 is resident, N is no entry): 5 misses. */
		const uint32_t sel1[8] = {1, 2, 0, 3, 4, 9, 5, N};

		a = t_stats_of(m);
		CHECK_RC(kvt_recall_blocks(m, 1, &seq, 1, sel1, 4, NULL), 0);
		b = t_stats_of(m);
		CHECK_U64(b.recall_loads - a.recall_loads, 5, "misses");
		CHECK_U64(b.bytes_h2d - a.bytes_h2d, 5 * BLOCK, "loaded bytes");
		if (fused) {
			/* launch + 2560 / 6 = 5000 + 426.67 */
			CHECK_U64(b.model_ns_h2d - a.model_ns_h2d,
				  want_ns(T_LAUNCH, 5 * BLOCK, T_FUSED_RATE), "fused recall ns");
			CHECK_U64(b.model_ns_h2d - a.model_ns_h2d, 5427, "fused recall, by hand");
			CHECK_U64(b.model_calls_h2d - a.model_calls_h2d, 1, "fused recall calls");
		} else {
			/* 5 x call + 2560 / 8 = 10000 + 320 */
			CHECK_U64(b.model_ns_h2d - a.model_ns_h2d, 5 * T_CALL + 5 * BLOCK / T_H2D,
				  "per-block recall ns");
			CHECK_U64(b.model_calls_h2d - a.model_calls_h2d, 5, "per-block calls");
		}
		/* The same selection again: all hits, no transfer, no time. */
		a = b;
		CHECK_RC(kvt_recall_blocks(m, 1, &seq, 1, sel1, 4, NULL), 0);
		b = t_stats_of(m);
		CHECK_U64(b.recall_hits - a.recall_hits, 5, "hits");
		CHECK_U64(b.model_ns_h2d, a.model_ns_h2d, "hits cost nothing");
		CHECK_U64(b.model_calls_h2d, a.model_calls_h2d, "hits take no call");
		/* Two hits and one miss (block 6 of head 1). */
		const uint32_t sel2[4] = {1, N, 6, 4};

		a = b;
		CHECK_RC(kvt_recall_blocks(m, 1, &seq, 1, sel2, 2, NULL), 0);
		b = t_stats_of(m);
		CHECK_U64(b.recall_loads - a.recall_loads, 1, "one miss");
		CHECK_U64(b.model_ns_h2d - a.model_ns_h2d,
			  fused ? want_ns(T_LAUNCH, BLOCK, T_FUSED_RATE) : T_CALL + BLOCK / T_H2D,
			  "one miss ns");
		/* Nothing but resident blocks: no gather at all. */
		const uint32_t sel3[2] = {0, 12};

		a = b;
		CHECK_RC(kvt_recall_blocks(m, 0, &seq, 1, sel3, 1, NULL), 0);
		b = t_stats_of(m);
		CHECK_U64(b.model_ns_h2d, a.model_ns_h2d, "resident blocks cost nothing");
		kvt_manager_destroy(m);
	}
}

static void test_resume_times(void **state)
{
	(void)state;
	for (uint32_t fused = 0; fused < 2; fused++) {
		struct kvt_config c = model_config(fused);
		struct kvt_manager *m = t_mk(&c);
		struct kvt_stats a, b;
		uint64_t seq = 11, seq2 = 12;

		/* L = 24 = sink + recent: every token resident, slots = positions, so each
		   (layer, head) reloads 3 whole blocks, as 3 entries of 2 pieces (K, V): 2 x 2 x
		   6 = 24 pieces of 8 rows; 2 layers x 2 heads x 24 rows x 2 x 32 = 6144 bytes. */
		prefill_all(m, seq, 24, 2);
		CHECK_RC(kvt_seq_preempt(m, seq), 0);
		a = t_stats_of(m);
		CHECK_RC(kvt_seq_resume(m, seq, NULL), 0);
		b = t_stats_of(m);
		CHECK_U64(b.bytes_h2d - a.bytes_h2d, 6144, "resume bytes");
		if (fused) {
			CHECK_U64(b.model_ns_h2d - a.model_ns_h2d, T_LAUNCH + 6144 / T_FUSED_RATE,
				  "fused resume ns");
			CHECK_U64(b.model_calls_h2d - a.model_calls_h2d, 1, "fused resume calls");
		} else {
			CHECK_U64(b.model_ns_h2d - a.model_ns_h2d, 24 * T_CALL + 6144 / T_H2D,
				  "per-piece resume ns");
			CHECK_U64(b.model_calls_h2d - a.model_calls_h2d, 24, "per-piece calls");
		}

		/* After decode (L = 100 + 5): sink 8 + top-K 16 + ring 16 = 40 rows a head:
		   2 x 2 x 40 x 2 x 32 = 10240 bytes. */
		prefill_all(m, seq2, P_L, 2);
		for (int t = 0; t < 5; t++)
			for (uint32_t l = 0; l < 2; l++)
				CHECK_RC(kvt_decode_append(m, l, &seq2, 1, K_PTR, V_PTR, NULL), 0);
		CHECK_RC(kvt_seq_preempt(m, seq2), 0);
		a = t_stats_of(m);
		CHECK_RC(kvt_seq_resume(m, seq2, NULL), 0);
		b = t_stats_of(m);
		CHECK_U64(b.bytes_h2d - a.bytes_h2d, 10240, "resume bytes after decode");
		if (fused)
			CHECK_U64(b.model_ns_h2d - a.model_ns_h2d,
				  want_ns(T_LAUNCH, 10240, T_FUSED_RATE), "fused resume ns");
		kvt_manager_destroy(m);
	}
}

static void test_no_payload_calls(void **state)
{
	struct kvt_config c = model_config(1);
	struct kvt_manager *m;
	struct kvt_stats a, b;
	uint8_t kbuf[ROW], vbuf[ROW];
	float q[4 * 16] = {0}, out[4 * 16];
	uint64_t seq = 5;

	(void)state;
	c.recall_blocks = 2;
	c.recall_cache_bytes = 16 * BLOCK;
	m = t_mk(&c);
	prefill_all(m, seq, P_L, 2);
	a = t_stats_of(m);
	memset(kbuf, 0xab, sizeof(kbuf));
	/* Resident (pos 0) and host-only (pos 40) tokens alike: no payload to read. */
	CHECK_RC(kvt_seq_read_token(m, seq, 0, 0, 0, kbuf, vbuf), -ENOTSUP);
	CHECK_RC(kvt_seq_read_token(m, seq, 0, 1, 40, kbuf, vbuf), -ENOTSUP);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	assert_int_equal(kbuf[0], 0xab);
	/* Nor anything to attend over or score. */
	CHECK_RC(kvt_attend(m, seq, 0, q, out), -ENOTSUP);
	CHECK_RC(kvt_decode_recall(m, 0, &seq, 1, K_PTR, NULL), -ENOTSUP);
	/* Argument errors still come first. */
	CHECK_RC(kvt_seq_read_token(m, seq, 0, 0, P_L, kbuf, vbuf), -EINVAL);
	CHECK_RC(kvt_seq_read_token(m, 99, 0, 0, 0, kbuf, vbuf), -ENOENT);
	b = t_stats_of(m);
	CHECK_U64(b.model_ns_d2h, a.model_ns_d2h, "reads cost nothing");
	CHECK_U64(b.bytes_read, 0, "bytes read");
	/* Resident positions are bookkeeping and work. */
	int32_t pos[64];
	uint32_t n = 0;

	CHECK_RC(kvt_seq_resident_positions(m, seq, 1, 1, pos, 64, &n), 0);
	assert_int_equal(n, 40);
	assert_int_equal(pos[8], 68); /* the model's top-K: nearest the ring */
	kvt_manager_destroy(m);
}

/* Everything the backend timed matches the manager's byte counters; other backends time
   nothing; stats past an older caller's .size are not written. */
static void test_accounting(void **state)
{
	struct kvt_config c = model_config(1);
	struct kvt_manager *m;
	struct kvt_stats st;
	uint64_t seqs[3] = {1, 2, 3};
	const uint32_t sel[3 * 2 * 2] = {1, 2, 3, 4, 5, 6, 7, 8, 1, 3, 5, 7};

	(void)state;
	c.recall_cache_bytes = 64 * BLOCK;
	m = t_mk(&c);
	for (int i = 0; i < 3; i++)
		prefill_all(m, seqs[i], P_L + 17 * i, 2);
	for (int t = 0; t < 20; t++) {
		for (uint32_t l = 0; l < 2; l++)
			CHECK_RC(kvt_decode_append(m, l, seqs, 3, K_PTR, V_PTR, NULL), 0);
		CHECK_RC(kvt_recall_blocks(m, (uint32_t)t & 1, seqs, 3, sel, 2, NULL), 0);
	}
	CHECK_RC(kvt_seq_preempt(m, 2), 0);
	CHECK_RC(kvt_seq_resume(m, 2, NULL), 0);
	st = t_stats_of(m);
	CHECK_U64(m->be->cost[KVT_DIR_H2D].bytes, st.bytes_h2d, "h2d bytes");
	CHECK_U64(m->be->cost[KVT_DIR_D2H].bytes, st.bytes_d2h, "d2h bytes");
	CHECK_U64(m->be->cost[KVT_DIR_D2D].bytes, st.bytes_d2d, "d2d bytes");
	CHECK_U64(st.model_ns_h2d, m->be->cost[KVT_DIR_H2D].ns, "h2d ns copied");
	CHECK_U64(st.model_ns_d2h, m->be->cost[KVT_DIR_D2H].ns, "d2h ns copied");
	CHECK_U64(st.model_ns_d2d, m->be->cost[KVT_DIR_D2D].ns, "d2d ns copied");
	/* prefill 6 layers + decode 40 calls: one launch each; saves 2 calls each */
	CHECK_U64(st.model_calls_d2d, 6 + 40, "d2d calls");
	CHECK_U64(st.model_calls_d2h, 2 * (6 + 40), "d2h calls");
	assert_true(st.model_ns_h2d > 0 && st.model_calls_h2d > 0);

	/* An older caller's stats end before the model fields: they are left alone. */
	struct kvt_stats old;

	memset(&old, 0x5a, sizeof(old));
	old.size = (uint32_t)offsetof(struct kvt_stats, model_ns_h2d);
	old.version = KVT_STATS_VERSION;
	CHECK_RC(kvt_manager_stats(m, &old), 0);
	CHECK_U64(old.model_ns_h2d, 0x5a5a5a5a5a5a5a5aull, "field past .size");
	CHECK_U64(old.resumes, 1, "field before .size");
	kvt_manager_destroy(m);

	/* The host backend moves real bytes and times nothing. */
	struct kvt_config h = t_small_config();
	size_t bytes = (size_t)HEADS * P_L * ROW;
	void *k = t_xmalloc(bytes), *v = t_xmalloc(bytes), *q = t_xmalloc(4 * 4 * ROW);

	t_fill_prefill(&h, 9, 0, P_L, k, v, q);
	m = t_mk(&h);
	CHECK_RC(kvt_seq_create(m, 9, P_L), 0);
	CHECK_RC(kvt_prefill_layer(m, 9, 0, k, v, q, NULL), 0);
	st = t_stats_of(m);
	assert_true(st.bytes_d2d > 0 && st.bytes_d2h > 0);
	CHECK_U64(st.model_ns_h2d + st.model_ns_d2h + st.model_ns_d2d, 0, "host backend time");
	CHECK_U64(st.model_calls_h2d + st.model_calls_d2h + st.model_calls_d2d, 0,
		  "host backend calls");
	kvt_manager_destroy(m);
	free(k);
	free(v);
	free(q);
}

/* ---- scale ------------------------------------------------------------------------------ */

/* 64 sequences x 32 layers x 32K-token prompts on Llama-3-8B geometry (the defaults: 8 kv
   heads, d=128 bf16, 32-token blocks, sink 128 + recent 512 + top-K 4096), then 100 decode
   steps: 256 GiB of host history and 37 GiB of resident frames that never exist. Defaults
   for the model too (H100, PCIe Gen5). Every total is checked against the hand-computed
   per-call figures below. */
static void test_scale(void **state)
{
	enum { SEQS = 64, LAYERS = 32, L = 32768, STEPS = 100 };
	struct kvt_config c = KVT_CONFIG_INIT;
	uint64_t seqs[SEQS];
	struct kvt_manager *m;
	struct kvt_stats st;
	double t0, t1, t2;

	(void)state;
	c.backend = KVT_BACKEND_MODEL;
	c.device_bytes = 64ull << 30;
	c.host_bytes = 512ull << 30;
	m = t_mk(&c);
	t0 = t_now_s();
	for (uint32_t i = 0; i < SEQS; i++) {
		seqs[i] = 0x9000 + i;
		prefill_all(m, seqs[i], L, LAYERS);
	}
	t1 = t_now_s();
	for (uint32_t s = 0; s < STEPS; s++)
		for (uint32_t l = 0; l < LAYERS; l++)
			CHECK_RC(kvt_decode_append(m, l, seqs, SEQS, K_PTR, V_PTR, NULL), 0);
	t2 = t_now_s();
	st = t_stats_of(m);

	/* One (token, layer) of all heads: 8 x 2 x 256 = 4096 bytes. */
	const uint64_t tok = 4096, resident = 128 + 512 + 4096;
	const uint64_t n_prefill = (uint64_t)SEQS * LAYERS, n_decode = (uint64_t)STEPS * LAYERS;
	/* prefill: launch + 4736 x 4096 / 1500; 128 MiB saved from k and v of 64 MiB each,
	   each crossing 2 chunks of 32 MiB staging: 4 calls + 128 MiB / 53. */
	const uint64_t pf_d2d = want_ns(5000, resident * tok, 1500);
	const uint64_t pf_d2h = want_ns(4 * 2000, (uint64_t)L * tok, 53);
	/* decode of 64: 64 x 4096 = 256 KiB: launch + 256 KiB / 1500; 2 calls + 256 KiB / 53 */
	const uint64_t dc_d2d = want_ns(5000, SEQS * tok, 1500);
	const uint64_t dc_d2h = want_ns(2 * 2000, SEQS * tok, 53);

	CHECK_U64(pf_d2d, 17932, "prefill layer d2d, by hand");
	CHECK_U64(pf_d2h, 2540410, "prefill layer d2h, by hand");
	CHECK_U64(st.tokens_prompt, n_prefill * L, "prompt tokens");
	CHECK_U64(st.tokens_appended, n_decode * SEQS, "appended tokens");
	CHECK_U64(st.bytes_d2h, (n_prefill * L + n_decode * SEQS) * tok, "bytes saved");
	CHECK_U64(st.model_ns_d2d, n_prefill * pf_d2d + n_decode * dc_d2d, "total d2d ns");
	CHECK_U64(st.model_ns_d2h, n_prefill * pf_d2h + n_decode * dc_d2h, "total d2h ns");
	CHECK_U64(st.model_calls_d2h, n_prefill * 4 + n_decode * 2, "total d2h calls");
	CHECK_U64(st.model_ns_h2d, 0, "no gathers");
	CHECK_U64(st.device_frames_used, n_prefill * (resident / 32) * 8, "device frames");
	print_message("# scale: %d seqs x %d layers x %d tokens, %d decode steps: %.2f GiB "
		      "host history, %.2f GiB resident, none allocated\n",
		      SEQS, LAYERS, L, STEPS, (double)st.host_blocks_used * 16384 / (1 << 30),
		      (double)st.device_frames_used * 16384 / (1 << 30));
	print_message("# modelled: d2h %.3f s (%llu calls), d2d %.3f s (%llu calls), h2d %.3f s; "
		      "per decode step %.1f us d2h + %.1f us d2d\n",
		      (double)st.model_ns_d2h * 1e-9, (unsigned long long)st.model_calls_d2h,
		      (double)st.model_ns_d2d * 1e-9, (unsigned long long)st.model_calls_d2d,
		      (double)st.model_ns_h2d * 1e-9, (double)(LAYERS * dc_d2h) * 1e-3,
		      (double)(LAYERS * dc_d2d) * 1e-3);
	print_message("# wall: prefill %.2f s, decode %.2f s (%.0f ns per (seq, layer) append)\n",
		      t1 - t0, t2 - t1, (t2 - t1) * 1e9 / ((double)n_decode * SEQS));

	/* Preempt and resume half of them: every resident row comes back in one fused gather
	   each (launch + rows / (53 x 0.8)); the rounding-free bound is checked. */
	uint64_t h2d0 = st.model_ns_h2d;

	for (uint32_t i = 0; i < SEQS; i += 2) {
		CHECK_RC(kvt_seq_preempt(m, seqs[i]), 0);
		CHECK_RC(kvt_seq_resume(m, seqs[i], NULL), 0);
	}
	st = t_stats_of(m);
	{
		double bytes = (double)resident * tok * LAYERS;
		double want = (SEQS / 2) * (5000 + bytes / (53 * 0.8));

		CHECK_U64(st.model_calls_h2d, SEQS / 2, "resume gathers");
		CHECK_U64(st.bytes_h2d, (uint64_t)(SEQS / 2) * resident * tok * LAYERS,
			  "resume bytes");
		if (fabs((double)(st.model_ns_h2d - h2d0) - want) > SEQS / 2)
			fail_at(__FILE__, __LINE__, "resume h2d %llu ns, expected %.1f",
				(unsigned long long)(st.model_ns_h2d - h2d0), want);
		print_message("# resume of %d seqs: %.3f ms modelled h2d (%.2f GiB)\n", SEQS / 2,
			      (double)(st.model_ns_h2d - h2d0) * 1e-6,
			      (double)st.bytes_h2d / (1 << 30));
	}
	kvt_manager_destroy(m);
}

/* Tiers of 4 TiB each on the model backend, in blocks of 4 KiB (8 kv heads: 2^30 groups per
   tier, a million times the tiers of the other tests): kvt_manager_create does no work and
   takes no memory per group (the pools hand out ids from a high-water mark), the manager
   works, and destroy gives everything back. Before, create wrote every free id of both pools
   (8 GiB, minutes); no time is asserted here (a slow create times the suite out), memory is. */
static void test_terabyte_tiers(void **state)
{
	const uint64_t tib4 = (uint64_t)4 << 40, group = 4096, rc_bytes = (uint64_t)1 << 20;
	struct kvt_config c = model_config(1);
	struct kvt_manager *m;
	struct kvt_stats st;
	struct kvt_seq_info info;
	uint64_t seqs[2] = {41, 42}, rss0, frames[8];
	uint32_t n_frames = 0, n_slots = 0;

	(void)state;
	c.n_kv_heads = 8;
	c.n_q_heads = 16;
	c.host_bytes = tib4;
	c.device_bytes = tib4;
	c.recall_blocks = 2;
	c.recall_cache_bytes = rc_bytes;
	rss0 = t_rss_bytes();
	m = t_mk(&c);
	st = t_stats_of(m);
	CHECK_U64(st.host_blocks_total, tib4 / group * 8, "host blocks");
	CHECK_U64(st.host_blocks_free, st.host_blocks_total, "host blocks free");
	CHECK_U64(st.device_frames_total, (tib4 - rc_bytes) / group * 8, "device frames");
	CHECK_U64(st.recall_frames_total, rc_bytes / BLOCK, "recall frames");
	if (t_rss_bytes() > rss0 + (64 << 20))
		fail_at(__FILE__, __LINE__, "create took %llu MiB",
			(unsigned long long)((t_rss_bytes() - rss0) >> 20));

	/* A little of everything: prefill, decode, recall, preempt and resume. */
	for (int i = 0; i < 2; i++)
		prefill_all(m, seqs[i], 200, 2);
	for (int step = 0; step < 20; step++)
		for (uint32_t l = 0; l < 2; l++)
			CHECK_RC(kvt_decode_append(m, l, seqs, 2, K_PTR, V_PTR, NULL), 0);
	{
		uint32_t sel[2][8][2];

		for (uint32_t h = 0; h < 8; h++) {
			sel[0][h][0] = sel[1][h][0] = 3;
			sel[0][h][1] = sel[1][h][1] = 4 + h % 3;
		}
		CHECK_RC(kvt_recall_blocks(m, 1, seqs, 2, &sel[0][0][0], 2, NULL), 0);
	}
	CHECK_RC(kvt_seq_preempt(m, seqs[0]), 0);
	CHECK_RC(kvt_seq_resume(m, seqs[0], NULL), 0);
	info = t_info_of(m, seqs[0]);
	/* Ids from 0 up: the second sequence's first layer has the groups after the first
	   sequence's two layers (the device arena starts at 4 GiB, transfer/model.c). */
	CHECK_RC(kvt_seq_frames(m, seqs[1], 0, 0, frames, 8, &n_frames, &n_slots), 0);
	CHECK_U64(n_frames, info.frames_per_layer / 8, "frames per layer and head");
	CHECK_U64(frames[0], ((uint64_t)1 << 32) + 2 * n_frames * group, "first frame");
	CHECK_U64(info.tokens, 220, "tokens");
	CHECK_U64(info.host_blocks, 2 * DIV_UP(220, 8) * 8, "host blocks of a sequence");
	st = t_stats_of(m);
	CHECK_U64(st.host_blocks_used, 2 * info.host_blocks, "host blocks used");
	CHECK_U64(st.device_frames_used, 2 * 2 * info.frames_per_layer, "device frames used");
	CHECK_U64(st.recall_loads, 2 * 8 * 2, "recall loads");
	for (int i = 0; i < 2; i++)
		CHECK_RC(kvt_seq_destroy(m, seqs[i]), 0);
	st = t_stats_of(m);
	CHECK_U64(st.host_blocks_used, 0, "host blocks used after destroy");
	CHECK_U64(st.device_frames_used, 0, "device frames used after destroy");
	kvt_manager_destroy(m);
	if (t_rss_bytes() > rss0 + (64 << 20))
		fail_at(__FILE__, __LINE__, "%llu MiB kept after destroy",
			(unsigned long long)((t_rss_bytes() - rss0) >> 20));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_find_and_create), cmocka_unit_test(test_invalid_fields),
		cmocka_unit_test(test_backend_arenas),	cmocka_unit_test(test_backend_times),
		cmocka_unit_test(test_backend_checks),	cmocka_unit_test(test_prefill_times),
		cmocka_unit_test(test_decode_times),	cmocka_unit_test(test_recall_times),
		cmocka_unit_test(test_resume_times),	cmocka_unit_test(test_no_payload_calls),
		cmocka_unit_test(test_accounting),	cmocka_unit_test(test_scale),
		cmocka_unit_test(test_terabyte_tiers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
