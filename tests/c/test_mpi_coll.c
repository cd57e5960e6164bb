/* test_mpi_coll.c — the mpi backend's collectives at the edges of MPI's int
 * counts, and its point-to-point calls when peers leave: each case runs this program under mpirun (worker mode, chosen by
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

/* One all_to_all of uint8 blocks on a group of 3 ranks (timeout 2 s) with
 * counts ic (sent) and oc (received) per rank, expected to fail on rank r
 * with status want_rc and an error text starting with want[r], every rank
 * within 1.5 s. */
static int a2a_fails(crun_store_t *st, int rank, const char *name, const size_t (*ic)[3], const size_t (*oc)[3],
                     int want_rc, const char *const *want) {
  /* the blocks at 0, 2, 4 and 8, 10, 12: a large block last, above every
   * block of the other direction (rank 1 sends one to rank 2, which receives
   * it from rank 1), so that no output overlaps an input (an in-place call
   * would copy the inputs) */
  uint8_t buf[16] = {0}, *lo = buf, *hi = buf + 8;
  const void *ins[3] = {rank == 2 ? lo : hi, rank == 2 ? lo + 2 : hi + 2, rank == 2 ? lo + 4 : hi + 4};
  void *outs[3] = {rank == 2 ? hi : lo, rank == 2 ? hi + 4 : lo + 2, rank == 2 ? hi + 2 : lo + 4};
  crun_pg_t *pg = NULL;
  crun_pg_opts_t o = {.world_size = 3, .rank = rank, .backend = "mpi", .timeout = 2, .name = name, .store = st};
  int bad = crun_pg_new(&o, &pg) < 0;
  if (bad) printf("rank %d: group '%s': %s\n", rank, name, crun_last_error());
  double t0 = MPI_Wtime();
  int rc = bad ? 0 : crun_pg_all_to_all(pg, outs, oc[rank], ins, ic[rank], CRUN_UINT8, NULL, NULL);
  if (!bad && (rc != want_rc || strncmp(crun_last_error(), want[rank], strlen(want[rank]))))
    printf("rank %d: %s: rc %d (%s), want %s...\n", rank, name, rc, rc < 0 ? crun_last_error() : "no error",
           want[rank]), bad = 1;
  if (MPI_Wtime() - t0 > 1.5) printf("rank %d: %s took %.1f s\n", rank, name, MPI_Wtime() - t0), bad = 1;
  if (pg) crun_pg_release(pg);
  return bad;
}

/* a2a_wrap (3 ranks): all_to_all where rank 1 sends rank 2 a block of
 * SIZE_MAX - 1 bytes after 2 bytes to the others, and rank 2 expects it
 * after 2 bytes from rank 0: on both, the running total of counts wraps
 * past SIZE_MAX to 0. crun_pg_all_to_all refuses such blocks on every
 * backend (EINVAL naming the block, test_pg all_to_all_count_overflow):
 * rank 1 and 2 fail with it, rank 0 from their abort notice, within the 2 s
 * timeout. Then the mpi backend's own limit: rank 1 sends rank 2 2^31 - 1
 * bytes after 2 to the others, which fits a size_t but not MPI's int
 * counts: ERANGE from the mpi backend (rank 1: its total; rank 2: naming
 * the block). Before its fix,
 * that layout's check (total + count > INT_MAX) wrapped with counts near
 * SIZE_MAX and let them through: MPI got count -2 and rank 1 packed
 * SIZE_MAX - 1 bytes into a staging buffer of 2 (a crash). */
static int worker_a2a_wrap(crun_store_t *st, int rank) {
  static const size_t ic[3][3] = {{1, 1, 2}, {1, 1, SIZE_MAX - 1}, {1, 1, 1}};
  static const size_t oc[3][3] = {{1, 1, 1}, {1, 1, 1}, {2, SIZE_MAX - 1, 1}};
  static const char *const want[3] = {
      "EINVAL: all_to_all on rank ",
      "EINVAL: all_to_all on rank 1: the input block for rank 2 (18446744073709551614 elements of 1 bytes) does "
      "not fit in memory",
      "EINVAL: all_to_all on rank 2: the output block for rank 1 (18446744073709551614 elements of 1 bytes) does "
      "not fit in memory"};
  static const size_t ic2[3][3] = {{1, 1, 2}, {1, 1, INT32_MAX}, {1, 1, 1}};
  static const size_t oc2[3][3] = {{1, 1, 1}, {1, 1, 1}, {2, INT32_MAX, 1}};
  static const char *const want2[3] = {
      "ERANGE: all_to_all #1 on rank ",
      "ERANGE: all_to_all #1 on rank 1: 2147483649 elements exceed the mpi backend's limit of 2147483647 per call",
      "ERANGE: all_to_all #1 on rank 2: the blocks it receives add up to more than 2147483647 elements (the mpi "
      "backend's limit per call) at the one from rank 1 (2147483647 elements)"};
  int bad = a2a_fails(st, rank, "wrap", ic, oc, CRUN_EINVAL, want);
  return bad | a2a_fails(st, rank, "int", ic2, oc2, CRUN_ERANGE, want2);
}

