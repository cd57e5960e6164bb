/* optim.c — fused per-parameter updates of SGD and Adam/AdamW, with the
 * update rules of torch.optim (single-tensor path of torch 1.13). */
#include <math.h>
#include <stdlib.h>

#include "cuda/dispatch.h"
#include "tensor/fpenv.h"
#include "train/check.h"

/* Denormal floats in the optimizer's state. With zero gradients (a dead
 * ReLU unit) Adam's exp_avg and SGD's momentum buffer decay geometrically
 * (x0.9 a step) into subnormal values after a few hundred steps, and the CPU
 * computes on those many times slower: on the project's AMD EPYC VM the
 * Adam step took 38 % of a 512x4 MLP's training (perf), its epochs slowing
 * from ~10.6k to ~7.5k samples/s (~10k with the flush). The updates therefore run
 * with the FTZ and DAZ bits set (the caller's MXCSR is restored after),
 * so such state becomes zero: it multiplies the learning rate into a change
 * below 1e-38, which no normal parameter can absorb anyway (the parameters
 * stay bit-identical to torch's unless they are themselves within 1e-30 of
 * zero). TensorFlow flushes denormals in its compute threads the same way;
 * torch leaves it to set_flush_denormal. The rest of the tensor math keeps
 * IEEE behaviour (crun.set_flush_denormal(true) extends flushing to it).
 * CRUN_OPTIM_DENORMALS=ieee keeps IEEE behaviour in the updates too. */
static int optim_flush(void) {
  static int flush = -1;
  if (flush < 0) {
    const char *e = getenv("CRUN_OPTIM_DENORMALS");
    flush = !(e && e[0] == 'i');
  }
  return flush;
}

typedef struct { unsigned csr; int set; } fpenv_t;
static fpenv_t flush_begin(void) {
  fpenv_t f = {0, 0};
  if (optim_flush()) f.csr = crun__fpenv_flush_begin(), f.set = 1;
  return f;
}
static void flush_end(fpenv_t f) {
  if (f.set) crun__fpenv_restore(f.csr);
}

/* The update of one element; d is the (signed, decayed) gradient. The loops
 * below call it with constant flags, so that each case compiles to its own
 * branch-free (vectorisable) loop: one loop with the branches inside ran at
 * 1.4 ns an element. */
#define SGD_BODY(T, HAS_WD, HAS_BUF, FIRST, NESTEROV)                    \
  for (int64_t i = 0; i < n; i++) {                                     \
    T d = sign * g[i];                                                  \
    if (HAS_WD) d += wd * p[i];                                         \
    if (HAS_BUF) {                                                      \
      T b = FIRST ? d : mom * buf[i] + damp * d;                        \
      buf[i] = b;                                                       \
      d = NESTEROV ? d + mom * b : b;                                   \
    }                                                                   \
    p[i] -= lr * d;                                                     \
  }

#define SGD_LOOP(T)                                                                   \
  static void sgd_##T(T *restrict p, const T *restrict g, T *restrict buf, int64_t n, \
                      const crun_sgd_opts_t *o, int first) {                          \
    const T lr = (T)o->lr, wd = (T)o->weight_decay, mom = (T)o->momentum;             \
    const T damp = (T)(1.0 - o->dampening), sign = o->maximize ? (T)-1 : (T)1;        \
    const int has_wd = o->weight_decay != 0, nest = o->nesterov;                      \
    if (!buf) {                                                                       \
      if (has_wd) SGD_BODY(T, 1, 0, 0, 0) else SGD_BODY(T, 0, 0, 0, 0)               \
    } else if (first) {                                                               \
      if (nest) SGD_BODY(T, has_wd, 1, 1, 1) else SGD_BODY(T, has_wd, 1, 1, 0)        \
    } else if (has_wd) {                                                              \
      if (nest) SGD_BODY(T, 1, 1, 0, 1) else SGD_BODY(T, 1, 1, 0, 0)                  \
    } else {                                                                          \
      if (nest) SGD_BODY(T, 0, 1, 0, 1) else SGD_BODY(T, 0, 1, 0, 0)                  \
    }                                                                                 \
  }
SGD_LOOP(float)
SGD_LOOP(double)

int crun_optim_sgd_update(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *buf,
                          const crun_sgd_opts_t *o, int first) {
  static const char *fn = "SGD step";
  CRUN_CHECK(crun__train_check_float(fn, "param", p));
  CRUN_CHECK(crun__train_check_like(fn, "grad", p, g));
  if (o->momentum != 0 && !buf) return crun_error(CRUN_EINVAL, "%s: momentum needs a buffer", fn);
  if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
    return crun_error(CRUN_EINVAL, "%s: nesterov needs momentum > 0 and dampening 0", fn);
  if (o->momentum == 0) buf = NULL;
  if (buf) CRUN_CHECK(crun__train_check_like(fn, "momentum buffer", p, buf));
  if (CRUN__ON_DEV(p) || CRUN__ON_DEV(g) || CRUN__ON_DEV(buf)) return crun__dev_sgd(p, g, buf, o, first);
  int64_t n = crun_tensor_numel(p);
  fpenv_t fe = flush_begin();
  if (crun_tensor_dtype(p) == CRUN_FLOAT32)
    sgd_float(crun_tensor_data(p), crun_tensor_data(g), buf ? crun_tensor_data(buf) : NULL, n, o, first);
  else
    sgd_double(crun_tensor_data(p), crun_tensor_data(g), buf ? crun_tensor_data(buf) : NULL, n, o, first);
  flush_end(fe);
  return 0;
}

