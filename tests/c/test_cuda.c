/* test_cuda.c — the C API of crun/cuda.h. In the real build without a GPU
 * (or a build without CUDA) it checks the no-device answers; with a device,
 * and in the double build (ctest gpudouble.c.test_cuda, two "devices" of
 * host memory), it checks device tensors, strided copies, streams, events
 * and the memory figures. */
#include "harness.h"

#include <stdint.h>

/* Says on stdout that a device case did not run here, and why. */
static int no_device(const char *name) {
  if (crun_cuda_is_available()) return 0;
  int n;
  crun_cuda_device_count(&n);
  printf("  %s: skipped: %s\n", name, crun_last_error());
  return 1;
}

/* A host float64 tensor of shape with element i = (-1)^i * (i*7919 % 1009) / 4. */
static crun_tensor_t *signed_seq(int nd, const int64_t *shape) {
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, nd, shape, &t));
  double *p = crun_tensor_data(t);
  for (int64_t i = 0; i < crun_tensor_numel(t); i++) p[i] = (i % 2 ? -1 : 1) * (double)((i * 7919) % 1009) / 4;
  return t;
}

TEST(host_tensors_report_the_host) {
  int64_t shape[2] = {3, 5};
  crun_tensor_t *t = signed_seq(2, shape), *same, *h;
  EXPECT_EQ_INT(crun_tensor_device(t), CRUN_DEVICE_CPU);
  EXPECT_EQ_INT(crun_tensor_is_pinned(t), 0);
  EXPECT_OK(crun_tensor_to_device(t, CRUN_DEVICE_CPU, &same));
  EXPECT(same == t);
  crun_tensor_release(same);
  EXPECT_OK(crun_tensor_new_on(CRUN_INT16, 2, shape, CRUN_DEVICE_CPU, &h));
  EXPECT_EQ_INT(crun_tensor_device(h), CRUN_DEVICE_CPU);
  EXPECT_EQ_INT(((int16_t *)crun_tensor_data(h))[14], 0);
  crun_tensor_release(h);
  crun_tensor_release(t);
}

TEST(without_a_device_every_call_says_why) {
  if (crun_cuda_is_available()) return; /* covered by the device cases */
  int n = -1;
  EXPECT_STATUS(crun_cuda_device_count(&n), CRUN_ENOTSUP);
  EXPECT_EQ_INT(n, 0);
  EXPECT(strstr(crun_last_error(), "no CUDA device (cudaGetDeviceCount: ") ||
         strstr(crun_last_error(), "crun was built without CUDA"));
  int64_t shape[1] = {4};
  crun_tensor_t *t;
  EXPECT_STATUS(crun_tensor_new_on(CRUN_FLOAT32, 1, shape, 0, &t), CRUN_ENOTSUP);
  crun_cuda_stream_t *s;
  EXPECT_STATUS(crun_cuda_stream_create(-1, &s), CRUN_ENOTSUP);
  crun_cuda_memory_t m;
  EXPECT_STATUS(crun_cuda_memory(0, &m), CRUN_ENOTSUP);
  crun_tensor_t *h = signed_seq(1, shape), *p;
  EXPECT_STATUS(crun_tensor_pin_memory(h, &p), CRUN_ENOTSUP);
  crun_tensor_release(h);
}

TEST(strided_round_trip_through_a_device) {
  if (no_device("strided_round_trip_through_a_device")) return;
  int64_t shape[3] = {4, 6, 5};
  crun_tensor_t *h = signed_seq(3, shape), *ht, *d, *back, *dd;
  EXPECT_OK(crun_tensor_transpose(h, 0, 2, &ht)); /* 5x6x4, strides 1, 5, 30 */
  EXPECT_OK(crun_tensor_to_device(ht, 0, &d));
  EXPECT_EQ_INT(crun_tensor_device(d), 0);
  EXPECT(crun_tensor_is_contiguous(d));
  int64_t idx[3] = {1, 2, 3};
  double v;
  EXPECT_STATUS(crun_tensor_get_double(d, idx, &v), CRUN_ENOTSUP); /* no host reads of device memory */
  EXPECT_TEXT("item: not implemented for a tensor on cuda:0");
  EXPECT_OK(crun_tensor_to_device(d, CRUN_DEVICE_CPU, &back));
  const double *hp = crun_tensor_data(h), *bp = crun_tensor_data(back);
  for (int64_t a = 0; a < 5; a++)
    for (int64_t b = 0; b < 6; b++)
      for (int64_t c = 0; c < 4; c++) EXPECT(bp[(a * 6 + b) * 4 + c] == hp[c * 30 + b * 5 + a]);
  /* device -> device view copy: the transposed device tensor into a fresh one */
  int n;
  EXPECT_OK(crun_cuda_device_count(&n));
  int other = n > 1 ? 1 : 0;
  crun_tensor_t *dt;
  EXPECT_OK(crun_tensor_transpose(d, 0, 2, &dt)); /* back to 4x6x5 */
  EXPECT_OK(crun_tensor_empty_on(CRUN_FLOAT64, 3, shape, other, &dd));
  EXPECT_OK(crun_tensor_copy(dd, dt));
  EXPECT(crun_tensor_equal(dd, h));
  crun_tensor_release(dd);
  crun_tensor_release(dt);
  crun_tensor_release(back);
  crun_tensor_release(d);
  crun_tensor_release(ht);
  crun_tensor_release(h);
}

