/* SPDX-License-Identifier: MIT */
/*
 * errors: every bad-input path of the public API (kvtier.h), on the host backend with
 * t_small_config() (2 layers, 2 kv heads, 4 q heads, d=16, 8-token blocks, sink 8, recent 16,
 * top-K 16, obs 4, f16).
 *
 * The contract under test: a failing call returns the documented negative errno, records a
 * detail for kvt_manager_last_error, and changes nothing. "Nothing" is checked three ways after
 * every failing call on a live manager: the stats are byte-identical to before the call, each
 * live sequence's token counts and resident positions are as before, and every token of every
 * prefilled (sequence, layer, head) still reads back (from whichever tier holds it, and from
 * the host history) exactly as it was written. Token data come from common.h's generator, so
 * the expected bytes are regenerated rather than stored.
 *
 * The fixture holds three sequences: A (prompt 40: top-K selection happens; layer 0 prefilled
 * and decoded to 45 tokens, layer 1 not prefilled), B (prompt 20: SnapStream Case 1; both
 * layers prefilled, layer 0 decoded to 24 tokens so its next token starts a new host block) and
 * C (prompt 30, nothing prefilled).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "internal.h"
#include "kvtier.h"

/* ---- log capture: keeps the expected warnings off stderr and checks their prefix -------- */

static unsigned log_count;

static void capture_log(void *user, enum kvt_log_level level, const char *msg)
{
	(void)user;
	(void)level;
	assert_non_null(msg);
	assert_int_equal(strncmp(msg, "kvtier: ", 8), 0);
	log_count++;
}

/* ---- fixture ---------------------------------------------------------------------------- */

#define SEQ_A 101u
#define SEQ_B 202u
#define SEQ_C 303u
#define SEQ_NONE 999u
#define N_SEQ 3
#define MAX_POS 64

struct fx {
	struct kvt_config c;
	struct kvt_manager *m;
	size_t row; /* bytes of one row */
	uint64_t id[N_SEQ];
	uint32_t prompt[N_SEQ];
	uint32_t ntok[N_SEQ][2];	   /* expected tokens per layer (0 = not prefilled) */
	int32_t pos[N_SEQ][2][2][MAX_POS]; /* resident positions snapshot */
	uint32_t npos[N_SEQ][2][2];
};

static void fx_prefill(struct fx *f, int s, uint32_t layer, bool with_q)
{
	const struct kvt_config *c = &f->c;
	uint32_t L = f->prompt[s];
	size_t kv = (size_t)c->n_kv_heads * L * f->row,
	       qb = (size_t)c->n_q_heads * c->obs_window * f->row;
	void *k = malloc(kv), *v = malloc(kv), *q = malloc(qb);

	assert_true(k && v && q);
	t_fill_prefill(c, f->id[s], layer, L, k, v, q);
	assert_int_equal(t_prefill_layer(f->m, f->id[s], layer, k, v, with_q ? q : NULL, NULL), 0);
	f->ntok[s][layer] = L;
	free(k);
	free(v);
	free(q);
}

/* Decodes one token for each listed fixture sequence on `layer` (must succeed). */
static void fx_decode(struct fx *f, uint32_t layer, const int *which, uint32_t n)
{
	uint64_t ids[N_SEQ];
	uint32_t pos[N_SEQ];
	size_t bytes = (size_t)n * f->c.n_kv_heads * f->row;
	void *k = malloc(bytes), *v = malloc(bytes);

	assert_true(k && v);
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = f->id[which[i]];
		pos[i] = f->ntok[which[i]][layer];
	}
	t_fill_decode(&f->c, ids, pos, n, layer, k, v);
	assert_int_equal(t_decode_append(f->m, layer, ids, n, k, v, NULL), 0);
	for (uint32_t i = 0; i < n; i++)
		f->ntok[which[i]][layer]++;
	free(k);
	free(v);
}

/* Hidden per-layer state (ring slot, write cursors, block tables) shows only in later work:
   decodes A and B on layer 0 past a full ring turn (and several block boundaries), then checks
   everything. Called after failing calls to show they left that state intact. */
static void fx_snapshot_positions(struct fx *f);
static void fx_check_state(struct fx *f, const char *file, int line);

static void fx_decode_rounds(struct fx *f, int rounds, const char *file, int line)
{
	const int ab[2] = {0, 1};

	for (int r = 0; r < rounds; r++)
		fx_decode(f, 0, ab, 2);
	fx_snapshot_positions(f);
	/* Resident positions follow the ring rule: sink, top-K (A only), the last 16. */
	for (int s = 0; s < 2; s++) {
		uint32_t N = f->ntok[s][0], topk = s == 0 ? 16 : 0;

		_assert_int_equal(f->npos[s][0][0], 8 + topk + 16, file, line);
		for (uint32_t i = 0; i < 16; i++)
			_assert_int_equal(f->pos[s][0][0][8 + topk + i], N - 16 + i, file, line);
	}
	fx_check_state(f, file, line);
}
#define DECODE_ROUNDS(f, r) fx_decode_rounds((f), (r), __FILE__, __LINE__)

/* Records the resident positions of every prefilled (sequence, layer, head). */
static void fx_snapshot_positions(struct fx *f)
{
	for (int s = 0; s < N_SEQ; s++)
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t h = 0; h < 2; h++) {
				f->npos[s][l][h] = 0;
				if (!f->ntok[s][l])
					continue;
				assert_int_equal(kvt_seq_resident_positions(
							 f->m, f->id[s], l, h, f->pos[s][l][h],
							 MAX_POS, &f->npos[s][l][h]),
						 0);
			}
}

/* Everything observable about the fixture's sequences is as recorded: token counts, resident
   positions, and the bytes of every token in both read paths. */
