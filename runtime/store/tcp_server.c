/* tcp_server.c — the TCP store server: one libuv loop on its own thread.
 *
 * Each connection buffers what it reads and serves its frames in order. A
 * GET / WAIT / MULTI_GET / JOIN_WAIT whose keys are missing stays at the head
 * of its connection's buffer and the connection is "parked" (nothing more is
 * read from it until it is answered). Its first park starts a timer for
 * the timeout_ms it carries (capped at CRUN_STORE_PARK_MAX_MS); the timer
 * answers ETIMEDOUT and the connection goes on with its next request. A
 * write that creates a key a parked request names moves that connection to
 * the ready queue, which is drained at the end of every callback, so
 * handlers never recurse; an answer stops the timer. A QUEUE_POP on an
 * empty queue parks the same way, on its queue key, with a ticket (its
 * place among the poppers); a QUEUE_PUSH readies the parked popper of its
 * key with the smallest ticket, only that one. A frame that
 * breaks the protocol (bad version, length over CRUN_STORE_MAX_FRAME,
 * arguments that do not fill the frame, unknown op) closes that connection
 * with a WARN STORE log line; others are not affected. */
#include "store/store_impl.h"
#include "store/tcp_proto.h"
#include "core/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct conn conn_t;

#define WAIT_BUCKETS 1024u /* lists of parked requests, by key hash */

struct crun_store_server {
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_pipe_t local;            /* same-host clients: an abstract unix socket */
  int has_local;
  uv_async_t stop_async;
  uv_thread_t thread;
  int port, started;
  char addr[80];
  crun__kv_t kv;
  crun__kv_t queues;          /* queue_push / queue_pop: their own namespace */
  uint64_t tickets;           /* parked poppers are numbered in arrival order */
  int64_t joined;
  crun__auth_t auth;          /* the job's secret (auth.on == 0: open store) */
  unsigned long refused;      /* clients refused (logged once, then counted) */
  atomic_ulong accepted;      /* connections accepted so far (crun__store_server_accepted) */
  conn_t *conns;              /* every open connection */
  atomic_int nconns;          /* how many: read by other threads (crun__store_server_clients) */
  conn_t *waiters[WAIT_BUCKETS]; /* parked requests by the hash of the key they wait for */
  conn_t *join_waiters;       /* parked JOIN_WAITs */
  conn_t *ready, *ready_tail; /* parked ones to look at again */
  int draining;
  size_t max_value;           /* the largest value a set may store (CRUN_STORE_MAX_VALUE_BYTES) */
  double spin;                /* seconds the loop polls after a request before it blocks */
  double active_at;           /* when the last request arrived (crun_clock) */
  int active_local;           /* it came over the unix socket */
  int ncpus;                  /* CPUs of this machine */
  double round_at;            /* when the current round of ACTIVE_ROUND began */
  unsigned round;             /* its number */
  int round_conns, busy_conns;/* clients heard from in it, and in the round before */
};

struct conn {
  union {
    uv_tcp_t tcp;   /* a client over TCP */
    uv_pipe_t pipe; /* a same-host client over the unix socket */
  } h;
  crun_store_server_t *srv;
  conn_t *prev, *next;   /* srv->conns */
  conn_t *pprev, *pnext; /* the list it is parked in (srv->waiters[i] or srv->join_waiters) */
  conn_t **plist;        /* that list's head */
  size_t wrel;           /* the missing key it waits for: at buf + off + wrel */
  uint32_t wlen;         /* (an offset: buf moves as more bytes arrive) */
  conn_t *rnext;         /* srv->ready */
  int parked, in_ready, closing, throttled;
  int authed;              /* passed the challenge-response (core/auth.h) */
  int local;               /* a same-host client on the unix socket */
  unsigned round;          /* the last round of ACTIVE_ROUND it sent a request in */
  uint64_t ticket;         /* a parked QUEUE_POP's place in line (0: none) */
  uv_timer_t timer;        /* the head request's deadline (when has_timer) */
  int has_timer, handles;  /* handles: open libuv handles (freed at 0) */
  int timed;               /* the timer runs for the head request */
  uint64_t timeout_ms;     /* what it was started with (for the error text) */
  double since;            /* when it connected (unauthenticated ones expire) */
  size_t queued;           /* bytes of queued replies, with their bookkeeping */
  unsigned char nonce[32]; /* the greeting's nonce */
  uint8_t *buf;
  size_t off, len, cap;  /* unserved bytes are buf[off..len) */
  uint8_t *obuf;         /* replies not written yet (flush_out) */
  size_t olen, ocap;
  int late_rc;           /* a set sent without waiting failed: the next request's reply */
  unsigned late_more;    /* how many more failed after it */
  char late[320];        /* its text */
  char peer[64];
};

typedef struct {
  uv_write_t req;
  uv_buf_t buf;
  uint8_t *own; /* a buffer the bytes live in, freed with the request (NULL: they follow it) */
} wreq_t;

static void wreq_free(wreq_t *w) {
  free(w->own);
  free(w);
}

enum { FRAME_DONE, FRAME_PARK, FRAME_CLOSE };

/* Bytes a client may pipeline behind a request that is waiting. */
#define PARKED_BACKLOG_MAX ((size_t)64 << 20)
/* Reply bytes queued for a client that does not read (counting each
 * reply's bookkeeping, so a flood of tiny replies is bounded too), before the
 * server stops serving (and reading) that connection until they drain. */
#define WRITE_BACKLOG_MAX ((size_t)64 << 20)
/* Connections still in the handshake: at most this many (the oldest goes
 * when another arrives: a real client finishes in well under a millisecond),
 * each for at most HANDSHAKE_SECONDS. */
#define PENDING_MAX 1024
#define HANDSHAKE_SECONDS 10.0
/* Clients that sent a request within this many seconds count as busy. */
#define ACTIVE_ROUND 1e-3
/* Replies buffered for one connection before they are written mid-pass. */
#define OUT_FLUSH ((size_t)64 << 10)

/* ------------------------------------------------------------ lists */

static unsigned key_bucket(const void *key, size_t len) {
  return (unsigned)(crun__kv_hash(key, len) % WAIT_BUCKETS);
}

static int key_exists(crun_store_server_t *srv, const uint8_t *k, uint32_t len) {
  return crun__kv_find(&srv->kv, (const char *)k, len) != NULL;
}

/* Whether c's head request (parked or about to be) is a QUEUE_POP. */
static int is_pop(const conn_t *c) { return c->buf[c->off + 5] == CRUN__SOP_QUEUE_POP; }

/* Parks c's head request: indexed by the first of its keys that is missing
 * (a set of that key wakes it; it then looks again and, if another key is
 * still missing, parks on that one), or in the join list. So a set looks at
 * the requests waiting for its own key only. */
