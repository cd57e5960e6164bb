/* tcp_mesh.c — builds the full mesh of a group: every rank listens on an
 * ephemeral port of the address it publishes (never the wildcard) under
 * "tcp/<rank>" in the group's store; each rank connects to every lower rank
 * and accepts every higher one. A connection says hello (group, rank, size)
 * and, when the job has a secret, passes the challenge-response of
 * core/auth.h bound to (group, connector, acceptor) before it is used. A
 * connection that fails either (junk bytes, a forged hello, no proof) is
 * closed and logged once; the mesh goes on accepting the real ranks. A job
 * without a secret refuses another user's process on this host instead
 * (refuse_stranger), both ways. The
 * acceptor runs every handshake in progress at once (accept_higher), so a
 * stranger that connects and stalls delays nobody; a connector whose
 * handshake was cut connects again until its deadline. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "transport/tcp_priv.h"
#include "core/auth.h"

#define MESH_PENDING 128       /* handshakes in progress at once on one listener */
#define MESH_HANDSHAKE_S 10.0  /* for one connection's hello, answer and proof */
#define MESH_PROOF_TRIES 3     /* a connector whose proof was refused tries this often */

int crun__tcp_wait_fd(int fd, short ev, double deadline) {
  for (;;) {
    double left = deadline - crun_clock();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = ev};
    int ms = left > 1000.0 ? 1000000 : (int)(left * 1000.0) + 1;
    int n = poll(&p, 1, ms);
    if (n > 0) return 1;
    if (n < 0 && errno != EINTR) return crun_error(CRUN_ESYS, "poll: %s", strerror(errno));
  }
}

/* Applies the socket options of a mesh connection. */
static void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  long buf = crun_env_int("CRUN_TCP_BUFFER", 4L << 20);
  if (buf > 0) {
    int b = (int)buf;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
  }
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* Finds the address peers should dial: CRUN_HOST, else the local address
 * that routes to MASTER_ADDR, else loopback. */
static void local_host(char *buf, size_t cap) {
  const char *h = getenv("CRUN_HOST");
  const char *m = getenv("MASTER_ADDR");
  snprintf(buf, cap, "127.0.0.1");
  if (h && *h) { snprintf(buf, cap, "%s", h); return; }
  if (!m || !*m || !strcmp(m, "localhost") || !strncmp(m, "127.", 4)) return;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
  if (getaddrinfo(m, "9", &hints, &ai) != 0 || !ai) return;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    inet_ntop(AF_INET, &sa.sin_addr, buf, (socklen_t)cap);
  if (fd >= 0) close(fd);
  freeaddrinfo(ai);
}

/* Opens a listening socket on an ephemeral port of host (the address this
 * rank publishes; the wildcard only when host is not an IPv4 literal);
 * returns the fd, port in *port. */
static int listen_ephemeral(const char *host, int backlog, int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return crun_error(CRUN_ESYS, "socket: %s", strerror(errno));
  tune_socket(fd);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    CRUN_LOG(WARN, NET, "tcp mesh: '%s' is not an IPv4 address; listening on every address", host);
  }
  socklen_t sl = sizeof sa;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, backlog) < 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
    int e = errno;
    close(fd);
    return crun_error(CRUN_ESYS, "listen on an ephemeral port: %s", strerror(e));
  }
  *port = ntohs(sa.sin_port);
  set_nonblock(fd);
  return fd;
}

/* Writes / reads exactly n bytes of a non-blocking fd by the deadline. */
static int io_full(int fd, void *buf, size_t n, int writing, double deadline) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k > 0) { p += k; n -= (size_t)k; continue; }
    if (k == 0) return crun_error(CRUN_EPEERDIED, "connection closed during the handshake");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return crun_error(CRUN_ECONNRESET, "handshake: %s", strerror(errno));
    int r = crun__tcp_wait_fd(fd, writing ? POLLOUT : POLLIN, deadline);
    if (r < 0) return r;
    if (r == 0) return crun_error(CRUN_ETIMEDOUT, "handshake timed out");
  }
  return 0;
}