static void fx_check_state(struct fx *f, const char *file, int line)
{
	uint8_t k[64], v[64], ek[64], ev[64];
	int32_t pos[MAX_POS];
	uint32_t n;

	for (int s = 0; s < N_SEQ; s++)
		for (uint32_t l = 0; l < 2; l++) {
			_assert_int_equal(kvt_seq_tokens(f->m, f->id[s], l, &n), 0, file, line);
			_assert_int_equal(n, f->ntok[s][l], file, line);
			if (!f->ntok[s][l])
				continue;
			for (uint32_t h = 0; h < 2; h++) {
				_assert_int_equal(kvt_seq_resident_positions(f->m, f->id[s], l, h,
									     pos, MAX_POS, &n),
						  0, file, line);
				_assert_int_equal(n, f->npos[s][l][h], file, line);
				_assert_true(memcmp(pos, f->pos[s][l][h], n * sizeof(pos[0])) == 0,
					     "resident positions unchanged", file, line);
				for (uint32_t p = 0; p < f->ntok[s][l]; p++) {
					t_fill_row(f->c.dtype, f->c.head_dim, ek, f->id[s], l, h, p,
						   0);
					t_fill_row(f->c.dtype, f->c.head_dim, ev, f->id[s], l, h, p,
						   1);
					memset(k, 0xee, sizeof(k));
					memset(v, 0xee, sizeof(v));
					_assert_int_equal(
						kvt_seq_read_token(f->m, f->id[s], l, h, p, k, v),
						0, file, line);
					if (memcmp(k, ek, f->row) || memcmp(v, ev, f->row)) {
						print_error(
							"seq %llu layer %u head %u pos %u: token "
							"bytes differ (device path)\n",
							(unsigned long long)f->id[s], l, h, p);
						_fail(file, line);
					}
					memset(k, 0xee, sizeof(k));
					memset(v, 0xee, sizeof(v));
					_assert_int_equal(kvt_seq_read_token_host(f->m, f->id[s], l,
										  h, p, k, v),
							  0, file, line);
					if (memcmp(k, ek, f->row) || memcmp(v, ev, f->row)) {
						print_error(
							"seq %llu layer %u head %u pos %u: token "
							"bytes differ (host history)\n",
							(unsigned long long)f->id[s], l, h, p);
						_fail(file, line);
					}
				}
			}
		}
}
#define CHECK_STATE(f) fx_check_state((f), __FILE__, __LINE__)

static int fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->c = t_small_config();
	f->row = (size_t)f->c.head_dim * kvt_dtype_size(f->c.dtype);
	f->id[0] = SEQ_A;
	f->id[1] = SEQ_B;
	f->id[2] = SEQ_C;
	f->prompt[0] = 40;
	f->prompt[1] = 20;
	f->prompt[2] = 30;
	assert_int_equal(t_manager_create(&f->c, &f->m), 0);
	assert_string_equal(kvt_manager_last_error(f->m), "");
	for (int s = 0; s < N_SEQ; s++)
		assert_int_equal(kvt_seq_create(f->m, f->id[s], f->prompt[s]), 0);
	fx_prefill(f, 0, 0, true);
	fx_prefill(f, 1, 0, false);
	fx_prefill(f, 1, 1, false);
	{
		const int ab[2] = {0, 1}, a[1] = {0};

		for (int i = 0; i < 4; i++)
			fx_decode(f, 0, ab, 2);
		fx_decode(f, 0, a, 1);
	}
	assert_int_equal(f->ntok[0][0], 45);
	assert_int_equal(f->ntok[1][0], 24);
	assert_int_equal(f->ntok[1][1], 20);
	fx_snapshot_positions(f);
	/* Sanity of the fixture itself: sink 8 + top-K 16 + ring 16; Case 1 keeps everything. */
	assert_int_equal(f->npos[0][0][0], 40);
	assert_int_equal(f->npos[1][0][1], 24);
	assert_int_equal(f->npos[1][1][0], 20);
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	kvt_manager_destroy(f->m);
	free(f);
	return 0;
}

/* Runs a call expected to fail on the fixture's manager: right code, a detail in last_error
   (cleared beforehand, so a stale message from an earlier failure does not count), stats
   byte-identical, sequences unchanged. */
