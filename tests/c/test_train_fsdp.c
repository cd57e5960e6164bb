/* test_train_fsdp.c — crun_fsdp_*: a unit's flat layout at 1..8 ranks
 * (sizes no world size divides, empty units and empty parameters,
 * NO_SHARD), each rank's shard range, the flatten / unflatten copies and
 * views, bad and overflowing input; the unit schedule (gathers, prefetches
 * and frees per strategy, in forward and backward order). Expected values are worked out by hand
 * in the comments. */
#include <stdint.h>
#include <string.h>

#include "harness.h"

static void expect_layout(const crun_fsdp_layout_t *l, int64_t numel, int64_t padded, int64_t shard) {
  EXPECT_EQ_INT(l->numel, numel);
  EXPECT_EQ_INT(l->padded, padded);
  EXPECT_EQ_INT(l->shard_numel, shard);
}

TEST(layout) {
  /* 3 + 5 + 2 + 7 = 17, prime: only world 1 divides it. ceil(17 / w) for
   * w = 1..8 is 17 9 6 5 4 3 3 3; times w: 17 18 18 20 20 18 21 24 */
  int64_t numel[] = {3, 5, 2, 7}, off[4];
  static const int64_t per[] = {17, 9, 6, 5, 4, 3, 3, 3}, padded[] = {17, 18, 18, 20, 20, 18, 21, 24};
  crun_fsdp_layout_t l;
  for (int w = 1; w <= 8; w++) {
    memset(off, 0xff, sizeof off);
    EXPECT_OK(crun_fsdp_layout(numel, 4, w, 0, off, &l));
    expect_layout(&l, 17, padded[w - 1], per[w - 1]);
    EXPECT_EQ_INT(off[0], 0);
    EXPECT_EQ_INT(off[1], 3);
    EXPECT_EQ_INT(off[2], 8);
    EXPECT_EQ_INT(off[3], 10);
    /* NO_SHARD: no padding, every rank keeps all 17 */
    EXPECT_OK(crun_fsdp_layout(numel, 4, w, 1, off, &l));
    expect_layout(&l, 17, 17, 17);
  }
  /* a size the world divides gets no padding: 6 + 6 on 3 ranks -> 4 each */
  int64_t even[] = {6, 6};
  EXPECT_OK(crun_fsdp_layout(even, 2, 3, 0, off, &l));
  expect_layout(&l, 12, 12, 4);
  EXPECT_EQ_INT(off[1], 6);
}

TEST(empty) {
  crun_fsdp_layout_t l;
  for (int w = 1; w <= 8; w++) {
    EXPECT_OK(crun_fsdp_layout(NULL, 0, w, 0, NULL, &l));
    expect_layout(&l, 0, 0, 0);
  }
  /* empty parameters take no room: {0, 4, 0} sit at 0, 0, 4; on 3 ranks
   * ceil(4 / 3) = 2, padded 6 */
  int64_t numel[] = {0, 4, 0}, off[3];
  EXPECT_OK(crun_fsdp_layout(numel, 3, 3, 0, off, &l));
  expect_layout(&l, 4, 6, 2);
  EXPECT_EQ_INT(off[0], 0);
  EXPECT_EQ_INT(off[1], 0);
  EXPECT_EQ_INT(off[2], 4);
}

static void expect_range(int64_t numel, int world, int rank, int64_t start, int64_t per, int64_t first,
                         int64_t count) {
  crun_fsdp_range_t r;
  EXPECT_OK(crun_fsdp_shard_range(numel, world, rank, &r));
  EXPECT_EQ_INT(r.start, start);
  EXPECT_EQ_INT(r.per, per);
  EXPECT_EQ_INT(r.first, first);
  EXPECT_EQ_INT(r.count, count);
}

