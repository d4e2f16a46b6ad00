/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "gpu.h"
#include "huge.h"
#include "manager.h"
#include "policy.h"
#include "prefix.h"
#include "recall.h"
#include "spill.h"

/* Bounds that keep every derived size well inside 64 bits and every slot/position index
   inside 31 bits. */
#define MAX_LAYERS 4096u
#define MAX_HEADS 4096u
#define MAX_HEAD_DIM 8192u
#define MAX_SLOTS (1u << 30)
/* Arenas with more bytes than this are not ASan-poisoned (the shadow would cost 1/8 of it). */
#define POISON_MAX_BYTES ((uint64_t)1 << 30)

static int cfg_error(const char *what)
{
	kvt_log(KVT_LOG_WARN, "invalid configuration: %s", what);
	return -EINVAL;
}

static bool gbps_ok(double g)
{
	return g > 0 && isfinite(g);
}

#define CFG_END(f) (offsetof(struct kvt_config, f) + sizeof(((struct kvt_config *)0)->f))

/* Every struct kvt_config of KVT_CONFIG_VERSION 1, by the end of its last field: each grew the
   one before it by fields at its end, so each is a prefix of today's. A caller passes its
   sizeof, that end rounded up to the struct's alignment; the bytes past the end are padding
   (today's next field may lie there), so only the fields are read. */
static const size_t config_ends[] = {
	CFG_END(backend),	     /* the design contract's fields */
	CFG_END(staging_bytes),	     /* kvtier's first header: the save path */
	CFG_END(recall_cache_bytes), /* dynamic recall */
	CFG_END(model_fused),	     /* the model backend */
	sizeof(struct kvt_config),   /* the disk tier, recall_threads: this header */
};
/* A field added to struct kvt_config makes a new size: the end of today's last field goes into
   the list above first (checked on LP64, where the sizes are 80, 88, 104, 152 and 184). */
_Static_assert(sizeof(void *) != 8 || sizeof(struct kvt_config) == 184,
	       "struct kvt_config changed: list the end of its previous version in config_ends");

/* The bytes of the caller's struct to read, or 0 when size is none of the sizes above. */
static size_t config_bytes(uint32_t size)
{
	const size_t align = _Alignof(struct kvt_config);

	for (size_t i = 0; i < sizeof(config_ends) / sizeof(config_ends[0]); i++)
		if (size == (config_ends[i] + align - 1) / align * align)
			return config_ends[i];
	return 0;
}

/* Copies the caller's config over the defaults (fields past the caller's struct keep their
   defaults) and validates it. */
