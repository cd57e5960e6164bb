/* test_train_reducer.c — crun_reducer_*: bucket layout (reverse order, first
 * bucket cap, dtype changes), and on 1-4 forked ranks: averages, launches
 * in bucket order whatever the readiness order, unready gradients, a second
 * iteration, bucket views, the join shadow and misuse. */
#include <stdlib.h>

#include "test_pg_util.h"

/* Four float64 gradients of 3, 5, 2, 7 elements (24, 40, 16, 56 bytes):
 * with first 60 / cap 64 the buckets are {3}, {2, 1}, {0}. */
static const int64_t SIZES[4] = {3, 5, 2, 7};

static void make_grads(crun_tensor_t **g, int rank) {
  for (int i = 0; i < 4; i++) {
    EXPECT_OK(crun_tensor_new(CRUN_FLOAT64, 1, &SIZES[i], &g[i]));
    double *d = crun_tensor_data(g[i]);
    for (int64_t k = 0; k < SIZES[i]; k++) d[k] = (rank + 1) * (i + 1) * 10.0 + (double)k;
  }
}

static void free_grads(crun_tensor_t **g, int n) {
  for (int i = 0; i < n; i++) crun_tensor_release(g[i]);
}

/* Gradient i after averaging over `world` ranks (see make_grads). */
static double avg_of(int world, int i, int64_t k) {
  return (world + 1) / 2.0 * (i + 1) * 10.0 + (double)k;
}

static void expect_entry(crun_reducer_t *r, int b, int k, int grad, int64_t offset) {
  int g = -1;
  int64_t off = -1;
  EXPECT_OK(crun_reducer_bucket_entry(r, b, k, &g, &off));
  EXPECT_EQ_INT(g, grad);
  EXPECT_EQ_INT(off, offset);
}

TEST(layout) {
  crun_tensor_t *g[5];
  make_grads(g, 0);
  crun_reducer_opts_t o = {.first_bucket_bytes = 60, .bucket_cap_bytes = 64};
  crun_reducer_t *r = NULL;
  EXPECT_OK(crun_reducer_new(NULL, g, 4, &o, &r));
  EXPECT_EQ_INT(crun_reducer_num_buckets(r), 3);
  EXPECT_EQ_INT(crun_reducer_bucket_size(r, 0), 1);
  expect_entry(r, 0, 0, 3, 0);
  EXPECT_EQ_INT(crun_reducer_bucket_size(r, 1), 2);
  expect_entry(r, 1, 0, 2, 0);
  expect_entry(r, 1, 1, 1, 2);
  EXPECT_EQ_INT(crun_tensor_numel(crun_reducer_bucket(r, 1)), 7);
  expect_entry(r, 2, 0, 0, 0);
  EXPECT_STATUS(crun_reducer_bucket_entry(r, 3, 0, NULL, NULL), CRUN_EINVAL);
  /* no group: communication is refused clearly */
  EXPECT_STATUS(crun_reducer_mark_ready(r, 0), CRUN_ESTATE);
  EXPECT_STATUS(crun_reducer_mark_ready(r, 4), CRUN_EINVAL);
  crun_reducer_free(r);
  /* a gradient bigger than the cap gets its own bucket; a dtype change closes one */
  int64_t n1 = 1;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, 1, &n1, &g[4]));
  o = (crun_reducer_opts_t){.first_bucket_bytes = 1000, .bucket_cap_bytes = 1000};
  EXPECT_OK(crun_reducer_new(NULL, g, 5, &o, &r));
  EXPECT_EQ_INT(crun_reducer_num_buckets(r), 2);
  expect_entry(r, 0, 0, 4, 0);
  EXPECT_EQ_INT(crun_reducer_bucket_size(r, 1), 4);
  expect_entry(r, 1, 3, 0, 14);
  crun_reducer_free(r);
  o = (crun_reducer_opts_t){.first_bucket_bytes = 8, .bucket_cap_bytes = 8};
  EXPECT_OK(crun_reducer_new(NULL, g, 4, &o, &r));
  EXPECT_EQ_INT(crun_reducer_num_buckets(r), 4);
  crun_reducer_free(r);
  free_grads(g, 5);
}

TEST(bad_gradients) {
  int64_t shape[2] = {2, 3};
  crun_tensor_t *g[2] = {NULL, NULL}, *t = NULL;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, 2, shape, &g[0]));
  EXPECT_OK(crun_tensor_new(CRUN_INT64, 2, shape, &g[1]));
  crun_reducer_t *r = NULL;
  EXPECT_STATUS(crun_reducer_new(NULL, g, 2, NULL, &r), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "gradient 1 has unsupported dtype int64") != NULL);
  EXPECT_OK(crun_tensor_transpose(g[0], 0, 1, &t));
  crun_tensor_t *h[1] = {t};
  EXPECT_STATUS(crun_reducer_new(NULL, h, 1, NULL, &r), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "gradient 0 is not contiguous") != NULL);
  EXPECT(r == NULL);
  crun_tensor_release(t);
  free_grads(g, 2);
}

