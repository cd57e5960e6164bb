/* broadcast.c — broadcast(root) and barrier on the shared segment.
 * One-shot: the root copies its buffer into its slot, every other rank
 * copies it out after the one synchronisation. Pipelined: the root copies
 * chunk t+1 into its buffer while the others copy chunk t out. */
#include "transport/shm/shm_int.h"

#include <string.h>

#include "core/heap.h"

static void bc_fill(shm_op_t *o, char *mine) { memcpy(mine, o->out, o->small_len); }

static int bc_finish(shm_op_t *o, int b) {
  memcpy(o->out, crun__shm_small_data(o->c, o->root, b), o->count * o->es);
  return 0;
}

static void bc_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base, n = crun__shm_chunk_len(o, t, &base);
  memcpy(mine, o->out + base * o->es, n * o->es);
}

static int bc_copy_out(shm_op_t *o, size_t t, int b) {
  size_t base, n = crun__shm_chunk_len(o, t, &base);
  memcpy(o->out + base * o->es, crun__shm_buf(o->c, o->root, b), n * o->es);
  return 0;
}

int crun__shm_broadcast(crun__shm_comm_t *c, void *buf, size_t count, crun_dtype_t dt,
                        int root, double timeout) {
  CRUN_CHECK(crun__shm_begin(c, SHM_BROADCAST, dt, 0, root, count, 1, buf != NULL, timeout));
  int is_root = c->rank == root;
  shm_op_t o = {.c = c, .kind = SHM_BROADCAST, .dt = dt, .root = root, .count = count};
  o.es = crun_dtype_size(dt);
  o.in = o.out = buf;
  size_t bytes = count * o.es;
  if (bytes <= c->small_bytes) {
    o.small_len = is_root ? bytes : 0;
    o.fill = bc_fill;
    o.finish = is_root || !count ? NULL : bc_finish;
    return crun__shm_run_small(&o);
  }
  /* every rank copies a slice of the root's buffer into every other one */
  int rc = crun__shm_run_direct(&o, crun__shm_direct_copy, crun__heap_contains(buf, bytes));
  if (rc != 0) return rc < 0 ? rc : 0;
  o.chunk_elems = c->chunk / o.es;
  o.nchunks = (count + o.chunk_elems - 1) / o.chunk_elems;
  o.copy_in = is_root ? bc_copy_in : NULL;
  o.copy_out = is_root ? NULL : bc_copy_out;
  o.out_wait_ctr = SHM_CTR_IN;
  o.out_wait_who = root;
  return crun__shm_run_pipeline(&o);
}

int crun__shm_barrier(crun__shm_comm_t *c, double timeout) {
  CRUN_CHECK(crun__shm_begin(c, SHM_BARRIER, CRUN_UINT8, 0, -1, 0, 1, 1, timeout));
  shm_op_t o = {.c = c, .kind = SHM_BARRIER, .dt = CRUN_UINT8, .es = 1};
  return crun__shm_run_small(&o);
}
