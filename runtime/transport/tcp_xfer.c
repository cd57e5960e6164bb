/* tcp_xfer.c — framed, non-blocking, full-duplex steps over the mesh.
 *
 * One step sends a frame to one peer while receiving a frame from another,
 * polling both sockets until the deadline. A received header is checked
 * against the caller's operation before any payload byte reaches its buffer:
 * another collective, count, dtype, op or root fails with CRUN_EMISMATCH
 * naming both calls. Frames that belong to a later point-to-point receive (or
 * were read by an any-source receive) wait in a per-peer stash. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "core/trace_int.h"
#include "transport/tcp_priv.h"

#define HDR sizeof(crun__hdr_t)
#define REDUCE_SEG (128u << 10)

enum { RX_HDR, RX_PAYLOAD, RX_STASH, RX_ABORT, RX_DONE };

typedef struct {
  crun__tcp_t *t;
  crun__coll_t *c;
  /* send side */
  int to;
  crun__hdr_t th;
  const char *sp;
  size_t sbytes, toff;
  int watch_to;           /* also watch `to` for an abort/EOF while only sending */
  /* receive side */
  int from, rstate, stash_only;
  int check;              /* a root_agree step (crun__xfer_t.check) */
  crun__hdr_t rh;
  size_t hgot, rbytes, rgot, reduced;
  char *rp;
  void *red_dst;
  crun__stash_t *pending; /* frame being read into the stash */
  char *abort_text;
} io_t;

static int rx_enter_payload(io_t *io, const crun__hdr_t *h);

static size_t elsize(crun_dtype_t dt) {
  size_t s = crun_dtype_size(dt);
  return s ? s : 1;
}

/* The count a frame header carries: per-message for p2p and all_to_all. */
static uint64_t hdr_count(const crun__coll_t *c, size_t nbytes) {
  if (c->kind == CRUN__COLL_SEND || c->kind == CRUN__COLL_RECV || c->kind == CRUN__COLL_ALL_TO_ALL)
    return nbytes / elsize(c->dt);
  return c->count;
}

/* The dtype a header names: the caller's, also when the data travels widened. */
static int hdr_dtype(const crun__coll_t *c) { return c->user_dt >= 0 ? c->user_dt : (int)c->dt; }

static void fill_hdr(crun__tcp_t *t, const crun__coll_t *c, size_t nbytes, crun__hdr_t *h) {
  memset(h, 0, sizeof *h);
  h->magic = CRUN__TCP_MAGIC;
  h->group = t->group;
  h->kind = (uint8_t)(c->kind == CRUN__COLL_RECV ? CRUN__COLL_SEND : c->kind);
  h->dtype = (uint8_t)hdr_dtype(c);
  h->op = (uint8_t)c->op;
  h->root = c->kind == CRUN__COLL_SEND ? t->rank : c->root;
  h->tag = c->tag;
  h->seq = c->seq;
  h->count = hdr_count(c, nbytes);
  h->nbytes = nbytes;
}

/* Reports a collective frame that does not match our call. */
static int mismatch(io_t *io, const crun__hdr_t *h) {
  const crun__coll_t *c = io->c;
  char desc[64], mine[96], theirs[96], seq[32] = "";
  crun__pg_coll_desc(io->t->pg, c, desc, sizeof desc);
  int kind = h->kind, dop = h->op != c->op, droot = h->root != c->root;
  uint64_t want = hdr_count(c, io->rbytes);
  int show_op = dop && crun__coll_reduces(c->kind), show_root = droot && crun__coll_rooted(c->kind);
  const crun_pg_t *pg = io->t->pg; /* a root is named as the caller gave it: its global rank */
  crun__tcp_call_shape(mine, sizeof mine, hdr_dtype(c), want, c->op, crun__pg_global(pg, c->root), show_op,
                       show_root);
  crun__tcp_call_shape(theirs, sizeof theirs, h->dtype, h->count, h->op, crun__pg_global(pg, h->root),
                       dop && crun__coll_reduces(kind), droot && crun__coll_rooted(kind));
  if (h->seq != c->seq && kind != CRUN__COLL_SEND)
    snprintf(seq, sizeof seq, " #%llu", (unsigned long long)h->seq);
  if (c->kind == CRUN__COLL_RECV)
    return crun_error(CRUN_EMISMATCH, "%s on %s expected %s, %s sent %s (tag %d)",
                      desc, CRUN__WHO(io->t->pg, io->t->rank), mine, CRUN__WHO(io->t->pg, io->from), theirs, h->tag);
  return crun_error(CRUN_EMISMATCH, "%s on %s expected %s, %s sent %s%s %s", desc,
                    CRUN__WHO(io->t->pg, io->t->rank), mine, CRUN__WHO(io->t->pg, io->from), crun__coll_name(kind), seq, theirs);
}

