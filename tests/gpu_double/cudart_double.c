/* cudart_double.c — a TEST DOUBLE of the subset of the CUDA runtime crun
 * calls. It is linked only into the second build under build/gpudouble/
 * (tests/gpu_double/CMakeLists.txt), never into libcrunrt or crun-lua.
 *
 * "Device memory" is host memory. Each stream is a FIFO of operations run
 * by its own worker thread, so work really is asynchronous: an event
 * completes when its stream reaches it, cudaStreamWaitEvent stalls the
 * waiting stream (not the host) until then, queries answer
 * cudaErrorNotReady while work is pending, and elapsed times are measured
 * between the moments the streams reached the two events. Simplifications:
 * the default stream of a device (NULL, cudaStreamLegacy, cudaStreamPerThread)
 * is one more stream that does not synchronise with the others; memory pools
 * are one counter pair per device (used, cached).
 *
 * Knobs (read once): CRUN_CUDA_DOUBLE_DEVICES (device count, default 2; 0
 * makes cudaGetDeviceCount fail with cudaErrorNoDevice),
 * CRUN_CUDA_DOUBLE_MEM (bytes of memory per device, default 1 GiB).
 * Fresh device memory is filled with 0xA5 bytes (cudaMalloc does not zero).
 * A stream stalled on an event for CRUN_CUDA_DOUBLE_STALL_S seconds (default
 * 120) aborts the process with a message: a double never hangs a test; so
 * does any call with an event after cudaEventDestroy (the last 4096
 * destroyed events are kept to catch that). */
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "double_counts.h"

#define DBL_MAX_DEV 16

/* ---------------------------------------------------------------- state */

typedef enum { OP_COPY, OP_COPY2D, OP_SET, OP_RECORD, OP_WAIT, OP_FREE, OP_HOSTFN } op_kind_t;

struct CUevent_st { /* cudaEvent_t points at one of these */
  int device, timing, destroyed, qrefs; /* qrefs: queued ops pointing here */
  int evicted; /* destroyed and out of the graveyard: freed once qrefs is 0 */
  uint64_t recorded, done; /* sequence numbers: recorded <= done means complete */
  double t_ms;
};

typedef struct dbl_op {
  op_kind_t kind;
  struct dbl_op *next;
  void *dst;
  const void *src;
  size_t n, dpitch, spitch, width, height;
  int value;
  struct CUevent_st *ev;
  uint64_t seq;
  cudaHostFn_t fn;
  void *arg;
} dbl_op_t;

struct CUstream_st { /* cudaStream_t points at one of these */
  int device, destroyed, busy, finished; /* finished: the worker returned (join it) */
  dbl_op_t *head, *tail;
  pthread_t thread;
};

typedef struct dbl_alloc {
  struct dbl_alloc *next;
  void *p;
  size_t n;
  int device; /* -1: pinned host memory */
} dbl_alloc_t;

