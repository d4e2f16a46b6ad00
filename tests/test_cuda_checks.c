/* SPDX-License-Identifier: MIT */
/*
 * cuda: the checks of a pair of managers (CUDA and host) on the same inputs: SnapKV's selection,
 * resident sets, tokens, frames, recall views, attention.
 */
#include "test_cuda.h"

/* ---- checks ---------------------------------------------------------------------------------- */

static uint32_t positions_at(struct pair *p, struct kvt_manager *m, const struct tseq *t,
			     uint32_t layer, uint32_t h, int32_t *out, const char *file, int line)
{
	uint32_t n = 0;
	int rc = kvt_seq_resident_positions(m, t->id, layer, h, out, POS_CAP, &n);

	if (rc)
		fail_at(file, line,
			"%s: kvt_seq_resident_positions(seq %llu, layer %u, head %u) = %d (%s): %s",
			side(p, m), ULL(t->id), layer, h, rc, kvt_strerror(rc),
			kvt_manager_last_error(m));
	return n;
}

static void resident_map(const int32_t *pos, uint32_t n, bool *map, uint32_t N)
{
	memset(map, 0, N);
	for (uint32_t i = 0; i < n; i++)
		if (pos[i] >= 0 && (uint32_t)pos[i] < N)
			map[pos[i]] = true;
}

/* Which position each valid slot holds (docs/design.md: sink slots, the ring by the ring rule, then
   the top-K after the ring), from the resident positions of a layer of N tokens. */
static void slot_map_at(const int32_t *pos, uint32_t n_pos, uint32_t N, uint32_t n_slots,
			int32_t *slot_pos, const char *what, const char *file, int line)
{
	uint32_t r0 = ring0_of(N), ti = 0;

	for (uint32_t s = 0; s < n_slots; s++)
		slot_pos[s] = -1;
	for (uint32_t i = 0; i < n_pos; i++) {
		uint32_t q = (uint32_t)pos[i];
		uint32_t s = q < SINK  ? q
			     : q >= r0 ? kvt_ring_slot(q, SINK, RECENT)
				       : SINK + RECENT + ti++;

		if (s >= n_slots || slot_pos[s] >= 0)
			fail_at(file, line,
				"%s: resident position %u maps to slot %u: beyond the %u valid slots "
				"or taken twice",
				what, q, s, n_slots);
		slot_pos[s] = (int32_t)q;
	}
	for (uint32_t s = 0; s < n_slots; s++)
		if (slot_pos[s] < 0)
			fail_at(file, line, "%s: valid slot %u holds no resident position", what,
				s);
}

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return i;
	return SIZE_MAX;
}

struct margin g_margin;

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x < y) - (x > y);
}

static void margin_note(const struct tseq *t, uint32_t layer, uint32_t h, const float *pooled)
{
	uint32_t lo = SINK, hi = cand_hi(t->L), n = hi > lo ? hi - lo : 0;
	float *s;
	double gap;

	if (t->count == 0 || t->count >= n)
		return;
	s = t_xmalloc(n * sizeof(float));
	memcpy(s, pooled + lo, n * sizeof(float));
	qsort(s, n, sizeof(float), cmp_desc);
	gap = ((double)s[t->count - 1] - s[t->count]) / fabs((double)s[t->count - 1]);
	if (gap < g_margin.gap) {
		g_margin.gap = gap;
		g_margin.seq = t->id;
		g_margin.layer = layer;
		g_margin.head = h;
	}
	free(s);
}

/* After prefill: the host backend's resident positions are docs/design.md's rule over
   kvt_snapkv_select on the very tensors the test handed over (so the tie analysis below reads
   the right scores), its top-K is the heavy keys' windows, and the CUDA backend's list is sink, an
   ascending top-K within the candidates, then the ring; its top-K equals the host's, or differs
   only by positions whose pooled scores are within TIE_TOL of each other. */