/* One connect of a non-blocking fd, finished by the deadline: 0, or -1 with
 * errno (ETIMEDOUT at the deadline). A blocking connect waited for the
 * kernel's SYN retries (about 2 minutes) whatever the deadline: a peer
 * address that drops SYNs (a listener whose backlog is full, a host gone
 * from the network) held the rank that long past its timeout. */
static int connect_by(int fd, const struct addrinfo *ai, double deadline) {
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return 0;
  if (errno != EINPROGRESS) return -1;
  int r = crun__tcp_wait_fd(fd, POLLOUT, deadline), e = 0;
  socklen_t el = sizeof e;
  if (r <= 0) return errno = ETIMEDOUT, -1;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0) return -1;
  return e ? (errno = e, -1) : 0;
}

/* Connects to host:port, retrying refused connects until the deadline. */
static int dial(const char *host, const char *port, double deadline) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  int rc = getaddrinfo(host, port, &hints, &ai);
  if (rc != 0) return crun_error(CRUN_EINVAL, "cannot resolve '%s': %s", host, gai_strerror(rc));
  int fd = -1;
  while (fd < 0) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    tune_socket(fd);
    if (connect_by(fd, ai, deadline) == 0) break;
    int e = errno;
    close(fd);
    fd = -1;
    if (crun_clock() > deadline) {
      freeaddrinfo(ai);
      return crun_error(e == ETIMEDOUT ? CRUN_ETIMEDOUT : CRUN_ECONNREFUSED, "connect to %s:%s: %s", host, port,
                        strerror(e));
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  freeaddrinfo(ai);
  set_nonblock(fd);
  return fd;
}

/* The auth context of the connection from rank `from` to rank `to`. */
static void mesh_ctx(const crun__tcp_t *t, int from, int to, char *buf, size_t cap) {
  snprintf(buf, cap, "mesh %08x %d->%d of %d", t->group, from, to, t->size);
}

/* Connector: answers lower rank j's greeting and checks its proof. */
static int prove(crun__tcp_t *t, int fd, int j, double deadline) {
  char ctx[96], peer[64];
  unsigned char greet[CRUN__AUTH_GREET], answer[CRUN__AUTH_ANSWER], want[CRUN__AUTH_PROOF], got[CRUN__AUTH_PROOF];
  mesh_ctx(t, t->rank, j, ctx, sizeof ctx);
  snprintf(peer, sizeof peer, "%s of the mesh", CRUN__WHO(t->pg, j));
  CRUN_CHECK(io_full(fd, greet, sizeof greet, 0, deadline));
  CRUN_CHECK(crun__auth_answer(&t->auth, ctx, peer, greet, answer, want));
  CRUN_CHECK(io_full(fd, answer, sizeof answer, 1, deadline));
  if (!t->auth.on) return 0;
  int rc = io_full(fd, got, sizeof got, 0, deadline);
  if (rc < 0) return crun_error(CRUN_EACCES, "%s refused this rank's proof of the job's secret", peer);
  return crun__auth_check_proof(want, got, peer);
}

