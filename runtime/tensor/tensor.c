/* tensor.c — tensor lifecycle, geometry and views over refcounted storage. */
#include "tensor/tensor_impl.h"

#include "core/checked.h"
#include "core/heap.h"
#include "tensor/dtype_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *crun__shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  if (ndim == 0) snprintf(buf, cap, "scalar");
  for (int d = 0; d < ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, d ? "x%lld" : "%lld", (long long)shape[d]);
  return buf;
}

int crun__check_shape(int ndim, const int64_t *shape, const char *where) {
  if (ndim < 0 || ndim > CRUN_MAX_DIMS)
    return crun_error(CRUN_EINVAL, "%s: %d dims (at most %d supported)", where, ndim, CRUN_MAX_DIMS);
  if (ndim > 0 && !shape) return crun_error(CRUN_EINVAL, "%s: shape is NULL", where);
  int64_t n = 1; /* product of the non-zero sizes: it bounds the strides of an empty tensor too */
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return crun_error(CRUN_EINVAL, "%s: size %lld of dim %d is negative", where, (long long)shape[d], d + 1);
    if (shape[d] > 0 && n > (INT64_C(1) << 50) / shape[d])
      return crun_error(CRUN_EINVAL, "%s: shape too large", where);
    if (shape[d] > 0) n *= shape[d];
  }
  return 0;
}

int crun__check_writable(const crun_tensor_t *t, const char *where) {
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] > 1 && t->strides[d] == 0)
      return crun_error(CRUN_EINVAL, "%s: dim %d of the destination repeats one element %lld times "
                        "(an expand()ed view): clone() it before writing", where, d + 1, (long long)t->shape[d]);
  return 0;
}

static void set_contiguous_strides(crun_tensor_t *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    t->strides[d] = s;
    s *= t->shape[d];
  }
}

/* Allocates a tensor struct holding one reference to `st`. */
static int tensor_alloc(crun_dtype_t dt, int ndim, const int64_t *shape, crun__storage_t *st,
                        crun_tensor_t **out) {
  crun_tensor_t *t = calloc(1, sizeof *t);
  if (!t) return crun_error(CRUN_ENOMEM, "tensor: out of memory");
  atomic_init(&t->refs, 1);
  t->dt = dt;
  t->ndim = ndim;
  if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  t->st = st;
  atomic_fetch_add(&st->refs, 1);
  set_contiguous_strides(t);
  *out = t;
  return 0;
}

static void storage_release(crun__storage_t *st) {
  if (atomic_fetch_sub(&st->refs, 1) == 1) {
    if (st->device >= 0 || st->pinned) crun__storage_free_dev(st);
    else if (!crun__heap_free(st->data)) free(st->data);
    free(st);
  }
}

int crun_tensor_empty(crun_dtype_t dt, int ndim, const int64_t *shape, crun_tensor_t **out) {
  if (!out) return crun_error(CRUN_EINVAL, "tensor: out is NULL");
  if (!crun__dtype_size(dt)) return crun_error(CRUN_EINVAL, "tensor: bad dtype %d", (int)dt);
  CRUN_CHECK(crun__check_shape(ndim, shape, "tensor"));
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  size_t nbytes = (size_t)n * crun__dtype_size(dt);
  crun__storage_t *st = calloc(1, sizeof *st);
  /* large storage from the node's shared heap when the launcher made one
   * (same-host collectives then read it in place), else from malloc */
  size_t padded = (nbytes + 63) / 64 * 64 + 64;
  void *data = !st ? NULL : crun__heap_alloc(padded);
  if (st && !data) data = aligned_alloc(64, padded);
  if (!data) {
    free(st);
    return crun_error(CRUN_ENOMEM, "tensor: cannot allocate %zu bytes", nbytes);
  }
  st->data = data;
  st->nbytes = nbytes;
  st->device = CRUN_DEVICE_CPU;
  atomic_init(&st->refs, 0);
  int rc = tensor_alloc(dt, ndim, shape, st, out);
  if (rc < 0) {
    if (!crun__heap_free(data)) free(data);
    free(st);
  }
  return rc;
}

