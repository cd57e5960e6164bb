/* copy.c — element access, dtype conversion, copy, fill and comparison. */
#include "tensor/half.h"
#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"
#include "cuda/dispatch.h"

#include <math.h>
#include <string.h>

/* Converts a double to an integer type, truncating toward zero and saturating
 * (nan -> 0) so that no conversion is undefined behaviour. */
static int64_t sat_i64(double v, double lo, double hi) {
  if (isnan(v)) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

double crun_elem_get_double(crun_dtype_t dt, const void *base, int64_t i) {
  switch (dt) {
    case CRUN_FLOAT32: return ((const float *)base)[i];
    case CRUN_FLOAT64: return ((const double *)base)[i];
    case CRUN_FLOAT16: return crun__f16_to_f32(((const uint16_t *)base)[i]);
    case CRUN_BFLOAT16: return crun__bf16_to_f32(((const uint16_t *)base)[i]);
    case CRUN_INT32: return ((const int32_t *)base)[i];
    case CRUN_INT64: return (double)((const int64_t *)base)[i];
    case CRUN_UINT8: return ((const uint8_t *)base)[i];
    case CRUN_INT8: return ((const int8_t *)base)[i];
    case CRUN_INT16: return ((const int16_t *)base)[i];
    case CRUN_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: return 0;
  }
}

void crun_elem_set_double(crun_dtype_t dt, void *base, int64_t i, double v) {
  switch (dt) {
    case CRUN_FLOAT32: ((float *)base)[i] = (float)v; break;
    case CRUN_FLOAT64: ((double *)base)[i] = v; break;
    case CRUN_FLOAT16: ((uint16_t *)base)[i] = crun__f32_to_f16((float)v); break;
    case CRUN_BFLOAT16: ((uint16_t *)base)[i] = crun__f32_to_bf16((float)v); break;
    case CRUN_INT32: ((int32_t *)base)[i] = (int32_t)sat_i64(v, -2147483648.0, 2147483647.0); break;
    case CRUN_INT64: ((int64_t *)base)[i] = sat_i64(v, -9223372036854775808.0, 9223372036854774784.0); break;
    case CRUN_UINT8: ((uint8_t *)base)[i] = (uint8_t)sat_i64(v, 0.0, 255.0); break;
    case CRUN_INT8: ((int8_t *)base)[i] = (int8_t)sat_i64(v, -128.0, 127.0); break;
    case CRUN_INT16: ((int16_t *)base)[i] = (int16_t)sat_i64(v, -32768.0, 32767.0); break;
    case CRUN_BOOL: ((uint8_t *)base)[i] = v != 0.0; break; /* nan is true, as in torch */
    default: break;
  }
}

int64_t crun__elem_get_int64(crun_dtype_t dt, const void *base, int64_t i) {
  switch (dt) {
    case CRUN_INT32: return ((const int32_t *)base)[i];
    case CRUN_INT64: return ((const int64_t *)base)[i];
    case CRUN_UINT8: return ((const uint8_t *)base)[i];
    case CRUN_INT8: return ((const int8_t *)base)[i];
    case CRUN_INT16: return ((const int16_t *)base)[i];
    case CRUN_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: return sat_i64(crun_elem_get_double(dt, base, i), -9223372036854775808.0, 9223372036854774784.0);
  }
}

/* Integer targets wrap like a C cast of the int64 (torch does the same). */
void crun__elem_set_int64(crun_dtype_t dt, void *base, int64_t i, int64_t v) {
  switch (dt) {
    case CRUN_INT32: ((int32_t *)base)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case CRUN_INT64: ((int64_t *)base)[i] = v; break;
    case CRUN_UINT8: ((uint8_t *)base)[i] = (uint8_t)(uint64_t)v; break;
    case CRUN_INT8: ((int8_t *)base)[i] = (int8_t)(uint8_t)(uint64_t)v; break;
    case CRUN_INT16: ((int16_t *)base)[i] = (int16_t)(uint16_t)(uint64_t)v; break;
    case CRUN_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: crun_elem_set_double(dt, base, i, (double)v); break;
  }
}

int64_t crun_elem_get_int64(crun_dtype_t dt, const void *base, int64_t i) {
  return crun__elem_get_int64(dt, base, i);
}

void crun_elem_set_int64(crun_dtype_t dt, void *base, int64_t i, int64_t v) {
  crun__elem_set_int64(dt, base, i, v);
}

/* ------------------------------------------------------------ element access */

static int elem_offset(const crun_tensor_t *t, const int64_t *idx, int64_t *off) {
  int64_t o = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (idx[d] < 0 || idx[d] >= t->shape[d])
      return crun_error(CRUN_ERANGE, "index %lld out of range for dim %d of size %lld",
                        (long long)idx[d] + 1, d + 1, (long long)t->shape[d]);
    o += idx[d] * t->strides[d];
  }
  *off = o;
  return 0;
}

