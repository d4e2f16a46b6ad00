/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <liburing.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "disk.h"
#include "fault.h"
#include "util.h"
#include "thread.h"

/* valgrind cannot see the kernel write a read's buffer through io_uring: tell it. */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#endif
#endif
#ifndef VALGRIND_MAKE_MEM_DEFINED
#define VALGRIND_MAKE_MEM_DEFINED(addr, len) ((void)(addr), (void)(len))
#endif

#define DISK_ALIGN 4096u
#define DISK_MAX_SLOTS 0x7fffffffu	     /* slot ids fit in 31 bits (the manager tags them) */
#define STAGE_MAX_BYTES ((uint64_t)64 << 20) /* bounce buffers, all together */
#define UNIT_MAX_BYTES ((uint64_t)1 << 30)
#define HUGE_BYTES ((uint64_t)2 << 20) /* a transparent huge page */
/* Writes filled but not yet handed to the kernel, at most (or a quarter of the queue depth):
   on the dev VM (ext4 on virtio) one io_uring_enter per 128 KiB write ran about 20% slower than
   one per 4 (the block layer merges what comes together), and one per batch 40% slower (the
   device idled while the thread copied). */
#define SUBMIT_BYTES ((uint64_t)512 << 10)
/* The longest wait for a completion of the ring before it counts as failed (ring_submit). */
#define WAIT_MAX_S 60

struct inflight {
	uint32_t io;  /* index in the batch */
	uint32_t crc; /* of the unit being written */
};

/* Units merged into one I/O at most. */
#define SYNC_RUN_MAX 64u

/* A run of the synchronous engine: units io[i, i + k) of the batch in the bounce buffers from
   buf on (unit u in buffer buf + u), stored in slots lo .. lo + k - 1, one preadv or pwritev. */
struct sync_run {
	struct iovec iov[SYNC_RUN_MAX]; /* in file order: falling runs are reversed */
	uint32_t i, k, lo, buf;
	int dir; /* slots rising (1, or 0 for one unit) or falling (-1) along the batch */
	bool write;
	int res; /* of the I/O: bytes or -errno */
};

struct kvt_disk {
	struct kvt_disk_params p;
	int fd;
	bool ring_ok, fixed;
	struct io_uring ring;
	uint64_t slot_bytes;
	uint32_t slots_max;
	uint32_t high; /* slots ever handed out: the file's length in slots */
	uint32_t n_used;
	uint32_t *free_slots; /* stack of released slots below high */
	uint32_t n_free, free_cap;
	uint32_t *crc;	  /* [slot] CRC-32C of the unit it holds (not in model mode) */
	uint64_t *in_use; /* bit per slot */
	uint32_t table_cap;
	uint8_t *stage; /* n_bufs bounce buffers of slot_bytes, DISK_ALIGN-aligned */
	uint32_t n_bufs, n_buf_free;
	uint32_t submit_every; /* ring writes handed to the kernel together (SUBMIT_BYTES) */
	uint32_t *buf_free;
	struct inflight *fl; /* [buf] */
	bool sync;	     /* no ring (refused at open, failed since, or not asked for) */
	uint8_t *sbuf;	   /* the synchronous engine's bounce buffers (stage when sync from open) */
	uint32_t sbuf_n;   /* slots they hold */
	uint32_t break_in; /* test hook: submissions until the simulated failure (0: none) */
	int break_err;
	uint32_t stall_in; /* test hook: waiting submissions until a lost completion (0: none) */
	uint32_t stall_ms; /* its wait */
	bool timed;	   /* the kernel bounds a wait itself (IORING_FEAT_EXT_ARG) */
	/* The synchronous engine's I/O thread: runs one posted run's I/O at a time while the
	   calling thread copies the next (or the last) one. */
	pthread_t io_th;
	pthread_mutex_t io_mu;
	pthread_cond_t io_cv;
	struct sync_run *io_job; /* posted and not done yet (under io_mu) */
	bool io_quit;		 /* under io_mu */
	bool io_live, io_refused;
	struct kvt_disk_stats st;
};