TEST(shard_range) {
  /* 17 on 4: shards of 5 at 0, 5, 10, 15; the last holds 2 real + 3 padding */
  expect_range(17, 4, 0, 0, 5, 0, 5);
  expect_range(17, 4, 1, 5, 5, 5, 5);
  expect_range(17, 4, 2, 10, 5, 10, 5);
  expect_range(17, 4, 3, 15, 5, 15, 2);
  /* 181 on 4: 46 each, the last 181 - 138 = 43 */
  expect_range(181, 4, 3, 138, 46, 138, 43);
  /* 2 on 3: shards of 1; rank 2 is all padding */
  expect_range(2, 3, 2, 2, 1, 2, 0);
  /* 1 on 4: ranks 1..3 are all padding, their first clamps to 1 */
  expect_range(1, 4, 1, 1, 1, 1, 0);
  expect_range(1, 4, 3, 3, 1, 1, 0);
  /* nothing to shard */
  expect_range(0, 3, 2, 0, 0, 0, 0);
  /* one rank owns it all */
  expect_range(17, 1, 0, 0, 17, 0, 17);
  /* every size 0..40 on 1..8 ranks: the shards tile [0, numel) in rank
   * order and tile the padded buffer in steps of per */
  for (int64_t n = 0; n <= 40; n++)
    for (int w = 1; w <= 8; w++) {
      int64_t next = 0;
      for (int r = 0; r < w; r++) {
        crun_fsdp_range_t g;
        EXPECT_OK(crun_fsdp_shard_range(n, w, r, &g));
        EXPECT_EQ_INT(g.first, next);
        EXPECT_EQ_INT(g.start, g.per * r);
        EXPECT(g.count >= 0 && g.count <= g.per);
        next += g.count;
      }
      EXPECT_EQ_INT(next, n);
    }
}

TEST(bad_input) {
  int64_t numel[] = {4, -2}, off[2];
  crun_fsdp_layout_t l;
  crun_fsdp_range_t r;
  EXPECT_STATUS(crun_fsdp_layout(numel, 2, 2, 0, off, &l), CRUN_EINVAL);
  EXPECT_TEXT("parameter 1 has a negative size -2");
  numel[1] = 2;
  EXPECT_STATUS(crun_fsdp_layout(numel, 2, 0, 0, off, &l), CRUN_EINVAL);
  EXPECT_TEXT("world size 0 must be >= 1");
  EXPECT_STATUS(crun_fsdp_layout(numel, -1, 2, 0, off, &l), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_layout(numel, 2, 2, 0, NULL, &l), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_layout(numel, 2, 2, 0, off, NULL), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_shard_range(10, 4, 4, &r), CRUN_EINVAL);
  EXPECT_TEXT("rank 4 is not in [0, 4)");
  EXPECT_STATUS(crun_fsdp_shard_range(10, 4, -1, &r), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_shard_range(-1, 4, 0, &r), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_shard_range(10, 0, 0, &r), CRUN_EINVAL);
}

TEST(overflow) {
  int64_t numel[] = {INT64_MAX, 1}, off[2];
  crun_fsdp_layout_t l;
  crun_fsdp_range_t r;
  EXPECT_STATUS(crun_fsdp_layout(numel, 2, 1, 0, off, &l), CRUN_ERANGE);
  EXPECT_TEXT("overflows at parameter 1");
  /* INT64_MAX alone fits on one rank and unpadded; on 2 ranks the shard is
   * 2^62 and the padded 2^63 does not fit */
  EXPECT_OK(crun_fsdp_layout(numel, 1, 1, 0, off, &l));
  expect_layout(&l, INT64_MAX, INT64_MAX, INT64_MAX);
  EXPECT_OK(crun_fsdp_layout(numel, 1, 2, 1, off, &l));
  expect_layout(&l, INT64_MAX, INT64_MAX, INT64_MAX);
  EXPECT_STATUS(crun_fsdp_layout(numel, 1, 2, 0, off, &l), CRUN_ERANGE);
  EXPECT_TEXT("padded to a multiple of 2 overflow");
  EXPECT_STATUS(crun_fsdp_shard_range(INT64_MAX, 2, 1, &r), CRUN_ERANGE);
  /* INT64_MAX - 1 = 2 * (2^62 - 1): two shards of 2^62 - 1, no padding */
  expect_range(INT64_MAX - 1, 2, 1, INT64_MAX / 2, INT64_MAX / 2, INT64_MAX / 2, INT64_MAX / 2);
}

/* A float32 tensor of the given shape holding v0, v0 + 1, ... */
static crun_tensor_t *iota(int ndim, const int64_t *shape, float v0) {
  crun_tensor_t *t = NULL;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, ndim, shape, &t));
  float *d = crun_tensor_data(t);
  for (int64_t k = 0; k < crun_tensor_numel(t); k++) d[k] = v0 + (float)k;
  return t;
}

