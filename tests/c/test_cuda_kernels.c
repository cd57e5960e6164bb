/* test_cuda_kernels.c — the per-element bodies of runtime/cuda/kernels/,
 * run through the host launchers of tests/gpu_double/launch_host.c, held
 * against the CPU kernels (bit for bit where both run the same arithmetic
 * on the host) and against independently computed values: Philox4x32-10
 * against Random123's published known answers, reductions split the way a
 * thread block splits them, sizes that cross the 256-thread block (1, 255,
 * 257, 65537), signed non-periodic inputs. */
#include "harness.h"

#include <math.h>

#include "cuda/kernels/elementwise.h"
#include "cuda/kernels/philox.h"
#include "cuda/kernels/reduce.h"
#include "cuda/launch.h"
#include "tensor/half.h"

static const int64_t SIZES[] = {1, 255, 257, 65537};
#define NSIZES (int)(sizeof SIZES / sizeof SIZES[0])

/* A tensor of signed, non-periodic values (splitmix64 stream of `seed`),
 * integral and in range for integer dtypes. */
static crun_tensor_t *rnd(crun_dtype_t dt, int nd, const int64_t *shape, uint64_t seed) {
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(dt, nd, shape, &t));
  for (int64_t i = 0; i < crun_tensor_numel(t); i++) {
    double u = (double)(crun_splitmix64_next(&seed) >> 11) * 0x1p-53;
    double v = crun_dtype_is_integer(dt) ? floor(u * 200.0) - (dt == CRUN_UINT8 ? 0 : 100) : (u - 0.5) * 7.3;
    crun_elem_set_double(dt, crun_tensor_data(t), i, v);
  }
  return t;
}

static crun_tensor_t *rnd1(crun_dtype_t dt, int64_t n, uint64_t seed) { return rnd(dt, 1, &n, seed); }

static crun_tensor_t *like(crun_tensor_t *t) {
  crun_tensor_t *o;
  EXPECT_OK(crun_tensor_new(crun_tensor_dtype(t), crun_tensor_ndim(t), crun_tensor_shape(t), &o));
  return o;
}

/* Fails unless a and b hold the same bytes (nan payloads included). */
static void same_bytes(const char *what, crun_tensor_t *a, crun_tensor_t *b) {
  size_t es = crun_dtype_size(crun_tensor_dtype(a)), n = (size_t)crun_tensor_numel(a);
  EXPECT_EQ_INT(crun_tensor_numel(a), crun_tensor_numel(b));
  const unsigned char *pa = crun_tensor_data(a), *pb = crun_tensor_data(b);
  for (size_t i = 0; i < n; i++)
    if (memcmp(pa + i * es, pb + i * es, es) != 0)
      crun_test_fail(__FILE__, __LINE__, "%s: element %zu differs: %.17g vs %.17g", what, i,
                     crun_elem_get_double(crun_tensor_dtype(a), pa, (int64_t)i),
                     crun_elem_get_double(crun_tensor_dtype(b), pb, (int64_t)i));
}

static crun__kgeo_t geo_of(crun_tensor_t *t, int nd, const int64_t *shape) {
  crun__kgeo_t g = {nd, {0}, {0}};
  int off = nd - crun_tensor_ndim(t);
  for (int d = 0; d < nd; d++) {
    g.shape[d] = shape[d];
    int td = d - off;
    g.stride[d] = td < 0 || crun_tensor_shape(t)[td] == 1 ? 0 : crun_tensor_strides(t)[td];
  }
  return g;
}

#define DATA(t) ((char *)crun_tensor_data(t))

/* ---------------------------------------------------------------- Philox */

TEST(philox_known_answers) {
  /* Random123 (Salmon et al. 2011) kat_vectors for philox4x32_10 */
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
       0xa20bc7c6u, 0x6d5451fdu},
      {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
       0x5001e420u, 0x24126ea1u}};
  for (int k = 0; k < 3; k++) {
    crun__philox_ctr_t c = {{kat[k][0], kat[k][1], kat[k][2], kat[k][3]}};
    crun__philox_ctr_t r = crun__k_philox4x32_10(c, kat[k][4], kat[k][5]);
    for (int w = 0; w < 4; w++)
      if (r.v[w] != kat[k][6 + w])
        crun_test_fail(__FILE__, __LINE__, "vector %d word %d: %08x, expected %08x", k, w, r.v[w], kat[k][6 + w]);
  }
}