#define EXPECT_FAIL(f, call, code)                                                  \
	do {                                                                        \
		struct kvt_stats before_ = t_stats_of((f)->m), after_;              \
		int rc_;                                                            \
		(f)->m->err[0] = '\0';                                              \
		rc_ = (call);                                                       \
		assert_int_equal(rc_, (code));                                      \
		assert_non_null(kvt_manager_last_error((f)->m));                    \
		if (kvt_manager_last_error((f)->m)[0] == '\0')                      \
			fail_msg("%s: no detail in kvt_manager_last_error", #call); \
		after_ = t_stats_of((f)->m);                                        \
		assert_memory_equal(&before_, &after_, sizeof(before_));            \
		CHECK_STATE(f);                                                     \
	} while (0)

/* A call on a const manager (config, stats): cannot record a detail, must change nothing. */
#define EXPECT_FAIL_CONST(f, call, code)                                 \
	do {                                                             \
		struct kvt_stats before_ = t_stats_of((f)->m), after_;   \
		assert_int_equal((call), (code));                        \
		after_ = t_stats_of((f)->m);                             \
		assert_memory_equal(&before_, &after_, sizeof(before_)); \
		CHECK_STATE(f);                                          \
	} while (0)

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

static void test_create_null_args(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m = SENTINEL;

	(void)state;
	assert_int_equal(t_manager_create(NULL, &m), -EINVAL);
	assert_ptr_equal(m, SENTINEL);
	assert_int_equal(t_manager_create(&c, NULL), -EINVAL);
	assert_int_equal(t_manager_create(NULL, NULL), -EINVAL);
}

static void test_create_size_version(void **state)
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

static void test_create_geometry(void **state)
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

static void test_create_snapstream(void **state)
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

static void test_create_budgets(void **state)
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

static void test_create_threads_staging(void **state)
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

static void test_create_backends(void **state)
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
static void test_create_older_caller(void **state)
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

/* ---- manager-level calls ---------------------------------------------------------------- */

static void test_destroy_null(void **state)
{
	(void)state;
	kvt_manager_destroy(NULL);
	kvt_manager_destroy(NULL);
}

static void test_strerror(void **state)
{
	static const int codes[] = {EINVAL,    ENOENT, EEXIST,	ENOSPC, ENOMEM,
				    EOVERFLOW, ENODEV, ENOTSUP, EIO,	EAGAIN};
	const char *unknown = kvt_strerror(12345);

	(void)state;
	assert_non_null(unknown);
	assert_true(strlen(unknown) > 0);
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		const char *neg = kvt_strerror(-codes[i]), *pos = kvt_strerror(codes[i]);

		assert_non_null(neg);
		assert_non_null(pos);
		assert_true(strlen(neg) > 0);
		/* Sign does not matter; every code the API returns has its own text. */
		assert_string_equal(neg, pos);
		assert_string_not_equal(neg, unknown);
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(neg, kvt_strerror(-codes[j]));
	}
	/* Unknown and extreme codes: some text, never NULL. */
	const int odd[] = {-12345, 12345, 0, 1 << 20, -(1 << 20), INT_MAX, INT_MIN, INT_MIN + 1};

	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		const char *s = kvt_strerror(odd[i]);

		assert_non_null(s);
		assert_true(strlen(s) > 0);
	}
	assert_string_equal(kvt_strerror(-12345), unknown);
	assert_string_equal(kvt_strerror(INT_MAX), unknown);
	assert_string_equal(kvt_strerror(INT_MIN), unknown);
}

static void test_last_error(void **state)
{
	struct fx *f = *state;
	const char *e = kvt_manager_last_error(NULL);

	assert_non_null(e);
	assert_true(strlen(e) > 0);
	/* The fixture ran only successful calls: no detail yet (checked in setup), and
	   successful calls after a failure keep the detail until the next failure. */
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, SEQ_NONE), -ENOENT);
	char saved[256];

	snprintf(saved, sizeof(saved), "%s", kvt_manager_last_error(f->m));
	assert_true(strlen(saved) > 0);
	uint32_t n;

	assert_int_equal(kvt_seq_tokens(f->m, SEQ_A, 0, &n), 0);
	assert_string_equal(kvt_manager_last_error(f->m), saved);
}

static void test_version_and_log(void **state)
{
	char want[32];

	(void)state;
	snprintf(want, sizeof(want), "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
		 KVT_VERSION_PATCH);
	assert_non_null(kvt_version());
	assert_string_equal(kvt_version(), want);
	/* No error paths: NULL resets to stderr, any level is accepted. */
	kvt_log_set(NULL, NULL);
	kvt_log_set_level(KVT_LOG_ERROR);
	kvt_log_set(capture_log, NULL);
	kvt_log_set_level(KVT_LOG_WARN);
}

static void test_config_errors(void **state)
{
	struct fx *f = *state;
	struct kvt_config out, keep;

	memset(&out, 0x3c, sizeof(out));
	keep = out;
	assert_int_equal(kvt_manager_config(NULL, &out), -EINVAL);
	assert_memory_equal(&out, &keep, sizeof(out));
	EXPECT_FAIL_CONST(f, kvt_manager_config(f->m, NULL), -EINVAL);
	assert_int_equal(kvt_manager_config(f->m, &out), 0);
	assert_int_equal(out.n_layers, 2);
	assert_int_equal(out.backend, t_be->kind);
}

static void test_stats_errors(void **state)
{
	struct fx *f = *state;
	const size_t full = sizeof(struct kvt_stats);
	uint8_t buf[sizeof(struct kvt_stats) + 64];
	struct kvt_stats ref = t_stats_of(f->m);

	assert_int_equal(kvt_manager_stats(NULL, &ref), -EINVAL);
	EXPECT_FAIL_CONST(f, kvt_manager_stats(f->m, NULL), -EINVAL);

	/* .size smaller than the two header fields: -EINVAL, nothing written. */
	const uint32_t too_small[] = {0, 1, 4, 7};

	for (size_t i = 0; i < sizeof(too_small) / sizeof(too_small[0]); i++) {
		memset(buf, 0xab, sizeof(buf));
		memcpy(buf, &too_small[i], sizeof(uint32_t));
		EXPECT_FAIL_CONST(f, kvt_manager_stats(f->m, (struct kvt_stats *)(void *)buf),
				  -EINVAL);
		assert_memory_equal(buf, &too_small[i], sizeof(uint32_t));
		for (size_t b = 4; b < sizeof(buf); b++)
			assert_int_equal(buf[b], 0xab);
	}
	/* A size covering part of the struct: exactly that many bytes written, matching the
	   full struct; the rest untouched. Larger than the struct: the struct, no more. (Only
	   kvt_manager_stats runs from here on, so the counters stay as in ref.) */
	ref = t_stats_of(f->m);
	const uint32_t sizes[] = {8,
				  12,
				  16,
				  (uint32_t)offsetof(struct kvt_stats, bytes_h2d),
				  (uint32_t)offsetof(struct kvt_stats, live_seqs),
				  (uint32_t)full - 4,
				  (uint32_t)full,
				  (uint32_t)full + 64};

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint32_t sz = sizes[i], written = sz < full ? sz : (uint32_t)full;

		memset(buf, 0xab, sizeof(buf));
		memcpy(buf, &sz, sizeof(sz));
		assert_int_equal(kvt_manager_stats(f->m, (struct kvt_stats *)(void *)buf), 0);
		/* Header: size says what was written, version is current. */
		uint32_t hdr[2];

		memcpy(hdr, buf, sizeof(hdr));
		assert_int_equal(hdr[0], written);
		assert_int_equal(hdr[1], KVT_STATS_VERSION);
		assert_memory_equal(buf + 8, (const uint8_t *)&ref + 8, written - 8);
		for (size_t b = written; b < sizeof(buf); b++)
			if (buf[b] != 0xab)
				fail_msg("stats with size %u wrote byte %zu", sz, b);
	}
	CHECK_STATE(f);
}