/* Classifies a received header: 0 it is ours, 1 stash it, <0 mismatch. */
static int classify(io_t *io, const crun__hdr_t *h) {
  const crun__coll_t *c = io->c;
  if (io->stash_only) return 1;
  if (c->kind == CRUN__COLL_RECV) {
    if (h->kind != CRUN__COLL_SEND || h->tag != c->tag) return 1;
    if (h->dtype != hdr_dtype(c) || h->nbytes != io->rbytes) return mismatch(io, h);
    return 0;
  }
  if (h->kind == CRUN__COLL_SEND) return 1;
  int check = h->algo == CRUN__HDR_CHECK; /* a root_agree frame: its root is compared by its payload */
  int same = h->kind == c->kind && h->seq == c->seq && h->dtype == hdr_dtype(c) &&
             h->count == hdr_count(c, io->rbytes) &&
             (!crun__coll_reduces(c->kind) || h->op == c->op) &&
             (check || !crun__coll_rooted(c->kind) || h->root == c->root);
  if (!same) return mismatch(io, h);
  if (check != io->check) {
    char desc[64];
    crun__pg_coll_desc(io->t->pg, c, desc, sizeof desc);
    return crun_error(CRUN_EPROTO, "%s on %s: %s %s the ranks' check of the root (different "
                      "CRUN_ROOT_CHECK settings?)", desc, CRUN__WHO(io->t->pg, io->t->rank), CRUN__WHO(io->t->pg, io->from), check ? "sent" : "skipped");
  }
  if (h->nbytes != io->rbytes) {
    char desc[64];
    crun__pg_coll_desc(io->t->pg, c, desc, sizeof desc);
    return crun_error(CRUN_EPROTO, "%s on %s: %s sent %llu bytes where %zu were expected "
                      "(different CRUN_ALGO settings?)", desc, CRUN__WHO(io->t->pg, io->t->rank), CRUN__WHO(io->t->pg, io->from),
                      (unsigned long long)h->nbytes, io->rbytes);
  }
  return 0;
}

static int aborted_by(io_t *io, int peer, const crun__hdr_t *h, const char *text);

/* The connection to peer ended (err: its errno, 0 when closed): the peer's
 * reason when it failed the group and left it on the board (its abort frame
 * could not reach us), else EPEERDIED. */
static int peer_died(io_t *io, int peer, int err) {
  crun__hdr_t h;
  char why[CRUN__ABORT_TEXT_MAX + 1], desc[64], how[128];
  const crun__prx_t *x = &io->t->prx[peer];
  if (x->state == CRUN__PRX_DEAD && x->text) return aborted_by(io, peer, &x->h, x->text); /* the pump read it */
  if (crun__tcp_board_reason(io->t, peer, &h, why, sizeof why)) return aborted_by(io, peer, &h, why);
  crun__pg_coll_desc(io->t->pg, io->c, desc, sizeof desc);
  return crun_error(CRUN_EPEERDIED, "%s on %s: connection to %s %s (the process died "
                    "or left the group)", desc, CRUN__WHO(io->t->pg, io->t->rank), CRUN__WHO(io->t->pg, peer), crun__tcp_conn_how(err, how, sizeof how));
}

/* Turns a received abort frame into our error. The frame was the peer's
 * last: its reader stops there, and the pending p2p operations fail with
 * the peer's reason now (else the pump, finding the connection closed next,
 * would fail them with a bare EPEERDIED first). */
static int aborted_by(io_t *io, int peer, const crun__hdr_t *h, const char *text) {
  crun__tcp_t *t = io->t;
  char desc[64], p2p[4200];
  crun__pg_coll_desc(io->t->pg, io->c, desc, sizeof desc);
  int st;
  const char *body = crun__tcp_abort_body(h, text, &st);
  t->prx[peer].state = CRUN__PRX_DEAD;
  snprintf(p2p, sizeof p2p, "%s [reported by %s; %s was in a point-to-point operation]", body, CRUN__WHO(t->pg, peer),
           CRUN__WHO(t->pg, t->rank));
  crun__tcp_fail_all(t, st, p2p); /* before our error: it records theirs */
  return crun_error(st, "%s [reported by %s; %s was in %s]", body, CRUN__WHO(t->pg, peer), CRUN__WHO(t->pg, t->rank), desc);
}