void check_selection_at(struct pair *p, struct tseq *t, uint32_t layer, const char *file, int line)
{
	struct kvt_snapkv sp = t_snapkv_of(&p->cfg, t->L);
	uint32_t N = t->L, count = t->count, n_sink = N < SINK ? N : SINK, r0 = ring0_of(N);
	uint32_t hi = cand_hi(N);
	uint8_t *k = t_xmalloc((size_t)N_KV * N * t->rowb);
	int32_t *sel = t_xmalloc((size_t)N_KV * (count ? count : 1) * sizeof(int32_t));
	float *pooled = NULL;
	void *scratch = NULL;
	int32_t ph[POS_CAP], pc[POS_CAP], want[POS_CAP];

	assert_int_equal(t->n[layer], t->L);
	prompt_tensor(t, layer, 0, k);
	if (count) {
		scratch = t_xmalloc(kvt_snapkv_scratch_bytes(&sp));
		pooled = t_xmalloc((size_t)(N - OBS) * sizeof(float));
		CHECK_RC(kvt_snapkv_select(&sp, k, t->q_obs[layer], sel, scratch), 0);
	}
	t->tie[layer] = false;
	for (uint32_t h = 0; h < N_KV; h++) {
		uint32_t nh = positions_at(p, p->h, t, layer, h, ph, file, line);
		uint32_t nc = positions_at(p, p->c, t, layer, h, pc, file, line);
		uint32_t nw = t_expect_resident(&p->cfg, N, sel + (size_t)h * count, count, want);
		const int32_t *th = ph + n_sink, *tc = pc + n_sink;

		for (uint32_t i = 0; i < nw; i++)
			if (nh != nw || ph[i] != want[i])
				fail_at(file, line,
					"host: seq %llu layer %u head %u (L=%u): resident[%u] = %d (of "
					"%u), the design rule over kvt_snapkv_select gives %d (of %u)",
					ULL(t->id), layer, h, N, i, i < nh ? ph[i] : -1, nh,
					want[i], nw);
		if (nc != nw)
			fail_at(file, line,
				"cuda: seq %llu layer %u head %u (L=%u): %u resident positions, "
				"expected %u (sink %u + top-K %u + ring %u)",
				ULL(t->id), layer, h, N, nc, nw, n_sink, count, N - r0);
		for (uint32_t i = 0; i < n_sink; i++)
			if (pc[i] != (int32_t)i)
				fail_at(file, line,
					"cuda: seq %llu layer %u head %u: resident[%u] = %d, expected "
					"sink position %u",
					ULL(t->id), layer, h, i, pc[i], i);
		for (uint32_t i = 0; i < N - r0; i++)
			if (pc[n_sink + count + i] != (int32_t)(r0 + i))
				fail_at(file, line,
					"cuda: seq %llu layer %u head %u: resident[%u] = %d, expected "
					"ring position %u",
					ULL(t->id), layer, h, n_sink + count + i,
					pc[n_sink + count + i], r0 + i);
		for (uint32_t i = 0; i < count; i++)
			if (tc[i] < (int32_t)SINK || tc[i] >= (int32_t)hi ||
			    (i && tc[i] <= tc[i - 1]))
				fail_at(file, line,
					"cuda: seq %llu layer %u head %u: top-K[%u] = %d is outside the "
					"candidates [%u, %u) or not ascending",
					ULL(t->id), layer, h, i, tc[i], SINK, hi);
		memcpy(t->topk_h[layer][h], th, count * sizeof(int32_t));
		memcpy(t->topk_c[layer][h], tc, count * sizeof(int32_t));
		/* the data does what it was made for: the top-K is the heavy keys' windows */
		for (uint32_t i = 0; i < t->n_heavy * POOL; i++) {
			int32_t w = (int32_t)t->heavy[layer][h][i / POOL] - POOL / 2 +
				    (int32_t)(i % POOL);
			bool found = false;

			for (uint32_t j = 0; j < count && !found; j++)
				found = th[j] == w;
			if (!found)
				fail_at(file, line,
					"test data: seq %llu layer %u head %u: position %d, in the pooling "
					"window of the heavy key at %u, is not in the host backend's top-K "
					"(the vote is flatter than designed)",
					ULL(t->id), layer, h, w, t->heavy[layer][h][i / POOL]);
		}
		if (!count)
			continue;
		CHECK_RC(kvt_snapkv_scores(&sp, h, k, t->q_obs[layer], pooled, scratch), 0);
		margin_note(t, layer, h, pooled);
		if (!memcmp(th, tc, count * sizeof(int32_t)))
			continue;
		/* Positions only one side kept (both lists ascending): each must tie each
		   position only the other side kept. */
		{
			uint32_t a[TOPK], b[TOPK], na = 0, nb = 0, i = 0, j = 0;

			while (i < count || j < count) {
				if (j == count || (i < count && th[i] < tc[j]))
					a[na++] = (uint32_t)th[i++];
				else if (i == count || tc[j] < th[i])
					b[nb++] = (uint32_t)tc[j++];
				else
					i++, j++;
			}
			for (i = 0; i < na; i++)
				for (j = 0; j < nb; j++) {
					double sa = pooled[a[i]], sb = pooled[b[j]];

					if (!(fabs(sa - sb) <= TIE_TOL * fmax(fabs(sa), fabs(sb))))
						fail_at(file, line,
							"%s: seq %llu layer %u head %u: the CUDA backend "
							"keeps position %u (pooled score %.9g) where the "
							"host keeps %u (%.9g): relative difference %.3g, "
							"not a tie (> %.0e)",
							t_dt_name(t->dt), ULL(t->id), layer, h,
							b[j], sb, a[i], sa,
							fabs(sa - sb) / fmax(fabs(sa), fabs(sb)),
							TIE_TOL);
					print_message(
						"# %s: seq %llu layer %u head %u: tie at the top-K "
						"cutoff accepted: cuda keeps %u (%.9g), host %u "
						"(%.9g)\n",
						t_dt_name(t->dt), ULL(t->id), layer, h, b[j], sb,
						a[i], sa);
				}
			t->tie[layer] = true;
		}
	}
	free(k);
	free(sel);
	free(pooled);
	free(scratch);
}

