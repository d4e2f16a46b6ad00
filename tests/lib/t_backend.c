/* SPDX-License-Identifier: MIT */
#include "plugin.h"
#include "t_backend.h"

enum kvt_backend t_auto_backend(void)
{
	const struct kvt_plugin *p;
	char why[256];
	int err = 0;

	p = kvt_plugin_load(&err);
	return p && p->probe(why, sizeof(why)) == 0 ? KVT_BACKEND_CUDA : KVT_BACKEND_HOST;
}
