/* test_shm.c — the shared-memory collective engine with forked ranks on a
 * file store: every collective x dtypes x ops x counts (0, 1, 7, 5000, 100003)
 * against a reference, one-shot and pipelined paths (small chunks so many
 * chunks wrap the buffers), 8 oversubscribed ranks, mismatches, timeouts, a
 * SIGKILLed peer, bad arguments, and /dev/shm left clean after every run. */
#include "harness.h"

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/heap.h"
#include "transport/shm/shm_int.h"

typedef void (*rank_fn)(crun__shm_comm_t *c, int rank, int size);

static const size_t counts[] = {0, 1, 7, 5000, 100003};
#define NCOUNTS (sizeof counts / sizeof counts[0])

/* ---------------------------------------------------------------- values */

static float half_to_float(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? INFINITY : ldexpf((float)(m | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}

/* Converts a float that is a small integer or a normal value (truncating). */
static uint16_t float_to_half(float f) {
  uint16_t s = f < 0 ? 0x8000 : 0;
  f = fabsf(f);
  if (f == 0) return s;
  int e;
  float m = frexpf(f, &e); /* f = m * 2^e, m in [0.5, 1) */
  if (e > 16) return s | 0x7c00;
  if (e < -13) return s;
  return s | (uint16_t)((e + 14) << 10) | (uint16_t)((int)(m * 2048.0f) & 0x3ff);
}

static double get(crun_dtype_t dt, const void *p, size_t i) {
  switch (dt) {
  case CRUN_FLOAT32: return ((const float *)p)[i];
  case CRUN_FLOAT64: return ((const double *)p)[i];
  case CRUN_FLOAT16: return half_to_float(((const uint16_t *)p)[i]);
  case CRUN_BFLOAT16: {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  case CRUN_INT32: return ((const int32_t *)p)[i];
  case CRUN_INT64: return (double)((const int64_t *)p)[i];
  case CRUN_UINT8: return ((const uint8_t *)p)[i];
  case CRUN_INT8: return ((const int8_t *)p)[i];
  case CRUN_INT16: return ((const int16_t *)p)[i];
  default: return NAN;
  }
}

static void set(crun_dtype_t dt, void *p, size_t i, double v) {
  switch (dt) {
  case CRUN_FLOAT32: ((float *)p)[i] = (float)v; break;
  case CRUN_FLOAT64: ((double *)p)[i] = v; break;
  case CRUN_FLOAT16: ((uint16_t *)p)[i] = float_to_half((float)v); break;
  case CRUN_BFLOAT16: {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    break;
  }
  case CRUN_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
  case CRUN_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
  case CRUN_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
  case CRUN_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
  case CRUN_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
  default: break;
  }
}

/* The input of rank r at element i for op (exact in every dtype). */
static double value(crun_dtype_t dt, crun_reduce_op_t op, int r, size_t i) {
  int k = (int)((r * 7 + i * 3) % 11);
  if (op == CRUN_OP_PRODUCT) {
    int m = (int)((r + i) % 4);
    if (dt == CRUN_UINT8) return m == 0 ? 2 : 1;
    return m == 0 ? -2 : m == 1 ? 2 : 1;
  }
  if (op == CRUN_OP_BAND || op == CRUN_OP_BOR || op == CRUN_OP_BXOR)
    return (double)((r * 37 + i * 11 + 5) & (dt == CRUN_INT8 ? 0x7f : 0xff));
  return dt == CRUN_UINT8 ? k : k - 5;
}

/* The reference result at element i over `size` ranks. */
static double expected(crun_dtype_t dt, crun_reduce_op_t op, int size, size_t i) {
  double acc = value(dt, op, 0, i);
  int64_t bits = (int64_t)acc;
  for (int r = 1; r < size; r++) {
    double v = value(dt, op, r, i);
    switch (op) {
    case CRUN_OP_SUM: case CRUN_OP_AVG: acc += v; break;
    case CRUN_OP_PRODUCT: acc *= v; break;
    case CRUN_OP_MIN: acc = v < acc ? v : acc; break;
    case CRUN_OP_MAX: acc = v > acc ? v : acc; break;
    case CRUN_OP_BAND: bits &= (int64_t)v; break;
    case CRUN_OP_BOR: bits |= (int64_t)v; break;
    case CRUN_OP_BXOR: bits ^= (int64_t)v; break;
    default: break;
    }
  }
  if (op == CRUN_OP_BAND || op == CRUN_OP_BOR || op == CRUN_OP_BXOR) return (double)bits;
  if (op == CRUN_OP_AVG) acc = crun_dtype_is_integer(dt) ? trunc(acc / size) : acc / size;
  return acc;
}

static void fill(crun_dtype_t dt, crun_reduce_op_t op, int r, void *p, size_t n) {
  for (size_t i = 0; i < n; i++) set(dt, p, i, value(dt, op, r, i));
}

/* Checks got[i] == want (tolerance for float avg); reports the first miss. */
static void check_elem(const char *what, crun_dtype_t dt, crun_reduce_op_t op, int rank,
                       const void *got, size_t i, double want) {
  double g = get(dt, got, i);
  double tol = 0;
  if (!crun_dtype_is_integer(dt) && op == CRUN_OP_AVG)
    tol = (dt == CRUN_FLOAT32 || dt == CRUN_FLOAT64 ? 1e-5 : 2e-2) * (fabs(want) + 1);
  if (fabs(g - want) > tol)
    crun_test_fail(__FILE__, __LINE__, "%s %s %s rank %d: element %zu is %g, expected %g", what,
                   crun_dtype_name(dt), crun_reduce_op_name(op), rank, i, g, want);
}

/* Buffers come from the shared tensor heap when the test made one (the
 * direct path), except on rank `malloc_rank` (the mixed case). */
static int malloc_rank = -1, my_rank = -1;

static void *xmalloc(size_t n) {
  void *p = my_rank != malloc_rank ? crun__heap_alloc(n ? n : 1) : NULL;
  if (!p) p = malloc(n ? n : 1);
  if (!p) crun_test_fail(__FILE__, __LINE__, "out of memory");
  return p;
}

static void xfree(void *p) {
  if (!crun__heap_free(p)) free(p);
}

/* ---------------------------------------------------------------- ranks */

static char store_path[PATH_MAX];
static int expect_direct = -1; /* 1: some ops must take the direct path, 0: none */

/* Fails when /dev/shm still holds a segment created by process pid. */
static void expect_shm_clean(pid_t pid) {
  char pre[64];
  snprintf(pre, sizeof pre, "crun-shm-%d-", (int)pid);
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, pre, strlen(pre)) == 0) {
      closedir(d);
      crun_test_fail(__FILE__, __LINE__, "/dev/shm/%s was left behind", e->d_name);
    }
  closedir(d);
}

/* Child body: joins the communicator and runs fn, exits 0 on success. */
static void rank_main(int rank, int size, rank_fn fn) {
  alarm(90);
  crun_log_set_rank(rank);
  my_rank = rank;
  crun__heap_use_slot(rank); /* a no-op unless the test reserved a heap */
  crun_store_t *s = NULL;
  crun__shm_comm_t *c = NULL;
  EXPECT_OK(crun_store_file_new(store_path, &s));
  EXPECT_OK(crun__shm_comm_create(s, "t", rank, size, 30, &c));
  fn(c, rank, size);
  if (expect_direct >= 0 && size > 1 && (c->direct_ops > 0) != expect_direct)
    crun_test_fail(__FILE__, __LINE__, "rank %d: %llu ops on the direct path, expected %s",
                   rank, (unsigned long long)c->direct_ops, expect_direct ? "some" : "none");
  crun__shm_comm_destroy(c);
  crun_store_release(s);
  _exit(0);
}

/* Forks size ranks running fn; returns how many failed. Every child is
 * reaped (killed after 100 s); /dev/shm must be clean afterwards. */
static int run_ranks(int size, rank_fn fn) {
  pid_t pids[16];
  crun_test_tmp_path(store_path, sizeof store_path, "crun_shm_test_%d", (int)getpid());
  unlink(store_path);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    if (pids[r] == 0) rank_main(r, size, fn);
  }
  int failed = 0, left = size;
  double deadline = crun_clock() + 100;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      left--;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    } else if (crun_clock() > deadline) {
      for (int r = 0; r < size; r++) kill(pids[r], SIGKILL);
    } else {
      usleep(2000);
    }
  }
  unlink(store_path);
  expect_shm_clean(pids[0]);
  return failed;
}

