/* tcp_client.c — the TCP store client (see tcp_proto.h for the protocol).
 *
 * One blocking socket per store, one request in flight (a mutex serializes
 * threads). The reply is polled for a moment (CRUN_STORE_SPIN_US), then
 * awaited in ppoll() bounded by the call's deadline, and read with a
 * non-blocking recv(). A request that parks on the server (get, wait,
 * multi_get, the join, a blocking queue_pop) sends the time it has left
 * and the server answers ETIMEDOUT itself (tcp_proto.h); its reply is
 * awaited PARK_GRACE (a pop POP_GRACE) past the deadline, so the
 * connection stays open. When no reply comes by then, the connection is
 * closed (the server then drops the parked request) and the next call
 * reconnects, so a timed-out store stays usable. A server that goes away
 * yields CRUN_ECONNRESET for the call in flight; later calls try to
 * reconnect for up to 2 s and then fail with CRUN_ECONNREFUSED. With
 * async_set (the default) a set returns once sent and the server does not
 * answer it: the reply to the handle's next request (or a flush's PING)
 * confirms it (tcp_proto.h, "Sets that do not wait"). */
#include "store/store_impl.h"
#include "store/tcp_proto.h"
#include "core/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define RECONNECT_WINDOW 2.0
/* A blocking queue_pop waits this long past its deadline for the server's
 * own ETIMEDOUT (tcp_proto.h): closing first could lose an item in flight. */
#define POP_GRACE 2.0
/* Other parked requests wait this long past their deadline for the
 * server's ETIMEDOUT, which keeps the connection (tcp_proto.h); a server
 * silent that long loses it. */
#define PARK_GRACE 1.0

typedef struct tcp_store {
  crun_store_t base;
  pthread_mutex_t mu;
  int fd, port;
  char *host;
  double connect_timeout;
  crun_store_server_t *server; /* embedded (is_master) */
  uint8_t *sbuf, *rbuf;
  size_t scap, rcap, rlen;
  size_t rused;                /* bytes of rbuf the last reply frame took */
  crun__sarg_t *rargs;         /* the last reply's arguments (views into rbuf) */
  unsigned rnargs, rargcap;
  crun__auth_t auth;           /* the job's secret (core/auth.h) */
  int no_local;                /* the server refused this user on its unix socket: TCP only */
  double spin;                 /* seconds to poll for a reply before blocking (tcp_proto.h) */
  double rtt;                  /* recent round trips (a moving average, capped samples), s */
  int async_set;               /* set returns once sent (tcp_proto.h, "Pipelined sets") */
  unsigned unacked;            /* sets sent without waiting that no reply confirmed yet */
  uint64_t sent, settled;      /* sets sent without waiting, and those confirmed or lost,
                                  ever (atomic: a flush reads them without the lock) */
  unsigned lost;               /* unconfirmed sets of a connection that was lost */
  int late_rc;                 /* a failure crun_store_flush_sets found: the next call's */
  char late_msg[400];
  struct tcp_store *prev, *next; /* the process's async_set clients (g_async) */
  unsigned gen;                /* g_async.gen at creation: another one in a forked child */
} tcp_store_t;

/* Every async_set client of this process, for crun_store_flush_sets, and the
 * number of their sets not yet confirmed (0: a flush has nothing to do). */
static struct {
  pthread_mutex_t mu;
  tcp_store_t *head;
  unsigned long unacked;
  unsigned gen; /* one more in each forked child */
} g_async = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

/* In a forked child the parent's clients are not this process's: their
 * sockets are shared with the parent (or closed and their numbers reused),
 * so a flush or a close there must not talk on the parent's connections.
 * The list starts empty, its lock fresh (another thread may have held it).
 * (A reference a parent's flush held at the fork stays counted in the
 * child: that inherited handle is then never destroyed there, a leak only.) */
static void async_after_fork(void) {
  pthread_mutex_init(&g_async.mu, NULL);
  g_async.head = NULL;
  g_async.unacked = 0;
  g_async.gen++;
}

static void async_init(void) {
  pthread_atfork(NULL, NULL, async_after_fork);
}

/* Whether t was inherited from the parent process (fork). */
static int inherited(const tcp_store_t *t) { return t->gen != g_async.gen; }

/* Moves t->unacked to n, keeping the process's count and t's sent and
 * settled sets (a drop from m to n settles m - n: read or lost). */
static void set_unacked(tcp_store_t *t, unsigned n) {
  if (inherited(t)) { /* counted in the parent */
  } else if (n > t->unacked) {
    __atomic_add_fetch(&g_async.unacked, n - t->unacked, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->sent, n - t->unacked, __ATOMIC_RELEASE);
  } else {
    __atomic_sub_fetch(&g_async.unacked, t->unacked - n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->settled, t->unacked - n, __ATOMIC_RELEASE);
  }
  t->unacked = n;
}

#define T(s) ((tcp_store_t *)(s))

/* What a request is, for error texts; formatted only when one fails. */
typedef struct {
  const char *op;          /* "get" */
  const char *const *keys; /* the keys it names (may be NULL) */
  size_t nkeys;
  const char *text;        /* when set: the whole description */
} what_t;

/* Formats w as "get 'k'" / "wait 'a', 'b'" into buf. */
static const char *what_fmt(const what_t *w, char *buf, size_t cap) {
  char ks[256];
  if (w->text) return w->text;
  if (!w->nkeys) return w->op;
  snprintf(buf, cap, "%s %s", w->op, crun__store_keys_str(w->keys, w->nkeys, ks, sizeof ks));
  return buf;
}
#define WHAT(w) what_fmt((w), (char[320]){0}, 320)

/* ------------------------------------------------------------ connecting */

/* Waits for a non-blocking connect to finish; returns 0 or an errno. */
static int finish_connect(int fd, double deadline) {
  struct pollfd p = {fd, POLLOUT, 0};
  double left = deadline - crun_clock();
  if (left < 0) left = 0;
  struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
  int r = ppoll(&p, 1, &ts, NULL);
  if (r == 0) return ETIMEDOUT;
  if (r < 0) return errno;
  int err = 0;
  socklen_t el = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
  return err;
}

/* connect_once's results when the host name does not resolve: not errnos,
 * so that a real "no route to host" (a cable pulled) is not reported as a
 * name that does not resolve. NO_NAME is for good (the name does not exist:
 * EAI_NONAME, EAI_FAIL, ...); NAME_AGAIN may pass (a DNS server that did not
 * answer: EAI_AGAIN), so it is tried again until the deadline. */
#define CONNECT_NO_NAME (-(1 << 20))
#define CONNECT_NAME_AGAIN (-(1 << 20) - 1)

