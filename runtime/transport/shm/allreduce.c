/* allreduce.c — all_reduce and reduce(root) on the shared segment.
 * One-shot: every rank copies its input into its slot; each rank (only the
 * root for reduce) reduces the size slots in rank order. Pipelined: each rank
 * copies chunk t (but its own slice) into its buffer, reduces its 1/size
 * slice from its private input and the peers' buffers, then every rank (only
 * the root for reduce) copies the reduced slices out. */
#include "transport/shm/shm_int.h"

#include <stdint.h>
#include <string.h>

#include "core/heap.h"
#include "tensor/dtype_int.h"

/* Bounds of rank q's slice of a chunk of n elements (relative to the chunk). */
static void slice_of(shm_op_t *o, size_t n, int q, size_t *lo, size_t *hi) {
  crun__shm_slice(n, o->c->size, SHM_LINE / o->es, q, lo, hi);
}

static void ar_fill(shm_op_t *o, char *mine) { memcpy(mine, o->in, o->small_len); }

/* reduce's one-shot finish (all_reduce's is small_allreduce) */
static int ar_finish(shm_op_t *o, int b) {
  crun__shm_comm_t *c = o->c;
  if (c->rank != o->root) return 0;
  const void *srcs[CRUN_SHM_MAX_RANKS];
  for (int q = 0; q < c->size; q++)
    srcs[q] = q == c->rank ? (const void *)o->in : crun__shm_small_data(c, q, b);
  CRUN_CHECK(crun_reduce_n(o->dt, o->op, o->out, srcs, c->size, o->count));
  if (o->op == CRUN_OP_AVG) CRUN_CHECK(crun_scale_div(o->dt, o->out, o->count, c->size));
  return 0;
}

static void ar_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base, n = crun__shm_chunk_len(o, t, &base), lo, hi;
  slice_of(o, n, o->c->rank, &lo, &hi);
  const char *src = o->in + base * o->es;
  memcpy(mine, src, lo * o->es);
  memcpy(mine + hi * o->es, src + hi * o->es, (n - hi) * o->es);
}

static int ar_reduce(shm_op_t *o, size_t t, int b) {
  crun__shm_comm_t *c = o->c;
  size_t base, n = crun__shm_chunk_len(o, t, &base), lo, hi;
  slice_of(o, n, c->rank, &lo, &hi);
  if (hi == lo) return 0;
  const void *srcs[CRUN_SHM_MAX_RANKS];
  for (int q = 0; q < c->size; q++)
    srcs[q] = q == c->rank ? o->in + (base + lo) * o->es
                           : (const char *)crun__shm_buf(c, q, b) + lo * o->es;
  char *dst = crun__shm_buf(c, c->rank, b) + lo * o->es;
  if (o->fused) {
    crun__shm_sum_f32_dual((float *)(void *)(o->out + (base + lo) * o->es), (float *)(void *)dst,
                           (const float *const *)srcs, c->size, hi - lo, o->op == CRUN_OP_AVG);
    return 0;
  }
  CRUN_CHECK(crun_reduce_n(o->dt, o->op, dst, srcs, c->size, hi - lo));
  if (o->op == CRUN_OP_AVG) CRUN_CHECK(crun_scale_div(o->dt, dst, hi - lo, c->size));
  return 0;
}

static int ar_copy_out(shm_op_t *o, size_t t, int b) {
  crun__shm_comm_t *c = o->c;
  size_t base, n = crun__shm_chunk_len(o, t, &base), lo, hi;
  for (int q = 0; q < c->size; q++) {
    if (q == c->rank && o->fused) continue; /* written by the fused reduce */
    slice_of(o, n, q, &lo, &hi);
    memcpy(o->out + (base + lo) * o->es, crun__shm_buf(c, q, b) + lo * o->es, (hi - lo) * o->es);
  }
  return 0;
}

/* A one-shot all_reduce of count elements (bytes, at most the slot's size)
 * from in into out: crun__shm_run_small's steps without its op record and
 * indirect calls, the path of every small all_reduce. */
static int small_allreduce(crun__shm_comm_t *c, const void *in, void *out, size_t count, crun_dtype_t dt,
                           crun_reduce_op_t op, size_t bytes) {
  int b = crun__shm_small_open(c);
  memcpy(crun__shm_small_data(c, c->rank, b), in, bytes);
  CRUN_CHECK(crun__shm_small_exchange(c, b));
  const void *srcs[CRUN_SHM_MAX_RANKS];
  for (int q = 0; q < c->size; q++) srcs[q] = q == c->rank ? in : crun__shm_small_data(c, q, b);
  int rc = crun_reduce_n(dt, op, out, srcs, c->size, count);
  if (rc == 0 && op == CRUN_OP_AVG) rc = crun_scale_div(dt, out, count, c->size);
  if (rc < 0) return crun__shm_fail_last(c, rc);
  crun__shm_small_close(c, b);
  return 0;
}

