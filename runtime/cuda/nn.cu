/* nn.cu — activations, log-softmax (one thread per row), element-wise mul,
 * Dropout (Philox per element) and the SGD / Adam steps: grid-stride loops
 * over the bodies of kernels/nn.h, philox.h and optim.h. */
#include "cuda/kernels/nn.h"
#include "cuda/kernels/optim.h"
#include "cuda/kernels/philox.h"
#include "cuda/launch_cuda.cuh"

#define K_NN(tn, T)                                                                                       \
  __global__ void k_act_fwd_##tn(int act, const T *x, T *y, int64_t n) {                                  \
    CRUN_K_FOR(i, n) crun__k_act_fwd_##tn(act, x, y, i);                                                  \
  }                                                                                                       \
  __global__ void k_act_bwd_##tn(int act, const T *y, const T *gy, T *gx, int64_t n) {                    \
    CRUN_K_FOR(i, n) crun__k_act_bwd_##tn(act, y, gy, gx, i);                                             \
  }                                                                                                       \
  __global__ void k_lsm_fwd_##tn(const T *x, T *y, int64_t rows, int64_t c) {                             \
    CRUN_K_FOR(r, rows) crun__k_lsm_fwd_##tn(x, y, r, c);                                                 \
  }                                                                                                       \
  __global__ void k_lsm_bwd_##tn(const T *y, const T *gy, T *gx, int64_t rows, int64_t c) {               \
    CRUN_K_FOR(r, rows) crun__k_lsm_bwd_##tn(y, gy, gx, r, c);                                            \
  }                                                                                                       \
  __global__ void k_bias_grad_##tn(T *gb, const T *gy, int64_t n, int64_t out) {                       \
    CRUN_K_FOR(j, out) crun__k_bias_grad_##tn(gb, gy, n, out, j);                                         \
  }                                                                                                       \
  __global__ void k_mul_##tn(const T *a, const T *b, T *y, int64_t n) {                                   \
    CRUN_K_FOR(i, n) crun__k_mul_##tn(a, b, y, i);                                                        \
  }                                                                                                       \
  __global__ void k_dropout_##tn(const T *x, T *y, T *mask, int64_t n, double p, double keep, uint64_t seed, \
                                 uint64_t offset) {                                                       \
    CRUN_K_FOR(i, n) crun__k_dropout_##tn(x, y, mask, i, p, keep, seed, offset);                          \
  }                                                                                                       \
  __global__ void k_sgd_##tn(T *p, const T *g, T *buf, int64_t n, crun__ksgd_t s) {                        \
    CRUN_K_FOR(i, n) crun__k_sgd_##tn(p, g, buf, i, &s);                                                  \
  }                                                                                                       \
  __global__ void k_adam_##tn(T *p, const T *g, T *m, T *v, T *vmax, int64_t n, crun__kadam_t a) {         \
    CRUN_K_FOR(i, n) crun__k_adam_##tn(p, g, m, v, vmax, i, &a);                                          \
  }
K_NN(f32, float)
K_NN(f64, double)

/* Launches k_<name>_f32 or _f64 over `count` items with the given arguments
 * (pointer arguments cast by the caller through F / D). */
#define LAUNCH(dt, count, stream, name, ...)                                                             \
  do {                                                                                                   \
    if ((dt) == CRUN_FLOAT32) {                                                                          \
      typedef float T;                                                                                   \
      k_##name##_f32<<<crun__k_blocks(count), CRUN_K_THREADS, 0, CRUN_K_STREAM(stream)>>>(__VA_ARGS__); \
    } else {                                                                                             \
      typedef double T;                                                                                  \
      k_##name##_f64<<<crun__k_blocks(count), CRUN_K_THREADS, 0, CRUN_K_STREAM(stream)>>>(__VA_ARGS__); \
    }                                                                                                    \
  } while (0)

extern "C" int crun__cuda_act_forward(crun_act_t act, crun_dtype_t dt, const void *x, void *y, int64_t n,
                                      void *stream) {
  CRUN_CHECK(crun__lc_float("activation forward", dt));
  CRUN_K_CHECK_N("activation forward", n, x, y);
  if (n == 0) return 0;
  LAUNCH(dt, n, stream, act_fwd, (int)act, (const T *)x, (T *)y, n);
  return crun__k_launched("activation forward");
}

extern "C" int crun__cuda_act_backward(crun_act_t act, crun_dtype_t dt, const void *y, const void *gy, void *gx,
                                       int64_t n, void *stream) {
  CRUN_CHECK(crun__lc_float("activation backward", dt));
  CRUN_K_CHECK_N("activation backward", n, y, gy, gx);
  if (n == 0) return 0;
  LAUNCH(dt, n, stream, act_bwd, (int)act, (const T *)y, (const T *)gy, (T *)gx, n);
  return crun__k_launched("activation backward");
}