/* One connect attempt to every address of host:port; returns fd, -errno,
 * CONNECT_NO_NAME or CONNECT_NAME_AGAIN (then *gai is getaddrinfo's code). */
static int connect_once(const char *host, int port, double deadline, int *gai) {
  struct addrinfo hints = {0}, *res = NULL;
  char ps[16];
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  snprintf(ps, sizeof ps, "%d", port);
  *gai = getaddrinfo(host, ps, &hints, &res);
  if (*gai != 0)
    return *gai == EAI_AGAIN || *gai == EAI_SYSTEM || *gai == EAI_MEMORY ? CONNECT_NAME_AGAIN : CONNECT_NO_NAME;
  int err = ECONNREFUSED;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (r == EINPROGRESS) r = finish_connect(fd, deadline);
    if (r == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      freeaddrinfo(res);
      return fd;
    }
    err = r;
    close(fd);
  }
  freeaddrinfo(res);
  return -err;
}

/* Returns 1 when host names this machine's loopback. */
static int is_loopback(const char *host) {
  return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
         strcmp(host, "localhost") == 0;
}

/* Connects to the server's unix socket when it runs on this host and was
 * bound to host (or to the wildcard); returns the fd (blocking) or -1. The
 * connect does not wait: a unix socket's connect blocks, with no timeout,
 * while the listener's backlog is full, and the name is public, so another
 * user could hold it with a backlog nobody accepts from. A full backlog
 * counts as no socket (the client goes over TCP). */
static int connect_local(const char *host, int port) {
  if (!is_loopback(host) || crun_env_int("CRUN_STORE_UNIX", 1) == 0) return -1;
  const char *v6 = strchr(host, ':') ? "::" : NULL;
  const char *names[2] = {strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, v6 ? v6 : "0.0.0.0"};
  for (int i = 0; i < 2; i++) {
    struct sockaddr_un un;
    socklen_t len = crun__store_local_addr(names[i], port, &un);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&un, len) == 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      return fd;
    }
    close(fd);
  }
  return -1;
}