static void parked_add(crun_store_server_t *srv, conn_t *c) {
  const uint8_t *f = c->buf + c->off;
  c->wrel = 0, c->wlen = 0;
  c->plist = &srv->join_waiters;
  if (f[5] == CRUN__SOP_QUEUE_POP) { /* waits for an item of the queue named by its key */
    c->wrel = CRUN_STORE_FRAME_HDR + 4, c->wlen = crun__get_u32(f + CRUN_STORE_FRAME_HDR);
    c->plist = &srv->waiters[key_bucket(f + c->wrel, c->wlen)];
  } else if (f[5] != CRUN__SOP_JOIN_WAIT) {
    unsigned nkeys = ((unsigned)f[6] | (unsigned)f[7] << 8) - 1; /* the last is the timeout */
    size_t p = CRUN_STORE_FRAME_HDR;
    for (unsigned i = 0; i < nkeys; i++) {
      uint32_t l = crun__get_u32(f + p);
      c->wrel = p + 4, c->wlen = l;
      if (!key_exists(srv, f + p + 4, l)) break;
      p += 4 + l;
    }
    c->plist = &srv->waiters[key_bucket(f + c->wrel, c->wlen)];
  }
  c->parked = 1;
  c->pprev = NULL;
  c->pnext = *c->plist;
  if (*c->plist) (*c->plist)->pprev = c;
  *c->plist = c;
}

static void parked_remove(crun_store_server_t *srv, conn_t *c) {
  (void)srv;
  if (!c->parked) return;
  if (c->pprev) c->pprev->pnext = c->pnext;
  else *c->plist = c->pnext;
  if (c->pnext) c->pnext->pprev = c->pprev;
  c->parked = 0;
}

static void ready_push(crun_store_server_t *srv, conn_t *c) {
  if (c->in_ready) return;
  c->in_ready = 1;
  c->rnext = NULL;
  if (srv->ready_tail) srv->ready_tail->rnext = c;
  else srv->ready = c;
  srv->ready_tail = c;
}

static void ready_remove(crun_store_server_t *srv, conn_t *c) {
  conn_t **pp = &srv->ready, *prev = NULL;
  for (; *pp && *pp != c; prev = *pp, pp = &(*pp)->rnext) {}
  if (!*pp) return;
  *pp = c->rnext;
  if (srv->ready_tail == c) srv->ready_tail = prev;
  c->in_ready = 0;
}

/* ------------------------------------------------------------ connections */

/* Frees c once the last of its libuv handles (stream, timer) has closed. */
static void on_conn_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  if (--c->handles > 0) return;
  free(c->buf);
  free(c->obuf);
  free(c);
}

static void wake_pop(crun_store_server_t *srv, const char *key, size_t klen);

/* Takes c's head request out of the parked list and the ready queue. A
 * popper that was readied for an item passes the wakeup on to the next
 * popper of its key, so an item never waits while a popper sleeps. */
static void unpark(crun_store_server_t *srv, conn_t *c) {
  int pass = c->parked && c->in_ready && is_pop(c);
  parked_remove(srv, c);
  if (c->in_ready) ready_remove(srv, c);
  if (pass) wake_pop(srv, (const char *)c->buf + c->off + c->wrel, c->wlen);
}

static void flush_out(conn_t *c);

/* Closes a connection (once), dropping any parked request; the replies
 * already made are written first (a "bad version" answer, say). */
static void conn_close(conn_t *c, const char *why) {
  if (c->closing) return;
  flush_out(c);
  if (c->closing) return;
  crun_store_server_t *srv = c->srv;
  c->closing = 1;
  if (why) CRUN_LOG(WARN, STORE, "store server %s: closing connection from %s: %s", srv->addr, c->peer, why);
  unpark(srv, c);
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  if (c->has_timer) uv_close((uv_handle_t *)&c->timer, on_conn_closed);
  atomic_fetch_sub(&srv->nconns, 1);
  uv_close((uv_handle_t *)&c->h, on_conn_closed);
}

static void serve_conn(conn_t *c);
static void drain_ready(crun_store_server_t *srv);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *out);
static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void on_written(uv_write_t *req, int status) {
  wreq_t *w = (wreq_t *)req;
  conn_t *c = req->handle->data;
  c->queued -= sizeof *w + w->buf.len;
  wreq_free(w);
  if (status < 0 && status != UV_ECANCELED) { /* the client went away: not its fault */
    CRUN_LOG(INFO, STORE, "store server %s: write to %s: %s", c->srv->addr, c->peer,
             uv_strerror(status));
    conn_close(c, NULL);
  }
  if (c->closing || !c->throttled || c->queued > WRITE_BACKLOG_MAX / 2)
    return;
  c->throttled = 0;
  uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
  serve_conn(c);
  drain_ready(c->srv);
}

/* Writes w's buffer now if the socket takes it all (no request, no callback,
 * no epoll change: the common case), else queues the rest with uv_write. */
static int send_reply(conn_t *c, wreq_t *w) {
  int n = uv_try_write((uv_stream_t *)&c->h, &w->buf, 1);
  if (n == (int)w->buf.len) {
    wreq_free(w);
    return 0;
  }
  if (n < 0 && n != UV_EAGAIN) {
    CRUN_LOG(INFO, STORE, "store server %s: write to %s: %s", c->srv->addr, c->peer, uv_strerror(n));
    wreq_free(w);
    conn_close(c, NULL);
    return 0;
  }
  if (n > 0) w->buf = uv_buf_init(w->buf.base + n, w->buf.len - (unsigned)n);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->h, &w->buf, 1, on_written);
  if (rc < 0) {
    wreq_free(w);
    conn_close(c, uv_strerror(rc));
    return 0;
  }
  c->queued += sizeof *w + w->buf.len;
  return 0;
}

/* Writes c's buffered replies with one write when the socket takes them
 * all (the common case), else queues the rest with uv_write. */
static void flush_out(conn_t *c) {
  size_t len = c->olen, done = 0;
  c->olen = 0;
  if (!len || c->closing) return;
  if (c->queued == 0) { /* nothing queued before them: they may go now */
    uv_buf_t b = uv_buf_init((char *)c->obuf, (unsigned)len);
    int n = uv_try_write((uv_stream_t *)&c->h, &b, 1);
    if (n == (int)len) {
      if (c->ocap > 4 * OUT_FLUSH) free(c->obuf), c->obuf = NULL, c->ocap = 0; /* after a big reply */
      return;
    }
    if (n < 0 && n != UV_EAGAIN) {
      CRUN_LOG(INFO, STORE, "store server %s: write to %s: %s", c->srv->addr, c->peer, uv_strerror(n));
      return conn_close(c, NULL);
    }
    if (n > 0) done = (size_t)n;
  }
  wreq_t *w = malloc(sizeof *w); /* it takes the buffer over: no copy */
  if (!w) return conn_close(c, "out of memory for a reply");
  w->own = c->obuf;
  w->buf = uv_buf_init((char *)c->obuf + done, (unsigned)(len - done));
  c->obuf = NULL, c->ocap = 0;
  send_reply(c, w);
}

