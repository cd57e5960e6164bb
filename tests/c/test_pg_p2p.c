/* test_pg_p2p.c — point-to-point progress on forked ranks: ring exchanges
 * where every rank posts its send (or its receive) before the matching call
 * (isend+recv and irecv+send, 8 B to 4 MiB, 2-4 ranks, with and without the
 * shared-memory engine), many messages in flight to one peer arriving in
 * order per tag, and p2p interleaved with collectives; an async send whose
 * pump thread cannot start. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "test_pg_util.h"
#include "store/store_impl.h"

static const size_t sizes[] = {8, 512u << 10, 4u << 20};

/* Fills n bytes with a pattern of (rank, round). */
static void fill(uint8_t *b, size_t n, int r, int k) {
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(i * 7 + (size_t)r * 31 + (size_t)k * 13);
}

static int same(const uint8_t *b, size_t n, int r, int k) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != (uint8_t)(i * 7 + (size_t)r * 31 + (size_t)k * 13)) return 0;
  return 1;
}

/* Every rank: isend to the right then recv from the left (or irecv from the
 * left then send to the right), for every size. */
static void ring(crun_pg_t *pg, void *arg) {
  int recv_first = *(int *)arg;
  int r = crun_pg_rank(pg), p = crun_pg_size(pg), right = (r + 1) % p, left = (r + p - 1) % p;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t n = sizes[s];
    uint8_t *out = malloc(n), *in = malloc(n);
    EXPECT(out && in);
    fill(out, n, r, (int)s);
    memset(in, 0, n);
    crun_work_t *w = NULL;
    if (recv_first) {
      EXPECT_OK(crun_pg_recv(pg, in, n, CRUN_UINT8, left, NULL, NULL, &w));
      EXPECT_OK(crun_pg_send(pg, out, n, CRUN_UINT8, right, NULL, NULL));
    } else {
      EXPECT_OK(crun_pg_send(pg, out, n, CRUN_UINT8, right, NULL, &w));
      EXPECT_OK(crun_pg_recv(pg, in, n, CRUN_UINT8, left, NULL, NULL, NULL));
    }
    EXPECT_OK(crun_work_wait(w, 20));
    crun_work_release(w);
    EXPECT(same(in, n, left, (int)s));
    free(out);
    free(in);
  }
}

static void run_rings(const char *shm) {
  setenv("CRUN_SHM", shm, 1);
  for (int p = 2; p <= 4; p++)
    for (int order = 0; order < 2; order++) EXPECT_EQ_INT(pg_spawn_ex(p, ring, &order, 15.0, 60.0), 0);
}

TEST(ring_exchange) { run_rings("1"); }
TEST(ring_exchange_tcp) { run_rings("0"); }

/* Rank 0 posts K isends per tag to rank 1 (two tags interleaved, sizes
 * alternating small and large); rank 1 receives tag 2 first, then tag 1, and
 * every message must come in issue order within its tag. */
static void in_order(crun_pg_t *pg, void *arg) {
  (void)arg;
  enum { K = 12 };
  int r = crun_pg_rank(pg);
  if (r > 1) return;
  crun_work_t *w[2 * K];
  uint8_t *bufs[2 * K];
  for (int k = 0; k < 2 * K; k++) {
    size_t n = (k / 2) % 2 ? (256u << 10) : 16;
    crun_coll_opts_t o = {.tag = 1 + k % 2};
    bufs[k] = malloc(n);
    EXPECT(bufs[k] != NULL);
    if (r == 0) {
      fill(bufs[k], n, 0, k);
      EXPECT_OK(crun_pg_send(pg, bufs[k], n, CRUN_UINT8, 1, &o, &w[k]));
    }
  }
  if (r == 1) {
    for (int pass = 0; pass < 2; pass++)
      for (int k = pass ? 0 : 1; k < 2 * K; k += 2) {
        size_t n = (k / 2) % 2 ? (256u << 10) : 16;
        crun_coll_opts_t o = {.tag = 1 + k % 2};
        EXPECT_OK(crun_pg_recv(pg, bufs[k], n, CRUN_UINT8, 0, &o, NULL, &w[k]));
      }
  }
  for (int k = 0; k < 2 * K; k++) {
    EXPECT_OK(crun_work_wait(w[k], 20));
    crun_work_release(w[k]);
    if (r == 1) EXPECT(same(bufs[k], (k / 2) % 2 ? (256u << 10) : 16, 0, k));
    free(bufs[k]);
  }
}