/* Reads exactly n bytes from the blocking fd by the deadline. */
static int read_exact(int fd, void *buf, size_t n, double deadline) {
  char *p = buf;
  while (n > 0) {
    double left = deadline - crun_clock();
    if (left <= 0) return -ETIMEDOUT;
    struct timeval tv = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6) + 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return k < 0 ? -errno : -ECONNRESET;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Whether the server on a unix-socket fd runs as this user (or root). The
 * socket's name is public: another user may have bound it first to read the
 * job's keys. Then the client goes over TCP (and says so once). */
static int served_by_this_user(tcp_store_t *t, int fd) {
  static int warned;
  long uid;
  if (!crun__peer_stranger(fd, &uid)) return 1;
  if (!warned++)
    CRUN_LOG(WARN, STORE, "the store's unix socket for %s:%d is held by uid %ld, not this user: "
             "ignoring it and connecting over TCP", t->host, t->port, uid);
  return 0;
}

/* Without a secret nothing proves the server is the job's: a TCP server on
 * this host run by another user (one that took the port first) is refused
 * with EACCES before anything is sent to it. With a secret the handshake
 * decides. Returns 0 or EACCES naming the store. */
static int check_tcp_server(tcp_store_t *t, int fd) {
  long uid;
  if (t->auth.on || !crun__peer_stranger(fd, &uid)) return 0;
  return crun_error(CRUN_EACCES, "the store server %s:%d is a process of another user (uid %ld) on this host, and "
                    "this client has no secret to check it with: refusing to talk to it (a neighbour may hold the "
                    "port; give the job a CRUN_TOKEN)", t->host, t->port, uid);
}

/* Proves the job's secret to the server on a new connection, and checks
 * the server's proof (core/auth.h). Returns 0 or a status naming the store. */
static int client_handshake(tcp_store_t *t, int fd, int local, double deadline) {
  char peer[160];
  snprintf(peer, sizeof peer, "the store server %s:%d%s", t->host, t->port, local ? " (unix socket)" : "");
  unsigned char greet[CRUN__AUTH_GREET], answer[CRUN__AUTH_ANSWER], want[CRUN__AUTH_PROOF], got[CRUN__AUTH_PROOF];
  int r = read_exact(fd, greet, sizeof greet, deadline);
  if (r < 0)
    return crun_error(r == -ETIMEDOUT ? CRUN_ETIMEDOUT : CRUN_ECONNRESET, "%s sent no greeting: %s", peer,
                      strerror(-r));
  CRUN_CHECK(crun__auth_answer(&t->auth, "store", peer, greet, answer, want));
  size_t done = 0;
  while (done < sizeof answer) {
    ssize_t w = send(fd, answer + done, sizeof answer - done, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return crun_error(CRUN_ECONNRESET, "%s: %s", peer, strerror(errno));
    done += (size_t)w;
  }
  if (!t->auth.on) return 0;
  r = read_exact(fd, got, sizeof got, deadline);
  /* a proof still to come at the deadline is a busy server, not a refusal
   * (tcp_connect gives up on EACCES at once: a client reconnecting to a
   * busy server would take it for a lost store) */
  if (r == -ETIMEDOUT)
    return crun_error(CRUN_ETIMEDOUT, "%s sent no proof of the job's secret in time", peer);
  if (r < 0)
    return crun_error(CRUN_EACCES, "%s refused this client's proof of the job's secret (CRUN_TOKEN differs "
                      "from the job's)", peer);
  return crun__auth_check_proof(want, got, peer);
}

/* Connects, retrying with backoff until the deadline. */
static int tcp_connect(tcp_store_t *t, double deadline) {
  long sleep_us = 5000;
  double t0 = crun_clock();
  int gai = 0;
  for (;;) {
    int fd = t->no_local ? -1 : connect_local(t->host, t->port), local = fd >= 0;
    if (local && !served_by_this_user(t, fd)) {
      close(fd);
      fd = -1, local = 0;
    }
    if (fd < 0) fd = connect_once(t->host, t->port, deadline, &gai);
    if (fd >= 0) {
      int rc = local ? 0 : check_tcp_server(t, fd);
      if (rc == 0) rc = client_handshake(t, fd, local, deadline);
      if (rc == 0) {
        t->fd = fd;
        t->rlen = t->rused = 0;
        return 0;
      }
      close(fd);
      if (local && rc == CRUN_EACCES) { /* the server serves only its own user there: TCP may admit us */
        t->no_local = 1;
        continue;
      }
      /* a wrong secret stays wrong; a handshake cut short (a busy server
       * shedding connections) is tried again until the deadline */
      if (rc == CRUN_EACCES || rc == CRUN_EPROTO || crun_clock() >= deadline) return rc;
      fd = -ECONNRESET;
    }
    double left = deadline - crun_clock();
    if (fd == CONNECT_NO_NAME) /* a name that does not exist will not come to exist by waiting */
      return crun_error(CRUN_EINVAL, "cannot connect to the store at %s:%d: cannot resolve '%s': %s", t->host,
                        t->port, t->host, gai_strerror(gai));
    if (left <= 0 || fd == -EHOSTUNREACH) {
      int st = fd == -ECONNREFUSED ? CRUN_ECONNREFUSED : fd == -ETIMEDOUT ? CRUN_ETIMEDOUT : CRUN_ESYS;
      char why[160];
      if (fd == CONNECT_NAME_AGAIN) snprintf(why, sizeof why, "cannot resolve '%s' (%s)", t->host, gai_strerror(gai));
      else snprintf(why, sizeof why, "%s%s", strerror(-fd), st == CRUN_ECONNREFUSED ? " (is the master running?)" : "");
      return crun_error(st, "cannot connect to the store at %s:%d within %.1f s: %s", t->host, t->port,
                        crun_clock() - t0, why);
    }
    long us = sleep_us < left * 1e6 ? sleep_us : (long)(left * 1e6) + 1;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    if (sleep_us < 200000) sleep_us *= 2;
  }
}

/* Closes the connection; sets no reply had confirmed count as lost. */
static void drop_conn(tcp_store_t *t) {
  if (t->fd >= 0) close(t->fd);
  t->fd = -1;
  t->rlen = t->rused = 0;
  t->lost += t->unacked;
  set_unacked(t, 0);
}

/* ------------------------------------------------------------ framing */

/* Encodes a request frame into t->sbuf; returns its length or a status. */
static long encode(tcp_store_t *t, int op, unsigned n, const void *const *a, const size_t *l) {
  size_t total = CRUN_STORE_FRAME_HDR;
  for (unsigned i = 0; i < n; i++) total += 4 + l[i];
  if (total - 4 > CRUN_STORE_MAX_FRAME || n > CRUN_STORE_MAX_ARGS)
    return crun_error(CRUN_ERANGE, "store request of %zu bytes / %u arguments is over the limit "
                      "(%u bytes, %d arguments; get, wait and multi_get send their timeout as one)", total, n,
                      CRUN_STORE_MAX_FRAME, CRUN_STORE_MAX_ARGS);
  if (total > t->scap) {
    uint8_t *nb = realloc(t->sbuf, total);
    if (!nb) return crun_error(CRUN_ENOMEM, "store: out of memory for a %zu-byte request", total);
    t->sbuf = nb;
    t->scap = total;
  }
  uint8_t *p = t->sbuf;
  crun__put_u32(p, (uint32_t)(total - 4));
  p[4] = CRUN_STORE_PROTO_VERSION, p[5] = (uint8_t)op, p[6] = (uint8_t)n, p[7] = (uint8_t)(n >> 8);
  p += CRUN_STORE_FRAME_HDR;
  for (unsigned i = 0; i < n; i++) {
    crun__put_u32(p, (uint32_t)l[i]);
    if (l[i]) memcpy(p + 4, a[i], l[i]);
    p += 4 + l[i];
  }
  return (long)total;
}

/* Sends len bytes of buf before the deadline (a server that takes nothing
 * that long, stopped or stuck, would block a set forever: sets are not
 * answered, so nothing else bounds them); a failure drops the connection. */
static int send_bytes(tcp_store_t *t, const uint8_t *buf, size_t len, double deadline, const what_t *what) {
  size_t done = 0;
  while (done < len) {
    ssize_t w = send(t->fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      double left = deadline - crun_clock();
      struct pollfd p = {t->fd, POLLOUT, 0};
      int ms = left * 1e3 < INT_MAX ? (int)ceil(left * 1e3) : INT_MAX; /* a timeout may be 1e9 s */
      if (left > 0 && (poll(&p, 1, ms) >= 0 || errno == EINTR)) continue;
      drop_conn(t);
      return crun_error(CRUN_ETIMEDOUT, "%s: the store server %s:%d took no more of the request within the "
                        "deadline (%zu of %zu bytes sent: it is busy or stuck)", WHAT(what), t->host, t->port,
                        done, len);
    }
    if (w < 0) {
      int e = errno;
      drop_conn(t);
      return crun_error(CRUN_ECONNRESET, "%s: lost the store server %s:%d: %s", WHAT(what), t->host,
                        t->port, strerror(e));
    }
    done += (size_t)w;
  }
  return 0;
}

/* Sends the len bytes encoded in t->sbuf before the deadline. */
static int send_all(tcp_store_t *t, size_t len, double deadline, const what_t *what) {
  return send_bytes(t, t->sbuf, len, deadline, what);
}

/* Fails the request whose reply has no room in memory (cap bytes). The
 * rest of that reply is still coming on the connection, so it goes: kept,
 * the next request would take that reply for its own. */
static int no_room(tcp_store_t *t, const what_t *what, size_t cap) {
  drop_conn(t);
  return crun_error(CRUN_ENOMEM, "%s: out of memory for a %zu-byte reply from the store %s:%d (connection closed)",
                    WHAT(what), cap, t->host, t->port);
}

/* Returns the size of the complete frame in rbuf, 0 if incomplete, <0 if bad. */
static long frame_ready(tcp_store_t *t, const what_t *what) {
  uint32_t flen = 0;
  int st = crun__sproto_frame(t->rbuf, t->rlen, &flen);
  if (st == CRUN__SFRAME_BAD) {
    drop_conn(t);
    return crun_error(CRUN_EPROTO, "%s: bad reply frame (%u bytes) from %s:%d", WHAT(what), flen,
                      t->host, t->port);
  }
  if (t->rlen < 4) return 0;
  if (t->rcap < 4 + (size_t)flen) {
    uint8_t *nb = realloc(t->rbuf, 4 + (size_t)flen);
    if (!nb) return no_room(t, what, 4 + (size_t)flen);
    t->rbuf = nb;
    t->rcap = 4 + (size_t)flen;
  }
  return st == CRUN__SFRAME_WHOLE ? (long)(4 + flen) : 0;
}

/* Waits until the socket is readable or `left` seconds pass, in poll():
 * not in a blocking recv, whose sleep on a unix socket is also woken each
 * time the server reads this client's request (the kernel's write-space
 * wake-up, unix_write_space, wakes every sleeper on the socket; poll's
 * sleepers only for what they asked) -- one useless wake-up and two context
 * switches per request. Returns poll's result. */
static int wait_readable(tcp_store_t *t, double left) {
  struct pollfd p = {t->fd, POLLIN, 0};
  struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
  return ppoll(&p, 1, &ts, NULL);
}

/* Reads what the socket has without blocking, retrying (sched_yield between
 * tries, so a runnable thread on this CPU goes first) until `until`: the
 * reply of a fast server is taken without this thread ever sleeping, so its
 * vCPU does not halt and the server's write wakes nobody (tcp_proto.h,
 * "Spinning"). Returns what recv returned; -1 with EAGAIN when nothing came. */
static ssize_t recv_spin(tcp_store_t *t, double until) {
  for (;;) {
    ssize_t got = recv(t->fd, t->rbuf + t->rlen, t->rcap - t->rlen, MSG_DONTWAIT);
    if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return got;
    if (crun_clock() >= until) {
      errno = EAGAIN;
      return -1;
    }
    sched_yield();
  }
}

/* How long to poll for this request's reply: the spin time while recent
 * round trips took less, else 0 (replies that come late -- many clients on
 * few cores, a parked get -- are slept for at once: polling for them only
 * takes the CPU from the server and the other clients). */
static double spin_budget(const tcp_store_t *t) { return t->rtt < t->spin ? t->spin : 0; }

/* Adds one round trip to the moving average (samples capped at 4 spin
 * times, so one long wait does not stop the polling for long). */
static void rtt_note(tcp_store_t *t, double took) {
  if (took > 4 * t->spin) took = 4 * t->spin;
  t->rtt += (took - t->rtt) * 0.25;
}

/* Drops the previous reply frame from rbuf, keeping any bytes that came
 * after it. */
static void consume_frame(tcp_store_t *t) {
  if (t->rused < t->rlen) memmove(t->rbuf, t->rbuf + t->rused, t->rlen - t->rused);
  t->rlen -= t->rused;
  t->rused = 0;
}

/* Reads one reply frame into rbuf before the deadline. */
static int recv_frame(tcp_store_t *t, double deadline, const what_t *what, long *flen) {
  consume_frame(t);
  double start = crun_clock(), budget = spin_budget(t);
  double spin_until = budget > 0 ? start + budget : 0;
  for (;;) {
    long n = frame_ready(t, what);
    if (n < 0) return (int)n;
    if (n > 0) {
      if (t->spin > 0) rtt_note(t, crun_clock() - start);
      t->rused = (size_t)n;
      return (int)(*flen = n, 0);
    }
    double left = deadline - crun_clock();
    if (left <= 0) {
      drop_conn(t);
      return crun_error(CRUN_ETIMEDOUT, "%s: no answer from the store %s:%d within the deadline "
                        "(the server answers a parked get or wait at its deadline: it is busy or stuck)",
                        WHAT(what), t->host, t->port);
    }
    if (t->rcap - t->rlen < 4096) {
      size_t cap = t->rcap * 2 > 65536 ? t->rcap * 2 : 65536;
      uint8_t *nb = realloc(t->rbuf, cap);
      if (!nb) return no_room(t, what, cap);
      t->rbuf = nb;
      t->rcap = cap;
    }
    ssize_t got = -1;
    errno = EAGAIN;
    if (spin_until > 0) got = recv_spin(t, spin_until < deadline ? spin_until : deadline);
    if (got < 0 && errno == EAGAIN) {
      spin_until = 0; /* spun once: sleep from now on */
      left = deadline - crun_clock();
      int r = left > 0 ? wait_readable(t, left) : 0;
      if (r == 0 || (r < 0 && errno == EINTR)) continue; /* the deadline, or a signal: look again */
      if (r > 0) got = recv(t->fd, t->rbuf + t->rlen, t->rcap - t->rlen, MSG_DONTWAIT);
    }
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got <= 0) {
      int e = got < 0 ? errno : 0;
      drop_conn(t);
      return crun_error(CRUN_ECONNRESET, "%s: the store server %s:%d closed the connection%s%s",
                        WHAT(what), t->host, t->port, e ? ": " : "", e ? strerror(e) : "");
    }
    t->rlen += (size_t)got;
  }
}

/* Splits the reply in rbuf into t->rargs, or turns an error reply into a status. */
static int parse_reply(tcp_store_t *t, long flen, const what_t *what) {
  unsigned code = 0;
  int rc = crun__sproto_parse_reply(t->rbuf, (uint32_t)(flen - 4), &code, &t->rargs, &t->rargcap, &t->rnargs);
  if (rc == CRUN_ENOMEM) return rc;
  if (rc < 0) {
    unsigned v = t->rbuf[4];
    drop_conn(t);
    if (v != CRUN_STORE_PROTO_VERSION)
      return crun_error(CRUN_EPROTO, "%s: the store %s:%d speaks protocol version %u, this client %d (mixed crun "
                        "builds?)", WHAT(what), t->host, t->port, v, CRUN_STORE_PROTO_VERSION);
    return crun_error(CRUN_EPROTO, "%s: malformed reply from the store %s:%d", WHAT(what), t->host, t->port);
  }
  if (code == 0) return 0;
  char where[128];
  snprintf(where, sizeof where, "store %s:%d", t->host, t->port);
  return crun__sproto_reply_error(code, t->rargs, t->rnargs, where);
}

/* Returns the text of the last error without its leading "ENAME: ". */
static const char *error_text(char *buf, size_t cap) {
  snprintf(buf, cap, "%s", crun__store_error_body());
  return buf;
}

/* Adds to a failed call's error that sets sent without waiting on the
 * connection it lost were never acknowledged (they may not have been applied). */
static int note_lost(tcp_store_t *t, int rc) {
  if (rc >= 0 || !t->lost) return rc;
  char msg[400];
  unsigned n = t->lost;
  t->lost = 0;
  return crun_error(rc, "%s; %u earlier set%s (async_set) never acknowledged: %s may not be applied",
                    error_text(msg, sizeof msg), n, n == 1 ? "" : "s", n == 1 ? "it" : "they");
}

/* What a PING that confirms the sets sent without waiting is, for errors. */
static const what_t CONFIRM = {NULL, NULL, 0, "set (async_set: confirming the sets sent without waiting)"};

/* Sends a PING (built here: t->sbuf may hold the request it goes ahead of).
 * Its reply comes after every set sent before it: the server serves a
 * connection in order. */
static int send_ping(tcp_store_t *t, double deadline, const what_t *what) {
  uint8_t ping[CRUN_STORE_FRAME_HDR] = {0};
  crun__put_u32(ping, CRUN_STORE_FRAME_HDR - 4);
  ping[4] = CRUN_STORE_PROTO_VERSION, ping[5] = CRUN__SOP_PING;
  return send_bytes(t, ping, sizeof ping, deadline, what);
}

static void keep_late(tcp_store_t *t, int rc);

/* Reads the reply to send_ping's PING: the sets before it are confirmed.
 * Returns 0, or the status of the first of them that failed (the server's
 * reply says so), which with `keep` is kept for t's next call instead
 * while the connection stays. The round-trip average is left as it was. */
static int read_ping(tcp_store_t *t, double deadline, int keep) {
  double rtt = t->rtt;
  long flen = 0;
  CRUN_CHECK(recv_frame(t, deadline, &CONFIRM, &flen));
  set_unacked(t, 0);
  t->rtt = rtt;
  int rc = parse_reply(t, flen, &CONFIRM);
  if (rc < 0 && keep && t->fd >= 0) return keep_late(t, rc), 0;
  return rc;
}

/* Makes sure every set sent without waiting was applied, before the
 * deadline: one PING and its reply. */
static int confirm_sets(tcp_store_t *t, double deadline) {
  CRUN_CHECK(send_ping(t, deadline, &CONFIRM));
  return read_ping(t, deadline, 0);
}

/* Fails with what crun_store_flush_sets found wrong with this handle's sets
 * (once: the call that reports it is not run). */
static int late_error(tcp_store_t *t) {
  int rc = t->late_rc;
  t->late_rc = 0;
  return crun_error(rc, "%s", t->late_msg);
}

/* Connects when there is no connection, within RECONNECT_WINDOW. */
static int ensure_conn(tcp_store_t *t, double deadline) {
  if (t->fd >= 0) return 0;
  double d = crun_clock() + RECONNECT_WINDOW;
  return tcp_connect(t, d < deadline ? d : deadline);
}

/* Whether the server parks op until a key (the join count, an item) exists. */
static int parks(int op) {
  return op == CRUN__SOP_GET || op == CRUN__SOP_WAIT || op == CRUN__SOP_MULTI_GET || op == CRUN__SOP_JOIN_WAIT ||
         op == CRUN__SOP_QUEUE_POP;
}

/* Sends one request and waits for its reply before the deadline (lock held). */
static int do_request(tcp_store_t *t, int op, unsigned n, const void *const *a, const size_t *l,
                      double deadline, const what_t *what) {
  if (t->late_rc) return late_error(t);
  long len = encode(t, op, n, a, l), flen = 0;
  if (len < 0) return (int)len;
  CRUN_CHECK(ensure_conn(t, deadline));
  /* Before a request that may park, a PING goes ahead of it: its reply
   * confirms the sets sent without waiting, so that a flush in another
   * thread need not wait for the parked request (its key may be set only
   * after the barrier). A failure of those sets is kept for the next call;
   * the request behind the PING runs all the same. */
  int pinged = t->unacked && parks(op);
  if (pinged) CRUN_CHECK(send_ping(t, deadline, what));
  CRUN_CHECK(send_all(t, (size_t)len, deadline, what));
  if (pinged) CRUN_CHECK(read_ping(t, deadline, 1));
  CRUN_CHECK(recv_frame(t, deadline, what, &flen));
  if (t->unacked) set_unacked(t, 0); /* the server served them first */
  return parse_reply(t, flen, what);
}

static int request(tcp_store_t *t, int op, unsigned n, const void *const *a, const size_t *l,
                   double deadline, const what_t *what) {
  return note_lost(t, do_request(t, op, n, a, l, deadline, what));
}

/* The timeout_ms a parking request sends: the time left to the deadline,
 * rounded up, at most CRUN_STORE_PARK_MAX_MS (*capped says whether the cap
 * cut it); 0 once the deadline passed (the server looks once). */
static int64_t park_ms(double deadline, int *capped) {
  double left = deadline - crun_clock(), ms = left > 0 ? ceil(left * 1e3) : 0;
  *capped = ms > CRUN_STORE_PARK_MAX_MS;
  return *capped ? CRUN_STORE_PARK_MAX_MS : (int64_t)ms;
}

/* Runs a request that parks on the server until the deadline; its last
 * argument (a[n - 1], l[n - 1]) is filled here with the timeout. The
 * server's ETIMEDOUT is awaited `grace` seconds past the deadline and keeps
 * the connection; one that the server's cap cut short is asked again. Lock
 * held. */
static int parked_request(tcp_store_t *t, int op, unsigned n, const void **a, size_t *l,
                          double deadline, double grace, const what_t *what) {
  uint8_t m[8];
  for (;;) {
    int capped;
    crun__put_i64(m, park_ms(deadline, &capped));
    a[n - 1] = m, l[n - 1] = 8;
    int rc = request(t, op, n, a, l, deadline + grace, what);
    if (rc != CRUN_ETIMEDOUT || t->fd < 0) return rc; /* fd < 0: this side's own timeout */
    if (capped && crun_clock() < deadline) continue;
    if (op == CRUN__SOP_QUEUE_POP) return rc; /* its text names the queue */
    char msg[400];
    return crun_error(rc, "%s: %s", WHAT(what), error_text(msg, sizeof msg));
  }
}

/* Sends a set that the server does not answer (async_set, tcp_proto.h:
 * "Sets that do not wait") and returns. A failure a flush kept is left for
 * the next call that reads a reply, as the server does with its own: a set
 * of another thread on this handle (the progress board's publisher) must
 * not take it from the user. Lock held. */
static int send_set(tcp_store_t *t, const void *const *a, const size_t *l, const what_t *what) {
  double deadline = crun_clock() + crun_store_get_timeout(&t->base);
  long len = encode(t, CRUN__SOP_SET_NOREPLY, 2, a, l);
  if (len < 0) return (int)len;
  CRUN_CHECK(ensure_conn(t, deadline));
  CRUN_CHECK(send_all(t, (size_t)len, deadline, what));
  set_unacked(t, t->unacked + 1);
  return 0;
}

/* Expects one 8-byte integer in the reply. */
static int reply_i64(tcp_store_t *t, int64_t *out, const what_t *what) {
  if (t->rnargs != 1 || t->rargs[0].len != 8)
    return crun_error(CRUN_EPROTO, "%s: unexpected reply from the store %s:%d", WHAT(what), t->host, t->port);
  *out = crun__get_i64(t->rargs[0].p);
  return 0;
}

/* Copies reply argument i into out. */
static int reply_buf(tcp_store_t *t, unsigned i, crun_buf_t *out, const what_t *what) {
  if (i >= t->rnargs)
    return crun_error(CRUN_EPROTO, "%s: unexpected reply from the store %s:%d", WHAT(what), t->host, t->port);
  return crun__buf_set(out, t->rargs[i].p, t->rargs[i].len);
}

/* ------------------------------------------------------------ ops */

static double deadline_now(crun_store_t *s) { return crun_clock() + crun_store_get_timeout(s); }

#define LOCKED(t, expr)                                                             \
  do {                                                                              \
    pthread_mutex_lock(&(t)->mu);                                                   \
    int rc_ = (expr);                                                               \
    pthread_mutex_unlock(&(t)->mu);                                                 \
    return rc_;                                                                     \
  } while (0)

static int k_set(crun_store_t *s, const char *key, const void *val, size_t len) {
  const what_t w = {"set", &key, 1, NULL}, *what = &w;
  const void *a[2] = {key, val};
  size_t l[2] = {strlen(key), len};
  if (T(s)->async_set) LOCKED(T(s), note_lost(T(s), send_set(T(s), a, l, what)));
  LOCKED(T(s), request(T(s), CRUN__SOP_SET, 2, a, l, deadline_now(s), what));
}

static int k_append(crun_store_t *s, const char *key, const void *val, size_t len) {
  const what_t w = {"append", &key, 1, NULL}, *what = &w;
  const void *a[2] = {key, val};
  size_t l[2] = {strlen(key), len};
  LOCKED(T(s), request(T(s), CRUN__SOP_APPEND, 2, a, l, deadline_now(s), what));
}

static int do_get(tcp_store_t *t, const char *key, double deadline, crun_buf_t *out, const what_t *what) {
  const void *a[2] = {key, NULL};
  size_t l[2] = {strlen(key), 0};
  CRUN_CHECK(parked_request(t, CRUN__SOP_GET, 2, a, l, deadline, PARK_GRACE, what));
  return reply_buf(t, 0, out, what);
}

static int k_get(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  const what_t w = {"get", &key, 1, NULL}, *what = &w;
  LOCKED(T(s), do_get(T(s), key, deadline, out, what));
}

static int do_add(tcp_store_t *t, const char *key, int64_t delta, int64_t *out, const what_t *what) {
  uint8_t d[8];
  crun__put_i64(d, delta);
  const void *a[2] = {key, d};
  size_t l[2] = {strlen(key), 8};
  CRUN_CHECK(request(t, CRUN__SOP_ADD, 2, a, l, deadline_now(&t->base), what));
  return reply_i64(t, out, what);
}

static int k_add(crun_store_t *s, const char *key, int64_t delta, int64_t *out) {
  const what_t w = {"add", &key, 1, NULL}, *what = &w;
  LOCKED(T(s), do_add(T(s), key, delta, out, what));
}

static int do_cas(tcp_store_t *t, const void *const *a, const size_t *l, crun_buf_t *out,
                  const what_t *what) {
  CRUN_CHECK(request(t, CRUN__SOP_CAS, 3, a, l, deadline_now(&t->base), what));
  return reply_buf(t, 0, out, what);
}

static int k_compare_set(crun_store_t *s, const char *key, const void *exp, size_t elen,
                         const void *des, size_t dlen, crun_buf_t *out) {
  const what_t w = {"compare_set", &key, 1, NULL}, *what = &w;
  const void *a[3] = {key, exp, des};
  size_t l[3] = {strlen(key), elen, dlen};
  LOCKED(T(s), do_cas(T(s), a, l, out, what));
}

/* Runs a request whose arguments are a key list (CHECK; WAIT and
 * MULTI_GET, which park, add their timeout). */
static int keys_request(tcp_store_t *t, int op, const char *const *keys, size_t n,
                        double deadline, const char *opname) {
  /* the arguments of a few keys live on the stack: a wait blocks for long,
   * and a process forked meanwhile (the launcher's workers) would otherwise
   * inherit a heap block nothing points to */
  int parks = op != CRUN__SOP_CHECK;
  size_t m = n + (size_t)parks, small[17] = {0}, *l = m <= 17 ? small : malloc(m * sizeof *l);
  const void *sa[17] = {0}, **a = m <= 17 ? sa : malloc(m * sizeof *a);
  int rc = !l || !a ? crun_error(CRUN_ENOMEM, "store %s: out of memory", opname) : 0;
  for (size_t i = 0; rc == 0 && i < n; i++) a[i] = keys[i], l[i] = strlen(keys[i]);
  const what_t w = {opname, keys, n, NULL};
  if (rc == 0)
    rc = parks ? parked_request(t, op, (unsigned)m, a, l, deadline, PARK_GRACE, &w)
               : request(t, op, (unsigned)m, a, l, deadline, &w);
  if (l != small) free(l);
  if (a != sa) free(a);
  return rc;
}

static int k_wait(crun_store_t *s, const char *const *keys, size_t n, double deadline) {
  LOCKED(T(s), keys_request(T(s), CRUN__SOP_WAIT, keys, n, deadline, "wait"));
}

static int do_check(tcp_store_t *t, const char *const *keys, size_t n, int *all) {
  int64_t v;
  CRUN_CHECK(keys_request(t, CRUN__SOP_CHECK, keys, n, deadline_now(&t->base), "check"));
  CRUN_CHECK(reply_i64(t, &v, &(const what_t){"check", keys, n, NULL}));
  *all = v != 0;
  return 0;
}

static int k_check(crun_store_t *s, const char *const *keys, size_t n, int *all) {
  LOCKED(T(s), do_check(T(s), keys, n, all));
}

static int do_multi_get(tcp_store_t *t, const char *const *keys, size_t n, double deadline,
                        crun_buf_t *outs) {
  CRUN_CHECK(keys_request(t, CRUN__SOP_MULTI_GET, keys, n, deadline, "multi_get"));
  if (t->rnargs != n)
    return crun_error(CRUN_EPROTO, "multi_get: %u values for %zu keys from the store %s:%d",
                      t->rnargs, n, t->host, t->port);
  for (size_t i = 0; i < n; i++) CRUN_CHECK(reply_buf(t, (unsigned)i, &outs[i], &(const what_t){"multi_get", keys, n, NULL}));
  return 0;
}

static int k_multi_get(crun_store_t *s, const char *const *keys, size_t n, double deadline,
                       crun_buf_t *outs) {
  LOCKED(T(s), do_multi_get(T(s), keys, n, deadline, outs));
}

static int do_multi_set(tcp_store_t *t, const char *const *keys, size_t n,
                        const void *const *vals, const size_t *lens) {
  const void **a = malloc(2 * n * sizeof *a);
  size_t *l = malloc(2 * n * sizeof *l);
  int rc = (!a || !l) ? crun_error(CRUN_ENOMEM, "store multi_set: out of memory") : 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    a[2 * i] = keys[i], l[2 * i] = strlen(keys[i]);
    a[2 * i + 1] = vals[i], l[2 * i + 1] = lens[i];
  }
  if (rc == 0) rc = request(t, CRUN__SOP_MULTI_SET, (unsigned)(2 * n), a, l, deadline_now(&t->base),
                            &(const what_t){"multi_set", keys, n, NULL});
  free(a);
  free(l);
  return rc;
}

