/* check.c — argument checks shared by the train kernels. */
#include "train/check.h"

#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"

#include <stdio.h>

const char *crun__train_shape_str(const crun_tensor_t *t, char *buf, size_t n) {
  return crun__shape_str(crun_tensor_ndim(t), crun_tensor_shape(t), buf, n);
}

int crun__train_check_float(const char *fn, const char *arg, const crun_tensor_t *t) {
  if (!t) return crun_error(CRUN_EINVAL, "%s: %s is missing", fn, arg);
  crun_dtype_t dt = crun_tensor_dtype(t);
  if (dt != CRUN_FLOAT32 && dt != CRUN_FLOAT64)
    return crun_error(CRUN_EINVAL, "%s: %s must be float32 or float64, got %s", fn, arg,
                      crun_dtype_name(dt));
  if (!crun_tensor_is_contiguous(t))
    return crun_error(CRUN_EINVAL, "%s: %s must be contiguous (call :contiguous())", fn, arg);
  return 0;
}

int crun__train_check_like(const char *fn, const char *arg, const crun_tensor_t *a,
                           const crun_tensor_t *b) {
  CRUN_CHECK(crun__train_check_float(fn, arg, b));
  char sa[64], sb[64];
  if (crun_tensor_dtype(a) != crun_tensor_dtype(b))
    return crun_error(CRUN_EINVAL, "%s: %s is %s, expected %s", fn, arg,
                      crun_dtype_name(crun_tensor_dtype(b)), crun_dtype_name(crun_tensor_dtype(a)));
  if (crun_tensor_numel(a) != crun_tensor_numel(b))
    return crun_error(CRUN_EINVAL, "%s: %s has shape %s, expected %lld elements (shape %s)", fn, arg,
                      crun__train_shape_str(b, sb, sizeof sb), (long long)crun_tensor_numel(a),
                      crun__train_shape_str(a, sa, sizeof sa));
  return 0;
}

int crun__train_check_2d(const char *fn, const char *arg, const crun_tensor_t *t,
                         int64_t *rows, int64_t *cols) {
  CRUN_CHECK(crun__train_check_float(fn, arg, t));
  char s[64];
  if (crun_tensor_ndim(t) != 2)
    return crun_error(CRUN_EINVAL, "%s: %s must be 2-d, got shape %s", fn, arg,
                      crun__train_shape_str(t, s, sizeof s));
  *rows = crun_tensor_shape(t)[0];
  *cols = crun_tensor_shape(t)[1];
  return 0;
}
