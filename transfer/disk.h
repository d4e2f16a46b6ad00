/* SPDX-License-Identifier: MIT */
/*
 * The disk tier's I/O engine: a private spill file of equal slots, each holding one unit (a host
 * block group) padded to the direct-I/O alignment, written and read in batches through one
 * io_uring with registered bounce buffers. Every slot carries the CRC-32C of its unit (kept in
 * memory, ISA-L's crc32_iscsi), checked on every read. Freed slots are reused, most recently
 * freed first, so the file grows only to the high-water mark of units spilled at once.
 *
 * The file is opened O_TMPFILE (or created and unlinked at once where the file system lacks
 * O_TMPFILE), mode 0600, so no path to it ever exists for another process and nothing is left
 * behind by a crash; O_DIRECT where the file system takes it, the page cache otherwise.
 *
 * Where io_uring is refused (Docker 25+ and containerd 2 block its system calls in their default
 * seccomp profiles; kernel.io_uring_disabled; gVisor) the engine does the same batches with
 * preadv/pwritev, each run of consecutive slots (rising or falling) as one I/O, done on an I/O
 * thread of the engine's own while the calling thread copies the next run in (writes) or the
 * last one out (reads): the tier works and nothing else changes. It switches the same way if
 * the ring fails later: the units in flight are redone synchronously (writes to fresh slots:
 * the abandoned ones are never reused, as the kernel may still complete the old I/O) and every
 * later batch goes synchronously; a wait in which no I/O of the batch completes for a minute
 * counts as a failed ring (-ETIME). The environment variable KVTIER_DISK_IO=sync asks for the
 * synchronous engine from the start (uring, the default, asks for io_uring).
 *
 * In model mode (payload-free backends) there is no file: slots are accounted the same way and
 * each batch is timed as latency + bytes / bandwidth.
 *
 * All calls come from the manager's thread. Every I/O of a batch, through the ring or the I/O
 * thread, is done before the call returns.
 */
#ifndef KVT_DISK_H
#define KVT_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvt_disk;

struct kvt_disk_params {
	const char *dir;      /* directory of the spill file */
	uint64_t unit_bytes;  /* payload bytes per slot (>= 1) */
	uint64_t max_bytes;   /* most bytes of the file, padding included; 0 = no limit */
	uint32_t queue_depth; /* io_uring entries, 1..4096 */
	bool model;	      /* no file and no bytes: accounting and time only */
	double model_gbps;    /* model mode: bytes per ns */
	uint32_t model_ns;    /* model mode: cost of one batch */
};

struct kvt_disk_stats {
	uint64_t slot_bytes;		 /* file bytes per slot */
	uint64_t slots_max;		 /* UINT64_MAX: no limit */
	uint64_t slots_used, slots_high; /* in use now; file length in slots */
	uint64_t units_written, units_read;
	uint64_t bytes_written, bytes_read;
	uint64_t io_errors, checksum_errors;
	uint64_t model_ns;
	uint64_t slots_abandoned; /* in flight when the ring failed: never reused, not in used */
	uint64_t ios;		  /* I/O requests: ring entries, or preadv/pwritev calls */
	bool direct;
	bool uring;	/* batches go through io_uring (false: pread/pwrite, or model mode) */
	bool io_thread; /* the pread/pwrite engine's I/O thread runs (started by its first batch) */
	int uring_err;	/* why not: the -errno that refused or broke the ring (0: none, or the
			   environment asked for sync) */
};

/* One unit of a batch: its host address (never dereferenced in model mode), its slot, and the
   outcome (0 or -errno). */
struct kvt_disk_io {
	uint64_t addr;
	uint32_t slot;
	int res;
};

/* Opens the engine and its spill file. 0; -EINVAL (bad params, or KVTIER_DISK_IO is neither
   uring nor sync); -ENOENT, -ENOTDIR, -EACCES, ... (the directory); -ENOMEM. A refused
   io_uring is not an error: the engine runs synchronously (stats: uring, uring_err). The detail
   goes to err. */
int kvt_disk_open(const struct kvt_disk_params *p, struct kvt_disk **out, char *err,
		  size_t err_len);
/* Closes the file (its space goes back to the file system) and frees everything. NULL: no-op. */
void kvt_disk_close(struct kvt_disk *d);

/* Writes the n units: takes a slot for each (io[i].slot), writes the unit and records its
   CRC. Per unit io[i].res is 0, -ENOSPC (file at its limit, file system full or over quota,
   the process's file size limit), -EIO (a write the disk failed; one that came short or was
   interrupted is continued first) or -ENOMEM (the ring failed and no bounce buffer could be
   had for the synchronous engine); a failed unit holds no slot. Only -EIO counts in
   io_errors. Returns the number written. */
uint32_t kvt_disk_write(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n);

/* Reads the n units in slots io[i].slot into io[i].addr and checks each CRC. Per unit io[i].res
   is 0, -EIO (a read the disk failed, or that found the file shorter than the slot; the slot
   still holds the unit), -ENOMEM (as for writes; the slot still holds the unit) or -EBADMSG
   (CRC mismatch).
   Slots stay taken: the caller frees them once it has committed. Returns the number read. */
uint32_t kvt_disk_read(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n);

/* Returns a slot for reuse. */
void kvt_disk_release(struct kvt_disk *d, uint32_t slot);

void kvt_disk_stats(const struct kvt_disk *d, struct kvt_disk_stats *out);

/* n bytes for direct I/O, as the engine's bounce buffers: DISK_ALIGN-aligned; from 2 MiB up, on
   huge page boundaries and advised to be huge pages (THP). Direct I/O from huge pages hands the
   device a few large segments instead of one per 4 KiB page: on the development VM's virtio disk
   that is 3-6 times the throughput (kvtier-bench disk, README). Without THP they work as before.
   NULL without memory; free() releases. */
void *kvt_disk_buf_alloc(uint64_t n);

/* Test hook: flips bytes of the unit stored in slot on the file itself (not through the
   engine), so the next read of it fails its CRC. 0, -ENOENT (slot not in use), -ENOTSUP
   (model mode) or -errno of the write. */
int kvt_disk_corrupt(struct kvt_disk *d, uint32_t slot);

/* Test hook: the nth io_uring submission from now (1 = the next) fails with err (< 0) instead
   of entering the kernel, as a ring that broke would, with the earlier I/Os of its batch still
   in flight. 0 disarms. -ENOTSUP when there is no ring (model mode, synchronous engine). */
int kvt_disk_break_ring(struct kvt_disk *d, uint32_t nth, int err);

/* Test hook: the nth wait for a completion from now (1 = the next) loses the completions of
   the I/Os in flight (they are done, and dropped as they come) and gives up when none has come
   for ms milliseconds, as a wait for completions the kernel lost would: the ring fails with
   -ETIME and the batch goes on synchronously. 0 disarms. -ENOTSUP without a ring, or where
   the kernel cannot bound a wait (before Linux 5.11, whose waits are unbounded). */
int kvt_disk_stall_ring(struct kvt_disk *d, uint32_t nth, uint32_t ms);

#endif /* KVT_DISK_H */