TEST(many_in_flight_in_order) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, in_order, NULL, 15.0, 60.0), 0);
  setenv("CRUN_SHM", "1", 1);
  EXPECT_EQ_INT(pg_spawn_ex(3, in_order, NULL, 15.0, 60.0), 0);
}

/* A pending isend of 1 MiB, then an all_reduce, an uneven all_to_all, then
 * the receive: collectives keep their order and results while the send is
 * in flight. */
static void mixed(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), p = crun_pg_size(pg), right = (r + 1) % p, left = (r + p - 1) % p;
  size_t n = 1u << 20;
  for (int round = 0; round < 4; round++) {
    uint8_t *out = malloc(n), *in = malloc(n);
    EXPECT(out && in);
    fill(out, n, r, round);
    crun_work_t *w;
    EXPECT_OK(crun_pg_send(pg, out, n, CRUN_UINT8, right, NULL, &w));
    int64_t v = r + round;
    EXPECT_OK(crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL));
    EXPECT_EQ_INT(v, p * (p - 1) / 2 + p * round);
    /* all_to_all where rank r sends j+1+r elements to rank j */
    float *ins[8], *outs[8];
    size_t ic[8], oc[8];
    for (int j = 0; j < p; j++) {
      ic[j] = (size_t)(j + 1 + r) * 1000;
      oc[j] = (size_t)(r + 1 + j) * 1000;
      ins[j] = malloc(ic[j] * sizeof(float));
      outs[j] = malloc(oc[j] * sizeof(float));
      for (size_t i = 0; i < ic[j]; i++) ins[j][i] = (float)(r * 100 + j);
    }
    EXPECT_OK(crun_pg_all_to_all(pg, (void **)outs, oc, (const void **)ins, ic, CRUN_FLOAT32, NULL, NULL));
    for (int j = 0; j < p; j++) {
      EXPECT(outs[j][0] == (float)(j * 100 + r) && outs[j][oc[j] - 1] == (float)(j * 100 + r));
      free(ins[j]);
      free(outs[j]);
    }
    EXPECT_OK(crun_pg_recv(pg, in, n, CRUN_UINT8, left, NULL, NULL, NULL));
    EXPECT_OK(crun_work_wait(w, 20));
    crun_work_release(w);
    EXPECT(same(in, n, left, round));
    free(out);
    free(in);
  }
}

TEST(p2p_between_collectives) {
  for (int shm = 0; shm < 2; shm++) {
    setenv("CRUN_SHM", shm ? "1" : "0", 1);
    for (int p = 2; p <= 4; p++) EXPECT_EQ_INT(pg_spawn_ex(p, mixed, NULL, 15.0, 60.0), 0);
  }
}

/* Rank 0's isend of 32 MiB to rank 1 is still pending when rank 0 enters a
 * barrier, which rank 1 enters only after its recv: the send must progress
 * while rank 0 waits in the collective (also when the shm engine runs it). */
static void across(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  size_t n = 32u << 20;
  uint8_t *b = malloc(n);
  EXPECT(b != NULL);
  for (int round = 0; round < 3; round++) {
    crun_work_t *w = NULL;
    if (r == 0) {
      fill(b, n, 0, round);
      EXPECT_OK(crun_pg_send(pg, b, n, CRUN_UINT8, 1, NULL, &w));
    } else if (r == 1) {
      memset(b, 0, n);
      EXPECT_OK(crun_pg_recv(pg, b, n, CRUN_UINT8, 0, NULL, NULL, NULL));
      EXPECT(same(b, n, 0, round));
    }
    EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
    if (w) {
      EXPECT_OK(crun_work_wait(w, 20));
      crun_work_release(w);
    }
  }
  free(b);
}

TEST(send_pending_across_collective) {
  for (int shm = 0; shm < 2; shm++) {
    setenv("CRUN_SHM", shm ? "1" : "0", 1);
    EXPECT_EQ_INT(pg_spawn_ex(2, across, NULL, 10.0, 30.0), 0);
    EXPECT_EQ_INT(pg_spawn_ex(3, across, NULL, 10.0, 30.0), 0);
  }
}

/* Rank 0 posts two any-source irecvs of 2 MiB while ranks 1 and 2 both send
 * one (frames of both are read at the same time, one into the stash), then
 * everyone runs all_reduces that read from those same sockets. */
