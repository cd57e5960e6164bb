/* pg_internal.h — the process group object, collective descriptors and the
 * work queue, shared by runtime/pg, runtime/backend and runtime/algo. */
#ifndef CRUN_PG_INTERNAL_H
#define CRUN_PG_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "crun.h"
#include "core/clock_int.h"
#include "core/who.h"
#include "core/trace_int.h"

/* Every operation a group runs; also the `kind` byte of a wire header. */
#define CRUN_COLL_MAP(X)                                                      \
  X(SEND, send) X(RECV, recv) X(BROADCAST, broadcast) X(ALL_REDUCE, all_reduce) \
  X(REDUCE, reduce) X(ALL_GATHER, all_gather) X(GATHER, gather)              \
  X(SCATTER, scatter) X(REDUCE_SCATTER, reduce_scatter)                      \
  X(ALL_TO_ALL, all_to_all) X(BARRIER, barrier)

typedef enum {
#define CRUN_X_COLL(NAME, name) CRUN__COLL_##NAME,
  CRUN_COLL_MAP(CRUN_X_COLL)
#undef CRUN_X_COLL
  CRUN__COLL_COUNT
} crun__coll_kind_t;

/* Returns "all_reduce" for CRUN__COLL_ALL_REDUCE; "?" for others. */
const char *crun__coll_name(int kind);

/* Whether an operation of this kind has a root (its src or dst) / reduces
 * with an op: the fields a mismatch check compares and a report shows. */
static inline int crun__coll_rooted(int kind) {
  return kind == CRUN__COLL_BROADCAST || kind == CRUN__COLL_REDUCE || kind == CRUN__COLL_GATHER ||
         kind == CRUN__COLL_SCATTER;
}
static inline int crun__coll_reduces(int kind) {
  return kind == CRUN__COLL_ALL_REDUCE || kind == CRUN__COLL_REDUCE || kind == CRUN__COLL_REDUCE_SCATTER;
}

/* How a device backend's enqueued operation (crun__coll_t.dev) is waited
 * for: wait(host = 0) makes the caller's current stream wait on its end,
 * wait(host = 1) waits on the host (timeout <= 0: until it ended or failed);
 * query returns 1 when it ended, 0 while it runs, <0 when it failed (text
 * recorded); free drops the record. */
typedef struct crun__dev_ops {
  int (*wait)(void *dev, int host, double timeout);
  int (*query)(void *dev);
  void (*free)(void *dev);
} crun__dev_ops_t;

/* One operation: what to do, on which buffers, with which deadline. */
typedef struct crun__coll {
  int kind;
  crun_dtype_t dt;
  int user_dt;               /* dtype wire headers name (-1: dt); differs when a
                                float16/bfloat16 reduction runs widened to float32 */
  crun_reduce_op_t op;
  size_t count;
  int root;                  /* broadcast/reduce/gather/scatter; peer for send/recv */
  int tag;                   /* send/recv */
  void *buf;                 /* send/recv/broadcast/all_reduce/reduce/scatter out */
  const void *in;            /* all_gather/gather */
  void **outs;               /* size entries (owned copy) */
  const void **ins;          /* size entries (owned copy) */
  size_t *out_counts;        /* all_to_all (owned copy) */
  size_t *in_counts;
  uint64_t seq;              /* collectives: group-wide number; p2p: 0 */
  double timeout;            /* seconds */
  double deadline;           /* crun_clock() value, set when it starts */
  int src_out;               /* recv: the sender */
  int caller_pumps;          /* p2p run inline: the caller's thread drives it to the end */
  int cuda;                  /* the buffers are CUDA device memory */
  void *stream;              /* cuda: the caller's current stream when it called
                                (the work waits for it, on whichever thread runs) */
  double premul;             /* op PREMUL_SUM on device buffers: the factor */
  void *dev;                 /* a device backend's record of the enqueued work */
  const crun__dev_ops_t *dev_ops;
} crun__coll_t;

struct crun_backend_vtable;

