/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "backend.h"

int kvt_be_fail(struct kvt_be *b, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->err, sizeof(b->err), fmt, ap);
	va_end(ap);
	return err;
}

const struct kvt_backend_ops *kvt_backend_find(enum kvt_backend which, enum kvt_backend *resolved,
					       int *err)
{
	switch (which) {
	case KVT_BACKEND_AUTO: /* no CUDA backend in this build: the host one */
	case KVT_BACKEND_HOST:
		*resolved = KVT_BACKEND_HOST;
		return &kvt_backend_host_ops;
	case KVT_BACKEND_CUDA:
		*err = -ENODEV;
		return NULL;
	case KVT_BACKEND_MODEL:
		*resolved = KVT_BACKEND_MODEL;
		return &kvt_backend_model_ops;
	}
	*err = -EINVAL;
	return NULL;
}
