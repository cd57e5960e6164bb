/* test_tensor.c — tensor creation, views, copies, conversions, element access
 * and the seeded generator. */
#include "harness.h"

#include <math.h>
#include <stdint.h>

static crun_tensor_t *arange2d(crun_dtype_t dt, int64_t r, int64_t c) {
  int64_t shape[2] = {r, c};
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(dt, 2, shape, &t));
  for (int64_t i = 0; i < r * c; i++) crun_elem_set_double(dt, crun_tensor_data(t), i, (double)i);
  return t;
}

static double at(crun_tensor_t *t, int64_t i, int64_t j) {
  int64_t idx[2] = {i, j};
  double v = -1;
  EXPECT_OK(crun_tensor_get_double(t, idx, &v));
  return v;
}

TEST(new_is_zeroed_and_aligned) {
  int64_t shape[3] = {2, 3, 4};
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, 3, shape, &t));
  EXPECT_EQ_INT(crun_tensor_numel(t), 24);
  EXPECT_EQ_INT(crun_tensor_nbytes(t), 192);
  EXPECT_EQ_INT(crun_tensor_strides(t)[0], 12);
  EXPECT_EQ_INT(((uintptr_t)crun_tensor_data(t)) % 64, 0);
  for (int i = 0; i < 24; i++) EXPECT(((double *)crun_tensor_data(t))[i] == 0.0);
  EXPECT(crun_tensor_is_contiguous(t));
  crun_tensor_release(t);
  int64_t bad[2] = {2, -1};
  EXPECT_STATUS(crun_tensor_new(CRUN_FLOAT32, 2, bad, &t), CRUN_EINVAL);
  EXPECT_STATUS(crun_tensor_new(CRUN_FLOAT32, 9, shape, &t), CRUN_EINVAL);
  EXPECT_OK(crun_tensor_new(CRUN_INT32, 0, NULL, &t)); /* 0-d: one element */
  EXPECT_EQ_INT(crun_tensor_numel(t), 1);
  crun_tensor_release(t);
}

TEST(views_share_storage) {
  crun_tensor_t *t = arange2d(CRUN_FLOAT32, 3, 4), *row, *col, *nar, *tr;
  EXPECT_OK(crun_tensor_select(t, 0, 1, &row));         /* [4 5 6 7] */
  EXPECT_OK(crun_tensor_select(t, 1, 2, &col));         /* [2 6 10] */
  EXPECT_OK(crun_tensor_narrow(t, 1, 1, 2, &nar));      /* 3x2 */
  EXPECT_OK(crun_tensor_transpose(t, 0, 1, &tr));       /* 4x3 */
  EXPECT(crun_tensor_is_contiguous(row) && !crun_tensor_is_contiguous(col));
  EXPECT(!crun_tensor_is_contiguous(nar) && !crun_tensor_is_contiguous(tr));
  /* the host span of a contiguous view starts at its offset; a strided one has none */
  void *data = NULL;
  size_t count = 0;
  crun_dtype_t dt = CRUN_INT8;
  EXPECT(crun_tensor_host_span(row, &data, &count, &dt));
  EXPECT(data == (char *)crun_tensor_data(t) + 4 * sizeof(float) && count == 4 && dt == CRUN_FLOAT32);
  EXPECT(!crun_tensor_host_span(col, &data, &count, &dt) && !crun_tensor_host_span(tr, &data, &count, &dt));
  EXPECT(count == 4); /* left alone */
  int64_t i1 = 3;
  double v;
  EXPECT_OK(crun_tensor_get_double(row, &i1, &v));
  EXPECT(v == 7.0);
  int64_t i2 = 2;
  EXPECT_OK(crun_tensor_get_double(col, &i2, &v));
  EXPECT(v == 10.0);
  EXPECT(at(nar, 2, 1) == 10.0 && at(tr, 3, 1) == 7.0);
  EXPECT_OK(crun_tensor_set_double(tr, (int64_t[]){0, 2}, 99.0));
  EXPECT(at(t, 2, 0) == 99.0);
  crun_tensor_release(t); /* views keep the storage alive */
  EXPECT(at(nar, 2, 0) == 9.0);
  int64_t bad = 4;
  EXPECT_STATUS(crun_tensor_get_double(row, &bad, &v), CRUN_ERANGE);
  EXPECT(strstr(crun_last_error(), "index 5 out of range for dim 1 of size 4") != NULL);
  crun_tensor_t *x;
  EXPECT_STATUS(crun_tensor_narrow(nar, 0, 2, 2, &x), CRUN_EINVAL);
  EXPECT_STATUS(crun_tensor_select(nar, 2, 0, &x), CRUN_EINVAL);
  crun_tensor_release(row); crun_tensor_release(col); crun_tensor_release(nar); crun_tensor_release(tr);
}

