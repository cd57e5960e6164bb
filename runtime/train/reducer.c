/* reducer.c — DDP gradient bucketing (torch's Reducer): gradients grouped in
 * reverse registration order into flat per-dtype buckets, each bucket's
 * async all_reduce (average) launched in bucket order as soon as all its
 * gradients are ready, and finalize waiting for them and copying back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crun/core.h"
#include "crun/train.h"
#include "crun/trace.h"
#include "cuda/cuda_int.h"

typedef struct {
  crun_tensor_t *buf;  /* flat, numel elements */
  crun_dtype_t dt;
  int64_t numel;
  size_t bytes;
  int first, count;    /* its gradients: order[first .. first+count-1] */
  int pending;         /* gradients not yet ready this iteration */
  crun_work_t *work;   /* in-flight all_reduce, or NULL */
} bucket_t;

typedef struct {
  crun_tensor_t *grad;
  int bucket;
  int64_t offset, numel;
  int ready;
} slot_t;

struct crun_reducer {
  crun_pg_t *pg;
  crun_reducer_opts_t opts;
  int n, nb, next_launch;
  int device;          /* of every gradient and bucket: -1 host, else a CUDA device */
  slot_t *slots;
  int *order;
  bucket_t *buckets;
};

static int is_float(crun_dtype_t dt) {
  return dt == CRUN_FLOAT32 || dt == CRUN_FLOAT64 || dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16;
}

/* Checks every gradient and fills the bucket layout (reverse order, caps). */
static int plan(crun_reducer_t *r, crun_tensor_t *const *grads) {
  size_t limit = r->opts.first_bucket_bytes;
  bucket_t *cur = NULL;
  int k = 0;
  for (int i = r->n - 1; i >= 0; i--) {
    crun_tensor_t *g = grads[i];
    if (!g) return crun_error(CRUN_EINVAL, "reducer: gradient %d is NULL", i);
    crun_dtype_t dt = crun_tensor_dtype(g);
    if (!is_float(dt))
      return crun_error(CRUN_EINVAL, "reducer: gradient %d has unsupported dtype %s (float dtypes only)", i,
                        crun_dtype_name(dt));
    if (!crun_tensor_is_contiguous(g))
      return crun_error(CRUN_EINVAL, "reducer: gradient %d is not contiguous", i);
    if (i == r->n - 1) r->device = crun_tensor_device(g);
    if (crun_tensor_device(g) != r->device)
      return crun_error(CRUN_EINVAL, "reducer: gradient %d is on device %d, gradient %d on device %d (one place for all)",
                        i, crun_tensor_device(g), r->n - 1, r->device);
    size_t bytes = crun_tensor_nbytes(g);
    if (cur && (cur->dt != dt || (cur->bytes > 0 && cur->bytes + bytes > limit))) {
      cur = NULL;
      limit = r->opts.bucket_cap_bytes;
    }
    if (!cur) {
      cur = &r->buckets[r->nb++];
      cur->dt = dt;
      cur->first = k;
    }
    slot_t *s = &r->slots[i];
    s->grad = g;
    crun_tensor_retain(g);
    s->bucket = (int)(cur - r->buckets);
    s->offset = cur->numel;
    s->numel = crun_tensor_numel(g);
    cur->numel += s->numel;
    cur->bytes += bytes;
    cur->count++;
    r->order[k++] = i;
  }
  return 0;
}

static void reset(crun_reducer_t *r) {
  for (int i = 0; i < r->n; i++) r->slots[i].ready = 0;
  for (int b = 0; b < r->nb; b++) r->buckets[b].pending = r->buckets[b].count;
  r->next_launch = 0;
}

/* Byte address of element `off` of bucket b. */
static char *bucket_at(const crun_reducer_t *r, int b, int64_t off) {
  const bucket_t *bk = &r->buckets[b];
  return (char *)crun_tensor_data(bk->buf) + (size_t)off * crun_dtype_size(bk->dt);
}

/* Copies n bytes between a gradient and its bucket: memcpy on the host; on
 * a device, ordered on the device's current stream (which the group's stream
 * waits for before the all_reduce, and the caller's later work follows). */
static int move_bytes(const crun_reducer_t *r, void *dst, const void *src, size_t n) {
  if (r->device < 0) {
    memcpy(dst, src, n);
    return 0;
  }
  return crun__cuda_memcpy(dst, r->device, src, r->device, n, crun__cuda_current_stream(r->device), 0);
}

