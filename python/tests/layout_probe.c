/* SPDX-License-Identifier: MIT */
/*
 * layout_probe: prints, as JSON, what the C compiler makes of kvtier.h's structures (size and
 * every field's offset and size) and the values of KVT_CONFIG_INIT and KVT_SCHED_CONFIG_INIT.
 * The Python binding's test (test_layout.py) compares its ctypes declarations with it.
 */
#include <stddef.h>
#include <stdio.h>

#include "kvtier.h"

#define FIELD(s, f) \
	printf("%s[\"%s\", %zu, %zu]", first++ ? ", " : "", #f, offsetof(s, f), sizeof(((s *)0)->f))

static void struct_begin(const char *name, size_t size, int comma)
{
	printf("%s\"%s\": {\"size\": %zu, \"fields\": [", comma ? ",\n" : "", name, size);
}

int main(void)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_sched_config sc = KVT_SCHED_CONFIG_INIT;
	int first;

	printf("{");
	struct_begin("kvt_config", sizeof(struct kvt_config), 0);
	first = 0;
	FIELD(struct kvt_config, size);
	FIELD(struct kvt_config, version);
	FIELD(struct kvt_config, n_layers);
	FIELD(struct kvt_config, n_kv_heads);
	FIELD(struct kvt_config, n_q_heads);
	FIELD(struct kvt_config, head_dim);
	FIELD(struct kvt_config, block_tokens);
	FIELD(struct kvt_config, dtype);
	FIELD(struct kvt_config, sink_tokens);
	FIELD(struct kvt_config, recent_tokens);
	FIELD(struct kvt_config, topk_tokens);
	FIELD(struct kvt_config, obs_window);
	FIELD(struct kvt_config, pool_kernel);
	FIELD(struct kvt_config, device_bytes);
	FIELD(struct kvt_config, host_bytes);
	FIELD(struct kvt_config, backend);
	FIELD(struct kvt_config, save_threads);
	FIELD(struct kvt_config, staging_bytes);
	FIELD(struct kvt_config, recall_blocks);
	FIELD(struct kvt_config, ws_window);
	FIELD(struct kvt_config, recall_cache_bytes);
	FIELD(struct kvt_config, model_h2d_gbps);
	FIELD(struct kvt_config, model_d2h_gbps);
	FIELD(struct kvt_config, model_d2d_gbps);
	FIELD(struct kvt_config, model_fused_eff);
	FIELD(struct kvt_config, model_call_ns);
	FIELD(struct kvt_config, model_launch_ns);
	FIELD(struct kvt_config, model_fused);
	FIELD(struct kvt_config, disk_queue_depth);
	FIELD(struct kvt_config, spill_dir);
	FIELD(struct kvt_config, disk_bytes);
	FIELD(struct kvt_config, model_disk_gbps);
	FIELD(struct kvt_config, model_disk_ns);
	FIELD(struct kvt_config, recall_threads);
	printf("]}");
	struct_begin("kvt_stats", sizeof(struct kvt_stats), 1);
	first = 0;
	FIELD(struct kvt_stats, size);
	FIELD(struct kvt_stats, version);
	FIELD(struct kvt_stats, device_frames_total);
	FIELD(struct kvt_stats, device_frames_used);
	FIELD(struct kvt_stats, device_frames_free);
	FIELD(struct kvt_stats, host_blocks_total);
	FIELD(struct kvt_stats, host_blocks_used);
	FIELD(struct kvt_stats, host_blocks_free);
	FIELD(struct kvt_stats, bytes_h2d);
	FIELD(struct kvt_stats, bytes_d2h);
	FIELD(struct kvt_stats, bytes_d2d);
	FIELD(struct kvt_stats, tokens_saved);
	FIELD(struct kvt_stats, tokens_appended);
	FIELD(struct kvt_stats, tokens_prompt);
	FIELD(struct kvt_stats, tokens_resident);
	FIELD(struct kvt_stats, prefill_layers);
	FIELD(struct kvt_stats, decode_calls);
	FIELD(struct kvt_stats, saves_submitted);
	FIELD(struct kvt_stats, live_seqs);
	FIELD(struct kvt_stats, save_threads);
	FIELD(struct kvt_stats, bytes_read);
	FIELD(struct kvt_stats, recall_frames_total);
	FIELD(struct kvt_stats, recall_frames_used);
	FIELD(struct kvt_stats, recall_calls);
	FIELD(struct kvt_stats, recall_lookups);
	FIELD(struct kvt_stats, recall_hits);
	FIELD(struct kvt_stats, recall_loads);
	FIELD(struct kvt_stats, recall_evictions);
	FIELD(struct kvt_stats, preemptions);
	FIELD(struct kvt_stats, resumes);
	FIELD(struct kvt_stats, model_ns_h2d);
	FIELD(struct kvt_stats, model_ns_d2h);
	FIELD(struct kvt_stats, model_ns_d2d);
	FIELD(struct kvt_stats, model_calls_h2d);
	FIELD(struct kvt_stats, model_calls_d2h);
	FIELD(struct kvt_stats, model_calls_d2d);
	FIELD(struct kvt_stats, disk_blocks_total);
	FIELD(struct kvt_stats, disk_blocks_used);
	FIELD(struct kvt_stats, disk_blocks_spilled);
	FIELD(struct kvt_stats, disk_blocks_fetched);
	FIELD(struct kvt_stats, disk_bytes_written);
	FIELD(struct kvt_stats, disk_bytes_read);
	FIELD(struct kvt_stats, disk_io_errors);
	FIELD(struct kvt_stats, disk_checksum_errors);
	FIELD(struct kvt_stats, seqs_lost);
	FIELD(struct kvt_stats, model_ns_disk);
	FIELD(struct kvt_stats, disk_direct);
	FIELD(struct kvt_stats, disk_uring);
	printf("]}");
	struct_begin("kvt_seq_info", sizeof(struct kvt_seq_info), 1);
	first = 0;
	FIELD(struct kvt_seq_info, size);
	FIELD(struct kvt_seq_info, prompt_tokens);
	FIELD(struct kvt_seq_info, layers_prefilled);
	FIELD(struct kvt_seq_info, preempted);
	FIELD(struct kvt_seq_info, tokens);
	FIELD(struct kvt_seq_info, frames_per_layer);
	FIELD(struct kvt_seq_info, device_frames);
	FIELD(struct kvt_seq_info, host_blocks);
	FIELD(struct kvt_seq_info, recall_ws_frames);
	FIELD(struct kvt_seq_info, recall_step_frames);
	FIELD(struct kvt_seq_info, disk_blocks);
	FIELD(struct kvt_seq_info, lost);
	FIELD(struct kvt_seq_info, reserved);
	printf("]}");
	struct_begin("kvt_recall_ref", sizeof(struct kvt_recall_ref), 1);
	first = 0;
	FIELD(struct kvt_recall_ref, frame);
	FIELD(struct kvt_recall_ref, block);
	FIELD(struct kvt_recall_ref, n_valid);
	FIELD(struct kvt_recall_ref, resident);
	printf("]}");
	struct_begin("kvt_pool_info", sizeof(struct kvt_pool_info), 1);
	first = 0;
	FIELD(struct kvt_pool_info, base);
	FIELD(struct kvt_pool_info, n_blocks);
	FIELD(struct kvt_pool_info, first_recall);
	FIELD(struct kvt_pool_info, block_bytes);
	FIELD(struct kvt_pool_info, v_offset);
	FIELD(struct kvt_pool_info, row_bytes);
	FIELD(struct kvt_pool_info, block_tokens);
	printf("]}");
	struct_begin("kvt_attn_tables", sizeof(struct kvt_attn_tables), 1);
	first = 0;
	FIELD(struct kvt_attn_tables, size);
	FIELD(struct kvt_attn_tables, max_batch);
	FIELD(struct kvt_attn_tables, max_frames);
	FIELD(struct kvt_attn_tables, max_recall);
	FIELD(struct kvt_attn_tables, n_batch);
	FIELD(struct kvt_attn_tables, n_tokens);
	FIELD(struct kvt_attn_tables, frames);
	FIELD(struct kvt_attn_tables, n_recall);
	FIELD(struct kvt_attn_tables, recall);
	FIELD(struct kvt_attn_tables, recall_tokens);
	FIELD(struct kvt_attn_tables, recall_skip);
	printf("]}");
	struct_begin("kvt_paged_tables", sizeof(struct kvt_paged_tables), 1);
	first = 0;
	FIELD(struct kvt_paged_tables, size);
	FIELD(struct kvt_paged_tables, max_batch);
	FIELD(struct kvt_paged_tables, max_pages);
	FIELD(struct kvt_paged_tables, max_tokens);
	FIELD(struct kvt_paged_tables, indptr);
	FIELD(struct kvt_paged_tables, indices);
	FIELD(struct kvt_paged_tables, last_page_len);
	FIELD(struct kvt_paged_tables, r_indptr);
	FIELD(struct kvt_paged_tables, r_indices);
	printf("]}");
	struct_begin("kvt_sched_config", sizeof(struct kvt_sched_config), 1);
	first = 0;
	FIELD(struct kvt_sched_config, size);
	FIELD(struct kvt_sched_config, version);
	FIELD(struct kvt_sched_config, max_requests);
	FIELD(struct kvt_sched_config, max_tokens);
	FIELD(struct kvt_sched_config, max_inject_tokens);
	FIELD(struct kvt_sched_config, ws_control);
	FIELD(struct kvt_sched_config, reserved);
	printf("]}");
	struct_begin("kvt_sched_item", sizeof(struct kvt_sched_item), 1);
	first = 0;
	FIELD(struct kvt_sched_item, seq);
	FIELD(struct kvt_sched_item, layer_begin);
	FIELD(struct kvt_sched_item, layer_end);
	FIELD(struct kvt_sched_item, decode);
	FIELD(struct kvt_sched_item, reserved);
	printf("]}");
	struct_begin("kvt_sched_iter", sizeof(struct kvt_sched_iter), 1);
	first = 0;
	FIELD(struct kvt_sched_iter, iteration);
	FIELD(struct kvt_sched_iter, batch_size);
	FIELD(struct kvt_sched_iter, n_decode);
	FIELD(struct kvt_sched_iter, n_prefill);
	FIELD(struct kvt_sched_iter, admitted);
	FIELD(struct kvt_sched_iter, reset);
	FIELD(struct kvt_sched_iter, preempted);
	FIELD(struct kvt_sched_iter, resumed);
	FIELD(struct kvt_sched_iter, completed);
	FIELD(struct kvt_sched_iter, prefill_token_layers);
	FIELD(struct kvt_sched_iter, ws_estimate_frames);
	FIELD(struct kvt_sched_iter, ws_touched_frames);
	FIELD(struct kvt_sched_iter, blocks_loaded);
	FIELD(struct kvt_sched_iter, recall_lookups);
	FIELD(struct kvt_sched_iter, recall_hits);
	FIELD(struct kvt_sched_iter, queued);
	FIELD(struct kvt_sched_iter, reserved);
	printf("]}");
	struct_begin("kvt_sched_batch", sizeof(struct kvt_sched_batch), 1);
	first = 0;
	FIELD(struct kvt_sched_batch, items);
	FIELD(struct kvt_sched_batch, n_items);
	FIELD(struct kvt_sched_batch, completed);
	FIELD(struct kvt_sched_batch, n_completed);
	FIELD(struct kvt_sched_batch, failed);
	FIELD(struct kvt_sched_batch, n_failed);
	FIELD(struct kvt_sched_batch, it);
	printf("]}");
	printf(",\n\"config_init\": {\"n_layers\": %u, \"n_kv_heads\": %u, \"n_q_heads\": %u, "
	       "\"head_dim\": %u, \"block_tokens\": %u, \"dtype\": %d, \"sink_tokens\": %u, "
	       "\"recent_tokens\": %u, \"topk_tokens\": %u, \"obs_window\": %u, "
	       "\"pool_kernel\": %u, \"device_bytes\": %llu, \"host_bytes\": %llu, "
	       "\"backend\": %d, \"save_threads\": %u, \"staging_bytes\": %llu, "
	       "\"recall_blocks\": %u, \"ws_window\": %u, \"recall_cache_bytes\": %llu, "
	       "\"model_h2d_gbps\": %.17g, \"model_d2h_gbps\": %.17g, \"model_d2d_gbps\": %.17g, "
	       "\"model_fused_eff\": %.17g, \"model_call_ns\": %u, \"model_launch_ns\": %u, "
	       "\"model_fused\": %u, \"disk_queue_depth\": %u, \"disk_bytes\": %llu, "
	       "\"model_disk_gbps\": %.17g, \"model_disk_ns\": %u, \"recall_threads\": %u}",
	       c.n_layers, c.n_kv_heads, c.n_q_heads, c.head_dim, c.block_tokens, (int)c.dtype,
	       c.sink_tokens, c.recent_tokens, c.topk_tokens, c.obs_window, c.pool_kernel,
	       (unsigned long long)c.device_bytes, (unsigned long long)c.host_bytes, (int)c.backend,
	       c.save_threads, (unsigned long long)c.staging_bytes, c.recall_blocks, c.ws_window,
	       (unsigned long long)c.recall_cache_bytes, c.model_h2d_gbps, c.model_d2h_gbps,
	       c.model_d2d_gbps, c.model_fused_eff, c.model_call_ns, c.model_launch_ns,
	       c.model_fused, c.disk_queue_depth, (unsigned long long)c.disk_bytes,
	       c.model_disk_gbps, c.model_disk_ns, c.recall_threads);
	printf(",\n\"sched_config_init\": {\"max_requests\": %u, \"max_tokens\": %u, "
	       "\"max_inject_tokens\": %llu, \"ws_control\": %u}",
	       sc.max_requests, sc.max_tokens, (unsigned long long)sc.max_inject_tokens,
	       sc.ws_control);
	printf(",\n\"versions\": {\"config\": %d, \"stats\": %d, \"sched_config\": %d}}\n",
	       KVT_CONFIG_VERSION, KVT_STATS_VERSION, KVT_SCHED_CONFIG_VERSION);
	return c.spill_dir != NULL;
}
