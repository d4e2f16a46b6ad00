/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_check.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "base.h"
#include "recall.h" /* the regions, read back (kvt_recall_pull) */
#include "util.h"

struct kvt_manager *t_mk(const struct kvt_config *c)
{
	struct kvt_manager *m = NULL;

	CHECK_RC(t_manager_create(c, &m), 0);
	assert_non_null(m);
	return m;
}

void t_prefill_seq(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L)
{
	size_t row = t_rowb(c);
	void *k = t_xmalloc((size_t)c->n_kv_heads * L * row);
	void *v = t_xmalloc((size_t)c->n_kv_heads * L * row);
	void *q = t_xmalloc((size_t)c->n_q_heads * c->obs_window * row);

	CHECK_RC(kvt_seq_create(m, seq, L), 0);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		t_fill_prefill(c, seq, l, L, k, v, q);
		CHECK_RC(t_prefill_layer(m, seq, l, k, v, q, NULL), 0);
	}
	free(k);
	free(v);
	free(q);
}

void t_same_views(struct kvt_manager *const mm[2], const struct kvt_config *c, uint64_t seq,
		  uint32_t layer, uint32_t r, uint64_t origin[2])
{
	struct kvt_recall_ref *ref[2];

	for (int k = 0; k < 2; k++)
		ref[k] = t_xmalloc(r * sizeof(*ref[k]));
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t n[2] = {0, 0};
		int rc[2];

		for (int k = 0; k < 2; k++) {
			memset(ref[k], 0, r * sizeof(*ref[k]));
			rc[k] = kvt_seq_recall_view(mm[k], seq, layer, h, ref[k], r, &n[k]);
		}
		if (rc[0] != rc[1])
			print_message("# views of seq %llu layer %u head %u: %d against %d (%s)\n",
				      (unsigned long long)seq, layer, h, rc[0], rc[1],
				      kvt_manager_last_error(mm[1]));
		CHECK_EQ(rc[0], rc[1]);
		CHECK_EQ(n[0], n[1]);
		for (uint32_t i = 0; rc[0] == 0 && i < n[0]; i++) {
			if (!origin[0]) {
				origin[0] = ref[0][i].frame;
				origin[1] = ref[1][i].frame;
			}
			CHECK_EQ(ref[0][i].frame - origin[0], ref[1][i].frame - origin[1]);
			CHECK_EQ(ref[0][i].block, ref[1][i].block);
			CHECK_EQ(ref[0][i].n_valid, ref[1][i].n_valid);
			CHECK_EQ(ref[0][i].resident, ref[1][i].resident);
		}
	}
	free(ref[0]);
	free(ref[1]);
}

void t_same_region(struct kvt_manager *const mm[2], uint64_t seq, uint32_t layer,
		   uint64_t origin[2])
{
	struct kvt_seq *s[2];
	struct kvt_recall_layer *rc[2];
	uint32_t H = mm[0]->cfg.n_kv_heads, nb;

	if (mm[0]->dev_regions == mm[1]->dev_regions)
		return;
	for (int k = 0; k < 2; k++) {
		s[k] = kvt_seqmap_get(&mm[k]->seqs, seq);
		rc[k] = s[k] && !s[k]->preempted ? s[k]->layers[layer].rc : NULL;
		if (rc[k]) {
			CHECK_RC(kvt_recall_pull(mm[k], rc[k]), 0);
			CHECK_RC(kvt_recall_sync(mm[k], rc[k]), 0);
		}
	}
	if (!rc[0] || !rc[1]) {
		CHECK_EQ(!rc[0], !rc[1]);
		return;
	}
	CHECK_EQ(rc[0]->rg.n_slots, rc[1]->rg.n_slots);
	CHECK_EQ(rc[0]->rg.clock, rc[1]->rg.clock);
	for (uint32_t i = 0; i < rc[0]->rg.n_slots; i++) {
		assert_memory_equal(&rc[0]->rg.slot[i], &rc[1]->rg.slot[i],
				    sizeof(rc[0]->rg.slot[i]));
		CHECK_EQ(mm[0]->rc.base + (uint64_t)rc[0]->frame[i] * mm[0]->block_bytes -
				 origin[0],
			 mm[1]->rc.base + (uint64_t)rc[1]->frame[i] * mm[1]->block_bytes -
				 origin[1]);
	}
	nb = DIV_UP(s[0]->layers[layer].n_tokens, mm[0]->cfg.block_tokens);
	/* the top-K counts are counted at a layer's first recall, or, on the CPU-kept side,
	   at its first scoring even when the call is then refused: compared once both have
	   them */
	for (uint32_t k = 0; k < nb * H; k++) {
		CHECK_EQ(rc[0]->rg.key[k].slot, rc[1]->rg.key[k].slot);
		CHECK_EQ(rc[0]->rg.key[k].touched, rc[1]->rg.key[k].touched);
		if (rc[0]->tk_ready && rc[1]->dtk)
			CHECK_EQ(rc[0]->rg.key[k].tk, rc[1]->rg.key[k].tk);
	}
	CHECK_EQ(rc[0]->ws.step, rc[1]->ws.step);
	CHECK_EQ(rc[0]->ws.cur, rc[1]->ws.cur);
	CHECK_EQ(rc[0]->ws.total, rc[1]->ws.total);
	if (rc[0]->ws.bucket && rc[1]->ws.bucket)
		assert_memory_equal(rc[0]->ws.bucket, rc[1]->ws.bucket,
				    rc[0]->ws.w * sizeof(*rc[0]->ws.bucket));
}