TEST(events_order_two_streams_and_memory_is_counted) {
  if (no_device("events_order_two_streams_and_memory_is_counted")) return;
  crun_cuda_memory_t m0, m1, m2;
  EXPECT_OK(crun_cuda_synchronize(0));
  EXPECT_OK(crun_cuda_memory(0, &m0));
  int64_t n = 1 << 21, shape[1] = {n};
  crun_tensor_t *src, *mid, *dst;
  EXPECT_OK(crun_tensor_new_on(CRUN_FLOAT32, 1, shape, 0, &src));
  EXPECT_OK(crun_tensor_fill(src, -0.75));
  EXPECT_OK(crun_tensor_empty_on(CRUN_FLOAT32, 1, shape, 0, &mid));
  EXPECT_OK(crun_tensor_new_on(CRUN_FLOAT32, 1, shape, 0, &dst));
  EXPECT_OK(crun_cuda_memory(0, &m1));
  EXPECT_EQ_INT(m1.allocated - m0.allocated, 3 * 4 * n);
  EXPECT(m1.peak >= m1.allocated && m1.reserved >= m1.allocated);
  EXPECT_OK(crun_cuda_synchronize(0));
  crun_cuda_stream_t *s1, *s2, *def;
  crun_cuda_event_t *e;
  EXPECT_OK(crun_cuda_stream_create(0, &s1));
  EXPECT_OK(crun_cuda_stream_create(0, &s2));
  EXPECT_OK(crun_cuda_default_stream(0, &def));
  EXPECT_OK(crun_cuda_event_create(0, 1, &e));
  EXPECT_OK(crun_cuda_set_stream(s1));
  EXPECT_OK(crun_tensor_copy(mid, src));
  EXPECT_OK(crun_cuda_event_record(e, NULL));
  EXPECT_OK(crun_cuda_set_stream(s2));
  EXPECT_OK(crun_cuda_event_wait(e, NULL));
  EXPECT_OK(crun_tensor_copy(dst, mid));
  EXPECT_OK(crun_cuda_stream_synchronize(s2));
  EXPECT_EQ_INT(crun_cuda_event_query(e), 1);
  EXPECT_EQ_INT(crun_cuda_stream_query(s1), 1);
  EXPECT_OK(crun_cuda_set_stream(def));
  crun_tensor_t *h;
  EXPECT_OK(crun_tensor_to_device(dst, CRUN_DEVICE_CPU, &h));
  const float *p = crun_tensor_data(h);
  EXPECT(p[0] == -0.75f && p[n / 2] == -0.75f && p[n - 1] == -0.75f);
  crun_tensor_release(h);
  crun_cuda_event_release(e);
  crun_cuda_stream_release(s1);
  crun_cuda_stream_release(s2);
  crun_tensor_release(src);
  crun_tensor_release(mid);
  crun_tensor_release(dst);
  EXPECT_OK(crun_cuda_memory(0, &m2));
  EXPECT_EQ_INT(m2.allocated, m0.allocated);
  EXPECT_EQ_INT(m2.peak, m1.peak);
}

#define CRUN_TESTS(X) X(host_tensors_report_the_host) X(without_a_device_every_call_says_why) \
  X(strided_round_trip_through_a_device) X(events_order_two_streams_and_memory_is_counted)
CRUN_TEST_MAIN()
