/* SPDX-License-Identifier: MIT */
/*
 * The library's own threads (save threads, the disk tier's I/O thread) start with every signal
 * blocked: signals sent to the process are the application's, and a thread of ours must never
 * be the one that runs its handler (or takes a signal its sigwait thread expects). Their names
 * start with "kvt-".
 */
#ifndef KVT_THREAD_H
#define KVT_THREAD_H

#include <pthread.h>
#include <signal.h>

/* pthread_create with every signal blocked in the new thread (the caller's mask is unchanged),
   named `name` (at most 15 characters: top -H, gdb, /proc/.../comm show it). 0 or
   pthread_create's error number (positive, as it returns it). */
static inline int kvt_thread_create(pthread_t *th, const char *name, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int e;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	e = pthread_create(th, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!e)
		(void)pthread_setname_np(*th, name); /* a hint for tools only */
	return e;
}

#endif