int crun_tensor_new(crun_dtype_t dt, int ndim, const int64_t *shape, crun_tensor_t **out) {
  CRUN_CHECK(crun_tensor_empty(dt, ndim, shape, out));
  memset((*out)->st->data, 0, (*out)->st->nbytes);
  return 0;
}

int crun_tensor_from_data(crun_dtype_t dt, int ndim, const int64_t *shape, const void *data,
                          size_t nbytes, crun_tensor_t **out) {
  /* the size is checked before anything is allocated: a corrupt checkpoint
   * that claims a huge shape for a few bytes costs nothing */
  if (!crun__dtype_size(dt)) return crun_error(CRUN_EINVAL, "tensor_from_data: bad dtype %d", (int)dt);
  CRUN_CHECK(crun__check_shape(ndim, shape, "tensor_from_data"));
  size_t need = crun__dtype_size(dt);
  for (int d = 0; d < ndim; d++) need *= (size_t)shape[d]; /* < 2^53: checked above */
  if (nbytes != need) {
    char sh[128];
    return crun_error(CRUN_EINVAL, "tensor_from_data: %zu bytes given, a %s %s tensor needs %zu",
                      nbytes, crun_dtype_name(dt), crun__shape_str(ndim, shape, sh, sizeof sh), need);
  }
  crun_tensor_t *t;
  CRUN_CHECK(crun_tensor_empty(dt, ndim, shape, &t));
  if (nbytes) memcpy(t->st->data, data, nbytes);
  *out = t;
  return 0;
}

void crun_tensor_retain(crun_tensor_t *t) {
  if (t) atomic_fetch_add(&t->refs, 1);
}

void crun_tensor_release(crun_tensor_t *t) {
  if (t && atomic_fetch_sub(&t->refs, 1) == 1) {
    storage_release(t->st);
    free(t);
  }
}

int crun__tensor_over_storage(crun_dtype_t dt, int ndim, const int64_t *shape, crun__storage_t *st,
                              crun_tensor_t **out) {
  return tensor_alloc(dt, ndim, shape, st, out);
}

crun_dtype_t crun_tensor_dtype(const crun_tensor_t *t) { return t->dt; }
int crun_tensor_device(const crun_tensor_t *t) { return t->st->device; }
int crun_tensor_is_pinned(const crun_tensor_t *t) { return t->st->pinned; }
int crun_tensor_ndim(const crun_tensor_t *t) { return t->ndim; }
const int64_t *crun_tensor_shape(const crun_tensor_t *t) { return t->shape; }
const int64_t *crun_tensor_strides(const crun_tensor_t *t) { return t->strides; }

int64_t crun_tensor_numel(const crun_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

size_t crun_tensor_nbytes(const crun_tensor_t *t) {
  return (size_t)crun_tensor_numel(t) * crun__dtype_size(t->dt);
}

/* Whether t is laid out row-major without gaps (an empty tensor is, and a
 * dim of size 1 takes any stride), with its element count in *numel:
 * crun_tensor_is_contiguous and crun_tensor_host_span in one pass. */
static inline int contiguous_numel(const crun_tensor_t *t, int64_t *numel) {
  int64_t s = 1, n = 1;
  int ok = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    n *= t->shape[d];
    if (t->shape[d] != 1 && n && t->strides[d] != s) ok = 0;
    s *= t->shape[d];
  }
  *numel = n;
  return ok;
}

int crun_tensor_is_contiguous(const crun_tensor_t *t) {
  int64_t n;
  return contiguous_numel(t, &n);
}

void *crun_tensor_data(const crun_tensor_t *t) {
  return (char *)t->st->data + t->offset * (int64_t)crun__dtype_size(t->dt);
}

