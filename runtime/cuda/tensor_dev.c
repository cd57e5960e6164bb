/* tensor_dev.c — tensors whose storage lives on a CUDA device or in pinned
 * host memory: creation, moves between devices and cross-device copies.
 * Built in every configuration: without CUDA the device layer answers
 * ENOTSUP (off.c), so only host tensors ever exist. */
#include "cuda/cuda_int.h"
#include "cuda/dispatch.h"
#include "tensor/tensor_impl.h"

#include "core/checked.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void crun__storage_free_dev(crun__storage_t *st) {
  if (st->pinned) {
    crun__cuda_host_free(st->data);
    return;
  }
  crun__cuda_free(st->device, st->data, st->nbytes, crun_cuda_stream_handle(st->stream));
  crun_cuda_stream_release(st->stream);
}

/* Allocates nbytes on `device` on its current stream into a new storage. */
static int storage_on_device(int device, size_t nbytes, crun__storage_t **out) {
  crun_cuda_stream_t *s;
  CRUN_CHECK(crun__cuda_check_device(device, "tensor"));
  CRUN_CHECK(crun_cuda_current_stream(device, &s));
  crun__storage_t *st = calloc(1, sizeof *st);
  if (!st) return crun_error(CRUN_ENOMEM, "tensor: out of memory");
  if (nbytes) {
    int rc = crun__cuda_alloc(device, nbytes, crun_cuda_stream_handle(s), &st->data);
    if (rc < 0) {
      free(st);
      return rc;
    }
  }
  crun_cuda_stream_retain(s);
  st->stream = s;
  st->device = device;
  st->nbytes = nbytes;
  atomic_init(&st->refs, 0);
  *out = st;
  return 0;
}

/* Bytes of a contiguous dt tensor of that shape (shape already checked). */
static size_t shape_bytes(crun_dtype_t dt, int ndim, const int64_t *shape) {
  size_t n = crun_dtype_size(dt);
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d]; /* < 2^53: crun__check_shape */
  return n;
}

int crun_tensor_empty_on(crun_dtype_t dt, int ndim, const int64_t *shape, int device, crun_tensor_t **out) {
  if (device < 0) return crun_tensor_empty(dt, ndim, shape, out);
  if (!out) return crun_error(CRUN_EINVAL, "tensor: out is NULL");
  if (!crun_dtype_size(dt)) return crun_error(CRUN_EINVAL, "tensor: bad dtype %d", (int)dt);
  CRUN_CHECK(crun__check_shape(ndim, shape, "tensor"));
  crun__storage_t *st = NULL;
  CRUN_CHECK(storage_on_device(device, shape_bytes(dt, ndim, shape), &st));
  atomic_fetch_add(&st->refs, 1); /* held across the wrap so a failure frees it */
  int rc = crun__tensor_over_storage(dt, ndim, shape, st, out);
  if (atomic_fetch_sub(&st->refs, 1) == 1) {
    crun__storage_free_dev(st);
    free(st);
  }
  return rc;
}

int crun_tensor_new_on(crun_dtype_t dt, int ndim, const int64_t *shape, int device, crun_tensor_t **out) {
  if (device < 0) return crun_tensor_new(dt, ndim, shape, out);
  CRUN_CHECK(crun_tensor_empty_on(dt, ndim, shape, device, out));
  crun__storage_t *st = (*out)->st;
  int rc = crun__cuda_memset0(device, st->data, st->nbytes, crun_cuda_stream_handle(st->stream));
  if (rc < 0) {
    crun_tensor_release(*out);
    *out = NULL;
  }
  return rc;
}

int crun_tensor_pin_memory(crun_tensor_t *t, crun_tensor_t **out) {
  if (t->st->pinned) {
    crun_tensor_retain(t);
    *out = t;
    return 0;
  }
  if (t->st->device >= 0)
    return crun_error(CRUN_EINVAL, "pin_memory: the tensor is on cuda:%d, only host tensors can be pinned",
                      t->st->device);
  size_t nbytes = crun_tensor_nbytes(t);
  crun__storage_t *st = calloc(1, sizeof *st);
  if (!st) return crun_error(CRUN_ENOMEM, "pin_memory: out of memory");
  int rc = crun__cuda_host_alloc(nbytes, &st->data);
  if (rc < 0) {
    free(st);
    return rc;
  }
  st->pinned = 1;
  st->device = CRUN_DEVICE_CPU;
  st->nbytes = nbytes;
  atomic_init(&st->refs, 0);
  crun_tensor_t *p;
  rc = crun__tensor_over_storage(t->dt, t->ndim, t->shape, st, &p);
  if (rc < 0) {
    crun__storage_free_dev(st);
    free(st);
    return rc;
  }
  rc = crun_tensor_copy(p, t);
  if (rc < 0) {
    crun_tensor_release(p);
    return rc;
  }
  *out = p;
  return 0;
}

/* Strides of t in bytes. */
static void byte_strides(const crun_tensor_t *t, int64_t *out) {
  int64_t es = (int64_t)crun_dtype_size(t->dt);
  for (int d = 0; d < t->ndim; d++) out[d] = t->strides[d] * es;
}

/* Copies src into dst of the same dtype and shape across devices: both
 * strided, ordered on the current stream of the device side (the
 * destination's when both are devices). Blocks when dst is on the host. */
