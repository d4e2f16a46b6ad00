/* SPDX-License-Identifier: MIT */
/* The host backend fixture (t_backend.h): kvtier's calls as they are, frames read in place. */
#include <string.h>

#include "t_backend.h"

static void host_dev_read(void *dst, uint64_t addr, size_t n)
{
	memcpy(dst, (const void *)(uintptr_t)addr, n);
}

static int host_step_append(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *k,
			    const void *v, void *stream)
{
	(void)n;
	return kvt_step_append(m, layer, k, v, stream);
}

static int host_step_recall(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
			    void *stream)
{
	(void)n;
	return kvt_step_recall(m, layer, q, stream);
}

static int host_step_recall_device_blocks(struct kvt_manager *m, uint32_t layer, uint32_t n,
					  const uint32_t *blocks, uint32_t r, void *stream)
{
	(void)n;
	return kvt_step_recall_device_blocks(m, layer, blocks, r, stream);
}

static int host_step_attend(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
			    void *out, float *lse, void *stream)
{
	(void)n;
	return kvt_step_attend(m, layer, q, out, lse, stream);
}

static int host_attend_tables(struct kvt_manager *m, const struct kvt_attn_tables *t, const void *q,
			      void *out, float *lse, int64_t scratch_short, void *stream)
{
	(void)scratch_short; /* the host needs none */
	return kvt_attend_tables(m, t, q, out, lse, NULL, 0, stream);
}

static void *host_stream_new(void)
{
	return NULL;
}

static void host_stream_free(void *s)
{
	(void)s;
}

static void host_stream_after(void *s, void *t)
{
	(void)s;
	(void)t;
}

const struct t_backend t_backend_host = {
	.name = "host",
	.kind = KVT_BACKEND_HOST,
	.manager_create = kvt_manager_create,
	.prefill_layer = kvt_prefill_layer,
	.decode_append = kvt_decode_append,
	.decode_recall = kvt_decode_recall,
	.step_append = host_step_append,
	.step_recall = host_step_recall,
	.recall_device_blocks = kvt_recall_device_blocks,
	.step_recall_device_blocks = host_step_recall_device_blocks,
	.prefill_chunk = kvt_prefill_chunk,
	.load_kv = kvt_seq_load_kv,
	.dev_read = host_dev_read,
	.step_tables = kvt_step_tables,
	.step_paged = kvt_step_paged,
	.attend_batch = kvt_attend_batch,
	.step_attend = host_step_attend,
	.attend_tables = host_attend_tables,
	.stream_new = host_stream_new,
	.stream_free = host_stream_free,
	.stream_after = host_stream_after,
};

const struct t_backend *const t_be = &t_backend_host;
