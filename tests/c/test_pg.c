/* test_pg.c — process group semantics on forked ranks: async ordering,
 * sub-groups, point-to-point matching by source and tag, argument errors,
 * and the failure reports (mismatch, timeout, a peer killed mid-collective). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "test_pg_util.h"

static void async_order(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), p = crun_pg_size(pg);
  enum { N = 6, C = 50000 };
  static float bufs[N][C];
  crun_work_t *w[N];
  for (int k = 0; k < N; k++) {
    for (int i = 0; i < C; i++) bufs[k][i] = (float)(r + k);
    EXPECT_OK(crun_pg_all_reduce(pg, bufs[k], C, CRUN_FLOAT32, CRUN_OP_SUM, NULL, &w[k]));
  }
  float x = (float)r;
  EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_MAX, NULL, NULL)); /* behind the queue */
  EXPECT(x == (float)(p - 1));
  for (int k = N - 1; k >= 0; k--) {
    EXPECT_OK(crun_work_wait(w[k], 10));
    EXPECT(crun_work_is_completed(w[k]));
    crun_work_release(w[k]);
    float want = (float)(p * (p - 1) / 2 + p * k);
    EXPECT(bufs[k][0] == want && bufs[k][C - 1] == want);
  }
  /* blocking calls behind an async one: their Work moves from the caller's
   * stack to the heap with what it owns (the list of outputs) and gives back
   * what it found out (the sender of a receive from any rank) */
  static float big[C];
  crun_work_t *wa;
  float mine = (float)(10 + r), got[4] = {0};
  void *outs[4] = {&got[0], &got[1], &got[2], &got[3]};
  EXPECT_OK(crun_pg_all_reduce(pg, big, C, CRUN_FLOAT32, CRUN_OP_SUM, NULL, &wa));
  EXPECT_OK(crun_pg_all_gather(pg, outs, &mine, 1, CRUN_FLOAT32, NULL, NULL));
  for (int q = 0; q < p; q++) EXPECT(got[q] == (float)(10 + q));
  EXPECT_OK(crun_work_wait(wa, 10));
  crun_work_release(wa);
  EXPECT_OK(crun_pg_all_reduce(pg, big, C, CRUN_FLOAT32, CRUN_OP_SUM, NULL, &wa));
  float v = (float)(100 + r);
  int src = -1;
  if (r == 1) EXPECT_OK(crun_pg_send(pg, &v, 1, CRUN_FLOAT32, 0, NULL, NULL));
  if (r == 0) {
    EXPECT_OK(crun_pg_recv(pg, &v, 1, CRUN_FLOAT32, CRUN_ANY_SOURCE, NULL, &src, NULL));
    EXPECT_EQ_INT(src, 1);
    EXPECT(v == 101.0f);
  }
  EXPECT_OK(crun_work_wait(wa, 10));
  crun_work_release(wa);
  EXPECT_EQ_INT(crun_pg_next_seq(pg), N + 5);
}

TEST(async_ordering) { pg_spawn(3, async_order, NULL); }

/* Blocking calls issued right behind async ones, many times: the blocking
 * call runs inline on the caller's thread only once the progress thread has
 * run everything queued before it (work.c: busy and queued, taken without
 * the group's lock). Run out of order, the ranks would pair different
 * operations: a mismatch, or a sum of the wrong buffers. */
static void async_blocking_race(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), p = crun_pg_size(pg);
  enum { ROUNDS = 3000, C = 37 };
  static double a[C], b[C];
  for (int k = 0; k < ROUNDS; k++) {
    crun_work_t *w = NULL;
    for (int i = 0; i < C; i++) a[i] = (double)((r + 1) * (k + i) - 7 * i);
    double x = (double)(k % 2 ? -(r + 3) * k : (r + 3) * k);
    EXPECT_OK(crun_pg_all_reduce(pg, a, C, CRUN_FLOAT64, CRUN_OP_SUM, NULL, &w));
    if (k % 3 == 0) EXPECT_OK(crun_work_wait(w, 30)); /* sometimes the queue is empty again first */
    EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT64, CRUN_OP_SUM, NULL, NULL));
    for (int i = 0; i < C; i++) b[i] = (double)(k - i * r);
    EXPECT_OK(crun_pg_broadcast(pg, b, C, CRUN_FLOAT64, k % p, NULL, NULL));
    EXPECT_OK(crun_work_wait(w, 30));
    crun_work_release(w);
    double sx = 0, want_a0 = 0, want_a5 = 0;
    for (int q = 0; q < p; q++) {
      sx += (double)(k % 2 ? -(q + 3) * k : (q + 3) * k);
      want_a0 += (double)((q + 1) * k);
      want_a5 += (double)((q + 1) * (k + 5) - 35);
    }
    if (x != sx || a[0] != want_a0 || a[5] != want_a5 || b[3] != (double)(k - 3 * (k % p))) {
      EXPECT(0 && "async/blocking order");
      break;
    }
  }
  EXPECT_EQ_INT(crun_pg_next_seq(pg), 3 * ROUNDS + 1);
}

TEST(async_blocking_race) { pg_spawn(3, async_blocking_race, NULL); }

