/* dispatch.c — tensor, nn and optim operations on device tensors: operand
 * checks, temporaries on the device, then the launchers of launch.h on the
 * device's current stream (see dispatch.h). */
#include "cuda/dispatch.h"

#include <stdio.h>
#include <string.h>

#include "core/checked.h"
#include "cuda/cuda_int.h"
#include "cuda/launch.h"
#include "tensor/tensor_impl.h"

/* The device a call runs on, the caller's device to restore, the stream. */
typedef struct {
  int dev, saved;
  void *s;
} scope_t;

static int enter(scope_t *sc, const crun_tensor_t *t) {
  sc->dev = t->st->device;
  CRUN_CHECK(crun__cuda_enter(sc->dev, &sc->saved));
  sc->s = crun__cuda_current_stream(sc->dev);
  return 0;
}

static int leave(scope_t *sc, int rc) {
  crun__cuda_leave(sc->dev, sc->saved);
  return rc;
}

static const char *place(int dev, char *buf, size_t n) {
  if (dev < 0) return "cpu";
  snprintf(buf, n, "cuda:%d", dev);
  return buf;
}

int crun__dev_same(const char *what, int n, const crun_tensor_t *const *ts) {
  int dev = ts[0]->st->device;
  for (int k = 1; k < n; k++) {
    if (!ts[k] || ts[k]->st->device == dev) continue;
    char a[32], b[32];
    return crun_error(CRUN_EINVAL, "%s: operands on different devices (%s and %s; move one with :to())", what,
                      place(dev, a, sizeof a), place(ts[k]->st->device, b, sizeof b));
  }
  return 0;
}

#define SAME(what, ...)                                                                      \
  CRUN_CHECK(crun__dev_same(what, (int)(sizeof((const crun_tensor_t *const[]){__VA_ARGS__}) / \
                                        sizeof(crun_tensor_t *)),                            \
                            (const crun_tensor_t *const[]){__VA_ARGS__}))

/* Geometry of t broadcast to (nd, shape): leading and size-1 dims stride 0. */
static crun__kgeo_t geo_to(const crun_tensor_t *t, int nd, const int64_t *shape) {
  crun__kgeo_t g;
  memset(&g, 0, sizeof g);
  g.ndim = nd;
  for (int d = 0, td = d - (nd - t->ndim); d < nd; d++, td++) {
    g.shape[d] = shape[d];
    g.stride[d] = td < 0 || t->shape[td] == 1 ? 0 : t->strides[td];
  }
  return g;
}

static crun__kgeo_t geo_flat(int64_t n) {
  crun__kgeo_t g;
  memset(&g, 0, sizeof g);
  g.ndim = 1;
  g.shape[0] = n;
  g.stride[0] = 1;
  return g;
}

/* ---------------------------------------------------------------- tensor ops */

int crun__dev_copy(crun_tensor_t *dst, crun_tensor_t *src) {
  SAME("copy", dst, src);
  scope_t sc;
  CRUN_CHECK(enter(&sc, dst));
  crun__kgeo_t dg = geo_to(dst, dst->ndim, dst->shape), sg = geo_to(src, dst->ndim, dst->shape);
  return leave(&sc, crun__cuda_copy(dst->dt, crun_tensor_data(dst), &dg, src->dt, crun_tensor_data(src), &sg, sc.s));
}

int crun__dev_fill(crun_tensor_t *t, double v) {
  scope_t sc;
  CRUN_CHECK(enter(&sc, t));
  int64_t n = crun_tensor_numel(t);
  int rc;
  if (crun_tensor_is_contiguous(t)) {
    rc = crun__cuda_fill(t->dt, crun_tensor_data(t), n, v, sc.s);
  } else { /* a strided view: one filled element, broadcast over t's walk */
    crun_tensor_t *one = NULL;
    rc = crun_tensor_empty_on(t->dt, 0, NULL, sc.dev, &one);
    if (rc == 0) rc = crun__cuda_fill(t->dt, crun_tensor_data(one), 1, v, sc.s);
    if (rc == 0) rc = crun__dev_copy(t, one);
    crun_tensor_release(one);
  }
  return leave(&sc, rc);
}

/* A contiguous output for out: out itself or a temporary copied back by finish_out. */
static int begin_out(crun_tensor_t *out, crun_tensor_t **tmp) {
  if (crun_tensor_is_contiguous(out)) {
    crun_tensor_retain(out);
    *tmp = out;
    return 0;
  }
  return crun_tensor_empty_on(out->dt, out->ndim, out->shape, out->st->device, tmp);
}

