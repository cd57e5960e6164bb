/* softmax.c — softmax and log-softmax along one dim, numerically stable:
 * the slice maximum is subtracted before exponentiating; sums in double. */
#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"
#include "cuda/dispatch.h"

#include <math.h>
#include <stdlib.h>

/* One slice of n values at stride `inner`: out = softmax or log-softmax. */
static void softmax_slice(crun_dtype_t dt, const char *src, char *dst, int64_t n, int64_t inner,
                          int use_log, double *buf) {
  double mx = -INFINITY, sum = 0;
  for (int64_t k = 0; k < n; k++) {
    buf[k] = crun_elem_get_double(dt, src, k * inner);
    if (buf[k] > mx || buf[k] != buf[k]) mx = buf[k];
  }
  if (mx == -INFINITY) mx = 0; /* all -inf: keep nan-free arithmetic below */
  for (int64_t k = 0; k < n; k++) sum += exp(buf[k] - mx);
  double lse = use_log ? mx + log(sum) : 0;
  for (int64_t k = 0; k < n; k++) {
    double v = use_log ? buf[k] - lse : exp(buf[k] - mx) / sum;
    crun_elem_set_double(dt, dst, k * inner, v);
  }
}

int crun_tensor_softmax(crun_tensor_t *a, int dim, int use_log, crun_tensor_t **out) {
  const char *what = use_log ? "log_softmax" : "softmax";
  if (a->dt != CRUN_FLOAT32 && a->dt != CRUN_FLOAT64)
    return crun_error(CRUN_ENOTSUP, "%s needs a float32 or float64 tensor, got %s", what, crun_dtype_name(a->dt));
  if (dim < 0 || dim >= a->ndim)
    return crun_error(CRUN_EINVAL, "%s: dim %d out of range for a %d-d tensor", what, dim + 1, a->ndim);
  if (__builtin_expect(a->st->device >= 0, 0)) return crun__dev_softmax(a, dim, use_log, out);
  int64_t outer = 1, n = a->shape[dim], inner = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (d < dim) outer *= a->shape[d];
    if (d > dim) inner *= a->shape[d];
  }
  crun_tensor_t *A;
  CRUN_CHECK(crun_tensor_contiguous(a, &A));
  int rc = crun_tensor_empty(a->dt, a->ndim, a->shape, out);
  double *buf = rc == 0 ? malloc((size_t)(n > 0 ? n : 1) * sizeof *buf) : NULL;
  if (rc == 0 && !buf) {
    crun_tensor_release(*out);
    rc = crun_error(CRUN_ENOMEM, "%s: out of memory", what);
  }
  size_t es = crun_dtype_size(a->dt);
  for (int64_t o = 0; rc == 0 && o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      int64_t off = (o * n * inner + j) * (int64_t)es;
      softmax_slice(a->dt, (const char *)crun_tensor_data(A) + off, (char *)crun_tensor_data(*out) + off, n,
                    inner, use_log, buf);
    }
  free(buf);
  crun_tensor_release(A);
  return rc;
}
