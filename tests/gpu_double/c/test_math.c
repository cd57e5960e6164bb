/* test_math.c — device tensors' math through the double build:
 * tensor ops, a Linear + ReLU + LogSoftMax + ClassNLL forward/backward and
 * SGD / Adam steps run on cuda:0 of the cudart double (device memory is host
 * memory, kernels are the host launchers) and must give the CPU's results
 * bit for bit. Runs as ctest gpudouble.c.test_math. */
#include "harness.h"

#include <math.h>

static crun_tensor_t *rnd(crun_dtype_t dt, int nd, const int64_t *shape, uint64_t seed) {
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(dt, nd, shape, &t));
  for (int64_t i = 0; i < crun_tensor_numel(t); i++)
    crun_elem_set_double(dt, crun_tensor_data(t), i, ((double)(crun_splitmix64_next(&seed) >> 11) * 0x1p-53 - 0.5) * 5.3);
  return t;
}

static crun_tensor_t *dev(crun_tensor_t *t) {
  crun_tensor_t *d;
  EXPECT_OK(crun_tensor_to_device(t, 0, &d));
  EXPECT_EQ_INT(crun_tensor_device(d), 0);
  return d;
}

/* Fails unless device tensor d, copied back, equals host tensor h byte for byte. */
static void same(const char *what, crun_tensor_t *h, crun_tensor_t *d) {
  crun_tensor_t *b, *hc;
  EXPECT_EQ_INT(crun_tensor_device(d), 0);
  EXPECT_OK(crun_tensor_to_device(d, -1, &b));
  EXPECT_OK(crun_tensor_contiguous(h, &hc));
  EXPECT_EQ_INT(crun_tensor_dtype(hc), crun_tensor_dtype(b));
  EXPECT_EQ_INT(crun_tensor_numel(hc), crun_tensor_numel(b));
  if (memcmp(crun_tensor_data(hc), crun_tensor_data(b), crun_tensor_nbytes(hc)) != 0)
    crun_test_fail(__FILE__, __LINE__, "%s: the device result differs from the CPU's", what);
  crun_tensor_release(b);
  crun_tensor_release(hc);
}