static int fail(char *err, size_t len, int e, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t len, int e, const char *fmt, ...)
{
	va_list ap;

	if (err && len) {
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return e;
}

static bool slot_used(const struct kvt_disk *d, uint32_t s)
{
	return s < d->high && (d->in_use[s >> 6] >> (s & 63)) & 1;
}

static void mark(struct kvt_disk *d, uint32_t s, bool used)
{
	if (used)
		d->in_use[s >> 6] |= 1ull << (s & 63);
	else
		d->in_use[s >> 6] &= ~(1ull << (s & 63));
}

/* Grows the per-slot tables to hold slot `s`. 0 or -ENOMEM. */
static int grow_tables(struct kvt_disk *d, uint32_t s)
{
	uint32_t cap = d->table_cap ? d->table_cap : 1024;
	uint64_t *bits;

	if (s < d->table_cap)
		return 0;
	while (cap <= s)
		cap = cap > DISK_MAX_SLOTS / 2 ? DISK_MAX_SLOTS + 1u : cap * 2;
	bits = kvt_realloc(d->in_use, (size_t)(cap + 63) / 64 * sizeof(*bits));
	if (!bits)
		return -ENOMEM;
	memset(bits + (d->table_cap + 63) / 64, 0,
	       ((size_t)(cap + 63) / 64 - (d->table_cap + 63) / 64) * sizeof(*bits));
	d->in_use = bits;
	if (!d->p.model) {
		uint32_t *crc = kvt_realloc(d->crc, (size_t)cap * sizeof(*crc));

		if (!crc)
			return -ENOMEM; /* in_use grew: harmless, table_cap unchanged */
		d->crc = crc;
	}
	d->table_cap = cap;
	return 0;
}

/* Takes a slot: the most recently released one, else a new one at the end of the file.
   0, -ENOSPC (at the limit) or -ENOMEM. */
static int take_slot(struct kvt_disk *d, uint32_t *slot)
{
	int err;

	if (d->n_free) {
		*slot = d->free_slots[--d->n_free];
	} else {
		if (d->high >= d->slots_max)
			return -ENOSPC;
		err = grow_tables(d, d->high);
		if (err)
			return err;
		if (d->free_cap < d->high + 1) {
			/* the free stack can hold every slot below high: kvt_disk_release needs no
			   room of its own */
			uint32_t cap = d->table_cap;
			uint32_t *fs = kvt_realloc(d->free_slots, (size_t)cap * sizeof(*fs));

			if (!fs)
				return -ENOMEM;
			d->free_slots = fs;
			d->free_cap = cap;
		}
		*slot = d->high++;
	}
	mark(d, *slot, true);
	d->n_used++;
	return 0;
}

void kvt_disk_release(struct kvt_disk *d, uint32_t slot)
{
	if (!d || !slot_used(d, slot))
		return;
	/* take_slot grew the free stack to hold every slot below high */
	if (NEVER(d->n_free >= d->free_cap))
		return;
	mark(d, slot, false);
	d->n_used--;
	d->free_slots[d->n_free++] = slot;
}

/* The slot of a batch's unit: a write takes one, a read's must be in use (the manager's slots:
   never otherwise). 0, or the error of take_slot, or -EINVAL. */
static int unit_slot(struct kvt_disk *d, struct kvt_disk_io *x, bool write)
{
	return write ? take_slot(d, &x->slot) : slot_used(d, x->slot) ? 0 : -EINVAL;
}

/* Copies a write's unit into its bounce buffer, zeroes the padding; the unit's CRC-32C. */
static uint32_t fill_unit(const struct kvt_disk *d, const struct kvt_disk_io *x, uint8_t *buf)
{
	memcpy(buf, (const void *)(uintptr_t)x->addr, d->p.unit_bytes);
	memset(buf + d->p.unit_bytes, 0, d->slot_bytes - d->p.unit_bytes);
	return crc32_iscsi(buf, (int)d->p.unit_bytes, 0);
}

void *kvt_disk_buf_alloc(uint64_t n)
{
	void *p;

	if (n < HUGE_BYTES)
		return kvt_aligned_alloc(DISK_ALIGN, n);
	n = (n + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
	p = kvt_aligned_alloc(HUGE_BYTES, n);
	if (p)
		(void)madvise(p, n, MADV_HUGEPAGE); /* a hint: refused, the pages stay small */
	return p;
}

/* Opens the spill file in dir: O_TMPFILE, else a unique name unlinked at once; O_DIRECT when
   the file system takes it (checked with one aligned write). */
static int open_file(struct kvt_disk *d, char *err, size_t len)
{
	const char *dir = d->p.dir;
	void *probe = NULL;
	int fd, e;

	fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | O_DIRECT, 0600);
	if (fd < 0 && errno == EINVAL)
		fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
		char path[4096];

		if ((size_t)snprintf(path, sizeof(path), "%s/.kvtier-spill-XXXXXX", dir) >=
		    sizeof(path))
			return fail(err, len, -ENAMETOOLONG, "spill directory name too long");
		fd = mkostemp(path, O_CLOEXEC);
		if (fd >= 0) {
			unlink(path);
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT);
		}
	}
	if (fd < 0) {
		e = -errno;
		return fail(err, len, e, "cannot create a spill file in %s: %s", dir, strerror(-e));
	}
	d->fd = fd;
	if (fchmod(fd, 0600)) {
		e = -errno;
		return fail(err, len, e, "spill file: chmod: %s", strerror(-e));
	}
	/* Some file systems accept O_DIRECT at open and refuse the I/O: probe once. */
	d->st.direct = (fcntl(fd, F_GETFL) & O_DIRECT) != 0;
	if (d->st.direct) {
		probe = aligned_alloc(DISK_ALIGN, DISK_ALIGN);
		if (!probe)
			return fail(err, len, -ENOMEM, "spill file: no memory");
		memset(probe, 0, DISK_ALIGN);
		if (pwrite(fd, probe, DISK_ALIGN, 0) != DISK_ALIGN) {
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT);
			d->st.direct = false;
		}
		free(probe);
		if (ftruncate(fd, 0)) {
			e = -errno;
			return fail(err, len, e, "spill file: truncate: %s", strerror(-e));
		}
	}
	return 0;
}

