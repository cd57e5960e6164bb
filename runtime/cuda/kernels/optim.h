/* optim.h — one element of torch.optim's SGD and Adam/AdamW updates, with
 * the arithmetic of runtime/train/optim.c: every constant is rounded to the
 * parameter's type once (on the host, by crun__k_sgd_consts / adam_consts)
 * and each element runs the same operations in the same order. */
#ifndef CRUN_CUDA_KERNELS_OPTIM_H
#define CRUN_CUDA_KERNELS_OPTIM_H

#include <math.h>

#include "cuda/kernels/common.h"
#include "crun/train.h"

/* The per-step constants, as doubles (each kernel rounds them to T). */
typedef struct {
  double lr, wd, mom, damp, sign;
  int has_wd, has_buf, first, nesterov;
} crun__ksgd_t;

typedef struct {
  double b1, b2, wd, eps, sign, decay, step_size, bc2_sqrt;
  int decoupled, amsgrad;
} crun__kadam_t;

/* Fills the SGD constants from the options (buf NULL: no momentum). */
static inline crun__ksgd_t crun__k_sgd_consts(const crun_sgd_opts_t *o, int has_buf, int first) {
  crun__ksgd_t s;
  s.lr = o->lr;
  s.wd = o->weight_decay;
  s.mom = o->momentum;
  s.damp = 1.0 - o->dampening;
  s.sign = o->maximize ? -1.0 : 1.0;
  s.has_wd = o->weight_decay != 0;
  s.has_buf = has_buf;
  s.first = first;
  s.nesterov = o->nesterov;
  return s;
}

/* Fills the Adam constants for 1-based step `step`. */
static inline crun__kadam_t crun__k_adam_consts(const crun_adam_opts_t *o, int64_t step) {
  crun__kadam_t a;
  a.b1 = o->beta1;
  a.b2 = o->beta2;
  a.wd = o->weight_decay;
  a.eps = o->eps;
  a.sign = o->maximize ? -1.0 : 1.0;
  a.decay = 1.0 - o->lr * o->weight_decay;
  a.step_size = o->lr / (1.0 - pow(o->beta1, (double)step));
  a.bc2_sqrt = sqrt(1.0 - pow(o->beta2, (double)step));
  a.decoupled = o->decoupled;
  a.amsgrad = o->amsgrad;
  return a;
}

#define CRUN__K_OPTIM(tn, T, F)                                                               \
  /* SGD on element i: d = sign g (+ wd p); momentum buffer; p -= lr d. */                   \
  CRUN_HD void crun__k_sgd_##tn(T *p, const T *g, T *buf, int64_t i, const crun__ksgd_t *s) { \
    const T lr = (T)s->lr, wd = (T)s->wd, mom = (T)s->mom, damp = (T)s->damp, sign = (T)s->sign; \
    T d = sign * g[i];                                                                        \
    if (s->has_wd) d += wd * p[i];                                                            \
    if (s->has_buf) {                                                                         \
      T b = s->first ? d : mom * buf[i] + damp * d;                                           \
      buf[i] = b;                                                                             \
      d = s->nesterov ? d + mom * b : b;                                                      \
    }                                                                                         \
    p[i] -= lr * d;                                                                           \
  }                                                                                           \
  /* Adam / AdamW on element i (vmax only read with amsgrad). */                              \
  CRUN_HD void crun__k_adam_##tn(T *p, const T *g, T *m, T *v, T *vmax, int64_t i,           \
                                 const crun__kadam_t *a) {                                    \
    const T b1 = (T)a->b1, b2 = (T)a->b2, wd = (T)a->wd, eps = (T)a->eps, sign = (T)a->sign; \
    const T decay = (T)a->decay, step_size = (T)a->step_size, bc2_sqrt = (T)a->bc2_sqrt;    \
    T gi = sign * g[i];                                                                       \
    if (a->decoupled) p[i] *= decay;                                                          \
    else gi += wd * p[i];                                                                     \
    m[i] = m[i] * b1 + gi * ((T)1 - b1);                                                      \
    v[i] = v[i] * b2 + gi * gi * ((T)1 - b2);                                                 \
    T s = v[i];                                                                               \
    if (a->amsgrad) s = vmax[i] = vmax[i] > v[i] ? vmax[i] : v[i];                            \
    p[i] -= step_size * m[i] / (sqrt##F(s) / bc2_sqrt + eps);                                 \
  }
CRUN__K_OPTIM(f32, float, f)
CRUN__K_OPTIM(f64, double, )

#endif