static void expect_avg(crun_tensor_t **g, int world) {
  for (int i = 0; i < 4; i++) {
    const double *d = crun_tensor_data(g[i]);
    for (int64_t k = 0; k < SIZES[i]; k++) EXPECT(d[k] == avg_of(world, i, k));
  }
}

/* Buckets whose gradients are all in ready[] form a complete prefix? Count it. */
static int complete_prefix(const int *ready) {
  static const int bucket_of[4] = {2, 1, 1, 0};
  int done[3] = {0, 0, 0}, need[3] = {1, 2, 1}, n = 0;
  for (int i = 0; i < 4; i++) done[bucket_of[i]] += ready[i];
  while (n < 3 && done[n] == need[n]) n++;
  return n;
}

/* Two iterations: readiness in a rank-dependent order, launches checked. */
static void rank_average(crun_pg_t *pg, void *arg) {
  (void)arg;
  int rank = crun_pg_rank(pg), world = crun_pg_size(pg);
  crun_tensor_t *g[4];
  make_grads(g, rank);
  crun_reducer_opts_t o = {.first_bucket_bytes = 60, .bucket_cap_bytes = 64};
  crun_reducer_t *r = NULL;
  EXPECT_OK(crun_reducer_new(pg, g, 4, &o, &r));
  for (int it = 0; it < 2; it++) {
    int ready[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; k++) {
      int i = (k + rank + it) % 4;
      EXPECT_OK(crun_reducer_mark_ready(r, i));
      ready[i] = 1;
      EXPECT_EQ_INT(crun_reducer_launched(r), complete_prefix(ready));
    }
    EXPECT_STATUS(crun_reducer_mark_ready(r, 2), CRUN_ESTATE);
    EXPECT(strstr(crun_last_error(), "gradient 2") != NULL);
    EXPECT_OK(crun_reducer_finalize(r, 20));
    EXPECT_EQ_INT(crun_reducer_launched(r), 0);
    expect_avg(g, world);
    /* the next iteration starts from this rank's own values again */
    free_grads(g, 4);
    make_grads(g, rank);
    crun_reducer_free(r);
    EXPECT_OK(crun_reducer_new(pg, g, 4, &o, &r));
  }
  /* unready gradients count with their current values (like unused parameters) */
  EXPECT_OK(crun_reducer_mark_ready(r, 3));
  EXPECT_EQ_INT(crun_reducer_launched(r), 1);
  EXPECT_OK(crun_reducer_finalize(r, 20));
  expect_avg(g, world);
  crun_reducer_free(r);
  free_grads(g, 4);
}

TEST(average_1_to_4_ranks) {
  for (int n = 1; n <= 4; n++) pg_spawn(n, rank_average, NULL);
}

/* gradient_as_bucket_view and no overlap: the views are the gradients. */
static void rank_views(crun_pg_t *pg, void *arg) {
  (void)arg;
  int rank = crun_pg_rank(pg), world = crun_pg_size(pg);
  crun_tensor_t *g[4], *v[4];
  make_grads(g, rank);
  crun_reducer_opts_t o = {.first_bucket_bytes = 60, .bucket_cap_bytes = 64, .grad_as_view = 1, .no_overlap = 1};
  crun_reducer_t *r = NULL;
  EXPECT_OK(crun_reducer_new(pg, g, 4, &o, &r));
  for (int i = 0; i < 4; i++) {
    EXPECT_OK(crun_reducer_bucket_view(r, i, &v[i]));
    EXPECT(crun_tensor_same_storage(v[i], crun_reducer_bucket(r, i == 0 ? 2 : i == 3 ? 0 : 1)));
    EXPECT_OK(crun_tensor_allclose(v[i], g[i], 0, 0) == 1 ? 0 : -1); /* starts with the values */
  }
  for (int i = 3; i >= 0; i--) {
    EXPECT_OK(crun_reducer_mark_ready(r, i));
    EXPECT_EQ_INT(crun_reducer_launched(r), 0); /* no overlap: all in finalize */
  }
  EXPECT_OK(crun_reducer_finalize(r, 20));
  expect_avg(v, world);
  crun_reducer_free(r);
  free_grads(v, 4);
  free_grads(g, 4);
}

TEST(bucket_views_no_overlap) {
  pg_spawn(1, rank_views, NULL);
  pg_spawn(3, rank_views, NULL);
}

/* Join: the last rank has no input and shadows with zeros. */
static void rank_join(crun_pg_t *pg, void *arg) {
  (void)arg;
  int rank = crun_pg_rank(pg), world = crun_pg_size(pg);
  crun_tensor_t *g[4];
  make_grads(g, rank);
  crun_reducer_opts_t o = {.first_bucket_bytes = 60, .bucket_cap_bytes = 64};
  crun_reducer_t *r = NULL;
  EXPECT_OK(crun_reducer_new(pg, g, 4, &o, &r));
  if (rank == world - 1) {
    EXPECT_OK(crun_reducer_shadow(r, 20));
  } else {
    for (int i = 0; i < 4; i++) EXPECT_OK(crun_reducer_mark_ready(r, i));
    EXPECT_OK(crun_reducer_finalize(r, 20));
    /* sum over the ranks that trained, divided by the full world size */
    for (int i = 0; i < 4; i++) {
      const double *d = crun_tensor_data(g[i]);
      for (int64_t k = 0; k < SIZES[i]; k++) {
        double sum = 0;
        for (int q = 0; q < world - 1; q++) sum += (q + 1) * (i + 1) * 10.0 + (double)k;
        EXPECT(d[k] == sum / world);
      }
    }
  }
  crun_reducer_free(r);
  free_grads(g, 4);
}