struct CUmemPoolHandle_st {
  int device;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_ndev = -1;
static size_t g_capacity;
static double g_stall_s;
static struct CUstream_st *g_default[DBL_MAX_DEV];
static struct CUstream_st *g_streams[1024]; /* every worker not joined yet */
static int g_nstreams;
static int g_shutdown; /* set when the double is unloaded or the process exits */
static size_t g_used[DBL_MAX_DEV], g_cached[DBL_MAX_DEV];
static struct CUmemPoolHandle_st g_pools[DBL_MAX_DEV];
static dbl_alloc_t *g_allocs;
static _Thread_local int tl_dev;
static _Thread_local cudaError_t tl_last;

static _Atomic long g_counts[CRUN_DBL_NCOUNTED];
#define COUNT(k) atomic_fetch_add_explicit(&g_counts[CRUN_DBL_##k], 1, memory_order_relaxed)

void crun_dbl_count_add(crun_dbl_counted_t k) {
  if (k < CRUN_DBL_NCOUNTED) atomic_fetch_add_explicit(&g_counts[k], 1, memory_order_relaxed);
}

long crun_dbl_count(crun_dbl_counted_t k) { return k < CRUN_DBL_NCOUNTED ? atomic_load(&g_counts[k]) : -1; }

const char *crun_dbl_count_name(crun_dbl_counted_t k) {
  static const char *names[] = {
#define CRUN_DBL_X(name, text) text,
      CRUN_DBL_COUNTED(CRUN_DBL_X)
#undef CRUN_DBL_X
  };
  return k < CRUN_DBL_NCOUNTED ? names[k] : "?";
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double env_num(const char *name, double def) {
  const char *v = getenv(name);
  return v && *v ? strtod(v, NULL) : def;
}

static void init_locked(void) {
  if (g_ndev >= 0) return;
  g_ndev = (int)env_num("CRUN_CUDA_DOUBLE_DEVICES", 2);
  if (g_ndev < 0) g_ndev = 0;
  if (g_ndev > DBL_MAX_DEV) g_ndev = DBL_MAX_DEV;
  g_capacity = (size_t)env_num("CRUN_CUDA_DOUBLE_MEM", 1024.0 * 1024 * 1024);
  g_stall_s = env_num("CRUN_CUDA_DOUBLE_STALL_S", 120);
  for (int d = 0; d < DBL_MAX_DEV; d++) g_pools[d].device = d;
}

static cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) tl_last = e;
  return e;
}

/* ---------------------------------------------------------------- stream workers */

static void run_op(dbl_op_t *op) {
  switch (op->kind) {
  case OP_COPY: memmove(op->dst, op->src, op->n); break;
  case OP_COPY2D:
    for (size_t r = 0; r < op->height; r++)
      memmove((char *)op->dst + r * op->dpitch, (const char *)op->src + r * op->spitch, op->width);
    break;
  case OP_SET: memset(op->dst, op->value, op->n); break;
  case OP_HOSTFN: op->fn(op->arg); break;
  default: break; /* the others run under the lock in worker() */
  }
}

/* Destroyed events are kept (the last DBL_GRAVE of them) so that a later
 * call with one is caught: events_live aborts the process naming the call
 * (with CUDA that handle may already be another event: an event pool that
 * destroyed an event some operation still waits on or queries). */
#define DBL_GRAVE 4096
static struct CUevent_st *g_grave[DBL_GRAVE];
static int g_grave_at;

static void bury_locked(struct CUevent_st *ev) {
  struct CUevent_st *old = g_grave[g_grave_at];
  g_grave[g_grave_at] = ev;
  g_grave_at = (g_grave_at + 1) % DBL_GRAVE;
  if (!old) return;
  old->evicted = 1;
  if (old->qrefs == 0) free(old);
}

/* Aborts the process when ev was destroyed (a use after cudaEventDestroy). */
static void event_live(const struct CUevent_st *ev, const char *call) {
  pthread_mutex_lock(&g_mu);
  int dead = ev->destroyed;
  pthread_mutex_unlock(&g_mu);
  if (!dead) return;
  fprintf(stderr, "cudart_double: %s on an event after cudaEventDestroy (a use after free with CUDA); aborting\n", call);
  abort();
}

static void event_unref_locked(struct CUevent_st *ev) {
  if (--ev->qrefs == 0 && ev->evicted) free(ev);
}

