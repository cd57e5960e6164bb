/* tcp_p2p.c — point-to-point operations that progress in the background.
 *
 * A send writes what the socket takes at once; the rest waits in a per-peer
 * FIFO. A receive takes a stashed frame or is posted. Whoever drives the
 * transport next (a collective step, another p2p call, or the group's
 * progress thread when idle) pumps every pending send and reads from every
 * peer a posted receive waits on, so a posted send never keeps a later
 * receive from running (isend+recv rings over any message size). Frames to
 * one peer leave in issue order, and frames of one peer are matched to
 * receives in posting order per tag, as torch promises.
 *
 * Frames no receive takes yet wait in a per-peer stash, bounded for the group
 * by CRUN_TCP_UNEXPECTED_MAX bytes: a frame that does not fit is left unread
 * (its header kept, HELD) until a receive for it is posted or the stash
 * drains, so TCP's flow control stalls the sender instead of this rank's
 * memory growing. A collective that must read past such a frame fails with
 * ENOMEM naming it (crun__stash_full).
 *
 * A peer that goes away (killed, closed, or failed its group: it then sends
 * an abort frame and shuts its side) fails every operation pending on it at
 * once, with EPEERDIED or the peer's reason: a receive reads the close or
 * the abort frame (or, when a half-sent frame or a full socket kept that
 * frame out, the reason the peer left on the group's board before it reset
 * the connection), a send the socket takes nothing of looks for the hang-up
 * and then reads what the peer left, and a reader paused at a held frame is
 * watched for the hang-up while anything waits on that peer (it then reads
 * past that frame to the peer's abort frame, if one follows). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <unistd.h>

#include "transport/tcp_priv.h"

#define HDR sizeof(crun__hdr_t)

static size_t elsize(crun_dtype_t dt) {
  size_t s = crun_dtype_size(dt);
  return s ? s : 1;
}

/* Ends op (already unlinked) with rc; the text is in crun_last_error(). */
static void op_end(crun__tcp_t *t, crun__p2p_op_t *op, int rc) {
  crun__coll_t *c = op->c;
  free(op);
  t->npending--;
  crun__pg_p2p_done(t->pg, c, rc);
}

/* Fails op (already unlinked) with a formatted error. */
#define OP_FAIL(t, op, st, ...) op_end((t), (op), crun_error((st), __VA_ARGS__))

static void op_desc(const crun__tcp_t *t, const crun__p2p_op_t *op, char *buf, size_t cap) {
  crun__pg_coll_desc(t->pg, op->c, buf, cap);
}

/* Has peer j shut its side of the connection (or did it fail)? Polls without
 * waiting and remembers a hang-up in prx[j].hup: what j left is then read to
 * its end (an abort frame, or the close). */
static int peer_hung_up(crun__tcp_t *t, int j) {
  if (t->prx[j].hup) return 1;
  struct pollfd p = {t->fds[j], POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR))) return 0;
  return t->prx[j].hup = 1;
}

/* ---------------------------------------------------------------- the stash's limit */

/* What a stashed frame counts against the limit: its payload and its record. */
static size_t stash_cost(uint64_t nbytes) { return (size_t)nbytes + sizeof(crun__stash_t); }

int crun__stash_fits(const crun__tcp_t *t, uint64_t nbytes) {
  /* stash_bytes <= stash_max < 2^60 and nbytes <= stash_max: no overflow */
  return nbytes <= t->stash_max && t->stash_bytes + stash_cost(nbytes) <= t->stash_max;
}

crun__stash_t *crun__stash_new(crun__tcp_t *t, const crun__hdr_t *h) {
  crun__stash_t *s = calloc(1, sizeof *s);
  if (s && !(s->data = malloc(h->nbytes ? (size_t)h->nbytes : 1))) {
    free(s);
    s = NULL;
  }
  if (!s) return NULL;
  s->h = *h;
  t->stash_bytes += stash_cost(h->nbytes);
  t->stash_n++;
  return s;
}

void crun__stash_free(crun__tcp_t *t, crun__stash_t *s) {
  if (!s) return;
  t->stash_bytes -= stash_cost(s->h.nbytes);
  t->stash_n--;
  free(s->data);
  free(s);
}

int crun__stash_full(const crun__tcp_t *t, const char *desc, int from, const crun__hdr_t *h) {
  return crun_error(CRUN_ENOMEM, "%s on %s: %s sent a frame (tag %d, %llu bytes) no recv took that "
                    "would have to be buffered, but %d such frames already hold %zu bytes of the limit of %zu "
                    "(CRUN_TCP_UNEXPECTED_MAX): post the receives for them first, or raise the limit",
                    desc, CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, from), h->tag, (unsigned long long)h->nbytes, t->stash_n, t->stash_bytes,
                    t->stash_max);
}