int crun_tensor_host_span(const crun_tensor_t *t, void **data, size_t *count, crun_dtype_t *dt) {
  int64_t n;
  if (t->st->device >= 0 || !contiguous_numel(t, &n)) return 0;
  *data = (char *)t->st->data + t->offset * (int64_t)crun__dtype_size(t->dt);
  *count = (size_t)n;
  *dt = t->dt;
  return 1;
}

int crun_tensor_same_storage(const crun_tensor_t *a, const crun_tensor_t *b) {
  return a->st == b->st;
}

/* ------------------------------------------------------------ views */

int crun__tensor_view_of(crun_tensor_t *t, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset, crun_tensor_t **out) {
  crun_tensor_t *v;
  CRUN_CHECK(tensor_alloc(t->dt, ndim, shape, t->st, &v));
  if (ndim) memcpy(v->strides, strides, (size_t)ndim * sizeof *strides);
  v->offset = offset;
  *out = v;
  return 0;
}

static int check_dim(const crun_tensor_t *t, int dim, const char *where) {
  if (dim < 0 || dim >= t->ndim)
    return crun_error(CRUN_EINVAL, "%s: dim %d out of range for a %d-d tensor", where, dim + 1, t->ndim);
  return 0;
}

int crun_tensor_narrow(crun_tensor_t *t, int dim, int64_t start, int64_t len, crun_tensor_t **out) {
  CRUN_CHECK(check_dim(t, dim, "narrow"));
  if (start < 0 || len < 0 || start > t->shape[dim] || len > t->shape[dim] - start)
    return crun_error(CRUN_EINVAL, "narrow: start %lld (1-based) and length %lld are out of range for dim %d of size %lld",
                      (long long)start + 1, (long long)len, dim + 1, (long long)t->shape[dim]);
  int64_t shape[CRUN_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[dim] = len;
  return crun__tensor_view_of(t, t->ndim, shape, t->strides, t->offset + start * t->strides[dim], out);
}

int crun_tensor_select(crun_tensor_t *t, int dim, int64_t i, crun_tensor_t **out) {
  CRUN_CHECK(check_dim(t, dim, "select"));
  if (i < 0 || i >= t->shape[dim])
    return crun_error(CRUN_EINVAL, "select: index %lld out of range for dim %d of size %lld",
                      (long long)i + 1, dim + 1, (long long)t->shape[dim]);
  int64_t shape[CRUN_MAX_DIMS], strides[CRUN_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (d == dim) continue;
    shape[nd] = t->shape[d];
    strides[nd++] = t->strides[d];
  }
  return crun__tensor_view_of(t, nd, shape, strides, t->offset + i * t->strides[dim], out);
}

/* Fills the one -1 entry of shape so that the counts match numel. */
static int infer_shape(int ndim, int64_t *shape, int64_t numel, const crun_tensor_t *t) {
  int infer = -1;
  int64_t n = 1;
  char a[128], b[128];
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == -1 && infer < 0) { infer = d; continue; }
    if (shape[d] < 0) return crun_error(CRUN_EINVAL, "view: bad size %lld in dim %d", (long long)shape[d], d + 1);
    if (crun__mul_i64(n, shape[d], &n)) goto mismatch; /* more elements than any tensor has */
  }
  if (infer >= 0) {
    if (n == 0 || numel % n != 0) goto mismatch;
    shape[infer] = numel / n;
    n = numel;
  }
  if (n == numel) return 0;
mismatch:
  return crun_error(CRUN_EINVAL, "view: shape %s is invalid for a tensor of size %s (%lld elements)",
                    crun__shape_str(ndim, shape, a, sizeof a),
                    crun__shape_str(t->ndim, t->shape, b, sizeof b), (long long)numel);
}

