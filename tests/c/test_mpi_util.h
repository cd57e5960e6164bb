/* test_mpi_util.h — runs the calling test program again as one of its MPI
 * worker cases under mpirun, for the MPI backend's C tests. */
#ifndef CRUN_TEST_MPI_UTIL_H
#define CRUN_TEST_MPI_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* Runs this program as case `name` (CRUN_TEST_MPI_CASE) on np ranks of
 * mpirun (extra options `mca`), killed after `limit` s, its output in
 * out[cap]. Returns mpirun's exit status, or -1 when the case cannot run
 * here (no mpirun, no mpi backend: it printed the SKIPPED line). */
static inline int mpi_run_case(const char *name, int np, const char *mca, int limit, char *out, size_t cap) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    printf("SKIPPED: mpirun is not installed\n");
    return -1;
  }
  char self[4096], cmd[8192];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  EXPECT(n > 0);
  self[n > 0 ? n : 0] = 0;
  snprintf(cmd, sizeof cmd, "unset CRUN_LAUNCHER RANK WORLD_SIZE CRUN_FAULT_ALLOC; CRUN_TEST_MPI_CASE=%s timeout -s KILL "
           "%d mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo %s "
           "-np %d %s 2>&1", name, limit, mca, np, self);
  FILE *p = popen(cmd, "r");
  EXPECT(p != NULL);
  size_t len = p ? fread(out, 1, cap - 1, p) : 0;
  out[len] = 0;
  int status = p ? pclose(p) : -1;
  if (strstr(out, "not available in this build")) {
    printf("SKIPPED: no mpi backend\n");
    return -1;
  }
  return status;
}

#if CRUN_HAVE_MPI
#include <mpi.h>

/* A worker's start: MPI with threads, and a store for its groups (a hash
 * store: every rank of the job is this program). Returns this rank. */
static inline int mpi_worker_begin(crun_store_t **st) {
  int level = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
  EXPECT(crun_store_hash_new(st) == 0);
  return atoi(getenv("OMPI_COMM_WORLD_RANK"));
}

/* A worker's end: releases st, meets the other ranks, finalizes MPI and
 * says "rank R: ok" unless bad; returns bad. */
static inline int mpi_worker_end(crun_store_t *st, int rank, int bad) {
  crun_store_release(st);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  if (!bad) printf("rank %d: ok\n", rank);
  fflush(stdout);
  return bad;
}
#endif

#endif