static int run_locked(struct CUstream_st *s, dbl_op_t *op) {
  if (op->kind == OP_RECORD) {
    op->ev->t_ms = now_ms();
    if (op->ev->done < op->seq) op->ev->done = op->seq;
    event_unref_locked(op->ev);
    return 1;
  }
  if (op->kind == OP_WAIT) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double until = dl.tv_sec + dl.tv_nsec / 1e9 + g_stall_s;
    while (op->ev->done < op->seq && !g_shutdown) {
      dl.tv_sec = (time_t)until;
      dl.tv_nsec = (long)((until - (double)dl.tv_sec) * 1e9);
      if (pthread_cond_timedwait(&g_cv, &g_mu, &dl) != 0 && op->ev->done < op->seq && !g_shutdown) {
        fprintf(stderr, "cudart_double: a stream of device %d waited %.0f s for an event that never "
                        "completed (CRUN_CUDA_DOUBLE_STALL_S); aborting\n", s->device, g_stall_s);
        abort();
      }
    }
    event_unref_locked(op->ev);
    return 1;
  }
  if (op->kind == OP_FREE) {
    dbl_alloc_t **pp = &g_allocs;
    while (*pp && (*pp)->p != op->dst) pp = &(*pp)->next;
    if (*pp) {
      dbl_alloc_t *a = *pp;
      *pp = a->next;
      g_used[a->device] -= a->n;
      g_cached[a->device] += a->n;
      free(a->p);
      free(a);
    }
    return 1;
  }
  return 0;
}

static void *worker(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!s->head && !s->destroyed && !g_shutdown) pthread_cond_wait(&g_cv, &g_mu);
    if (g_shutdown || !s->head) break; /* unloading, or destroyed and drained */
    dbl_op_t *op = s->head;
    s->busy = 1;
    if (!run_locked(s, op)) {
      pthread_mutex_unlock(&g_mu);
      run_op(op);
      pthread_mutex_lock(&g_mu);
    }
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->busy = 0;
    free(op);
    pthread_cond_broadcast(&g_cv);
  }
  s->finished = 1; /* joined and freed by reap_locked or the destructor */
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* Joins and frees the workers of destroyed streams that have returned. */
static void reap_locked(void) {
  for (int i = 0; i < g_nstreams;) {
    struct CUstream_st *s = g_streams[i];
    if (!s->finished) {
      i++;
      continue;
    }
    pthread_join(s->thread, NULL); /* it has released g_mu: returns at once */
    g_streams[i] = g_streams[--g_nstreams];
    free(s);
  }
}

/* The worker threads run code of the library holding the double (the Lua
 * module is dlclose'd when its state closes): stop and join them all before
 * that code goes away. Queued work is dropped. */
__attribute__((destructor)) static void double_unload(void) {
  pthread_mutex_lock(&g_mu);
  g_shutdown = 1;
  pthread_cond_broadcast(&g_cv);
  struct CUstream_st *all[sizeof g_streams / sizeof *g_streams];
  int n = g_nstreams;
  memcpy(all, g_streams, (size_t)n * sizeof *all);
  g_nstreams = 0;
  pthread_mutex_unlock(&g_mu);
  for (int i = 0; i < n; i++) {
    pthread_join(all[i]->thread, NULL);
    pthread_mutex_lock(&g_mu);
    for (dbl_op_t *op = all[i]->head, *next; op; op = next) { /* the dropped work */
      next = op->next;
      if (op->ev) event_unref_locked(op->ev);
      free(op);
    }
    pthread_mutex_unlock(&g_mu);
    free(all[i]);
  }
}

static struct CUstream_st *stream_new_locked(int device) {
  reap_locked();
  if (g_shutdown || g_nstreams == (int)(sizeof g_streams / sizeof *g_streams)) return NULL;
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->device = device;
  int rc = pthread_create(&s->thread, NULL, worker, s);
  if (rc) {
    free(s);
    return NULL;
  }
  g_streams[g_nstreams++] = s;
  return s;
}

/* Maps a cudaStream_t to its queue (the default ones are made on first use). */
static struct CUstream_st *resolve_locked(cudaStream_t st) {
  init_locked();
  if (st && st != cudaStreamLegacy && st != cudaStreamPerThread) return st->destroyed ? NULL : st;
  int d = tl_dev;
  if (d < 0 || d >= g_ndev) return NULL;
  if (!g_default[d]) g_default[d] = stream_new_locked(d);
  return g_default[d];
}