static void subgroups(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  int a[] = {0, 2}, b[] = {3, 1};
  crun_pg_t *ga = NULL, *gb = NULL;
  EXPECT_OK(crun_pg_new_group(pg, a, 2, 0, &ga));
  EXPECT_OK(crun_pg_new_group(pg, b, 2, 0, &gb));
  EXPECT((ga != NULL) == (r == 0 || r == 2));
  EXPECT((gb != NULL) == (r == 1 || r == 3));
  crun_pg_t *g = ga ? ga : gb;
  EXPECT_EQ_INT(crun_pg_size(g), 2);
  EXPECT_EQ_INT(crun_pg_global_rank(g, crun_pg_rank(g)), r);
  int64_t v = r;
  EXPECT_OK(crun_pg_all_reduce(g, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL));
  EXPECT_EQ_INT(v, ga ? 2 : 4);
  int64_t root_val = r * 10;
  EXPECT_OK(crun_pg_broadcast(g, &root_val, 1, CRUN_INT64, 0, NULL, NULL));
  EXPECT_EQ_INT(root_val, ga ? 0 : 10); /* as in torch, members are sorted: {3, 1} has global 1 as group rank 0 */
  crun_pg_release(g);
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  int bad[] = {0, 4};
  crun_pg_t *gx = NULL;
  EXPECT_STATUS(crun_pg_new_group(pg, bad, 2, 0, &gx), CRUN_EINVAL);
  EXPECT_TEXT("rank 4 is out of range");
}

TEST(sub_groups) { pg_spawn(4, subgroups, NULL); }

static void p2p(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), p = crun_pg_size(pg), src = -2;
  int32_t a[3] = {r, r, r}, b[3] = {0};
  crun_coll_opts_t t1 = {.tag = 1}, t2 = {.tag = 2};
  if (r == 0) {
    int32_t x[3] = {11, 12, 13}, y[3] = {21, 22, 23};
    EXPECT_OK(crun_pg_send(pg, x, 3, CRUN_INT32, 1, &t1, NULL));
    EXPECT_OK(crun_pg_send(pg, y, 3, CRUN_INT32, 1, &t2, NULL));
    for (int k = 1; k < p; k++) {
      EXPECT_OK(crun_pg_recv(pg, b, 3, CRUN_INT32, CRUN_ANY_SOURCE, NULL, &src, NULL));
      EXPECT(src >= 1 && src < p && b[0] == src && b[2] == src);
    }
  } else {
    if (r == 1) {
      EXPECT_OK(crun_pg_recv(pg, b, 3, CRUN_INT32, 0, &t2, &src, NULL)); /* tag 1 waits in the stash */
      EXPECT(src == 0 && b[0] == 21 && b[2] == 23);
      crun_work_t *w;
      EXPECT_OK(crun_pg_recv(pg, b, 3, CRUN_INT32, 0, &t1, NULL, &w));
      EXPECT_OK(crun_work_wait(w, 10));
      EXPECT_EQ_INT(crun_work_source(w), 0);
      crun_work_release(w);
      EXPECT(b[0] == 11 && b[2] == 13);
    }
    EXPECT_OK(crun_pg_send(pg, a, 3, CRUN_INT32, 0, NULL, NULL));
  }
  /* a size mismatch on a matching tag is an error on the receiver */
  if (r == 0) EXPECT_OK(crun_pg_send(pg, a, 2, CRUN_INT32, 1, &t1, NULL));
  if (r == 1) {
    EXPECT_STATUS(crun_pg_recv(pg, b, 3, CRUN_INT32, 0, &t1, NULL, NULL), CRUN_EMISMATCH);
    EXPECT_TEXT("expected int32[3], rank 0 sent int32[2]");
  }
}

TEST(send_recv_matching) { pg_spawn(3, p2p, NULL); }

/* Rank 1's wait(0.2) must time out while rank 0 holds its send back until
 * rank 1 says (through a flag file) that it saw the timeout. */
static void wait_timeout(crun_pg_t *pg, void *arg) {
  const char *flag = arg;
  double v = 0;
  if (crun_pg_rank(pg) == 1) {
    crun_work_t *w;
    EXPECT_OK(crun_pg_recv(pg, &v, 1, CRUN_FLOAT64, 0, NULL, NULL, &w));
    EXPECT_STATUS(crun_work_wait(w, 0.2), CRUN_ETIMEDOUT);
    EXPECT(!crun_work_is_completed(w));
    FILE *f = fopen(flag, "w");
    EXPECT(f != NULL);
    fclose(f);
    EXPECT_OK(crun_pg_send(pg, &v, 1, CRUN_FLOAT64, 0, NULL, NULL)); /* queued behind the recv */
    EXPECT_OK(crun_work_wait(w, 10));
    EXPECT(v == 7.5);
    crun_work_release(w);
  } else {
    double end = crun_clock() + 20;
    while (access(flag, F_OK) != 0 && crun_clock() < end) usleep(10000);
    v = 7.5;
    EXPECT_OK(crun_pg_send(pg, &v, 1, CRUN_FLOAT64, 1, NULL, NULL));
    EXPECT_OK(crun_pg_recv(pg, &v, 1, CRUN_FLOAT64, 1, NULL, NULL, NULL));
  }
}

TEST(work_wait_timeout) {
  char flag[PATH_MAX];
  crun_test_tmp_path(flag, sizeof flag, "crun_pgtest_flag_%d", (int)getpid());
  unlink(flag);
  pg_spawn(2, wait_timeout, flag);
  unlink(flag);
}

