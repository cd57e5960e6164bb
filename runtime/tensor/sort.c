/* sort.c — torch's sort along one dim: each slice is ordered by value with
 * nan the largest and equal values in their original order (torch's stable
 * sort), ascending or descending; the positions come out as int64. */
#include "tensor/tensor_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  double d;   /* the value of a float dtype */
  int64_t i;  /* the value of an integer dtype (exact past 2^53) */
  int64_t at; /* the position in the slice */
} sort_item;

/* -1, 0 or 1 as x sorts before, with or after y ascending (nan last). */
static int cmp_float(const sort_item *x, const sort_item *y) {
  int xn = x->d != x->d, yn = y->d != y->d;
  if (xn || yn) return xn - yn;
  return (x->d > y->d) - (x->d < y->d);
}

static int cmp_int(const sort_item *x, const sort_item *y) { return (x->i > y->i) - (x->i < y->i); }

/* The four qsort orders: value ascending or descending, then position. */
static int by_position(const sort_item *x, const sort_item *y) { return (x->at > y->at) - (x->at < y->at); }
static int asc_float(const void *a, const void *b) { int c = cmp_float(a, b); return c ? c : by_position(a, b); }
static int desc_float(const void *a, const void *b) { int c = cmp_float(b, a); return c ? c : by_position(a, b); }
static int asc_int(const void *a, const void *b) { int c = cmp_int(a, b); return c ? c : by_position(a, b); }
static int desc_int(const void *a, const void *b) { int c = cmp_int(b, a); return c ? c : by_position(a, b); }

/* Sorts the slice of n elements at `at`, stride `inner`, of contiguous A into V and I. */
static void sort_slice(crun_tensor_t *A, crun_tensor_t *V, crun_tensor_t *I, int64_t at, int64_t n, int64_t inner,
                       int descending, int64_t base, sort_item *buf) {
  int ints = crun_dtype_is_integer(A->dt) || A->dt == CRUN_BOOL;
  const void *src = crun_tensor_data(A);
  for (int64_t k = 0; k < n; k++) {
    buf[k].at = k;
    if (ints) buf[k].i = crun__elem_get_int64(A->dt, src, at + k * inner);
    else buf[k].d = crun_elem_get_double(A->dt, src, at + k * inner);
  }
  qsort(buf, (size_t)n, sizeof *buf, ints ? (descending ? desc_int : asc_int) : (descending ? desc_float : asc_float));
  size_t es = crun_dtype_size(A->dt);
  char *v = crun_tensor_data(V);
  int64_t *ix = crun_tensor_data(I);
  for (int64_t k = 0; k < n; k++) {
    memcpy(v + (size_t)(at + k * inner) * es, (const char *)src + (size_t)(at + buf[k].at * inner) * es, es);
    ix[at + k * inner] = buf[k].at + base;
  }
}

int crun_tensor_sort(crun_tensor_t *a, int dim, int descending, int64_t base, crun_tensor_t **values,
                     crun_tensor_t **indices) {
  if (a->ndim == 0 ? dim != -1 && dim != 0 : dim < 0 || dim >= a->ndim)
    return crun_error(CRUN_EINVAL, "sort: dim %d out of range for a %d-d tensor", dim + 1, a->ndim);
  if (a->st->device >= 0)
    return crun_error(CRUN_ENOTSUP, "sort: not implemented for a tensor on cuda:%d (copy it to the host with :cpu() first)",
                      a->st->device);
  int64_t outer = 1, n = a->ndim == 0 ? 1 : a->shape[dim], inner = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (d < dim) outer *= a->shape[d];
    if (d > dim) inner *= a->shape[d];
  }
  crun_tensor_t *A = NULL, *V = NULL, *I = NULL;
  sort_item *buf = NULL;
  int rc;
  CRUN_CHECK_GOTO(crun_tensor_contiguous(a, &A), rc, done);
  CRUN_CHECK_GOTO(crun_tensor_empty(a->dt, a->ndim, a->shape, &V), rc, done);
  CRUN_CHECK_GOTO(crun_tensor_empty(CRUN_INT64, a->ndim, a->shape, &I), rc, done);
  if (!(buf = malloc((size_t)(n > 0 ? n : 1) * sizeof *buf))) {
    rc = crun_error(CRUN_ENOMEM, "sort: out of memory");
    goto done;
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) sort_slice(A, V, I, o * n * inner + j, n, inner, descending, base, buf);
  *values = V;
  *indices = I;
  V = I = NULL;
  rc = 0;
done:
  free(buf);
  crun_tensor_release(A);
  crun_tensor_release(V);
  crun_tensor_release(I);
  return rc;
}
