/* SPDX-License-Identifier: MIT */
/* The CPU kernel emulator's stand-in for the CUDA runtime header (see ../kemu.h). */
#ifndef KEMU_SHIM_CUDA_RUNTIME_H
#define KEMU_SHIM_CUDA_RUNTIME_H
#include "kemu.h"
#endif