static int load_config(const struct kvt_config *cfg, struct kvt_config *c)
{
	static const struct kvt_config defaults = KVT_CONFIG_INIT;
	size_t bytes = config_bytes(cfg->size);

	if (!bytes)
		return cfg_error("size is not the sizeof of any struct kvt_config");
	if (cfg->version != KVT_CONFIG_VERSION)
		return cfg_error("unknown version");
	*c = defaults;
	memcpy(c, cfg, bytes);
	c->size = sizeof(*c);

	if (c->n_layers == 0 || c->n_layers > MAX_LAYERS)
		return cfg_error("n_layers must be 1..4096");
	if (c->n_kv_heads == 0 || c->n_kv_heads > MAX_HEADS || c->n_q_heads == 0 ||
	    c->n_q_heads > MAX_HEADS)
		return cfg_error("head counts must be 1..4096");
	if (c->n_q_heads % c->n_kv_heads)
		return cfg_error("n_q_heads is not a multiple of n_kv_heads");
	if (c->head_dim == 0 || c->head_dim > MAX_HEAD_DIM)
		return cfg_error("head_dim must be 1..8192");
	if (c->block_tokens < 8 || c->block_tokens > 64 ||
	    (c->block_tokens & (c->block_tokens - 1)))
		return cfg_error("block_tokens must be a power of two in 8..64");
	if (kvt_dtype_size(c->dtype) == 0)
		return cfg_error("unknown dtype");
	if (c->recent_tokens == 0)
		return cfg_error("recent_tokens must be at least 1");
	if ((uint64_t)c->sink_tokens + c->recent_tokens + c->topk_tokens > MAX_SLOTS)
		return cfg_error("sink + recent + top-K tokens exceed 2^30");
	if (c->topk_tokens && c->obs_window == 0)
		return cfg_error("obs_window must be at least 1 when topk_tokens > 0");
	if (c->pool_kernel == 0 || c->pool_kernel % 2 == 0)
		return cfg_error("pool_kernel must be odd");
	if (c->save_threads > 64)
		return cfg_error("save_threads must be at most 64");
	if (c->recall_threads > 64)
		return cfg_error("recall_threads must be at most 64");
	if (c->staging_bytes < 4096 || c->staging_bytes > ((uint64_t)1 << 40))
		return cfg_error("staging_bytes must be 4 KiB..1 TiB");
	if (c->ws_window == 0 || c->ws_window > KVT_WS_MAX)
		return cfg_error("ws_window must be 1..64");
	if (c->recall_blocks > 65536)
		return cfg_error("recall_blocks must be at most 65536");
	if (c->recall_cache_bytes >= c->device_bytes && c->recall_cache_bytes)
		return cfg_error("recall_cache_bytes must be below device_bytes");
	if (c->spill_dir && !c->spill_dir[0])
		return cfg_error("spill_dir is empty (NULL turns the disk tier off)");
	if (c->spill_dir && (c->disk_queue_depth == 0 || c->disk_queue_depth > 4096))
		return cfg_error("disk_queue_depth must be 1..4096");
	/* The transfer model matters to the model backend only; others ignore it. */
	if (c->backend == KVT_BACKEND_MODEL) {
		if (!gbps_ok(c->model_h2d_gbps) || !gbps_ok(c->model_d2h_gbps) ||
		    !gbps_ok(c->model_d2d_gbps))
			return cfg_error("model_h2d_gbps, model_d2h_gbps and model_d2d_gbps must "
					 "be finite and > 0");
		if (!(c->model_fused_eff > 0 && c->model_fused_eff <= 1))
			return cfg_error("model_fused_eff must be in (0, 1]");
		if (c->model_fused > 1)
			return cfg_error("model_fused must be 0 or 1");
		if (c->spill_dir && !gbps_ok(c->model_disk_gbps))
			return cfg_error("model_disk_gbps must be finite and > 0");
	}
	return 0;
}

/* Number of whole groups a budget holds, or 0 when it holds none or more than 32-bit ids. */
static uint32_t budget_groups(uint64_t bytes, uint64_t group_bytes)
{
	uint64_t n = bytes / group_bytes;

	return n == 0 || n >= UINT32_MAX ? 0 : (uint32_t)n;
}

/* The error of opening the disk tier as kvt_manager_create documents it: what the file system
   said about spill_dir where that names the cause, -EIO for anything else (logged). */
static int spill_errno(int err)
{
	switch (-err) {
	case 0:
	case EINVAL:
	case ENOMEM:
	case ENOENT:
	case ENOTDIR:
	case EACCES:
	case EPERM:
	case EROFS:
	case ENOSPC:
	case ENAMETOOLONG:
	case ELOOP:
	case EMFILE:
		return err;
	case EDQUOT:
		return -ENOSPC;
	case ENFILE:
		return -EMFILE;
	default:
		return -EIO;
	}
}

/* The manager's time_every (base.h): KVTIER_RECALL_TIME_EVERY, a count 0..2^20, or
   KVT_TIME_EVERY when unset or not such a count (logged). */
