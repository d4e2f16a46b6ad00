/* SPDX-License-Identifier: MIT */
/*
 * errors: kvt_manager_create's argument checks (each field, sizes and versions, backends, an older
 * caller's smaller struct).
 */
#include "test_errors.h"

/* ---- kvt_manager_create ----------------------------------------------------------------- */

static struct kvt_manager *const SENTINEL = (struct kvt_manager *)(uintptr_t)0x5eed;

static void expect_create(const struct kvt_config *c, int code, const char *what, const char *file,
			  int line)
{
	struct kvt_manager *m = SENTINEL;
	struct kvt_config copy = *c;
	int rc = t_manager_create(c, &m);

	if (rc != code) {
		print_error("%s: kvt_manager_create returned %d (%s), expected %d (%s)\n", what, rc,
			    kvt_strerror(rc), code, kvt_strerror(code));
		_fail(file, line);
	}
	_assert_true(memcmp(&copy, c, sizeof(copy)) == 0, "cfg untouched", file, line);
	if (code) {
		_assert_true(m == SENTINEL, "*out untouched on failure", file, line);
	} else {
		_assert_true(m != SENTINEL && m != NULL, "*out set", file, line);
		kvt_manager_destroy(m);
	}
}
#define EXPECT_CREATE(c, code, what) expect_create((c), (code), (what), __FILE__, __LINE__)

