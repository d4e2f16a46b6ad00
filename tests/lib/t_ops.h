/* SPDX-License-Identifier: MIT */
/*
 * The random operation driver of the long seeded runs (test_random.c, test_spill_noloss.c): a
 * model of every live sequence (struct t_seq), the choices every such run makes (a new
 * sequence's id and prompt, a sequence to destroy, a decode or recall batch, a sequence to
 * preempt or resume) and the loop that draws each operation from a mix that alternates filling
 * and draining phases. The suite keeps what only it checks in t_seq.layer and writes the
 * operations themselves; the failure context (t_seed, t_op, t_what) names the seed and the
 * operation under way in every failure message once check_context = t_run_context.
 */
#ifndef KVT_TEST_T_OPS_H
#define KVT_TEST_T_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define T_RUN_MAX_LAYERS 4
#define T_RUN_DEAD_IDS 64 /* ids of destroyed sequences kept for reuse */

/* The failure context: "seed S, op N (what): " while a run is under way (t_op >= 0), else
   "what: ". t_seed is the binary's seed (t_pick_seed), printed so KVT_TEST_SEED repeats it. */
extern uint64_t t_seed;
extern long t_op;
extern const char *t_what;
void t_run_context(char *buf, size_t len);

/* A live sequence as the run models it. */
struct t_seq {
	uint64_t id;
	uint32_t L;		       /* prompt tokens */
	uint32_t count;		       /* valid_topk of the prompt (kvt_snapkv_count) */
	uint32_t fph;		       /* device frames per kv head of a prefilled layer */
	uint32_t n[T_RUN_MAX_LAYERS];  /* tokens per layer; 0 = not prefilled */
	bool pre;		       /* preempted: no device frames */
	uint32_t spills;	       /* explicit spills (kvt_seq_spill), for failure messages */
	void *layer[T_RUN_MAX_LAYERS]; /* the suite's record of each layer (malloc'd or NULL;
					  freed with the sequence) */
};

struct t_run {
	struct kvt_config c;
	struct kvt_manager *m; /* set by the suite, which owns it */
	size_t rb;	       /* bytes of one row */
	struct t_seq *live;    /* [max_live] */
	uint32_t n_live, max_live;
	uint64_t dead[T_RUN_DEAD_IDS];
	uint32_t n_dead;
	/* the manager's cumulative counters as the suite's successful calls add up to */
	uint64_t tokens_prompt, tokens_appended, prefill_layers, decode_calls;
	uint32_t id_small;    /* 1 new id in 8 is below it (ids that collide and come back) */
	uint32_t prompt_span; /* long prompts are sink + recent + 1 + [0, prompt_span) */
	uint64_t created, destroyed;
};

/* A run of configuration c with up to max_live sequences. No manager yet (r->m). */
void t_run_init(struct t_run *r, const struct kvt_config *c, uint32_t max_live);
/* Frees the model (not the manager). */
void t_run_fini(struct t_run *r);

/* The stats every run can predict: as many live sequences as the model, frames and blocks used
   plus free equal to the totals, and the counters above (tokens saved = prompt + appended). */
void t_run_check_stats(const struct t_run *r, const struct kvt_stats *st);

/* The live sequence of that id, or NULL. */
struct t_seq *t_run_find(const struct t_run *r, uint64_t id);

/* A random prompt length: up to sink + recent tokens (1 in 4), just past them so few
   candidates remain (1 in 4), or long enough for top-K to apply (prompt_span). */
uint32_t t_run_prompt(const struct t_run *r);

/* Creates a sequence of a random prompt (t_run_prompt) and id: a destroyed sequence's 1 time in
   4, else a small one 1 time in 8 (id_small), else any. kvt_seq_create must succeed. Returns
   the new sequence (not prefilled), or NULL when the id drawn is live (nothing happens). */
struct t_seq *t_run_create(struct t_run *r);

/* Destroys a random live sequence (kvt_seq_destroy must succeed), remembers its id for reuse. */
void t_run_destroy(struct t_run *r);

/* Drops live sequence i from the model only (the suite destroyed it). */
void t_run_remove(struct t_run *r, uint32_t i);

/* A random batch of 1..max live sequences that are prefilled on layer l and not preempted, in
   random order, into out; how many (0: none qualifies). */
uint32_t t_run_pick_batch(const struct t_run *r, uint32_t l, struct t_seq **out, uint32_t max);

/* A random live sequence (n_live > 0), preempted when resume is set and resident otherwise if
   one is found in 8 tries. */
struct t_seq *t_run_pick(const struct t_run *r, bool resume);

#define T_MIX_MAX 10

/* The operations of a run and how often each comes. The run alternates phases of phase_ops
   operations: filling (few destroys, so the tiers run out) and draining (many destroys, so
   memory comes back and is reused). Each operation draws x in [0, 100) and runs op[k] for the
   first k with x < fill[k] (drain[k] while draining), op[n - 1] past the last threshold. */
struct t_mix {
	uint32_t n;
	void (*op[T_MIX_MAX])(struct t_run *r);
	uint32_t fill[T_MIX_MAX - 1], drain[T_MIX_MAX - 1]; /* cumulative, n - 1 of each */
	uint32_t phase_ops;
	bool ends_filling; /* phases counted back from the last operation: the run ends filling
			      (else it starts filling) */
};

/* Runs ops operations of the mix (t_op = 0 .. ops - 1), calling after(r) after each; t_op is
   ops when it returns. */
void t_run_loop(struct t_run *r, long ops, const struct t_mix *mix, void (*after)(struct t_run *r));

#endif /* KVT_TEST_T_OPS_H */
