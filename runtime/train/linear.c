/* linear.c — y = x W^T + b and its backward through BLAS (sgemm/dgemm). */
#include "tensor/blas_lib.h"
#include <stdlib.h>
#include <unistd.h>

#include "cuda/dispatch.h"
#include "train/check.h"

/* Checks x [N, in], w [out, in] and returns N, in, out. */
static int linear_dims(const char *fn, const crun_tensor_t *x, const crun_tensor_t *w,
                       int64_t *n, int64_t *in, int64_t *out) {
  int64_t win;
  char sx[64], sw[64];
  CRUN_CHECK(crun__train_check_2d(fn, "input", x, n, in));
  CRUN_CHECK(crun__train_check_2d(fn, "weight", w, out, &win));
  if (win != *in || crun_tensor_dtype(x) != crun_tensor_dtype(w))
    return crun_error(CRUN_EINVAL, "%s: input %s %s does not match weight %s %s (in_features %lld)",
                      fn, crun_dtype_name(crun_tensor_dtype(x)), crun__train_shape_str(x, sx, sizeof sx),
                      crun_dtype_name(crun_tensor_dtype(w)), crun__train_shape_str(w, sw, sizeof sw),
                      (long long)win);
  return 0;
}

/* Checks that t is float, of x's dtype, with exactly `numel` elements. */
static int check_sized(const char *fn, const char *arg, const crun_tensor_t *x,
                       const crun_tensor_t *t, int64_t numel) {
  CRUN_CHECK(crun__train_check_float(fn, arg, t));
  char s[64];
  if (crun_tensor_dtype(t) != crun_tensor_dtype(x) || crun_tensor_numel(t) != numel)
    return crun_error(CRUN_EINVAL, "%s: %s is %s %s, expected %s with %lld elements", fn, arg,
                      crun_dtype_name(crun_tensor_dtype(t)), crun__train_shape_str(t, s, sizeof s),
                      crun_dtype_name(crun_tensor_dtype(x)), (long long)numel);
  return 0;
}

/* Copies b into every row of y [n, out]. */
static void fill_rows(crun_dtype_t dt, void *y, const void *b, int64_t n, int64_t out) {
  for (int64_t i = 0; i < n; i++) {
    if (dt == CRUN_FLOAT32)
      for (int64_t j = 0; j < out; j++) ((float *)y)[i * out + j] = b ? ((const float *)b)[j] : 0.f;
    else
      for (int64_t j = 0; j < out; j++) ((double *)y)[i * out + j] = b ? ((const double *)b)[j] : 0.;
  }
}

int crun_nn_linear_forward(const crun_tensor_t *x, const crun_tensor_t *w,
                           const crun_tensor_t *b, crun_tensor_t *y) {
  static const char *fn = "Linear forward";
  int64_t n, in, out;
  CRUN_CHECK(linear_dims(fn, x, w, &n, &in, &out));
  if (b) CRUN_CHECK(check_sized(fn, "bias", x, b, out));
  CRUN_CHECK(check_sized(fn, "output", x, y, n * out));
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(w) || CRUN__ON_DEV(b) || CRUN__ON_DEV(y)) return crun__dev_linear_forward(x, w, b, y);
  crun_dtype_t dt = crun_tensor_dtype(x);
  fill_rows(dt, crun_tensor_data(y), b ? crun_tensor_data(b) : NULL, n, out);
  if (n == 0 || out == 0 || in == 0) return 0;
  if (dt == CRUN_FLOAT32)
    crun__blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.f,
                     crun_tensor_data(x), (int)in, crun_tensor_data(w), (int)in, 1.f,
                     crun_tensor_data(y), (int)out);
  else
    crun__blas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.,
                     crun_tensor_data(x), (int)in, crun_tensor_data(w), (int)in, 1.,
                     crun_tensor_data(y), (int)out);
  return 0;
}