TEST(flatten) {
  /* a: 2x3 = 1..6, b: 4 = 10..13, c: empty, d: the transpose of [[20, 21],
   * [22, 23]] (not contiguous; row-major 20 22 21 23). 6 + 4 + 0 + 4 = 14
   * on 3 ranks: padded 15, the last element is padding and stays -1. */
  int64_t s23[] = {2, 3}, s4[] = {4}, s0[] = {0}, s22[] = {2, 2}, s15[] = {15};
  crun_tensor_t *base = iota(2, s22, 20), *p[4] = {iota(2, s23, 1), iota(1, s4, 10), iota(1, s0, 0), NULL};
  EXPECT_OK(crun_tensor_transpose(base, 0, 1, &p[3]));
  int64_t numel[4] = {6, 4, 0, 4}, off[4];
  crun_fsdp_layout_t l;
  EXPECT_OK(crun_fsdp_layout(numel, 4, 3, 0, off, &l));
  expect_layout(&l, 14, 15, 5);
  crun_tensor_t *flat = NULL;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, 1, s15, &flat));
  EXPECT_OK(crun_tensor_fill(flat, -1));
  EXPECT_OK(crun_fsdp_flatten(flat, p, off, 4));
  static const float want[15] = {1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 20, 22, 21, 23, -1};
  const float *f = crun_tensor_data(flat);
  for (int k = 0; k < 15; k++) EXPECT_EQ_INT(f[k], want[k]);
  /* back: zero the parameters, unflatten, compare with the same table */
  for (int i = 0; i < 4; i++) EXPECT_OK(crun_tensor_fill(p[i], 0));
  EXPECT_OK(crun_fsdp_unflatten(flat, p, off, 4));
  const float *a = crun_tensor_data(p[0]), *b = crun_tensor_data(p[1]), *e = crun_tensor_data(base);
  for (int k = 0; k < 6; k++) EXPECT_EQ_INT(a[k], k + 1);
  for (int k = 0; k < 4; k++) EXPECT_EQ_INT(b[k], 10 + k);
  for (int k = 0; k < 4; k++) EXPECT_EQ_INT(e[k], 20 + k); /* the transpose wrote its base back */
  for (int i = 0; i < 4; i++) crun_tensor_release(p[i]);
  crun_tensor_release(base);
  crun_tensor_release(flat);
}

TEST(views) {
  int64_t s15[] = {15}, s22[] = {2, 2}, s4[] = {4};
  crun_tensor_t *flat = iota(1, s15, 0), *v = NULL;
  /* elements 10..13 as 2x2: [[10, 11], [12, 13]] */
  EXPECT_OK(crun_fsdp_view(flat, 10, 2, s22, &v));
  EXPECT_EQ_INT(crun_tensor_ndim(v), 2);
  double x = 0;
  EXPECT_OK(crun_tensor_get_double(v, (int64_t[]){1, 0}, &x));
  EXPECT_EQ_INT(x, 12);
  EXPECT_OK(crun_tensor_set_double(v, (int64_t[]){0, 1}, 99));
  EXPECT_EQ_INT(((float *)crun_tensor_data(flat))[11], 99); /* writes go through */
  crun_tensor_release(v);
  /* the last 4 fit, one further does not */
  EXPECT_OK(crun_fsdp_view(flat, 11, 1, s4, &v));
  crun_tensor_release(v);
  EXPECT_STATUS(crun_fsdp_view(flat, 12, 1, s4, &v), CRUN_EINVAL);
  EXPECT_TEXT("4 elements at offset 12 do not fit in 15");
  EXPECT_STATUS(crun_fsdp_view(flat, -1, 1, s4, &v), CRUN_EINVAL);
  crun_tensor_release(flat);
}

TEST(copy_misuse) {
  int64_t s4[] = {4}, s15[] = {15}, s35[] = {3, 5};
  crun_tensor_t *flat = iota(1, s15, 0), *p = iota(1, s4, 1), *q = NULL, *m = iota(2, s35, 0);
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, 1, s4, &q));
  int64_t off[] = {12};
  EXPECT_STATUS(crun_fsdp_flatten(flat, &p, off, 1), CRUN_EINVAL);
  EXPECT_TEXT("parameter 0's 4 elements at offset 12 do not fit in 15");
  off[0] = 0;
  EXPECT_STATUS(crun_fsdp_unflatten(flat, &q, off, 1), CRUN_EINVAL);
  EXPECT_TEXT("parameter 0 is float64, the flat buffer float32");
  EXPECT_STATUS(crun_fsdp_flatten(m, &p, off, 1), CRUN_EINVAL);
  EXPECT_TEXT("contiguous 1-d tensor");
  crun_tensor_t *none = NULL;
  EXPECT_STATUS(crun_fsdp_flatten(flat, &none, off, 1), CRUN_EINVAL);
  EXPECT_OK(crun_fsdp_flatten(flat, NULL, NULL, 0));
  crun_tensor_release(flat);
  crun_tensor_release(p);
  crun_tensor_release(q);
  crun_tensor_release(m);
}

