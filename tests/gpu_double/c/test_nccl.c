/* test_nccl.c — the nccl backend's host-side logic, run through the NCCL and
 * CUDA runtime test doubles (tests/gpu_double): the collectives matrix
 * (every op x dtype x world size 1..4 x counts 0, 1, 7, 4099), rooted
 * collectives from every root, gather/scatter/all_to_all/send/recv through
 * grouped ncclSend/ncclRecv, premul_sum, sub-groups by ncclCommSplit,
 * backend "auto" serving both kinds of buffer, device work handles, and the
 * error cases: wrong device (EINVAL both ways), bitwise and int16 (ENOTSUP
 * naming op and dtype), a mismatch (EMISMATCH), a rank that never calls
 * (ETIMEDOUT naming it, from the signature check and, with the check off,
 * from the watchdog), an asynchronous NCCL error (EIO), ESTATE after an
 * abort, and an abort from another thread racing the collectives (the
 * communicator is never passed to NCCL after ncclCommAbort freed it), and
 * the operations' pool (an end event serves a new operation only once no
 * handle holds the one it ended).
 * Expected values are computed here from the inputs' formula. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../double_counts.h"         /* what a call asked of the CUDA double */
#include "backend/nccl/nccl_int.h" /* the operations' pool */
#include "harness.h"
#include "pg/pg_internal.h" /* crun__pg_fail: the abort another thread makes */
#include "test_pg_util.h"

typedef void (*rank_fn)(crun_pg_t *pg, void *arg);

/* Forks n ranks joined in a group with `backend`; returns the number that failed. */
static int spawn(int n, const char *backend, rank_fn fn, void *arg, double timeout) {
  char path[PATH_MAX];
  crun_test_tmp_path(path, sizeof path, "crun_nccltest_%d_%ld", (int)getpid(), (long)time(NULL));
  unlink(path);
  pid_t pids[8];
  if (n < 1 || n > (int)(sizeof pids / sizeof pids[0])) {
    fprintf(stderr, "spawn: world size %d outside 1..%d\n", n, (int)(sizeof pids / sizeof pids[0]));
    return n < 1 ? 1 : n;
  }
  for (int r = 0; r < n; r++) {
    if ((pids[r] = fork()) == 0) {
      char rs[16];
      snprintf(rs, sizeof rs, "%d", r);
      setenv("RANK", rs, 1);
      crun_store_t *s = NULL;
      EXPECT_OK(crun_store_file_new(path, &s));
      crun_pg_opts_t o = {.store = s, .rank = r, .world_size = n, .timeout = timeout, .backend = backend, .name = "t"};
      crun_pg_t *pg = NULL;
      EXPECT_OK(crun_pg_new(&o, &pg));
      fn(pg, arg);
      crun_pg_release(pg);
      crun_store_release(s);
      exit(0); /* not _exit: coverage builds flush their counters at exit */
    }
  }
  int failed = pg_reap(n, pids, 120);
  unlink(path);
  return failed;
}

static const crun_coll_opts_t DEV = {.cuda = 1};

/* Input element i of rank r: signed, non-periodic in i, small enough that a
 * product over 4 ranks fits int8 and every value is exact in bfloat16. */
static int64_t in_val(crun_dtype_t dt, int r, size_t i) {
  int64_t v = (int64_t)((i * 7 + (size_t)r * 13 + i / 5) % 5) - 2;
  if (dt == CRUN_UINT8) v += 2;
  if (dt == CRUN_BOOL) v = v > 0;
  return v;
}

static double expect_val(crun_dtype_t dt, crun_reduce_op_t op, int n, size_t i) {
  double acc = (double)in_val(dt, 0, i);
  for (int r = 1; r < n; r++) {
    double x = (double)in_val(dt, r, i);
    switch (op) {
    case CRUN_OP_SUM: case CRUN_OP_AVG: acc += x; break;
    case CRUN_OP_PRODUCT: acc *= x; break;
    case CRUN_OP_MIN: acc = x < acc ? x : acc; break;
    case CRUN_OP_MAX: acc = x > acc ? x : acc; break;
    default: break;
    }
  }
  if (dt == CRUN_BOOL && op == CRUN_OP_SUM) acc = acc != 0;
  if (op == CRUN_OP_AVG) acc = crun_dtype_is_integer(dt) ? trunc(acc / n) : acc / n;
  return acc;
}