int kvt_disk_open(const struct kvt_disk_params *p, struct kvt_disk **out, char *err, size_t err_len)
{
	const char *engine = getenv("KVTIER_DISK_IO");
	struct kvt_disk *d;
	struct stat sb;
	uint64_t slots;
	int e;

	if (!p || !out || !p->dir || !p->dir[0] || p->unit_bytes == 0 ||
	    p->unit_bytes > UNIT_MAX_BYTES || p->queue_depth == 0 || p->queue_depth > 4096)
		return fail(err, err_len, -EINVAL, "disk tier: bad parameters");
	if (p->model && !(p->model_gbps > 0 && isfinite(p->model_gbps)))
		return fail(err, err_len, -EINVAL, "disk tier: model bandwidth must be > 0");
	if (engine && *engine && strcmp(engine, "uring") && strcmp(engine, "sync"))
		return fail(err, err_len, -EINVAL, "KVTIER_DISK_IO=%s: expected uring or sync",
			    engine);
	if (stat(p->dir, &sb)) {
		e = -errno;
		return fail(err, err_len, e, "spill directory %s: %s", p->dir, strerror(-e));
	}
	if (!S_ISDIR(sb.st_mode))
		return fail(err, err_len, -ENOTDIR, "spill directory %s: not a directory", p->dir);
	if (access(p->dir, W_OK | X_OK)) {
		e = -errno;
		return fail(err, err_len, e, "spill directory %s: %s", p->dir, strerror(-e));
	}
	d = kvt_calloc(1, sizeof(*d));
	if (!d)
		return fail(err, err_len, -ENOMEM, "disk tier: no memory");
	d->p = *p;
	d->p.dir = NULL; /* the caller's string need not outlive open */
	d->fd = -1;
	d->slot_bytes = (p->unit_bytes + DISK_ALIGN - 1) / DISK_ALIGN * DISK_ALIGN;
	slots = p->max_bytes ? p->max_bytes / d->slot_bytes : DISK_MAX_SLOTS;
	d->slots_max = slots > DISK_MAX_SLOTS ? DISK_MAX_SLOTS : (uint32_t)slots;
	if (d->slots_max == 0) {
		e = fail(err, err_len, -EINVAL, "disk_bytes %llu hold no slot of %llu bytes",
			 (unsigned long long)p->max_bytes, (unsigned long long)d->slot_bytes);
		goto fail;
	}
	d->st.slot_bytes = d->slot_bytes;
	d->st.slots_max = p->max_bytes ? d->slots_max : UINT64_MAX;
	if (p->model) {
		*out = d;
		return 0;
	}

	d->p.dir = p->dir;
	e = open_file(d, err, err_len);
	d->p.dir = NULL;
	if (e)
		goto fail;

	/* Bounce buffers: up to queue_depth of them within STAGE_MAX_BYTES (at least two). */
	d->n_bufs = (uint32_t)(STAGE_MAX_BYTES / d->slot_bytes);
	d->n_bufs = d->n_bufs < 2 ? 2 : d->n_bufs > p->queue_depth ? p->queue_depth : d->n_bufs;
	d->submit_every = (uint32_t)(SUBMIT_BYTES / d->slot_bytes);
	d->submit_every = d->submit_every > d->n_bufs / 4 ? d->n_bufs / 4 : d->submit_every;
	d->submit_every = d->submit_every < 1 ? 1 : d->submit_every;
	if (!engine || strcmp(engine, "sync")) {
		e = io_uring_queue_init(d->n_bufs, &d->ring, 0);
		if (e < 0) {
			d->st.uring_err = e;
			kvt_log(KVT_LOG_WARN,
				"disk tier: io_uring refused (%s): pread/pwrite from now on",
				strerror(-e));
		} else {
			d->ring_ok = true;
			d->timed = (d->ring.features & IORING_FEAT_EXT_ARG) != 0;
		}
	}
	d->sync = !d->ring_ok;
	d->stage = kvt_disk_buf_alloc(d->n_bufs * d->slot_bytes);
	d->buf_free = kvt_calloc(d->n_bufs, sizeof(*d->buf_free));
	d->fl = kvt_calloc(d->n_bufs, sizeof(*d->fl));
	if (!d->stage || !d->buf_free || !d->fl) {
		e = fail(err, err_len, -ENOMEM, "disk tier: no memory for %u bounce buffers",
			 d->n_bufs);
		goto fail;
	}
	for (uint32_t b = 0; b < d->n_bufs; b++)
		d->buf_free[b] = d->n_bufs - 1 - b;
	d->n_buf_free = d->n_bufs;
	if (d->sync) {
		d->sbuf = d->stage;
		d->sbuf_n = d->n_bufs;
	} else {
		struct iovec *iov = kvt_calloc(d->n_bufs, sizeof(*iov));

		if (iov) {
			for (uint32_t b = 0; b < d->n_bufs; b++)
				iov[b] =
					(struct iovec){d->stage + b * d->slot_bytes, d->slot_bytes};
			/* Registered buffers spare the kernel a page walk per I/O; without them
			   (memlock limits) plain reads and writes do the same job. */
			d->fixed = io_uring_register_buffers(&d->ring, iov, d->n_bufs) == 0;
			free(iov);
		}
	}
	*out = d;
	return 0;
fail:
	kvt_disk_close(d);
	return e;
}

