/* conv.c — 2-d convolution (im2col + GEMM through OpenBLAS) and 2-d max /
 * average pooling, forward and backward, for float32 and float64. Images are
 * NCHW and contiguous; a convolution works one image at a time through a
 * column buffer of C*KH*KW x OH*OW elements. */
#include "tensor/blas_lib.h"
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "train/check.h"

/* Checks that t is a 4-d float tensor; stores its dims in d[4]. */
static int check_4d(const char *fn, const char *arg, const crun_tensor_t *t, int64_t d[4]) {
  CRUN_CHECK(crun__train_check_float(fn, arg, t));
  char s[64];
  if (crun_tensor_ndim(t) != 4)
    return crun_error(CRUN_EINVAL, "%s: %s must be 4-d (N, C, H, W), got shape %s", fn, arg,
                      crun__train_shape_str(t, s, sizeof s));
  memcpy(d, crun_tensor_shape(t), 4 * sizeof d[0]);
  return 0;
}

/* Fails unless t is a float tensor of ref's dtype with shape d[0..3]. */
static int check_shape4(const char *fn, const char *arg, const crun_tensor_t *ref,
                        const crun_tensor_t *t, const int64_t d[4]) {
  int64_t td[4];
  char s[64];
  CRUN_CHECK(check_4d(fn, arg, t, td));
  if (crun_tensor_dtype(t) != crun_tensor_dtype(ref) || memcmp(td, d, sizeof td) != 0)
    return crun_error(CRUN_EINVAL, "%s: %s is %s %s, expected %s %lldx%lldx%lldx%lld", fn, arg,
                      crun_dtype_name(crun_tensor_dtype(t)), crun__train_shape_str(t, s, sizeof s),
                      crun_dtype_name(crun_tensor_dtype(ref)), (long long)d[0], (long long)d[1],
                      (long long)d[2], (long long)d[3]);
  return 0;
}

/* Output extent of a window sweep: (in + 2 pad - dil (k - 1) - 1) / stride + 1. */
static int out_extent(const char *fn, const char *axis, int64_t in, int64_t k, int64_t s,
                      int64_t p, int64_t d, int64_t *out) {
  if (k < 1 || s < 1 || p < 0 || d < 1)
    return crun_error(CRUN_EINVAL, "%s: %s: kernel %lld, stride %lld, padding %lld, dilation %lld "
                      "(kernel, stride and dilation >= 1, padding >= 0)", fn, axis, (long long)k,
                      (long long)s, (long long)p, (long long)d);
  if (in > INT32_MAX || k > INT32_MAX || p > INT32_MAX || d > INT32_MAX) /* before any product */
    return crun_error(CRUN_EINVAL, "%s: %s: input extent %lld, kernel %lld, padding %lld or dilation %lld "
                      "is above 2^31 - 1", fn, axis, (long long)in, (long long)k, (long long)p, (long long)d);
  int64_t span = d * (k - 1) + 1, avail = in + 2 * p;
  if (avail < span)
    return crun_error(CRUN_EINVAL, "%s: %s: input extent %lld with padding %lld is smaller than the "
                      "dilated kernel (%lld)", fn, axis, (long long)in, (long long)p, (long long)span);
  *out = (avail - span) / s + 1;
  return 0;
}

/* C[m, n] = op(A) op(B) + beta C, row-major, ldc = n. */
static void gemm(crun_dtype_t dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                 const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c) {
  enum CBLAS_TRANSPOSE A = ta ? CblasTrans : CblasNoTrans, B = tb ? CblasTrans : CblasNoTrans;
  if (dt == CRUN_FLOAT32)
    crun__blas_sgemm(CblasRowMajor, A, B, (int)m, (int)n, (int)k, 1.f, a, (int)lda, b, (int)ldb,
                     (float)beta, c, (int)n);
  else
    crun__blas_dgemm(CblasRowMajor, A, B, (int)m, (int)n, (int)k, 1., a, (int)lda, b, (int)ldb, beta,
                     c, (int)n);
}

typedef struct {
  int64_t c, h, w, kh, kw, oh, ow;
  const crun_conv2d_geom_t *g;
} conv_plan_t;