/* Makes room for n more bytes of replies in c->obuf; 0 or -1. */
static int out_reserve(conn_t *c, size_t n) {
  if (c->ocap - c->olen >= n) return 0;
  size_t cap = c->ocap ? c->ocap : 256;
  while (cap - c->olen < n) cap *= 2;
  uint8_t *nb = realloc(c->obuf, cap);
  if (!nb) return -1;
  c->obuf = nb;
  c->ocap = cap;
  return 0;
}

/* Adds one reply frame with nargs arguments to c's buffered replies
 * (written by flush_out at the end of the pass over c's requests). */
static int reply(conn_t *c, int code, unsigned nargs, const void *const *args, const size_t *lens) {
  size_t total = CRUN_STORE_FRAME_HDR;
  for (unsigned i = 0; i < nargs; i++) total += 4 + lens[i];
  if (total - 4 > CRUN_STORE_MAX_FRAME) {
    char msg[128];
    int n = snprintf(msg, sizeof msg, "ERANGE: reply of %zu bytes is over the %u-byte frame limit",
                     total, CRUN_STORE_MAX_FRAME);
    const void *a[1] = {msg};
    size_t l[1] = {(size_t)n};
    return reply(c, CRUN_ERANGE, 1, a, l);
  }
  if (c->closing) return 0;
  if (out_reserve(c, total) < 0) {
    conn_close(c, "out of memory for a reply");
    return CRUN_ENOMEM;
  }
  uint8_t *p = c->obuf + c->olen;
  c->olen += total;
  crun__put_u32(p, (uint32_t)(total - 4));
  p[4] = CRUN_STORE_PROTO_VERSION;
  p[5] = (uint8_t)(code < 0 ? -code : code);
  p[6] = (uint8_t)nargs, p[7] = (uint8_t)(nargs >> 8);
  p += CRUN_STORE_FRAME_HDR;
  for (unsigned i = 0; i < nargs; i++) {
    crun__put_u32(p, (uint32_t)lens[i]);
    if (lens[i]) memcpy(p + 4, args[i], lens[i]);
    p += 4 + lens[i];
  }
  return 0;
}

static int reply_ok0(conn_t *c) { return reply(c, 0, 0, NULL, NULL); }

static int reply_i64(conn_t *c, int64_t v) {
  uint8_t b[8];
  crun__put_i64(b, v);
  const void *a[1] = {b};
  size_t l[1] = {8};
  return reply(c, 0, 1, a, l);
}

/* Replies with the error recorded by the failed status on this thread. */
static int reply_err(conn_t *c, int status) {
  const char *msg = crun_last_error();
  const void *a[1] = {msg};
  size_t l[1] = {strlen(msg)};
  return reply(c, status, 1, a, l);
}

/* ------------------------------------------------------------ waking */

/* Whether parked c waits on key. */
static int waits_on(const conn_t *c, const char *key, size_t klen) {
  return c->wlen == klen && memcmp(c->buf + c->off + c->wrel, key, klen) == 0;
}

/* Queues the parked requests waiting on key (NULL: on the join count);
 * poppers wait on queues, not keys, and are left alone. */
static void wake(crun_store_server_t *srv, const char *key, size_t klen) {
  conn_t *c = key ? srv->waiters[key_bucket(key, klen)] : srv->join_waiters;
  for (; c; c = c->pnext)
    if (!key || (!is_pop(c) && waits_on(c, key, klen))) ready_push(srv, c);
}

/* Queues the one parked popper of queue key that came first (smallest
 * ticket) and is not queued yet: one pushed item, one popper woken. */
static void wake_pop(crun_store_server_t *srv, const char *key, size_t klen) {
  conn_t *first = NULL;
  for (conn_t *c = srv->waiters[key_bucket(key, klen)]; c; c = c->pnext)
    if (is_pop(c) && !c->in_ready && waits_on(c, key, klen) && (!first || c->ticket < first->ticket)) first = c;
  if (first) ready_push(srv, first);
}

/* ------------------------------------------------------------ ops */

#define KEY(a) ((const char *)(a).p), (a).len

/* Returns 1 when every one of the n key arguments exists. */
static int keys_present(crun_store_server_t *srv, const crun__sarg_t *a, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    if (!crun__kv_find(&srv->kv, KEY(a[i]))) return 0;
  return 1;
}

static int park_timed(conn_t *c, const crun__sarg_t *t);

/* GET / MULTI_GET of the n keys in a (a[n]: the timeout). */
static int op_get(conn_t *c, const crun__sarg_t *a, unsigned n, int multi) {
  crun_store_server_t *srv = c->srv;
  if (!keys_present(srv, a, n)) return park_timed(c, &a[n]);
  const void *stack_v[16] = {0};
  size_t stack_l[16] = {0};
  const void **vals = n <= 16 ? stack_v : malloc(n * sizeof *vals);
  size_t *lens = n <= 16 ? stack_l : malloc(n * sizeof *lens);
  if (!vals || !lens) {
    if (n > 16) free(vals), free(lens);
    return FRAME_CLOSE;
  }
  for (unsigned i = 0; i < n; i++) {
    crun__kv_entry_t *e = crun__kv_find(&srv->kv, KEY(a[i]));
    vals[i] = e->val;
    lens[i] = e->len;
  }
  reply(c, 0, multi ? n : 1, vals, lens);
  if (n > 16) free(vals), free(lens);
  return FRAME_DONE;
}

/* Refuses a value of len bytes for key over the server's limit (ERANGE). */
static int value_ok(conn_t *c, const crun__sarg_t *key, size_t len) {
  if (len <= c->srv->max_value) return 0;
  return crun_error(CRUN_ERANGE, "store: a value of %zu bytes for key '%.*s' is over this server's limit of %zu "
                    "bytes (CRUN_STORE_MAX_VALUE_BYTES)", len, CRUN__KLEN(key->len),
                    (const char *)key->p, c->srv->max_value);
}

/* A set sent without waiting (SET_NOREPLY): applied, or its failure kept
 * for the connection's next request, which gets it as its reply instead of
 * running (the first failure; later ones are counted). Nothing is written. */