void kvt_disk_close(struct kvt_disk *d)
{
	if (!d)
		return;
	if (d->io_live) { /* idle: every batch waits for its last run */
		pthread_mutex_lock(&d->io_mu);
		d->io_quit = true;
		pthread_cond_broadcast(&d->io_cv);
		pthread_mutex_unlock(&d->io_mu);
		pthread_join(d->io_th, NULL);
		pthread_cond_destroy(&d->io_cv);
		pthread_mutex_destroy(&d->io_mu);
	}
	if (d->ring_ok)
		io_uring_queue_exit(&d->ring);
	if (d->fd >= 0)
		close(d->fd);
	if (d->sbuf != d->stage)
		free(d->sbuf);
	free(d->stage);
	free(d->buf_free);
	free(d->fl);
	free(d->free_slots);
	free(d->crc);
	free(d->in_use);
	free(d);
}

/* Model mode: slots and figures as a real batch would have them, time from the model. */
static uint32_t model_batch(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n, bool write)
{
	uint64_t bytes = 0;
	uint32_t ok = 0;

	for (uint32_t i = 0; i < n; i++) {
		io[i].res = unit_slot(d, &io[i], write);
		if (!io[i].res && kvt_fault(KVT_FAULT_IO)) {
			io[i].res = -EIO;
			d->st.io_errors++;
			if (write)
				kvt_disk_release(d, io[i].slot);
		}
		if (io[i].res)
			continue;
		ok++;
		bytes += d->slot_bytes;
	}
	if (write) {
		d->st.units_written += ok;
		d->st.bytes_written += bytes;
	} else {
		d->st.units_read += ok;
		d->st.bytes_read += bytes;
	}
	if (n)
		d->st.model_ns +=
			d->p.model_ns + (uint64_t)llround((double)bytes / d->p.model_gbps);
	return ok;
}

/* Settles the I/O of unit x through buf that moved res (bytes, or -errno) instead of the whole
   slot, where that says nothing of the disk yet: a transfer that came short (a write the file
   took only part of, at a file system or file size limit) or was interrupted (-EINTR, -EAGAIN)
   is continued from where it stopped, synchronously, until the slot has moved or the call
   says why not. What the I/O moved in the end (slot_bytes), or its -errno. */
static int settle(struct kvt_disk *d, const struct kvt_disk_io *x, uint8_t *buf, int res,
		  bool write)
{
	off_t off = (off_t)((uint64_t)x->slot * d->slot_bytes);

	if (res == -EINTR || res == -EAGAIN)
		res = 0;
	while (res >= 0 && res < (int)d->slot_bytes) {
		size_t left = d->slot_bytes - (size_t)res;
		ssize_t r;

		d->st.ios++;
		do
			r = write ? pwrite(d->fd, buf + res, left, off + res)
				  : pread(d->fd, buf + res, left, off + res);
		while (r < 0 && (errno == EINTR || errno == EAGAIN));
		if (r <= 0)
			return r < 0 ? -errno : -EIO; /* a read past the end of the file */
		res += (int)r;
	}
	return res;
}

/* The end of unit x's I/O through buf, of result res (bytes, or -errno); crc: of the unit
   written. Whether it went. Only failures of the disk itself count in io_errors (and the I/O
   fault site, which fails an I/O that went as the device would): a write the spill file's
   limits refused (-ENOSPC, -EDQUOT, -EFBIG: a full file system or quota, the process's file
   size limit) fails with -ENOSPC and is not counted. */