static int k_multi_set(crun_store_t *s, const char *const *keys, size_t n,
                       const void *const *vals, const size_t *lens) {
  if (2 * n > CRUN_STORE_MAX_ARGS)
    return crun_error(CRUN_ERANGE, "multi_set of %zu keys: at most %d per call", n, CRUN_STORE_MAX_ARGS / 2);
  LOCKED(T(s), do_multi_set(T(s), keys, n, vals, lens));
}

/* Runs a request that answers one integer. */
static int int_request(tcp_store_t *t, int op, unsigned n, const void *const *a, const size_t *l,
                       double deadline, int64_t *out, const what_t *what) {
  CRUN_CHECK(request(t, op, n, a, l, deadline, what));
  return reply_i64(t, out, what);
}

static int k_delete_key(crun_store_t *s, const char *key, int *existed) {
  const what_t w = {"delete_key", &key, 1, NULL}, *what = &w;
  int64_t v = 0;
  const void *a[1] = {key};
  size_t l[1] = {strlen(key)};
  pthread_mutex_lock(&T(s)->mu);
  int rc = int_request(T(s), CRUN__SOP_DELETE, 1, a, l, deadline_now(s), &v, what);
  pthread_mutex_unlock(&T(s)->mu);
  *existed = v != 0;
  return rc;
}

