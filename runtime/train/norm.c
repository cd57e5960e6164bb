/* norm.c — the pieces batch normalisation is built from (per-channel sums,
 * normalise, input gradient; SyncBatchNorm all_reduces the sums between
 * them), layer normalisation, and embedding lookup. Inputs are viewed as
 * [N, C, S] (S = product of the dims after the channel, 1 for [N, C]);
 * per-channel statistics are float64 [C] whatever the input's dtype. */
#include <math.h>
#include <string.h>

#include "train/check.h"

/* Fails unless t is a contiguous float64 tensor of c elements. */
static int check_stat(const char *fn, const char *arg, const crun_tensor_t *t, int64_t c) {
  if (!t || crun_tensor_dtype(t) != CRUN_FLOAT64 || !crun_tensor_is_contiguous(t) ||
      crun_tensor_numel(t) != c)
    return crun_error(CRUN_EINVAL, "%s: %s must be a contiguous float64 tensor of %lld elements", fn,
                      arg, (long long)c);
  return 0;
}

/* Fails unless t is a contiguous tensor of x's dtype with c elements. */
static int check_param(const char *fn, const char *arg, const crun_tensor_t *x,
                       const crun_tensor_t *t, int64_t c) {
  CRUN_CHECK(crun__train_check_float(fn, arg, t));
  if (crun_tensor_dtype(t) != crun_tensor_dtype(x) || crun_tensor_numel(t) != c)
    return crun_error(CRUN_EINVAL, "%s: %s must be %s with %lld elements, got %s with %lld", fn, arg,
                      crun_dtype_name(crun_tensor_dtype(x)), (long long)c,
                      crun_dtype_name(crun_tensor_dtype(t)), (long long)crun_tensor_numel(t));
  return 0;
}

/* Splits x (at least 2-d) into N, C, S. */
static int nc_dims(const char *fn, const crun_tensor_t *x, int64_t *n, int64_t *c, int64_t *s) {
  CRUN_CHECK(crun__train_check_float(fn, "input", x));
  char b[64];
  int nd = crun_tensor_ndim(x);
  if (nd < 2)
    return crun_error(CRUN_EINVAL, "%s: input must be at least 2-d (N, C, ...), got shape %s", fn,
                      crun__train_shape_str(x, b, sizeof b));
  const int64_t *d = crun_tensor_shape(x);
  *n = d[0], *c = d[1], *s = 1;
  for (int i = 2; i < nd; i++) *s *= d[i];
  return 0;
}

/* Element e of a float32/float64 buffer as a double. */
static inline double at(int f32, const void *p, int64_t e) {
  return f32 ? (double)((const float *)p)[e] : ((const double *)p)[e];
}

static inline void put(int f32, void *p, int64_t e, double v) {
  if (f32) ((float *)p)[e] = (float)v;
  else ((double *)p)[e] = v;
}

int crun_nn_bn_reduce(const crun_tensor_t *a, const crun_tensor_t *ma, const crun_tensor_t *b,
                      const crun_tensor_t *mb, crun_tensor_t *out) {
  static const char *fn = "BatchNorm reduce";
  int64_t n, c, s;
  CRUN_CHECK(nc_dims(fn, a, &n, &c, &s));
  if (b) CRUN_CHECK(crun__train_check_like(fn, "b", a, b));
  if (ma) CRUN_CHECK(check_stat(fn, "shift of a", ma, c));
  if (mb) CRUN_CHECK(check_stat(fn, "shift of b", mb, c));
  CRUN_CHECK(check_stat(fn, "output", out, c));
  int f32 = crun_tensor_dtype(a) == CRUN_FLOAT32;
  const void *pa = crun_tensor_data(a), *pb = b ? crun_tensor_data(b) : NULL;
  double *o = crun_tensor_data(out);
  for (int64_t ch = 0; ch < c; ch++) {
    double sa = ma ? ((const double *)crun_tensor_data(ma))[ch] : 0;
    double sb = mb ? ((const double *)crun_tensor_data(mb))[ch] : 0, acc = 0;
    for (int64_t i = 0; i < n; i++) {
      int64_t base = (i * c + ch) * s;
      for (int64_t k = 0; k < s; k++)
        acc += (at(f32, pa, base + k) - sa) * (pb ? at(f32, pb, base + k) - sb : 1.0);
    }
    o[ch] = acc;
  }
  return 0;
}

