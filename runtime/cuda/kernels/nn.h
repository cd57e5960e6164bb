/* nn.h — the bodies of the nn layers and losses, with the arithmetic of
 * runtime/train/layers.c and loss.c (same types, same order of operations):
 * activations per element, log-softmax and cross entropy per row, MSE and
 * NLL per element / row. F is the math-function suffix of the type. */
#ifndef CRUN_CUDA_KERNELS_NN_H
#define CRUN_CUDA_KERNELS_NN_H

#include "cuda/kernels/common.h"
#include "crun/train.h"

#define CRUN__K_NN(tn, T, F)                                                                   \
  /* y[i] = act(x[i]) for crun_act_t `act` (relu, tanh, sigmoid). */                          \
  CRUN_HD void crun__k_act_fwd_##tn(int act, const T *x, T *y, int64_t i) {                   \
    T v = x[i];                                                                                \
    if (act == CRUN_ACT_RELU) y[i] = v < 0 ? (T)0 : v;                                         \
    else if (act == CRUN_ACT_TANH) y[i] = tanh##F(v);                                          \
    else y[i] = v >= 0 ? (T)1 / ((T)1 + exp##F(-v)) : exp##F(v) / ((T)1 + exp##F(v));          \
  }                                                                                            \
  /* gx[i] from the forward output y and gy. */                                                \
  CRUN_HD void crun__k_act_bwd_##tn(int act, const T *y, const T *gy, T *gx, int64_t i) {     \
    if (act == CRUN_ACT_RELU) gx[i] = y[i] <= 0 ? (T)0 : gy[i];                                \
    else if (act == CRUN_ACT_TANH) gx[i] = gy[i] * ((T)1 - y[i] * y[i]);                       \
    else gx[i] = gy[i] * y[i] * ((T)1 - y[i]);                                                 \
  }                                                                                            \
  /* Row r of y = log_softmax(x) over c columns (max in T, sum in double). */                  \
  CRUN_HD void crun__k_lsm_fwd_##tn(const T *x, T *y, int64_t r, int64_t c) {                 \
    const T *xr = x + r * c;                                                                   \
    T *yr = y + r * c;                                                                         \
    T mx = xr[0];                                                                              \
    for (int64_t j = 1; j < c; j++) mx = xr[j] > mx ? xr[j] : mx;                              \
    double s = 0;                                                                              \
    for (int64_t j = 0; j < c; j++) s += exp##F(xr[j] - mx);                                   \
    T lse = mx + (T)log(s);                                                                    \
    for (int64_t j = 0; j < c; j++) yr[j] = xr[j] - lse;                                       \
  }                                                                                            \
  /* Row r of the log-softmax gradient: gx = gy - exp(y) sum(gy). */                           \
  CRUN_HD void crun__k_lsm_bwd_##tn(const T *y, const T *gy, T *gx, int64_t r, int64_t c) {   \
    double s = 0;                                                                              \
    for (int64_t j = 0; j < c; j++) s += gy[r * c + j];                                        \
    for (int64_t j = 0; j < c; j++) gx[r * c + j] = gy[r * c + j] - exp##F(y[r * c + j]) * (T)s; \
  }                                                                                            \
  /* Cross entropy of row r against 0-based label l: returns -log softmax[l],      \
   * writes scale * (softmax - onehot) into g's row (g nullable), and the row's    \
   * argmax (first of equal values) into *argmax. */                                          \
  CRUN_HD double crun__k_ce_row_##tn(const T *x, int64_t r, int64_t c, int64_t l, T *g,        \
                                     double scale, int64_t *argmax) {                          \
    const T *xr = x + r * c;                                                                   \
    T mx = xr[0];                                                                              \
    int64_t am = 0;                                                                            \
    for (int64_t j = 1; j < c; j++)                                                            \
      if (xr[j] > mx) { mx = xr[j]; am = j; }                                                  \
    double s = 0;                                                                              \
    for (int64_t j = 0; j < c; j++) s += exp##F(xr[j] - mx);                                   \
    double lse = (double)mx + log(s);                                                          \
    if (g) {                                                                                   \
      T *gr = g + r * c;                                                                       \
      for (int64_t j = 0; j < c; j++) gr[j] = (T)(exp((double)xr[j] - lse) * scale);           \
      gr[l] -= (T)scale;                                                                       \
    }                                                                                          \
    *argmax = am;                                                                              \
    return lse - (double)xr[l];                                                                \
  }                                                                                            \
  /* MSE element i: grad[i] = k (x - t) (grad nullable); returns (x - t)^2. */                \
  CRUN_HD double crun__k_mse_##tn(const T *x, const T *t, T *grad, int64_t i, double k) {      \
    double d = (double)x[i] - (double)t[i];                                                    \
    if (grad) grad[i] = (T)(k * d);                                                            \
    return d * d;                                                                              \
  }                                                                                            \
  /* NLL row r with 0-based label l: returns -x[r, l]; with g, writes the row's  \
   * gradient (-scale at l, 0 elsewhere). */                                                   \
  CRUN_HD double crun__k_nll_row_##tn(const T *x, int64_t r, int64_t c, int64_t l, T *g,       \
                                      double scale) {                                          \
    if (g)                                                                                     \
      for (int64_t j = 0; j < c; j++) g[r * c + j] = j == l ? (T)(-scale) : (T)0;              \
    return -(double)x[r * c + l];                                                              \
  }                                                                                            \
  /* Column j of the bias gradient: gb[j] += gy[i, j] for i < n, in order, in T. */         \
  CRUN_HD void crun__k_bias_grad_##tn(T *gb, const T *gy, int64_t n, int64_t out, int64_t j) {  \
    T acc = gb[j];                                                                             \
    for (int64_t i = 0; i < n; i++) acc += gy[i * out + j];                                    \
    gb[j] = acc;                                                                               \
  }                                                                                            \
  CRUN_HD void crun__k_mul_##tn(const T *a, const T *b, T *y, int64_t i) { y[i] = a[i] * b[i]; }
CRUN__K_NN(f32, float, f)
CRUN__K_NN(f64, double, )

/* Label i (1-based in the tensor) as a 0-based class, or -1 when it is out
 * of 1..c. lt is CRUN_INT64 or CRUN_INT32. */
CRUN_HD int64_t crun__k_label(int lt, const void *labels, int64_t i, int64_t c) {
  int64_t l = lt == CRUN_INT64 ? ((const int64_t *)labels)[i] : ((const int32_t *)labels)[i];
  return l >= 1 && l <= c ? l - 1 : -1;
}

#endif
