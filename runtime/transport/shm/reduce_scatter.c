/* reduce_scatter.c — reduce_scatter on the shared segment: every rank copies
 * the blocks of its peers into its slot (pipelined: a piece of every block
 * per chunk), then reduces its own block from its private input and the
 * peers' slots straight into out. */
#include "transport/shm/shm_int.h"

#include <string.h>

#include "core/heap.h"

static size_t blk(shm_op_t *o) { return o->count * o->es; }

static void rs_fill(shm_op_t *o, char *mine) {
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank) memcpy(mine + q * blk(o), crun__shm_in_blk(o, q), blk(o));
}

static int reduce_block(shm_op_t *o, void *dst, const void *const *srcs, size_t n) {
  CRUN_CHECK(crun_reduce_n(o->dt, o->op, dst, srcs, o->c->size, n));
  if (o->op == CRUN_OP_AVG) CRUN_CHECK(crun_scale_div(o->dt, dst, n, o->c->size));
  return 0;
}

static int rs_finish(shm_op_t *o, int b) {
  crun__shm_comm_t *c = o->c;
  const void *srcs[CRUN_SHM_MAX_RANKS];
  for (int q = 0; q < c->size; q++)
    srcs[q] = q == c->rank ? crun__shm_in_blk(o, q)
                           : crun__shm_small_data(c, q, b) + c->rank * blk(o);
  return reduce_block(o, o->out, srcs, o->count);
}

static void rs_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base, n = crun__shm_chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank)
      memcpy(mine + q * piece, crun__shm_in_blk(o, q) + base * o->es, n * o->es);
}

static int rs_reduce(shm_op_t *o, size_t t, int b) {
  crun__shm_comm_t *c = o->c;
  size_t base, n = crun__shm_chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
  const void *srcs[CRUN_SHM_MAX_RANKS];
  for (int q = 0; q < c->size; q++)
    srcs[q] = q == c->rank ? crun__shm_in_blk(o, q) + base * o->es
                           : (const char *)crun__shm_buf(c, q, b) + c->rank * piece;
  return reduce_block(o, o->out + base * o->es, srcs, n);
}

/* Whether the n blocks of `bytes` each follow one another in memory (as
 * dist.reduce_scatter_tensor passes them): then they are one input. */
static int consecutive(const void *const *ins, int n, size_t bytes) {
  for (int q = 1; q < n; q++)
    if ((const char *)ins[q] != (const char *)ins[0] + (size_t)q * bytes) return 0;
  return 1;
}

static int reduce_scatter(crun__shm_comm_t *c, void *out, const void *in,
                          const void *const *ins, size_t count, crun_dtype_t dt,
                          crun_reduce_op_t op, int bufs_ok, double timeout) {
  CRUN_CHECK(crun__shm_begin(c, SHM_REDUCE_SCATTER, dt, op, -1, count,
                             c ? (size_t)c->size : 1, bufs_ok, timeout));
  shm_op_t o = {.c = c, .kind = SHM_REDUCE_SCATTER, .dt = dt, .op = op, .count = count};
  o.es = crun_dtype_size(dt);
  if (ins && consecutive(ins, c->size, count * o.es)) in = ins[0], ins = NULL;
  o.in = in;
  o.ins = (const char *const *)ins;
  o.out = out;
  if (count * o.es * (size_t)c->size <= c->small_bytes) {
    o.small_len = count * o.es * (size_t)c->size;
    o.fill = rs_fill;
    o.finish = count ? rs_finish : NULL;
    return crun__shm_run_small(&o);
  }
  /* peers read this rank's whole input */
  int rc = crun__shm_run_direct(&o, crun__shm_direct_reduce,
                                in && crun__heap_contains(in, count * o.es * (size_t)c->size));
  if (rc != 0) return rc < 0 ? rc : 0;
  o.chunk_elems = (c->chunk / (size_t)c->size) / SHM_LINE * SHM_LINE / o.es;
  o.nchunks = (count + o.chunk_elems - 1) / o.chunk_elems;
  o.has_reduce = 1;
  o.copy_in = rs_copy_in;
  o.reduce = rs_reduce;
  return crun__shm_run_pipeline(&o);
}

int crun__shm_reduce_scatter(crun__shm_comm_t *c, void *out, const void *in, size_t count,
                             crun_dtype_t dt, crun_reduce_op_t op, double timeout) {
  return reduce_scatter(c, out, in, NULL, count, dt, op, out && in, timeout);
}

int crun__shm_reduce_scatter_v(crun__shm_comm_t *c, void *out, const void *const *ins,
                               size_t count, crun_dtype_t dt, crun_reduce_op_t op,
                               double timeout) {
  int ok = out && crun__shm_blocks_ok(c, ins);
  return reduce_scatter(c, out, NULL, ins, count, dt, op, ok, timeout);
}