static uint32_t time_every(void)
{
	const char *s = getenv("KVTIER_RECALL_TIME_EVERY");
	char *end;
	unsigned long v;

	if (!s || !*s)
		return KVT_TIME_EVERY;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || s[0] == '-' || v > (1ul << 20)) {
		kvt_log(KVT_LOG_WARN, "KVTIER_RECALL_TIME_EVERY=%s ignored (want 0..%lu)", s,
			1ul << 20);
		return KVT_TIME_EVERY;
	}
	return (uint32_t)v;
}

/* Builds a manager from a configuration load_config has already validated. */
static int create_loaded(struct kvt_config c, const struct kvt_backend_ops *ops,
			 struct kvt_manager **out)
{
	struct kvt_backend_params bp;
	struct kvt_manager *m;
	const char *phases;
	uint32_t n_dev, n_host;
	uint64_t n_rc;
	int err;

	m = kvt_calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->cfg = c;
	/* a benchmark's split of the recall calls' host time (kvt_manager_phases) */
	phases = getenv("KVTIER_TIME_PHASES");
	m->phase_on = phases && strcmp(phases, "1") == 0;
	m->time_every = time_every();
	m->ops = ops;
	m->esize = kvt_dtype_size(c.dtype);
	m->row_bytes = c.head_dim * m->esize;
	m->group_q = c.n_q_heads / c.n_kv_heads;
	m->lbt = (uint32_t)__builtin_ctz(c.block_tokens);
	m->slots_sr = c.sink_tokens + c.recent_tokens;
	m->bt_n = c.recent_tokens / c.block_tokens + 3;
	m->block_bytes = 2ull * c.block_tokens * m->row_bytes;
	m->group_bytes = m->block_bytes * c.n_kv_heads;
	m->v_offset = (uint64_t)c.block_tokens * m->row_bytes;

	n_dev = budget_groups(c.device_bytes - c.recall_cache_bytes, m->group_bytes);
	n_host = budget_groups(c.host_bytes, m->group_bytes);
	n_rc = c.recall_cache_bytes / m->block_bytes;
	if (n_rc >= (1u << 30) || (c.recall_blocks && !n_rc)) {
		kvt_log(KVT_LOG_WARN,
			"invalid configuration: recall_cache_bytes must hold 1 .. 2^30-1 blocks "
			"of %llu bytes when recall_blocks > 0",
			(unsigned long long)m->block_bytes);
		err = -EINVAL;
		goto fail;
	}
	if (!n_dev || !n_host) {
		kvt_log(KVT_LOG_WARN,
			"invalid configuration: %s budget must hold 1 .. 2^32-2 "
			"groups of %llu bytes",
			!n_dev ? "device" : "host", (unsigned long long)m->group_bytes);
		err = -EINVAL;
		goto fail;
	}
	/* One device arena: the resident-set pool, then the recall cache's single frames. */
	m->dev_arena_bytes = (uint64_t)n_dev * m->group_bytes + n_rc * m->block_bytes;
	m->host_arena_bytes = (uint64_t)n_host * m->group_bytes;