static void fill(crun_dtype_t dt, void *buf, int r, size_t n) {
  for (size_t i = 0; i < n; i++) crun_elem_set_int64(dt, buf, (int64_t)i, in_val(dt, r, i));
}

static const size_t counts[] = {0, 1, 7, 4099};
static const crun_reduce_op_t ops[] = {CRUN_OP_SUM, CRUN_OP_PRODUCT, CRUN_OP_MIN, CRUN_OP_MAX, CRUN_OP_AVG};

static void check_buf(crun_dtype_t dt, const void *buf, size_t n, double (*want)(crun_dtype_t, size_t, void *),
                      void *ctx, const char *what) {
  /* the host reads what the device wrote: wait for the current stream, as
   * t:cpu() would (a blocking collective only makes that stream wait) */
  int dev = 0;
  EXPECT_OK(crun_cuda_current_device(&dev));
  EXPECT_OK(crun_cuda_synchronize(dev));
  for (size_t i = 0; i < n; i++) {
    double got = crun_elem_get_double(dt, buf, (int64_t)i), w = want(dt, i, ctx);
    double tol = dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16 ? 0.02 * fabs(w) + 0.01 : 1e-6 * fabs(w);
    if (fabs(got - w) > tol)
      crun_test_fail(__FILE__, __LINE__, "%s %s[%zu]: got %g, want %g", what, crun_dtype_name(dt), i, got, w);
  }
}

typedef struct { crun_reduce_op_t op; int n; } red_ctx;
static double want_red(crun_dtype_t dt, size_t i, void *c) {
  red_ctx *x = c;
  return expect_val(dt, x->op, x->n, i);
}

/* all_reduce, reduce and reduce_scatter over every dtype x op x count. */
static void matrix(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), n = crun_pg_size(pg);
  char *buf = malloc(4099 * 8 * 4), **ins = malloc(sizeof(char *) * 4);
  for (int d = 0; d < CRUN_DTYPE_COUNT; d++)
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      crun_dtype_t dt = (crun_dtype_t)d;
      crun_reduce_op_t op = ops[o];
      if (crun_reduce_op_check(dt, op) < 0) continue;
      red_ctx ctx = {op, n};
      char what[64];
      for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t c = counts[k];
        fill(dt, buf, r, c);
        int rc = crun_pg_all_reduce(pg, buf, c, dt, op, &DEV, NULL);
        if (dt == CRUN_INT16) { /* NCCL has no int16 */
          EXPECT_EQ_INT(rc, CRUN_ENOTSUP);
          EXPECT_TEXT("int16");
          EXPECT_TEXT(crun_reduce_op_name(op));
          continue;
        }
        EXPECT_OK(rc);
        snprintf(what, sizeof what, "all_reduce %s n=%d c=%zu", crun_reduce_op_name(op), n, c);
        check_buf(dt, buf, c, want_red, &ctx, what);
        for (int root = 0; root < n; root++) {
          fill(dt, buf, r, c);
          EXPECT_OK(crun_pg_reduce(pg, buf, c, dt, op, root, &DEV, NULL));
          snprintf(what, sizeof what, "reduce %s root %d n=%d c=%zu", crun_reduce_op_name(op), root, n, c);
          if (r == root) check_buf(dt, buf, c, want_red, &ctx, what);
        }
        /* reduce_scatter: block j of rank r's input is fill(r) shifted by j */
        char *out = buf + 4099 * 8 * 3;
        for (int j = 0; j < n; j++) {
          ins[j] = buf + (size_t)j * c * crun_dtype_size(dt);
          fill(dt, ins[j], (r + j) % 5 == 0 ? r : r, c);
        }
        EXPECT_OK(crun_pg_reduce_scatter(pg, out, (const void *const *)ins, c, dt, op, &DEV, NULL));
        snprintf(what, sizeof what, "reduce_scatter %s n=%d c=%zu", crun_reduce_op_name(op), n, c);
        check_buf(dt, out, c, want_red, &ctx, what);
      }
    }
  free(buf);
  free(ins);
}

TEST(reductions_1_to_4_ranks) {
  for (int n = 1; n <= 4; n++) EXPECT_EQ_INT(spawn(n, "nccl", matrix, NULL, 30), 0);
}

typedef struct { int src; } mv_ctx;
static double want_from(crun_dtype_t dt, size_t i, void *c) { return (double)in_val(dt, ((mv_ctx *)c)->src, i); }

/* broadcast, all_gather, gather, scatter, all_to_all, send/recv, barrier on
 * every dtype (int16 and bool move as bytes). */