static void bad_args(crun_pg_t *pg, void *arg) {
  (void)arg;
  float f[4] = {0};
  EXPECT_STATUS(crun_pg_all_reduce(pg, f, 4, CRUN_FLOAT32, CRUN_OP_BXOR, NULL, NULL), CRUN_EINVAL);
  EXPECT_TEXT("bxor");
  EXPECT_STATUS(crun_pg_broadcast(pg, f, 4, CRUN_FLOAT32, 5, NULL, NULL), CRUN_EINVAL);
  EXPECT_TEXT("root 5 is out of range for a group of 2 ranks");
  EXPECT_STATUS(crun_pg_send(pg, f, 4, CRUN_FLOAT32, crun_pg_rank(pg), NULL, NULL), CRUN_EINVAL);
  EXPECT_STATUS(crun_pg_all_reduce(pg, NULL, 4, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL), CRUN_EINVAL);
  /* every rank refused the same three collectives (a refused send is this
   * rank's alone): each refusal took its number (#1-#3), as on the peers, and
   * the group goes on, as torch's does; a refusal of one rank only stops it
   * (spec dist_errors "fail every rank when rank N alone refuses") */
  EXPECT_TEXT("every rank refused all_reduce #3: the group goes on");
  EXPECT_EQ_INT((int)crun_pg_next_seq(pg), 4);
  f[0] = (float)crun_pg_rank(pg) + 1.5f;
  EXPECT_OK(crun_pg_all_reduce(pg, f, 4, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL));
  EXPECT(f[0] == 4.0f);
  EXPECT_EQ_INT((int)crun_pg_next_seq(pg), 5);
}

TEST(argument_errors) { pg_spawn(2, bad_args, NULL); }

/* Rank 2 calls all_gather (or another count) where the others all_reduce. */
static void mismatch(crun_pg_t *pg, void *arg) {
  int r = crun_pg_rank(pg), mode = *(int *)arg;
  float buf[4 * 1024] = {0}, *outs[3] = {buf, buf + 1024, buf + 2048};
  int rc;
  if (r == 2 && mode == 0) rc = crun_pg_all_gather(pg, (void *const *)outs, buf + 3072, 512, CRUN_FLOAT32, NULL, NULL);
  else rc = crun_pg_all_reduce(pg, buf, r == 2 ? 512 : 1024, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL);
  EXPECT_EQ_INT(rc, CRUN_EMISMATCH);
  /* whichever rank saw it first, every rank names both calls and rank 2 */
  EXPECT_TEXT("all_reduce");
  EXPECT_TEXT(mode == 0 ? "all_gather" : "float32[1024]");
  EXPECT_TEXT("float32[512]");
  EXPECT_TEXT("rank 2");
  /* the group is unusable afterwards, and says why */
  EXPECT_STATUS(crun_pg_barrier(pg, NULL, NULL), CRUN_ESTATE);
  EXPECT_TEXT("earlier failure");
}

TEST(mismatch_reported_everywhere) {
  int mode = 0;
  EXPECT_EQ_INT(pg_spawn_ex(3, mismatch, &mode, 20.0, 30.0), 0);
  mode = 1;
  EXPECT_EQ_INT(pg_spawn_ex(3, mismatch, &mode, 20.0, 30.0), 0);
}

static void timeout_case(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float x = 1;
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  if (r == 2) {
    usleep(2500 * 1000);
    /* the late rank may still complete all_reduce from buffered data, but the
     * group is aborted: at the latest the next call fails */
    int rc = crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL);
    if (rc == 0) rc = crun_pg_barrier(pg, NULL, NULL);
    EXPECT(rc < 0);
    return;
  }
  crun_coll_opts_t o = {.timeout = 1.0};
  double t0 = crun_clock();
  EXPECT_STATUS(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, &o, NULL), CRUN_ETIMEDOUT);
  EXPECT(crun_clock() - t0 < 5.0); /* 1 s deadline + the report; far below the group timeout */
  EXPECT_TEXT("all_reduce #2");
  EXPECT_TEXT("rank 2 is at barrier #1");
  if (r == 1) {
    EXPECT_TEXT("no data from rank 2 after 1.0 s");
    EXPECT_TEXT("ranks 0-1 are at all_reduce #2");
  }
}

TEST(timeout_names_ranks) { EXPECT_EQ_INT(pg_spawn_ex(3, timeout_case, NULL, 20.0, 30.0), 0); }

static void killed_case(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  size_t n = 4 << 20;
  float *buf = calloc(n, sizeof(float));
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  if (r == 2) {
    usleep(300 * 1000);
    raise(SIGKILL);
  }
  double t0 = crun_clock();
  int rc = 0;
  for (int k = 0; k < 50 && rc == 0; k++) rc = crun_pg_all_reduce(pg, buf, n, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL);
  EXPECT(rc == CRUN_EPEERDIED || rc == CRUN_ECONNRESET);
  EXPECT_TEXT("rank 2");
  EXPECT(crun_clock() - t0 < 10.0);
  free(buf);
}

TEST(peer_killed_mid_all_reduce) { EXPECT_EQ_INT(pg_spawn_ex(3, killed_case, NULL, 60.0, 30.0), 1); }

/* The failure reports over TCP alone (the shm engine has its own wording). */
TEST(tcp_mismatch) {
  setenv("CRUN_SHM", "0", 1);
  int mode = 0;
  EXPECT_EQ_INT(pg_spawn_ex(3, mismatch, &mode, 20.0, 30.0), 0);
}

TEST(tcp_timeout) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(3, timeout_case, NULL, 20.0, 30.0), 0);
}

