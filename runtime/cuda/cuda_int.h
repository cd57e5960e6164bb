/* cuda_int.h — the device layer inside libcrunrt (internal to runtime/).
 *
 * Code that needs device memory, copies or the current stream calls these;
 * only the .c files of runtime/cuda/ include cuda_runtime.h. A cudaStream_t travels as
 * crun__stream_t (void *). In a build without CUDA (CRUN_HAVE_CUDA=0) every
 * function exists and fails with CRUN_ENOTSUP "crun was built without CUDA"
 * (runtime/cuda/off.c), so callers need no #if.
 *
 * Device pointers are only dereferenced on the device: host code must not
 * read them (the test double's device memory is host memory, which would
 * hide such a bug; the tensor layer refuses CPU math on device tensors). */
#ifndef CRUN_CUDA_INT_H
#define CRUN_CUDA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "crun.h"

#define CRUN__CUDA_MAX_DEVICES 64

typedef void *crun__stream_t; /* a cudaStream_t; NULL is the legacy default stream */

/* Stores the device count; CRUN_ENOTSUP with the reason when there is none
 * ("no CUDA device (cudaGetDeviceCount: ...)"). Cached after the first call. */
int crun__cuda_device_count(int *n);

/* Returns 0 when dev is a valid device, else CRUN_EINVAL naming `where`. */
int crun__cuda_check_device(int dev, const char *where);

/* The calling thread's current device; the first call in a thread under
 * crun-lua picks CRUN_CUDA_DEVICE or LOCAL_RANK % count. */
int crun__cuda_current_device(int *dev);
int crun__cuda_set_device(int dev);

/* The calling thread's current stream on dev (never fails for a valid dev;
 * NULL = the default stream). */
crun__stream_t crun__cuda_current_stream(int dev);

/* Allocates nbytes (> 0) of device memory on dev, ordered on stream s, from
 * the device's pool (cudaMallocAsync); counts it in the memory figures. */
int crun__cuda_alloc(int dev, size_t nbytes, crun__stream_t s, void **out);

/* Returns p (of nbytes, from crun__cuda_alloc) to the pool once the work
 * queued on s so far has finished (cudaFreeAsync). NULL p is a no-op. */
void crun__cuda_free(int dev, void *p, size_t nbytes, crun__stream_t s);

/* Page-locked host memory (cudaHostAlloc) and its release. */
int crun__cuda_host_alloc(size_t nbytes, void **out);
void crun__cuda_host_free(void *p);

/* Copies n bytes; dev -1 names host memory. Ordered on stream s (of the
 * device side; the destination's for device-to-device). `blocking` makes
 * the host wait for the copy; a copy touching pageable host memory blocks
 * anyway, one between pinned host memory and a device does not. */
int crun__cuda_memcpy(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
                      crun__stream_t s, int blocking);

/* Copies an n-d strided block of `elsize`-byte elements: element i of the
 * block sits at base + sum(idx[d] * strides[d]) (strides in BYTES, >= 0).
 * Runs of either side are batched as 2-d copies (cudaMemcpy2DAsync), one per
 * outer index. Other arguments as crun__cuda_memcpy. */
int crun__cuda_memcpy_strided(void *dst, int dst_dev, const int64_t *dst_strides, const void *src,
                              int src_dev, const int64_t *src_strides, int ndim,
                              const int64_t *shape, size_t elsize, crun__stream_t s, int blocking);

/* Sets n bytes at device pointer p (on dev) to zero, ordered on s
 * (asynchronous). */
int crun__cuda_memset0(int dev, void *p, size_t n, crun__stream_t s);

/* Makes dev the calling thread's device for one call (*saved receives the
 * previous one) / puts the previous one back. */
int crun__cuda_enter(int dev, int *saved);
void crun__cuda_leave(int dev, int saved);

/* Waits on the host for stream s of device dev. */
int crun__cuda_stream_wait_host(int dev, crun__stream_t s);

/* The error of a failed CUDA runtime call as a crun status:
 * "EIO: <where>: <call> failed on device <dev>: cudaErrorX (text)";
 * out-of-memory maps to CRUN_ENOMEM. `cuda_err` is a cudaError_t. */
int crun__cuda_fail(int cuda_err, const char *call, const char *where, int dev);

/* Fails with "ENOTSUP: <op>: not implemented for a tensor on cuda:<dev>
 * (copy it with :cpu() first)" — the answer of a CPU-only op. */
int crun__cuda_host_only_fail(const char *op, int dev);

/* One branch on the host path: returns from the enclosing function with the
 * error above when tensor t (a crun_tensor_t *) lives on a device. The 2-
 * and 3-tensor forms test all of them in one branch (host devices are -1,
 * so the AND of the device fields is negative only when all are host). */
#define CRUN__HOST_ONLY(t, op)                                                    \
  do {                                                                            \
    int crun__dev_ = (t)->st->device; /* needs tensor/tensor_impl.h */           \
    if (__builtin_expect(crun__dev_ >= 0, 0)) return crun__cuda_host_only_fail((op), crun__dev_); \
  } while (0)

#define CRUN__DEV_MAX2(a, b) ((a)->st->device > (b)->st->device ? (a)->st->device : (b)->st->device)
#define CRUN__HOST_ONLY2(a, b, op)                                                        \
  do {                                                                                    \
    if (__builtin_expect(((a)->st->device & (b)->st->device) >= 0, 0))                    \
      return crun__cuda_host_only_fail((op), CRUN__DEV_MAX2(a, b));                       \
  } while (0)
#define CRUN__HOST_ONLY3(a, b, c, op)                                                     \
  do {                                                                                    \
    if (__builtin_expect(((a)->st->device & (b)->st->device & (c)->st->device) >= 0, 0)) { \
      int crun__d_ = CRUN__DEV_MAX2(a, b);                                                \
      return crun__cuda_host_only_fail((op), crun__d_ > (c)->st->device ? crun__d_ : (c)->st->device); \
    }                                                                                     \
  } while (0)

#endif