static void movement(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), n = crun_pg_size(pg);
  size_t cap = 4099 * 8;
  char *a = malloc(cap), *blk = malloc(cap * 4);
  void *outs[4];
  const void *ins[4];
  for (int d = 0; d < CRUN_DTYPE_COUNT; d++)
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
      crun_dtype_t dt = (crun_dtype_t)d;
      size_t c = counts[k], es = crun_dtype_size(dt);
      char what[64];
      for (int root = 0; root < n; root++) {
        mv_ctx m = {root};
        fill(dt, a, r, c);
        EXPECT_OK(crun_pg_broadcast(pg, a, c, dt, root, &DEV, NULL));
        snprintf(what, sizeof what, "broadcast root %d n=%d", root, n);
        check_buf(dt, a, c, want_from, &m, what);
        /* gather: blocks in reverse order in memory (not one flat run) */
        for (int j = 0; j < n; j++) outs[j] = blk + (size_t)(n - 1 - j) * c * es;
        memset(blk, 0x5a, cap * 4);
        fill(dt, a, r, c);
        EXPECT_OK(crun_pg_gather(pg, a, outs, c, dt, root, &DEV, NULL));
        for (int j = 0; r == root && j < n; j++) {
          mv_ctx mj = {j};
          snprintf(what, sizeof what, "gather root %d block %d", root, j);
          check_buf(dt, outs[j], c, want_from, &mj, what);
        }
        /* scatter: block j is fill(j) */
        for (int j = 0; j < n; j++) fill(dt, blk + (size_t)j * c * es, j, c), ins[j] = blk + (size_t)j * c * es;
        memset(a, 0x5a, cap);
        EXPECT_OK(crun_pg_scatter(pg, a, ins, c, dt, root, &DEV, NULL));
        mv_ctx me = {r};
        snprintf(what, sizeof what, "scatter root %d", root);
        check_buf(dt, a, c, want_from, &me, what);
      }
      /* all_gather into separate (reversed) and into flat outputs */
      for (int flat = 0; flat < 2; flat++) {
        for (int j = 0; j < n; j++) outs[j] = blk + (size_t)(flat ? j : n - 1 - j) * c * es;
        fill(dt, a, r, c);
        EXPECT_OK(crun_pg_all_gather(pg, outs, a, c, dt, &DEV, NULL));
        for (int j = 0; j < n; j++) {
          mv_ctx mj = {j};
          snprintf(what, sizeof what, "all_gather flat=%d block %d", flat, j);
          check_buf(dt, outs[j], c, want_from, &mj, what);
        }
      }
      /* all_to_all with uneven counts: rank r sends (r + 2 p) % 5 elements to p */
      size_t ic[4], oc[4], off = 0;
      for (int p = 0; p < n; p++) {
        ic[p] = (size_t)(r + 2 * p) % 5 * (c ? 1 : 0);
        oc[p] = (size_t)(p + 2 * r) % 5 * (c ? 1 : 0);
        ins[p] = blk + off;
        fill(dt, blk + off, r * 10 + p, ic[p]);
        off += 8 * 8;
        outs[p] = a + (size_t)p * 8 * 8;
      }
      EXPECT_OK(crun_pg_all_to_all(pg, outs, oc, ins, ic, dt, &DEV, NULL));
      for (int p = 0; p < n; p++) {
        mv_ctx mp = {p * 10 + r};
        snprintf(what, sizeof what, "all_to_all from %d", p);
        check_buf(dt, outs[p], oc[p], want_from, &mp, what);
      }
      /* send/recv around the ring */
      if (n > 1) {
        fill(dt, a, r, c);
        crun_work_t *sw = NULL;
        EXPECT_OK(crun_pg_send(pg, a, c, dt, (r + 1) % n, &DEV, &sw));
        int src = -1;
        EXPECT_OK(crun_pg_recv(pg, blk, c, dt, (r + n - 1) % n, &DEV, &src, NULL));
        EXPECT_EQ_INT(src, (r + n - 1) % n);
        EXPECT_OK(crun_work_wait(sw, 0));
        crun_work_release(sw);
        mv_ctx mp = {(r + n - 1) % n};
        check_buf(dt, blk, c, want_from, &mp, "recv");
      }
    }
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  free(a);
  free(blk);
}

TEST(data_movement_1_to_4_ranks) {
  for (int n = 1; n <= 4; n++) EXPECT_EQ_INT(spawn(n, "nccl", movement, NULL, 30), 0);
}