static void test_sync_errors(void **state)
{
	struct fx *f = *state;

	assert_int_equal(kvt_manager_sync(NULL, NULL), -EINVAL);
	assert_int_equal(kvt_manager_sync(f->m, NULL), 0);
	CHECK_STATE(f);
}

/* ---- sequences -------------------------------------------------------------------------- */

static void test_seq_create_errors(void **state)
{
	struct fx *f = *state;

	assert_int_equal(kvt_seq_create(NULL, 7, 10), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 7, 0), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 7, (uint32_t)INT32_MAX + 1), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 7, UINT32_MAX), -EINVAL);
	/* Live ids, whatever their state; a different prompt length changes nothing. */
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_A, 40), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_A, 100), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_B, 1), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_C, 30), -EEXIST);
	/* Edges accepted: 1 and INT32_MAX tokens (no tier memory until prefill); ids 0 and
	   UINT64_MAX are ordinary ids. */
	struct kvt_stats st0 = t_stats_of(f->m), st1;

	assert_int_equal(kvt_seq_create(f->m, 7, INT32_MAX), 0);
	assert_int_equal(kvt_seq_create(f->m, 0, 1), 0);
	assert_int_equal(kvt_seq_create(f->m, UINT64_MAX, 1), 0);
	st1 = t_stats_of(f->m);
	assert_int_equal(st1.live_seqs, st0.live_seqs + 3);
	assert_int_equal(st1.device_frames_used, st0.device_frames_used);
	assert_int_equal(st1.host_blocks_used, st0.host_blocks_used);
	EXPECT_FAIL(f, kvt_seq_create(f->m, UINT64_MAX, 5), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 0, 5), -EEXIST);
	assert_int_equal(kvt_seq_destroy(f->m, 7), 0);
	assert_int_equal(kvt_seq_destroy(f->m, 0), 0);
	assert_int_equal(kvt_seq_destroy(f->m, UINT64_MAX), 0);
	st1 = t_stats_of(f->m);
	assert_int_equal(st1.live_seqs, st0.live_seqs);
	CHECK_STATE(f);
}

static void test_seq_destroy_errors(void **state)
{
	struct fx *f = *state;

	assert_int_equal(kvt_seq_destroy(NULL, SEQ_A), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, SEQ_NONE), -ENOENT);
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, 0), -ENOENT);
	assert_int_equal(kvt_seq_create(f->m, 77, 12), 0);
	assert_int_equal(kvt_seq_destroy(f->m, 77), 0);
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, 77), -ENOENT);
}

/* ---- prefill ---------------------------------------------------------------------------- */

struct tensors {
	void *k, *v, *q;
};

static struct tensors make_prefill(const struct fx *f, uint64_t seq, uint32_t layer, uint32_t L)
{
	size_t kv = (size_t)f->c.n_kv_heads * L * f->row;
	size_t qb = (size_t)f->c.n_q_heads * (f->c.obs_window ? f->c.obs_window : 1) * f->row;
	struct tensors t = {malloc(kv), malloc(kv), malloc(qb)};

	assert_true(t.k && t.v && t.q);
	t_fill_prefill(&f->c, seq, layer, L, t.k, t.v, f->c.obs_window ? t.q : NULL);
	return t;
}

static void free_tensors(struct tensors *t)
{
	free(t->k);
	free(t->v);
	free(t->q);
}

static void test_prefill_errors(void **state)
{
	struct fx *f = *state;
	struct tensors a1 = make_prefill(f, SEQ_A, 1, 40), a0 = make_prefill(f, SEQ_A, 0, 40);
	struct tensors c0 = make_prefill(f, SEQ_C, 0, 30);

	assert_int_equal(t_prefill_layer(NULL, SEQ_A, 1, a1.k, a1.v, a1.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_NONE, 0, c0.k, c0.v, c0.q, NULL), -ENOENT);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_C, 2, c0.k, c0.v, c0.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_C, UINT32_MAX, c0.k, c0.v, c0.q, NULL), -EINVAL);
	/* Second prefill of a layer, with perfectly good tensors. */
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 0, a0.k, a0.v, a0.q, NULL), -EEXIST);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_B, 1, a0.k, a0.v, NULL, NULL), -EEXIST);
	/* NULL tensors. */
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, NULL, a1.v, a1.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, a1.k, NULL, a1.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, NULL, NULL, NULL, NULL), -EINVAL);
	/* A's prompt (40 > sink 8 + recent 16) needs the observation queries. */
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, a1.k, a1.v, NULL, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_C, 0, c0.k, c0.v, NULL, NULL), -EINVAL);

	/* After all that, the same layers prefill normally and read back exactly. */
	assert_int_equal(t_prefill_layer(f->m, SEQ_A, 1, a1.k, a1.v, a1.q, NULL), 0);
	f->ntok[0][1] = 40;
	assert_int_equal(t_prefill_layer(f->m, SEQ_C, 0, c0.k, c0.v, c0.q, NULL), 0);
	f->ntok[2][0] = 30;
	fx_snapshot_positions(f);
	assert_int_equal(f->npos[0][1][0], 40);		/* 8 sink + 16 top-K + 16 ring */
	assert_int_equal(f->npos[2][0][1], 8 + 6 + 16); /* candidates [8, 14) */
	CHECK_STATE(f);
	free_tensors(&a1);
	free_tensors(&a0);
	free_tensors(&c0);
}