static void set_noreply(conn_t *c, const crun__sarg_t *a) {
  int rc = value_ok(c, &a[0], a[1].len);
  if (rc == 0) rc = crun__kv_set(&c->srv->kv, KEY(a[0]), a[1].p, a[1].len);
  if (rc == 0) return wake(c->srv, KEY(a[0]));
  if (c->late_rc) {
    if (c->late_more < UINT_MAX) c->late_more++;
    return;
  }
  c->late_rc = rc;
  snprintf(c->late, sizeof c->late, "%s", crun__store_error_body());
  CRUN_LOG(WARN, STORE, "store server %s: a set from %s that did not wait failed (its next request is told): %s",
           c->srv->addr, c->peer, c->late);
}

/* Answers c's request with the failure of an earlier set that did not wait
 * (the request is not run). */
static int reply_late(conn_t *c) {
  int rc = c->late_rc;
  char more[64] = "";
  if (c->late_more) snprintf(more, sizeof more, " (and %u more after it)", c->late_more);
  c->late_rc = 0, c->late_more = 0;
  crun_error(rc, "an earlier set failed (set does not wait for the server; this call was not run): %s%s",
             c->late, more);
  reply_err(c, rc);
  return FRAME_DONE;
}

static int op_cas(conn_t *c, const crun__sarg_t *a) {
  const void *res;
  size_t rlen;
  int rc = value_ok(c, &a[0], a[2].len);
  if (rc == 0) rc = crun__kv_compare_set(&c->srv->kv, KEY(a[0]), a[1].p, a[1].len, a[2].p, a[2].len, &res, &rlen);
  if (rc < 0) return reply_err(c, rc), FRAME_DONE;
  reply(c, 0, 1, &res, &rlen);
  wake(c->srv, KEY(a[0]));
  return FRAME_DONE;
}

static int op_multi_set(conn_t *c, const crun__sarg_t *a, unsigned n) {
  for (unsigned i = 0; i < n; i += 2) {
    int rc = value_ok(c, &a[i], a[i + 1].len);
    if (rc < 0) return reply_err(c, rc), FRAME_DONE;
  }
  for (unsigned i = 0; i < n; i += 2) {
    int rc = crun__kv_set(&c->srv->kv, KEY(a[i]), a[i + 1].p, a[i + 1].len);
    if (rc < 0) return reply_err(c, rc), FRAME_DONE;
  }
  reply_ok0(c);
  for (unsigned i = 0; i < n; i += 2) wake(c->srv, KEY(a[i]));
  return FRAME_DONE;
}

static void serve_conn(conn_t *c);

/* Records why c's head request timed out (c->wrel / c->wlen: the key it
 * parked on last). */
static void timeout_error(conn_t *c) {
  const uint8_t *f = c->buf + c->off;
  int kl = (int)(c->wlen < 200 ? c->wlen : 200);
  const char *k = (const char *)f + c->wrel;
  unsigned long long ms = (unsigned long long)c->timeout_ms;
  if (f[5] == CRUN__SOP_QUEUE_POP)
    crun_error(CRUN_ETIMEDOUT, "queue_pop: queue '%.*s' got no item within the deadline", kl, k);
  else if (f[5] == CRUN__SOP_JOIN_WAIT)
    crun_error(CRUN_ETIMEDOUT, "%lld of %lld clients joined within %llu ms", (long long)c->srv->joined,
               (long long)crun__get_i64(f + CRUN_STORE_FRAME_HDR + 4), ms);
  else
    crun_error(CRUN_ETIMEDOUT, "key '%.*s' not set within %llu ms", kl, k, ms);
}

/* The deadline of c's head request passed: answers ETIMEDOUT and serves
 * what the client sent after it. */
static void on_park_timeout(uv_timer_t *t) {
  conn_t *c = t->data;
  crun_store_server_t *srv = c->srv;
  if (c->closing || !c->timed) return;
  c->timed = 0;
  unpark(srv, c);
  timeout_error(c);
  reply_err(c, CRUN_ETIMEDOUT);
  c->off += 4 + (size_t)crun__get_u32(c->buf + c->off);
  c->ticket = 0;
  if (!c->closing) serve_conn(c); /* writes the answer too */
  drain_ready(srv);
}

/* Starts the deadline of c's head request, about to park for the first
 * time: ms from now, capped at CRUN_STORE_PARK_MAX_MS (ms >= 0). */
static int start_deadline(conn_t *c, int64_t ms) {
  crun_store_server_t *srv = c->srv;
  if (!c->has_timer) {
    int rc = uv_timer_init(&srv->loop, &c->timer);
    if (rc < 0) return crun_error(CRUN_ESYS, "store: no timer for a deadline: %s", uv_strerror(rc));
    c->timer.data = c;
    c->has_timer = 1;
    c->handles++;
  }
  c->timeout_ms = ms > CRUN_STORE_PARK_MAX_MS ? (uint64_t)CRUN_STORE_PARK_MAX_MS : (uint64_t)ms;
  uv_update_time(&srv->loop); /* the deadline counts from now, not from this loop turn */
  uv_timer_start(&c->timer, on_park_timeout, c->timeout_ms, 0);
  c->timed = 1;
  return 0;
}

/* Parks c's head request (its keys are missing); the first park starts its
 * deadline from the timeout_ms in argument t (checked >= 0 by the parser). */
static int park_timed(conn_t *c, const crun__sarg_t *t) {
  int rc = c->timed ? 0 : start_deadline(c, crun__get_i64(t->p));
  if (rc < 0) return reply_err(c, rc), FRAME_DONE;
  return FRAME_PARK;
}

/* QUEUE_POP: the head item now, else ENOTFOUND (timeout_ms < 0) or park. */
static int op_pop(conn_t *c, const crun__sarg_t *a) {
  crun_store_server_t *srv = c->srv;
  const void *item;
  size_t ilen;
  if (crun__kv_qpeek(&srv->queues, KEY(a[0]), &item, &ilen)) {
    if (reply(c, 0, 1, &item, &ilen) == 0) crun__kv_qdrop(&srv->queues, KEY(a[0]));
    else wake_pop(srv, KEY(a[0])); /* not sent: the item stays for the next popper */
    return FRAME_DONE;
  }
  int64_t ms = crun__get_i64(a[1].p);
  int rc = 0;
  if (ms < 0)
    rc = crun_error(CRUN_ENOTFOUND, "queue_pop: queue '%.*s' is empty", (int)(a[0].len < 200 ? a[0].len : 200),
                    (const char *)a[0].p);
  else if (!c->timed && (rc = start_deadline(c, ms)) == 0)
    c->ticket = ++srv->tickets;
  if (rc < 0) return reply_err(c, rc), FRAME_DONE;
  return FRAME_PARK;
}

