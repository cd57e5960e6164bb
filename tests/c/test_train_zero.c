/* test_train_zero.c — crun_zero_assign / crun_zero_offsets: torch's greedy
 * ZeroRedundancyOptimizer assignment on hand-computed examples, the flat
 * buffer offsets per (owner, key), and bad or overflowing input. */
#include <stdint.h>
#include <string.h>

#include "harness.h"

TEST(torch_rule) {
  /* sorted: 40 (#1), 40 (#2), 30 (#4), 10 (#0), 5 (#3), 1 (#5); sizes go
   * [40,0,0] [40,40,0] [40,40,30] [40,40,40] [45,40,40] [45,41,40] */
  int64_t numel[] = {10, 40, 40, 5, 30, 1};
  int owner[6];
  int64_t tot[3];
  EXPECT_OK(crun_zero_assign(numel, 6, 3, owner, tot));
  int want[] = {2, 0, 1, 0, 2, 1};
  for (int i = 0; i < 6; i++) EXPECT_EQ_INT(owner[i], want[i]);
  EXPECT_EQ_INT(tot[0], 45);
  EXPECT_EQ_INT(tot[1], 41);
  EXPECT_EQ_INT(tot[2], 40);
  /* more ranks than parameters: the last ranks own nothing */
  int64_t two[] = {3, 7};
  int o2[2];
  int64_t t4[4];
  EXPECT_OK(crun_zero_assign(two, 2, 4, o2, t4));
  EXPECT_EQ_INT(o2[0], 1);
  EXPECT_EQ_INT(o2[1], 0);
  EXPECT_EQ_INT(t4[2], 0);
  EXPECT_EQ_INT(t4[3], 0);
  /* one rank owns everything; no parameters at all is fine */
  EXPECT_OK(crun_zero_assign(numel, 6, 1, owner, tot));
  for (int i = 0; i < 6; i++) EXPECT_EQ_INT(owner[i], 0);
  EXPECT_EQ_INT(tot[0], 126);
  EXPECT_OK(crun_zero_assign(NULL, 0, 2, NULL, t4));
  EXPECT_EQ_INT(t4[0] + t4[1], 0);
}

TEST(offsets) {
  int64_t numel[] = {10, 40, 40, 5, 30, 1};
  int owner[] = {2, 0, 1, 0, 2, 1};
  int key[] = {0, 1, 0, 1, 1, 0};
  int64_t off[6], b[3];
  EXPECT_OK(crun_zero_offsets(numel, owner, NULL, 6, 3, 1, off, b));
  int64_t want[] = {0, 0, 0, 40, 10, 40};
  for (int i = 0; i < 6; i++) EXPECT_EQ_INT(off[i], want[i]);
  EXPECT_EQ_INT(b[0], 45);
  EXPECT_EQ_INT(b[1], 41);
  EXPECT_EQ_INT(b[2], 40);
  /* keys split a rank's buffer: rank 0 keeps #1 and #3 in key 1 */
  int64_t bk[6];
  EXPECT_OK(crun_zero_offsets(numel, owner, key, 6, 3, 2, off, bk));
  int64_t wk[] = {0, 0, 0, 40, 0, 40};
  for (int i = 0; i < 6; i++) EXPECT_EQ_INT(off[i], wk[i]);
  int64_t wb[] = {0, 45, 41, 0, 10, 30};
  for (int i = 0; i < 6; i++) EXPECT_EQ_INT(bk[i], wb[i]);
}

TEST(bad_input) {
  int64_t numel[] = {4, -2};
  int owner[2] = {0, 0};
  int64_t off[2];
  EXPECT_STATUS(crun_zero_assign(numel, 2, 2, owner, NULL), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "parameter 1 has a negative size -2") != NULL);
  numel[1] = 2;
  EXPECT_STATUS(crun_zero_assign(numel, 2, 0, owner, NULL), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "world size 0") != NULL);
  EXPECT_STATUS(crun_zero_assign(numel, 2, 2, NULL, NULL), CRUN_EINVAL);
  owner[1] = 2;
  EXPECT_STATUS(crun_zero_offsets(numel, owner, NULL, 2, 2, 1, off, NULL), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "parameter 1's owner 2 is not in [0, 2)") != NULL);
  owner[1] = 1;
  int key[] = {0, 3};
  EXPECT_STATUS(crun_zero_offsets(numel, owner, key, 2, 2, 3, off, NULL), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "key 3 is not in [0, 3)") != NULL);
  EXPECT_STATUS(crun_zero_offsets(numel, owner, NULL, 2, 2, 0, off, NULL), CRUN_EINVAL);
}

TEST(overflow) {
  /* two parameters of INT64_MAX / 2 + 1 on one rank overflow its total */
  int64_t big[] = {INT64_MAX / 2 + 1, INT64_MAX / 2 + 1, 3};
  int owner[3];
  EXPECT_STATUS(crun_zero_assign(big, 3, 1, owner, NULL), CRUN_ERANGE);
  EXPECT(strstr(crun_last_error(), "rank 0's element count overflows") != NULL);
  /* on two ranks they fit; the small one then overflows neither */
  int64_t tot[2];
  EXPECT_OK(crun_zero_assign(big, 2, 2, owner, tot));
  EXPECT_EQ_INT(tot[0], INT64_MAX / 2 + 1);
  int same[] = {0, 0, 0};
  int64_t off[3];
  EXPECT_STATUS(crun_zero_offsets(big, same, NULL, 3, 1, 1, off, NULL), CRUN_ERANGE);
  EXPECT(strstr(crun_last_error(), "rank 0's buffer 0 overflows at parameter 1") != NULL);
  /* a world * keys table that cannot be sized */
  EXPECT_STATUS(crun_zero_offsets(big, same, NULL, 0, INT32_MAX, INT32_MAX, off, NULL), CRUN_EINVAL);
}

#define CRUN_TESTS(X) X(torch_rule) X(offsets) X(bad_input) X(overflow)
CRUN_TEST_MAIN()