#define RUN_RANKS(size, fn) EXPECT_EQ_INT(run_ranks(size, fn), 0)

/* bool (or / and semantics) runs in the collectives matrix, not here. */
static int op_ok(crun_dtype_t dt, crun_reduce_op_t op) {
  if (dt == CRUN_BOOL || op == CRUN_OP_PREMUL_SUM) return 0; /* premul_sum: a pg-level op */
  return op != CRUN_OP_BAND && op != CRUN_OP_BOR && op != CRUN_OP_BXOR ? 1
                                                                        : crun_dtype_is_integer(dt);
}

/* ---------------------------------------------------------------- bodies */

static void expect_text(const char *needle) {
  if (!strstr(crun_last_error(), needle))
    crun_test_fail(__FILE__, __LINE__, "error text '%s' lacks '%s'", crun_last_error(), needle);
}

/* all_reduce, every dtype x op x count, in place and out of place. */
static void body_allreduce(crun__shm_comm_t *c, int rank, int size) {
  for (int dt = 0; dt < CRUN_DTYPE_COUNT; dt++)
    for (int op = 0; op < CRUN_OP_COUNT; op++) {
      if (!op_ok(dt, op)) continue;
      for (size_t k = 0; k < NCOUNTS; k++) {
        size_t n = counts[k], es = crun_dtype_size(dt);
        char *in = xmalloc(n * es), *out = xmalloc(n * es);
        fill(dt, op, rank, in, n);
        int inplace = (k + op) % 2;
        if (inplace) memcpy(out, in, n * es);
        EXPECT_OK(crun__shm_allreduce(c, out, inplace ? NULL : in, n, dt, op, 0));
        for (size_t i = 0; i < n; i++)
          check_elem("all_reduce", dt, op, rank, out, i, expected(dt, op, size, i));
        if (!inplace)
          for (size_t i = 0; i < n; i++) EXPECT(get(dt, in, i) == value(dt, op, rank, i));
        xfree(in);
        xfree(out);
      }
    }
}