/* im2col: col[(ci*kh + i)*kw + j][y*ow + x] = img[ci][y*sh - ph + i*dh][x*sw - pw + j*dw]
 * (0 outside); col2im adds col back into img (img must start zeroed). */
#define COL_LOOPS(T)                                                                         \
  static void im2col_##T(const conv_plan_t *p, const T *img, T *col) {                       \
    const crun_conv2d_geom_t *g = p->g;                                                      \
    for (int64_t ci = 0; ci < p->c; ci++)                                                    \
      for (int64_t i = 0; i < p->kh; i++)                                                    \
        for (int64_t j = 0; j < p->kw; j++) {                                                \
          T *row = col + ((ci * p->kh + i) * p->kw + j) * p->oh * p->ow;                     \
          for (int64_t y = 0; y < p->oh; y++) {                                              \
            int64_t iy = y * g->stride_h - g->pad_h + i * g->dil_h;                          \
            for (int64_t x = 0; x < p->ow; x++) {                                            \
              int64_t ix = x * g->stride_w - g->pad_w + j * g->dil_w;                        \
              row[y * p->ow + x] = (iy >= 0 && iy < p->h && ix >= 0 && ix < p->w)            \
                                       ? img[(ci * p->h + iy) * p->w + ix] : (T)0;           \
            }                                                                                \
          }                                                                                  \
        }                                                                                    \
  }                                                                                          \
  static void col2im_##T(const conv_plan_t *p, const T *col, T *img) {                       \
    const crun_conv2d_geom_t *g = p->g;                                                      \
    for (int64_t ci = 0; ci < p->c; ci++)                                                    \
      for (int64_t i = 0; i < p->kh; i++)                                                    \
        for (int64_t j = 0; j < p->kw; j++) {                                                \
          const T *row = col + ((ci * p->kh + i) * p->kw + j) * p->oh * p->ow;               \
          for (int64_t y = 0; y < p->oh; y++) {                                              \
            int64_t iy = y * g->stride_h - g->pad_h + i * g->dil_h;                          \
            if (iy < 0 || iy >= p->h) continue;                                              \
            for (int64_t x = 0; x < p->ow; x++) {                                            \
              int64_t ix = x * g->stride_w - g->pad_w + j * g->dil_w;                        \
              if (ix >= 0 && ix < p->w) img[(ci * p->h + iy) * p->w + ix] += row[y * p->ow + x]; \
            }                                                                                \
          }                                                                                  \
        }                                                                                    \
  }
COL_LOOPS(float)
COL_LOOPS(double)

int crun_nn_conv2d_out_size(int64_t h, int64_t w, int64_t kh, int64_t kw,
                            const crun_conv2d_geom_t *g, int64_t *oh, int64_t *ow) {
  static const char *fn = "Conv2d";
  CRUN_CHECK(out_extent(fn, "height", h, kh, g->stride_h, g->pad_h, g->dil_h, oh));
  return out_extent(fn, "width", w, kw, g->stride_w, g->pad_w, g->dil_w, ow);
}

/* Checks x, w (and b, y when given) and fills the plan and the column buffer
 * size in elements. */