/* Resident positions on both managers: docs/design.md's rule over each one's top-K from prefill. */
void check_resident_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
		       int line)
{
	int32_t got[POS_CAP], want[POS_CAP];

	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;

		for (uint32_t h = 0; h < N_KV; h++) {
			const int32_t *tk = s ? t->topk_c[layer][h] : t->topk_h[layer][h];
			uint32_t n = positions_at(p, m, t, layer, h, got, file, line);
			uint32_t nw = t_expect_resident(&p->cfg, t->n[layer], tk, t->count, want);

			for (uint32_t i = 0; i < nw || i < n; i++)
				if (n != nw || got[i] != want[i])
					fail_at(file, line,
						"%s: seq %llu layer %u head %u (L=%u, N=%u): "
						"resident[%u] = %d (of %u), expected %d (of %u)",
						side(p, m), ULL(t->id), layer, h, t->L, t->n[layer],
						i, i < n ? got[i] : -1, n, i < nw ? want[i] : -1,
						nw);
		}
	}
}

static void expect_row_at(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
			  const struct tseq *t, uint32_t layer, uint32_t h, uint32_t pos,
			  const char *file, int line)
{
	size_t i = first_diff(got, want, n);

	if (i != SIZE_MAX)
		fail_at(file, line,
			"%s %s: seq %llu layer %u head %u pos %u (N=%u): differs from the input at "
			"byte %zu of %zu (0x%02x, expected 0x%02x)",
			t_dt_name(t->dt), what, ULL(t->id), layer, h, pos, t->n[layer], i, n,
			got[i], want[i]);
}

/* Every token of (t, layer), every head, read back bit-exact: through kvt_seq_read_token and
   the host history of the CUDA manager, and (with_host) kvt_seq_read_token of the host one. */