/* reduce to every root, a few dtypes and ops. */
static void body_reduce(crun__shm_comm_t *c, int rank, int size) {
  static const int dts[] = {CRUN_FLOAT32, CRUN_INT64, CRUN_BFLOAT16};
  static const int ops[] = {CRUN_OP_SUM, CRUN_OP_MAX, CRUN_OP_AVG};
  for (int root = 0; root < size; root++)
    for (int d = 0; d < 3; d++)
      for (size_t k = 0; k < NCOUNTS; k++) {
        int dt = dts[d], op = ops[(root + d + (int)k) % 3];
        size_t n = counts[k], es = crun_dtype_size(dt);
        char *in = xmalloc(n * es), *out = xmalloc(n * es);
        fill(dt, op, rank, in, n);
        memset(out, 0x5a, n * es);
        EXPECT_OK(crun__shm_reduce(c, out, in, n, dt, op, root, 0));
        for (size_t i = 0; i < n; i++) {
          if (rank == root) check_elem("reduce", dt, op, rank, out, i, expected(dt, op, size, i));
          else EXPECT(((unsigned char *)out)[i * es] == 0x5a);
        }
        xfree(in);
        xfree(out);
      }
}

/* broadcast from every root, every dtype. */
static void body_broadcast(crun__shm_comm_t *c, int rank, int size) {
  for (int root = 0; root < size; root++)
    for (int dt = 0; dt < CRUN_DTYPE_COUNT; dt++)
      for (size_t k = 0; k < NCOUNTS; k++) {
        size_t n = counts[k], es = crun_dtype_size(dt);
        char *buf = xmalloc(n * es);
        fill(dt, CRUN_OP_SUM, rank == root ? 100 + root : rank, buf, n);
        EXPECT_OK(crun__shm_broadcast(c, buf, n, dt, root, 0));
        for (size_t i = 0; i < n; i++)
          check_elem("broadcast", dt, CRUN_OP_SUM, rank, buf, i, value(dt, CRUN_OP_SUM, 100 + root, i));
        xfree(buf);
      }
}

/* all_gather, out of place and in place. */
static void body_all_gather(crun__shm_comm_t *c, int rank, int size) {
  static const int dts[] = {CRUN_FLOAT32, CRUN_FLOAT64, CRUN_UINT8, CRUN_FLOAT16};
  for (int d = 0; d < 4; d++)
    for (size_t k = 0; k < NCOUNTS; k++) {
      int dt = dts[d], inplace = (d + (int)k) % 2;
      size_t n = counts[k], es = crun_dtype_size(dt);
      char *in = xmalloc(n * es), *out = xmalloc(n * es * size);
      fill(dt, CRUN_OP_SUM, rank, in, n);
      if (inplace) memcpy(out + rank * n * es, in, n * es);
      EXPECT_OK(crun__shm_all_gather(c, out, inplace ? out + rank * n * es : in, n, dt, 0));
      for (int q = 0; q < size; q++)
        for (size_t i = 0; i < n; i++)
          check_elem("all_gather", dt, CRUN_OP_SUM, rank, out + q * n * es, i,
                     value(dt, CRUN_OP_SUM, q, i));
      xfree(in);
      xfree(out);
    }
}

/* reduce_scatter: rank q's input block b holds value(q, b*n + i). */
static void body_reduce_scatter(crun__shm_comm_t *c, int rank, int size) {
  static const int dts[] = {CRUN_FLOAT32, CRUN_INT32, CRUN_FLOAT16, CRUN_UINT8};
  static const int ops[] = {CRUN_OP_SUM, CRUN_OP_MIN, CRUN_OP_AVG, CRUN_OP_BXOR};
  for (int d = 0; d < 4; d++)
    for (size_t k = 0; k < NCOUNTS; k++) {
      int dt = dts[d], op = ops[d], inplace = (int)k % 2;
      size_t n = counts[k], es = crun_dtype_size(dt);
      char *in = xmalloc(n * es * size), *out = xmalloc(n * es);
      fill(dt, op, rank, in, n * size);
      char *dst = inplace ? in + rank * n * es : out;
      EXPECT_OK(crun__shm_reduce_scatter(c, dst, in, n, dt, op, 0));
      for (size_t i = 0; i < n; i++)
        check_elem("reduce_scatter", dt, op, rank, dst, i, expected(dt, op, size, rank * n + i));
      xfree(in);
      xfree(out);
    }
}

/* all_to_all: block b of rank q's input holds value(q, b*n + i). */
static void body_all_to_all(crun__shm_comm_t *c, int rank, int size) {
  static const int dts[] = {CRUN_FLOAT32, CRUN_INT64, CRUN_BFLOAT16};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < NCOUNTS; k++) {
      int dt = dts[d], inplace = (d + (int)k) % 2;
      size_t n = counts[k], es = crun_dtype_size(dt);
      char *in = xmalloc(n * es * size), *out = xmalloc(n * es * size);
      fill(dt, CRUN_OP_SUM, rank, in, n * size);
      if (inplace) memcpy(out, in, n * es * size);
      EXPECT_OK(crun__shm_all_to_all(c, out, inplace ? out : in, n, dt, 0));
      for (int q = 0; q < size; q++)
        for (size_t i = 0; i < n; i++)
          check_elem("all_to_all", dt, CRUN_OP_SUM, rank, out + q * n * es, i,
                     value(dt, CRUN_OP_SUM, q, rank * n + i));
      xfree(in);
      xfree(out);
    }
}