/* LIST_KEYS: the count, then every plain key NUL-terminated. */
static int op_list_keys(conn_t *c) {
  crun_store_keys_t k;
  int rc = crun__kv_keys(&c->srv->kv, &k);
  if (rc < 0) return reply_err(c, rc), FRAME_DONE;
  uint8_t n[8];
  crun__put_i64(n, (int64_t)k.count);
  const void *a[2] = {n, k.buf};
  size_t l[2] = {8, k.len};
  reply(c, 0, 2, a, l);
  free(k.buf);
  return FRAME_DONE;
}

/* Runs one op whose arguments were checked against its arity. */
static int run_op(conn_t *c, int op, const crun__sarg_t *a, unsigned n) {
  crun_store_server_t *srv = c->srv;
  int rc;
  int64_t v;
  if (op == CRUN__SOP_SET_NOREPLY) return set_noreply(c, a), FRAME_DONE;
  if (c->late_rc) return reply_late(c);
  switch (op) {
  case CRUN__SOP_SET:
  case CRUN__SOP_APPEND: {
    const crun__kv_entry_t *e = op == CRUN__SOP_APPEND ? crun__kv_find(&srv->kv, KEY(a[0])) : NULL;
    rc = value_ok(c, &a[0], (e ? e->len : 0) + (size_t)a[1].len);
    if (rc == 0)
      rc = op == CRUN__SOP_SET ? crun__kv_set(&srv->kv, KEY(a[0]), a[1].p, a[1].len)
                               : crun__kv_append(&srv->kv, KEY(a[0]), a[1].p, a[1].len);
    rc < 0 ? reply_err(c, rc) : reply_ok0(c);
    if (rc == 0) wake(srv, KEY(a[0]));
    return FRAME_DONE;
  }
  case CRUN__SOP_GET: return op_get(c, a, 1, 0);
  case CRUN__SOP_MULTI_GET: return op_get(c, a, n - 1, 1);
  case CRUN__SOP_WAIT:
    if (!keys_present(srv, a, n - 1)) return park_timed(c, &a[n - 1]);
    return reply_ok0(c), FRAME_DONE;
  case CRUN__SOP_ADD:
    rc = crun__kv_add(&srv->kv, KEY(a[0]), crun__get_i64(a[1].p), &v);
    rc < 0 ? reply_err(c, rc) : reply_i64(c, v);
    if (rc == 0) wake(srv, KEY(a[0]));
    return FRAME_DONE;
  case CRUN__SOP_CAS: return op_cas(c, a);
  case CRUN__SOP_CHECK: return reply_i64(c, keys_present(srv, a, n)), FRAME_DONE;
  case CRUN__SOP_DELETE: return reply_i64(c, crun__kv_delete(&srv->kv, KEY(a[0]))), FRAME_DONE;
  case CRUN__SOP_NUM_KEYS: return reply_i64(c, (int64_t)srv->kv.count), FRAME_DONE;
  case CRUN__SOP_MULTI_SET: return op_multi_set(c, a, n);
  case CRUN__SOP_PING: {
    const void *p = "crun-store";
    size_t l = 10;
    return reply(c, 0, 1, &p, &l), FRAME_DONE;
  }
  case CRUN__SOP_JOIN:
    reply_i64(c, ++srv->joined);
    wake(srv, NULL, 0);
    return FRAME_DONE;
  case CRUN__SOP_JOIN_WAIT:
    if (srv->joined < crun__get_i64(a[0].p)) return park_timed(c, &a[1]);
    return reply_i64(c, srv->joined), FRAME_DONE;
  case CRUN__SOP_QUEUE_PUSH:
    rc = value_ok(c, &a[0], a[1].len);
    if (rc == 0) rc = crun__kv_qpush(&srv->queues, KEY(a[0]), a[1].p, a[1].len);
    rc < 0 ? reply_err(c, rc) : reply_ok0(c);
    if (rc == 0) wake_pop(srv, KEY(a[0]));
    return FRAME_DONE;
  case CRUN__SOP_QUEUE_POP: return op_pop(c, a);
  case CRUN__SOP_QUEUE_LEN: return reply_i64(c, crun__kv_qlen(&srv->queues, KEY(a[0]))), FRAME_DONE;
  case CRUN__SOP_LIST_KEYS: return op_list_keys(c);
  }
  return FRAME_CLOSE;
}

/* Serves the frame at the head of c's buffer (complete, header checked). */
static int serve_frame(conn_t *c, size_t flen, char *why, size_t whylen) {
  crun__sreq_t r;
  int res = FRAME_CLOSE;
  if (crun__sproto_parse_request(c->buf + c->off, (uint32_t)flen, &r, why, whylen) == 0)
    res = run_op(c, r.op, r.args, r.nargs);
  crun__sproto_request_free(&r);
  return res;
}

/* Checks a frame header as soon as its 8 bytes are in, so garbage is
 * refused before its "length" is awaited; fills why and returns -1 if bad
 * (a client of another protocol version is told so first). */
static int header_ok(conn_t *c, char *why, size_t whylen) {
  const uint8_t *f = c->buf + c->off;
  int r = crun__sproto_check_request(f, c->len - c->off, why, whylen);
  if (r == CRUN__SREQ_BAD_VERSION) {
    size_t at = c->olen;
    crun_error(CRUN_EPROTO, "store protocol version %u not supported (server speaks %d)", f[4],
               CRUN_STORE_PROTO_VERSION);
    reply_err(c, CRUN_EPROTO);
    if (c->olen > at) c->obuf[at + 4] = f[4]; /* in the client's version: it can read why */
  }
  return r == CRUN__SREQ_OK ? 0 : -1;
}

/* Refuses a client that failed the challenge-response (or the unix
 * socket's credentials check): logs the first one, counts the others. */
static void refuse(conn_t *c, const char *why) {
  crun_store_server_t *srv = c->srv;
  if (srv->refused++ == 0)
    CRUN_LOG(WARN, STORE, "store server %s: refused %s: %s (further refusals are counted, not logged)", srv->addr,
             c->peer, why);
  conn_close(c, NULL);
}

/* Checks the client's answer to the greeting (the first 64 bytes it sends)
 * and sends the proof; returns 0 when c may go on, -1 when it waits or was
 * refused. */
static int authenticate(conn_t *c) {
  if (c->len - c->off < CRUN__AUTH_ANSWER) return -1;
  unsigned char proof[CRUN__AUTH_PROOF];
  if (crun__auth_check_answer(&c->srv->auth, "store", c->nonce, c->buf + c->off, proof) < 0) {
    refuse(c, "no proof of the job's secret (CRUN_TOKEN)");
    return -1;
  }
  c->off += CRUN__AUTH_ANSWER;
  c->authed = 1;
  if (!c->srv->auth.on) return 0;
  wreq_t *w = malloc(sizeof *w + CRUN__AUTH_PROOF);
  if (!w) return conn_close(c, "out of memory"), -1;
  w->own = NULL;
  memcpy(w + 1, proof, CRUN__AUTH_PROOF);
  w->buf = uv_buf_init((char *)(w + 1), CRUN__AUTH_PROOF);
  send_reply(c, w);
  return c->closing ? -1 : 0;
}

