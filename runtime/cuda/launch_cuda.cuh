/* launch_cuda.cuh — what the .cu launchers share: grid sizing for
 * grid-stride loops (an element's result never depends on the geometry) and
 * the check after a launch. Internal to the .cu files of runtime/cuda/. */
#ifndef CRUN_CUDA_LAUNCH_CUDA_CUH
#define CRUN_CUDA_LAUNCH_CUDA_CUH

#include <cuda_runtime.h>

#include "cuda/launch_check.h"

#define CRUN_K_THREADS 256

/* Blocks for n elements: enough to cover n once, at most 65535 * 8 (the
 * grid-stride loop covers the rest). */
static inline unsigned crun__k_blocks(int64_t n) {
  int64_t b = (n + CRUN_K_THREADS - 1) / CRUN_K_THREADS;
  return (unsigned)(b < 1 ? 1 : b > 524280 ? 524280 : b);
}

/* The grid-stride loop over i < n. */
#define CRUN_K_FOR(i, n)                                                            \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
       i += (int64_t)gridDim.x * blockDim.x)

/* Returns 0, or CRUN_EIO naming the kernel when its launch failed. */
static inline int crun__k_launched(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  return crun_error(CRUN_EIO, "%s: kernel launch failed: %s (%s)", what, cudaGetErrorName(e),
                    cudaGetErrorString(e));
}

/* Returns 0, or CRUN_EIO naming the call and the CUDA error. */
static inline int crun__k_cuda_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  return crun_error(CRUN_EIO, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CRUN_K_STREAM(s) ((cudaStream_t)(s))

/* Checks n and the pointers the way the host launcher does. */
#define CRUN_K_CHECK_N(what, n, ...)                                                  \
  do {                                                                                \
    const void *ptrs_[] = {__VA_ARGS__};                                              \
    CRUN_CHECK(crun__lc_count(what, n, (int)(sizeof ptrs_ / sizeof ptrs_[0]), ptrs_)); \
  } while (0)

#endif