/* Expects a step of (launch, wait, prefetch). */
static void expect_step(const crun_fsdp_step_t *st, int launch, int wait, int prefetch) {
  EXPECT_EQ_INT(st->launch, launch);
  EXPECT_EQ_INT(st->wait, wait);
  EXPECT_EQ_INT(st->prefetch, prefetch);
}

static void expect_states(const crun_fsdp_sched_t *s, int n, const char *want) {
  static const char code[] = "SGF"; /* sharded, gathering, full (gathered) */
  for (int k = 0; k < n; k++) EXPECT_EQ_INT(code[crun_fsdp_sched_state(s, k)], want[k]);
}

TEST(sched_full_shard) {
  /* 3 units, both prefetches: forward gathers 0 and prefetches the next,
   * frees each after its forward; backward gathers 2 and prefetches 1, 0:
   * 6 gathers, 2 per unit */
  crun_fsdp_sched_t *s = NULL;
  crun_fsdp_step_t st;
  EXPECT_OK(crun_fsdp_sched_new(3, CRUN_FSDP_FULL_SHARD, 1, 1, &s));
  expect_states(s, 3, "SSS");
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 0, 1, &st));
  expect_step(&st, 1, 1, 1);
  expect_states(s, 3, "FGS");
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 0), 1);
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 1, 1, &st));
  expect_step(&st, 0, 1, 2);
  expect_states(s, 3, "SFG");
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 1), 1);
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 2, 1, &st));
  expect_step(&st, 0, 1, -1);
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 2), 1);
  expect_states(s, 3, "SSS");
  EXPECT_OK(crun_fsdp_sched_pre_backward(s, 2, &st));
  expect_step(&st, 1, 1, 1);
  EXPECT_EQ_INT(crun_fsdp_sched_post_backward(s, 2), 1);
  EXPECT_OK(crun_fsdp_sched_pre_backward(s, 1, &st));
  expect_step(&st, 0, 1, 0);
  expect_states(s, 3, "GFS");
  EXPECT_EQ_INT(crun_fsdp_sched_post_backward(s, 1), 1);
  EXPECT_OK(crun_fsdp_sched_pre_backward(s, 0, &st));
  expect_step(&st, 0, 1, -1);
  EXPECT_EQ_INT(crun_fsdp_sched_post_backward(s, 0), 1);
  EXPECT_EQ_INT(crun_fsdp_sched_end_backward(s), 0);
  expect_states(s, 3, "SSS");
  /* a later leaf of unit 0 (first = 0) gathers nothing and prefetches nothing */
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 0, 1, &st));
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 0, 0, &st));
  expect_step(&st, 0, 0, -1);
  crun_fsdp_sched_free(s);
}

TEST(sched_shard_grad_op) {
  /* units stay gathered from forward to the end of their backward: one
   * gather per unit, backward launches and waits for nothing */
  crun_fsdp_sched_t *s = NULL;
  crun_fsdp_step_t st;
  EXPECT_OK(crun_fsdp_sched_new(3, CRUN_FSDP_SHARD_GRAD_OP, 1, 1, &s));
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 0, 1, &st));
  expect_step(&st, 1, 1, 1);
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 0), 0);
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 1, 1, &st));
  expect_step(&st, 0, 1, 2);
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 1), 0);
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 2, 1, &st));
  expect_step(&st, 0, 1, -1);
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 2), 0);
  expect_states(s, 3, "FFF");
  for (int k = 2; k >= 0; k--) {
    EXPECT_OK(crun_fsdp_sched_pre_backward(s, k, &st));
    expect_step(&st, 0, 0, -1);
    EXPECT_EQ_INT(crun_fsdp_sched_post_backward(s, k), 1);
  }
  expect_states(s, 3, "SSS");
  crun_fsdp_sched_free(s);
}