/* premul_sum, async work handles, sub-groups by split. */
static void extras(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), n = crun_pg_size(pg);
  float x[3] = {(float)r + 1, -2.0f * (float)r, 0.5f};
  crun_coll_opts_t o = {.cuda = 1, .premul_factor = 0.25};
  EXPECT_OK(crun_pg_all_reduce(pg, x, 3, CRUN_FLOAT32, CRUN_OP_PREMUL_SUM, &o, NULL));
  EXPECT(fabs(x[0] - 0.25 * (n * (n + 1) / 2)) < 1e-6 && fabs(x[1] + 0.5 * (n * (n - 1) / 2)) < 1e-6);
  EXPECT(fabs(x[2] - 0.125 * n) < 1e-6);
  float y[2] = {(float)r, 1};
  EXPECT_OK(crun_pg_reduce(pg, y, 2, CRUN_FLOAT32, CRUN_OP_PREMUL_SUM, 0, &o, NULL));
  if (r == 0) EXPECT(fabs(y[0] - 0.25 * (n * (n - 1) / 2)) < 1e-6);
  else EXPECT(y[0] == (float)r); /* a non-root's input stays as given */
  /* async work: wait (stream), synchronize (host), is_completed (event) */
  int64_t v[5] = {r, r, r, r, r};
  crun_work_t *w = NULL;
  EXPECT_OK(crun_pg_all_reduce(pg, v, 5, CRUN_INT64, CRUN_OP_MAX, &DEV, &w));
  EXPECT_OK(crun_work_wait(w, 10));
  EXPECT_OK(crun_work_synchronize(w, 10));
  EXPECT(crun_work_is_completed(w));
  crun_work_release(w);
  EXPECT_EQ_INT(v[4], n - 1);
  if (n < 4) return;
  int odd[] = {3, 1};
  crun_pg_t *g = NULL;
  EXPECT_OK(crun_pg_new_group(pg, odd, 2, 0, &g));
  EXPECT((g != NULL) == (r % 2 == 1));
  if (g) {
    EXPECT_EQ_INT(crun_pg_size(g), 2);
    int64_t s = r * 100 + 7;
    EXPECT_OK(crun_pg_all_reduce(g, &s, 1, CRUN_INT64, CRUN_OP_SUM, &DEV, NULL));
    EXPECT_EQ_INT(s, 100 + 7 + 300 + 7);
    int64_t b = r;
    EXPECT_OK(crun_pg_broadcast(g, &b, 1, CRUN_INT64, 1, &DEV, NULL));
    EXPECT_EQ_INT(b, 3);
    crun_pg_release(g);
  }
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
}

TEST(premul_async_and_subgroups) {
  EXPECT_EQ_INT(spawn(2, "nccl", extras, NULL, 30), 0);
  EXPECT_EQ_INT(spawn(4, "nccl", extras, NULL, 30), 0);
}

/* backend "auto" with a (double) GPU: one group, host and device buffers. */
static void auto_both(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float h = (float)r + 1, d = 10.0f * (float)r;
  EXPECT_OK(crun_pg_all_reduce(pg, &h, 1, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL));
  EXPECT_OK(crun_pg_all_reduce(pg, &d, 1, CRUN_FLOAT32, CRUN_OP_SUM, &DEV, NULL));
  EXPECT(h == 3.0f && d == 10.0f);
  EXPECT(!strcmp(crun_pg_backend(pg), "cpu"));
}

TEST(auto_serves_cpu_and_cuda) { EXPECT_EQ_INT(spawn(2, "auto", auto_both, NULL, 30), 0); }

static void wrong_device(crun_pg_t *pg, void *arg) {
  int nccl = arg != NULL, r = crun_pg_rank(pg);
  float x = 1;
  if (nccl) {
    EXPECT_STATUS(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL), CRUN_EINVAL);
    EXPECT_TEXT("a CPU tensor was given to a group with backend nccl");
    int32_t i = 3;
    EXPECT_STATUS(crun_pg_all_reduce(pg, &i, 1, CRUN_INT32, CRUN_OP_BXOR, &DEV, NULL), CRUN_ENOTSUP);
    EXPECT_TEXT("bxor on int32 is not supported by backend nccl");
    EXPECT_STATUS(crun_pg_all_reduce(pg, &i, 1, CRUN_INT32, CRUN_OP_BAND, &DEV, NULL), CRUN_ENOTSUP);
    EXPECT_TEXT("band on int32");
    if (r == 0) {
      EXPECT_STATUS(crun_pg_recv(pg, &x, 1, CRUN_FLOAT32, CRUN_ANY_SOURCE, &DEV, NULL, NULL), CRUN_ENOTSUP);
      EXPECT_TEXT("recv from any rank");
    }
  } else {
    EXPECT_STATUS(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, &DEV, NULL), CRUN_EINVAL);
    EXPECT_TEXT("a CUDA tensor was given to a group with backend cpu");
  }
}

