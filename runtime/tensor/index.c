/* index.c — index_select, gather and scatter_add_ along one dim. Index
 * values are counted from `base` (0 in C, 1 from Lua) and checked. */
#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"

#include <string.h>

static int check_index_tensor(const char *what, const crun_tensor_t *idx) {
  if (idx->dt != CRUN_INT64 && idx->dt != CRUN_INT32)
    return crun_error(CRUN_EINVAL, "%s: index must be int64 or int32, got %s", what, crun_dtype_name(idx->dt));
  return 0;
}

/* Index value v counted from base as a 0-based position in [0, size), or
 * -1 when it is outside (v - base computed without signed overflow: an
 * index of INT64_MIN from Lua, base 1, is simply out of range). */
static int64_t index_pos(int64_t v, int64_t base, int64_t size) {
  int64_t k;
  if (__builtin_sub_overflow(v, base, &k) || k < 0 || k >= size) return -1;
  return k;
}

static int bad_index(const char *what, int64_t v, int64_t base, int64_t pos, int dim, int64_t size) {
  return crun_error(CRUN_ERANGE, "%s: index %lld (entry %lld) out of range for dim %d of size %lld "
                    "(indices count from %lld)", what, (long long)v, (long long)pos + 1, dim + 1,
                    (long long)size, (long long)base);
}

