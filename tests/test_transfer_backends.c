/* SPDX-License-Identifier: MIT */
/*
 * transfer: the null backend and the backend lookup.
 */
#include "test_transfer.h"

/* ---- null backend ----------------------------------------------------------------------- */

void test_null_backend(void **state)
{
	const struct kvt_backend_ops *o = &kvt_backend_null_ops;
	struct kvt_backend_params bp = {2, 4096};
	struct kvt_be *b = NULL;
	uint64_t dev, host, t1, t2, t3;
	/* (device, host) arena sizes; the last pair is a replay-scale host tier (docs/design.md:
	   ~10^9 host blocks) beside a GPU-sized device tier. */
	const uint64_t sizes[][2] = {
		{4096, 4096},
		{1ull << 30, 1ull << 30},
		{1ull << 40, 1ull << 40},
		{80ull << 30, 1ull << 46},
	};

	(void)state;
	assert_int_equal(o->version, KVT_BACKEND_OPS_VERSION);
	assert_int_equal(o->create(&bp, &b), 0);
	assert_non_null(b);
	assert_ptr_equal(b->ops, o);
	assert_true(b->flags & KVT_BE_NO_PAYLOAD);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, sizes[i][0], &dev), 0);
		assert_int_equal(o->arena_alloc(b, KVT_TIER_HOST, sizes[i][1], &host), 0);
		assert_true(dev != 0 && host != 0);
		assert_int_equal(dev % 4096, 0);
		assert_int_equal(host % 4096, 0);
		/* Disjoint, and neither wraps around the address space. */
		assert_true(dev + sizes[i][0] > dev && host + sizes[i][1] > host);
		assert_true(dev + sizes[i][0] <= host || host + sizes[i][1] <= dev);
		o->arena_free(b, KVT_TIER_HOST, host, sizes[i][1]);
		o->arena_free(b, KVT_TIER_DEVICE, dev, sizes[i][0]);
	}
	uint64_t base = 5;

	assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, 0, &base), -EINVAL);
	assert_int_equal(base, 5);

	/* Every op succeeds and dereferences nothing: the addresses below are unmapped. */
	struct kvt_xfer x[2] = {
		{.src = 16,
		 .dst = 32,
		 .bytes = 1 << 20,
		 .reps = 3,
		 .src_stride = 8,
		 .dst_stride = 8},
		{.src = 1ull << 44, .dst = 1ull << 45, .bytes = 64, .reps = 1},
	};
	struct kvt_save_src src = {48, 1 << 20};
	struct kvt_append ap = {64, 128};
	struct kvt_append_geom g = {8, 256, 4096, 2048};

	assert_int_equal(o->copy_d2d(b, x, 2, NULL), 0);
	assert_int_equal(o->gather_h2d(b, x, 2, NULL), 0);
	assert_int_equal(o->save(b, &src, 1, x, 2, NULL, &t1), 0);
	assert_int_equal(o->append(b, 16, 32, 1, &ap, &g, NULL, &t2), 0);
	assert_int_equal(o->save(b, &src, 1, x, 2, NULL, &t3), 0);
	assert_int_equal(t1, 1);
	assert_int_equal(t2, 2);
	assert_int_equal(t3, 3);
	assert_int_equal(o->save_wait(b, t2), 0);
	assert_int_equal(o->save_wait(b, UINT64_MAX), 0);
	assert_int_equal(o->sync(b, NULL), 0);
	/* Lists that are NULL with entries are refused. */
	assert_int_equal(o->copy_d2d(b, NULL, 1, NULL), -EINVAL);
	assert_int_equal(o->gather_h2d(b, NULL, 1, NULL), -EINVAL);

	/* No payload to read back. */
	uint8_t dst[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	b->err[0] = '\0';
	assert_int_equal(o->read_d2h(b, dst, 4096, sizeof(dst), NULL), -ENOTSUP);
	assert_true(strlen(b->err) > 0);
	assert_int_equal(dst[0], 1);
	o->destroy(b);
}

/* ---- lookup ----------------------------------------------------------------------------- */

void test_backend_find(void **state)
{
	enum kvt_backend res;
	int err;

	(void)state;
	res = (enum kvt_backend)99;
	err = 0;
	if (t_auto_backend() == KVT_BACKEND_HOST) {
		assert_ptr_equal(kvt_backend_find(KVT_BACKEND_AUTO, &res, &err),
				 &kvt_backend_host_ops);
		assert_int_equal(res, KVT_BACKEND_HOST);
		err = 0;
		assert_null(kvt_backend_find(KVT_BACKEND_CUDA, &res, &err));
		assert_int_equal(err, -ENODEV);
	} else {
		const struct kvt_backend_ops *cuda = kvt_plugin_load(&err)->ops;

		assert_ptr_equal(kvt_backend_find(KVT_BACKEND_AUTO, &res, &err), cuda);
		assert_int_equal(res, KVT_BACKEND_CUDA);
		assert_ptr_equal(kvt_backend_find(KVT_BACKEND_CUDA, &res, &err), cuda);
	}
	res = (enum kvt_backend)99;
	assert_ptr_equal(kvt_backend_find(KVT_BACKEND_HOST, &res, &err), &kvt_backend_host_ops);
	assert_int_equal(res, KVT_BACKEND_HOST);

	err = 0;
	res = (enum kvt_backend)99;
	assert_ptr_equal(kvt_backend_find(KVT_BACKEND_MODEL, &res, &err), &kvt_backend_model_ops);
	assert_int_equal(res, KVT_BACKEND_MODEL);
	err = 0;
	assert_null(kvt_backend_find((enum kvt_backend)4, &res, &err));
	assert_int_equal(err, -EINVAL);
	err = 0;
	assert_null(kvt_backend_find((enum kvt_backend) - 1, &res, &err));
	assert_int_equal(err, -EINVAL);
}