TEST(tcp_peer_killed) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(3, killed_case, NULL, 60.0, 30.0), 1);
}

/* Rank 1 fails the group (its recv from rank 2 times out after 0.5 s) while
 * rank 0 waits in a barrier for rank 2, which sleeps 6 s: rank 0 fails at
 * once with rank 1's reason, though its barrier step reads only rank 2's
 * connection and rank 1's abort frame waits on another one (it had been
 * learnt one hop later: when rank 2 woke and passed the failure on). */
static void abort_elsewhere(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float x = 0;
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  if (r == 1) {
    crun_coll_opts_t o = {.tag = 9, .timeout = 0.5};
    EXPECT_STATUS(crun_pg_recv(pg, &x, 1, CRUN_FLOAT32, 2, &o, NULL, NULL), CRUN_ETIMEDOUT);
    usleep(3000 * 1000); /* stays up: rank 0 learns it from the abort frame, not a close */
    return;
  }
  if (r == 2) {
    usleep(6000 * 1000);
    (void)crun_pg_barrier(pg, NULL, NULL); /* may pass: its frames go out before it reads any */
    return;
  }
  double t0 = crun_clock();
  EXPECT_STATUS(crun_pg_barrier(pg, NULL, NULL), CRUN_ETIMEDOUT);
  EXPECT(crun_clock() - t0 < 2.5); /* rank 2 sleeps 6 s; the barrier's timeout is 20 s */
  EXPECT_TEXT("recv from rank 2 (tag 9) on rank 1: no data from rank 2 after 0.5 s");
  EXPECT_TEXT("[reported by rank 1; rank 0 was in barrier #2]");
}

TEST(tcp_abort_seen_while_waiting_on_another_peer) {
  setenv("CRUN_TRANSPORT", "tcp", 1);
  EXPECT_EQ_INT(pg_spawn_ex(3, abort_elsewhere, NULL, 20.0, 30.0), 0);
  unsetenv("CRUN_TRANSPORT");
}

/* Two threads per rank issue the same all_reduce on one group, one blocking,
 * the other async every other call: whichever pairing the ranks' run orders
 * give, every sum is the group size. The ranks must agree on each
 * operation's number, which is its place in the run order (work.c number());
 * numbered at submit, the numbers of a blocking call run inline and of a
 * call queued meanwhile by the other thread came out of run order, and TCP
 * refused the frames ("expected all_reduce #4867, rank 1 sent #4868"). */
typedef struct {
  crun_pg_t *pg;
  int n, async, bad;
} thr_t;

static void *thr_main(void *arg) {
  thr_t *t = arg;
  for (int k = 0; k < t->n && !t->bad; k++) {
    int32_t x = 1;
    crun_work_t *w = NULL;
    int rc = crun_pg_all_reduce(t->pg, &x, 1, CRUN_INT32, CRUN_OP_SUM, NULL, t->async && (k & 1) ? &w : NULL);
    if (rc == 0 && w) rc = crun_work_wait(w, 30);
    if (w) crun_work_release(w);
    if (rc < 0 || x != crun_pg_size(t->pg)) {
      fprintf(stderr, "rank %d call %d: %s (sum %d)\n", crun_pg_rank(t->pg), k, rc < 0 ? crun_last_error() : "ok", x);
      t->bad = 1;
    }
  }
  return NULL;
}