/* q_obs may be NULL exactly when no selection happens. */
static void test_prefill_q_obs_optional(void **state)
{
	struct fx *f = *state;
	/* Case 1: prompt <= sink + recent (24); also a prompt shorter than the sink, and one
	   no longer than the observation window. */
	const uint32_t no_sel[] = {24, 23, 9, 8, 5, 4, 1};

	for (size_t i = 0; i < sizeof(no_sel) / sizeof(no_sel[0]); i++) {
		uint32_t L = no_sel[i], n;
		uint64_t id = 500 + i;
		struct tensors t = make_prefill(f, id, 0, L);
		int32_t pos[MAX_POS];
		uint8_t k[64], v[64], ek[64], ev[64];

		assert_int_equal(kvt_seq_create(f->m, id, L), 0);
		assert_int_equal(t_prefill_layer(f->m, id, 0, t.k, t.v, NULL, NULL), 0);
		/* Every prompt token is resident. */
		assert_int_equal(kvt_seq_resident_positions(f->m, id, 0, 1, pos, MAX_POS, &n), 0);
		assert_int_equal(n, L);
		for (uint32_t p = 0; p < L; p++) {
			assert_int_equal(pos[p], (int32_t)p);
			assert_int_equal(kvt_seq_read_token(f->m, id, 0, 1, p, k, v), 0);
			t_fill_row(f->c.dtype, f->c.head_dim, ek, id, 0, 1, p, 0);
			t_fill_row(f->c.dtype, f->c.head_dim, ev, id, 0, 1, p, 1);
			assert_memory_equal(k, ek, f->row);
			assert_memory_equal(v, ev, f->row);
		}
		assert_int_equal(kvt_seq_destroy(f->m, id), 0);
		free_tensors(&t);
	}
	/* One token past Case 1 selects one token: q_obs is required. */
	{
		struct tensors t = make_prefill(f, 600, 0, 25);

		assert_int_equal(kvt_seq_create(f->m, 600, 25), 0);
		EXPECT_FAIL(f, t_prefill_layer(f->m, 600, 0, t.k, t.v, NULL, NULL), -EINVAL);
		uint32_t n;

		assert_int_equal(kvt_seq_tokens(f->m, 600, 0, &n), 0);
		assert_int_equal(n, 0);
		assert_int_equal(t_prefill_layer(f->m, 600, 0, t.k, t.v, t.q, NULL), 0);
		assert_int_equal(kvt_seq_destroy(f->m, 600), 0);
		free_tensors(&t);
	}
	/* Without top-K there is never a selection. */
	{
		struct kvt_config c = t_small_config();
		struct kvt_manager *m;
		struct fx g = *f;
		uint32_t n;

		c.topk_tokens = 0;
		c.obs_window = 0;
		g.c = c;
		struct tensors t = make_prefill(&g, 1, 0, 100);

		assert_int_equal(t_manager_create(&c, &m), 0);
		assert_int_equal(kvt_seq_create(m, 1, 100), 0);
		assert_int_equal(t_prefill_layer(m, 1, 0, t.k, t.v, NULL, NULL), 0);
		assert_int_equal(kvt_seq_resident_positions(m, 1, 0, 0, NULL, 0, &n), -ENOSPC);
		assert_int_equal(n, 8 + 16);
		kvt_manager_destroy(m);
		free_tensors(&t);
	}
}

/* A tier that cannot hold the layer: -ENOMEM and nothing allocated, in either tier. */
static void test_prefill_tier_full(void **state)
{
	(void)state;
	for (int which = 0; which < 2; which++) {
		struct fx g = {0};
		struct kvt_manager *m;
		struct kvt_stats s0, s1;

		g.c = t_small_config();
		g.row = (size_t)g.c.head_dim * 2;
		/* Prompt 40: 5 frame groups (sink + recent + top-K = 40 slots) and 5 host groups
		   per layer. The short tier holds one layer and a bit. */
		if (which == 0)
			g.c.device_bytes = 7 * 1024;
		else
			g.c.host_bytes = 7 * 1024;
		struct tensors t1 = make_prefill(&g, 1, 0, 40), t2 = make_prefill(&g, 2, 0, 40);

		assert_int_equal(t_manager_create(&g.c, &m), 0);
		assert_int_equal(kvt_seq_create(m, 1, 40), 0);
		assert_int_equal(kvt_seq_create(m, 2, 40), 0);
		assert_int_equal(t_prefill_layer(m, 1, 0, t1.k, t1.v, t1.q, NULL), 0);
		s0 = t_stats_of(m);
		m->err[0] = '\0';
		assert_int_equal(t_prefill_layer(m, 2, 0, t2.k, t2.v, t2.q, NULL), -ENOMEM);
		assert_true(strlen(kvt_manager_last_error(m)) > 0);
		s1 = t_stats_of(m);
		assert_memory_equal(&s0, &s1, sizeof(s0));
		uint32_t n = 1;

		assert_int_equal(kvt_seq_tokens(m, 2, 0, &n), 0);
		assert_int_equal(n, 0);
		/* Room made: the very same call now succeeds, and both groups of memory it
		   took come back on destroy. */
		assert_int_equal(kvt_seq_destroy(m, 1), 0);
		assert_int_equal(t_prefill_layer(m, 2, 0, t2.k, t2.v, t2.q, NULL), 0);
		s1 = t_stats_of(m);
		assert_int_equal(s1.device_frames_used, 5 * 2);
		assert_int_equal(s1.host_blocks_used, 5 * 2);
		uint8_t k[32], v[32], ek[32];

		assert_int_equal(kvt_seq_read_token(m, 2, 0, 1, 39, k, v), 0);
		t_fill_row(g.c.dtype, g.c.head_dim, ek, 2, 0, 1, 39, 0);
		assert_memory_equal(k, ek, 32);
		assert_int_equal(kvt_seq_destroy(m, 2), 0);
		s1 = t_stats_of(m);
		assert_int_equal(s1.device_frames_used, 0);
		assert_int_equal(s1.host_blocks_used, 0);
		kvt_manager_destroy(m);
		free_tensors(&t1);
		free_tensors(&t2);
	}
}

