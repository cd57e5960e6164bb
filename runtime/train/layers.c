/* layers.c — element-wise activations, log-softmax, dropout and their
 * backward passes, for float32 and float64 (one loop per dtype, generated). */
#include <math.h>
#include <string.h>

#include "cuda/dispatch.h"
#include "train/check.h"

int crun_act_parse(const char *name, crun_act_t *out) {
  if (name && strcmp(name, "relu") == 0) *out = CRUN_ACT_RELU;
  else if (name && strcmp(name, "tanh") == 0) *out = CRUN_ACT_TANH;
  else if (name && strcmp(name, "sigmoid") == 0) *out = CRUN_ACT_SIGMOID;
  else return crun_error(CRUN_EINVAL, "unknown activation '%s' (relu, tanh, sigmoid)", name ? name : "(null)");
  return 0;
}

#define ACT_LOOPS(T, EXP, TANH)                                                       \
  static void act_fwd_##T(crun_act_t a, const T *x, T *y, int64_t n) {                \
    if (a == CRUN_ACT_RELU)                                                           \
      for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? (T)0 : x[i]; /* NaN stays */  \
    else if (a == CRUN_ACT_TANH)                                                      \
      for (int64_t i = 0; i < n; i++) y[i] = TANH(x[i]);                              \
    else                                                                              \
      for (int64_t i = 0; i < n; i++)                                                 \
        y[i] = x[i] >= 0 ? (T)1 / ((T)1 + EXP(-x[i])) : EXP(x[i]) / ((T)1 + EXP(x[i])); \
  }                                                                                   \
  static void act_bwd_##T(crun_act_t a, const T *y, const T *gy, T *gx, int64_t n) {  \
    if (a == CRUN_ACT_RELU)                                                           \
      for (int64_t i = 0; i < n; i++) gx[i] = y[i] <= 0 ? (T)0 : gy[i];               \
    else if (a == CRUN_ACT_TANH)                                                      \
      for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * ((T)1 - y[i] * y[i]);           \
    else                                                                              \
      for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * y[i] * ((T)1 - y[i]);           \
  }
ACT_LOOPS(float, expf, tanhf)
ACT_LOOPS(double, exp, tanh)

int crun_nn_act_forward(crun_act_t act, const crun_tensor_t *x, crun_tensor_t *y) {
  CRUN_CHECK(crun__train_check_float("activation forward", "input", x));
  CRUN_CHECK(crun__train_check_like("activation forward", "output", x, y));
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(y)) return crun__dev_act_forward(act, x, y);
  int64_t n = crun_tensor_numel(x);
  if (crun_tensor_dtype(x) == CRUN_FLOAT32) act_fwd_float(act, crun_tensor_data(x), crun_tensor_data(y), n);
  else act_fwd_double(act, crun_tensor_data(x), crun_tensor_data(y), n);
  return 0;
}

int crun_nn_act_backward(crun_act_t act, const crun_tensor_t *y, const crun_tensor_t *gy,
                         crun_tensor_t *gx) {
  CRUN_CHECK(crun__train_check_float("activation backward", "output", y));
  CRUN_CHECK(crun__train_check_like("activation backward", "gradOutput", y, gy));
  CRUN_CHECK(crun__train_check_like("activation backward", "gradInput", y, gx));
  if (CRUN__ON_DEV(y) || CRUN__ON_DEV(gy) || CRUN__ON_DEV(gx)) return crun__dev_act_backward(act, y, gy, gx);
  int64_t n = crun_tensor_numel(y);
  if (crun_tensor_dtype(y) == CRUN_FLOAT32)
    act_bwd_float(act, crun_tensor_data(y), crun_tensor_data(gy), crun_tensor_data(gx), n);
  else
    act_bwd_double(act, crun_tensor_data(y), crun_tensor_data(gy), crun_tensor_data(gx), n);
  return 0;
}

#define LSM_LOOPS(T, EXP, LOG)                                                       \
  static void lsm_fwd_##T(const T *x, T *y, int64_t rows, int64_t c) {               \
    for (int64_t r = 0; r < rows; r++) {                                             \
      const T *xr = x + r * c;                                                       \
      T *yr = y + r * c;                                                             \
      T mx = xr[0];                                                                  \
      for (int64_t j = 1; j < c; j++) mx = xr[j] > mx ? xr[j] : mx;                  \
      double s = 0;                                                                  \
      for (int64_t j = 0; j < c; j++) s += EXP(xr[j] - mx);                          \
      T lse = mx + (T)LOG(s);                                                        \
      for (int64_t j = 0; j < c; j++) yr[j] = xr[j] - lse;                           \
    }                                                                                \
  }                                                                                  \
  static void lsm_bwd_##T(const T *y, const T *gy, T *gx, int64_t rows, int64_t c) { \
    for (int64_t r = 0; r < rows; r++) {                                             \
      double s = 0;                                                                  \
      for (int64_t j = 0; j < c; j++) s += gy[r * c + j];                            \
      for (int64_t j = 0; j < c; j++)                                                \
        gx[r * c + j] = gy[r * c + j] - EXP(y[r * c + j]) * (T)s;                    \
    }                                                                                \
  }