struct crun_pg {
  atomic_int refs;
  crun_store_t *store;       /* prefixed with `prefix` */
  crun_store_t *base;        /* the store the root group was made with */
  crun_store_t *board;       /* like store, with a short timeout: the progress board */
  char *prefix;
  int rank, size;
  int *global;               /* global rank of each group rank */
  double timeout;
  uint32_t group_id;
  _Atomic uint64_t next_seq; /* the last collective's sequence number (written by the busy holder) */
  int nchildren;             /* sub-groups made so far (names them) */
  const struct crun_backend_vtable *be;
  void *be_state;
  /* backend "auto" with a GPU: the device backend serving CUDA buffers
   * (torch's "cpu:gloo,cuda:nccl"); NULL otherwise */
  const struct crun_backend_vtable *be_dev;
  void *be_dev_state;
  /* the function that runs every host all_reduce of the group, and its
   * state, when the backend has one that skips its own dispatch (the
   * shared-memory engine's: backend.h direct); NULL: the backend's slot */
  int (*ar_fn)(void *state, struct crun__coll *c);
  void *ar_state;
  _Atomic uint32_t checked_call; /* the last call without options that passed coll.c's checks */
  char *broken;              /* error text once the group failed; guarded by mu */
  _Atomic int is_broken;     /* set after broken: lets the hot path skip mu */
  /* work queue */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct crun_work *head, *tail;
  /* busy: one operation runs (work.c: taken only by busy_take, from 0 to 1,
   * given back by busy_give; a blocking call with nothing queued takes it
   * without mu). busy_waiters: threads in a wait on cv for busy to clear.
   * queued: works in the queue, readable without mu. stop: written under
   * mu, also read without it. */
  _Atomic int busy, busy_waiters, queued, stop;
  int has_thread;
  pthread_t thread;
  /* progress publication: (kind << 56 | seq) of the current collective */
  atomic_uint_fast64_t cur;
  uint64_t published;
  int pub_stop, has_pub;
  pthread_t pub_thread;
  pthread_cond_t pub_cv;
  /* a blocking send or recv this rank's caller waits in (coll.c; 0: none):
   * gen << 24 | kind << 20 | (peer + 1), published by the same thread as
   * "blocked/<rank>" = "<kind> <peer> <gen>" (or "-"), which a peer's
   * refusal reads (coll.c): a rank blocked on it cannot reach its call */
  _Atomic uint64_t p2p_wait;
  _Atomic uint32_t p2p_gen;
  uint64_t p2p_published;
  /* point-to-point operations the backend progresses in the background */
  int npending;              /* guarded by mu */
  int (*pump)(void *arg, double wait_s); /* progresses them; set by the backend */
  void *pump_arg;
  /* observation (core/trace.c): counters per op, the group's timeline index */
  crun__obs_stat_t obs_stats[CRUN__COLL_COUNT];
  int obs_group;
  /* one released Work kept for the next call (coll.c work_new, work.c
   * work_unref): a blocking collective then costs no malloc/free */
  struct crun_work *_Atomic spare;
};

/* Sanitizer builds free every Work, so that ASan sees a use after release. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CRUN__WORK_SPARE 0
#else
#define CRUN__WORK_SPARE 1
#endif

struct crun_work {
  atomic_int refs;
  crun_pg_t *pg;
  crun__coll_t c;
  int async;
  int on_stack;              /* a blocking call's, in its frame (coll.c work_new) */
  int queued;                /* the queue holds a reference */
  int done, status;
  char *err;
  char desc[64];             /* crun__pg_coll_desc's text, written when a text needs it */
  void *scratch;             /* premul_sum: the scaled copies of the inputs */
  crun__obs_op_t obs;        /* timeline / flight recorder bookkeeping */
  struct crun_work *next;
};

/* A backend's send/recv returns this when the operation continues in the
 * background; it then reports the end through crun__pg_p2p_done. */
#define CRUN__PENDING 1

/* Runs a work: backend dispatch, error capture, group-broken bookkeeping.
 * Returns CRUN__PENDING when a p2p operation goes on in the background. */
int crun__pg_execute(crun_pg_t *pg, struct crun_work *w);

/* Marks the group broken with (rc, text) and aborts its backends (first
 * failure only): a device backend's watchdog reports through it. */
void crun__pg_fail(crun_pg_t *pg, int rc, const char *text);

/* Ends a pending p2p operation (rc < 0: crun_last_error() holds the text). */
void crun__pg_p2p_done(crun_pg_t *pg, crun__coll_t *c, int rc);

/* Names send or recv c as what this rank's caller waits in (pg->p2p_wait,
 * which the publisher leaves on the board as "blocked/<rank>" for a peer's
 * refusal, coll.c); returns the value to give crun__pg_p2p_unblock when the
 * wait ends, which clears it unless another thread's wait replaced it. */
uint64_t crun__pg_p2p_block(crun_pg_t *pg, const crun__coll_t *c);
void crun__pg_p2p_unblock(crun_pg_t *pg, uint64_t b);