static int k_num_keys(crun_store_t *s, int64_t *out) {
  LOCKED(T(s), int_request(T(s), CRUN__SOP_NUM_KEYS, 0, NULL, NULL, deadline_now(s), out,
                            &(const what_t){"num_keys", NULL, 0, NULL}));
}

static int k_queue_push(crun_store_t *s, const char *key, const void *val, size_t len) {
  const what_t w = {"queue_push", &key, 1, NULL}, *what = &w;
  const void *a[2] = {key, val};
  size_t l[2] = {strlen(key), len};
  LOCKED(T(s), request(T(s), CRUN__SOP_QUEUE_PUSH, 2, a, l, deadline_now(s), what));
}

/* A blocking pop (deadline >= 0) parks with its timeout and awaits the
 * server's answer POP_GRACE past it; else it sends -1: do not wait. */
static int do_pop(tcp_store_t *t, const char *key, double deadline, crun_buf_t *out, const what_t *what) {
  uint8_t m[8];
  crun__put_i64(m, -1);
  const void *a[2] = {key, m};
  size_t l[2] = {strlen(key), 8};
  if (deadline >= 0) CRUN_CHECK(parked_request(t, CRUN__SOP_QUEUE_POP, 2, a, l, deadline, POP_GRACE, what));
  else CRUN_CHECK(request(t, CRUN__SOP_QUEUE_POP, 2, a, l, deadline_now(&t->base), what));
  return reply_buf(t, 0, out, what);
}