/* Connects to lower rank j (address from the store) and says hello. */
static int connect_lower(crun__tcp_t *t, int j, double deadline) {
  char key[32];
  snprintf(key, sizeof key, "tcp/%d", j);
  const char *keys[1] = {key};
  double left = deadline - crun_clock();
  int rc = crun_store_wait(t->pg->store, keys, 1, left > 0.001 ? left : 0.001);
  if (rc < 0) return crun_error(rc, "%s never published its address", CRUN__WHO(t->pg, j));
  crun_buf_t v = {0};
  CRUN_CHECK(crun_store_get(t->pg->store, key, &v));
  char addr[128];
  snprintf(addr, sizeof addr, "%.*s", (int)v.len, (char *)v.data);
  crun_buf_free(&v);
  char *colon = strrchr(addr, ':');
  if (!colon) return crun_error(CRUN_EPROTO, "bad address '%s' of %s", addr, CRUN__WHO(t->pg, j));
  *colon = 0;
  /* A handshake the acceptor cut (its pending queue overflowed, or it took
   * this connection for a stranger that was too slow) is tried again until
   * the deadline; a refused proof at most MESH_PROOF_TRIES times. */
  for (int refused = 0;;) {
    int fd = dial(addr, colon + 1, deadline);
    if (fd < 0) return fd;
    long uid;
    if (!t->auth.on && crun__peer_stranger(fd, &uid)) {
      close(fd);
      return crun_error(CRUN_EACCES, "%s's address %s:%s is served by another user's process (uid %ld) on this "
                        "host, and the job has no secret (CRUN_TOKEN) to check it with: refusing to send to it",
                        CRUN__WHO(t->pg, j), addr, colon + 1, uid);
    }
    crun__hello_t h = {CRUN__TCP_HELLO, t->group, t->rank, t->size};
    rc = io_full(fd, &h, sizeof h, 1, deadline);
    if (rc == 0) rc = prove(t, fd, j, deadline);
    if (rc == 0) {
      t->fds[j] = fd;
      return 0;
    }
    close(fd);
    int cut = rc == CRUN_EPEERDIED || rc == CRUN_ECONNRESET || (rc == CRUN_EACCES && ++refused < MESH_PROOF_TRIES);
    if (!cut || crun_clock() + 0.05 > deadline) return rc;
    CRUN_LOG(INFO, NET, "group '%s' %s: handshake with %s cut (%s); connecting again", t->pg->prefix,
             CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, j), crun_last_error());
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* The acceptor's side of the handshakes, all in progress at once: a stranger
 * that connects and then stalls (or trickles bytes) holds one slot of
 * MESH_PENDING for at most MESH_HANDSHAKE_S, never the real ranks behind it.
 * When every slot is taken, the oldest is dropped (its connector, if it is a
 * rank, connects again). Each connection: hello -> greeting -> answer -> proof. */
typedef struct {
  int fd;
  int stage;                  /* 0: reading the hello, 1: reading the answer */
  size_t got;                 /* bytes of the current message read */
  double until;               /* dropped after this */
  crun__hello_t h;
  unsigned char nonce[32];
  unsigned char answer[CRUN__AUTH_ANSWER];
} pending_t;

/* Closes pending[i] (refused: logged once, counted after) and moves the last in its place. */
static void drop_pending(crun__tcp_t *t, pending_t *p, int *n, int i, const char *why) {
  close(p[i].fd);
  if (why && t->refused++ == 0)
    CRUN_LOG(WARN, NET, "group '%s' %s: refused a mesh connection: %s (further ones are counted)",
             t->pg->prefix, CRUN__WHO(t->pg, t->rank), why);
  p[i] = p[--*n];
}

/* Sends all n bytes at once or fails (a fresh socket's buffer takes them). */
static int send_now(int fd, const void *b, size_t n) {
  ssize_t k = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  return k == (ssize_t)n ? 0 : -1;
}

/* Reads what is there for pending p; returns 1 when it became rank p->h.rank's
 * connection, 0 to go on, -1 (why set) to drop it. */
static int advance(crun__tcp_t *t, pending_t *p, char *why, size_t wn) {
  unsigned char *dst = p->stage == 0 ? (unsigned char *)&p->h : p->answer;
  size_t want = p->stage == 0 ? sizeof p->h : sizeof p->answer;
  ssize_t k = recv(p->fd, dst + p->got, want - p->got, MSG_DONTWAIT);
  if (k == 0) return snprintf(why, wn, "closed during the handshake"), -1;
  if (k < 0) return (errno == EAGAIN || errno == EINTR) ? 0 : (snprintf(why, wn, "%s", strerror(errno)), -1);
  p->got += (size_t)k;
  if (p->got < want) return 0;
  if (p->stage == 0) {
    if (crun__tcp_hello_check(&p->h, t->group, t->rank, t->size, t->fds) < 0)
      return snprintf(why, wn, "%s", crun_last_error()), -1;
    unsigned char greet[CRUN__AUTH_GREET];
    crun__auth_greet(&t->auth, greet, p->nonce);
    if (send_now(p->fd, greet, sizeof greet) < 0) return snprintf(why, wn, "cannot send the greeting"), -1;
    p->stage = 1;
    p->got = 0;
    return 0;
  }
  char ctx[96];
  unsigned char proof[CRUN__AUTH_PROOF];
  mesh_ctx(t, p->h.rank, t->rank, ctx, sizeof ctx);
  if (crun__auth_check_answer(&t->auth, ctx, p->nonce, p->answer, proof) < 0)
    return snprintf(why, wn, "no proof of the job's secret from a connection claiming %s", CRUN__WHO(t->pg, p->h.rank)), -1;
  if (t->fds[p->h.rank] >= 0) return snprintf(why, wn, "%s is connected already", CRUN__WHO(t->pg, p->h.rank)), -1;
  if (t->auth.on && send_now(p->fd, proof, sizeof proof) < 0) return snprintf(why, wn, "cannot send the proof"), -1;
  t->fds[p->h.rank] = p->fd;
  return 1;
}

/* Without a secret a hello is all a connection shows, so another user's
 * process on this host could claim a rank's place (its port is listed in
 * /proc/net/tcp, the group id is a hash of the group's name) and read or
 * feed the collectives: such a peer (crun__peer_stranger) is told why
 * (crun__auth_deny) and closed. Returns 1 when fd was refused. */
static int refuse_stranger(crun__tcp_t *t, int fd) {
  long uid;
  if (t->auth.on || !crun__peer_stranger(fd, &uid)) return 0;
  unsigned char deny[CRUN__AUTH_GREET];
  crun__auth_deny(deny);
  (void)send_now(fd, deny, sizeof deny);
  close(fd);
  if (t->refused++ == 0)
    CRUN_LOG(WARN, NET, "group '%s' %s: refused a mesh connection from another user's process (uid %ld) on "
             "this host: the job has no secret (CRUN_TOKEN) to tell it from a rank (further ones are counted)",
             t->pg->prefix, CRUN__WHO(t->pg, t->rank), uid);
  return 1;
}

/* Accepts the size - 1 - rank higher ranks by the deadline. */
static int accept_higher(crun__tcp_t *t, int lfd, double deadline) {
  pending_t p[MESH_PENDING];
  struct pollfd pf[MESH_PENDING + 1];
  int n = 0, need = t->size - 1 - t->rank, rc = 0;
  char why[256];
  while (need > 0) {
    double now = crun_clock(), wake = deadline;
    if (now >= deadline) { rc = crun_error(CRUN_ETIMEDOUT, "accept timed out"); break; }
    for (int i = 0; i < n;) { /* expire the stalled ones */
      if (p[i].until <= now) drop_pending(t, p, &n, i, "no hello and proof in time");
      else { if (p[i].until < wake) wake = p[i].until; i++; }
    }
    pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
    for (int i = 0; i < n; i++) pf[i + 1] = (struct pollfd){.fd = p[i].fd, .events = POLLIN};
    int ms = (int)((wake - now) * 1000) + 1;
    int r = poll(pf, (nfds_t)n + 1, ms);
    if (r < 0 && errno != EINTR) { rc = crun_error(CRUN_ESYS, "poll: %s", strerror(errno)); break; }
    if (r <= 0) continue;
    int before = n;
    for (int i = before - 1; i >= 0; i--) { /* backwards: drop_pending moves the last entry */
      if (!(pf[i + 1].revents & (POLLIN | POLLERR | POLLHUP))) continue;
      int a = advance(t, &p[i], why, sizeof why);
      if (a < 0) drop_pending(t, p, &n, i, why);
      if (a > 0) { p[i] = p[--n]; need--; }
    }
    if (pf[0].revents & POLLIN) {
      int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
          rc = crun_error(CRUN_ESYS, "accept: %s", strerror(errno));
          break;
        }
        continue;
      }
      if (refuse_stranger(t, fd)) continue;
      tune_socket(fd);
      if (n == MESH_PENDING) { /* full: the oldest goes */
        int old = 0;
        for (int i = 1; i < n; i++) if (p[i].until < p[old].until) old = i;
        drop_pending(t, p, &n, old, "too many connections in the handshake at once");
      }
      double lim = crun_clock() + MESH_HANDSHAKE_S;
      p[n++] = (pending_t){.fd = fd, .until = lim < deadline ? lim : deadline};
    }
  }
  for (int i = 0; i < n; i++) close(p[i].fd);
  return rc;
}