/* ---- decode ----------------------------------------------------------------------------- */

/* Decode tensors for ids with junk contents (so a call that wrongly writes anything shows up
   in the read-back). */
static void junk_decode(const struct fx *f, uint32_t n, void **k, void **v)
{
	size_t bytes = (size_t)n * f->c.n_kv_heads * f->row;

	*k = malloc(bytes);
	*v = malloc(bytes);
	assert_true(*k && *v);
	memset(*k, 0x7b, bytes);
	memset(*v, 0x3d, bytes);
}

static void test_decode_errors(void **state)
{
	struct fx *f = *state;
	const uint64_t a[1] = {SEQ_A}, ab[2] = {SEQ_A, SEQ_B};
	void *k, *v;

	junk_decode(f, 3, &k, &v);
	assert_int_equal(t_decode_append(NULL, 0, a, 1, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, NULL, 1, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, a, 1, NULL, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, a, 1, k, NULL, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, a, 0, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, ab, 0, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 2, a, 1, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, UINT32_MAX, ab, 2, k, v, NULL), -EINVAL);
	{
		const uint64_t none[1] = {SEQ_NONE};

		EXPECT_FAIL(f, t_decode_append(f->m, 0, none, 1, k, v, NULL), -ENOENT);
	}
	/* Decode before prefill: C has no layer at all, A has no layer 1. */
	{
		const uint64_t c[1] = {SEQ_C};

		EXPECT_FAIL(f, t_decode_append(f->m, 0, c, 1, k, v, NULL), -EINVAL);
		EXPECT_FAIL(f, t_decode_append(f->m, 1, a, 1, k, v, NULL), -EINVAL);
	}
	/* A repeated id. */
	{
		const uint64_t aa[2] = {SEQ_A, SEQ_A}, aba[3] = {SEQ_A, SEQ_B, SEQ_A};

		EXPECT_FAIL(f, t_decode_append(f->m, 0, aa, 2, k, v, NULL), -EINVAL);
		EXPECT_FAIL(f, t_decode_append(f->m, 0, aba, 3, k, v, NULL), -EINVAL);
	}
	free(k);
	free(v);
	DECODE_ROUNDS(f, 20);
}

/* All or nothing: only the last id of the batch is bad; the earlier ones (B sits at a block
   boundary, so it needs a new host block) must not have moved at all. Then the same earlier
   ids decode normally, at the positions they had. */
static void test_decode_last_bad(void **state)
{
	struct fx *f = *state;
	void *k, *v;
	struct {
		uint64_t ids[3];
		int code;
	} cases[] = {
		{{SEQ_A, SEQ_B, SEQ_NONE}, -ENOENT},
		{{SEQ_A, SEQ_B, SEQ_C}, -EINVAL}, /* C not prefilled */
		{{SEQ_A, SEQ_B, SEQ_B}, -EINVAL}, /* repeat, last */
		{{SEQ_B, SEQ_A, SEQ_B}, -EINVAL}, /* repeat of the first */
		{{SEQ_B, SEQ_A, SEQ_A}, -EINVAL},
	};

	junk_decode(f, 3, &k, &v);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		EXPECT_FAIL(f, t_decode_append(f->m, 0, cases[i].ids, 3, k, v, NULL),
			    cases[i].code);
	/* Layer 1: B is prefilled there, A is not (last). */
	{
		const uint64_t ba[2] = {SEQ_B, SEQ_A};

		EXPECT_FAIL(f, t_decode_append(f->m, 1, ba, 2, k, v, NULL), -EINVAL);
	}
	free(k);
	free(v);
	/* The same batch heads decode for real now: tokens land at 45 (A) and 24 (B). */
	const int ab[2] = {0, 1};

	fx_decode(f, 0, ab, 2);
	assert_int_equal(f->ntok[0][0], 46);
	assert_int_equal(f->ntok[1][0], 25);
	fx_snapshot_positions(f);
	CHECK_STATE(f);
	DECODE_ROUNDS(f, 20);
}

/* -EOVERFLOW at INT32_MAX tokens (reached here by setting the count directly: 2^31 real
   appends are out of reach), as the last sequence of a batch. */
static void test_decode_overflow(void **state)
{
	struct fx *f = *state;
	struct kvt_seq *s = kvt_seqmap_get(&f->m->seqs, SEQ_B);
	const uint64_t ab[2] = {SEQ_A, SEQ_B};
	uint32_t saved;
	void *k, *v;

	assert_non_null(s);
	saved = s->layers[0].n_tokens;
	s->layers[0].n_tokens = INT32_MAX;
	junk_decode(f, 2, &k, &v);
	{
		struct kvt_stats before = t_stats_of(f->m), after;
		uint32_t n;

		f->m->err[0] = '\0';
		assert_int_equal(t_decode_append(f->m, 0, ab, 2, k, v, NULL), -EOVERFLOW);
		assert_true(strlen(kvt_manager_last_error(f->m)) > 0);
		after = t_stats_of(f->m);
		assert_memory_equal(&before, &after, sizeof(before));
		assert_int_equal(kvt_seq_tokens(f->m, SEQ_B, 0, &n), 0);
		assert_int_equal(n, INT32_MAX);
	}
	s->layers[0].n_tokens = saved;
	CHECK_STATE(f);
	free(k);
	free(v);
	DECODE_ROUNDS(f, 20);
}