static void any_source(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), p = crun_pg_size(pg);
  size_t n = 2u << 20;
  for (int round = 0; round < 4; round++) {
    if (r == 0) {
      uint8_t *b[2] = {malloc(n), malloc(n)};
      crun_work_t *w[2];
      for (int i = 0; i < 2; i++) EXPECT_OK(crun_pg_recv(pg, b[i], n, CRUN_UINT8, CRUN_ANY_SOURCE, NULL, NULL, &w[i]));
      int seen = 0;
      for (int i = 0; i < 2; i++) {
        EXPECT_OK(crun_work_wait(w[i], 20));
        int src = crun_work_source(w[i]);
        EXPECT(src == 1 || src == 2);
        seen |= 1 << src;
        EXPECT(same(b[i], n, src, round));
        crun_work_release(w[i]);
        free(b[i]);
      }
      EXPECT_EQ_INT(seen, 6);
    } else if (r <= 2) {
      uint8_t *b = malloc(n);
      fill(b, n, r, round);
      EXPECT_OK(crun_pg_send(pg, b, n, CRUN_UINT8, 0, NULL, NULL));
      free(b);
    }
    for (int k = 0; k < 3; k++) {
      int64_t v = r + k;
      EXPECT_OK(crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL));
      EXPECT_EQ_INT(v, p * (p - 1) / 2 + p * k);
    }
  }
}

TEST(any_source_then_collectives) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(3, any_source, NULL, 15.0, 60.0), 0);
  EXPECT_EQ_INT(pg_spawn_ex(4, any_source, NULL, 15.0, 60.0), 0);
}

/* The sanitizers define pthread_create themselves: no interposing there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NO_INTERPOSE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define NO_INTERPOSE 1
#endif
#endif

#ifndef NO_INTERPOSE
/* While set, no thread of this process starts: the runtime, linked into this
 * test, calls this pthread_create, which then fails with EAGAIN. */
static volatile int no_threads;

int pthread_create(pthread_t *th, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
  int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  if (no_threads) return EAGAIN;
  *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
  return real ? real(th, a, fn, arg) : ENOSYS;
}

/* Rank 0's async send of 64 MiB (more than the sockets take) finds that the
 * TCP transport's pump thread cannot start: it fails at once with ESYS
 * naming that, instead of staying pending with nothing to progress or expire
 * it (its wait, and the Lua Work's __gc, would then never end); rank 1,
 * waiting in a recv from rank 0, fails with that reason too. */
static void no_pump(crun_pg_t *pg, void *arg) {
  (void)arg;
  crun_work_t *w;
  EXPECT_OK(crun_pg_barrier(pg, NULL, &w)); /* starts the group's own threads */
  EXPECT_OK(crun_work_wait(w, 10));
  crun_work_release(w);
  if (crun_pg_rank(pg) != 0) {
    uint8_t x;
    crun_coll_opts_t o9 = {.tag = 9, .timeout = 10.0};
    EXPECT_STATUS(crun_pg_recv(pg, &x, 1, CRUN_UINT8, 0, &o9, NULL, NULL), CRUN_ESYS);
    EXPECT_TEXT("cannot start the thread that progresses");
    return;
  }
  size_t n = 64u << 20;
  uint8_t *b = calloc(n, 1);
  EXPECT(b != NULL);
  crun_coll_opts_t o = {.tag = 3, .timeout = 1.0};
  no_threads = 1;
  EXPECT_OK(crun_pg_send(pg, b, n, CRUN_UINT8, 1, &o, &w));
  EXPECT_STATUS(crun_work_wait(w, 5), CRUN_ESYS);
  no_threads = 0;
  EXPECT_TEXT("send to rank 1 (tag 3) on rank 0: cannot start the thread that progresses");
  crun_work_release(w);
  free(b);
}

TEST(send_without_pump_thread) {
  setenv("CRUN_SHM", "0", 1);
  EXPECT_EQ_INT(pg_spawn_ex(2, no_pump, NULL, 15.0, 60.0), 0);
}
#else
TEST(send_without_pump_thread) {} /* a sanitizer build: pthread_create is its own */
#endif

/* Rank 0's async send of 64 MiB to rank 1 is left half written, then rank 0
 * fails its group (a recv from rank 1 times out). Its abort frame cannot
 * follow the half-sent frame, yet rank 1 must learn promptly that rank 0
 * failed and why: mode 0: rank 1 waits in a recv from rank 0 with another
 * tag (10 s) and, with a 1 MiB CRUN_TCP_UNEXPECTED_MAX, its reader holds
 * that frame (it waited out its deadline); mode 1: rank 1 enters an
 * all_reduce over TCP after rank 0 failed (it learnt only that the
 * connection closed). Rank 0 keeps the group until rank 1 says, through a
 * flag file, that its call returned. */
