/* SPDX-License-Identifier: MIT */
/*
 * The helpers every part of the manager shares (base.h): error recording, scratch growth, the
 * device-work bookkeeping around transfers, and the lookup of a usable sequence. They call
 * nothing of the manager's other files.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "base.h"
#include "manager.h"

/* (declared in manager.h, for the benchmarks; here, as the recall calls' phase timing reads
   it too, and base.c imports nothing of the manager's other files) */
void kvt_manager_be_stats(const struct kvt_manager *m, struct kvt_be_stats *out)
{
	*out = (struct kvt_be_stats){0};
	if (m->ops->stats)
		m->ops->stats(m->be, out);
}

uint64_t kvt_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void kvt_verror(char *buf, size_t len, const char *who, int err, const char *fmt, va_list ap)
{
	int n = vsnprintf(buf, len, fmt, ap);

	if (n >= 0 && (size_t)n < len - 3)
		snprintf(buf + n, len - (size_t)n, " (%s)", kvt_strerror(err));
	kvt_log(KVT_LOG_DEBUG, "%s%s", who, buf);
}

int kvt_fail(struct kvt_manager *m, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvt_verror(m->err, sizeof(m->err), "", err, fmt, ap);
	va_end(ap);
	return err;
}

int kvt_reserve_with(void *(*re)(void *, size_t), void **arr, uint32_t *cap, uint32_t n, size_t sz)
{
	uint32_t c = *cap ? *cap : 64;
	void *p;

	if (n <= *cap)
		return 0;
	while (c < n)
		c = c > UINT32_MAX / 2 ? n : c * 2;
	p = re(*arr, (size_t)c * sz);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = c;
	return 0;
}

int kvt_reserve(void **arr, uint32_t *cap, uint32_t n, size_t sz)
{
	return kvt_reserve_with(kvt_realloc, arr, cap, n, sz);
}

int kvt_host_copy(struct kvt_manager *m, const void *src, uint64_t bytes, void *stream)
{
	if (bytes > UINT32_MAX ||
	    kvt_reserve((void **)&m->hcopy, &m->hcopy_cap, (uint32_t)bytes, 1))
		return kvt_be_fail(m->be, -ENOMEM, "no memory for a host copy of %llu bytes",
				   (unsigned long long)bytes);
	return KVT_XFER(m, read_d2h, m->hcopy, (uint64_t)(uintptr_t)src, bytes, stream);
}

int kvt_dev_quiesce(struct kvt_manager *m)
{
	int err;

	if (!m->dev_queued)
		return 0;
	err = m->ops->sync(m->be, NULL);
	if (!err)
		m->dev_queued = false;
	return err;
}

int kvt_dev_gather(struct kvt_manager *m, uint32_t nx, void *stream)
{
	int err;

	kvt_dev_queue(m);
	err = KVT_XFER(m, gather_h2d, m->xf, nx, stream);
	if (err)
		kvt_dev_quiesce(m); /* part of the load may be queued */
	return err;
}

struct kvt_seq *kvt_seq_usable(struct kvt_manager *m, uint64_t seq, const char *what, int *err)
{
	struct kvt_seq *s = kvt_seqmap_get(&m->seqs, seq);

	if (!s)
		*err = kvt_fail(m, -ENOENT, "%s%ssequence %llu is not live", what ? what : "",
				what ? ": " : "", (unsigned long long)seq);
	else if (s->lost)
		*err = kvt_fail(m, s->lost, "%s%ssequence %llu: its history was lost",
				what ? what : "", what ? ": " : "", (unsigned long long)seq);
	return s && !s->lost ? s : NULL;
}