/* Serves every complete frame buffered on c until it parks or closes, then
 * writes the replies (a client that pipelines gets them in one write). */
static void serve_conn(conn_t *c) {
  char why[160];
  if (!c->authed && authenticate(c) < 0) return;
  while (!c->parked && !c->closing && c->len - c->off >= 4) {
    if (c->olen >= OUT_FLUSH) flush_out(c);
    if (c->closing) return;
    if (c->queued > WRITE_BACKLOG_MAX) {
      c->throttled = 1; /* resumed by on_written once the replies drain */
      uv_read_stop((uv_stream_t *)&c->h);
      break;
    }
    uint32_t flen = crun__get_u32(c->buf + c->off);
    if (header_ok(c, why, sizeof why) < 0) return conn_close(c, why);
    if (c->len - c->off < 4 + (size_t)flen) break;
    int r = serve_frame(c, flen, why, sizeof why);
    if (r == FRAME_CLOSE) return conn_close(c, why);
    if (r == FRAME_PARK) {
      parked_add(c->srv, c);
      break;
    }
    if (c->timed) { /* a request that had parked got its answer */
      c->timed = 0;
      uv_timer_stop(&c->timer);
    }
    c->ticket = 0;
    c->off += 4 + (size_t)flen;
  }
  flush_out(c);
  if (!c->parked && c->off == c->len) c->off = c->len = 0;
}

/* Looks again at every queued parked connection (iteratively). */
static void drain_ready(crun_store_server_t *srv) {
  if (srv->draining) return;
  srv->draining = 1;
  while (srv->ready) {
    conn_t *c = srv->ready;
    srv->ready = c->rnext;
    if (!srv->ready) srv->ready_tail = NULL;
    c->in_ready = 0;
    parked_remove(srv, c);
    serve_conn(c);
  }
  srv->draining = 0;
}

/* ------------------------------------------------------------ libuv callbacks */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *out) {
  conn_t *c = h->data;
  if (c->off > 0 && c->off == c->len) c->off = c->len = 0;
  size_t want = 65536;
  if (!c->authed) want = CRUN__AUTH_ANSWER; /* nothing is sized by a stranger's bytes */
  else if (c->len - c->off >= 4) { /* room for the whole frame at once */
    uint32_t flen = crun__get_u32(c->buf + c->off);
    if (flen <= CRUN_STORE_MAX_FRAME && c->off + 4 + flen > c->len)
      want = c->off + 4 + flen - c->len;
  }
  if (c->off > 0 && c->cap - c->len < want) { /* compact first */
    memmove(c->buf, c->buf + c->off, c->len - c->off);
    c->len -= c->off;
    c->off = 0;
  }
  if (c->cap - c->len < want) {
    size_t cap = c->len + want;
    uint8_t *nb = realloc(c->buf, cap);
    if (!nb) {
      *out = uv_buf_init(NULL, 0);
      return;
    }
    c->buf = nb;
    c->cap = cap;
  }
  *out = uv_buf_init((char *)c->buf + c->len, (unsigned)(c->cap - c->len > 1u << 30 ? 1u << 30 : c->cap - c->len));
}

/* Records that c sent a request now: the time (spinning) and whether it is
 * a client not yet heard from in this round (round_conns, busy_conns). */
static void note_active(conn_t *c) {
  crun_store_server_t *srv = c->srv;
  double now = crun_clock();
  srv->active_at = now;
  srv->active_local = c->local;
  if (now - srv->round_at > ACTIVE_ROUND) {
    srv->busy_conns = srv->round_conns;
    srv->round_conns = 0;
    srv->round_at = now;
    srv->round++;
  }
  if (c->round != srv->round) c->round = srv->round, srv->round_conns++;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = st->data;
  if (nread == UV_ENOBUFS) return conn_close(c, "out of memory for the read buffer");
  if (nread < 0) {
    if (nread != UV_EOF && nread != UV_ECONNRESET)
      CRUN_LOG(INFO, STORE, "store server %s: read from %s: %s", c->srv->addr, c->peer,
               uv_strerror((int)nread));
    return conn_close(c, NULL);
  }
  c->len += (size_t)nread;
  note_active(c);
  if (c->parked && c->len - c->off > 4 + (size_t)crun__get_u32(c->buf + c->off) + PARKED_BACKLOG_MAX)
    return conn_close(c, "over 64 MiB sent behind a parked request");
  if (!c->parked) serve_conn(c);
  drain_ready(c->srv);
}

/* Records "ip:port" (or "local pid N") of the peer for log lines. */
static void peer_name(conn_t *c, int local) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  char ip[INET6_ADDRSTRLEN] = "unknown peer";
  int port = 0;
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (local) {
    if (uv_fileno((uv_handle_t *)&c->h, &fd) == 0 &&
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
      snprintf(c->peer, sizeof c->peer, "local pid %d", (int)cred.pid);
    else
      snprintf(c->peer, sizeof c->peer, "local peer");
    return;
  }
  if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET) {
      uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
      port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    } else {
      uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
      port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
  }
  if (port) snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
  else snprintf(c->peer, sizeof c->peer, "%s", ip);
}

/* Closes connections that are still in the handshake after
 * HANDSHAKE_SECONDS, and the oldest ones beyond PENDING_MAX (never `keep`):
 * idle strangers cannot use up the server's file descriptors. */
static void expire_pending(crun_store_server_t *srv, conn_t *keep) {
  double now = crun_clock();
  int pending = 0;
  conn_t *oldest = NULL;
  for (conn_t *c = srv->conns, *next; c; c = next) {
    next = c->next;
    if (c->authed || c == keep) continue;
    if (now - c->since > HANDSHAKE_SECONDS) {
      refuse(c, "no handshake within the deadline");
      continue;
    }
    pending++;
    oldest = c; /* the list is newest first */
  }
  if (pending >= PENDING_MAX && oldest) refuse(oldest, "too many connections in the handshake");
}

/* Refuses c when its peer is another user's process on this host: always on
 * the unix socket (its name is public), and on TCP when the store has no
 * secret (then nothing else tells the job's clients from a neighbour's; see
 * crun__peer_stranger). The peer is told why (crun__auth_deny) before the
 * connection closes. Returns 1 when c was refused. */