TEST(sched_no_shard_and_no_prefetch) {
  crun_fsdp_sched_t *s = NULL;
  crun_fsdp_step_t st;
  /* NO_SHARD: always whole, nothing to gather or free */
  EXPECT_OK(crun_fsdp_sched_new(2, CRUN_FSDP_NO_SHARD, 1, 1, &s));
  expect_states(s, 2, "FF");
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 0, 1, &st));
  expect_step(&st, 0, 0, -1);
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 0), 0);
  EXPECT_OK(crun_fsdp_sched_pre_backward(s, 1, &st));
  expect_step(&st, 0, 0, -1);
  EXPECT_EQ_INT(crun_fsdp_sched_post_backward(s, 1), 0);
  crun_fsdp_sched_free(s);
  /* prefetch off: each unit gathered when needed, nothing ahead */
  EXPECT_OK(crun_fsdp_sched_new(2, CRUN_FSDP_FULL_SHARD, 0, 0, &s));
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 0, 1, &st));
  expect_step(&st, 1, 1, -1);
  EXPECT_OK(crun_fsdp_sched_pre_backward(s, 1, &st));
  expect_step(&st, 1, 1, -1);
  crun_fsdp_sched_free(s);
}

TEST(sched_backward_order) {
  crun_fsdp_sched_t *s = NULL;
  crun_fsdp_step_t st;
  /* unit 1's backward ran first: unit 2's prefetch skips it for unit 0 */
  EXPECT_OK(crun_fsdp_sched_new(3, CRUN_FSDP_FULL_SHARD, 1, 1, &s));
  EXPECT_EQ_INT(crun_fsdp_sched_post_backward(s, 1), 0); /* not gathered: nothing to free */
  EXPECT_OK(crun_fsdp_sched_pre_backward(s, 2, &st));
  expect_step(&st, 1, 1, 0);
  /* backward ends with unit 0's prefetch unused: it is dropped */
  EXPECT_EQ_INT(crun_fsdp_sched_post_backward(s, 2), 1);
  expect_states(s, 3, "GSS");
  EXPECT_EQ_INT(crun_fsdp_sched_end_backward(s), 1);
  expect_states(s, 3, "SSS");
  /* a forward makes the unit's backward pending again */
  EXPECT_OK(crun_fsdp_sched_pre_forward(s, 1, 0, &st));
  EXPECT_EQ_INT(crun_fsdp_sched_post_forward(s, 1), 1);
  EXPECT_OK(crun_fsdp_sched_pre_backward(s, 2, &st));
  expect_step(&st, 1, 1, 1);
  crun_fsdp_sched_free(s);
}

TEST(sched_misuse) {
  crun_fsdp_sched_t *s = NULL;
  crun_fsdp_step_t st;
  EXPECT_STATUS(crun_fsdp_sched_new(-1, CRUN_FSDP_FULL_SHARD, 1, 1, &s), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_sched_new(2, (crun_fsdp_strategy_t)7, 1, 1, &s), CRUN_EINVAL);
  EXPECT_TEXT("unknown sharding strategy 7");
  EXPECT_OK(crun_fsdp_sched_new(2, CRUN_FSDP_FULL_SHARD, 1, 1, &s));
  EXPECT_STATUS(crun_fsdp_sched_pre_forward(s, 2, 1, &st), CRUN_EINVAL);
  EXPECT_TEXT("unit 2 is not in [0, 2)");
  EXPECT_STATUS(crun_fsdp_sched_pre_backward(s, -1, &st), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_sched_post_forward(s, 5), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_sched_post_backward(s, 5), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_sched_state(s, 2), CRUN_EINVAL);
  EXPECT_STATUS(crun_fsdp_sched_pre_forward(s, 0, 1, NULL), CRUN_EINVAL);
  crun_fsdp_sched_free(s);
  /* no units at all is a schedule too */
  EXPECT_OK(crun_fsdp_sched_new(0, CRUN_FSDP_SHARD_GRAD_OP, 1, 1, &s));
  EXPECT_EQ_INT(crun_fsdp_sched_end_backward(s), 0);
  crun_fsdp_sched_free(s);
  crun_fsdp_sched_free(NULL);
}

#define CRUN_TESTS(X) X(layout) X(empty) X(shard_range) X(bad_input) X(overflow) X(flatten) X(views) X(copy_misuse) \
  X(sched_full_shard) X(sched_shard_grad_op) X(sched_no_shard_and_no_prefetch) X(sched_backward_order) X(sched_misuse)
CRUN_TEST_MAIN()
