/* launch_host.c — the launch API of runtime/cuda/launch.h carried out on the
 * host, for the double build (tests/gpu_double/): "device memory" is host
 * memory there, so each launcher runs the same per-element bodies as the
 * CUDA kernels in plain loops (reductions fold sequentially, which is the
 * CPU kernels' order) and GEMM goes through OpenBLAS. Streams are ignored:
 * every launch has finished when it returns. Never linked into libcrunrt. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels/elementwise.h"
#include "cuda/kernels/nn.h"
#include "cuda/kernels/optim.h"
#include "cuda/kernels/philox.h"
#include "cuda/kernels/reduce.h"
#include "cuda/launch_check.h"

#if CRUN_GPU_DOUBLE
#include <cuda_runtime_api.h>
/* The double's streams run queued work on worker threads: a launcher first
 * waits for what its stream holds, then runs at once, so it keeps its place
 * in the stream's order. (Compiled into c.test_cuda_kernels without the
 * double, the launchers just run.) */
#define SYNC(stream)                                                           \
  do {                                                                         \
    cudaError_t e_ = cudaStreamSynchronize((cudaStream_t)(stream));            \
    if (e_ != cudaSuccess)                                                     \
      return crun_error(CRUN_EIO, "launch: cudaStreamSynchronize failed: %s", cudaGetErrorString(e_)); \
  } while (0)
#else
#define SYNC(stream) ((void)0)
#endif

#define PTRS(...) (const void *const[]){__VA_ARGS__}
#define NPTRS(...) (int)(sizeof((const void *[]){__VA_ARGS__}) / sizeof(void *))
#define CHECK_N(what, n, ...) CRUN_CHECK(crun__lc_count(what, n, NPTRS(__VA_ARGS__), PTRS(__VA_ARGS__)))

int crun__cuda_fill(crun_dtype_t dt, void *dst, int64_t n, double v, void *stream) {
  SYNC(stream);
  CHECK_N("fill", n, dst);
  if ((unsigned)dt >= CRUN_DTYPE_COUNT) return crun_error(CRUN_EINVAL, "fill: bad dtype %d", (int)dt);
  unsigned char one[8];
  crun__k_set_f64((int)dt, one, 0, v);
  size_t es = crun_dtype_size(dt);
  for (int64_t i = 0; i < n; i++) memcpy((char *)dst + (size_t)i * es, one, es);
  return 0;
}

int crun__cuda_copy(crun_dtype_t ddt, void *dst, const crun__kgeo_t *dg, crun_dtype_t sdt,
                    const void *src, const crun__kgeo_t *sg, void *stream) {
  SYNC(stream);
  int64_t n = 0, ns = 0;
  CRUN_CHECK(crun__lc_geo("copy", dg, &n));
  CRUN_CHECK(crun__lc_geo("copy", sg, &ns));
  if (n != ns || dg->ndim != sg->ndim) return crun_error(CRUN_EINVAL, "copy: geometries differ in shape");
  CHECK_N("copy", n, dst, src);
  for (int64_t i = 0; i < n; i++)
    crun__k_cast((int)ddt, dst, crun__k_offset(dg, i), (int)sdt, src, crun__k_offset(sg, i));
  return 0;
}

/* Runs the binary body of dtype dt over n elements. */
static void binary_loop(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, const crun__kgeo_t *ga,
                        const void *b, const crun__kgeo_t *gb, int rev, int64_t n) {
#define BL(tn, T) for (int64_t i = 0; i < n; i++) crun__k_binary_##tn(op, out, a, ga, b, gb, i, rev); break
  switch (dt) {
    case CRUN_FLOAT32: BL(f32, float);
    case CRUN_FLOAT64: BL(f64, double);
    case CRUN_INT32: BL(i32, int32_t);
    case CRUN_INT64: BL(i64, int64_t);
    case CRUN_UINT8: BL(u8, uint8_t);
    case CRUN_INT8: BL(i8, int8_t);
    default: BL(i16, int16_t);
  }
#undef BL
}

int crun__cuda_binary(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, const crun__kgeo_t *ga,
                      const void *b, const crun__kgeo_t *gb, int reverse, void *stream) {
  SYNC(stream);
  int64_t n = 0, nb = 0;
  CRUN_CHECK(crun__lc_binop(op, dt));
  CRUN_CHECK(crun__lc_geo("binary", ga, &n));
  CRUN_CHECK(crun__lc_geo("binary", gb, &nb));
  if (n != nb || ga->ndim != gb->ndim) return crun_error(CRUN_EINVAL, "binary: geometries differ in shape");
  CHECK_N(crun_binop_name(op), n, out, a, b);
  binary_loop(op, dt, out, a, ga, b, gb, reverse, n);
  return 0;
}

