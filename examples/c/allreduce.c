/* examples/c/allreduce.c — libcrunrt from C, the way one would use Gloo.
 *
 *   build/examples/allreduce (target example_allreduce), once per rank with the torchrun variables:
 *   RANK=r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build/examples/allreduce
 *
 * Joins the TCP store at MASTER_ADDR:MASTER_PORT (rank 0 hosts it unless a
 * launcher that serves it set CRUN_LAUNCHER), makes the process group, runs a
 * blocking and an async all_reduce and a broadcast, and checks the results.
 * Exits 0 on success, 1 with the error text otherwise. */
#include <stdio.h>
#include <stdlib.h>

#include <crun.h>

static int fail(const char *what, int rc) {
  fprintf(stderr, "allreduce example: %s failed: %s\n", what, rc < 0 ? crun_last_error() : "wrong result");
  return 1;
}

/* Opens the store the torchrun way (env://). */
static int open_store(int rank, int size, crun_store_t **out) {
  const char *port = getenv("MASTER_PORT");
  if (!port) return crun_error(CRUN_EINVAL, "MASTER_PORT is not set");
  crun_store_tcp_opts_t o = {
      .host = getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : "127.0.0.1",
      .port = atoi(port),
      .is_master = rank == 0 && !getenv("CRUN_LAUNCHER"),
      .world_size = 0,
      .timeout = 60,
  };
  (void)size;
  return crun_store_tcp_new(&o, out);
}

int main(void) {
  int rank = (int)crun_env_int("RANK", 0), size = (int)crun_env_int("WORLD_SIZE", 1), rc;
  crun_store_t *store = NULL;
  crun_pg_t *pg = NULL;
  if ((rc = open_store(rank, size, &store)) < 0) return fail("store", rc);
  crun_pg_opts_t po = {.store = store, .rank = rank, .world_size = size, .timeout = 60};
  if ((rc = crun_pg_new(&po, &pg)) < 0) return fail("crun_pg_new", rc);

  float data[1000];
  for (int i = 0; i < 1000; i++) data[i] = (float)(rank + i);
  if ((rc = crun_pg_all_reduce(pg, data, 1000, CRUN_FLOAT32, CRUN_OP_SUM, NULL, NULL)) < 0)
    return fail("all_reduce", rc);
  float want = (float)(size * (size - 1) / 2);
  if (data[0] != want || data[999] != want + 999.0f * size) return fail("all_reduce check", 0);

  int64_t x = rank, y = rank;
  crun_work_t *w = NULL;
  if ((rc = crun_pg_all_reduce(pg, &x, 1, CRUN_INT64, CRUN_OP_MAX, NULL, &w)) < 0) return fail("async all_reduce", rc);
  if ((rc = crun_pg_broadcast(pg, &y, 1, CRUN_INT64, size - 1, NULL, NULL)) < 0) return fail("broadcast", rc);
  if ((rc = crun_work_wait(w, 30)) < 0) return fail("wait", rc);
  crun_work_release(w);
  if (x != size - 1 || y != size - 1) return fail("max/broadcast check", 0);

  printf("rank %d of %d: all_reduce ok (data[0] = %.1f), async max = %lld\n", rank, size, data[0], (long long)x);
  if ((rc = crun_pg_barrier(pg, NULL, NULL)) < 0) return fail("barrier", rc);
  crun_pg_release(pg);
  crun_store_release(store);
  return 0;
}