/* all_gather and reduce_scatter on separate blocks (the process-group form). */
static void body_block_lists(crun__shm_comm_t *c, int rank, int size) {
  static const size_t ns[] = {0, 7, 100003};
  for (int k = 0; k < 3; k++) {
    size_t n = ns[k];
    float *blocks[8], *in = xmalloc(n * 4);
    for (int q = 0; q < size; q++) {
      blocks[q] = xmalloc(n * 4);
      fill(CRUN_FLOAT32, CRUN_OP_SUM, rank, blocks[q], n);
    }
    fill(CRUN_FLOAT32, CRUN_OP_SUM, rank + 50, in, n);
    EXPECT_OK(crun__shm_all_gather_v(c, (void *const *)blocks, in, n, CRUN_FLOAT32, 0));
    for (int q = 0; q < size; q++)
      for (size_t i = 0; i < n; i++)
        EXPECT(blocks[q][i] == (float)value(CRUN_FLOAT32, CRUN_OP_SUM, q + 50, i));
    for (int q = 0; q < size; q++) fill(CRUN_FLOAT32, CRUN_OP_MAX, rank, blocks[q], n);
    EXPECT_OK(crun__shm_reduce_scatter_v(c, in, (const void *const *)blocks, n, CRUN_FLOAT32,
                                         CRUN_OP_MAX, 0));
    for (size_t i = 0; i < n; i++)
      check_elem("reduce_scatter_v", CRUN_FLOAT32, CRUN_OP_MAX, rank, in, i,
                 expected(CRUN_FLOAT32, CRUN_OP_MAX, size, i));
    for (int q = 0; q < size; q++) xfree(blocks[q]);
    xfree(in);
  }
}

/* gather and scatter from every root; the root's own block in place on
 * odd counts. Non-roots pass no block list. */
static void body_gather_scatter(crun__shm_comm_t *c, int rank, int size) {
  static const int dts[] = {CRUN_FLOAT32, CRUN_INT64, CRUN_UINT8};
  for (int root = 0; root < size; root++)
    for (int d = 0; d < 3; d++)
      for (size_t k = 0; k < NCOUNTS; k++) {
        int dt = dts[d], inplace = (int)k % 2;
        size_t n = counts[k], es = crun_dtype_size(dt);
        char *blocks[8] = {0}, *mine = xmalloc(n * es);
        for (int q = 0; q < size && rank == root; q++) blocks[q] = xmalloc(n * es);
        fill(dt, CRUN_OP_SUM, rank, mine, n);
        const char *in = mine;
        if (rank == root && inplace) {
          memcpy(blocks[root], mine, n * es);
          in = blocks[root];
        }
        EXPECT_OK(crun__shm_gather_v(c, rank == root ? (void *const *)blocks : NULL, in, n, dt,
                                     root, 0));
        for (int q = 0; q < size && rank == root; q++)
          for (size_t i = 0; i < n; i++)
            check_elem("gather", dt, CRUN_OP_SUM, rank, blocks[q], i, value(dt, CRUN_OP_SUM, q, i));
        for (int q = 0; q < size && rank == root; q++) fill(dt, CRUN_OP_SUM, 10 + q, blocks[q], n);
        char *out = rank == root && inplace ? blocks[root] : mine;
        EXPECT_OK(crun__shm_scatter_v(c, out, rank == root ? (const void *const *)blocks : NULL,
                                      n, dt, root, 0));
        for (size_t i = 0; i < n; i++)
          check_elem("scatter", dt, CRUN_OP_SUM, rank, out, i, value(dt, CRUN_OP_SUM, 10 + rank, i));
        for (int q = 0; q < size; q++) xfree(blocks[q]);
        xfree(mine);
      }
}

/* all_to_all_v: rank r sends cnt(r, q) elements to q, small and large. */
static size_t a2av_cnt(int r, int q, int big) {
  size_t k = (size_t)((r * 3 + q * 5 + big) % 7);
  return big ? k * 20011 : k;
}

static void body_all_to_all_v(crun__shm_comm_t *c, int rank, int size) {
  for (int big = 0; big < 2; big++) {
    size_t inc[8], outc[8];
    float *ins[8], *outs[8];
    for (int q = 0; q < size; q++) {
      inc[q] = a2av_cnt(rank, q, big);
      outc[q] = a2av_cnt(q, rank, big);
      ins[q] = xmalloc(inc[q] * 4);
      outs[q] = xmalloc(outc[q] * 4);
      fill(CRUN_FLOAT32, CRUN_OP_SUM, rank * 16 + q, ins[q], inc[q]);
    }
    EXPECT_OK(crun__shm_all_to_all_v(c, (void *const *)outs, outc, (const void *const *)ins, inc,
                                     CRUN_FLOAT32, 0));
    for (int q = 0; q < size; q++) {
      for (size_t i = 0; i < outc[q]; i++)
        EXPECT(outs[q][i] == (float)value(CRUN_FLOAT32, CRUN_OP_SUM, q * 16 + rank, i));
      xfree(ins[q]);
      xfree(outs[q]);
    }
  }
}

