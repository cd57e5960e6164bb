/* test_tensor_math.c — the math layer from C: gemm over every operand layout
 * against a naive product, broadcasting, in-place ops on strided views,
 * reductions, indexing with base 0 and the errors of bad input. */
#include "harness.h"

#include <math.h>

static crun_tensor_t *seq(crun_dtype_t dt, int nd, const int64_t *shape, double mul, double add) {
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(dt, nd, shape, &t));
  for (int64_t i = 0; i < crun_tensor_numel(t); i++)
    crun_elem_set_double(dt, crun_tensor_data(t), i, fmod(i * mul + add, 7.0) - 3.0);
  return t;
}

static double get2(crun_tensor_t *t, int64_t i, int64_t j) {
  double v;
  EXPECT_OK(crun_tensor_get_double(t, (int64_t[]){i, j}, &v));
  return v;
}

/* Checks C == alpha op(A) op(B) + beta C0 element by element. */
static void check_gemm(int ta, int tb, crun_tensor_t *A, crun_tensor_t *B, crun_tensor_t *C0, double alpha,
                       double beta, crun_tensor_t *C) {
  int64_t M = crun_tensor_shape(C)[0], N = crun_tensor_shape(C)[1];
  int64_t K = crun_tensor_shape(A)[ta ? 0 : 1];
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += (ta ? get2(A, k, i) : get2(A, i, k)) * (tb ? get2(B, j, k) : get2(B, k, j));
      double want = alpha * s + beta * get2(C0, i, j), got = get2(C, i, j);
      if (fabs(got - want) > 1e-4 * (1 + fabs(want)))
        crun_test_fail(__FILE__, __LINE__, "gemm ta=%d tb=%d C[%lld][%lld] = %g, expected %g", ta, tb,
                       (long long)i, (long long)j, got, want);
    }
}

TEST(gemm_every_layout) {
  for (int dt = 0; dt < 2; dt++) {
    crun_dtype_t d = dt ? CRUN_FLOAT64 : CRUN_FLOAT32;
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int view = 0; view < 3; view++) {
          /* op(A) is 5x6, op(B) is 6x4; view 1 passes transposed views, view 2 narrowed ones */
          int64_t sa[2] = {ta ? 6 : 5, ta ? 5 : 6}, sb[2] = {tb ? 4 : 6, tb ? 6 : 4}, sc[2] = {5, 4};
          crun_tensor_t *A, *B, *C = seq(d, 2, sc, 0.7, 1), *C0, *A2 = NULL, *B2 = NULL;
          if (view == 1) {
            int64_t ta_s[2] = {sa[1], sa[0]}, tb_s[2] = {sb[1], sb[0]};
            A2 = seq(d, 2, ta_s, 1.3, 0.5); B2 = seq(d, 2, tb_s, 0.9, 2);
            EXPECT_OK(crun_tensor_transpose(A2, 0, 1, &A));
            EXPECT_OK(crun_tensor_transpose(B2, 0, 1, &B));
          } else if (view == 2) {
            int64_t wa[2] = {sa[0], sa[1] + 3}, wb[2] = {sb[0], sb[1] + 2};
            A2 = seq(d, 2, wa, 1.3, 0.5); B2 = seq(d, 2, wb, 0.9, 2);
            EXPECT_OK(crun_tensor_narrow(A2, 1, 1, sa[1], &A));
            EXPECT_OK(crun_tensor_narrow(B2, 1, 2, sb[1], &B));
          } else {
            A = seq(d, 2, sa, 1.3, 0.5); B = seq(d, 2, sb, 0.9, 2);
          }
          EXPECT_OK(crun_tensor_clone(C, &C0));
          EXPECT_OK(crun_tensor_gemm(ta, tb, 0.5, A, B, 2.0, C));
          check_gemm(ta, tb, A, B, C0, 0.5, 2.0, C);
          crun_tensor_release(A); crun_tensor_release(B); crun_tensor_release(C); crun_tensor_release(C0);
          crun_tensor_release(A2); crun_tensor_release(B2);
        }
  }
}

