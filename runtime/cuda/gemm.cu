/* gemm.cu — row-major GEMM through cuBLAS (column-major): C = A B is
 * computed as C^T = B^T A^T, so the operands swap and keep their transpose
 * flags. float32 -> cublasSgemm, float64 -> cublasDgemm, float16 / bfloat16
 * -> cublasGemmEx with float32 accumulation (CUBLAS_COMPUTE_32F). One handle
 * per device, created on first use; the stream is set per call.
 *
 * cuBLAS is opened with dlopen at the first device GEMM, not linked: loading
 * libcublas.so.13 pulls in libcublasLt, whose start-up costs ~160 ms and ~95 MiB
 * of private memory in every process that maps it (measured on this project's
 * 2-core VM: a CPU-only 8-rank job's launcher peaked at 224 MB instead of 5 MB,
 * and each rank carried the 95 MiB). A job that never multiplies on a GPU
 * never loads it. CRUN_CUBLAS names another library file. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/launch_cuda.cuh"

#ifndef CRUN_CUBLAS_PATH /* the library CMake found */
#define CRUN_CUBLAS_PATH "libcublas.so"
#endif
#ifndef CRUN_CUBLAS_SONAME
#define CRUN_CUBLAS_SONAME "libcublas.so"
#endif

#define MAX_DEV 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t handles[MAX_DEV];

/* The functions used, by their exported names (cublas_v2.h maps cublasCreate
 * to cublasCreate_v2 and so on). */
static struct {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasDgemm_v2) dgemm;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                            const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) status_string;
  char why[256];
} lib;
static pthread_once_t once = PTHREAD_ONCE_INIT;

template <typename F> static bool take(void *h, const char *name, F *out) {
  *out = reinterpret_cast<F>(dlsym(h, name));
  return *out != nullptr;
}

static void open_cublas(void) {
  const char *env = getenv("CRUN_CUBLAS");
  const char *names[] = {env && *env ? env : CRUN_CUBLAS_SONAME, env && *env ? nullptr : CRUN_CUBLAS_PATH};
  snprintf(lib.why, sizeof lib.why, "not found");
  for (const char *name : names) {
    if (!name) continue;
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      snprintf(lib.why, sizeof lib.why, "%s", dlerror());
      continue;
    }
    if (take(h, "cublasCreate_v2", &lib.create) && take(h, "cublasDestroy_v2", &lib.destroy) &&
        take(h, "cublasSetStream_v2", &lib.set_stream) && take(h, "cublasSgemm_v2", &lib.sgemm) &&
        take(h, "cublasDgemm_v2", &lib.dgemm) && take(h, "cublasGemmEx", &lib.gemm_ex) &&
        take(h, "cublasGetStatusString", &lib.status_string))
      return;
    snprintf(lib.why, sizeof lib.why, "%s lacks a cuBLAS function crun uses", name);
    lib.create = nullptr;
    dlclose(h);
  }
}

/* 0 when cuBLAS is loaded; else ENOTSUP saying why. */
static int cublas_loaded(void) {
  pthread_once(&once, open_cublas);
  if (lib.create) return 0;
  return crun_error(CRUN_ENOTSUP, "gemm on a CUDA device needs cuBLAS, which could not be loaded (%s); "
                    "install the CUDA toolkit's libcublas or name it with CRUN_CUBLAS", lib.why);
}

static int cublas_ok(cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) return 0;
  return crun_error(CRUN_EIO, "gemm: %s failed: %s", what, lib.status_string(st));
}

/* The current device's handle, bound to `stream`. */
static int handle_for(cudaStream_t stream, cublasHandle_t *out) {
  int dev = 0;
  CRUN_CHECK(crun__k_cuda_ok(cudaGetDevice(&dev), "gemm: cudaGetDevice"));
  if (dev < 0 || dev >= MAX_DEV) return crun_error(CRUN_ERANGE, "gemm: device %d beyond %d", dev, MAX_DEV);
  pthread_mutex_lock(&lock);
  int rc = handles[dev] ? 0 : cublas_ok(lib.create(&handles[dev]), "cublasCreate");
  cublasHandle_t h = handles[dev];
  pthread_mutex_unlock(&lock);
  if (rc < 0) return rc;
  CRUN_CHECK(cublas_ok(lib.set_stream(h, stream), "cublasSetStream"));
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
  CRUN_CHECK(cublas_loaded());
  CRUN_CHECK(handle_for(CRUN_K_STREAM(stream), &h));
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  int M = (int)m, N = (int)n, K = (int)k;
  if (dt == CRUN_FLOAT32) {
    float al = (float)alpha, be = (float)beta;
    return cublas_ok(lib.sgemm(h, opb, opa, N, M, K, &al, (const float *)B, (int)ldb, (const float *)A, (int)lda,
                                 &be, (float *)C, (int)ldc), "cublasSgemm");
  }
  if (dt == CRUN_FLOAT64)
    return cublas_ok(lib.dgemm(h, opb, opa, N, M, K, &alpha, (const double *)B, (int)ldb, (const double *)A,
                                 (int)lda, &beta, (double *)C, (int)ldc), "cublasDgemm");
  if (dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16) {
    cudaDataType_t ty = dt == CRUN_FLOAT16 ? CUDA_R_16F : CUDA_R_16BF;
    float al = (float)alpha, be = (float)beta;
    return cublas_ok(lib.gemm_ex(h, opb, opa, N, M, K, &al, B, ty, (int)ldb, A, ty, (int)lda, &be, C, ty, (int)ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "cublasGemmEx");
  }
  return crun_error(CRUN_ENOTSUP, "gemm needs float32, float64, float16 or bfloat16, got %s", crun_dtype_name(dt));
}

extern "C" void crun__cuda_math_shutdown(void) {
  pthread_mutex_lock(&lock);
  for (int d = 0; d < MAX_DEV; d++)
    if (handles[d]) {
      lib.destroy(handles[d]);
      handles[d] = NULL;
    }
  pthread_mutex_unlock(&lock);
}