/* Adam's update of one element, with constant flags as SGD_BODY: AdamW's
 * decoupled decay or L2 decay folded into the gradient, and AMSGrad's
 * running maximum. The square root is the IEEE one whichever way it is
 * compiled (this file is built with -fno-math-errno, so it vectorises), so
 * results equal the scalar loop's bit for bit. */
#define ADAM_BODY(T, SQRT, DECOUPLED, HAS_WD, AMSGRAD)                   \
  for (int64_t i = 0; i < n; i++) {                                     \
    T gi = sign * g[i];                                                 \
    if (DECOUPLED) p[i] *= decay;                                       \
    else if (HAS_WD) gi += wd * p[i];                                   \
    T mi = m[i] * b1 + gi * ((T)1 - b1);                                \
    T vi = v[i] * b2 + gi * gi * ((T)1 - b2);                           \
    m[i] = mi;                                                          \
    v[i] = vi;                                                          \
    if (AMSGRAD) vi = vmax[i] = vmax[i] > vi ? vmax[i] : vi;            \
    p[i] -= step_size * mi / (SQRT(vi) / bc2_sqrt + eps);               \
  }

#define ADAM_LOOP(T, SQRT)                                                                          \
  static void adam_##T(T *restrict p, const T *restrict g, T *restrict m, T *restrict v,            \
                       T *restrict vmax, int64_t n, int64_t step, const crun_adam_opts_t *o) {      \
    const T b1 = (T)o->beta1, b2 = (T)o->beta2, wd = (T)o->weight_decay, eps = (T)o->eps;           \
    const T sign = o->maximize ? (T)-1 : (T)1, decay = (T)(1.0 - o->lr * o->weight_decay);          \
    const T step_size = (T)(o->lr / (1.0 - pow(o->beta1, (double)step)));                           \
    const T bc2_sqrt = (T)sqrt(1.0 - pow(o->beta2, (double)step));                                  \
    const int has_wd = o->weight_decay != 0;                                                        \
    if (o->decoupled) {                                                                             \
      if (vmax) ADAM_BODY(T, SQRT, 1, 0, 1) else ADAM_BODY(T, SQRT, 1, 0, 0)                        \
    } else if (has_wd) {                                                                            \
      if (vmax) ADAM_BODY(T, SQRT, 0, 1, 1) else ADAM_BODY(T, SQRT, 0, 1, 0)                        \
    } else {                                                                                        \
      if (vmax) ADAM_BODY(T, SQRT, 0, 0, 1) else ADAM_BODY(T, SQRT, 0, 0, 0)                        \
    }                                                                                               \
  }
ADAM_LOOP(float, sqrtf)
ADAM_LOOP(double, sqrt)

int crun_optim_adam_update(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *m,
                           crun_tensor_t *v, crun_tensor_t *vmax, int64_t step,
                           const crun_adam_opts_t *o) {
  static const char *fn = "Adam step";
  CRUN_CHECK(crun__train_check_float(fn, "param", p));
  CRUN_CHECK(crun__train_check_like(fn, "grad", p, g));
  CRUN_CHECK(crun__train_check_like(fn, "exp_avg", p, m));
  CRUN_CHECK(crun__train_check_like(fn, "exp_avg_sq", p, v));
  if (o->amsgrad) CRUN_CHECK(crun__train_check_like(fn, "max_exp_avg_sq", p, vmax));
  else vmax = NULL;
  if (step < 1) return crun_error(CRUN_EINVAL, "%s: step must be >= 1, got %lld", fn, (long long)step);
  if (CRUN__ON_DEV(p) || CRUN__ON_DEV(g) || CRUN__ON_DEV(m) || CRUN__ON_DEV(v) || CRUN__ON_DEV(vmax))
    return crun__dev_adam(p, g, m, v, vmax, step, o);
  int64_t n = crun_tensor_numel(p);
  fpenv_t fe = flush_begin();
  if (crun_tensor_dtype(p) == CRUN_FLOAT32)
    adam_float(crun_tensor_data(p), crun_tensor_data(g), crun_tensor_data(m), crun_tensor_data(v),
               vmax ? crun_tensor_data(vmax) : NULL, n, step, o);
  else
    adam_double(crun_tensor_data(p), crun_tensor_data(g), crun_tensor_data(m), crun_tensor_data(v),
                vmax ? crun_tensor_data(vmax) : NULL, n, step, o);
  flush_end(fe);
  return 0;
}