static void two_threads(crun_pg_t *pg, void *arg) {
  int n = *(const int *)arg; /* calls per thread */
  thr_t a = {pg, n, 1, 0}, b = {pg, n, 0, 0};
  pthread_t ta, tb;
  EXPECT(pthread_create(&ta, NULL, thr_main, &a) == 0);
  EXPECT(pthread_create(&tb, NULL, thr_main, &b) == 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  EXPECT(!a.bad && !b.bad);
  EXPECT_EQ_INT(crun_pg_next_seq(pg), 2 * (uint64_t)n + 1);
}

/* On shared memory, with the ranks' four threads on two cores, a few
 * thousand calls already take seconds under load; over TCP the numbering
 * bug above showed after ~3,000 calls per thread, so that one runs 20,000. */
TEST(two_threads_one_group) {
  static const int n = 4000;
  pg_spawn(2, two_threads, (void *)&n);
}

TEST(tcp_two_threads_one_group) {
  static const int n = 20000;
  setenv("CRUN_SHM", "0", 1);
  pg_spawn(2, two_threads, (void *)&n);
}

/* dist.stats' time of large all_gathers run right after small ones: the
 * small ones' ends may be estimated from their last exact duration
 * (core/trace.c end_ticks), a large one's never. */
static void stats_after_small(crun_pg_t *pg, void *arg) {
  (void)arg;
  int p = crun_pg_size(pg);
  enum { BIG = 4 << 20 };
  float *in = calloc(BIG, sizeof(float)), *outs[4], one = 1, got[4];
  void *small[4];
  for (int q = 0; q < p; q++) outs[q] = calloc(BIG, sizeof(float)), small[q] = &got[q];
  crun_pg_stat_t st[CRUN_PG_STAT_OPS];
  for (int k = 0; k < 20; k++) EXPECT_OK(crun_pg_all_gather(pg, small, &one, 1, CRUN_FLOAT32, NULL, NULL));
  EXPECT_OK(crun_pg_stats(pg, st, 1));
  double t0 = crun_clock();
  for (int k = 0; k < 5; k++)
    EXPECT_OK(crun_pg_all_gather(pg, (void *const *)outs, in, BIG, CRUN_FLOAT32, NULL, NULL));
  double wall = crun_clock() - t0;
  EXPECT_OK(crun_pg_stats(pg, st, 1));
  EXPECT_EQ_INT((int)st[5].ops, 5); /* index 5: all_gather */
  if (!(st[5].time_s > 0.5 * wall && st[5].time_s <= 1.01 * wall)) {
    fprintf(stderr, "rank %d: 5 all_gathers of 16 MiB: %.6f s in stats, %.6f s around them\n", crun_pg_rank(pg),
            st[5].time_s, wall);
    EXPECT(0);
  }
  for (int q = 0; q < p; q++) free(outs[q]);
  free(in);
}

TEST(stats_large_after_small) { pg_spawn(2, stats_after_small, NULL); }

/* crun_work_wait(w, 0) sets no limit of its own: the operation's deadline
 * (the group's timeout, here 0.5 s) ends it on every path. Rank 0 issues an
 * async op rank 1 never matches (mode 0: a recv, 1: a 64 MiB send, 2: an
 * all_reduce) and a barrier queued behind it, and waits on both with 0: the
 * first ends with ETIMEDOUT in a few seconds, the second with ESTATE. Rank 1
 * keeps the group until rank 0 says (flag file) that its waits returned. */
typedef struct { int mode; char flag[PATH_MAX]; } wait0_t;

static void wait_zero(crun_pg_t *pg, void *arg) {
  wait0_t *a = arg;
  if (crun_pg_rank(pg) == 1) {
    double end = crun_clock() + 20;
    while (access(a->flag, F_OK) != 0 && crun_clock() < end) usleep(10000);
    return;
  }
  crun_pg_set_timeout(pg, 0.5);
  size_t n = a->mode == 1 ? 64u << 20 : 16;
  uint8_t *b = calloc(n, 1);
  EXPECT(b != NULL);
  crun_work_t *w, *w2;
  if (a->mode == 0) EXPECT_OK(crun_pg_recv(pg, b, n, CRUN_UINT8, 1, NULL, NULL, &w));
  if (a->mode == 1) EXPECT_OK(crun_pg_send(pg, b, n, CRUN_UINT8, 1, NULL, &w));
  if (a->mode == 2) EXPECT_OK(crun_pg_all_reduce(pg, b, n, CRUN_UINT8, CRUN_OP_SUM, NULL, &w));
  EXPECT_OK(crun_pg_barrier(pg, NULL, &w2));
  double t0 = crun_clock();
  EXPECT_STATUS(crun_work_wait(w, 0), CRUN_ETIMEDOUT);
  EXPECT_STATUS(crun_work_wait(w2, 0), CRUN_ESTATE);
  EXPECT(crun_clock() - t0 < 5.0);
  crun_work_release(w);
  crun_work_release(w2);
  free(b);
  FILE *f = fopen(a->flag, "w");
  EXPECT(f != NULL);
  fclose(f);
}

static void wait_zero_modes(const char *shm) {
  setenv("CRUN_SHM", shm, 1);
  for (int mode = 0; mode < 3; mode++) {
    if (mode < 2 && shm[0] == '1') continue; /* p2p runs over TCP either way */
    wait0_t a = {.mode = mode};
    crun_test_tmp_path(a.flag, sizeof a.flag, "crun_pgtest_w0_%d", (int)getpid());
    unlink(a.flag);
    EXPECT_EQ_INT(pg_spawn_ex(2, wait_zero, &a, 20.0, 30.0), 0);
    unlink(a.flag);
  }
}

TEST(wait_zero_ends_by_the_deadline) { wait_zero_modes("0"); }
TEST(wait_zero_ends_by_the_deadline_shm) { wait_zero_modes("1"); }

/* A timeout of inf (or NaN, or more than 1e9 s) never makes a deadline that
 * cannot pass: inf and huge ones are 1e9 s, NaN and <= 0 the default. */
static void timeouts_clamped(crun_pg_t *pg, void *arg) {
  (void)arg;
  crun_pg_set_timeout(pg, INFINITY);
  EXPECT(crun_pg_get_timeout(pg) == 1e9);
  crun_pg_set_timeout(pg, 1e300);
  EXPECT(crun_pg_get_timeout(pg) == 1e9);
  crun_pg_set_timeout(pg, NAN);
  EXPECT(crun_pg_get_timeout(pg) == CRUN_PG_DEFAULT_TIMEOUT);
  crun_pg_set_timeout(pg, 7.5);
  EXPECT(crun_pg_get_timeout(pg) == 7.5);
  crun_pg_t *g = NULL;
  int all[2] = {0, 1};
  EXPECT_OK(crun_pg_new_group(pg, all, 2, INFINITY, &g));
  EXPECT(g && crun_pg_get_timeout(g) == 1e9);
  float v = (float)(crun_pg_rank(pg) + 1);
  crun_coll_opts_t o = {.timeout = INFINITY};
  EXPECT_OK(crun_pg_all_reduce(g, &v, 1, CRUN_FLOAT32, CRUN_OP_SUM, &o, NULL));
  EXPECT(v == 3.0f);
  crun_pg_destroy(g);
}
TEST(timeouts_clamped) { pg_spawn(2, timeouts_clamped, NULL); }

/* A refusal on a group that is already unusable (here: rank 1 alone refused
 * call #1, which stopped the group on both ranks) has no peer left to agree
 * with: the peers' calls fail at once (ESTATE) and take no number, so
 * waiting for them to refuse too would last the group's timeout. */
static void refuse_broken(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float f[2] = {1.5f, -2.25f};
  EXPECT_STATUS(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, r == 1 ? CRUN_OP_BXOR : CRUN_OP_SUM, NULL, NULL),
                CRUN_EINVAL);
  double t0 = crun_clock();
  int rc = crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, r == 0 ? CRUN_OP_BXOR : CRUN_OP_SUM, NULL, NULL);
  EXPECT_EQ_INT(rc, r == 0 ? CRUN_EINVAL : CRUN_ESTATE);
  EXPECT(crun_clock() - t0 < 3.0);
  EXPECT(!strstr(crun_last_error(), "goes on"));
}
TEST(refusal_on_broken_group) { EXPECT_EQ_INT(pg_spawn_ex(2, refuse_broken, NULL, 15.0, 40.0), 0); }