int crun_nn_bn_apply(const crun_tensor_t *x, const crun_tensor_t *mean, const crun_tensor_t *invstd,
                     const crun_tensor_t *w, const crun_tensor_t *b, crun_tensor_t *y) {
  static const char *fn = "BatchNorm forward";
  int64_t n, c, s;
  CRUN_CHECK(nc_dims(fn, x, &n, &c, &s));
  CRUN_CHECK(check_stat(fn, "mean", mean, c));
  CRUN_CHECK(check_stat(fn, "invstd", invstd, c));
  if (w) CRUN_CHECK(check_param(fn, "weight", x, w, c));
  if (b) CRUN_CHECK(check_param(fn, "bias", x, b, c));
  CRUN_CHECK(crun__train_check_like(fn, "output", x, y));
  int f32 = crun_tensor_dtype(x) == CRUN_FLOAT32;
  const double *mu = crun_tensor_data(mean), *is = crun_tensor_data(invstd);
  for (int64_t ch = 0; ch < c; ch++) {
    double sc = is[ch] * (w ? at(f32, crun_tensor_data(w), ch) : 1.0);
    double sh = (b ? at(f32, crun_tensor_data(b), ch) : 0.0) - mu[ch] * sc;
    for (int64_t i = 0; i < n; i++) {
      int64_t base = (i * c + ch) * s;
      for (int64_t k = 0; k < s; k++) put(f32, crun_tensor_data(y), base + k, at(f32, crun_tensor_data(x), base + k) * sc + sh);
    }
  }
  return 0;
}

int crun_nn_bn_backward_input(const crun_tensor_t *gy, const crun_tensor_t *x,
                              const crun_tensor_t *mean, const crun_tensor_t *invstd,
                              const crun_tensor_t *w, const crun_tensor_t *mean_dy,
                              const crun_tensor_t *mean_dy_xmu, crun_tensor_t *gx) {
  static const char *fn = "BatchNorm backward";
  int64_t n, c, s;
  CRUN_CHECK(nc_dims(fn, x, &n, &c, &s));
  CRUN_CHECK(crun__train_check_like(fn, "gradOutput", x, gy));
  CRUN_CHECK(crun__train_check_like(fn, "gradInput", x, gx));
  CRUN_CHECK(check_stat(fn, "mean", mean, c));
  CRUN_CHECK(check_stat(fn, "invstd", invstd, c));
  if (w) CRUN_CHECK(check_param(fn, "weight", x, w, c));
  if (!mean_dy != !mean_dy_xmu)
    return crun_error(CRUN_EINVAL, "%s: mean_dy and mean_dy_xmu go together (training) or are both absent (eval)", fn);
  if (mean_dy) CRUN_CHECK(check_stat(fn, "mean_dy", mean_dy, c));
  if (mean_dy_xmu) CRUN_CHECK(check_stat(fn, "mean_dy_xmu", mean_dy_xmu, c));
  int f32 = crun_tensor_dtype(x) == CRUN_FLOAT32;
  const double *mu = crun_tensor_data(mean), *is = crun_tensor_data(invstd);
  for (int64_t ch = 0; ch < c; ch++) {
    double sc = is[ch] * (w ? at(f32, crun_tensor_data(w), ch) : 1.0);
    double md = mean_dy ? ((const double *)crun_tensor_data(mean_dy))[ch] : 0.0;
    double proj = mean_dy_xmu ? ((const double *)crun_tensor_data(mean_dy_xmu))[ch] * is[ch] * is[ch] : 0.0;
    for (int64_t i = 0; i < n; i++) {
      int64_t base = (i * c + ch) * s;
      for (int64_t k = 0; k < s; k++) {
        double xm = at(f32, crun_tensor_data(x), base + k) - mu[ch];
        put(f32, crun_tensor_data(gx), base + k, (at(f32, crun_tensor_data(gy), base + k) - md - xm * proj) * sc);
      }
    }
  }
  return 0;
}

int crun_nn_bn_param_grads(const crun_tensor_t *sum_dy, const crun_tensor_t *sum_dy_xmu,
                           const crun_tensor_t *invstd, crun_tensor_t *gw, crun_tensor_t *gb) {
  static const char *fn = "BatchNorm parameter gradients";
  int64_t c = crun_tensor_numel(invstd);
  CRUN_CHECK(check_stat(fn, "invstd", invstd, c));
  CRUN_CHECK(check_stat(fn, "sum_dy", sum_dy, c));
  CRUN_CHECK(check_stat(fn, "sum_dy_xmu", sum_dy_xmu, c));
  const crun_tensor_t *ref = gw ? gw : gb;
  if (!ref) return 0;
  if (gw) CRUN_CHECK(check_param(fn, "gradWeight", ref, gw, c));
  if (gb) CRUN_CHECK(check_param(fn, "gradBias", ref, gb, c));
  int f32 = crun_tensor_dtype(ref) == CRUN_FLOAT32;
  const double *sd = crun_tensor_data(sum_dy), *sx = crun_tensor_data(sum_dy_xmu), *is = crun_tensor_data(invstd);
  for (int64_t ch = 0; ch < c; ch++) {
    if (gw) put(f32, crun_tensor_data(gw), ch, at(f32, crun_tensor_data(gw), ch) + sx[ch] * is[ch]);
    if (gb) put(f32, crun_tensor_data(gb), ch, at(f32, crun_tensor_data(gb), ch) + sd[ch]);
  }
  return 0;
}

