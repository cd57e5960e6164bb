/* device.c — devices, the current device and stream, device memory and
 * copies over the CUDA runtime (see cuda_int.h). Built when CRUN_HAVE_CUDA;
 * the double build links the same file against tests/gpu_double/. */
#if CRUN_HAVE_CUDA
#include "cuda/cuda_int.h"

#include "core/checked.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- errors */

int crun__cuda_fail(int cuda_err, const char *call, const char *where, int dev) {
  cudaError_t e = (cudaError_t)cuda_err;
  (void)cudaGetLastError(); /* clear the sticky copy of a non-fatal error */
  int st = e == cudaErrorMemoryAllocation ? CRUN_ENOMEM : CRUN_EIO;
  if (dev >= 0)
    return crun_error(st, "%s: %s failed on cuda:%d: %s (%s)", where, call, dev, cudaGetErrorName(e),
                      cudaGetErrorString(e));
  return crun_error(st, "%s: %s failed: %s (%s)", where, call, cudaGetErrorName(e), cudaGetErrorString(e));
}

int crun__cuda_host_only_fail(const char *op, int dev) {
  return crun_error(CRUN_ENOTSUP, "%s: not implemented for a tensor on cuda:%d (copy it to the host with :cpu() first)",
                    op, dev);
}

/* ---------------------------------------------------------------- devices */

static pthread_once_t g_count_once = PTHREAD_ONCE_INIT;
static int g_count;
static char g_count_why[200];
static int g_default_dev;

/* Parses a non-negative integer environment variable; -1 when unset/bad. */
static int env_index(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return -1;
  char *end;
  long x = strtol(v, &end, 10);
  return *end || x < 0 || x > 1 << 20 ? -1 : (int)x;
}

static void count_once(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (e != cudaSuccess || n <= 0) {
    snprintf(g_count_why, sizeof g_count_why, "no CUDA device (cudaGetDeviceCount: %s, %s)",
             e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e),
             e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    g_count = 0;
    return;
  }
  g_count = n > CRUN__CUDA_MAX_DEVICES ? CRUN__CUDA_MAX_DEVICES : n;
  /* the device of this process: CRUN_CUDA_DEVICE, else LOCAL_RANK (set by
   * crun-lua and torchrun) modulo the count, else 0 */
  int pick = env_index("CRUN_CUDA_DEVICE");
  if (pick < 0) pick = env_index("LOCAL_RANK");
  g_default_dev = pick < 0 ? 0 : pick % g_count;
}

int crun__cuda_device_count(int *n) {
  pthread_once(&g_count_once, count_once);
  *n = g_count;
  if (!g_count) return crun_error(CRUN_ENOTSUP, "%s", g_count_why);
  return 0;
}

int crun__cuda_check_device(int dev, const char *where) {
  int n;
  CRUN_CHECK(crun__cuda_device_count(&n));
  if (dev < 0 || dev >= n)
    return crun_error(CRUN_EINVAL, "%s: device cuda:%d does not exist (%d device%s: cuda:0..cuda:%d)", where,
                      dev, n, n == 1 ? "" : "s", n - 1);
  return 0;
}

static _Thread_local int tl_dev_set; /* 1 once this thread's device was chosen */

int crun__cuda_set_device(int dev) {
  CRUN_CHECK(crun__cuda_check_device(dev, "set_device"));
  cudaError_t e = cudaSetDevice(dev);
  if (e != cudaSuccess) return crun__cuda_fail(e, "cudaSetDevice", "set_device", dev);
  tl_dev_set = 1;
  return 0;
}

int crun__cuda_current_device(int *dev) {
  int n;
  CRUN_CHECK(crun__cuda_device_count(&n));
  if (!tl_dev_set) CRUN_CHECK(crun__cuda_set_device(g_default_dev));
  cudaError_t e = cudaGetDevice(dev);
  if (e != cudaSuccess) return crun__cuda_fail(e, "cudaGetDevice", "current_device", -1);
  return 0;
}