TEST(gemm_into_transposed_output_and_errors) {
  int64_t s23[2] = {2, 3}, s34[2] = {3, 4}, s42[2] = {4, 2}, s22[2] = {2, 2};
  crun_tensor_t *A = seq(CRUN_FLOAT32, 2, s23, 1, 0), *B = seq(CRUN_FLOAT32, 2, s34, 2, 1);
  crun_tensor_t *Cs = seq(CRUN_FLOAT32, 2, s42, 0, 0), *C, *C0;
  EXPECT_OK(crun_tensor_transpose(Cs, 0, 1, &C)); /* 2x4 non-row-major output */
  EXPECT_OK(crun_tensor_clone(C, &C0));
  EXPECT_OK(crun_tensor_gemm(0, 0, 1.0, A, B, 0.0, C));
  check_gemm(0, 0, A, B, C0, 1.0, 0.0, C);
  crun_tensor_t *bad = seq(CRUN_FLOAT32, 2, s22, 1, 0);
  EXPECT_STATUS(crun_tensor_gemm(0, 0, 1.0, A, B, 0.0, bad), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "op(A) is 2x3, op(B) is 3x4, C is 2x2") != NULL);
  crun_tensor_t *I = seq(CRUN_INT32, 2, s23, 1, 0), *out;
  EXPECT_STATUS(crun_tensor_matmul(I, B, &out), CRUN_ENOTSUP);
  crun_tensor_release(A); crun_tensor_release(B); crun_tensor_release(Cs); crun_tensor_release(C);
  crun_tensor_release(C0); crun_tensor_release(bad); crun_tensor_release(I);
}

TEST(broadcast_and_inplace_on_views) {
  int64_t s34[2] = {3, 4}, s31[2] = {3, 1}, s4[1] = {4};
  crun_tensor_t *a = seq(CRUN_FLOAT64, 2, s34, 1, 0), *col = seq(CRUN_FLOAT64, 2, s31, 1, 10);
  crun_tensor_t *row = seq(CRUN_FLOAT64, 1, s4, 1, 20), *r1, *r2, *t;
  EXPECT_OK(crun_tensor_binop(CRUN_BIN_SUB, a, col, &r1));
  EXPECT_OK(crun_tensor_binop(CRUN_BIN_MUL, row, a, &r2)); /* broadcast on the left */
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) {
      double x = get2(a, i, j);
      double c = crun_elem_get_double(CRUN_FLOAT64, crun_tensor_data(col), i);
      double r = crun_elem_get_double(CRUN_FLOAT64, crun_tensor_data(row), j);
      EXPECT(get2(r1, i, j) == x - c && get2(r2, i, j) == r * x);
    }
  EXPECT_OK(crun_tensor_transpose(a, 0, 1, &t));
  EXPECT_OK(crun_tensor_binop_scalar_out(CRUN_BIN_SUB, t, 1.0, 1, t)); /* t = 1 - t, in place */
  EXPECT(get2(a, 2, 3) == 1.0 - get2(r1, 2, 3) - crun_elem_get_double(CRUN_FLOAT64, crun_tensor_data(col), 2));
  EXPECT_OK(crun_tensor_unop_out(CRUN_UN_RELU, t, t));
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) EXPECT(get2(a, i, j) >= 0);
  crun_tensor_release(a); crun_tensor_release(col); crun_tensor_release(row);
  crun_tensor_release(r1); crun_tensor_release(r2); crun_tensor_release(t);
}