/* ---------------------------------------------------------------- LayerNorm */

/* Checks x (numel a multiple of d > 0) and returns the row count. */
static int ln_rows(const char *fn, const crun_tensor_t *x, int64_t d, int64_t *rows) {
  CRUN_CHECK(crun__train_check_float(fn, "input", x));
  int64_t n = crun_tensor_numel(x);
  if (d < 1 || n % d != 0)
    return crun_error(CRUN_EINVAL, "%s: input of %lld elements is not a whole number of rows of %lld", fn,
                      (long long)n, (long long)d);
  *rows = n / d;
  return 0;
}

int crun_nn_layer_norm_forward(const crun_tensor_t *x, int64_t d, const crun_tensor_t *w,
                               const crun_tensor_t *b, double eps, crun_tensor_t *y,
                               crun_tensor_t *mean, crun_tensor_t *rstd) {
  static const char *fn = "LayerNorm forward";
  int64_t rows;
  CRUN_CHECK(ln_rows(fn, x, d, &rows));
  if (w) CRUN_CHECK(check_param(fn, "weight", x, w, d));
  if (b) CRUN_CHECK(check_param(fn, "bias", x, b, d));
  CRUN_CHECK(crun__train_check_like(fn, "output", x, y));
  CRUN_CHECK(check_stat(fn, "mean", mean, rows));
  CRUN_CHECK(check_stat(fn, "rstd", rstd, rows));
  if (!(eps >= 0)) return crun_error(CRUN_EINVAL, "%s: eps must be >= 0, got %g", fn, eps);
  int f32 = crun_tensor_dtype(x) == CRUN_FLOAT32;
  const void *px = crun_tensor_data(x);
  for (int64_t r = 0; r < rows; r++) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < d; j++) m += at(f32, px, r * d + j);
    m /= (double)d;
    for (int64_t j = 0; j < d; j++) v += (at(f32, px, r * d + j) - m) * (at(f32, px, r * d + j) - m);
    double rs = 1.0 / sqrt(v / (double)d + eps);
    ((double *)crun_tensor_data(mean))[r] = m;
    ((double *)crun_tensor_data(rstd))[r] = rs;
    for (int64_t j = 0; j < d; j++) {
      double xh = (at(f32, px, r * d + j) - m) * rs;
      if (w) xh *= at(f32, crun_tensor_data(w), j);
      if (b) xh += at(f32, crun_tensor_data(b), j);
      put(f32, crun_tensor_data(y), r * d + j, xh);
    }
  }
  return 0;
}