/* Uses a stashed frame when one matches the receive; 1 when consumed. */
static int rx_from_stash(io_t *io) {
  crun__stash_t **pp = &io->t->stash[io->from];
  for (; *pp; pp = &(*pp)->next) {
    int r = classify(io, &(*pp)->h);
    if (r < 0) return r;
    if (r == 1) continue;
    crun__stash_t *s = *pp;
    *pp = s->next;
    if (io->red_dst)
      crun_reduce_into(io->c->dt, io->c->op, io->red_dst, s->data, io->rbytes / elsize(io->c->dt));
    else if (io->rbytes)
      memcpy(io->rp, s->data, io->rbytes);
    io->rh = s->h;
    crun__stash_free(io->t, s);
    io->rstate = RX_DONE;
    return 1;
  }
  return 0;
}

/* The abort frame that `to` sent (it failed the group), read and turned into
 * our error; 0 when none waits on its connection. Never blocks. */
static int abort_from_to(io_t *io) {
  crun__hdr_t h;
  char text[4097] = "";
  ssize_t k = recv(io->t->fds[io->to], &h, HDR, MSG_PEEK | MSG_DONTWAIT);
  if (k != (ssize_t)HDR || h.kind != CRUN__KIND_ABORT ||
      crun__tcp_hdr_garbled(&h, io->t->group, io->t->pg, io->t->rank, io->to, text, sizeof text))
    return 0; /* not a frame: a receive that failed left this stream mid-frame */
  text[0] = 0;
  size_t n = h.nbytes > 4096 ? 4096 : h.nbytes;
  recv(io->t->fds[io->to], &h, HDR, MSG_DONTWAIT);
  recv(io->t->fds[io->to], text, n, MSG_DONTWAIT);
  return aborted_by(io, io->to, &h, text);
}

/* Sends what the socket takes now; 1 progress, 0 would block, <0 error. A
 * broken connection reports the peer's abort frame when one came first. */
static int tx_some(io_t *io) {
  size_t total = HDR + io->sbytes;
  if (io->toff >= total || io->t->outq[io->to]) return 0; /* earlier sends to `to` go first */
  struct iovec iov[2];
  int n = 0;
  if (io->toff < HDR) {
    iov[n++] = (struct iovec){(char *)&io->th + io->toff, HDR - io->toff};
    if (io->sbytes) iov[n++] = (struct iovec){(void *)io->sp, io->sbytes};
  } else {
    iov[n++] = (struct iovec){(void *)(io->sp + (io->toff - HDR)), total - io->toff};
  }
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
  ssize_t k = sendmsg(io->t->fds[io->to], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k > 0) {
    io->toff += (size_t)k;
    io->t->tx_dirty[io->to] = io->toff < total;
    return 1;
  }
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return errno == EINTR;
  int err = k < 0 ? errno : 0;
  int r = abort_from_to(io); /* a peer that failed the group and left sent why before it closed */
  return r < 0 ? r : peer_died(io, io->to, err);
}

/* Reads up to n bytes of the receive side; returns bytes, 0 would block, <0 error. */
static ssize_t rx_read(io_t *io, void *p, size_t n) {
  ssize_t k = recv(io->t->fds[io->from], p, n, MSG_DONTWAIT);
  if (k > 0) return k;
  if (k == 0) return peer_died(io, io->from, 0);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  return peer_died(io, io->from, errno);
}

/* A whole header arrived: decide where its payload goes. */
static int rx_header_done(io_t *io) {
  crun__hdr_t *h = &io->rh;
  char text[160];
  if (crun__tcp_hdr_garbled(h, io->t->group, io->t->pg, io->t->rank, io->from, text, sizeof text))
    return crun_error(CRUN_EPROTO, "%s", text);
  if (h->kind == CRUN__KIND_ABORT) {
    size_t n = h->nbytes > CRUN__ABORT_TEXT_MAX ? CRUN__ABORT_TEXT_MAX : h->nbytes;
    io->abort_text = calloc(1, n + 1);
    io->rgot = 0;
    io->rstate = RX_ABORT;
    return io->abort_text ? 0 : crun_error(CRUN_ENOMEM, "abort text");
  }
  int r = classify(io, h);
  if (r < 0) return r;
  if (r == 0) return rx_enter_payload(io, h);
  if (!crun__stash_fits(io->t, h->nbytes)) { /* the step's own frame is behind it: cannot wait */
    char desc[64];
    crun__pg_coll_desc(io->t->pg, io->c, desc, sizeof desc);
    return crun__stash_full(io->t, desc, io->from, h);
  }
  if (!(io->pending = crun__stash_new(io->t, h)))
    return crun_error(CRUN_ENOMEM, "stash of %llu bytes", (unsigned long long)h->nbytes);
  io->rgot = 0;
  io->rstate = RX_STASH;
  return 0;
}

static int rx_enter_payload(io_t *io, const crun__hdr_t *h) {
  io->rgot = 0;
  io->rstate = h->nbytes ? RX_PAYLOAD : RX_DONE;
  return 0;
}

