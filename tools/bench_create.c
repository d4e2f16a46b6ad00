/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench create: what kvt_manager_create and kvt_manager_destroy cost for a given tier
 * size on the model backend (no payload memory: what is left is the manager's bookkeeping),
 * in time and in resident memory. The target: a server with a few TB of DRAM starts in well
 * under a second (host tier of 4 TiB: create < 1 s).
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench.h"
#include "cli.h"
#include "kvtier.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-bench create [options]\n"
		"Creates and destroys a manager on the model backend --reps times: the median and\n"
		"worst create and destroy times, the resident memory a created manager holds, and\n"
		"the process's peak resident memory.\n"
		"  --host-gib N      host tier (default 4096: 4 TiB)\n"
		"  --device-gib N    device tier (default 80)\n"
		"  --geometry G      llama: Llama-3-8B, 128 KiB block groups (default); small: one\n"
		"                    kv head of d=64 f16 in 8-token blocks, 2 KiB block groups, the\n"
		"                    smallest whose 4 TiB still fit the 32-bit group ids (2^31)\n"
		"  --spill-dir DIR   with the disk tier (modelled: no file is written)\n"
		"  --reps N          runs (default 5)\n"
		"  -h, --help        this text\n"
		"Exit status: 0 on success, 1 on a library error, 2 on bad usage.\n");
}

/* Resident memory now, in bytes (0 when /proc is not there). */
static uint64_t rss_now(void)
{
	unsigned long long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%llu %llu", &size, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

int bench_create(int argc, char **argv)
{
	static const struct option lo[] = {
		{"host-gib", required_argument, 0, 'H'},
		{"device-gib", required_argument, 0, 'D'},
		{"geometry", required_argument, 0, 'g'},
		{"spill-dir", required_argument, 0, 's'},
		{"reps", required_argument, 0, 'r'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	struct kvt_config c = KVT_CONFIG_INIT;
	uint32_t host_gib = 4096, dev_gib = 80, reps = 5;
	double *tc = NULL, *td = NULL;
	uint64_t rss0, rss, held = 0;
	struct rusage ru;
	bool small = false;
	int ch, rc = 1;

	optind = 1;
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (ch) {
		case 'H':
			if (sim_parse_u32(optarg, 1, 1u << 24, &host_gib))
				return cli_bad_value("kvtier-bench create", "host-gib", optarg), 2;
			break;
		case 'D':
			if (sim_parse_u32(optarg, 1, 1u << 24, &dev_gib))
				return cli_bad_value("kvtier-bench create", "device-gib", optarg),
				       2;
			break;
		case 'g':
			if (strcmp(optarg, "llama") && strcmp(optarg, "small"))
				return cli_bad_value("kvtier-bench create", "geometry", optarg), 2;
			small = strcmp(optarg, "small") == 0;
			break;
		case 's':
			c.spill_dir = optarg;
			break;
		case 'r':
			if (sim_parse_u32(optarg, 1, 1000, &reps))
				return cli_bad_value("kvtier-bench create", "reps", optarg), 2;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (cli_no_extra("kvtier-bench create", argc, argv))
		return 2;
	c.backend = KVT_BACKEND_MODEL;
	c.host_bytes = (uint64_t)host_gib << 30;
	c.device_bytes = (uint64_t)dev_gib << 30;
	if (small) {
		c.n_kv_heads = 1;
		c.n_q_heads = 1;
		c.head_dim = 64;
		c.dtype = KVT_DTYPE_F16;
		c.block_tokens = 8;
	}
	tc = calloc(reps, sizeof(*tc));
	td = calloc(reps, sizeof(*td));
	if (!tc || !td) {
		fprintf(stderr, "kvtier-bench create: out of memory\n");
		goto out;
	}
	rss0 = rss_now();
	for (uint32_t r = 0; r < reps; r++) {
		struct kvt_manager *m = NULL;
		double t0 = sim_now_s();
		int err = kvt_manager_create(&c, &m);

		tc[r] = sim_now_s() - t0;
		if (err) {
			fprintf(stderr, "kvtier-bench create: kvt_manager_create: %s\n",
				kvt_strerror(err));
			goto out;
		}
		rss = rss_now();
		if (rss > rss0 && rss - rss0 > held)
			held = rss - rss0;
		t0 = sim_now_s();
		kvt_manager_destroy(m);
		td[r] = sim_now_s() - t0;
	}
	getrusage(RUSAGE_SELF, &ru);
	qsort(tc, reps, sizeof(*tc), sim_cmp_double);
	qsort(td, reps, sizeof(*td), sim_cmp_double);

	/* K and V of block_tokens rows per kv head; both geometries are of 2-byte elements */
	uint64_t group = 2ull * c.block_tokens * c.head_dim * 2 * c.n_kv_heads;

	printf("kvtier-bench create: model backend, host tier %u GiB (%llu block groups of %llu "
	       "bytes), device tier %u GiB, %s geometry%s, %u runs\n",
	       host_gib, (unsigned long long)(c.host_bytes / group), (unsigned long long)group,
	       dev_gib, small ? "small" : "Llama-3-8B", c.spill_dir ? ", disk tier" : "", reps);
	printf("kvt_manager_create: median %.3f ms, max %.3f ms\n",
	       sim_percentile(tc, reps, 0.5) * 1e3, tc[reps - 1] * 1e3);
	printf("kvt_manager_destroy: median %.3f ms, max %.3f ms\n",
	       sim_percentile(td, reps, 0.5) * 1e3, td[reps - 1] * 1e3);
	printf("resident memory of a created manager: %.1f MiB; peak of the process: %.1f MiB\n",
	       (double)held / (1 << 20), (double)ru.ru_maxrss / 1024);
	printf("target create < 1 s with a 4 TiB host tier: %s (max / target = %.4f)\n",
	       host_gib != 4096	    ? "n/a (other host tier)"
	       : tc[reps - 1] < 1.0 ? "met"
				    : "NOT met",
	       tc[reps - 1]);
	rc = 0;
out:
	free(tc);
	free(td);
	return rc;
}
