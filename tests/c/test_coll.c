/* test_coll.c — every collective x op x dtype x world size 1..4 x counts
 * 0, 1, 7, 100003 on forked ranks, checked on every rank against a reference
 * computed locally from every rank's (exactly representable) inputs. Also
 * every algorithm forced with CRUN_ALGO. */
#include <stdlib.h>

#include "test_pg_util.h"

static const size_t counts[] = {0, 1, 7, 100003};
#define NCOUNTS (sizeof counts / sizeof counts[0])

/* Rank r's input element i for op (small integers: exact in every dtype). */
static double value(int r, size_t i, crun_reduce_op_t op, int salt) {
  if (op == CRUN_OP_PRODUCT) return (double)((r + i + (size_t)salt) % 3 + 1);
  return (double)((r * 3 + i * 5 + (size_t)salt) % 8);
}

static void *fill(crun_dtype_t dt, size_t n, int r, crun_reduce_op_t op, int salt) {
  char *b = malloc(n * crun_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++) crun_elem_set_double(dt, b, (int64_t)i, value(r, i, op, salt));
  return b;
}

/* The reduction over every rank's input, as every rank must see it. */
static void *reference(crun_dtype_t dt, size_t n, int size, crun_reduce_op_t op, int salt) {
  const void *srcs[8];
  for (int r = 0; r < size; r++) srcs[r] = fill(dt, n, r, op, salt);
  void *out = malloc(n * crun_dtype_size(dt) + 1);
  crun_reduce_n(dt, op, out, srcs, size, n);
  if (op == CRUN_OP_AVG) crun_scale_div(dt, out, n, size);
  for (int r = 0; r < size; r++) free((void *)srcs[r]);
  return out;
}

static void expect_same(const void *a, const void *b, size_t bytes, const char *what, int rank) {
  if (bytes && memcmp(a, b, bytes) != 0)
    crun_test_fail(__FILE__, __LINE__, "%s: wrong result on rank %d", what, rank);
}

/* all_reduce, reduce and reduce_scatter for one dtype/op/count. */
static void check_reductions(crun_pg_t *pg, crun_dtype_t dt, crun_reduce_op_t op, size_t n) {
  int r = crun_pg_rank(pg), p = crun_pg_size(pg), root = p - 1;
  size_t es = crun_dtype_size(dt);
  void *ref = reference(dt, n, p, op, 0), *buf = fill(dt, n, r, op, 0), *mine = fill(dt, n, r, op, 0);
  EXPECT_OK(crun_pg_all_reduce(pg, buf, n, dt, op, NULL, NULL));
  expect_same(buf, ref, n * es, "all_reduce", r);
  memcpy(buf, mine, n * es);
  EXPECT_OK(crun_pg_reduce(pg, buf, n, dt, op, root, NULL, NULL));
  expect_same(buf, r == root ? ref : mine, n * es, "reduce", r);
  const void *ins[8];
  for (int b = 0; b < p; b++) ins[b] = fill(dt, n, r, op, b);
  void *rref = reference(dt, n, p, op, r);
  EXPECT_OK(crun_pg_reduce_scatter(pg, buf, ins, n, dt, op, NULL, NULL));
  expect_same(buf, rref, n * es, "reduce_scatter", r);
  for (int b = 0; b < p; b++) free((void *)ins[b]);
  free(rref);
  free(ref);
  free(buf);
  free(mine);
}

/* broadcast, all_gather, gather, scatter, all_to_all for one dtype/count. */
static void check_moves(crun_pg_t *pg, crun_dtype_t dt, size_t n) {
  int r = crun_pg_rank(pg), p = crun_pg_size(pg), root = p > 1 ? 1 : 0;
  size_t es = crun_dtype_size(dt);
  void *outs[8], *exp_[8];
  const void *ins[8];
  size_t cnt[8];
  for (int j = 0; j < p; j++) { outs[j] = calloc(1, n * es + 1); exp_[j] = fill(dt, n, j, CRUN_OP_SUM, 0); cnt[j] = n; }
  void *buf = fill(dt, n, r, CRUN_OP_SUM, 0);
  EXPECT_OK(crun_pg_broadcast(pg, buf, n, dt, root, NULL, NULL));
  expect_same(buf, exp_[root], n * es, "broadcast", r);
  void *in = fill(dt, n, r, CRUN_OP_SUM, 0);
  EXPECT_OK(crun_pg_all_gather(pg, outs, in, n, dt, NULL, NULL));
  for (int j = 0; j < p; j++) expect_same(outs[j], exp_[j], n * es, "all_gather", r);
  for (int j = 0; j < p; j++) memset(outs[j], 0, n * es);
  EXPECT_OK(crun_pg_gather(pg, in, outs, n, dt, root, NULL, NULL));
  for (int j = 0; r == root && j < p; j++) expect_same(outs[j], exp_[j], n * es, "gather", r);
  for (int j = 0; j < p; j++) ins[j] = fill(dt, n, r * 8 + j, CRUN_OP_SUM, 1);
  EXPECT_OK(crun_pg_scatter(pg, buf, ins, n, dt, root, NULL, NULL));
  void *want = fill(dt, n, root * 8 + r, CRUN_OP_SUM, 1);
  expect_same(buf, want, n * es, "scatter", r);
  EXPECT_OK(crun_pg_all_to_all(pg, outs, cnt, ins, cnt, dt, NULL, NULL));
  for (int j = 0; j < p; j++) {
    void *w = fill(dt, n, j * 8 + r, CRUN_OP_SUM, 1);
    expect_same(outs[j], w, n * es, "all_to_all", r);
    free(w);
  }
  for (int j = 0; j < p; j++) { free(outs[j]); free(exp_[j]); free((void *)ins[j]); }
  free(buf);
  free(in);
  free(want);
}

