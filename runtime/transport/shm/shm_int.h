/* shm_int.h — the segment layout, the communicator and the pieces shared by
 * the engine files (segment.c, wait.c, engine.c, one file per collective).
 *
 * Segment layout (every part 64-byte aligned, large buffers 4 KiB aligned):
 *   header            magic, layout, attach count, abort record
 *   pids[size]        pid of each rank
 *   ctrl[size]        per rank: progress counters (written by the owner only),
 *                     bell + sleepers (the futex a waiter sleeps on), op ring
 *   small[size][2]    one-shot slots: a header line (seq + op) then data
 *   large[size][nbuf] pipeline buffers of `chunk` bytes
 * Counters are monotonic sequence numbers, never reset: a waiter waits for
 * "counter >= target". */
#ifndef CRUN_TRANSPORT_SHM_INT_H
#define CRUN_TRANSPORT_SHM_INT_H

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/clock_int.h"
#include "core/who.h"
#include "transport/shm/shm.h"

#define SHM_LINE 64
#define SHM_MAGIC 0x6372756e73686d31ull /* "crunshm1" */
#define SHM_RING 4

typedef enum {
  SHM_ALLREDUCE = 1, SHM_REDUCE, SHM_BROADCAST, SHM_ALLGATHER, SHM_REDUCE_SCATTER,
  SHM_ALLTOALL, SHM_BARRIER, SHM_GATHER, SHM_SCATTER, SHM_ALLTOALLV
} shm_kind_t;

/* The counters a rank publishes: IN, RED, OUT for the pipelined path (chunk
 * numbers), ENTER and DONE for the direct path (op numbers); SMALL names the
 * one-shot slot's sequence word. */
typedef enum {
  SHM_CTR_IN = 0, SHM_CTR_RED, SHM_CTR_OUT, SHM_CTR_ENTER, SHM_CTR_DONE, SHM_CTR_SMALL
} shm_ctr_t;

typedef struct {
  uint64_t magic;
  uint32_t size, nbuf;
  uint64_t total, small_bytes, chunk;
  _Atomic uint32_t attached;
  _Atomic uint32_t abort_claim;  /* first failing rank + 1 claims the record */
  _Atomic uint32_t abort_rank;   /* set (release) once the record is written */
  int32_t abort_status;
  char abort_text[400];
} shm_header_t;

/* One op description, published so peers can check they run the same op;
 * the direct path adds the rank's buffers and whether peers may use them. */
typedef struct {
  _Atomic uint64_t opseq, sig, count, direct_ok;
  _Atomic uint64_t in, out; /* addresses in the shared tensor heap */
  uint64_t pad[2];
} shm_desc_t;

typedef struct {
  _Alignas(SHM_LINE) _Atomic uint64_t ctr[5];    /* IN .. DONE; owner writes */
  _Atomic int32_t cpu;                           /* owner's CPU at its last post */
  uint64_t heap;                                 /* owner's heap id (core/heap.h) */
  _Alignas(SHM_LINE) _Atomic uint32_t bell;      /* futex word, owner bumps */
  _Atomic uint32_t sleepers;                     /* waiters sleeping on bell */
  _Atomic uint32_t left;                         /* owner destroyed its communicator */
  _Alignas(SHM_LINE) shm_desc_t ring[SHM_RING];  /* op descriptions by opseq */
  cpu_set_t cpus;                                /* owner's CPU affinity at attach */
} shm_ctrl_t;

/* A one-shot slot: the header, then the payload from byte 32 on, so that a
 * payload of up to 32 bytes shares the header's cache line and a peer pulls
 * one line per op (seq, description and data) instead of two. */
typedef struct {
  _Atomic uint64_t seq, opseq, sig, count;
  char data[SHM_LINE - 32];  /* the payload's first bytes; it runs on past the line */
} shm_small_hdr_t;