static int k_queue_pop(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  const what_t w = {"queue_pop", &key, 1, NULL}, *what = &w;
  LOCKED(T(s), do_pop(T(s), key, deadline, out, what));
}

static int k_queue_len(crun_store_t *s, const char *key, int64_t *out) {
  const what_t w = {"queue_len", &key, 1, NULL}, *what = &w;
  const void *a[1] = {key};
  size_t l[1] = {strlen(key)};
  LOCKED(T(s), int_request(T(s), CRUN__SOP_QUEUE_LEN, 1, a, l, deadline_now(s), out, what));
}

/* Copies the reply's key list into out after checking that it holds
 * exactly the announced number of NUL-terminated keys. */
static int do_list_keys(tcp_store_t *t, crun_store_keys_t *out) {
  const what_t w = {"list_keys", NULL, 0, NULL}, *what = &w;
  CRUN_CHECK(request(t, CRUN__SOP_LIST_KEYS, 0, NULL, NULL, deadline_now(&t->base), what));
  if (t->rnargs != 2 || t->rargs[0].len != 8)
    return crun_error(CRUN_EPROTO, "list_keys: unexpected reply from the store %s:%d", t->host, t->port);
  int64_t n = crun__get_i64(t->rargs[0].p), nuls = 0;
  const uint8_t *p = t->rargs[1].p;
  size_t len = t->rargs[1].len;
  for (size_t i = 0; i < len; i++) nuls += p[i] == 0;
  if (nuls != n || (len && p[len - 1] != 0))
    return crun_error(CRUN_EPROTO, "list_keys: the store %s:%d announced %lld keys and sent %lld", t->host,
                      t->port, (long long)n, (long long)nuls);
  if (!(out->buf = malloc(len ? len : 1)))
    return crun_error(CRUN_ENOMEM, "list_keys: out of memory for %zu bytes of keys", len);
  if (len) memcpy(out->buf, p, len);
  out->len = len;
  out->count = (size_t)n;
  return 0;
}