/* The limit from CRUN_TCP_UNEXPECTED_MAX (bytes; default 256 MiB, at most 2^60). */
static size_t stash_limit(void) {
  long v = crun_env_int("CRUN_TCP_UNEXPECTED_MAX", 256l << 20);
  if (v < 0) v = 256l << 20;
  return (size_t)v > ((size_t)1 << 60) ? (size_t)1 << 60 : (size_t)v;
}

/* Unlinks and returns the first posted receive from `peer` (or any) with
 * `tag`; NULL when none. */
static crun__p2p_op_t *take_posted(crun__tcp_t *t, int peer, int tag) {
  for (crun__p2p_op_t **pp = &t->posted; *pp; pp = &(*pp)->next) {
    crun__p2p_op_t *op = *pp;
    if ((op->peer == peer || op->peer == CRUN_ANY_SOURCE) && op->c->tag == tag) {
      *pp = op->next;
      return op;
    }
  }
  return NULL;
}

/* Checks a send frame against the receive it matched; <0 with the text. */
static int check_frame(crun__tcp_t *t, const crun__p2p_op_t *op, int from, const crun__hdr_t *h) {
  const crun__coll_t *c = op->c;
  int dt = c->user_dt >= 0 ? c->user_dt : (int)c->dt;
  if (h->dtype == dt && h->nbytes == op->nbytes) return 0;
  char desc[64];
  op_desc(t, op, desc, sizeof desc);
  const char *mine = crun_dtype_name((crun_dtype_t)dt), *theirs = crun_dtype_name((crun_dtype_t)h->dtype);
  return crun_error(CRUN_EMISMATCH, "%s on %s expected %s[%llu], %s sent %s[%llu] (tag %d)", desc,
                    CRUN__WHO(t->pg, t->rank), mine ? mine : "?", (unsigned long long)(op->nbytes / elsize(c->dt)), CRUN__WHO(t->pg, from),
                    theirs ? theirs : "?", (unsigned long long)h->count, h->tag);
}

/* Finds the first stashed send frame some posted receive takes; 1 when one
 * was handed over (the lists may have changed). */
static int match_one(crun__tcp_t *t) {
  for (int j = 0; j < t->size; j++)
    for (crun__stash_t **sp = &t->stash[j]; *sp; sp = &(*sp)->next) {
      crun__stash_t *s = *sp;
      if (s->h.kind != CRUN__COLL_SEND) continue;
      crun__p2p_op_t *op = take_posted(t, j, s->h.tag);
      if (!op) continue;
      *sp = s->next;
      int rc = check_frame(t, op, j, &s->h);
      if (rc == 0 && op->nbytes) memcpy(op->c->buf, s->data, op->nbytes);
      op->c->src_out = j;
      crun__stash_free(t, s);
      op_end(t, op, rc);
      return 1;
    }
  return 0;
}

void crun__tcp_match(crun__tcp_t *t) {
  while (t->posted && match_one(t)) {}
}

/* ---------------------------------------------------------------- sends */