static int copy_same_dtype(crun_tensor_t *dst, crun_tensor_t *src) {
  int dd = dst->st->device, sd = src->st->device;
  int dev = dd >= 0 ? dd : sd;
  crun__stream_t s = crun__cuda_current_stream(dev);
  if (dd >= 0 && sd >= 0 && dd != sd) {
    /* the copy runs on the destination's stream: first let it wait for the
     * source's current stream, where src's data is being produced */
    crun_cuda_event_t *ev;
    crun_cuda_stream_t *ss, *ds;
    CRUN_CHECK(crun_cuda_current_stream(sd, &ss));
    CRUN_CHECK(crun_cuda_current_stream(dd, &ds));
    CRUN_CHECK(crun_cuda_event_create(sd, 0, &ev));
    int rc = crun_cuda_event_record(ev, ss);
    if (rc == 0) rc = crun_cuda_event_wait(ev, ds);
    crun_cuda_event_release(ev);
    if (rc < 0) return rc;
  }
  int64_t ds[CRUN_MAX_DIMS], ss_[CRUN_MAX_DIMS];
  byte_strides(dst, ds);
  byte_strides(src, ss_);
  return crun__cuda_memcpy_strided(crun_tensor_data(dst), dd, ds, crun_tensor_data(src), sd, ss_, dst->ndim,
                                   dst->shape, crun_dtype_size(dst->dt), s, dd < 0);
}

/* crun__check_cast_fits for a device source: read through a host copy (so a
 * float-to-integer cast on a device pays one transfer; other casts none). */
static int check_dev_cast_fits(crun_dtype_t ddt, crun_tensor_t *src) {
  if (!crun_dtype_is_integer(ddt) || crun_dtype_is_integer(src->dt) || src->dt == CRUN_BOOL) return 0;
  crun_tensor_t *h = NULL;
  int rc = crun_tensor_to_device(src, CRUN_DEVICE_CPU, &h);
  if (rc == 0) rc = crun__check_cast_fits(ddt, h);
  crun_tensor_release(h);
  return rc;
}

int crun__tensor_copy_dev(crun_tensor_t *dst, crun_tensor_t *src) {
  char a[128], b[128];
  if (dst->ndim != src->ndim || memcmp(dst->shape, src->shape, (size_t)dst->ndim * sizeof *dst->shape))
    return crun_error(CRUN_EINVAL, "copy: shapes differ (%s vs %s)", crun__shape_str(dst->ndim, dst->shape, a, sizeof a),
                      crun__shape_str(src->ndim, src->shape, b, sizeof b));
  if (dst->dt == src->dt) return copy_same_dtype(dst, src);
  if (dst->st->device == src->st->device) { /* a cast kernel (dispatch.c), whose float-to-integer */
    CRUN_CHECK(check_dev_cast_fits(dst->dt, src)); /* casts saturate: refused first, as on the host */
    return crun__dev_copy(dst, src);
  }
  /* a dtype conversion runs on the host: through a host copy of the device
   * side(s) (the device kernels, when built, take over this path) */
  crun_tensor_t *hs = NULL, *hd = NULL;
  int rc = crun_tensor_to_device(src, CRUN_DEVICE_CPU, &hs);
  if (rc == 0) rc = crun_tensor_empty(dst->dt, dst->ndim, dst->shape, &hd);
  if (rc == 0) rc = crun_tensor_copy(hd, hs);
  if (rc == 0) rc = crun_tensor_copy(dst, hd);
  crun_tensor_release(hs);
  crun_tensor_release(hd);
  return rc;
}

int crun_tensor_to_device(crun_tensor_t *t, int device, crun_tensor_t **out) {
  if (t->st->device == device || (device < 0 && t->st->device < 0)) {
    crun_tensor_retain(t);
    *out = t;
    return 0;
  }
  crun_tensor_t *r;
  if (device >= 0) CRUN_CHECK(crun__cuda_check_device(device, "to"));
  CRUN_CHECK(crun_tensor_empty_on(t->dt, t->ndim, t->shape, device, &r));
  int rc = copy_same_dtype(r, t);
  if (rc < 0) {
    crun_tensor_release(r);
    return rc;
  }
  *out = r;
  return 0;
}

int crun__tensor_fill_dev(crun_tensor_t *t, double v) {
  crun__storage_t *st = t->st;
  if (v == 0 && !signbit(v) && crun_tensor_is_contiguous(t))
    return crun__cuda_memset0(st->device, crun_tensor_data(t), crun_tensor_nbytes(t),
                              crun__cuda_current_stream(st->device));
  crun_tensor_t *h;
  CRUN_CHECK(crun_tensor_empty(t->dt, t->ndim, t->shape, &h));
  int rc = crun_tensor_fill(h, v);
  if (rc == 0) rc = crun_tensor_copy(t, h); /* pageable source: waits, so h may go */
  crun_tensor_release(h);
  return rc;
}

int crun__tensor_compare_dev(crun_tensor_t *a, crun_tensor_t *b, int (*eq)(crun_tensor_t *, crun_tensor_t *),
                             double rtol, double atol) {
  crun_tensor_t *ha = NULL, *hb = NULL;
  int r = 0;
  if (crun_tensor_to_device(a, CRUN_DEVICE_CPU, &ha) == 0 && crun_tensor_to_device(b, CRUN_DEVICE_CPU, &hb) == 0)
    r = eq ? eq(ha, hb) : crun_tensor_allclose(ha, hb, rtol, atol);
  crun_tensor_release(ha);
  crun_tensor_release(hb);
  return r;
}