static int k_list_keys(crun_store_t *s, crun_store_keys_t *out) {
  LOCKED(T(s), do_list_keys(T(s), out));
}

static int k_port(crun_store_t *s) { return T(s)->port; }

/* Takes t off the process's async_set clients (it may not be on them). */
static void async_unlist(tcp_store_t *t) {
  if (inherited(t)) return; /* on the parent's list only */
  pthread_mutex_lock(&g_async.mu);
  if (t->prev) t->prev->next = t->next;
  else if (g_async.head == t) g_async.head = t->next;
  if (t->next) t->next->prev = t->prev;
  t->prev = t->next = NULL;
  pthread_mutex_unlock(&g_async.mu);
}

/* Keeps the failure a flush found (the last error, without its status
 * name: late_error names it) for t's next call; one found while an earlier
 * one is still kept is added to its text. */
static void keep_late(tcp_store_t *t, int rc) {
  char msg[400];
  size_t at = t->late_rc ? strlen(t->late_msg) : 0;
  snprintf(t->late_msg + at, sizeof t->late_msg - at, "%s%s", at ? "; later: " : "", error_text(msg, sizeof msg));
  if (!t->late_rc) t->late_rc = rc;
}

/* Waits until every set sent on t before this call is confirmed or lost,
 * within t's timeout. A handle busy in another thread's call is not waited
 * for as a whole (a parked get could wait on a key that a peer sets only
 * after the barrier): that call's reply confirms them (the server serves
 * the connection in order), so this polls until one did or the lock is free. */
static void flush_one(tcp_store_t *t) {
  uint64_t target = __atomic_load_n(&t->sent, __ATOMIC_ACQUIRE);
  double deadline = deadline_now(&t->base);
  long ns = 20000;
  while (__atomic_load_n(&t->settled, __ATOMIC_ACQUIRE) < target) {
    if (pthread_mutex_trylock(&t->mu) == 0) {
      int rc = t->unacked ? note_lost(t, confirm_sets(t, deadline)) : 0;
      if (rc < 0) keep_late(t, rc);
      pthread_mutex_unlock(&t->mu);
      return;
    }
    if (crun_clock() >= deadline) return; /* the busy call reports what went wrong */
    nanosleep(&(struct timespec){0, ns}, NULL);
    if (ns < 1000000) ns *= 2; /* the holder's reply confirms them: usually at once */
  }
}