/* Writes what the socket takes of op; 1 done, 0 would block, <0 error. */
static int op_write(crun__tcp_t *t, crun__p2p_op_t *op) {
  size_t total = HDR + op->nbytes;
  while (op->off < total) {
    struct iovec iov[2];
    int n = 0;
    if (op->off < HDR) {
      iov[n++] = (struct iovec){(char *)&op->h + op->off, HDR - op->off};
      if (op->nbytes) iov[n++] = (struct iovec){op->c->buf, op->nbytes};
    } else {
      iov[n++] = (struct iovec){(char *)op->c->buf + (op->off - HDR), total - op->off};
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t k = sendmsg(t->fds[op->peer], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      op->off += (size_t)k;
      t->tx_dirty[op->peer] = op->off < total;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    char desc[64], how[128];
    crun__tcp_conn_how(k < 0 ? errno : 0, how, sizeof how);
    op_desc(t, op, desc, sizeof desc);
    return crun_error(CRUN_EPEERDIED, "%s on %s: connection to %s %s (the process died or left the group)",
                      desc, CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, op->peer), how);
  }
  return 1;
}

/* Pumps the send FIFO of peer j; 1 on progress. A send the socket takes
 * nothing of checks whether j hung up: a peer that failed its group shuts
 * its side and reads no more, and its abort frame says why. */
static int pump_sends(crun__tcp_t *t, int j) {
  int progress = 0;
  while (t->outq[j]) {
    crun__p2p_op_t *op = t->outq[j];
    size_t before = op->off;
    int r = op_write(t, op);
    progress |= op->off != before;
    if (r == 0 && op->off == before) peer_hung_up(t, j); /* then pump_reads reads what j left */
    if (r == 0) break;
    t->outq[j] = op->next;
    op_end(t, op, r < 0 ? r : 0);
    progress = 1;
  }
  return progress;
}

static int send_locked(crun__tcp_t *t, crun__coll_t *c) {
  if (t->aborted) return crun_error(CRUN_ESTATE, "%s: the tcp transport was aborted", CRUN__WHO(t->pg, t->rank));
  crun__p2p_op_t *op = calloc(1, sizeof *op);
  if (!op) return crun_error(CRUN_ENOMEM, "send");
  op->c = c;
  op->peer = c->root;
  op->nbytes = c->count * elsize(c->dt);
  op->h = (crun__hdr_t){.magic = CRUN__TCP_MAGIC, .group = t->group, .kind = CRUN__COLL_SEND,
                        .dtype = (uint8_t)(c->user_dt >= 0 ? c->user_dt : (int)c->dt), .op = (uint8_t)c->op,
                        .root = t->rank, .tag = c->tag, .count = c->count, .nbytes = op->nbytes};
  if (!t->outq[op->peer]) {
    int r = op_write(t, op);
    if (r != 0) {
      free(op);
      return r < 0 ? r : 0;
    }
  }
  crun__p2p_op_t **pp = &t->outq[op->peer];
  while (*pp) pp = &(*pp)->next;
  *pp = op;
  t->npending++;
  return CRUN__PENDING;
}

/* ---------------------------------------------------------------- receives */

/* Can the held frame of peer j move on: a receive posted for it, or room in
 * the stash? */
static int held_ready(const crun__tcp_t *t, int j) {
  const crun__hdr_t *h = &t->prx[j].h;
  if (crun__stash_fits(t, h->nbytes)) return 1;
  if (h->kind != CRUN__COLL_SEND) return 0;
  for (const crun__p2p_op_t *op = t->posted; op; op = op->next)
    if ((op->peer == j || op->peer == CRUN_ANY_SOURCE) && op->c->tag == h->tag) return 1;
  return 0;
}

/* Would peer j's going away fail a pending operation: a send to j, a
 * receive from j, or one from any source when every other peer is closed? */
static int held_waiter(const crun__tcp_t *t, int j) {
  if (t->outq[j]) return 1;
  int open = 0;
  for (int k = 0; k < t->size; k++) open += k != t->rank && k != j && !t->closed[k];
  for (const crun__p2p_op_t *op = t->posted; op; op = op->next)
    if (op->peer == j || (op->peer == CRUN_ANY_SOURCE && !open)) return 1;
  return 0;
}

/* Does a pending receive wait on peer j (or is a frame of j half read, or
 * did j hang up)? A held reader is watched for its peer's hang-up while an
 * operation waits on it. */
static int wants_peer(crun__tcp_t *t, int j) {
  if (j == t->rank || t->fds[j] < 0 || t->prx[j].state == CRUN__PRX_DEAD) return 0;
  if (t->prx[j].state == CRUN__PRX_HELD) return held_ready(t, j) || held_waiter(t, j);
  if (t->prx[j].state != CRUN__PRX_HDR || t->prx[j].hgot || t->prx[j].hup) return 1;
  if (t->closed[j]) return 0;
  for (crun__p2p_op_t *op = t->posted; op; op = op->next)
    if (op->peer == j || op->peer == CRUN_ANY_SOURCE) return 1;
  return 0;
}

/* Writes into buf (empty when none) a note on the first send frame of peer
 * `peer` (of any peer: CRUN_ANY_SOURCE) that waits in the stash: a receive
 * that got nothing from that peer most likely gave another tag. */
static void unmatched_note(const crun__tcp_t *t, int peer, char *buf, size_t cap) {
  buf[0] = 0;
  for (int j = 0; j < t->size; j++) {
    if (peer != CRUN_ANY_SOURCE && j != peer) continue;
    if (t->prx && t->prx[j].state == CRUN__PRX_HELD) {
      snprintf(buf, cap, " (reading from %s is paused: its next frame, tag %d of %llu bytes, does not fit "
               "beside the %d frames no recv took yet (%zu bytes; limit CRUN_TCP_UNEXPECTED_MAX=%zu): post "
               "their receives first, or raise the limit)", CRUN__WHO(t->pg, j), t->prx[j].h.tag,
               (unsigned long long)t->prx[j].h.nbytes, t->stash_n, t->stash_bytes, t->stash_max);
      return;
    }
    for (const crun__stash_t *s = t->stash[j]; s; s = s->next) {
      if (s->h.kind != CRUN__COLL_SEND) continue;
      const char *dt = crun_dtype_name((crun_dtype_t)s->h.dtype);
      snprintf(buf, cap, " (%s sent %s[%llu] with tag %d, which no recv took: do the tags differ?)", CRUN__WHO(t->pg, j),
               dt ? dt : "?", (unsigned long long)s->h.count, s->h.tag);
      return;
    }
  }
}

/* Peer j failed its group for the reason (h, why) of its abort frame or of
 * the board: every pending operation fails with it. */
static void peer_aborted(crun__tcp_t *t, int j, const crun__hdr_t *h, const char *why) {
  int st;
  char text[4200];
  const char *body = crun__tcp_abort_body(h, why, &st);
  snprintf(text, sizeof text, "%s [reported by %s; %s was in a point-to-point operation]", body, CRUN__WHO(t->pg, j),
           CRUN__WHO(t->pg, t->rank));
  crun__tcp_fail_all(t, st, text);
}

/* An abort frame of peer j was read whole: every pending operation fails.
 * The reason stays in x (h, text) for a collective step (tcp_xfer.c). */
static void prx_abort_done(crun__tcp_t *t, int j) {
  crun__prx_t *x = &t->prx[j];
  x->state = CRUN__PRX_DEAD;
  peer_aborted(t, j, &x->h, x->text);
}

/* Fails the receives that can no longer be served after peer j went away
 * (err: the connection's errno, 0 when j closed it), and the sends to j (a
 * peer that shut its side reads no more either). */
static void peer_gone(crun__tcp_t *t, int j, int err) {
  crun__prx_t *x = &t->prx[j];
  char how[128];
  crun__tcp_conn_how(err, how, sizeof how);
  char held[320] = ""; /* why the frames j sent last were not read */
  if (x->state == CRUN__PRX_HELD) unmatched_note(t, j, held, sizeof held);
  x->state = CRUN__PRX_DEAD;
  t->closed[j] = 1;
  crun__stash_free(t, x->frame);
  x->frame = NULL;
  crun__hdr_t h;
  char why[CRUN__ABORT_TEXT_MAX + 1];
  if (crun__tcp_board_reason(t, j, &h, why, sizeof why)) { /* j failed its group: its abort frame could not come */
    free(x->text); /* kept for a collective step, as prx_abort_done does */
    x->h = h;
    x->text = strdup(why);
    peer_aborted(t, j, &h, why);
    return;
  }
  int open = 0;
  for (int k = 0; k < t->size; k++) open += k != t->rank && !t->closed[k];
  crun__p2p_op_t *op = x->direct;
  x->direct = NULL;
  for (;;) {
    if (!op) {
      crun__p2p_op_t **pp = &t->posted;
      while (*pp && !((*pp)->peer == j || ((*pp)->peer == CRUN_ANY_SOURCE && !open))) pp = &(*pp)->next;
      if (!*pp) pp = &t->outq[j];
      if (!(op = *pp)) return;
      *pp = op->next;
    }
    char desc[64], note[320];
    op_desc(t, op, desc, sizeof desc);
    unmatched_note(t, op->peer, note, sizeof note);
    if (held[0]) snprintf(note, sizeof note, "%s", held);
    if (op->c->kind == CRUN__COLL_SEND) note[0] = 0;
    if (op->peer == CRUN_ANY_SOURCE && !open) /* else it was taking j's frame (direct) */
      OP_FAIL(t, op, CRUN_EPEERDIED, "%s on %s: every peer closed its connection%s", desc, CRUN__WHO(t->pg, t->rank), note);
    else
      OP_FAIL(t, op, CRUN_EPEERDIED, "%s on %s: connection to %s %s (the process died or left the group)%s",
              desc, CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, j), how, note);
    op = NULL;
  }
}