TEST(join_shadow) {
  pg_spawn(2, rank_join, NULL);
  pg_spawn(4, rank_join, NULL);
}

/* A peer that leaves without finalizing: finalize fails (peer died or timed
 * out) instead of hanging, naming the rank, and the reducer frees cleanly. */
static void rank_timeout(crun_pg_t *pg, void *arg) {
  (void)arg;
  crun_tensor_t *g[4];
  make_grads(g, crun_pg_rank(pg));
  crun_reducer_t *r = NULL;
  EXPECT_OK(crun_reducer_new(pg, g, 4, NULL, &r));
  if (crun_pg_rank(pg) == 0) {
    double t0 = crun_clock();
    int rc = crun_reducer_finalize(r, 1.0);
    EXPECT(rc < 0);
    EXPECT(strstr(crun_last_error(), "reducer finalize on rank 0") != NULL);
    EXPECT(crun_clock() - t0 < 20);
  }
  crun_reducer_free(r);
  free_grads(g, 4);
}

TEST(finalize_fails_clearly) {
  EXPECT_EQ_INT(pg_spawn_ex(2, rank_timeout, NULL, 2.0, 60.0), 0);
}

/* External mode (communication hooks): buckets are handed out in bucket
 * order as they complete, nothing is launched, finish copies back what the
 * caller left in each bucket and refuses a bucket not taken. */
static void rank_external(crun_pg_t *pg, void *arg) {
  (void)arg;
  int rank = crun_pg_rank(pg);
  crun_tensor_t *g[4];
  make_grads(g, rank);
  crun_reducer_opts_t o = {.first_bucket_bytes = 60, .bucket_cap_bytes = 64, .external = 1};
  crun_reducer_t *r = NULL;
  EXPECT_OK(crun_reducer_new(pg, g, 4, &o, &r));
  for (int it = 0; it < 2; it++) {
    EXPECT_EQ_INT(crun_reducer_next_ready(r), -1);
    EXPECT_OK(crun_reducer_mark_ready(r, 1)); /* bucket 1 = {2, 1}: half ready */
    EXPECT_EQ_INT(crun_reducer_next_ready(r), -1);
    EXPECT_OK(crun_reducer_mark_ready(r, 2)); /* bucket 1 complete, bucket 0 ({3}) is not */
    EXPECT_EQ_INT(crun_reducer_next_ready(r), -1);
    EXPECT_OK(crun_reducer_mark_ready(r, 3));
    EXPECT_EQ_INT(crun_reducer_next_ready(r), 0);
    EXPECT_EQ_INT(crun_reducer_next_ready(r), 1);
    EXPECT_EQ_INT(crun_reducer_next_ready(r), -1);
    EXPECT_EQ_INT(crun_reducer_launched(r), 2);
    EXPECT_STATUS(crun_reducer_finalize(r, 5), CRUN_ESTATE);
    EXPECT_STATUS(crun_reducer_finish(r), CRUN_ESTATE); /* bucket 2 never taken: reset */
    EXPECT_OK(crun_reducer_mark_ready(r, 3));           /* a fresh iteration */
    EXPECT_OK(crun_reducer_mark_rest(r));
    for (int b = 0; b < 3; b++) {
      EXPECT_EQ_INT(crun_reducer_next_ready(r), b);
      /* the "hook": bucket values negated and shifted by the bucket index */
      crun_tensor_t *buf = crun_reducer_bucket(r, b);
      double *d = crun_tensor_data(buf);
      for (int64_t k = 0; k < crun_tensor_numel(buf); k++) d[k] = -d[k] + b;
    }
    EXPECT_OK(crun_reducer_finish(r));
    for (int i = 0; i < 4; i++) {
      const double *d = crun_tensor_data(g[i]);
      int b = i == 3 ? 0 : i == 0 ? 2 : 1;
      for (int64_t k = 0; k < SIZES[i]; k++) {
        double orig = (rank + 1) * (i + 1) * 10.0 + (double)k;
        EXPECT(d[k] == (it == 0 ? -orig + b : orig)); /* applied twice: back to the start */
      }
    }
  }
  EXPECT_STATUS(crun_reducer_shadow(r, 5), CRUN_ESTATE);
  crun_reducer_free(r);
  free_grads(g, 4);
}

TEST(external_hook_mode) {
  pg_spawn(1, rank_external, NULL);
  pg_spawn(2, rank_external, NULL);
}

#define CRUN_TESTS(X) \
  X(layout) X(bad_gradients) X(average_1_to_4_ranks) X(bucket_views_no_overlap) X(join_shadow) X(finalize_fails_clearly) \
  X(external_hook_mode)
CRUN_TEST_MAIN()