/* Rank 1 expects one element less from rank 0 than rank 0 sends. */
static void body_all_to_all_v_mismatch(crun__shm_comm_t *c, int rank, int size) {
  size_t inc[4] = {3, 3, 3, 3}, outc[4] = {3, 3, 3, 3};
  float buf[8][3] = {{0}};
  void *outs[4] = {buf[0], buf[1], buf[2], buf[3]};
  const void *ins[4] = {buf[4], buf[5], buf[6], buf[7]};
  if (rank == 1) outc[0] = 2;
  EXPECT_STATUS(crun__shm_all_to_all_v(c, outs, outc, ins, inc, CRUN_FLOAT32, 10), CRUN_EMISMATCH);
  expect_text("rank 0 sends 3 elements but this rank expects 2");
}

static void body_barrier(crun__shm_comm_t *c, int rank, int size) {
  for (int i = 0; i < 200; i++) EXPECT_OK(crun__shm_barrier(c, 0));
}

/* 8 oversubscribed ranks: all_reduce, broadcast and barrier, both paths. */
static void body_oversub(crun__shm_comm_t *c, int rank, int size) {
  static const size_t ns[] = {0, 7, 100003};
  for (int k = 0; k < 3; k++) {
    size_t n = ns[k];
    float *buf = xmalloc(n * 4);
    fill(CRUN_FLOAT32, CRUN_OP_SUM, rank, buf, n);
    EXPECT_OK(crun__shm_allreduce(c, buf, NULL, n, CRUN_FLOAT32, CRUN_OP_SUM, 0));
    for (size_t i = 0; i < n; i++)
      check_elem("all_reduce", CRUN_FLOAT32, CRUN_OP_SUM, rank, buf, i,
                 expected(CRUN_FLOAT32, CRUN_OP_SUM, size, i));
    fill(CRUN_FLOAT32, CRUN_OP_SUM, rank, buf, n);
    EXPECT_OK(crun__shm_broadcast(c, buf, n, CRUN_FLOAT32, 5, 0));
    for (size_t i = 0; i < n; i++) EXPECT(buf[i] == (float)value(CRUN_FLOAT32, CRUN_OP_SUM, 5, i));
    EXPECT_OK(crun__shm_barrier(c, 0));
    xfree(buf);
  }
  for (int i = 0; i < 100; i++) EXPECT_OK(crun__shm_barrier(c, 0));
}

/* ---------------------------------------------------------------- failures */

/* Rank 1 calls broadcast while the others call all_reduce. */
static void body_mismatch_kind(crun__shm_comm_t *c, int rank, int size) {
  float buf[4] = {1, 2, 3, 4};
  int rc = rank == 1 ? crun__shm_broadcast(c, buf, 4, CRUN_FLOAT32, 0, 10)
                     : crun__shm_allreduce(c, buf, NULL, 4, CRUN_FLOAT32, CRUN_OP_SUM, 10);
  EXPECT_EQ_INT(rc, CRUN_EMISMATCH);
  expect_text("broadcast");
  EXPECT_STATUS(crun__shm_barrier(c, 1), CRUN_ESTATE);
}

/* Rank 0 sends a large count, the others a small one (different paths). */
static void body_mismatch_count(crun__shm_comm_t *c, int rank, int size) {
  size_t n = rank == 0 ? 100000 : 10;
  float *buf = calloc(100000, 4);
  double t0 = crun_clock();
  EXPECT_STATUS(crun__shm_allreduce(c, buf, NULL, n, CRUN_FLOAT32, CRUN_OP_SUM, 20),
                CRUN_EMISMATCH);
  EXPECT(crun_clock() - t0 < 5);
  expect_text("float32[100000]");
  expect_text("float32[10]");
  xfree(buf);
}

/* Rank 2 skips the collective: the others time out naming it. */
static size_t timeout_count = 1000; /* one-shot path; the direct test: large */
static void body_timeout(crun__shm_comm_t *c, int rank, int size) {
  float *buf = xmalloc(timeout_count * 4);
  memset(buf, 0, timeout_count * 4);
  if (rank == 2) {
    usleep(1500000);
    EXPECT(crun__shm_barrier(c, 5) < 0); /* learns of the abort quickly */
    return;
  }
  double t0 = crun_clock();
  int rc = crun__shm_allreduce(c, buf, NULL, timeout_count, CRUN_FLOAT32, CRUN_OP_SUM, 0.5);
  EXPECT(rc == CRUN_ETIMEDOUT);
  EXPECT(crun_clock() - t0 < 3);
  if (rank == 0 || strstr(crun_last_error(), "failed first") == NULL) expect_text("no data from rank 2 after 0.5 s");
}