static bool finish(struct kvt_disk *d, struct kvt_disk_io *x, uint8_t *buf, int res, uint32_t crc,
		   bool write)
{
	if (res != (int)d->slot_bytes)
		res = settle(d, x, buf, res, write);
	if (res == (int)d->slot_bytes && kvt_fault(KVT_FAULT_IO))
		res = -EIO;
	if (res != (int)d->slot_bytes) {
		x->res = write && (res == -ENOSPC || res == -EDQUOT || res == -EFBIG) ? -ENOSPC
										      : -EIO;
		if (x->res == -EIO)
			d->st.io_errors++;
		if (write)
			kvt_disk_release(d, x->slot);
		return false;
	}
	if (write) {
		d->crc[x->slot] = crc;
		d->st.units_written++;
		d->st.bytes_written += d->slot_bytes;
	} else {
		VALGRIND_MAKE_MEM_DEFINED(buf, d->slot_bytes);
		if (crc32_iscsi(buf, (int)d->p.unit_bytes, 0) != d->crc[x->slot]) {
			x->res = -EBADMSG;
			d->st.checksum_errors++;
			return false;
		}
		memcpy((void *)(uintptr_t)x->addr, buf, d->p.unit_bytes);
		d->st.units_read++;
		d->st.bytes_read += d->slot_bytes;
	}
	x->res = 0;
	return true;
}

/* Completion of the ring's I/O on bounce buffer b with result res. */
static bool complete(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t b, int res, bool write)
{
	d->buf_free[d->n_buf_free++] = b;
	return finish(d, &io[d->fl[b].io], d->stage + b * d->slot_bytes, res, d->fl[b].crc, write);
}

/* One preadv or pwritev of k slots from `lo` on, the iov[i] slot_bytes each in file order;
   the bytes moved, or -errno. k * slot_bytes is at most STAGE_MAX_BYTES, or one slot
   (<= UNIT_MAX_BYTES): it fits an int. Touches nothing of d but its file (the I/O thread). */
static int pio(const struct kvt_disk *d, const struct iovec *iov, uint32_t k, uint32_t lo,
	       bool write)
{
	off_t off = (off_t)((uint64_t)lo * d->slot_bytes);
	ssize_t r;

	do
		r = write ? pwritev(d->fd, iov, (int)k, off) : preadv(d->fd, iov, (int)k, off);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : (int)r;
}

/* The synchronous engine's I/O on the calling thread. */
static int sync_rw(struct kvt_disk *d, const struct iovec *iov, uint32_t k, uint32_t lo, bool write)
{
	d->st.ios++;
	return pio(d, iov, k, lo, write);
}

/* Bounce buffers for the synchronous engine once the ring has failed (its own may still be the
   kernel's): as many slots as the ring had, else one. */
static void sync_buffers(struct kvt_disk *d)
{
	d->sbuf = kvt_disk_buf_alloc(d->n_bufs * d->slot_bytes);
	d->sbuf_n = d->n_bufs;
	if (!d->sbuf) {
		d->sbuf = kvt_disk_buf_alloc(d->slot_bytes);
		d->sbuf_n = 1;
	}
	if (!d->sbuf)
		d->sbuf_n = 0;
}

/* The I/O thread: does the I/O of each run posted to it, until close. */
static void *io_thread(void *arg)
{
	struct kvt_disk *d = arg;

	pthread_mutex_lock(&d->io_mu);
	for (;;) {
		struct sync_run *run;

		while (!d->io_job && !d->io_quit)
			pthread_cond_wait(&d->io_cv, &d->io_mu);
		if (!d->io_job)
			break;
		run = d->io_job;
		pthread_mutex_unlock(&d->io_mu);
		run->res = pio(d, run->iov, run->k, run->lo, run->write);
		pthread_mutex_lock(&d->io_mu);
		d->io_job = NULL;
		pthread_cond_broadcast(&d->io_cv);
	}
	pthread_mutex_unlock(&d->io_mu);
	return NULL;
}

/* Starts the I/O thread once; false (and the engine copies and does its I/O in turn) if the
   system refuses it. */
static bool io_thread_start(struct kvt_disk *d)
{
	int e;

	if (d->io_live || d->io_refused)
		return d->io_live;
	pthread_mutex_init(&d->io_mu, NULL);
	pthread_cond_init(&d->io_cv, NULL);
	e = kvt_thread_create(&d->io_th, "kvt-disk-io", io_thread, d);
	if (e) {
		kvt_log(KVT_LOG_WARN, "disk tier: no I/O thread (%s): copies and I/O in turn",
			strerror(e));
		pthread_cond_destroy(&d->io_cv);
		pthread_mutex_destroy(&d->io_mu);
		d->io_refused = true;
		return false;
	}
	d->io_live = true;
	return true;
}

