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

/* The sizeof of a struct kvt_config that ends with field f, on this ABI. */
#define T_CFG_END(f) (offsetof(struct kvt_config, f) + sizeof(((struct kvt_config *)0)->f))
#define T_CFG_SIZE(f)                                                  \
	((uint32_t)((T_CFG_END(f) + _Alignof(struct kvt_config) - 1) / \
		    _Alignof(struct kvt_config) * _Alignof(struct kvt_config)))

/* The sizes struct kvt_config has had at KVT_CONFIG_VERSION 1 (kvtier.h): the design contract's
   fields, then kvtier's first header, recall, the model backend, and this header. */
static const uint32_t *known_sizes(uint32_t *n)
{
	static uint32_t sz[5];

	sz[0] = T_CFG_SIZE(backend);
	sz[1] = T_CFG_SIZE(staging_bytes);
	sz[2] = T_CFG_SIZE(recall_cache_bytes);
	sz[3] = T_CFG_SIZE(model_fused);
	sz[4] = (uint32_t)sizeof(struct kvt_config);
	*n = 5;
	return sz;
}

void test_create_size_version(void **state)
{
	uint32_t n_known;
	const uint32_t *known = known_sizes(&n_known);

	(void)state;
	if (sizeof(void *) == 8) { /* the headers' sizes on LP64 */
		const uint32_t lp64[5] = {80, 88, 104, 152, 184};

		assert_memory_equal(known, lp64, sizeof(lp64));
	}
	/* Exactly the known sizes, and no other from 0 to past today's struct, are accepted. */
	for (uint32_t size = 0; size <= sizeof(struct kvt_config) + 64; size++) {
		char what[64];
		struct kvt_config c = t_small_config();
		int want = -EINVAL;

		for (uint32_t i = 0; i < n_known; i++)
			want = size == known[i] ? 0 : want;
		c.size = size;
		snprintf(what, sizeof(what), "size = %u", size);
		expect_create(&c, want, what, __FILE__, __LINE__);
	}
	CREATE_WITH(size, 65536, -EINVAL);
	CREATE_WITH(size, UINT32_MAX, -EINVAL);
	CREATE_WITH(version, 0, -EINVAL);
	CREATE_WITH(version, KVT_CONFIG_VERSION + 1, -EINVAL);
	CREATE_WITH(version, UINT32_MAX, -EINVAL);
	/* recall_threads must be at most 64 ... */
	CREATE_WITH(recall_threads, 65, -EINVAL);
	CREATE_WITH(recall_threads, UINT32_MAX, -EINVAL);
	/* ... where the caller's struct has it: an older one's memory past its end is not read. */
	{
		struct kvt_config c = t_small_config();

		c.size = known[3];
		c.recall_threads = 65;
		EXPECT_CREATE(&c, 0, "recall_threads past an older caller's struct");
	}
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

/* A caller built against an older header passes that header's struct: the fields inside it are
   read (and validated), the rest keep their defaults, whatever lies in memory past it, its
   tail padding included (today's next field may lie there). */
void test_create_older_caller(void **state)
{
	const struct kvt_config defaults = KVT_CONFIG_INIT;
	struct kvt_config c = t_small_config(), got;
	struct kvt_manager *m = NULL;
	struct kvt_stats st = KVT_STATS_INIT;
	uint32_t n_known;
	const uint32_t *known = known_sizes(&n_known);

	(void)state;
	/* Every field past the design contract's holds a value that is invalid if read. */
	c.save_threads = 1000;
	c.staging_bytes = 1;
	c.recall_blocks = 1u << 30;
	c.ws_window = 0;
	c.recall_cache_bytes = UINT64_MAX;
	c.model_h2d_gbps = -1;
	c.model_fused = 7;
	c.disk_queue_depth = 0;
	c.spill_dir = "/no/such/spill/dir";
	c.disk_bytes = 1;
	c.recall_threads = 1000;

	/* The design contract's fields alone: save_threads lies in its padding. */
	c.size = known[0];
	assert_int_equal(t_manager_create(&c, &m), 0);
	assert_int_equal(kvt_manager_config(m, &got), 0);
	assert_int_equal(got.size, sizeof(struct kvt_config));
	assert_int_equal(got.version, KVT_CONFIG_VERSION);
	assert_int_equal(got.save_threads, defaults.save_threads);
	assert_int_equal(got.staging_bytes, defaults.staging_bytes);
	assert_int_equal(got.recall_blocks, defaults.recall_blocks);
	assert_null(got.spill_dir);
	assert_int_equal(got.recall_threads, defaults.recall_threads);
	/* The fields inside .size are the caller's. */
	assert_int_equal(got.n_layers, c.n_layers);
	assert_int_equal(got.head_dim, c.head_dim);
	assert_int_equal(got.dtype, c.dtype);
	assert_int_equal(got.device_bytes, c.device_bytes);
	assert_int_equal(got.backend, t_be->kind);
	assert_int_equal(kvt_manager_stats(m, &st), 0);
	assert_int_equal(st.save_threads, defaults.save_threads);
	kvt_manager_destroy(m);

	/* kvtier's first header: the save path is the caller's, recall the default. */
	c.size = known[1];
	c.save_threads = 3;
	c.staging_bytes = 8192;
	assert_int_equal(t_manager_create(&c, &m), 0);
	assert_int_equal(kvt_manager_config(m, &got), 0);
	assert_int_equal(got.save_threads, 3);
	assert_int_equal(got.staging_bytes, 8192);
	assert_int_equal(got.recall_blocks, defaults.recall_blocks);
	assert_int_equal(got.ws_window, defaults.ws_window);
	kvt_manager_destroy(m);

	/* With recall: those fields are read and validated. */
	c.size = known[2];
	EXPECT_CREATE(&c, -EINVAL, "recall fields inside an older caller's struct");
	c.recall_blocks = 2;
	c.ws_window = 5;
	c.recall_cache_bytes = 64 * 512;
	assert_int_equal(t_manager_create(&c, &m), 0);
	assert_int_equal(kvt_manager_config(m, &got), 0);
	assert_int_equal(got.recall_blocks, 2);
	assert_int_equal(got.ws_window, 5);
	assert_int_equal(got.model_fused, defaults.model_fused);
	assert_true(got.model_h2d_gbps == defaults.model_h2d_gbps);
	kvt_manager_destroy(m);

	/* With the model fields: disk_queue_depth lies in that struct's padding, the disk tier
	   past it. */
	c.size = known[3];
	c.model_h2d_gbps = 20;
	c.model_fused = 0;
	assert_int_equal(t_manager_create(&c, &m), 0);
	assert_int_equal(kvt_manager_config(m, &got), 0);
	assert_true(got.model_h2d_gbps == 20);
	assert_int_equal(got.model_fused, 0);
	assert_int_equal(got.disk_queue_depth, defaults.disk_queue_depth);
	assert_null(got.spill_dir);
	assert_int_equal(got.disk_bytes, defaults.disk_bytes);
	kvt_manager_destroy(m);

	/* ... and the field inside .size is validated. */
	c.size = known[1];
	c.save_threads = 65;
	EXPECT_CREATE(&c, -EINVAL, "save_threads 65 inside a short struct");
}
