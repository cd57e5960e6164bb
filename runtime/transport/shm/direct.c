/* direct.c — the zero-copy path for large collectives.
 *
 * When crun-lua started the ranks, large tensors live in the node's shared
 * tensor heap (core/heap.h), mapped at the same address in every worker, so
 * a rank can read its peers' inputs and write their outputs in place. A
 * collective then costs one pass over the data instead of three (copy in,
 * reduce, copy out through the segment's buffers):
 *
 *   all_reduce      rank r reduces its 1/size slice from every rank's input
 *                   and writes the result into every rank's output
 *   reduce          the same, into the root's output only
 *   reduce_scatter  rank r reduces block r of every rank's input into its
 *                   own output (input given as one buffer, or as blocks that
 *                   follow each other in memory)
 *   broadcast       rank r copies its 1/size slice of the root's buffer into
 *                   every other rank's buffer (the root works too)
 *   all_gather      every rank copies every peer's input (gather: the root)
 *
 * Two synchronisations frame the work: ENTER (every rank published its
 * buffers and so will not touch them until the op ends) and DONE (nobody
 * reads or writes them any more). The choice is collective: at attach every
 * rank published its heap id (c->direct: all equal), and each op's
 * description says whether this rank's buffers are in the heap; unless all
 * say yes, every rank takes the bounce path. Slices are reduced by one rank
 * each, in rank order, so results are the same as on the other paths.
 * scatter and all_to_all (and a reduce_scatter whose input blocks are
 * scattered in memory) take lists of blocks, which one published address
 * cannot describe: they stay on the bounce path. */
#include "transport/shm/shm_int.h"

#include <string.h>

#include "core/heap.h"

#define DIRECT_ALIGN 4096   /* slice bounds: reducers never share a page */
#define DIRECT_BLOCK 16384  /* bytes reduced before they are copied out (L1) */

const char *crun__shm_peer_in(crun__shm_comm_t *c, int q) {
  shm_desc_t *d = &c->ctrl[q].ring[c->opseq % SHM_RING];
  return (const char *)(uintptr_t)atomic_load_explicit(&d->in, memory_order_relaxed);
}

char *crun__shm_peer_out(crun__shm_comm_t *c, int q) {
  shm_desc_t *d = &c->ctrl[q].ring[c->opseq % SHM_RING];
  return (char *)(uintptr_t)atomic_load_explicit(&d->out, memory_order_relaxed);
}

/* Publishes this rank's buffers (mine_ok: peers may use them), meets every
 * rank at ENTER and, when every rank said so, runs `work` on the peers'
 * buffers and meets every rank at DONE: returns 1. Returns 0 when the op must
 * take the bounce path, < 0 on failure. */
int crun__shm_run_direct(shm_op_t *o, int (*work)(shm_op_t *o), int mine_ok) {
  crun__shm_comm_t *c = o->c;
  if (!c->direct) return 0;
  shm_desc_t *d = &c->ctrl[c->rank].ring[c->opseq % SHM_RING];
  atomic_store_explicit(&d->in, (uint64_t)(uintptr_t)o->in, memory_order_relaxed);
  atomic_store_explicit(&d->out, (uint64_t)(uintptr_t)o->out, memory_order_relaxed);
  atomic_store_explicit(&d->direct_ok, (uint64_t)mine_ok, memory_order_relaxed);
  crun__shm_post(c, &c->ctrl[c->rank].ctr[SHM_CTR_ENTER], c->opseq);
  CRUN_CHECK(crun__shm_wait(c, SHM_CTR_ENTER, -1, c->opseq));
  CRUN_CHECK(crun__shm_check_ring(c));
  for (int q = 0; q < c->size; q++)
    if (!atomic_load_explicit(&c->ctrl[q].ring[c->opseq % SHM_RING].direct_ok,
                              memory_order_relaxed))
      return 0;
  int rc = work(o);
  if (rc < 0) return crun__shm_fail_last(c, rc);
  c->direct_ops++;
  crun__shm_post(c, &c->ctrl[c->rank].ctr[SHM_CTR_DONE], c->opseq);
  CRUN_CHECK(crun__shm_wait(c, SHM_CTR_DONE, -1, c->opseq));
  return 1;
}

