/* SPDX-License-Identifier: MIT */
#include "t_config.h"
#include "t_data.h"
#include "util.h"

struct kvt_config t_small_config(void)
{
	struct kvt_config c = KVT_CONFIG_INIT;

	c.n_layers = 2;
	c.n_kv_heads = 2;
	c.n_q_heads = 4;
	c.head_dim = 16;
	c.block_tokens = 8;
	c.dtype = KVT_DTYPE_F16;
	c.sink_tokens = 8;
	c.recent_tokens = 16;
	c.topk_tokens = 16;
	c.obs_window = 4;
	c.pool_kernel = 3;
	c.device_bytes = 4u << 20;
	c.host_bytes = 4u << 20;
	c.backend = KVT_BACKEND_HOST;
	c.save_threads = 2;
	c.staging_bytes = 64u << 10;
	return c;
}

size_t t_rowb(const struct kvt_config *c)
{
	return (size_t)c->head_dim * kvt_dtype_size(c->dtype);
}

uint64_t t_block_bytes(const struct kvt_config *c)
{
	return 2ull * c->block_tokens * t_rowb(c);
}

uint64_t t_group_bytes(const struct kvt_config *c)
{
	return (uint64_t)c->n_kv_heads * t_block_bytes(c);
}

uint64_t t_budget(const struct kvt_config *c, uint32_t groups)
{
	return (uint64_t)groups * t_group_bytes(c);
}

uint32_t t_frames_per_head(const struct kvt_config *c, uint32_t L)
{
	return DIV_UP(c->sink_tokens + c->recent_tokens + t_naive_count(c, L), c->block_tokens);
}
