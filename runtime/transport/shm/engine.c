/* engine.c — what every collective shares: argument checks and the op
 * description, and the one-shot path. The chunked path is in pipeline.c. */
#include "core/trace_int.h"
#include "transport/shm/shm_int.h"

#include <stdint.h>
#include <string.h>

/* Splits n items into `parts` nearly equal slices whose bounds are multiples
 * of align (except the end); slice i is [*lo, *hi), possibly empty. */
void crun__shm_slice(size_t n, int parts, size_t align, int i, size_t *lo, size_t *hi) {
  size_t per = (n + (size_t)parts - 1) / (size_t)parts;
  per = (per + align - 1) / align * align;
  size_t a = per * (size_t)i, b = a + per;
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
}

static int check_args(crun__shm_comm_t *c, shm_kind_t kind, crun_dtype_t dt,
                      crun_reduce_op_t op, int root, size_t count, size_t nblocks,
                      int bufs_ok) {
#define name crun__shm_kind_name(kind) /* only an error needs it */
  if (!c) return crun_error(CRUN_EINVAL, "shm %s: communicator is NULL", name);
  if (c->broken)
    return crun_error(CRUN_ESTATE, "shm %s on %s: the communicator is unusable after an "
                      "earlier failure; destroy it", name, SHM_WHO(c, c->rank));
  if ((unsigned)dt >= CRUN_DTYPE_COUNT)
    return crun_error(CRUN_EINVAL, "shm %s on %s: unknown dtype %d", name, SHM_WHO(c, c->rank), dt);
  if (kind == SHM_ALLREDUCE || kind == SHM_REDUCE || kind == SHM_REDUCE_SCATTER) {
    if ((unsigned)op >= CRUN_OP_COUNT)
      return crun_error(CRUN_EINVAL, "shm %s on %s: unknown reduce op %d", name, SHM_WHO(c, c->rank),
                        op);
    int rc = crun_reduce_op_check(dt, op);
    if (rc < 0)
      return crun_error(rc, "shm %s on %s: %s", name, SHM_WHO(c, c->rank),
                        crun_last_error() + strlen(crun_err_name(rc)) + 2);
  }
  if ((kind == SHM_REDUCE || kind == SHM_BROADCAST || kind == SHM_GATHER ||
       kind == SHM_SCATTER) && (root < 0 || root >= c->size))
    return crun_error(CRUN_EINVAL, "shm %s on %s: root %d out of range 0..%d", name,
                      SHM_WHO(c, c->rank), root, c->size - 1);
  if (count > 0 && !bufs_ok)
    return crun_error(CRUN_EINVAL, "shm %s on %s: buffer is NULL for count %zu", name,
                      SHM_WHO(c, c->rank), count);
  if (count > SIZE_MAX / 16 / nblocks)
    return crun_error(CRUN_EINVAL, "shm %s on %s: count %zu too large", name, SHM_WHO(c, c->rank),
                      count);
  return 0;
#undef name
}

void crun__shm_comm_label(crun__shm_comm_t *c, uint64_t seq) {
  if (c) c->next_label = seq;
}

void crun__shm_comm_deadline(crun__shm_comm_t *c, double deadline, double timeout) {
  if (c) c->next_deadline = deadline, c->next_timeout = timeout;
}

/* Starts op number opseq+1 (labelled `label`, 0: opseq+1; due by deadline,
 * 0: timeout from now, or the communicator's timeout when that is 0 too)
 * and publishes its description in this rank's ring. */
int crun__shm_start(crun__shm_comm_t *c, shm_kind_t kind, crun_dtype_t dt, crun_reduce_op_t op,
                    int root, size_t count, uint64_t label, double deadline, double timeout) {
  int uses_op = kind == SHM_ALLREDUCE || kind == SHM_REDUCE || kind == SHM_REDUCE_SCATTER;
  int uses_root = kind == SHM_REDUCE || kind == SHM_BROADCAST || kind == SHM_GATHER ||
                  kind == SHM_SCATTER;
  c->opseq++;
  c->label = label ? label : c->opseq;
  c->kind = kind;
  c->count = count;
  c->sig = (uint64_t)kind | (uint64_t)dt << 8 | (uint64_t)(uses_op ? op : 0) << 16 |
           (uint64_t)(uses_root ? root + 1 : 0) << 24;
  if (deadline > 0) { /* the group's, set when the call started */
    c->op_timeout = timeout;
    c->deadline = deadline;
  } else {
    c->op_timeout = timeout > 0 ? timeout : c->timeout;
    c->deadline = crun__clock_coarse() + c->op_timeout;
  }
  /* A peer aborted the communicator: fail now, even when the peers' data for
   * this op is already there (a late rank must not succeed where they failed). */
  CRUN_CHECK(crun__shm_check_abort(c));
  shm_desc_t *d = &c->ctrl[c->rank].ring[c->opseq % SHM_RING];
  atomic_store_explicit(&d->sig, c->sig, memory_order_relaxed);
  atomic_store_explicit(&d->count, count, memory_order_relaxed);
  atomic_store_explicit(&d->opseq, c->opseq, memory_order_release);
  return 0;
}

