/* shm_bench.c — times the shared-memory engine the way the anchors do
 * (anchors/mpi/mpi_allreduce.c): per size, a warm-up, then every rank times
 * every op on its own (back to back); the per-iteration time is the max over
 * ranks; the table gives the median (and min, mean), algbw = bytes / median
 * and busbw as nccl-tests define it (all_reduce x2(n-1)/n, broadcast x1,
 * all_gather x(n-1)/n; bytes = one rank's input, but for all_gather the total
 * gathered, as in nccl-tests and the Gloo anchor).
 *
 * Usage: shm_bench [-n ranks] [-c all_reduce|broadcast|all_gather|reduce_scatter|all_to_all]
 *                  [-b budget_s_per_size] [bytes ...]
 * Forks the ranks, which meet on a file store in /tmp; CSV on stdout (rank 0),
 * float32 sum. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crun.h"
#include "transport/shm/shm.h"

typedef struct {
  int n;
  const char *coll;
  double budget;
  size_t sizes[32];
  int nsizes;
  char store[64];
} bench_opts_t;

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void plan(size_t bytes, int *warm, int *iters) {
  if (bytes <= 1024) { *warm = 50; *iters = 1000; }
  else if (bytes <= (64u << 10)) { *warm = 20; *iters = 300; }
  else if (bytes <= (1u << 20)) { *warm = 10; *iters = 200; }
  else if (bytes <= (16u << 20)) { *warm = 3; *iters = 30; }
  else { *warm = 2; *iters = 10; }
}

/* Runs one op of the chosen collective on count floats per rank. */
static int one_op(crun__shm_comm_t *c, const char *coll, float *sb, float *rb, size_t count) {
  if (!strcmp(coll, "all_reduce"))
    return crun__shm_allreduce(c, rb, sb, count, CRUN_FLOAT32, CRUN_OP_SUM, 0);
  if (!strcmp(coll, "broadcast")) return crun__shm_broadcast(c, rb, count, CRUN_FLOAT32, 0, 0);
  if (!strcmp(coll, "all_gather")) return crun__shm_all_gather(c, rb, sb, count, CRUN_FLOAT32, 0);
  if (!strcmp(coll, "reduce_scatter"))
    return crun__shm_reduce_scatter(c, rb, sb, count, CRUN_FLOAT32, CRUN_OP_SUM, 0);
  if (!strcmp(coll, "all_to_all")) return crun__shm_all_to_all(c, rb, sb, count, CRUN_FLOAT32, 0);
  return crun_error(CRUN_EINVAL, "unknown collective '%s'", coll);
}

static double bus_factor(const char *coll, int n) {
  if (!strcmp(coll, "all_reduce")) return 2.0 * (n - 1) / n;
  if (!strcmp(coll, "broadcast")) return 1.0;
  return (double)(n - 1) / n;
}