static int finish_out(crun_tensor_t *out, crun_tensor_t *tmp, int rc) {
  if (rc == 0 && tmp != out) rc = crun__dev_copy(out, tmp);
  crun_tensor_release(tmp);
  return rc;
}

int crun__dev_binop(crun_binop_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t *out) {
  SAME(crun_binop_name(op), a, b, out);
  scope_t sc;
  crun_tensor_t *O;
  CRUN_CHECK(enter(&sc, out));
  int rc = begin_out(out, &O);
  if (rc == 0) {
    crun__kgeo_t ga = geo_to(a, out->ndim, out->shape), gb = geo_to(b, out->ndim, out->shape);
    rc = finish_out(out, O, crun__cuda_binary(op, a->dt, crun_tensor_data(O), crun_tensor_data(a), &ga,
                                              crun_tensor_data(b), &gb, 0, sc.s));
  }
  return leave(&sc, rc);
}

/* Runs STEP (using A, the contiguous input, and O, the contiguous output). */
#define UNARY_LIKE(what, a, out, STEP)                                         \
  do {                                                                         \
    SAME(what, a, out);                                                        \
    scope_t sc;                                                                \
    crun_tensor_t *A = NULL, *O = NULL;                                        \
    CRUN_CHECK(enter(&sc, out));                                               \
    int rc = crun_tensor_contiguous(a, &A);                                    \
    if (rc == 0) rc = begin_out(out, &O);                                      \
    if (rc == 0) {                                                             \
      rc = finish_out(out, O, (STEP));                                         \
      O = NULL;                                                                \
    }                                                                          \
    crun_tensor_release(A);                                                    \
    crun_tensor_release(O);                                                    \
    return leave(&sc, rc);                                                     \
  } while (0)

int crun__dev_binop_scalar(crun_binop_t op, crun_tensor_t *a, double s, int reverse, crun_tensor_t *out) {
  UNARY_LIKE(crun_binop_name(op), a, out,
             crun__cuda_binary_scalar(op, a->dt, crun_tensor_data(O), crun_tensor_data(A), crun_tensor_numel(A), s,
                                      reverse, sc.s));
}

int crun__dev_unop(crun_unop_t op, crun_tensor_t *a, crun_tensor_t *out) {
  UNARY_LIKE(crun_unop_name(op), a, out,
             crun__cuda_unary(op, a->dt, crun_tensor_data(O), crun_tensor_data(A), crun_tensor_numel(A), sc.s));
}

int crun__dev_clamp(crun_tensor_t *a, double lo, double hi, crun_tensor_t *out) {
  UNARY_LIKE("clamp", a, out,
             crun__cuda_clamp(a->dt, crun_tensor_data(O), crun_tensor_data(A), crun_tensor_numel(A), lo, hi, sc.s));
}

int crun__dev_reduce_dim(crun_dimred_t op, crun_tensor_t *a, int64_t outer, int64_t n, int64_t inner, int nd,
                         const int64_t *shape, int64_t base, crun_dtype_t vdt, crun_tensor_t **values,
                         crun_tensor_t **indices) {
  int want_idx = indices && (op == CRUN_DIMRED_MAX || op == CRUN_DIMRED_MIN);
  scope_t sc;
  crun_tensor_t *A = NULL, *V = NULL, *I = NULL;
  CRUN_CHECK(enter(&sc, a));
  int rc = crun_tensor_contiguous(a, &A);
  if (rc == 0) rc = crun_tensor_empty_on(vdt, nd, shape, sc.dev, &V);
  if (rc == 0 && want_idx) rc = crun_tensor_empty_on(CRUN_INT64, nd, shape, sc.dev, &I);
  if (rc == 0)
    rc = crun__cuda_reduce_dim(op, a->dt, crun_tensor_data(A), outer, n, inner, crun_tensor_data(V), vdt,
                               I ? crun_tensor_data(I) : NULL, base, sc.s);
  crun_tensor_release(A);
  if (rc == 0) {
    *values = V;
    if (indices) *indices = I;
  } else {
    crun_tensor_release(V);
    crun_tensor_release(I);
  }
  return leave(&sc, rc);
}

int crun__dev_softmax(crun_tensor_t *a, int dim, int use_log, crun_tensor_t **out) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (d < dim) outer *= a->shape[d];
    if (d > dim) inner *= a->shape[d];
  }
  scope_t sc;
  crun_tensor_t *A = NULL;
  CRUN_CHECK(enter(&sc, a));
  int rc = crun_tensor_contiguous(a, &A);
  if (rc == 0) rc = crun_tensor_empty_on(a->dt, a->ndim, a->shape, sc.dev, out);
  if (rc == 0) {
    rc = crun__cuda_softmax(a->dt, crun_tensor_data(A), crun_tensor_data(*out), outer, a->shape[dim], inner, use_log,
                            sc.s);
    if (rc < 0) crun_tensor_release(*out);
  }
  crun_tensor_release(A);
  return leave(&sc, rc);
}