TEST(dropout_reproducible_and_geometry_free) {
  for (int f = 0; f < 2; f++) {
    crun_dtype_t dt = f ? CRUN_FLOAT64 : CRUN_FLOAT32;
    int64_t n = 65537;
    crun_tensor_t *x = rnd1(dt, n, 7), *y = like(x), *m = like(x), *y2 = like(x), *m2 = like(x);
    EXPECT_OK(crun__cuda_dropout(dt, DATA(x), DATA(y), DATA(m), n, 0.3, 0x1234abcdULL, 5, NULL));
    EXPECT_OK(crun__cuda_dropout(dt, DATA(x), DATA(y2), DATA(m2), n, 0.3, 0x1234abcdULL, 5, NULL));
    same_bytes("same seed", m, m2);
    /* element i alone, in reverse order and in odd chunks: the same draw */
    int64_t dropped = 0;
    double keep = 1.0 / 0.7;
    for (int64_t i = n - 1; i >= 0; i -= 1) {
      double u = crun__k_philox_uniform(0x1234abcdULL, 5, (uint64_t)i);
      double want = u < 0.3 ? 0.0 : keep, got = crun_elem_get_double(dt, DATA(m), i);
      if (f ? got != want : got != (double)(float)want)
        crun_test_fail(__FILE__, __LINE__, "mask[%lld] = %g, expected %g", (long long)i, got, want);
      double yv = crun_elem_get_double(dt, DATA(y), i), xv = crun_elem_get_double(dt, DATA(x), i);
      if (f ? yv != xv * want : yv != (double)((float)xv * (float)want))
        crun_test_fail(__FILE__, __LINE__, "y[%lld] = %g, expected x * mask", (long long)i, yv);
      dropped += want == 0.0;
    }
    /* binomial(65537, 0.3): sd ~ 117; 5 sd */
    EXPECT(fabs((double)dropped - 0.3 * (double)n) < 5 * 117.4);
    EXPECT_OK(crun__cuda_dropout(dt, DATA(x), DATA(y2), DATA(m2), n, 0.3, 0x1234abcdULL, 6, NULL));
    EXPECT(memcmp(DATA(m), DATA(m2), (size_t)n * crun_dtype_size(dt)) != 0);
    EXPECT_STATUS(crun__cuda_dropout(dt, DATA(x), DATA(y2), DATA(m2), n, 1.0, 1, 0, NULL), CRUN_EINVAL);
    crun_tensor_release(x); crun_tensor_release(y); crun_tensor_release(m);
    crun_tensor_release(y2); crun_tensor_release(m2);
  }
}

/* ---------------------------------------------------------------- conversions */

TEST(half_conversions_match_cpu) {
  for (uint32_t h = 0; h < 65536u; h++) {
    if (crun__f32_bits(crun__k_f16_to_f32((uint16_t)h)) != crun__f32_bits(crun__f16_to_f32((uint16_t)h)))
      crun_test_fail(__FILE__, __LINE__, "f16 %04x -> f32 differs", h);
    if (crun__f32_bits(crun__k_bf16_to_f32((uint16_t)h)) != crun__f32_bits(crun__bf16_to_f32((uint16_t)h)))
      crun_test_fail(__FILE__, __LINE__, "bf16 %04x -> f32 differs", h);
  }
  uint64_t s = 99;
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)crun_splitmix64_next(&s);
    if (i < 65536) u = (uint32_t)i << 13 ^ (i & 1u ? 0x80000000u : 0); /* every f16 rounding boundary region */
    float f = crun__bits_f32(u);
    if (crun__k_f32_to_f16(f) != crun__f32_to_f16(f))
      crun_test_fail(__FILE__, __LINE__, "f32 %08x -> f16: %04x vs %04x", u, crun__k_f32_to_f16(f), crun__f32_to_f16(f));
    if (crun__k_f32_to_bf16(f) != crun__f32_to_bf16(f))
      crun_test_fail(__FILE__, __LINE__, "f32 %08x -> bf16 differs", u);
  }
}

/* want = src cast by the kernels' element rule: a float into an integer
 * dtype truncates and saturates (nan -> 0). crun_tensor_copy refuses such
 * values before any kernel runs; the kernel itself must still be defined. */
static void saturating_ref(crun_tensor_t *want, crun_tensor_t *src) {
  crun_tensor_t *c;
  EXPECT_OK(crun_tensor_contiguous(src, &c));
  for (int64_t i = 0; i < crun_tensor_numel(c); i++)
    crun_elem_set_double(crun_tensor_dtype(want), DATA(want), i, crun_elem_get_double(crun_tensor_dtype(c), DATA(c), i));
  crun_tensor_release(c);
}

