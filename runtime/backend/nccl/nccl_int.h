/* nccl_int.h — the "nccl" backend: collectives of CUDA buffers over NCCL.
 *
 * One NCCL communicator per group, made from a unique id rank 0 writes into
 * the group's store (sub-groups: ncclCommSplit of the parent's communicator,
 * collective over the parent). Each group owns a CUDA stream; a call first
 * makes that stream wait for the caller's current stream, enqueues the NCCL
 * operation(s) on it and records an end event; the caller's stream then
 * waits on that event (torch's semantics: no host wait). Gather, scatter,
 * all_to_all and send/recv are grouped ncclSend/ncclRecv. A one-rank group
 * makes no NCCL call: its result is the input, or a device-to-device copy of
 * it on the group's stream (NCCL's own one-rank path makes the same copy
 * after its enqueue's host work).
 *
 * Before each collective a host-side signature check (check.c; on unless
 * CRUN_NCCL_CHECK=0) compares the calls of every rank through the store, as
 * the mpi backend does over MPI: EMISMATCH and ETIMEDOUT texts are the same.
 * A watchdog thread per group (watch.c) polls the pending end events and
 * ncclCommGetAsyncError; at an operation's deadline, on an asynchronous
 * error or on a peer's abort notice it aborts the communicator
 * (ncclCommAbort) and fails the operation; the group is then ESTATE.
 *
 * Every use of the communicator outside the watchdog passes a gate
 * (crun__nccl_enter/exit, watch.c), so that an abort never frees it while a
 * thread is on its way into NCCL with the pointer: see abort_comm. */
#ifndef CRUN_NCCL_INT_H
#define CRUN_NCCL_INT_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>

#include "backend/backend.h"

/* What names an operation in a text ("all_reduce #3": crun__coll_desc's
 * fields), kept instead of the text, which only a failure needs. */
typedef struct crun__nccl_name {
  int kind, root, tag;
  uint64_t seq;
} crun__nccl_name_t;

/* The name of c. */
static inline crun__nccl_name_t crun__nccl_name_of(const crun__coll_t *c) {
  return (crun__nccl_name_t){c->kind, c->root, c->tag, c->seq};
}
/* Writes n's text ("all_reduce #3"; a peer named as CRUN__WHO names it in
 * group pg, which may be NULL) into buf. */
void crun__nccl_name_text(const crun_pg_t *pg, const crun__nccl_name_t *n, char *buf, size_t cap);

/* One enqueued operation the watchdog follows until its end event fired. */
typedef struct crun__nccl_op {
  atomic_int refs;
  cudaEvent_t end;              /* NULL while the host is still inside NCCL; then ev, recorded */
  cudaEvent_t ev;               /* the op's own event, kept with it in the pool (NULL: none yet) */
  struct crun__nccl_pool *pool; /* where the op came from and goes back to */
  double deadline;              /* crun_clock() value */
  double begun;                 /* when the group started it (crun_clock()'s base) */
  double timeout;
  int device;
  int status;                   /* 0, or the failure (err holds the text) */
  int ended;                    /* end was seen complete (set under the group's mu) */
  atomic_int done;              /* set last, after status and err (op_wait reads it without mu) */
  char *err;
  crun__nccl_name_t name;       /* all_reduce #3 */
  struct crun__nccl_op *next;
} crun__nccl_op_t;

/* A group's spare operations, at most CRUN__NCCL_SPARE of them, each with
 * its end event: allocating an operation and creating and destroying a CUDA
 * event (several microseconds) per call cost more than the call's own host
 * time, so an operation comes from here and goes back when its last
 * reference goes (not before: op_wait's cudaStreamWaitEvent and the queries
 * use its event until then); its event is kept only once its record has
 * completed. refs: the group's and one per operation taken from it, so that
 * a handle released after its group still finds it. */
#define CRUN__NCCL_SPARE 64
typedef struct crun__nccl_pool {
  pthread_mutex_t mu;
  atomic_int refs;
  int n;                        /* spare operations (guarded by mu) */
  crun__nccl_op_t *spare;       /* linked by next */
} crun__nccl_pool_t;

/* A new pool (refs 1: the group's) into *out; ENOMEM. */
int crun__nccl_pool_new(crun__nccl_pool_t **out);
/* Drops the group's reference: the last one frees the spares. */
void crun__nccl_pool_release(crun__nccl_pool_t *p);