TEST(view_and_contiguous) {
  crun_tensor_t *t = arange2d(CRUN_INT64, 2, 6), *v, *tr, *c;
  EXPECT_OK(crun_tensor_view(t, 3, (int64_t[]){3, -1, 2}, &v));
  EXPECT_EQ_INT(crun_tensor_shape(v)[1], 2);
  int64_t iv;
  EXPECT_OK(crun_tensor_get_int64(v, (int64_t[]){2, 1, 1}, &iv));
  EXPECT_EQ_INT(iv, 11);
  EXPECT_STATUS(crun_tensor_view(t, 2, (int64_t[]){5, 2}, &v), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "5x2") != NULL);
  EXPECT_OK(crun_tensor_transpose(t, 0, 1, &tr));
  EXPECT_STATUS(crun_tensor_view(tr, 1, (int64_t[]){12}, &v), CRUN_EINVAL);
  EXPECT_OK(crun_tensor_contiguous(tr, &c));
  EXPECT(crun_tensor_is_contiguous(c) && !crun_tensor_same_storage(c, t));
  int64_t want[12] = {0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11};
  for (int i = 0; i < 12; i++) EXPECT_EQ_INT(((int64_t *)crun_tensor_data(c))[i], want[i]);
  crun_tensor_release(c);
  EXPECT_OK(crun_tensor_contiguous(t, &c));
  EXPECT(c == t);
  crun_tensor_release(c); crun_tensor_release(tr); crun_tensor_release(t);
}

TEST(copy_converts_dtypes) {
  crun_tensor_t *f = arange2d(CRUN_FLOAT32, 2, 3), *ni, *h, *big;
  crun_elem_set_double(CRUN_FLOAT32, crun_tensor_data(f), 1, -1.75);
  crun_elem_set_double(CRUN_FLOAT32, crun_tensor_data(f), 5, 300.0);
  /* -1.75 and 300 have no uint8: refused, naming the first (row-major) */
  EXPECT_STATUS(crun_tensor_to(f, CRUN_UINT8, &ni), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "element 2 (-1.75) does not fit uint8") != NULL);
  EXPECT_OK(crun_tensor_to(f, CRUN_INT16, &ni));
  EXPECT(at(ni, 0, 1) == -1.0 && at(ni, 1, 2) == 300.0 && at(ni, 1, 0) == 3.0); /* truncates */
  EXPECT_OK(crun_tensor_to(f, CRUN_FLOAT16, &h));
  EXPECT(at(h, 0, 1) == -1.75 && at(h, 1, 2) == 300.0);
  int64_t s1[1] = {1};
  EXPECT_OK(crun_tensor_new(CRUN_INT64, 1, s1, &big));
  EXPECT_OK(crun_tensor_set_int64(big, (int64_t[]){0}, (INT64_C(1) << 60) + 1));
  crun_tensor_t *big2;
  EXPECT_OK(crun_tensor_to(big, CRUN_INT64, &big2));
  int64_t got;
  EXPECT_OK(crun_tensor_get_int64(big2, (int64_t[]){0}, &got));
  EXPECT(got == (INT64_C(1) << 60) + 1);
  crun_tensor_t *tr, *dst = arange2d(CRUN_FLOAT64, 3, 2);
  EXPECT_OK(crun_tensor_transpose(dst, 0, 1, &tr)); /* copy into a strided view */
  EXPECT_OK(crun_tensor_copy(tr, f));
  EXPECT(at(dst, 2, 0) == 2.0 && at(dst, 1, 1) == 4.0 && at(dst, 0, 1) == 3.0);
  EXPECT_STATUS(crun_tensor_copy(dst, f), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "destination is 3x2, source is 2x3") != NULL);
  EXPECT(crun_tensor_equal(tr, f) == 1 && crun_tensor_equal(dst, f) == 0);
  crun_elem_set_double(CRUN_FLOAT32, crun_tensor_data(f), 1, 1.0);
  EXPECT(crun_tensor_equal(tr, f) == 0);
  crun_tensor_release(f); crun_tensor_release(ni); crun_tensor_release(h);
  crun_tensor_release(big); crun_tensor_release(big2); crun_tensor_release(tr); crun_tensor_release(dst);
}