/* Runs the calling thread on dev for one call and puts its device back. */
int crun__cuda_enter(int dev, int *saved) {
  CRUN_CHECK(crun__cuda_current_device(saved));
  if (*saved == dev) return 0;
  cudaError_t e = cudaSetDevice(dev);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaSetDevice", "device", dev);
}

void crun__cuda_leave(int dev, int saved) {
  if (saved != dev) (void)cudaSetDevice(saved);
}

/* ---------------------------------------------------------------- memory */

typedef struct {
  atomic_uint_least64_t allocated, peak;
  pthread_once_t pool_once;
} dev_mem_t;

static dev_mem_t g_mem[CRUN__CUDA_MAX_DEVICES];
static pthread_once_t g_mem_once = PTHREAD_ONCE_INIT;
static void mem_init(void) {
  for (int d = 0; d < CRUN__CUDA_MAX_DEVICES; d++) g_mem[d].pool_once = (pthread_once_t)PTHREAD_ONCE_INIT;
}

/* Lets the default pool cache freed memory instead of returning it to the
 * driver at every synchronisation (the caching behaviour of torch's
 * allocator; empty_cache trims it). */
static int g_pool_dev;
static void pool_setup(void) {
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, g_pool_dev) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  (void)cudaGetLastError();
}

static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static void pool_ensure(int dev) {
  static int done[CRUN__CUDA_MAX_DEVICES];
  pthread_mutex_lock(&g_pool_mu);
  if (!done[dev]) {
    g_pool_dev = dev;
    pool_setup();
    done[dev] = 1;
  }
  pthread_mutex_unlock(&g_pool_mu);
}

static void count_alloc(int dev, uint64_t n) {
  uint64_t now = atomic_fetch_add(&g_mem[dev].allocated, n) + n;
  uint64_t peak = atomic_load(&g_mem[dev].peak);
  while (now > peak && !atomic_compare_exchange_weak(&g_mem[dev].peak, &peak, now)) {
  }
}

int crun__cuda_alloc(int dev, size_t nbytes, crun__stream_t s, void **out) {
  pthread_once(&g_mem_once, mem_init);
  int saved;
  CRUN_CHECK(crun__cuda_check_device(dev, "cuda alloc"));
  CRUN_CHECK(crun__cuda_enter(dev, &saved));
  pool_ensure(dev);
  cudaError_t e = cudaMallocAsync(out, nbytes, (cudaStream_t)s);
  crun__cuda_leave(dev, saved);
  if (e != cudaSuccess) {
    crun_cuda_memory_t m = {0};
    (void)crun_cuda_memory(dev, &m);
    int rc = crun__cuda_fail(e, "cudaMallocAsync", "cuda alloc", dev);
    char what[256]; /* the text without its status name, copied out of the error buffer */
    snprintf(what, sizeof what, "%s", crun_last_error() + strlen(crun_err_name(rc)) + 2);
    return crun_error(rc, "%s; asked for %zu bytes, %llu allocated, %llu reserved", what, nbytes,
                      (unsigned long long)m.allocated, (unsigned long long)m.reserved);
  }
  count_alloc(dev, nbytes);
  return 0;
}

void crun__cuda_free(int dev, void *p, size_t nbytes, crun__stream_t s) {
  if (!p) return;
  int saved;
  if (crun__cuda_enter(dev, &saved) < 0) return;
  cudaError_t e = cudaFreeAsync(p, (cudaStream_t)s);
  crun__cuda_leave(dev, saved);
  if (e != cudaSuccess) {
    (void)crun__cuda_fail(e, "cudaFreeAsync", "cuda free", dev);
    crun_log(CRUN_LOG_WARN, CRUN_SUB_CORE, "%s", crun_last_error());
  }
  atomic_fetch_sub(&g_mem[dev].allocated, nbytes);
}

int crun__cuda_host_alloc(size_t nbytes, void **out) {
  int n;
  CRUN_CHECK(crun__cuda_device_count(&n));
  cudaError_t e = cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocDefault);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaHostAlloc", "pin_memory", -1);
}