/* Starts run's I/O: on the I/O thread (async), else here and now. */
static void run_post(struct kvt_disk *d, struct sync_run *run, bool async)
{
	d->st.ios++;
	if (!async) {
		run->res = pio(d, run->iov, run->k, run->lo, run->write);
		return;
	}
	pthread_mutex_lock(&d->io_mu);
	d->io_job = run;
	pthread_cond_broadcast(&d->io_cv);
	pthread_mutex_unlock(&d->io_mu);
}

/* Waits until the posted run's I/O is done. */
static void run_wait(struct kvt_disk *d)
{
	if (!d->io_live)
		return;
	pthread_mutex_lock(&d->io_mu);
	while (d->io_job)
		pthread_cond_wait(&d->io_cv, &d->io_mu);
	pthread_mutex_unlock(&d->io_mu);
}

/* Units of a batch: res 1 is pending (a write without its slot yet), SLOT_TAKEN pending with
   its slot taken (write) or checked (read). */
#define SLOT_TAKEN 2

/* The next run of the batch from *i on: pending units (res > 0) in consecutive slots, rising
   or falling (fresh slots rise; reused ones come off the free stack falling), at most max,
   in the bounce buffers from buf on (writes: copied in and checksummed). Writes take their
   slots here. Whether there is one (false: every unit left is done or failed). */
static bool run_build(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n, uint32_t *i,
		      uint32_t max, uint32_t buf, bool write, struct sync_run *run)
{
	uint32_t k = 0, first = 0;
	int dir = 0;

	while (*i + k < n && k < max) {
		struct kvt_disk_io *x = &io[*i + k];
		int e = 0;

		if (x->res == 1)
			e = unit_slot(d, x, write);
		if (e || x->res <= 0) {
			if (e)
				x->res = e;
			if (k)
				break;
			(*i)++;
			continue;
		}
		x->res = SLOT_TAKEN;
		if (k == 1 && (x->slot == first + 1 || x->slot + 1 == first))
			dir = x->slot > first ? 1 : -1;
		if (k && (!dir || x->slot != first + (uint32_t)(dir * (int)k)))
			break; /* starts the next run, its slot taken */
		if (!k)
			first = x->slot;
		if (write)
			d->fl[buf + k].crc = fill_unit(d, x, d->sbuf + (buf + k) * d->slot_bytes);
		k++;
	}
	if (!k)
		return false;
	*run = (struct sync_run){.i = *i,
				 .k = k,
				 .lo = dir < 0 ? first - (k - 1) : first,
				 .buf = buf,
				 .dir = dir,
				 .write = write};
	for (uint32_t u = 0; u < k; u++)
		run->iov[dir < 0 ? k - 1 - u : u] =
			(struct iovec){d->sbuf + (buf + u) * d->slot_bytes, d->slot_bytes};
	*i += k;
	return true;
}

/* The outcome of each unit of a run whose I/O is done; a run whose I/O failed or came short
   is redone a unit at a time (here), so that every unit gets its own, as through the ring.
   Reads: checked and copied out. The units that went. */
static uint32_t run_finish(struct kvt_disk *d, struct kvt_disk_io *io, const struct sync_run *run)
{
	uint32_t ok = 0, k = run->k;

	for (uint32_t u = 0; u < k; u++) {
		const struct iovec *v = &run->iov[run->dir < 0 ? k - 1 - u : u];
		struct kvt_disk_io *x = &io[run->i + u];
		int res = run->res == (int)(k * d->slot_bytes) ? (int)d->slot_bytes
			  : k == 1			       ? run->res
				   : sync_rw(d, v, 1, x->slot, run->write);

		ok += finish(d, x, v->iov_base, res, d->fl[run->buf + u].crc, run->write);
	}
	return ok;
}

/* The synchronous engine: the batch's pending units (res > 0) in runs of consecutive slots
   (run_build), each one preadv or pwritev of at most SYNC_RUN_MAX units and STAGE_MAX_BYTES
   through the bounce buffers. With the I/O thread and two halves of buffers, a run's I/O
   overlaps the copies of the next one in (writes) or of the last one out (reads). */
static uint32_t run_sync(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n, bool write)
{
	struct sync_run runs[2], *prev = NULL;
	uint32_t ok = 0, max, i = 0, halves, h = 0;

	if (!d->sbuf)
		sync_buffers(d);
	halves = d->sbuf_n >= 2 && io_thread_start(d) ? 2 : 1;
	max = (uint32_t)(STAGE_MAX_BYTES / d->slot_bytes);
	max = max < 1 ? 1 : max > SYNC_RUN_MAX ? SYNC_RUN_MAX : max;
	max = max > d->sbuf_n / halves ? d->sbuf_n / halves : max;
	for (;;) {
		struct sync_run *run = &runs[h];
		/* writes: copied in while prev's I/O runs */
		bool have = max && run_build(d, io, n, &i, max, h * max, write, run);

		if (prev)
			run_wait(d);
		/* on the thread if there is something to do meanwhile: the copies of the next run
		   in or of the last one out (a batch of one run waits for no handoff) */
		if (have)
			run_post(d, run, halves == 2 && (i < n || (prev && !write)));
		if (prev)
			ok += run_finish(d, io, prev); /* reads: copied out while run's I/O runs */
		prev = NULL;
		if (!have)
			break;
		if (halves == 1)
			ok += run_finish(d, io, run);
		else
			prev = run;
		h = (h + 1) % halves;
	}
	/* without bounce buffers nothing ran */
	for (; i < n; i++)
		if (io[i].res > 0) {
			if (write && io[i].res == SLOT_TAKEN)
				kvt_disk_release(d, io[i].slot);
			io[i].res = -ENOMEM;
		}
	return ok;
}

