/* tcp_priv.h — the TCP transport's internals shared by tcp_mesh.c and
 * tcp_xfer.c: the wire header, the per-peer stash of early frames. */
#ifndef CRUN_TRANSPORT_TCP_PRIV_H
#define CRUN_TRANSPORT_TCP_PRIV_H

#include <poll.h>
#include <pthread.h>

#include "transport/tcp.h"
#include "core/auth.h"

#define CRUN__TCP_MAGIC 0x314e5243u /* "CRN1" */
#define CRUN__TCP_HELLO 0x4f4c4548u /* "HELO" */
#define CRUN__KIND_ABORT 0xff
#define CRUN__HDR_CHECK 1u

/* The header in front of every frame (host byte order: one host family). */
typedef struct {
  uint32_t magic;
  uint32_t group;
  uint8_t kind, dtype, op, algo;  /* algo: CRUN__HDR_CHECK on a root_agree frame */
  int32_t root;
  int32_t tag;
  uint32_t status;   /* abort frames: -status */
  uint64_t seq;
  uint64_t count;
  uint64_t nbytes;   /* payload bytes that follow */
} crun__hdr_t;

/* The hello a connector sends first on a mesh connection (host byte order). */
typedef struct {
  uint32_t magic, group;
  int32_t rank, size;
} crun__hello_t;

/* ---- the pure wire checks (tcp_wire.c): the mesh code and tests/fuzz
 * call these on bytes as they arrived. */

/* Acceptor `rank` of a group of `size` (fds[j] >= 0: rank j is connected):
 * 0 when h is the hello of a higher rank of this group not yet connected,
 * else CRUN_EPROTO naming what it claims. */
int crun__tcp_hello_check(const crun__hello_t *h, uint32_t group, int rank, int size, const int *fds);

/* The longest abort frame a reader takes (its text is kept to
 * CRUN__ABORT_TEXT_MAX and crun__tcp_abort sends no more): a longer one is
 * garbled, or a peer streaming bytes would keep a reader draining it
 * forever, past every deadline. */
#define CRUN__ABORT_FRAME_MAX (64u << 10)

/* Returns 1 and writes why into text when h (a header from rank `from` to
 * rank `rank` of group pg, named as CRUN__WHO names them; pg may be NULL)
 * lacks the frame magic, names another group, or is an abort frame longer
 * than CRUN__ABORT_FRAME_MAX; else 0. */
int crun__tcp_hdr_garbled(const crun__hdr_t *h, uint32_t group, const crun_pg_t *pg, int rank, int from, char *text,
                          size_t cap);

/* How a connection to a peer ended, for "connection to rank N <how>":
 * "closed" when err is 0 (the peer closed it), else "failed: <strerror(err)>";
 * written into buf (cap bytes), which it returns. */
const char *crun__tcp_conn_how(int err, char *buf, size_t cap);

/* The part of an abort frame's text that is kept (the rest is read and dropped). */
#define CRUN__ABORT_TEXT_MAX 4096

/* Where the next bytes of an abort frame of nbytes go after got of them:
 * into text (CRUN__ABORT_TEXT_MAX + 1 bytes, zeroed, so it stays
 * NUL-terminated) up to the kept length, then into sink (sinkcap bytes) for
 * the rest. Sets *want to the bytes that may be read there now: 0 when the
 * frame is whole. */
char *crun__tcp_abort_dst(char *text, char *sink, size_t sinkcap, uint64_t nbytes, uint64_t got, size_t *want);

/* An abort frame's status (CRUN_EIO when h names none) into *st, and its
 * text without a leading "<that status name>: ". */
const char *crun__tcp_abort_body(const crun__hdr_t *h, const char *text, int *st);

/* Writes "float32[512]" into b, plus " sum" (show_op) and " root 2"
 * (show_root), for a mismatch text; dtype and op may be any wire values. */
int crun__tcp_call_shape(char *b, size_t cap, int dt, uint64_t count, int op, int root, int show_op,
                         int show_root);

/* A whole frame read ahead of the call that wants it. */
typedef struct crun__stash {
  crun__hdr_t h;
  void *data;
  struct crun__stash *next;
} crun__stash_t;

/* A point-to-point operation the transport progresses in the background: a
 * send whose frame did not fit in the socket yet, or a posted receive. */
typedef struct crun__p2p_op {
  crun__coll_t *c;
  int peer;             /* send: destination; recv: source or CRUN_ANY_SOURCE */
  crun__hdr_t h;        /* send: the frame header */
  size_t off, nbytes;   /* send: bytes of header+payload written; payload bytes */
  struct crun__p2p_op *next;
} crun__p2p_op_t;

/* The background reader of one peer: frames for posted receives go straight
 * to their buffer, anything else to the stash. HELD: a header was read whose
 * frame no receive takes and that does not fit in the stash's limit: the
 * reader stops there (TCP then stalls the sender) until a receive for it is
 * posted or the stash drains. */
enum { CRUN__PRX_HDR, CRUN__PRX_DIRECT, CRUN__PRX_STASH, CRUN__PRX_ABORT, CRUN__PRX_DEAD, CRUN__PRX_HELD };
typedef struct {
  int state;
  crun__hdr_t h;
  size_t hgot, got;
  crun__stash_t *frame;     /* STASH: the frame being read */
  crun__p2p_op_t *direct;   /* DIRECT: the receive being filled */
  char *text;               /* ABORT: its text; DEAD: the reason (h, text) when the peer failed
                             * the group (its abort frame, or the board), else NULL */
  int hup;                  /* the peer shut its side (seen by a send stuck on it or a held
                             * reader): what it left is read to its end */
  int cut;                  /* DEAD: a receive that failed (timed out) left its frame half
                             * read, so the stream stops mid-frame: a step cannot read on */
} crun__prx_t;