/* Host tier full at the last sequence: -ENOMEM, and the groups counted for the earlier ones
   are not taken. */
static void test_decode_host_full(void **state)
{
	struct fx g = {0};
	struct kvt_manager *m;
	struct kvt_stats s0, s1;
	const uint64_t ids[3] = {1, 2, 3};
	void *k, *v;

	(void)state;
	g.c = t_small_config();
	g.row = (size_t)g.c.head_dim * 2;
	/* Three sequences of 8 tokens (1 host group each, full), 4 groups in the tier: the
	   next token of each needs a group, only one is left. */
	g.c.host_bytes = 4 * 1024;
	assert_int_equal(t_manager_create(&g.c, &m), 0);
	for (uint64_t i = 1; i <= 3; i++) {
		struct tensors t = make_prefill(&g, i, 0, 8);

		assert_int_equal(kvt_seq_create(m, i, 8), 0);
		assert_int_equal(t_prefill_layer(m, i, 0, t.k, t.v, NULL, NULL), 0);
		free_tensors(&t);
	}
	junk_decode(&g, 3, &k, &v);
	s0 = t_stats_of(m);
	assert_int_equal(s0.host_blocks_free, 1 * 2);
	m->err[0] = '\0';
	assert_int_equal(t_decode_append(m, 0, ids, 3, k, v, NULL), -ENOMEM);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	m->err[0] = '\0';
	assert_int_equal(t_decode_append(m, 0, ids, 2, k, v, NULL), -ENOMEM);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	s1 = t_stats_of(m);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	for (uint64_t i = 1; i <= 3; i++) {
		uint32_t n;
		uint8_t rk[32], rv[32], ek[32];

		assert_int_equal(kvt_seq_tokens(m, i, 0, &n), 0);
		assert_int_equal(n, 8);
		for (uint32_t p = 0; p < 8; p++) {
			assert_int_equal(kvt_seq_read_token(m, i, 0, 0, p, rk, rv), 0);
			t_fill_row(g.c.dtype, g.c.head_dim, ek, i, 0, 0, p, 0);
			assert_memory_equal(rk, ek, 32);
		}
	}
	/* One sequence fits. */
	{
		uint32_t p8 = 8;

		t_fill_decode(&g.c, &ids[2], &p8, 1, 0, k, v);
		assert_int_equal(t_decode_append(m, 0, &ids[2], 1, k, v, NULL), 0);
		s1 = t_stats_of(m);
		assert_int_equal(s1.host_blocks_free, 0);
	}
	kvt_manager_destroy(m);
	free(k);
	free(v);
}

/* ---- reads ------------------------------------------------------------------------------ */

static void test_resident_errors(void **state)
{
	struct fx *f = *state;
	int32_t out[MAX_POS];
	uint32_t n;

	for (int i = 0; i < MAX_POS; i++)
		out[i] = -7;
	n = 12345;
	assert_int_equal(kvt_seq_resident_positions(NULL, SEQ_A, 0, 0, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 0, out, MAX_POS, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 0, NULL, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_NONE, 0, 0, out, MAX_POS, &n), -ENOENT);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 2, 0, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 2, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, UINT32_MAX, out, MAX_POS, &n),
		    -EINVAL);
	/* Layer not prefilled. */
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 1, 0, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_C, 0, 0, out, MAX_POS, &n), -EINVAL);
	for (int i = 0; i < MAX_POS; i++)
		assert_int_equal(out[i], -7);
	assert_int_equal(n, 12345);
	/* Short output: -ENOSPC, the count reported, nothing written. */
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 1, out, 39, &n), -ENOSPC);
	assert_int_equal(n, 40);
	for (int i = 0; i < MAX_POS; i++)
		assert_int_equal(out[i], -7);
	n = 0;
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_B, 0, 0, NULL, 0, &n), -ENOSPC);
	assert_int_equal(n, 24);
	/* Exactly enough room. */
	assert_int_equal(kvt_seq_resident_positions(f->m, SEQ_A, 0, 1, out, 40, &n), 0);
	assert_int_equal(n, 40);
	assert_memory_equal(out, f->pos[0][0][1], 40 * sizeof(out[0]));
	assert_int_equal(out[40], -7);
}

static void test_read_token_errors(void **state)
{
	struct fx *f = *state;
	uint8_t k[64], v[64];

	memset(k, 0x11, sizeof(k));
	memset(v, 0x22, sizeof(v));
	assert_int_equal(kvt_seq_read_token(NULL, SEQ_A, 0, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 0, 0, NULL, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 0, 0, k, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_NONE, 0, 0, 0, k, v), -ENOENT);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 2, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, UINT32_MAX, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 2, 0, k, v), -EINVAL);
	/* pos >= tokens of that layer (A layer 0 has 45, B layer 1 has 20). */
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 0, 45, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 1, UINT32_MAX, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_B, 1, 0, 20, k, v), -EINVAL);
	/* Layer not prefilled: no tokens at all. */
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 1, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_C, 0, 0, 0, k, v), -EINVAL);
	for (size_t i = 0; i < sizeof(k); i++) {
		assert_int_equal(k[i], 0x11);
		assert_int_equal(v[i], 0x22);
	}
	/* The internal host-history read has the same checks. */
	EXPECT_FAIL(f, kvt_seq_read_token_host(f->m, SEQ_A, 0, 0, 45, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token_host(f->m, SEQ_NONE, 0, 0, 0, k, v), -ENOENT);
	/* The last valid position reads. */
	assert_int_equal(kvt_seq_read_token(f->m, SEQ_A, 0, 0, 44, k, v), 0);
}

