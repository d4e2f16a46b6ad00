/* SPDX-License-Identifier: MIT */
/*
 * Small manager configurations and the geometry the tests derive budgets and expectations
 * from: bytes of a row, a block, a block group; device frames of a resident set.
 */
#ifndef KVT_TEST_T_CONFIG_H
#define KVT_TEST_T_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/* A small host-backend configuration: 2 layers, 2 kv heads, 4 q heads, d=16, 8-token blocks,
   sink 8, recent 16, top-K 16, obs 4, kernel 3, f16, 4 MiB per tier, 2 save threads, 64 KiB of
   staging. The backend under test (t_backend.h) runs it on its own backend. */
struct kvt_config t_small_config(void);

/* Bytes of one row (head_dim elements of the dtype). */
size_t t_rowb(const struct kvt_config *c);
/* Bytes of one block of one kv head: block_tokens rows of K and of V. */
uint64_t t_block_bytes(const struct kvt_config *c);
/* Bytes of one block group: a block of every kv head, the unit tier budgets are rounded to. */
uint64_t t_group_bytes(const struct kvt_config *c);
/* A host or device budget of `groups` block groups. */
uint64_t t_budget(const struct kvt_config *c, uint32_t groups);
/* Device frames one prefilled (seq, layer) of a prompt of L tokens holds per kv head: its
   resident set (sink + recent + top-K, t_naive_count) in blocks. */
uint32_t t_frames_per_head(const struct kvt_config *c, uint32_t L);

#endif /* KVT_TEST_T_CONFIG_H */