static int conv_plan(const char *fn, const crun_tensor_t *x, const crun_tensor_t *w,
                     const crun_tensor_t *b, const crun_conv2d_geom_t *g, conv_plan_t *p,
                     int64_t xd[4], int64_t yd[4], size_t *col_bytes) {
  int64_t wd[4], col = 0, rows = 0;
  char sx[64], sw[64];
  CRUN_CHECK(check_4d(fn, "input", x, xd));
  CRUN_CHECK(check_4d(fn, "weight", w, wd));
  if (wd[1] != xd[1] || crun_tensor_dtype(w) != crun_tensor_dtype(x))
    return crun_error(CRUN_EINVAL, "%s: input %s %s does not match weight %s %s (in_channels %lld)", fn,
                      crun_dtype_name(crun_tensor_dtype(x)), crun__train_shape_str(x, sx, sizeof sx),
                      crun_dtype_name(crun_tensor_dtype(w)), crun__train_shape_str(w, sw, sizeof sw),
                      (long long)wd[1]);
  *p = (conv_plan_t){.c = xd[1], .h = xd[2], .w = xd[3], .kh = wd[2], .kw = wd[3], .g = g};
  CRUN_CHECK(crun_nn_conv2d_out_size(p->h, p->w, p->kh, p->kw, g, &p->oh, &p->ow));
  if (b && (crun_tensor_dtype(b) != crun_tensor_dtype(x) || crun_tensor_numel(b) != wd[0] ||
            !crun_tensor_is_contiguous(b)))
    return crun_error(CRUN_EINVAL, "%s: bias must be a contiguous %s tensor of %lld elements", fn,
                      crun_dtype_name(crun_tensor_dtype(x)), (long long)wd[0]);
  yd[0] = xd[0], yd[1] = wd[0], yd[2] = p->oh, yd[3] = p->ow;
  if (crun__prod_i64((int64_t[]){p->c, p->kh, p->kw}, 3, &rows) ||
      crun__mul_i64(rows, p->oh * p->ow, &col) || rows > INT32_MAX || p->oh * p->ow > INT32_MAX ||
      crun__mul_size((size_t)col, crun_dtype_size(crun_tensor_dtype(x)), col_bytes))
    return crun_error(CRUN_ERANGE, "%s: the column buffer (%lld x %lld) is too large", fn,
                      (long long)rows, (long long)(p->oh * p->ow));
  return 0;
}

int crun_nn_conv2d_forward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *b,
                           crun_tensor_t *y, const crun_conv2d_geom_t *g) {
  static const char *fn = "Conv2d forward";
  conv_plan_t p;
  int64_t xd[4], yd[4];
  size_t col_bytes;
  CRUN_CHECK(conv_plan(fn, x, w, b, g, &p, xd, yd, &col_bytes));
  CRUN_CHECK(check_shape4(fn, "output", x, y, yd));
  crun_dtype_t dt = crun_tensor_dtype(x);
  size_t es = crun_dtype_size(dt);
  int64_t oc = yd[1], l = p.oh * p.ow, k = p.c * p.kh * p.kw;
  void *col = malloc(col_bytes ? col_bytes : 1);
  if (!col) return crun_error(CRUN_ENOMEM, "%s: column buffer of %zu bytes", fn, col_bytes);
  for (int64_t n = 0; n < xd[0]; n++) {
    const char *xn = (const char *)crun_tensor_data(x) + (size_t)(n * p.c * p.h * p.w) * es;
    char *yn = (char *)crun_tensor_data(y) + (size_t)(n * oc * l) * es;
    if (dt == CRUN_FLOAT32) im2col_float(&p, (const float *)xn, col);
    else im2col_double(&p, (const double *)xn, col);
    for (int64_t o = 0; o < oc; o++)
      for (int64_t i = 0; i < l; i++) {
        if (dt == CRUN_FLOAT32) ((float *)yn)[o * l + i] = b ? ((const float *)crun_tensor_data(b))[o] : 0.f;
        else ((double *)yn)[o * l + i] = b ? ((const double *)crun_tensor_data(b))[o] : 0.;
      }
    if (k > 0 && l > 0 && oc > 0) gemm(dt, 0, 0, oc, l, k, crun_tensor_data(w), k, col, l, 1., yn);
  }
  free(col);
  return 0;
}

/* gb[o] += sum over pixels of gy_n[o]. */
static void conv_bias_grad(crun_dtype_t dt, void *gb, const void *gy, int64_t oc, int64_t l) {
  for (int64_t o = 0; o < oc; o++) {
    double s = 0;
    for (int64_t i = 0; i < l; i++)
      s += dt == CRUN_FLOAT32 ? (double)((const float *)gy)[o * l + i] : ((const double *)gy)[o * l + i];
    if (dt == CRUN_FLOAT32) ((float *)gb)[o] += (float)s;
    else ((double *)gb)[o] += s;
  }
}