	bp.save_threads = c.save_threads;
	bp.staging_bytes = c.staging_bytes;
	bp.model = (struct kvt_model_params){
		.h2d_gbps = c.model_h2d_gbps,
		.d2h_gbps = c.model_d2h_gbps,
		.d2d_gbps = c.model_d2d_gbps,
		.fused_eff = c.model_fused_eff,
		.call_ns = c.model_call_ns,
		.launch_ns = c.model_launch_ns,
		.fused = c.model_fused,
	};
	err = ops->create(&bp, &m->be);
	if (err) {
		kvt_log(KVT_LOG_WARN, "backend %s: cannot start (%s)", ops->name,
			kvt_strerror(err));
		goto fail;
	}
	m->payload = !(m->be->flags & KVT_BE_NO_PAYLOAD);
	m->cpu_device = m->payload && (m->be->flags & KVT_BE_DEVICE_CPU_READABLE);
	err = ops->arena_alloc(m->be, KVT_TIER_DEVICE, m->dev_arena_bytes, &m->dev_base);
	if (err)
		goto fail_be;
	err = ops->arena_alloc(m->be, KVT_TIER_HOST, m->host_arena_bytes, &m->host_base);
	if (err) {
		m->host_base = 0;
		goto fail_be;
	}
	err = kvt_pool_init(&m->dev, n_dev,
			    m->cpu_device && m->dev_arena_bytes <= POISON_MAX_BYTES
				    ? (void *)(uintptr_t)m->dev_base
				    : NULL,
			    m->group_bytes);
	if (!err)
		err = kvt_pool_init(&m->host, n_host,
				    m->payload && m->host_arena_bytes <= POISON_MAX_BYTES
					    ? (void *)(uintptr_t)m->host_base
					    : NULL,
				    m->group_bytes);
	if (!err)
		err = kvt_idmap_init(&m->seqs);
	if (!err)
		err = kvt_prefix_init(m);
	if (!err)
		err = kvt_recall_init(m, m->dev_base + (uint64_t)n_dev * m->group_bytes,
				      (uint32_t)n_rc);
	if (!err)
		err = spill_errno(kvt_spill_open(m));
	if (err)
		goto fail_be;
	m->meta_bytes = 2 * m->row_bytes;
	m->keep_meta = c.recall_blocks > 0 && (m->cpu_device || (m->payload && ops->block_meta));
	/* Metadata on the device and Quest scoring there, within the kernel's limits; the CPU
	   keeps and scores it otherwise. */
	m->dev_meta = m->keep_meta && !m->cpu_device && ops->meta_build && ops->quest &&
		      c.recall_blocks <= KVT_GPU_QUEST_MAX_R &&
		      (uint64_t)m->group_q * c.head_dim <= KVT_GPU_QUEST_MAX_QDIM;
	/* The recall regions there too, where a region's heads fit one CTA. With a disk tier, a
	   call with a member whose layer has spilled blocks reads back what its loads need
	   before it returns (recall.c, dev_repair). */
	m->dev_regions = m->dev_meta && ops->region_run && ops->region_host && ops->region_wait &&
			 ops->region_order && c.n_kv_heads <= KVT_GPU_REGION_MAX_HEADS;
	m->st.save_threads = c.save_threads;
	*out = m;
	return 0;
fail_be:
	if (m->be && m->be->err[0]) /* the other failures logged their own detail */
		kvt_log(KVT_LOG_WARN, "backend %s: %s", ops->name, m->be->err);
	kvt_spill_close(m);
	kvt_prefix_fini(m);
	kvt_idmap_fini(&m->seqs);
	kvt_recall_fini(m);
	kvt_pool_fini(&m->dev);
	kvt_pool_fini(&m->host);
	if (m->host_base)
		ops->arena_free(m->be, KVT_TIER_HOST, m->host_base, m->host_arena_bytes);
	if (m->dev_base)
		ops->arena_free(m->be, KVT_TIER_DEVICE, m->dev_base, m->dev_arena_bytes);
	if (m->be)
		ops->destroy(m->be);
fail:
	free(m);
	return err;
}

KVT_API int kvt_manager_create(const struct kvt_config *cfg, struct kvt_manager **out)
{
	const struct kvt_backend_ops *ops;
	enum kvt_backend resolved;
	struct kvt_config c;
	int err = 0;

	if (!cfg || !out)
		return -EINVAL;
	err = load_config(cfg, &c);
	if (err)
		return err;
	ops = kvt_backend_find(c.backend, &resolved, &err);
	if (!ops) { /* kvt_backend_find logged why (CUDA: plugin or device) */
		if (err == -EINVAL)
			kvt_log(KVT_LOG_WARN, "invalid configuration: backend %d is unknown",
				(int)c.backend);
		return err;
	}
	c.backend = resolved;
	return create_loaded(c, ops, out);
}

