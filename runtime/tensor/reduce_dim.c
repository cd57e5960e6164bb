/* reduce_dim.c — sum / mean / prod / max / min (with positions) along one
 * dim or over every element. The input is viewed as [outer, n, inner]; each
 * step folds one [inner] slice into an accumulator row, so memory is read
 * in order. Floats accumulate in double, integers in int64. */
#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"
#include "cuda/dispatch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Loads n contiguous elements of dt as doubles / int64s. */
static void load_d(crun_dtype_t dt, const void *src, double *dst, int64_t n) {
  switch (dt) {
    case CRUN_FLOAT32: for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)src)[i]; break;
    case CRUN_FLOAT64: memcpy(dst, src, (size_t)n * sizeof *dst); break;
    default: for (int64_t i = 0; i < n; i++) dst[i] = crun_elem_get_double(dt, src, i); break;
  }
}

static void load_i(crun_dtype_t dt, const void *src, int64_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = crun__elem_get_int64(dt, src, i);
}

typedef struct {
  crun_dimred_t op;
  int ints;           /* accumulate as int64 */
  int64_t n, inner;
  double *ad, *rd;    /* accumulator and loaded row (double) */
  int64_t *ai, *ri;   /* the same for integers */
  int64_t *pos;       /* positions for max / min */
} red_state;

/* Folds slice k (already loaded into rd / ri) into the accumulators. */
static void fold(red_state *s, int64_t k) {
  for (int64_t j = 0; j < s->inner; j++) {
    if (s->ints) {
      int64_t v = s->ri[j], *a = &s->ai[j];
      if (k == 0) { *a = v; s->pos[j] = 0; continue; }
      switch (s->op) {
        case CRUN_DIMRED_SUM: case CRUN_DIMRED_MEAN: *a = (int64_t)((uint64_t)*a + (uint64_t)v); break;
        case CRUN_DIMRED_PROD: *a = (int64_t)((uint64_t)*a * (uint64_t)v); break;
        case CRUN_DIMRED_MAX: if (v > *a) *a = v, s->pos[j] = k; break;
        default: if (v < *a) *a = v, s->pos[j] = k; break;
      }
    } else {
      double v = s->rd[j], *a = &s->ad[j];
      if (k == 0) { *a = v; s->pos[j] = 0; continue; }
      switch (s->op) {
        case CRUN_DIMRED_SUM: case CRUN_DIMRED_MEAN: *a += v; break;
        case CRUN_DIMRED_PROD: *a *= v; break;
        case CRUN_DIMRED_MAX: if (*a == *a && (v > *a || v != v)) *a = v, s->pos[j] = k; break;
        default: if (*a == *a && (v < *a || v != v)) *a = v, s->pos[j] = k; break;
      }
    }
  }
}

/* Result dtype: int64 for integer and bool sums/products (torch counts the
 * true elements), else the input's. */
static crun_dtype_t value_dtype(crun_dimred_t op, crun_dtype_t dt) {
  if ((crun_dtype_is_integer(dt) || dt == CRUN_BOOL) && (op == CRUN_DIMRED_SUM || op == CRUN_DIMRED_PROD)) return CRUN_INT64;
  return dt;
}

static int check_args(crun_dimred_t op, crun_tensor_t *a, int dim) {
  static const char *names[] = {
#define CRUN_X_DRN(NAME, name) #name,
      CRUN_DIMRED_MAP(CRUN_X_DRN)
#undef CRUN_X_DRN
  };
  if ((unsigned)op >= CRUN_DIMRED_COUNT) return crun_error(CRUN_EINVAL, "bad reduction %d", (int)op);
  if (dim < -1 || dim >= a->ndim)
    return crun_error(CRUN_EINVAL, "%s: dim %d out of range for a %d-d tensor", names[op], dim + 1, a->ndim);
  if (op == CRUN_DIMRED_MEAN && (crun_dtype_is_integer(a->dt) || a->dt == CRUN_BOOL))
    return crun_error(CRUN_ENOTSUP, "mean needs a float tensor, got %s (convert with :double())", crun_dtype_name(a->dt));
  int64_t n = dim < 0 ? crun_tensor_numel(a) : a->shape[dim];
  if (n == 0 && (op == CRUN_DIMRED_MAX || op == CRUN_DIMRED_MIN)) /* (mean: 0/0 = nan, as torch's) */
    return crun_error(CRUN_EINVAL, "%s over an empty dim (no identity)", names[op]);
  return 0;
}