void check_tokens_at(struct pair *p, const struct tseq *t, uint32_t layer, bool with_host,
		     const char *file, int line)
{
	uint32_t N = t->n[layer], got;
	uint8_t gk[ROW_MAX], gv[ROW_MAX];
	int32_t pos[POS_CAP];
	bool *map = t_xmalloc(N ? N : 1);
	size_t rb = t->rowb;

	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;
		int rc;

		if (!s && !with_host)
			continue;
		got = UINT32_MAX;
		rc = kvt_seq_tokens(m, t->id, layer, &got);
		if (rc || got != N)
			fail_at(file, line,
				"%s: kvt_seq_tokens(seq %llu, layer %u) = %d, %u tokens; "
				"expected %u",
				side(p, m), ULL(t->id), layer, rc, got, N);
		/* one past the end is out of range */
		rc = kvt_seq_read_token(m, t->id, layer, 0, N, gk, gv);
		if (rc != -EINVAL)
			fail_at(file, line,
				"%s: reading pos %u of seq %llu layer %u (N=%u) = %d, expected -EINVAL",
				side(p, m), N, ULL(t->id), layer, N, rc);
	}
	for (uint32_t h = 0; h < N_KV; h++) {
		uint32_t nres = positions_at(p, p->c, t, layer, h, pos, file, line);

		resident_map(pos, nres, map, N);
		for (uint32_t q = 0; q < N; q++) {
			const uint8_t *wk = ref_row(t, layer, h, q, 0),
				      *wv = ref_row(t, layer, h, q, 1);

			for (int path = 0; path < 3; path++) {
				static const char *const names[3] = {
					"cuda kvt_seq_read_token",
					"cuda host history (kvt_seq_read_token_host)",
					"host kvt_seq_read_token",
				};
				struct kvt_manager *m = path == 2 ? p->h : p->c;
				const char *where =
					map[q] ? "position resident" : "position not resident";
				char what[128];
				int rc;

				if (path == 2 && !with_host)
					continue;
				rc = path == 1 ? kvt_seq_read_token_host(m, t->id, layer, h, q, gk,
									 gv)
					       : kvt_seq_read_token(m, t->id, layer, h, q, gk, gv);
				if (rc)
					fail_at(file, line,
						"%s: reading seq %llu layer %u head %u pos %u (N=%u) = "
						"%d (%s): %s",
						side(p, m), ULL(t->id), layer, h, q, N, rc,
						kvt_strerror(rc), kvt_manager_last_error(m));
				snprintf(what, sizeof(what), "%s, K row (%s)", names[path], where);
				expect_row_at(gk, wk, rb, what, t, layer, h, q, file, line);
				snprintf(what, sizeof(what), "%s, V row (%s)", names[path], where);
				expect_row_at(gv, wv, rb, what, t, layer, h, q, file, line);
			}
		}
	}
	free(map);
}

/* The valid slots of (t, layer, h) on m, each as its K row then its V row; *ns_out slots. */
static uint8_t *frame_rows_at(struct pair *p, struct kvt_manager *m, const struct tseq *t,
			      uint32_t layer, uint32_t h, uint32_t *ns_out, const char *file,
			      int line)
{
	uint64_t fr[FRAME_CAP];
	uint32_t nf = 0, ns = 0, N = t->n[layer];
	uint32_t nf_want = DIV_UP(SINK + RECENT + t->count, BT);
	uint32_t ns_want = (N < SINK + RECENT ? N : SINK + RECENT) + t->count;
	size_t rb = t->rowb, bb = p->block_bytes;
	uint8_t *blk, *out;
	int rc = kvt_seq_frames(m, t->id, layer, h, fr, FRAME_CAP, &nf, &ns);

	if (rc)
		fail_at(file, line, "%s: kvt_seq_frames(seq %llu, layer %u, head %u) = %d (%s): %s",
			side(p, m), ULL(t->id), layer, h, rc, kvt_strerror(rc),
			kvt_manager_last_error(m));
	if (nf != nf_want || ns != ns_want)
		fail_at(file, line,
			"%s: seq %llu layer %u head %u (N=%u): %u frames with %u valid slots, "
			"expected %u frames, %u slots",
			side(p, m), ULL(t->id), layer, h, N, nf, ns, nf_want, ns_want);
	blk = t_xmalloc(nf * bb);
	out = t_xmalloc(ns * 2 * rb);
	for (uint32_t f = 0; f < nf; f++)
		addr_get(blk + f * bb, fr[f], bb, m == p->c);
	for (uint32_t s = 0; s < ns; s++) {
		const uint8_t *row = blk + (s / BT) * bb + (s % BT) * rb;

		memcpy(out + (size_t)s * 2 * rb, row, rb);
		memcpy(out + (size_t)s * 2 * rb + rb, row + BT * rb, rb); /* V after K */
	}
	free(blk);
	*ns_out = ns;
	return out;
}