TEST(copy_casts_strided_and_broadcast) {
  static const crun_dtype_t dts[] = {CRUN_FLOAT32, CRUN_FLOAT64, CRUN_FLOAT16, CRUN_BFLOAT16, CRUN_INT32,
                                     CRUN_INT64, CRUN_UINT8, CRUN_INT8, CRUN_INT16, CRUN_BOOL};
  int64_t shape[3] = {3, 257, 2}, tshape[3];
  for (int a = 0; a < 10; a++)
    for (int b = 0; b < 10; b++) {
      crun_tensor_t *src = rnd(dts[a], 3, shape, 11 + a), *srcT, *want, *got;
      if (dts[a] == CRUN_FLOAT64) crun_elem_set_double(CRUN_FLOAT64, DATA(src), 5, 1e300); /* saturates */
      if (dts[a] == CRUN_FLOAT32) crun_elem_set_double(CRUN_FLOAT32, DATA(src), 6, NAN);
      EXPECT_OK(crun_tensor_transpose(src, 0, 2, &srcT)); /* 2 x 257 x 3, strided */
      for (int d = 0; d < 3; d++) tshape[d] = crun_tensor_shape(srcT)[d];
      EXPECT_OK(crun_tensor_new(dts[b], 3, tshape, &want));
      EXPECT_OK(crun_tensor_new(dts[b], 3, tshape, &got));
      if (crun_dtype_is_integer(dts[b]) && !crun_dtype_is_integer(dts[a]) && dts[a] != CRUN_BOOL) {
        saturating_ref(want, srcT);
        if (dts[a] == CRUN_FLOAT64 || dts[a] == CRUN_FLOAT32) /* 1e300, nan */
          EXPECT_STATUS(crun_tensor_copy(got, srcT), CRUN_EINVAL);
      } else {
        EXPECT_OK(crun_tensor_copy(want, srcT));
      }
      crun__kgeo_t dg = geo_of(got, 3, tshape), sg = geo_of(srcT, 3, tshape);
      EXPECT_OK(crun__cuda_copy(dts[b], DATA(got), &dg, dts[a], (char *)crun_tensor_data(srcT), &sg, NULL));
      same_bytes("copy", want, got);
      crun_tensor_release(src); crun_tensor_release(srcT); crun_tensor_release(want); crun_tensor_release(got);
    }
  /* broadcast: a [257] row repeated over 3 rows */
  int64_t n = 257, s2[2] = {3, 257};
  crun_tensor_t *row = rnd1(CRUN_FLOAT32, n, 3), *out;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, 2, s2, &out));
  crun__kgeo_t dg = geo_of(out, 2, s2), sg = geo_of(row, 2, s2);
  EXPECT_OK(crun__cuda_copy(CRUN_FLOAT64, DATA(out), &dg, CRUN_FLOAT32, DATA(row), &sg, NULL));
  for (int64_t r = 0; r < 3; r++)
    for (int64_t j = 0; j < n; j++)
      EXPECT(((double *)DATA(out))[r * n + j] == (double)((float *)DATA(row))[j]);
  crun_tensor_release(row); crun_tensor_release(out);
}

TEST(fill_every_dtype) {
  for (int dt = 0; dt < CRUN_DTYPE_COUNT; dt++)
    for (int k = 0; k < NSIZES; k++) {
      crun_tensor_t *want = rnd1((crun_dtype_t)dt, SIZES[k], 1), *got = like(want);
      EXPECT_OK(crun_tensor_fill(want, -2.71828));
      EXPECT_OK(crun__cuda_fill((crun_dtype_t)dt, DATA(got), SIZES[k], -2.71828, NULL));
      same_bytes("fill", want, got);
      crun_tensor_release(want); crun_tensor_release(got);
    }
}

/* ---------------------------------------------------------------- elementwise */

static const crun_dtype_t BIN_DTS[] = {CRUN_FLOAT32, CRUN_FLOAT64, CRUN_INT32, CRUN_INT64, CRUN_UINT8, CRUN_INT8,
                                       CRUN_INT16};

/* out = a op b through the launcher, with a and b broadcast to the CPU's result shape. */
static void check_binary(crun_binop_t op, crun_tensor_t *a, crun_tensor_t *b) {
  crun_tensor_t *want, *got;
  EXPECT_OK(crun_tensor_binop(op, a, b, &want));
  got = like(want);
  int nd = crun_tensor_ndim(want);
  const int64_t *shape = crun_tensor_shape(want);
  crun__kgeo_t ga = geo_of(a, nd, shape), gb = geo_of(b, nd, shape);
  EXPECT_OK(crun__cuda_binary(op, crun_tensor_dtype(a), DATA(got), DATA(a), &ga, DATA(b), &gb, 0, NULL));
  same_bytes(crun_binop_name(op), want, got);
  crun_tensor_release(want); crun_tensor_release(got);
}