struct kvt_stats t_stats_of(const struct kvt_manager *m)
{
	struct kvt_stats st = KVT_STATS_INIT;

	CHECK_RC(kvt_manager_stats(m, &st), 0);
	return st;
}

struct kvt_seq_info t_info_of(struct kvt_manager *m, uint64_t seq)
{
	struct kvt_seq_info in = {.size = sizeof(in)};

	CHECK_RC(kvt_seq_info(m, seq, &in), 0);
	return in;
}

uint32_t t_tokens_of(struct kvt_manager *m, uint64_t seq, uint32_t layer)
{
	uint32_t n = 0;

	CHECK_RC(kvt_seq_tokens(m, seq, layer, &n), 0);
	return n;
}

void t_check_stats_equal(const struct kvt_stats *a, const struct kvt_stats *b, const char *file,
			 int line)
{
	struct kvt_stats x = *a, y = *b;

	/* a time, the device's own: never the same twice; and how many calls it sums, which a
	   twin without the regions on the device does not time */
	x.recall_device_ns = y.recall_device_ns = 0;
	x.recall_device_timed = y.recall_device_timed = 0;
	if (memcmp(&x, &y, sizeof(x)) == 0)
		return;
	fail_at(file, line,
		"stats changed: frames used %llu -> %llu, blocks used %llu -> %llu, "
		"tokens saved %llu -> %llu, appended %llu -> %llu, prefill layers %llu -> %llu, "
		"decode calls %llu -> %llu, saves %llu -> %llu, bytes d2h %llu -> %llu, "
		"bytes d2d %llu -> %llu",
		(unsigned long long)a->device_frames_used,
		(unsigned long long)b->device_frames_used, (unsigned long long)a->host_blocks_used,
		(unsigned long long)b->host_blocks_used, (unsigned long long)a->tokens_saved,
		(unsigned long long)b->tokens_saved, (unsigned long long)a->tokens_appended,
		(unsigned long long)b->tokens_appended, (unsigned long long)a->prefill_layers,
		(unsigned long long)b->prefill_layers, (unsigned long long)a->decode_calls,
		(unsigned long long)b->decode_calls, (unsigned long long)a->saves_submitted,
		(unsigned long long)b->saves_submitted, (unsigned long long)a->bytes_d2h,
		(unsigned long long)b->bytes_d2h, (unsigned long long)a->bytes_d2d,
		(unsigned long long)b->bytes_d2d);
}

bool t_kvt_threads_block_signals(uint32_t *n)
{
	const unsigned long long want =
		(1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1)) | (1ull << (SIGUSR1 - 1));
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	bool all = dir != NULL;

	*n = 0;
	while (dir && (e = readdir(dir))) {
		char path[300], line[128];
		unsigned long long blk = 0;
		bool ours = false, seen = false;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* the thread has just exited */
		while (fgets(line, sizeof(line), f)) {
			if (!strncmp(line, "Name:\tkvt-", 10))
				ours = true;
			if (sscanf(line, "SigBlk: %llx", &blk) == 1)
				seen = true;
		}
		fclose(f);
		if (!ours)
			continue;
		(*n)++;
		all = all && seen && (blk & want) == want;
	}
	if (dir)
		closedir(dir);
	return all;
}

uint64_t t_rss_bytes(void)
{
	unsigned long long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	int got = f ? fscanf(f, "%llu %llu", &size, &resident) : 0;

	if (f)
		fclose(f);
	if (got != 2)
		fail_at(__FILE__, __LINE__, "cannot read /proc/self/statm");
	return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

uint32_t t_dir_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint32_t n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}