int kvt_manager_create_with(const struct kvt_config *cfg, const struct kvt_backend_ops *ops,
			    struct kvt_manager **out)
{
	struct kvt_config c;
	int err;

	if (!cfg || !out || !ops)
		return -EINVAL;
	err = load_config(cfg, &c);
	if (err)
		return err;
	return create_loaded(c, ops, out);
}

static void free_layer_tables(struct kvt_seq_layer *ly)
{
	kvt_huge_free(ly->groups);
	free(ly->frames);
	free(ly->topk);
}

KVT_API void kvt_manager_destroy(struct kvt_manager *m)
{
	struct kvt_seq *s;

	if (!m)
		return;
	/* Every pending save must land before the host arena goes away; device work still queued
	   on the arenas is waited for by arena_free, which cannot fail (a sync here could, with
	   nobody to tell). */
	m->ops->save_wait(m->be, UINT64_MAX);
	for (uint32_t pos = 0; (s = kvt_idmap_next(&m->seqs, &pos));) {
		for (uint32_t l = 0; l < m->cfg.n_layers; l++)
			free_layer_tables(&s->layers[l]);
		kvt_recall_free_seq(m, s);
		kvt_seq_px_free(s->px);
		free(s);
	}
	kvt_idmap_fini(&m->seqs);
	kvt_prefix_fini(m);
	kvt_spill_close(m); /* the spill file goes with it */
	kvt_recall_fini(m);
	if (m->att_dev)
		m->ops->dmem_free(m->be, m->att_dev);
	kvt_pool_fini(&m->dev);
	kvt_pool_fini(&m->host);
	m->ops->arena_free(m->be, KVT_TIER_HOST, m->host_base, m->host_arena_bytes);
	m->ops->arena_free(m->be, KVT_TIER_DEVICE, m->dev_base, m->dev_arena_bytes);
	m->ops->destroy(m->be);
	free(m->xf);
	free(m->ap);
	free(m->fresh);
	free(m->batch);
	free(m->step.ids);
	free(m->step.of);
	free(m->sel_scratch);
	free(m->tab);
	free(m->segs);
	free(m->sel);
	free(m->score);
	free(m->cand);
	free(m->qf);
	free(m->dq);
	free(m->hcopy);
	free(m->seg_off);
	free(m->slots.free);
	free(m);
}

KVT_API const char *kvt_manager_last_error(const struct kvt_manager *m)
{
	return m ? m->err : "no manager";
}

KVT_API int kvt_manager_config(const struct kvt_manager *m, struct kvt_config *out)
{
	if (!m || !out)
		return -EINVAL;
	*out = m->cfg;
	return 0;
}