/* any_left (3 ranks): ranks 1 and 2 destroy the group; rank 0's recv from
 * any rank (timeout 10 s) must fail with EPEERDIED naming both within about
 * LEFT_GRACE (1 s) of their notices, not wait for its deadline. Then a recv
 * from any rank on a group where rank 1 alone left still waits (rank 2 may
 * send): rank 2 sends after 1.5 s and rank 0 receives it. Before, an
 * any-source recv never looked at the peers' notices: ETIMEDOUT after 10 s. */
static int worker_any_left(crun_store_t *st, int rank) {
  crun_pg_t *pg = NULL;
  crun_pg_opts_t o = {.world_size = 3, .rank = rank, .backend = "mpi", .timeout = 10, .name = "al1", .store = st};
  int bad = crun_pg_new(&o, &pg) < 0;
  if (bad) printf("rank %d: group 'al1': %s\n", rank, crun_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  if (!bad && rank == 0) {
    static const char want[] = "EPEERDIED: recv from any rank (tag 0) on rank 0: ranks 1-2 destroyed the group "
                               "without sending it";
    int32_t x = 0;
    double t0 = MPI_Wtime();
    int rc = crun_pg_recv(pg, &x, 1, CRUN_INT32, CRUN_ANY_SOURCE, NULL, NULL, NULL);
    if (rc != CRUN_EPEERDIED || strncmp(crun_last_error(), want, strlen(want)))
      printf("rank 0: al1: rc %d (%s), want %s...\n", rc, rc < 0 ? crun_last_error() : "no error", want), bad = 1;
    if (MPI_Wtime() - t0 > 3) printf("rank 0: al1: recv took %.1f s\n", MPI_Wtime() - t0), bad = 1;
  }
  if (pg) crun_pg_release(pg);
  MPI_Barrier(MPI_COMM_WORLD);
  o.name = "al2";
  pg = NULL;
  bad |= crun_pg_new(&o, &pg) < 0;
  int32_t x = rank == 2 ? 42 : 0;
  if (!bad && rank == 1) crun_pg_release(pg), pg = NULL;
  if (!bad && rank == 2) {
    usleep(1500 * 1000);
    if (crun_pg_send(pg, &x, 1, CRUN_INT32, 0, NULL, NULL) < 0) printf("rank 2: al2: %s\n", crun_last_error()), bad = 1;
  }
  if (!bad && rank == 0) {
    int src = -1, rc = crun_pg_recv(pg, &x, 1, CRUN_INT32, CRUN_ANY_SOURCE, NULL, &src, NULL);
    if (rc < 0 || x != 42 || src != 2)
      printf("rank 0: al2: rc %d (%s), got %d from %d\n", rc, rc < 0 ? crun_last_error() : "ok", x, src), bad = 1;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (pg) crun_pg_release(pg);
  return bad;
}
#endif

/* Runs case `which` on this rank; prints "rank R: ok" when it passed. */
static int worker(const char *which) {
#if CRUN_HAVE_MPI
  crun_store_t *st = NULL;
  int rank = mpi_worker_begin(&st), bad = 0;
  if (!strcmp(which, "a2a_wrap")) bad |= worker_a2a_wrap(st, rank);
  else if (!strcmp(which, "any_left")) bad |= worker_any_left(st, rank);
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

TEST(any_source_recv_every_peer_left) { run_mpi_case("any_left", 3); }

#define CRUN_TESTS(X) X(a2a_count_wrap) X(any_source_recv_every_peer_left)

int main(int argc, char **argv) {
  const char *which = getenv("CRUN_TEST_MPI_CASE");
  if (getenv("OMPI_COMM_WORLD_SIZE") && which) return worker(which);
  static const crun_test_case cases[] = {CRUN_TESTS(CRUN_X_CASE)};
  return crun_test_run(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
