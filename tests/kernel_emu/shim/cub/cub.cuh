/* SPDX-License-Identifier: MIT */
/*
 * The CPU kernel emulator's stand-in for the two CUB algorithms policy/snapkv.cu calls, with
 * CUB's contracts: a NULL temp_storage asks for the size; the call proper needs at least that
 * many bytes; SortPairs is a stable sort on bits [begin_bit, end_bit) of the key with separate
 * in and out buffers; Flagged keeps the flagged items in order and writes their count. The temp
 * storage is filled with garbage, so a caller that keeps data there loses it as on a GPU.
 */
#ifndef KEMU_SHIM_CUB_CUH
#define KEMU_SHIM_CUB_CUH

#include <stdio.h>

#include <algorithm>
#include <vector>

#include "kemu.h"

namespace cub
{

namespace detail
{

static inline bool overlap(const void *a, size_t na, const void *b, size_t nb)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return na && nb && x < y + nb && y < x + na;
}

} /* namespace detail */

struct DeviceRadixSort {
	template <typename K, typename V, typename N>
	static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *kin, K *kout,
				     const V *vin, V *vout, N n, int begin_bit = 0,
				     int end_bit = (int)sizeof(K) * 8,
				     cudaStream_t stream = nullptr)
	{
		size_t items = (size_t)n, need = 256 + items * (sizeof(K) + sizeof(V));
		int bits = end_bit - begin_bit;
		K mask = bits >= (int)sizeof(K) * 8 ? (K) ~(K)0 : (K)(((K)1 << bits) - 1);
		std::vector<size_t> idx(items);

		(void)stream;
		if (n < 0 || begin_bit < 0 || bits <= 0 || end_bit > (int)sizeof(K) * 8)
			return cudaErrorInvalidValue;
		if (!temp) {
			temp_bytes = need;
			return cudaSuccess;
		}
		if (temp_bytes < need || (items && (!kin || !kout || !vin || !vout)) ||
		    detail::overlap(kin, items * sizeof(K), kout, items * sizeof(K)) ||
		    detail::overlap(vin, items * sizeof(V), vout, items * sizeof(V)) ||
		    detail::overlap(temp, temp_bytes, kout, items * sizeof(K)) ||
		    detail::overlap(temp, temp_bytes, vout, items * sizeof(V))) {
			fprintf(stderr, "kemu: cub::DeviceRadixSort::SortPairs: bad arguments\n");
			return cudaErrorInvalidValue;
		}
		memset(temp, 0xa5, temp_bytes);
		for (size_t i = 0; i < items; i++)
			idx[i] = i;
		std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
			return (K)(kin[a] >> begin_bit & mask) < (K)(kin[b] >> begin_bit & mask);
		});
		for (size_t i = 0; i < items; i++) {
			kout[i] = kin[idx[i]];
			vout[i] = vin[idx[i]];
		}
		return cudaSuccess;
	}
};

struct DeviceSelect {
	template <typename In, typename F, typename Out, typename NS, typename N>
	static cudaError_t Flagged(void *temp, size_t &temp_bytes, const In *in, const F *flags,
				   Out *out, NS *n_selected, N n, cudaStream_t stream = nullptr)
	{
		size_t items = (size_t)n, need = 256, k = 0;

		(void)stream;
		if (n < 0)
			return cudaErrorInvalidValue;
		if (!temp) {
			temp_bytes = need;
			return cudaSuccess;
		}
		if (temp_bytes < need || !n_selected || (items && (!in || !flags || !out))) {
			fprintf(stderr, "kemu: cub::DeviceSelect::Flagged: bad arguments\n");
			return cudaErrorInvalidValue;
		}
		memset(temp, 0xa5, temp_bytes);
		for (size_t i = 0; i < items; i++)
			if (flags[i])
				out[k++] = in[i];
		*n_selected = (NS)k;
		return cudaSuccess;
	}
};

} /* namespace cub */

#endif /* KEMU_SHIM_CUB_CUH */
