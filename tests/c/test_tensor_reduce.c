/* test_tensor_reduce.c — dtype helpers, float16/bfloat16 conversions and the
 * reduction kernels against straightforward element-by-element references.
 * `CRUN_BENCH=1 ./test_tensor_reduce bench_reduce_n` prints GB/s. */
#include "harness.h"
#include "tensor/half.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

TEST(dtype_names) {
  crun_dtype_t dt;
  EXPECT_EQ_INT(crun_dtype_size(CRUN_BFLOAT16), 2);
  EXPECT_EQ_INT(crun_dtype_size(CRUN_INT64), 8);
  EXPECT_EQ_INT(crun_dtype_size((crun_dtype_t)99), 0);
  EXPECT(strcmp(crun_dtype_name(CRUN_UINT8), "uint8") == 0);
  EXPECT(crun_dtype_name((crun_dtype_t)-1) == NULL);
  EXPECT_OK(crun_dtype_parse("double", &dt));
  EXPECT_EQ_INT(dt, CRUN_FLOAT64);
  EXPECT_OK(crun_dtype_parse("bfloat16", &dt));
  EXPECT_EQ_INT(dt, CRUN_BFLOAT16);
  EXPECT_OK(crun_dtype_parse("long", &dt));
  EXPECT_EQ_INT(dt, CRUN_INT64);
  EXPECT_STATUS(crun_dtype_parse("complex", &dt), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "complex") != NULL);
  EXPECT(crun_dtype_is_integer(CRUN_UINT8) && !crun_dtype_is_integer(CRUN_FLOAT16));
}

TEST(op_names) {
  crun_reduce_op_t op;
  EXPECT_OK(crun_reduce_op_parse("SUM", &op));
  EXPECT_EQ_INT(op, CRUN_OP_SUM);
  EXPECT_OK(crun_reduce_op_parse("prod", &op));
  EXPECT_EQ_INT(op, CRUN_OP_PRODUCT);
  EXPECT_OK(crun_reduce_op_parse("bxor", &op));
  EXPECT_EQ_INT(op, CRUN_OP_BXOR);
  EXPECT_STATUS(crun_reduce_op_parse("median", &op), CRUN_EINVAL);
  EXPECT(strcmp(crun_reduce_op_name(CRUN_OP_AVG), "avg") == 0);
  EXPECT_STATUS(crun_reduce_op_check(CRUN_FLOAT32, CRUN_OP_BXOR), CRUN_EINVAL);
  EXPECT(strcmp(crun_last_error(), "EINVAL: bxor is only defined on integer dtypes, got float32") == 0);
  EXPECT_OK(crun_reduce_op_check(CRUN_UINT8, CRUN_OP_BAND));
  float x = 1, y = 2;
  EXPECT_STATUS(crun_reduce_into(CRUN_FLOAT32, CRUN_OP_BAND, &x, &y, 1), CRUN_EINVAL);
  EXPECT_STATUS(crun_reduce_into((crun_dtype_t)42, CRUN_OP_SUM, &x, &y, 1), CRUN_EINVAL);
  EXPECT_STATUS(crun_reduce_n(CRUN_FLOAT32, CRUN_OP_SUM, &x, NULL, 0, 1), CRUN_EINVAL);
}

/* Reference float -> float16: the nearest finite half by search, ties to even. */
static uint16_t ref_f32_to_f16(float f) {
  if (isnan(f)) return 0x7e00;
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0, hi = 0x7bff; /* largest h with value <= a */
  while (lo < hi) {
    uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
    if ((double)crun__f16_to_f32(mid) <= a) lo = mid; else hi = (uint16_t)(mid - 1);
  }
  if (lo == 0x7bff) return sign | 0x7bff; /* a < 65520 here */
  double dl = a - crun__f16_to_f32(lo), dh = crun__f16_to_f32((uint16_t)(lo + 1)) - a;
  uint16_t r = dl < dh ? lo : dh < dl ? (uint16_t)(lo + 1) : ((lo & 1) ? (uint16_t)(lo + 1) : lo);
  return sign | r;
}