typedef struct crun__nccl {
  crun_pg_t *pg;
  /* atomic: set by create/split while the watchdog runs; the abort swaps
   * it to NULL (under mu, once no thread is inside the gate) */
  _Atomic(ncclComm_t) comm;
  cudaStream_t stream;
  cudaEvent_t ready;            /* recorded on the caller's stream */
  crun__nccl_pool_t *pool;      /* spare operations and their end events */
  int device;
  int check;                    /* CRUN_NCCL_CHECK */
  uint64_t last_checked;        /* seq of our previous signature key (0: none) */
  void *one;                    /* device scratch of one float: barrier */
  void *scratch;                /* staging of all_gather/reduce_scatter (nccl.c's scratch) */
  size_t scratch_cap;           /* its bytes */
  /* watchdog */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  crun__nccl_op_t *pending;     /* oldest first: one stream, so they end in this order */
  crun__nccl_op_t *pending_tail;
  crun__nccl_name_t last;       /* the latest operation (guarded by mu) */
  int has_last;
  int stop, has_watch;
  pthread_t watch;
  _Atomic int aborted;          /* marked for abort (set under mu): the gate refuses */
  _Atomic int inside;           /* threads through the gate, not out yet (the gate: watch.c) */
  int fail_rc;                  /* why (guarded by mu) */
  char *fail_text;
} crun__nccl_t;

/* The NCCL type of dt for op kind `kind` with op `op` (reductions); sets
 * *scale to the element-count multiplier (1, or the size when a dtype NCCL
 * lacks moves as bytes). ENOTSUP naming op and dtype when NCCL cannot. */
int crun__nccl_dtype(crun_dtype_t dt, int reduces, crun_reduce_op_t op, ncclDataType_t *out, size_t *scale,
                     const char *desc, const crun_pg_t *pg);

/* The NCCL op for op on dt (bool: sum/max -> max, product/min -> min);
 * ENOTSUP for bitwise ops, naming op and dtype. */
int crun__nccl_op(crun_dtype_t dt, crun_reduce_op_t op, ncclRedOp_t *out, const char *desc, const crun_pg_t *pg);

/* Records "ENAME: <desc> on rank r: <call> failed: <nccl text>", rank r
 * being pg's own, as CRUN__WHO names it (the texts of crun__nccl_dtype and
 * crun__nccl_op too). */
int crun__nccl_fail(ncclResult_t r, ncclComm_t comm, const char *desc, const crun_pg_t *pg, const char *call);

/* The signature check of c (check.c). */
int crun__nccl_check(crun__nccl_t *b, crun__coll_t *c);

/* Reads a peer's abort notice from the store: <0 with its text recorded when
 * there is one, 0 when none. */
int crun__nccl_poll_abort(crun__nccl_t *b, const char *desc);

/* The gate (watch.c). enter: 0 and *comm set, the caller is counted inside
 * until it calls exit; or <0 (nothing set, nothing counted) once the group
 * is marked aborted. Between them the caller may pass *comm to NCCL calls;
 * exit returns r unchanged (so that `enter ? .. : exit(b, call)` wraps a
 * call). Never blocks. */
int crun__nccl_enter(crun__nccl_t *b, ncclComm_t *comm);
ncclResult_t crun__nccl_exit(crun__nccl_t *b, ncclResult_t r);

/* Watchdog (watch.c). */
int crun__nccl_watch_start(crun__nccl_t *b);
void crun__nccl_watch_stop(crun__nccl_t *b);
/* Registers an operation about to enter NCCL (deadline from c) into *out:
 * one of the group's pool, after giving back the pending ones that ended
 * when the pool ran dry (the watchdog looks only every few milliseconds);
 * ESTATE once the group is marked aborted, ENOMEM. */
int crun__nccl_op_begin(crun__nccl_t *b, const crun__coll_t *c, crun__nccl_op_t **out);
/* The host left NCCL with rc: records the operation's end event (created
 * on its first use, kept with it in the pool) when rc == 0, else fails the
 * operation. */
int crun__nccl_op_end(crun__nccl_t *b, crun__nccl_op_t *op, int rc);
void crun__nccl_op_unref(crun__nccl_op_t *op);
/* Aborts the communicator once, recording why (rc, text); wakes waiters.
 * Blocks until the gate is empty, at most CRUN__NCCL_GRACE_S after the
 * mark, then in ncclCommAbort. */
#define CRUN__NCCL_GRACE_S 0.25
void crun__nccl_abort_comm(crun__nccl_t *b, int rc, const char *text, int notify);
/* Names the ranks not at c (from the progress board) into who/where. */
void crun__nccl_missing(crun__nccl_t *b, const char *desc, char *who, size_t wcap, char *where, size_t rcap);

#endif