TEST(binary_matches_cpu) {
  for (size_t d = 0; d < sizeof BIN_DTS / sizeof BIN_DTS[0]; d++)
    for (int op = 0; op < CRUN_BINOP_COUNT; op++) {
      crun_dtype_t dt = BIN_DTS[d];
      if (!crun__k_bin_supported(dt, op)) {
        int64_t one = 1;
        crun__kgeo_t g = {1, {1}, {1}};
        char buf[8] = {0};
        EXPECT_STATUS(crun__cuda_binary((crun_binop_t)op, dt, buf, buf, &g, buf, &g, 0, NULL), CRUN_ENOTSUP);
        (void)one;
        continue;
      }
      for (int k = 0; k < NSIZES; k++) {
        crun_tensor_t *a = rnd1(dt, SIZES[k], 100 + k), *b = rnd1(dt, SIZES[k], 200 + k);
        if (crun_dtype_is_integer(dt) == 0 && SIZES[k] > 3) {
          crun_elem_set_double(dt, DATA(a), 1, NAN);
          crun_elem_set_double(dt, DATA(b), 2, NAN);
          crun_elem_set_double(dt, DATA(b), 3, crun_elem_get_double(dt, DATA(a), 3)); /* a tie */
        }
        check_binary((crun_binop_t)op, a, b);
        /* scalar and reversed scalar */
        crun_tensor_t *want, *got = NULL;
        for (int rev = 0; rev < 2; rev++) {
          double sc = dt == CRUN_UINT8 ? 3.0 : -3.0; /* uint8 cannot hold -3 */
          EXPECT_OK(crun_tensor_binop_scalar((crun_binop_t)op, a, sc, rev, &want));
          got = like(want);
          EXPECT_OK(crun__cuda_binary_scalar((crun_binop_t)op, dt, DATA(got), DATA(a), SIZES[k], sc, rev, NULL));
          same_bytes("scalar", want, got);
          crun_tensor_release(want); crun_tensor_release(got);
        }
        crun_tensor_release(a); crun_tensor_release(b);
      }
      /* broadcasting: [5, 1, 257] op [3, 1] and [257, 3] op [3] */
      int64_t sa[3] = {5, 1, 257}, sb[2] = {3, 1}, sc[2] = {257, 3}, sd[1] = {3};
      crun_tensor_t *a = rnd(dt, 3, sa, 1), *b = rnd(dt, 2, sb, 2), *c = rnd(dt, 2, sc, 3), *e = rnd(dt, 1, sd, 4);
      check_binary((crun_binop_t)op, a, b);
      check_binary((crun_binop_t)op, b, a);
      check_binary((crun_binop_t)op, c, e);
      crun_tensor_release(a); crun_tensor_release(b); crun_tensor_release(c); crun_tensor_release(e);
    }
  char buf[8] = {0};
  EXPECT_STATUS(crun__cuda_binary_scalar(CRUN_BIN_ADD, CRUN_INT32, buf, buf, 1, 0.5, 0, NULL), CRUN_ENOTSUP);
  EXPECT_STATUS(crun__cuda_binary_scalar(CRUN_BIN_ADD, CRUN_INT8, buf, buf, 1, 300, 0, NULL), CRUN_ERANGE);
}

TEST(unary_and_clamp_match_cpu) {
  for (int f = 0; f < 2; f++) {
    crun_dtype_t dt = f ? CRUN_FLOAT64 : CRUN_FLOAT32;
    for (int k = 0; k < NSIZES; k++) {
      crun_tensor_t *a = rnd1(dt, SIZES[k], 300 + k), *want, *got = like(a);
      if (SIZES[k] > 2) crun_elem_set_double(dt, DATA(a), 2, NAN);
      for (int op = 0; op < CRUN_UNOP_COUNT; op++) {
        EXPECT_OK(crun_tensor_unop((crun_unop_t)op, a, &want));
        EXPECT_OK(crun__cuda_unary((crun_unop_t)op, dt, DATA(got), DATA(a), SIZES[k], NULL));
        same_bytes(crun_unop_name((crun_unop_t)op), want, got);
        crun_tensor_release(want);
      }
      EXPECT_OK(crun_tensor_clamp(a, -1.25, 0.5, &want));
      EXPECT_OK(crun__cuda_clamp(dt, DATA(got), DATA(a), SIZES[k], -1.25, 0.5, NULL));
      same_bytes("clamp", want, got);
      crun_tensor_release(want); crun_tensor_release(a); crun_tensor_release(got);
    }
  }
  char buf[8] = {0};
  EXPECT_STATUS(crun__cuda_unary(CRUN_UN_EXP, CRUN_INT32, buf, buf, 1, NULL), CRUN_ENOTSUP);
}

/* ---------------------------------------------------------------- reductions */