/* Allocates the buckets (on the gradients' device); with grad_as_view the
 * gradients become their views. */
static int make_buffers(crun_reducer_t *r) {
  for (int b = 0; b < r->nb; b++) {
    int64_t shape[1] = {r->buckets[b].numel};
    int rc = crun_tensor_new_on(r->buckets[b].dt, 1, shape, r->device, &r->buckets[b].buf);
    if (rc < 0) return rc;
  }
  if (!r->opts.grad_as_view) return 0;
  for (int i = 0; i < r->n; i++) {
    crun_tensor_t *v = NULL;
    int rc = crun_reducer_bucket_view(r, i, &v);
    if (rc < 0) return rc;
    rc = move_bytes(r, crun_tensor_data(v), crun_tensor_data(r->slots[i].grad), crun_tensor_nbytes(v));
    if (rc < 0) {
      crun_tensor_release(v);
      return rc;
    }
    crun_tensor_release(r->slots[i].grad);
    r->slots[i].grad = v;
  }
  return 0;
}

int crun_reducer_new(crun_pg_t *pg, crun_tensor_t *const *grads, int n,
                     const crun_reducer_opts_t *opts, crun_reducer_t **out) {
  if (!out || n < 0 || (n > 0 && !grads)) return crun_error(CRUN_EINVAL, "reducer_new: bad arguments (n=%d)", n);
  crun_reducer_t *r = calloc(1, sizeof *r);
  if (!r) return crun_error(CRUN_ENOMEM, "reducer_new: no memory");
  if (opts) r->opts = *opts;
  if (!r->opts.bucket_cap_bytes) r->opts.bucket_cap_bytes = 25u << 20;
  if (!r->opts.first_bucket_bytes) r->opts.first_bucket_bytes = 1u << 20;
  r->n = n;
  r->slots = calloc((size_t)n + 1, sizeof *r->slots);
  r->order = calloc((size_t)n + 1, sizeof *r->order);
  r->buckets = calloc((size_t)n + 1, sizeof *r->buckets);
  int rc = (r->slots && r->order && r->buckets) ? 0 : crun_error(CRUN_ENOMEM, "reducer_new: no memory");
  if (rc == 0) rc = plan(r, grads);
  if (rc == 0) rc = make_buffers(r);
  if (rc < 0) {
    crun_reducer_free(r);
    return rc;
  }
  if (pg) crun_pg_retain(pg);
  r->pg = pg;
  reset(r);
  CRUN_LOG(INFO, DDP, "reducer: %d gradients in %d buckets", n, r->nb);
  *out = r;
  return 0;
}

/* Waits for every in-flight all_reduce (until its own deadline) and drops it. */
static void drain(crun_reducer_t *r) {
  for (int b = 0; b < r->nb; b++) {
    if (!r->buckets[b].work) continue;
    (void)crun_work_wait(r->buckets[b].work, 0);
    crun_work_release(r->buckets[b].work);
    r->buckets[b].work = NULL;
  }
}

void crun_reducer_free(crun_reducer_t *r) {
  if (!r) return;
  if (r->buckets) {
    drain(r);
    for (int b = 0; b < r->nb; b++) crun_tensor_release(r->buckets[b].buf);
  }
  for (int i = 0; r->slots && i < r->n; i++)
    if (r->slots[i].grad) crun_tensor_release(r->slots[i].grad);
  if (r->pg) crun_pg_release(r->pg);
  free(r->slots);
  free(r->order);
  free(r->buckets);
  free(r);
}

int crun_reducer_num_buckets(const crun_reducer_t *r) { return r ? r->nb : 0; }

crun_tensor_t *crun_reducer_bucket(const crun_reducer_t *r, int b) {
  return (r && b >= 0 && b < r->nb) ? r->buckets[b].buf : NULL;
}

int crun_reducer_bucket_size(const crun_reducer_t *r, int b) {
  if (!r || b < 0 || b >= r->nb) return crun_error(CRUN_EINVAL, "reducer: bucket %d out of range", b);
  return r->buckets[b].count;
}