int crun_tensor_get_double(const crun_tensor_t *t, const int64_t *idx, double *out) {
  CRUN__HOST_ONLY(t, "item");
  int64_t o;
  CRUN_CHECK(elem_offset(t, idx, &o));
  *out = crun_elem_get_double(t->dt, crun_tensor_data(t), o);
  return 0;
}

int crun_tensor_set_double(crun_tensor_t *t, const int64_t *idx, double v) {
  CRUN__HOST_ONLY(t, "set element");
  int64_t o;
  CRUN_CHECK(elem_offset(t, idx, &o));
  crun_elem_set_double(t->dt, crun_tensor_data(t), o, v);
  return 0;
}

int crun_tensor_get_int64(const crun_tensor_t *t, const int64_t *idx, int64_t *out) {
  CRUN__HOST_ONLY(t, "item");
  int64_t o;
  CRUN_CHECK(elem_offset(t, idx, &o));
  *out = crun__elem_get_int64(t->dt, crun_tensor_data(t), o);
  return 0;
}

int crun_tensor_set_int64(crun_tensor_t *t, const int64_t *idx, int64_t v) {
  CRUN__HOST_ONLY(t, "set element");
  int64_t o;
  CRUN_CHECK(elem_offset(t, idx, &o));
  crun__elem_set_int64(t->dt, crun_tensor_data(t), o, v);
  return 0;
}

/* ------------------------------------------------------------ copy */

/* Whether a and b have the same number of dims and the same sizes. */
static int same_shape(const crun_tensor_t *a, const crun_tensor_t *b) {
  return a->ndim == b->ndim && memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t)) == 0;
}

/* Copies one row of n elements (strided) between dtypes. */
static void copy_row(crun_dtype_t ddt, char *d, int64_t ds, crun_dtype_t sdt, const char *s,
                     int64_t ss, int64_t n) {
  size_t es = crun_dtype_size(ddt);
  if (ddt == sdt && ds == 1 && ss == 1) {
    memmove(d, s, (size_t)n * es);
  } else if (ddt == sdt) {
    for (int64_t i = 0; i < n; i++) memcpy(d + i * ds * (int64_t)es, s + i * ss * (int64_t)es, es);
  } else if (crun_dtype_is_integer(ddt) && crun_dtype_is_integer(sdt)) {
    for (int64_t i = 0; i < n; i++) crun__elem_set_int64(ddt, d, i * ds, crun__elem_get_int64(sdt, s, i * ss));
  } else {
    for (int64_t i = 0; i < n; i++) crun_elem_set_double(ddt, d, i * ds, crun_elem_get_double(sdt, s, i * ss));
  }
}

/* Whether v truncated toward zero is a value of integer dtype dt (nan and
 * +-inf are not; 2^63 is the first double past INT64_MAX). */
static int fits_int(crun_dtype_t dt, double v) {
  double t = trunc(v);
  switch (dt) {
    case CRUN_INT8: return t >= -128.0 && t <= 127.0;
    case CRUN_UINT8: return t >= 0.0 && t <= 255.0;
    case CRUN_INT16: return t >= -32768.0 && t <= 32767.0;
    case CRUN_INT32: return t >= -2147483648.0 && t <= 2147483647.0;
    default: return t >= -9223372036854775808.0 && t < 9223372036854775808.0;
  }
}

