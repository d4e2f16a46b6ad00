/* SPDX-License-Identifier: MIT */
/*
 * What the files of the prefix suite share (test_prefix.c: the prompt builders and checks,
 * main; test_prefix_disk.c: spans in the spill file; test_prefix_random.c: the seeded random
 * run).
 */
#ifndef TEST_PREFIX_H
#define TEST_PREFIX_H

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

#include "policy.h"
#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "t_ops.h"
#include "util.h"

#define HT 16 /* hash_tokens: two 8-token blocks */

/* test_prefix.c */

/* The suite's configuration: t_small_config with 3 layers and recall (2 blocks, 64 frames). */
struct kvt_config cfg(void);

/* One prompt's tensors, all layers: k, v [layer][H][L][D], q_obs [layer][Hq][obs][D]. Positions
   below `shared` hold the values of prompt `base`, the rest those of prompt `id`, so two prompts
   built on one base share that prefix exactly. */
struct prompt {
	uint32_t L;
	size_t lkv, lq; /* bytes per layer */
	uint8_t *k, *v, *q;
};

struct prompt mk_prompt(const struct kvt_config *c, uint64_t id, uint32_t L, uint64_t base,
			uint32_t shared);
void free_prompt(struct prompt *p);
/* Rows [from, to) of every head of layer l of p, as [H][to - from][D], into dst. */
void rows_of(const struct kvt_config *c, const struct prompt *p, uint32_t l, uint32_t from,
	     uint32_t to, const uint8_t *src, uint8_t *dst);
/* Prefills layer l of seq from position `pos` in chunks of `step` tokens (the rest at once when
   0), each chunk's tensors holding rows from 0 (from_mode 0), the chunk's start (1) or between
   (2). */
void prefill_pieces(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		    const struct prompt *p, uint32_t l, uint32_t pos, uint32_t step, int from_mode);
/* kvt_prefill_layer of every layer of seq with p's tensors, which must succeed. */
void prefill_whole(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		   const struct prompt *p);
/* Everything visible of (ma, a) equals (mb, b), every layer: resident positions, the frames'
   rows, the whole history (which must be p's), the recall views after one recall. */
void check_same(struct kvt_manager *ma, uint64_t a, struct kvt_manager *mb, uint64_t b,
		const struct kvt_config *c, const struct prompt *p);
/* The chain base * 1000 + i, i < n, into h. */
void chain_of(uint64_t base, uint32_t n, uint64_t *h);
/* The history of layers [0, n_layers) of seq at positions [from, to) is p's, bit for bit
   (kvt_seq_load_kv). */
void check_history(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		   const struct prompt *p, uint32_t from, uint32_t to);

/* The fixture of the tests that use a spill directory: a fresh directory under $TMPDIR (or
   /tmp), its path in *state; removed after the test, with anything a failed test left in it. */
int tmpdir_setup(void **state);
int tmpdir_teardown(void **state);

/* test_prefix_disk.c (each with the tmpdir fixture) */
void test_prefix_disk_restore(void **state);
void test_prefix_disk_checksum(void **state);
void test_prefix_disk_full(void **state);
void test_prefix_resume_shared(void **state);
void test_prefix_restore_after_pins(void **state);

/* test_prefix_random.c */
void test_prefix_random_host(void **state);
void test_prefix_random_disk(void **state); /* with the tmpdir fixture, as the next */
void test_prefix_random_disk_limited(void **state);

#endif /* TEST_PREFIX_H */