/* Folds [outer, n, 1] rows the way k_reduce_rows does: 256 strided partial
 * accumulators combined pairwise in a tree. */
static void block_fold(int op, crun_dtype_t dt, const void *a, int64_t o, int64_t n, crun__kacc_t *out) {
  crun__kacc_t part[256];
  for (int t = 0; t < 256; t++) {
    part[t] = crun__k_red_init(op);
    for (int64_t k = t; k < n; k += 256) crun__k_red_fold(op, dt, &part[t], a, o * n + k, k);
  }
  for (int w = 128; w > 0; w /= 2)
    for (int t = 0; t < w; t++) crun__k_red_combine(op, dt, &part[t], &part[t + w]);
  *out = part[0];
}

TEST(reduce_dim_matches_cpu) {
  static const crun_dtype_t dts[] = {CRUN_FLOAT32, CRUN_FLOAT64, CRUN_INT32, CRUN_INT64, CRUN_UINT8, CRUN_BFLOAT16};
  int64_t shape[3] = {3, 257, 5};
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (int op = 0; op < CRUN_DIMRED_COUNT; op++) {
      crun_dtype_t dt = dts[d];
      if (op == CRUN_DIMRED_MEAN && crun_dtype_is_integer(dt)) continue;
      if (op == CRUN_DIMRED_PROD && !crun_dtype_is_integer(dt)) continue; /* 1285-term products overflow */
      crun_tensor_t *a = rnd(dt, 3, shape, 400 + d);
      if (dt == CRUN_FLOAT64) {
        crun_elem_set_double(dt, DATA(a), 700, NAN);
        crun_elem_set_double(dt, DATA(a), 9, crun_elem_get_double(dt, DATA(a), 4)); /* ties */
      }
      for (int dim = -1; dim < 3; dim++) {
        crun_tensor_t *V, *I = NULL, *gv, *gi = NULL;
        int want_idx = op == CRUN_DIMRED_MAX || op == CRUN_DIMRED_MIN;
        EXPECT_OK(crun_tensor_reduce_dim((crun_dimred_t)op, a, dim, 0, 1, &V, want_idx ? &I : NULL));
        int64_t outer = 1, n = dim < 0 ? crun_tensor_numel(a) : shape[dim], inner = 1;
        for (int k = 0; dim >= 0 && k < 3; k++) {
          if (k < dim) outer *= shape[k];
          if (k > dim) inner *= shape[k];
        }
        gv = like(V);
        if (I) gi = like(I);
        EXPECT_OK(crun__cuda_reduce_dim((crun_dimred_t)op, dt, DATA(a), outer, n, inner, DATA(gv),
                                        crun_tensor_dtype(V), I ? (int64_t *)DATA(gi) : NULL, 1, NULL));
        same_bytes("reduce values", V, gv);
        if (I) same_bytes("reduce indices", I, gi);
        if (inner == 1) { /* the block's split: positions exact, sums within rounding */
          for (int64_t o = 0; o < outer; o++) {
            crun__kacc_t acc;
            block_fold(op, dt, DATA(a), o, n, &acc);
            _Alignas(8) unsigned char blk8[8];
            int64_t bi = 0;
            crun__k_red_store(op, dt, &acc, n, blk8, crun_tensor_dtype(V), &bi, 0, 1);
            double blk[1] = {crun_elem_get_double(crun_tensor_dtype(V), blk8, 0)};
            double want = crun_elem_get_double(crun_tensor_dtype(V), DATA(V), o);
            if (want_idx) EXPECT_EQ_INT(bi, ((int64_t *)DATA(I))[o]);
            if (!(blk[0] == want || (want != want && blk[0] != blk[0]) ||
                  fabs(blk[0] - want) <= 1e-6 * (1 + fabs(want))))
              crun_test_fail(__FILE__, __LINE__, "block fold op %d dim %d row %lld: %.17g vs %.17g", op, dim,
                             (long long)o, blk[0], want);
          }
        }
        crun_tensor_release(V); crun_tensor_release(I); crun_tensor_release(gv); crun_tensor_release(gi);
      }
      crun_tensor_release(a);
    }
}

TEST(softmax_matches_cpu) {
  int64_t shape[3] = {4, 257, 3};
  for (int f = 0; f < 2; f++) {
    crun_dtype_t dt = f ? CRUN_FLOAT64 : CRUN_FLOAT32;
    crun_tensor_t *a = rnd(dt, 3, shape, 500), *want, *got = like(a);
    for (int dim = 0; dim < 3; dim++)
      for (int lg = 0; lg < 2; lg++) {
        EXPECT_OK(crun_tensor_softmax(a, dim, lg, &want));
        int64_t outer = 1, inner = 1;
        for (int k = 0; k < 3; k++) {
          if (k < dim) outer *= shape[k];
          if (k > dim) inner *= shape[k];
        }
        EXPECT_OK(crun__cuda_softmax(dt, DATA(a), DATA(got), outer, shape[dim], inner, lg, NULL));
        same_bytes("softmax", want, got);
        crun_tensor_release(want);
      }
    crun_tensor_release(a); crun_tensor_release(got);
  }
}