/* Reads up to n bytes from peer j; bytes, 0 would block, -1 gone (handled). */
static ssize_t prx_read(crun__tcp_t *t, int j, void *p, size_t n) {
  ssize_t k = recv(t->fds[j], p, n, MSG_DONTWAIT);
  if (k > 0) return k;
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  peer_gone(t, j, k == 0 ? 0 : errno);
  return -1;
}

/* A whole header of peer j arrived: pick where its payload goes. */
static void prx_header(crun__tcp_t *t, int j) {
  crun__prx_t *x = &t->prx[j];
  x->hgot = 0;
  x->got = 0;
  char text[160];
  if (crun__tcp_hdr_garbled(&x->h, t->group, t->pg, t->rank, j, text, sizeof text)) {
    x->state = CRUN__PRX_DEAD;
    crun__tcp_fail_all(t, CRUN_EPROTO, text);
    return;
  }
  if (x->h.kind == CRUN__KIND_ABORT) {
    x->text = calloc(1, CRUN__ABORT_TEXT_MAX + 1);
    x->state = x->text ? CRUN__PRX_ABORT : CRUN__PRX_DEAD;
    return;
  }
  crun__p2p_op_t *op = x->h.kind == CRUN__COLL_SEND ? take_posted(t, j, x->h.tag) : NULL;
  if (op && check_frame(t, op, j, &x->h) < 0) {
    op_end(t, op, CRUN_EMISMATCH); /* the frame itself goes to the stash */
    op = NULL;
  }
  if (op) {
    op->c->src_out = j;
    x->direct = op;
    x->state = CRUN__PRX_DIRECT;
    return;
  }
  if (!crun__stash_fits(t, x->h.nbytes)) {
    if (x->state != CRUN__PRX_HELD)
      CRUN_LOG(INFO, NET, "rank %d: stash full (%d frames, %zu of %zu bytes): stop reading rank %d at its "
               "%s frame (tag %d, %llu bytes) until a recv takes it or the stash drains", t->rank, t->stash_n,
               t->stash_bytes, t->stash_max, j, crun__coll_name(x->h.kind), x->h.tag,
               (unsigned long long)x->h.nbytes);
    x->state = CRUN__PRX_HELD;
    return;
  }
  if (!(x->frame = crun__stash_new(t, &x->h))) {
    x->state = CRUN__PRX_DEAD;
    crun__tcp_fail_all(t, CRUN_ENOMEM, "out of memory for a received frame");
    return;
  }
  x->state = CRUN__PRX_STASH;
}