TEST(wrong_device_and_unsupported_ops) {
  EXPECT_EQ_INT(spawn(2, "nccl", wrong_device, (void *)1, 30), 0);
  EXPECT_EQ_INT(spawn(2, "cpu", wrong_device, NULL, 30), 0);
}

/* A one-rank group answers without NCCL: an op it refuses must leave the
 * output as it was, as at n ranks (reduce_scatter copied the block first). */
static void one_rank_refused_op(crun_pg_t *pg, void *arg) {
  (void)arg;
  int32_t in = -5, out = 7;
  const void *ins[1] = {&in};
  EXPECT_STATUS(crun_pg_reduce_scatter(pg, &out, ins, 1, CRUN_INT32, CRUN_OP_BXOR, &DEV, NULL), CRUN_ENOTSUP);
  EXPECT_TEXT("bxor on int32");
  EXPECT_EQ_INT(out, 7);
  crun_coll_opts_t pm = DEV;
  pm.premul_factor = 0.5;
  EXPECT_STATUS(crun_pg_reduce_scatter(pg, &out, ins, 1, CRUN_INT32, CRUN_OP_PREMUL_SUM, &pm, NULL), CRUN_EINVAL);
  EXPECT_TEXT("premul_sum is only defined on floating dtypes");
  EXPECT_EQ_INT(out, 7);
}

TEST(one_rank_refused_op_leaves_the_output) { EXPECT_EQ_INT(spawn(1, "nccl", one_rank_refused_op, NULL, 30), 0); }

static void mismatch(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float x[4] = {0};
  EXPECT_STATUS(crun_pg_all_reduce(pg, x, r == 1 ? 3 : 4, CRUN_FLOAT32, CRUN_OP_SUM, &DEV, NULL), CRUN_EMISMATCH);
  EXPECT_TEXT(r == 1 ? "all_reduce #1 on rank 1 expected float32[3], rank 0 sent all_reduce #1 float32[4]"
                     : "expected float32[4], rank 1 sent all_reduce #1 float32[3]");
  EXPECT_STATUS(crun_pg_all_reduce(pg, x, 4, CRUN_FLOAT32, CRUN_OP_SUM, &DEV, NULL), CRUN_ESTATE);
  EXPECT_TEXT("unusable after an earlier failure");
}

TEST(mismatch_names_both_calls) { EXPECT_EQ_INT(spawn(3, "nccl", mismatch, NULL, 30), 0); }

/* Rank 2 never calls all_reduce #2 (it sleeps past the deadline). */
static void hang(crun_pg_t *pg, void *arg) {
  int check_off = arg != NULL, r = crun_pg_rank(pg);
  float x = 1;
  EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, &DEV, NULL));
  if (r == 2) {
    struct timespec ts = {3, 0};
    nanosleep(&ts, NULL);
    return;
  }
  crun_coll_opts_t o = {.cuda = 1, .timeout = 1.0};
  EXPECT_STATUS(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, &o, NULL), CRUN_ETIMEDOUT);
  EXPECT_TEXT(check_off ? "NCCL did not finish within 1.0 s, the watchdog aborted the communicator; no data from rank 2"
                        : "all_reduce #2 on rank");
  EXPECT_TEXT("no data from rank 2");
  EXPECT_TEXT("rank 2 is at all_reduce #1");
  EXPECT_STATUS(crun_pg_broadcast(pg, &x, 1, CRUN_FLOAT32, 0, &DEV, NULL), CRUN_ESTATE);
}

TEST(hang_signature_check_names_missing_rank) { EXPECT_EQ_INT(spawn(3, "nccl", hang, NULL, 30), 0); }

TEST(hang_watchdog_aborts_and_names_missing_rank) {
  setenv("CRUN_NCCL_CHECK", "0", 1);
  EXPECT_EQ_INT(spawn(3, "nccl", hang, (void *)1, 30), 0);
}

