/* test_mpi_coll.c — the mpi backend's collectives at the edges of MPI's int
 * counts: each case runs this program under mpirun (worker mode, chosen by
 * OMPI_COMM_WORLD_SIZE; the case by CRUN_TEST_MPI_CASE). Passes without
 * running anything when mpirun or the mpi backend is missing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_mpi_util.h"

#if CRUN_HAVE_MPI
#include <mpi.h>

/* a2a_wrap (3 ranks): all_to_all where rank 1 sends rank 2 a block of
 * SIZE_MAX - 1 bytes after 2 bytes to the others, and rank 2 expects it
 * after 2 bytes from rank 0: on both, the running total of counts wraps
 * past SIZE_MAX to 0. Rank 1 and 2 must fail with ERANGE naming the block
 * and its size, rank 0 with their error (from an abort notice), all within
 * the 2 s timeout. Before, the layout's check (total + count > INT_MAX)
 * wrapped too and let the counts through: MPI got count -2 and rank 1
 * packed SIZE_MAX - 1 bytes into a staging buffer of 2 (a crash). */
static int worker_a2a_wrap(crun_store_t *st, int rank) {
  static const size_t ic[3][3] = {{1, 1, 2}, {1, 1, SIZE_MAX - 1}, {1, 1, 1}};
  static const size_t oc[3][3] = {{1, 1, 1}, {1, 1, 1}, {2, SIZE_MAX - 1, 1}};
  static const char *const want[3] = {
      "ERANGE: all_to_all #1 on rank ",
      "ERANGE: all_to_all #1 on rank 1: the blocks it sends add up to more than 2147483647 elements (the mpi "
      "backend's limit per call) at the one for rank 2 (18446744073709551614 elements)",
      "ERANGE: all_to_all #1 on rank 2: the blocks it receives add up to more than 2147483647 elements (the mpi "
      "backend's limit per call) at the one from rank 1 (18446744073709551614 elements)"};
  uint8_t buf[16] = {0}; /* inputs at 0, 2, 4; outputs from 8, above every input's span */
  const void *ins[3] = {buf, buf + 2, buf + 4};
  void *outs[3] = {buf + 8, buf + 10, buf + 12};
  crun_pg_t *pg = NULL;
  crun_pg_opts_t o = {.world_size = 3, .rank = rank, .backend = "mpi", .timeout = 2, .name = "wrap", .store = st};
  int bad = crun_pg_new(&o, &pg) < 0;
  if (bad) printf("rank %d: group 'wrap': %s\n", rank, crun_last_error());
  double t0 = MPI_Wtime();
  int rc = bad ? 0 : crun_pg_all_to_all(pg, outs, oc[rank], ins, ic[rank], CRUN_UINT8, NULL, NULL);
  if (!bad && (rc != CRUN_ERANGE || strncmp(crun_last_error(), want[rank], strlen(want[rank]))))
    printf("rank %d: rc %d (%s), want ERANGE: %s...\n", rank, rc, rc < 0 ? crun_last_error() : "no error",
           want[rank]), bad = 1;
  if (MPI_Wtime() - t0 > 1.5) printf("rank %d: all_to_all took %.1f s\n", rank, MPI_Wtime() - t0), bad = 1;
  if (pg) crun_pg_release(pg);
  return bad;
}
#endif

/* Runs case `which` on this rank; prints "rank R: ok" when it passed. */
static int worker(const char *which) {
#if CRUN_HAVE_MPI
  int rank = atoi(getenv("OMPI_COMM_WORLD_RANK")), level = 0, bad = 0;
  crun_store_t *st = NULL;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
  EXPECT(crun_store_hash_new(&st) == 0);
  if (!strcmp(which, "a2a_wrap")) bad |= worker_a2a_wrap(st, rank);
  else printf("rank %d: no case %s\n", rank, which), bad = 1;
  return mpi_worker_end(st, rank, bad);
#else
  (void)which;
  printf("not available in this build\n");
  return 0;
#endif
}

/* Runs this program as case `name` on np ranks of mpirun and checks that
 * every rank said ok. */
static void run_mpi_case(const char *name, int np) {
  static char out[65536];
  int status = mpi_run_case(name, np, "", 60, out, sizeof out);
  if (status == -1) return;
  for (int r = 0; r < np; r++) {
    char ok[32];
    snprintf(ok, sizeof ok, "rank %d: ok", r);
    if (status != 0 || !strstr(out, ok)) {
      crun_test_fail(__FILE__, __LINE__, "exit status %d\n%s", status, out);
      return;
    }
  }
}

TEST(a2a_count_wrap) { run_mpi_case("a2a_wrap", 3); }

#define CRUN_TESTS(X) X(a2a_count_wrap)

int main(int argc, char **argv) {
  const char *which = getenv("CRUN_TEST_MPI_CASE");
  if (getenv("OMPI_COMM_WORLD_SIZE") && which) return worker(which);
  static const crun_test_case cases[] = {CRUN_TESTS(CRUN_X_CASE)};
  return crun_test_run(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