/* The ring itself failed (not one I/O), with units 0..queued-1 of the batch queued. What is in
   flight may still complete at any time, into its bounce buffer and its slot: neither is used
   again. The units not done yet, and every later batch, go through the synchronous engine
   with its own buffers (the ring's stay allocated until close); the slots stay taken but leave
   slots_used. */
static void ring_failed(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t queued, bool write,
			int err)
{
	kvt_log(KVT_LOG_WARN, "disk tier: the io_uring failed (%s): pread/pwrite from now on",
		strerror(-err));
	d->sync = true;
	d->st.uring_err = err;
	if (!write)
		return;
	for (uint32_t i = 0; i < queued; i++)
		if (io[i].res > 0) {
			d->n_used--;
			d->st.slots_abandoned++;
		}
}

/* Queues unit i of the batch on a free bounce buffer (write: copied in and checksummed). */
static void queue_io(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t i, bool write)
{
	uint32_t b = d->buf_free[--d->n_buf_free];
	uint8_t *buf = d->stage + b * d->slot_bytes;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring); /* n_bufs entries: never NULL */
	uint64_t off = (uint64_t)io[i].slot * d->slot_bytes;

	d->fl[b].io = i;
	d->st.ios++;
	if (write) {
		d->fl[b].crc = fill_unit(d, &io[i], buf);
		if (d->fixed)
			io_uring_prep_write_fixed(sqe, d->fd, buf, (unsigned)d->slot_bytes, off,
						  (int)b);
		else
			io_uring_prep_write(sqe, d->fd, buf, (unsigned)d->slot_bytes, off);
	} else {
		if (d->fixed)
			io_uring_prep_read_fixed(sqe, d->fd, buf, (unsigned)d->slot_bytes, off,
						 (int)b);
		else
			io_uring_prep_read(sqe, d->fd, buf, (unsigned)d->slot_bytes, off);
	}
	io_uring_sqe_set_data64(sqe, b);
}

/* Hands the queued I/Os to the kernel; with wait, also waits for a completion, at most
   WAIT_MAX_S where the kernel can bound the wait. 0 or the ring's -errno; -ETIME when no I/O
   completed in time (where the same call also submitted, the kernel reports the submission
   and the next wait the timeout): a completion the kernel lost (seen once on the development
   VM: 36 direct writes taken by the kernel, none in flight on the device, no completion after
   15 minutes) then costs a minute or two and the ring, not the caller's thread. The test hooks
   fail the nth call (break_in), or drop the completions of the nth wait and time it out after
   stall_ms (stall_in). */
static int ring_submit(struct kvt_disk *d, bool wait)
{
	struct __kernel_timespec ts = {.tv_sec = WAIT_MAX_S};
	struct io_uring_cqe *cqe;
	int r;

	if (d->break_in && !--d->break_in)
		return d->break_err;
	if (wait && d->stall_in && !--d->stall_in) {
		/* the completions of what is in flight are lost: each is dropped as it comes,
		   until none comes for stall_ms (the kernel reports a timed-out wait as -ETIME
		   only with the completion queue empty) */
		while ((r = io_uring_submit(&d->ring)) == -EINTR)
			;
		if (r < 0)
			return r;
		ts = (struct __kernel_timespec){.tv_sec = d->stall_ms / 1000,
						.tv_nsec =
							(long long)(d->stall_ms % 1000) * 1000000};
		while ((r = io_uring_wait_cqe_timeout(&d->ring, &cqe, &ts)) == 0 || r == -EINTR)
			if (!r)
				io_uring_cqe_seen(&d->ring, cqe);
		return r;
	}
	do {
		if (!wait)
			r = io_uring_submit(&d->ring);
		else if (d->timed)
			r = io_uring_submit_and_wait_timeout(&d->ring, &cqe, 1, &ts, NULL);
		else
			r = io_uring_submit_and_wait(&d->ring, 1);
	} while (r == -EINTR);
	return r < 0 ? r : 0;
}

