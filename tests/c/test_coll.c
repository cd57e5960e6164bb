/* test_coll.c — every collective x op x dtype x world size 1..4 x counts
 * 0, 1, 7, 100003 on forked ranks, checked on every rank against closed-form
 * expectations (see put_value / reference: no reduction kernel involved). Also
 * every algorithm forced with CRUN_ALGO. */
#include <stdlib.h>

#include "test_pg_util.h"

static const size_t counts[] = {0, 1, 7, 100003};
#define NCOUNTS (sizeof counts / sizeof counts[0])

/* Inputs, signed and non-periodic, built so that every reduction over ranks
 * 0..p-1 has a closed form (no reduction kernel computes the expectation):
 *   sum/avg, min/max: v = a(i) + r * b(i), a and b hashes of i; integers
 *     span the dtype's range for sum (wrapping), min/max keep a + r*b in range;
 *     floats are multiples of 1/8 whose partial sums are exact in the dtype;
 *   product: c(i) on rank 0, then +-1 by the parity of r + i;
 *   band/bor/bxor: m(i) (low 4 bits clear) | 1 << r;
 *   bool: bit r of a hash of i. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int is_float(crun_dtype_t dt) {
  return dt == CRUN_FLOAT32 || dt == CRUN_FLOAT64 || dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16;
}

static void int_range(crun_dtype_t dt, int64_t *lo, int64_t *hi) {
  switch (dt) {
    case CRUN_INT8: *lo = -128; *hi = 127; break;
    case CRUN_INT16: *lo = -32768; *hi = 32767; break;
    case CRUN_INT32: *lo = INT32_MIN; *hi = INT32_MAX; break;
    case CRUN_UINT8: *lo = 0; *hi = 255; break;
    default: *lo = -(INT64_C(1) << 62); *hi = INT64_C(1) << 62; break;
  }
}

#define B 3 /* |b| for integer min/max */

typedef struct { double fa, fb, fc; int64_t a, b, c, m; uint64_t h; } terms_t;

static terms_t terms(crun_dtype_t dt, size_t i, int salt) {
  terms_t t;
  uint64_t h = mix(i * 1000003u + (uint64_t)salt), h2 = mix(h), h3 = mix(h2);
  t.h = h;
  int64_t K = dt == CRUN_FLOAT16 ? 256 : dt == CRUN_BFLOAT16 ? 32 : 65536;
  int64_t J = dt == CRUN_FLOAT16 ? 8 : dt == CRUN_BFLOAT16 ? 4 : 64;
  t.fa = (double)((int64_t)(h % (uint64_t)(2 * K + 1)) - K) / 8;
  t.fb = (double)((int64_t)(h2 % (uint64_t)(2 * J + 1)) - J) / 8;
  t.fc = (double)((int64_t)(h3 % 7) - 3) / 2;
  int64_t lo, hi;
  int_range(dt, &lo, &hi);
  t.a = (int64_t)h;  /* wrapped into the dtype when stored */
  t.b = (int64_t)h2;
  t.c = (int64_t)h3;
  t.m = (int64_t)(h & ~UINT64_C(0xf));
  (void)lo; (void)hi;
  return t;
}

/* min/max terms: a within [lo + 4B, hi - 4B], b in [-B, B]. */
static void minmax_terms(crun_dtype_t dt, const terms_t *t, double *a, double *b, int64_t *ia, int64_t *ib) {
  int64_t lo, hi;
  int_range(dt, &lo, &hi);
  uint64_t span = (uint64_t)hi - (uint64_t)lo + 1 - 8 * B; /* hi - lo overflows int64 for int64 */
  *ia = lo + 4 * B + (int64_t)(t->h % span);
  *ib = (int64_t)(mix(t->h + 1) % (2 * B + 1)) - B;
  *a = t->fa;
  *b = t->fb;
}

static int64_t wrap_to(crun_dtype_t dt, int64_t v) {
  unsigned char buf[8];
  crun_elem_set_int64(dt, buf, 0, v);
  return crun_elem_get_int64(dt, buf, 0);
}

static void put(crun_dtype_t dt, void *b, size_t i, double f, int64_t v) {
  if (is_float(dt)) crun_elem_set_double(dt, b, (int64_t)i, f);
  else crun_elem_set_int64(dt, b, (int64_t)i, v);
}