/* Reduces the whole elements received so far (in segments) into red_dst. */
static void rx_reduce(io_t *io, int final) {
  size_t es = elsize(io->c->dt), avail = io->rgot / es * es;
  if (avail > io->reduced && (final || avail - io->reduced >= REDUCE_SEG)) {
    crun_reduce_into(io->c->dt, io->c->op, (char *)io->red_dst + io->reduced,
                     io->rp + io->reduced, (avail - io->reduced) / es);
    io->reduced = avail;
  }
}

/* Appends the finished pending frame to the peer's stash. */
static void stash_push(io_t *io) {
  crun__stash_t **pp = &io->t->stash[io->from];
  while (*pp) pp = &(*pp)->next;
  *pp = io->pending;
  io->pending = NULL;
}

/* Advances the receive state machine; 1 progress, 0 would block, <0 error. */
static int rx_some(io_t *io) {
  ssize_t k;
  switch (io->rstate) {
  case RX_HDR:
    if ((k = rx_read(io, (char *)&io->rh + io->hgot, HDR - io->hgot)) <= 0) return (int)k;
    if ((io->hgot += (size_t)k) == HDR) {
      io->hgot = 0;
      int r = rx_header_done(io);
      return r < 0 ? r : 1;
    }
    return 1;
  case RX_PAYLOAD:
    if ((k = rx_read(io, io->rp + io->rgot, io->rbytes - io->rgot)) <= 0) return (int)k;
    io->rgot += (size_t)k;
    if (io->red_dst) rx_reduce(io, io->rgot == io->rbytes);
    if (io->rgot == io->rbytes) io->rstate = RX_DONE;
    return 1;
  case RX_STASH:
    k = io->rh.nbytes ? rx_read(io, (char *)io->pending->data + io->rgot, io->rh.nbytes - io->rgot) : 0;
    if (k < 0 || (k == 0 && io->rh.nbytes)) return (int)k;
    if ((io->rgot += (size_t)k) == io->rh.nbytes) {
      stash_push(io);
      io->rstate = io->stash_only ? RX_DONE : RX_HDR;
    }
    return 1;
  case RX_ABORT: {
    char sink[4096];
    size_t want;
    char *dst = crun__tcp_abort_dst(io->abort_text, sink, sizeof sink, io->rh.nbytes, io->rgot, &want);
    if (want && (k = rx_read(io, dst, want)) <= 0) return (int)k;
    io->rgot += want ? (size_t)k : 0;
    if (io->rgot == io->rh.nbytes) return aborted_by(io, io->from, &io->rh, io->abort_text);
    return 1;
  }
  }
  return 0;
}

/* While only sending to `to`, looks whether it sent an abort frame or closed. */
static int peek_abort(io_t *io) {
  crun__hdr_t h;
  ssize_t k = recv(io->t->fds[io->to], &h, HDR, MSG_PEEK | MSG_DONTWAIT);
  if (k == 0) return peer_died(io, io->to, 0);
  io->watch_to = 0;
  return abort_from_to(io);
}

/* The step's deadline passed: name the peer and where every rank is. */
static int timed_out(io_t *io) {
  char desc[64], where[1024];
  crun__pg_coll_desc(io->t->pg, io->c, desc, sizeof desc);
  crun__pg_progress_report(io->t->pg, where, sizeof where);
  if (io->rstate != RX_DONE && io->from >= 0)
    return crun_error(CRUN_ETIMEDOUT, "%s on %s: no data from %s after %.1f s; %s", desc,
                      CRUN__WHO(io->t->pg, io->t->rank), CRUN__WHO(io->t->pg, io->from), io->c->timeout, where);
  return crun_error(CRUN_ETIMEDOUT, "%s on %s: %s took no data for %.1f s; %s", desc,
                    CRUN__WHO(io->t->pg, io->t->rank), CRUN__WHO(io->t->pg, io->to), io->c->timeout, where);
}

/* How long a step waits on its own peers before it looks at the others'
 * next frames (peek_others): a frame that arrives sooner costs nothing. */
#define PEEK_MS 50

/* Whether h, a frame of another peer than the one this collective step
 * waits for, belongs to the same call of the group yet names another
 * collective: another kind, dtype or (reductions) op. The count and the
 * root may differ between the frames of one call (all_to_all; the
 * hierarchical engine's segments and host roots), and a later call or a
 * point-to-point frame is no sign of anything. */
static int other_call(const io_t *io, const crun__hdr_t *h) {
  const crun__coll_t *c = io->c;
  if (h->magic != CRUN__TCP_MAGIC || h->group != io->t->group || h->seq != c->seq ||
      h->kind == CRUN__COLL_SEND || h->kind == CRUN__KIND_ABORT)
    return 0;
  return h->kind != c->kind || h->dtype != hdr_dtype(c) || (crun__coll_reduces(c->kind) && h->op != c->op);
}