static void *recv_from_0(void *arg) {
  float v = 0;
  crun_pg_recv(arg, &v, 1, CRUN_FLOAT32, 0, NULL, NULL, NULL);
  return NULL;
}

/* Rank 1 refuses all_reduce #1 while another of its threads is in a recv,
 * so its refusal takes no number and stops the group; rank 0 refuses the
 * same all_reduce as #1. Rank 0 must learn at once that rank 1 stopped
 * instead of waiting its timeout for a refusal of #1 that never comes. */
static void refuse_beside_recv(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float f[2] = {1.5f, -2.25f};
  pthread_t th;
  if (r == 1) EXPECT(pthread_create(&th, NULL, recv_from_0, pg) == 0);
  usleep(r == 1 ? 100 * 1000 : 400 * 1000);
  double t0 = crun_clock();
  EXPECT_STATUS(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, CRUN_OP_BXOR, NULL, NULL), CRUN_EINVAL);
  EXPECT(crun_clock() - t0 < 3.0);
  EXPECT_TEXT("bxor");
  EXPECT(!strstr(crun_last_error(), "goes on"));
  EXPECT_STATUS(crun_pg_barrier(pg, NULL, NULL), CRUN_ESTATE);
  if (r == 1) pthread_join(th, NULL);
}
TEST(refusal_beside_unnumbered_refusal) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_beside_recv, NULL, 15.0, 40.0), 0);
}

/* Rank 1 closes the group after call #1; rank 0 then refuses all_reduce #2,
 * which rank 1 will never call, let alone refuse: rank 0 fails at once (the
 * group stops), as before the every-rank agreement, not after its timeout. */
static void refuse_after_peer_closed(crun_pg_t *pg, void *arg) {
  (void)arg;
  float f[2] = {1.5f, -2.25f};
  EXPECT_OK(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL));
  if (crun_pg_rank(pg) == 1) return; /* pg_spawn_ex releases the group */
  usleep(400 * 1000);
  double t0 = crun_clock();
  EXPECT_STATUS(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, CRUN_OP_BXOR, NULL, NULL), CRUN_EINVAL);
  EXPECT(crun_clock() - t0 < 3.0);
  EXPECT(!strstr(crun_last_error(), "goes on"));
}
TEST(refusal_after_peer_closed) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_after_peer_closed, NULL, 15.0, 40.0), 0);
}

/* The seconds rank r's refusal of a float all_reduce (bxor) took, after
 * EINVAL that does not say "goes on"; printed for the report. */
static double refuse_bxor_timed(crun_pg_t *pg, const char *what) {
  float f[2] = {1.5f, -2.25f};
  double t0 = crun_clock();
  EXPECT_STATUS(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, CRUN_OP_BXOR, NULL, NULL), CRUN_EINVAL);
  double s = crun_clock() - t0;
  EXPECT(!strstr(crun_last_error(), "goes on"));
  fprintf(stderr, "rank %d: refusal %s took %.3f s\n", crun_pg_rank(pg), what, s);
  return s;
}

/* Rank 1 is killed (SIGKILL, its group never closed) after call #1; rank 0
 * then refuses call #2, which rank 1 will never reach: its connection's end
 * tells rank 0 at once, not the agreement's 5 s bound. */
static void refuse_after_peer_killed(crun_pg_t *pg, void *arg) {
  (void)arg;
  float f[2] = {1.5f, -2.25f};
  EXPECT_OK(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL));
  if (crun_pg_rank(pg) == 1) raise(SIGKILL);
  usleep(400 * 1000);
  EXPECT(refuse_bxor_timed(pg, "after a killed peer") < 3.0);
}
TEST(refusal_after_peer_killed) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_after_peer_killed, NULL, 15.0, 40.0), 1);
}
TEST(refusal_after_peer_killed_shm) {
  setenv("CRUN_SHM", "1", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_after_peer_killed, NULL, 15.0, 40.0), 1);
}

/* Rank 1's group fails for a reason of its own (a recv from rank 0 that
 * times out) and rank 1 stays up without closing it; rank 0 then refuses
 * call #2, which rank 1 will never reach: the failure left stopped/1 on the
 * board, so rank 0 stops at once. */