int crun_nn_layer_norm_backward(const crun_tensor_t *gy, const crun_tensor_t *x, int64_t d,
                                const crun_tensor_t *mean, const crun_tensor_t *rstd,
                                const crun_tensor_t *w, crun_tensor_t *gx, crun_tensor_t *gw,
                                crun_tensor_t *gb) {
  static const char *fn = "LayerNorm backward";
  int64_t rows;
  CRUN_CHECK(ln_rows(fn, x, d, &rows));
  CRUN_CHECK(crun__train_check_like(fn, "gradOutput", x, gy));
  if (gx) CRUN_CHECK(crun__train_check_like(fn, "gradInput", x, gx));
  CRUN_CHECK(check_stat(fn, "mean", mean, rows));
  CRUN_CHECK(check_stat(fn, "rstd", rstd, rows));
  if (w) CRUN_CHECK(check_param(fn, "weight", x, w, d));
  if (gw) CRUN_CHECK(check_param(fn, "gradWeight", x, gw, d));
  if (gb) CRUN_CHECK(check_param(fn, "gradBias", x, gb, d));
  int f32 = crun_tensor_dtype(x) == CRUN_FLOAT32;
  const void *px = crun_tensor_data(x), *pg = crun_tensor_data(gy);
  for (int64_t r = 0; r < rows; r++) {
    double m = ((const double *)crun_tensor_data(mean))[r], rs = ((const double *)crun_tensor_data(rstd))[r];
    double s1 = 0, s2 = 0; /* sum of g*w, sum of g*w*xhat */
    for (int64_t j = 0; j < d; j++) {
      double xh = (at(f32, px, r * d + j) - m) * rs, g = at(f32, pg, r * d + j);
      double gw_ = g * (w ? at(f32, crun_tensor_data(w), j) : 1.0);
      s1 += gw_, s2 += gw_ * xh;
      if (gw) put(f32, crun_tensor_data(gw), j, at(f32, crun_tensor_data(gw), j) + g * xh);
      if (gb) put(f32, crun_tensor_data(gb), j, at(f32, crun_tensor_data(gb), j) + g);
    }
    if (!gx) continue;
    for (int64_t j = 0; j < d; j++) {
      double xh = (at(f32, px, r * d + j) - m) * rs;
      double gw_ = at(f32, pg, r * d + j) * (w ? at(f32, crun_tensor_data(w), j) : 1.0);
      put(f32, crun_tensor_data(gx), r * d + j, rs * (gw_ - s1 / (double)d - xh * s2 / (double)d));
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- Embedding */

/* Checks idx (int32/int64, contiguous, entries in 1..v) and w [v, d]. */
static int emb_check(const char *fn, const crun_tensor_t *idx, const crun_tensor_t *w, int64_t *v,
                     int64_t *d) {
  CRUN_CHECK(crun__train_check_2d(fn, "weight", w, v, d));
  crun_dtype_t dt = idx ? crun_tensor_dtype(idx) : CRUN_FLOAT32;
  if (!idx || (dt != CRUN_INT64 && dt != CRUN_INT32) || !crun_tensor_is_contiguous(idx))
    return crun_error(CRUN_EINVAL, "%s: indices must be a contiguous int64 or int32 tensor", fn);
  int64_t n = crun_tensor_numel(idx);
  for (int64_t i = 0; i < n; i++) {
    int64_t k = dt == CRUN_INT64 ? ((const int64_t *)crun_tensor_data(idx))[i]
                                 : ((const int32_t *)crun_tensor_data(idx))[i];
    if (k < 1 || k > *v)
      return crun_error(CRUN_ERANGE, "%s: index %lld at position %lld is out of range 1..%lld (1-based)", fn,
                        (long long)k, (long long)(i + 1), (long long)*v);
  }
  return 0;
}

static inline int64_t idx_at(const crun_tensor_t *idx, int64_t i) {
  return crun_tensor_dtype(idx) == CRUN_INT64 ? ((const int64_t *)crun_tensor_data(idx))[i]
                                               : ((const int32_t *)crun_tensor_data(idx))[i];
}

int crun_nn_embedding_forward(const crun_tensor_t *idx, const crun_tensor_t *w, crun_tensor_t *y) {
  static const char *fn = "Embedding forward";
  int64_t v, d;
  CRUN_CHECK(emb_check(fn, idx, w, &v, &d));
  int64_t n = crun_tensor_numel(idx);
  CRUN_CHECK(crun__train_check_float(fn, "output", y));
  if (crun_tensor_dtype(y) != crun_tensor_dtype(w) || crun_tensor_numel(y) != n * d)
    return crun_error(CRUN_EINVAL, "%s: output must be %s with %lld elements", fn,
                      crun_dtype_name(crun_tensor_dtype(w)), (long long)(n * d));
  size_t row = (size_t)d * crun_dtype_size(crun_tensor_dtype(w));
  for (int64_t i = 0; i < n; i++)
    memcpy((char *)crun_tensor_data(y) + (size_t)i * row,
           (const char *)crun_tensor_data(w) + (size_t)(idx_at(idx, i) - 1) * row, row);
  return 0;
}

int crun_nn_embedding_backward(const crun_tensor_t *idx, const crun_tensor_t *gy, crun_tensor_t *gw,
                               int64_t padding_idx) {
  static const char *fn = "Embedding backward";
  int64_t v, d;
  CRUN_CHECK(emb_check(fn, idx, gw, &v, &d));
  int64_t n = crun_tensor_numel(idx);
  CRUN_CHECK(crun__train_check_float(fn, "gradOutput", gy));
  if (crun_tensor_dtype(gy) != crun_tensor_dtype(gw) || crun_tensor_numel(gy) != n * d)
    return crun_error(CRUN_EINVAL, "%s: gradOutput must have %lld elements, got %lld", fn,
                      (long long)(n * d), (long long)crun_tensor_numel(gy));
  int f32 = crun_tensor_dtype(gw) == CRUN_FLOAT32;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = idx_at(idx, i);
    if (k == padding_idx) continue;
    for (int64_t j = 0; j < d; j++)
      put(f32, crun_tensor_data(gw), (k - 1) * d + j,
          at(f32, crun_tensor_data(gw), (k - 1) * d + j) + at(f32, crun_tensor_data(gy), i * d + j));
  }
  return 0;
}