struct crun__shm_comm {
  int rank, size;
  void *base;
  size_t len;
  shm_header_t *hdr;
  int32_t *pids;
  shm_ctrl_t *ctrl;
  char *small;              /* small[q][b] at small + (q*2+b)*small_stride */
  size_t small_bytes, small_stride;
  char *large;              /* large[q][b] at large + (q*nbuf+b)*chunk */
  size_t chunk;
  int nbuf;
  uint64_t opseq, small_seq, chunk_seq;
  uint64_t label, next_label; /* the op's number in error texts */
  double next_deadline, next_timeout; /* the next op's, when its caller has one */
  double timeout;
  int *pidfd;               /* per rank; -1 for self or unknown */
  int oversub, policy_yield;
  long spin_ns, spin_cur, yields;
  long small_yields;        /* yields on the one-shot path (SHM_CTR_SMALL) */
  uint64_t last_live_ns;
  int broken;
  int direct;               /* every rank shares one tensor heap: direct path on */
  uint64_t direct_ops;      /* ops that took it (for tests) */
  char name[96];
  /* the op in progress, for error texts and checks */
  shm_kind_t kind;
  uint64_t sig, count;
  double deadline, op_timeout;
  int *global;              /* error texts: rank q is global rank global[q]
                               (crun__shm_comm_create_ranks; NULL: q) */
};

/* Per-op arguments of a collective, filled by the collective's entry point. */
typedef struct shm_op shm_op_t;
struct shm_op {
  crun__shm_comm_t *c;
  shm_kind_t kind;
  crun_dtype_t dt;
  crun_reduce_op_t op;
  int root;
  size_t count, es;
  const char *in;
  char *out;
  const char *const *ins;      /* block lists (size entries) instead of in/out */
  char *const *outs;
  const size_t *in_counts, *out_counts; /* all_to_all_v: per-block counts */
  /* pipelined path */
  size_t nchunks, chunk_elems; /* chunk_elems: elements of one chunk step */
  int has_reduce;              /* phase B: wait IN of all, reduce, post RED */
  int fused;                   /* reduce also writes this rank's slice to out */
  int out_wait_ctr;            /* phase C waits this counter ... */
  int out_wait_who;            /* ... of this rank, or -1: every rank */
  void (*copy_in)(shm_op_t *o, size_t t, char *mine);
  int (*reduce)(shm_op_t *o, size_t t, int b);
  int (*copy_out)(shm_op_t *o, size_t t, int b);
  /* one-shot path */
  size_t small_len;            /* bytes this rank writes into its slot */
  void (*fill)(shm_op_t *o, char *mine);
  int (*finish)(shm_op_t *o, int b);
};

/* Block q (count elements) of an op's input / output. */
static inline const char *crun__shm_in_blk(const shm_op_t *o, int q) {
  return o->ins ? o->ins[q] : o->in + (size_t)q * o->count * o->es;
}
static inline char *crun__shm_out_blk(const shm_op_t *o, int q) {
  return o->outs ? o->outs[q] : o->out + (size_t)q * o->count * o->es;
}

/* Chunk t of a pipelined op: sets *base to its first element and returns
 * its length in elements (the last chunk may be short). */
static inline size_t crun__shm_chunk_len(const shm_op_t *o, size_t t, size_t *base) {
  *base = t * o->chunk_elems;
  size_t left = o->count - *base;
  return left < o->chunk_elems ? left : o->chunk_elems;
}

static inline shm_small_hdr_t *crun__shm_small_hdr(crun__shm_comm_t *c, int q, int b) {
  return (shm_small_hdr_t *)(void *)(c->small + ((size_t)q * 2 + (size_t)b) * c->small_stride);
}
static inline char *crun__shm_small_data(crun__shm_comm_t *c, int q, int b) {
  return crun__shm_small_hdr(c, q, b)->data;
}
static inline char *crun__shm_buf(crun__shm_comm_t *c, int q, int b) {
  return c->large + ((size_t)q * (size_t)c->nbuf + (size_t)b) * c->chunk;
}

