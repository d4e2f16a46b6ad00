/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/*
 * The callback and its user data are read and replaced under log_mu, but no lock is held while
 * a callback runs: a slow callback on one thread holds up no other thread's message, and a
 * callback may reconfigure the logging. Each message being delivered (to a callback or to
 * stderr) is listed in log_calls, a node on the logging thread's stack, with the generation of
 * the pair it read, so that kvt_log_set can wait for the deliveries of the pairs it replaced.
 * log_depth tells kvt_log_set that its own thread is inside a callback, where waiting could
 * deadlock (on this very call, or on another thread doing the same), so it does not wait there.
 */
struct log_call {
	struct log_call *next;
	uint64_t gen; /* log_gen when this call read the pair */
};

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t log_call_done = PTHREAD_COND_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static kvt_log_fn log_fn;		 /* under log_mu */
static void *log_user;			 /* under log_mu */
static uint64_t log_gen;		 /* under log_mu: bumped by every kvt_log_set */
static struct log_call *log_calls;	 /* under log_mu: messages being delivered */
static _Thread_local unsigned log_depth; /* callbacks this thread is inside */
static int log_level = KVT_LOG_WARN;

static void log_init(void)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	const char *e = getenv("KVT_LOG");

	if (!e)
		return;
	for (int i = 0; i < 4; i++)
		if (strcmp(e, names[i]) == 0)
			__atomic_store_n(&log_level, i, __ATOMIC_RELAXED);
}

/* Whether a call of a pair older than generation gen is still running; under log_mu. */
static bool log_older_running(uint64_t gen)
{
	for (const struct log_call *c = log_calls; c; c = c->next)
		if (c->gen < gen)
			return true;
	return false;
}

KVT_API void kvt_log_set(kvt_log_fn fn, void *user)
{
	uint64_t gen;

	pthread_once(&log_once, log_init);
	pthread_mutex_lock(&log_mu);
	log_fn = fn;
	log_user = user;
	gen = ++log_gen;
	/* Calls that read the pair from here on get the new one; the older ones end when their
	   callbacks return (a callback must not wait for this thread: kvtier.h). */
	if (log_depth == 0)
		while (log_older_running(gen))
			pthread_cond_wait(&log_call_done, &log_mu);
	pthread_mutex_unlock(&log_mu);
}

KVT_API void kvt_log_set_level(enum kvt_log_level level)
{
	pthread_once(&log_once, log_init);
	__atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

bool kvt_log_enabled(enum kvt_log_level level)
{
	pthread_once(&log_once, log_init);
	return (int)level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

void kvt_log(enum kvt_log_level level, const char *fmt, ...)
{
	struct log_call call, **p;
	char msg[512];
	kvt_log_fn fn;
	void *user;
	va_list ap;
	int n;

	if (!kvt_log_enabled(level))
		return; /* checked before formatting */
	n = snprintf(msg, sizeof(msg), "kvtier: ");
	va_start(ap, fmt);
	vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&log_mu);
	fn = log_fn;
	user = log_user;
	call.gen = log_gen;
	call.next = log_calls;
	log_calls = &call;
	pthread_mutex_unlock(&log_mu);
	if (fn) {
		log_depth++;
		fn(user, level, msg);
		log_depth--;
	} else {
		fprintf(stderr, "%s\n", msg); /* stdio locks the stream: one line at a time */
	}
	pthread_mutex_lock(&log_mu);
	/* Only this thread unlinks its node, so the walk finds it (no ALWAYS() here: a
	   violation would log, and take log_mu again). */
	for (p = &log_calls; *p && *p != &call; p = &(*p)->next)
		;
	if (*p)
		*p = call.next;
	pthread_cond_broadcast(&log_call_done);
	pthread_mutex_unlock(&log_mu);
}

static uint64_t invariant_failures;

void kvt_invariant_failed(const char *file, int line, const char *expr, bool aborts)
{
	__atomic_add_fetch(&invariant_failures, 1, __ATOMIC_RELAXED);
	if (aborts) {
		/* Straight to stderr: a callback could itself be what is broken. */
		fprintf(stderr, "kvtier: %s:%d: invariant violated: %s\n", file, line, expr);
		abort();
	}
	kvt_log(KVT_LOG_ERROR, "%s:%d: invariant violated: %s (a bug in kvtier; please report it)",
		file, line, expr);
}

uint64_t kvt_invariant_failures(void)
{
	return __atomic_load_n(&invariant_failures, __ATOMIC_RELAXED);
}

KVT_API const char *kvt_strerror(int err)
{
	switch (err < 0 ? -(long long)err : (long long)err) {
	case 0:
		return "success";
	case EINVAL:
		return "invalid argument";
	case ENOENT:
		return "not found (no such sequence, scheduled request or committed iteration, or no "
		       "such spill directory)";
	case EEXIST:
		return "already exists";
	case ENOSPC:
		return "no space (output buffer, recall cache, spill file or its file system)";
	case ENOMEM:
		return "out of memory in a tier or the heap";
	case EOVERFLOW:
		return "value too large";
	case ENODEV:
		return "backend or device not available";
	case ENOTSUP:
		return "not supported (backend without payload, or no disk tier)";
	case EIO:
		return "I/O or device error";
	case EAGAIN:
		return "resource temporarily unavailable";
	case EBUSY:
		return "busy";
	case EBADMSG:
		return "stored data failed its checksum (lost)";
	case EALREADY:
		return "already in that state";
	case ESTALE:
		return "stale view (recall again)";
	case E2BIG:
		return "larger than the tier could ever hold";
	case ENOTDIR:
		return "not a directory";
	case EACCES:
		return "permission denied";
	case EPERM:
		return "operation not permitted";
	case EROFS:
		return "read-only file system";
	case ENAMETOOLONG:
		return "file name too long";
	case ELOOP:
		return "too many levels of symbolic links";
	case EMFILE:
		return "too many open files";
	}
	return "unknown error";
}

#define KVT_STR2(x) #x
#define KVT_STR(x) KVT_STR2(x)

KVT_API const char *kvt_version(void)
{
	return KVT_STR(KVT_VERSION_MAJOR) "." KVT_STR(KVT_VERSION_MINOR) "." KVT_STR(
		KVT_VERSION_PATCH);
}