TEST(float16_conversions) {
  EXPECT_EQ_INT(crun__f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ_INT(crun__f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ_INT(crun__f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ_INT(crun__f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ_INT(crun__f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ_INT(crun__f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ_INT(crun__f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ_INT(crun__f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ_INT(crun__f32_to_f16(0x1p-25f), 0x0000);        /* tie to even */
  EXPECT_EQ_INT(crun__f32_to_f16(0x1.8p-24f), 0x0002);      /* tie to even */
  EXPECT_EQ_INT(crun__f32_to_f16(0x1.0p-14f), 0x0400);
  EXPECT_EQ_INT(crun__f32_to_f16(-0.0f), 0x8000);
  EXPECT(isnan(crun__f16_to_f32(crun__f32_to_f16(NAN))));
  EXPECT(crun__f16_to_f32(0x0001) == 0x1p-24f);
  EXPECT(crun__f16_to_f32(0x3555) == 0x1.554p-2f);
  for (uint32_t h = 0; h < 65536; h++) {         /* every half round-trips */
    float f = crun__f16_to_f32((uint16_t)h);
    if (isnan(f)) { EXPECT((crun__f32_to_f16(f) & 0x7c00) == 0x7c00 && (crun__f32_to_f16(f) & 0x3ff)); continue; }
    if (crun__f32_to_f16(f) != h) crun_test_fail(__FILE__, __LINE__, "half 0x%04x does not round-trip", h);
  }
  for (int i = 0; i < 200000; i++) {             /* random floats vs search */
    uint32_t u = (uint32_t)rnd();
    u = (u & 0x80000000u) | (0x33000000u + u % (0x47900000u - 0x33000000u));
    float f = crun__bits_f32(u);
    if (crun__f32_to_f16(f) != ref_f32_to_f16(f))
      crun_test_fail(__FILE__, __LINE__, "f32 %a -> 0x%04x, expected 0x%04x", f,
                     crun__f32_to_f16(f), ref_f32_to_f16(f));
  }
}

TEST(bfloat16_conversions) {
  EXPECT_EQ_INT(crun__f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ_INT(crun__f32_to_bf16(crun__bits_f32(0x3f808000u)), 0x3f80); /* tie, even */
  EXPECT_EQ_INT(crun__f32_to_bf16(crun__bits_f32(0x3f818000u)), 0x3f82); /* tie, odd */
  EXPECT_EQ_INT(crun__f32_to_bf16(crun__bits_f32(0x3f808001u)), 0x3f81);
  EXPECT_EQ_INT(crun__f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ_INT(crun__f32_to_bf16(crun__bits_f32(0x7f7fffffu)), 0x7f80); /* overflow */
  EXPECT(isnan(crun__bf16_to_f32(crun__f32_to_bf16(crun__bits_f32(0x7f800001u)))));
  EXPECT(crun__bf16_to_f32(0x0001) == 0x1p-133f);  /* subnormal */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = crun__bf16_to_f32((uint16_t)h);
    if (!isnan(f) && crun__f32_to_bf16(f) != h) crun_test_fail(__FILE__, __LINE__, "bf16 0x%04x", h);
  }
}

/* ---------------------------------------------------------------- references */

static void fill_random(crun_dtype_t dt, void *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double v = ((double)(rnd() % 2001) - 1000.0) / 500.0; /* [-2, 2] */
    int64_t iv = (int64_t)(rnd() % 512) - 256;
    switch (dt) {
      case CRUN_FLOAT32: ((float *)p)[i] = (float)v; break;
      case CRUN_FLOAT64: ((double *)p)[i] = v * 1.000001; break;
      case CRUN_FLOAT16: ((uint16_t *)p)[i] = crun__f32_to_f16((float)v); break;
      case CRUN_BFLOAT16: ((uint16_t *)p)[i] = crun__f32_to_bf16((float)v); break;
      case CRUN_INT32: ((int32_t *)p)[i] = (int32_t)(iv * 9000001); break;
      case CRUN_INT64: ((int64_t *)p)[i] = iv * 90000000001ll; break;
      case CRUN_UINT8: ((uint8_t *)p)[i] = (uint8_t)iv; break;
      case CRUN_INT8: ((int8_t *)p)[i] = (int8_t)(iv / 2); break;
      case CRUN_INT16: ((int16_t *)p)[i] = (int16_t)(iv * 127); break;
      case CRUN_BOOL: ((uint8_t *)p)[i] = (uint8_t)(iv & 1); break;
      default: break;
    }
  }
}

static double refd(crun_reduce_op_t op, double a, double b) {
  switch (op) {
    case CRUN_OP_SUM: case CRUN_OP_AVG: return a + b;
    case CRUN_OP_PRODUCT: return a * b;
    case CRUN_OP_MIN: return (b < a || b != b) ? b : a;
    default: return (b > a || b != b) ? b : a;
  }
}
static float reff(crun_reduce_op_t op, float a, float b) {
  switch (op) {
    case CRUN_OP_SUM: case CRUN_OP_AVG: return a + b;
    case CRUN_OP_PRODUCT: return a * b;
    case CRUN_OP_MIN: return (b < a || b != b) ? b : a;
    default: return (b > a || b != b) ? b : a;
  }
}
static int64_t refi(crun_reduce_op_t op, int64_t a, int64_t b) {
  switch (op) {
    case CRUN_OP_SUM: case CRUN_OP_AVG: return (int64_t)((uint64_t)a + (uint64_t)b);
    case CRUN_OP_PRODUCT: return (int64_t)((uint64_t)a * (uint64_t)b);
    case CRUN_OP_MIN: return b < a ? b : a;
    case CRUN_OP_MAX: return b > a ? b : a;
    case CRUN_OP_BAND: return a & b;
    case CRUN_OP_BOR: return a | b;
    default: return a ^ b;
  }
}

/* Reference ((s0 op s1) op s2) ... for element i, written to out[i]. */
static void ref_elem(crun_dtype_t dt, crun_reduce_op_t op, void *out, void **s, int ns, size_t i) {
  switch (dt) {
    case CRUN_FLOAT32: { float a = ((float *)s[0])[i];
      for (int k = 1; k < ns; k++) a = reff(op, a, ((float *)s[k])[i]);
      ((float *)out)[i] = a; break; }
    case CRUN_FLOAT64: { double a = ((double *)s[0])[i];
      for (int k = 1; k < ns; k++) a = refd(op, a, ((double *)s[k])[i]);
      ((double *)out)[i] = a; break; }
    case CRUN_FLOAT16: { float a = crun__f16_to_f32(((uint16_t *)s[0])[i]);
      for (int k = 1; k < ns; k++) a = reff(op, a, crun__f16_to_f32(((uint16_t *)s[k])[i]));
      ((uint16_t *)out)[i] = crun__f32_to_f16(a); break; }
    case CRUN_BFLOAT16: { float a = crun__bf16_to_f32(((uint16_t *)s[0])[i]);
      for (int k = 1; k < ns; k++) a = reff(op, a, crun__bf16_to_f32(((uint16_t *)s[k])[i]));
      ((uint16_t *)out)[i] = crun__f32_to_bf16(a); break; }
    case CRUN_INT32: { int64_t a = ((int32_t *)s[0])[i];
      for (int k = 1; k < ns; k++) a = (int32_t)refi(op, a, ((int32_t *)s[k])[i]);
      ((int32_t *)out)[i] = (int32_t)a; break; }
    case CRUN_INT64: { int64_t a = ((int64_t *)s[0])[i];
      for (int k = 1; k < ns; k++) a = refi(op, a, ((int64_t *)s[k])[i]);
      ((int64_t *)out)[i] = a; break; }
    case CRUN_INT8: { int64_t a = ((int8_t *)s[0])[i];
      for (int k = 1; k < ns; k++) a = (int8_t)(uint8_t)refi(op, a, ((int8_t *)s[k])[i]);
      ((int8_t *)out)[i] = (int8_t)a; break; }
    case CRUN_INT16: { int64_t a = ((int16_t *)s[0])[i];
      for (int k = 1; k < ns; k++) a = (int16_t)(uint16_t)refi(op, a, ((int16_t *)s[k])[i]);
      ((int16_t *)out)[i] = (int16_t)a; break; }
    case CRUN_BOOL: { int a = ((uint8_t *)s[0])[i]; /* torch: sum/max or, product/min and */
      for (int k = 1; k < ns; k++) {
        int b = ((uint8_t *)s[k])[i];
        a = op == CRUN_OP_SUM || op == CRUN_OP_MAX || op == CRUN_OP_BOR ? (a || b)
          : op == CRUN_OP_BXOR ? (a != b) : (a && b);
      }
      ((uint8_t *)out)[i] = (uint8_t)a; break; }
    default: { int64_t a = ((uint8_t *)s[0])[i];
      for (int k = 1; k < ns; k++) a = (uint8_t)refi(op, a, ((uint8_t *)s[k])[i]);
      ((uint8_t *)out)[i] = (uint8_t)a; break; }
  }
}

static void expect_same(crun_dtype_t dt, crun_reduce_op_t op, const char *what, int ns,
                        const void *got, const void *want, size_t n) {
  size_t es = crun_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0)
      crun_test_fail(__FILE__, __LINE__, "%s %s %s nsrc=%d n=%zu: element %zu differs", what,
                     crun_dtype_name(dt), crun_reduce_op_name(op), ns, n, i);
  }
}

#define MAXS 5
static const size_t sizes[] = {0, 1, 3, 63, 64, 65, 1000, 2048, 5003};

/* Runs into / reduce3 / reduce_n (with and without aliasing) for one case. */
static void check_case(crun_dtype_t dt, crun_reduce_op_t op, size_t n) {
  size_t es = crun_dtype_size(dt), bytes = (n + 1) * es;
  void *s[MAXS], *orig[MAXS], *want = malloc(bytes), *dst = malloc(bytes);
  for (int k = 0; k < MAXS; k++) { s[k] = malloc(bytes); orig[k] = malloc(bytes); fill_random(dt, orig[k], n); }
  for (int ns = 1; ns <= MAXS; ns++) {
    for (size_t i = 0; i < n; i++) ref_elem(dt, op, want, orig, ns, i);
    for (int k = 0; k < MAXS; k++) memcpy(s[k], orig[k], n * es);
    EXPECT_OK(crun_reduce_n(dt, op, dst, (const void *const *)s, ns, n));
    expect_same(dt, op, "reduce_n", ns, dst, want, n);
    for (int alias = 0; alias < ns; alias++) { /* dst is source #alias */
      for (int k = 0; k < MAXS; k++) memcpy(s[k], orig[k], n * es);
      EXPECT_OK(crun_reduce_n(dt, op, s[alias], (const void *const *)s, ns, n));
      expect_same(dt, op, "reduce_n aliased", ns, s[alias], want, n);
    }
    if (ns != 2) continue;
    EXPECT_OK(crun_reduce3(dt, op, dst, orig[0], orig[1], n));
    expect_same(dt, op, "reduce3", 2, dst, want, n);
    memcpy(s[1], orig[1], n * es);
    EXPECT_OK(crun_reduce3(dt, op, s[1], orig[0], s[1], n));
    expect_same(dt, op, "reduce3 aliased", 2, s[1], want, n);
    memcpy(dst, orig[0], n * es);
    EXPECT_OK(crun_reduce_into(dt, op, dst, orig[1], n));
    expect_same(dt, op, "reduce_into", 2, dst, want, n);
  }
  for (int k = 0; k < MAXS; k++) { free(s[k]); free(orig[k]); }
  free(want); free(dst);
}

TEST(every_dtype_and_op_matches_reference) {
  for (int dt = 0; dt < CRUN_DTYPE_COUNT; dt++)
    for (int op = 0; op < CRUN_OP_COUNT; op++) {
      if (op == CRUN_OP_PREMUL_SUM) continue; /* not a kernel: see premul_sum_is_scale_then_sum */
      if (crun_reduce_op_check((crun_dtype_t)dt, (crun_reduce_op_t)op) < 0) {
        EXPECT((!crun_dtype_is_integer((crun_dtype_t)dt) && op >= CRUN_OP_BAND) ||
               (dt == CRUN_BOOL && op == CRUN_OP_AVG));
        continue;
      }
      for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        check_case((crun_dtype_t)dt, (crun_reduce_op_t)op, sizes[i]);
    }
}

TEST(premul_sum_is_scale_then_sum) {
  float a[3] = {1.5f, -2.0f, 0.25f}, d[3];
  EXPECT_OK(crun_reduce_op_check(CRUN_FLOAT32, CRUN_OP_PREMUL_SUM));
  EXPECT(crun_reduce_op_check(CRUN_INT32, CRUN_OP_PREMUL_SUM) == CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "floating") != NULL);
  EXPECT(crun_reduce_into(CRUN_FLOAT32, CRUN_OP_PREMUL_SUM, d, a, 3) == CRUN_EINVAL);
  EXPECT_OK(crun_scale_mul(CRUN_FLOAT32, d, a, 3, -4.0));
  EXPECT(d[0] == -6.0f && d[1] == 8.0f && d[2] == -1.0f && a[0] == 1.5f);
  uint16_t h[2] = {crun__f32_to_f16(3.0f), crun__f32_to_f16(-0.5f)};
  EXPECT_OK(crun_scale_mul(CRUN_FLOAT16, h, h, 2, 0.5));
  EXPECT(crun__f16_to_f32(h[0]) == 1.5f && crun__f16_to_f32(h[1]) == -0.25f);
  int8_t i8[1] = {3};
  EXPECT(crun_scale_mul(CRUN_INT8, i8, i8, 1, 2.0) == CRUN_EINVAL);
}

TEST(reduce_into_self) {
  int32_t a[100];
  for (int i = 0; i < 100; i++) a[i] = i - 50;
  EXPECT_OK(crun_reduce_into(CRUN_INT32, CRUN_OP_SUM, a, a, 100));
  for (int i = 0; i < 100; i++) EXPECT_EQ_INT(a[i], 2 * (i - 50));
  uint16_t h[3] = {crun__f32_to_f16(1.5f), crun__f32_to_f16(-3.0f), crun__f32_to_f16(65504.0f)};
  EXPECT_OK(crun_reduce_into(CRUN_FLOAT16, CRUN_OP_SUM, h, h, 3));
  EXPECT(crun__f16_to_f32(h[0]) == 3.0f && crun__f16_to_f32(h[1]) == -6.0f);
  EXPECT(isinf(crun__f16_to_f32(h[2])));
}

TEST(min_max_propagate_nan) {
  float a[3] = {1.0f, NAN, 3.0f}, b[3] = {NAN, 2.0f, NAN}, d[3];
  EXPECT_OK(crun_reduce3(CRUN_FLOAT32, CRUN_OP_MIN, d, a, b, 3));
  EXPECT(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
  EXPECT_OK(crun_reduce3(CRUN_FLOAT32, CRUN_OP_MAX, d, b, a, 3));
  EXPECT(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
}

TEST(half_sum_rounds_once) {
  /* 2048 + 1 + 1 in float16: pairwise rounding would give 2048 twice (the
   * spacing there is 2), accumulating in float32 gives 2050. */
  uint16_t a = crun__f32_to_f16(2048.0f), b = crun__f32_to_f16(1.0f), c = b, d;
  const void *srcs[3] = {&a, &b, &c};
  EXPECT_OK(crun_reduce_n(CRUN_FLOAT16, CRUN_OP_SUM, &d, srcs, 3, 1));
  EXPECT(crun__f16_to_f32(d) == 2050.0f);
}

TEST(scale_div) {
  int32_t iv[4] = {7, -7, 9, 0};
  EXPECT_OK(crun_scale_div(CRUN_INT32, iv, 4, 2.0));
  EXPECT(iv[0] == 3 && iv[1] == -3 && iv[2] == 4 && iv[3] == 0);
  int64_t lv[2] = {INT64_MIN, 10};
  EXPECT_OK(crun_scale_div(CRUN_INT64, lv, 2, -1.0));
  EXPECT(lv[0] == INT64_MIN && lv[1] == -10);
  uint8_t uv[2] = {255, 10};
  EXPECT_OK(crun_scale_div(CRUN_UINT8, uv, 2, 4.0));
  EXPECT(uv[0] == 63 && uv[1] == 2);
  float fv[130];
  for (int i = 0; i < 130; i++) fv[i] = (float)i;
  EXPECT_OK(crun_scale_div(CRUN_FLOAT32, fv, 130, 4.0));
  for (int i = 0; i < 130; i++) EXPECT(fv[i] == (float)i / 4.0f);
  double dv[1] = {1.0};
  EXPECT_OK(crun_scale_div(CRUN_FLOAT64, dv, 1, 3.0));
  EXPECT(dv[0] == 1.0 / 3.0);
  uint16_t hv[2] = {crun__f32_to_f16(3.0f), crun__f32_to_bf16(3.0f)};
  EXPECT_OK(crun_scale_div(CRUN_FLOAT16, hv, 1, 2.0));
  EXPECT(crun__f16_to_f32(hv[0]) == 1.5f);
  EXPECT_OK(crun_scale_div(CRUN_BFLOAT16, hv + 1, 1, 3.0));
  EXPECT(hv[1] == crun__f32_to_bf16(1.0f));
  EXPECT_STATUS(crun_scale_div(CRUN_FLOAT32, fv, 1, 0.0), CRUN_EINVAL);
  EXPECT_STATUS(crun_scale_div(CRUN_FLOAT32, NULL, 1, 2.0), CRUN_EINVAL);
  EXPECT_OK(crun_scale_div(CRUN_FLOAT32, NULL, 0, 2.0));
}

/* Prints GB/s of float32 sum reduce_n over 16 MiB inputs (only with CRUN_BENCH=1). */
TEST(bench_reduce_n) {
  if (!crun_env_int("CRUN_BENCH", 0)) return;
  size_t n = (16u << 20) / 4;
  float *s[4], *d = aligned_alloc(64, n * 4);
  for (int k = 0; k < 4; k++) { s[k] = aligned_alloc(64, n * 4); for (size_t i = 0; i < n; i++) s[k][i] = (float)i; }
  memset(d, 0, n * 4);
  double into_best = 1e9;
  for (int rep = 0; rep < 11; rep++) { /* a[i] += b[i], as the anchors' sum_f32 */
    double t0 = crun_clock();
    EXPECT_OK(crun_reduce_into(CRUN_FLOAT32, CRUN_OP_SUM, s[0], s[1], n));
    double t = crun_clock() - t0;
    if (t < into_best) into_best = t;
  }
  printf("  reduce_into float32 sum 16 MiB: %.2f ms, %.1f GB/s (r+w)\n", into_best * 1e3,
         3.0 * n * 4 / into_best / 1e9);
  for (int ns = 2; ns <= 4; ns += 2) {
    double best = 1e9;
    for (int rep = 0; rep < 10; rep++) {
      double t0 = crun_clock();
      EXPECT_OK(crun_reduce_n(CRUN_FLOAT32, CRUN_OP_SUM, d, (const void *const *)s, ns, n));
      double t = crun_clock() - t0;
      if (t < best) best = t;
    }
    double bytes = (double)n * 4 * (ns + 1);
    printf("  reduce_n float32 sum, %d inputs x 16 MiB: %.2f ms, %.1f GB/s (reads+writes)\n",
           ns, best * 1e3, bytes / best / 1e9);
    double t0 = crun_clock();
    memcpy(d, s[0], n * 4);
    printf("  memcpy 16 MiB for comparison: %.1f GB/s\n", 2.0 * n * 4 / (crun_clock() - t0) / 1e9);
  }
}

#define CRUN_TESTS(X) X(dtype_names) X(op_names) X(float16_conversions) X(bfloat16_conversions) \
  X(every_dtype_and_op_matches_reference) X(premul_sum_is_scale_then_sum) X(reduce_into_self) X(min_max_propagate_nan) X(half_sum_rounds_once)         \
  X(scale_div) X(bench_reduce_n)
CRUN_TEST_MAIN()
