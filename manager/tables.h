/* SPDX-License-Identifier: MIT */
/*
 * Attention tables (manager/tables.c): one layer's attention inputs for a batch, as the
 * fixed-stride tables of struct kvt_attn_tables (kvtier.h). Calls recall.c and base.c only.
 */
#ifndef KVT_TABLES_H
#define KVT_TABLES_H

#include <stdint.h>

#include "base.h"

/* Writes the tables of `layer` for the n members ids[] (the open step's batch, resolved by
   kvt_member) into t's buffers, as kvt_step_tables documents. 0 or a negative errno, recorded;
   an error writes nothing. */
int kvt_tables_write(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		     const struct kvt_attn_tables *t, void *stream);

/* Writes the tables of `layer` for the n members ids[] in FlashInfer's paged form into p's
   buffers, as kvt_step_paged documents. 0 or a negative errno, recorded; an error writes
   nothing. */
int kvt_paged_write(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		    const struct kvt_paged_tables *p, void *stream);

/* Batched decode attention of `layer` for the n members ids[] (kvt_attend_batch, or the open
   step's batch resolved by kvt_member): builds the tables and runs the policy's reference per
   row on the host, or one launch on the backend's device. 0 or a negative errno, recorded. */
int kvt_attend_run(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		   const void *q, void *out, float *lse, void *stream);

#endif /* KVT_TABLES_H */