void crun__cuda_host_free(void *p) {
  if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

int crun_cuda_memory(int device, crun_cuda_memory_t *out) {
  pthread_once(&g_mem_once, mem_init);
  CRUN_CHECK(crun__cuda_check_device(device, "cuda.memory"));
  memset(out, 0, sizeof *out);
  out->allocated = atomic_load(&g_mem[device].allocated);
  out->peak = atomic_load(&g_mem[device].peak);
  cudaMemPool_t pool;
  cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, device);
  if (e == cudaSuccess) e = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &out->reserved);
  if (e != cudaSuccess) return crun__cuda_fail(e, "cudaMemPoolGetAttribute", "cuda.memory", device);
  return 0;
}

int crun_cuda_reset_peak(int device) {
  pthread_once(&g_mem_once, mem_init);
  CRUN_CHECK(crun__cuda_check_device(device, "cuda.reset_peak"));
  atomic_store(&g_mem[device].peak, atomic_load(&g_mem[device].allocated));
  return 0;
}

int crun_cuda_empty_cache(int device) {
  int saved;
  CRUN_CHECK(crun__cuda_check_device(device, "cuda.empty_cache"));
  CRUN_CHECK(crun__cuda_enter(device, &saved));
  cudaError_t e = cudaDeviceSynchronize();
  cudaMemPool_t pool;
  if (e == cudaSuccess) e = cudaDeviceGetDefaultMemPool(&pool, device);
  if (e == cudaSuccess) e = cudaMemPoolTrimTo(pool, 0);
  crun__cuda_leave(device, saved);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaMemPoolTrimTo", "cuda.empty_cache", device);
}

/* ---------------------------------------------------------------- copies */

int crun__cuda_stream_wait_host(int dev, crun__stream_t s) {
  int saved;
  CRUN_CHECK(crun__cuda_enter(dev, &saved));
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);
  crun__cuda_leave(dev, saved);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaStreamSynchronize", "synchronize", dev);
}

/* 1 when host pointer p is page-locked memory the runtime knows. */
static int host_is_pinned(const void *p) {
  struct cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return at.type == cudaMemoryTypeHost;
}

/* Whether a copy must end with the host waiting: asked for, or a host side
 * in pageable memory (the runtime would stage it synchronously anyway). */
static int must_block(const void *dst, int dst_dev, const void *src, int src_dev, int blocking) {
  if (blocking) return 1;
  if (dst_dev < 0 && !host_is_pinned(dst)) return 1;
  if (src_dev < 0 && !host_is_pinned(src)) return 1;
  return 0;
}

int crun__cuda_memcpy(void *dst, int dst_dev, const void *src, int src_dev, size_t n, crun__stream_t s,
                      int blocking) {
  int64_t st = 1, shape = 1;
  return crun__cuda_memcpy_strided(dst, dst_dev, &st, src, src_dev, &st, 1, &shape, n, s, blocking);
}

/* One 2-d copy: height rows of width bytes; falls back to one 1-d copy per
 * row where a pitch is below the width (a broadcast source) or too large. */
static cudaError_t copy_2d(char *dst, size_t dpitch, const char *src, size_t spitch, size_t width,
                           size_t height, int dst_dev, int src_dev, cudaStream_t s) {
  if (height == 1 || (dpitch == width && spitch == width))
    return cudaMemcpyAsync(dst, src, width * height, cudaMemcpyDefault, s);
  if (dpitch >= width && spitch >= width && dpitch <= INT32_MAX && spitch <= INT32_MAX)
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, s);
  for (size_t r = 0; r < height; r++) {
    cudaError_t e = cudaMemcpyAsync(dst + r * dpitch, src + r * spitch, width, cudaMemcpyDefault, s);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/* Merges dims d, d+1 when both sides step over d as one run of d+1, and
 * drops dims of size 1; returns the new ndim. */
static int collapse(int nd, int64_t *shape, int64_t *ds, int64_t *ss) {
  int k = 0;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    if (k > 0 && ds[k - 1] == ds[d] * shape[d] && ss[k - 1] == ss[d] * shape[d]) {
      shape[k - 1] *= shape[d];
      ds[k - 1] = ds[d], ss[k - 1] = ss[d];
      continue;
    }
    shape[k] = shape[d], ds[k] = ds[d], ss[k] = ss[d];
    k++;
  }
  return k;
}

