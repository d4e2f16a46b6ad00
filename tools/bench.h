/* SPDX-License-Identifier: MIT */
/* Subcommands of kvtier-bench that live in their own files. */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "simutil.h"

/* Fills dst[0 .. n) with random bf16 bit patterns from the generator *rng: 0x3c00 (2^-7) plus
   the bits of `mask` (0x7f: the mantissa, values in [2^-7, 2^-6); 0xff also the exponent's low
   bit, up to 2^-5) and a random sign, so magnitudes of about 0.008 to 0.03. */
static inline void bench_rand_bf16(uint64_t *rng, uint16_t *dst, size_t n, uint32_t mask)
{
	for (size_t x = 0; x < n; x++)
		dst[x] = (uint16_t)(0x3c00u + (sim_splitmix64(rng) & mask) +
				    ((sim_splitmix64(rng) & 1u) << 15));
}

/* kvtier-bench recall (tools/bench_recall.c): argv[0] is "recall". Exit status. */
int bench_recall(int argc, char **argv);

/* kvtier-bench recall's options (its --help). */
struct bench_recall_opts {
	uint32_t seqs, layers, prompt, steps, r, churn_pct, cache_pct, threads, head_dim;
	bool quest, step, tables, cuda;
	bool stagger; /* sequence i's prompt is bench_recall_prompt's */
	const char *csv;
};

/* Sequence i's prompt: o->prompt, or with o->stagger o->prompt - i % bt, so that the batch's
   members reach a block's end a few at a time (bt the block's tokens). */
static inline uint32_t bench_recall_prompt(const struct bench_recall_opts *o, uint32_t i,
					   uint32_t bt)
{
	return o->stagger ? o->prompt - i % bt : o->prompt;
}

/* The shortest prompt of any sequence (bench_recall_prompt at most): what a check of the
   blocks every prompt has must use. */
static inline uint32_t bench_recall_shortest(const struct bench_recall_opts *o, uint32_t bt)
{
	return bench_recall_prompt(o, bt - 1, bt);
}

/* kvtier-bench recall --backend cuda (tools/bench_recall_cuda.c): exit status (0; 1 on a
   failure, a CUDA error or the two managers deciding differently; 77 without a usable device
   or runtime). */
int bench_recall_cuda(const struct bench_recall_opts *o);
/* kvtier-bench attend (tools/bench_attend.c). */
int bench_attend(int argc, char **argv);

/* kvtier-bench attend's run: the batch, the recall, the repetitions timed; with cuda, the CUDA
   backend and the device-to-device copy of copy_mib MiB timed beside it. */
struct bench_attend_opts {
	uint32_t seqs, prompt, r, reps, copy_mib;
	bool cuda;
};

/* What both modes of kvtier-bench attend share (tools/bench_attend.c): the manager's
   configuration (Llama-3-8B geometry, one layer, tiers sized for the batch), and the inputs
   from one fixed seed: k [n_kv_heads][prompt][head_dim] (every sequence's K and V rows), qo
   [n_q_heads][obs_window][head_dim] (zeros), q [seqs][n_q_heads][head_dim] (all bf16) and sel
   [seqs][n_kv_heads][r] (the blocks recalled: past the sink, before the recent ring). */
struct bench_attend_in {
	uint16_t *k, *qo, *q;
	uint32_t *sel;
	size_t k_n, qo_n, q_n; /* elements */
};

void bench_attend_config(const struct bench_attend_opts *o, struct kvt_config *c);
/* 0, or -1 with "out of memory" reported (what was made is freed). */
int bench_attend_inputs(const struct bench_attend_opts *o, const struct kvt_config *c,
			struct bench_attend_in *in);
void bench_attend_inputs_free(struct bench_attend_in *in);
/* Frames per row of the attention tables the configuration can need. */
uint32_t bench_attend_max_frames(const struct kvt_config *c);
/* Tokens the attention tables t name for `rows` rows (max_batch * n_kv_heads), each once:
   the resident slots and the recalled rows not marked resident. t in host memory. */
uint64_t bench_attend_tokens(const struct kvt_attn_tables *t, size_t rows);
/* kvtier-bench attend --backend cuda (tools/bench_attend_cuda.c): exit status (0; 1 on a
   failure, a CUDA error or a wrong output; 77 without a usable device). */
int bench_attend_cuda(const struct bench_attend_opts *o);
/* kvtier-bench disk (tools/bench_disk.c). */
int bench_disk(int argc, char **argv);
/* kvtier-bench create (tools/bench_create.c). */
int bench_create(int argc, char **argv);
/* kvtier-bench calibrate (tools/bench_calibrate.c). */
int bench_calibrate(int argc, char **argv);

#endif /* KVT_BENCH_H */