/* Reports peer j's frame h of the same call that names another collective.
 * An all_to_all is described by its block from j, the frame j owed: the
 * step's own count is that of the block from `from` (before, the text
 * showed it, "called all_to_all float32[0]" where that block was empty). */
static int other_call_error(io_t *io, int j, const crun__hdr_t *h) {
  const crun__coll_t *c = io->c;
  char desc[64], mine[128], theirs[96];
  crun__pg_coll_desc(io->t->pg, c, desc, sizeof desc);
  int a2a = c->kind == CRUN__COLL_ALL_TO_ALL && c->out_counts;
  uint64_t count = a2a ? c->out_counts[j] : hdr_count(c, io->rbytes);
  int n = a2a ? snprintf(mine, sizeof mine, ", whose block from %s is ", CRUN__WHO(io->t->pg, j)) : snprintf(mine, sizeof mine, " ");
  crun__tcp_call_shape(mine + n, sizeof mine - (size_t)n, hdr_dtype(c), count, c->op,
                       crun__pg_global(io->t->pg, c->root),
                       crun__coll_reduces(c->kind), 0);
  crun__tcp_call_shape(theirs, sizeof theirs, h->dtype, h->count, h->op, crun__pg_global(io->t->pg, h->root),
                       crun__coll_reduces(h->kind), 0);
  int peer = io->from >= 0 && io->rstate != RX_DONE ? io->from : io->to;
  return crun_error(CRUN_EMISMATCH, "%s on %s: %s sent %s #%llu %s but %s called %s%s (seen "
                    "while it waited for %s)", desc, CRUN__WHO(io->t->pg, io->t->rank), CRUN__WHO(io->t->pg, j), crun__coll_name(h->kind),
                    (unsigned long long)h->seq, theirs, CRUN__WHO(io->t->pg, io->t->rank), crun__coll_name(c->kind), mine, CRUN__WHO(io->t->pg, peer));
}

/* Looks at what peer j sent ahead of what this rank read from it: its
 * stashed frames, the header its background reader holds, and the next
 * header on its socket (peeked, not read, and only where its stream is
 * between frames). <0 when one is of this call but another collective. */
static int peek_peer(io_t *io, int j) {
  crun__tcp_t *t = io->t;
  for (crun__stash_t *s = t->stash[j]; s; s = s->next)
    if (other_call(io, &s->h)) return other_call_error(io, j, &s->h);
  const crun__prx_t *p = &t->prx[j];
  if (p->state == CRUN__PRX_HELD && other_call(io, &p->h)) return other_call_error(io, j, &p->h);
  if (p->state != CRUN__PRX_HDR || p->hgot) return 0;
  crun__hdr_t h;
  if (recv(t->fds[j], &h, HDR, MSG_PEEK | MSG_DONTWAIT) == (ssize_t)HDR && other_call(io, &h))
    return other_call_error(io, j, &h);
  return 0;
}

/* A collective step that waited PEEK_MS for its peers looks whether another
 * peer is in the same call with another collective (a whole host called
 * something else, so no check among its ranks saw it, and its frame waits
 * unread on a connection this step does not read): EMISMATCH now instead
 * of a timeout. Runs under t->mu, so the pump thread reads no socket
 * meanwhile; reads nothing, so frames that are early stay where they are. */
static int peek_others(io_t *io) {
  crun__tcp_t *t = io->t;
  if (t->aborted) return 0;
  for (int j = 0; j < t->size; j++) {
    if (j == t->rank || t->fds[j] < 0 || (j == io->from && io->rstate != RX_DONE)) continue;
    int r = peek_peer(io, j);
    if (r < 0) return r;
  }
  return 0;
}

/* Whether a wait of this step may look at the other peers' frames. */
static int may_peek(const io_t *io) {
  int k = io->c->kind;
  return k != CRUN__COLL_SEND && k != CRUN__COLL_RECV && !io->stash_only && io->t->size > 2;
}

/* Whether a waiting step watches peer j for a hang-up: the step neither
 * sends to j nor reads from it now, and j's stream is between frames with
 * no background read on it. */
static int idle_peer(const io_t *io, int j, int tx, int rx) {
  const crun__tcp_t *t = io->t;
  const crun__prx_t *x = &t->prx[j];
  return j != t->rank && t->fds[j] >= 0 && !(tx && j == io->to) && !(rx && j == io->from) && !t->closed[j] &&
         x->state == CRUN__PRX_HDR && !x->hgot && !x->hup;
}