/* The device frames of (t, layer) on both managers, slot by slot: each slot holds the input
   rows of the position the layout puts there, and the CUDA frames equal the host backend's
   bit for bit (when both kept the same positions). */
void check_frames_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
		     int line)
{
	size_t rb = t->rowb;

	for (uint32_t h = 0; h < N_KV; h++) {
		uint8_t *rows[2];
		uint32_t ns[2];

		for (int s = 0; s < 2; s++) {
			struct kvt_manager *m = s ? p->c : p->h;
			int32_t pos[POS_CAP], slot_pos[POS_CAP];
			uint32_t np = positions_at(p, m, t, layer, h, pos, file, line);
			char what[96];

			rows[s] = frame_rows_at(p, m, t, layer, h, &ns[s], file, line);
			snprintf(what, sizeof(what), "%s: seq %llu layer %u head %u", side(p, m),
				 ULL(t->id), layer, h);
			slot_map_at(pos, np, t->n[layer], ns[s], slot_pos, what, file, line);
			for (uint32_t sl = 0; sl < ns[s]; sl++) {
				uint32_t q = (uint32_t)slot_pos[sl];

				snprintf(what, sizeof(what), "%s device frame slot %u, K row",
					 side(p, m), sl);
				expect_row_at(rows[s] + (size_t)sl * 2 * rb,
					      ref_row(t, layer, h, q, 0), rb, what, t, layer, h, q,
					      file, line);
				snprintf(what, sizeof(what), "%s device frame slot %u, V row",
					 side(p, m), sl);
				expect_row_at(rows[s] + (size_t)sl * 2 * rb + rb,
					      ref_row(t, layer, h, q, 1), rb, what, t, layer, h, q,
					      file, line);
			}
		}
		if (!t->tie[layer])
			for (uint32_t sl = 0; sl < ns[0]; sl++) {
				size_t i = first_diff(rows[1] + (size_t)sl * 2 * rb,
						      rows[0] + (size_t)sl * 2 * rb, 2 * rb);

				if (i != SIZE_MAX)
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: cuda device frame slot %u "
						"differs from the host backend's at byte %zu of its %s row",
						t_dt_name(t->dt), ULL(t->id), layer, h, sl, i % rb,
						i < rb ? "K" : "V");
			}
		free(rows[0]);
		free(rows[1]);
	}
}

/* Every valid slot of every head of (t, layer) on m, in head and slot order. */
uint8_t *snapshot_at(struct pair *p, struct kvt_manager *m, const struct tseq *t, uint32_t layer,
		     size_t *bytes, const char *file, int line)
{
	uint8_t *all = NULL;
	size_t at = 0;

	for (uint32_t h = 0; h < N_KV; h++) {
		uint32_t ns;
		uint8_t *rows = frame_rows_at(p, m, t, layer, h, &ns, file, line);
		size_t n = (size_t)ns * 2 * t->rowb;

		if (!all)
			all = t_xmalloc(N_KV * n);
		memcpy(all + at, rows, n);
		at += n;
		free(rows);
	}
	*bytes = at;
	return all;
}