/* Rank 1 is SIGKILLed in the middle of a pipelined all_reduce. */
static void body_peer_killed(crun__shm_comm_t *c, int rank, int size) {
  size_t n = 4 << 20;
  float *buf = xmalloc(n * 4); /* in the heap for the direct-path test */
  memset(buf, 0, n * 4);
  EXPECT_OK(crun__shm_allreduce(c, buf, NULL, n, CRUN_FLOAT32, CRUN_OP_SUM, 0));
  if (rank == 1) raise(SIGKILL);
  double t0 = crun_clock();
  int rc = 0;
  for (int i = 0; i < 20 && rc == 0; i++)
    rc = crun__shm_allreduce(c, buf, NULL, n, CRUN_FLOAT32, CRUN_OP_SUM, 0);
  EXPECT_EQ_INT(rc, CRUN_EPEERDIED);
  expect_text("rank 1");
  EXPECT(crun_clock() - t0 < 5);
  xfree(buf);
}

/* Bad arguments fail on the caller with a clear error and break the comm. */
static void body_bad_args(crun__shm_comm_t *c, int rank, int size) {
  float buf[4] = {0};
  EXPECT_STATUS(crun__shm_allreduce(c, buf, NULL, 4, CRUN_FLOAT32, CRUN_OP_BXOR, 5), CRUN_EINVAL);
  expect_text("bxor");
  EXPECT_STATUS(crun__shm_broadcast(c, buf, 4, CRUN_FLOAT32, 0, 5), CRUN_ESTATE);
}

static void body_bad_root(crun__shm_comm_t *c, int rank, int size) {
  float buf[4] = {0};
  EXPECT_STATUS(crun__shm_broadcast(c, buf, 4, CRUN_FLOAT32, size, 5), CRUN_EINVAL);
  expect_text("root");
}

/* ---------------------------------------------------------------- cases */

static void small_chunks(void) {
  setenv("CRUN_SHM_CHUNK", "65536", 1);
  setenv("CRUN_SHM_SMALL", "32768", 1);
}

TEST(allreduce_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_allreduce);
}
TEST(reduce_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_reduce);
}
TEST(broadcast_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_broadcast);
}
TEST(all_gather_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_all_gather);
}
TEST(reduce_scatter_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_reduce_scatter);
}
TEST(all_to_all_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_all_to_all);
}
TEST(block_lists_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_block_lists);
}
TEST(gather_scatter_1_to_4_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_gather_scatter);
}
TEST(all_to_all_v_1_to_4_and_8_ranks) {
  small_chunks();
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_all_to_all_v);
  RUN_RANKS(8, body_all_to_all_v);
}
TEST(all_to_all_v_count_mismatch) { RUN_RANKS(3, body_all_to_all_v_mismatch); }
TEST(barrier_1_to_4_ranks) {
  for (int n = 1; n <= 4; n++) RUN_RANKS(n, body_barrier);
}
TEST(oversubscribed_8_ranks) {
  small_chunks();
  RUN_RANKS(8, body_oversub);
}
TEST(default_layout_3_ranks) {
  unsetenv("CRUN_SHM_CHUNK");
  unsetenv("CRUN_SHM_SMALL");
  RUN_RANKS(3, body_allreduce);
}
/* Buffers in a shared heap (as under crun-lua): the large ops read and
 * write peers' buffers in place; every result must be the same. */
static void direct_setup(int nslots) {
  small_chunks();
  setenv("CRUN_HEAP_MIN", "1", 1);
  EXPECT_OK(crun__heap_reserve(nslots));
  expect_direct = 1;
}
TEST(direct_path_1_to_4_ranks) {
  direct_setup(8);
  for (int n = 1; n <= 4; n++) {
    RUN_RANKS(n, body_allreduce);
    RUN_RANKS(n, body_reduce);
    RUN_RANKS(n, body_broadcast);
    RUN_RANKS(n, body_all_gather);
    RUN_RANKS(n, body_reduce_scatter);
    RUN_RANKS(n, body_block_lists);
  }
  RUN_RANKS(8, body_oversub);
}
/* One rank's buffers are not in the heap: every rank takes the bounce path. */
TEST(direct_path_needs_every_rank) {
  direct_setup(3);
  expect_direct = 0;
  malloc_rank = 1;
  RUN_RANKS(3, body_allreduce);
  RUN_RANKS(3, body_all_gather);
}
/* CRUN_SHM_DIRECT=0 keeps a heap-backed group on the bounce path. */
TEST(direct_path_off_by_env) {
  direct_setup(2);
  expect_direct = 0;
  setenv("CRUN_SHM_DIRECT", "0", 1);
  RUN_RANKS(2, body_broadcast);
}
TEST(direct_path_timeout_names_missing_rank) {
  direct_setup(3);
  expect_direct = -1;
  timeout_count = 100000;
  RUN_RANKS(3, body_timeout);
}
/* A peer killed between direct ops: the others fail naming it, no crash. */
TEST(direct_path_peer_killed) {
  direct_setup(3);
  expect_direct = -1;
  EXPECT_EQ_INT(run_ranks(3, body_peer_killed), 1);
}
TEST(mismatched_collective) { RUN_RANKS(3, body_mismatch_kind); }
TEST(mismatched_count) { RUN_RANKS(3, body_mismatch_count); }
TEST(timeout_names_missing_rank) { RUN_RANKS(3, body_timeout); }
TEST(bad_arguments) {
  RUN_RANKS(2, body_bad_args);
  RUN_RANKS(2, body_bad_root);
}

