/* SPDX-License-Identifier: MIT */
/*
 * Deterministic test data: a seeded number stream, token values that are a function of their
 * coordinates (every (seq, layer, head, pos, kv) row can be regenerated, so tests check
 * read-back without keeping copies), tensor builders in the layouts kvtier's API takes, and
 * docs/design.md's selection rules written out independently of the library.
 */
#ifndef KVT_TEST_T_DATA_H
#define KVT_TEST_T_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "policy.h"

/* splitmix64's finalizer: a well-mixed 64-bit function of x. */
static inline uint64_t t_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The randomized tests' number stream: splitmix64, one per test binary, seeded with
   t_rng_seed. */
void t_rng_seed(uint64_t seed);
uint64_t t_rng_next(void);
/* uniform in [0, n), n > 0 */
uint32_t t_rng_below(uint32_t n);

/* KVT_TEST_SEED when set (a run is repeated with it), else one from the clock and pid. */
uint64_t t_pick_seed(void);
/* Whether this is a full-length run: KVT_TEST_LONG=1, which meson's setup 'full' sets (CI).
   The default setup, 'quick', leaves it unset: randomized runs shorten and walks sample. */
bool t_long_run(void);
/* The length of a randomized run whose full length is dflt: KVT_TEST_OPS when set (longer or
   shorter runs, e.g. under valgrind), else dflt in a full-length run, else dflt / 4. */
long t_pick_ops(long dflt);

/* Zeroed allocation that never returns NULL to a test (n == 0 allocates 1 byte). */
void *t_xmalloc(size_t n);

/* Seconds on the monotonic clock. */
double t_now_s(void);

/* "f32", "f16" or "bf16". */
const char *t_dt_name(enum kvt_dtype dt);

/* A value in [-1, 1) determined by the token's coordinates; exactly representable in bf16 and
   f16 (multiples of 1/128), so every dtype stores it exactly. */
float t_value(uint64_t seq, uint32_t layer, uint32_t head, uint32_t pos, uint32_t dim, int is_v);

/* Fills one row (head_dim elements of dt) of token (seq, layer, head, pos) with t_value's. */
void t_fill_row(enum kvt_dtype dt, uint32_t head_dim, void *dst, uint64_t seq, uint32_t layer,
		uint32_t head, uint32_t pos, int is_v);

/* Prefill tensors of (seq, layer): k/v [H][L][D]; q_obs [Hq][obs][D] (query values are the
   token values of the last obs positions, head 1000 + g, so they differ from K), or NULL. */
void t_fill_prefill(const struct kvt_config *c, uint64_t seq, uint32_t layer, uint32_t L, void *k,
		    void *v, void *q_obs);

/* Decode tensors for a batch: k/v [n][H][D] holding token pos[i] of seqs[i]. */
void t_fill_decode(const struct kvt_config *c, const uint64_t *seqs, const uint32_t *pos,
		   uint32_t n, uint32_t layer, void *k, void *v);

/* SnapKV parameters of a manager configuration for a prompt of L tokens. */
struct kvt_snapkv t_snapkv_of(const struct kvt_config *c, uint32_t L);

/* valid_topk straight from docs/design.md steps 4-6, independent of the library, to cross-check
   kvt_snapkv_count and the frames a prefill takes. */
uint32_t t_naive_count(const struct kvt_config *c, uint32_t L);

/* Resident positions by docs/design.md's rule, independent of the library: [0, min(N, sink)), the
   count top-K positions, then [max(sink, N - recent), N), ascending. Returns how many. */
uint32_t t_expect_resident(const struct kvt_config *c, uint32_t N, const int32_t *topk,
			   uint32_t count, int32_t *out);

#endif /* KVT_TEST_T_DATA_H */
