/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench disk: throughput of the disk tier's I/O engine (transfer/disk.c) on this machine,
 * against plain sequential direct I/O of the same bytes (the ceiling the file system gives one
 * thread), and of the CRC-32C it computes per block group.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"
#include "disk.h"

#define SEQ_CHUNK ((size_t)4 << 20)

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-bench disk [options]\n"
		"Writes and reads back --mib MiB of block groups through the disk tier's I/O\n"
		"engine (batched io_uring, CRC-32C per group) in a private file in --dir, and the\n"
		"same bytes with plain sequential 4 MiB writes/reads (O_DIRECT when the file system\n"
		"takes it): GB/s of each, the ratio, and the CRC-32C rate. Median of --reps runs.\n"
		"The engine uses preadv/pwritev (runs of consecutive slots, one I/O on a thread\n"
		"while the next run is copied) where io_uring is refused, and with the environment\n"
		"variable KVTIER_DISK_IO=sync; the first line says which.\n"
		"  --dir DIR          directory of the spill file (default /tmp)\n"
		"  --mib N            bytes moved per run (default 1024)\n"
		"  --group-kib N      block group size (default 128: Llama-3-8B, 32-token blocks)\n"
		"  --queue-depth N    I/Os in flight, or groups in the preadv/pwritev buffers\n"
		"                     (default 64)\n"
		"  --reps N           runs (default 5)\n"
		"  -h, --help         this text\n"
		"Exit status: 0 on success, 1 on an I/O error, 2 on bad usage.\n");
}

static double median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), sim_cmp_double);
	return sim_percentile(v, n, 0.5);
}

/* Plain sequential I/O of `bytes` from buf through fd: seconds, or -1. */
static double seq_io(int fd, uint8_t *buf, size_t bytes, bool write)
{
	double t0 = sim_now_s();

	for (size_t off = 0; off < bytes; off += SEQ_CHUNK) {
		size_t n = bytes - off < SEQ_CHUNK ? bytes - off : SEQ_CHUNK;
		ssize_t r = write ? pwrite(fd, buf + off, n, (off_t)off)
				  : pread(fd, buf + off, n, (off_t)off);

		if (r != (ssize_t)n)
			return -1;
	}
	return sim_now_s() - t0;
}

