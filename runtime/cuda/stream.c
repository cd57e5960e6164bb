/* stream.c — the public device, stream and event API (crun/cuda.h) over the
 * CUDA runtime. Built when CRUN_HAVE_CUDA (off.c answers otherwise). */
#if CRUN_HAVE_CUDA
#include "cuda/cuda_int.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct crun_cuda_stream {
  atomic_long refs; /* the default streams are static and never freed */
  int device, is_default;
  cudaStream_t s;
};

struct crun_cuda_event {
  int device, timing, recorded;
  cudaEvent_t e;
};

static crun_cuda_stream_t g_defaults[CRUN__CUDA_MAX_DEVICES];
static _Thread_local crun_cuda_stream_t *tl_current[CRUN__CUDA_MAX_DEVICES];

/* ---------------------------------------------------------------- devices */

int crun_cuda_is_available(void) {
  int n;
  return crun__cuda_device_count(&n) == 0;
}

int crun_cuda_device_count(int *out) { return crun__cuda_device_count(out); }
int crun_cuda_set_device(int device) { return crun__cuda_set_device(device); }
int crun_cuda_current_device(int *out) { return crun__cuda_current_device(out); }

/* Resolves -1 to the calling thread's current device and checks the index. */
static int pick_device(int *dev, const char *where) {
  if (*dev < 0) return crun__cuda_current_device(dev);
  return crun__cuda_check_device(*dev, where);
}

int crun_cuda_synchronize(int device) {
  int saved;
  CRUN_CHECK(pick_device(&device, "cuda.synchronize"));
  CRUN_CHECK(crun__cuda_enter(device, &saved));
  cudaError_t e = cudaDeviceSynchronize();
  crun__cuda_leave(device, saved);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaDeviceSynchronize", "cuda.synchronize", device);
}

/* ---------------------------------------------------------------- streams */

int crun_cuda_default_stream(int device, crun_cuda_stream_t **out) {
  CRUN_CHECK(pick_device(&device, "cuda.default_stream"));
  crun_cuda_stream_t *s = &g_defaults[device];
  s->device = device; /* idempotent: the same values from every thread */
  s->is_default = 1;
  *out = s;
  return 0;
}

int crun_cuda_current_stream(int device, crun_cuda_stream_t **out) {
  CRUN_CHECK(pick_device(&device, "cuda.current_stream"));
  if (tl_current[device]) {
    *out = tl_current[device];
    return 0;
  }
  return crun_cuda_default_stream(device, out);
}

crun__stream_t crun__cuda_current_stream(int dev) {
  crun_cuda_stream_t *s = dev >= 0 && dev < CRUN__CUDA_MAX_DEVICES ? tl_current[dev] : NULL;
  return s ? (crun__stream_t)s->s : NULL;
}

int crun_cuda_set_stream(crun_cuda_stream_t *s) {
  if (!s) return crun_error(CRUN_EINVAL, "cuda.set_stream: stream is NULL");
  crun_cuda_stream_retain(s);
  crun_cuda_stream_t *old = tl_current[s->device];
  tl_current[s->device] = s->is_default ? NULL : s;
  if (s->is_default) crun_cuda_stream_release(s);
  crun_cuda_stream_release(old);
  return 0;
}

int crun_cuda_stream_create(int device, crun_cuda_stream_t **out) {
  int saved;
  CRUN_CHECK(pick_device(&device, "cuda.Stream"));
  crun_cuda_stream_t *s = calloc(1, sizeof *s);
  if (!s) return crun_error(CRUN_ENOMEM, "cuda.Stream: out of memory");
  int rc = crun__cuda_enter(device, &saved);
  if (rc < 0) {
    free(s);
    return rc;
  }
  cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
  crun__cuda_leave(device, saved);
  if (e != cudaSuccess) {
    free(s);
    return crun__cuda_fail(e, "cudaStreamCreateWithFlags", "cuda.Stream", device);
  }
  atomic_init(&s->refs, 1);
  s->device = device;
  *out = s;
  return 0;
}

void crun_cuda_stream_retain(crun_cuda_stream_t *s) {
  if (s && !s->is_default) atomic_fetch_add(&s->refs, 1);
}

/* The last release destroys the stream; work queued on it still runs. */
void crun_cuda_stream_release(crun_cuda_stream_t *s) {
  if (!s || s->is_default || atomic_fetch_sub(&s->refs, 1) != 1) return;
  int saved;
  if (crun__cuda_enter(s->device, &saved) == 0) {
    (void)cudaStreamDestroy(s->s);
    crun__cuda_leave(s->device, saved);
  }
  free(s);
}

int crun_cuda_stream_device(const crun_cuda_stream_t *s) { return s->device; }
void *crun_cuda_stream_handle(const crun_cuda_stream_t *s) { return (void *)s->s; }