/* Times one size on every rank; rank 0 prints the CSV line. */
static int bench_size(crun__shm_comm_t *c, const bench_opts_t *o, size_t bytes) {
  int rank = crun__shm_comm_rank(c), n = o->n, warm, iters;
  /* all_gather: bytes is the total gathered, as nccl-tests and the Gloo anchor count it */
  int ag = !strcmp(o->coll, "all_gather");
  size_t count = bytes / 4 / (ag ? (size_t)n : 1);
  if (!count) count = 1;
  size_t in_n = !strcmp(o->coll, "reduce_scatter") || !strcmp(o->coll, "all_to_all") ? count * n : count;
  size_t out_n = !strcmp(o->coll, "all_gather") || !strcmp(o->coll, "all_to_all") ? count * n : count;
  float *sb = malloc(in_n * 4), *rb = calloc(out_n, 4);
  if (!sb || !rb) return crun_error(CRUN_ENOMEM, "bench: out of memory");
  for (size_t i = 0; i < in_n; i++) sb[i] = 1.0f;
  plan(bytes, &warm, &iters);
  CRUN_CHECK(crun__shm_barrier(c, 0));
  double tw = crun_clock();
  for (int i = 0; i < warm; i++) CRUN_CHECK(one_op(c, o->coll, sb, rb, count));
  tw = (crun_clock() - tw) / warm;
  CRUN_CHECK(crun__shm_allreduce(c, &tw, NULL, 1, CRUN_FLOAT64, CRUN_OP_MAX, 0));
  int cap = (int)(o->budget / (tw > 0 ? tw : 1e-9));
  if (cap < iters) iters = cap < 3 ? 3 : cap;
  if (!strcmp(o->coll, "all_reduce") && rb[0] != (float)n)
    return crun_error(CRUN_EIO, "bench: bad all_reduce result %f on rank %d", rb[0], rank);
  double *t = malloc(sizeof(double) * iters);
  CRUN_CHECK(crun__shm_barrier(c, 0));
  for (int i = 0; i < iters; i++) {
    double t0 = crun_clock();
    CRUN_CHECK(one_op(c, o->coll, sb, rb, count));
    t[i] = crun_clock() - t0;
  }
  CRUN_CHECK(crun__shm_reduce(c, t, NULL, (size_t)iters, CRUN_FLOAT64, CRUN_OP_MAX, 0, 0));
  if (rank == 0) {
    double mean = 0;
    for (int i = 0; i < iters; i++) mean += t[i];
    mean /= iters;
    qsort(t, (size_t)iters, sizeof(double), cmpd);
    double med = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    size_t b = count * 4 * (ag ? (size_t)n : 1);
    double alg = (double)b / med / 1e9;
    printf("%s,%d,%zu,%d,%.6e,%.6e,%.6e,%.4f,%.4f\n", o->coll, n, b, iters, med, t[0],
           mean, alg, alg * bus_factor(o->coll, n));
    fflush(stdout);
  }
  free(t);
  free(sb);
  free(rb);
  return 0;
}

static int rank_main(const bench_opts_t *o, int rank) {
  crun_store_t *s = NULL;
  crun__shm_comm_t *c = NULL;
  crun_log_set_rank(rank);
  int rc = crun_store_file_new(o->store, &s);
  if (rc == 0) rc = crun__shm_comm_create(s, "bench", rank, o->n, 60, &c);
  for (int i = 0; rc == 0 && i < o->nsizes; i++) rc = bench_size(c, o, o->sizes[i]);
  if (rc < 0) fprintf(stderr, "shm_bench rank %d: %s\n", rank, crun_last_error());
  crun__shm_comm_destroy(c);
  if (s) crun_store_release(s);
  return rc < 0;
}

static int parse(int argc, char **argv, bench_opts_t *o) {
  static const size_t def[] = {8, 64, 1024, 8192, 32768, 65536, 262144, 1u << 20, 4u << 20,
                               16u << 20, 64u << 20};
  *o = (bench_opts_t){.n = 2, .coll = "all_reduce", .budget = 2.0};
  int opt;
  while ((opt = getopt(argc, argv, "n:c:b:")) != -1) {
    if (opt == 'n') o->n = atoi(optarg);
    else if (opt == 'c') o->coll = optarg;
    else if (opt == 'b') o->budget = atof(optarg);
    else return -1;
  }
  for (int i = optind; i < argc && o->nsizes < 32; i++)
    o->sizes[o->nsizes++] = strtoull(argv[i], NULL, 0);
  if (!o->nsizes)
    for (size_t i = 0; i < sizeof def / sizeof def[0]; i++) o->sizes[o->nsizes++] = def[i];
  return o->n >= 1 && o->n <= 64 ? 0 : -1;
}

int main(int argc, char **argv) {
  bench_opts_t o;
  if (parse(argc, argv, &o) < 0) {
    fprintf(stderr, "usage: shm_bench [-n ranks] [-c collective] [-b budget_s] [bytes ...]\n");
    return 2;
  }
  snprintf(o.store, sizeof o.store, "/tmp/crun_shm_bench_%d", (int)getpid());
  unlink(o.store);
  printf("# crun shm engine, world_size=%d budget_s=%.1f\n", o.n, o.budget);
  printf("op,world_size,bytes,iters,median_s,min_s,mean_s,algbw_GBps,busbw_GBps\n");
  fflush(stdout);
  pid_t pids[64];
  for (int r = 0; r < o.n; r++)
    if ((pids[r] = fork()) == 0) _exit(rank_main(&o, r));
  int failed = 0;
  for (int r = 0; r < o.n; r++) {
    int st;
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {}
    failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  unlink(o.store);
  return failed;
}