static int refuse_stranger(conn_t *c) {
  uv_os_fd_t fd;
  long uid = -1;
  if (!c->local && c->srv->auth.on) return 0;
  if (uv_fileno((uv_handle_t *)&c->h, &fd) == 0 && !crun__peer_stranger(fd, &uid)) return 0;
  unsigned char deny[CRUN__AUTH_GREET];
  crun__auth_deny(deny);
  uv_buf_t b = uv_buf_init((char *)deny, sizeof deny);
  (void)uv_try_write((uv_stream_t *)&c->h, &b, 1); /* a fresh socket takes it; else the close tells */
  char why[128];
  snprintf(why, sizeof why, "%s is another user (uid %ld)%s", c->local ? "the unix socket's peer" : "the TCP peer",
           uid, c->local ? "" : " on this host, and the store has no secret (CRUN_TOKEN)");
  refuse(c, why);
  return 1;
}

/* Initializes c's handle for the listener it arrives on. */
static void conn_handle_init(crun_store_server_t *srv, conn_t *c, int local) {
  if (local) uv_pipe_init(&srv->loop, &c->h.pipe, 0);
  else uv_tcp_init(&srv->loop, &c->h.tcp);
  c->h.tcp.data = c; /* same offset in both: the uv_handle_t head */
}

static void on_connection(uv_stream_t *server, int status) {
  crun_store_server_t *srv = server->data;
  int local = server == (uv_stream_t *)&srv->local;
  if (status < 0) {
    CRUN_LOG(WARN, STORE, "store server %s: accept: %s", srv->addr, uv_strerror(status));
    return;
  }
  conn_t *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = srv;
  c->handles = 1;
  c->local = local;
  conn_handle_init(srv, c, local);
  if (uv_accept(server, (uv_stream_t *)&c->h) < 0) {
    uv_close((uv_handle_t *)&c->h, on_conn_closed);
    return;
  }
  if (!local) uv_tcp_nodelay(&c->h.tcp, 1);
  peer_name(c, local);
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  atomic_fetch_add(&srv->nconns, 1);
  atomic_fetch_add(&srv->accepted, 1);
  CRUN_LOG(TRACE, STORE, "store server %s: connection from %s", srv->addr, c->peer);
  if (refuse_stranger(c)) return;
  c->since = crun_clock();
  expire_pending(srv, c);
  wreq_t *w = malloc(sizeof *w + CRUN__AUTH_GREET);
  if (!w) return conn_close(c, "out of memory");
  w->own = NULL;
  crun__auth_greet(&srv->auth, (unsigned char *)(w + 1), c->nonce);
  w->buf = uv_buf_init((char *)(w + 1), CRUN__AUTH_GREET);
  send_reply(c, w);
  if (c->closing) return;
  uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
}

static void on_stop(uv_async_t *a) {
  crun_store_server_t *srv = a->data;
  while (srv->conns) conn_close(srv->conns, NULL);
  uv_close((uv_handle_t *)&srv->listener, NULL);
  if (srv->has_local) uv_close((uv_handle_t *)&srv->local, NULL);
  uv_close((uv_handle_t *)&srv->stop_async, NULL);
}

/* Whether the loop should poll rather than sleep now: within srv->spin of
 * the last request, and while fewer clients are busy than there are CPUs.
 * With as many busy clients as CPUs no CPU is left idle to poll on: a
 * polling server only yields to the clients it should be serving, and
 * each sched_yield puts it at the back of the run queue behind them. */
static int should_spin(crun_store_server_t *srv) {
  if (srv->spin <= 0 || crun_clock() - srv->active_at >= srv->spin) return 0;
  int busy = srv->busy_conns > srv->round_conns ? srv->busy_conns : srv->round_conns;
  return busy < srv->ncpus;
}

/* How many more times the loop looks for requests (sched_yield between)
 * before it blocks, once should_spin says no: CRUN_STORE_TAIL_POLLS after
 * a request from a unix-socket client, so a client that runs on this CPU
 * meanwhile finds the loop awake instead of waking it from another vCPU
 * (runtime/store/README.md, "Polling clients"); none after a
 * TCP client's (measured slower: a TCP request costs the server more, and
 * the yields hand its CPU to the clients). `seen` is the request that
 * started the count. */
static int tail_polls(crun_store_server_t *srv, double *seen, int *left) {
  if (srv->active_at != *seen) {
    *seen = srv->active_at;
    *left = srv->active_local && srv->spin > 0 ? CRUN_STORE_TAIL_POLLS : 0;
  }
  if (*left <= 0) return 0;
  --*left;
  return 1;
}

/* The loop: for srv->spin after each request it polls (an epoll_wait that
 * does not block, then sched_yield) instead of sleeping, so the next
 * request of a client that asks again at once finds this thread awake and
 * wakes no halted vCPU (tcp_proto.h, "Spinning"), unless the clients keep
 * every CPU busy (should_spin); then it looks a few more times after a
 * unix-socket request (tail_polls) and blocks in epoll_wait until the next
 * event. Ends when no handle is left (on_stop). */
static void server_thread(void *arg) {
  crun_store_server_t *srv = arg;
  pthread_setname_np(pthread_self(), "crun-store"); /* for top, perf and the tests */
  double seen = 0;
  int left = 0;
  for (;;) {
    int spinning = should_spin(srv) || tail_polls(srv, &seen, &left);
    if (!uv_run(&srv->loop, spinning ? UV_RUN_NOWAIT : UV_RUN_ONCE)) break;
    if (spinning) sched_yield();
  }
}

/* ------------------------------------------------------------ public */

/* Fills a bind address: an IP literal as given; "localhost" or nothing ->
 * 127.0.0.1; a host name -> its first IPv4 address (the address the job
 * publishes, never the wildcard unless asked for with "0.0.0.0"). */
static int bind_addr(const char *host, int port, struct sockaddr_storage *ss) {
  if (!host || !*host || strcmp(host, "localhost") == 0) return uv_ip4_addr("127.0.0.1", port, (struct sockaddr_in *)ss);
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0) return 0;
  if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0) return 0;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai)
    return crun_error(CRUN_EINVAL, "store server: cannot resolve '%s' to an address to listen on", host);
  memcpy(ss, ai->ai_addr, ai->ai_addrlen);
  ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  freeaddrinfo(ai);
  return 0;
}

/* Returns 1 when clients on this host reach ss through 127.0.0.1 / ::1
 * (a loopback or wildcard bind). */
static int loopback_reachable(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET) {
    uint32_t a = ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr);
    return a == 0 || (a >> 24) == 127;
  }
  const struct in6_addr *a6 = &((const struct sockaddr_in6 *)ss)->sin6_addr;
  return IN6_IS_ADDR_UNSPECIFIED(a6) || IN6_IS_ADDR_LOOPBACK(a6);
}

/* Also listens on the abstract unix socket crun__store_local_name(ip, port),
 * so same-host clients skip the TCP stack. Optional: failures are logged. */