/* Checks the arguments, then crun__shm_start with the label and deadline
 * the group set for this op (crun__shm_comm_label, crun__shm_comm_deadline). */
int crun__shm_begin(crun__shm_comm_t *c, shm_kind_t kind, crun_dtype_t dt,
                    crun_reduce_op_t op, int root, size_t count, size_t nblocks,
                    int bufs_ok, double timeout) {
  /* every collective begins here first thing, so the next op's label and
   * deadline are consumed here even when its arguments are refused */
  double next_deadline = c ? c->next_deadline : 0;
  uint64_t next_label = c ? c->next_label : 0;
  if (c) c->next_deadline = 0, c->next_label = 0;
  int rc = check_args(c, kind, dt, op, root, count, nblocks, bufs_ok);
  if (rc < 0) return c && !c->broken ? crun__shm_fail_last(c, rc) : rc;
  return crun__shm_start(c, kind, dt, op, root, count, next_label, next_deadline,
                         next_deadline > 0 ? c->next_timeout : timeout);
}

/* Checks every peer's description of this op in its ring (once every peer
 * posted past the op's start, so it has published it). */
int crun__shm_check_ring(crun__shm_comm_t *c) {
  for (int q = 0; q < c->size; q++) {
    if (q == c->rank) continue;
    shm_desc_t *d = &c->ctrl[q].ring[c->opseq % SHM_RING];
    uint64_t sig = atomic_load_explicit(&d->sig, memory_order_relaxed);
    uint64_t count = atomic_load_explicit(&d->count, memory_order_relaxed);
    if (atomic_load_explicit(&d->opseq, memory_order_acquire) != c->opseq)
      return crun__shm_fail(c, CRUN_EMISMATCH, "shm %s #%llu on %s: %s is on "
                            "another collective", crun__shm_kind_name(c->kind),
                            (unsigned long long)c->label, SHM_WHO(c, c->rank), SHM_WHO(c, q));
    CRUN_CHECK(crun__shm_check_desc(c, q, c->opseq, sig, count));
  }
  return 0;
}

/* Checks that every peer runs the same op as this rank (after a wait that
 * proved they published it in their small slot header). */
static int check_small_descs(crun__shm_comm_t *c, int b) {
  for (int q = 0; q < c->size; q++) {
    if (q == c->rank) continue;
    shm_small_hdr_t *h = crun__shm_small_hdr(c, q, b);
    uint64_t sig = atomic_load_explicit(&h->sig, memory_order_relaxed);
    uint64_t count = atomic_load_explicit(&h->count, memory_order_relaxed);
    CRUN_CHECK(crun__shm_check_desc(c, q, c->opseq, sig, count));
  }
  return 0;
}

/* One-shot path: fill this rank's slot, post, wait for every rank, finish
 * from every slot. Slots alternate between two buffers: a rank can't start op
 * s+2 before every rank posted s+1, i.e. finished reading op s. The steps are
 * crun__shm_small_open (the slot's header), the caller's fill of the slot's
 * data, crun__shm_small_exchange (post, wait, check what the peers run) and
 * crun__shm_small_close; crun__shm_run_small runs them for any collective,
 * allreduce.c without its indirect calls for a group's small all_reduce. */
int crun__shm_small_open(crun__shm_comm_t *c) {
  if (crun__obs_on) crun__obs_oneshot = 1; /* its end may be estimated (core/trace_int.h) */
  uint64_t s = ++c->small_seq;
  int b = (int)(s & 1);
  shm_small_hdr_t *h = crun__shm_small_hdr(c, c->rank, b);
  atomic_store_explicit(&h->opseq, c->opseq, memory_order_relaxed);
  atomic_store_explicit(&h->sig, c->sig, memory_order_relaxed);
  atomic_store_explicit(&h->count, c->count, memory_order_relaxed);
  return b;
}

int crun__shm_small_exchange(crun__shm_comm_t *c, int b) {
  crun__shm_post(c, &crun__shm_small_hdr(c, c->rank, b)->seq, c->small_seq);
  CRUN_CHECK(crun__shm_wait(c, SHM_CTR_SMALL, -1, c->small_seq));
  return check_small_descs(c, b);
}

void crun__shm_small_close(crun__shm_comm_t *c, int b) {
  /* Every peer posted this op, so it has read this rank's other slot (the
   * op before): take that slot's header line for writing now, while the
   * caller is busy elsewhere, rather than at the next op's first store, whose
   * wait for the peers' copies to go was a tenth of a 2-rank 8-byte op. */
  __builtin_prefetch(crun__shm_small_hdr(c, c->rank, b ^ 1), 1, 3);
}

int crun__shm_run_small(shm_op_t *o) {
  crun__shm_comm_t *c = o->c;
  int b = crun__shm_small_open(c);
  if (o->fill && o->small_len) o->fill(o, crun__shm_small_data(c, c->rank, b));
  CRUN_CHECK(crun__shm_small_exchange(c, b));
  if (o->finish) {
    int rc = o->finish(o, b);
    if (rc < 0) return crun__shm_fail_last(c, rc);
  }
  crun__shm_small_close(c, b);
  return 0;
}
