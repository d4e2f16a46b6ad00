/* SPDX-License-Identifier: MIT */
/*
 * The manager's life cycle (manager/manager.c), beyond the public API. Calls recall.c,
 * spill.c and base.c.
 */
#ifndef KVT_MANAGER_H
#define KVT_MANAGER_H

#include "backend.h"
#include "kvtier.h"

/* Creates a manager on an explicit backend, bypassing the public backend choice (benchmarks
   use the null backend this way). */
int kvt_manager_create_with(const struct kvt_config *cfg, const struct kvt_backend_ops *ops,
			    struct kvt_manager **out);

#endif /* KVT_MANAGER_H */