TEST(fill_and_from_data) {
  crun_tensor_t *t = arange2d(CRUN_INT32, 4, 5), *n;
  EXPECT_OK(crun_tensor_narrow(t, 1, 1, 3, &n));
  EXPECT_OK(crun_tensor_fill(n, 7.9));
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 5; j++) EXPECT(at(t, i, j) == ((j >= 1 && j <= 3) ? 7.0 : (double)(i * 5 + j)));
  float src[6] = {1, 2, 3, 4, 5, 6};
  crun_tensor_t *f;
  EXPECT_OK(crun_tensor_from_data(CRUN_FLOAT32, 2, (int64_t[]){3, 2}, src, sizeof src, &f));
  EXPECT(at(f, 2, 1) == 6.0);
  EXPECT_STATUS(crun_tensor_from_data(CRUN_FLOAT32, 2, (int64_t[]){3, 3}, src, sizeof src, &f), CRUN_EINVAL);
  crun_tensor_t *w = arange2d(CRUN_INT64, 2, 2);
  int64_t v, i11[2] = {1, 1};
  EXPECT_OK(crun_tensor_fill_int64(w, INT64_MAX)); /* exact: a double would round it */
  EXPECT_OK(crun_tensor_get_int64(w, i11, &v));
  EXPECT(v == INT64_MAX);
  EXPECT_OK(crun_tensor_fill_int64(n, -9)); /* int32 view */
  EXPECT(at(t, 3, 2) == -9.0 && at(t, 3, 4) == 19.0);
  crun_tensor_release(t); crun_tensor_release(n); crun_tensor_release(f); crun_tensor_release(w);
}

TEST(expand_broadcasts_rows) {
  crun_tensor_t *r = arange2d(CRUN_FLOAT32, 1, 3), *e, *c;
  EXPECT_OK(crun_tensor_expand(r, 2, (int64_t[]){4, 3}, &e));
  EXPECT_OK(crun_tensor_contiguous(e, &c));
  for (int i = 0; i < 4; i++) EXPECT(at(c, i, 2) == 2.0);
  EXPECT_STATUS(crun_tensor_expand(r, 2, (int64_t[]){4, 2}, &e), CRUN_EINVAL);
  crun_tensor_release(r); crun_tensor_release(c);
}

TEST(generator_is_deterministic) {
  crun_generator_t a, b;
  crun_generator_seed(&a, 42);
  crun_generator_seed(&b, 42);
  for (int i = 0; i < 100; i++) EXPECT(crun_generator_next(&a) == crun_generator_next(&b));
  crun_generator_seed(&b, 43);
  EXPECT(crun_generator_next(&a) != crun_generator_next(&b));
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, 1, (int64_t[]){20000}, &t));
  EXPECT_OK(crun_tensor_normal_(t, &a, 0.0, 1.0));
  double s = 0, s2 = 0, *p = crun_tensor_data(t);
  for (int i = 0; i < 20000; i++) { s += p[i]; s2 += p[i] * p[i]; }
  EXPECT(fabs(s / 20000) < 0.05 && fabs(s2 / 20000 - 1.0) < 0.05);
  EXPECT_OK(crun_tensor_uniform_(t, &a, 2.0, 3.0));
  for (int i = 0; i < 20000; i++) EXPECT(p[i] >= 2.0 && p[i] < 3.0);
  crun_tensor_release(t);
}

#define CRUN_TESTS(X) X(new_is_zeroed_and_aligned) X(views_share_storage) X(view_and_contiguous) \
  X(copy_converts_dtypes) X(fill_and_from_data) X(expand_broadcasts_rows) X(generator_is_deterministic)
CRUN_TEST_MAIN()