/* Writes the accumulator row j of outer index o into the outputs. */
static void store(red_state *s, crun_tensor_t *V, crun_tensor_t *I, int64_t o, int64_t base) {
  for (int64_t j = 0; j < s->inner; j++) {
    int64_t at = o * s->inner + j;
    if (s->n == 0) {
      crun_elem_set_double(V->dt, crun_tensor_data(V), at,
                           s->op == CRUN_DIMRED_PROD ? 1.0 : s->op == CRUN_DIMRED_MEAN ? NAN : 0.0);
    } else if (s->ints) {
      crun__elem_set_int64(V->dt, crun_tensor_data(V), at, s->ai[j]);
    } else {
      double v = s->op == CRUN_DIMRED_MEAN ? s->ad[j] / (double)s->n : s->ad[j];
      crun_elem_set_double(V->dt, crun_tensor_data(V), at, v);
    }
    if (I) ((int64_t *)crun_tensor_data(I))[at] = s->pos[j] + base;
  }
}

#define ROW_CHUNK 1024

/* inner == 1: folds row o (n contiguous elements) in chunks into acc[0]. */
static void run_row(red_state *s, const char *row, crun_dtype_t dt) {
  size_t es = crun_dtype_size(dt);
  double *rd = s->rd;
  int64_t *ri = s->ri;
  for (int64_t k0 = 0; k0 < s->n; k0 += ROW_CHUNK) {
    int64_t m = s->n - k0 < ROW_CHUNK ? s->n - k0 : ROW_CHUNK;
    if (s->ints) load_i(dt, row + k0 * (int64_t)es, ri, m);
    else load_d(dt, row + k0 * (int64_t)es, rd, m);
    if (!s->ints && (s->op == CRUN_DIMRED_SUM || s->op == CRUN_DIMRED_MEAN)) {
      double acc = k0 ? s->ad[0] : 0;
      for (int64_t i = 0; i < m; i++) acc += rd[i];
      s->ad[0] = acc;
      continue;
    }
    for (int64_t i = 0; i < m; i++) {
      s->rd = rd + i;
      s->ri = ri + i;
      fold(s, k0 + i);
    }
    s->rd = rd;
    s->ri = ri;
  }
}

/* Runs the reduction of contiguous A = [outer, n, inner] into V (and I). */
static int run(red_state *s, crun_tensor_t *A, int64_t outer, crun_tensor_t *V, crun_tensor_t *I,
               int64_t base) {
  size_t es = crun_dtype_size(A->dt);
  const char *src = crun_tensor_data(A);
  for (int64_t o = 0; o < outer; o++) {
    if (s->inner == 1) {
      run_row(s, src + o * s->n * (int64_t)es, A->dt);
      store(s, V, I, o, base);
      continue;
    }
    for (int64_t k = 0; k < s->n; k++) {
      const char *row = src + ((o * s->n + k) * s->inner) * (int64_t)es;
      if (s->ints) load_i(A->dt, row, s->ri, s->inner);
      else load_d(A->dt, row, s->rd, s->inner);
      fold(s, k);
    }
    store(s, V, I, o, base);
  }
  return 0;
}