/* Peer j, whose connection this step does not read, hung up: it failed the
 * group (its abort frame is the last thing it sent, or its reason is on the
 * board when it reset the connection), closed the group, or died. The
 * background reader reads what j left up to that end (its frames into the
 * stash, for a later step). <0 with j's reason when j failed the group,
 * else 0: this step goes on (a step that reads from j later finds its
 * frames, then the close). */
static int idle_peer_hung_up(io_t *io, int j, int rx) {
  crun__tcp_t *t = io->t;
  t->prx[j].hup = 1;
  crun__tcp_pump(t, rx ? io->from : -1);
  const crun__prx_t *x = &t->prx[j];
  return x->state == CRUN__PRX_DEAD && x->text ? aborted_by(io, j, &x->h, x->text) : 0;
}

/* After a poll: looks at the idle peers that hung up (idle_peer_hung_up);
 * <0 with the reason of one that failed the group. */
static int idle_peers_check(io_t *io, int tx, int rx) {
  crun__tcp_t *t = io->t;
  for (int j = 0; j < t->size; j++) {
    if (!(t->pfd[j].revents & (POLLRDHUP | POLLHUP | POLLERR)) || !idle_peer(io, j, tx, rx)) continue;
    int r = idle_peer_hung_up(io, j, rx);
    if (r < 0) return r;
  }
  return 0;
}

/* Polls the step's sockets (and those pending p2p operations wait on) until
 * one is ready; <0 on timeout, or when another peer's frame shows that it
 * is in this call with another collective (peek_others). The other peers'
 * sockets are polled for a hang-up too: a peer that failed the group sent
 * its abort frame and then shut its side, so the step fails at once with
 * that peer's reason (idle_peers_check) instead of when the failure reaches
 * it through the peer it waits for. This costs nothing while the step's
 * own peers keep it busy: only a step that would block polls. */
static int io_wait(io_t *io) {
  crun__tcp_t *t = io->t;
  struct pollfd *p = t->pfd;
  int tx = io->to >= 0 && io->toff < HDR + io->sbytes, rx = io->from >= 0 && io->rstate != RX_DONE;
  int watch = may_peek(io);
  for (int j = 0; j < t->size; j++)
    p[j] = (struct pollfd){-1, watch && idle_peer(io, j, tx, rx) ? POLLRDHUP : 0, 0};
  if (tx) p[io->to].events |= (short)(POLLOUT | (io->watch_to ? POLLIN : 0));
  if (rx) p[io->from].events |= POLLIN;
  crun__tcp_pump_events(t, rx ? io->from : -1);
  for (int j = 0; j < t->size; j++)
    if (p[j].events) p[j].fd = t->fds[j];
  double left = io->c->deadline - crun_clock();
  if (left <= 0) return timed_out(io);
  double pl = crun__tcp_pump_deadline(t) - crun_clock();
  if (pl < left) left = pl > 0 ? pl : 0;
  int ms = left > 1000.0 ? 1000000 : (int)(left * 1000.0) + 1;
  int peek = ms > PEEK_MS && may_peek(io);
  if (peek) ms = PEEK_MS;
  uint64_t t0 = crun__obs_on ? crun_clock_ns() : 0; /* blocked on peers: core/trace_int.h */
  int k = poll(p, (nfds_t)t->size, ms);
  if (t0) crun__obs_wait_ns += crun_clock_ns() - t0;
  if (k < 0 && errno != EINTR) return crun_error(CRUN_ESYS, "poll: %s", strerror(errno));
  if (k == 0 && peek) return peek_others(io);
  int r = k > 0 && watch ? idle_peers_check(io, tx, rx) : 0;
  if (r < 0) return r;
  if (k > 0 && tx && io->watch_to && (p[io->to].revents & (POLLIN | POLLHUP)) && !(rx && io->from == io->to))
    return peek_abort(io);
  return 0;
}

/* The step cannot go on: the transport was aborted (an operation it pumped
 * may have failed the group meanwhile: the sockets are shut for writing), or
 * a receive that failed left the stream from `from` mid-frame. <0 with the
 * cause then, else 0. */
static int io_blocked(io_t *io) {
  crun__tcp_t *t = io->t;
  int cut = io->from >= 0 && io->rstate != RX_DONE && t->prx[io->from].state == CRUN__PRX_DEAD &&
            t->prx[io->from].cut;
  if (!t->aborted && !cut) return 0;
  char desc[64], note[160] = "";
  crun__pg_coll_desc(io->t->pg, io->c, desc, sizeof desc);
  if (cut)
    snprintf(note, sizeof note, "%sthe connection from %s stopped mid-frame where a receive from it failed",
             t->aborted ? " (" : "", CRUN__WHO(t->pg, io->from));
  if (!t->aborted)
    return crun_error(CRUN_ESTATE, "%s on %s: %s", desc, CRUN__WHO(t->pg, t->rank), note);
  return crun_error(CRUN_ESTATE, "%s on %s: %s%s%s", desc, CRUN__WHO(t->pg, t->rank),
                    t->abort_why ? t->abort_why : "the tcp transport was aborted", note, cut ? ")" : "");
}