struct crun__tcp {
  crun_pg_t *pg;
  int rank, size;
  uint32_t group;
  crun__auth_t auth;      /* the job's secret: every mesh connection proves it */
  unsigned long refused;  /* mesh connections refused while building (logged once) */
  int *fds;             /* fds[peer]; -1 for self */
  char *tx_dirty;       /* a frame to that peer was left half sent */
  char *closed;         /* the peer closed its side (seen by an any-source recv) */
  crun__stash_t **stash;/* per-peer FIFO */
  size_t stash_bytes;   /* what every stashed frame costs (crun__stash_new), all peers */
  size_t stash_max;     /* the bound on stash_bytes: CRUN_TCP_UNEXPECTED_MAX */
  int stash_n;          /* stashed frames (and ones being read into the stash) */
  int aborted;
  char *abort_why;        /* aborted: why ("the group is unusable after an earlier failure: ...") */
  crun__p2p_op_t **outq;  /* per-peer FIFO of sends not fully written */
  crun__p2p_op_t *posted; /* receives in posting order */
  crun__prx_t *prx;       /* per-peer background reader */
  struct pollfd *pfd;     /* size entries */
  int npending;
  /* every entry point holds mu (recursive: a failure reported while pumping
   * aborts the transport); the pump thread progresses pending p2p while no
   * one else drives the transport, e.g. during a shared-memory collective */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t pump_th;
  int has_mu, has_pump, pump_stop;
  int lock_depth;         /* how deep its one holder holds mu (crun__tcp_lock) */
  char *reason_due;       /* an abort's reason ("<-status> <text>") the outermost crun__tcp_unlock
                           * leaves on the board, outside the lock; then it resets the
                           * connections of reset_due[] */
  char *reset_due;        /* size entries: the abort frame to that peer could not go */
  int wake[2];            /* a byte here wakes the pump thread's poll */
  struct pollfd *tpfd;    /* the pump thread's poll set: size + 1 entries */
};

/* Progresses every pending p2p operation without blocking, leaving peer
 * `skip` (the one a collective step reads) alone. Returns 1 on progress.
 * Operations finish through crun__pg_p2p_done. */
int crun__tcp_pump(crun__tcp_t *t, int skip);

/* Adds the events pending p2p operations wait for to t->pfd (skip as above). */
void crun__tcp_pump_events(crun__tcp_t *t, int skip);

/* The earliest deadline of a pending p2p operation (a large value if none). */
double crun__tcp_pump_deadline(crun__tcp_t *t);

/* Finishes a partly read background frame from `peer` before a step reads
 * that socket itself; <0 at `deadline`. */
int crun__tcp_settle(crun__tcp_t *t, int peer, double deadline);

/* Gives stashed send frames to posted receives that match them. */
void crun__tcp_match(crun__tcp_t *t);

/* Whether a frame of nbytes payload fits in the stash's limit now. */
int crun__stash_fits(const crun__tcp_t *t, uint64_t nbytes);

/* A stash record for a frame with header h and room for its payload, counted
 * against the limit; NULL when out of memory. The caller checked the limit. */
crun__stash_t *crun__stash_new(crun__tcp_t *t, const crun__hdr_t *h);

/* Frees a stash record (NULL: nothing) and gives back what it counted. */
void crun__stash_free(crun__tcp_t *t, crun__stash_t *s);

/* The error for a frame of peer `from` (header h) that a blocking step must
 * read but cannot buffer: ENOMEM naming the step (desc), the peer, the tag,
 * the sizes and the limit. */
int crun__stash_full(const crun__tcp_t *t, const char *desc, int from, const crun__hdr_t *h);

/* Fails every pending p2p operation with status/text (no group break when
 * status is CRUN_ECLOSED). */
void crun__tcp_fail_all(crun__tcp_t *t, int status, const char *text);

/* Sets up the lock and the background pump (tcp_p2p.c); <0 on failure. */
int crun__tcp_p2p_init(crun__tcp_t *t);

/* Stops the pump thread and fails what is still pending (close). */
void crun__tcp_p2p_fini(crun__tcp_t *t);

/* The reason peer j left on the group's board when it failed the group but
 * could not send us its abort frame (crun__tcp_abort): 1 with h (an abort
 * header naming its status) and text (cap bytes) set, else 0. Asks the
 * store, bounded by the board's timeout: call it once a connection ended. */
int crun__tcp_board_reason(crun__tcp_t *t, int j, crun__hdr_t *h, char *text, size_t cap);

/* Take and release t->mu (recursive). The outermost release finishes an
 * abort whose frame could not reach every peer: it leaves the reason on the
 * group's board (the store may take up to the board's timeout, so no other
 * thread waits on the transport meanwhile), then resets those connections. */
void crun__tcp_lock(crun__tcp_t *t);
void crun__tcp_unlock(crun__tcp_t *t);

/* Returns 1 when fd is ready for `ev`, 0 at the deadline, <0 on poll error. */
int crun__tcp_wait_fd(int fd, short ev, double deadline);

#endif
