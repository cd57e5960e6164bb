/* gemm.cu — row-major GEMM through cuBLAS (column-major): C = A B is
 * computed as C^T = B^T A^T, so the operands swap and keep their transpose
 * flags. float32 -> cublasSgemm, float64 -> cublasDgemm, float16 / bfloat16
 * -> cublasGemmEx with float32 accumulation (CUBLAS_COMPUTE_32F). One handle
 * per device, created on first use; the stream is set per call. */
#include <cublas_v2.h>
#include <pthread.h>

#include "cuda/launch_cuda.cuh"

#define MAX_DEV 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t handles[MAX_DEV];

static int cublas_ok(cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) return 0;
  return crun_error(CRUN_EIO, "gemm: %s failed: %s", what, cublasGetStatusString(st));
}

/* The current device's handle, bound to `stream`. */
static int handle_for(cudaStream_t stream, cublasHandle_t *out) {
  int dev = 0;
  CRUN_CHECK(crun__k_cuda_ok(cudaGetDevice(&dev), "gemm: cudaGetDevice"));
  if (dev < 0 || dev >= MAX_DEV) return crun_error(CRUN_ERANGE, "gemm: device %d beyond %d", dev, MAX_DEV);
  pthread_mutex_lock(&lock);
  int rc = handles[dev] ? 0 : cublas_ok(cublasCreate(&handles[dev]), "cublasCreate");
  cublasHandle_t h = handles[dev];
  pthread_mutex_unlock(&lock);
  if (rc < 0) return rc;
  CRUN_CHECK(cublas_ok(cublasSetStream(h, stream), "cublasSetStream"));
  *out = h;
  return 0;
}

extern "C" int crun__cuda_gemm(crun_dtype_t dt, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                               const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
                               int64_t ldc, void *stream) {
  if (m < 0 || n < 0 || k < 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX ||
      ldb > INT32_MAX || ldc > INT32_MAX)
    return crun_error(CRUN_ERANGE, "gemm: dims %lld x %lld x %lld out of range", (long long)m, (long long)n,
                      (long long)k);
  if (m == 0 || n == 0) return 0;
  CRUN_K_CHECK_N("gemm", 1, A, B, C);
  cublasHandle_t h = NULL;
  CRUN_CHECK(handle_for(CRUN_K_STREAM(stream), &h));
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  int M = (int)m, N = (int)n, K = (int)k;
  if (dt == CRUN_FLOAT32) {
    float al = (float)alpha, be = (float)beta;
    return cublas_ok(cublasSgemm(h, opb, opa, N, M, K, &al, (const float *)B, (int)ldb, (const float *)A, (int)lda,
                                 &be, (float *)C, (int)ldc), "cublasSgemm");
  }
  if (dt == CRUN_FLOAT64)
    return cublas_ok(cublasDgemm(h, opb, opa, N, M, K, &alpha, (const double *)B, (int)ldb, (const double *)A,
                                 (int)lda, &beta, (double *)C, (int)ldc), "cublasDgemm");
  if (dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16) {
    cudaDataType_t ty = dt == CRUN_FLOAT16 ? CUDA_R_16F : CUDA_R_16BF;
    float al = (float)alpha, be = (float)beta;
    return cublas_ok(cublasGemmEx(h, opb, opa, N, M, K, &al, B, ty, (int)ldb, A, ty, (int)lda, &be, C, ty, (int)ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "cublasGemmEx");
  }
  return crun_error(CRUN_ENOTSUP, "gemm needs float32, float64, float16 or bfloat16, got %s", crun_dtype_name(dt));
}

extern "C" void crun__cuda_math_shutdown(void) {
  pthread_mutex_lock(&lock);
  for (int d = 0; d < MAX_DEV; d++)
    if (handles[d]) {
      cublasDestroy(handles[d]);
      handles[d] = NULL;
    }
  pthread_mutex_unlock(&lock);
}