/* A whole frame of peer j arrived. */
static void prx_frame_done(crun__tcp_t *t, int j) {
  crun__prx_t *x = &t->prx[j];
  x->state = CRUN__PRX_HDR;
  if (x->direct) {
    crun__p2p_op_t *op = x->direct;
    x->direct = NULL;
    op_end(t, op, 0);
    return;
  }
  crun__stash_t **pp = &t->stash[j];
  while (*pp) pp = &(*pp)->next;
  *pp = x->frame;
  x->frame = NULL;
  crun__tcp_match(t);
}


/* Peer j hung up while its reader is held: all j sent is in this socket.
 * Reads past the held frame (nothing can take it now that j is gone) to see
 * whether an abort frame follows it: j failed its group and says why. 1 with
 * the reader reading that frame (prx_abort_done then fails what is pending
 * with j's reason); 0 otherwise, the held header kept for peer_gone's note. */
static int held_skip_to_abort(crun__tcp_t *t, int j) {
  crun__prx_t *x = &t->prx[j];
  char sink[4096];
  for (uint64_t left = x->h.nbytes; left;) {
    ssize_t k = recv(t->fds[j], sink, left < sizeof sink ? (size_t)left : sizeof sink, MSG_DONTWAIT);
    if (k <= 0) return 0;
    left -= (uint64_t)k;
  }
  crun__hdr_t h;
  char why[160];
  if (recv(t->fds[j], &h, HDR, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)HDR || h.kind != CRUN__KIND_ABORT ||
      crun__tcp_hdr_garbled(&h, t->group, t->pg, t->rank, j, why, sizeof why) || !(x->text = calloc(1, CRUN__ABORT_TEXT_MAX + 1)))
    return 0;
  if (recv(t->fds[j], &x->h, HDR, MSG_DONTWAIT) != (ssize_t)HDR) { /* cannot fail after the peek */
    free(x->text);
    x->text = NULL;
    return 0;
  }
  x->hgot = x->got = 0;
  x->state = CRUN__PRX_ABORT;
  return 1;
}

/* Peer j's reader is held and an operation waits on j: when j hung up (its
 * frames now end at what this socket holds, and the one in front is held) or
 * the connection failed, fails them with the reason of j's abort frame when
 * one waits behind the held frame, else as peer_gone does, so they do not
 * wait for their deadline; 1 then. Without a waiter the held frame stays
 * readable for a receive posted later. */