static cudaError_t enqueue(cudaStream_t st, dbl_op_t *tmpl) {
  dbl_op_t *op = malloc(sizeof *op);
  if (!op) return ret(cudaErrorMemoryAllocation);
  *op = *tmpl;
  op->next = NULL;
  pthread_mutex_lock(&g_mu);
  struct CUstream_st *s = resolve_locked(st);
  if (!s) {
    pthread_mutex_unlock(&g_mu);
    free(op);
    return ret(cudaErrorInvalidResourceHandle);
  }
  if (op->ev) op->ev->qrefs++;
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

static int idle_locked(struct CUstream_st *s) { return !s->head && !s->busy; }

/* ---------------------------------------------------------------- errors, devices */

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  default: return "unknown error";
  }
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tl_last;
  tl_last = cudaSuccess;
  return e;
}

cudaError_t cudaGetDeviceCount(int *count) {
  pthread_mutex_lock(&g_mu);
  init_locked();
  int n = g_ndev;
  pthread_mutex_unlock(&g_mu);
  *count = n;
  return n ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  int n;
  cudaGetDeviceCount(&n);
  if (device < 0 || device >= n) return ret(cudaErrorInvalidDevice);
  tl_dev = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  *device = tl_dev;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
  *can = device != peer;
  return cudaSuccess;
}

/* Waits until every stream of the current device is idle. */
cudaError_t cudaDeviceSynchronize(void) {
  COUNT(HOST_SYNC);
  pthread_mutex_lock(&g_mu);
  init_locked();
  for (;;) {
    int busy = 0;
    for (int i = 0; i < g_nstreams; i++)
      if (g_streams[i]->device == tl_dev && !idle_locked(g_streams[i])) busy = 1;
    if (!busy) break;
    pthread_cond_wait(&g_cv, &g_mu);
  }
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

/* ---------------------------------------------------------------- streams */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  COUNT(STREAM_CREATE);
  pthread_mutex_lock(&g_mu);
  init_locked();
  struct CUstream_st *s = tl_dev < g_ndev ? stream_new_locked(tl_dev) : NULL;
  pthread_mutex_unlock(&g_mu);
  if (!s) return ret(cudaErrorMemoryAllocation);
  *out = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, 0); }

/* Like CUDA: returns at once; queued work still runs, then the worker ends. */
cudaError_t cudaStreamDestroy(cudaStream_t st) {
  if (!st || st == cudaStreamLegacy || st == cudaStreamPerThread) return ret(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&g_mu);
  st->destroyed = 1;
  pthread_cond_broadcast(&g_cv);
  /* the worker of an idle stream returns at once: join it now, so that a
   * process ending by _exit (the C tests' cases), which runs no destructor,
   * leaves no thread unjoined (ThreadSanitizer: thread leak); a stream with
   * work queued is joined later, by reap_locked or the destructor */
  while (!st->head && !st->finished) pthread_cond_wait(&g_cv, &g_mu);
  reap_locked();
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t st) {
  pthread_mutex_lock(&g_mu);
  struct CUstream_st *s = resolve_locked(st);
  cudaError_t e = !s ? cudaErrorInvalidResourceHandle : idle_locked(s) ? cudaSuccess : cudaErrorNotReady;
  pthread_mutex_unlock(&g_mu);
  return e == cudaErrorInvalidResourceHandle ? ret(e) : e;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
  COUNT(HOST_SYNC);
  return crun_dbl_stream_sync(st);
}

cudaError_t crun_dbl_stream_sync(cudaStream_t st) {
  pthread_mutex_lock(&g_mu);
  struct CUstream_st *s = resolve_locked(st);
  while (s && !idle_locked(s)) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return s ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int flags) {
  if (!ev) return ret(cudaErrorInvalidResourceHandle);
  event_live(ev, "cudaStreamWaitEvent");
  pthread_mutex_lock(&g_mu);
  uint64_t seq = ev->recorded; /* the work recorded so far; never recorded: nothing to wait for */
  pthread_mutex_unlock(&g_mu);
  dbl_op_t op = {.kind = OP_WAIT, .ev = ev, .seq = seq};
  return enqueue(st, &op);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void *arg) {
  dbl_op_t op = {.kind = OP_HOSTFN, .fn = fn, .arg = arg};
  return enqueue(st, &op);
}

