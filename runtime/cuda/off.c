/* off.c — the device API of a build without CUDA (CRUN_HAVE_CUDA=0): every
 * call fails with ENOTSUP saying so, crun_cuda_is_available() is 0. */
#if !CRUN_HAVE_CUDA
#include "cuda/cuda_int.h"

#define OFF(where) crun_error(CRUN_ENOTSUP, "%s: crun was built without CUDA (CRUN_WITH_CUDA=OFF or no toolkit found)", where)

int crun__cuda_fail(int cuda_err, const char *call, const char *where, int dev) { return OFF(where); }
int crun__cuda_host_only_fail(const char *op, int dev) { return OFF(op); }
int crun__cuda_device_count(int *n) { *n = 0; return OFF("cuda.device_count"); }
int crun__cuda_check_device(int dev, const char *where) { return OFF(where); }
int crun__cuda_current_device(int *dev) { *dev = -1; return OFF("cuda.current_device"); }
int crun__cuda_set_device(int dev) { return OFF("cuda.set_device"); }
int crun__cuda_enter(int dev, int *saved) { return OFF("cuda"); }
void crun__cuda_leave(int dev, int saved) {}
crun__stream_t crun__cuda_current_stream(int dev) { return NULL; }
int crun__cuda_alloc(int dev, size_t nbytes, crun__stream_t s, void **out) { return OFF("cuda alloc"); }
void crun__cuda_free(int dev, void *p, size_t nbytes, crun__stream_t s) {}
int crun__cuda_host_alloc(size_t nbytes, void **out) { return OFF("pin_memory"); }
void crun__cuda_host_free(void *p) {}
int crun__cuda_memcpy(void *dst, int dst_dev, const void *src, int src_dev, size_t n, crun__stream_t s,
                      int blocking) { return OFF("copy"); }
int crun__cuda_memcpy_strided(void *dst, int dst_dev, const int64_t *dst_strides, const void *src, int src_dev,
                              const int64_t *src_strides, int ndim, const int64_t *shape, size_t elsize,
                              crun__stream_t s, int blocking) { return OFF("copy"); }
int crun__cuda_memset0(int dev, void *p, size_t n, crun__stream_t s) { return OFF("zeros"); }
int crun__cuda_stream_wait_host(int dev, crun__stream_t s) { return OFF("synchronize"); }

int crun_cuda_is_available(void) { return 0; }
int crun_cuda_device_count(int *out) { return crun__cuda_device_count(out); }
int crun_cuda_set_device(int device) { return OFF("cuda.set_device"); }
int crun_cuda_current_device(int *out) { return crun__cuda_current_device(out); }
int crun_cuda_synchronize(int device) { return OFF("cuda.synchronize"); }
int crun_cuda_memory(int device, crun_cuda_memory_t *out) { return OFF("cuda.memory"); }
int crun_cuda_reset_peak(int device) { return OFF("cuda.reset_peak"); }
int crun_cuda_empty_cache(int device) { return OFF("cuda.empty_cache"); }
int crun_cuda_stream_create(int device, crun_cuda_stream_t **out) { return OFF("cuda.Stream"); }
void crun_cuda_stream_retain(crun_cuda_stream_t *s) {}
void crun_cuda_stream_release(crun_cuda_stream_t *s) {}
int crun_cuda_stream_device(const crun_cuda_stream_t *s) { return -1; }
void *crun_cuda_stream_handle(const crun_cuda_stream_t *s) { return NULL; }
int crun_cuda_stream_query(crun_cuda_stream_t *s) { return OFF("Stream:query"); }
int crun_cuda_stream_synchronize(crun_cuda_stream_t *s) { return OFF("Stream:synchronize"); }
int crun_cuda_default_stream(int device, crun_cuda_stream_t **out) { return OFF("cuda.default_stream"); }
int crun_cuda_current_stream(int device, crun_cuda_stream_t **out) { return OFF("cuda.current_stream"); }
int crun_cuda_set_stream(crun_cuda_stream_t *s) { return OFF("cuda.set_stream"); }
int crun_cuda_event_create(int device, int timing, crun_cuda_event_t **out) { return OFF("cuda.Event"); }
void crun_cuda_event_release(crun_cuda_event_t *e) {}
int crun_cuda_event_record(crun_cuda_event_t *e, crun_cuda_stream_t *s) { return OFF("Event:record"); }
int crun_cuda_event_wait(crun_cuda_event_t *e, crun_cuda_stream_t *s) { return OFF("Event:wait"); }
int crun_cuda_event_query(crun_cuda_event_t *e) { return OFF("Event:query"); }
int crun_cuda_event_synchronize(crun_cuda_event_t *e) { return OFF("Event:synchronize"); }
int crun_cuda_event_elapsed_ms(crun_cuda_event_t *start, crun_cuda_event_t *end, double *ms) {
  return OFF("Event:elapsed_time");
}
#else
typedef int crun__cuda_off_c_is_empty_with_cuda;
#endif