int crun_nn_conv2d_backward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *gy,
                            crun_tensor_t *gx, crun_tensor_t *gw, crun_tensor_t *gb,
                            const crun_conv2d_geom_t *g) {
  static const char *fn = "Conv2d backward";
  conv_plan_t p;
  int64_t xd[4], yd[4];
  size_t col_bytes;
  CRUN_CHECK(conv_plan(fn, x, w, gb, g, &p, xd, yd, &col_bytes));
  CRUN_CHECK(check_shape4(fn, "gradOutput", x, gy, yd));
  if (gx) CRUN_CHECK(check_shape4(fn, "gradInput", x, gx, xd));
  if (gw) CRUN_CHECK(check_shape4(fn, "gradWeight", x, gw, crun_tensor_shape(w)));
  crun_dtype_t dt = crun_tensor_dtype(x);
  size_t es = crun_dtype_size(dt);
  int64_t oc = yd[1], l = p.oh * p.ow, k = p.c * p.kh * p.kw, img = p.c * p.h * p.w;
  void *col = malloc(col_bytes ? col_bytes : 1);
  if (!col) return crun_error(CRUN_ENOMEM, "%s: column buffer of %zu bytes", fn, col_bytes);
  if (gx) memset(crun_tensor_data(gx), 0, (size_t)(xd[0] * img) * es);
  for (int64_t n = 0; n < xd[0]; n++) {
    const char *xn = (const char *)crun_tensor_data(x) + (size_t)(n * img) * es;
    const char *gyn = (const char *)crun_tensor_data(gy) + (size_t)(n * oc * l) * es;
    if (gb) conv_bias_grad(dt, crun_tensor_data(gb), gyn, oc, l);
    if (k == 0 || l == 0 || oc == 0) continue;
    if (gw) {
      if (dt == CRUN_FLOAT32) im2col_float(&p, (const float *)xn, col);
      else im2col_double(&p, (const double *)xn, col);
      gemm(dt, 0, 1, oc, k, l, gyn, l, col, l, 1., crun_tensor_data(gw));
    }
    if (gx) {
      char *gxn = (char *)crun_tensor_data(gx) + (size_t)(n * img) * es;
      gemm(dt, 1, 0, k, l, oc, crun_tensor_data(w), k, gyn, l, 0., col);
      if (dt == CRUN_FLOAT32) col2im_float(&p, col, (float *)gxn);
      else col2im_double(&p, col, (double *)gxn);
    }
  }
  free(col);
  return 0;
}

/* ---------------------------------------------------------------- pooling */

int crun_nn_pool2d_out_size(int64_t h, int64_t w, const crun_pool2d_geom_t *g, int64_t *oh,
                            int64_t *ow) {
  static const char *fn = "Pool2d";
  if (g->pad_h > g->kh / 2 || g->pad_w > g->kw / 2) /* pad * 2 could overflow */
    return crun_error(CRUN_EINVAL, "%s: padding (%lld, %lld) must be at most half the kernel (%lld, %lld)",
                      fn, (long long)g->pad_h, (long long)g->pad_w, (long long)g->kh, (long long)g->kw);
  CRUN_CHECK(out_extent(fn, "height", h, g->kh, g->stride_h, g->pad_h, 1, oh));
  return out_extent(fn, "width", w, g->kw, g->stride_w, g->pad_w, 1, ow);
}

/* Checks x [N, C, H, W] and y [N, C, OH, OW] for geometry g. */
static int pool_dims(const char *fn, const char *xname, const crun_tensor_t *x, const char *yname,
                     const crun_tensor_t *y, const crun_pool2d_geom_t *g, int64_t xd[4], int64_t yd[4]) {
  CRUN_CHECK(check_4d(fn, xname, x, xd));
  yd[0] = xd[0], yd[1] = xd[1];
  CRUN_CHECK(crun_nn_pool2d_out_size(xd[2], xd[3], g, &yd[2], &yd[3]));
  return check_shape4(fn, yname, x, y, yd);
}