static int held_watch(crun__tcp_t *t, int j) {
  if (!peer_hung_up(t, j)) return 0;
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(t->fds[j], SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = 0;
  if (held_skip_to_abort(t, j)) return 1; /* pump_reads reads it on */
  peer_gone(t, j, err);
  return 1;
}

/* A header was read whole: zero-byte frames end at once. */
static void prx_after_header(crun__tcp_t *t, int j) {
  crun__prx_t *x = &t->prx[j];
  prx_header(t, j);
  if (x->h.nbytes) return;
  if (x->state == CRUN__PRX_DIRECT || x->state == CRUN__PRX_STASH) prx_frame_done(t, j);
  else if (x->state == CRUN__PRX_ABORT) prx_abort_done(t, j);
}

/* Reads what peer j has; 1 on progress. */
static int pump_reads(crun__tcp_t *t, int j) {
  crun__prx_t *x = &t->prx[j];
  int progress = 0;
  while (x->state != CRUN__PRX_DEAD && wants_peer(t, j)) {
    ssize_t k;
    size_t n = x->h.nbytes;
    if (x->state == CRUN__PRX_HELD) { /* wants_peer: it can move on, or a receive waits on it */
      if (!held_ready(t, j)) return held_watch(t, j) | progress;
      prx_after_header(t, j);
      progress = 1;
    } else if (x->state == CRUN__PRX_HDR) {
      if ((k = prx_read(t, j, (char *)&x->h + x->hgot, HDR - x->hgot)) <= 0) return progress;
      progress = 1;
      if ((x->hgot += (size_t)k) == HDR) prx_after_header(t, j);
    } else if (x->state == CRUN__PRX_ABORT) {
      char sink[4096];
      size_t want;
      char *dst = crun__tcp_abort_dst(x->text, sink, sizeof sink, n, x->got, &want);
      if (want && (k = prx_read(t, j, dst, want)) <= 0) return progress;
      x->got += want ? (size_t)k : 0;
      progress = 1;
      if (x->got >= n) prx_abort_done(t, j);
    } else {
      char *dst = x->state == CRUN__PRX_DIRECT ? (char *)x->direct->c->buf : (char *)x->frame->data;
      if ((k = prx_read(t, j, dst + x->got, n - x->got)) <= 0) return progress;
      x->got += (size_t)k;
      progress = 1;
      if (x->got == n) prx_frame_done(t, j);
    }
  }
  return progress;
}

static int recv_locked(crun__tcp_t *t, crun__coll_t *c) {
  if (t->aborted) return crun_error(CRUN_ESTATE, "%s: the tcp transport was aborted", CRUN__WHO(t->pg, t->rank));
  crun__p2p_op_t *op = calloc(1, sizeof *op);
  if (!op) return crun_error(CRUN_ENOMEM, "recv");
  op->c = c;
  op->peer = c->root;
  op->nbytes = c->count * elsize(c->dt);
  if (op->peer != CRUN_ANY_SOURCE && t->prx[op->peer].state == CRUN__PRX_DEAD && !t->stash[op->peer]) {
    free(op);
    char desc[64];
    crun__pg_coll_desc(t->pg, c, desc, sizeof desc);
    return crun_error(CRUN_EPEERDIED, "%s on %s: connection to %s is closed", desc, CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, c->root));
  }
  crun__p2p_op_t **pp = &t->posted;
  while (*pp) pp = &(*pp)->next;
  *pp = op;
  t->npending++;
  /* a stashed frame may serve it at once: then it ends through the group */
  crun__tcp_match(t);
  crun__tcp_pump(t, -1);
  return CRUN__PENDING;
}

/* ---------------------------------------------------------------- the pump */

/* Fails the pending operations whose deadline passed; 1 when one was. */
static int expire(crun__tcp_t *t) {
  double now = crun_clock();
  int any = 0;
  for (int again = 1; again;) {
    again = 0;
    crun__p2p_op_t *op = NULL;
    int peer = -1;
    for (crun__p2p_op_t **pp = &t->posted; *pp; pp = &(*pp)->next)
      if ((*pp)->c->deadline <= now) { op = *pp; *pp = op->next; break; }
    for (int j = 0; !op && j < t->size; j++) {
      if (t->outq && t->outq[j] && t->outq[j]->c->deadline <= now) { op = t->outq[j]; t->outq[j] = op->next; }
      else if (t->prx[j].direct && t->prx[j].direct->c->deadline <= now) {
        op = t->prx[j].direct;
        t->prx[j].direct = NULL;
        t->prx[j].state = CRUN__PRX_DEAD; /* its frame is half read into a buffer we give back */
        t->prx[j].cut = 1;
      }
      peer = j;
    }
    if (!op) return any;
    any = 1;
    char desc[64], where[1024], note[320] = "";
    op_desc(t, op, desc, sizeof desc);
    crun__pg_progress_report(t->pg, where, sizeof where);
    int is_send = op->c->kind == CRUN__COLL_SEND;
    if (!is_send) unmatched_note(t, op->peer, note, sizeof note);
    if (is_send)
      OP_FAIL(t, op, CRUN_ETIMEDOUT, "%s on %s: %s took no data for %.1f s; %s", desc, CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, peer),
              op->c->timeout, where);
    else if (op->peer == CRUN_ANY_SOURCE)
      OP_FAIL(t, op, CRUN_ETIMEDOUT, "%s on %s: no sender after %.1f s%s; %s", desc, CRUN__WHO(t->pg, t->rank), op->c->timeout,
              note, where);
    else
      OP_FAIL(t, op, CRUN_ETIMEDOUT, "%s on %s: no data from %s after %.1f s%s; %s", desc, CRUN__WHO(t->pg, t->rank),
              CRUN__WHO(t->pg, op->peer), op->c->timeout, note, where);
    again = 1;
  }
  return any;
}

int crun__tcp_pump(crun__tcp_t *t, int skip) {
  int progress = 0; /* no shortcut on npending == 0: a stash frame may be half read */
  for (int j = 0; j < t->size; j++) {
    if (j == t->rank || t->fds[j] < 0) continue;
    if (t->outq[j]) progress |= pump_sends(t, j);
    if (j != skip) progress |= pump_reads(t, j);
  }
  /* an expiry is progress: a caller waiting for a reader to settle (a
   * receive dropped mid-frame) must look again before it sleeps */
  return expire(t) | progress;
}