int crun_tensor_view(crun_tensor_t *t, int ndim, const int64_t *in_shape, crun_tensor_t **out) {
  if (ndim < 0 || ndim > CRUN_MAX_DIMS) return crun_error(CRUN_EINVAL, "view: %d dims", ndim);
  if (!crun_tensor_is_contiguous(t))
    return crun_error(CRUN_EINVAL, "view: tensor is not contiguous (call contiguous() first)");
  int64_t shape[CRUN_MAX_DIMS], strides[CRUN_MAX_DIMS];
  if (ndim) memcpy(shape, in_shape, (size_t)ndim * sizeof *shape);
  CRUN_CHECK(infer_shape(ndim, shape, crun_tensor_numel(t), t));
  /* an empty tensor matches any shape with a zero in it: bound the others,
   * or the strides below overflow int64 (view(0, 2^62, 2^62)) */
  CRUN_CHECK(crun__check_shape(ndim, shape, "view"));
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d];
  }
  return crun__tensor_view_of(t, ndim, shape, strides, t->offset, out);
}

int crun_tensor_transpose(crun_tensor_t *t, int d0, int d1, crun_tensor_t **out) {
  CRUN_CHECK(check_dim(t, d0, "transpose"));
  CRUN_CHECK(check_dim(t, d1, "transpose"));
  int64_t shape[CRUN_MAX_DIMS], strides[CRUN_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  memcpy(strides, t->strides, sizeof strides);
  shape[d0] = t->shape[d1], shape[d1] = t->shape[d0];
  strides[d0] = t->strides[d1], strides[d1] = t->strides[d0];
  return crun__tensor_view_of(t, t->ndim, shape, strides, t->offset, out);
}

int crun_tensor_expand(crun_tensor_t *t, int ndim, const int64_t *shape, crun_tensor_t **out) {
  char a[128], b[128];
  if (ndim < t->ndim || ndim > CRUN_MAX_DIMS) goto bad;
  int64_t strides[CRUN_MAX_DIMS];
  for (int d = ndim - 1, s = t->ndim - 1; d >= 0; d--, s--) {
    int64_t have = s >= 0 ? t->shape[s] : 1;
    if (have == shape[d]) strides[d] = s >= 0 ? t->strides[s] : 0;
    else if (have == 1 && shape[d] >= 0) strides[d] = 0;
    else goto bad;
  }
  CRUN_CHECK(crun__check_shape(ndim, shape, "expand"));
  return crun__tensor_view_of(t, ndim, shape, strides, t->offset, out);
bad:
  return crun_error(CRUN_EINVAL, "expand: cannot broadcast size %s to %s",
                    crun__shape_str(t->ndim, t->shape, a, sizeof a),
                    crun__shape_str(ndim, shape, b, sizeof b));
}

/* ------------------------------------------------------------ row iterator */

void crun__rowiter_init(crun__rowiter_t *it, const crun_tensor_t *t) {
  it->nd = t->ndim > 0 ? t->ndim - 1 : 0;
  memset(it->idx, 0, sizeof it->idx);
  it->shape = t->shape;
  it->strides = t->strides;
  it->es = crun__dtype_size(t->dt);
  it->len = t->ndim > 0 ? t->shape[t->ndim - 1] : 1;
  it->step = t->ndim > 0 ? t->strides[t->ndim - 1] : 1;
  it->row = crun_tensor_data(t);
  int64_t rows = crun_tensor_numel(t) > 0 ? 1 : 0;
  for (int d = 0; d < it->nd; d++) rows *= t->shape[d];
  it->rows_left = rows;
}

int crun__rowiter_next(crun__rowiter_t *it) {
  if (it->rows_left-- <= 1) return 0;
  for (int d = it->nd - 1; d >= 0; d--) {
    it->row += it->strides[d] * (int64_t)it->es;
    if (++it->idx[d] < it->shape[d]) return 1;
    it->row -= it->strides[d] * it->shape[d] * (int64_t)it->es;
    it->idx[d] = 0;
  }
  return 1;
}