/* Reduces elements [lo, hi) of block `blk` of every rank's input into every
 * rank's output (all_reduce), the root's (reduce) or this rank's own
 * (reduce_scatter: block = this rank). */
static int reduce_range(shm_op_t *o, size_t blk, size_t lo, size_t hi) {
  crun__shm_comm_t *c = o->c;
  int n = c->size, nd = 0;
  const void *srcs[CRUN_SHM_MAX_RANKS];
  char *dsts[CRUN_SHM_MAX_RANKS];
  for (int q = 0; q < n; q++) srcs[q] = crun__shm_peer_in(c, q) + (blk * o->count + lo) * o->es;
  if (o->kind == SHM_ALLREDUCE)
    for (int q = 0; q < n; q++) dsts[nd++] = crun__shm_peer_out(c, q) + lo * o->es;
  else if (o->kind == SHM_REDUCE)
    dsts[nd++] = crun__shm_peer_out(c, o->root) + lo * o->es;
  else
    dsts[nd++] = o->out + lo * o->es;
  int avg = o->op == CRUN_OP_AVG;
  if (o->dt == CRUN_FLOAT32 && (o->op == CRUN_OP_SUM || avg)) {
    crun__shm_sum_f32_multi((float *const *)(void *)dsts, nd, (const float *const *)srcs, n,
                            hi - lo, avg);
    return 0;
  }
  /* other dtypes and ops: reduce an L1-sized block into the first
   * destination, then copy it to the others while it is hot */
  size_t step = DIRECT_BLOCK / o->es;
  for (size_t a = 0; a < hi - lo; a += step) {
    size_t m = hi - lo - a < step ? hi - lo - a : step;
    const void *s[CRUN_SHM_MAX_RANKS];
    for (int q = 0; q < n; q++) s[q] = (const char *)srcs[q] + a * o->es;
    char *d0 = dsts[0] + a * o->es;
    CRUN_CHECK(crun_reduce_n(o->dt, o->op, d0, s, n, m));
    if (avg) CRUN_CHECK(crun_scale_div(o->dt, d0, m, n));
    for (int k = 1; k < nd; k++) memcpy(dsts[k] + a * o->es, d0, m * o->es);
  }
  return 0;
}

int crun__shm_direct_reduce(shm_op_t *o) {
  crun__shm_comm_t *c = o->c;
  if (o->kind == SHM_REDUCE_SCATTER) return reduce_range(o, (size_t)c->rank, 0, o->count);
  size_t lo, hi;
  crun__shm_slice(o->count, c->size, DIRECT_ALIGN / o->es, c->rank, &lo, &hi);
  return hi > lo ? reduce_range(o, 0, lo, hi) : 0;
}

/* broadcast: this rank's slice of the root's buffer into every other
 * rank's, a block at a time (read once, written size-1 times while it is in
 * cache); all_gather/gather: the receiving ranks copy every rank's input into
 * their blocks of out. */
int crun__shm_direct_copy(shm_op_t *o) {
  crun__shm_comm_t *c = o->c;
  size_t bytes = o->count * o->es;
  if (o->kind == SHM_BROADCAST) {
    size_t lo, hi;
    crun__shm_slice(bytes, c->size, DIRECT_ALIGN, c->rank, &lo, &hi);
    const char *src = crun__shm_peer_out(c, o->root);
    for (size_t a = lo; a < hi; a += DIRECT_BLOCK * 4) {
      size_t m = hi - a < DIRECT_BLOCK * 4 ? hi - a : DIRECT_BLOCK * 4;
      for (int q = 0; q < c->size; q++)
        if (q != o->root) memcpy(crun__shm_peer_out(c, q) + a, src + a, m);
    }
    return 0;
  }
  if (o->kind == SHM_GATHER && c->rank != o->root) return 0;
  for (int q = 0; q < c->size; q++) {
    char *dst = crun__shm_out_blk(o, q);
    const char *src = crun__shm_peer_in(c, q);
    if (dst != src) memmove(dst, src, bytes);
  }
  return 0;
}