/* Fails unless idx is a contiguous int64 tensor with n elements. */
static int check_index(const char *fn, const crun_tensor_t *idx, int64_t n) {
  if (!idx || crun_tensor_dtype(idx) != CRUN_INT64 || !crun_tensor_is_contiguous(idx) ||
      crun_tensor_numel(idx) != n)
    return crun_error(CRUN_EINVAL, "%s: indices must be a contiguous int64 tensor of %lld elements", fn,
                      (long long)n);
  return 0;
}

#define POOL_LOOPS(T)                                                                       \
  static void maxpool_##T(const T *x, T *y, int64_t *idx, int64_t planes, const int64_t *xd, \
                          const int64_t *yd, const crun_pool2d_geom_t *g) {                 \
    for (int64_t pl = 0; pl < planes; pl++) {                                               \
      const T *xp = x + pl * xd[2] * xd[3];                                                 \
      for (int64_t oy = 0; oy < yd[2]; oy++)                                                \
        for (int64_t ox = 0; ox < yd[3]; ox++) {                                            \
          int64_t best = -1;                                                                \
          T m = 0;                                                                          \
          for (int64_t i = 0; i < g->kh; i++) {                                             \
            int64_t iy = oy * g->stride_h - g->pad_h + i;                                   \
            if (iy < 0 || iy >= xd[2]) continue;                                            \
            for (int64_t j = 0; j < g->kw; j++) {                                           \
              int64_t ix = ox * g->stride_w - g->pad_w + j;                                 \
              if (ix < 0 || ix >= xd[3]) continue;                                          \
              T v = xp[iy * xd[3] + ix];                                                    \
              if (best < 0 || v > m || v != v) { m = v; best = iy * xd[3] + ix; }           \
            }                                                                               \
          }                                                                                 \
          int64_t o = (pl * yd[2] + oy) * yd[3] + ox;                                       \
          y[o] = m;                                                                         \
          idx[o] = best;                                                                    \
        }                                                                                   \
    }                                                                                       \
  }                                                                                         \
  static void avgpool_##T(const T *x, T *y, const T *gy, T *gx, int64_t planes,             \
                          const int64_t *xd, const int64_t *yd, const crun_pool2d_geom_t *g, \
                          int include_pad) {                                                \
    for (int64_t pl = 0; pl < planes; pl++)                                                 \
      for (int64_t oy = 0; oy < yd[2]; oy++)                                                \
        for (int64_t ox = 0; ox < yd[3]; ox++) {                                            \
          int64_t y0 = oy * g->stride_h - g->pad_h, x0 = ox * g->stride_w - g->pad_w;       \
          int64_t y1 = y0 + g->kh, x1 = x0 + g->kw;                                         \
          int64_t py1 = y1 < xd[2] + g->pad_h ? y1 : xd[2] + g->pad_h;                      \
          int64_t px1 = x1 < xd[3] + g->pad_w ? x1 : xd[3] + g->pad_w;                      \
          int64_t div = (py1 - y0) * (px1 - x0);                                            \
          y0 = y0 < 0 ? 0 : y0, x0 = x0 < 0 ? 0 : x0;                                       \
          y1 = y1 > xd[2] ? xd[2] : y1, x1 = x1 > xd[3] ? xd[3] : x1;                       \
          if (!include_pad) div = (y1 - y0) * (x1 - x0);                                    \
          int64_t o = (pl * yd[2] + oy) * yd[3] + ox;                                       \
          if (y) {                                                                          \
            double s = 0;                                                                   \
            for (int64_t iy = y0; iy < y1; iy++)                                            \
              for (int64_t ix = x0; ix < x1; ix++) s += x[(pl * xd[2] + iy) * xd[3] + ix];  \
            y[o] = div > 0 ? (T)(s / (double)div) : (T)0;                                   \
          } else if (div > 0) {                                                             \
            T v = gy[o] / (T)div;                                                           \
            for (int64_t iy = y0; iy < y1; iy++)                                            \
              for (int64_t ix = x0; ix < x1; ix++) gx[(pl * xd[2] + iy) * xd[3] + ix] += v; \
          }                                                                                 \
        }                                                                                   \
  }
POOL_LOOPS(float)
POOL_LOOPS(double)