int crun_tensor_index_select(crun_tensor_t *a, int dim, crun_tensor_t *index, int64_t base,
                             crun_tensor_t **out) {
  CRUN__HOST_ONLY2(a, index, "index_select");
  CRUN_CHECK(check_index_tensor("index_select", index));
  if (index->ndim != 1)
    return crun_error(CRUN_EINVAL, "index_select: index must be 1-d, got %d-d", index->ndim);
  if (dim < 0 || dim >= a->ndim)
    return crun_error(CRUN_EINVAL, "index_select: dim %d out of range for a %d-d tensor", dim + 1, a->ndim);
  int64_t n = index->shape[0], shape[CRUN_MAX_DIMS];
  for (int64_t i = 0; i < n; i++) {
    int64_t v = crun__elem_get_int64(index->dt, crun_tensor_data(index), i * index->strides[0]);
    if (index_pos(v, base, a->shape[dim]) < 0) return bad_index("index_select", v, base, i, dim, a->shape[dim]);
  }
  memcpy(shape, a->shape, sizeof shape);
  shape[dim] = n;
  CRUN_CHECK(crun_tensor_empty(a->dt, a->ndim, shape, out));
  int rc = 0;
  for (int64_t i = 0; i < n && rc == 0; i++) {
    int64_t v = crun__elem_get_int64(index->dt, crun_tensor_data(index), i * index->strides[0]);
    crun_tensor_t *src = NULL, *dst = NULL;
    rc = crun_tensor_select(a, dim, v - base, &src);
    if (rc == 0) rc = crun_tensor_select(*out, dim, i, &dst);
    if (rc == 0) rc = crun_tensor_copy(dst, src);
    crun_tensor_release(src);
    crun_tensor_release(dst);
  }
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

/* Checks index against a for gather/scatter: same ndim, no larger dims
 * (except `dim` itself, which may be any size). */
static int check_gather(const char *what, const crun_tensor_t *a, int dim, const crun_tensor_t *index) {
  CRUN_CHECK(check_index_tensor(what, index));
  if (dim < 0 || dim >= a->ndim)
    return crun_error(CRUN_EINVAL, "%s: dim %d out of range for a %d-d tensor", what, dim + 1, a->ndim);
  if (index->ndim != a->ndim)
    return crun_error(CRUN_EINVAL, "%s: index has %d dims, tensor has %d", what, index->ndim, a->ndim);
  for (int d = 0; d < a->ndim; d++)
    if (d != dim && index->shape[d] > a->shape[d])
      return crun_error(CRUN_EINVAL, "%s: index size %lld exceeds tensor size %lld in dim %d", what,
                        (long long)index->shape[d], (long long)a->shape[d], d + 1);
  return 0;
}

/* Visits every element of index in row-major order; for each, computes the
 * element offset into `a` (with the index value along dim) and calls fn. */
typedef int (*visit_fn)(void *ctx, int64_t a_off, int64_t pos, const int64_t *coord);

static int visit(const char *what, const crun_tensor_t *a, int dim, const crun_tensor_t *index,
                 int64_t base, visit_fn fn, void *ctx) {
  int64_t n = crun_tensor_numel(index), coord[CRUN_MAX_DIMS] = {0};
  for (int64_t pos = 0; pos < n; pos++) {
    int64_t ioff = 0, aoff = 0;
    for (int d = 0; d < a->ndim; d++) ioff += coord[d] * index->strides[d];
    int64_t v = crun__elem_get_int64(index->dt, crun_tensor_data(index), ioff);
    int64_t k = index_pos(v, base, a->shape[dim]);
    if (k < 0) return bad_index(what, v, base, pos, dim, a->shape[dim]);
    for (int d = 0; d < a->ndim; d++) aoff += (d == dim ? k : coord[d]) * a->strides[d];
    CRUN_CHECK(fn(ctx, aoff, pos, coord));
    for (int d = a->ndim - 1; d >= 0; d--) {
      if (++coord[d] < index->shape[d]) break;
      coord[d] = 0;
    }
  }
  return 0;
}

typedef struct { const crun_tensor_t *a; crun_tensor_t *out; const crun_tensor_t *src; } gctx;

static int gather_one(void *c, int64_t aoff, int64_t pos, const int64_t *coord) {
  gctx *g = c;
  size_t es = crun_dtype_size(g->a->dt);
  (void)coord;
  memcpy((char *)crun_tensor_data(g->out) + pos * (int64_t)es,
         (const char *)crun_tensor_data(g->a) + aoff * (int64_t)es, es);
  return 0;
}

int crun_tensor_gather(crun_tensor_t *a, int dim, crun_tensor_t *index, int64_t base,
                       crun_tensor_t **out) {
  CRUN__HOST_ONLY2(a, index, "gather");
  CRUN_CHECK(check_gather("gather", a, dim, index));
  CRUN_CHECK(crun_tensor_empty(a->dt, index->ndim, index->shape, out));
  gctx g = {a, *out, NULL};
  int rc = visit("gather", a, dim, index, base, gather_one, &g);
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

static int scatter_one(void *c, int64_t aoff, int64_t pos, const int64_t *coord) {
  gctx *g = c;
  int64_t soff = 0;
  (void)pos;
  for (int d = 0; d < g->src->ndim; d++) soff += coord[d] * g->src->strides[d];
  void *ad = crun_tensor_data(g->out);
  double v = crun_elem_get_double(g->out->dt, ad, aoff) + crun_elem_get_double(g->src->dt, crun_tensor_data(g->src), soff);
  crun_elem_set_double(g->out->dt, ad, aoff, v);
  return 0;
}

static int check_only(void *c, int64_t aoff, int64_t pos, const int64_t *coord) {
  (void)c, (void)aoff, (void)pos, (void)coord;
  return 0;
}

int crun_tensor_scatter_add_(crun_tensor_t *a, int dim, crun_tensor_t *index, crun_tensor_t *src,
                             int64_t base) {
  CRUN__HOST_ONLY3(a, index, src, "scatter_add_");
  CRUN_CHECK(check_gather("scatter_add_", a, dim, index));
  CRUN_CHECK(crun__check_writable(a, "scatter_add_"));
  if (a->dt != CRUN_FLOAT32 && a->dt != CRUN_FLOAT64)
    return crun_error(CRUN_ENOTSUP, "scatter_add_ needs a float32 or float64 tensor, got %s", crun_dtype_name(a->dt));
  if (src->dt != a->dt)
    return crun_error(CRUN_EINVAL, "scatter_add_: src is %s, tensor is %s", crun_dtype_name(src->dt), crun_dtype_name(a->dt));
  if (src->ndim != index->ndim)
    return crun_error(CRUN_EINVAL, "scatter_add_: src has %d dims, index has %d", src->ndim, index->ndim);
  for (int d = 0; d < src->ndim; d++)
    if (index->shape[d] > src->shape[d])
      return crun_error(CRUN_EINVAL, "scatter_add_: index size %lld exceeds src size %lld in dim %d",
                        (long long)index->shape[d], (long long)src->shape[d], d + 1);
  CRUN_CHECK(visit("scatter_add_", a, dim, index, base, check_only, NULL)); /* all or nothing */
  /* src sharing a's storage would be read after the adds wrote it
   * (a:scatter_add_(1, {3, 2, 1}, a) gave 5, 4, 4): read a copy instead */
  crun_tensor_t *own = NULL;
  if (crun_tensor_same_storage(src, a)) CRUN_CHECK(crun_tensor_clone(src, &own));
  gctx g = {a, a, own ? own : src};
  int rc = visit("scatter_add_", a, dim, index, base, scatter_one, &g);
  crun_tensor_release(own);
  return rc;
}