int crun_reducer_bucket_entry(const crun_reducer_t *r, int b, int k, int *grad, int64_t *offset) {
  if (!r || b < 0 || b >= r->nb || k < 0 || k >= r->buckets[b].count)
    return crun_error(CRUN_EINVAL, "reducer: bucket %d entry %d out of range", b, k);
  int i = r->order[r->buckets[b].first + k];
  if (grad) *grad = i;
  if (offset) *offset = r->slots[i].offset;
  return 0;
}

int crun_reducer_bucket_view(crun_reducer_t *r, int i, crun_tensor_t **view) {
  if (!r || i < 0 || i >= r->n) return crun_error(CRUN_EINVAL, "reducer: gradient %d out of range", i);
  slot_t *s = &r->slots[i];
  crun_tensor_t *flat = NULL;
  int rc = crun_tensor_narrow(r->buckets[s->bucket].buf, 0, s->offset, s->numel, &flat);
  if (rc < 0) return rc;
  rc = crun_tensor_view(flat, crun_tensor_ndim(s->grad), crun_tensor_shape(s->grad), view);
  crun_tensor_release(flat);
  return rc;
}

static int check_pg(const crun_reducer_t *r, const char *what) {
  if (!r->pg) return crun_error(CRUN_ESTATE, "reducer %s: this reducer has no process group", what);
  return 0;
}

/* Launches the all_reduce of bucket b (average). */
static int launch(crun_reducer_t *r, int b) {
  bucket_t *bk = &r->buckets[b];
  crun_coll_opts_t o = {0};
  /* a device bucket goes to the group's device backend (nccl), whose stream
   * first waits for the caller's current stream, where the bucket's copies
   * are queued (no host wait here: the all_reduce overlaps backward) */
  o.cuda = r->device >= 0;
  int rc = crun_pg_all_reduce(r->pg, crun_tensor_data(bk->buf), (size_t)bk->numel, bk->dt, CRUN_OP_AVG,
                              &o, &bk->work);
  if (rc < 0) return rc;
  CRUN_LOG(TRACE, DDP, "reducer: launched bucket %d (%lld elements)", b, (long long)bk->numel);
  if (crun_trace_enabled()) {
    char name[48];
    snprintf(name, sizeof name, "bucket %d launch (%lld elements)", b, (long long)bk->numel);
    crun_trace_instant(name, "ddp", crun_clock_ns());
  }
  return 0;
}

/* Launches, in bucket order, every complete bucket not launched yet. */
static int launch_ready(crun_reducer_t *r) {
  while (r->next_launch < r->nb && r->buckets[r->next_launch].pending == 0) {
    int rc = launch(r, r->next_launch);
    if (rc < 0) return rc;
    r->next_launch++;
  }
  return 0;
}

/* Marks gradient i ready (copying it into its bucket). */
static int mark(crun_reducer_t *r, int i) {
  slot_t *s = &r->slots[i];
  if (s->ready)
    return crun_error(CRUN_ESTATE, "reducer: gradient %d (rank %d) marked ready twice in one iteration", i,
                      crun_pg_rank(r->pg));
  if (!r->opts.grad_as_view)
    CRUN_CHECK(move_bytes(r, bucket_at(r, s->bucket, s->offset), crun_tensor_data(s->grad), crun_tensor_nbytes(s->grad)));
  s->ready = 1;
  r->buckets[s->bucket].pending--;
  return 0;
}

int crun_reducer_mark_ready(crun_reducer_t *r, int i) {
  if (!r || i < 0 || i >= r->n)
    return crun_error(CRUN_EINVAL, "reducer mark_ready: gradient %d out of range [0, %d)", i, r ? r->n : 0);
  int rc = check_pg(r, "mark_ready");
  if (rc == 0) rc = mark(r, i);
  if (rc == 0 && !r->opts.no_overlap && !r->opts.external) rc = launch_ready(r);
  return rc;
}

static int copy_back(crun_reducer_t *r, int b);

/* Fails in external mode: the caller owns the communication. */
static int check_internal(const crun_reducer_t *r, const char *what) {
  if (r->opts.external)
    return crun_error(CRUN_ESTATE, "reducer %s: a communication hook reduces the buckets (use finish)", what);
  return 0;
}

int crun_reducer_next_ready(crun_reducer_t *r) {
  if (!r || !r->opts.external || r->next_launch >= r->nb || r->buckets[r->next_launch].pending > 0) return -1;
  return r->next_launch++;
}