int crun__dev_gemm(int ta, int tb, double alpha, crun_tensor_t *A, crun_tensor_t *B, double beta, crun_tensor_t *C) {
  SAME("gemm", C, A, B);
  int64_t K = A->shape[!ta], lda = 0, ldb = 0, ldc = 0;
  int fa = 0, fb = 0, fc = 0;
  if (K == 0) {
    if (beta == 1.0) return 0;
    return beta == 0.0 ? crun__dev_fill(C, 0.0) : crun__dev_binop_scalar(CRUN_BIN_MUL, C, beta, 0, C);
  }
  scope_t sc;
  crun_tensor_t *Au = NULL, *Bu = NULL, *Cu = NULL;
  CRUN_CHECK(enter(&sc, C));
  int rc = crun__gemm_operand(A, &Au, &fa, &lda);
  if (rc == 0) rc = crun__gemm_operand(B, &Bu, &fb, &ldb);
  if (rc == 0) {
    if (crun__gemm_layout(C, &fc, &ldc) == 0 && fc == 0 && !crun_tensor_same_storage(C, A) &&
        !crun_tensor_same_storage(C, B)) {
      crun_tensor_retain(C);
      Cu = C;
    } else {
      rc = crun_tensor_clone(C, &Cu);
      ldc = C->shape[1] > 1 ? C->shape[1] : 1;
    }
  }
  if (rc == 0)
    rc = crun__cuda_gemm(C->dt, fa ^ ta, fb ^ tb, C->shape[0], C->shape[1], K, alpha, crun_tensor_data(Au), lda,
                         crun_tensor_data(Bu), ldb, beta, crun_tensor_data(Cu), ldc, sc.s);
  if (rc == 0 && Cu != C) rc = crun__dev_copy(C, Cu);
  crun_tensor_release(Au);
  crun_tensor_release(Bu);
  crun_tensor_release(Cu);
  return leave(&sc, rc);
}

/* ---------------------------------------------------------------- nn and optim */

#define D(t) crun_tensor_data(t)
#define CD(t) ((const void *)crun_tensor_data(t))

/* Enters x's device after checking that the listed tensors share it; runs CALL. */
#define ON_DEVICE(what, x, CALL, ...)                                          \
  do {                                                                         \
    SAME(what, __VA_ARGS__);                                                   \
    scope_t sc;                                                                \
    CRUN_CHECK(enter(&sc, x));                                                 \
    return leave(&sc, (CALL));                                                 \
  } while (0)

int crun__dev_linear_forward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *b, crun_tensor_t *y) {
  SAME("Linear forward", x, w, b, y);
  int64_t n = x->shape[0], in = x->shape[1], out = w->shape[0];
  scope_t sc;
  CRUN_CHECK(enter(&sc, x));
  int rc;
  if (b) { /* every row of y = b */
    crun__kgeo_t yg = geo_flat(n * out), bg;
    memset(&bg, 0, sizeof bg);
    bg.ndim = yg.ndim = 2;
    yg.shape[0] = bg.shape[0] = n;
    yg.shape[1] = bg.shape[1] = out;
    yg.stride[0] = out;
    yg.stride[1] = bg.stride[1] = 1;
    rc = crun__cuda_copy(y->dt, D(y), &yg, b->dt, CD(b), &bg, sc.s);
  } else {
    rc = crun__cuda_fill(y->dt, D(y), n * out, 0.0, sc.s);
  }
  if (rc == 0 && n && out && in)
    rc = crun__cuda_gemm(x->dt, 0, 1, n, out, in, 1.0, CD(x), in, CD(w), in, 1.0, D(y), out, sc.s);
  return leave(&sc, rc);
}

int crun__dev_linear_backward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *gy,
                              crun_tensor_t *gx, crun_tensor_t *gw, crun_tensor_t *gb) {
  SAME("Linear backward", x, w, gy, gx, gw, gb);
  int64_t n = x->shape[0], in = x->shape[1], out = w->shape[0];
  scope_t sc;
  CRUN_CHECK(enter(&sc, x));
  int rc = 0;
  if (gx) {
    if (out == 0) rc = crun__cuda_fill(gx->dt, D(gx), n * in, 0.0, sc.s);
    else if (n && in) rc = crun__cuda_gemm(x->dt, 0, 0, n, in, out, 1.0, CD(gy), out, CD(w), in, 0.0, D(gx), in, sc.s);
  }
  if (rc == 0 && gw && n && out && in)
    rc = crun__cuda_gemm(x->dt, 1, 0, out, in, n, 1.0, CD(gy), out, CD(x), in, 1.0, D(gw), in, sc.s);
  if (rc == 0 && gb) rc = crun__cuda_bias_grad(x->dt, D(gb), CD(gy), n, out, sc.s);
  return leave(&sc, rc);
}

