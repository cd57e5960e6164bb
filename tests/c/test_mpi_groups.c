/* test_mpi_groups.c — mpi backend groups created concurrently: each case
 * runs this program under `mpirun -np 2` (worker mode, chosen by
 * OMPI_COMM_WORLD_SIZE), where two threads per rank create a group each at
 * the same time and all_reduce on it. Passes without running anything when
 * mpirun or the mpi backend is missing. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* Two group names whose ids (fnv1a of "<name>/0") agree modulo 0x8000. */
static void colliding_names(char a[32], char b[32]) {
  char pa[40], pb[40];
  snprintf(a, 32, "c0");
  snprintf(pa, sizeof pa, "%s/0", a);
  for (int k = 1;; k++) {
    snprintf(b, 32, "c%d", k);
    snprintf(pb, sizeof pb, "%s/0", b);
    if ((fnv1a(pa) & 0x7fff) == (fnv1a(pb) & 0x7fff)) return;
  }
}

typedef struct { const char *name; int rank, which, rc; char err[512]; } job_t;

/* Creates group `name` (backend mpi) and checks one all_reduce on it. */
static void *job_main(void *arg) {
  job_t *j = arg;
  crun_store_t *st = NULL;
  crun_pg_t *pg = NULL;
  crun_pg_opts_t o = {.world_size = 2, .rank = j->rank, .backend = "mpi", .timeout = 10, .name = j->name};
  j->rc = crun_store_hash_new(&st);
  if (j->rc == 0) o.store = st, j->rc = crun_pg_new(&o, &pg);
  int64_t v[4];
  for (int i = 0; i < 4; i++) v[i] = -(int64_t)(100 * j->which + 10 * j->rank + i);
  if (j->rc == 0) j->rc = crun_pg_all_reduce(pg, v, 4, CRUN_INT64, CRUN_OP_SUM, NULL, NULL);
  if (j->rc < 0) snprintf(j->err, sizeof j->err, "%s", crun_last_error());
  for (int i = 0; j->rc == 0 && i < 4; i++)
    if (v[i] != -(int64_t)(200 * j->which + 10 + 2 * i)) {
      j->rc = -1;
      snprintf(j->err, sizeof j->err, "group %s: element %d is %lld, want %lld (another group's data)", j->name, i,
               (long long)v[i], (long long)-(200 * j->which + 10 + 2 * i));
    }
  if (pg) crun_pg_release(pg);
  if (st) crun_store_release(st);
  return NULL;
}

/* Worker: rounds of two groups created at once by two threads. */
static int worker(void) {
  int rank = atoi(getenv("OMPI_COMM_WORLD_RANK")), bad = 0;
  char a[32], b[32];
  colliding_names(a, b);
  for (int round = 0; round < 10 && !bad; round++) {
    char na[48], nb[48];
    snprintf(na, sizeof na, "%s", round % 2 ? a : b);
    snprintf(nb, sizeof nb, "%s", round % 2 ? b : a);
    job_t j[2] = {{.name = na, .rank = rank, .which = 0}, {.name = nb, .rank = rank, .which = 1}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, job_main, &j[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
      if (j[i].rc < 0) printf("rank %d round %d: %s\n", rank, round, j[i].err), bad = 1;
  }
  if (!bad) printf("rank %d: ok\n", rank);
  fflush(stdout);
  return bad;
}

TEST(concurrent_colliding_groups) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    printf("SKIPPED: mpirun is not installed\n");
    return;
  }
  char self[4096], cmd[8192], out[8192] = "";
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  EXPECT(n > 0);
  self[n] = 0;
  snprintf(cmd, sizeof cmd, "unset CRUN_LAUNCHER RANK WORLD_SIZE; timeout -s KILL 120 mpirun --allow-run-as-root "
           "--oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 2 %s 2>&1", self);
  FILE *p = popen(cmd, "r");
  EXPECT(p != NULL);
  size_t len = fread(out, 1, sizeof out - 1, p);
  out[len] = 0;
  pclose(p);
  if (strstr(out, "not available in this build")) {
    printf("SKIPPED: no mpi backend\n");
    return;
  }
  if (!strstr(out, "rank 0: ok") || !strstr(out, "rank 1: ok")) crun_test_fail(__FILE__, __LINE__, "%s", out);
}

#define CRUN_TESTS(X) X(concurrent_colliding_groups)

int main(int argc, char **argv) {
  if (getenv("OMPI_COMM_WORLD_SIZE")) return worker();
  static const crun_test_case cases[] = {CRUN_TESTS(CRUN_X_CASE)};
  return crun_test_run(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