int crun__cuda_memcpy_strided(void *dst, int dst_dev, const int64_t *dst_strides, const void *src, int src_dev,
                              const int64_t *src_strides, int ndim, const int64_t *in_shape, size_t elsize,
                              crun__stream_t stream, int blocking) {
  int64_t shape[CRUN_MAX_DIMS + 1], ds[CRUN_MAX_DIMS + 1], ss[CRUN_MAX_DIMS + 1], total;
  if (ndim < 0 || ndim > CRUN_MAX_DIMS) return crun_error(CRUN_EINVAL, "cuda copy: %d dims", ndim);
  if (crun__prod_i64(in_shape, ndim, &total)) return crun_error(CRUN_EINVAL, "cuda copy: bad shape");
  if (total == 0 || elsize == 0) return 0;
  /* the element itself is the innermost "dim": elsize bytes at stride 1 */
  for (int d = 0; d < ndim; d++) {
    if (dst_strides[d] < 0 || src_strides[d] < 0) return crun_error(CRUN_EINVAL, "cuda copy: negative stride");
    shape[d] = in_shape[d], ds[d] = dst_strides[d], ss[d] = src_strides[d];
  }
  shape[ndim] = (int64_t)elsize, ds[ndim] = 1, ss[ndim] = 1;
  int nd = collapse(ndim + 1, shape, ds, ss);
  if (nd == 0) { /* a single byte */
    shape[0] = 1, ds[0] = ss[0] = 1, nd = 1;
  }
  /* the innermost dim is a contiguous run on both sides (stride 1 byte):
   * width = its length; the next dim out (if any) is the 2-d copy's rows */
  size_t width = (size_t)shape[nd - 1];
  size_t height = nd >= 2 ? (size_t)shape[nd - 2] : 1;
  size_t dp = nd >= 2 ? (size_t)ds[nd - 2] : width, sp = nd >= 2 ? (size_t)ss[nd - 2] : width;
  int outer = nd >= 2 ? nd - 2 : 0;
  int dev = dst_dev >= 0 ? dst_dev : src_dev;
  if (dev < 0) return crun_error(CRUN_EINVAL, "cuda copy: neither side is on a device");
  int saved;
  CRUN_CHECK(crun__cuda_enter(dev, &saved));
  int64_t idx[CRUN_MAX_DIMS + 1] = {0}, slabs = 1;
  for (int d = 0; d < outer; d++) slabs *= shape[d];
  cudaError_t e = cudaSuccess;
  for (int64_t k = 0; k < slabs && e == cudaSuccess; k++) {
    int64_t doff = 0, soff = 0;
    for (int d = 0; d < outer; d++) doff += idx[d] * ds[d], soff += idx[d] * ss[d];
    e = copy_2d((char *)dst + doff, dp, (const char *)src + soff, sp, width, height, dst_dev, src_dev,
                (cudaStream_t)stream);
    for (int d = outer - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  if (e == cudaSuccess && must_block(dst, dst_dev, src, src_dev, blocking))
    e = cudaStreamSynchronize((cudaStream_t)stream);
  crun__cuda_leave(dev, saved);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaMemcpyAsync", "copy", dev);
}

int crun__cuda_memset0(int dev, void *p, size_t n, crun__stream_t s) {
  int saved;
  CRUN_CHECK(crun__cuda_enter(dev, &saved));
  cudaError_t e = cudaMemsetAsync(p, 0, n, (cudaStream_t)s);
  crun__cuda_leave(dev, saved);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaMemsetAsync", "zeros", dev);
}
#else
typedef int crun__cuda_device_c_is_empty_without_cuda;
#endif
