/* test_train_conv.c — the image kernels from C (crun/train.h): Conv2d
 * against a direct loop, MaxPool2d's indices, the size rules and their
 * errors, and crun_gunzip_file on a file zlib wrote. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "harness.h"

static crun_tensor_t *make(int ndim, const int64_t *shape, double (*f)(int64_t)) {
  crun_tensor_t *t = NULL;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, ndim, shape, &t));
  double *p = crun_tensor_data(t);
  for (int64_t i = 0; i < crun_tensor_numel(t); i++) p[i] = f ? f(i) : 0;
  return t;
}

static double xval(int64_t i) { return (double)((i * 7) % 11) - 5.25; }
static double wval(int64_t i) { return (double)((i * 5) % 9) * 0.5 - 1.75; }

TEST(conv_matches_direct_loop) {
  /* x [2, 3, 7, 6], w [4, 3, 3, 2], stride (2, 1), pad (1, 1), dilation (1, 2) */
  int64_t xs[] = {2, 3, 7, 6}, ws[] = {4, 3, 3, 2}, bs[] = {4};
  crun_conv2d_geom_t g = {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 2};
  int64_t oh, ow;
  EXPECT_OK(crun_nn_conv2d_out_size(7, 6, 3, 2, &g, &oh, &ow));
  EXPECT_EQ_INT(oh, 4); /* (7 + 2 - 2 - 1) / 2 + 1 */
  EXPECT_EQ_INT(ow, 6); /* (6 + 2 - 2 - 1) / 1 + 1 */
  int64_t ys[] = {2, 4, oh, ow};
  crun_tensor_t *x = make(4, xs, xval), *w = make(4, ws, wval), *b = make(1, bs, xval), *y = make(4, ys, NULL);
  EXPECT_OK(crun_nn_conv2d_forward(x, w, b, y, &g));
  const double *px = crun_tensor_data(x), *pw = crun_tensor_data(w), *pb = crun_tensor_data(b), *py = crun_tensor_data(y);
  for (int n = 0; n < 2; n++)
    for (int o = 0; o < 4; o++)
      for (int r = 0; r < oh; r++)
        for (int c = 0; c < ow; c++) {
          double s = pb[o];
          for (int ci = 0; ci < 3; ci++)
            for (int i = 0; i < 3; i++)
              for (int j = 0; j < 2; j++) {
                int iy = r * 2 - 1 + i, ix = c - 1 + 2 * j;
                if (iy >= 0 && iy < 7 && ix >= 0 && ix < 6)
                  s += px[((n * 3 + ci) * 7 + iy) * 6 + ix] * pw[((o * 3 + ci) * 3 + i) * 2 + j];
              }
          double got = py[((n * 4 + o) * oh + r) * ow + c];
          EXPECT(got - s < 1e-12 && s - got < 1e-12);
        }
  /* a weight with other in_channels is named */
  int64_t w2s[] = {4, 2, 3, 2};
  crun_tensor_t *w2 = make(4, w2s, wval);
  EXPECT_STATUS(crun_nn_conv2d_forward(x, w2, b, y, &g), CRUN_EINVAL);
  EXPECT_TEXT("in_channels 2");
  crun_conv2d_geom_t big = {.stride_h = 1, .stride_w = 1, .dil_h = 4, .dil_w = 1};
  EXPECT_STATUS(crun_nn_conv2d_out_size(7, 6, 3, 2, &big, &oh, &ow), CRUN_EINVAL);
  EXPECT_TEXT("smaller than the dilated kernel");
  crun_tensor_release(x), crun_tensor_release(w), crun_tensor_release(w2);
  crun_tensor_release(b), crun_tensor_release(y);
}

TEST(maxpool_indices) {
  int64_t xs[] = {1, 1, 3, 4}, ys[] = {1, 1, 2, 2};
  crun_pool2d_geom_t g = {.kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 0};
  crun_tensor_t *x = make(4, xs, xval), *y = make(4, ys, NULL), *idx = NULL;
  EXPECT_OK(crun_tensor_new(CRUN_INT64, 4, ys, &idx));
  EXPECT_OK(crun_nn_maxpool2d_forward(x, y, idx, &g));
  /* x rows: [-5.25 1.75 -2.25 4.75] [0.75 -3.25 3.75 -0.25] [-4.25 2.75 -1.25 -5.25];
   * the top windows cover the padding row and row 0 only */
  const int64_t *k = crun_tensor_data(idx);
  const double *py = crun_tensor_data(y);
  EXPECT_EQ_INT(k[0], 1); /* 1.75 */
  EXPECT_EQ_INT(k[1], 3); /* 4.75 */
  EXPECT_EQ_INT(k[2], 9); /* 2.75 */
  EXPECT_EQ_INT(k[3], 6); /* 3.75 */
  EXPECT(py[0] == 1.75 && py[1] == 4.75 && py[2] == 2.75 && py[3] == 3.75);
  crun_pool2d_geom_t bad = {.kh = 2, .kw = 2, .stride_h = 1, .stride_w = 1, .pad_h = 2};
  int64_t oh, ow;
  EXPECT_STATUS(crun_nn_pool2d_out_size(3, 4, &bad, &oh, &ow), CRUN_EINVAL);
  EXPECT_TEXT("at most half the kernel");
  crun_tensor_release(x), crun_tensor_release(y), crun_tensor_release(idx);
}

TEST(gunzip_file) {
  char path[PATH_MAX];
  crun_test_tmp_path(path, sizeof path, "crun-test-gz.XXXXXX");
  int fd = mkstemp(path);
  EXPECT(fd >= 0);
  close(fd);
  gzFile f = gzopen(path, "wb");
  EXPECT(f != NULL);
  char line[64];
  for (int i = 0; i < 5000; i++) { /* ~50 KB: several reads and buffer growths */
    int n = snprintf(line, sizeof line, "%d,%d\n", i, (i * 37) % 1001 - 500);
    EXPECT_EQ_INT(gzwrite(f, line, (unsigned)n), n);
  }
  gzclose(f);
  char *buf = NULL;
  size_t len = 0;
  EXPECT_OK(crun_gunzip_file(path, 1 << 20, &buf, &len));
  EXPECT(len > 40000);
  EXPECT(strncmp(buf, "0,-500\n1,-463\n", 14) == 0);
  EXPECT(strncmp(buf + len - 9, "4999,279\n", 9) == 0); /* 4999 * 37 % 1001 = 779 */
  free(buf);
  EXPECT_STATUS(crun_gunzip_file(path, 1000, &buf, &len), CRUN_ERANGE);
  EXPECT(buf == NULL);
  unlink(path);
  EXPECT_STATUS(crun_gunzip_file(path, 1000, &buf, &len), CRUN_EIO);
  EXPECT_TEXT(path);
}

#define CRUN_TESTS(X) X(conv_matches_direct_loop) X(maxpool_indices) X(gunzip_file)
CRUN_TEST_MAIN()