/* Rank 1's communicator reports an asynchronous error on its first operation. */
static void async_error(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg);
  float x = 1;
  crun_coll_opts_t o = {.cuda = 1, .timeout = 20.0};
  crun_work_t *w = NULL;
  EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, &o, &w));
  int rc = crun_work_synchronize(w, 0);
  crun_work_release(w);
  if (r == 1) {
    /* the double skipped the operation; the watchdog sees the async error
     * (before or after the end event was reached) */
    EXPECT(rc == CRUN_OK || rc == CRUN_EIO);
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    EXPECT_STATUS(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_SUM, &o, NULL), CRUN_ESTATE);
    EXPECT_TEXT("NCCL reported an asynchronous error: unhandled system error");
  } else {
    /* the peer's abort notice (its status and text) ends the wait long
     * before the 20 s deadline */
    EXPECT_EQ_INT(rc, CRUN_EIO);
    EXPECT_TEXT("a peer aborted the group: all_reduce #1 on rank 1: NCCL reported an asynchronous error");
    EXPECT_TEXT("[reported by rank 1]");
  }
}

TEST(async_error_aborts_every_rank) {
  setenv("CRUN_NCCL_DOUBLE_ASYNC_ERROR", "1", 1);
  EXPECT_EQ_INT(spawn(2, "nccl", async_error, NULL, 30), 0);
}

/* Breaks the group (and so aborts its communicator) after a random 0-50 ms,
 * as a failure seen by another thread does (break_group). */
static void *abort_soon(void *arg) {
  struct timespec ts = {0, (long)(rand() % 50000) * 1000};
  nanosleep(&ts, NULL);
  crun__pg_fail(arg, CRUN_EIO, "EIO: test: an abort racing the collectives");
  return NULL;
}

/* Collectives back to back while rank 0's other thread aborts the group
 * (rank 1 follows through the abort notice). Every NCCL call stalls 30 ms on
 * its way in (CRUN_NCCL_DOUBLE_ENTRY_DELAY_US: longer than break_group takes
 * to reach ncclCommAbort, flight recorder dump included), so the abort lands
 * between a thread's "aborted?" check and NCCL's first read of the
 * communicator: before the gate (issue 16) the call then came with a
 * communicator ncclCommAbort had freed, and the double aborted the rank.
 * Each call returns the right sum, or fails (EIO, ESTATE); once one failed,
 * the next is ESTATE. */
static void abort_race(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), n = crun_pg_size(pg), failed = 0;
  srand((unsigned)getpid());
  pthread_t t;
  if (r == 0) EXPECT(pthread_create(&t, NULL, abort_soon, pg) == 0);
  crun_coll_opts_t o = {.cuda = 1, .premul_factor = 0.25, .timeout = 20};
  double end = crun_clock() + 20;
  for (int i = 0; !failed && crun_clock() < end; i++) {
    float x[2] = {(float)r + 1, 1};
    int rc;
    switch (i % 3) {
    case 0:
      if ((rc = crun_pg_all_reduce(pg, x, 2, CRUN_FLOAT32, CRUN_OP_SUM, &o, NULL)) == 0)
        EXPECT(x[0] == (float)(n * (n + 1) / 2) && x[1] == (float)n);
      break;
    case 1: /* premul_sum: an op created and destroyed around the call */
      if ((rc = crun_pg_all_reduce(pg, x, 2, CRUN_FLOAT32, CRUN_OP_PREMUL_SUM, &o, NULL)) == 0)
        EXPECT(x[0] == 0.25f * (float)(n * (n + 1) / 2));
      break;
    default: /* grouped ncclSend/ncclRecv */
      if ((rc = crun_pg_scatter(pg, &x[1], r == 0 ? (const void *[]){&x[0], &x[0]} : NULL, 1, CRUN_FLOAT32, 0, &o, NULL)) == 0)
        EXPECT(x[1] == 1.0f);
      break;
    }
    if (rc < 0) {
      EXPECT(rc == CRUN_EIO || rc == CRUN_ESTATE);
      failed = 1;
    }
  }
  EXPECT(failed);
  float y = 1;
  EXPECT_STATUS(crun_pg_all_reduce(pg, &y, 1, CRUN_FLOAT32, CRUN_OP_SUM, &o, NULL), CRUN_ESTATE);
  if (r == 0) pthread_join(t, NULL);
}