/* ---------------------------------------------------------------- events */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
  COUNT(EVENT_CREATE);
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return ret(cudaErrorMemoryAllocation);
  e->device = tl_dev;
  e->timing = !(flags & cudaEventDisableTiming);
  *out = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, 0); }

/* Like CUDA: returns at once; queued records and waits still complete.
 * The event goes to the graveyard (bury_locked), freed later. */
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  COUNT(EVENT_DESTROY);
  if (!ev) return ret(cudaErrorInvalidResourceHandle);
  event_live(ev, "cudaEventDestroy");
  pthread_mutex_lock(&g_mu);
  ev->destroyed = 1;
  bury_locked(ev);
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
  if (!ev) return ret(cudaErrorInvalidResourceHandle);
  event_live(ev, "cudaEventRecord");
  pthread_mutex_lock(&g_mu);
  uint64_t seq = ++ev->recorded;
  pthread_mutex_unlock(&g_mu);
  dbl_op_t op = {.kind = OP_RECORD, .ev = ev, .seq = seq};
  cudaError_t e = enqueue(st, &op);
  if (e != cudaSuccess) {
    pthread_mutex_lock(&g_mu);
    ev->recorded--;
    pthread_mutex_unlock(&g_mu);
  }
  return e;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  if (!ev) return ret(cudaErrorInvalidResourceHandle);
  event_live(ev, "cudaEventQuery");
  pthread_mutex_lock(&g_mu);
  int done = ev->done >= ev->recorded;
  pthread_mutex_unlock(&g_mu);
  return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  COUNT(HOST_SYNC);
  if (!ev) return ret(cudaErrorInvalidResourceHandle);
  event_live(ev, "cudaEventSynchronize");
  pthread_mutex_lock(&g_mu);
  while (ev->done < ev->recorded) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b) return ret(cudaErrorInvalidResourceHandle);
  event_live(a, "cudaEventElapsedTime");
  event_live(b, "cudaEventElapsedTime");
  if (!a->timing || !b->timing) return ret(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&g_mu);
  int recorded = a->recorded && b->recorded;
  int done = a->done >= a->recorded && b->done >= b->recorded;
  double d = b->t_ms - a->t_ms;
  pthread_mutex_unlock(&g_mu);
  if (!recorded) return ret(cudaErrorInvalidResourceHandle);
  if (!done) return ret(cudaErrorNotReady);
  *ms = (float)d;
  return cudaSuccess;
}

/* ---------------------------------------------------------------- memory */

static dbl_alloc_t *find_locked(const void *p) {
  for (dbl_alloc_t *a = g_allocs; a; a = a->next)
    if ((const char *)p >= (const char *)a->p && (const char *)p < (const char *)a->p + (a->n ? a->n : 1))
      return a;
  return NULL;
}

cudaError_t cudaMallocAsync(void **out, size_t n, cudaStream_t st) {
  COUNT(MALLOC);
  pthread_mutex_lock(&g_mu);
  struct CUstream_st *s = resolve_locked(st);
  int d = s ? s->device : 0;
  if (!s || !out) {
    pthread_mutex_unlock(&g_mu);
    return ret(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  }
  if (g_used[d] + n > g_capacity || n > g_capacity) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorMemoryAllocation);
  }
  dbl_alloc_t *a = calloc(1, sizeof *a);
  void *p = a ? aligned_alloc(256, (n + 255) / 256 * 256 + 256) : NULL;
  if (!p) {
    free(a);
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorMemoryAllocation);
  }
  memset(p, 0xA5, n);
  a->p = p, a->n = n, a->device = d;
  a->next = g_allocs;
  g_allocs = a;
  size_t reuse = g_cached[d] < n ? g_cached[d] : n; /* the pool hands out cached memory first */
  g_cached[d] -= reuse;
  g_used[d] += n;
  pthread_mutex_unlock(&g_mu);
  *out = p;
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t st) {
  COUNT(FREE);
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&g_mu);
  dbl_alloc_t *a = find_locked(p);
  int ok = a && a->p == p && a->device >= 0;
  pthread_mutex_unlock(&g_mu);
  if (!ok) return ret(cudaErrorInvalidValue);
  dbl_op_t op = {.kind = OP_FREE, .dst = p};
  return enqueue(st, &op);
}