/* ---------------------------------------------------------------- nn */

TEST(activations_and_log_softmax_match_cpu) {
  for (int f = 0; f < 2; f++) {
    crun_dtype_t dt = f ? CRUN_FLOAT64 : CRUN_FLOAT32;
    for (int k = 0; k < NSIZES; k++) {
      int64_t n = SIZES[k];
      crun_tensor_t *x = rnd1(dt, n, 600 + k), *gy = rnd1(dt, n, 700 + k);
      crun_tensor_t *y = like(x), *yg = like(x), *gx = like(x), *gxg = like(x);
      for (int act = 0; act < 3; act++) {
        EXPECT_OK(crun_nn_act_forward((crun_act_t)act, x, y));
        EXPECT_OK(crun__cuda_act_forward((crun_act_t)act, dt, DATA(x), DATA(yg), n, NULL));
        same_bytes("act forward", y, yg);
        EXPECT_OK(crun_nn_act_backward((crun_act_t)act, y, gy, gx));
        EXPECT_OK(crun__cuda_act_backward((crun_act_t)act, dt, DATA(y), DATA(gy), DATA(gxg), n, NULL));
        same_bytes("act backward", gx, gxg);
      }
      EXPECT_OK(crun_nn_mul(x, gy, y));
      EXPECT_OK(crun__cuda_mul(dt, DATA(x), DATA(gy), DATA(yg), n, NULL));
      same_bytes("mul", y, yg);
      crun_tensor_release(x); crun_tensor_release(gy); crun_tensor_release(y); crun_tensor_release(yg);
      crun_tensor_release(gx); crun_tensor_release(gxg);
    }
    for (int k = 0; k < 3; k++) { /* rows x classes: 257 x 10, 1 x 257, 255 x 1 */
      int64_t shape[2] = {k == 0 ? 257 : k == 1 ? 1 : 255, k == 0 ? 10 : k == 1 ? 257 : 1};
      crun_tensor_t *x = rnd(dt, 2, shape, 800 + k), *gy = rnd(dt, 2, shape, 900 + k);
      crun_tensor_t *y = like(x), *yg = like(x), *gx = like(x), *gxg = like(x);
      EXPECT_OK(crun_nn_log_softmax_forward(x, y));
      EXPECT_OK(crun__cuda_log_softmax_forward(dt, DATA(x), DATA(yg), shape[0], shape[1], NULL));
      same_bytes("log_softmax forward", y, yg);
      EXPECT_OK(crun_nn_log_softmax_backward(y, gy, gx));
      EXPECT_OK(crun__cuda_log_softmax_backward(dt, DATA(y), DATA(gy), DATA(gxg), shape[0], shape[1], NULL));
      same_bytes("log_softmax backward", gx, gxg);
      /* the bias gradient of Linear: gb += column sums of gy, through linear_backward */
      int64_t in = 3, wshape[2] = {shape[1], in}, xshape[2] = {shape[0], in};
      crun_tensor_t *lx = rnd(dt, 2, xshape, 950 + k), *w = rnd(dt, 2, wshape, 960 + k), *lgx = like(lx);
      crun_tensor_t *gw = like(w), *gb = rnd1(dt, shape[1], 970 + k), *gbg = like(gb);
      EXPECT_OK(crun_tensor_copy(gbg, gb));
      EXPECT_OK(crun_nn_linear_backward(lx, w, gy, lgx, gw, gb));
      EXPECT_OK(crun__cuda_bias_grad(dt, DATA(gbg), DATA(gy), shape[0], shape[1], NULL));
      same_bytes("bias grad", gb, gbg);
      crun_tensor_release(lx); crun_tensor_release(w); crun_tensor_release(lgx); crun_tensor_release(gw);
      crun_tensor_release(gb); crun_tensor_release(gbg);
      crun_tensor_release(x); crun_tensor_release(gy); crun_tensor_release(y); crun_tensor_release(yg);
      crun_tensor_release(gx); crun_tensor_release(gxg);
    }
  }
}