/* Writes the peers that are still unconnected ("1,2"; by their global
 * ranks when global) into buf; returns the length. */
static size_t missing_ranks(crun__tcp_t *t, char *buf, size_t cap, int global) {
  size_t n = 0;
  buf[0] = 0;
  for (int j = 0; j < t->size && n + 12 < cap; j++)
    if (j != t->rank && t->fds[j] < 0)
      n += (size_t)snprintf(buf + n, cap - n, "%s%d", n ? "," : "", global ? crun__pg_global(t->pg, j) : j);
  return n;
}

/* Lists the unconnected peers for the timeout message, named as CRUN__WHO
 * names a rank: "1,2", then " (group ranks 0,1)" on a sub-group. */
static void missing_list(crun__tcp_t *t, char *buf, size_t cap) {
  size_t n = missing_ranks(t, buf, cap, 1);
  int shifted = 0;
  for (int j = 0; j < t->size; j++) shifted |= j != t->rank && t->fds[j] < 0 && crun__pg_global(t->pg, j) != j;
  if (!shifted || n + 32 >= cap) return;
  n += (size_t)snprintf(buf + n, cap - n, " (group ranks ");
  n += missing_ranks(t, buf + n, cap - n, 0);
  snprintf(buf + n, cap - n, ")");
}

