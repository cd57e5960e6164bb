/* launch_check.h — the argument checks both implementations of launch.h
 * share (host code; error texts as the CPU kernels'). */
#ifndef CRUN_CUDA_LAUNCH_CHECK_H
#define CRUN_CUDA_LAUNCH_CHECK_H

#include <math.h>

#include "core/checked.h"
#include "cuda/kernels/elementwise.h"
#include "cuda/launch.h"

/* Fails unless dt is float32 or float64. */
static inline int crun__lc_float(const char *what, crun_dtype_t dt) {
  if (dt != CRUN_FLOAT32 && dt != CRUN_FLOAT64)
    return crun_error(CRUN_ENOTSUP, "%s needs a float32 or float64 tensor, got %s (convert with :float())",
                      what, crun_dtype_name(dt));
  return 0;
}

/* Fails unless n >= 0 and the buffers are there when n > 0. */
static inline int crun__lc_count(const char *what, int64_t n, int nptr, const void *const *ptrs) {
  if (n < 0) return crun_error(CRUN_EINVAL, "%s: negative element count %lld", what, (long long)n);
  for (int k = 0; n > 0 && k < nptr; k++)
    if (!ptrs[k]) return crun_error(CRUN_EINVAL, "%s: device buffer %d is NULL for %lld elements", what, k,
                                    (long long)n);
  return 0;
}

/* Fails unless the binary op exists for dt (the CPU's bin_table). */
static inline int crun__lc_binop(crun_binop_t op, crun_dtype_t dt) {
  if ((unsigned)op >= CRUN_BINOP_COUNT) return crun_error(CRUN_EINVAL, "bad binary op %d", (int)op);
  if (!crun__k_bin_supported((int)dt, (int)op))
    return crun_error(CRUN_ENOTSUP, "%s is not supported on %s tensors (convert with :float() or :double())",
                      crun_binop_name(op), crun_dtype_name(dt));
  return 0;
}

/* Converts scalar s to one element of dt in buf (the CPU's scalar_of). */
static inline int crun__lc_scalar(const char *what, crun_dtype_t dt, double s, void *buf) {
  if (crun_dtype_is_integer(dt)) {
    double lo = dt == CRUN_UINT8 ? 0 : dt == CRUN_INT8 ? -128.0 : dt == CRUN_INT16 ? -32768.0
              : dt == CRUN_INT32 ? -2147483648.0 : -9223372036854775808.0;
    double hi = dt == CRUN_UINT8 ? 255 : dt == CRUN_INT8 ? 127.0 : dt == CRUN_INT16 ? 32767.0
              : dt == CRUN_INT32 ? 2147483647.0 : 9223372036854774784.0;
    if (s != floor(s))
      return crun_error(CRUN_ENOTSUP, "%s: %s tensor with non-integral scalar %g (convert with :double())",
                        what, crun_dtype_name(dt), s);
    if (s < lo || s > hi) return crun_error(CRUN_ERANGE, "%s: scalar %g out of range for %s", what, s,
                                            crun_dtype_name(dt));
  }
  crun__k_set_f64((int)dt, buf, 0, s);
  return 0;
}

/* The error of a label out of range (row is 0-based). */
static inline int crun__lc_bad_label(const char *fn, int64_t label, int64_t row, int64_t c) {
  return crun_error(CRUN_ERANGE, "%s: label %lld of row %lld is out of range 1..%lld (labels are 1-based)", fn,
                    (long long)label, (long long)(row + 1), (long long)c);
}

/* Fails unless lt is a label dtype. */
static inline int crun__lc_label_dtype(const char *fn, crun_dtype_t lt) {
  if (lt != CRUN_INT64 && lt != CRUN_INT32)
    return crun_error(CRUN_EINVAL, "%s: labels must be int64 or int32, got %s", fn, crun_dtype_name(lt));
  return 0;
}

/* Stores outer * n * inner; fails when a size is negative or the product
 * overflows. */
static inline int crun__lc_slices(const char *what, int64_t outer, int64_t n, int64_t inner, int64_t *total) {
  const int64_t v[3] = {outer, n, inner};
  if (crun__prod_i64(v, 3, total))
    return crun_error(CRUN_EINVAL, "%s: bad sizes %lld x %lld x %lld", what, (long long)outer, (long long)n,
                      (long long)inner);
  return 0;
}

/* Fails unless the geometry fits: ndim in range, dims >= 0. */
static inline int crun__lc_geo(const char *what, const crun__kgeo_t *g, int64_t *numel) {
  if (!g || g->ndim < 0 || g->ndim > CRUN_MAX_DIMS)
    return crun_error(CRUN_EINVAL, "%s: bad geometry", what);
  if (crun__prod_i64(g->shape, g->ndim, numel))
    return crun_error(CRUN_ERANGE, "%s: negative dim or element count beyond 2^63", what);
  return 0;
}

#endif
