/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_check.h"
#include "t_manager.h"

struct kvt_manager *t_mk(const struct kvt_config *c)
{
	struct kvt_manager *m = NULL;

	CHECK_RC(t_manager_create(c, &m), 0);
	assert_non_null(m);
	return m;
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
	if (memcmp(a, b, sizeof(*a)) == 0)
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