TEST(losses_match_cpu) {
  for (int f = 0; f < 2; f++) {
    crun_dtype_t dt = f ? CRUN_FLOAT64 : CRUN_FLOAT32;
    for (int lt = 0; lt < 2; lt++) {
      crun_dtype_t ldt = lt ? CRUN_INT32 : CRUN_INT64;
      int64_t shape[2] = {257, 11}, rows = 257, c = 11;
      crun_tensor_t *x = rnd(dt, 2, shape, 1000 + f), *labels, *g = like(x), *gg = like(x);
      EXPECT_OK(crun_tensor_new(ldt, 1, &rows, &labels));
      uint64_t s = 5;
      for (int64_t i = 0; i < rows; i++) crun_elem_set_int64(ldt, DATA(labels), i, 1 + (int64_t)(crun_splitmix64_next(&s) % 11));
      for (int sum = 0; sum < 2; sum++) {
        double loss, gloss;
        int64_t ok, gok;
        EXPECT_OK(crun_nn_cross_entropy(x, labels, sum, &loss, &ok, g));
        EXPECT_OK(crun__cuda_cross_entropy(dt, DATA(x), ldt, DATA(labels), rows, c, sum ? 1.0 : 1.0 / rows, DATA(gg),
                                           &gloss, &gok, NULL));
        EXPECT(loss == gloss);
        EXPECT_EQ_INT(ok, gok);
        same_bytes("cross entropy grad", g, gg);
      }
      /* NLL against its definition: -mean x[i, label_i], one-hot gradient */
      double nll, want = 0;
      EXPECT_OK(crun__cuda_nll(dt, DATA(x), ldt, DATA(labels), rows, c, 1.0 / rows, DATA(gg), &nll, NULL));
      for (int64_t i = 0; i < rows; i++) {
        int64_t l = crun_elem_get_int64(ldt, DATA(labels), i) - 1;
        want -= crun_elem_get_double(dt, DATA(x), i * c + l);
        for (int64_t j = 0; j < c; j++)
          EXPECT(crun_elem_get_double(dt, DATA(gg), i * c + j) == (j == l ? (f ? -1.0 / rows : (double)(float)(-1.0 / rows)) : 0.0));
      }
      EXPECT(fabs(nll - want / rows) < 1e-12);
      /* a label out of range: ERANGE naming the row */
      crun_elem_set_int64(ldt, DATA(labels), 200, 12);
      EXPECT_STATUS(crun__cuda_cross_entropy(dt, DATA(x), ldt, DATA(labels), rows, c, 1, NULL, NULL, NULL, NULL),
                    CRUN_ERANGE);
      EXPECT_TEXT("label 12 of row 201 is out of range 1..11");
      EXPECT_STATUS(crun__cuda_nll(dt, DATA(x), ldt, DATA(labels), rows, c, 1, NULL, NULL, NULL), CRUN_ERANGE);
      crun_tensor_release(x); crun_tensor_release(labels); crun_tensor_release(g); crun_tensor_release(gg);
    }
    for (int k = 0; k < NSIZES; k++) {
      crun_tensor_t *x = rnd1(dt, SIZES[k], 1100 + k), *t = rnd1(dt, SIZES[k], 1200 + k), *g = like(x), *gg = like(x);
      double loss, gloss;
      EXPECT_OK(crun_nn_mse(x, t, &loss, g));
      EXPECT_OK(crun__cuda_mse(dt, DATA(x), DATA(t), SIZES[k], DATA(gg), &gloss, NULL));
      EXPECT(loss == gloss);
      same_bytes("mse grad", g, gg);
      crun_tensor_release(x); crun_tensor_release(t); crun_tensor_release(g); crun_tensor_release(gg);
    }
  }
}

/* ---------------------------------------------------------------- optim */