/* Drives both sides until done, an error, or the deadline. */
static int io_run(io_t *io) {
  for (;;) {
    int progress = 0, r;
    while (io->to >= 0 && (r = tx_some(io)) != 0) {
      if (r < 0) return r;
      progress = 1;
    }
    while (io->from >= 0 && io->rstate != RX_DONE && (r = rx_some(io)) != 0) {
      if (r < 0) return r;
      progress = 1;
    }
    int tx_left = io->to >= 0 && io->toff < HDR + io->sbytes;
    int rx_left = io->from >= 0 && io->rstate != RX_DONE;
    if (io->t->npending) {
      crun__tcp_match(io->t);
      progress |= crun__tcp_pump(io->t, rx_left ? io->from : -1);
      if ((r = io_blocked(io)) < 0) return r;
    }
    if (!tx_left && !rx_left) return 0;
    if (!progress && (r = io_wait(io)) < 0) return r;
  }
}

static void io_free(io_t *io) {
  crun__stash_free(io->t, io->pending);
  free(io->abort_text);
}

static int run_step(crun__tcp_t *t, crun__coll_t *c, const crun__xfer_t *x, int stash_only) {
  io_t io = {.t = t, .c = c, .to = x->to, .sp = x->sbuf, .sbytes = x->sbytes, .watch_to = 1,
             .from = x->from, .rp = x->rbuf, .rbytes = x->rbytes, .red_dst = x->red_dst,
             .stash_only = stash_only, .rstate = RX_HDR};
  io.check = x->check;
  if (x->to >= 0) fill_hdr(t, c, x->sbytes, &io.th);
  if (x->to >= 0 && x->check) io.th.algo = CRUN__HDR_CHECK;
  int rc = 0;
  if (x->from >= 0 && !stash_only) rc = crun__tcp_settle(t, x->from, c->deadline);
  if (rc >= 0) rc = io_blocked(&io); /* settling pumps: a pending receive may have failed */
  if (x->from >= 0 && !stash_only && rc >= 0) rc = rx_from_stash(&io);
  if (rc == 0 && x->from >= 0 && !stash_only && t->prx[x->from].state == CRUN__PRX_HELD) {
    io.rh = t->prx[x->from].h; /* the background reader stopped after this header: the step goes on */
    t->prx[x->from].state = CRUN__PRX_HDR;
    rc = rx_header_done(&io);
  }
  if (rc >= 0) rc = io_run(&io);
  io_free(&io);
  return rc;
}

int crun__tcp_xfer(crun__tcp_t *t, crun__coll_t *c, const crun__xfer_t *x) {
  if (t->aborted) return crun_error(CRUN_ESTATE, "%s: the tcp transport was aborted", CRUN__WHO(t->pg, t->rank));
  crun__tcp_lock(t);
  int rc = run_step(t, c, x, 0);
  crun__tcp_unlock(t);
  return rc < 0 ? rc : 0;
}

/* The key on the group's board under which rank r leaves the reason it
 * failed the group, for the peers its abort frame could not reach. */
static void reason_key(int r, char *buf, size_t cap) { snprintf(buf, cap, "abort/%d", r); }

int crun__tcp_board_reason(crun__tcp_t *t, int j, crun__hdr_t *h, char *text, size_t cap) {
  char key[32];
  reason_key(j, key, sizeof key);
  crun_buf_t v = {0};
  if (!t->pg || crun__pg_board_peek(t->pg, key, &v) <= 0) return 0;
  snprintf(text, cap, "%.*s", (int)(v.len < cap ? v.len : cap - 1), (const char *)v.data);
  crun_buf_free(&v);
  char *end = NULL;
  long st = strtol(text, &end, 10); /* "<-status> <text>" */
  int got = end > text && *end == ' ' && st > 0 && st < 1000;
  if (got) {
    *h = (crun__hdr_t){.magic = CRUN__TCP_MAGIC, .group = t->group, .kind = CRUN__KIND_ABORT,
                       .status = (uint32_t)st};
    memmove(text, end + 1, strlen(end + 1) + 1);
  }
  return got;
}

/* The value publish_reason leaves: "<-status> <text>" (malloc'd; NULL
 * without memory). */
static char *reason_value(int status, const char *text, size_t len) {
  char *v = malloc(len + 16);
  if (v) snprintf(v, len + 16, "%d %.*s", -status, (int)len, text);
  return v;
}

/* Leaves why this rank failed the group (v, from reason_value) on the
 * board, for a peer its abort frame cannot reach; bounded by the board's
 * timeout. Called without t->mu. */