/* gb[j] += sum_i gy[i, j]. */
static void bias_grad(crun_dtype_t dt, void *gb, const void *gy, int64_t n, int64_t out) {
  for (int64_t i = 0; i < n; i++) {
    if (dt == CRUN_FLOAT32)
      for (int64_t j = 0; j < out; j++) ((float *)gb)[j] += ((const float *)gy)[i * out + j];
    else
      for (int64_t j = 0; j < out; j++) ((double *)gb)[j] += ((const double *)gy)[i * out + j];
  }
}

/* C[m, k] = alpha op(A) op(B) + beta C for either float dtype. */
static void gemm(crun_dtype_t dt, int ta, int tb, int64_t m, int64_t k, int64_t inner,
                 const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c) {
  enum CBLAS_TRANSPOSE A = ta ? CblasTrans : CblasNoTrans, B = tb ? CblasTrans : CblasNoTrans;
  if (dt == CRUN_FLOAT32)
    crun__blas_sgemm(CblasRowMajor, A, B, (int)m, (int)k, (int)inner, 1.f, a, (int)lda, b, (int)ldb,
                     (float)beta, c, (int)k);
  else
    crun__blas_dgemm(CblasRowMajor, A, B, (int)m, (int)k, (int)inner, 1., a, (int)lda, b, (int)ldb,
                     beta, c, (int)k);
}

int crun_nn_linear_backward(const crun_tensor_t *x, const crun_tensor_t *w,
                            const crun_tensor_t *gy, crun_tensor_t *gx,
                            crun_tensor_t *gw, crun_tensor_t *gb) {
  static const char *fn = "Linear backward";
  int64_t n, in, out;
  CRUN_CHECK(linear_dims(fn, x, w, &n, &in, &out));
  CRUN_CHECK(check_sized(fn, "gradOutput", x, gy, n * out));
  if (gx) CRUN_CHECK(check_sized(fn, "gradInput", x, gx, n * in));
  if (gw) CRUN_CHECK(check_sized(fn, "gradWeight", x, gw, out * in));
  if (gb) CRUN_CHECK(check_sized(fn, "gradBias", x, gb, out));
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(w) || CRUN__ON_DEV(gy) || CRUN__ON_DEV(gx) || CRUN__ON_DEV(gw) || CRUN__ON_DEV(gb))
    return crun__dev_linear_backward(x, w, gy, gx, gw, gb);
  crun_dtype_t dt = crun_tensor_dtype(x);
  if (gx) {
    if (out == 0) fill_rows(dt, crun_tensor_data(gx), NULL, n, in);
    else if (n && in)
      gemm(dt, 0, 0, n, in, out, crun_tensor_data(gy), out, crun_tensor_data(w), in, 0.,
           crun_tensor_data(gx));
  }
  if (gw && n && out && in)
    gemm(dt, 1, 0, out, in, n, crun_tensor_data(gy), out, crun_tensor_data(x), in, 1.,
         crun_tensor_data(gw));
  if (gb) bias_grad(dt, crun_tensor_data(gb), crun_tensor_data(gy), n, out);
  return 0;
}

int crun_blas_set_threads(int n) {
  /* the user's setting wins; crun-lua's OMP_NUM_THREADS=1 (CRUN_OMP_DEFAULTED) does not */
  int omp_user = getenv("OMP_NUM_THREADS") && !crun_env_int("CRUN_OMP_DEFAULTED", 0);
  if (n <= 0 && (getenv("OPENBLAS_NUM_THREADS") || omp_user)) return crun__blas_get_threads();
  if (n <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long local = crun_env_int("LOCAL_WORLD_SIZE", 1);
    n = (int)(cores > 0 && local > 0 ? cores / local : 1);
    if (n < 1) n = 1;
  }
  crun__blas_set_threads(n);
  CRUN_LOG(INFO, DDP, "BLAS uses %d thread(s)", crun__blas_get_threads());
  return crun__blas_get_threads();
}