KVT_API int kvt_manager_stats(const struct kvt_manager *m, struct kvt_stats *out)
{
	struct kvt_stats st;
	uint32_t size;

	if (!m || !out || out->size < offsetof(struct kvt_stats, device_frames_total) ||
	    out->version != KVT_STATS_VERSION)
		return -EINVAL;
	size = out->size < sizeof(st) ? out->size : (uint32_t)sizeof(st);
	/* the figures of recall calls the device has not reported yet (a failure there is
	   recorded for the next recall call) */
	(void)kvt_recall_settle((struct kvt_manager *)m);
	st = m->st;
	st.size = size;
	st.version = KVT_STATS_VERSION;
	st.device_frames_total = (uint64_t)m->dev.n_units * m->cfg.n_kv_heads;
	st.device_frames_free = (uint64_t)m->dev.n_free * m->cfg.n_kv_heads;
	st.device_frames_used = st.device_frames_total - st.device_frames_free;
	st.host_blocks_total = (uint64_t)m->host.n_units * m->cfg.n_kv_heads;
	st.host_blocks_free = (uint64_t)m->host.n_free * m->cfg.n_kv_heads;
	st.host_blocks_used = st.host_blocks_total - st.host_blocks_free;
	st.live_seqs = m->seqs.n;
	st.prefix_spans = m->px.map.n;
	st.prefix_blocks = m->px.groups * m->cfg.n_kv_heads;
	st.prefix_blocks_idle = m->px.groups_idle * m->cfg.n_kv_heads;
	st.prefix_blocks_disk = m->px.groups_disk * m->cfg.n_kv_heads;
	st.prefix_blocks_shared = (m->px.groups - m->px.groups_idle) * m->cfg.n_kv_heads;
	st.recall_frames_total = m->rc.n;
	st.recall_frames_used = m->rc.n_held;
	st.device_meta_bytes = m->dmeta_bytes;
	st.model_ns_h2d = m->be->cost[KVT_DIR_H2D].ns;
	st.model_ns_d2h = m->be->cost[KVT_DIR_D2H].ns;
	st.model_ns_d2d = m->be->cost[KVT_DIR_D2D].ns;
	st.model_calls_h2d = m->be->cost[KVT_DIR_H2D].calls;
	st.model_calls_d2h = m->be->cost[KVT_DIR_D2H].calls;
	st.model_calls_d2d = m->be->cost[KVT_DIR_D2D].calls;
	if (m->disk) {
		struct kvt_disk_stats ds;
		uint64_t per = m->cfg.n_kv_heads;

		kvt_disk_stats(m->disk, &ds);
		st.disk_blocks_total = ds.slots_max == UINT64_MAX ? UINT64_MAX : ds.slots_max * per;
		st.disk_blocks_used = ds.slots_used * per;
		st.disk_bytes_written = ds.bytes_written;
		st.disk_bytes_read = ds.bytes_read;
		st.disk_io_errors = ds.io_errors;
		st.disk_checksum_errors = ds.checksum_errors;
		st.model_ns_disk = ds.model_ns;
		st.disk_direct = ds.direct;
		st.disk_uring = ds.uring;
	}
	if (m->ops->stats) {
		struct kvt_be_stats bs;

		kvt_manager_be_stats(m, &bs);
		st.h2d_kernel_launches = bs.h2d_kernel_launches;
		st.h2d_dma_batches = bs.h2d_dma_batches;
		st.xfer_calibrated = bs.calibrated;
		st.xfer_gather_min_4k = bs.gather_min[0];
		st.xfer_gather_min_16k = bs.gather_min[1];
		st.xfer_gather_min_64k = bs.gather_min[2];
		st.recall_device_ns = bs.region_ns;
		st.recall_device_timed = bs.region_timed;
	}
	memcpy(out, &st, size);
	return 0;
}

void kvt_manager_phases(const struct kvt_manager *m, struct kvt_phases *out)
{
	*out = (struct kvt_phases){.settle = m->phase_ns[KVT_PH_SETTLE],
				   .check = m->phase_ns[KVT_PH_CHECK],
				   .size = m->phase_ns[KVT_PH_SIZE],
				   .run = m->phase_ns[KVT_PH_RUN]};
}

KVT_API int kvt_manager_save_event(struct kvt_manager *m, void *event)
{
	int err;

	if (!m)
		return -EINVAL;
	if (!event)
		return kvt_fail(m, -EINVAL, "save event: NULL event");
	if (!m->ops->save_event)
		return kvt_fail(m, -ENOTSUP, "save event: backend %s has no device events",
				m->ops->name);
	err = m->ops->save_event(m->be, event);
	return err ? kvt_fail(m, err, "save event: %s", m->be->err) : 0;
}

KVT_API int kvt_manager_sync(struct kvt_manager *m, void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = m->ops->sync(m->be, stream);
	if (!err && !stream)
		m->dev_queued = false;
	if (!err)
		err = m->ops->save_wait(m->be, UINT64_MAX);
	if (err)
		return kvt_fail(m, err, "sync: %s", m->be->err);
	/* and the recall calls' reports */
	return kvt_recall_settle(m);
}