int crun_nn_maxpool2d_forward(const crun_tensor_t *x, crun_tensor_t *y, crun_tensor_t *idx,
                              const crun_pool2d_geom_t *g) {
  static const char *fn = "MaxPool2d forward";
  int64_t xd[4], yd[4];
  CRUN_CHECK(pool_dims(fn, "input", x, "output", y, g, xd, yd));
  CRUN_CHECK(check_index(fn, idx, crun_tensor_numel(y)));
  if (crun_tensor_dtype(x) == CRUN_FLOAT32)
    maxpool_float(crun_tensor_data(x), crun_tensor_data(y), crun_tensor_data(idx), xd[0] * xd[1], xd, yd, g);
  else
    maxpool_double(crun_tensor_data(x), crun_tensor_data(y), crun_tensor_data(idx), xd[0] * xd[1], xd, yd, g);
  return 0;
}

int crun_nn_maxpool2d_backward(const crun_tensor_t *gy, const crun_tensor_t *idx, crun_tensor_t *gx,
                               const crun_pool2d_geom_t *g) {
  static const char *fn = "MaxPool2d backward";
  int64_t xd[4], yd[4];
  CRUN_CHECK(pool_dims(fn, "gradInput", gx, "gradOutput", gy, g, xd, yd));
  CRUN_CHECK(check_index(fn, idx, crun_tensor_numel(gy)));
  int64_t plane = xd[2] * xd[3], oplane = yd[2] * yd[3], planes = xd[0] * xd[1];
  const int64_t *ix = crun_tensor_data(idx);
  int f32 = crun_tensor_dtype(gx) == CRUN_FLOAT32;
  memset(crun_tensor_data(gx), 0, (size_t)crun_tensor_numel(gx) * crun_dtype_size(crun_tensor_dtype(gx)));
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t o = 0; o < oplane; o++) {
      int64_t k = ix[pl * oplane + o];
      if (k < 0 || k >= plane) continue; /* a window with no element (cannot happen when pad <= k/2) */
      if (f32) ((float *)crun_tensor_data(gx))[pl * plane + k] += ((const float *)crun_tensor_data(gy))[pl * oplane + o];
      else ((double *)crun_tensor_data(gx))[pl * plane + k] += ((const double *)crun_tensor_data(gy))[pl * oplane + o];
    }
  return 0;
}

int crun_nn_avgpool2d_forward(const crun_tensor_t *x, crun_tensor_t *y, const crun_pool2d_geom_t *g,
                              int count_include_pad) {
  static const char *fn = "AvgPool2d forward";
  int64_t xd[4], yd[4];
  CRUN_CHECK(pool_dims(fn, "input", x, "output", y, g, xd, yd));
  if (crun_tensor_dtype(x) == CRUN_FLOAT32)
    avgpool_float(crun_tensor_data(x), crun_tensor_data(y), NULL, NULL, xd[0] * xd[1], xd, yd, g, count_include_pad);
  else
    avgpool_double(crun_tensor_data(x), crun_tensor_data(y), NULL, NULL, xd[0] * xd[1], xd, yd, g, count_include_pad);
  return 0;
}

int crun_nn_avgpool2d_backward(const crun_tensor_t *gy, crun_tensor_t *gx, const crun_pool2d_geom_t *g,
                               int count_include_pad) {
  static const char *fn = "AvgPool2d backward";
  int64_t xd[4], yd[4];
  CRUN_CHECK(pool_dims(fn, "gradInput", gx, "gradOutput", gy, g, xd, yd));
  memset(crun_tensor_data(gx), 0, (size_t)crun_tensor_numel(gx) * crun_dtype_size(crun_tensor_dtype(gx)));
  if (crun_tensor_dtype(gx) == CRUN_FLOAT32)
    avgpool_float(NULL, NULL, crun_tensor_data(gy), crun_tensor_data(gx), xd[0] * xd[1], xd, yd, g, count_include_pad);
  else
    avgpool_double(NULL, NULL, crun_tensor_data(gy), crun_tensor_data(gx), xd[0] * xd[1], xd, yd, g, count_include_pad);
  return 0;
}