TEST(abort_races_collectives) {
  setenv("CRUN_NCCL_CHECK", "0", 1);
  setenv("CRUN_NCCL_DOUBLE_ENTRY_DELAY_US", "30000", 1);
  for (int k = 0; k < 8; k++) EXPECT_EQ_INT(spawn(2, "nccl", abort_race, NULL, 30), 0);
  unsetenv("CRUN_NCCL_DOUBLE_ENTRY_DELAY_US");
  unsetenv("CRUN_NCCL_CHECK");
}

static void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The end event of w, a device work of the nccl backend. */
static cudaEvent_t end_of(crun_work_t *w) { return w->c.dev ? ((crun__nccl_op_t *)w->c.dev)->end : NULL; }

/* The end events come with the operations from the group's pool: an
 * operation whose handle is still held keeps its event after the watchdog
 * saw it end (a later operation gets another one: its handle may still make
 * a stream wait on it), a released one's event serves the next operation,
 * and the pool keeps at most CRUN__NCCL_SPARE. */
static void event_pool(crun_pg_t *pg, void *arg) {
  (void)arg;
  int r = crun_pg_rank(pg), n = crun_pg_size(pg);
  float x = (float)r;
  crun_work_t *a = NULL, *b = NULL, *c = NULL;
  EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_MAX, &DEV, &a));
  EXPECT_OK(crun_work_synchronize(a, 10));
  nap_ms(300); /* the watchdog saw it end and dropped its reference */
  EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_MAX, &DEV, &b));
  EXPECT_OK(crun_work_synchronize(b, 10));
  cudaEvent_t ea = end_of(a), eb = end_of(b);
  EXPECT(ea && eb && ea != eb);
  EXPECT_OK(crun_work_wait(a, 10)); /* the caller's stream waits on a's own event */
  crun_work_release(a);
  crun_work_release(b);
  nap_ms(300);
  EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_MAX, &DEV, &c));
  EXPECT_OK(crun_work_synchronize(c, 10));
  EXPECT(end_of(c) == ea || end_of(c) == eb);
  crun_work_release(c);
  for (int i = 0; i < 200; i++) EXPECT_OK(crun_pg_all_reduce(pg, &x, 1, CRUN_FLOAT32, CRUN_OP_MAX, &DEV, NULL));
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  nap_ms(300);
  crun__nccl_pool_t *pool = ((crun__nccl_t *)pg->be_state)->pool;
  pthread_mutex_lock(&pool->mu);
  EXPECT(pool->n > 0 && pool->n <= CRUN__NCCL_SPARE);
  pthread_mutex_unlock(&pool->mu);
  EXPECT(x == (float)(n - 1));
}

TEST(end_events_come_from_a_bounded_pool) { EXPECT_EQ_INT(spawn(2, "nccl", event_pool, NULL, 30), 0); }

/* One blocking call of every collective of the nccl backend on c floats
 * per block: all_gather and reduce_scatter into one flat run and into
 * separate (reversed) blocks, rooted ones from root 0, send/recv around the
 * ring. */
static void every_collective(crun_pg_t *pg, float *a, float *blk, size_t c) {
  int r = crun_pg_rank(pg), n = crun_pg_size(pg);
  void *outs[4];
  const void *ins[4];
  size_t cnt[4];
  EXPECT_OK(crun_pg_all_reduce(pg, a, c, CRUN_FLOAT32, CRUN_OP_SUM, &DEV, NULL));
  EXPECT_OK(crun_pg_all_reduce(pg, a, c, CRUN_FLOAT32, CRUN_OP_AVG, &DEV, NULL));
  EXPECT_OK(crun_pg_reduce(pg, a, c, CRUN_FLOAT32, CRUN_OP_MAX, 0, &DEV, NULL));
  EXPECT_OK(crun_pg_broadcast(pg, a, c, CRUN_FLOAT32, 0, &DEV, NULL));
  for (int flat = 0; flat < 2; flat++) {
    for (int j = 0; j < n; j++) ins[j] = outs[j] = blk + (size_t)(flat ? j : n - 1 - j) * c;
    EXPECT_OK(crun_pg_all_gather(pg, outs, a, c, CRUN_FLOAT32, &DEV, NULL));
    EXPECT_OK(crun_pg_reduce_scatter(pg, a, ins, c, CRUN_FLOAT32, CRUN_OP_SUM, &DEV, NULL));
  }
  for (int j = 0; j < n; j++) outs[j] = blk + (size_t)j * c, ins[j] = blk + (size_t)(n + j) * c, cnt[j] = c;
  EXPECT_OK(crun_pg_gather(pg, a, r == 0 ? outs : NULL, c, CRUN_FLOAT32, 0, &DEV, NULL));
  EXPECT_OK(crun_pg_scatter(pg, a, r == 0 ? ins : NULL, c, CRUN_FLOAT32, 0, &DEV, NULL));
  EXPECT_OK(crun_pg_all_to_all(pg, outs, cnt, ins, cnt, CRUN_FLOAT32, &DEV, NULL));
  if (n < 2) return;
  crun_work_t *sw = NULL;
  EXPECT_OK(crun_pg_send(pg, a, c, CRUN_FLOAT32, (r + 1) % n, &DEV, &sw));
  EXPECT_OK(crun_pg_recv(pg, blk, c, CRUN_FLOAT32, (r + n - 1) % n, &DEV, NULL, NULL));
  EXPECT_OK(crun_work_wait(sw, 0));
  crun_work_release(sw);
}