/* Takes a reference to each of the process's async_set clients (one its
 * destroy is taking off the list is left out: that destroy confirms its
 * sets) into *out, *n of them; *out is `local` when they fit there. The
 * list's lock is held only meanwhile: a flush waits for a handle's reply
 * without it, so one stuck handle holds up no other thread's client. */
static int async_snapshot(tcp_store_t **local, size_t cap, tcp_store_t ***out, size_t *n) {
  pthread_mutex_lock(&g_async.mu);
  size_t len = 0;
  for (tcp_store_t *t = g_async.head; t; t = t->next) len++;
  tcp_store_t **all = len <= cap ? local : malloc(len * sizeof *all);
  if (!all) {
    pthread_mutex_unlock(&g_async.mu);
    return crun_error(CRUN_ENOMEM, "store flush: out of memory for %zu clients", len);
  }
  *n = 0;
  for (tcp_store_t *t = g_async.head; t; t = t->next)
    if (crun__store_try_retain(&t->base)) all[(*n)++] = t;
  pthread_mutex_unlock(&g_async.mu);
  *out = all;
  return 0;
}

void crun_store_flush_sets(void) {
  if (!__atomic_load_n(&g_async.unacked, __ATOMIC_RELAXED)) return;
  tcp_store_t *local[32], **all = NULL;
  size_t n = 0;
  if (async_snapshot(local, sizeof local / sizeof *local, &all, &n) < 0) {
    CRUN_LOG(WARN, STORE, "%s: sets sent without waiting are not flushed", crun_last_error());
    return;
  }
  /* a handle closed meanwhile is destroyed by the release that drops the
   * last reference: here, once it is flushed */
  for (size_t i = 0; i < n; i++) flush_one(all[i]), crun_store_release(&all[i]->base);
  if (all != local) free(all);
}

static void k_destroy(crun_store_t *s) {
  tcp_store_t *t = T(s);
  async_unlist(t);
  if (t->late_rc) CRUN_LOG(WARN, STORE, "closing the store %s:%d: %s", t->host, t->port, t->late_msg);
  if (t->unacked && t->fd >= 0 && !inherited(t) && confirm_sets(t, deadline_now(s)) < 0) /* sets before a close are applied */
    CRUN_LOG(WARN, STORE, "closing the store %s:%d: %s", t->host, t->port, crun_last_error());
  drop_conn(t);
  if (t->server) crun_store_server_stop(t->server);
  pthread_mutex_destroy(&t->mu);
  free(t->host);
  free(t->sbuf);
  free(t->rbuf);
  free(t->rargs);
  free(t);
}

static const crun__store_ops_t tcp_ops = {
    .kind = "tcp", .set = k_set, .get = k_get, .add = k_add, .compare_set = k_compare_set,
    .wait = k_wait, .check = k_check, .delete_key = k_delete_key, .num_keys = k_num_keys,
    .append = k_append, .multi_get = k_multi_get, .multi_set = k_multi_set,
    .queue_push = k_queue_push, .queue_pop = k_queue_pop, .queue_len = k_queue_len,
    .list_keys = k_list_keys, .port = k_port, .destroy = k_destroy};

/* ------------------------------------------------------------ create */

/* Joins the world: counts this client and, on the master, waits for all. */
static int tcp_join(tcp_store_t *t, const crun_store_tcp_opts_t *o) {
  int64_t v;
  double deadline = deadline_now(&t->base);
  CRUN_CHECK(int_request(t, CRUN__SOP_JOIN, 0, NULL, NULL, deadline, &v, &(const what_t){"join", NULL, 0, NULL}));
  if (!o->is_master) return 0;
  uint8_t n[8];
  crun__put_i64(n, o->world_size);
  const void *a[2] = {n, NULL};
  size_t l[2] = {8, 0};
  char text[128];
  snprintf(text, sizeof text, "waiting for world_size=%d clients to join", o->world_size);
  const what_t w = {NULL, NULL, 0, text};
  CRUN_CHECK(parked_request(t, CRUN__SOP_JOIN_WAIT, 2, a, l, deadline, PARK_GRACE, &w));
  return reply_i64(t, &v, &w);
}

/* Opens the connection (starting the embedded server first on the master). */
static int tcp_open(tcp_store_t *t, const crun_store_tcp_opts_t *o) {
  CRUN_CHECK(crun__auth_init(&t->auth, o->token ? o->token : getenv("CRUN_TOKEN")));
  if (o->is_master) {
    CRUN_CHECK(crun_store_server_start_token(o->host, o->port, o->token, &t->server));
    t->port = crun_store_server_port(t->server);
  }
  double ct = o->connect_timeout > 0 ? o->connect_timeout : crun_store_get_timeout(&t->base);
  CRUN_CHECK(tcp_connect(t, crun_clock() + ct));
  return o->world_size > 0 ? tcp_join(t, o) : 0;
}

int crun_store_tcp_new(const crun_store_tcp_opts_t *opts, crun_store_t **out) {
  if (!opts || !out) return crun_error(CRUN_EINVAL, "tcp store: opts and out are required");
  if (opts->port < 0 || opts->port > 65535 || (opts->port == 0 && !opts->is_master))
    return crun_error(CRUN_EINVAL, "tcp store: bad port %d (0 picks a free port on the master only)",
                      opts->port);
  if (opts->world_size < 0) return crun_error(CRUN_EINVAL, "tcp store: world_size %d < 0", opts->world_size);
  tcp_store_t *t = calloc(1, sizeof *t);
  const char *host = opts->host && *opts->host ? opts->host : "127.0.0.1";
  if (!t || !(t->host = strdup(host))) {
    free(t);
    return crun_error(CRUN_ENOMEM, "tcp store: out of memory");
  }
  crun__store_init(&t->base, &tcp_ops);
  crun_store_set_timeout(&t->base, opts->timeout);
  pthread_mutex_init(&t->mu, NULL);
  t->spin = crun__store_spin_seconds(CRUN_STORE_SPIN_US_CLIENT);
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, async_init);
  t->gen = g_async.gen;
  t->async_set = opts->async_set > 0 || (opts->async_set == 0 && crun_env_int("CRUN_STORE_ASYNC_SET", 1) != 0);
  t->fd = -1;
  t->port = opts->port;
  int rc = tcp_open(t, opts);
  if (rc < 0) {
    k_destroy(&t->base);
    return rc;
  }
  if (t->async_set) {
    pthread_mutex_lock(&g_async.mu);
    if ((t->next = g_async.head)) t->next->prev = t;
    g_async.head = t;
    pthread_mutex_unlock(&g_async.mu);
  }
  *out = &t->base;
  return 0;
}