static void publish_reason(crun__tcp_t *t, const char *v) {
  char key[32];
  reason_key(t->rank, key, sizeof key);
  if (!t->pg || !t->pg->board) return;
  if (crun_store_set(t->pg->board, key, v, strlen(v)) < 0)
    CRUN_LOG(INFO, NET, "rank %d: could not leave the abort reason on the board: %s", t->rank, crun_last_error());
}

/* Sends the abort frame to peer j; 1 when it went out whole, -1 when the
 * connection is gone already (no one reads it), 0 when it could not go: a
 * frame to j left half sent (tx_dirty) keeps it out, and so does a full
 * socket. Never blocks. */
static int abort_frame_to(crun__tcp_t *t, int j, int status, const char *text, size_t len) {
  if (t->tx_dirty[j]) return 0;
  crun__hdr_t h = {.magic = CRUN__TCP_MAGIC, .group = t->group, .kind = CRUN__KIND_ABORT,
                   .status = (uint32_t)(-status), .nbytes = len};
  struct iovec iov[2] = {{&h, HDR}, {(void *)text, len}};
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
  ssize_t k = sendmsg(t->fds[j], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k < 0) CRUN_LOG(INFO, NET, "abort frame to rank %d: %s", j, strerror(errno));
  if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
  return k == (ssize_t)(HDR + len);
}

/* Resets the connection to peer j at once (connect to AF_UNSPEC sends a
 * RST): a peer behind our half-sent frame would otherwise see our close only
 * after reading all of the frame's bytes still queued here, and a peer whose
 * reader holds that frame never would. The peer then reads the reason from
 * the board (crun__tcp_board_reason). */
static void reset_conn(crun__tcp_t *t, int j) {
  struct sockaddr sa = {.sa_family = AF_UNSPEC};
  if (connect(t->fds[j], &sa, sizeof sa) < 0) {
    CRUN_LOG(INFO, NET, "reset of the connection to rank %d: %s", j, strerror(errno));
    shutdown(t->fds[j], SHUT_WR);
  }
}

void crun__tcp_lock(crun__tcp_t *t) {
  pthread_mutex_lock(&t->mu);
  t->lock_depth++;
}

/* The part of an abort that waits for the outermost release of t->mu (its
 * caller may be deep in a pump that holds it): leaves the reason on the
 * board without the lock, then resets the connections its abort frame
 * could not reach, so that a peer that sees the reset finds the reason. */
static void abort_finish(crun__tcp_t *t, char *v) {
  publish_reason(t, v);
  free(v);
  pthread_mutex_lock(&t->mu);
  for (int j = 0; j < t->size; j++)
    if (t->reset_due[j]) {
      t->reset_due[j] = 0;
      reset_conn(t, j);
    }
  pthread_mutex_unlock(&t->mu);
}

void crun__tcp_unlock(crun__tcp_t *t) {
  char *v = --t->lock_depth == 0 ? t->reason_due : NULL;
  t->reason_due = v ? NULL : t->reason_due;
  pthread_mutex_unlock(&t->mu);
  if (v) abort_finish(t, v);
}

void crun__tcp_abort(crun__tcp_t *t, int status, const char *text) {
  if (!t || t->aborted) return;
  crun__tcp_lock(t);
  if (t->aborted) { /* another thread's abort came first */
    crun__tcp_unlock(t);
    return;
  }
  t->aborted = 1;
  const char *cut = strstr(text, " [reported by rank");
  size_t len = cut ? (size_t)(cut - text) : strlen(text);
  if (len > CRUN__ABORT_TEXT_MAX) len = CRUN__ABORT_TEXT_MAX; /* what a reader keeps */
  char why[512];
  snprintf(why, sizeof why, "the group is unusable after an earlier failure: %.*s", (int)(len < 400 ? len : 400), text);
  t->abort_why = strdup(why);
  int resets = 0;
  for (int j = 0; j < t->size; j++) {
    if (t->fds[j] < 0) continue;
    if (abort_frame_to(t, j, status, text, len) != 0) {
      shutdown(t->fds[j], SHUT_WR);
      continue;
    }
    t->reset_due[j] = 1;
    resets++;
  }
  /* the reason goes on the board before those resets, the peers react to
   * them: both at the outermost unlock (abort_finish); without memory for
   * it, the resets go now (the peers see EPEERDIED) */
  if (resets && !(t->reason_due = reason_value(status, text, len)))
    for (int j = 0; j < t->size; j++)
      if (t->reset_due[j]) {
        t->reset_due[j] = 0;
        reset_conn(t, j);
      }
  crun__tcp_fail_all(t, CRUN_ESTATE, why);
  crun__tcp_unlock(t);
}