static void refuse_after_peer_failed(crun_pg_t *pg, void *arg) {
  (void)arg;
  float f[2] = {1.5f, -2.25f};
  EXPECT_OK(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL));
  if (crun_pg_rank(pg) == 1) {
    crun_coll_opts_t o = {.timeout = 0.2};
    EXPECT_STATUS(crun_pg_recv(pg, f, 1, CRUN_FLOAT32, 0, &o, NULL, NULL), CRUN_ETIMEDOUT);
    usleep(3500 * 1000);
    return;
  }
  usleep(800 * 1000);
  EXPECT(refuse_bxor_timed(pg, "after a peer's failed group") < 3.0);
}
TEST(refusal_after_peer_failed) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_after_peer_failed, NULL, 15.0, 40.0), 0);
}

/* Rank 1 waits in a blocking recv from rank 0 while rank 0 refuses call #1:
 * rank 1 cannot reach #1 until rank 0 sends, so rank 0 stops at once (the
 * board shows whom rank 1's recv waits for) instead of after 5 s, and rank
 * 1's recv fails with rank 0's refusal. */
static void refuse_while_peer_in_recv(crun_pg_t *pg, void *arg) {
  (void)arg;
  float f[2] = {1.5f, -2.25f};
  if (crun_pg_rank(pg) == 1) {
    double t0 = crun_clock();
    EXPECT(crun_pg_recv(pg, f, 1, CRUN_FLOAT32, 0, NULL, NULL, NULL) < 0);
    EXPECT_TEXT("bxor");
    EXPECT(crun_clock() - t0 < 3.5);
    return;
  }
  usleep(300 * 1000);
  EXPECT(refuse_bxor_timed(pg, "while the peer waits in a recv from it") < 3.0);
}
TEST(refusal_while_peer_in_recv) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_while_peer_in_recv, NULL, 15.0, 40.0), 0);
}

/* As refusal_while_peer_in_recv, but rank 1 waits on the Work of an irecv
 * from rank 0: that wait, too, only rank 0 can end, so rank 0 stops at once
 * (before, the board showed no wait for an async recv's Work, and rank 0's
 * refusal took the agreement's full 5 s). */
static void refuse_while_peer_waits_irecv(crun_pg_t *pg, void *arg) {
  (void)arg;
  float f[2] = {1.5f, -2.25f};
  if (crun_pg_rank(pg) == 1) {
    double t0 = crun_clock();
    crun_work_t *w = NULL;
    EXPECT_OK(crun_pg_recv(pg, f, 1, CRUN_FLOAT32, 0, NULL, NULL, &w));
    EXPECT(crun_work_wait(w, 10.0) < 0);
    EXPECT_TEXT("bxor");
    EXPECT(crun_clock() - t0 < 3.5);
    crun_work_release(w);
    return;
  }
  usleep(300 * 1000);
  EXPECT(refuse_bxor_timed(pg, "while the peer waits on an irecv from it") < 3.0);
}
TEST(refusal_while_peer_waits_irecv) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_while_peer_waits_irecv, NULL, 15.0, 40.0), 0);
}

/* Rank 1 receives from rank 0 (a recv that ends), then works 1 s before it
 * makes the refusal rank 0 made right after its send: a recv that ended is
 * no wait on rank 0, so the group goes on, as it did before the board named
 * blocked sends and recvs. */
static void refuse_after_recv_ended(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float f[2] = {1.5f, -2.25f};
  if (r == 0) EXPECT_OK(crun_pg_send(pg, f, 2, CRUN_FLOAT32, 1, NULL, NULL));
  else EXPECT_OK(crun_pg_recv(pg, f, 2, CRUN_FLOAT32, 0, NULL, NULL, NULL));
  if (r == 1) usleep(1000 * 1000);
  EXPECT_STATUS(crun_pg_all_reduce(pg, f, 2, CRUN_FLOAT32, CRUN_OP_BXOR, NULL, NULL), CRUN_EINVAL);
  EXPECT_TEXT("every rank refused all_reduce #1: the group goes on");
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
}
TEST(refusal_after_recv_ended) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_after_recv_ended, NULL, 15.0, 40.0), 0);
}

/* Every rank issues an async all_reduce and at once refuses the next call
 * (as a REPL line would), 20 times on fresh sub-groups: a refusal with that
 * work still queued or running takes no number and stops the group, one
 * after it took the number after it; either way the ranks must agree: a
 * rank told "the group goes on" finds its next call working, one told it
 * stops finds it ESTATE, and the async work's sum is right wherever it
 * succeeded. */
static void refuse_beside_async(crun_pg_t *pg, void *arg) {
  (void)arg;
  int all[2] = {0, 1};
  for (int i = 0; i < 20; i++) {
    crun_pg_t *g = NULL;
    EXPECT_OK(crun_pg_new_group(pg, all, 2, 0, &g));
    if (!g) return;
    float a = 1.0f, f = 2.0f;
    crun_work_t *w = NULL;
    EXPECT_OK(crun_pg_all_reduce(g, &a, 1, CRUN_FLOAT32, CRUN_OP_SUM, NULL, &w));
    EXPECT_STATUS(crun_pg_all_reduce(g, &f, 1, CRUN_FLOAT32, CRUN_OP_BXOR, NULL, NULL), CRUN_EINVAL);
    int goes_on = strstr(crun_last_error(), "goes on") != NULL;
    if (crun_work_wait(w, 10.0) == 0) EXPECT(a == 2.0f);
    crun_work_release(w);
    int rc = crun_pg_barrier(g, NULL, NULL);
    EXPECT(goes_on ? rc == 0 : rc < 0);
    crun_pg_destroy(g);
  }
}
TEST(refusal_beside_async_work) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_beside_async, NULL, 15.0, 120.0), 0);
}