int crun__dev_act_forward(crun_act_t act, const crun_tensor_t *x, crun_tensor_t *y) {
  ON_DEVICE("activation forward", x, crun__cuda_act_forward(act, x->dt, CD(x), D(y), crun_tensor_numel(x), sc.s), x, y);
}

int crun__dev_act_backward(crun_act_t act, const crun_tensor_t *y, const crun_tensor_t *gy, crun_tensor_t *gx) {
  ON_DEVICE("activation backward", y,
            crun__cuda_act_backward(act, y->dt, CD(y), CD(gy), D(gx), crun_tensor_numel(y), sc.s), y, gy, gx);
}

int crun__dev_log_softmax_forward(const crun_tensor_t *x, crun_tensor_t *y) {
  ON_DEVICE("LogSoftMax forward", x,
            crun__cuda_log_softmax_forward(x->dt, CD(x), D(y), x->shape[0], x->shape[1], sc.s), x, y);
}

int crun__dev_log_softmax_backward(const crun_tensor_t *y, const crun_tensor_t *gy, crun_tensor_t *gx) {
  ON_DEVICE("LogSoftMax backward", y,
            crun__cuda_log_softmax_backward(y->dt, CD(y), CD(gy), D(gx), y->shape[0], y->shape[1], sc.s), y, gy, gx);
}

int crun__dev_dropout(const crun_tensor_t *x, crun_tensor_t *y, crun_tensor_t *mask, double p, uint64_t *state) {
  /* the mask of this call: Philox keyed by the state; the state then moves on */
  uint64_t seed = *state;
  (void)crun_splitmix64_next(state);
  ON_DEVICE("Dropout forward", x,
            crun__cuda_dropout(x->dt, CD(x), D(y), D(mask), crun_tensor_numel(x), p, seed, 0, sc.s), x, y, mask);
}

int crun__dev_mul(const crun_tensor_t *a, const crun_tensor_t *b, crun_tensor_t *y) {
  ON_DEVICE("mul", a, crun__cuda_mul(a->dt, CD(a), CD(b), D(y), crun_tensor_numel(a), sc.s), a, b, y);
}

int crun__dev_cross_entropy(const crun_tensor_t *x, const crun_tensor_t *labels, double scale, double *loss,
                            int64_t *correct, crun_tensor_t *grad) {
  ON_DEVICE("CrossEntropy", x,
            crun__cuda_cross_entropy(x->dt, CD(x), labels->dt, CD(labels), x->shape[0], x->shape[1], scale,
                                     grad ? D(grad) : NULL, loss, correct, sc.s),
            x, labels, grad);
}

int crun__dev_nll(const crun_tensor_t *x, const crun_tensor_t *labels, double scale, double *loss,
                  crun_tensor_t *grad) {
  ON_DEVICE("ClassNLLCriterion", x,
            crun__cuda_nll(x->dt, CD(x), labels->dt, CD(labels), x->shape[0], x->shape[1], scale,
                           grad ? D(grad) : NULL, loss, sc.s),
            x, labels, grad);
}

int crun__dev_mse(const crun_tensor_t *x, const crun_tensor_t *t, double *loss, crun_tensor_t *grad) {
  ON_DEVICE("MSE", x, crun__cuda_mse(x->dt, CD(x), CD(t), crun_tensor_numel(x), grad ? D(grad) : NULL, loss, sc.s),
            x, t, grad);
}

int crun__dev_sgd(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *buf, const crun_sgd_opts_t *o, int first) {
  ON_DEVICE("SGD step", p,
            crun__cuda_sgd(p->dt, D(p), CD(g), buf ? D(buf) : NULL, crun_tensor_numel(p), o, first, sc.s), p, g, buf);
}

int crun__dev_adam(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *m, crun_tensor_t *v, crun_tensor_t *vmax,
                   int64_t step, const crun_adam_opts_t *o) {
  ON_DEVICE("Adam step", p,
            crun__cuda_adam(p->dt, D(p), CD(g), D(m), D(v), vmax ? D(vmax) : NULL, crun_tensor_numel(p), step, o, sc.s),
            p, g, m, v, vmax);
}