/* Queues units from *next on while bounce buffers are free, at most `most`, the writes handed
   to the kernel as they are filled, SUBMIT_BYTES or a quarter of the buffers at a time, whichever
   comes first (the rest go with the caller's next submission). A unit whose slot is refused is
   done (its res). 0 or the ring's -errno. */
static int feed(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n, uint32_t *next,
		uint32_t *inflight, uint32_t most, bool write)
{
	uint32_t unsent = 0;

	while (*next < n && d->n_buf_free && most) {
		/* io[].res stays 1 (in flight) until its completion */
		int e = unit_slot(d, &io[*next], write);

		if (e) {
			io[(*next)++].res = e;
			continue;
		}
		queue_io(d, io, (*next)++, write);
		(*inflight)++;
		most--;
		if (write && ++unsent == d->submit_every) {
			unsent = 0;
			if ((e = ring_submit(d, false)))
				return e;
		}
	}
	return 0;
}

/* Runs a batch with at most n_bufs I/Os in flight and keeps the device fed while this thread
   copies: writes go to the kernel a few at a time as their bounce buffers are filled (feed), and
   the buffer of a read just copied out is read into again before the next completion is copied.
   Refilled only after each wait, all the buffers at once, the device sat idle during the copies
   (see the README's disk tier figures). */
static uint32_t run_batch(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n, bool write)
{
	uint32_t next = 0, inflight = 0, ok = 0;
	int r;

	if (d->sync)
		return run_sync(d, io, n, write);

	for (;;) {
		struct io_uring_cqe *cqe;

		r = feed(d, io, n, &next, &inflight, UINT32_MAX, write);
		if (r || !inflight)
			break;
		r = ring_submit(d, true); /* with what feed left queued (the reads) */
		while (!r && io_uring_peek_cqe(&d->ring, &cqe) == 0) {
			uint32_t b = (uint32_t)io_uring_cqe_get_data64(cqe), before;
			int res = cqe->res;

			io_uring_cqe_seen(&d->ring, cqe);
			inflight--;
			ok += complete(d, io, b, res, write);
			if (write)
				continue; /* feed refills the write buffers, at the top */
			before = inflight;
			r = feed(d, io, n, &next, &inflight, 1, false);
			if (!r && inflight > before)
				r = ring_submit(d, false);
		}
		if (r)
			break;
	}
	if (r) {
		ring_failed(d, io, next, write, r);
		return ok + run_sync(d, io, n, write);
	}
	return ok;
}

uint32_t kvt_disk_write(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n)
{
	if (d->p.model)
		return model_batch(d, io, n, true);
	/* res > 0 marks units not done yet (run_sync takes those should the ring break) */
	for (uint32_t i = 0; i < n; i++)
		io[i].res = 1;
	return run_batch(d, io, n, true);
}

uint32_t kvt_disk_read(struct kvt_disk *d, struct kvt_disk_io *io, uint32_t n)
{
	if (d->p.model)
		return model_batch(d, io, n, false);
	for (uint32_t i = 0; i < n; i++)
		io[i].res = 1;
	return run_batch(d, io, n, false);
}

void kvt_disk_stats(const struct kvt_disk *d, struct kvt_disk_stats *out)
{
	*out = d->st;
	out->slots_used = d->n_used;
	out->slots_high = d->high;
	out->uring = !d->p.model && !d->sync;
	out->io_thread = d->io_live;
}

int kvt_disk_corrupt(struct kvt_disk *d, uint32_t slot)
{
	uint8_t *buf;
	int e = 0;

	if (d->p.model)
		return -ENOTSUP;
	if (!slot_used(d, slot))
		return -ENOENT;
	buf = aligned_alloc(DISK_ALIGN, d->slot_bytes);
	if (!buf)
		return -ENOMEM;
	if (pread(d->fd, buf, d->slot_bytes, (off_t)(slot * d->slot_bytes)) !=
	    (ssize_t)d->slot_bytes) {
		e = -EIO;
	} else {
		buf[0] ^= 0xff;
		buf[d->p.unit_bytes - 1] ^= 0x5a;
		if (pwrite(d->fd, buf, d->slot_bytes, (off_t)(slot * d->slot_bytes)) !=
		    (ssize_t)d->slot_bytes)
			e = -EIO;
	}
	free(buf);
	return e;
}

int kvt_disk_stall_ring(struct kvt_disk *d, uint32_t nth, uint32_t ms)
{
	if (!d || (nth && !ms))
		return -EINVAL;
	if (d->p.model || d->sync || !d->timed)
		return -ENOTSUP;
	d->stall_in = nth;
	d->stall_ms = ms;
	return 0;
}

int kvt_disk_break_ring(struct kvt_disk *d, uint32_t nth, int err)
{
	if (!d || (nth && err >= 0))
		return -EINVAL;
	if (d->p.model || d->sync)
		return -ENOTSUP;
	d->break_in = nth;
	d->break_err = err;
	return 0;
}