int crun__check_cast_fits(crun_dtype_t ddt, const crun_tensor_t *src) {
  if (!crun_dtype_is_integer(ddt) || crun_dtype_is_integer(src->dt) || src->dt == CRUN_BOOL ||
      crun_tensor_numel(src) == 0)
    return 0;
  crun__rowiter_t it;
  int64_t pos = 0;
  crun__rowiter_init(&it, src);
  do {
    for (int64_t i = 0; i < it.len; i++, pos++) {
      double v = crun_elem_get_double(src->dt, it.row, i * it.step);
      if (fits_int(ddt, v)) continue;
      int64_t lo, hi;
      crun_dtype_int_range(ddt, &lo, &hi);
      return crun_error(CRUN_EINVAL, "convert %s to %s: element %lld (%.14g) does not fit %s [%lld, %lld] "
                        "(nan, inf and values out of range have no integer; clamp first)",
                        crun_dtype_name(src->dt), crun_dtype_name(ddt), (long long)pos + 1, v,
                        crun_dtype_name(ddt), (long long)lo, (long long)hi);
    }
  } while (crun__rowiter_next(&it));
  return 0;
}

int crun_tensor_copy(crun_tensor_t *dst, crun_tensor_t *src) {
  char a[128], b[128];
  CRUN_CHECK(crun__check_writable(dst, "copy"));
  /* host tensors have device -1 on both sides: the AND stays negative */
  if (__builtin_expect((dst->st->device & src->st->device) >= 0, 0)) return crun__tensor_copy_dev(dst, src);
  if (!same_shape(dst, src))
    return crun_error(CRUN_EINVAL, "copy: shape mismatch, destination is %s, source is %s",
                      crun__shape_str(dst->ndim, dst->shape, a, sizeof a),
                      crun__shape_str(src->ndim, src->shape, b, sizeof b));
  if (crun_tensor_numel(dst) == 0) return 0;
  CRUN_CHECK(crun__check_cast_fits(dst->dt, src)); /* before anything is written */
  if (crun_tensor_is_contiguous(dst) && crun_tensor_is_contiguous(src)) {
    copy_row(dst->dt, crun_tensor_data(dst), 1, src->dt, crun_tensor_data(src), 1, crun_tensor_numel(dst));
    return 0;
  }
  crun__rowiter_t di, si;
  crun__rowiter_init(&di, dst);
  crun__rowiter_init(&si, src);
  do {
    copy_row(dst->dt, di.row, di.step, src->dt, si.row, si.step, di.len);
  } while (crun__rowiter_next(&di) && crun__rowiter_next(&si));
  return 0;
}

int crun_tensor_to(crun_tensor_t *t, crun_dtype_t dt, crun_tensor_t **out) {
  crun_tensor_t *c;
  CRUN_CHECK(crun_tensor_empty_on(dt, t->ndim, t->shape, t->st->device, &c));
  int rc = crun_tensor_copy(c, t);
  if (rc < 0) {
    crun_tensor_release(c);
    return rc;
  }
  *out = c;
  return 0;
}

int crun_tensor_clone(crun_tensor_t *t, crun_tensor_t **out) { return crun_tensor_to(t, t->dt, out); }

int crun_tensor_contiguous(crun_tensor_t *t, crun_tensor_t **out) {
  if (crun_tensor_is_contiguous(t)) {
    crun_tensor_retain(t);
    *out = t;
    return 0;
  }
  return crun_tensor_clone(t, out);
}

/* ------------------------------------------------------------ fill, equal */