static int build_mesh(crun__tcp_t *t, double deadline) {
  CRUN_CHECK(crun__auth_from_env(&t->auth));
  char host[64], val[96], key[32];
  local_host(host, sizeof host);
  int port = 0, lfd = listen_ephemeral(host, t->size + 16, &port);
  if (lfd < 0) return lfd;
  snprintf(val, sizeof val, "%s:%d", host, port);
  snprintf(key, sizeof key, "tcp/%d", t->rank);
  int rc = crun_store_set(t->pg->store, key, val, strlen(val));
  for (int j = 0; rc >= 0 && j < t->rank; j++) rc = connect_lower(t, j, deadline);
  if (rc >= 0) rc = accept_higher(t, lfd, deadline);
  close(lfd);
  if (rc < 0) {
    char miss[256];
    missing_list(t, miss, sizeof miss);
    char why[512];
    snprintf(why, sizeof why, "%s", crun_last_error());
    return crun_error(rc, "group '%s' on %s: mesh not connected, missing ranks %s (%s)",
                      t->pg->prefix, CRUN__WHO(t->pg, t->rank), miss, why);
  }
  return 0;
}

int crun__tcp_open(crun_pg_t *pg, crun__tcp_t **out) {
  crun__tcp_t *t = calloc(1, sizeof *t);
  if (!t) return crun_error(CRUN_ENOMEM, "tcp transport");
  t->pg = pg;
  t->rank = pg->rank;
  t->size = pg->size;
  t->group = pg->group_id;
  t->fds = malloc(sizeof(int) * (size_t)pg->size);
  t->tx_dirty = calloc((size_t)pg->size, 1);
  t->closed = calloc((size_t)pg->size, 1);
  t->stash = calloc((size_t)pg->size, sizeof *t->stash);
  t->outq = calloc((size_t)pg->size, sizeof *t->outq);
  t->prx = calloc((size_t)pg->size, sizeof *t->prx);
  t->pfd = calloc((size_t)pg->size, sizeof *t->pfd);
  t->reset_due = calloc((size_t)pg->size, 1);
  if (!t->fds || !t->tx_dirty || !t->closed || !t->stash || !t->outq || !t->prx || !t->pfd || !t->reset_due) { crun__tcp_close(t); return crun_error(CRUN_ENOMEM, "tcp transport"); }
  for (int j = 0; j < pg->size; j++) t->fds[j] = -1;
  int rc = crun__tcp_p2p_init(t);
  if (rc < 0) { crun__tcp_close(t); return rc; }
  rc = pg->size > 1 ? build_mesh(t, crun_clock() + pg->timeout) : 0;
  if (rc < 0) { crun__tcp_close(t); return rc; }
  CRUN_LOG(INFO, NET, "group '%s': tcp mesh of %d ranks connected", pg->prefix, pg->size);
  *out = t;
  return 0;
}