int crun_cuda_stream_query(crun_cuda_stream_t *s) {
  int saved;
  CRUN_CHECK(crun__cuda_enter(s->device, &saved));
  cudaError_t e = cudaStreamQuery(s->s);
  crun__cuda_leave(s->device, saved);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  return crun__cuda_fail(e, "cudaStreamQuery", "Stream:query", s->device);
}

int crun_cuda_stream_synchronize(crun_cuda_stream_t *s) {
  return crun__cuda_stream_wait_host(s->device, (crun__stream_t)s->s);
}

/* ---------------------------------------------------------------- events */

int crun_cuda_event_create(int device, int timing, crun_cuda_event_t **out) {
  int saved;
  CRUN_CHECK(pick_device(&device, "cuda.Event"));
  crun_cuda_event_t *ev = calloc(1, sizeof *ev);
  if (!ev) return crun_error(CRUN_ENOMEM, "cuda.Event: out of memory");
  int rc = crun__cuda_enter(device, &saved);
  if (rc < 0) {
    free(ev);
    return rc;
  }
  cudaError_t e = cudaEventCreateWithFlags(&ev->e, timing ? cudaEventDefault : cudaEventDisableTiming);
  crun__cuda_leave(device, saved);
  if (e != cudaSuccess) {
    free(ev);
    return crun__cuda_fail(e, "cudaEventCreateWithFlags", "cuda.Event", device);
  }
  ev->device = device;
  ev->timing = timing != 0;
  *out = ev;
  return 0;
}

void crun_cuda_event_release(crun_cuda_event_t *ev) {
  if (!ev) return;
  int saved;
  if (crun__cuda_enter(ev->device, &saved) == 0) {
    (void)cudaEventDestroy(ev->e);
    crun__cuda_leave(ev->device, saved);
  }
  free(ev);
}

/* Resolves a NULL stream to the current stream of dev. */
static cudaStream_t stream_of(crun_cuda_stream_t *s, int dev) {
  return s ? s->s : (cudaStream_t)crun__cuda_current_stream(dev);
}

int crun_cuda_event_record(crun_cuda_event_t *ev, crun_cuda_stream_t *s) {
  if (s && s->device != ev->device)
    return crun_error(CRUN_EINVAL, "Event:record: the event is on cuda:%d, the stream on cuda:%d", ev->device,
                      s->device);
  int saved;
  CRUN_CHECK(crun__cuda_enter(ev->device, &saved));
  cudaError_t e = cudaEventRecord(ev->e, stream_of(s, ev->device));
  crun__cuda_leave(ev->device, saved);
  if (e != cudaSuccess) return crun__cuda_fail(e, "cudaEventRecord", "Event:record", ev->device);
  ev->recorded = 1;
  return 0;
}

int crun_cuda_event_wait(crun_cuda_event_t *ev, crun_cuda_stream_t *s) {
  int dev = s ? s->device : ev->device;
  int saved;
  CRUN_CHECK(crun__cuda_enter(dev, &saved));
  cudaError_t e = cudaStreamWaitEvent(stream_of(s, dev), ev->e, 0);
  crun__cuda_leave(dev, saved);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaStreamWaitEvent", "Event:wait", dev);
}

int crun_cuda_event_query(crun_cuda_event_t *ev) {
  cudaError_t e = cudaEventQuery(ev->e);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  return crun__cuda_fail(e, "cudaEventQuery", "Event:query", ev->device);
}

int crun_cuda_event_synchronize(crun_cuda_event_t *ev) {
  cudaError_t e = cudaEventSynchronize(ev->e);
  return e == cudaSuccess ? 0 : crun__cuda_fail(e, "cudaEventSynchronize", "Event:synchronize", ev->device);
}

int crun_cuda_event_elapsed_ms(crun_cuda_event_t *a, crun_cuda_event_t *b, double *ms) {
  if (!a->timing || !b->timing)
    return crun_error(CRUN_EINVAL, "Event:elapsed_time: both events need timing (made with enable_timing)");
  if (!a->recorded || !b->recorded)
    return crun_error(CRUN_ESTATE, "Event:elapsed_time: the %s event was never recorded", a->recorded ? "end" : "start");
  if (!crun_cuda_event_query(a) || !crun_cuda_event_query(b))
    return crun_error(CRUN_ESTATE, "Event:elapsed_time: the work before the %s event has not finished (synchronize first)",
                      crun_cuda_event_query(a) ? "end" : "start");
  float f = 0;
  cudaError_t e = cudaEventElapsedTime(&f, a->e, b->e);
  if (e != cudaSuccess) return crun__cuda_fail(e, "cudaEventElapsedTime", "Event:elapsed_time", a->device);
  *ms = f;
  return 0;
}
#else
typedef int crun__cuda_stream_c_is_empty_without_cuda;
#endif