cudaError_t cudaHostAlloc(void **out, size_t n, unsigned int flags) {
  COUNT(MALLOC);
  dbl_alloc_t *a = calloc(1, sizeof *a);
  void *p = a ? aligned_alloc(256, (n + 255) / 256 * 256 + 256) : NULL;
  if (!p) {
    free(a);
    return ret(cudaErrorMemoryAllocation);
  }
  a->p = p, a->n = n, a->device = -1;
  pthread_mutex_lock(&g_mu);
  a->next = g_allocs;
  g_allocs = a;
  pthread_mutex_unlock(&g_mu);
  *out = p;
  return cudaSuccess;
}

/* Like CUDA, waits for all queued work first (a pending copy may read p). */
cudaError_t cudaFreeHost(void *p) {
  COUNT(FREE);
  pthread_mutex_lock(&g_mu);
  for (;;) {
    int busy = 0;
    for (int i = 0; i < g_nstreams; i++) busy |= !idle_locked(g_streams[i]);
    if (!busy) break;
    pthread_cond_wait(&g_cv, &g_mu);
  }
  dbl_alloc_t **pp = &g_allocs;
  while (*pp && !((*pp)->p == p && (*pp)->device < 0)) pp = &(*pp)->next;
  dbl_alloc_t *a = *pp;
  if (a) *pp = a->next;
  pthread_mutex_unlock(&g_mu);
  if (!a) return ret(cudaErrorInvalidValue);
  free(a->p);
  free(a);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p) {
  memset(at, 0, sizeof *at);
  pthread_mutex_lock(&g_mu);
  dbl_alloc_t *a = find_locked(p);
  if (a) {
    at->type = a->device >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    at->device = a->device >= 0 ? a->device : 0;
    at->devicePointer = (void *)p;
    at->hostPointer = a->device >= 0 ? NULL : (void *)p;
  } else {
    at->type = cudaMemoryTypeUnregistered;
    at->hostPointer = (void *)p;
  }
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
  int n;
  cudaGetDeviceCount(&n);
  if (device < 0 || device >= n) return ret(cudaErrorInvalidDevice);
  *pool = &g_pools[device];
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  return pool ? cudaSuccess : ret(cudaErrorInvalidValue); /* the double's pool always caches */
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  if (!pool) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&g_mu);
  uint64_t v = 0;
  if (attr == cudaMemPoolAttrReservedMemCurrent) v = g_used[pool->device] + g_cached[pool->device];
  else if (attr == cudaMemPoolAttrUsedMemCurrent) v = g_used[pool->device];
  pthread_mutex_unlock(&g_mu);
  *(uint64_t *)value = v;
  return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  if (!pool) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&g_mu);
  if (g_cached[pool->device] > keep) g_cached[pool->device] = keep;
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

/* ---------------------------------------------------------------- copies */

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t st) {
  if (!n) return cudaSuccess;
  if (!dst || !src) return ret(cudaErrorInvalidValue);
  dbl_op_t op = {.kind = OP_COPY, .dst = dst, .src = src, .n = n};
  return enqueue(st, &op);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
                                cudaStream_t st) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t st) {
  if (!width || !height) return cudaSuccess;
  if (!dst || !src || dpitch < width || spitch < width) return ret(cudaErrorInvalidValue);
  dbl_op_t op = {.kind = OP_COPY2D, .dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch,
                 .width = width, .height = height};
  return enqueue(st, &op);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t st) {
  if (!n) return cudaSuccess;
  if (!p) return ret(cudaErrorInvalidValue);
  dbl_op_t op = {.kind = OP_SET, .dst = p, .value = value, .n = n};
  return enqueue(st, &op);
}