/* Warns about a frame from `peer` that no operation of this rank took: the
 * ranks' calls differed in a way no receiver could see (broadcast or reduce
 * with a different src on different ranks: each rank that took itself for
 * the root only sent), or a send no recv matched. Found when the group is
 * destroyed, the last point where it can be told; best effort (a frame still
 * on its way from another host is missed). When a peer had failed the group
 * (by: that rank, why: its reason), the frame was left by that failure, not
 * by calls that differed, and the warning says so. */
static void warn_unread(crun__tcp_t *t, int peer, const crun__hdr_t *h, int by, const char *why) {
  char shape[96];
  const char *g = t->pg && t->pg->prefix ? t->pg->prefix : "?";
  crun__tcp_call_shape(shape, sizeof shape, h->dtype, h->count, h->op, crun__pg_global(t->pg, h->root), 0,
                       crun__coll_rooted(h->kind));
  if (by >= 0)
    CRUN_LOG(WARN, PG, "group '%s' was destroyed on %s after %s had failed it (%s): %s's %s #%llu %s "
             "to %s was left unread", g, CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, by), why, CRUN__WHO(t->pg, peer), crun__coll_name(h->kind),
             (unsigned long long)h->seq, shape, CRUN__WHO(t->pg, t->rank));
  else
    CRUN_LOG(WARN, PG, "EMISMATCH: group '%s': %s sent %s #%llu %s to %s, and no operation of %s "
             "received it before the group was destroyed (the ranks' calls differed: e.g. a broadcast or reduce "
             "given a different src on different ranks, or a send no recv matched)", g, CRUN__WHO(t->pg, peer),
             crun__coll_name(h->kind), (unsigned long long)h->seq, shape, CRUN__WHO(t->pg, t->rank), CRUN__WHO(t->pg, t->rank));
}

/* The most of a connection peer_failed peeks at. */
#define PEEK_AHEAD (256u << 10)

/* Whether peer j failed the group, as far as this rank can tell without
 * waiting or reading: the reason its background reader kept, or an abort
 * frame on its connection behind at most PEEK_AHEAD bytes of other frames
 * (j sends it last). 1 with "<status name>: <reason>" in why. */
static int peer_failed(crun__tcp_t *t, int j, char *why, size_t cap) {
  const crun__prx_t *x = &t->prx[j];
  int st;
  if (x->state == CRUN__PRX_DEAD && x->text) {
    const char *body = crun__tcp_abort_body(&x->h, x->text, &st);
    snprintf(why, cap, "%s: %s", crun_err_name(st), body);
    return 1;
  }
  size_t pos = x->state == CRUN__PRX_HELD ? (size_t)x->h.nbytes : 0; /* the held frame's payload is next */
  if ((x->state != CRUN__PRX_HDR && x->state != CRUN__PRX_HELD) || x->hgot || pos > PEEK_AHEAD) return 0;
  char *b = malloc(PEEK_AHEAD + CRUN__ABORT_TEXT_MAX + 2 * sizeof(crun__hdr_t)), text[CRUN__ABORT_TEXT_MAX + 1];
  ssize_t k = b ? recv(t->fds[j], b, PEEK_AHEAD + CRUN__ABORT_TEXT_MAX + 2 * sizeof(crun__hdr_t),
                       MSG_PEEK | MSG_DONTWAIT) : -1;
  int found = 0;
  for (crun__hdr_t h; !found && k > 0 && pos + sizeof h <= (size_t)k; pos += sizeof h + (size_t)h.nbytes) {
    memcpy(&h, b + pos, sizeof h);
    if (crun__tcp_hdr_garbled(&h, t->group, t->pg, t->rank, j, text, sizeof text) || h.nbytes > PEEK_AHEAD) break;
    if (h.kind != CRUN__KIND_ABORT) continue;
    size_t n = (size_t)k - pos - sizeof h;
    snprintf(text, sizeof text, "%.*s", (int)(n < h.nbytes ? n : h.nbytes), b + pos + sizeof h);
    const char *body = crun__tcp_abort_body(&h, text, &st);
    snprintf(why, cap, "%s: %s", crun_err_name(st), body);
    found = 1;
  }
  free(b);
  return found;
}