/* The commonest call, a blocking all_reduce of host memory without options
 * whose checks the group passed for the last call (coll.c checked_call), on a
 * group whose backend runs all_reduce directly (pg->ar_fn) with nothing
 * queued or running: what work_new, crun__pg_submit, run_inline and
 * crun__pg_execute do for it, in one frame (~300 of ~1,400 instructions of
 * a 2-rank 8-byte all_reduce). Returns the call's status, or 1 when it did
 * not run it (no direct backend, the group broken, stopping or busy): the
 * caller then takes the general path, which says why. */
int crun__pg_all_reduce_now(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt, crun_reduce_op_t op);

/* Queues or inlines the work and, when blocking, waits for it. Takes
 * ownership of one reference of w. Returns the status of a blocking op. */
int crun__pg_submit(crun_pg_t *pg, struct crun_work *w, crun_work_t **out);

/* Takes the group's next call number for a call refused before it ran, when
 * nothing is queued or running (1, the number in *seq), else 0. */
int crun__pg_number_refused(crun_pg_t *pg, uint64_t *seq);

/* How an error text names rank r of group pg (core/who.h: "rank G", then
 * " (group rank r)" on a sub-group). Use through CRUN__WHO(pg, r) as a "%s"
 * argument. */
crun__who_t crun__pg_who(const crun_pg_t *pg, int r);
#define CRUN__WHO(pg, r) (crun__pg_who((pg), (r)).s)
/* The global rank of group rank r (r when pg is NULL or r is not one of its
 * ranks): how a text gives a root, which dist.lua's src/dst is. */
int crun__pg_global(const crun_pg_t *pg, int r);

/* Describes c, an operation of group pg, into buf: "all_reduce #3", "send
 * to rank 1 (tag 0)", its peer named as CRUN__WHO names it ("recv from rank
 * 2 (group rank 1) (tag 0)" on a sub-group). crun__coll_desc names the peer
 * by its rank in the group it was given in, for a caller without the group
 * (pg NULL does the same). */
void crun__pg_coll_desc(const crun_pg_t *pg, const crun__coll_t *c, char *buf, size_t cap);
void crun__coll_desc(const crun__coll_t *c, char *buf, size_t cap);

/* Frees the owned arrays of a coll. */
void crun__coll_free(crun__coll_t *c);

/* Publishes "<kind> #<seq>" under progress/<rank> now (used before reporting a
 * timeout) and returns a text describing where the ranks in `peers` (or all
 * when peers is NULL) are, e.g. "rank 3 is at barrier #41; ranks 0-2 ...". */
void crun__pg_progress_report(crun_pg_t *pg, char *out, size_t cap);

/* Writes "rank 3" or "ranks 0-2,5" (sorted ranks, runs joined) into buf;
 * returns the length written (snprintf-style, capped by cap). */
size_t crun__ranks_text(char *buf, size_t cap, const int *rs, int n);
/* crun__ranks_text for ranks rs of group pg, named as CRUN__WHO names one:
 * by global rank, then, on a sub-group whose ranks are shifted, by group
 * rank: "ranks 1-2 (group ranks 0-1)". */
size_t crun__pg_ranks_text(const crun_pg_t *pg, char *buf, size_t cap, const int *rs, int n);

/* Returns rc; when it is CRUN_ETIMEDOUT (an engine's timeout), first appends
 * the progress report to this thread's error text ("...; rank 3 is at ..."),
 * unless the text already holds that report (from a stage below or a peer). */
int crun__pg_timeout_text(crun_pg_t *pg, int rc);
static inline int crun__pg_timeout_report(crun_pg_t *pg, int rc) {
  return rc == CRUN_ETIMEDOUT ? crun__pg_timeout_text(pg, rc) : rc;
}

/* Reads key from pg's board without waiting for it (crun_store_get waits
 * until a key exists): 1 with *out filled (crun_buf_free it), 0 when the key
 * is not there (or pg has no board), -1 when the board cannot be read. */
int crun__pg_board_peek(crun_pg_t *pg, const char *key, crun_buf_t *out);

/* Leaves "stopped/<rank>" = val on pg's board: this rank's refusal stopped
 * the group, or it closed a group that still worked, so a peer waiting in a
 * refusal's agreement (coll.c) stops at once instead of at its bound. */
void crun__pg_leave_stopped(crun_pg_t *pg, const char *val);

/* Marks the current collective for the progress publisher. */
void crun__pg_mark(crun_pg_t *pg, const crun__coll_t *c);

/* Stops the publisher thread (destroy). */
void crun__pg_progress_stop(crun_pg_t *pg);

/* Stops the progress thread, failing queued work with `status`. */
void crun__pg_queue_stop(crun_pg_t *pg);

#endif