void crun__tcp_pump_events(crun__tcp_t *t, int skip) {
  for (int j = 0; j < t->size; j++) {
    if (j == t->rank || t->fds[j] < 0) continue;
    if (t->outq[j]) t->pfd[j].events |= POLLOUT | (t->prx[j].hup ? 0 : POLLRDHUP);
    if (j == skip || !wants_peer(t, j)) continue;
    /* a held reader waits for its peer's hang-up only: its bytes are there */
    t->pfd[j].events |= t->prx[j].state == CRUN__PRX_HELD && !held_ready(t, j) ? POLLRDHUP : POLLIN;
  }
}

double crun__tcp_pump_deadline(crun__tcp_t *t) {
  double d = 1e300;
  for (crun__p2p_op_t *op = t->posted; op; op = op->next)
    if (op->c->deadline < d) d = op->c->deadline;
  for (int j = 0; j < t->size; j++) {
    if (t->outq[j] && t->outq[j]->c->deadline < d) d = t->outq[j]->c->deadline;
    if (t->prx[j].direct && t->prx[j].direct->c->deadline < d) d = t->prx[j].direct->c->deadline;
  }
  return d;
}

/* Polls the pending operations' sockets for at most wait_s seconds. */
static void pump_wait(crun__tcp_t *t, int skip, double wait_s) {
  for (int j = 0; j < t->size; j++) t->pfd[j] = (struct pollfd){-1, 0, 0};
  crun__tcp_pump_events(t, skip);
  for (int j = 0; j < t->size; j++)
    if (t->pfd[j].events) t->pfd[j].fd = t->fds[j];
  double left = crun__tcp_pump_deadline(t) - crun_clock();
  if (left > wait_s) left = wait_s;
  if (left < 0) left = 0;
  poll(t->pfd, (nfds_t)t->size, (int)(left * 1000.0) + 1);
}

/* The group's pump callback (a blocking call waiting for its own p2p
 * operation): progress, wait up to wait_s, progress again. */
static int tcp_progress(void *arg, double wait_s) {
  crun__tcp_t *t = arg;
  crun__tcp_lock(t);
  int r = crun__tcp_pump(t, -1);
  if (!r && t->npending) {
    pump_wait(t, -1, wait_s);
    r = crun__tcp_pump(t, -1);
  }
  crun__tcp_unlock(t);
  return r;
}

/* Wakes the pump thread: new pending work or stop. Called with mu held. */
static void wake_pump(crun__tcp_t *t) {
  pthread_cond_signal(&t->cv);
  char b = 1;
  if (t->has_pump && write(t->wake[1], &b, 1) < 0 && errno != EAGAIN)
    CRUN_LOG(TRACE, NET, "pump wake: %s", strerror(errno));
}

/* Builds the pump thread's poll set (sockets + the wake pipe); returns the
 * poll timeout in ms. Called with mu held. */
static int pump_poll_set(crun__tcp_t *t) {
  for (int j = 0; j < t->size; j++) t->pfd[j] = (struct pollfd){-1, 0, 0};
  crun__tcp_pump_events(t, -1);
  for (int j = 0; j < t->size; j++)
    t->tpfd[j] = (struct pollfd){t->pfd[j].events ? t->fds[j] : -1, t->pfd[j].events, 0};
  t->tpfd[t->size] = (struct pollfd){t->wake[0], POLLIN, 0};
  double left = crun__tcp_pump_deadline(t) - crun_clock();
  if (left > 0.5) left = 0.5;
  return left > 0 ? (int)(left * 1000.0) + 1 : 0;
}

/* The pump thread: while p2p operations are pending and no other thread
 * drives the transport, progresses them. */
static void *pump_main(void *arg) {
  crun__tcp_t *t = arg;
  crun__tcp_lock(t);
  while (!t->pump_stop) {
    if (t->reason_due) { /* an abort this thread's pumping caused: finish it */
      crun__tcp_unlock(t);
      crun__tcp_lock(t);
      continue;
    }
    if (!t->npending) {
      t->lock_depth = 0; /* the wait releases mu */
      pthread_cond_wait(&t->cv, &t->mu);
      t->lock_depth = 1;
      continue;
    }
    if (crun__tcp_pump(t, -1)) continue;
    int ms = pump_poll_set(t);
    crun__tcp_unlock(t);
    poll(t->tpfd, (nfds_t)t->size + 1, ms);
    char sink[64];
    if (t->tpfd[t->size].revents & POLLIN)
      while (read(t->wake[0], sink, sizeof sink) > 0) {}
    crun__tcp_lock(t);
  }
  crun__tcp_unlock(t);
  return NULL;
}