TEST(reduce_and_index_base0) {
  int64_t s23[2] = {2, 3};
  crun_tensor_t *a = seq(CRUN_FLOAT32, 2, s23, 1, 3), *v, *ix; /* {0 1 2; 3 -3 -2} */
  EXPECT_OK(crun_tensor_reduce_dim(CRUN_DIMRED_MAX, a, 1, 0, 0, &v, &ix));
  EXPECT_EQ_INT(((int64_t *)crun_tensor_data(ix))[0], 2);
  EXPECT_EQ_INT(((int64_t *)crun_tensor_data(ix))[1], 0);
  crun_tensor_release(v); crun_tensor_release(ix);
  EXPECT_OK(crun_tensor_reduce_dim(CRUN_DIMRED_SUM, a, -1, 0, 0, &v, NULL));
  EXPECT_EQ_INT(crun_tensor_ndim(v), 0);
  EXPECT(((float *)crun_tensor_data(v))[0] == 1.0f);
  crun_tensor_release(v);
  int64_t two = 2;
  crun_tensor_t *idx, *sel;
  EXPECT_OK(crun_tensor_from_data(CRUN_INT64, 1, &two, (int64_t[]){1, 1}, 16, &idx));
  EXPECT_OK(crun_tensor_index_select(a, 0, idx, 0, &sel));
  EXPECT(get2(sel, 0, 0) == 3.0 && get2(sel, 1, 2) == -2.0);
  crun_tensor_release(sel);
  EXPECT_STATUS(crun_tensor_index_select(a, 0, idx, 2, &sel), CRUN_ERANGE); /* 1 - 2 < 0 */
  crun_tensor_release(idx); crun_tensor_release(a);
}

TEST(softmax_rows_sum_to_one) {
  int64_t s[2] = {4, 1000};
  crun_tensor_t *a = seq(CRUN_FLOAT32, 2, s, 123.0, 0), *p;
  EXPECT_OK(crun_tensor_softmax(a, 1, 0, &p));
  for (int i = 0; i < 4; i++) {
    double sum = 0;
    for (int j = 0; j < 1000; j++) sum += get2(p, i, j);
    EXPECT(fabs(sum - 1.0) < 1e-4);
  }
  crun_tensor_release(a); crun_tensor_release(p);
}

/* where over a transposed (strided) a, a broadcast row b and a column
 * condition; int64 values past 2^53 and nan are copied bit for bit. */
TEST(where_selects_broadcast_and_strided) {
  int64_t s23[] = {2, 3}, s3[] = {3}, s21[] = {2, 1};
  crun_tensor_t *m = seq(CRUN_FLOAT64, 2, (int64_t[]){3, 2}, 1.5, 0.25), *a, *b = seq(CRUN_FLOAT64, 1, s3, 2.5, 1), *c, *r;
  EXPECT_OK(crun_tensor_transpose(m, 0, 1, &a)); /* 2x3, not contiguous */
  EXPECT_OK(crun_tensor_from_data(CRUN_BOOL, 2, s21, (uint8_t[]){0, 1}, 2, &c));
  crun_elem_set_double(CRUN_FLOAT64, crun_tensor_data(b), 1, NAN);
  EXPECT_OK(crun_tensor_where(c, a, b, &r));
  EXPECT(crun_tensor_ndim(r) == 2 && crun_tensor_shape(r)[0] == 2 && crun_tensor_shape(r)[1] == 3);
  for (int64_t j = 0; j < 3; j++) {
    double bj = crun_elem_get_double(CRUN_FLOAT64, crun_tensor_data(b), j);
    EXPECT(j == 1 ? isnan(get2(r, 0, j)) : get2(r, 0, j) == bj); /* row 0: condition false */
    EXPECT(get2(r, 1, j) == get2(m, j, 1));                        /* row 1: a = m^T */
  }
  crun_tensor_t *i1, *i2, *ri;
  int64_t big = ((int64_t)1 << 60) + 1;
  EXPECT_OK(crun_tensor_from_data(CRUN_INT64, 1, s3, (int64_t[]){big, -big, 7}, 24, &i1));
  EXPECT_OK(crun_tensor_from_data(CRUN_INT64, 1, s3, (int64_t[]){-5, big - 2, -big}, 24, &i2));
  crun_tensor_t *c3;
  EXPECT_OK(crun_tensor_from_data(CRUN_BOOL, 1, s3, (uint8_t[]){1, 0, 0}, 3, &c3));
  EXPECT_OK(crun_tensor_where(c3, i1, i2, &ri));
  const int64_t *v = crun_tensor_data(ri);
  EXPECT(v[0] == big && v[1] == big - 2 && v[2] == -big);
  EXPECT_STATUS(crun_tensor_where(c3, i1, b, &r), CRUN_EINVAL);   /* int64 with float64 */
  EXPECT_STATUS(crun_tensor_where(i1, i1, i2, &r), CRUN_EINVAL);  /* an int64 condition */
  EXPECT_STATUS(crun_tensor_where(c, a, i1, &r), CRUN_EINVAL);    /* dtypes, before shapes */
  crun_tensor_t *s2, *c2;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, 2, s23, &s2));
  EXPECT_OK(crun_tensor_new(CRUN_BOOL, 1, (int64_t[]){2}, &c2));
  EXPECT_STATUS(crun_tensor_where(c2, s2, s2, &r), CRUN_EINVAL); /* condition 2 vs values 2x3 */
  crun_tensor_release(c2); crun_tensor_release(s2); crun_tensor_release(c3); crun_tensor_release(ri); crun_tensor_release(i1);
  crun_tensor_release(i2); crun_tensor_release(r); crun_tensor_release(c); crun_tensor_release(b);
  crun_tensor_release(a); crun_tensor_release(m);
}