extern "C" int crun__cuda_log_softmax_forward(crun_dtype_t dt, const void *x, void *y, int64_t rows, int64_t c,
                                              void *stream) {
  CRUN_CHECK(crun__lc_float("LogSoftMax forward", dt));
  if (c == 0 || rows == 0) return 0;
  CRUN_K_CHECK_N("LogSoftMax forward", rows, x, y);
  LAUNCH(dt, rows, stream, lsm_fwd, (const T *)x, (T *)y, rows, c);
  return crun__k_launched("LogSoftMax forward");
}

extern "C" int crun__cuda_log_softmax_backward(crun_dtype_t dt, const void *y, const void *gy, void *gx,
                                               int64_t rows, int64_t c, void *stream) {
  CRUN_CHECK(crun__lc_float("LogSoftMax backward", dt));
  if (c == 0 || rows == 0) return 0;
  CRUN_K_CHECK_N("LogSoftMax backward", rows, y, gy, gx);
  LAUNCH(dt, rows, stream, lsm_bwd, (const T *)y, (const T *)gy, (T *)gx, rows, c);
  return crun__k_launched("LogSoftMax backward");
}

extern "C" int crun__cuda_bias_grad(crun_dtype_t dt, void *gb, const void *gy, int64_t n, int64_t out,
                                    void *stream) {
  CRUN_CHECK(crun__lc_float("Linear backward", dt));
  if (out == 0) return 0;
  CRUN_K_CHECK_N("Linear backward", out, gb, n ? gy : gb);
  LAUNCH(dt, out, stream, bias_grad, (T *)gb, (const T *)gy, n, out);
  return crun__k_launched("Linear backward");
}

extern "C" int crun__cuda_mul(crun_dtype_t dt, const void *a, const void *b, void *y, int64_t n, void *stream) {
  CRUN_CHECK(crun__lc_float("mul", dt));
  CRUN_K_CHECK_N("mul", n, a, b, y);
  if (n == 0) return 0;
  LAUNCH(dt, n, stream, mul, (const T *)a, (const T *)b, (T *)y, n);
  return crun__k_launched("mul");
}

extern "C" int crun__cuda_dropout(crun_dtype_t dt, const void *x, void *y, void *mask, int64_t n, double p,
                                  uint64_t seed, uint64_t offset, void *stream) {
  CRUN_CHECK(crun__lc_float("Dropout forward", dt));
  if (!(p >= 0 && p < 1)) return crun_error(CRUN_EINVAL, "Dropout: p must be in [0, 1), got %g", p);
  CRUN_K_CHECK_N("Dropout forward", n, x, y, mask);
  if (n == 0) return 0;
  LAUNCH(dt, n, stream, dropout, (const T *)x, (T *)y, (T *)mask, n, p, 1.0 / (1.0 - p), seed, offset);
  return crun__k_launched("Dropout forward");
}

extern "C" int crun__cuda_sgd(crun_dtype_t dt, void *p, const void *g, void *buf, int64_t n,
                              const crun_sgd_opts_t *o, int first, void *stream) {
  CRUN_CHECK(crun__lc_float("SGD step", dt));
  if (o->momentum != 0 && !buf) return crun_error(CRUN_EINVAL, "SGD step: momentum needs a buffer");
  CRUN_K_CHECK_N("SGD step", n, p, g);
  if (n == 0) return 0;
  crun__ksgd_t s = crun__k_sgd_consts(o, o->momentum != 0, first);
  LAUNCH(dt, n, stream, sgd, (T *)p, (const T *)g, (T *)buf, n, s);
  return crun__k_launched("SGD step");
}

extern "C" int crun__cuda_adam(crun_dtype_t dt, void *p, const void *g, void *m, void *v, void *vmax, int64_t n,
                               int64_t step, const crun_adam_opts_t *o, void *stream) {
  CRUN_CHECK(crun__lc_float("Adam step", dt));
  if (step < 1) return crun_error(CRUN_EINVAL, "Adam step: step must be >= 1, got %lld", (long long)step);
  if (o->amsgrad && !vmax) return crun_error(CRUN_EINVAL, "Adam step: amsgrad needs max_exp_avg_sq");
  CRUN_K_CHECK_N("Adam step", n, p, g, m, v);
  if (n == 0) return 0;
  crun__kadam_t a = crun__k_adam_consts(o, step);
  LAUNCH(dt, n, stream, adam, (T *)p, (const T *)g, (T *)m, (T *)v, (T *)vmax, n, a);
  return crun__k_launched("Adam step");
}