/* wait.c */
/* How an error text names rank q of c: "rank q", or "rank G (group rank q)"
 * when c was given global ranks (a process group's sub-group) and q's is G.
 * Use through SHM_WHO(c, q) as a "%s" argument (the array lives to the end of
 * the full expression). */
crun__who_t crun__shm_who(const crun__shm_comm_t *c, int q); /* core/who.h's crun__who */
#define SHM_WHO(c, q) (crun__shm_who((c), (q)).s)
/* Writes ranks qs[0..n) named as SHM_WHO names one: "rank 2", "ranks 1, 3",
 * then " (group ranks 0, 2)" where they are not the global ranks. */
void crun__shm_ranks_text(const crun__shm_comm_t *c, const int *qs, int n, char *buf, size_t cap);
typedef struct { long iter, spins; uint64_t t0, last; int slept, cocore; } shm_waiter_t; /* last: latest clock read (the timeline's wait) */
int crun__shm_ready(crun__shm_comm_t *c, shm_ctr_t ctr, int who, uint64_t target);
int crun__shm_idle(crun__shm_comm_t *c, shm_waiter_t *w, shm_ctr_t ctr, int who, int q,
                   uint64_t target);
void crun__shm_waited(crun__shm_comm_t *c, shm_waiter_t *w);
const char *crun__shm_kind_name(shm_kind_t k);
void crun__shm_post(crun__shm_comm_t *c, _Atomic uint64_t *ctr, uint64_t v);
/* Marks this rank gone (its communicator is being destroyed) and wakes the
 * peers sleeping on it: one that still waits for it fails with EPEERDIED. */
void crun__shm_leave(crun__shm_comm_t *c);
int crun__shm_wait(crun__shm_comm_t *c, shm_ctr_t ctr, int who, uint64_t target);
int crun__shm_fail(crun__shm_comm_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int crun__shm_fail_last(crun__shm_comm_t *c, int status);
int crun__shm_check_abort(crun__shm_comm_t *c);
int crun__shm_check_desc(crun__shm_comm_t *c, int q, uint64_t opseq, uint64_t sig,
                         uint64_t count);

/* kernels.c */
void crun__shm_sum_f32_dual(float *d1, float *d2, const float *const *srcs, int n,
                            size_t count, int avg);
void crun__shm_sum_f32_multi(float *const *dsts, int nd, const float *const *srcs, int n,
                             size_t count, int avg);

/* allgather.c */
int crun__shm_blocks_ok(const crun__shm_comm_t *c, const void *const *list);

/* engine.c */
int crun__shm_start(crun__shm_comm_t *c, shm_kind_t kind, crun_dtype_t dt, crun_reduce_op_t op,
                    int root, size_t count, uint64_t label, double deadline, double timeout);
int crun__shm_begin(crun__shm_comm_t *c, shm_kind_t kind, crun_dtype_t dt,
                    crun_reduce_op_t op, int root, size_t count, size_t nblocks,
                    int bufs_ok, double timeout);
int crun__shm_run_small(shm_op_t *o);
int crun__shm_small_open(crun__shm_comm_t *c);
int crun__shm_small_exchange(crun__shm_comm_t *c, int b);
void crun__shm_small_close(crun__shm_comm_t *c, int b);
int crun__shm_run_pipeline(shm_op_t *o);
int crun__shm_check_ring(crun__shm_comm_t *c);

/* direct.c */
int crun__shm_run_direct(shm_op_t *o, int (*work)(shm_op_t *o), int mine_ok);
const char *crun__shm_peer_in(crun__shm_comm_t *c, int q);
char *crun__shm_peer_out(crun__shm_comm_t *c, int q);
int crun__shm_direct_reduce(shm_op_t *o);
int crun__shm_direct_copy(shm_op_t *o);
void crun__shm_slice(size_t n, int parts, size_t align, int i, size_t *lo, size_t *hi);

#endif /* CRUN_TRANSPORT_SHM_INT_H */