static void matrix(crun_pg_t *pg, void *arg) {
  (void)arg;
  for (int dt = 0; dt < CRUN_DTYPE_COUNT; dt++)
    for (size_t k = 0; k < NCOUNTS; k++) {
      for (int op = 0; op < CRUN_OP_COUNT; op++)
        if (crun_reduce_op_check((crun_dtype_t)dt, (crun_reduce_op_t)op) == 0)
          check_reductions(pg, (crun_dtype_t)dt, (crun_reduce_op_t)op, counts[k]);
      check_moves(pg, (crun_dtype_t)dt, counts[k]);
    }
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
}

/* With the default engine choice (shared memory takes what it supports). */
TEST(world_1) { pg_spawn(1, matrix, NULL); }
TEST(world_2) { pg_spawn(2, matrix, NULL); }
TEST(world_3) { pg_spawn(3, matrix, NULL); }
TEST(world_4) { pg_spawn(4, matrix, NULL); }

/* Over TCP alone. */
TEST(tcp_world_2) { setenv("CRUN_SHM", "0", 1); pg_spawn(2, matrix, NULL); }
TEST(tcp_world_3) { setenv("CRUN_SHM", "0", 1); pg_spawn(3, matrix, NULL); }
TEST(tcp_world_4) { setenv("CRUN_SHM", "0", 1); pg_spawn(4, matrix, NULL); }

/* Forces every non-default algorithm on 3 and 4 ranks (float32, int32). */
static void forced(crun_pg_t *pg, void *arg) {
  (void)arg;
  for (size_t k = 0; k < NCOUNTS; k++) {
    check_reductions(pg, CRUN_FLOAT32, CRUN_OP_SUM, counts[k]);
    check_reductions(pg, CRUN_INT32, CRUN_OP_MAX, counts[k]);
    check_moves(pg, CRUN_FLOAT32, counts[k]);
  }
}

TEST(algo_ring_chain) {
  setenv("CRUN_SHM", "0", 1);
  setenv("CRUN_ALGO", "ring,chain", 1);
  pg_spawn(3, forced, NULL);
  pg_spawn(4, forced, NULL);
}

TEST(algo_rd_binomial) {
  setenv("CRUN_SHM", "0", 1);
  setenv("CRUN_ALGO", "rd,binomial", 1);
  pg_spawn(3, forced, NULL);
  pg_spawn(4, forced, NULL);
}

/* The ring run slice by slice (4 KiB slices: many slices and a remainder). */
TEST(algo_ring_sliced) {
  setenv("CRUN_SHM", "0", 1);
  setenv("CRUN_ALGO", "ring", 1);
  setenv("CRUN_RING_SLICE", "4096", 1);
  pg_spawn(3, forced, NULL);
  pg_spawn(4, forced, NULL);
}

/* float16/bfloat16 reductions accumulate in float32 and round once: 2048 + 1
 * + 1 + 1 is 2051 -> 2052 in float16 (pairwise float16 sums would stay 2048);
 * for bfloat16, 256 + 1 + 1 + 1 = 259 -> 260. Checked for every algorithm. */
static void half_accumulation(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), p = crun_pg_size(pg);
  enum { N = 300000 };
  crun_dtype_t dts[2] = {CRUN_FLOAT16, CRUN_BFLOAT16};
  double big[2] = {2048, 256}, want[2] = {2052, 260};
  uint16_t *buf = malloc(N * 2), *ins[4], *out = malloc(N * 2);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < N; i++) crun_elem_set_double(dts[k], buf, i, r == 0 ? big[k] : 1);
    EXPECT_OK(crun_pg_all_reduce(pg, buf, N, dts[k], CRUN_OP_SUM, NULL, NULL));
    EXPECT(crun_elem_get_double(dts[k], buf, 0) == want[k] && crun_elem_get_double(dts[k], buf, N - 1) == want[k]);
    for (int i = 0; i < N; i++) crun_elem_set_double(dts[k], buf, i, r == 0 ? big[k] : 1);
    EXPECT_OK(crun_pg_reduce(pg, buf, N, dts[k], CRUN_OP_SUM, p - 1, NULL, NULL));
    EXPECT(crun_elem_get_double(dts[k], buf, 7) == (r == p - 1 ? want[k] : (r == 0 ? big[k] : 1)));
    for (int j = 0; j < p; j++) {
      ins[j] = malloc(N * 2);
      for (int i = 0; i < N; i++) crun_elem_set_double(dts[k], ins[j], i, r == 0 ? big[k] : 1);
    }
    EXPECT_OK(crun_pg_reduce_scatter(pg, out, (const void *const *)ins, N, dts[k], CRUN_OP_SUM, NULL, NULL));
    EXPECT(crun_elem_get_double(dts[k], out, N / 2) == want[k]);
    for (int j = 0; j < p; j++) free(ins[j]);
  }
  free(buf);
  free(out);
}

TEST(half_accumulates_in_float32) {
  setenv("CRUN_SHM", "0", 1);
  pg_spawn(4, half_accumulation, NULL);
  setenv("CRUN_ALGO", "ring", 1);
  pg_spawn(4, half_accumulation, NULL);
  setenv("CRUN_ALGO", "rd", 1);
  pg_spawn(4, half_accumulation, NULL);
  setenv("CRUN_SHM", "1", 1);
  unsetenv("CRUN_ALGO");
  pg_spawn(4, half_accumulation, NULL);
}

#define CRUN_TESTS(X) X(world_1) X(world_2) X(world_3) X(world_4) X(tcp_world_2) X(tcp_world_3) \
  X(tcp_world_4) X(algo_ring_chain) X(algo_rd_binomial) X(algo_ring_sliced) \
  X(half_accumulates_in_float32)
CRUN_TEST_MAIN()
