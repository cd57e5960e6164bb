/* test_train_sampler.c — crun_sampler_*: torch's DistributedSampler formulas
 * (num_samples, total_size, wrap-around padding, striding, drop_last), the
 * exactly-once mode, the splitmix64 Fisher-Yates shuffle and bad input. */
#include <stdlib.h>

#include "harness.h"

/* Indices of (size, R, rank) without shuffle, checked against `want`. */
static void expect_indices(int64_t size, int R, int rank, int drop_last, int drop_padding,
                           const int64_t *want, int64_t nwant) {
  crun_sampler_t s;
  EXPECT_OK(crun_sampler_init(&s, size, R, rank, 0, 0, drop_last));
  s.drop_padding = drop_padding;
  EXPECT_EQ_INT(crun_sampler_len(&s), nwant);
  int64_t out[64], n = -1;
  EXPECT_OK(crun_sampler_indices(&s, 0, out, &n));
  EXPECT_EQ_INT(n, nwant);
  for (int64_t k = 0; k < n; k++) EXPECT_EQ_INT(out[k], want[k]);
}

TEST(torch_formulas) {
  crun_sampler_t s;
  /* ceil(10 / 3) = 4 per rank, padded with the first 2 indices */
  EXPECT_OK(crun_sampler_init(&s, 10, 3, 0, 0, 0, 0));
  EXPECT_EQ_INT(s.num_samples, 4);
  EXPECT_EQ_INT(s.total_size, 12);
  expect_indices(10, 3, 0, 0, 0, (int64_t[]){0, 3, 6, 9}, 4);
  expect_indices(10, 3, 1, 0, 0, (int64_t[]){1, 4, 7, 0}, 4);
  expect_indices(10, 3, 2, 0, 0, (int64_t[]){2, 5, 8, 1}, 4);
  /* drop_last: ceil((10 - 3) / 3) = 3, the tail is dropped */
  EXPECT_OK(crun_sampler_init(&s, 10, 3, 0, 0, 0, 1));
  EXPECT_EQ_INT(s.num_samples, 3);
  EXPECT_EQ_INT(s.total_size, 9);
  expect_indices(10, 3, 2, 1, 0, (int64_t[]){2, 5, 8}, 3);
  /* divisible sizes: drop_last changes nothing */
  expect_indices(8, 4, 3, 1, 0, (int64_t[]){3, 7}, 2);
  expect_indices(8, 4, 3, 0, 0, (int64_t[]){3, 7}, 2);
  /* padding longer than the data set: repeated as often as needed */
  expect_indices(2, 5, 2, 0, 0, (int64_t[]){0}, 1);
  expect_indices(2, 5, 3, 0, 0, (int64_t[]){1}, 1);
  expect_indices(2, 5, 4, 0, 0, (int64_t[]){0}, 1);
  expect_indices(3, 2, 1, 0, 0, (int64_t[]){1, 0}, 2);
  /* drop_last with fewer samples than ranks: nothing at all */
  EXPECT_OK(crun_sampler_init(&s, 2, 5, 4, 0, 0, 1));
  EXPECT_EQ_INT(s.num_samples, 0);
  expect_indices(2, 5, 4, 1, 0, NULL, 0);
  /* empty data set */
  expect_indices(0, 3, 1, 0, 0, NULL, 0);
}

TEST(exactly_once) {
  expect_indices(10, 3, 0, 0, 1, (int64_t[]){0, 3, 6, 9}, 4);
  expect_indices(10, 3, 1, 0, 1, (int64_t[]){1, 4, 7}, 3);
  expect_indices(10, 3, 2, 0, 1, (int64_t[]){2, 5, 8}, 3);
  expect_indices(2, 5, 3, 0, 1, NULL, 0);
  /* every sample exactly once over the ranks, shuffled too */
  for (int R = 1; R <= 7; R++) {
    int seen[50] = {0};
    for (int r = 0; r < R; r++) {
      crun_sampler_t s;
      EXPECT_OK(crun_sampler_init(&s, 50, R, r, 1, 7, 0));
      s.drop_padding = 1;
      int64_t out[64], n = 0;
      EXPECT_OK(crun_sampler_indices(&s, 3, out, &n));
      for (int64_t k = 0; k < n; k++) seen[out[k]]++;
    }
    for (int i = 0; i < 50; i++) EXPECT_EQ_INT(seen[i], 1);
  }
}