int crun__cuda_binary_scalar(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n,
                             double s, int reverse, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_binop(op, dt));
  CHECK_N(crun_binop_name(op), n, out, a);
  _Alignas(8) unsigned char one[8];
  CRUN_CHECK(crun__lc_scalar(crun_binop_name(op), dt, s, one));
  crun__kgeo_t ga = {1, {n}, {1}}, gb = {1, {n}, {0}};
  binary_loop(op, dt, out, a, &ga, one, &gb, reverse, n);
  return 0;
}

int crun__cuda_unary(crun_unop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n, void *stream) {
  SYNC(stream);
  if ((unsigned)op >= CRUN_UNOP_COUNT) return crun_error(CRUN_EINVAL, "bad unary op %d", (int)op);
  CRUN_CHECK(crun__lc_float(crun_unop_name(op), dt));
  CHECK_N(crun_unop_name(op), n, out, a);
  for (int64_t i = 0; i < n; i++) {
    if (dt == CRUN_FLOAT32) ((float *)out)[i] = crun__k_unary_f32(op, ((const float *)a)[i]);
    else ((double *)out)[i] = crun__k_unary_f64(op, ((const double *)a)[i]);
  }
  return 0;
}

int crun__cuda_clamp(crun_dtype_t dt, void *out, const void *a, int64_t n, double lo, double hi, void *stream) {
  SYNC(stream);
  if (lo > hi) return crun_error(CRUN_EINVAL, "clamp: min %g > max %g", lo, hi);
  CRUN_CHECK(crun__lc_float("clamp", dt));
  CHECK_N("clamp", n, out, a);
  for (int64_t i = 0; i < n; i++) {
    if (dt == CRUN_FLOAT32) ((float *)out)[i] = crun__k_clamp_f32(((const float *)a)[i], (float)lo, (float)hi);
    else ((double *)out)[i] = crun__k_clamp_f64(((const double *)a)[i], lo, hi);
  }
  return 0;
}

int crun__cuda_reduce_dim(crun_dimred_t op, crun_dtype_t dt, const void *a, int64_t outer, int64_t n,
                          int64_t inner, void *values, crun_dtype_t vdt, int64_t *indices, int64_t base,
                          void *stream) {
  SYNC(stream);
  int64_t total = 0;
  if ((unsigned)op >= CRUN_DIMRED_COUNT) return crun_error(CRUN_EINVAL, "bad reduction %d", (int)op);
  int64_t all = 0;
  CRUN_CHECK(crun__lc_slices("reduce", outer, n, inner, &all));
  total = outer * inner; /* <= all, or n == 0 */
  if (n == 0 && crun__mul_i64(outer, inner, &total))
    return crun_error(CRUN_EINVAL, "reduce: bad sizes %lld x 0 x %lld", (long long)outer, (long long)inner);
  CHECK_N("reduce", total, values);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      crun__kacc_t acc = crun__k_red_init(op);
      for (int64_t k = 0; k < n; k++) crun__k_red_fold(op, dt, &acc, a, (o * n + k) * inner + j, k);
      crun__k_red_store(op, dt, &acc, n, values, vdt, indices, o * inner + j, base);
    }
  return 0;
}

int crun__cuda_softmax(crun_dtype_t dt, const void *a, void *out, int64_t outer, int64_t n, int64_t inner,
                       int use_log, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float(use_log ? "log_softmax" : "softmax", dt));
  int64_t total = 0;
  CRUN_CHECK(crun__lc_slices("softmax", outer, n, inner, &total));
  CRUN_CHECK(crun__lc_count("softmax", total, 2, PTRS(a, out)));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) crun__k_softmax_slice(dt, a, out, o * n * inner + j, n, inner, use_log);
  return 0;
}

/* Runs STMT_F32 or STMT_F64 (each using i) for i < n by dtype. */
#define BY_DT(dt, n, F32, F64)                                                 \
  do {                                                                         \
    if ((dt) == CRUN_FLOAT32)                                                  \
      for (int64_t i = 0; i < (n); i++) { F32; }                               \
    else                                                                       \
      for (int64_t i = 0; i < (n); i++) { F64; }                               \
  } while (0)

int crun__cuda_act_forward(crun_act_t act, crun_dtype_t dt, const void *x, void *y, int64_t n, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("activation forward", dt));
  CHECK_N("activation forward", n, x, y);
  BY_DT(dt, n, crun__k_act_fwd_f32(act, x, y, i), crun__k_act_fwd_f64(act, x, y, i));
  return 0;
}

int crun__cuda_act_backward(crun_act_t act, crun_dtype_t dt, const void *y, const void *gy, void *gx,
                            int64_t n, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("activation backward", dt));
  CHECK_N("activation backward", n, y, gy, gx);
  BY_DT(dt, n, crun__k_act_bwd_f32(act, y, gy, gx, i), crun__k_act_bwd_f64(act, y, gy, gx, i));
  return 0;
}

