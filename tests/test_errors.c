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
 * the host history) exactly as it was written. Token data come from the test library's
 * generator (lib/t_data.h), so the expected bytes are regenerated rather than stored.
 *
 * The fixture holds three sequences: A (prompt 40: top-K selection happens; layer 0 prefilled
 * and decoded to 45 tokens, layer 1 not prefilled), B (prompt 20: SnapStream Case 1; both
 * layers prefilled, layer 0 decoded to 24 tokens so its next token starts a new host block) and
 * C (prompt 30, nothing prefilled).
 */
#include "test_errors.h"

/* ---- log capture: keeps the expected warnings off stderr and checks their prefix -------- */

static unsigned log_count;

void capture_log(void *user, enum kvt_log_level level, const char *msg)
{
	(void)user;
	(void)level;
	assert_non_null(msg);
	assert_int_equal(strncmp(msg, "kvtier: ", 8), 0);
	log_count++;
}

/* ---- fixture ---------------------------------------------------------------------------- */

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
void fx_decode(struct fx *f, uint32_t layer, const int *which, uint32_t n)
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
void fx_decode_rounds(struct fx *f, int rounds, const char *file, int line)
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

/* Records the resident positions of every prefilled (sequence, layer, head). */
void fx_snapshot_positions(struct fx *f)
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
void fx_check_state(struct fx *f, const char *file, int line)
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

int fx_setup(void **state)
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

int fx_teardown(void **state)
{
	struct fx *f = *state;

	kvt_manager_destroy(f->m);
	free(f);
	return 0;
}

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
		cmocka_unit_test(test_log_set_from_callback),
		cmocka_unit_test(test_log_callback_blocks_no_other),
		cmocka_unit_test(test_log_set_waits_for_callbacks),
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