LSM_LOOPS(float, expf, log)
LSM_LOOPS(double, exp, log)

int crun_nn_log_softmax_forward(const crun_tensor_t *x, crun_tensor_t *y) {
  int64_t rows, c;
  CRUN_CHECK(crun__train_check_2d("LogSoftMax forward", "input", x, &rows, &c));
  CRUN_CHECK(crun__train_check_like("LogSoftMax forward", "output", x, y));
  if (c == 0) return 0;
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(y)) return crun__dev_log_softmax_forward(x, y);
  if (crun_tensor_dtype(x) == CRUN_FLOAT32) lsm_fwd_float(crun_tensor_data(x), crun_tensor_data(y), rows, c);
  else lsm_fwd_double(crun_tensor_data(x), crun_tensor_data(y), rows, c);
  return 0;
}

int crun_nn_log_softmax_backward(const crun_tensor_t *y, const crun_tensor_t *gy, crun_tensor_t *gx) {
  int64_t rows, c;
  CRUN_CHECK(crun__train_check_2d("LogSoftMax backward", "output", y, &rows, &c));
  CRUN_CHECK(crun__train_check_like("LogSoftMax backward", "gradOutput", y, gy));
  CRUN_CHECK(crun__train_check_like("LogSoftMax backward", "gradInput", y, gx));
  if (CRUN__ON_DEV(y) || CRUN__ON_DEV(gy) || CRUN__ON_DEV(gx)) return crun__dev_log_softmax_backward(y, gy, gx);
  if (crun_tensor_dtype(y) == CRUN_FLOAT32)
    lsm_bwd_float(crun_tensor_data(y), crun_tensor_data(gy), crun_tensor_data(gx), rows, c);
  else
    lsm_bwd_double(crun_tensor_data(y), crun_tensor_data(gy), crun_tensor_data(gx), rows, c);
  return 0;
}

int crun_nn_dropout_forward(const crun_tensor_t *x, crun_tensor_t *y, crun_tensor_t *mask,
                            double p, uint64_t *state) {
  CRUN_CHECK(crun__train_check_float("Dropout forward", "input", x));
  CRUN_CHECK(crun__train_check_like("Dropout forward", "output", x, y));
  CRUN_CHECK(crun__train_check_like("Dropout forward", "mask", x, mask));
  if (!(p >= 0 && p < 1)) return crun_error(CRUN_EINVAL, "Dropout: p must be in [0, 1), got %g", p);
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(y) || CRUN__ON_DEV(mask)) return crun__dev_dropout(x, y, mask, p, state);
  int64_t n = crun_tensor_numel(x);
  double keep = 1.0 / (1.0 - p);
  int f32 = crun_tensor_dtype(x) == CRUN_FLOAT32;
  for (int64_t i = 0; i < n; i++) {
    double u = (double)(crun_splitmix64_next(state) >> 11) * (1.0 / 9007199254740992.0);
    double m = u < p ? 0.0 : keep;
    if (f32) {
      ((float *)crun_tensor_data(mask))[i] = (float)m;
      ((float *)crun_tensor_data(y))[i] = ((const float *)crun_tensor_data(x))[i] * (float)m;
    } else {
      ((double *)crun_tensor_data(mask))[i] = m;
      ((double *)crun_tensor_data(y))[i] = ((const double *)crun_tensor_data(x))[i] * m;
    }
  }
  return 0;
}

int crun_nn_mul(const crun_tensor_t *a, const crun_tensor_t *b, crun_tensor_t *y) {
  CRUN_CHECK(crun__train_check_float("mul", "a", a));
  CRUN_CHECK(crun__train_check_like("mul", "b", a, b));
  CRUN_CHECK(crun__train_check_like("mul", "output", a, y));
  if (CRUN__ON_DEV(a) || CRUN__ON_DEV(b) || CRUN__ON_DEV(y)) return crun__dev_mul(a, b, y);
  int64_t n = crun_tensor_numel(a);
  if (crun_tensor_dtype(a) == CRUN_FLOAT32) {
    const float *pa = crun_tensor_data(a), *pb = crun_tensor_data(b);
    float *py = crun_tensor_data(y);
    for (int64_t i = 0; i < n; i++) py[i] = pa[i] * pb[i];
  } else {
    const double *pa = crun_tensor_data(a), *pb = crun_tensor_data(b);
    double *py = crun_tensor_data(y);
    for (int64_t i = 0; i < n; i++) py[i] = pa[i] * pb[i];
  }
  return 0;
}
