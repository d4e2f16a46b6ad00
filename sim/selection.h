/* SPDX-License-Identifier: MIT */
/*
 * Decode selection model for replays without a real model: which host blocks each decode step
 * of one (sequence, layer, kv head) asks recall for. A seeded process with temporal locality:
 * each of the r blocks of the previous step is kept with probability p_keep; a replaced one is,
 * with probability p_revisit, a block dropped within the last `window` steps (picked
 * uniformly among them), else a fresh block uniform over the candidates. The overlap of a
 * step with the union of the previous k steps is therefore p_keep at k = 1 and rises about
 * linearly by (1 - p_keep) * p_revisit until k = window, then stays flat: SparseServe Fig. 8's
 * shape (defaults 0.80, 0.45, 12: about 0.80 -> 0.89, a 10% gain).
 */
#ifndef SIM_SELECTION_H
#define SIM_SELECTION_H

#include <stdint.h>

struct sim_sel_params {
	uint32_t r;	 /* blocks per step, 1..1024 */
	uint32_t window; /* steps a dropped block can come back within, 1..64 */
	double p_keep, p_revisit;
	uint64_t seed;
};

#define SIM_SEL_PARAMS_INIT                                                         \
	{                                                                           \
		.r = 16, .window = 12, .p_keep = 0.80, .p_revisit = 0.45, .seed = 1 \
	}

/* A dropped block and the step it was dropped at: an entry of a stream's ring. */
struct sim_sel_drop {
	uint32_t block, step;
};

/* One (sequence, layer, kv head) stream. Its selection and its ring lie in one allocation,
   the ring right after the selection, so that a step touches few cache lines. */
struct sim_sel_stream {
	uint64_t rng;
	uint32_t n_cur, n_drop, drop_head, step;
	uint32_t *cur;		   /* [r] current selection */
	struct sim_sel_drop *drop; /* [window * r] ring of the dropped blocks, oldest first */
};

/* 0, or -EINVAL for bad parameters. */
int sim_sel_check(const struct sim_sel_params *p);
/* Allocates a stream (id makes streams independent under one seed). 0 or -ENOMEM. */
int sim_sel_stream_init(const struct sim_sel_params *p, uint64_t id, struct sim_sel_stream *st);
/* Releases a stream of sim_sel_stream_init and zeroes it (a zeroed one too). */
void sim_sel_stream_fini(struct sim_sel_stream *st);
/* n streams in st[0..n), those of ids first_id .. first_id + n - 1 (each the stream
   sim_sel_stream_init gives its id), their arrays in one allocation, stream after stream; p
   passes sim_sel_check, and every later call on them takes the same p. Released with
   sim_sel_group_fini, not stream by stream. 0, or -ENOMEM with st[] zeroed. */
int sim_sel_group_init(const struct sim_sel_params *p, uint64_t first_id, uint32_t n,
		       struct sim_sel_stream *st);
/* Releases the n streams of sim_sel_group_init and zeroes them (zeroed ones too). */
void sim_sel_group_fini(struct sim_sel_stream *st, uint32_t n);
/* Starts loading into the cache what the next sim_sel_next of st reads (its selection and
   the live part of its ring); changes nothing. A caller that walks many streams calls it a
   stream or two ahead: it reads st itself, so st should be in the cache by then. */
void sim_sel_prefetch(const struct sim_sel_params *p, const struct sim_sel_stream *st);
/* The next step's selection among blocks [lo, hi): min(r, hi - lo) distinct blocks into out
   (UINT32_MAX in the remaining entries). Blocks outside [lo, hi) (the range grew or moved)
   are replaced. */
void sim_sel_next(const struct sim_sel_params *p, struct sim_sel_stream *st, uint32_t lo,
		  uint32_t hi, uint32_t *out);

#endif /* SIM_SELECTION_H */