typedef struct { int mode; char flag[PATH_MAX]; } half_t;

static void abort_half_sent(crun_pg_t *pg, void *arg) {
  half_t *a = arg;
  crun_work_t *w;
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  if (crun_pg_rank(pg) == 1) {
    uint8_t x[64] = {0};
    crun_coll_opts_t o7 = {.tag = 7, .timeout = 10.0};
    double t0 = crun_clock();
    if (a->mode == 1) usleep(1500 * 1000);
    int rc = a->mode == 0 ? crun_pg_recv(pg, x, 1, CRUN_UINT8, 0, &o7, NULL, NULL)
                          : crun_pg_all_reduce(pg, x, 64, CRUN_UINT8, CRUN_OP_SUM, &o7, NULL);
    EXPECT_STATUS(rc, CRUN_ETIMEDOUT);
    EXPECT(crun_clock() - t0 < 5.0);
    EXPECT_TEXT("recv from rank 1 (tag 5) on rank 0: no data from rank 1");
    EXPECT_TEXT("reported by rank 0");
    FILE *f = fopen(a->flag, "w");
    EXPECT(f != NULL);
    fclose(f);
    return;
  }
  size_t n = 64u << 20;
  uint8_t *b = calloc(n, 1), x;
  EXPECT(b != NULL);
  crun_coll_opts_t o3 = {.tag = 3, .timeout = 10.0}, o5 = {.tag = 5, .timeout = 0.5};
  EXPECT_OK(crun_pg_send(pg, b, n, CRUN_UINT8, 1, &o3, &w));
  EXPECT_STATUS(crun_pg_recv(pg, &x, 1, CRUN_UINT8, 1, &o5, NULL, NULL), CRUN_ETIMEDOUT);
  EXPECT(crun_work_wait(w, 15) < 0);
  crun_work_release(w);
  free(b);
  double end = crun_clock() + 15;
  while (access(a->flag, F_OK) != 0 && crun_clock() < end) usleep(10000);
}

TEST(abort_reaches_peer_behind_half_sent_frame) {
  setenv("CRUN_SHM", "0", 1);
  for (int mode = 0; mode < 2; mode++) {
    half_t a = {.mode = mode};
    crun_test_tmp_path(a.flag, sizeof a.flag, "crun_pgtest_flag_%d", (int)getpid());
    unlink(a.flag);
    if (mode == 0) setenv("CRUN_TCP_UNEXPECTED_MAX", "1048576", 1);
    EXPECT_EQ_INT(pg_spawn_ex(2, abort_half_sent, &a, 20.0, 40.0), 0);
    unsetenv("CRUN_TCP_UNEXPECTED_MAX");
    unlink(a.flag);
  }
}

/* A store that takes 1.5 s to write an abort reason ("abort/<rank>" on the
 * group's board) and passes everything else to the file store it wraps. */
typedef struct { struct crun_store base; crun_store_t *in; } slow_t;
#define IN(s) (((slow_t *)(void *)(s))->in)
#define FWD(slot, ...) (IN(s)->ops->slot ? IN(s)->ops->slot(IN(s), __VA_ARGS__) : CRUN_ENOTSUP)
static int slow_set(crun_store_t *s, const char *k, const void *v, size_t n) {
  if (strstr(k, "abort/")) usleep(1500 * 1000);
  return FWD(set, k, v, n);
}
static int slow_get(crun_store_t *s, const char *k, double d, crun_buf_t *o) { return FWD(get, k, d, o); }
static int slow_add(crun_store_t *s, const char *k, int64_t d, int64_t *o) { return FWD(add, k, d, o); }
static int slow_cas(crun_store_t *s, const char *k, const void *e, size_t el, const void *v, size_t vl, crun_buf_t *o) {
  return FWD(compare_set, k, e, el, v, vl, o);
}
static int slow_wait(crun_store_t *s, const char *const *k, size_t n, double d) { return FWD(wait, k, n, d); }
static int slow_check(crun_store_t *s, const char *const *k, size_t n, int *all) { return FWD(check, k, n, all); }
static int slow_del(crun_store_t *s, const char *k, int *e) { return FWD(delete_key, k, e); }
static int slow_num(crun_store_t *s, int64_t *o) { return FWD(num_keys, o); }
static int slow_mget(crun_store_t *s, const char *const *k, size_t n, double d, crun_buf_t *o) {
  return FWD(multi_get, k, n, d, o);
}
static int slow_mset(crun_store_t *s, const char *const *k, size_t n, const void *const *v, const size_t *l) {
  return FWD(multi_set, k, n, v, l);
}
static void slow_destroy(crun_store_t *s) {
  crun_store_release(IN(s));
  free(s);
}
static const crun__store_ops_t slow_ops = {.kind = "slow", .set = slow_set, .get = slow_get, .add = slow_add,
                                           .compare_set = slow_cas, .wait = slow_wait, .check = slow_check,
                                           .delete_key = slow_del, .num_keys = slow_num, .multi_get = slow_mget,
                                           .multi_set = slow_mset, .destroy = slow_destroy};