/* Whether two snapshots of (t, layer) differ; if so, where, into msg. */
bool snapshot_differs(const uint8_t *before, size_t nb, const uint8_t *after, size_t na,
		      const struct tseq *t, uint32_t layer, char *msg, size_t len)
{
	size_t rb = t->rowb, i = nb == na ? first_diff(before, after, nb) : 0;
	size_t ns = nb / (N_KV * 2 * rb);

	if (nb != na)
		snprintf(msg, len, "seq %llu layer %u: %zu bytes of valid slots, %zu before",
			 ULL(t->id), layer, na, nb);
	else if (i != SIZE_MAX)
		snprintf(msg, len,
			 "seq %llu layer %u: device frame of head %zu slot %zu (%s row, byte %zu) "
			 "differs from before",
			 ULL(t->id), layer, i / (2 * rb) / ns, i / (2 * rb) % ns,
			 i % (2 * rb) < rb ? "K" : "V", i % rb);
	return nb != na || i != SIZE_MAX;
}

/* The CUDA manager's frames of (t, layer) now, against a snapshot of them taken before. */
void expect_frames_as_at(struct pair *p, const struct tseq *t, uint32_t layer,
			 const uint8_t *before, size_t nb, const char *what, const char *file,
			 int line)
{
	size_t na;
	uint8_t *after = snapshot_at(p, p->c, t, layer, &na, file, line);
	char msg[200];

	if (snapshot_differs(before, nb, after, na, t, layer, msg, sizeof(msg)))
		fail_at(file, line, "%s: %s", what, msg);
	free(after);
}

/* Recall views of (t, layer) on both managers: as many blocks as kvtier.h makes resident
   (min(recall_blocks, blocks not fully resident) after a recall, none after a preemption),
   ascending, valid counts and resident masks as the resident set says, frames holding the input
   rows; and the CUDA view equal to the host's, frame bytes included. */