/* Prints timings of the main kernels (only with CRUN_BENCH=1). */
TEST(bench_math) {
  if (!crun_env_int("CRUN_BENCH", 0)) return;
  int64_t n = 1 << 22, sm[2] = {512, 512};
  crun_tensor_t *a, *b, *c, *A, *B, *C;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, 1, &n, &a));
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, 1, &n, &b));
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, 1, &n, &c));
  double t0 = crun_clock();
  for (int r = 0; r < 10; r++) EXPECT_OK(crun_tensor_binop_out(CRUN_BIN_ADD, a, b, c));
  double t = (crun_clock() - t0) / 10;
  printf("  add float32 16 MiB: %.2f ms, %.1f GB/s\n", t * 1e3, 3.0 * n * 4 / t / 1e9);
  A = seq(CRUN_FLOAT32, 2, sm, 1, 0); B = seq(CRUN_FLOAT32, 2, sm, 2, 0); C = seq(CRUN_FLOAT32, 2, sm, 0, 0);
  t0 = crun_clock();
  for (int r = 0; r < 5; r++) EXPECT_OK(crun_tensor_gemm(0, 1, 1.0, A, B, 0.0, C));
  t = (crun_clock() - t0) / 5;
  printf("  sgemm 512^3: %.2f ms, %.1f GFLOP/s\n", t * 1e3, 2.0 * 512 * 512 * 512 / t / 1e9);
  crun_tensor_t *v;
  t0 = crun_clock();
  EXPECT_OK(crun_tensor_reduce_dim(CRUN_DIMRED_SUM, a, -1, 0, 0, &v, NULL));
  printf("  sum float32 16 MiB: %.2f ms\n", (crun_clock() - t0) * 1e3);
  crun_tensor_release(v);
  crun_tensor_release(a); crun_tensor_release(b); crun_tensor_release(c);
  crun_tensor_release(A); crun_tensor_release(B); crun_tensor_release(C);
}

#define CRUN_TESTS(X) X(where_selects_broadcast_and_strided) X(gemm_every_layout) X(gemm_into_transposed_output_and_errors) \
  X(broadcast_and_inplace_on_views) X(reduce_and_index_base0) X(softmax_rows_sum_to_one) X(bench_math)
CRUN_TEST_MAIN()
