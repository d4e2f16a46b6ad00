/* SPDX-License-Identifier: MIT */
/*
 * A fake of the cuBLAS functions that kvtier-bench calibrate looks up (transfer/cuda_calib.c),
 * over the fake CUDA runtime, so that its measurements run end to end where there is no GPU: the
 * tests name this library to the plugin with KVTIER_CUBLAS. The functions have the types of
 * CUDA's cublas_api.h, so a signature the plugin would call wrongly does not compile here.
 *
 * Each GEMM is checked as cuBLAS checks its arguments (sizes, leading dimensions) and for the
 * types calibrate asks for (bf16 operands and result, fp32 compute, the default algorithm;
 * anything else is a warning, which fails the process at exit), then launched on the handle's
 * stream through the fake runtime; when it runs, every operand of every batch is viewed, so one
 * that does not lie inside one live device allocation stops the test there with a stack. It
 * computes nothing: calibrate reads no result, and the fake's events give made-up times.
 * A handle still live when the library is unloaded or the process exits is a warning too.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <cublas_api.h>

#include "fake_cudart.h"

#define HANDLE_MAGIC 0x6b626c61u
#define ELEM 2 /* bf16 */

struct cublasContext {
	uint32_t magic;
	cudaStream_t stream;
};

static atomic_long live_handles;

static __attribute__((destructor)) void handles_check(void)
{
	long n = atomic_load(&live_handles);

	if (n)
		fake_cuda_warn("cuBLAS: %ld handles never destroyed (cublasDestroy)", n);
}

static bool handle_ok(cublasHandle_t h, const char *what)
{
	if (h && h->magic == HANDLE_MAGIC)
		return true;
	fake_cuda_warn("%s: handle %p is not live", what, (void *)h);
	return false;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
	cublasHandle_t h;

	if (!handle)
		return CUBLAS_STATUS_INVALID_VALUE;
	h = calloc(1, sizeof(*h));
	if (!h)
		return CUBLAS_STATUS_ALLOC_FAILED;
	h->magic = HANDLE_MAGIC;
	atomic_fetch_add(&live_handles, 1);
	*handle = h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
	if (!handle_ok(handle, "cublasDestroy"))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->magic = 0;
	free(handle);
	atomic_fetch_sub(&live_handles, 1);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
	if (!handle_ok(handle, "cublasSetStream"))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->stream = stream;
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status)
{
	switch (status) {
	case CUBLAS_STATUS_SUCCESS:
		return "success (fake cuBLAS)";
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return "not initialized (fake cuBLAS)";
	case CUBLAS_STATUS_INVALID_VALUE:
		return "invalid value (fake cuBLAS)";
	case CUBLAS_STATUS_NOT_SUPPORTED:
		return "not supported (fake cuBLAS)";
	case CUBLAS_STATUS_EXECUTION_FAILED:
		return "execution failed (fake cuBLAS)";
	default:
		return "other status (fake cuBLAS)";
	}
}

/* One operand: where batch 0 starts, its extent in bytes, and the stride between batches. */
struct operand {
	uint64_t addr, bytes;
	long long stride; /* elements */
};

struct gemm_args {
	struct operand op[3]; /* A, B, C */
	int batch;
};

/* Views every operand of every batch, and checks that no batch's C overlaps another's or an
   operand read (the batches of one call run in no particular order on a GPU). */
static void gemm_work(void *p)
{
	static const char *const what[3] = {"cuBLAS GEMM: A", "cuBLAS GEMM: B", "cuBLAS GEMM: C"};
	const struct gemm_args *g = p;
	size_t n = (size_t)g->batch;
	struct fake_range *fr = malloc(3 * n * sizeof(*fr));

	if (!fr)
		fake_cuda_die("cuBLAS GEMM: no memory for %zu batches", n);
	for (size_t b = 0; b < n; b++)
		for (int i = 0; i < 3; i++) {
			uint64_t a =
				g->op[i].addr + (uint64_t)((long long)b * g->op[i].stride) * ELEM;

			fake_cuda_kernel_view(a, g->op[i].bytes, what[i]);
			/* C first: the writes, then the reads */
			fr[(i == 2 ? 0 : n + (size_t)i * n) + b] =
				(struct fake_range){a, g->op[i].bytes};
		}
	fake_cuda_check_footprint(fr, n, fr + n, 2 * n, "cuBLAS GEMM");
	free(fr);
}

/* The operand of a rows x cols column-major matrix at p with leading dimension ld: false when
   ld is below rows (cuBLAS's CUBLAS_STATUS_INVALID_VALUE). */
static bool operand(const void *p, int rows, int cols, int ld, long long stride, struct operand *o)
{
	if (ld < (rows > 1 ? rows : 1))
		return false;
	*o = (struct operand){(uint64_t)(uintptr_t)p,
			      ((uint64_t)(cols - 1) * (uint64_t)ld + (uint64_t)rows) * ELEM,
			      stride};
	return true;
}

static cublasStatus_t gemm(const char *what, cublasHandle_t h, cublasOperation_t ta,
			   cublasOperation_t tb, int m, int n, int k, const void *alpha,
			   const void *A, cudaDataType at, int lda, long long sa, const void *B,
			   cudaDataType bt, int ldb, long long sb, const void *beta, void *C,
			   cudaDataType ct, int ldc, long long sc, int batch,
			   cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	struct gemm_args g = {.batch = batch};
	bool a_t = ta == CUBLAS_OP_T, b_t = tb == CUBLAS_OP_T;

	if (!handle_ok(h, what))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_16BF ||
	    compute != CUBLAS_COMPUTE_32F || algo != CUBLAS_GEMM_DEFAULT ||
	    (ta != CUBLAS_OP_N && !a_t) || (tb != CUBLAS_OP_N && !b_t)) {
		fake_cuda_warn("%s: types, compute type, algorithm or operation not those "
			       "calibrate asks for",
			       what);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	if (m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta ||
	    !operand(A, a_t ? k : m, a_t ? m : k, lda, sa, &g.op[0]) ||
	    !operand(B, b_t ? n : k, b_t ? k : n, ldb, sb, &g.op[1]) ||
	    !operand(C, m, n, ldc, sc, &g.op[2])) {
		fake_cuda_warn("%s: m %d, n %d, k %d, lda %d, ldb %d, ldc %d, batch %d: an invalid "
			       "value",
			       what, m, n, k, lda, ldb, ldc, batch);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	if (m == 0 || n == 0 || k == 0 || batch == 0)
		return CUBLAS_STATUS_SUCCESS; /* nothing the fake would view */
	return fake_cuda_launch(h->stream, what, gemm_work, &g, sizeof(g), NULL, 0)
		       ? CUBLAS_STATUS_EXECUTION_FAILED
		       : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
			    cublasOperation_t transb, int m, int n, int k, const void *alpha,
			    const void *A, cudaDataType Atype, int lda, const void *B,
			    cudaDataType Btype, int ldb, const void *beta, void *C,
			    cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
			    cublasGemmAlgo_t algo)
{
	return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B,
		    Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
					  cublasOperation_t transb, int m, int n, int k,
					  const void *alpha, const void *A, cudaDataType Atype,
					  int lda, long long int strideA, const void *B,
					  cudaDataType Btype, int ldb, long long int strideB,
					  const void *beta, void *C, cudaDataType Ctype, int ldc,
					  long long int strideC, int batchCount,
					  cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
	return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype,
		    lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
		    computeType, algo);
}