/* Rank r's input element i for op. */
static void put_value(crun_dtype_t dt, void *b, int r, size_t i, crun_reduce_op_t op, int salt) {
  terms_t t = terms(dt, i, salt);
  if (dt == CRUN_BOOL) { crun_elem_set_int64(dt, b, (int64_t)i, (int64_t)((t.h >> r) & 1)); return; }
  int64_t sign = (r + i) % 2 ? -1 : 1;
  switch (op) {
    case CRUN_OP_PRODUCT: put(dt, b, i, r == 0 ? t.fc : (double)sign, r == 0 ? t.c : sign); break;
    case CRUN_OP_MIN: case CRUN_OP_MAX: {
      double a, bb;
      int64_t ia, ib;
      minmax_terms(dt, &t, &a, &bb, &ia, &ib);
      put(dt, b, i, a + r * bb, ia + r * ib);
      break;
    }
    case CRUN_OP_BAND: case CRUN_OP_BOR: case CRUN_OP_BXOR:
      put(dt, b, i, 0, t.m | (INT64_C(1) << r)); break;
    default: /* sum, avg */
      put(dt, b, i, t.fa + r * t.fb, (int64_t)((uint64_t)t.a + (uint64_t)r * (uint64_t)t.b)); break;
  }
}

static void *fill(crun_dtype_t dt, size_t n, int r, crun_reduce_op_t op, int salt) {
  char *b = malloc(n * crun_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++) put_value(dt, b, r, i, op, salt);
  return b;
}

/* The reduction over ranks 0..size-1 in closed form, as every rank must see it. */
static void *reference(crun_dtype_t dt, size_t n, int size, crun_reduce_op_t op, int salt) {
  void *out = malloc(n * crun_dtype_size(dt) + 1);
  uint64_t p = (uint64_t)size, tri = p * (p - 1) / 2, mask = (UINT64_C(1) << size) - 1;
  for (size_t i = 0; i < n; i++) {
    terms_t t = terms(dt, i, salt);
    if (dt == CRUN_BOOL) {
      uint64_t bits = t.h & mask;
      int v = op == CRUN_OP_SUM || op == CRUN_OP_MAX || op == CRUN_OP_BOR ? bits != 0
            : op == CRUN_OP_BXOR ? __builtin_popcountll(bits) & 1 : bits == mask;
      crun_elem_set_int64(dt, out, (int64_t)i, v);
      continue;
    }
    int flips = (int)(i % 2 == 0 ? p / 2 : (p - 1) / 2); /* ranks 1..p-1 giving -1 */
    double a, b;
    int64_t ia, ib;
    switch (op) {
      case CRUN_OP_PRODUCT:
        put(dt, out, i, flips % 2 ? -t.fc : t.fc, (int64_t)((uint64_t)t.c * (flips % 2 ? UINT64_MAX : 1)));
        break;
      case CRUN_OP_MIN:
        minmax_terms(dt, &t, &a, &b, &ia, &ib);
        put(dt, out, i, a + (b < 0 ? (double)(size - 1) * b : 0), ia + (ib < 0 ? (size - 1) * ib : 0));
        break;
      case CRUN_OP_MAX:
        minmax_terms(dt, &t, &a, &b, &ia, &ib);
        put(dt, out, i, a + (b > 0 ? (double)(size - 1) * b : 0), ia + (ib > 0 ? (size - 1) * ib : 0));
        break;
      case CRUN_OP_BAND: put(dt, out, i, 0, t.m | (size == 1 ? 1 : 0)); break;
      case CRUN_OP_BOR: put(dt, out, i, 0, t.m | (int64_t)mask); break;
      case CRUN_OP_BXOR: put(dt, out, i, 0, (size % 2 ? t.m : 0) ^ (int64_t)mask); break;
      default: { /* sum, avg: p*a + b*p(p-1)/2 */
        double fs = (double)size * t.fa + (double)tri * t.fb;
        int64_t is = (int64_t)(p * (uint64_t)t.a + tri * (uint64_t)t.b);
        if (op == CRUN_OP_AVG) {
          if (dt == CRUN_FLOAT32) fs = (double)((float)fs / (float)size);
          else if (dt == CRUN_FLOAT64) fs = fs / size;
          else fs = (double)(float)(fs / size); /* half: float32 quotient, then rounded */
          is = wrap_to(dt, is) / size;            /* integers: truncating */
        }
        put(dt, out, i, fs, is);
      }
    }
  }
  return out;
}

static void expect_same(const void *a, const void *b, size_t bytes, const char *what, int rank) {
  if (bytes && memcmp(a, b, bytes) != 0)
    crun_test_fail(__FILE__, __LINE__, "%s: wrong result on rank %d", what, rank);
}

/* all_reduce, reduce and reduce_scatter for one dtype/op/count. */
static void check_reductions(crun_pg_t *pg, crun_dtype_t dt, crun_reduce_op_t op, size_t n) {
  int r = crun_pg_rank(pg), p = crun_pg_size(pg), root = (int)((n + (size_t)dt + (size_t)op) % (size_t)p);
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
  int r = crun_pg_rank(pg), p = crun_pg_size(pg), root = (int)((n + (size_t)dt) % (size_t)p);
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
        if (op != CRUN_OP_PREMUL_SUM && crun_reduce_op_check((crun_dtype_t)dt, (crun_reduce_op_t)op) == 0)
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
