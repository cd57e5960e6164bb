/* alltoall.c — all_to_all on the shared segment: every rank copies the
 * blocks meant for its peers into its slot (pipelined: a piece of every
 * block per chunk), then takes its block from every peer's slot. In place is
 * safe: a piece of out is written only after that piece of in was copied. */
#include "transport/shm/shm_int.h"

#include <stdint.h>
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

static void a2a_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base, n = crun__shm_chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank)
      memcpy(mine + q * piece, o->in + ((size_t)q * o->count + base) * o->es, n * o->es);
}

static int a2a_copy_out(shm_op_t *o, size_t t, int b) {
  crun__shm_comm_t *c = o->c;
  size_t base, n = crun__shm_chunk_len(o, t, &base), piece = o->chunk_elems * o->es;
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

/* ---------------------------------------------------------------- all_to_all_v
 * Blocks of any length: a one-shot exchange of every rank's in_counts first
 * (it checks that each rank expects what its peers send, and finds the
 * longest block M anywhere), then the blocks move as above, every block of a
 * rank's slot M elements long. */

static void cnt_fill(shm_op_t *o, char *mine) {
  for (int q = 0; q < o->c->size; q++) {
    uint64_t v = o->in_counts[q];
    memcpy(mine + (size_t)q * 8, &v, 8);
  }
}

static uint64_t peer_count(crun__shm_comm_t *c, int q, int j, int b) {
  uint64_t v;
  memcpy(&v, crun__shm_small_data(c, q, b) + (size_t)j * 8, 8);
  return v;
}

/* Checks out_counts against what every peer sends here; sets o->count = M. */
static int cnt_finish(shm_op_t *o, int b) {
  crun__shm_comm_t *c = o->c;
  uint64_t m = 0;
  for (int q = 0; q < c->size; q++) {
    uint64_t sends = q == c->rank ? o->in_counts[q] : peer_count(c, q, c->rank, b);
    if (sends != o->out_counts[q])
      return crun_error(CRUN_EMISMATCH, "shm all_to_all #%llu on %s: %s sends %llu "
                        "elements but this rank expects %zu", (unsigned long long)c->label,
                        SHM_WHO(c, c->rank), SHM_WHO(c, q), (unsigned long long)sends, o->out_counts[q]);
    for (int j = 0; j < c->size; j++) {
      uint64_t v = q == c->rank ? o->in_counts[j] : peer_count(c, q, j, b);
      if (v > m) m = v;
    }
  }
  o->count = (size_t)m;
  return 0;
}

/* Elements of a block of n that fall in [base, base + len). */
static size_t part(size_t n, size_t base, size_t len) {
  return n <= base ? 0 : n - base < len ? n - base : len;
}

static void v_fill(shm_op_t *o, char *mine) {
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank) memcpy(mine + q * blk(o), o->ins[q], o->in_counts[q] * o->es);
}

static void v_own(shm_op_t *o, size_t base, size_t len) {
  int r = o->c->rank;
  size_t n = part(o->in_counts[r], base, len);
  if (n && o->outs[r] != o->ins[r])
    memmove(o->outs[r] + base * o->es, o->ins[r] + base * o->es, n * o->es);
}

static int v_finish(shm_op_t *o, int b) {
  crun__shm_comm_t *c = o->c;
  for (int q = 0; q < c->size; q++)
    if (q != c->rank)
      memcpy(o->outs[q], crun__shm_small_data(c, q, b) + c->rank * blk(o), o->out_counts[q] * o->es);
  v_own(o, 0, o->count);
  return 0;
}

static void v_copy_in(shm_op_t *o, size_t t, char *mine) {
  size_t base = t * o->chunk_elems, piece = o->chunk_elems * o->es;
  for (int q = 0; q < o->c->size; q++)
    if (q != o->c->rank)
      memcpy(mine + q * piece, o->ins[q] + base * o->es,
             part(o->in_counts[q], base, o->chunk_elems) * o->es);
}

static int v_copy_out(shm_op_t *o, size_t t, int b) {
  crun__shm_comm_t *c = o->c;
  size_t base = t * o->chunk_elems, piece = o->chunk_elems * o->es;
  for (int q = 0; q < c->size; q++)
    if (q != c->rank)
      memcpy(o->outs[q] + base * o->es, crun__shm_buf(c, q, b) + c->rank * piece,
             part(o->out_counts[q], base, o->chunk_elems) * o->es);
  v_own(o, base, o->chunk_elems);
  return 0;
}

static int lists_ok(crun__shm_comm_t *c, void *const *outs, const size_t *out_counts,
                    const void *const *ins, const size_t *in_counts) {
  if (!c || !outs || !ins || !out_counts || !in_counts) return 0;
  for (int q = 0; q < c->size; q++) {
    if ((out_counts[q] && !outs[q]) || (in_counts[q] && !ins[q])) return 0;
    if (out_counts[q] > SIZE_MAX / 16 / (size_t)c->size || in_counts[q] > SIZE_MAX / 16 / (size_t)c->size)
      return 0;
  }
  return 1;
}

int crun__shm_all_to_all_v(crun__shm_comm_t *c, void *const *outs, const size_t *out_counts,
                           const void *const *ins, const size_t *in_counts, crun_dtype_t dt,
                           double timeout) {
  int ok = lists_ok(c, outs, out_counts, ins, in_counts);
  CRUN_CHECK(crun__shm_begin(c, SHM_ALLTOALLV, dt, 0, -1, 1, 1, ok, timeout));
  shm_op_t o = {.c = c, .kind = SHM_ALLTOALLV, .dt = dt, .in_counts = in_counts,
                .out_counts = out_counts, .ins = (const char *const *)ins,
                .outs = (char *const *)outs};
  o.es = crun_dtype_size(dt);
  o.small_len = 8 * (size_t)c->size;
  o.fill = cnt_fill;
  o.finish = cnt_finish;
  CRUN_CHECK(crun__shm_run_small(&o));
  if (o.count * o.es * (size_t)c->size <= c->small_bytes) {
    o.small_len = o.count * o.es * (size_t)c->size;
    o.fill = v_fill;
    o.finish = v_finish;
    return crun__shm_run_small(&o);
  }
  o.chunk_elems = (c->chunk / (size_t)c->size) / SHM_LINE * SHM_LINE / o.es;
  o.nchunks = (o.count + o.chunk_elems - 1) / o.chunk_elems;
  o.copy_in = v_copy_in;
  o.copy_out = v_copy_out;
  o.out_wait_ctr = SHM_CTR_IN;
  o.out_wait_who = -1;
  return crun__shm_run_pipeline(&o);
}