int crun__cuda_log_softmax_forward(crun_dtype_t dt, const void *x, void *y, int64_t rows, int64_t c,
                                   void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("LogSoftMax forward", dt));
  if (c == 0) return 0;
  CHECK_N("LogSoftMax forward", rows, x, y);
  BY_DT(dt, rows, crun__k_lsm_fwd_f32(x, y, i, c), crun__k_lsm_fwd_f64(x, y, i, c));
  return 0;
}

int crun__cuda_log_softmax_backward(crun_dtype_t dt, const void *y, const void *gy, void *gx, int64_t rows,
                                    int64_t c, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("LogSoftMax backward", dt));
  if (c == 0) return 0;
  CHECK_N("LogSoftMax backward", rows, y, gy, gx);
  BY_DT(dt, rows, crun__k_lsm_bwd_f32(y, gy, gx, i, c), crun__k_lsm_bwd_f64(y, gy, gx, i, c));
  return 0;
}

int crun__cuda_bias_grad(crun_dtype_t dt, void *gb, const void *gy, int64_t n, int64_t out, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("Linear backward", dt));
  if (out == 0) return 0;
  CHECK_N("Linear backward", out, gb, n ? gy : gb);
  BY_DT(dt, out, crun__k_bias_grad_f32(gb, gy, n, out, i), crun__k_bias_grad_f64(gb, gy, n, out, i));
  return 0;
}

int crun__cuda_mul(crun_dtype_t dt, const void *a, const void *b, void *y, int64_t n, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("mul", dt));
  CHECK_N("mul", n, a, b, y);
  BY_DT(dt, n, crun__k_mul_f32(a, b, y, i), crun__k_mul_f64(a, b, y, i));
  return 0;
}

int crun__cuda_dropout(crun_dtype_t dt, const void *x, void *y, void *mask, int64_t n, double p,
                       uint64_t seed, uint64_t offset, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("Dropout forward", dt));
  if (!(p >= 0 && p < 1)) return crun_error(CRUN_EINVAL, "Dropout: p must be in [0, 1), got %g", p);
  CHECK_N("Dropout forward", n, x, y, mask);
  double keep = 1.0 / (1.0 - p);
  BY_DT(dt, n, crun__k_dropout_f32(x, y, mask, i, p, keep, seed, offset),
        crun__k_dropout_f64(x, y, mask, i, p, keep, seed, offset));
  return 0;
}

/* Checks every label first (as the CPU does), then runs ROW for each row r
 * with its 0-based label l. */
#define LABEL_ROWS(fn, lt, labels, rows, c, ROW)                               \
  do {                                                                         \
    for (int64_t r = 0; r < (rows); r++)                                       \
      if (crun__k_label((int)(lt), labels, r, c) < 0)                          \
        return crun__lc_bad_label(fn, (lt) == CRUN_INT64 ? ((const int64_t *)(labels))[r] \
                                                         : ((const int32_t *)(labels))[r], r, c); \
    for (int64_t r = 0; r < (rows); r++) {                                     \
      int64_t l = crun__k_label((int)(lt), labels, r, c);                      \
      ROW;                                                                     \
    }                                                                          \
  } while (0)

int crun__cuda_cross_entropy(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels, int64_t rows,
                             int64_t c, double scale, void *grad, double *loss, int64_t *correct, void *stream) {
  SYNC(stream);
  static const char *fn = "CrossEntropy";
  CRUN_CHECK(crun__lc_float(fn, dt));
  CRUN_CHECK(crun__lc_label_dtype(fn, lt));
  if (c <= 0) return crun_error(CRUN_EINVAL, "%s: input has 0 classes", fn);
  CHECK_N(fn, rows, x, labels);
  double total = 0;
  int64_t ok = 0, am;
  LABEL_ROWS(fn, lt, labels, rows, c, {
    total += dt == CRUN_FLOAT32 ? crun__k_ce_row_f32(x, r, c, l, grad, scale, &am)
                                : crun__k_ce_row_f64(x, r, c, l, grad, scale, &am);
    ok += am == l;
  });
  if (loss) *loss = total * scale;
  if (correct) *correct = ok;
  return 0;
}

int crun__cuda_nll(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels, int64_t rows, int64_t c,
                   double scale, void *grad, double *loss, void *stream) {
  SYNC(stream);
  static const char *fn = "ClassNLLCriterion";
  CRUN_CHECK(crun__lc_float(fn, dt));
  CRUN_CHECK(crun__lc_label_dtype(fn, lt));
  CHECK_N(fn, rows, x, labels);
  double total = 0;
  LABEL_ROWS(fn, lt, labels, rows, c, {
    total += dt == CRUN_FLOAT32 ? crun__k_nll_row_f32(x, r, c, l, grad, scale)
                                : crun__k_nll_row_f64(x, r, c, l, grad, scale);
  });
  if (loss) *loss = total * scale;
  return 0;
}

