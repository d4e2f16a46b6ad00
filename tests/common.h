/* SPDX-License-Identifier: MIT */
/*
 * The name the trace tests (and kernel_emu's) include for the test library (lib/): its data
 * generator and tensor builders (t_data.h), small configurations (t_config.h), manager
 * shorthands (t_manager.h) and the backend under test (t_backend.h). The core suites include
 * those headers themselves.
 */
#ifndef KVT_TEST_COMMON_H
#define KVT_TEST_COMMON_H

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "policy.h"
#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"

#endif /* KVT_TEST_COMMON_H */