/* Stores the element whose bytes are one[0..size) at every position of t. */
static void fill_elem(crun_tensor_t *t, const unsigned char one[8]) {
  size_t es = crun_dtype_size(t->dt);
  int zero = 1;
  for (size_t b = 0; b < es; b++) zero &= one[b] == 0;
  uint8_t v1 = one[0];
  uint16_t v2;
  uint32_t v4;
  uint64_t v8;
  memcpy(&v2, one, 2);
  memcpy(&v4, one, 4);
  memcpy(&v8, one, 8);
  crun__rowiter_t it;
  crun__rowiter_init(&it, t);
  if (it.rows_left <= 0) return;
  do {
    /* one typed store per element (a memcpy of a run-time size each was 1 GB/s) */
    if (it.step == 1 && zero) {
      memset(it.row, 0, (size_t)it.len * es);
      continue;
    }
    int64_t st = it.step;
    switch (es) {
      case 1: { uint8_t *p = (uint8_t *)it.row; for (int64_t i = 0; i < it.len; i++) p[i * st] = v1; break; }
      case 2: { uint16_t *p = (uint16_t *)it.row; for (int64_t i = 0; i < it.len; i++) p[i * st] = v2; break; }
      case 4: { uint32_t *p = (uint32_t *)it.row; for (int64_t i = 0; i < it.len; i++) p[i * st] = v4; break; }
      default: { uint64_t *p = (uint64_t *)it.row; for (int64_t i = 0; i < it.len; i++) p[i * st] = v8; break; }
    }
  } while (crun__rowiter_next(&it));
}

int crun_tensor_fill(crun_tensor_t *t, double v) {
  CRUN_CHECK(crun__check_writable(t, "fill"));
  if (__builtin_expect(t->st->device >= 0, 0)) return crun__dev_fill(t, v);
  unsigned char one[8] = {0};
  crun_elem_set_double(t->dt, one, 0, v);
  fill_elem(t, one);
  return 0;
}

int crun_tensor_fill_int64(crun_tensor_t *t, int64_t v) {
  CRUN_CHECK(crun__check_writable(t, "fill"));
  if (__builtin_expect(t->st->device >= 0, 0)) return crun__dev_fill(t, (double)v);
  unsigned char one[8] = {0};
  crun__elem_set_int64(t->dt, one, 0, v);
  fill_elem(t, one);
  return 0;
}

int crun_tensor_equal(crun_tensor_t *a, crun_tensor_t *b) {
  if (!same_shape(a, b)) return 0;
  if (__builtin_expect((a->st->device & b->st->device) >= 0, 0))
    return crun__tensor_compare_dev(a, b, crun_tensor_equal, 0, 0);
  if (crun_tensor_numel(a) == 0) return 1;
  int ints = crun_dtype_is_integer(a->dt) && crun_dtype_is_integer(b->dt);
  crun__rowiter_t ai, bi;
  crun__rowiter_init(&ai, a);
  crun__rowiter_init(&bi, b);
  do {
    for (int64_t i = 0; i < ai.len; i++) {
      int same = ints ? crun__elem_get_int64(a->dt, ai.row, i * ai.step) ==
                            crun__elem_get_int64(b->dt, bi.row, i * bi.step)
                      : crun_elem_get_double(a->dt, ai.row, i * ai.step) ==
                            crun_elem_get_double(b->dt, bi.row, i * bi.step);
      if (!same) return 0;
    }
  } while (crun__rowiter_next(&ai) && crun__rowiter_next(&bi));
  return 1;
}

int crun_tensor_allclose(crun_tensor_t *a, crun_tensor_t *b, double rtol, double atol) {
  if (!same_shape(a, b)) return 0;
  if (__builtin_expect((a->st->device & b->st->device) >= 0, 0))
    return crun__tensor_compare_dev(a, b, NULL, rtol, atol);
  if (crun_tensor_numel(a) == 0) return 1;
  crun__rowiter_t ai, bi;
  crun__rowiter_init(&ai, a);
  crun__rowiter_init(&bi, b);
  do {
    for (int64_t i = 0; i < ai.len; i++) {
      double x = crun_elem_get_double(a->dt, ai.row, i * ai.step);
      double y = crun_elem_get_double(b->dt, bi.row, i * bi.step);
      if (x == y) continue; /* equal infinities */
      if (!(fabs(x - y) <= atol + rtol * fabs(y))) return 0;
    }
  } while (crun__rowiter_next(&ai) && crun__rowiter_next(&bi));
  return 1;
}