/* Rank 0's pending isend (half sent, as in abort_half_sent mode 0) and the
 * time its wait, on another thread, returned. */
typedef struct { crun_work_t *w; double t_done; } waiter_t;

static void *wait_send(void *arg) {
  waiter_t *a = arg;
  EXPECT(crun_work_wait(a->w, 15) < 0);
  a->t_done = crun_clock();
  return NULL;
}

/* Rank 0 fails the group with a frame to rank 1 half sent, so its reason
 * goes on the board, which takes 1.5 s here: its pending isend fails at
 * once all the same (it waited for the board write, which held the
 * transport's lock), and rank 1 still reads the reason from the board. */
static void slow_board(crun_pg_t *pg, void *arg) {
  half_t *a = arg;
  if (crun_pg_rank(pg) == 1) {
    abort_half_sent(pg, arg); /* its rank 1: a recv the held frame keeps waiting, then the reason */
    return;
  }
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  size_t n = 64u << 20;
  uint8_t *b = calloc(n, 1), x;
  EXPECT(b != NULL);
  crun_coll_opts_t o3 = {.tag = 3, .timeout = 10.0}, o5 = {.tag = 5, .timeout = 0.5};
  waiter_t wt = {0};
  EXPECT_OK(crun_pg_send(pg, b, n, CRUN_UINT8, 1, &o3, &wt.w));
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, wait_send, &wt) == 0);
  double t0 = crun_clock();
  EXPECT_STATUS(crun_pg_recv(pg, &x, 1, CRUN_UINT8, 1, &o5, NULL, NULL), CRUN_ETIMEDOUT);
  pthread_join(th, NULL);
  EXPECT(wt.t_done - t0 < 1.3); /* the recv's deadline (0.5 s), not behind the board write (1.5 s more) */
  crun_work_release(wt.w);
  free(b);
  double end = crun_clock() + 15;
  while (access(a->flag, F_OK) != 0 && crun_clock() < end) usleep(10000);
}

TEST(abort_reason_left_on_a_slow_board_outside_the_lock) {
  setenv("CRUN_SHM", "0", 1);
  setenv("CRUN_TCP_UNEXPECTED_MAX", "1048576", 1);
  half_t a = {.mode = 0};
  crun_test_tmp_path(a.flag, sizeof a.flag, "crun_pgtest_flag_%d", (int)getpid());
  unlink(a.flag);
  char path[PATH_MAX];
  crun_test_tmp_path(path, sizeof path, "crun_pgtest_slow_%d", (int)getpid());
  unlink(path);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    if ((pids[r] = fork()) != 0) continue;
    slow_t *s = calloc(1, sizeof *s);
    EXPECT(s != NULL);
    EXPECT_OK(crun_store_file_new(path, &s->in));
    crun__store_init(&s->base, &slow_ops);
    crun_pg_opts_t o = {.store = &s->base, .rank = r, .world_size = 2, .timeout = 20.0, .name = "t"};
    crun_pg_t *pg = NULL;
    EXPECT_OK(crun_pg_new(&o, &pg));
    slow_board(pg, &a);
    crun_pg_release(pg);
    crun_store_release(&s->base);
    _exit(0);
  }
  EXPECT_EQ_INT(pg_reap(2, pids, 40.0), 0);
  unsetenv("CRUN_TCP_UNEXPECTED_MAX");
  unlink(a.flag);
  unlink(path);
}

#define CRUN_TESTS(X) X(ring_exchange) X(ring_exchange_tcp) X(many_in_flight_in_order) X(p2p_between_collectives) \
  X(send_pending_across_collective) X(any_source_then_collectives) X(send_without_pump_thread) \
  X(abort_reaches_peer_behind_half_sent_frame) X(abort_reason_left_on_a_slow_board_outside_the_lock)
CRUN_TEST_MAIN()
