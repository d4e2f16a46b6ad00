/* SPDX-License-Identifier: MIT */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "util.h"
#include "plugin.h"

#ifndef KVT_PLUGIN_DIR
#define KVT_PLUGIN_DIR ""
#endif

int kvt_be_fail(struct kvt_be *b, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->err, sizeof(b->err), fmt, ap);
	va_end(ap);
	return err;
}

/* ---- The CUDA plugin ------------------------------------------------------------------ */

static void *host_malloc(size_t n)
{
	return kvt_malloc(n);
}

static void *host_calloc(size_t n, size_t size)
{
	return kvt_calloc(n, size);
}

static void *host_realloc(void *p, size_t n)
{
	return kvt_realloc(p, n);
}

static const struct kvt_plugin_host plugin_host = {
	.abi = KVT_PLUGIN_ABI,
	.size = sizeof(struct kvt_plugin_host),
	.malloc = host_malloc,
	.calloc = host_calloc,
	.realloc = host_realloc,
	.fault = kvt_fault,
	.log = kvt_log,
	.savepool_create = kvt_savepool_create,
	.savepool_destroy = kvt_savepool_destroy,
	.savepool_submit_xfer = kvt_savepool_submit_xfer,
	.savepool_submit_append = kvt_savepool_submit_append,
	.savepool_wait = kvt_savepool_wait,
};

static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;
static const struct kvt_plugin *plugin;
static char plugin_err[512];

/* dlopen of one candidate; on failure appends dlerror's text to plugin_err. */
static void *try_open(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	size_t used = strlen(plugin_err);

	if (!h && used < sizeof(plugin_err) - 1) {
		const char *e = dlerror();

		size_t room = sizeof(plugin_err) - used;
		int w = snprintf(plugin_err + used, room, "%s%s", used ? "; " : "", e ? e : path);

		if (w > 0 && (size_t)w >= room) /* cut short: say so */
			memcpy(plugin_err + sizeof(plugin_err) - 4, "...", 4);
	}
	return h;
}

/* The plugin next to the object this code was loaded from (libkvtier.so, or the program
   itself when linked statically), then in its kvtier/ subdirectory. */
static void *open_beside_self(void)
{
	static const char *const names[] = {KVT_PLUGIN_SONAME, "kvtier/" KVT_PLUGIN_SONAME};
	char dir[PATH_MAX];
	Dl_info info;
	char *slash;

	if (!dladdr((void *)&plugin_host, &info) || !info.dli_fname ||
	    strlen(info.dli_fname) >= sizeof(dir))
		return NULL;
	strcpy(dir, info.dli_fname);
	slash = strrchr(dir, '/');
	if (!slash)
		return NULL;
	*slash = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char path[PATH_MAX + 64];
		void *h;

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
		if (!h) {
			FILE *f = fopen(path, "r"); /* only report files that exist */

			if (!f)
				continue;
			fclose(f);
			h = try_open(path);
		}
		if (h)
			return h;
	}
	return NULL;
}

static void plugin_load_once(void)
{
	const char *env = getenv("KVTIER_CUDA_PLUGIN");
	kvt_plugin_entry_fn entry;
	void *h = NULL;

	if (env && *env) {
		h = try_open(env); /* named explicitly: no fallback to another copy */
	} else {
		h = open_beside_self();
		if (!h && KVT_PLUGIN_DIR[0] != '\0')
			h = try_open(KVT_PLUGIN_DIR "/" KVT_PLUGIN_SONAME);
		if (!h)
			h = try_open(KVT_PLUGIN_SONAME);
	}
	if (!h)
		return;
	*(void **)&entry = dlsym(h, KVT_PLUGIN_ENTRY);
	if (!entry) {
		snprintf(plugin_err, sizeof(plugin_err), "%s: no symbol %s", KVT_PLUGIN_SONAME,
			 KVT_PLUGIN_ENTRY);
		dlclose(h);
		return;
	}
	plugin = entry(&plugin_host);
	if (!plugin || plugin->abi != KVT_PLUGIN_ABI || plugin->size < sizeof(*plugin) ||
	    !plugin->ops || plugin->ops->version != KVT_BACKEND_OPS_VERSION) {
		snprintf(plugin_err, sizeof(plugin_err),
			 "%s: built for another kvtier (plugin ABI or backend ops version)",
			 KVT_PLUGIN_SONAME);
		plugin = NULL;
		dlclose(h);
		return;
	}
	plugin_err[0] = '\0'; /* the failures of earlier candidates no longer matter */
	/* The handle stays open for the life of the process: backends may be live anywhere. */
}

const struct kvt_plugin *kvt_plugin_load(int *err)
{
	pthread_once(&plugin_once, plugin_load_once);
	if (!plugin) {
		*err = -ENODEV;
		return NULL;
	}
	return plugin;
}

const char *kvt_plugin_error(void)
{
	return plugin_err;
}

/* The CUDA backend when the plugin loads and a device is usable; else NULL and why. */
static const struct kvt_backend_ops *cuda_ops(char *why, size_t len, int *err)
{
	const struct kvt_plugin *p = kvt_plugin_load(err);

	if (!p) {
		snprintf(why, len, "CUDA backend plugin not loaded (%s)",
			 plugin_err[0] ? plugin_err : "not found");
		return NULL;
	}
	*err = p->probe(why, len);
	return *err ? NULL : p->ops;
}

const struct kvt_backend_ops *kvt_backend_find(enum kvt_backend which, enum kvt_backend *resolved,
					       int *err)
{
	const struct kvt_backend_ops *ops;
	char why[640];

	switch (which) {
	case KVT_BACKEND_AUTO:
		ops = cuda_ops(why, sizeof(why), err);
		if (ops) {
			*resolved = KVT_BACKEND_CUDA;
			return ops;
		}
		kvt_log(KVT_LOG_INFO, "backend auto: host (%s)", why);
		*resolved = KVT_BACKEND_HOST;
		return &kvt_backend_host_ops;
	case KVT_BACKEND_HOST:
		*resolved = KVT_BACKEND_HOST;
		return &kvt_backend_host_ops;
	case KVT_BACKEND_CUDA:
		ops = cuda_ops(why, sizeof(why), err);
		if (!ops) {
			kvt_log(KVT_LOG_WARN, "backend cuda: %s", why);
			*err = -ENODEV;
			return NULL;
		}
		*resolved = KVT_BACKEND_CUDA;
		return ops;
	case KVT_BACKEND_MODEL:
		*resolved = KVT_BACKEND_MODEL;
		return &kvt_backend_model_ops;
	}
	*err = -EINVAL;
	return NULL;
}