/* The first frame of peer j that no operation took (its stashed frames,
 * the header its reader holds, or the next one on its connection): 1 with
 * it in h. */
static int first_unread(crun__tcp_t *t, int j, crun__hdr_t *h) {
  if (t->stash && t->stash[j]) return *h = t->stash[j]->h, 1;
  if (t->prx && t->prx[j].state == CRUN__PRX_HELD) return *h = t->prx[j].h, 1; /* read up to its header, then held */
  if (t->prx && (t->prx[j].frame || t->prx[j].state != CRUN__PRX_HDR || t->prx[j].hgot))
    return 0; /* a background read in progress (or ended): not judged */
  char why[128];
  ssize_t n = recv(t->fds[j], h, sizeof *h, MSG_PEEK | MSG_DONTWAIT);
  return n == (ssize_t)sizeof *h && !crun__tcp_hdr_garbled(h, t->group, t->pg, t->rank, j, why, sizeof why) &&
         h->kind < CRUN__COLL_COUNT; /* an abort frame's kind is past every operation's */
}

/* Looks for frames nobody received (warn_unread) on a group that did not
 * fail here; a peer's failure that this rank never read explains them. */
static void check_unread(crun__tcp_t *t) {
  if (t->aborted || !t->fds || !t->prx) return;
  char why[600];
  int by = -1;
  for (int j = 0; j < t->size; j++) {
    crun__hdr_t h;
    if (t->fds[j] < 0 || !first_unread(t, j, &h)) continue;
    for (int q = 0; by < 0 && q < t->size; q++) /* looked for once, at the first unread frame */
      if (t->fds[q] >= 0 && peer_failed(t, q, why, sizeof why)) by = q;
    if (by < 0) by = t->size; /* none failed: not looked for again */
    warn_unread(t, j, &h, by < t->size ? by : -1, why);
  }
}

int crun__tcp_peer_gone(crun__tcp_t *t, int j) {
  if (!t || !t->fds || j < 0 || j >= t->size || j == t->rank || t->fds[j] < 0) return 0;
  struct pollfd p = {.fd = t->fds[j], .events = POLLRDHUP};
  /* the peer's FIN (its close, or its process's end) or RST; data still
   * queued before it does not hide it */
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void crun__tcp_close(crun__tcp_t *t) {
  if (!t) return;
  crun__tcp_p2p_fini(t);
  check_unread(t);
  for (int j = 0; t->fds && j < t->size; j++) {
    if (t->fds[j] >= 0 && t->tx_dirty && t->tx_dirty[j]) {
      /* a frame left half sent (a pending send failed at destroy): its rest
       * would keep our close behind it, unseen by a peer that reads no more
       * of it (a held reader); reset the connection instead */
      struct linger lg = {1, 0};
      if (setsockopt(t->fds[j], SOL_SOCKET, SO_LINGER, &lg, sizeof lg) < 0)
        CRUN_LOG(INFO, NET, "SO_LINGER to %s: %s", CRUN__WHO(t->pg, j), strerror(errno));
    }
    if (t->fds[j] >= 0) close(t->fds[j]);
    for (crun__stash_t *s = t->stash ? t->stash[j] : NULL, *n; s; s = n) {
      n = s->next;
      free(s->data);
      free(s);
    }
    if (t->prx && t->prx[j].frame) { free(t->prx[j].frame->data); free(t->prx[j].frame); }
    if (t->prx) free(t->prx[j].text);
  }
  free(t->abort_why);
  free(t->reason_due);
  free(t->reset_due);
  free(t->outq);
  free(t->prx);
  free(t->pfd);
  free(t->fds);
  free(t->tx_dirty);
  free(t->closed);
  free(t->stash);
  free(t);
}
