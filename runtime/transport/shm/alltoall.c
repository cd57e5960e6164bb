/* alltoall.c — all_to_all on the shared segment: every rank copies the
 * blocks meant for its peers into its slot (pipelined: a piece of every
 * block per chunk), then takes its block from every peer's slot. In place is
 * safe: a piece of out is written only after that piece of in was copied. */
#include "transport/shm/shm_int.h"

#include <string.h>

static size_t blk(shm_op_t *o) { return o->count * o->es; }

static void a2a_fill(shm_op_t *o, char *mine) {
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank) memcpy(mine + q * blk(o), o->in + q * blk(o), blk(o));
}

/* Copies this rank's own block piece [base, base+n) from in to out. */
static void own_piece(shm_op_t *o, size_t base, size_t n) {
  size_t off = ((size_t)o->c->rank * o->count + base) * o->es;
  if (o->out + off != o->in + off) memmove(o->out + off, o->in + off, n * o->es);
}

static int a2a_finish(shm_op_t *o, int b) {
  crun__shm_comm_t *c = o->c;
  for (int q = 0; q < c->size; q++)
    if (q != c->rank)
      memcpy(o->out + q * blk(o), crun__shm_small_data(c, q, b) + c->rank * blk(o), blk(o));
  own_piece(o, 0, o->count);
  return 0;
}

static size_t chunk_len(shm_op_t *o, size_t t, size_t *base) {
  *base = t * o->chunk_elems;
  size_t left = o->count - *base;
  return left < o->chunk_elems ? left : o->chunk_elems;
}

static void a2a_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base, n = chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank)
      memcpy(mine + q * piece, o->in + ((size_t)q * o->count + base) * o->es, n * o->es);
}

static int a2a_copy_out(shm_op_t *o, size_t t, int b) {
  crun__shm_comm_t *c = o->c;
  size_t base, n = chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
  for (int q = 0; q < c->size; q++)
    if (q != c->rank)
      memcpy(o->out + ((size_t)q * o->count + base) * o->es,
             crun__shm_buf(c, q, b) + c->rank * piece, n * o->es);
  own_piece(o, base, n);
  return 0;
}

int crun__shm_all_to_all(crun__shm_comm_t *c, void *out, const void *in, size_t count,
                         crun_dtype_t dt, double timeout) {
  CRUN_CHECK(crun__shm_begin(c, SHM_ALLTOALL, dt, 0, -1, count, c ? (size_t)c->size : 1,
                             out && in, timeout));
  shm_op_t o = {.c = c, .kind = SHM_ALLTOALL, .dt = dt, .count = count};
  o.es = crun_dtype_size(dt);
  o.in = in;
  o.out = out;
  if (count * o.es * (size_t)c->size <= c->small_bytes) {
    o.small_len = count * o.es * (size_t)c->size;
    o.fill = a2a_fill;
    o.finish = count ? a2a_finish : NULL;
    return crun__shm_run_small(&o);
  }
  o.chunk_elems = (c->chunk / (size_t)c->size) / SHM_LINE * SHM_LINE / o.es;
  o.nchunks = (count + o.chunk_elems - 1) / o.chunk_elems;
  o.copy_in = a2a_copy_in;
  o.copy_out = a2a_copy_out;
  o.out_wait_ctr = SHM_CTR_IN;
  o.out_wait_who = -1;
  return crun__shm_run_pipeline(&o);
}