int crun__tcp_p2p_init(crun__tcp_t *t) {
  t->tpfd = calloc((size_t)t->size + 1, sizeof *t->tpfd);
  if (!t->tpfd) return crun_error(CRUN_ENOMEM, "tcp transport");
  if (pipe(t->wake) < 0) return crun_error(CRUN_ESYS, "tcp transport: pipe: %s", strerror(errno));
  for (int i = 0; i < 2; i++) fcntl(t->wake[i], F_SETFL, fcntl(t->wake[i], F_GETFL) | O_NONBLOCK | FD_CLOEXEC);
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&t->mu, &a);
  pthread_mutexattr_destroy(&a);
  pthread_cond_init(&t->cv, NULL);
  t->has_mu = 1;
  t->stash_max = stash_limit();
  t->pg->pump = tcp_progress;
  t->pg->pump_arg = t;
  return 0;
}

/* Starts the pump thread before the first operation that may stay pending
 * with no caller pumping it; <0 (ESYS naming c) when it cannot start: such an
 * operation would then wait with nothing to progress it or end it at its
 * deadline. Called with mu held. */
static int pump_start(crun__tcp_t *t, const crun__coll_t *c) {
  if (t->has_pump || t->pump_stop) return 0;
  int e = pthread_create(&t->pump_th, NULL, pump_main, t);
  t->has_pump = e == 0;
  if (!e) return 0;
  char desc[64];
  crun__pg_coll_desc(t->pg, c, desc, sizeof desc);
  return crun_error(CRUN_ESYS, "%s on %s: cannot start the thread that progresses point-to-point operations "
                    "(%s)", desc, CRUN__WHO(t->pg, t->rank), strerror(e));
}

void crun__tcp_p2p_fini(crun__tcp_t *t) {
  if (!t->has_mu) return;
  crun__tcp_lock(t);
  t->pump_stop = 1;
  wake_pump(t);
  int had = t->has_pump;
  crun__tcp_unlock(t);
  if (had) pthread_join(t->pump_th, NULL);
  crun__tcp_lock(t);
  crun__tcp_fail_all(t, CRUN_ECLOSED, "the group was destroyed while it was pending");
  crun__tcp_unlock(t);
  if (t->pg->pump_arg == t) t->pg->pump = NULL;
  close(t->wake[0]);
  close(t->wake[1]);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  free(t->tpfd);
  t->has_mu = 0;
}

/* Runs a send or receive under the lock; wakes the pump when it is pending.
 * A pending operation may already have ended (and its work be freed) when fn
 * returns, so c is not read after the call. */
static int p2p_call(crun__tcp_t *t, crun__coll_t *c, int (*fn)(crun__tcp_t *, crun__coll_t *)) {
  int caller_pumps = c->caller_pumps; /* c may be gone once fn returns */
  crun__tcp_lock(t);
  int rc = caller_pumps ? 0 : pump_start(t, c);
  if (rc == 0) rc = fn(t, c);
  if (rc == CRUN__PENDING && !caller_pumps) wake_pump(t);
  crun__tcp_unlock(t);
  return rc;
}

int crun__tcp_send(crun__tcp_t *t, crun__coll_t *c) { return p2p_call(t, c, send_locked); }
int crun__tcp_recv(crun__tcp_t *t, crun__coll_t *c) { return p2p_call(t, c, recv_locked); }

int crun__tcp_settle(crun__tcp_t *t, int peer, double deadline) {
  crun__prx_t *x = &t->prx[peer];
  /* a held frame stays for the step (tcp_xfer.c takes its header over) */
  while (x->state != CRUN__PRX_DEAD && x->state != CRUN__PRX_HELD && (x->state != CRUN__PRX_HDR || x->hgot)) {
    if (crun__tcp_pump(t, -1)) continue;
    if (crun_clock() >= deadline)
      return crun_error(CRUN_ETIMEDOUT, "%s: a frame from %s stayed half received", CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, peer));
    pump_wait(t, -1, deadline - crun_clock());
  }
  return 0;
}

void crun__tcp_fail_all(crun__tcp_t *t, int status, const char *text) {
  for (;;) {
    crun__p2p_op_t *op = t->posted;
    if (op) t->posted = op->next;
    for (int j = 0; !op && t->outq && j < t->size; j++)
      if ((op = t->outq[j])) t->outq[j] = op->next;
    for (int j = 0; !op && t->prx && j < t->size; j++)
      if ((op = t->prx[j].direct)) {
        t->prx[j].direct = NULL;
        t->prx[j].state = CRUN__PRX_DEAD;
        t->prx[j].cut = 1;
      }
    if (!op) return;
    char desc[64];
    op_desc(t, op, desc, sizeof desc);
    OP_FAIL(t, op, status, "%s on %s: %s", desc, CRUN__WHO(t->pg, t->rank), text);
  }
}