/* Runs all_reduce (root < 0) or reduce(root) once begin() accepted it. */
static int run(crun__shm_comm_t *c, shm_kind_t kind, void *buf, const void *sendbuf,
               size_t count, crun_dtype_t dt, crun_reduce_op_t op, int root) {
  size_t es = crun__dtype_size(dt), bytes = count * es;
  if (kind == SHM_ALLREDUCE && count && bytes <= c->small_bytes)
    return small_allreduce(c, sendbuf ? sendbuf : buf, buf, count, dt, op, bytes);
  shm_op_t o = {.c = c, .kind = kind, .dt = dt, .op = op, .root = root, .count = count};
  o.es = es;
  o.in = sendbuf ? sendbuf : buf;
  o.out = buf;
  if (bytes <= c->small_bytes) {
    o.small_len = bytes;
    o.fill = ar_fill;
    o.finish = count ? ar_finish : NULL;
    return crun__shm_run_small(&o);
  }
  /* peers read every input and write the outputs that get the result */
  int rc = crun__shm_run_direct(&o, crun__shm_direct_reduce,
                                crun__heap_contains(o.in, bytes) &&
                                    ((kind == SHM_REDUCE && c->rank != root) ||
                                     crun__heap_contains(o.out, bytes)));
  if (rc != 0) return rc < 0 ? rc : 0;
  o.chunk_elems = c->chunk / o.es;
  o.nchunks = (count + o.chunk_elems - 1) / o.chunk_elems;
  o.has_reduce = 1;
  o.copy_in = ar_copy_in;
  o.reduce = ar_reduce;
  o.copy_out = kind == SHM_ALLREDUCE || c->rank == root ? ar_copy_out : NULL;
  /* float32 sum/avg: the reduce writes this rank's slice to out as well */
  o.fused = o.copy_out && dt == CRUN_FLOAT32 && (op == CRUN_OP_SUM || op == CRUN_OP_AVG) &&
            !crun_env_int("CRUN_SHM_NO_FUSED", 0);
  o.out_wait_ctr = SHM_CTR_RED;
  o.out_wait_who = -1;
  return crun__shm_run_pipeline(&o);
}

int crun__shm_allreduce(crun__shm_comm_t *c, void *buf, const void *sendbuf, size_t count,
                        crun_dtype_t dt, crun_reduce_op_t op, double timeout) {
  CRUN_CHECK(crun__shm_begin(c, SHM_ALLREDUCE, dt, op, -1, count, 1, buf != NULL, timeout));
  return run(c, SHM_ALLREDUCE, buf, sendbuf, count, dt, op, -1);
}

int crun__shm_allreduce_call(crun__shm_comm_t *c, void *buf, size_t count, crun_dtype_t dt,
                             crun_reduce_op_t op, uint64_t label, double deadline, double timeout) {
  if (c->broken)
    return crun_error(CRUN_ESTATE, "shm all_reduce on %s: the communicator is unusable after an "
                      "earlier failure; destroy it", SHM_WHO(c, c->rank));
  if (count > SIZE_MAX / 16) /* what begin's check allows */
    return crun__shm_fail(c, CRUN_EINVAL, "shm all_reduce on %s: count %zu too large", SHM_WHO(c, c->rank), count);
  CRUN_CHECK(crun__shm_start(c, SHM_ALLREDUCE, dt, op, -1, count, label, deadline, timeout));
  size_t bytes = count * crun__dtype_size(dt);
  if (count && bytes <= c->small_bytes) /* run()'s first test, without its frame (~60 instructions) */
    return small_allreduce(c, buf, buf, count, dt, op, bytes);
  return run(c, SHM_ALLREDUCE, buf, NULL, count, dt, op, -1);
}

int crun__shm_reduce(crun__shm_comm_t *c, void *buf, const void *sendbuf, size_t count,
                     crun_dtype_t dt, crun_reduce_op_t op, int root, double timeout) {
  CRUN_CHECK(crun__shm_begin(c, SHM_REDUCE, dt, op, root, count, 1, buf != NULL, timeout));
  return run(c, SHM_REDUCE, buf, sendbuf, count, dt, op, root);
}
