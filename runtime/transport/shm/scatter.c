/* scatter.c — scatter(root) on the shared segment: the root copies the
 * blocks of the other ranks into its slot (pipelined: a piece of every block
 * per chunk); every other rank copies its block out of the root's slot. */
#include "transport/shm/shm_int.h"

#include <string.h>

static size_t blk(shm_op_t *o) { return o->count * o->es; }

static void sc_fill(shm_op_t *o, char *mine) {
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank) memcpy(mine + q * blk(o), crun__shm_in_blk(o, q), blk(o));
}

static int sc_finish(shm_op_t *o, int b) {
  crun__shm_comm_t *c = o->c;
  if (c->rank == o->root) {
    if (o->out != crun__shm_in_blk(o, c->rank)) memmove(o->out, crun__shm_in_blk(o, c->rank), blk(o));
  } else {
    memcpy(o->out, crun__shm_small_data(c, o->root, b) + c->rank * blk(o), blk(o));
  }
  return 0;
}

static void sc_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base, n = crun__shm_chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank) memcpy(mine + q * piece, crun__shm_in_blk(o, q) + base * o->es, n * o->es);
  const char *own = crun__shm_in_blk(o, o->c->rank) + base * o->es;
  if (o->out + base * o->es != own) memmove(o->out + base * o->es, own, n * o->es);
}

static int sc_copy_out(shm_op_t *o, size_t t, int b) {
  size_t base, n = crun__shm_chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
  memcpy(o->out + base * o->es, crun__shm_buf(o->c, o->root, b) + o->c->rank * piece, n * o->es);
  return 0;
}

int crun__shm_scatter_v(crun__shm_comm_t *c, void *out, const void *const *ins, size_t count,
                        crun_dtype_t dt, int root, double timeout) {
  int is_root = c && c->rank == root;
  int ok = out && (!is_root || crun__shm_blocks_ok(c, ins));
  CRUN_CHECK(crun__shm_begin(c, SHM_SCATTER, dt, 0, root, count, c ? (size_t)c->size : 1, ok,
                             timeout));
  shm_op_t o = {.c = c, .kind = SHM_SCATTER, .dt = dt, .root = root, .count = count};
  o.es = crun_dtype_size(dt);
  o.ins = is_root ? (const char *const *)ins : NULL;
  o.out = out;
  if (count * o.es * (size_t)c->size <= c->small_bytes) {
    o.small_len = is_root ? count * o.es * (size_t)c->size : 0;
    o.fill = is_root ? sc_fill : NULL;
    o.finish = count ? sc_finish : NULL;
    return crun__shm_run_small(&o);
  }
  o.chunk_elems = (c->chunk / (size_t)c->size) / SHM_LINE * SHM_LINE / o.es;
  o.nchunks = (count + o.chunk_elems - 1) / o.chunk_elems;
  o.copy_in = is_root ? sc_copy_in : NULL;
  o.copy_out = is_root ? NULL : sc_copy_out;
  o.out_wait_ctr = SHM_CTR_IN;
  o.out_wait_who = root;
  return crun__shm_run_pipeline(&o);
}