static void test_tokens_errors(void **state)
{
	struct fx *f = *state;
	uint32_t n = 777;

	assert_int_equal(kvt_seq_tokens(NULL, SEQ_A, 0, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_A, 0, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_A, 2, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_A, UINT32_MAX, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_NONE, 0, &n), -ENOENT);
	assert_int_equal(n, 777);
	/* Not prefilled is not an error: 0 tokens. */
	assert_int_equal(kvt_seq_tokens(f->m, SEQ_C, 1, &n), 0);
	assert_int_equal(n, 0);
}

static void test_attend_errors(void **state)
{
	struct fx *f = *state;
	float q[4 * 16], out[4 * 16];

	for (int i = 0; i < 64; i++) {
		q[i] = (float)(i % 7) / 8.0f;
		out[i] = -3.5f;
	}
	assert_int_equal(kvt_attend(NULL, SEQ_A, 0, q, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 0, NULL, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 0, q, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_NONE, 0, q, out), -ENOENT);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 2, q, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, UINT32_MAX, q, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 1, q, out), -EINVAL); /* not prefilled */
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_C, 0, q, out), -EINVAL);
	for (int i = 0; i < 64; i++)
		assert_true(out[i] == -3.5f);
	/* And it works on the same sequence once the arguments are right. */
	assert_int_equal(kvt_attend(f->m, SEQ_A, 0, q, out), 0);
	for (int i = 0; i < 64; i++)
		assert_true(out[i] >= -1.0f && out[i] <= 1.0f);
}

/* NULL manager everywhere: -EINVAL (or nothing, for the void and const-char calls). */
static void test_null_manager(void **state)
{
	struct kvt_config c;
	struct kvt_stats st = KVT_STATS_INIT;
	uint64_t id = 1;
	uint8_t buf[64];
	uint32_t n;
	int32_t pos[4];
	float q[64], out[64];

	(void)state;
	memset(q, 0, sizeof(q));
	kvt_manager_destroy(NULL);
	assert_non_null(kvt_manager_last_error(NULL));
	assert_int_equal(kvt_manager_config(NULL, &c), -EINVAL);
	assert_int_equal(kvt_manager_stats(NULL, &st), -EINVAL);
	assert_int_equal(kvt_manager_sync(NULL, NULL), -EINVAL);
	assert_int_equal(kvt_seq_create(NULL, 1, 1), -EINVAL);
	assert_int_equal(kvt_seq_destroy(NULL, 1), -EINVAL);
	assert_int_equal(t_prefill_layer(NULL, 1, 0, buf, buf, buf, NULL), -EINVAL);
	assert_int_equal(t_decode_append(NULL, 0, &id, 1, buf, buf, NULL), -EINVAL);
	assert_int_equal(kvt_seq_resident_positions(NULL, 1, 0, 0, pos, 4, &n), -EINVAL);
	assert_int_equal(kvt_seq_read_token(NULL, 1, 0, 0, 0, buf, buf), -EINVAL);
	assert_int_equal(kvt_seq_tokens(NULL, 1, 0, &n), -EINVAL);
	assert_int_equal(kvt_attend(NULL, 1, 0, q, out), -EINVAL);
	/* Every pointer NULL at once. */
	assert_int_equal(kvt_manager_config(NULL, NULL), -EINVAL);
	assert_int_equal(kvt_manager_stats(NULL, NULL), -EINVAL);
	assert_int_equal(t_prefill_layer(NULL, 1, 0, NULL, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(t_decode_append(NULL, 0, NULL, 0, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(kvt_seq_resident_positions(NULL, 1, 0, 0, NULL, 0, NULL), -EINVAL);
	assert_int_equal(kvt_seq_read_token(NULL, 1, 0, 0, 0, NULL, NULL), -EINVAL);
	assert_int_equal(kvt_seq_tokens(NULL, 1, 0, NULL), -EINVAL);
	assert_int_equal(kvt_attend(NULL, 1, 0, NULL, NULL), -EINVAL);
}

static int group_setup(void **state)
{
	(void)state;
	kvt_log_set(capture_log, NULL);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	kvt_log_set(NULL, NULL);
	return 0;
}

#define FX(t) cmocka_unit_test_setup_teardown(t, fx_setup, fx_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_null_args),
		cmocka_unit_test(test_create_size_version),
		cmocka_unit_test(test_create_geometry),
		cmocka_unit_test(test_create_snapstream),
		cmocka_unit_test(test_create_budgets),
		cmocka_unit_test(test_create_threads_staging),
		cmocka_unit_test(test_create_backends),
		cmocka_unit_test(test_create_older_caller),
		cmocka_unit_test(test_destroy_null),
		cmocka_unit_test(test_strerror),
		cmocka_unit_test(test_version_and_log),
		cmocka_unit_test(test_null_manager),
		FX(test_last_error),
		FX(test_config_errors),
		FX(test_stats_errors),
		FX(test_sync_errors),
		FX(test_seq_create_errors),
		FX(test_seq_destroy_errors),
		FX(test_prefill_errors),
		FX(test_prefill_q_obs_optional),
		cmocka_unit_test(test_prefill_tier_full),
		FX(test_decode_errors),
		FX(test_decode_last_bad),
		FX(test_decode_overflow),
		cmocka_unit_test(test_decode_host_full),
		FX(test_resident_errors),
		FX(test_read_token_errors),
		FX(test_tokens_errors),
		FX(test_attend_errors),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
