/* pipeline.c — the chunked path every large collective runs on.
 *
 * A chunk goes through three stages on each rank: IN (copy this rank's part
 * into its buffer g % nbuf, post IN=g), RED (optional: once every rank posted
 * IN=g, reduce this rank's slice, post RED=g) and OUT (once the ranks the op
 * names posted IN or RED=g, copy the result out, post OUT=g). A buffer is
 * reused for chunk g+nbuf only after every rank posted OUT=g. Chunk numbers g
 * run on across ops, so counters only ever grow.
 *
 * The driver is work-conserving: it finishes the oldest stage that can run
 * (OUT, then RED, then IN as far ahead as free buffers allow) and backs off
 * only when none can, which keeps a rank busy for its whole time slice when
 * ranks outnumber cores. */
#include "transport/shm/shm_int.h"

typedef struct {
  uint64_t g0;
  size_t T, nin, nred, nout;
  shm_ctr_t blk_ctr; /* what the oldest blocked stage waits for */
  int blk_who, blk_q;
  uint64_t blk_target;
} pipe_t;

/* Notes the stage that blocked if no older one did; returns 0. */
static int blocked(pipe_t *p, shm_ctr_t ctr, int who, int q, uint64_t target) {
  if (p->blk_q < 0) {
    p->blk_ctr = ctr, p->blk_who = who, p->blk_q = q, p->blk_target = target;
  }
  return 0;
}

/* Copies out the oldest reduced chunk when its inputs are ready. */
static int try_out(shm_op_t *o, pipe_t *p) {
  crun__shm_comm_t *c = o->c;
  if (p->nout >= p->nred) return 0;
  uint64_t g = p->g0 + p->nout;
  if (o->copy_out) {
    int q = crun__shm_ready(c, (shm_ctr_t)o->out_wait_ctr, o->out_wait_who, g);
    if (q >= 0) return blocked(p, (shm_ctr_t)o->out_wait_ctr, o->out_wait_who, q, g);
    int rc = o->copy_out(o, p->nout, (int)(g % c->nbuf));
    if (rc < 0) return crun__shm_fail_last(c, rc);
  }
  crun__shm_post(c, &c->ctrl[c->rank].ctr[SHM_CTR_OUT], g);
  p->nout++;
  return 1;
}

/* Reduces this rank's slice of the oldest copied-in chunk once every rank
 * has copied it in. Ops without a reduction skip the stage. */
static int try_red(shm_op_t *o, pipe_t *p) {
  crun__shm_comm_t *c = o->c;
  if (p->nred >= p->nin) return 0;
  if (!o->has_reduce) {
    p->nred = p->nin;
    return 1;
  }
  uint64_t g = p->g0 + p->nred;
  int q = crun__shm_ready(c, SHM_CTR_IN, -1, g);
  if (q >= 0) return blocked(p, SHM_CTR_IN, -1, q, g);
  int rc = o->reduce(o, p->nred, (int)(g % c->nbuf));
  if (rc < 0) return crun__shm_fail_last(c, rc);
  crun__shm_post(c, &c->ctrl[c->rank].ctr[SHM_CTR_RED], g);
  p->nred++;
  return 1;
}

/* Copies the next chunk in when every rank is done with its buffer. */
static int try_in(shm_op_t *o, pipe_t *p) {
  crun__shm_comm_t *c = o->c;
  if (p->nin >= p->T) return 0;
  /* this rank's own copy-out of the buffer's last chunk comes first (the
   * older stages are tried before, so one of them is noted as blocking) */
  if (p->nin >= p->nout + (size_t)c->nbuf) return 0;
  uint64_t g = p->g0 + p->nin;
  if (g > (uint64_t)c->nbuf) {
    int q = crun__shm_ready(c, SHM_CTR_OUT, -1, g - c->nbuf);
    if (q >= 0) return blocked(p, SHM_CTR_OUT, -1, q, g - c->nbuf);
  }
  if (o->copy_in) o->copy_in(o, p->nin, crun__shm_buf(c, c->rank, (int)(g % c->nbuf)));
  crun__shm_post(c, &c->ctrl[c->rank].ctr[SHM_CTR_IN], g);
  p->nin++;
  return 1;
}

/* Copies in chunk 0 and waits until every rank did, so that every rank is
 * known to run the same op before any data is read. */
static int start(shm_op_t *o, pipe_t *p) {
  crun__shm_comm_t *c = o->c;
  shm_waiter_t w = {0};
  int rc;
  p->blk_q = -1;
  while ((rc = try_in(o, p)) == 0) {
    CRUN_CHECK(crun__shm_idle(c, &w, p->blk_ctr, p->blk_who, p->blk_q, p->blk_target));
    p->blk_q = -1;
  }
  CRUN_CHECK(rc);
  crun__shm_waited(c, &w);
  CRUN_CHECK(crun__shm_wait(c, SHM_CTR_IN, -1, p->g0));
  return crun__shm_check_ring(c);
}

int crun__shm_run_pipeline(shm_op_t *o) {
  crun__shm_comm_t *c = o->c;
  pipe_t p = {.g0 = c->chunk_seq + 1, .T = o->nchunks};
  c->chunk_seq += p.T;
  CRUN_CHECK(start(o, &p));
  shm_waiter_t w = {0};
  while (p.nout < p.T) {
    int rc, did = 0;
    p.blk_q = -1;
    if ((rc = try_out(o, &p)) < 0) return rc;
    did |= rc;
    if (!did && (rc = try_red(o, &p)) < 0) return rc;
    did |= rc;
    if (!did && (rc = try_in(o, &p)) < 0) return rc;
    did |= rc;
    if (did) {
      crun__shm_waited(c, &w);
      continue;
    }
    CRUN_CHECK(crun__shm_idle(c, &w, p.blk_ctr, p.blk_who, p.blk_q, p.blk_target));
  }
  return 0;
}
