/* mpi_int.h — the "mpi" backend over Open MPI (or any MPI-3 library).
 *
 * Each group owns two communicators made from the ranks of its members:
 * `comm` carries the MPI collectives and the user's send/recv, `ctrl` the
 * backend's own small messages (call signatures, abort notices). Before a
 * collective every rank sends its call's signature (kind, seq, dtype, count,
 * op, root) to every other rank on `ctrl` and waits for theirs, polling with
 * the call's deadline: a rank that never arrives is named in an ETIMEDOUT, a
 * rank that called something else in an EMISMATCH, on every rank. Only then
 * does the rank enter the blocking MPI collective (MPI_Allreduce, ...), which
 * every member is then known to enter too. MPI cannot cancel a collective: a
 * watchdog thread aborts the MPI job when one overstays its deadline (a peer
 * stopped or died inside it). See README.md beside this file. */
#ifndef CRUN_MPI_INT_H
#define CRUN_MPI_INT_H

#include <mpi.h>
#include <stdatomic.h>

#include "backend/backend.h"

/* Tags of the ctrl communicators. */
enum { CRUN__MPI_TAG_SIG = 1, CRUN__MPI_TAG_ABORT = 2, CRUN__MPI_TAG_LEFT = 4 };

/* Signature words of one call (sent as MPI_INT64_T): the first
 * CRUN__SIG_CMP must match between ranks; DEADLINE is the sender's deadline
 * for the call in wall-clock microseconds. */
enum { CRUN__SIG_KIND, CRUN__SIG_SEQ, CRUN__SIG_DTYPE, CRUN__SIG_COUNT, CRUN__SIG_OP,
       CRUN__SIG_ROOT, CRUN__SIG_CMP, CRUN__SIG_DEADLINE = CRUN__SIG_CMP, CRUN__SIG_WORDS };

/* A blocking MPI call the watchdog keeps an eye on. */
typedef struct crun__mpi_watch {
  _Atomic double deadline;       /* crun_clock() value; 0 when idle */
  char what[96];                 /* "all_reduce #3 (MPI_Allreduce)" */
  char who[48];                  /* this rank, as CRUN__WHO names it */
  struct crun__mpi_watch *next;  /* registry list, guarded by the registry lock */
} crun__mpi_watch_t;

/* A buffered send still in flight (p2p.c). */
typedef struct crun__mpi_send {
  MPI_Request req;
  struct crun__mpi_send *next;
  char data[];                   /* header + payload */
} crun__mpi_send_t;

/* One group's backend state. */
typedef struct crun__mpi {
  crun_pg_t *pg;
  MPI_Comm comm, ctrl;
  int rank, size;
  int check;                     /* CRUN_MPI_CHECK: signature exchange before collectives */
  int64_t *sig_out, *sig_in;     /* size x CRUN__SIG_WORDS each */
  MPI_Request *reqs;             /* 2 x size */
  void *stage[2];                /* reusable staging buffers (coll.c: taken before the exchange) */
  int *a2a_lay;                  /* 4 x size: all_to_all's MPI counts and displacements */
  size_t stage_cap[2];
  int peer_aborted;              /* our failure came from a peer's abort notice */
  char *abort_msg;               /* our own notice, kept while its sends are pending */
  MPI_Request *abort_reqs;
  crun__mpi_send_t *sends;       /* buffered sends in flight */
  int counted;                   /* holds one of group.c's count of groups */
  crun__mpi_watch_t watch;
} crun__mpi_t;

/* Initializes MPI once per process with MPI_THREAD_MULTIPLE (or checks the
 * level of an MPI the program initialized itself) and returns the process
 * wide duplicates of MPI_COMM_WORLD: *world for groups, *join for the
 * group-creation handshake. Fails clearly when the level is lower. */
int crun__mpi_up(MPI_Comm *world, MPI_Comm *join);

/* MPI_TAG_UB of communicator c (at least 32767). The mpi backend keeps this
 * tag for its own "left" notice on a group's comm: user tags are 0..ub-1. */
int crun__mpi_tag_ub(MPI_Comm c);

/* Non-zero when MPI may still be called (initialized and not finalized). */
int crun__mpi_alive(void);

/* The crun status of MPI error code mpirc: EMISMATCH for a truncation,
 * ENOMEM when MPI had no memory, else EIO. */
int crun__mpi_status(int mpirc);

/* Records crun__mpi_status(mpirc) naming the MPI call and error, and rank
 * `rank` of group pg as CRUN__WHO names it (pg may be NULL). */
int crun__mpi_fail(int mpirc, const char *desc, const crun_pg_t *pg, int rank, const char *call);