void check_views_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
		    int line)
{
	uint32_t N = t->n[layer], nb = DIV_UP(N, BT);
	size_t rb = t->rowb, bb = p->block_bytes;
	bool *map = t_xmalloc(N);

	for (uint32_t h = 0; h < N_KV; h++) {
		struct kvt_recall_ref rv[2][VIEW_CAP];
		uint8_t *fb[2];
		uint32_t nv[2];

		for (int s = 0; s < 2; s++) {
			struct kvt_manager *m = s ? p->c : p->h;
			int32_t pos[POS_CAP];
			uint32_t np = positions_at(p, m, t, layer, h, pos, file, line), cand = 0,
				 want;
			int rc = kvt_seq_recall_view(m, t->id, layer, h, rv[s], VIEW_CAP, &nv[s]);

			if (rc)
				fail_at(file, line,
					"%s: kvt_seq_recall_view(seq %llu, layer %u, head %u) = %d "
					"(%s): %s",
					side(p, m), ULL(t->id), layer, h, rc, kvt_strerror(rc),
					kvt_manager_last_error(m));
			resident_map(pos, np, map, N);
			for (uint32_t b = 0; b < nb; b++) {
				uint32_t n_valid = N - b * BT < BT ? N - b * BT : BT, i = 0;

				while (i < n_valid && map[b * BT + i])
					i++;
				cand += i < n_valid;
			}
			want = t->recalled[layer] ? (cand < R_BLOCKS ? cand : R_BLOCKS) : 0;
			if (nv[s] != want)
				fail_at(file, line,
					"%s: seq %llu layer %u head %u (N=%u): recall view of %u blocks, "
					"expected %u (%u blocks not fully resident, recall_blocks %u%s)",
					side(p, m), ULL(t->id), layer, h, N, nv[s], want, cand,
					R_BLOCKS, t->recalled[layer] ? "" : ", not recalled");
			fb[s] = t_xmalloc(nv[s] * bb + 1);
			for (uint32_t j = 0; j < nv[s]; j++) {
				const struct kvt_recall_ref *r = &rv[s][j];
				uint32_t n_valid = r->block < nb && N - r->block * BT < BT
							   ? N - r->block * BT
							   : BT;
				uint64_t mask = 0;
				char what[96];

				if (r->block >= nb || (j && r->block <= rv[s][j - 1].block))
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: view[%u] names block %u "
						"(%u blocks; ascending order expected)",
						side(p, m), ULL(t->id), layer, h, j, r->block, nb);
				for (uint32_t i = 0; i < n_valid; i++)
					mask |= (uint64_t)map[r->block * BT + i] << i;
				if (r->n_valid != n_valid || r->resident != mask ||
				    mask == ((uint64_t)1 << n_valid) - 1)
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: view of block %u: "
						"n_valid %u resident 0x%llx; expected %u and 0x%llx (not "
						"all set)",
						side(p, m), ULL(t->id), layer, h, r->block,
						r->n_valid, ULL(r->resident), n_valid, ULL(mask));
				addr_get(fb[s] + j * bb, r->frame, bb, m == p->c);
				for (uint32_t i = 0; i < n_valid; i++) {
					uint32_t q = r->block * BT + i;

					snprintf(what, sizeof(what),
						 "%s recalled frame of block %u, K row", side(p, m),
						 r->block);
					expect_row_at(fb[s] + j * bb + i * rb,
						      ref_row(t, layer, h, q, 0), rb, what, t,
						      layer, h, q, file, line);
					snprintf(what, sizeof(what),
						 "%s recalled frame of block %u, V row", side(p, m),
						 r->block);
					expect_row_at(fb[s] + j * bb + (BT + i) * rb,
						      ref_row(t, layer, h, q, 1), rb, what, t,
						      layer, h, q, file, line);
				}
			}
		}
		if (!t->tie[layer]) {
			if (nv[0] != nv[1])
				fail_at(file, line,
					"seq %llu layer %u head %u: cuda recall view of %u blocks, "
					"host %u",
					ULL(t->id), layer, h, nv[1], nv[0]);
			for (uint32_t j = 0; j < nv[0]; j++) {
				const struct kvt_recall_ref *a = &rv[1][j], *b = &rv[0][j];
				size_t vb = (size_t)a->n_valid * rb;

				if (a->block != b->block || a->n_valid != b->n_valid ||
				    a->resident != b->resident)
					fail_at(file, line,
						"seq %llu layer %u head %u: cuda view[%u] = block %u "
						"n_valid %u resident 0x%llx, host block %u n_valid %u "
						"resident 0x%llx",
						ULL(t->id), layer, h, j, a->block, a->n_valid,
						ULL(a->resident), b->block, b->n_valid,
						ULL(b->resident));
				if (memcmp(fb[1] + j * bb, fb[0] + j * bb, vb) ||
				    memcmp(fb[1] + j * bb + BT * rb, fb[0] + j * bb + BT * rb, vb))
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: recalled frame of block "
						"%u differs between cuda and host",
						t_dt_name(t->dt), ULL(t->id), layer, h, a->block);
			}
		}
		free(fb[0]);
		free(fb[1]);
	}
	free(map);
}

/* Attention over exactly the rows m's resident set and recall views of (t, layer) name, each
   token once, from the input rows (kvt_attend_rows, one segment per head). */
