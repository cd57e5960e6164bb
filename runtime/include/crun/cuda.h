/* crun/cuda.h — tensors on CUDA devices, streams, events and device memory
 * figures. Include <crun.h>.
 *
 * Every function here exists in every build. A build without CUDA (or a
 * machine without a device) answers crun_cuda_is_available() with 0 and the
 * others with CRUN_ENOTSUP, whose text says why ("ENOTSUP: crun was built
 * without CUDA" or "ENOTSUP: no CUDA device (cudaGetDeviceCount: ...)").
 * Devices are numbered from 0; device -1 means the host (CPU). */
#ifndef CRUN_CUDA_H
#define CRUN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "crun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CRUN_DEVICE_CPU (-1)

/* Returns the device of t's storage: CRUN_DEVICE_CPU (-1) or a CUDA device
 * index (0-based). Never fails. */
int crun_tensor_device(const crun_tensor_t *t);

/* Returns 1 when t's storage is page-locked host memory (copies to and
 * from a device then run asynchronously on the current stream), else 0. */
int crun_tensor_is_pinned(const crun_tensor_t *t);

/* Creates a contiguous tensor on `device` (-1: the host, as
 * crun_tensor_empty / crun_tensor_new). The _new form zero-fills it, on the
 * device's current stream (asynchronously for a device tensor). Device
 * memory comes from the device's stream-ordered pool (cudaMallocAsync). */
int crun_tensor_empty_on(crun_dtype_t dt, int ndim, const int64_t *shape, int device,
                         crun_tensor_t **out);
int crun_tensor_new_on(crun_dtype_t dt, int ndim, const int64_t *shape, int device,
                       crun_tensor_t **out);

/* Returns a contiguous copy of host tensor t in page-locked host memory
 * (cudaHostAlloc); t itself (a new reference) when already pinned. */
int crun_tensor_pin_memory(crun_tensor_t *t, crun_tensor_t **out);

/* Returns t on `device` (-1: the host): t itself (a new reference) when it
 * is already there, else a contiguous copy of the same dtype. A copy to the
 * host waits for it (the result is readable at once); a copy to a device is
 * ordered on that device's current stream and, when t is pinned or on a
 * device, does not block the host. */
int crun_tensor_to_device(crun_tensor_t *t, int device, crun_tensor_t **out);

/* Device memory figures of `device`, in bytes: allocated = bytes of live
 * tensors, reserved = bytes the pool holds from the driver (allocated plus
 * cached), peak = the largest `allocated` since the start or the last
 * crun_cuda_reset_peak. */
typedef struct {
  uint64_t allocated, reserved, peak;
} crun_cuda_memory_t;

int crun_cuda_memory(int device, crun_cuda_memory_t *out);
int crun_cuda_reset_peak(int device);

/* Waits for the device's work, then returns the pool's cached memory to
 * the driver (cudaMemPoolTrimTo 0). Blocks. */
int crun_cuda_empty_cache(int device);

/* Returns 1 when CUDA is built in and at least one device is visible. */
int crun_cuda_is_available(void);

/* Stores the number of visible devices; CRUN_ENOTSUP (with the reason)
 * when there is none or crun was built without CUDA. */
int crun_cuda_device_count(int *out);

/* Sets / reads the calling thread's current device. Under crun-lua the
 * first use of CUDA in a worker selects LOCAL_RANK modulo the device count
 * (CRUN_CUDA_DEVICE overrides it). */
int crun_cuda_set_device(int device);
int crun_cuda_current_device(int *out);

/* Waits on the host for all work queued on `device` (-1: the current one). */
int crun_cuda_synchronize(int device);

/* ---------------------------------------------------------------- streams
 * A stream handle is refcounted; the default stream of a device is a handle
 * too (crun_cuda_default_stream) and is never destroyed. Streams made here
 * do not synchronise with the default stream (cudaStreamNonBlocking). */
typedef struct crun_cuda_stream crun_cuda_stream_t;

int crun_cuda_stream_create(int device, crun_cuda_stream_t **out);
void crun_cuda_stream_retain(crun_cuda_stream_t *s);
void crun_cuda_stream_release(crun_cuda_stream_t *s);
int crun_cuda_stream_device(const crun_cuda_stream_t *s);

/* Returns the raw cudaStream_t of s (as void *) for code that launches on it. */
void *crun_cuda_stream_handle(const crun_cuda_stream_t *s);

/* Returns 1 when all work queued on s has finished, 0 when some is pending. */
int crun_cuda_stream_query(crun_cuda_stream_t *s);

/* Waits on the host for all work queued on s. Blocks. */
int crun_cuda_stream_synchronize(crun_cuda_stream_t *s);

/* The default stream of `device` (no reference is taken: do not release). */
int crun_cuda_default_stream(int device, crun_cuda_stream_t **out);

/* The calling thread's current stream of `device` (-1: the current device);
 * the default stream until crun_cuda_set_stream. No reference is taken. */
int crun_cuda_current_stream(int device, crun_cuda_stream_t **out);

/* Makes s the calling thread's current stream of s's device (the thread
 * keeps a reference until another stream replaces it). */
int crun_cuda_set_stream(crun_cuda_stream_t *s);

/* ---------------------------------------------------------------- events */
typedef struct crun_cuda_event crun_cuda_event_t;

/* Creates an event; `timing` != 0 lets it measure elapsed time. */
int crun_cuda_event_create(int device, int timing, crun_cuda_event_t **out);
void crun_cuda_event_release(crun_cuda_event_t *e);

/* Records e on s (NULL: the current stream of e's device). */
int crun_cuda_event_record(crun_cuda_event_t *e, crun_cuda_stream_t *s);

/* Makes s (NULL: the current stream) wait for e's recorded work; the host
 * does not block. */
int crun_cuda_event_wait(crun_cuda_event_t *e, crun_cuda_stream_t *s);

/* 1 when the work recorded by e has finished (or e was never recorded). */
int crun_cuda_event_query(crun_cuda_event_t *e);
int crun_cuda_event_synchronize(crun_cuda_event_t *e);

/* Milliseconds between two finished timing events; CRUN_ESTATE when either
 * was not recorded or is not finished, CRUN_EINVAL when made without timing. */
int crun_cuda_event_elapsed_ms(crun_cuda_event_t *start, crun_cuda_event_t *end, double *ms);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_CUDA_H */