/* A collective in steady state asks the GPU for no memory, no event, no
 * stream and no host wait: each costs microseconds, more than the call's
 * own budget (cudaMallocAsync for all_gather's scratch; a new end event
 * when the spare ones are still held by operations the watchdog has not
 * looked at yet). The test waits for the device after each round (that
 * wait is its own, counted out), never for the watchdog. A group keeps as
 * many operations, each with its event, as were ever in flight at once: a
 * few more events are fine when that high-water mark grows in the timed
 * rounds (the double's streams are threads the scheduler may hold back).
 * A one-rank group does not enter NCCL at all: its result is a local copy
 * at most (NCCL's own one-rank path would make that copy after its
 * enqueue's host work). */
static void steady_state(crun_pg_t *pg, void *arg) {
  (void)arg;
  int dev = 0, n = crun_pg_size(pg);
  size_t c = 5;
  float *a = calloc(c, sizeof *a), *blk = calloc(c * 2 * (size_t)n, sizeof *blk);
  EXPECT_OK(crun_cuda_current_device(&dev));
  for (int i = 0; i < 3; i++) every_collective(pg, a, blk, c); /* warm-up: the pools fill, the scratch grows */
  EXPECT_OK(crun_cuda_synchronize(dev));
  long before[CRUN_DBL_NCOUNTED];
  for (int k = 0; k < CRUN_DBL_NCOUNTED; k++) before[k] = crun_dbl_count((crun_dbl_counted_t)k);
  int rounds = 40;
  for (int i = 0; i < rounds; i++) {
    every_collective(pg, a, blk, c);
    EXPECT_OK(crun_cuda_synchronize(dev));
  }
  for (int k = 0; k < CRUN_DBL_NCOUNTED; k++) {
    long d = crun_dbl_count((crun_dbl_counted_t)k) - before[k] - (k == CRUN_DBL_HOST_SYNC ? rounds : 0);
    if (k == CRUN_DBL_NCCL_OP && n > 1) continue; /* one rank's collective is a local copy at most */
    if (d > (k == CRUN_DBL_EVENT_CREATE ? 3 : 0))
      crun_test_fail(__FILE__, __LINE__, "world size %d: %ld x %s in %d rounds of every collective", n, d,
                     crun_dbl_count_name((crun_dbl_counted_t)k), rounds);
  }
  EXPECT_OK(crun_pg_barrier(pg, NULL, NULL));
  free(a);
  free(blk);
}

TEST(steady_state_calls_allocate_nothing) {
  setenv("CRUN_NCCL_CHECK", "0", 1); /* the store is not the device's business */
  for (int n = 1; n <= 3; n++) EXPECT_EQ_INT(spawn(n, "nccl", steady_state, NULL, 30), 0);
  unsetenv("CRUN_NCCL_CHECK");
}

#define CRUN_TESTS(X) X(reductions_1_to_4_ranks) X(data_movement_1_to_4_ranks) X(premul_async_and_subgroups) \
  X(auto_serves_cpu_and_cuda) X(wrong_device_and_unsupported_ops) X(mismatch_names_both_calls)               \
  X(hang_signature_check_names_missing_rank) X(hang_watchdog_aborts_and_names_missing_rank)                    \
  X(async_error_aborts_every_rank) X(abort_races_collectives) X(end_events_come_from_a_bounded_pool) \
  X(steady_state_calls_allocate_nothing) X(one_rank_refused_op_leaves_the_output)
CRUN_TEST_MAIN()