/* The rank that was killed fails; the others must pass. */
TEST(peer_killed_mid_collective) {
  small_chunks();
  EXPECT_EQ_INT(run_ranks(3, body_peer_killed), 1);
}

/* Only 2 of 3 ranks start: create times out naming rank 2, no segment left. */
static void create_alone(int rank) {
  crun_store_t *s = NULL;
  crun__shm_comm_t *c = NULL;
  EXPECT_OK(crun_store_file_new(store_path, &s));
  double t0 = crun_clock();
  EXPECT_STATUS(crun__shm_comm_create(s, "t", rank, 3, 1.0, &c), CRUN_ETIMEDOUT);
  expect_text("2");
  EXPECT(crun_clock() - t0 < 4);
  crun_store_release(s);
  _exit(0);
}

TEST(create_times_out) {
  crun_test_tmp_path(store_path, sizeof store_path, "crun_shm_test_%d", (int)getpid());
  unlink(store_path);
  pid_t p[2];
  for (int r = 0; r < 2; r++)
    if ((p[r] = fork()) == 0) create_alone(r);
  for (int r = 0; r < 2; r++) {
    int st;
    waitpid(p[r], &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  unlink(store_path);
  expect_shm_clean(p[0]);
}

/* Rank 0 is killed while it waits for rank 2 (never started) to attach: rank
 * 1 times out and removes the segment, so nothing is left in /dev/shm. */
TEST(creator_killed_during_create) {
  crun_test_tmp_path(store_path, sizeof store_path, "crun_shm_test_%d", (int)getpid());
  unlink(store_path);
  pid_t p0 = fork();
  if (p0 == 0) {
    crun_store_t *s = NULL;
    crun__shm_comm_t *c = NULL;
    EXPECT_OK(crun_store_file_new(store_path, &s));
    crun__shm_comm_create(s, "t", 0, 3, 30.0, &c);
    _exit(1);
  }
  pid_t p1 = fork();
  if (p1 == 0) {
    crun_store_t *s = NULL;
    crun__shm_comm_t *c = NULL;
    EXPECT_OK(crun_store_file_new(store_path, &s));
    EXPECT_STATUS(crun__shm_comm_create(s, "t", 1, 3, 1.5, &c), CRUN_ETIMEDOUT);
    _exit(0);
  }
  usleep(500000);
  kill(p0, SIGKILL);
  int st0, st1;
  waitpid(p0, &st0, 0);
  waitpid(p1, &st1, 0);
  unlink(store_path);
  EXPECT(WIFSIGNALED(st0));
  EXPECT(WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
  expect_shm_clean(p0);
}

/* A hostile header: rank 0 (a child) creates the segment; this process, as
 * rank 1, rewrites its header with `corrupt` before attaching, and the
 * attach must fail cleanly with EPROTO naming the segment and the rank. */
static void attach_hostile(void (*corrupt)(shm_header_t *h)) {
  crun_test_tmp_path(store_path, sizeof store_path, "crun_shm_test_%d", (int)getpid());
  unlink(store_path);
  pid_t p0 = fork();
  if (p0 == 0) {
    crun_store_t *s = NULL;
    crun__shm_comm_t *c = NULL;
    EXPECT_OK(crun_store_file_new(store_path, &s));
    EXPECT_STATUS(crun__shm_comm_create(s, "t", 0, 2, 0.8, &c), CRUN_ETIMEDOUT);
    _exit(0);
  }
  crun_store_t *s = NULL;
  crun__shm_comm_t *c = NULL;
  EXPECT_OK(crun_store_file_new(store_path, &s));
  const char *keys[1] = {"t/shm_name"};
  EXPECT_OK(crun_store_wait(s, keys, 1, 10));
  crun_buf_t v = {0};
  EXPECT_OK(crun_store_get(s, keys[0], &v));
  char name[128];
  snprintf(name, sizeof name, "%.*s", (int)v.len, (const char *)v.data);
  crun_buf_free(&v);
  int fd = shm_open(name, O_RDWR, 0600);
  EXPECT(fd >= 0);
  shm_header_t *h = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT(h != MAP_FAILED);
  close(fd);
  corrupt(h);
  munmap(h, sizeof *h);
  EXPECT_STATUS(crun__shm_comm_create(s, "t", 1, 2, 1.5, &c), CRUN_EPROTO);
  expect_text("rank 1");
  expect_text(name);
  expect_text("bad header");
  int st;
  waitpid(p0, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  crun_store_release(s);
  unlink(store_path);
  expect_shm_clean(p0);
}

/* (64 + small) * 2 * 2 ranks wraps past 2^64 back to the true layout's size. */
static void wrap_small(shm_header_t *h) { h->small_bytes += 1ull << 62; }
/* chunk * nbuf * 2 ranks wraps (nbuf * 2 is even) back to the true size. */
static void wrap_chunk(shm_header_t *h) { h->chunk += 1ull << 63; }
/* A total past the mapping, and a buffer count past int. */
static void past_mapping(shm_header_t *h) { h->total *= 2; }
static void huge_nbuf(shm_header_t *h) { h->nbuf = 0x80000002u; }

TEST(hostile_header_refused) {
  unsetenv("CRUN_SHM_CHUNK");
  unsetenv("CRUN_SHM_SMALL");
  attach_hostile(wrap_small);
  attach_hostile(wrap_chunk);
  attach_hostile(past_mapping);
  attach_hostile(huge_nbuf);
}

/* A long pseudo-random sequence of every collective and size on few, small
 * buffers (two of 16 KiB), so that every reuse of a slot or buffer across
 * ops and paths is exercised; every result is checked. */
static void body_mixed(crun__shm_comm_t *c, int rank, int size) {
  uint64_t x = 12345;
  size_t cap = 40000 * (size_t)size;
  float *a = xmalloc(cap * 4), *b = xmalloc(cap * 4);
  for (int it = 0; it < 150; it++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    size_t n = (size_t)(x >> 33) % 40000;
    if ((x >> 20) % 3 == 0) n %= 300;
    int kind = (int)((x >> 40) % 6), root = (int)((x >> 50) % (uint64_t)size);
    fill(CRUN_FLOAT32, CRUN_OP_SUM, rank, a, n * size);
    if (kind == 0) {
      EXPECT_OK(crun__shm_allreduce(c, a, NULL, n, CRUN_FLOAT32, CRUN_OP_SUM, 0));
      for (size_t i = 0; i < n; i++) EXPECT(a[i] == (float)expected(CRUN_FLOAT32, CRUN_OP_SUM, size, i));
    } else if (kind == 1) {
      fill(CRUN_FLOAT32, CRUN_OP_SUM, rank == root ? 77 : rank, a, n);
      EXPECT_OK(crun__shm_broadcast(c, a, n, CRUN_FLOAT32, root, 0));
      for (size_t i = 0; i < n; i++) EXPECT(a[i] == (float)value(CRUN_FLOAT32, CRUN_OP_SUM, 77, i));
    } else if (kind == 2) {
      EXPECT_OK(crun__shm_all_gather(c, b, a, n, CRUN_FLOAT32, 0));
      for (int q = 0; q < size; q++)
        for (size_t i = 0; i < n; i++) EXPECT(b[q * n + i] == (float)value(CRUN_FLOAT32, CRUN_OP_SUM, q, i));
    } else if (kind == 3) {
      EXPECT_OK(crun__shm_reduce_scatter(c, b, a, n, CRUN_FLOAT32, CRUN_OP_SUM, 0));
      for (size_t i = 0; i < n; i++)
        EXPECT(b[i] == (float)expected(CRUN_FLOAT32, CRUN_OP_SUM, size, rank * n + i));
    } else if (kind == 4) {
      EXPECT_OK(crun__shm_all_to_all(c, b, a, n, CRUN_FLOAT32, 0));
      for (int q = 0; q < size; q++)
        for (size_t i = 0; i < n; i++)
          EXPECT(b[q * n + i] == (float)value(CRUN_FLOAT32, CRUN_OP_SUM, q, rank * n + i));
    } else {
      EXPECT_OK(crun__shm_reduce(c, a, NULL, n, CRUN_FLOAT32, CRUN_OP_SUM, root, 0));
      if (rank == root)
        for (size_t i = 0; i < n; i++) EXPECT(a[i] == (float)expected(CRUN_FLOAT32, CRUN_OP_SUM, size, i));
    }
  }
  xfree(a);
  xfree(b);
}

TEST(mixed_sequence_2_and_8_ranks) {
  setenv("CRUN_SHM_CHUNK", "16384", 1);
  setenv("CRUN_SHM_NBUF", "2", 1);
  setenv("CRUN_SHM_SMALL", "4096", 1);
  RUN_RANKS(2, body_mixed);
  RUN_RANKS(3, body_mixed);
  RUN_RANKS(8, body_mixed);
  unsetenv("CRUN_SHM_NBUF");
}

#define CRUN_TESTS(X) X(allreduce_1_to_4_ranks) X(reduce_1_to_4_ranks) X(broadcast_1_to_4_ranks) \
  X(all_gather_1_to_4_ranks) X(reduce_scatter_1_to_4_ranks) X(all_to_all_1_to_4_ranks)          \
  X(block_lists_1_to_4_ranks) X(gather_scatter_1_to_4_ranks)                                   \
  X(all_to_all_v_1_to_4_and_8_ranks) X(all_to_all_v_count_mismatch) X(barrier_1_to_4_ranks) X(oversubscribed_8_ranks) X(default_layout_3_ranks)                    \
  X(mismatched_collective) X(mismatched_count) X(timeout_names_missing_rank) X(bad_arguments)   \
  X(peer_killed_mid_collective) X(create_times_out) X(creator_killed_during_create) X(hostile_header_refused)          \
  X(mixed_sequence_2_and_8_ranks) X(direct_path_1_to_4_ranks) X(direct_path_needs_every_rank)  \
  X(direct_path_off_by_env) X(direct_path_timeout_names_missing_rank) X(direct_path_peer_killed)
CRUN_TEST_MAIN()