int bench_disk(int argc, char **argv)
{
	static const struct option lo[] = {
		{"dir", required_argument, 0, 'd'},
		{"mib", required_argument, 0, 'm'},
		{"group-kib", required_argument, 0, 'g'},
		{"reps", required_argument, 0, 'r'},
		{"queue-depth", required_argument, 0, 'q'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	const char *dir = "/tmp";
	uint32_t mib = 1024, gkib = 128, reps = 5, qd = 64;
	double *tw, *tr, *ts_w, *ts_r;
	struct kvt_disk_io *io = NULL;
	struct kvt_disk *d = NULL;
	uint8_t *buf = NULL;
	size_t bytes, n;
	char err[256] = "", path[4096];
	int c, fd = -1, rc = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'd':
			dir = optarg;
			break;
		case 'm':
			if (sim_parse_u32(optarg, 1, 1u << 20, &mib))
				return cli_bad_value("kvtier-bench disk", "mib", optarg), 2;
			break;
		case 'g':
			if (sim_parse_u32(optarg, 4, 1u << 20, &gkib))
				return cli_bad_value("kvtier-bench disk", "group-kib", optarg), 2;
			break;
		case 'r':
			if (sim_parse_u32(optarg, 1, 1000, &reps))
				return cli_bad_value("kvtier-bench disk", "reps", optarg), 2;
			break;
		case 'q':
			if (sim_parse_u32(optarg, 1, 4096, &qd))
				return cli_bad_value("kvtier-bench disk", "queue-depth", optarg), 2;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (cli_no_extra("kvtier-bench disk", argc, argv))
		return 2;
	n = ((size_t)mib << 20) / ((size_t)gkib << 10);
	if (n == 0) {
		fprintf(stderr, "kvtier-bench disk: --mib is smaller than one group\n");
		return 2;
	}
	bytes = n * ((size_t)gkib << 10);
	tw = calloc(4 * (size_t)reps, sizeof(double));
	/* allocated as the engine's bounce buffers are (huge pages where THP allows): the
	   sequential figures are then the best this disk gives one thread */
	buf = kvt_disk_buf_alloc(bytes);
	io = calloc(n, sizeof(*io));
	if (!tw || !buf || !io) {
		fprintf(stderr, "kvtier-bench disk: out of memory\n");
		goto out;
	}
	tr = tw + reps;
	ts_w = tr + reps;
	ts_r = ts_w + reps;
	{
		uint64_t seed = 1;

		for (size_t i = 0; i < bytes; i += 8)
			*(uint64_t *)(buf + i) = sim_splitmix64(&seed);
	}

	struct kvt_disk_params p = {
		.dir = dir, .unit_bytes = (uint64_t)gkib << 10, .queue_depth = qd};
	rc = kvt_disk_open(&p, &d, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvtier-bench disk: %s\n", err);
		rc = rc == -EINVAL ? 2 : 1; /* the options are checked: KVTIER_DISK_IO */
		goto out;
	}
	snprintf(path, sizeof(path), "%s/.kvtier-bench-XXXXXX", dir);
	fd = mkostemp(path, O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "kvtier-bench disk: %s: %s\n", dir, strerror(errno));
		rc = 1;
		goto out;
	}
	unlink(path);
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT) == 0 &&
	    seq_io(fd, buf, 4096, true) < 0)
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT);

	rc = 1;
	for (uint32_t r = 0; r < reps; r++) {
		double t0 = sim_now_s();

		for (size_t i = 0; i < n; i++)
			io[i] = (struct kvt_disk_io){
				.addr = (uint64_t)(uintptr_t)(buf + i * ((size_t)gkib << 10))};
		if (kvt_disk_write(d, io, (uint32_t)n) != n) {
			fprintf(stderr, "kvtier-bench disk: a write failed (%s)\n",
				strerror(-io[0].res));
			goto out;
		}
		tw[r] = sim_now_s() - t0;
		t0 = sim_now_s();
		if (kvt_disk_read(d, io, (uint32_t)n) != n) {
			fprintf(stderr, "kvtier-bench disk: a read failed\n");
			goto out;
		}
		tr[r] = sim_now_s() - t0;
		for (size_t i = 0; i < n; i++)
			kvt_disk_release(d, io[i].slot);
		ts_w[r] = seq_io(fd, buf, bytes, true);
		ts_r[r] = seq_io(fd, buf, bytes, false);
		if (ts_w[r] < 0 || ts_r[r] < 0) {
			fprintf(stderr, "kvtier-bench disk: sequential I/O failed: %s\n",
				strerror(errno));
			goto out;
		}
	}
	{
		struct kvt_disk_stats st;
		double w = median(tw, reps), rd = median(tr, reps);
		double sw = median(ts_w, reps), sr = median(ts_r, reps);
		double t0 = sim_now_s(), tc;
		uint32_t crc = 0;

		for (int k = 0; k < 4; k++)
			crc = crc32_iscsi(buf, (int)(bytes < INT32_MAX ? bytes : INT32_MAX), crc);
		tc = (sim_now_s() - t0) / 4;
		kvt_disk_stats(d, &st);
		printf("disk tier I/O engine (%s%s%s), %s, %zu groups of %u KiB (%.0f MiB) per "
		       "run, queue depth %u, %s, median of %u\n",
		       st.uring	      ? "io_uring"
		       : st.io_thread ? "pread/pwrite, I/O thread"
				      : "pread/pwrite",
		       st.uring_err ? ": io_uring refused, " : "",
		       st.uring_err ? strerror(-st.uring_err) : "", dir, n, gkib, bytes / 1048576.0,
		       qd, st.direct ? "O_DIRECT" : "page cache (O_DIRECT refused)", reps);
		printf("%-34s %8.2f GB/s\n", "spill (copy + CRC-32C + write)", bytes / w / 1e9);
		printf("%-34s %8.2f GB/s\n", "fetch (read + CRC check + copy)", bytes / rd / 1e9);
		printf("%-34s %8.2f GB/s\n", "sequential 4 MiB writes", bytes / sw / 1e9);
		printf("%-34s %8.2f GB/s\n", "sequential 4 MiB reads", bytes / sr / 1e9);
		printf("%-34s %8.2f GB/s (%08x)\n", "CRC-32C (ISA-L)", bytes / tc / 1e9, crc);
		printf("ratio spill / sequential write     %8.2f\n", sw / w);
		printf("ratio fetch / sequential read      %8.2f\n", sr / rd);
	}
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	kvt_disk_close(d);
	free(io);
	free(buf);
	free(tw);
	return rc;
}