TEST(tensor_ops_on_device) {
  int64_t sa[2] = {257, 3}, sb[1] = {3};
  crun_tensor_t *a = rnd(CRUN_FLOAT32, 2, sa, 1), *b = rnd(CRUN_FLOAT32, 1, sb, 2), *da = dev(a), *db = dev(b);
  crun_tensor_t *h, *d, *hi, *di, *at, *dat;
  EXPECT_OK(crun_tensor_binop(CRUN_BIN_ADD, a, b, &h));
  EXPECT_OK(crun_tensor_binop(CRUN_BIN_ADD, da, db, &d));
  same("add broadcast", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  EXPECT_OK(crun_tensor_binop(CRUN_BIN_GT, a, b, &h));
  EXPECT_OK(crun_tensor_binop(CRUN_BIN_GT, da, db, &d));
  same("gt broadcast", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  EXPECT_OK(crun_tensor_binop_scalar(CRUN_BIN_DIV, a, -1.5, 1, &h));
  EXPECT_OK(crun_tensor_binop_scalar(CRUN_BIN_DIV, da, -1.5, 1, &d));
  same("scalar div reversed", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  /* strided: the transpose */
  EXPECT_OK(crun_tensor_transpose(a, 0, 1, &at));
  EXPECT_OK(crun_tensor_transpose(da, 0, 1, &dat));
  EXPECT_OK(crun_tensor_unop(CRUN_UN_EXP, at, &h));
  EXPECT_OK(crun_tensor_unop(CRUN_UN_EXP, dat, &d));
  same("exp of a transpose", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  EXPECT_OK(crun_tensor_clamp(at, -1, 0.25, &h));
  EXPECT_OK(crun_tensor_clamp(dat, -1, 0.25, &d));
  same("clamp", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  for (int dim = -1; dim < 2; dim++) {
    EXPECT_OK(crun_tensor_reduce_dim(CRUN_DIMRED_SUM, at, dim, 1, 1, &h, NULL));
    EXPECT_OK(crun_tensor_reduce_dim(CRUN_DIMRED_SUM, dat, dim, 1, 1, &d, NULL));
    same("sum", h, d);
    crun_tensor_release(h); crun_tensor_release(d);
    EXPECT_OK(crun_tensor_reduce_dim(CRUN_DIMRED_MAX, a, dim, 0, 1, &h, &hi));
    EXPECT_OK(crun_tensor_reduce_dim(CRUN_DIMRED_MAX, da, dim, 0, 1, &d, &di));
    same("max", h, d);
    same("argmax", hi, di);
    crun_tensor_release(h); crun_tensor_release(d); crun_tensor_release(hi); crun_tensor_release(di);
  }
  EXPECT_OK(crun_tensor_softmax(a, 1, 1, &h));
  EXPECT_OK(crun_tensor_softmax(da, 1, 1, &d));
  same("log_softmax", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  /* matmul of a transposed view: [3, 257] x [257, 3] */
  EXPECT_OK(crun_tensor_matmul(at, a, &h));
  EXPECT_OK(crun_tensor_matmul(dat, da, &d));
  same("matmul", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  /* cast on the device, fill of a strided view */
  EXPECT_OK(crun_tensor_to(at, CRUN_FLOAT64, &h));
  EXPECT_OK(crun_tensor_to(dat, CRUN_FLOAT64, &d));
  same("cast to float64", h, d);
  crun_tensor_release(h); crun_tensor_release(d);
  EXPECT_OK(crun_tensor_fill(at, -0.75));
  EXPECT_OK(crun_tensor_fill(dat, -0.75));
  same("fill through a view", a, da);
  /* operands on two places */
  EXPECT_STATUS(crun_tensor_binop(CRUN_BIN_ADD, a, db, &h), CRUN_EINVAL);
  EXPECT_TEXT("different devices (cpu and cuda:0");
  crun_tensor_release(at); crun_tensor_release(dat);
  crun_tensor_release(a); crun_tensor_release(b); crun_tensor_release(da); crun_tensor_release(db);
}

/* One training step of Linear(7 -> 5) + ReLU + Linear(5 -> 4) + LogSoftMax +
 * ClassNLL on the tensors given (all on one place); returns the loss. */
typedef struct {
  crun_tensor_t *w1, *b1, *w2, *b2, *gw1, *gb1, *gw2, *gb2;
} net_t;

static crun_tensor_t *zeros_like(crun_tensor_t *t) {
  crun_tensor_t *z;
  EXPECT_OK(crun_tensor_new_on(crun_tensor_dtype(t), crun_tensor_ndim(t), crun_tensor_shape(t), crun_tensor_device(t), &z));
  return z;
}

static crun_tensor_t *zeros2(crun_dtype_t dt, int64_t r, int64_t c, int device) {
  crun_tensor_t *z;
  int64_t s[2] = {r, c};
  EXPECT_OK(crun_tensor_new_on(dt, 2, s, device, &z));
  return z;
}

static double step(net_t *n, crun_tensor_t *x, crun_tensor_t *labels, int device) {
  crun_dtype_t dt = crun_tensor_dtype(x);
  int64_t N = crun_tensor_shape(x)[0];
  crun_tensor_t *h1 = zeros2(dt, N, 5, device), *a1 = zeros2(dt, N, 5, device), *h2 = zeros2(dt, N, 4, device);
  crun_tensor_t *y = zeros2(dt, N, 4, device), *gy = zeros2(dt, N, 4, device), *gh2 = zeros2(dt, N, 4, device);
  crun_tensor_t *ga1 = zeros2(dt, N, 5, device), *gh1 = zeros2(dt, N, 5, device), *gx = zeros2(dt, N, 7, device);
  double loss = 0;
  EXPECT_OK(crun_nn_linear_forward(x, n->w1, n->b1, h1));
  EXPECT_OK(crun_nn_act_forward(CRUN_ACT_RELU, h1, a1));
  EXPECT_OK(crun_nn_linear_forward(a1, n->w2, n->b2, h2));
  EXPECT_OK(crun_nn_log_softmax_forward(h2, y));
  EXPECT_OK(crun_nn_nll(y, labels, &loss, gy));
  EXPECT_OK(crun_nn_log_softmax_backward(y, gy, gh2));
  EXPECT_OK(crun_nn_linear_backward(a1, n->w2, gh2, ga1, n->gw2, n->gb2));
  EXPECT_OK(crun_nn_act_backward(CRUN_ACT_RELU, a1, ga1, gh1));
  EXPECT_OK(crun_nn_linear_backward(x, n->w1, gh1, gx, n->gw1, n->gb1));
  crun_tensor_t *all[] = {h1, a1, h2, y, gy, gh2, ga1, gh1, gx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) crun_tensor_release(all[i]);
  return loss;
}

static void net_init(net_t *n, crun_dtype_t dt) {
  int64_t s1[2] = {5, 7}, s2[2] = {4, 5}, b1 = 5, b2 = 4;
  n->w1 = rnd(dt, 2, s1, 11); n->b1 = rnd(dt, 1, &b1, 12); n->w2 = rnd(dt, 2, s2, 13); n->b2 = rnd(dt, 1, &b2, 14);
  n->gw1 = zeros_like(n->w1); n->gb1 = zeros_like(n->b1); n->gw2 = zeros_like(n->w2); n->gb2 = zeros_like(n->b2);
}

static void net_to_dev(const net_t *h, net_t *d) {
  d->w1 = dev(h->w1); d->b1 = dev(h->b1); d->w2 = dev(h->w2); d->b2 = dev(h->b2);
  d->gw1 = dev(h->gw1); d->gb1 = dev(h->gb1); d->gw2 = dev(h->gw2); d->gb2 = dev(h->gb2);
}

static void net_free(net_t *n) {
  crun_tensor_t **p = &n->w1;
  for (int i = 0; i < 8; i++) crun_tensor_release(p[i]);
}

TEST(mlp_forward_backward_and_optimizers_on_device) {
  for (int f = 0; f < 2; f++) {
    crun_dtype_t dt = f ? CRUN_FLOAT64 : CRUN_FLOAT32;
    int64_t xs[2] = {257, 7}, N = 257;
    crun_tensor_t *x = rnd(dt, 2, xs, 20), *labels, *dx = dev(x), *dl;
    EXPECT_OK(crun_tensor_new(CRUN_INT64, 1, &N, &labels));
    uint64_t s = 3;
    for (int64_t i = 0; i < N; i++) ((int64_t *)crun_tensor_data(labels))[i] = 1 + (int64_t)(crun_splitmix64_next(&s) % 4);
    dl = dev(labels);
    net_t h, d;
    net_init(&h, dt);
    net_to_dev(&h, &d);
    crun_sgd_opts_t so = {0.1, 0.9, 0, 0.01, 1, 0};
    crun_adam_opts_t ao = {1e-2, 0.9, 0.999, 1e-8, 0.01, 1, 1, 0};
    crun_tensor_t *hb = zeros_like(h.w1), *db = dev(hb), *hm = zeros_like(h.w2), *hv = zeros_like(h.w2),
                  *hvm = zeros_like(h.w2), *dm = dev(hm), *dv = dev(hv), *dvm = dev(hvm);
    for (int it = 1; it <= 3; it++) {
      double lh = step(&h, x, labels, -1), ld = step(&d, dx, dl, 0);
      if (lh != ld) crun_test_fail(__FILE__, __LINE__, "%s step %d: loss %.17g on the CPU, %.17g on the device",
                                   crun_dtype_name(dt), it, lh, ld);
      same("gradWeight 1", h.gw1, d.gw1);
      same("gradBias 1", h.gb1, d.gb1);
      same("gradWeight 2", h.gw2, d.gw2);
      same("gradBias 2", h.gb2, d.gb2);
      EXPECT_OK(crun_optim_sgd_update(h.w1, h.gw1, hb, &so, it == 1));
      EXPECT_OK(crun_optim_sgd_update(d.w1, d.gw1, db, &so, it == 1));
      EXPECT_OK(crun_optim_adam_update(h.w2, h.gw2, hm, hv, hvm, it, &ao));
      EXPECT_OK(crun_optim_adam_update(d.w2, d.gw2, dm, dv, dvm, it, &ao));
      same("SGD (momentum, nesterov, weight decay) weight", h.w1, d.w1);
      same("AdamW amsgrad weight", h.w2, d.w2);
      same("AdamW max_exp_avg_sq", hvm, dvm);
    }
    /* cross entropy and its label check on the device */
    int64_t ok_h, ok_d;
    double lh, ld;
    crun_tensor_t *lo = zeros2(dt, N, 7, -1), *dlo = zeros2(dt, N, 7, 0);
    crun_tensor_t *l7;
    EXPECT_OK(crun_tensor_clone(labels, &l7));
    crun_tensor_t *dl7 = dev(l7);
    EXPECT_OK(crun_nn_cross_entropy(x, l7, 0, &lh, &ok_h, lo));
    EXPECT_OK(crun_nn_cross_entropy(dx, dl7, 0, &ld, &ok_d, dlo));
    EXPECT(lh == ld);
    EXPECT_EQ_INT(ok_h, ok_d);
    same("cross entropy grad", lo, dlo);
    ((int64_t *)crun_tensor_data(l7))[100] = 9;
    crun_tensor_release(dl7);
    dl7 = dev(l7);
    EXPECT_STATUS(crun_nn_cross_entropy(dx, dl7, 0, &ld, &ok_d, dlo), CRUN_ERANGE);
    EXPECT_TEXT("label 9 of row 101 is out of range 1..7");
    /* dropout: reproducible from the state, which moves on */
    crun_tensor_t *y1 = zeros_like(dx), *m1 = zeros_like(dx), *y2 = zeros_like(dx), *m2 = zeros_like(dx);
    uint64_t st1 = 77, st2 = 77;
    EXPECT_OK(crun_nn_dropout_forward(dx, y1, m1, 0.25, &st1));
    EXPECT_OK(crun_nn_dropout_forward(dx, y2, m2, 0.25, &st2));
    EXPECT(st1 == st2 && st1 != 77);
    crun_tensor_t *hm1, *hm2;
    EXPECT_OK(crun_tensor_to_device(m1, -1, &hm1));
    same("dropout mask, same seed", hm1, m2);
    EXPECT_OK(crun_nn_dropout_forward(dx, y2, m2, 0.25, &st2));
    EXPECT_OK(crun_tensor_to_device(m2, -1, &hm2));
    EXPECT(memcmp(crun_tensor_data(hm1), crun_tensor_data(hm2), crun_tensor_nbytes(hm1)) != 0);
    crun_tensor_t *rel[] = {x, labels, dx, dl, hb, db, hm, hv, hvm, dm, dv, dvm, lo, dlo, l7, dl7, y1, m1, y2, m2, hm1, hm2};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) crun_tensor_release(rel[i]);
    net_free(&h);
    net_free(&d);
  }
}

#define CRUN_TESTS(X) X(tensor_ops_on_device) X(mlp_forward_backward_and_optimizers_on_device)
CRUN_TEST_MAIN()