static void listen_local(crun_store_server_t *srv, const struct sockaddr_storage *ss) {
  char ip[INET6_ADDRSTRLEN];
  struct sockaddr_un un;
  if (!loopback_reachable(ss) || crun_env_int("CRUN_STORE_UNIX", 1) == 0) return;
  if (ss->ss_family == AF_INET) uv_ip4_name((const struct sockaddr_in *)ss, ip, sizeof ip);
  else uv_ip6_name((const struct sockaddr_in6 *)ss, ip, sizeof ip);
  socklen_t len = crun__store_local_addr(ip, srv->port, &un);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&un, len) < 0 || listen(fd, 4096) < 0) {
    CRUN_LOG(INFO, STORE, "store server %s: no local socket: %s", srv->addr, strerror(errno));
    if (fd >= 0) close(fd);
    return;
  }
  uv_pipe_init(&srv->loop, &srv->local, 0);
  srv->local.data = srv;
  srv->has_local = 1;
  if (uv_pipe_open(&srv->local, fd) < 0 || uv_listen((uv_stream_t *)&srv->local, 4096, on_connection) < 0)
    CRUN_LOG(INFO, STORE, "store server %s: local socket not served", srv->addr);
}

/* Binds and listens (on the caller's thread, so errors are immediate). */
static int server_listen(crun_store_server_t *srv, const char *host, int port) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  /* the handle first: server_abort closes it whatever failed below (an
   * address that does not resolve used to leave it uninitialised, and
   * uv_close aborted the process) */
  uv_tcp_init(&srv->loop, &srv->listener);
  srv->listener.data = srv;
  CRUN_CHECK(bind_addr(host, port, &ss));
  int rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, 4096, on_connection);
  if (rc < 0)
    return crun_error(rc == UV_EADDRINUSE ? CRUN_EADDRINUSE : CRUN_ESYS,
                      "store server: cannot listen on %s:%d: %s", host ? host : "0.0.0.0", port,
                      uv_strerror(rc));
  struct sockaddr_storage got;
  int glen = sizeof got;
  uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&got, &glen);
  srv->port = ntohs(((struct sockaddr_in *)&got)->sin_port);
  snprintf(srv->addr, sizeof srv->addr, "%s:%d", host && *host ? host : "0.0.0.0", srv->port);
  listen_local(srv, &got);
  return 0;
}

/* Frees the server's tables and the server. */
static void server_free(crun_store_server_t *srv) {
  crun__kv_free(&srv->kv);
  crun__kv_free(&srv->queues);
  free(srv);
}

/* Closes every handle of a loop that never ran and frees the server. */
static void server_abort(crun_store_server_t *srv) {
  uv_close((uv_handle_t *)&srv->listener, NULL);
  if (srv->has_local) uv_close((uv_handle_t *)&srv->local, NULL);
  uv_close((uv_handle_t *)&srv->stop_async, NULL);
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  uv_loop_close(&srv->loop);
  server_free(srv);
}

/* Starts the loop thread with every signal blocked: SIGPIPE from a write to
 * a vanished client becomes EPIPE, and the host process's signal handling
 * (the launcher's SIGINT/SIGCHLD) stays on its own threads. */
static int start_thread(crun_store_server_t *srv) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = uv_thread_create(&srv->thread, server_thread, srv);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc == 0 ? 0 : crun_error(CRUN_ESYS, "store server %s: cannot start its thread: %s",
                                  srv->addr, uv_strerror(rc));
}

/* Raises this process's open-file limit to its hard limit (a server of many
 * ranks needs many descriptors; 1024 is the usual soft default). */
static void raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

int crun_store_server_start(const char *host, int port, crun_store_server_t **out) {
  return crun_store_server_start_token(host, port, NULL, out);
}

int crun_store_server_start_token(const char *host, int port, const char *token, crun_store_server_t **out) {
  if (!out || port < 0 || port > 65535)
    return crun_error(CRUN_EINVAL, "store server: bad port %d or NULL out", port);
  crun_store_server_t *srv = calloc(1, sizeof *srv);
  if (!srv || crun__kv_init(&srv->kv) < 0 || crun__kv_init(&srv->queues) < 0) {
    if (srv) server_free(srv);
    return crun_error(CRUN_ENOMEM, "store server: out of memory");
  }
  raise_fd_limit();
  srv->spin = crun__store_spin_seconds(CRUN_STORE_SPIN_US_SERVER);
  long mv = crun_env_int("CRUN_STORE_MAX_VALUE_BYTES", 0);
  /* at most what a reply frame can carry back (its header, the value's length) */
  size_t most = CRUN_STORE_MAX_FRAME - CRUN_STORE_FRAME_HDR - 4;
  srv->max_value = mv > 0 && (unsigned long)mv < most ? (size_t)mv : most;
  long ncpus = sysconf(_SC_NPROCESSORS_ONLN); /* the machine's: clients may run on any */
  srv->ncpus = ncpus > 0 ? (int)ncpus : 1;
  srv->round = 1; /* a connection's round starts at 0: its first request counts */
  int arc = crun__auth_init(&srv->auth, token ? token : getenv("CRUN_TOKEN"));
  if (arc < 0) {
    server_free(srv);
    return arc;
  }
  int rc = uv_loop_init(&srv->loop);
  if (rc < 0) {
    server_free(srv);
    return crun_error(CRUN_ESYS, "store server: uv_loop_init: %s", uv_strerror(rc));
  }
  uv_async_init(&srv->loop, &srv->stop_async, on_stop);
  srv->stop_async.data = srv;
  rc = server_listen(srv, host, port);
  if (rc == 0) rc = start_thread(srv);
  if (rc < 0) {
    server_abort(srv);
    return rc;
  }
  srv->started = 1;
  CRUN_LOG(INFO, STORE, "store server listening on %s", srv->addr);
  *out = srv;
  return 0;
}

int crun_store_server_port(crun_store_server_t *srv) { return srv ? srv->port : -1; }

int crun__store_server_clients(crun_store_server_t *srv) { return srv ? atomic_load(&srv->nconns) : 0; }

unsigned long crun__store_server_accepted(crun_store_server_t *srv) { return srv ? atomic_load(&srv->accepted) : 0; }

void crun_store_server_stop(crun_store_server_t *srv) {
  if (!srv) return;
  uv_async_send(&srv->stop_async);
  uv_thread_join(&srv->thread);
  uv_loop_close(&srv->loop);
  unsigned long acc = atomic_load(&srv->accepted);
  CRUN_LOG(INFO, STORE, "store server %s stopped (%lu connection%s accepted, %lu client%s refused)", srv->addr,
           acc, acc == 1 ? "" : "s", srv->refused, srv->refused == 1 ? "" : "s");
  server_free(srv);
}
