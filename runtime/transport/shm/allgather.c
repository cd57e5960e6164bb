/* allgather.c — all_gather and gather(root) on the shared segment: every
 * rank copies its input into its slot (or chunk by chunk into its buffers);
 * every rank (gather: the root only) copies every peer's out after the
 * synchronisation. In place when in is this rank's block of out. */
#include "transport/shm/shm_int.h"

#include <stdint.h>
#include <string.h>

#include "core/heap.h"

static void ag_fill(shm_op_t *o, char *mine) { memcpy(mine, o->in, o->small_len); }

/* Copies this rank's own n elements from base into its block of out. */
static void own_block(shm_op_t *o, size_t base, size_t n) {
  char *dst = crun__shm_out_blk(o, o->c->rank) + base * o->es;
  const char *src = o->in + base * o->es;
  if (dst != src) memmove(dst, src, n * o->es);
}

static int ag_finish(shm_op_t *o, int b) {
  crun__shm_comm_t *c = o->c;
  size_t bytes = o->count * o->es;
  for (int q = 0; q < c->size; q++)
    if (q != c->rank) memcpy(crun__shm_out_blk(o, q), crun__shm_small_data(c, q, b), bytes);
  own_block(o, 0, o->count);
  return 0;
}

static void ag_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base, n = crun__shm_chunk_len(o, t, &base);
  memcpy(mine, o->in + base * o->es, n * o->es);
}

static int ag_copy_out(shm_op_t *o, size_t t, int b) {
  crun__shm_comm_t *c = o->c;
  size_t base, n = crun__shm_chunk_len(o, t, &base);
  for (int q = 0; q < c->size; q++)
    if (q != c->rank)
      memcpy(crun__shm_out_blk(o, q) + base * o->es, crun__shm_buf(c, q, b), n * o->es);
  own_block(o, base, n);
  return 0;
}

/* Runs all_gather (root < 0) or gather(root). */
static int all_gather(crun__shm_comm_t *c, void *out, void *const *outs, const void *in,
                      size_t count, crun_dtype_t dt, int root, int bufs_ok, double timeout) {
  shm_kind_t kind = root < 0 ? SHM_ALLGATHER : SHM_GATHER;
  CRUN_CHECK(crun__shm_begin(c, kind, dt, 0, root, count, c ? (size_t)c->size : 1, bufs_ok,
                             timeout));
  int takes = root < 0 || c->rank == root;
  shm_op_t o = {.c = c, .kind = kind, .dt = dt, .root = root, .count = count};
  o.es = crun_dtype_size(dt);
  o.in = in;
  o.out = out;
  o.outs = (char *const *)outs;
  size_t bytes = count * o.es;
  if (bytes <= c->small_bytes) {
    o.small_len = bytes;
    o.fill = ag_fill;
    o.finish = count && takes ? ag_finish : NULL;
    return crun__shm_run_small(&o);
  }
  /* peers read only this rank's input */
  int rc = crun__shm_run_direct(&o, crun__shm_direct_copy, crun__heap_contains(in, bytes));
  if (rc != 0) return rc < 0 ? rc : 0;
  o.chunk_elems = c->chunk / o.es;
  o.nchunks = (count + o.chunk_elems - 1) / o.chunk_elems;
  o.copy_in = ag_copy_in;
  o.copy_out = takes ? ag_copy_out : NULL;
  o.out_wait_ctr = SHM_CTR_IN;
  o.out_wait_who = -1;
  return crun__shm_run_pipeline(&o);
}

int crun__shm_all_gather(crun__shm_comm_t *c, void *out, const void *in, size_t count,
                         crun_dtype_t dt, double timeout) {
  return all_gather(c, out, NULL, in, count, dt, -1, out && in, timeout);
}

/* Returns non-zero when list and its size entries are non-NULL. */
int crun__shm_blocks_ok(const crun__shm_comm_t *c, const void *const *list) {
  if (!c || !list) return 0;
  for (int q = 0; q < c->size; q++)
    if (!list[q]) return 0;
  return 1;
}

int crun__shm_all_gather_v(crun__shm_comm_t *c, void *const *outs, const void *in,
                           size_t count, crun_dtype_t dt, double timeout) {
  int ok = in && crun__shm_blocks_ok(c, (const void *const *)outs);
  return all_gather(c, NULL, outs, in, count, dt, -1, ok, timeout);
}

int crun__shm_gather_v(crun__shm_comm_t *c, void *const *outs, const void *in, size_t count,
                       crun_dtype_t dt, int root, double timeout) {
  int ok = in && (!c || c->rank != root || crun__shm_blocks_ok(c, (const void *const *)outs));
  return all_gather(c, NULL, outs, in, count, dt, root < 0 ? INT32_MAX : root, ok, timeout);
}