int crun__cuda_mse(crun_dtype_t dt, const void *x, const void *t, int64_t n, void *grad, double *loss,
                   void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("MSE", dt));
  CHECK_N("MSE", n, x, t);
  double s = 0, k = n ? 2.0 / (double)n : 0;
  BY_DT(dt, n, s += crun__k_mse_f32(x, t, grad, i, k), s += crun__k_mse_f64(x, t, grad, i, k));
  if (loss) *loss = n ? s / (double)n : 0;
  return 0;
}

int crun__cuda_sgd(crun_dtype_t dt, void *p, const void *g, void *buf, int64_t n, const crun_sgd_opts_t *o,
                   int first, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("SGD step", dt));
  if (o->momentum != 0 && !buf) return crun_error(CRUN_EINVAL, "SGD step: momentum needs a buffer");
  CHECK_N("SGD step", n, p, g);
  crun__ksgd_t s = crun__k_sgd_consts(o, o->momentum != 0, first);
  BY_DT(dt, n, crun__k_sgd_f32(p, g, buf, i, &s), crun__k_sgd_f64(p, g, buf, i, &s));
  return 0;
}

int crun__cuda_adam(crun_dtype_t dt, void *p, const void *g, void *m, void *v, void *vmax, int64_t n,
                    int64_t step, const crun_adam_opts_t *o, void *stream) {
  SYNC(stream);
  CRUN_CHECK(crun__lc_float("Adam step", dt));
  if (step < 1) return crun_error(CRUN_EINVAL, "Adam step: step must be >= 1, got %lld", (long long)step);
  if (o->amsgrad && !vmax) return crun_error(CRUN_EINVAL, "Adam step: amsgrad needs max_exp_avg_sq");
  CHECK_N("Adam step", n, p, g, m, v);
  crun__kadam_t a = crun__k_adam_consts(o, step);
  BY_DT(dt, n, crun__k_adam_f32(p, g, m, v, vmax, i, &a), crun__k_adam_f64(p, g, m, v, vmax, i, &a));
  return 0;
}

/* Converts a 16-bit float matrix to float32 (rows x cols, leading dim ld;
 * the gaps between rows are left zero). */
static float *widen(crun_dtype_t dt, const void *src, int64_t rows, int64_t cols, int64_t ld) {
  float *w = calloc((size_t)(rows * ld > 0 ? rows * ld : 1), sizeof *w);
  for (int64_t r = 0; w && r < rows; r++)
    for (int64_t j = 0; j < cols; j++) w[r * ld + j] = (float)crun__k_get_f64(dt, src, r * ld + j);
  return w;
}

int crun__cuda_gemm(crun_dtype_t dt, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                    const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc,
                    void *stream) {
  SYNC(stream);
  if (m < 0 || n < 0 || k < 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    return crun_error(CRUN_ERANGE, "gemm: dims %lld x %lld x %lld out of range", (long long)m, (long long)n,
                      (long long)k);
  if (m == 0 || n == 0) return 0;
  CHECK_N("gemm", 1, A, B, C);
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (dt == CRUN_FLOAT32) {
    cblas_sgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, (float)alpha, A, (int)lda, B, (int)ldb,
                (float)beta, C, (int)ldc);
  } else if (dt == CRUN_FLOAT64) {
    cblas_dgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, alpha, A, (int)lda, B, (int)ldb, beta, C,
                (int)ldc);
  } else if (dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16) {
    /* float32 accumulation, rounded once into C: CUBLAS_COMPUTE_32F's contract */
    float *a = widen(dt, A, ta ? k : m, ta ? m : k, lda), *b = widen(dt, B, tb ? n : k, tb ? k : n, ldb);
    float *c = widen(dt, C, m, n, ldc);
    int rc = 0;
    if (!a || !b || !c) {
      rc = crun_error(CRUN_ENOMEM, "gemm: out of memory widening %s operands", crun_dtype_name(dt));
    } else {
      cblas_sgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, (float)alpha, a, (int)lda, b, (int)ldb,
                  (float)beta, c, (int)ldc);
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) crun__k_set_f64(dt, C, i * ldc + j, c[i * ldc + j]);
    }
    free(a); free(b); free(c);
    return rc;
  } else {
    return crun_error(CRUN_ENOTSUP, "gemm needs float32, float64, float16 or bfloat16, got %s",
                      crun_dtype_name(dt));
  }
  return 0;
}

void crun__cuda_math_shutdown(void) {}