int crun_reducer_mark_rest(crun_reducer_t *r) {
  if (!r) return crun_error(CRUN_EINVAL, "reducer mark_rest: NULL reducer");
  for (int i = 0; i < r->n; i++)
    if (!r->slots[i].ready) CRUN_CHECK(mark(r, i));
  return 0;
}

int crun_reducer_finish(crun_reducer_t *r) {
  if (!r) return crun_error(CRUN_EINVAL, "reducer finish: NULL reducer");
  if (!r->opts.external) return crun_error(CRUN_ESTATE, "reducer finish: only with a communication hook");
  if (r->next_launch < r->nb) {
    int b = r->next_launch;
    reset(r);
    return crun_error(CRUN_ESTATE, "reducer finish on rank %d: bucket %d was not reduced (%s)",
                      r->pg ? crun_pg_rank(r->pg) : -1, b,
                      r->buckets[b].pending ? "its gradients are not all ready" : "never taken");
  }
  int rc = 0;
  for (int b = 0; rc == 0 && b < r->nb && !r->opts.grad_as_view; b++) rc = copy_back(r, b);
  reset(r);
  return rc;
}

/* Copies bucket b back into its gradients. */
static int copy_back(crun_reducer_t *r, int b) {
  const bucket_t *bk = &r->buckets[b];
  for (int k = 0; k < bk->count; k++) {
    slot_t *s = &r->slots[r->order[bk->first + k]];
    CRUN_CHECK(move_bytes(r, crun_tensor_data(s->grad), bucket_at(r, b, s->offset), crun_tensor_nbytes(s->grad)));
  }
  return 0;
}

/* Waits for bucket b and copies it back into its gradients. */
static int complete(crun_reducer_t *r, int b, double timeout) {
  bucket_t *bk = &r->buckets[b];
  uint64_t t0 = crun_clock_ns();
  int rc = crun_work_wait(bk->work, timeout);
  if (rc < 0) return rc;
  if (crun_trace_enabled()) {
    char name[48];
    snprintf(name, sizeof name, "bucket %d wait", b);
    crun_trace_span(name, "ddp", t0, crun_clock_ns());
  }
  crun_work_release(bk->work);
  bk->work = NULL;
  return r->opts.grad_as_view ? 0 : copy_back(r, b);
}

int crun_reducer_finalize(crun_reducer_t *r, double timeout) {
  if (!r) return crun_error(CRUN_EINVAL, "reducer finalize: NULL reducer");
  int rc = check_pg(r, "finalize");
  if (rc == 0) rc = check_internal(r, "finalize");
  for (int i = 0; rc == 0 && i < r->n; i++)
    if (!r->slots[i].ready) rc = mark(r, i);
  if (rc == 0) rc = launch_ready(r);
  for (int b = 0; rc == 0 && b < r->nb; b++) rc = complete(r, b, timeout > 0 ? timeout : 0);
  if (rc < 0) {
    int keep = rc;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", crun_last_error());
    drain(r);
    reset(r);
    return crun_error(keep, "reducer finalize on rank %d: %s", r->pg ? crun_pg_rank(r->pg) : -1, msg);
  }
  reset(r);
  return 0;
}

int crun_reducer_shadow(crun_reducer_t *r, double timeout) {
  if (!r) return crun_error(CRUN_EINVAL, "reducer shadow: NULL reducer");
  int rc = check_pg(r, "shadow");
  if (rc == 0) rc = check_internal(r, "shadow");
  for (int b = 0; rc == 0 && b < r->nb; b++) {
    memset(crun_tensor_data(r->buckets[b].buf), 0, r->buckets[b].bytes);
    rc = launch(r, b);
  }
  for (int b = 0; rc == 0 && b < r->nb; b++) {
    rc = crun_work_wait(r->buckets[b].work, timeout > 0 ? timeout : 0);
    crun_work_release(r->buckets[b].work);
    r->buckets[b].work = NULL;
  }
  if (rc < 0) drain(r);
  reset(r);
  return rc;
}

void crun_reducer_reset(crun_reducer_t *r) {
  if (!r) return;
  drain(r);
  reset(r);
}

int crun_reducer_launched(const crun_reducer_t *r) { return r ? r->next_launch : 0; }