/* Applies one field change to t_small_config() and expects `code`. */
#define CREATE_WITH(field, value, code)                          \
	do {                                                     \
		struct kvt_config c_ = t_small_config();         \
		c_.field = (value);                              \
		EXPECT_CREATE(&c_, (code), #field " = " #value); \
	} while (0)

void test_create_null_args(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m = SENTINEL;

	(void)state;
	assert_int_equal(t_manager_create(NULL, &m), -EINVAL);
	assert_ptr_equal(m, SENTINEL);
	assert_int_equal(t_manager_create(&c, NULL), -EINVAL);
	assert_int_equal(t_manager_create(NULL, NULL), -EINVAL);
}

void test_create_size_version(void **state)
{
	const uint32_t min_size = offsetof(struct kvt_config, backend) + sizeof(enum kvt_backend);

	(void)state;
	CREATE_WITH(size, 0, -EINVAL);
	CREATE_WITH(size, 4, -EINVAL);
	CREATE_WITH(size, 8, -EINVAL);
	/* Too short to hold every design-contract field (up to and including backend). */
	CREATE_WITH(size, min_size - 1, -EINVAL);
	CREATE_WITH(size, (uint32_t)offsetof(struct kvt_config, device_bytes), -EINVAL);
	CREATE_WITH(size, UINT32_MAX, -EINVAL);
	CREATE_WITH(version, 0, -EINVAL);
	CREATE_WITH(version, KVT_CONFIG_VERSION + 1, -EINVAL);
	CREATE_WITH(version, UINT32_MAX, -EINVAL);
	/* The contract's minimum is accepted. */
	CREATE_WITH(size, min_size, 0);
}

void test_create_geometry(void **state)
{
	(void)state;
	CREATE_WITH(n_layers, 0, -EINVAL);
	CREATE_WITH(n_kv_heads, 0, -EINVAL);
	CREATE_WITH(n_q_heads, 0, -EINVAL);
	CREATE_WITH(n_q_heads, 3, -EINVAL); /* 3 % 2 */
	CREATE_WITH(n_q_heads, 5, -EINVAL);
	CREATE_WITH(n_q_heads, 1, -EINVAL); /* fewer q heads than kv heads */
	CREATE_WITH(head_dim, 0, -EINVAL);
	CREATE_WITH(block_tokens, 0, -EINVAL);
	CREATE_WITH(block_tokens, 4, -EINVAL);
	CREATE_WITH(block_tokens, 7, -EINVAL);
	CREATE_WITH(block_tokens, 24, -EINVAL);
	CREATE_WITH(block_tokens, 48, -EINVAL);
	CREATE_WITH(block_tokens, 128, -EINVAL);
	CREATE_WITH(block_tokens, 1u << 31, -EINVAL);
	CREATE_WITH(dtype, (enum kvt_dtype)3, -EINVAL);
	CREATE_WITH(dtype, (enum kvt_dtype)99, -EINVAL);
	CREATE_WITH(dtype, (enum kvt_dtype) - 1, -EINVAL);
	/* The valid edges. */
	CREATE_WITH(block_tokens, 16, 0);
	CREATE_WITH(block_tokens, 32, 0);
	CREATE_WITH(n_q_heads, 2, 0); /* G = 1 */
	CREATE_WITH(dtype, KVT_DTYPE_F32, 0);
	CREATE_WITH(dtype, KVT_DTYPE_BF16, 0);
	{
		struct kvt_config c = t_small_config();

		c.block_tokens = 64;
		c.device_bytes = c.host_bytes = 16u << 20;
		EXPECT_CREATE(&c, 0, "block_tokens = 64");
	}
}

void test_create_snapstream(void **state)
{
	(void)state;
	CREATE_WITH(recent_tokens, 0, -EINVAL);
	CREATE_WITH(pool_kernel, 0, -EINVAL);
	CREATE_WITH(pool_kernel, 2, -EINVAL);
	CREATE_WITH(pool_kernel, 4, -EINVAL);
	CREATE_WITH(obs_window, 0, -EINVAL); /* top-K 16 > 0 */
	/* Accepted: no top-K needs no observation window; no sink; kernel 1. */
	{
		struct kvt_config c = t_small_config();

		c.topk_tokens = 0;
		c.obs_window = 0;
		EXPECT_CREATE(&c, 0, "topk 0, obs 0");
	}
	CREATE_WITH(sink_tokens, 0, 0);
	CREATE_WITH(pool_kernel, 1, 0);
	CREATE_WITH(recent_tokens, 1, 0);
}

void test_create_budgets(void **state)
{
	const struct kvt_config base = t_small_config();
	/* One group: a block (K and V of block_tokens rows) per kv head. */
	const uint64_t group = 2ull * base.block_tokens * base.head_dim * 2 * base.n_kv_heads;

	(void)state;
	assert_int_equal(group, 1024);
	CREATE_WITH(device_bytes, 0, -EINVAL);
	CREATE_WITH(device_bytes, group - 1, -EINVAL);
	CREATE_WITH(host_bytes, 0, -EINVAL);
	CREATE_WITH(host_bytes, group - 1, -EINVAL);
	/* More groups than 32-bit ids can name. */
	CREATE_WITH(host_bytes, UINT64_MAX, -EINVAL);
	CREATE_WITH(device_bytes, UINT64_MAX, -EINVAL);
	CREATE_WITH(host_bytes, (uint64_t)UINT32_MAX * 1024, -EINVAL);
	CREATE_WITH(device_bytes, ((uint64_t)1 << 32) * 1024 + 5, -EINVAL);
	/* Exactly one group per tier is enough (rounded down from a little more). */
	{
		struct kvt_config c = base;

		c.device_bytes = group;
		c.host_bytes = 2 * group - 1;
		EXPECT_CREATE(&c, 0, "one group per tier");
	}
}

void test_create_threads_staging(void **state)
{
	(void)state;
	CREATE_WITH(save_threads, 65, -EINVAL);
	CREATE_WITH(save_threads, UINT32_MAX, -EINVAL);
	CREATE_WITH(staging_bytes, 0, -EINVAL);
	CREATE_WITH(staging_bytes, 100, -EINVAL);
	CREATE_WITH(staging_bytes, 4095, -EINVAL);
	CREATE_WITH(staging_bytes, UINT64_MAX, -EINVAL);
	CREATE_WITH(save_threads, 0, 0);
	CREATE_WITH(staging_bytes, 4096, 0);
}

void test_create_backends(void **state)
{
	(void)state;
	if (t_auto_backend() == KVT_BACKEND_HOST)
		CREATE_WITH(backend, KVT_BACKEND_CUDA, -ENODEV);
	CREATE_WITH(backend, KVT_BACKEND_MODEL, 0);
	CREATE_WITH(backend, (enum kvt_backend)42, -EINVAL);
	CREATE_WITH(backend, (enum kvt_backend) - 1, -EINVAL);
	/* AUTO resolves to CUDA where it is usable, else host; the resolved value is reported. */
	{
		struct kvt_config c = t_small_config(), got;
		struct kvt_manager *m = NULL;

		c.backend = KVT_BACKEND_AUTO;
		assert_int_equal(t_manager_create(&c, &m), 0);
		assert_int_equal(kvt_manager_config(m, &got), 0);
		assert_int_equal(got.backend, t_auto_backend());
		kvt_manager_destroy(m);
	}
}

/* An older caller's struct ends before save_threads / staging_bytes: those get the defaults,
   whatever happens to lie in memory past .size. */
void test_create_older_caller(void **state)
{
	const struct kvt_config defaults = KVT_CONFIG_INIT;
	struct kvt_config c = t_small_config(), got;
	struct kvt_manager *m = NULL;
	struct kvt_stats st = KVT_STATS_INIT;

	(void)state;
	c.size = offsetof(struct kvt_config, save_threads);
	c.save_threads = 1000; /* invalid if read */
	c.staging_bytes = 1;   /* invalid if read */
	assert_int_equal(t_manager_create(&c, &m), 0);
	assert_int_equal(kvt_manager_config(m, &got), 0);
	assert_int_equal(got.size, sizeof(struct kvt_config));
	assert_int_equal(got.version, KVT_CONFIG_VERSION);
	assert_int_equal(got.save_threads, defaults.save_threads);
	assert_int_equal(got.staging_bytes, defaults.staging_bytes);
	/* The fields inside .size are the caller's. */
	assert_int_equal(got.n_layers, c.n_layers);
	assert_int_equal(got.head_dim, c.head_dim);
	assert_int_equal(got.dtype, c.dtype);
	assert_int_equal(got.device_bytes, c.device_bytes);
	assert_int_equal(got.backend, t_be->kind);
	assert_int_equal(kvt_manager_stats(m, &st), 0);
	assert_int_equal(st.save_threads, defaults.save_threads);
	kvt_manager_destroy(m);

	/* One field more: save_threads is the caller's, staging_bytes the default. */
	c.size = offsetof(struct kvt_config, staging_bytes);
	c.save_threads = 3;
	assert_int_equal(t_manager_create(&c, &m), 0);
	assert_int_equal(kvt_manager_config(m, &got), 0);
	assert_int_equal(got.save_threads, 3);
	assert_int_equal(got.staging_bytes, defaults.staging_bytes);
	kvt_manager_destroy(m);

	/* ... and the field inside .size is validated. */
	c.save_threads = 65;
	EXPECT_CREATE(&c, -EINVAL, "save_threads 65 inside a short struct");
}
