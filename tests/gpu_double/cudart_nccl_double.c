/* cudart_nccl_double.c — a TEST DOUBLE of the few CUDA runtime calls the nccl
 * backend makes (device, streams, events, stream-ordered memory, async
 * copies), for the double build only; never linked into libcrunrt. Every
 * function is weak so that the full CUDA runtime double (cudart_double.c),
 * when linked beside it, takes over. "Device memory" is host memory and the
 * "device" runs work at once, so a recorded event has completed. One device
 * is reported (CRUN_CUDA_DOUBLE_DEVICES overrides the count). */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#define WEAK __attribute__((weak))

struct CUstream_st { int flags; };
struct CUevent_st { int recorded; };

static _Thread_local int current_device;

WEAK const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNotReady: return "device not ready";
  default: return "unknown error";
  }
}

WEAK cudaError_t cudaGetDeviceCount(int *n) {
  const char *e = getenv("CRUN_CUDA_DOUBLE_DEVICES");
  *n = e ? atoi(e) : 1;
  return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

WEAK cudaError_t cudaGetDevice(int *d) {
  *d = current_device;
  return cudaSuccess;
}

WEAK cudaError_t cudaSetDevice(int d) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (d < 0 || d >= n) return cudaErrorInvalidDevice;
  current_device = d;
  return cudaSuccess;
}

WEAK cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  *s = calloc(1, sizeof **s);
  if (!*s) return cudaErrorMemoryAllocation;
  (*s)->flags = (int)flags;
  return cudaSuccess;
}

WEAK cudaError_t cudaStreamDestroy(cudaStream_t s) {
  free(s);
  return cudaSuccess;
}

WEAK cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

WEAK cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)s;
  (void)flags;
  return e ? cudaSuccess : cudaErrorInvalidValue;
}

WEAK cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  (void)flags;
  *e = calloc(1, sizeof **e);
  return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

WEAK cudaError_t cudaEventDestroy(cudaEvent_t e) {
  free(e);
  return cudaSuccess;
}

WEAK cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)s;
  if (!e) return cudaErrorInvalidValue;
  e->recorded = 1;
  return cudaSuccess;
}

WEAK cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidValue; }

WEAK cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidValue; }

WEAK cudaError_t cudaMalloc(void **p, size_t n) {
  *p = malloc(n ? n : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

WEAK cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}

WEAK cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  (void)s;
  return cudaMalloc(p, n);
}

WEAK cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  return cudaFree(p);
}

WEAK cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k;
  (void)s;
  if (n) memmove(dst, src, n);
  return cudaSuccess;
}