TEST(sgd_and_adam_match_cpu) {
  for (int f = 0; f < 2; f++) {
    crun_dtype_t dt = f ? CRUN_FLOAT64 : CRUN_FLOAT32;
    for (int k = 0; k < NSIZES; k++) {
      int64_t n = SIZES[k];
      for (int variant = 0; variant < 6; variant++) {
        crun_sgd_opts_t o = {0.05, variant >= 2 ? 0.9 : 0, 0, variant & 1 ? 0.01 : 0, variant >= 4, variant == 5};
        if (variant == 3) o.dampening = 0.25;
        crun_tensor_t *p = rnd1(dt, n, 1300 + k), *pg = like(p), *b = like(p), *bg = like(p);
        EXPECT_OK(crun_tensor_copy(pg, p));
        for (int step = 0; step < 3; step++) {
          crun_tensor_t *g = rnd1(dt, n, 1400 + step);
          EXPECT_OK(crun_optim_sgd_update(p, g, b, &o, step == 0));
          EXPECT_OK(crun__cuda_sgd(dt, DATA(pg), DATA(g), o.momentum != 0 ? DATA(bg) : NULL, n, &o, step == 0, NULL));
          crun_tensor_release(g);
        }
        same_bytes("sgd param", p, pg);
        if (o.momentum != 0) same_bytes("sgd buffer", b, bg);
        crun_tensor_release(p); crun_tensor_release(pg); crun_tensor_release(b); crun_tensor_release(bg);
      }
      for (int variant = 0; variant < 4; variant++) {
        crun_adam_opts_t o = {1e-3, 0.9, 0.999, 1e-8, variant ? 0.01 : 0, variant >= 2, variant == 3, variant == 1};
        crun_tensor_t *p = rnd1(dt, n, 1500 + k), *pg = like(p), *m = like(p), *v = like(p), *vm = like(p);
        crun_tensor_t *mg = like(p), *vg = like(p), *vmg = like(p);
        EXPECT_OK(crun_tensor_copy(pg, p));
        for (int step = 1; step <= 3; step++) {
          crun_tensor_t *g = rnd1(dt, n, 1600 + step);
          EXPECT_OK(crun_optim_adam_update(p, g, m, v, vm, step, &o));
          EXPECT_OK(crun__cuda_adam(dt, DATA(pg), DATA(g), DATA(mg), DATA(vg), DATA(vmg), n, step, &o, NULL));
          crun_tensor_release(g);
        }
        same_bytes("adam param", p, pg);
        same_bytes("adam exp_avg", m, mg);
        same_bytes("adam exp_avg_sq", v, vg);
        if (o.amsgrad) same_bytes("adam max_exp_avg_sq", vm, vmg);
        crun_tensor_release(p); crun_tensor_release(pg); crun_tensor_release(m); crun_tensor_release(v);
        crun_tensor_release(vm); crun_tensor_release(mg); crun_tensor_release(vg); crun_tensor_release(vmg);
      }
    }
  }
}

/* ---------------------------------------------------------------- gemm */

TEST(gemm_every_dtype_and_layout) {
  static const crun_dtype_t dts[] = {CRUN_FLOAT32, CRUN_FLOAT64, CRUN_FLOAT16, CRUN_BFLOAT16};
  int64_t M = 17, N = 9, K = 257;
  for (int d = 0; d < 4; d++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        crun_dtype_t dt = dts[d];
        int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {tb ? N : K, tb ? K : N}, sc[2] = {M, N};
        crun_tensor_t *A = rnd(dt, 2, sa, 1700), *B = rnd(dt, 2, sb, 1800), *C = rnd(dt, 2, sc, 1900);
        crun_tensor_t *C0;
        EXPECT_OK(crun_tensor_to(C, CRUN_FLOAT64, &C0));
        EXPECT_OK(crun__cuda_gemm(dt, ta, tb, M, N, K, 0.5, DATA(A), sa[1], DATA(B), sb[1], -0.25, DATA(C), N, NULL));
        double tol = dt == CRUN_FLOAT64 ? 1e-12 : dt == CRUN_FLOAT32 ? 1e-4 : dt == CRUN_FLOAT16 ? 2e-2 : 1.5e-1;
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
              s += crun_elem_get_double(dt, DATA(A), ta ? k * M + i : i * K + k) *
                   crun_elem_get_double(dt, DATA(B), tb ? j * K + k : k * N + j);
            double want = 0.5 * s - 0.25 * ((double *)DATA(C0))[i * N + j];
            double got = crun_elem_get_double(dt, DATA(C), i * N + j);
            if (fabs(got - want) > tol * (1 + fabs(want)))
              crun_test_fail(__FILE__, __LINE__, "%s ta=%d tb=%d C[%lld][%lld] = %g, expected %g",
                             crun_dtype_name(dt), ta, tb, (long long)i, (long long)j, got, want);
          }
        crun_tensor_release(A); crun_tensor_release(B); crun_tensor_release(C); crun_tensor_release(C0);
      }
  char buf[8];
  EXPECT_STATUS(crun__cuda_gemm(CRUN_INT32, 0, 0, 1, 1, 1, 1, buf, 1, buf, 1, 0, buf, 1, NULL), CRUN_ENOTSUP);
}

#define CRUN_TESTS(X)                                                          \
  X(philox_known_answers) X(dropout_reproducible_and_geometry_free)            \
  X(half_conversions_match_cpu) X(copy_casts_strided_and_broadcast)            \
  X(fill_every_dtype) X(binary_matches_cpu) X(unary_and_clamp_match_cpu)       \
  X(reduce_dim_matches_cpu) X(softmax_matches_cpu)                             \
  X(activations_and_log_softmax_match_cpu) X(losses_match_cpu)                 \
  X(sgd_and_adam_match_cpu) X(gemm_every_dtype_and_layout)
CRUN_TEST_MAIN()