TEST(shuffle) {
  uint64_t st = 0;
  EXPECT(crun_splitmix64_next(&st) == 0xE220A8397B1DCDAFull); /* the reference first output */
  /* the permutation the Lua sampler has always produced for seed 42 */
  int64_t p[10], want[10] = {0, 2, 7, 5, 9, 4, 8, 3, 6, 1};
  crun_permutation(10, 42, p);
  for (int i = 0; i < 10; i++) EXPECT_EQ_INT(p[i], want[i]);
  /* rank r takes global positions r, r + R, ... of permutation(seed + epoch), padded */
  expect_indices(0, 1, 0, 0, 0, NULL, 0);
  crun_sampler_t s;
  EXPECT_OK(crun_sampler_init(&s, 7, 3, 1, 1, 5, 0));
  int64_t out[8], n = 0, perm[7];
  EXPECT_OK(crun_sampler_indices(&s, 2, out, &n));
  EXPECT_EQ_INT(n, 3);
  crun_permutation(7, 5 + 2, perm);
  EXPECT_EQ_INT(out[0], perm[1]);
  EXPECT_EQ_INT(out[1], perm[4]);
  EXPECT_EQ_INT(out[2], perm[0]); /* position 7 wraps to 0 */
  EXPECT_EQ_INT(out[0], 6);       /* values from the Lua implementation */
  EXPECT_EQ_INT(out[1], 5);
  EXPECT_EQ_INT(out[2], 0);
  /* another epoch, another order; the same epoch, the same order */
  int64_t a[400], b[400], na, nb;
  EXPECT_OK(crun_sampler_init(&s, 1000, 3, 0, 1, 9, 0));
  EXPECT_OK(crun_sampler_indices(&s, 0, a, &na));
  EXPECT_OK(crun_sampler_indices(&s, 1, b, &nb));
  EXPECT_EQ_INT(na, 334);
  int differ = 0;
  for (int k = 0; k < na; k++) differ += a[k] != b[k];
  EXPECT(differ > 0);
  EXPECT_OK(crun_sampler_indices(&s, 1, a, &na));
  for (int k = 0; k < na; k++) EXPECT_EQ_INT(a[k], b[k]);
}

TEST(bad_input) {
  crun_sampler_t s;
  EXPECT_STATUS(crun_sampler_init(&s, 10, 3, 3, 0, 0, 0), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "rank 3 out of range [0, 3)") != NULL);
  EXPECT_STATUS(crun_sampler_init(&s, 10, 3, -1, 0, 0, 0), CRUN_EINVAL);
  EXPECT_STATUS(crun_sampler_init(&s, -1, 3, 0, 0, 0, 0), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "size -1") != NULL);
  EXPECT_STATUS(crun_sampler_init(&s, 10, 0, 0, 0, 0, 0), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "num_replicas 0") != NULL);
  EXPECT_OK(crun_sampler_init(&s, 10, 3, 0, 0, 0, 0));
  int64_t out[8], n;
  EXPECT_STATUS(crun_sampler_indices(&s, -1, out, &n), CRUN_EINVAL);
  EXPECT_STATUS(crun_sampler_indices(&s, 0, NULL, &n), CRUN_EINVAL);
}

#define CRUN_TESTS(X) X(torch_formulas) X(exactly_once) X(shuffle) X(bad_input)
CRUN_TEST_MAIN()