/* Rank 1 refuses call #1 after rank 0's agreement on it gave up (group
 * timeout 1 s: a 1 s bound) and stopped the group: rank 1 finds rank 0's
 * refusal of #1 on the board but must not say the group goes on, since rank
 * 0 said it stops: the decision is written once and both read it. */
static void refuse_after_agreement_gave_up(crun_pg_t *pg, void *arg) {
  (void)arg;
  if (crun_pg_rank(pg) == 1) usleep(1700 * 1000);
  refuse_bxor_timed(pg, "beside a late peer");
  EXPECT(crun_pg_barrier(pg, NULL, NULL) < 0);
}
TEST(refusal_decided_once) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, refuse_after_agreement_gave_up, NULL, 1.0, 40.0), 0);
}

/* all_to_all counts whose sum or byte size does not fit in a size_t: an
 * EINVAL naming the call, the rank and the count, before anything is sent
 * (the refusal tells the peers why), instead of wrapped sizes reaching the
 * in-place copy (a2a_unalias) or the engines. Case 0: every rank's input
 * counts add up past SIZE_MAX (in place, uint8: two blocks of 2^63, each of
 * which could end inside the address space); case 1: every rank's output
 * block for its peer is over SIZE_MAX bytes (float32); case 2: rank 1 alone
 * gives case 0's counts, rank 0 a valid call, which fails naming rank 1. */
static void a2a_overflow_case(crun_pg_t *pg, int mode) {
  int r = crun_pg_rank(pg), p = 1 - r;
  uint8_t buf[16] = {0};
  size_t in[2], out[2];
  void *outs[2] = {buf, buf + 8};
  const void *ins[2] = {buf, buf + 8};
  in[r] = out[r] = 2;
  in[p] = out[p] = 2;
  crun_dtype_t dt = CRUN_UINT8;
  if (mode == 0 || (mode == 2 && r == 1)) in[r] = out[r] = in[p] = SIZE_MAX / 2 + 1; /* 2^63 each: the sum wraps to 0 */
  if (mode == 1) out[p] = SIZE_MAX / 4 + 1, dt = CRUN_FLOAT32;
  int rc = crun_pg_all_to_all(pg, outs, out, ins, in, dt, NULL, NULL);
  EXPECT_STATUS(rc, CRUN_EINVAL);
  if (mode == 2 && r == 0) {
    EXPECT_TEXT("rank 1 refused its part of all_to_all");
    EXPECT_TEXT("the input counts add up to more than");
    return;
  }
  char want[128];
  snprintf(want, sizeof want, "all_to_all on rank %d: ", r);
  EXPECT_TEXT(want);
  if (mode == 1) snprintf(want, sizeof want, "the output block for rank %d (4611686018427387904 elements of 4 bytes)", p);
  else snprintf(want, sizeof want, "the input counts add up to more than %zu bytes at the one for rank 1", SIZE_MAX);
  EXPECT_TEXT(want);
  if (mode != 2) EXPECT_TEXT(": the group goes on)");
}

static void a2a_overflow(crun_pg_t *pg, void *arg) {
  (void)arg;
  a2a_overflow_case(pg, 0);
  a2a_overflow_case(pg, 1);
  uint8_t x[2] = {1, 2}, y[2] = {0};
  size_t one[2] = {1, 1};
  void *outs[2] = {y, y + 1};
  const void *ins[2] = {x, x + 1};
  EXPECT_OK(crun_pg_all_to_all(pg, outs, one, ins, one, CRUN_UINT8, NULL, NULL)); /* the group went on */
  EXPECT(y[0] == 1 + crun_pg_rank(pg) && y[1] == 1 + crun_pg_rank(pg));
  a2a_overflow_case(pg, 2);
}

TEST(all_to_all_count_overflow) { EXPECT_EQ_INT(pg_spawn_ex(2, a2a_overflow, NULL, 10.0, 40.0), 0); }
TEST(tcp_all_to_all_count_overflow) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, a2a_overflow, NULL, 10.0, 40.0), 0);
}

#define CRUN_TESTS(X) X(async_ordering) X(async_blocking_race) X(two_threads_one_group) X(tcp_two_threads_one_group) \
  X(stats_large_after_small) X(sub_groups) X(send_recv_matching) X(work_wait_timeout) \
  X(argument_errors) X(mismatch_reported_everywhere) X(timeout_names_ranks) X(peer_killed_mid_all_reduce) \
  X(tcp_mismatch) X(tcp_timeout) X(tcp_peer_killed) X(tcp_abort_seen_while_waiting_on_another_peer) X(wait_zero_ends_by_the_deadline) \
  X(wait_zero_ends_by_the_deadline_shm) X(timeouts_clamped) \
  X(refusal_on_broken_group) X(refusal_beside_unnumbered_refusal) \
  X(refusal_after_peer_closed) X(refusal_after_peer_killed) X(refusal_after_peer_killed_shm) X(refusal_after_peer_failed) \
  X(refusal_while_peer_in_recv) X(refusal_while_peer_waits_irecv) X(refusal_after_recv_ended) X(refusal_decided_once) \
  X(refusal_beside_async_work) X(all_to_all_count_overflow) X(tcp_all_to_all_count_overflow)
CRUN_TEST_MAIN()