int crun_tensor_reduce_dim(crun_dimred_t op, crun_tensor_t *a, int dim, int keepdim, int64_t base,
                           crun_tensor_t **values, crun_tensor_t **indices) {
  CRUN_CHECK(check_args(op, a, dim));
  int64_t outer = 1, n = dim < 0 ? crun_tensor_numel(a) : a->shape[dim], inner = 1;
  int64_t shape[CRUN_MAX_DIMS];
  int nd = 0;
  for (int d = 0; dim >= 0 && d < a->ndim; d++) {
    if (d < dim) outer *= a->shape[d];
    if (d > dim) inner *= a->shape[d];
    if (d != dim) shape[nd++] = a->shape[d];
    else if (keepdim) shape[nd++] = 1;
  }
  for (int d = 0; dim < 0 && keepdim && d < a->ndim; d++) shape[nd++] = 1;
  if (__builtin_expect(a->st->device >= 0, 0))
    return crun__dev_reduce_dim(op, a, outer, n, inner, nd, shape, base, value_dtype(op, a->dt), values, indices);
  int want_idx = indices && (op == CRUN_DIMRED_MAX || op == CRUN_DIMRED_MIN);
  crun_tensor_t *A = NULL, *V = NULL, *I = NULL;
  red_state s = {op, crun_dtype_is_integer(a->dt), n, inner, NULL, NULL, NULL, NULL, NULL};
  int rc;
  CRUN_CHECK_GOTO(crun_tensor_contiguous(a, &A), rc, fail);
  CRUN_CHECK_GOTO(crun_tensor_empty(value_dtype(op, a->dt), nd, shape, &V), rc, fail);
  if (want_idx) CRUN_CHECK_GOTO(crun_tensor_empty(CRUN_INT64, nd, shape, &I), rc, fail);
  size_t row = (size_t)(inner > ROW_CHUNK ? inner : ROW_CHUNK);
  s.ad = malloc(row * sizeof(double)); s.rd = malloc(row * sizeof(double));
  s.ai = malloc(row * sizeof(int64_t)); s.ri = malloc(row * sizeof(int64_t));
  s.pos = malloc(row * sizeof(int64_t));
  if (!s.ad || !s.rd || !s.ai || !s.ri || !s.pos) {
    rc = crun_error(CRUN_ENOMEM, "reduce: out of memory");
    goto fail;
  }
  if (crun_tensor_numel(V) > 0) run(&s, A, outer, V, I, base);
  *values = V;
  if (indices) *indices = I;
  V = I = NULL;
  rc = 0;
fail:
  free(s.ad); free(s.rd); free(s.ai); free(s.ri); free(s.pos);
  crun_tensor_release(A);
  crun_tensor_release(V);
  crun_tensor_release(I);
  return rc;
}

/* Scans n elements at stride `inner` from contiguous src into dst (of dt). */
static void scan_slice(int prod, crun_dtype_t st, const void *src, crun_dtype_t dt, void *dst, int64_t at,
                       int64_t n, int64_t inner) {
  if (crun_dtype_is_integer(dt)) {
    uint64_t acc = prod ? 1 : 0; /* (wraps as torch's int64) */
    for (int64_t k = 0, i = at; k < n; k++, i += inner) {
      uint64_t v = (uint64_t)crun__elem_get_int64(st, src, i);
      acc = prod ? acc * v : acc + v;
      crun__elem_set_int64(dt, dst, i, (int64_t)acc);
    }
    return;
  }
  double acc = prod ? 1 : 0;
  for (int64_t k = 0, i = at; k < n; k++, i += inner) {
    double v = crun_elem_get_double(st, src, i);
    acc = prod ? acc * v : acc + v;
    crun_elem_set_double(dt, dst, i, acc);
  }
}

int crun_tensor_cumulate(crun_dimred_t op, crun_tensor_t *a, int dim, crun_tensor_t **out) {
  const char *what = op == CRUN_DIMRED_PROD ? "cumprod" : "cumsum";
  if (op != CRUN_DIMRED_SUM && op != CRUN_DIMRED_PROD) return crun_error(CRUN_EINVAL, "cumulate: bad op %d", (int)op);
  if (a->ndim == 0 ? dim != -1 && dim != 0 : dim < 0 || dim >= a->ndim)
    return crun_error(CRUN_EINVAL, "%s: dim %d out of range for a %d-d tensor", what, dim + 1, a->ndim);
  if (a->st->device >= 0)
    return crun_error(CRUN_ENOTSUP, "%s: not implemented for a tensor on cuda:%d (copy it to the host with :cpu() first)",
                      what, a->st->device);
  int64_t outer = 1, n = a->ndim == 0 ? 1 : a->shape[dim], inner = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (d < dim) outer *= a->shape[d];
    if (d > dim) inner *= a->shape[d];
  }
  crun_tensor_t *A;
  CRUN_CHECK(crun_tensor_contiguous(a, &A));
  crun_dtype_t dt = crun_dtype_is_integer(a->dt) || a->dt == CRUN_BOOL ? CRUN_INT64 : a->dt;
  int rc = crun_tensor_empty(dt, a->ndim, a->shape, out);
  for (int64_t o = 0; rc == 0 && o < outer; o++)
    for (int64_t j = 0; j < inner; j++)
      scan_slice(op == CRUN_DIMRED_PROD, a->dt, crun_tensor_data(A), dt, crun_tensor_data(*out), o * n * inner + j, n,
                 inner);
  crun_tensor_release(A);
  return rc;
}