static void attend_reference_at(struct pair *p, struct kvt_manager *m, const struct tseq *t,
				uint32_t layer, const float *q, float *out, const char *file,
				int line)
{
	size_t rb = t->rowb, cap = POS_CAP + (size_t)VIEW_CAP * BT;
	uint8_t *kb = t_xmalloc(cap * rb), *vb = t_xmalloc(cap * rb);

	for (uint32_t h = 0; h < N_KV; h++) {
		struct kvt_recall_ref rv[VIEW_CAP];
		int32_t pos[POS_CAP];
		uint32_t n = positions_at(p, m, t, layer, h, pos, file, line), nv = 0, w = 0;
		int rc = kvt_seq_recall_view(m, t->id, layer, h, rv, VIEW_CAP, &nv);

		if (rc)
			fail_at(file, line,
				"%s: kvt_seq_recall_view(seq %llu, layer %u, head %u) = %d",
				side(p, m), ULL(t->id), layer, h, rc);
		for (uint32_t i = 0; i < n; i++) {
			memcpy(kb + w * rb, ref_row(t, layer, h, (uint32_t)pos[i], 0), rb);
			memcpy(vb + w * rb, ref_row(t, layer, h, (uint32_t)pos[i], 1), rb);
			w++;
		}
		for (uint32_t j = 0; j < nv; j++)
			for (uint32_t i = 0; i < rv[j].n_valid; i++) {
				if ((rv[j].resident >> i) & 1)
					continue;
				memcpy(kb + w * rb, ref_row(t, layer, h, rv[j].block * BT + i, 0),
				       rb);
				memcpy(vb + w * rb, ref_row(t, layer, h, rv[j].block * BT + i, 1),
				       rb);
				w++;
			}
		{
			struct kvt_attend_rows seg = {kb, vb, rb, rb, w};

			kvt_attend_rows(t->dt, HEAD_DIM, q + (size_t)h * G_Q * HEAD_DIM, G_Q, &seg,
					1, out + (size_t)h * G_Q * HEAD_DIM);
		}
	}
	free(kb);
	free(vb);
}

/* got within ATTEND_TOL of want, relative to the largest |want| of each query head (a single
   output near zero is the difference of large terms, so its own magnitude is no scale). */
void expect_close_at(const float *got, const float *want, const char *what, const struct tseq *t,
		     uint32_t layer, const char *file, int line)
{
	for (uint32_t g = 0; g < N_Q; g++) {
		double mx = 0;

		for (uint32_t d = 0; d < HEAD_DIM; d++)
			mx = fmax(mx, fabs((double)want[g * HEAD_DIM + d]));
		for (uint32_t d = 0; d < HEAD_DIM; d++) {
			double a = got[g * HEAD_DIM + d], b = want[g * HEAD_DIM + d];

			if (!(fabs(a - b) <= ATTEND_TOL * mx))
				fail_at(file, line,
					"%s %s: seq %llu layer %u (N=%u) q head %u dim %u: %.9g, "
					"expected %.9g (|diff| %.3g > %.0e x %.3g, the head's largest "
					"output)",
					t_dt_name(t->dt), what, ULL(t->id), layer, t->n[layer], g,
					d, a, b, fabs(a - b), ATTEND_TOL, mx);
		}
	}
}

/* kvt_attend on both managers: each within tolerance of attention over the rows it names, and
   of each other (same selection). out_c (optional) receives the CUDA output. */
void check_attend_at(struct pair *p, const struct tseq *t, uint32_t layer, float *out_c,
		     const char *file, int line)
{
	float out[2][N_Q * HEAD_DIM], ref[2][N_Q * HEAD_DIM];

	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;
		int rc = kvt_attend(m, t->id, layer, t->q_att[layer], out[s]);

		if (rc)
			fail_at(file, line, "%s: kvt_attend(seq %llu, layer %u) = %d (%s): %s",
				side(p, m), ULL(t->id), layer, rc, kvt_strerror(rc),
				kvt_manager_last_error(m));
		attend_reference_at(p, m, t, layer, t->q_att[layer], ref[s], file, line);
	}
	expect_close_at(out[0], ref[0], "host kvt_attend vs its rows", t, layer, file, line);
	expect_close_at(out[1], ref[1], "cuda kvt_attend vs its rows", t, layer, file, line);
	if (!t->tie[layer])
		expect_close_at(out[1], out[0], "cuda kvt_attend vs host kvt_attend", t, layer,
				file, line);
	if (out_c)
		memcpy(out_c, out[1], sizeof(out[1]));
}