/* Waiting policy of polling loops: spin, then yield (at once when the host
 * runs more ranks than cores), then nap, so oversubscribed ranks progress. */
typedef struct { double start; unsigned spins; } crun__mpi_spin_t;
void crun__mpi_relax(crun__mpi_spin_t *s);

/* Polls reqs[0..n-1] (completed ones become MPI_REQUEST_NULL) until all are
 * done (0), the deadline passes (1, no text recorded) or, when b is not
 * NULL, a peer's abort notice arrives (<0, the peer's error recorded). With
 * b, reqs[p] for p < nrecv is a receive from group rank p: it still pending
 * when p has destroyed the group fails with EPEERDIED. */
int crun__mpi_wait(crun__mpi_t *b, MPI_Request *reqs, int n, int nrecv, double deadline, const char *desc);

/* Returns <0 with the peer's error when an abort notice is waiting on ctrl. */
int crun__mpi_poll_abort(crun__mpi_t *b, const char *desc);

/* Returns <0 (EPEERDIED) when rank p's notice that it destroyed the group is
 * waiting on ctrl (the notice stays there for later calls). */
int crun__mpi_poll_left(crun__mpi_t *b, int p, const char *desc);

/* Brackets a blocking MPI call for the watchdog (deadline: now + timeout). */
void crun__mpi_watch_begin(crun__mpi_watch_t *w, double timeout, const char *desc, const char *call);
void crun__mpi_watch_end(crun__mpi_watch_t *w);
void crun__mpi_watch_add(crun__mpi_watch_t *w);
void crun__mpi_watch_remove(crun__mpi_watch_t *w);

/* Exchanges call signatures over ctrl with the call's deadline. */
int crun__mpi_check(crun__mpi_t *b, crun__coll_t *c);


/* Returns staging buffer i (0 or 1) of at least n bytes, or NULL; an
 * allocation goes through fault site `site` (core/fault.h). */
void *crun__mpi_stage(crun__mpi_t *b, int i, size_t n, const char *site);

/* Runs any collective (coll.c): the vtable's collective slots. */
int crun__mpi_coll(void *state, crun__coll_t *c);

/* Waits up to `wait` seconds for the buffered sends to complete, freeing
 * those that did (teardown); the others stay in b->sends. */
void crun__mpi_sends_drain(crun__mpi_t *b, double wait);

/* Frees the completed sends of a list; returns 1 when none is left. */
int crun__mpi_sends_reap(crun__mpi_send_t **list);

/* What crun__mpi_mrecv_head did with its message: taken (1: received, or
 * at least handed to MPI_Mrecv, so no longer matched in MPI; 0: still
 * matched, its sender's send may never complete) and the MPI call that
 * failed when it returned an error. */
typedef struct {
  int taken;
  const char *call;
} crun__mpi_rx_t;

/* Receives matched message m (`bytes` long, from MPI_Get_elements_x) whole,
 * keeping its first `keep` bytes at most in head (NULL: none) and dropping
 * the rest in a few KiB on the stack; blocks like MPI_Mrecv. Returns
 * MPI_SUCCESS (the head kept), or the code of the MPI call that failed
 * (rx, when not NULL: that call, and whether the message was taken anyway:
 * when a datatype cannot be made, it falls back to receiving the message
 * SINK bytes at a time through the shared extent-0 block, which loses the
 * head, or into a heap copy; only when neither exists does the message
 * stay matched). A message of at most 4 KiB is received whole on the stack,
 * with no datatype. A receive into a buffer shorter than the message is
 * not safe with Open MPI 4.1: over shared memory and TCP alike it writes
 * the whole message past the buffer (4 MiB past a 16-byte one; into NULL:
 * EFAULT or a crash), and a message can exceed any memory we could give it
 * (2^31-1 float64s). So the rest is received with a datatype of its size
 * whose extent is 0: every block lands on the same sink bytes. (MPI calls a
 * receive datatype with overlapping entries erroneous; Open MPI unpacks it
 * in order into the sink, which only ever holds garbage, so that is safe
 * there.) */
int crun__mpi_mrecv_head(MPI_Message *m, MPI_Count bytes, void *head, size_t keep, crun__mpi_rx_t *rx);

/* Point-to-point: the vtable's send and recv slots. */
int crun__mpi_send(void *state, crun__coll_t *c);
int crun__mpi_recv(void *state, crun__coll_t *c);

/* The MPI datatype carrying dt's bits (float16/bfloat16 as MPI_UINT16_T). */
MPI_Datatype crun__mpi_type(crun_dtype_t dt);

#endif
